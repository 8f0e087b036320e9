"""A NEXMark query as a streaming pipeline, on Rhino or on Spark's own operator:
what the exactly-once tests, the benchmarks and the demo run.

``system="rhino"``: ``events -> prepare -> foreachBatch(op.for_each_batch(sink))`` with
``rhino.spark.transform_with_state`` (state in the hosts' Rhino workers).
``system="spark"``: ``events -> prepare -> groupBy(key).transformWithStateInPandas(...)``
with the RocksDB state store provider, written with ``foreachBatch`` to the same sink.
Both run the **same processor class** and the same stateless ``prepare``.

The sink is idempotent by batch id (a dict batch id -> rows), as a ``foreachBatch``
sink must be; per-batch durations come from Spark's own progress reports
(``durationMs.triggerExecution``) for both systems.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pandas as pd

from .queries import QUERIES
from .source import NexmarkDataSource

__all__ = ["PipelineRun", "run_pipeline", "ROCKSDB_PROVIDER"]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass
class PipelineRun:
    system: str
    query: str
    outputs: dict[int, pd.DataFrame] = field(default_factory=dict)
    #: per batch: batch id, wall start/end (epoch s), Spark's triggerExecution ms, rows in
    batches: list[dict] = field(default_factory=list)
    operator: Any = None
    chain: Any = None  # what runs the operator: itself, or a rhino.spark.Pipeline of it
    seconds: float = 0.0
    #: the StreamingQuery while it runs (set right after start)
    query: Any = None
    #: Spark's progress reports by batch id, all of them (collected while the query runs)
    progress: dict[int, dict] = field(default_factory=dict)

    def output(self) -> pd.DataFrame:
        """Every batch's output, in batch order."""
        frames = [f for _, f in sorted(self.outputs.items()) if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _events(spark: Any, *, events_per_batch: int, max_events: int, options: dict) -> Any:
    spark.dataSource.register(NexmarkDataSource)
    r = (spark.readStream.format("nexmark").option("eventsPerBatch", int(events_per_batch))
         .option("maxEvents", int(max_events)))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_pipeline(spark: Any, *, system: str, query: str, checkpoint_dir: str | Path, events_per_batch: int,
                 max_events: int, source_options: Optional[dict] = None, params: Optional[dict] = None,
                 operator_id: Optional[str] = None, coordinator: Optional[str] = None,
                 secret_file: Optional[str] = None, parallelism: int = 3, replicas: int = 2,
                 on_batch: Optional[Callable[[int, PipelineRun], None]] = None, locality: bool = True,
                 timeout_s: float = 1800.0, operator_options: Optional[dict] = None,
                 stop_when: Optional[Callable[[PipelineRun], bool]] = None, spark_conf: Optional[dict] = None,
                 processor: Any = None, chain: Optional[Callable[[Any], Any]] = None) -> PipelineRun:
    """Runs ``query`` over ``max_events`` events (``events_per_batch`` per micro-batch) to the
    end (Trigger.AvailableNow); returns the outputs by batch and the timings. ``on_batch(batch_id,
    run)`` is called once per batch when it is done (Rhino: committed, its report in
    ``run.operator.reports``; Spark: from the sink, after its output). ``stop_when(run)`` is
    polled (every 0.2 s) while the query runs, and stops it once true. ``spark_conf``: session
    conf entries set before the query starts; ``processor``: one to run instead of the query's
    own (new code, restarted from the same checkpoint); ``chain``: Rhino's operator -> what
    runs it (a ``rhino.spark.Pipeline``, kept in ``run.chain``)."""
    q, params, ck = QUERIES[query], params or {}, Path(checkpoint_dir)
    proc = processor if processor is not None else q.processor_factory(**params)
    run = PipelineRun(system=system, query=query)
    events = _events(spark, events_per_batch=events_per_batch, max_events=max_events,
                     options=source_options or {})
    prepared = q.prepare(events.withWatermark(q.event_time_column, q.watermark_delay), **params)
    lock = threading.Lock()

    def done(batch_id: int, t0: float) -> None:
        """A batch is done (Rhino: committed): ``on_batch``, then its record."""
        if on_batch is not None:
            on_batch(int(batch_id), run)
        run.batches.append({"batch": int(batch_id), "sink_start": t0, "sink_end": time.time()})

    def sink(df: Any, batch_id: int) -> None:
        t0 = time.time()
        pdf = df.toPandas()
        with lock:
            run.outputs[int(batch_id)] = pdf  # idempotent by batch id
        if system != "rhino":
            done(batch_id, t0)

    if system == "rhino":
        from rhino.spark.operator import TransformWithState

        run.operator = op = TransformWithState(
            proc, key=q.key, output_schema=q.output_schema, operator_id=operator_id or f"nexmark-{query}",
            coordinator=coordinator, secret_file=secret_file, parallelism=parallelism, replicas=replicas,
            time_mode=q.time_mode, event_time=q.event_time_column, watermark_delay=q.watermark_delay,
            checkpoint_location=str(ck / "rhino"), locality=locality, **(operator_options or {}))
        # The sink is fused with the stateful stage: it runs before the batch commits, and again
        # if the batch runs again. A batch is done once for_each_batch returns (committed).
        run.chain = chain(op) if chain is not None else op
        fb = run.chain.for_each_batch(sink)

        def body(df: Any, batch_id: int) -> None:
            t0 = time.time()
            fb(df, batch_id)
            done(batch_id, t0)

        writer = prepared.writeStream.foreachBatch(body)
    elif system == "spark":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        out = prepared.groupBy(*q.key).transformWithStateInPandas(
            proc, q.output_schema, q.output_mode, q.time_mode)
        writer = out.writeStream.outputMode("append").foreachBatch(sink)
    else:
        raise ValueError(f"system must be 'rhino' or 'spark', not {system!r}")
    for k, v in (spark_conf or {}).items():
        spark.conf.set(k, str(v))
    t0 = time.time()
    sq = writer.option("checkpointLocation", str(ck / "query")).trigger(availableNow=True).start()
    run.query = sq

    def collect_progress() -> None:
        for p in sq.recentProgress or []:
            run.progress.setdefault(int(p["batchId"]), p)

    try:
        if stop_when is None:
            if not sq.awaitTermination(timeout_s):
                raise TimeoutError(f"{system} {query} did not finish in {timeout_s:g} s")
        else:
            deadline = time.time() + timeout_s
            while not sq.awaitTermination(0.2):
                collect_progress()
                if stop_when(run):
                    break
                if time.time() > deadline:
                    raise TimeoutError(f"{system} {query} did not finish in {timeout_s:g} s")
    finally:
        if sq.isActive:
            sq.stop()
    run.seconds = time.time() - t0
    collect_progress()
    progress = run.progress
    for b in run.batches:
        p = progress.get(b["batch"])
        if p is not None:
            b["trigger_ms"] = p.get("durationMs", {}).get("triggerExecution")
            b["rows_in"] = p.get("numInputRows")
    return run
