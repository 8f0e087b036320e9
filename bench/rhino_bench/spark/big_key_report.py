"""``rhino-bench spark big-key``: the summary and the report of its records (pure: they read the
JSON lines alone, in a run or with ``--from``)."""

from __future__ import annotations

from typing import Any, Optional

from ..frame import source_line
from .common import round_floats
from .big_key_workload import STEPS
from ..report import fmt, last_summary, md_table, run_header, setup_of, write_lines


def summarize(records: list[dict], elapsed_s: Optional[float], checks: dict[str, bool],
              failed: Optional[str]) -> dict:
    steps = {r["step"]: r for r in records if r.get("record") == "step"}
    out: dict[str, Any] = {"record": "summary", "checks": checks, "all_passed": bool(checks) and all(checks.values())
                           and failed is None and set(STEPS) <= set(steps),
                           "failed_step": failed, "steps_run": [s for s in STEPS if s in steps],
                           "elapsed_s": None if elapsed_s is None else round(elapsed_s, 1)}
    f = steps.get("fill") or {}
    out["fill_s"] = f.get("fill_s")
    out["fill_payload_mib_per_s"] = f.get("payload_mib_per_s")
    for s in ("read_processor", "read_processor_after_handover"):
        if s in steps:
            out[f"{s}_s"] = steps[s].get("seconds_batch")
    for s in ("read_state_reader", "read_state_reader_after_handover"):
        if s in steps:
            out[f"{s}_s"] = steps[s].get("query_s")
    h = steps.get("handover") or {}
    out["handover_step_s"] = h.get("handover_step_s")
    out["handover_begin_s"] = h.get("begin_s")
    out["handover_bytes_copied"] = h.get("bytes_copied")
    return round_floats(out)


# ---- the report ----------------------------------------------------------------------------------


def _step_cells(r: dict, f: Any) -> str:
    """The time and detail cells of one step's row in the report."""
    s = r["step"]
    if s == "fill":
        return (f"{f(r.get('fill_s'), 1)} s | {r.get('records', 0):,} records, {_fmt(r.get('payload_bytes'))} of "
                f"payload in {len(r.get('batches', []))} batches ({f(r.get('payload_mib_per_s'), 1)} MiB/s; per "
                f"batch median {f(r.get('batch_s_median'), 1)} s, max {f(r.get('batch_s_max'), 1)} s); key and "
                f"value bytes committed: {_fmt(r.get('logical_bytes'))}")
    if s.startswith("read_processor"):
        bk, t = r.get("big_key") or {}, r.get("big_key_task") or {}
        return (f"{f(r.get('seconds_batch'), 1)} s | {bk.get('entries', 0):,} entries iterated by instance "
                f"{t.get('instance')}'s task (its processor {f(t.get('process_s'), 1)} s: "
                f"{f(r.get('payload_mib_per_s'), 1)} MiB/s of payload; {t.get('round_trips')} round trips); "
                f"{'equal to the model' if r.get('ok') else 'see the JSON line'}")
    if s.startswith("read_state_reader"):
        bk = r.get("big_key") or {}
        return (f"{f(r.get('query_s'), 1)} s | {bk.get('entries', 0):,} rows of the big key at batch "
                f"{r.get('batch')}, partition_id {r.get('big_key_partitions')} "
                f"({f(r.get('payload_mib_per_s'), 1)} MiB/s of payload through Spark SQL count/sum/crc32); "
                f"{'equal to the model' if r.get('ok') else 'see the JSON line'}")
    if s == "handover":
        return (f"{f(r.get('handover_step_s'), 3)} s | vnode {r.get('vnode')}: instance {r.get('origin')} "
                f"({r.get('origin_worker')}) -> {r.get('target')} ({r.get('target_worker')}), target worker in "
                f"the origin's chain: {r.get('target_in_origin_chain')}; bytes copied {r.get('bytes_copied')}; "
                f"the batch that ran it: begin_s {f(r.get('begin_s'), 2)} s (fill batches' median "
                f"{f(r.get('fill_begin_s_median'), 2)} s), whole batch {f(r.get('batch_s'), 1)} s; epoch "
                f"{r.get('epoch_before')} -> {r.get('epoch_after')}")
    return "- | -"


def report(records: list[dict], path: str) -> None:
    setup, summ = setup_of(records), last_summary(records)
    steps = {r["step"]: r for r in records if r.get("record") == "step"}
    p = setup.get("parameters", {})
    f = lambda x, d=2: fmt(x, d)  # noqa: E731
    el = (summ or {}).get("elapsed_s")
    L = run_header("One key with a large MapState: written, read back, moved (rhino.spark)", setup,
                   f"; the whole run took {el / 60:.1f} min ({el:.0f} s)." if el else "; the run did not finish.")
    L += [source_line(setup.get("source") or {}, summ), "",
         "What runs (bench/rhino_bench/spark/big_key.py): an ordinary `StatefulProcessor` "
         "(`RecordStoreProcessor`: per key a MapState `records`, `rid long` -> `seq long, payload binary`) on "
         "`rhino.spark.transform_with_state`, one micro-batch at a time through `process_batch` (what "
         "`foreachBatch` calls), on a local Spark, a `rhino coordinator` process and "
         f"{p.get('partitions')} `rhino worker` processes (r={p.get('replicas')}). A FILL row makes the processor "
         "`updateValue` records a..a+n-1 of its key (payload: `value_bytes` pseudo-random bytes of (key, record)); "
         "a SCAN row makes it iterate the key's map (`iterator()`) and emit the entries and the sums of the record "
         "ids, of `seq`, of `crc32(payload)` and of the payload lengths. Every read is compared with a model of "
         "what was written, computed in the driver from the fill plan.", ""]
    L += md_table(["step", "result", "time", "detail"],
                  [(s, "ok" if steps[s].get("ok") else "FAILED", _step_cells(steps[s], f)) for s in STEPS if s in steps],
                  "llrl")
    for r in steps.values():
        if r.get("error"):
            e = r["error"]
            L += ["", f"**{r['step']} failed**: `{e.get('type')}: {e.get('message', '')[:1500]}`"]
    fl = steps.get("fill")
    if fl and fl.get("batches"):
        L += ["", "Fill batches: the driver's parts (begin_batch at the coordinator, the Spark job, "
                  "commit_batch), then the big key's task (its processor, the write-back, the commit with the "
                  "chain's barrier replication, of which replication), its instance's checkpoint bytes, and the key "
                  "and value bytes all workers committed and the checkpoint bytes the primaries sent down their "
                  "chains (the workers' metrics):", "",
              ""]
        L += md_table(["batch", "records", "s", "begin", "job", "commit_batch", "task: process", "write", "commit",
                       "replicate", "checkpoint", "key+value bytes", "replicated"],
                      [[b["batch"], f"{b['records']:,}", f(b["seconds"], 1), f(b["begin_s"]), f(b["job_s"], 1),
                        f(b["commit_s"]), *(f((b.get("big_key_task") or {}).get(k), 1)
                                            for k in ("process_s", "write_s", "commit_s", "replicate_s")),
                        _fmt((b.get("big_key_task") or {}).get("checkpoint_bytes")), _fmt(b.get("logical_bytes")),
                        _fmt(b.get("replicated_bytes"))] for b in fl["batches"]], "r" * 13)
    L += ["", "Peak resident memory per step (MiB; sampled each second) and the bytes in the workers' "
              "directories after it (hard links once):", ""]
    rows = []
    for s in (s for s in STEPS if s in steps):
        r, pk = steps[s], steps[s].get("peak_rss_mib") or {}
        wmax = max((v for k, v in pk.items() if k.startswith("rhino_worker_")), default=None)
        rows.append((s, f(wmax, 0), f(pk.get("spark_jvm"), 0), f(pk.get("spark_python_max"), 0),
                     f(pk.get("driver_python"), 0), f(r.get("min_mem_available_mib"), 0), _fmt(r.get("rhino_dir_bytes"))))
    L += md_table(["step", "Rhino workers (max)", "Spark JVM", "Spark Python worker (max)", "driver",
                   "min MemAvailable", "workers' dirs"], rows, "lrrrrrr")
    if summ:
        L += ["", "Checks:", ""]
        for name, ok in (summ.get("checks") or {}).items():
            L.append(f"- {'PASS' if ok else 'FAIL'}: {name}")
        L += ["", f"**{'All checks passed.' if summ.get('all_passed') else 'NOT all checks passed'}**"
              + (f" (stopped at step {summ['failed_step']})" if summ.get("failed_step") else "")]
    write_lines(path, L)


def _fmt(n: Optional[float]) -> str:
    if n is None:
        return "-"
    from rhino._sizes import format_bytes

    return format_bytes(float(n))
