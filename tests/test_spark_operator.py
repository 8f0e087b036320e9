"""rhino.spark's operator on a real local Spark (local[2]), real `rhino worker`
processes on 127.0.0.2..4 and a real `rhino coordinator` process.

Oracles: pandas replays of the input (counts, lists, maps), and Spark's own
`transformWithStateInPandas` (RocksDB state store) running the same processor
object on the same file stream, for event-time timers and the watermark.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import RefuseFirstCommit, local_spark, rhino_cluster  # noqa: E402

# The processors below travel to Spark's Python workers by value (they cannot import this module).
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CountProcessor(StatefulProcessor):
    """Per key: a running count (ValueState), every value seen (ListState), and counts by v % 3 (MapState)."""

    def init(self, handle):
        self.count = handle.getValueState("count", "c long")
        self.seen = handle.getListState("seen", "v long")
        self.mod = handle.getMapState("mod", "m long", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = 0
        for pdf in rows:
            n += len(pdf)
            for v in pdf["v"].tolist():
                self.seen.appendValue((v,))
                old = self.mod.getValue((v % 3,))
                self.mod.updateValue((v % 3,), ((old[0] if old else 0) + 1,))
        c = (self.count.get() or (0,))[0] + n
        self.count.update((c,))
        mods = dict((k[0], v[0]) for k, v in self.mod.iterator())
        yield pd.DataFrame({"k": [key[0]], "count": [c], "seen_sum": [sum(x[0] for x in self.seen.get())],
                            "mod0": [mods.get(0, 0)]})

    def close(self):
        pass


class SessionProcessor(StatefulProcessor):
    """Event time: per key, the count and span of its events; a timer at last+gap emits and clears."""

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("sparkop")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-operator", rocksdb=True)
    yield s
    s.stop()


def _op(cluster, processor, op_id, schema, **kw):
    from rhino.spark import transform_with_state

    return transform_with_state(processor, key="k", output_schema=schema, operator_id=op_id,
                                coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                parallelism=kw.pop("parallelism", 3), replicas=kw.pop("replicas", 2),
                                locality=False, **kw)


def test_value_list_map_state_across_batches_equal_a_pandas_replay(cluster, spark):
    op = _op(cluster, CountProcessor(), "count", "k long, count long, seen_sum long, mod0 long")
    seen: dict[int, list[int]] = {}
    for b in range(4):
        pdf = pd.DataFrame({"k": [(i * 7 + b) % 11 for i in range(60)], "v": [b * 100 + i for i in range(60)]})
        out = op.process_batch(spark.createDataFrame(pdf), b).to_pandas().sort_values("k").reset_index(drop=True)
        for k, v in zip(pdf["k"], pdf["v"]):
            seen.setdefault(int(k), []).append(int(v))
        keys = sorted(set(pdf["k"]))
        want = pd.DataFrame({"k": keys, "count": [len(seen[k]) for k in keys],
                             "seen_sum": [sum(seen[k]) for k in keys],
                             "mod0": [sum(1 for v in seen[k] if v % 3 == 0) for k in keys]})
        pd.testing.assert_frame_equal(out, want, check_dtype=False)
        rep = op.reports[-1]
        assert rep.attempts == 1 and len(rep.tasks) == 3
        assert rep.routing == "jvm"  # a long key: routed by KeyRouter (test_spark_routing_jvm.py)
        # a constant number of round trips whatever the keys and variables: one get_batch, one
        # scan_many, one delete_batch, one put_batch, the commit (the open is counted apart)
        assert all(t["round_trips"] <= 5 and t["large_reads"] == 0 for t in rep.tasks), rep.tasks
    # a replay of the last batch (Spark reruns it after a driver restart): same output, state not doubled
    out = op.process_batch(spark.createDataFrame(pdf), 3).to_pandas().sort_values("k").reset_index(drop=True)
    pd.testing.assert_frame_equal(out, want, check_dtype=False)
    assert any(t["rolled_back"] for t in op.reports[-1].tasks)
    pdf = pd.DataFrame({"k": [1], "v": [7]})
    out = op.process_batch(spark.createDataFrame(pdf), 4).to_pylist()
    assert out[0]["count"] == len(seen[1]) + 1


def test_a_key_only_python_encodes_is_routed_by_the_python_pass(cluster, spark):
    """A double key: KeyRouter does not encode it (runtime/routing.py), the mapInArrow pass does."""
    op = _op(cluster, CountProcessor(), "count-double", "k double, count long, seen_sum long, mod0 long")
    seen: dict[float, list[int]] = {}
    for b in range(2):
        pdf = pd.DataFrame({"k": [(i * 7 + b) % 11 + 0.5 for i in range(40)], "v": [b * 100 + i for i in range(40)]})
        out = op.process_batch(spark.createDataFrame(pdf), b).to_pandas().sort_values("k").reset_index(drop=True)
        for k, v in zip(pdf["k"], pdf["v"]):
            seen.setdefault(float(k), []).append(int(v))
        keys = sorted(set(pdf["k"]))
        want = pd.DataFrame({"k": keys, "count": [len(seen[k]) for k in keys], "seen_sum": [sum(seen[k]) for k in keys],
                             "mod0": [sum(1 for v in seen[k] if v % 3 == 0) for k in keys]})
        pd.testing.assert_frame_equal(out, want, check_dtype=False)
        assert op.reports[-1].routing == "python"


def _stages(spark, group):
    """(numTasks, numCompletedTasks) of every stage of the jobs of a job group, per job."""
    st = spark.sparkContext.statusTracker()
    jobs = sorted(st.getJobIdsForGroup(group))
    return [[(i.numTasks, i.numCompletedTasks) for i in (st.getStageInfo(s) for s in st.getJobInfo(j).stageIds)
             if i is not None] for j in jobs]


def test_a_batch_run_again_reuses_its_shuffle_and_stays_exactly_once(cluster, spark):
    op = _op(cluster, CountProcessor(), "rerun", "k long, count long, seen_sum long, mod0 long")
    pdf0 = pd.DataFrame({"k": [i % 7 for i in range(50)], "v": list(range(50))})
    op.process_batch(spark.createDataFrame(pdf0), 0)
    op.control.client = RefuseFirstCommit(op.coordinator(), 1)
    pdf1 = pd.DataFrame({"k": [i % 5 for i in range(40)], "v": [1000 + i for i in range(40)]})
    spark.sparkContext.setJobGroup("rhino-rerun-b1", "batch 1 of the rerun test")
    try:
        out = op.process_batch(spark.createDataFrame(pdf1), 1).to_pandas().sort_values("k").reset_index(drop=True)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert op.control.client.refused == 1 and op.reports[-1].attempts == 2
    # exactly once: the counts of a pandas replay of batches 0 and 1, not of batch 1 applied twice
    both = pd.concat([pdf0, pdf1])
    want = (both[both["k"].isin(pdf1["k"])].groupby("k")["v"].agg(["count", "sum"]).reset_index()
            .rename(columns={"sum": "seen_sum"}))
    pd.testing.assert_frame_equal(out[["k", "count", "seen_sum"]], want, check_dtype=False)
    # Both attempts' stateful stages ran (3 tasks each), but the shuffle's map stage ran once: the
    # second attempt reused it (a stage that was not run again shows no completed tasks). The
    # last (3, 3) is process_batch's collect, which reads the checkpointed output.
    ran = sorted((n, done) for job in _stages(spark, "rhino-rerun-b1") for n, done in job if done > 0)
    assert ran == [(2, 2), (3, 3), (3, 3), (3, 3)], ran


def test_event_time_timers_equal_sparks_own_operator(cluster, spark, tmp_path):
    """The same processor object on Spark's transformWithStateInPandas (RocksDB) and on Rhino, over
    the same file stream (one file per micro-batch): the same expired-timer output."""
    src = tmp_path / "src"
    src.mkdir()
    rng = __import__("random").Random(5)
    t = 1_000_000
    for b in range(6):
        rows = []
        for _ in range(40):
            t += rng.choice([10, 50, 400, 2500])
            rows.append({"k": rng.randrange(8), "ts": pd.Timestamp(t, unit="ms")})
        pd.DataFrame(rows).to_parquet(src / f"part-{b:03d}.parquet", coerce_timestamps="us")
    # a last file far in the future moves the watermark past every session
    pd.DataFrame([{"k": 99, "ts": pd.Timestamp(t + 60_000, unit="ms")}]).to_parquet(src / "part-999.parquet", coerce_timestamps="us")
    # Spark's file source takes files in mtime order: written within one clock tick, a later file
    # taken first would move the watermark past an earlier one's rows (dropped as late), on either
    # system, differently
    base = time.time() - 100
    for i, f in enumerate(sorted(src.iterdir())):
        os.utime(f, (base + i, base + i))
    schema = "k long, ts timestamp"
    out_schema = "k long, first long, last long, n long"

    def stream():
        return (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
                .withWatermark("ts", "1 second"))

    # Spark's own operator
    got_spark: list[pd.DataFrame] = []
    q = (stream().groupBy("k").transformWithStateInPandas(SessionProcessor(), outputStructType=out_schema,
                                                          outputMode="Append", timeMode="EventTime")
         .writeStream.foreachBatch(lambda df, b: got_spark.append(df.toPandas()))
         .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    # Rhino, from foreachBatch
    op = _op(cluster, SessionProcessor(), "sessions", out_schema, time_mode="EventTime", event_time="ts",
             watermark_delay="1 second", checkpoint_location=str(tmp_path / "ck-rhino"))
    got_rhino: list[pd.DataFrame] = []
    q = (stream().writeStream.foreachBatch(op.for_each_batch(lambda df, b: got_rhino.append(df.toPandas())))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    # Rhino's timers fire in the batch after the watermark passes them; Spark also runs a no-data
    # batch at the end. Feed one more (empty) batch so the last watermark is applied.
    op.process_batch(spark.createDataFrame([], schema), len(op.reports))

    def norm(frames):
        df = pd.concat([f for f in frames if len(f)], ignore_index=True) if frames else pd.DataFrame()
        return df.sort_values(["k", "first"]).reset_index(drop=True).astype("int64")

    s, r = norm(got_spark), norm(got_rhino + [op.last_output.toPandas()])
    assert len(s) > 8, s
    pd.testing.assert_frame_equal(r, s)
    assert sum(t["timers_fired"] for rep in op.reports for t in rep.tasks) == len(r)


def test_bad_configuration_is_refused_clearly(cluster, spark):
    from rhino.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="ProcessingTime"):
        _op(cluster, CountProcessor(), "bad1", "k long", time_mode="WallClock")
    with pytest.raises(InvalidArgumentError, match="event_time"):
        _op(cluster, CountProcessor(), "bad2", "k long", time_mode="EventTime")
    op = _op(cluster, CountProcessor(), "bad3", "k long, count long, seen_sum long, mod0 long")
    with pytest.raises(InvalidArgumentError, match="not in the input"):
        op.process_batch(spark.createDataFrame(pd.DataFrame({"key": [1], "v": [1]})), 0)


class TypedProcessor(StatefulProcessor):
    """A running count per key in a ValueState of a given schema; ``bad`` writes a string."""

    def __init__(self, schema="n long", bad=False):
        self.schema, self.bad = schema, bad

    def init(self, handle):
        self.v = handle.getValueState("v", self.schema)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(p) for p in rows)
        old = self.v.get()
        width = len(self.schema.split(","))
        new = ("oops",) if self.bad else ((old[0] if old else 0) + n,) + (None,) * (width - 1)
        self.v.update(new)
        yield pd.DataFrame({"k": [key[0]], "n": [new[0]], "old_width": [len(old) if old else 0]})


def test_schema_is_checked_and_evolves_across_runs(cluster, spark):
    """Each step is a new run of the query (a new operator object, the same operator id): a
    nullable field added, then removed, keeps the state; an incompatible change is refused
    before any batch runs; a wrong value is refused naming the variable and the field."""
    from rhino.coordinator.client import connect_coordinator

    from rhino.spark.state.schema import StateSchemaError

    runs = iter(range(100))

    def run(schema, b, **kw):
        # each run is deployed as new code (going back to a schema is too): its own version
        # name, or the driver would be refused as older than the code in force (issue 47)
        op = _op(cluster, TypedProcessor(schema, **kw), "typed", "k long, n long, old_width long",
                 max_batch_attempts=1, code_version=f"run-{next(runs)}")
        try:
            return op.process_batch(spark.createDataFrame(pd.DataFrame({"k": [1, 1, 2]})), b).to_pandas()
        finally:
            op.close()

    out = run("n long", 0)
    assert sorted(zip(out.k, out.n)) == [(1, 2), (2, 1)]
    out = run("n long, note string", 1)  # a nullable field added: old values read through version 2
    assert sorted(zip(out.k, out.n, out.old_width)) == [(1, 4, 2), (2, 2, 2)]
    out = run("n long", 2)  # and removed again
    assert sorted(zip(out.k, out.n, out.old_width)) == [(1, 6, 1), (2, 3, 1)]
    with pytest.raises(StateSchemaError, match="'v'.*'n'"):
        run("n string", 3)  # incompatible: refused on the driver, before the batch
    with pytest.raises(Exception, match="(?s)StateValueError: state 'v'.*field 'n'.*grouping key"):
        run("n long", 3, bad=True)  # a string written into a long: the task fails, nothing commits
    with connect_coordinator(cluster["coordinator"], secret=cluster["secret_file"].read_bytes().strip()) as cc:
        assert cc.placement("typed").last_batch == 2
    out = run("n long", 3)
    assert sorted(zip(out.k, out.n)) == [(1, 8), (2, 4)]


def _grouped_fn(key, pdfs, state):
    """Grouped-pandas form: a running count per key; emits and forgets a key once the
    watermark passes its last event + 2 s (an event-time timeout)."""
    if state.hasTimedOut:
        (n, last) = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "n": [n], "last": [last], "why": ["timeout"]})
        return
    n, last = state.getOption if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        last = max([last] + [int(t.value // 1_000_000) for t in pdf["ts"]])
    state.update((n, last))
    state.setTimeoutTimestamp(last + 2000)
    yield pd.DataFrame({"k": [key[0]], "n": [n], "last": [last], "why": ["data"]})


def test_grouped_pandas_form_equals_sparks_apply_in_pandas_with_state(cluster, spark, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = __import__("random").Random(11)
    t = 5_000_000
    for b in range(5):
        rows = []
        for _ in range(30):
            t += rng.choice([20, 300, 1500])
            rows.append({"k": rng.randrange(6), "ts": pd.Timestamp(t, unit="ms")})
        pd.DataFrame(rows).to_parquet(src / f"part-{b:03d}.parquet", coerce_timestamps="us")
    pd.DataFrame([{"k": 50, "ts": pd.Timestamp(t + 60_000, unit="ms")}]).to_parquet(
        src / "part-999.parquet", coerce_timestamps="us")
    # Spark's file source takes files in modification-time order: files written within one
    # clock tick could come in either order, and the last one (60 s ahead) taken early moves
    # the watermark past the others (Spark's own run then failed: INVALID_TIMEOUT_TIMESTAMP).
    base = time.time() - 100
    for i, f in enumerate(sorted(src.iterdir())):
        os.utime(f, (base + i, base + i))
    schema = "k long, ts timestamp"
    out_schema = "k long, n long, last long, why string"

    def stream():
        return (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
                .withWatermark("ts", "500 milliseconds"))

    got_spark: list[pd.DataFrame] = []
    q = (stream().groupBy("k").applyInPandasWithState(_grouped_fn, out_schema, "n long, last long", "Update",
                                                      "EventTimeTimeout")
         .writeStream.outputMode("update").foreachBatch(lambda df, b: got_spark.append(df.toPandas()))
         .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
    q.awaitTermination(180)

    from rhino.spark import apply_in_pandas_with_state

    op = apply_in_pandas_with_state(_grouped_fn, key="k", output_schema=out_schema, state_schema="n long, last long",
                                    operator_id="grouped",
                                    coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                    parallelism=3, replicas=2, locality=False, timeout="EventTimeTimeout",
                                    event_time="ts", watermark_delay="500 ms",
                                    checkpoint_location=str(tmp_path / "ck-rhino"))
    got_rhino: list[pd.DataFrame] = []
    q = (stream().writeStream.foreachBatch(op.for_each_batch(lambda df, b: got_rhino.append(df.toPandas())))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    got_rhino.append(op.process_batch(spark.createDataFrame([], schema), len(op.reports)).to_pandas())

    def norm(frames):
        df = pd.concat([f for f in frames if len(f)], ignore_index=True)
        return df.sort_values(["k", "why", "n"]).reset_index(drop=True).astype({"k": "int64", "n": "int64",
                                                                                 "last": "int64"})

    s, r = norm(got_spark), norm(got_rhino)
    assert (s["why"] == "timeout").sum() >= 5, s
    pd.testing.assert_frame_equal(r, s)


def _pt_timeout_fn(key, pdfs, state):
    """Counts each key's rows; a key silent for 6 s times out: emitted with its count, removed."""
    k = int(key[0])
    if state.hasTimedOut:
        (n,) = state.get
        state.remove()
        yield pd.DataFrame({"k": [k], "n": [n], "why": ["timeout"]})
        return
    n = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
    state.update((n,))
    state.setTimeoutDuration(6000)
    yield pd.DataFrame({"k": [k], "n": [n], "why": ["data"]})


def test_grouped_processing_time_timeout_equals_sparks_apply_in_pandas_with_state(cluster, spark, tmp_path):
    """Spark's own ``applyInPandasWithState(..., "ProcessingTimeTimeout")`` and Rhino's, as two
    queries on one file stream that grows by a file a second (wall-clock batch times on both):
    key 0 has a row in every file and never times out; keys 1-3 have rows only in the first file,
    key 4 in the first two: each times out 6 s after its last rows, once, with its count. (The
    gaps between batches stay well under 6 s even when both queries share two loaded cores.) (Spark also runs no-data batches for processing-time timeouts, Rhino only batches with
    data; the ticking key 0 gives Rhino a batch every second, so both time out the same keys with
    the same counts.)"""
    import threading

    from rhino.spark import apply_in_pandas_with_state

    src = tmp_path / "src"
    src.mkdir()
    schema = "k long"
    out_schema = "k long, n long, why string"

    def write(i: int) -> None:
        keys = [0] + ([1, 1, 2, 2, 3, 3, 4] if i == 0 else []) + ([4] if i == 1 else [])
        tmp = tmp_path / f"tmp-{i}.parquet"
        pd.DataFrame({"k": keys}).to_parquet(tmp)
        os.replace(tmp, src / f"part-{i:03d}.parquet")

    write(0)

    def stream():
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))

    got_spark: list[pd.DataFrame] = []
    qs = (stream().groupBy("k").applyInPandasWithState(_pt_timeout_fn, out_schema, "n long", "Update",
                                                       "ProcessingTimeTimeout")
          .writeStream.outputMode("update").foreachBatch(lambda df, b: got_spark.append(df.toPandas()))
          .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(processingTime="500 milliseconds")
          .start())
    op = apply_in_pandas_with_state(_pt_timeout_fn, key="k", output_schema=out_schema, state_schema="n long",
                                    operator_id="grouped-pt", coordinator=cluster["coordinator"],
                                    secret_file=str(cluster["secret_file"]), parallelism=3, replicas=1,
                                    locality=False, timeout="ProcessingTimeTimeout")
    got_rhino: list[pd.DataFrame] = []
    qr = (stream().writeStream.foreachBatch(op.for_each_batch(lambda df, b: got_rhino.append(df.toPandas())))
          .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(processingTime="500 milliseconds")
          .start())
    stop = threading.Event()
    try:
        for i in range(1, 15):  # a file a second for 14 s: keys 1-4 time out on the way
            if stop.wait(1.0):
                break
            write(i)

        def seen(frames):  # the files a query has processed: key 0's count
            return max([int(f.loc[f["k"] == 0, "n"].max()) for f in frames if len(f) and (f["k"] == 0).any()],
                       default=0)

        # both queries catch up with the 15 files (on a loaded machine a batch can take seconds)
        deadline = time.monotonic() + 90
        while min(seen(got_spark), seen(got_rhino)) < 15 and time.monotonic() < deadline:
            assert qs.isActive and qr.isActive, (qs.exception(), qr.exception())
            time.sleep(0.5)
    finally:
        qs.stop()
        qr.stop()

    def norm(frames):
        df = pd.concat([f for f in frames if len(f)], ignore_index=True)
        return df.sort_values(["k", "why", "n"]).reset_index(drop=True).astype({"k": "int64", "n": "int64"})

    s, r = norm(got_spark), norm(got_rhino)
    timeouts = s[s["why"] == "timeout"].sort_values("k")
    assert timeouts[["k", "n"]].values.tolist() == [[1, 2], [2, 2], [3, 2], [4, 2]], s
    # Rhino may have run fewer batches than Spark by the end (a batch per new file): compare what
    # both saw, the data rows of the files both processed, and every timeout
    both = min(s[s["k"] == 0]["n"].max(), r[r["k"] == 0]["n"].max())
    pd.testing.assert_frame_equal(r[(r["k"] != 0) | (r["n"] <= both)].reset_index(drop=True),
                                  s[(s["k"] != 0) | (s["n"] <= both)].reset_index(drop=True))
    assert both >= 10, (s, r)


def test_grouped_timeout_calls_are_checked_as_in_spark(cluster, spark):
    """setTimeoutDuration needs ProcessingTimeTimeout and a positive duration; setTimeoutTimestamp
    needs EventTimeTimeout; getCurrentProcessingTimeMs is the batch's time (a manual clock here)."""
    from rhino.errors import InvalidArgumentError
    from rhino.spark import apply_in_pandas_with_state
    from rhino.spark.grouped import RhinoGroupState

    st = RhinoGroupState(None, None, 0, False, "notimeout", 1234)
    with pytest.raises(InvalidArgumentError, match="ProcessingTimeTimeout"):
        st.setTimeoutDuration(1000)
    st = RhinoGroupState(None, None, 0, False, "processingtimetimeout", 1234)
    with pytest.raises(InvalidArgumentError, match="EventTimeTimeout"):
        st.setTimeoutTimestamp(5000)
    with pytest.raises(InvalidArgumentError, match="positive"):
        st.setTimeoutDuration(0)
    st.setTimeoutDuration("2 seconds")
    assert st.timeout_ms == 1234 + 2000 and st.getCurrentProcessingTimeMs() == 1234

    def fn(key, pdfs, state):
        yield pd.DataFrame({"k": [int(key[0])], "now": [state.getCurrentProcessingTimeMs()]})

    clock = {"now": 42_000}
    op = apply_in_pandas_with_state(fn, key="k", output_schema="k long, now long", state_schema="n long",
                                    operator_id="grouped-now", coordinator=cluster["coordinator"],
                                    secret_file=str(cluster["secret_file"]), parallelism=3, replicas=1,
                                    locality=False, timeout="ProcessingTimeTimeout", clock=lambda: clock["now"])
    out = op.process_batch(spark.createDataFrame(pd.DataFrame({"k": [1, 2, 3]})), 0).to_pandas()
    assert sorted(out["now"]) == [42_000] * 3


class TimerValuesProbe(StatefulProcessor):
    """Emits, per key and batch, what TimerValues says: whether a processing time is given
    (-1 when the time mode gives none), whether it is one time for the whole batch (the
    batch's), and the watermark."""

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        pt = timerValues.getCurrentProcessingTimeInMs()
        yield pd.DataFrame({"k": [int(key[0])], "pt_given": [pt != -1], "pt": [pt],
                            "wm": [timerValues.getCurrentWatermarkInMs()]})

    def close(self):
        pass


@pytest.mark.parametrize("time_mode", ["None", "ProcessingTime", "EventTime"])
def test_timer_values_equal_sparks_own_operator(cluster, spark, tmp_path, time_mode):
    src = tmp_path / "src"
    src.mkdir()
    base = time.time() - 100
    t = 2_000_000
    for b in range(3):
        rows = [{"k": k, "ts": pd.Timestamp(t + 1000 * b + 10 * k, unit="ms")} for k in range(4)]
        f = src / f"part-{b:03d}.parquet"
        pd.DataFrame(rows).to_parquet(f, coerce_timestamps="us")
        os.utime(f, (base + b, base + b))  # the file source's order (mtime)
    schema = "k long, ts timestamp"
    out_schema = "k long, pt_given boolean, pt long, wm long"

    def stream():
        s = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
        return s.withWatermark("ts", "500 milliseconds") if time_mode == "EventTime" else s

    got_spark: list[pd.DataFrame] = []
    mode = "Append" if time_mode == "EventTime" else "Update"
    q = (stream().groupBy("k").transformWithStateInPandas(TimerValuesProbe(), outputStructType=out_schema,
                                                          outputMode=mode, timeMode=time_mode)
         .writeStream.outputMode(mode.lower())
         .foreachBatch(lambda df, b: got_spark.append(df.toPandas().assign(batch=b)))
         .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
    # Spark's own operator with processing-time timers keeps running no-data batches even with
    # availableNow, and neither awaitTermination nor processAllAvailable returns: wait for the
    # three files' rows (4 each), then stop it
    deadline = time.monotonic() + 180
    while sum(len(f) for f in got_spark) < 12 and q.isActive and time.monotonic() < deadline:
        time.sleep(0.2)
    q.stop()
    kw = dict(event_time="ts", watermark_delay="500 ms") if time_mode == "EventTime" else {}
    op = _op(cluster, TimerValuesProbe(), f"timervalues-{time_mode.lower()}", out_schema, time_mode=time_mode,
             checkpoint_location=str(tmp_path / "ck-rhino"), **kw)
    got_rhino: list[pd.DataFrame] = []
    q = (stream().writeStream.foreachBatch(
        op.for_each_batch(lambda df, b: got_rhino.append(df.toPandas().assign(batch=b))))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)

    def view(frames):
        df = pd.concat([f for f in frames if len(f)], ignore_index=True)
        # one processing time per batch, whatever it is (the batch's, on both systems)
        assert (df.groupby("batch")["pt"].nunique() == 1).all(), df
        return (df[["batch", "k", "pt_given", "wm"]].sort_values(["batch", "k"]).reset_index(drop=True)
                .astype({"batch": "int64", "k": "int64", "wm": "int64", "pt_given": bool}))

    s, r = view(got_spark), view(got_rhino)
    assert len(s) == 12, s
    pd.testing.assert_frame_equal(r, s)
