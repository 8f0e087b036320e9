"""``rhino-bench spark output``: a stateful operator with a large output (10 rows out per row
in), Rhino against Spark's own ``transformWithStateInPandas`` with the RocksDB state store
provider, in the same run, with the same processor class, on one local 3-host cluster
(:class:`~rhino_testing.harness.spark_cluster.LocalCluster`, hosts 127.0.0.60-62 by default).

    rhino-bench spark output --json --out bench/results/spark_output.jsonl \
        --report bench/results/spark_output.md --plot bench/results/spark_output.png

How it runs and what each record holds: bench/README.md, "Large output".
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main
from ..report import choices
from ..procmem import RssSampler, _mb, cmdline, driver_jvm_pid, rss_bytes
from .common import (ROCKSDB_PROVIDER, host_number, loadavg, non_negative_int, positive_float, positive_int, round_floats,
                     say)
from .output_report import (FLAT_TOLERANCE_MB, RHINO_VS_SPARK_TARGET, SYSTEMS, _MB, batch_records, plot, report,
                            summarize, system_record, window_bytes)

__all__ = ["main", "FanOutProcessor", "write_inputs", "summarize", "SYSTEMS", "RHINO_VS_SPARK_TARGET",
           "FLAT_TOLERANCE_MB", "window_bytes"]

INPUT_SCHEMA = "k long, v long"
OUTPUT_SCHEMA = "k long, v long, j int, seen long"
DRIVER_CONF = {"spark.driver.memory": "1g", "spark.driver.maxResultSize": "64m"}
_TASK_FIELDS = ("read_s", "open_s", "group_s", "fetch_s", "process_s", "write_s", "commit_s", "replicate_s")


# ---- the processor (the same class on both systems) -----------------------------------------

try:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - the CLI checks for PySpark before importing this module
    _Base = object  # type: ignore[assignment,misc]


class FanOutProcessor(_Base):  # type: ignore[misc,valid-type]
    """Per key, a row count in a ValueState (``"n long"``); per input row ``(k, v)``, ``fanout``
    output rows ``(k, v, j, seen)`` with ``j`` = 0..fanout-1 and ``seen`` the key's count of
    rows before this one (over all batches): a real stateful operator whose output is
    ``fanout`` times its input."""

    def __init__(self, fanout: int = 10) -> None:
        self.fanout = int(fanout)
        self.count: Any = None

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import numpy as np
        import pandas as pd

        k = int(key[0])
        got = self.count.get()
        seen = int(got[0]) if got is not None else 0
        f = self.fanout
        j = np.arange(f, dtype=np.int32)
        for pdf in rows:
            v = pdf["v"].to_numpy(dtype=np.int64)
            m = len(v)
            if not m:
                continue
            yield pd.DataFrame({"k": np.full(m * f, k, dtype=np.int64), "v": np.repeat(v, f),
                                "j": np.tile(j, m), "seen": np.repeat(np.arange(seen, seen + m, dtype=np.int64), f)})
            seen += m
        self.count.update((seen,))

    def close(self) -> None:
        pass


# ---- the input: one Parquet file per micro-batch ---------------------------------------------


def write_inputs(directory: Path, *, batches: int, rows: int, keys: int, seed: int = 7) -> list[int]:
    """``batches`` Parquet files of ``rows`` rows (``k`` drawn from 0..keys-1 by a seeded
    generator, ``v`` the row's global index), with strictly increasing modification times
    (Spark's file source takes files in that order). Returns the rows of each file."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 10 * batches - 100
    for b in range(batches):
        rng = np.random.default_rng(seed * 1_000_003 + b)
        k = rng.integers(0, keys, size=rows, dtype=np.int64)
        v = np.arange(b * rows, (b + 1) * rows, dtype=np.int64)
        path = directory / f"batch-{b:05d}.parquet"
        pq.write_table(pa.table({"k": k, "v": v}), path)
        os.utime(path, (base + 10 * b, base + 10 * b))
    return [rows] * batches


# ---- one system's run -------------------------------------------------------------------------


def _stream(spark: Any, input_dir: Path) -> Any:
    return spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))


def _driver_heap(spark: Any) -> dict:
    """The driver JVM's heap (used, committed) and non-heap (used: metaspace, code cache) in MiB,
    as its MemoryMXBean reports them (no GC forced)."""
    try:
        mx = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
        h, n = mx.getHeapMemoryUsage(), mx.getNonHeapMemoryUsage()
        return {"driver_heap_used_mb": _mb(h.getUsed()), "driver_heap_committed_mb": _mb(h.getCommitted()),
                "driver_nonheap_used_mb": _mb(n.getUsed())}
    except Exception:  # noqa: BLE001 - extra figures
        return {}


def _write_noop(df: Any, name: str) -> int:
    """Writes ``df`` to the noop sink; its row count, from an observed metric (aggregated on the
    executors: only one number reaches the driver)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    obs = Observation(name)
    df.observe(obs, F.count(F.lit(1)).alias("rows")).write.format("noop").mode("overwrite").save()
    return int(obs.get["rows"])


def run_system(spark: Any, cl: Any, *, system: str, args: argparse.Namespace, input_dir: Path, work: Path,
               sampler: RssSampler, operator_id: str) -> dict[int, dict]:
    """Every batch of ``input_dir`` through one system; per batch id its measurements (before
    Spark's progress is merged in)."""
    recs: dict[int, dict] = {}
    proc = FanOutProcessor(args.fanout)
    op = None
    if system == "rhino":
        from rhino.spark import transform_with_state

        op = transform_with_state(proc, key="k", output_schema=OUTPUT_SCHEMA, operator_id=operator_id,
                                  coordinator=cl.coordinator, secret_file=str(cl.secret_file),
                                  parallelism=args.parallelism, replicas=args.replicas,
                                  task_window_rows=args.window_rows, checkpoint_location=str(work))

        written: dict[int, int] = {}

        def write(out: Any, batch_id: int) -> None:
            # the fused sink: its job runs the stateful tasks (called again if the batch runs again)
            written[int(batch_id)] = _write_noop(out, f"rhino-out-{batch_id}-{len(op.reports)}")

        fused = op.for_each_batch(write)

        def fb(df: Any, batch_id: int) -> None:
            sampler.begin()
            w0 = time.time()
            t0 = time.perf_counter()
            if args.rhino_output == "fused":
                fused(df, batch_id)
                n = written[int(batch_id)]
                t1 = t2 = time.perf_counter()
            else:
                out = op.transform(df, batch_id)
                t1 = time.perf_counter()
                n = _write_noop(out, f"rhino-out-{batch_id}")
                t2 = time.perf_counter()
            rec = {"output_rows": n, "transform_s": t1 - t0, "noop_write_s": t2 - t1, "sink_s": t2 - t0,
                   "rhino_output": args.rhino_output, "_window": (w0, time.time())}
            rec.update(sampler.end())
            rec.update(_driver_heap(spark))
            rec.update(_rhino_breakdown(op.reports[-1]))
            recs[int(batch_id)] = rec

        writer = _stream(spark, input_dir).writeStream.foreachBatch(fb)
    else:
        def fb(df: Any, batch_id: int) -> None:
            sampler.begin()
            w0 = time.time()
            t0 = time.perf_counter()
            n = _write_noop(df, f"spark-out-{batch_id}")
            t1 = time.perf_counter()
            rec = {"output_rows": n, "noop_write_s": t1 - t0, "sink_s": t1 - t0, "_window": (w0, time.time())}
            rec.update(sampler.end())
            rec.update(_driver_heap(spark))
            recs[int(batch_id)] = rec

        out = _stream(spark, input_dir).groupBy("k").transformWithStateInPandas(proc, OUTPUT_SCHEMA, "Append",
                                                                              "None")
        writer = out.writeStream.outputMode("append").foreachBatch(fb)
    progress: dict[int, dict] = {}
    q = writer.option("checkpointLocation", str(work / "query")).trigger(availableNow=True).start()
    try:
        deadline = time.time() + args.timeout
        while not q.awaitTermination(0.5):
            if time.time() > deadline:
                raise TimeoutError(f"{system} did not finish in {args.timeout:g} s")
    finally:
        if q.isActive:
            q.stop()
        if op is not None:
            op.close()
    for p in q.recentProgress or []:
        progress[int(p["batchId"])] = p
    stages = _stages(spark, {b: r.pop("_window") for b, r in recs.items()})
    for b, rec in recs.items():
        rec["stages"] = stages.get(b, [])
        rec["executor_gc_s"] = round(sum(st["gc_s"] for st in rec["stages"]), 3)
        p = progress.get(b) or {}
        dur = p.get("durationMs") or {}
        rec["trigger_s"] = dur.get("triggerExecution", 0) / 1000.0 if dur else None
        rec["input_rows"] = p.get("numInputRows")
        rec["spark_duration_ms"] = {k: dur.get(k) for k in ("addBatch", "getBatch", "latestOffset", "queryPlanning",
                                                            "walCommit", "commitOffsets") if k in dur}
        ops = p.get("stateOperators") or []
        if ops:
            rec["spark_state_op"] = {k: ops[0].get(k) for k in ("numRowsTotal", "numRowsUpdated", "allUpdatesTimeMs",
                                                                "commitTimeMs", "memoryUsedBytes")}
    return recs


def _stages(spark: Any, windows: dict[int, tuple[float, float]]) -> dict[int, list[dict]]:
    """Per batch, the Spark stages submitted while its ``foreachBatch`` function ran (the
    monitoring REST API): where a batch's time went, in Spark's terms."""
    from .common import spark_rest, spark_time

    sc = spark.sparkContext
    try:
        stages = spark_rest(sc.uiWebUrl, f"applications/{sc.applicationId}/stages?status=complete")
    except Exception as e:  # noqa: BLE001 - the figures are extra
        say(f"Spark's REST API did not answer: {e}")
        return {}
    out: dict[int, list[dict]] = {}
    for st in sorted(stages, key=lambda x: x["stageId"]):
        t = spark_time(st.get("submissionTime"))
        if t is None:
            continue
        # the window it was submitted in; else (the REST API's times are in ms) the nearest within 0.5 s
        b = next((b for b, (a, z) in windows.items() if a <= t <= z), None)
        if b is None:
            near = min(windows, key=lambda b: min(abs(t - windows[b][0]), abs(t - windows[b][1])), default=None)
            if near is None or min(abs(t - windows[near][0]), abs(t - windows[near][1])) > 0.5:
                continue
            b = near
        done = spark_time(st.get("completionTime"))
        out.setdefault(b, []).append({
            "stage": st["stageId"], "name": (st.get("name") or "")[:60], "tasks": st.get("numTasks"),
            "duration_s": round(done - t, 3) if done is not None else None,
            "executor_run_s": round((st.get("executorRunTime") or 0) / 1000.0, 3),
            "executor_cpu_s": round((st.get("executorCpuTime") or 0) / 1e9, 3),
            "input_rows": st.get("inputRecords"), "output_rows": st.get("outputRecords"),
            "shuffle_read_rows": st.get("shuffleReadRecords"), "shuffle_write_rows": st.get("shuffleWriteRecords"),
            "shuffle_write_mb": round((st.get("shuffleWriteBytes") or 0) / _MB, 1),
            "spill_disk_mb": round((st.get("diskBytesSpilled") or 0) / _MB, 1),
            "spill_memory_mb": round((st.get("memoryBytesSpilled") or 0) / _MB, 1),
            "gc_s": round((st.get("jvmGcTime") or 0) / 1000.0, 3)})
    return out


def _rhino_breakdown(rep: Any) -> dict:
    """From the operator's BatchReport: the driver's parts, and per task its parts (mean over the
    tasks, and the slowest task); ``output_s`` = a task's time in none of its parts."""
    tasks = list(rep.tasks)

    def parts(t: dict) -> dict:
        d = {f: float(t.get(f) or 0.0) for f in _TASK_FIELDS}
        d["total_s"] = float(t["end"] - t["start"])
        d["output_s"] = d["total_s"] - sum(d[f] for f in _TASK_FIELDS if f != "replicate_s")
        return d

    out: dict[str, Any] = {"rhino_driver_s": {"begin_s": rep.begin_s, "job_s": rep.job_s, "commit_s": rep.commit_s},
                           "rhino_attempts": rep.attempts, "rhino_rows_out": rep.rows_out,
                           "rhino_tasks": len(tasks)}
    if tasks:
        ps = [parts(t) for t in tasks]
        out["task_mean_s"] = {f: sum(p[f] for p in ps) / len(ps) for f in ps[0]}
        slow = max(range(len(tasks)), key=lambda i: ps[i]["total_s"])
        out["task_slowest_s"] = ps[slow]
        out["task_rows_in"] = [int(t.get("rows_in", 0)) for t in tasks]
        out["task_windows"] = [int(t.get("windows", 0)) for t in tasks]
        out["max_window_rows"] = max(int(t.get("max_window_rows", 0)) for t in tasks)
        out["locality"] = sum(1 for t in tasks if t.get("host") == t.get("primary_host")) / len(tasks)
    return out


# ---- command line -------------------------------------------------------------------------------


class Output(Scenario):
    name = "spark output"
    description = ("A stateful operator with 10 rows out per row in: output rows/s, the driver's RSS "
                   "(spark.driver.memory=1g) and the Python workers' peak RSS, Rhino vs Spark's "
                   "transformWithStateInPandas with RocksDB, on one local 3-host cluster (--hosts).")
    workdir_prefix = "rhino-spark-output-"
    summary_on_failure = False
    setup_late = True  # with the driver JVM's pid and -Xmx, once the cluster is up

    def flags(self, ap: argparse.ArgumentParser) -> None:
        _flags(ap)

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.first_host + args.hosts - 1 > 254:
            ap.error(f"--first-host: the cluster's {args.hosts} hosts must fit 127.0.0.2..254")
        if args.replicas > args.hosts - 1:
            ap.error(f"--replicas {args.replicas}: an instance's replicas live on other hosts, so at most "
                     f"--hosts - 1 = {args.hosts - 1}")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {"systems": args.systems, "input_rows": args.input_rows, "fanout": args.fanout, "keys": args.keys,
                "batches": args.batches, "warmup": args.warmup, "window_rows": args.window_rows,
                "parallelism": args.parallelism, "replicas": args.replicas, "hosts": args.hosts,
                "first_host": args.first_host, "sample_interval": args.sample_interval, "seed": args.seed,
                "run_id": run_id, "rhino_output": args.rhino_output}

    def setup_extra(self, args: argparse.Namespace) -> dict:
        conf = dict(DRIVER_CONF, **{"spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
                                    "spark.sql.session.timeZone": "UTC"})
        conf.update(args.spark_conf_dict)
        return {"spark_conf": conf, "loadavg_1_5_15": loadavg()}

    def run(self, br: BenchRun) -> None:
        from rhino_testing.harness.spark_cluster import LocalCluster

        args, base, stack = br.args, br.base, br.stack
        n = args.warmup + args.batches
        input_dir = base / "input"
        say(f"writing {n} Parquet files of {args.input_rows:,} rows ({args.keys:,} keys) to {input_dir}")
        expected_in = write_inputs(input_dir, batches=n, rows=args.input_rows, keys=args.keys, seed=args.seed)
        say(f"starting a {args.hosts}-host cluster at 127.0.0.{args.first_host}")
        cl = stack.enter_context(LocalCluster.up(base / "cluster", hosts=args.hosts, first_host=args.first_host))
        spark = cl.spark_session("rhino-bench-output", **br.setup["spark_conf"])
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        jvm = driver_jvm_pid(spark)
        br.setup.update(driver_jvm_pid=jvm, driver_jvm_xmx=_xmx(jvm),
                        driver_rss_start_mb=_mb(rss_bytes(jvm) if jvm else None), executor_pids=cl.executor_pids())
        br.setup = round_floats(br.setup)
        br.emit(br.setup)
        sampler = RssSampler(jvm, cl.executor_pids(), args.sample_interval).start()
        stack.callback(sampler.stop)
        for system in args.systems:
            say(f"{system}: {n} batches of {args.input_rows:,} rows in, {args.fanout * args.input_rows:,} out")
            work = base / f"work-{system}"
            t1 = time.monotonic()
            recs = run_system(spark, cl, system=system, args=args, input_dir=input_dir, work=work,
                              sampler=sampler, operator_id=f"output-{br.run_id}")
            bl = batch_records(system, recs, warmup=args.warmup, fanout=args.fanout, expected_in=expected_in)
            for b in bl:
                br.emit(b)
                say(f"  {system} batch {b['batch']}: {b['output_rows']:,} rows out in {b['trigger_s']} s "
                    f"({(b['rows_per_s'] or 0) / 1e6:.2f}M rows/s), driver JVM {b['driver_rss_mb']} MiB, "
                    f"largest Python worker {b['python_worker_peak_rss_mb']} MiB")
            sr = system_record(system, bl)
            sr["wall_s"] = round(time.monotonic() - t1, 1)
            br.emit(sr)
            shutil.rmtree(work, ignore_errors=True)

    def replay_records(self, records: list[dict], args: argparse.Namespace) -> list[dict]:
        """The newest run, or run ``--run-id``: from its setup record to the next run's."""
        starts = [i for i, r in enumerate(records) if r.get("record") == "setup"
                  and (args.run_id is None or (r.get("parameters") or {}).get("run_id") == args.run_id)]
        if not starts:
            return []
        run = [records[starts[-1]]]
        for r in records[starts[-1] + 1:]:
            if r.get("record") == "setup":
                break
            run.append(r)
        return run


def _flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--run-id", default=None,
                    help="with --from: this run (its setup's parameters.run_id) instead of the newest")
    ap.add_argument("--systems", type=choices(SYSTEMS, "system"), default=list(SYSTEMS),
                    help=f"comma-separated, run in this order, from {', '.join(SYSTEMS)} (default all)")
    ap.add_argument("--input-rows", type=positive_int, default=2_000_000, help="input rows per batch (default 2M)")
    ap.add_argument("--fanout", type=positive_int, default=10, help="output rows per input row (default 10)")
    ap.add_argument("--keys", type=positive_int, default=20_000, help="distinct keys (default 20000)")
    ap.add_argument("--batches", type=positive_int, default=3, help="measured batches per system (default 3)")
    ap.add_argument("--warmup", type=non_negative_int, default=1, help="discarded batches per system (default 1)")
    ap.add_argument("--window-rows", type=positive_int, default=100_000,
                    help="Rhino's task_window_rows (default 100000, the library's default)")
    ap.add_argument("--rhino-output", choices=("fused", "checkpoint"), default="fused",
                    help="fused: op.for_each_batch(sink), the noop write runs the stateful tasks (default); "
                         "checkpoint: out = op.transform(df, b) (materialized on the executors), then the write")
    ap.add_argument("--parallelism", type=positive_int, default=3, help="Rhino instances (default 3)")
    ap.add_argument("--replicas", type=non_negative_int, default=2, help="Rhino's r (default 2)")
    ap.add_argument("--hosts", type=positive_int, default=3,
                    help="cluster hosts, one 1-core executor and one Rhino worker each (default 3)")
    ap.add_argument("--first-host", type=host_number, default=60, help="hosts are 127.0.0.N.. (default 60)")
    ap.add_argument("--sample-interval", type=positive_float, default=0.1,
                    help="seconds between RSS samples (default 0.1)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Spark conf for both systems (repeatable)")
    ap.add_argument("--timeout", type=positive_float, default=3600.0, help="per system, s (default 3600)")


def _xmx(pid: Optional[int]) -> Optional[str]:
    if pid is None:
        return None
    return next((a for a in cmdline(pid) if a.startswith("-Xmx")), None)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(Output(summarize=summarize, report=report, plot=plot), argv)
