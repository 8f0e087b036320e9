#!/usr/bin/env python3
"""Writes the report of `rhino-bench overhead`: a PNG and overhead.md next to it.

usage: python bench/report_overhead.py bench/results/overhead.jsonl bench/results/overhead.png

Reads the JSON lines of `rhino-bench overhead` (the newest run in the file, by
run_id, is the headline; older runs are listed with their commands), plots the
primary's writes/s per phase and where the machine's CPU went, and writes
overhead.md: the figures, the target of issue 3 (a primary's writes/s with r=2
at most 10% below r=0, same run) with PASS or FAIL, the command, the
parameters and the machine.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rhino_bench.report import pyplot, save


def _sched(p: dict) -> str:
    """The workers' scheduling policy; runs from before `rhino worker --sched` existed ran the normal one."""
    got = p.get("worker_sched")
    return {"batch": "SCHED_BATCH", "normal": "SCHED_OTHER"}.get(got, "SCHED_OTHER (before --sched existed)")

def load_runs(path: str) -> dict[str, dict[str, Any]]:
    """{run_id: {"phases": [...], "summary": {...}}}; runs without a summary (interrupted) are skipped."""
    runs: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for row in (json.loads(line) for line in f if line.strip()):
            run = runs.setdefault(row["run_id"], {"phases": [], "summary": None})
            if row.get("record") == "summary":
                run["summary"] = row
            else:
                run["phases"].append(row)
    runs = {k: v for k, v in runs.items() if v["summary"] is not None}
    if not runs:
        raise SystemExit(f"{path}: no complete run")
    return runs


def plot(run: dict[str, Any], out_png: str) -> None:
    phases, s = run["phases"], run["summary"]
    r = s["parameters"]["replicas"]
    fig, (ax1, ax2) = pyplot().subplots(2, 1, figsize=(9, 8), dpi=120, sharex=True)
    xs = list(range(len(phases)))
    labels = [f"{p['phase']}\nr={p['replicas']}" for p in phases]
    colors = ["tab:blue" if p["replicas"] == 0 else "tab:orange" for p in phases]
    ax1.bar(xs, [p["writes_per_s"] / 1e3 for p in phases], color=colors)
    ax1.axhline(s["writes_r0"] / 1e3, color="tab:blue", linestyle="--", label=f"median r=0: {s['writes_r0']:,.0f}/s")
    ax1.axhline(s["writes_r2"] / 1e3, color="tab:orange", linestyle="--",
                label=f"median r={r}: {s['writes_r2']:,.0f}/s")
    ax1.axhline(s["writes_r0"] * (1 - s["target_drop"]) / 1e3, color="red", linestyle=":",
                label=f"target: r={r} >= {1 - s['target_drop']:.0%} of r=0")
    ax1.set_ylabel("primary writes/s (thousands of keys)")
    ax1.set_title(f"steady-state overhead of chain replication: drop {s['drop']:.1%} "
                  f"({'PASS' if s['target_met'] else 'FAIL'})")
    ax1.legend(loc="lower right", fontsize=8)

    parts = [
        ("primary: write loop", lambda p: p["cpu"]["primary_main_thread_cpu_s"], "tab:blue"),
        ("primary: RocksDB threads", lambda p: p["cpu"]["primary_rocksdb_threads_cpu_s"], "tab:cyan"),
        ("primary: other (sender)", lambda p: max(0.0, p["cpu"]["primary_other_threads_cpu_s"]), "tab:purple"),
        ("workers", lambda p: sum(p["cpu"]["workers_cpu_s"].values()), "tab:orange"),
        ("everything else", lambda p: max(0.0, p["cpu"]["others_cpu_s"]), "tab:gray"),
        ("iowait", lambda p: p["cpu"]["machine_iowait_s"], "tab:olive"),
        ("idle", lambda p: p["cpu"]["machine_idle_s"], "whitesmoke"),
    ]
    bottom = [0.0] * len(phases)
    for name, f, color in parts:
        vals = [f(p) / p["window_s"] for p in phases]
        ax2.bar(xs, vals, bottom=bottom, color=color, label=name, edgecolor="black", linewidth=0.3)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_ylabel("cores (CPU seconds per second)")
    ax2.set_xticks(xs)
    ax2.set_xticklabels(labels)
    ax2.set_xlabel("phase (in the order run)")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    save(fig, out_png, dpi=120)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def report(runs: dict[str, dict[str, Any]], png_name: str) -> tuple[str, bool]:
    latest = max(runs)
    run = runs[latest]
    phases, s = run["phases"], run["summary"]
    p = s["parameters"]
    r = p["replicas"]
    m = s.get("machine", {})
    fs = m.get("filesystem") or {}
    c0, c2 = s["cpu"]["r0"], s["cpu"]["r2"]
    missing = {w: ids for w, ids in s["replicas_missing_completed"].items() if ids}
    lines = [
        "# Steady-state overhead of chain replication (issue 3)", "",
        f"![overhead]({png_name})", "",
        f"Run `{latest}`: {len(phases)} phases of {p['duration_s']:g} s (after {p['warmup_s']:g} s of warm-up each), "
        f"r=0 and r={r} interleaved in ABBA order, all in the same run; figures are medians over the phases.", "",
        f"| target (issue 3) | r=0 writes/s | r={r} writes/s | drop | result |", "|---|---|---|---|---|",
        f"| writes/s on a primary with r={r} at most {s['target_drop']:.0%} below r=0 | {s['writes_r0']:,.0f} | "
        f"{s['writes_r2']:,.0f} | {s['drop']:.1%} (per pair: {', '.join(f'{d:.1%}' for d in s['drop_pairs'])}) | "
        f"{'PASS' if s['target_met'] else 'FAIL'} |", "",
        "## Phases", "",
        "| phase | r | writes/s | MB/s written | checkpoints | delta per checkpoint (median) | checkpoint (median) "
        "| replicated | replications done (coalesced) | lag (median) | put_batch: on CPU / waiting for a CPU / asleep "
        "| CPU: write loop / RocksDB / sender / workers / idle (cores) | taken by the hypervisor (steal) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ph in phases:
        c = ph["cpu"]
        w = ph["window_s"]
        deltas = sorted(ph["checkpoint_delta_bytes"])
        med_delta = deltas[len(deltas) // 2] if deltas else 0
        lag = f"{ph['replication_lag_median_s']:.2f} s" if ph["replication_lag_median_s"] is not None else "-"
        lines.append(
            f"| {ph['phase']} | {ph['replicas']} | {ph['writes_per_s']:,.0f} | {ph['mb_written_per_s']:.1f} | "
            f"{ph['checkpoints']} | {_mb(med_delta)} | {ph['checkpoint_median_s']:.2f} s | "
            f"{ph['replication_mb_per_s']:.1f} MB/s | {ph['replications_completed']} ({ph['checkpoints_coalesced']}) | "
            f"{lag} | {ph['put_batch_on_cpu_s']:.1f} / {ph['put_batch_runqueue_wait_s']:.1f} / "
            f"{max(0.0, ph['put_batch_asleep_s']):.1f} s | "
            f"{c['primary_main_thread_cpu_s'] / w:.2f} / {c['primary_rocksdb_threads_cpu_s'] / w:.2f} / "
            f"{max(0.0, c['primary_other_threads_cpu_s']) / w:.2f} / {sum(c['workers_cpu_s'].values()) / w:.2f} / "
            f"{c['machine_idle_s'] / w:.2f} | {c.get('machine_steal_s', 0.0) / w:.2f} cores |")
    lost = 1 - c2["primary_main_thread_cpu_per_s"] / c0["primary_main_thread_cpu_per_s"]
    per_key = c2["put_batch_cpu_us_per_key"] / c0["put_batch_cpu_us_per_key"] - 1
    lines += [
        "", "## Reading", "",
        f"- put_batch never slept (no RocksDB write stalls: {max(0.0, c0['put_batch_asleep_share']):.1%} of its "
        f"time with r=0, {max(0.0, c2['put_batch_asleep_share']):.1%} with r={r}), and its CPU per key changed by "
        f"{per_key:+.1%}. With r={r} it spent {c2['put_batch_runqueue_wait_share']:.1%} of its time runnable but "
        f"waiting for a CPU (r=0: {c0['put_batch_runqueue_wait_share']:.1%}), and the write loop got "
        f"{lost:.0%} less CPU. The drop is CPU contention.",
        f"- The {s.get('cpu_count')} cores are shared: with r=0 the primary used "
        f"{c0['primary_cpu_per_s']:.2f} cores and {c0['machine_idle_per_s']:.2f} were idle; with r={r} the "
        f"workers used {c2['workers_cpu_per_s']:.2f} cores ({c2['workers_cpu_ms_per_mb_replicated']:.1f} ms of CPU "
        f"per MB replicated, both members together), the primary's sender "
        f"{max(0.0, c2['primary_other_threads_cpu_per_s']):.2f}, and {c2['machine_idle_per_s']:.2f} cores were left "
        "idle. On a real cluster the members are other hosts, but each host is a member of other instances' "
        "chains, so in a symmetric cluster a host spends the same receiving CPU per byte its own primaries "
        "checkpoint.",
        "- bench/README.md (\"Reading the results\") has the profile of where the workers' CPU goes.",
    ]
    lines += [
        "", "## Where the time went (medians over the phases)", "",
        f"| figure | r=0 | r={r} |", "|---|---|---|",
        f"| write loop: CPU (cores) | {c0['primary_main_thread_cpu_per_s']:.2f} | {c2['primary_main_thread_cpu_per_s']:.2f} |",
        f"| write loop: waiting for a CPU (share of the window) | {c0['main_thread_runqueue_wait_per_s']:.1%} | "
        f"{c2['main_thread_runqueue_wait_per_s']:.1%} |",
        f"| put_batch: share of the loop's time | {c0['put_batch_share']:.1%} | {c2['put_batch_share']:.1%} |",
        f"| put_batch: waiting for a CPU (share of its time) | {c0['put_batch_runqueue_wait_share']:.1%} | "
        f"{c2['put_batch_runqueue_wait_share']:.1%} |",
        f"| put_batch: asleep (write stalls; share of its time) | {max(0.0, c0['put_batch_asleep_share']):.1%} | "
        f"{max(0.0, c2['put_batch_asleep_share']):.1%} |",
        f"| put_batch: CPU per key | {c0['put_batch_cpu_us_per_key']:.2f} µs | {c2['put_batch_cpu_us_per_key']:.2f} µs |",
        f"| checkpoint + retention/gc: share of the loop's time | {c0['checkpoint_share']:.1%} | "
        f"{c2['checkpoint_share']:.1%} |",
        f"| checkpoint (median) | {c0['checkpoint_median_s']:.2f} s | {c2['checkpoint_median_s']:.2f} s |",
        f"| primary RocksDB threads (cores) | {c0['primary_rocksdb_threads_cpu_per_s']:.2f} | "
        f"{c2['primary_rocksdb_threads_cpu_per_s']:.2f} |",
        f"| primary other threads: replication sender (cores) | {max(0.0, c0['primary_other_threads_cpu_per_s']):.2f} | "
        f"{max(0.0, c2['primary_other_threads_cpu_per_s']):.2f} |",
        f"| workers (cores, both) | {c0['workers_cpu_per_s']:.2f} | {c2['workers_cpu_per_s']:.2f} |",
        f"| workers' CPU per MB replicated | - | {c2['workers_cpu_ms_per_mb_replicated']:.1f} ms |",
        f"| everything else: kernel threads, other tenants (cores) | {c0['others_cpu_per_s']:.2f} | "
        f"{c2['others_cpu_per_s']:.2f} |",
        f"| machine idle (cores) | {c0['machine_idle_per_s']:.2f} | {c2['machine_idle_per_s']:.2f} |",
        f"| machine iowait (cores) | {c0['machine_iowait_per_s']:.2f} | {c2['machine_iowait_per_s']:.2f} |",
        "",
        "Sources: `/proc/self/task/*/stat` (CPU of the write loop's thread and of the RocksDB threads; the rest of "
        "the primary process is the replication sender and threads that have ended), `/proc/<pid>/stat` of each "
        "worker, `/proc/stat` (machine), `/proc/self/task/<tid>/schedstat` around every `put_batch` call (on a CPU, "
        "runnable but waiting for a CPU; the rest of the call is asleep). Steal is the time the hypervisor ran "
        "something else while this VM's CPUs wanted to run (`/proc/stat`); it swings between phases on a shared "
        "host and is much of the noise between pairs.",
        "", "## Replication", "",
        f"- r={r} phases: {s['checkpoints_r2']} checkpoints taken in the windows, "
        f"{s['replications_completed_r2']} replications completed in them "
        f"({s['checkpoints_coalesced_r2']} checkpoints coalesced into a later one because a transfer was in flight), "
        f"{_mb(s['replication_bytes_r2'])} sent ({s['replication_mb_per_s_r2']:.1f} MB/s median), "
        f"{s['replications_failed']} failed; median lag from checkpoint to the chain's ack "
        f"{s['replication_lag_median_s']} s.",
        f"- Median checkpoint delta {_mb(s['checkpoint_delta_bytes_median'])}; the r={r} twin's last checkpoint "
        f"holds {_mb(s['checkpoint_total_bytes_last'])}. r=0 phases took {s['checkpoints_r0']} checkpoints, "
        "none replicated.",
        f"- Cross-check with the replicas (StoreQuery to each worker after the last phase): "
        f"{', '.join(f'{w} holds {n} checkpoints' for w, n in s['replicas_checkpoints'].items())}; "
        + ("every checkpoint the primary saw complete is committed on every member."
           if not missing else f"MISSING on the replicas: {missing}."),
        f"- Set-up (untimed): loading each twin {s['setup'].get('load_r0_s')} s / "
        f"{s['setup'].get('load_r' + str(r) + '_s')} s, initial checkpoint {_mb(s['setup']['initial_checkpoint_bytes'])}, "
        f"its bulk copy to the chain {s['setup']['initial_replication_s']} s.",
        "", "## Command", "", "```",
        "make bench   # among others:",
        s["command"],
        "python bench/report_overhead.py bench/results/overhead.jsonl bench/results/overhead.png",
        "```", "",
        f"Parameters: chain of r={r} workers (127.0.0.2 -> 127.0.0.{1 + r}), each its own `rhino worker` process "
        f"and session; {p['batch_keys']:,} keys per `put_batch` (NumPy int64), {p['value_size']}-byte random "
        f"values, {p['update_fraction']:.0%} updates of existing keys (uniform) and "
        f"{1 - p['update_fraction']:.0%} new keys, {p['initial_keys']:,} keys loaded first; the instance holds "
        f"{p['vnodes_held']} of {p['num_vnodes']} vnodes (instance 0 of {p['instances']}); write-buffer budget "
        f"{p['write_buffer_budget'] >> 20} MiB; a checkpoint every {p['checkpoint_interval_s']:g} s, the newest "
        f"{p['keep_checkpoints']} kept (then gc); replication chunks of {p['chunk_bytes'] >> 10} KiB, credit window "
        f"{p['window']}, at most one replication in flight; worker nice {p['worker_nice']}, "
        f"scheduling policy {_sched(p)}; seed {p['seed']}.",
        "", "## Machine", "",
        f"- CPU: {m.get('cpu_model')} ({s.get('cpu_count')} cores, os.cpu_count()); the primary and both workers "
        "share them",
        f"- RAM: {m.get('ram_bytes', 0) / (1 << 30):.1f} GiB",
        f"- OS / kernel: {m.get('os')} / {m.get('kernel')}; autogroup scheduling "
        f"{'on' if s.get('sched_autogroup_enabled') else 'off'} (each worker is its own session, so the CPU is "
        "shared between the primary and each worker first)",
        f"- Disk filesystem: {fs.get('fstype')} on {fs.get('device')} (mounted at {fs.get('mount')})",
        f"- Python {m.get('python')}, rhino {m.get('rhino')}, RocksDB {m.get('rocksdb') or m.get('librocksdb')}",
        f"- Load average (1, 5, 15 min) at the end: {s.get('loadavg')}; per phase, before/after: "
        + "; ".join(f"{ph['phase']}: {ph['loadavg_before'][0]}/{ph['loadavg_after'][0]}" for ph in phases),
    ]
    others = [k for k in sorted(runs) if k != latest]
    if others:
        lines += ["", "## Other runs in overhead.jsonl", "",
                  "| run | command | r=0 writes/s | r=R writes/s | drop | result |", "|---|---|---|---|---|---|"]
        for k in others:
            o = runs[k]["summary"]
            lines.append(f"| `{k}` | `{o['command']}` | {o['writes_r0']:,.0f} | {o['writes_r2']:,.0f} | "
                         f"{o['drop']:.1%} | {'PASS' if o['target_met'] else 'FAIL'} |")
    lines += [
        "", "## What is measured", "",
        "- The primary is the benchmark process. It holds two identical instances (twins) with their own live "
        "state and local replica store, loaded alike and fed the same seeded stream of batches; one only ever runs "
        "r=0 phases, the other only r=2 phases, so both do the same writes, checkpoints and compactions.",
        "- writes/s: keys passed to `put_batch` in the measured window, divided by its length. The loop also "
        "generates the batches and takes the checkpoints (with retention and gc), so checkpoint time counts.",
        "- With r=2, each checkpoint is replicated asynchronously; the loop never waits for an ack. At most one "
        "replication is in flight per instance; a checkpoint taken meanwhile is coalesced into the next transfer "
        "(the chain is asked what it lacks, so the newest checkpoint carries every missing file).",
        "- The warm-up before each window brings the pipeline to its steady state; after the window, an "
        "unfinished transfer is waited for (untimed) before the next phase.",
    ]
    return "\n".join(lines) + "\n", bool(s["target_met"])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    src, out_png = argv[1], argv[2]
    runs = load_runs(src)
    plot(runs[max(runs)], out_png)
    text, ok = report(runs, os.path.basename(out_png))
    out_md = os.path.join(os.path.dirname(out_png) or ".", "overhead.md")
    with open(out_md, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"wrote {out_png} and {out_md}; target {'met' if ok else 'NOT met'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
