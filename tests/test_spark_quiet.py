"""Timers on a quiet stream: Spark's own ``transformWithStateInPandas`` (RocksDB) and
Rhino (``rhino.spark.with_ticks`` + ``for_each_batch``) as two live queries on the
same file stream, with a processing-time trigger; after the last file, no input
arrives. Spark runs no-data batches for its stateful operator; Rhino's query runs
batches because the ticks' offsets advance.

- Event time: a session whose timer the last file's watermark passes is emitted by
  the first batch after the input stops, on both, with the same sessions.
- Processing time: a timer registered by the last input fires in a batch with no
  input at all, on both, with the same output; a timer deleted by later input never
  fires.

The real `rhino worker` processes are on 127.0.0.2..4, as in test_spark_operator."""

from __future__ import annotations

import os
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TRIGGER = "1 second"


class SessionProcessor(StatefulProcessor):
    """Event time: per key, its events' count and span; a timer at last + GAP emits and clears."""

    GAP = 3000

    def init(self, handle):
        self.handle = handle
        self.st = handle.getValueState("s", "first long, last long, n long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        ts = sorted(int(t.value // 1_000_000) for t in pdf["ts"])
        cur = self.st.get()
        first, last, n = cur if cur else (ts[0], ts[0], 0)
        for t in ts:
            first, last, n = min(first, t), max(last, t), n + 1
        if cur:
            self.handle.deleteTimer(cur[1] + self.GAP)
        self.st.update((first, last, n))
        self.handle.registerTimer(last + self.GAP)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        first, last, n = self.st.get()
        self.st.clear()
        yield pd.DataFrame({"k": [key[0]], "first": [first], "last": [last], "n": [n]})

    def close(self):
        pass


class IdleProcessor(StatefulProcessor):
    """Processing time: per key, a count, and a timer DELAY ms after its last input (moved on by
    more input); the timer emits the count."""

    DELAY = 8000  # longer than the gap between two batches on a loaded machine

    def init(self, handle):
        self.handle = handle
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.n.get() or (0,))[0] + sum(len(p) for p in rows)
        self.n.update((n,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + self.DELAY)
        yield pd.DataFrame({"k": [key[0]], "n": [n], "why": ["data"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"k": [key[0]], "n": [self.n.get()[0]], "why": ["idle"]})

    def close(self):
        pass


class IdleProcessorRows(IdleProcessor):
    """The same in the Row form (``transformWithState``): the same counts, timers and rows."""

    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        n = (self.n.get() or (0,))[0] + sum(1 for _ in rows)
        self.n.update((n,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + self.DELAY)
        yield Row(k=key[0], n=n, why="data")

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        from pyspark.sql import Row

        yield Row(k=key[0], n=self.n.get()[0], why="idle")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("quiet")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-quiet", rocksdb=True)
    yield s
    s.stop()


def _op(cluster, processor, op_id, schema, **kw):
    from rhino.spark import transform_with_state

    return transform_with_state(processor, key="k", output_schema=schema, operator_id=op_id,
                                coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                parallelism=3, replicas=1, locality=False, **kw)


def _write_files(src, frames) -> None:
    """One parquet file per micro-batch, with increasing mtimes (the file source's order)."""
    base = time.time() - 100
    for i, pdf in enumerate(frames):
        f = src / f"part-{i:03d}.parquet"
        pdf.to_parquet(f, coerce_timestamps="us") if "ts" in pdf else pdf.to_parquet(f)
        os.utime(f, (base + i, base + i))


class _Sink:
    """Keeps each batch's output with its batch id, and when the batch reached the sink."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, float, pd.DataFrame]] = []

    def __call__(self, df, b) -> None:
        self.batches.append((int(b), time.time(), df.toPandas()))

    def rows(self) -> pd.DataFrame:
        """Each batch's last delivery. A query stopped between its sink and its commit delivers
        that batch again at its restart (foreachBatch is at-least-once; Spark's guide asks the
        sink to dedupe by batch id); a CI run saw Spark's sink get one batch twice."""
        last = {b: f for b, _, f in self.batches}
        frames = [f.assign(batch=b) for b, f in sorted(last.items()) if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _wait(pred, queries, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        for q in queries:
            if q.exception() is not None:
                raise AssertionError(f"query failed: {q.exception()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _last_data_batch(q) -> int:
    """The id of the query's last batch that read rows from the file source (Spark's progress;
    the ticks' rate source counts its rows too, before the filter)."""
    return max(p["batchId"] for p in q.recentProgress
               if any(s["numInputRows"] > 0 for s in p["sources"] if "FileStream" in s["description"]))


def test_a_session_closes_when_the_stream_goes_quiet_as_in_spark(cluster, spark, tmp_path):
    from rhino.spark import with_ticks

    src = tmp_path / "src"
    src.mkdir()
    t0 = 1_000_000
    ts = lambda ms: pd.Timestamp(t0 + ms, unit="ms")  # noqa: E731
    # key 0: an event every 5 s of event time (its session never closes); key 1: two events early
    # (closed while input flows); key 2: one event at 10.5 s, whose timer (13.5 s) only the last
    # file's watermark (15 s - 1 s delay) passes: it closes in the batch after the input stops
    files = [pd.DataFrame({"k": [0, 1], "ts": [ts(0), ts(200)]}),
             pd.DataFrame({"k": [0, 1], "ts": [ts(5000), ts(5100)]}),
             pd.DataFrame({"k": [0, 2], "ts": [ts(10000), ts(10500)]}),
             pd.DataFrame({"k": [0], "ts": [ts(15000)]})]
    _write_files(src, files)
    schema, out_schema = "k long, ts timestamp", "k long, first long, last long, n long"

    def stream():
        return (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
                .withWatermark("ts", "1 second"))

    got_s, got_r = _Sink(), _Sink()
    qs = (stream().groupBy("k").transformWithStateInPandas(SessionProcessor(), outputStructType=out_schema,
                                                           outputMode="Append", timeMode="EventTime")
          .writeStream.foreachBatch(got_s).option("checkpointLocation", str(tmp_path / "ck-spark"))
          .trigger(processingTime=TRIGGER).start())
    op = _op(cluster, SessionProcessor(), "quiet-sessions", out_schema, time_mode="EventTime", event_time="ts",
             watermark_delay="1 second", checkpoint_location=str(tmp_path / "ck-rhino"))
    qr = (with_ticks(stream()).writeStream.foreachBatch(op.for_each_batch(got_r))
          .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(processingTime=TRIGGER).start())
    closed = lambda sink: len(sink.rows()) and 2 in set(sink.rows()["k"])  # noqa: E731
    try:
        _wait(lambda: closed(got_s) and closed(got_r), [qs, qr], 150)
    finally:
        qs.stop()
        qr.stop()
    s, r = got_s.rows(), got_r.rows()
    cols = ["k", "first", "last", "n"]
    norm = lambda df: df[cols].sort_values(cols).reset_index(drop=True).astype("int64")  # noqa: E731
    pd.testing.assert_frame_equal(norm(r), norm(s))
    assert norm(s).values.tolist() == [[1, t0 + 200, t0 + 5100, 2], [2, t0 + 10500, t0 + 10500, 1]]
    # on both, the first batch after the last one with input emitted key 2's session
    for q, rows in ((qs, s), (qr, r)):
        last = _last_data_batch(q)
        assert rows[rows["k"] == 2]["batch"].tolist() == [last + 1], (last, rows)
    # Rhino's: within one trigger interval (plus the batch's own run) after the last input's batch
    ends = {b: at for b, at, _ in got_r.batches}
    last = _last_data_batch(qr)
    assert ends[last + 1] - ends[last] < 1.0 + 10.0


def test_a_processing_time_timer_fires_with_no_input_as_in_spark(cluster, spark, tmp_path):
    from rhino.spark import with_ticks

    src = tmp_path / "src"
    src.mkdir()
    # keys 1-3 in the first file, key 3 again in the second (its first timer is deleted): then no
    # input; every key's timer fires DELAY after its last input, in batches without rows
    _write_files(src, [pd.DataFrame({"k": [1, 2, 3, 3]}), pd.DataFrame({"k": [3]})])
    out_schema = "k long, n long, why string"

    def stream():
        return spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(src))

    got_s, got_r = _Sink(), _Sink()
    qs = (stream().groupBy("k").transformWithStateInPandas(IdleProcessor(), outputStructType=out_schema,
                                                           outputMode="Update", timeMode="ProcessingTime")
          .writeStream.foreachBatch(got_s).option("checkpointLocation", str(tmp_path / "ck-spark"))
          .trigger(processingTime=TRIGGER).start())
    op = _op(cluster, IdleProcessor(), "quiet-idle", out_schema, time_mode="ProcessingTime")
    qr = (with_ticks(stream()).writeStream.foreachBatch(op.for_each_batch(got_r))
          .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(processingTime=TRIGGER).start())
    fired = lambda sink: len(sink.rows()) and (sink.rows()["why"] == "idle").sum() >= 3  # noqa: E731
    try:
        _wait(lambda: fired(got_s) and fired(got_r), [qs, qr], 150)
        time.sleep(2.0)  # nothing fires twice
    finally:
        qs.stop()
        qr.stop()
    s, r = got_s.rows(), got_r.rows()
    cols = ["k", "n", "why"]
    norm = lambda df: df[cols].sort_values(cols).reset_index(drop=True).astype({"k": "int64", "n": "int64"})  # noqa
    pd.testing.assert_frame_equal(norm(r), norm(s))
    assert norm(s)[norm(s)["why"] == "idle"].values.tolist() == [[1, 1, "idle"], [2, 1, "idle"], [3, 3, "idle"]]
    # on both, the timer of the last input fired in a batch that read no input
    for q, rows in ((qs, s), (qr, r)):
        last = _last_data_batch(q)
        assert (rows[(rows["why"] == "idle") & (rows["k"] == 3)]["batch"] > last).all(), (last, rows)
    # and Rhino's batches without input ran the operator (its reports), at the trigger's pace
    quiet = [rep for rep in op.reports if sum(t["rows_in"] for t in rep.tasks) == 0]
    assert quiet and sum(t["timers_fired"] for rep in quiet for t in rep.tasks) >= 1


@pytest.mark.parametrize("mode", ["pandas", "rows"])
def test_a_query_started_without_ticks_gains_them_at_a_restart_as_spark_does(cluster, spark, tmp_path, mode):
    """Issue 45: quiet-stream batches a query gains after its first start. Both queries first run:
    Spark's own operator, and Rhino's without ticks, read two files (timers registered) and
    stop. Both restart from their checkpoints, Rhino's with ``with_ticks(...,
    checkpoint_location=...)``, which readies a checkpoint made without ticks, and a third file
    arrives. Spark's operator runs no-data batches again once it has run a batch since its
    restart (its engine asks the last batch's plan); Rhino's query runs one at every trigger
    (the ticks). Every key's timer fires, with the same output on both; key 3's and key 4's,
    registered by the last input of each run, only in batches with no input. Without the
    checkpoint step, Spark refuses Rhino's restart ("There are [1] sources in the checkpoint
    offsets and now there are [2]")."""
    from rhino.spark import with_ticks

    src = tmp_path / "src"
    src.mkdir()
    _write_files(src, [pd.DataFrame({"k": [1, 2, 3, 3]}), pd.DataFrame({"k": [3]})])
    out_schema = "k long, n long, why string"
    ck_s, ck_r = str(tmp_path / "ck-spark"), str(tmp_path / "ck-rhino")

    def stream():
        return spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(src))

    proc = IdleProcessor if mode == "pandas" else IdleProcessorRows

    def spark_query(sink):
        g = stream().groupBy("k")
        tws = g.transformWithStateInPandas if mode == "pandas" else g.transformWithState
        return (tws(proc(), outputStructType=out_schema, outputMode="Update", timeMode="ProcessingTime")
                .writeStream.foreachBatch(sink).option("checkpointLocation", ck_s)
                .trigger(processingTime=TRIGGER).start())

    def has(sink, k, why, n=None):
        rows = sink.rows()
        return bool(len(rows)) and bool(((rows["k"] == k) & (rows["why"] == why)
                                         & ((rows["n"] == n) if n is not None else True)).any())

    # 1. the first start: Rhino's with no ticks, stopped once both files are read
    got_s1, got_r1 = _Sink(), _Sink()
    op = _op(cluster, proc(), f"quiet-gained-{mode}", out_schema, time_mode="ProcessingTime", mode=mode)
    qs = spark_query(got_s1)
    qr = (stream().writeStream.foreachBatch(op.for_each_batch(got_r1)).option("checkpointLocation", ck_r)
          .trigger(processingTime=TRIGGER).start())
    try:
        _wait(lambda: has(got_s1, 3, "data", 3) and has(got_r1, 3, "data", 3), [qs, qr], 150)
    finally:
        qs.stop()
        qr.stop()
    # key 3's timer, registered by the last input, can only fire in a batch with no input: none
    # ran on Rhino's side (keys 1 and 2 may have fired in the second file's batch, on both)
    assert not has(got_r1, 3, "idle")
    # 2. the restart, then a third file
    got_s2, got_r2 = _Sink(), _Sink()
    op2 = _op(cluster, proc(), f"quiet-gained-{mode}", out_schema, time_mode="ProcessingTime", mode=mode)
    qs = spark_query(got_s2)
    qr = (with_ticks(stream(), checkpoint_location=ck_r).writeStream.foreachBatch(op2.for_each_batch(got_r2))
          .option("checkpointLocation", ck_r).trigger(processingTime=TRIGGER).start())
    f = src / "part-002.parquet"
    pd.DataFrame({"k": [4]}).to_parquet(f)
    all_fired = lambda a, b: all(has(_both(a, b), k, "idle") for k in (1, 2, 3, 4))  # noqa: E731
    try:
        _wait(lambda: all_fired(got_s1, got_s2) and all_fired(got_r1, got_r2), [qs, qr], 150)
        time.sleep(2.0)  # nothing fires twice
    finally:
        qs.stop()
        qr.stop()
    s, r = _both(got_s1, got_s2).rows(), _both(got_r1, got_r2).rows()
    cols = ["k", "n", "why"]
    norm = lambda df: df[cols].sort_values(cols).reset_index(drop=True).astype({"k": "int64", "n": "int64"})  # noqa
    pd.testing.assert_frame_equal(norm(r), norm(s))
    assert norm(r)[norm(r)["why"] == "idle"].values.tolist() == [[1, 1, "idle"], [2, 1, "idle"], [3, 3, "idle"],
                                                                [4, 1, "idle"]]
    # on Rhino's side, keys 3 and 4 fired after the restart; key 4's (DELAY after the third file's
    # batch, the last input) in a batch that read no rows: a tick's
    assert has(got_r2, 3, "idle") and has(got_r2, 4, "idle")
    quiet = [rep for rep in op2.reports if sum(t["rows_in"] for t in rep.tasks) == 0]
    assert sum(t["timers_fired"] for rep in quiet for t in rep.tasks) >= 1


def _both(a: _Sink, b: _Sink) -> _Sink:
    """The batches of a query's two runs, as one sink's."""
    out = _Sink()
    out.batches = a.batches + b.batches
    return out
