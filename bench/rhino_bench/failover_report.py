"""``rhino-bench failover``: the plot and the report of its records (they read the JSON lines alone)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from rhino._machine import machine_summary
from rhino._sizes import format_bytes
from .report import md_table, pyplot, save, write_lines


# ---- the records of a size, the summary --------------------------------------------------------

FETCH_FLAT_TARGET = 2.0  # Rhino's fetch at the largest size within 2x of the smallest (issue: 4G vs 1G)
SPEEDUP_TARGET = 20.0  # DFS total excl. detection over Rhino's, at the largest size

TIMES = ("detection_s", "scheduling_s", "fetch_s", "load_s")


def combine(trials: list[dict]) -> dict:
    """One row of a size and method: each part the median over the trials, the totals their sums
    (so the parts add up), each trial's figures kept in ``<field>_runs``."""
    out = {k: v for k, v in trials[0].items() if k not in ("rep",)}
    out["record"] = "failover"
    out["trials"] = len(trials)
    for k in (*TIMES, "recovery_s", "state_bytes", "files", "linked_files", "copied_bytes", "network_bytes",
              "copy_s", "link_build_s", "takeover_request_s", "store_cached_fraction", "source_cached_fraction"):
        if k not in out:
            continue
        vals = [t[k] for t in trials]
        if any(v is None for v in vals):
            continue
        med = float(np.median(vals))
        out[k] = round(med, 4) if isinstance(vals[0], float) else int(med)
        if len(trials) > 1:
            out[f"{k}_runs"] = vals
    excl = out["scheduling_s"] + out["fetch_s"] + out["load_s"]
    out["total_excl_detection_s"] = round(excl, 4)
    out["total_s"] = None if out["detection_s"] is None else round(out["detection_s"] + excl, 4)
    if len(trials) > 1:
        out["total_excl_detection_s_runs"] = [t["total_excl_detection_s"] for t in trials]
    out["state_correct"] = all(t["state_correct"] for t in trials)
    return out


def summarize(rows: list[dict]) -> dict:
    res = [r for r in rows if r.get("record") == "failover"]
    sizes = sorted({r["size_bytes"] for r in res})
    out: dict[str, Any] = {"record": "summary", "sizes": sizes}
    if not sizes:
        return out
    rh = {r["size_bytes"]: r for r in res if r["method"] == "rhino"}
    df = {r["size_bytes"]: r for r in res if r["method"] == "dfs"}
    lo, hi = sizes[0], sizes[-1]
    out["fetch_flat"] = {"from_size": lo, "to_size": hi, "rhino_fetch_s": [rh[lo]["fetch_s"], rh[hi]["fetch_s"]],
                         "ratio": round(rh[hi]["fetch_s"] / rh[lo]["fetch_s"], 3) if rh[lo]["fetch_s"] > 0 else None,
                         "target": FETCH_FLAT_TARGET}
    out["fetch_flat"]["met"] = (len(sizes) > 1 and out["fetch_flat"]["ratio"] is not None
                                and out["fetch_flat"]["ratio"] <= FETCH_FLAT_TARGET)
    out["speedup"] = {"size": hi, "rhino_total_excl_detection_s": rh[hi]["total_excl_detection_s"],
                      "dfs_total_excl_detection_s": df[hi]["total_excl_detection_s"],
                      "ratio": round(df[hi]["total_excl_detection_s"] / rh[hi]["total_excl_detection_s"], 2),
                      "target": SPEEDUP_TARGET}
    out["speedup"]["met"] = out["speedup"]["ratio"] >= SPEEDUP_TARGET
    if rh[hi]["total_s"] is not None:
        out["speedup_incl_detection"] = round(df[hi]["total_s"] / rh[hi]["total_s"], 2)
    return out



# ---- the plot and the report ---------------------------------------------------------------------

PARTS = [("detection_s", "detection", "#999999"), ("scheduling_s", "scheduling", "#4c72b0"),
         ("fetch_s", "state fetching", "#dd8452"), ("load_s", "state loading", "#55a868")]


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()

    res = [r for r in rows if r.get("record") == "failover"]
    sizes = sorted({r["size_bytes"] for r in res})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.38

    def row(size: int, method: str) -> dict:
        return next((r for r in res if r["size_bytes"] == size and r["method"] == method), {})

    # Left: both methods, every part, seconds.
    for k, method in enumerate(("rhino", "dfs")):
        xs = np.arange(len(sizes)) + (k - 0.5) * width
        bottom = np.zeros(len(sizes))
        for key, label, color in PARTS:
            ys = np.array([row(s, method).get(key) or 0.0 for s in sizes])
            ax1.bar(xs, ys, width, bottom=bottom, color=color, edgecolor="black" if method == "rhino" else "white",
                    hatch="" if method == "rhino" else "//", label=label if k == 0 else None)
            bottom += ys
        for x, tot in zip(xs, bottom):
            ax1.annotate(f"{'Rhino' if method == 'rhino' else 'DFS'}\n{tot:.2f} s", (x, tot), ha="center",
                         va="bottom", fontsize=7)
    # Right: Rhino alone without detection, milliseconds, against the DFS-style total.
    xs = np.arange(len(sizes))
    bottom = np.zeros(len(sizes))
    for key, label, color in PARTS[1:]:
        ys = np.array([(row(s, "rhino").get(key) or 0.0) * 1e3 for s in sizes])
        ax2.bar(xs, ys, 0.5, bottom=bottom, color=color, edgecolor="black", label=label)
        bottom += ys
    for x, tot, s in zip(xs, bottom, sizes):
        dfs = row(s, "dfs").get("total_excl_detection_s")
        ax2.annotate(f"{tot:.0f} ms" + (f"\nDFS-style {dfs:.2f} s ({dfs * 1e3 / tot:.0f}x)" if dfs and tot else ""),
                     (x, tot), ha="center", va="bottom", fontsize=8)
    ax2.set_ylim(0, max(bottom.max() * 1.5, 1.0))
    ax2.set_ylabel("milliseconds")
    ax2.set_title("Rhino excluding detection (median of the trials)", fontsize=10)
    ax2.legend(fontsize=8, loc="upper left")
    ax1.set_ylabel("seconds")
    for ax in (ax1, ax2):
        ax.set_xticks(np.arange(len(sizes)), [format_bytes(s) for s in sizes])
        ax.set_xlabel("state size (one instance, r=2)")
    det = next((r for r in res if r["detection_s"] is not None), None)
    ax1.set_title("recovery after SIGKILL, solid Rhino, hatched DFS-style" +
                  (f" (heartbeat timeout {det['heartbeat_timeout_s']} s)" if det else " (detection not measured)"),
                  fontsize=10)
    ax1.legend(fontsize=8, loc="upper left")
    save(fig, path)


def _runs(res: list[dict], size: int, method: str, key: str) -> list[float]:
    r = next((r for r in res if r["size_bytes"] == size and r["method"] == method), None)
    return [] if r is None else list(r.get(f"{key}_runs", [r[key]]))


def _per_trial(res: list[dict], size: int) -> list[float]:
    rh = _runs(res, size, "rhino", "total_excl_detection_s")
    df = _runs(res, size, "dfs", "total_excl_detection_s")
    return [d / r for r, d in zip(rh, df) if r]


def _cached_text(res: list[dict]) -> str:
    src = [r["source_cached_fraction"] for r in res if r.get("source_cached_fraction") is not None]
    own = [r["store_cached_fraction"] for r in res if r.get("store_cached_fraction") is not None]
    if not src and not own:
        return "how much of the stores was cached was not measured (no fincore)."
    return (f"right before the kill, {max(src, default=0):.0%} at most of the source's pooled bytes (C, read by "
            f"the copy) and {max(own, default=0):.0%} at most of B's (opened by the takeover) were in the page "
            "cache (util-linux fincore), so both methods read from the disk.")


def _f(x: Optional[float], digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def report(rows: list[dict], path: str) -> None:
    setup = next(r for r in rows if r.get("record") == "setup")
    res = [r for r in rows if r.get("record") == "failover"]
    skipped = [r for r in rows if r.get("record") == "skipped"]
    summary = next((r for r in rows if r.get("record") == "summary"), {})
    m = setup["machine"]
    if setup["detection"] == "heartbeat":
        det = (f"by heartbeat timeout ({setup['heartbeat_timeout_s']} s): A, B and C are `rhino worker "
               f"--coordinator` processes heartbeating every {setup['heartbeat_interval_s']} s to the coordinator, "
               "which the benchmark serves from its own process over the coordinator protocol (the server "
               "`rhino coordinator` runs); its timeout is an hour while the state is built and "
               f"{setup['heartbeat_timeout_s']} s from right before the kill, because a worker sends no heartbeat "
               "while a commit holds its instance (bench/README.md, Failover)")
    elif setup["detection"] == "process":
        det = (f"by heartbeat timeout: a `rhino coordinator` process with `--heartbeat-timeout "
               f"{setup['heartbeat_timeout_s']}`, workers heartbeating every {setup['heartbeat_interval_s']} s "
               "(`rhino worker --coordinator`)")
    else:
        det = ("not measured (an in-process coordinator told at once, `declare_dead` right after the kill"
               + (f"; {setup['detection_note']}" if setup.get("detection_note") else "") + ")")
    lines = ["# Failover: recovery time against state size (Rhino paper Table 1)", "",
             f"Command: `{setup['command']}`", "",
             f"Run at {setup['unix']} on {machine_summary(m)}. Workers A {setup['workers']['A']} (primary, "
             f"SIGKILLed), B {setup['workers']['B']} and C {setup['workers']['C']} (its chain, r=2), D "
             f"{setup['workers']['D']} (holds nothing; the DFS-style reader); all share the machine's "
             f"{m.get('cpu_cores')} cores and one disk.", "",
             f"Parameters: one instance of {setup['num_vnodes']} vnodes, {setup['value_bytes']}-byte random values "
             f"written through sessions in batches of {format_bytes(setup['fill_batch_bytes'])}, each committed in "
             f"barrier mode; then settled (1-key commits until the checkpoint's file count stops falling, at most "
             f"{setup['settle_timeout_s']} s), then `sync` and {setup.get('quiesce_s', 0)} s of quiet before "
             f"the SIGKILL. Detection {det}. The page cache was not dropped. Each size ran "
             f"{setup.get('repeat', 1)} time(s), each time on a fresh cluster; every part is the median over "
             f"those trials and the totals are the sums of the medians (each trial's total in the last column).", "",
             "Seconds:", "",
             ""]
    rows = [(f"{format_bytes(r['size_bytes'])} ({r['state_bytes'] / 1e9:.2f} GB)",
             "Rhino (takeover by hard links)" if r["method"] == "rhino" else "DFS-style (full copy, then open)",
             *(_f(r[k]) for k in ("detection_s", "scheduling_s", "fetch_s", "load_s", "total_s",
                                  "total_excl_detection_s")),
             f"{r['files']} ({r['linked_files']})", format_bytes(r["network_bytes"]),
             ", ".join(_f(x) for x in r.get("total_excl_detection_s_runs", [r["total_excl_detection_s"]])))
            for r in sorted(res, key=lambda r: (r["size_bytes"], r["method"] != "rhino"))]
    rows += [(format_bytes(r["size_bytes"]), "skipped", r["reason"], *[""] * 8) for r in skipped]
    lines += md_table(["state", "method", "detection", "scheduling", "state fetching", "state loading", "total",
                       "total excl. detection", "files (linked)", "bytes over the network",
                       "trials: total excl. detection"], rows, "llrrrrrrrrl")
    lines += ["", "Targets:", ""]
    ff = summary.get("fetch_flat")
    if ff:
        lines.append(f"- Rhino's state fetching flat in size: {format_bytes(ff['to_size'])} "
                     f"{ff['rhino_fetch_s'][1] * 1e3:.1f} ms against {format_bytes(ff['from_size'])} "
                     f"{ff['rhino_fetch_s'][0] * 1e3:.1f} ms, {ff['ratio']}x (target <= {ff['target']}x): "
                     f"**{'met' if ff['met'] else 'not met'}**.")
        sp = summary["speedup"]
        lines.append(f"- Recovery excluding detection at {format_bytes(sp['size'])}: Rhino "
                     f"{sp['rhino_total_excl_detection_s']:.3f} s, DFS-style {sp['dfs_total_excl_detection_s']:.3f} s, "
                     f"{sp['ratio']}x (target >= {sp['target']}x): **{'met' if sp['met'] else 'not met'}**.")
        if "speedup_incl_detection" in summary:
            lines.append(f"- Including detection: {summary['speedup_incl_detection']}x.")
        trials = _per_trial(res, sp["size"])
        if len(trials) > 1:
            lines.append(f"- Trial by trial at {format_bytes(sp['size'])} (DFS-style / Rhino, excluding detection): "
                         + ", ".join(f"{x:.0f}x" for x in trials) + "; Rhino's fetch per trial: "
                         + ", ".join(f"{x * 1e3:.1f} ms" for x in _runs(res, sp["size"], "rhino", "fetch_s")) + ".")
    lines += ["",
              "Definitions: detection runs from the SIGKILL to the coordinator declaring the worker dead; "
              "scheduling from there to the takeover request being sent (the Replication Manager's decision); "
              "Rhino's fetch is building the restore directory by hard links from B's own replica store "
              "(`restore.build_s` of the takeover's answer) and its load is RocksDB opening it "
              "(`restore.open_s`); the DFS-style fetch is a full copy of the checkpoint from C to D over TCP "
              "(the `replicate` action) plus D's link build, and its load D's open. Both methods share detection "
              "and scheduling.", "",
              "What this machine does to the baseline: the copy runs over loopback (no NIC, no network "
              "bandwidth limit) between processes on one disk, which both reads and writes it. The page cache "
              "is not dropped, but replicas drop a file's pages once it is on disk: " + _cached_text(res) + " "
              "A real DFS fetch crosses a network as well, so the ratio here understates Rhino's advantage."]
    write_lines(path, lines)
