"""``rhino-bench spark output``: the summary, the plot and the report of its records (pure: they read the
JSON lines alone, in a run or with ``--from``)."""

from __future__ import annotations

from typing import Any

from ..report import last_summary, md_table, pyplot, run_header, save, setup_of, write_lines
from .common import mean as _mean, median, round_floats

from .state_size_workload import SYSTEMS
RHINO_VS_SPARK_TARGET = 1.0
FLAT_TOLERANCE_MB = 64.0  # the driver's RSS, last batch minus first: "flat" if at most this
IN_ROW_BYTES = 16  # k, v
OUT_ROW_BYTES = 28  # k, v, j (int32), seen
_MB = 1 << 20


def window_bytes(window_rows: int, fanout: int) -> int:
    """The bytes of one task window's data: its input rows and their output, as columns."""
    return window_rows * (IN_ROW_BYTES + fanout * OUT_ROW_BYTES)


# ---- records ----------------------------------------------------------------------------------


def batch_records(system: str, recs: dict[int, dict], *, warmup: int, fanout: int, expected_in: list[int]) -> list[dict]:
    out = []
    for i, b in enumerate(sorted(recs)):
        r = recs[b]
        want = expected_in[i] if i < len(expected_in) else None
        rec: dict[str, Any] = {"record": "batch", "system": system, "batch": b, "warmup": i < warmup,
                               "input_rows": r.get("input_rows"), "expected_input_rows": want,
                               "output_rows": r["output_rows"],
                               "expected_output_rows": fanout * want if want is not None else None,
                               "trigger_s": r.get("trigger_s"),
                               "rows_per_s": (r["output_rows"] / r["trigger_s"]) if r.get("trigger_s") else None}
        rec.update({k: v for k, v in r.items() if k not in rec})
        out.append(round_floats(rec))
    return out


def system_record(system: str, batches: list[dict]) -> dict:
    steady = [b for b in batches if not b["warmup"] and b.get("trigger_s")]
    rows = sum(b["output_rows"] for b in steady)
    secs = sum(b["trigger_s"] for b in steady)
    drv = [b["driver_rss_mb"] for b in batches if b.get("driver_rss_mb") is not None]
    rec: dict[str, Any] = {
        "record": "system", "system": system, "batches": len(batches), "steady_batches": len(steady),
        "output_rows": rows, "seconds": secs, "rows_per_s": rows / secs if secs else None,
        "trigger_s_median": median([b["trigger_s"] for b in steady]),
        "rows_per_s_by_batch": [b.get("rows_per_s") for b in batches],
        "driver_rss_mb_by_batch": drv, "driver_rss_first_mb": drv[0] if drv else None,
        "driver_rss_last_mb": drv[-1] if drv else None, "driver_rss_max_mb": max(
            [b.get("driver_rss_max_mb") or 0 for b in batches] + drv, default=None),
        "driver_rss_growth_mb": (drv[-1] - drv[0]) if drv else None,
        "driver_heap_used_mb_by_batch": [b.get("driver_heap_used_mb") for b in batches],
        "driver_heap_committed_mb_by_batch": [b.get("driver_heap_committed_mb") for b in batches],
        "driver_nonheap_used_mb_by_batch": [b.get("driver_nonheap_used_mb") for b in batches],
        "python_driver_rss_mb_by_batch": [b.get("python_driver_rss_mb") for b in batches],
        "python_worker_peak_rss_mb_by_batch": [b.get("python_worker_peak_rss_mb") for b in batches],
        "python_worker_peak_rss_mb": max((b.get("python_worker_peak_rss_mb") or 0 for b in batches), default=None),
        "python_worker_peak_sum_mb": max((b.get("python_worker_peak_sum_mb") or 0 for b in batches), default=None),
        "python_worker_start_rss_mb": min((b.get("python_worker_start_rss_mb") or 0 for b in steady), default=None),
        "python_worker_growth_mb": max((b.get("python_worker_growth_mb") or 0 for b in steady), default=None),
        "outputs_expected": all(b["output_rows"] == b.get("expected_output_rows") for b in batches),
        "executor_gc_s_mean": _mean([b.get("executor_gc_s") for b in steady]),
    }
    rec["driver_rss_flat"] = (rec["driver_rss_growth_mb"] is not None
                              and rec["driver_rss_growth_mb"] <= FLAT_TOLERANCE_MB)
    if any("task_slowest_s" in b for b in steady):
        rb = [b for b in steady if "task_slowest_s" in b]
        keys = list(rb[0]["task_slowest_s"])
        rec["task_slowest_s"] = {k: sum(b["task_slowest_s"][k] for b in rb) / len(rb) for k in keys}
        rec["task_mean_s"] = {k: sum(b["task_mean_s"][k] for b in rb) / len(rb) for k in keys}
        rec["rhino_driver_s"] = {k: sum(b["rhino_driver_s"][k] for b in rb) / len(rb) for k in rb[0]["rhino_driver_s"]}
        rec["transform_s"] = sum(b["transform_s"] for b in rb) / len(rb)
        rec["noop_write_s"] = sum(b["noop_write_s"] for b in rb) / len(rb)
        rec["max_window_rows"] = max(b.get("max_window_rows") or 0 for b in rb)
        rec["locality"] = min(b.get("locality", 1.0) for b in rb)
    return round_floats(rec)



def summarize(records: list[dict]) -> dict:
    by = {r["system"]: r for r in records if r.get("record") == "system"}
    setup = next((r for r in records if r.get("record") == "setup"), {})
    params = setup.get("parameters", {})
    out: dict[str, Any] = {"record": "summary"}
    rh, sp = by.get("rhino"), by.get("spark-rocksdb")
    if rh and sp and sp.get("rows_per_s") and rh.get("rows_per_s"):
        out["rhino_vs_spark"] = round(rh["rows_per_s"] / sp["rows_per_s"], 3)
        out["rhino_vs_spark_target_met"] = out["rhino_vs_spark"] >= RHINO_VS_SPARK_TARGET
    out["rows_per_s"] = {s: r.get("rows_per_s") for s, r in by.items()}
    out["driver_rss"] = {s: {"first_mb": r.get("driver_rss_first_mb"), "last_mb": r.get("driver_rss_last_mb"),
                             "max_mb": r.get("driver_rss_max_mb"), "growth_mb": r.get("driver_rss_growth_mb"),
                             "flat": r.get("driver_rss_flat")} for s, r in by.items()}
    out["driver_rss_flat"] = bool(by) and all(r.get("driver_rss_flat") for r in by.values())
    out["python_worker_peak_rss_mb"] = {s: r.get("python_worker_peak_rss_mb") for s, r in by.items()}
    if params.get("window_rows") and params.get("fanout"):
        wb = window_bytes(params["window_rows"], params["fanout"])
        out["window_mb"] = round(wb / _MB, 1)
        out["python_worker_growth_mb"] = {s: r.get("python_worker_growth_mb") for s, r in by.items()}
        if rh and rh.get("python_worker_growth_mb") is not None:
            out["rhino_worker_growth_mb"] = rh["python_worker_growth_mb"]
            out["rhino_worker_growth_per_window"] = round(out["rhino_worker_growth_mb"] / (wb / _MB), 2)
    out["outputs_expected"] = bool(by) and all(r.get("outputs_expected") for r in by.values())
    return out


# ---- plot and report --------------------------------------------------------------------------

_COLORS = {"rhino": "#d04040", "spark-rocksdb": "#404040"}


def plot(records: list[dict], path: str) -> None:
    plt = pyplot()

    bs = [r for r in records if r.get("record") == "batch"]
    if not bs:
        return
    setup = next((r for r in records if r.get("record") == "setup"), {})
    params = setup.get("parameters", {})
    systems = [s for s in SYSTEMS if any(b["system"] == s for b in bs)]
    fig, axs = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        sb = [b for b in bs if b["system"] == s]
        xs = list(range(len(sb)))
        axs[0].bar([x + (i - (len(systems) - 1) / 2) * width for x in xs], [(b["rows_per_s"] or 0) / 1e6 for b in sb],
                   width=width, color=_COLORS[s], label=s)
        for x, b in zip(xs, sb):
            if b["warmup"]:
                axs[0].text(x + (i - (len(systems) - 1) / 2) * width, (b["rows_per_s"] or 0) / 1e6, "warm-up",
                            ha="center", va="bottom", fontsize=7, rotation=90)
        axs[1].plot(xs, [b.get("driver_rss_mb") for b in sb], "o-", color=_COLORS[s], label=f"{s}: driver JVM")
        axs[1].plot(xs, [b.get("python_driver_rss_mb") for b in sb], "s--", color=_COLORS[s], alpha=0.6,
                    label=f"{s}: Python driver")
        axs[2].plot(xs, [b.get("python_worker_peak_rss_mb") for b in sb], "o-", color=_COLORS[s],
                    label=f"{s}: largest worker")
        axs[2].plot(xs, [b.get("python_worker_start_rss_mb") for b in sb], "x:", color=_COLORS[s], alpha=0.6,
                    label=f"{s}: at the batch's start")
    for ax in axs:
        ax.xaxis.get_major_locator().set_params(integer=True)
    axs[0].set_xlabel("batch")
    axs[0].set_ylabel("output rows/s (millions; triggerExecution)")
    axs[0].set_title(f"{params.get('fanout', '?')} rows out per row in, "
                     f"{(params.get('input_rows') or 0) * (params.get('fanout') or 0) / 1e6:g}M per batch")
    axs[0].legend(fontsize=8)
    axs[1].set_xlabel("batch")
    axs[1].set_ylabel("RSS after the batch (MiB)")
    axs[1].set_title("driver (spark.driver.memory=1g)")
    axs[1].set_ylim(bottom=0)
    axs[1].legend(fontsize=7)
    if params.get("window_rows") and params.get("fanout"):
        wb = window_bytes(params["window_rows"], params["fanout"]) / _MB
        starts = [b.get("python_worker_start_rss_mb") or 0 for b in bs if b["system"] == "rhino" and not b["warmup"]]
        if starts:
            axs[2].axhline(min(starts) + wb, color=_COLORS["rhino"], lw=0.8, ls="-.",
                           label=f"rhino: lowest start (steady) + one window's columns ({wb:.0f} MiB)")
    axs[2].set_xlabel("batch")
    axs[2].set_ylabel("peak RSS of one Python worker (MiB)")
    axs[2].set_title("executors' Python workers")
    axs[2].set_ylim(bottom=0)
    axs[2].legend(fontsize=7)
    save(fig, path)


def report(records: list[dict], path: str) -> None:
    setup = setup_of(records)
    params, src = setup.get("parameters", {}), setup.get("source") or {}
    bs = [r for r in records if r.get("record") == "batch"]
    ss = {r["system"]: r for r in records if r.get("record") == "system"}
    summ = last_summary(records) or summarize(records)

    def f(x: Any, d: int = 1) -> str:
        return "-" if x is None else (f"{x:,.{d}f}" if isinstance(x, float) else f"{x:,}" if isinstance(x, int)
                                      else str(x))

    L = run_header("Spark output: a stateful operator emitting 10 rows per input row, Rhino vs Spark's RocksDB state "
                   "store", setup, f"; load average at the start {setup.get('loadavg_1_5_15')}, at the end "
                   f"{summ.get('loadavg_1_5_15')}; {summ.get('elapsed_s')} s in all.")
    L += [f"Code: commit {src.get('commit')}; files differing from it in the working tree: "
         f"{', '.join(src.get('modified') or []) or 'none'}; library files modified during the run: "
         f"{', '.join(summ.get('source_changed_during_run') or []) or 'none'}.", "",
         "Spark settings: " + ", ".join(f"`{k}={v}`" for k, v in setup.get("spark_conf", {}).items())
         + f" (besides the cluster's: {params.get('hosts')} hosts, one 1-core executor with 1g per host, "
         f"`spark.sql.shuffle.partitions={max(2, params.get('hosts') or 3)}`). "
         f"Driver JVM: pid {setup.get('driver_jvm_pid')}, `{setup.get('driver_jvm_xmx')}`; its RSS after the session "
         f"started: {f(setup.get('driver_rss_start_mb'))} MiB.", "",
         f"Input: one Parquet file per batch, {f(params.get('input_rows'))} rows over {f(params.get('keys'))} keys "
         f"(`k long, v long`), read with `maxFilesPerTrigger=1`. The processor (the same class on both) counts "
         f"each key's rows in a ValueState and emits {params.get('fanout')} rows (`k, v, j, seen`) per input row; "
         "the output is written with `df.write.format(\"noop\")` inside `foreachBatch` and counted with "
         "`Dataset.observe` (nothing but that count reaches the driver).", "",
         "## Per batch", ""]
    L += md_table(["system", "batch", "input rows", "output rows", "batch s (triggerExecution)", "output rows/s",
                   "driver JVM RSS (MiB)", "max during", "Python driver RSS", "worker peak RSS (MiB)",
                   "its RSS at start", "largest growth", "active workers"],
                  [(b["system"], f"{b['batch']}{' (warm-up)' if b['warmup'] else ''}", f(b.get("input_rows")),
                    f(b["output_rows"]), f(b.get("trigger_s"), 2), f(b.get("rows_per_s"), 0),
                    *(f(b.get(k)) for k in ("driver_rss_mb", "driver_rss_max_mb", "python_driver_rss_mb",
                                            "python_worker_peak_rss_mb", "python_worker_start_rss_mb",
                                            "python_worker_growth_mb")), b.get("python_workers")) for b in bs],
                  "l" + "r" * 12)
    if any(b.get("driver_heap_used_mb") is not None for b in bs):
        L += ["", "The driver JVM's memory after each batch (MiB; its MemoryMXBean, no GC forced):", ""]
        L += md_table(["system", "RSS by batch", "heap used", "heap committed", "non-heap used (metaspace, code cache)"],
                      [[s] + [", ".join(f(b.get(k), 0) for b in bs if b["system"] == s)
                              for k in ("driver_rss_mb", "driver_heap_used_mb", "driver_heap_committed_mb",
                                        "driver_nonheap_used_mb")]
                       for s in SYSTEMS if any(b["system"] == s for b in bs)])
    L += ["", "## Per system (steady batches)", ""]
    L += md_table(["system", "output rows/s", "median batch s", "driver RSS first / last / max (MiB)",
                   f"flat (growth <= {FLAT_TOLERANCE_MB:g} MiB)", "worker peak RSS (MiB)", "worker growth (MiB)",
                   "executors' GC per batch (s)", f"outputs = {params.get('fanout')} x input"],
                  [(s, f(r.get("rows_per_s"), 0), f(r.get("trigger_s_median"), 2),
                    f"{f(r.get('driver_rss_first_mb'))} / {f(r.get('driver_rss_last_mb'))} / "
                    f"{f(r.get('driver_rss_max_mb'))}", f"{r.get('driver_rss_flat')} ({f(r.get('driver_rss_growth_mb'))})",
                    f(r.get("python_worker_peak_rss_mb")), f(r.get("python_worker_growth_mb")),
                    f(r.get("executor_gc_s_mean"), 2), r.get("outputs_expected")) for s, r in ss.items()],
                  "lrrllrrrl")
    rh = ss.get("rhino")
    if rh and rh.get("task_slowest_s"):
        keys = list(rh["task_slowest_s"])
        L += ["", "Rhino, per task (mean of the steady batches, seconds; `replicate_s` is inside `commit_s`; "
              "`output_s` is the task's time outside its own parts, while Spark consumed its output: Arrow to the "
              "JVM, then the noop write (fused) or into the block manager (`localCheckpoint`)):", "",
              "| | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys),
              "| slowest task | " + " | ".join(f(rh["task_slowest_s"][k], 3) for k in keys) + " |",
              "| mean task | " + " | ".join(f(rh["task_mean_s"][k], 3) for k in keys) + " |", "",
              (f"Driver, per batch: `op.transform` {f(rh.get('transform_s'), 2)} s (begin "
               f"{f(rh['rhino_driver_s']['begin_s'], 3)}, job {f(rh['rhino_driver_s']['job_s'], 2)}, commit "
               f"{f(rh['rhino_driver_s']['commit_s'], 3)}), then the noop write of its output "
               f"{f(rh.get('noop_write_s'), 2)} s." if params.get("rhino_output", "checkpoint") == "checkpoint" else
               f"Driver, per batch: `op.for_each_batch(sink)` {f(rh.get('transform_s'), 2)} s (begin "
               f"{f(rh['rhino_driver_s']['begin_s'], 3)}, the sink's noop write, which ran the stateful tasks, "
               f"{f(rh['rhino_driver_s']['job_s'], 2)}, commit {f(rh['rhino_driver_s']['commit_s'], 3)}).")
              + f" Largest task window: {f(rh.get('max_window_rows'))} rows; locality {f(rh.get('locality'), 2)}."]
    last = {}
    for b in bs:
        if not b["warmup"] and b.get("stages"):
            last[b["system"]] = b
    if last:
        L += ["", "## Spark stages of each system's last batch", "",
              "(submitted while its `foreachBatch` function ran; seconds; the REST API's figures)", ""]
        L += md_table(["system", "stage", "name", "tasks", "duration", "executor run", "executor CPU", "GC",
                       "input rows", "shuffle write rows", "output rows", "spill disk MiB"],
                      [(f"{sys_} (batch {b['batch']})", st["stage"], st["name"], st["tasks"],
                        *(f(st[k], 2) for k in ("duration_s", "executor_run_s", "executor_cpu_s", "gc_s")),
                        *(f(st[k]) for k in ("input_rows", "shuffle_write_rows", "output_rows", "spill_disk_mb")))
                       for sys_, b in last.items() for st in b["stages"]], "lrlrrrrrrrrr")
    L += ["", "## Targets", ""]
    if "rhino_vs_spark" in summ:
        L.append(f"- Rhino at least as fast as Spark's own operator (output rows/s over the steady batches): "
                 f"{summ['rhino_vs_spark']}x: **{'met' if summ['rhino_vs_spark_target_met'] else 'not met'}**.")
    for s, d in (summ.get("driver_rss") or {}).items():
        L.append(f"- {s}: driver JVM RSS flat across batches: first {f(d['first_mb'])}, last {f(d['last_mb'])}, "
                 f"max {f(d['max_mb'])} MiB (growth {f(d['growth_mb'])} MiB): **{'met' if d['flat'] else 'not met'}**.")
    if summ.get("window_mb") is not None:
        part = (params.get("input_rows") or 0) // max(1, params.get("parallelism") or 1)
        L.append(f"- Python workers: one task window is {f(params.get('window_rows'))} input rows = "
                 f"{f(summ['window_mb'])} MiB of input and output columns (a task's whole partition, "
                 f"{f(part)} rows, would be {f(window_bytes(part, params.get('fanout') or 0) / _MB)} MiB); "
                 f"the largest growth of one Rhino worker within a batch was "
                 f"{f(summ.get('rhino_worker_growth_mb'))} MiB ({summ.get('rhino_worker_growth_per_window')} "
                 "windows); peak RSS "
                 + ", ".join(f"{s} {f(v)} MiB" for s, v in (summ.get("python_worker_peak_rss_mb") or {}).items())
                 + "; growth "
                 + ", ".join(f"{s} {f(v)} MiB" for s, v in (summ.get("python_worker_growth_mb") or {}).items())
                 + ".")
    L.append(f"- Every batch's output = {params.get('fanout')} x its input rows (counted on the executors): "
             f"**{'yes' if summ.get('outputs_expected') else 'NO'}**.")
    write_lines(path, L)
