"""Steady-state overhead of chain replication on a primary's writes (issue 3).

    rhino-bench overhead --json --out bench/results/overhead.jsonl

How it runs and what each record holds: bench/README.md, "Steady-state overhead".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import rhino
from rhino._machine import describe_machine, machine_summary
from rhino._sizes import parse_size
from rhino.daemon.worker import DEFAULT_NICE, DEFAULT_SCHED
from rhino_testing.harness.workers import SECRET, start_workers, write_secret

from .common import JsonLines, exit_on_sigterm, max_chunk_bytes, raise_if_stopped
from .overhead_twin import INSTANCE, OPERATOR, Twin, _cpu_delta, _cpu_snapshot, _schedstat, settle

TARGET_DROP = 0.10


def run_phase(twin: Twin, replicate: bool, args: argparse.Namespace, workers: list, index: int) -> dict:
    sched_path = f"/proc/self/task/{threading.get_native_id()}/schedstat"  # the write loop's thread
    t_start = time.perf_counter()
    t_measure = t_start + args.warmup
    t_end = t_measure + args.duration
    next_ckpt = t_start + args.checkpoint_interval
    keys_total = 0
    measuring = False
    put_s = ckpt_s = gen_s = 0.0
    put_run = put_wait = 0  # ns, the main thread inside put_batch
    ckpts: list[dict] = []
    keys0 = 0
    t0 = 0.0
    snap0: dict = {}
    sent0 = 0
    completed0 = 0
    first_ckpt_in_window = 0
    load0 = os.getloadavg()
    while True:
        raise_if_stopped()
        now = time.perf_counter()
        if not measuring and now >= t_measure:
            measuring, t0, keys0 = True, now, keys_total
            put_s = ckpt_s = gen_s = 0.0
            put_run = put_wait = 0
            snap0 = _cpu_snapshot(workers)
            sent0 = twin.sent_bytes()
            completed0 = len(twin.completed)
            first_ckpt_in_window = twin.ckpt_id + 1
        if now >= t_end:
            break
        if now >= next_ckpt:
            c = twin.checkpoint()
            c["measured"] = measuring
            ckpts.append(c)
            ckpt_s += c["checkpoint_s"] + c["retain_gc_s"]
            next_ckpt += args.checkpoint_interval
            if next_ckpt <= now:  # a checkpoint took longer than the interval: do not queue up a burst
                next_ckpt = now + args.checkpoint_interval
        if replicate:
            twin.poll()
        a = time.perf_counter()
        keys, values = twin.workload.next_batch()
        s0 = _schedstat(sched_path)
        b = time.perf_counter()
        twin.db.put_batch(keys, values)
        c_ = time.perf_counter()
        s1 = _schedstat(sched_path)
        gen_s += b - a
        put_s += c_ - b
        put_run += s1[0] - s0[0]
        put_wait += s1[1] - s0[1]
        keys_total += len(keys)
    t1 = time.perf_counter()
    snap1 = _cpu_snapshot(workers)
    sent1 = twin.sent_bytes() if replicate else 0
    window = t1 - t0
    keys = keys_total - keys0
    drained = twin.drain() if replicate else 0.0
    in_window = [c for c in ckpts if c["measured"]]
    reps = twin.completed[completed0:]
    reps_in_window = [r for r in reps if r["finished"] <= t1]
    return {
        "record": "phase",
        "phase": index,
        "replicas": args.replicas if replicate else 0,
        "twin": twin.name,
        "writes_per_s": round(keys / window, 1),
        "keys_written": keys,
        "mb_written_per_s": round(keys * (8 + args.value_size) / window / 1e6, 2),
        "window_s": round(window, 3),
        "put_batch_s": round(put_s, 3),
        # inside put_batch: on a CPU, waiting for one, and asleep (RocksDB write stalls, mutexes)
        "put_batch_on_cpu_s": round(put_run / 1e9, 3),
        "put_batch_runqueue_wait_s": round(put_wait / 1e9, 3),
        "put_batch_asleep_s": round(put_s - (put_run + put_wait) / 1e9, 3),
        "checkpoint_and_gc_s": round(ckpt_s, 3),
        "generate_s": round(gen_s, 3),
        "checkpoints": len(in_window),
        "checkpoint_ids": [c["id"] for c in in_window],
        "checkpoint_median_s": round(statistics.median(c["checkpoint_s"] for c in in_window), 4) if in_window else None,
        "checkpoint_max_s": round(max(c["checkpoint_s"] for c in in_window), 4) if in_window else None,
        "checkpoint_delta_bytes": [c["delta_bytes"] for c in in_window],
        "checkpoint_delta_files": [c["delta_files"] for c in in_window],
        "checkpoint_total_bytes_last": in_window[-1]["total_bytes"] if in_window else None,
        "checkpoint_delta_mb_per_s": round(sum(c["delta_bytes"] for c in in_window) / window / 1e6, 2),
        "replication_bytes": sent1 - sent0,
        "replication_mb_per_s": round((sent1 - sent0) / window / 1e6, 2),
        "replications_completed": len(reps_in_window),
        "replications_completed_ids": [r["id"] for r in reps_in_window if r["ok"]],
        "replications_failed": sum(1 for r in reps if not r["ok"]),
        "checkpoints_coalesced": sum(r["coalesced"] for r in reps_in_window),
        "replication_lag_median_s": round(statistics.median(r["lag_s"] for r in reps_in_window), 3)
        if reps_in_window else None,
        "replication_lag_max_s": round(max(r["lag_s"] for r in reps_in_window), 3) if reps_in_window else None,
        "replication_seconds_median": round(statistics.median(r["seconds"] for r in reps_in_window if r["ok"]), 3)
        if any(r["ok"] for r in reps_in_window) else None,
        "drain_after_window_s": round(drained, 3),
        "first_checkpoint_in_window": first_ckpt_in_window,
        "cpu": _cpu_delta(snap0, snap1, window),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def parameters(args: argparse.Namespace, vnodes: list[int]) -> dict:
    return {
        "replicas": args.replicas, "pairs": args.pairs, "duration_s": args.duration, "warmup_s": args.warmup,
        "checkpoint_interval_s": args.checkpoint_interval, "initial_keys": args.initial_keys,
        "value_size": args.value_size, "batch_keys": args.batch_keys, "update_fraction": args.update_fraction,
        "num_vnodes": args.num_vnodes, "instances": args.instances, "vnodes_held": len(vnodes),
        "write_buffer_budget": args.write_buffer_budget, "keep_checkpoints": args.keep_checkpoints,
        "chunk_bytes": args.chunk, "window": args.window, "seed": args.seed, "worker_nice": DEFAULT_NICE if args.worker_nice is None else args.worker_nice,
        "worker_sched": DEFAULT_SCHED if args.worker_sched is None else args.worker_sched,
        "settle_max_s": args.settle_max, "compaction": args.compaction,
        "flush_threads": args.flush_threads,
    }


def worker_priorities(workers: list) -> list[dict]:
    """What each worker applied of its --nice and --sched (its `priority` log event)."""
    out = []
    for w in workers:
        rec: dict[str, Any] = {"worker": w.id}
        for line in w.log_path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "priority":
                rec.update({k: ev.get(k) for k in ("nice", "autogroup_nice", "sched")})
        out.append(rec)
    return out


def run(args: argparse.Namespace, command: str) -> list[dict]:
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    partitioner = rhino.Partitioner(num_vnodes=args.num_vnodes)
    vnodes = rhino.RoutingTable.from_ring(args.num_vnodes, args.instances).vnodes_of(INSTANCE)
    params = parameters(args, vnodes)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.quiet else (lambda *a: None)

    secret_file = write_secret(root)
    extra = ["--log-format", "json"]
    if args.worker_nice is not None:
        extra += ["--nice", str(args.worker_nice)]
    if args.worker_sched is not None:
        extra += ["--sched", args.worker_sched]
    workers = start_workers(root, list(range(2, 2 + args.replicas)), secret_file, args.window, extra)
    twins: dict[int, Twin] = {}
    rows: list[dict] = []
    try:
        params["worker_priority"] = worker_priorities(workers)
        setup: dict[str, Any] = {}
        for r, name in ((0, "r0"), (args.replicas, f"r{args.replicas}")):
            t0 = time.perf_counter()
            tw = Twin(name, root, args, partitioner, vnodes)
            for keys, values in tw.workload.initial_batches(args.initial_keys):
                tw.db.put_batch(keys, values)
            c = tw.checkpoint()
            setup[f"load_{name}_s"] = round(time.perf_counter() - t0, 2)
            setup["initial_checkpoint_bytes"] = c["total_bytes"]
            twins[r] = tw
        tw = twins[args.replicas]
        tw.chain = [w.address for w in workers]
        t0 = time.perf_counter()
        tw.poll()  # the initial bulk copy of the r2 twin's first checkpoint, before any phase
        tw.drain()
        if tw.failures:
            raise RuntimeError(f"initial replication failed: {tw.failures[0]}")
        setup["initial_replication_s"] = round(time.perf_counter() - t0, 2)
        setup["initial_replication_bytes"] = tw.completed[-1]["bytes_sent"]
        raise_if_stopped()
        say(f"[overhead] set up: {setup}")

        order: list[int] = []
        for p in range(args.pairs):
            order += [0, args.replicas] if p % 2 == 0 else [args.replicas, 0]
        for i, r in enumerate(order):
            settled = settle(workers, args.settle_max)
            row = run_phase(twins[r], r > 0, args, workers, i)
            row.update(run_id=run_id, parameters=params, settle_before_s=round(settled, 2))
            rows.append(row)
            say(f"[overhead] phase {i} r={r} (settled {settled:.1f} s): {row['writes_per_s']:,.0f} writes/s, "
                f"{row['checkpoints']} checkpoints, "
                f"{row['replication_mb_per_s']} MB/s replicated ({row['replications_completed']} done, "
                f"{row['checkpoints_coalesced']} coalesced), primary CPU {row['cpu']['primary_cpu_s']} s, "
                f"workers {row['cpu']['workers_cpu_s']}, idle {row['cpu']['machine_idle_s']} s")

        # Cross-check with the replicas themselves: every checkpoint the primary saw complete is committed on
        # every member of the chain.
        completed_ok = sorted(r["id"] for r in tw.completed if r["ok"])
        held = {w.id: rhino.query_store(w.address, secret=SECRET, operator_id=OPERATOR, instance=INSTANCE)
                for w in workers}
        missing = {w: sorted(set(completed_ok) - set(ids)) for w, ids in held.items()}
        rows.append(summarize(rows, args, params, run_id, command, setup, completed_ok, held, missing,
                              tw.failures, root))
    finally:
        for t in twins.values():
            t.close()
        for w in workers:
            w.stop()
    return rows


def summarize(rows: list[dict], args: argparse.Namespace, params: dict, run_id: str, command: str, setup: dict,
              completed_ok: list[int], held: dict, missing: dict, failures: list[str], root: Path) -> dict:
    r0 = [r for r in rows if r["replicas"] == 0]
    r2 = [r for r in rows if r["replicas"] > 0]
    w0 = statistics.median(r["writes_per_s"] for r in r0)
    w2 = statistics.median(r["writes_per_s"] for r in r2)
    drop = 1 - w2 / w0
    # Phases 2k and 2k+1 form a pair (measured back to back, in alternating order).
    pair_drops = []
    for k in range(0, len(rows) - 1, 2):
        a, b = rows[k], rows[k + 1]
        x0, x2 = (a, b) if a["replicas"] == 0 else (b, a)
        pair_drops.append(round(1 - x2["writes_per_s"] / x0["writes_per_s"], 4))

    def med(rs: list[dict], f) -> float:
        return round(statistics.median(f(r) for r in rs), 3)

    def per_s(key: str) -> Any:
        return lambda r: r["cpu"][key] / r["window_s"]

    figures = {"primary_cpu_per_s": per_s("primary_cpu_s"),
               "primary_main_thread_cpu_per_s": per_s("primary_main_thread_cpu_s"),
               "primary_rocksdb_threads_cpu_per_s": per_s("primary_rocksdb_threads_cpu_s"),
               "primary_other_threads_cpu_per_s": per_s("primary_other_threads_cpu_s"),
               "workers_cpu_per_s": lambda r: sum(r["cpu"]["workers_cpu_s"].values()) / r["window_s"],
               "machine_idle_per_s": per_s("machine_idle_s"), "machine_iowait_per_s": per_s("machine_iowait_s"),
               "others_cpu_per_s": per_s("others_cpu_s"),
               "main_thread_runqueue_wait_per_s": per_s("primary_main_thread_runqueue_wait_s"),
               "put_batch_share": lambda r: r["put_batch_s"] / r["window_s"],
               "put_batch_runqueue_wait_share": lambda r: r["put_batch_runqueue_wait_s"] / r["put_batch_s"],
               "put_batch_asleep_share": lambda r: r["put_batch_asleep_s"] / r["put_batch_s"],
               "put_batch_cpu_us_per_key": lambda r: r["put_batch_on_cpu_s"] / r["keys_written"] * 1e6,
               "checkpoint_share": lambda r: r["checkpoint_and_gc_s"] / r["window_s"],
               "checkpoint_median_s": lambda r: r["checkpoint_median_s"] or 0.0}
    cpu = {label: {k: med(rs, f) for k, f in figures.items()} for label, rs in (("r0", r0), ("r2", r2))}
    cpu["r2"]["workers_cpu_ms_per_mb_replicated"] = med(
        r2, lambda r: sum(r["cpu"]["workers_cpu_s"].values()) * 1e3 / max(r["replication_bytes"] / 1e6, 1e-9))
    return {
        "record": "summary",
        "run_id": run_id,
        "command": command,
        "parameters": params,
        "writes_r0": round(w0, 1),
        "writes_r2": round(w2, 1),
        "drop": round(drop, 4),
        "drop_pairs": pair_drops,
        "drop_pairs_median": round(statistics.median(pair_drops), 4),
        "writes_r0_phases": [r["writes_per_s"] for r in r0],
        "writes_r2_phases": [r["writes_per_s"] for r in r2],
        "target_drop": TARGET_DROP,
        "target_met": drop <= TARGET_DROP,
        "checkpoints_r0": sum(r["checkpoints"] for r in r0),
        "checkpoints_r2": sum(r["checkpoints"] for r in r2),
        "checkpoint_delta_mb_per_s_r2": med(r2, lambda r: r["checkpoint_delta_mb_per_s"]),
        "checkpoint_delta_bytes_median": int(statistics.median(
            b for r in r2 for b in r["checkpoint_delta_bytes"])) if any(r["checkpoint_delta_bytes"] for r in r2)
        else 0,
        "checkpoint_total_bytes_last": r2[-1]["checkpoint_total_bytes_last"],
        "replication_bytes_r2": sum(r["replication_bytes"] for r in r2),
        "replication_mb_per_s_r2": med(r2, lambda r: r["replication_mb_per_s"]),
        "replications_completed_r2": sum(r["replications_completed"] for r in r2),
        "checkpoints_coalesced_r2": sum(r["checkpoints_coalesced"] for r in r2),
        "replications_failed": len(failures),
        "failures": failures[:5],
        "replication_lag_median_s": med([r for r in r2 if r["replication_lag_median_s"] is not None],
                                        lambda r: r["replication_lag_median_s"]) if any(
            r["replication_lag_median_s"] is not None for r in r2) else None,
        "replicas_checkpoints": {w: len(ids) for w, ids in held.items()},
        "replicas_missing_completed": {w: ids for w, ids in missing.items()},
        "replicated_checkpoints_total": len(completed_ok),
        "cpu": cpu,
        "setup": setup,
        "cpu_count": os.cpu_count(),
        # Each worker runs in its own session (setsid). With autogroup scheduling on, Linux shares the CPU
        # between sessions first: the primary and each worker get equal shares when all are busy.
        "sched_autogroup_enabled": _read_int("/proc/sys/kernel/sched_autogroup_enabled"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "machine": describe_machine(str(root)),
    }


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def summary_text(s: dict) -> str:
    p = s["parameters"]
    c0, c2 = s["cpu"]["r0"], s["cpu"]["r2"]
    lines = [
        f"rhino-bench overhead: r={p['replicas']} vs r=0, {p['pairs']} pairs of {p['duration_s']:g} s phases "
        f"(+{p['warmup_s']:g} s warm-up), checkpoint every {p['checkpoint_interval_s']:g} s",
        f"  workload: {p['batch_keys']} keys/batch, {p['value_size']} B values, "
        f"{p['update_fraction']:.0%} updates, {p['vnodes_held']} vnodes of {p['num_vnodes']}, "
        f"{p['initial_keys']:,} initial keys",
        f"  writes/s r=0: {s['writes_r0']:,.0f} (phases {', '.join(f'{x:,.0f}' for x in s['writes_r0_phases'])})",
        f"  writes/s r={p['replicas']}: {s['writes_r2']:,.0f} "
        f"(phases {', '.join(f'{x:,.0f}' for x in s['writes_r2_phases'])})",
        f"  drop: {s['drop']:.1%} (per pair: {', '.join(f'{d:.1%}' for d in s['drop_pairs'])}); "
        f"target <= {s['target_drop']:.0%}: {'PASS' if s['target_met'] else 'FAIL'}",
        f"  r={p['replicas']}: {s['replications_completed_r2']} replications completed in the windows "
        f"({s['checkpoints_coalesced_r2']} checkpoints coalesced), {s['replication_bytes_r2'] / 1e6:,.0f} MB sent, "
        f"median {s['replication_mb_per_s_r2']} MB/s, lag {s['replication_lag_median_s']} s; "
        f"replicas hold {s['replicas_checkpoints']} checkpoints, failures {s['replications_failed']}",
        f"  CPU, r=0 -> r={p['replicas']} (medians): write loop {c0['primary_main_thread_cpu_per_s']:.2f} -> "
        f"{c2['primary_main_thread_cpu_per_s']:.2f} cores; put_batch waiting for a CPU "
        f"{c0['put_batch_runqueue_wait_share']:.1%} -> {c2['put_batch_runqueue_wait_share']:.1%} of its time, asleep "
        f"{max(0.0, c0['put_batch_asleep_share']):.1%} -> {max(0.0, c2['put_batch_asleep_share']):.1%}; "
        f"RocksDB threads {c0['primary_rocksdb_threads_cpu_per_s']:.2f} -> "
        f"{c2['primary_rocksdb_threads_cpu_per_s']:.2f}; workers {c2['workers_cpu_per_s']:.2f} cores "
        f"({c2['workers_cpu_ms_per_mb_replicated']:.1f} ms per MB replicated); idle {c0['machine_idle_per_s']:.2f} -> "
        f"{c2['machine_idle_per_s']:.2f} cores (of {s['cpu_count']})",
        f"  machine: {machine_summary(s['machine'])}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhino-bench overhead", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="chain length of the replicated side")
    p.add_argument("--pairs", type=int, default=3, help="pairs of phases (r=0 and r=R), in ABBA order")
    p.add_argument("--duration", type=float, default=16.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds per phase before the window opens")
    p.add_argument("--checkpoint-interval", type=float, default=2.0, help="seconds between checkpoints")
    p.add_argument("--initial-keys", type=int, default=1_000_000,
                   help="keys loaded into each twin before the phases")
    p.add_argument("--value-size", type=int, default=128, help="bytes per value")
    p.add_argument("--batch-keys", type=int, default=20_000, help="keys per put_batch")
    p.add_argument("--update-fraction", type=float, default=0.8, help="share of each batch that updates existing keys")
    p.add_argument("--num-vnodes", type=int, default=256)
    p.add_argument("--instances", type=int, default=8,
                   help="the primary holds instance 0's vnodes of a ring over this many instances")
    p.add_argument("--write-buffer-budget", type=lambda s: parse_size(s), default=parse_size("256M"))
    p.add_argument("--keep-checkpoints", type=int, default=4, help="checkpoints kept in the primary's store (0: all)")
    p.add_argument("--compaction", choices=["level", "universal"], default="level",
                   help="compaction style of both twins' vnodes (StateBackend.open(compaction=...))")
    p.add_argument("--flush-threads", type=int, default=1, choices=range(1, 17), metavar="1..16",
                   help="RocksDB flush threads of both twins (StateBackend.open(flush_threads=...))")
    p.add_argument("--chunk", type=int, default=1 << 20, help="replication chunk bytes")
    p.add_argument("--window", type=int, default=16, help="replication credit window (chunks)")
    p.add_argument("--settle-max", type=float, default=15.0,
                   help="before each phase, wait up to this long for the background work of earlier phases "
                        "(compactions, transfers) to finish")
    p.add_argument("--replication-timeout", type=float, default=120.0)
    p.add_argument("--worker-nice", type=int, default=None, choices=range(0, 20), metavar="0..19",
                   help="the workers' --nice (default: rhino worker's own default)")
    p.add_argument("--worker-sched", choices=["batch", "normal"], default=None,
                   help="the workers' --sched (default: rhino worker's own default, %s)" % DEFAULT_SCHED)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dir", default=".bench-overhead", help="work directory, removed and recreated")
    p.add_argument("--keep", action="store_true", help="keep the work directory (stores, logs) afterwards")
    p.add_argument("--json", action="store_true", help="JSON lines on stdout (the summary text goes to stderr)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.replicas < 1 or args.pairs < 1 or args.duration <= 0 or args.checkpoint_interval <= 0:
        parser.error("--replicas, --pairs, --duration and --checkpoint-interval must be positive")
    if args.warmup < 0 or args.initial_keys < 1 or args.batch_keys < 1 or args.value_size < 1:
        parser.error("--warmup must be >= 0; --initial-keys, --batch-keys and --value-size >= 1")
    if not 0 <= args.update_fraction < 1:
        parser.error("--update-fraction must be in [0, 1)")
    if args.instances < 1 or not args.instances <= args.num_vnodes <= (1 << 15):
        parser.error(f"--instances must be >= 1 and --num-vnodes from --instances to {1 << 15} "
                     f"(every instance holds at least one vnode; there are {1 << 15} key groups)")
    if args.chunk < 1 or args.chunk > max_chunk_bytes() or args.window < 1:
        parser.error(f"--chunk must be 1..{max_chunk_bytes()} bytes and --window >= 1")
    if args.settle_max < 0 or args.replication_timeout <= 0 or args.keep_checkpoints < 0:
        parser.error("--settle-max and --keep-checkpoints must be >= 0, --replication-timeout > 0")
    command = "rhino-bench overhead " + " ".join(shlex.quote(a) for a in argv)
    exit_on_sigterm()
    try:
        rows = run(args, command)
    except BaseException:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
        raise
    out = JsonLines(args)
    for row in rows:
        out.emit(row)
    print(summary_text(rows[-1]), file=sys.stderr if args.json else sys.stdout, flush=True)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0
