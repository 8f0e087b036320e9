"""Spark's semantics in the details, each against Spark's own operator on the same
processor and micro-batches (a file stream, one file per batch):

- the row form (``mode="rows"``, Spark's ``transformWithState`` with Rows): a null
  reaches the processor as None, a timestamp as a datetime in the session's time
  zone, and the output converts back as Spark's does;
- ``deleteIfExists`` in ``init`` drops the state variable, for every key;
- the grouped form's ``state.oldTimeoutTimestamp``, with event-time timeouts.

Real `rhino worker` processes on 127.0.0.2..4, as in test_spark_operator."""

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("semantics")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-semantics", rocksdb=True)
    yield s
    s.stop()


class RowProbe(StatefulProcessor):
    """The row form: per input row, what the processor saw (a null long as None, a timestamp
    as a datetime in the session's zone), and the row's values back out; a count per key."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        n = (self.n.get() or (0,))[0]
        for row in rows:
            n += 1
            ts = row.ts
            yield Row(k=key[0], x=row.x, x_is_none=row.x is None, ts=ts, ts_str=None if ts is None else str(ts),
                      hour=None if ts is None else ts.hour, n=n)
        self.n.update((n,))

    def close(self):
        pass


def test_row_form_nulls_timestamps_and_time_zone_equal_sparks_own(cluster, spark, tmp_path):
    from rhino.spark import transform_with_state

    src = tmp_path / "src"
    src.mkdir()
    base = time.time() - 100
    t = pd.Timestamp("2026-03-08 09:30:00", tz="UTC")  # around the US DST switch
    frames = [pd.DataFrame({"k": ["a", "b", "a", None], "x": [1, None, 3, 4],
                            "ts": [t, t + pd.Timedelta(hours=1), None, t + pd.Timedelta(minutes=5)]}),
              pd.DataFrame({"k": ["b", "a"], "x": [None, 6], "ts": [t + pd.Timedelta(hours=2), t]})]
    for i, pdf in enumerate(frames):
        f = src / f"part-{i:03d}.parquet"
        pdf.astype({"x": "Int64"}).to_parquet(f, coerce_timestamps="us")
        os.utime(f, (base + i, base + i))
    out = "k string, x long, x_is_none boolean, ts timestamp, ts_str string, hour int, n long"
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        def stream():
            return (spark.readStream.schema("k string, x long, ts timestamp").option("maxFilesPerTrigger", 1)
                    .parquet(str(src)))

        got_s: list[pd.DataFrame] = []
        q = (stream().groupBy("k").transformWithState(RowProbe(), outputStructType=out, outputMode="Update",
                                                      timeMode="None")
             .writeStream.foreachBatch(lambda df, b: got_s.append(df.toPandas().assign(batch=b)))
             .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
        q.awaitTermination(180)
        op = transform_with_state(RowProbe(), key="k", output_schema=out, operator_id="rows-probe", mode="rows",
                                  coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                  parallelism=3, replicas=1, locality=False)
        got_r: list[pd.DataFrame] = []
        q = (stream().writeStream.foreachBatch(op.for_each_batch(lambda df, b: got_r.append(df.toPandas().assign(batch=b))))
             .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
        q.awaitTermination(180)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")

    def norm(frames):
        df = pd.concat(frames, ignore_index=True)
        return df.sort_values(["batch", "k", "n"], na_position="first").reset_index(drop=True)

    s, r = norm(got_s), norm(got_r)
    assert len(s) == 6 and s["x_is_none"].sum() == 2 and s["k"].isna().sum() == 1, s
    # the processor saw the session's zone: 09:30 UTC on 8 March 2026 is 01:30 in Los Angeles (PST)
    assert s[(s["k"] == "a") & (s["n"] == 1)]["ts_str"].tolist() == ["2026-03-08 01:30:00-08:00"], s
    pd.testing.assert_frame_equal(r, s)


class CountWithLegacy(StatefulProcessor):
    """Per key: a count, and a ``legacy`` value (the last batch's row count x 10); emits what
    ``legacy`` held before the update (-1: nothing). ``DROP``: init drops ``legacy`` first."""

    DROP = False

    def init(self, handle):
        if self.DROP:
            handle.deleteIfExists("legacy")
        self.count = handle.getValueState("count", "c long")
        self.legacy = handle.getValueState("legacy", "l long")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(p) for p in rows)
        c = (self.count.get() or (0,))[0] + n
        was = self.legacy.get()
        self.count.update((c,))
        self.legacy.update((n * 10,))
        yield pd.DataFrame({"k": [key[0]], "count": [c], "legacy_was": [was[0] if was else -1]})

    def close(self):
        pass


class DropsLegacy(CountWithLegacy):
    DROP = True


def test_delete_if_exists_in_init_drops_the_variable_as_in_spark(cluster, spark, tmp_path):
    """Two runs of one query (one checkpoint): the first keeps ``legacy``; the restarted one's
    init drops it. On both systems, every batch of the second run finds it empty for every key,
    while ``count`` goes on."""
    from rhino.spark import transform_with_state

    src = tmp_path / "src"
    src.mkdir()
    base = time.time() - 100
    files = [pd.DataFrame({"k": [1, 2, 2]}), pd.DataFrame({"k": [1, 3]}),
             pd.DataFrame({"k": [1, 2, 3, 3]}), pd.DataFrame({"k": [2, 4]})]

    def write(i):
        f = src / f"part-{i:03d}.parquet"
        files[i].to_parquet(f)
        os.utime(f, (base + i, base + i))

    out = "k long, count long, legacy_was long"

    def stream():
        return spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(src))

    def run_spark(proc, sink):
        q = (stream().groupBy("k").transformWithStateInPandas(proc, outputStructType=out, outputMode="Update",
                                                              timeMode="None")
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck-spark"))
             .trigger(availableNow=True).start())
        q.awaitTermination(180)

    def run_rhino(proc, sink):
        op = transform_with_state(proc, key="k", output_schema=out, operator_id="drop-legacy",
                                  coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                  parallelism=3, replicas=1, locality=False)
        q = (stream().writeStream.foreachBatch(op.for_each_batch(sink))
             .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
        q.awaitTermination(180)
        return op

    got_s: list[pd.DataFrame] = []
    got_r: list[pd.DataFrame] = []
    sink = lambda got: lambda df, b: got.append(df.toPandas().assign(batch=b))  # noqa: E731
    write(0), write(1)
    run_spark(CountWithLegacy(), sink(got_s))
    run_rhino(CountWithLegacy(), sink(got_r))
    write(2), write(3)
    run_spark(DropsLegacy(), sink(got_s))
    op = run_rhino(DropsLegacy(), sink(got_r))

    def norm(frames):
        df = pd.concat(frames, ignore_index=True)
        return df.sort_values(["batch", "k"]).reset_index(drop=True).astype("int64")

    s, r = norm(got_s), norm(got_r)
    pd.testing.assert_frame_equal(r, s)
    # independently: the first run saw its own legacy values, the second none; counts go on
    assert s[(s["batch"] == 1) & (s["k"] == 1)]["legacy_was"].tolist() == [10]
    assert (s[s["batch"] >= 2]["legacy_was"] == -1).all(), s
    assert s[(s["batch"] == 2) & (s["k"] == 1)]["count"].tolist() == [3]
    # Rhino deleted the entries batch 2 found (keys 1, 2, 3 had one each), then batch 3's (1, 2, 3)
    dropped = [sum(t.get("dropped_entries", 0) for t in rep.tasks) for rep in op.reports]
    assert dropped == [3, 3], dropped


def _old_timeout_fn(key, pdfs, state):
    """Event-time timeouts: keys other than 2 time out 5 s (event time) after their last row;
    every call reports ``state.oldTimeoutTimestamp``."""
    old = state.oldTimeoutTimestamp
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "old": [old], "why": ["timeout"]})
        return
    mx = max(int(t.value // 1_000_000) for p in pdfs for t in p["ts"])
    state.update((mx,))
    if key[0] != 2:
        state.setTimeoutTimestamp(mx + 5000)
    yield pd.DataFrame({"k": [key[0]], "old": [old], "why": ["data"]})


def test_grouped_old_timeout_timestamp_and_event_time_timeouts_equal_sparks(cluster, spark, tmp_path):
    from rhino.spark import apply_in_pandas_with_state

    src = tmp_path / "src"
    src.mkdir()
    base = time.time() - 100
    t0 = 1_000_000
    ts = lambda ms: pd.Timestamp(t0 + ms, unit="ms")  # noqa: E731
    frames = [pd.DataFrame({"k": [1, 2], "ts": [ts(0), ts(100)]}), pd.DataFrame({"k": [1], "ts": [ts(2000)]}),
              pd.DataFrame({"k": [3], "ts": [ts(20000)]}), pd.DataFrame({"k": [3], "ts": [ts(40000)]})]
    for i, pdf in enumerate(frames):
        f = src / f"part-{i:03d}.parquet"
        pdf.to_parquet(f, coerce_timestamps="us")
        os.utime(f, (base + i, base + i))
    out = "k long, old long, why string"

    def stream():
        return (spark.readStream.schema("k long, ts timestamp").option("maxFilesPerTrigger", 1).parquet(str(src))
                .withWatermark("ts", "1 second"))

    got_s: list[pd.DataFrame] = []
    q = (stream().groupBy("k").applyInPandasWithState(_old_timeout_fn, out, "m long", "Update", "EventTimeTimeout")
         .writeStream.outputMode("update").foreachBatch(lambda df, b: got_s.append(df.toPandas().assign(batch=b)))
         .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    op = apply_in_pandas_with_state(_old_timeout_fn, key="k", output_schema=out, state_schema="m long",
                                    operator_id="grouped-old-timeout", coordinator=cluster["coordinator"],
                                    secret_file=str(cluster["secret_file"]), parallelism=3, replicas=1,
                                    locality=False, timeout="EventTimeTimeout", event_time="ts",
                                    watermark_delay="1 second", checkpoint_location=str(tmp_path / "ck-rhino"))
    got_r: list[pd.DataFrame] = []
    q = (stream().writeStream.foreachBatch(op.for_each_batch(lambda df, b: got_r.append(df.toPandas().assign(batch=b))))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)

    def norm(frames):
        df = pd.concat(frames, ignore_index=True)
        return df.sort_values(["batch", "k", "why"]).reset_index(drop=True).astype({"k": "int64", "old": "int64",
                                                                                     "batch": "int64"})

    s, r = norm(got_s), norm(got_r)
    pd.testing.assert_frame_equal(r, s)
    # key 1 times out in batch 3 (the watermark from batch 2's rows passed its timeout); key 2
    # set none and never does
    assert s[s["why"] == "timeout"][["batch", "k"]].values.tolist() == [[3, 1]], s
