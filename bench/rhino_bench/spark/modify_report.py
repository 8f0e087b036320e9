"""``rhino-bench spark modify``: the summary, the report and the plot of its records (pure:
they read the JSON lines alone, in a run or with ``--from``)."""

from __future__ import annotations

from typing import Optional
from ..report import md_table, pyplot, save, setup_of, write_lines

SPIKE_TARGET = 1.5  # the swap's largest batch over the steady median
SPEEDUP_TARGET = 5.0  # Spark's restart over Rhino's swap, request to effect (the less favourable Spark route)


def _by_route(records: list[dict]) -> dict[str, dict]:
    return {r["route"]: r for r in records if r.get("record") == "modify"}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 2) if a is not None and b else None


def new_code_start_s(r: dict) -> float:
    """From the request to the start of the first batch with the new code."""
    return next(start for b, start, _ in r["batches"] if b == r["effect_batch"] and start >= 0)


def steady_max_x(r: dict) -> float:
    """The longest steady batch before the request over their median: how far batches spike
    with no modification at all (the yardstick for spike_x)."""
    ds = [end - start for _, start, end in r["batches"][2:] if end <= 0]
    return round(max(ds) / r["steady_batch_s"], 3) if ds else 1.0


def summarize(records: list[dict]) -> dict:
    """Rhino's swap against the fastest Spark restart of the run, and the issue's targets:
    on request_to_effect_s (to the first batch with the new code completed) and, as a second
    view, on new_code_start_s (to its start)."""
    by = _by_route(records)
    swap = by.get("swap")
    spark = [r for k, r in by.items() if k.startswith("spark-restart")]
    base = min(spark, key=lambda r: r["request_to_effect_s"]) if spark else None
    speedup = _ratio(base["request_to_effect_s"], swap["request_to_effect_s"]) if swap and base else None
    start_speedup = None
    if swap and spark:
        start_speedup = _ratio(min(new_code_start_s(r) for r in spark), new_code_start_s(swap))
    checks = {}
    if swap:
        checks.update({"swap_at_first_barrier": swap["batches_delayed"] == 0,
                       "swap_spike_at_most_1_5x": swap["spike_x"] <= SPIKE_TARGET,
                       "swap_no_failed_batch": swap["failed_batches"] == 0})
    if speedup is not None:
        checks["swap_5x_faster_than_spark_restart"] = speedup >= SPEEDUP_TARGET
    return {"record": "summary", "routes": sorted(by), "baseline": base["route"] if base else None,
            "speedup_vs_spark_restart": speedup, "new_code_start_speedup": start_speedup,
            "new_code_start_s": {k: round(new_code_start_s(r), 3) for k, r in by.items()},
            "steady_max_x": {k: steady_max_x(r) for k, r in by.items()}, "checks": checks,
            "errors": [r for r in records if r.get("record") == "error"],
            "ok": bool(checks) and all(checks.values())}


def report(records: list[dict], path: str) -> None:
    setup, by, s = setup_of(records), _by_route(records), summarize(records)
    lines = ["# Changing a running query's code: Rhino's swap vs Spark's restart (NEXMark Q8)", "",
             f"Command: `{setup.get('command', '?')}`  ", f"Started: {setup.get('started', '?')}  ",
             f"Parameters: `{setup.get('parameters')}`", ""]
    lines += md_table(["route", "state MiB", "request to effect (s)", "new code starts (s)", "batches delayed",
                       "spike x", "steady max x", "failed batches", "steady batch (s)"],
                      [(k, f"{r['state_bytes'] / 2**20:.0f}", f"{r['request_to_effect_s']:.2f}",
                        f"{new_code_start_s(r):.2f}", r["batches_delayed"], f"{r['spike_x']:.2f}",
                        f"{steady_max_x(r):.2f}", r["failed_batches"], f"{r['steady_batch_s']:.2f}")
                       for k, r in sorted(by.items())])
    lines += ["", "spike x: the longest batch from the request on over the median steady batch before it; "
              "steady max x: the same for the longest steady batch before the request (no modification).", "",
              f"Speed-up of the swap over the fastest Spark restart ({s['baseline']}): "
              f"{s['speedup_vs_spark_restart']}x (target {SPEEDUP_TARGET:g}x); to the start of the first "
              f"batch with the new code: {s['new_code_start_speedup']}x.", "",
              "Checks: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in s["checks"].items()), ""]
    for e in s["errors"]:
        lines.append(f"- {e['route']} failed: {e['error'][:300]}")
    write_lines(path, lines)


def plot(records: list[dict], path: str) -> None:
    """Each route's batches around the request: one bar per batch (its start and end, s from
    the request), the batch that first ran the new code marked."""
    plt = pyplot()

    by = _by_route(records)
    if not by:
        return
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.8 * len(by)))
    for y, (k, r) in enumerate(sorted(by.items())):
        for b, start, end in r["batches"]:
            if end < -6 * r["steady_batch_s"]:
                continue
            new = b >= r["effect_batch"]
            ax.barh(y, end - start, left=start, color="tab:green" if new else "tab:gray", edgecolor="white")
        ax.text(r["request_to_effect_s"], y + 0.35, f"{r['request_to_effect_s']:.1f} s", fontsize=8)
    ax.axvline(0, color="tab:red", linestyle="--", label="code change requested")
    ax.set_yticks(range(len(by)), sorted(by))
    ax.set_xlabel("s from the request (grey: old code, green: new code)")
    ax.legend(loc="lower right")
    save(fig, path)
