"""An operator's lifecycle from Spark (issue 45, item 3), with real streaming queries (Spark's
file source, one file per micro-batch) on a local SparkSession against a ``rhino
coordinator`` and three ``rhino worker`` processes on 127.0.0.194..196, one of each for
the module:

- the event-time watermark survives a restart of the query and its driver side (a new
  operator object, nothing of the first one kept: only the Spark checkpoint and the
  coordinator carry over), with the checkpoint location a Hadoop ``file://`` URI: the
  restarted query drops late rows by the restored watermark and fires timers by it, as
  Spark's own ``transformWithStateInPandas`` does when it is stopped and restarted the
  same way over the same files;
- a fresh Spark checkpoint on an operator that has state is refused before anything runs,
  with ``FreshCheckpointError`` naming ``rhino drop``; after the drop (its Python form,
  ``CoordinatorClient.drop_operator``) the same fresh query starts over from nothing;
- two queries run at once with the same operator name in two namespaces, each over its
  own input: each one's output is its own input's running counts (pandas), nothing of the
  other's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino  # noqa: E402
from rhino.coordinator.client import connect_coordinator  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = (194, 195, 196)  # 127.0.0.194..196: no other test module's workers (tests/test_test_hosts.py)
T0 = 1_000_000  # event times: ms after this
BASE = time.time() - 1000  # input files' mtimes: BASE + their index


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("lifecycle"), hosts=HOSTS) as c:
        yield c


@pytest.fixture(scope="module")
def cc(cluster):
    with connect_coordinator(cluster["coordinator"], secret=cluster["secret"]) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-lifecycle", rocksdb=True)
    yield s
    s.stop()


def _ts(ms: int) -> pd.Timestamp:
    return pd.Timestamp(T0 + ms, unit="ms")


def _add_files(src: Path, frames: dict[int, pd.DataFrame]) -> None:
    """Input file i (one micro-batch each), with mtime BASE + i (the file source's order)."""
    src.mkdir(exist_ok=True)
    for i, pdf in frames.items():
        f = src / f"part-{i:03d}.parquet"
        tmp = src / f".part-{i:03d}.tmp"
        pdf.to_parquet(tmp, coerce_timestamps="us")
        os.utime(tmp, (BASE + i, BASE + i))
        os.replace(tmp, f)


def _run(stream: Any, fb: Any, ck: str, timeout: float = 180, *, may_fail: bool = False) -> Any:
    """One run of a query to the end of its input (availableNow); ``may_fail``: a query that
    fails is returned (its ``exception()``), not raised."""
    q = stream.writeStream.foreachBatch(fb).option("checkpointLocation", ck).trigger(availableNow=True).start()
    try:
        q.awaitTermination(timeout)
    except Exception:
        if not may_fail:
            raise
    return q


def _collect(got: list) -> Any:
    return lambda df, b: got.append(df.toPandas().assign(batch=b))


def _norm(frames: list[pd.DataFrame]) -> pd.DataFrame:
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["batch"] + [c for c in df.columns if c != "batch"]).reset_index(drop=True)


# ---- a. the watermark survives a restart (checkpoint on file://) -------------------------------


class WatermarkProbe(StatefulProcessor):
    """Per key and batch: the rows it got (a row dropped as late shows) and the watermark; a
    timer 5 s (event time) after each row, reported with the watermark it fires at."""

    def init(self, handle):
        self.h = handle

    def handleInputRows(self, key, rows, timerValues):
        n = 0
        for pdf in rows:
            n += len(pdf)
            for t in pdf["ts"]:
                self.h.registerTimer(int(pd.Timestamp(t).value // 1_000_000) + 5000)
        yield pd.DataFrame({"k": [key[0]], "info": [f"rows={n} wm={timerValues.getCurrentWatermarkInMs()}"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"k": [key[0] + "-expired"],
                            "info": [f"ts={expiredTimerInfo.getExpiryTimeInMs()} "
                                     f"wm={timerValues.getCurrentWatermarkInMs()}"]})

    def close(self):
        pass


# Event times (ms after T0), one file per batch; the delay is 1 s. The first run takes files
# 0 and 1, the restarted one 2..4. Batch 1 runs with watermark 9 s (10 s - 1 s) and is the
# first run's last: it moves no watermark, so Spark adds no batch of its own. Batch 2 (the
# first after the restart) drops late rows by batch 1's watermark, 9 s, restored: a at 3 s
# and b at 8.8 s are late. Batch 3 moves the watermark to 19 s, which batch 4 fires a's, b's,
# c's and d's timers at; its g at 8.5 s is late by batch 3's 9 s; the last batch moves none.
WM_FRAMES = [pd.DataFrame({"k": ["a"], "ts": [_ts(10000)]}),
             pd.DataFrame({"k": ["a", "b"], "ts": [_ts(3500), _ts(8800)]}),
             pd.DataFrame({"k": ["a", "b", "c", "d"], "ts": [_ts(3000), _ts(8800), _ts(9500), _ts(10000)]}),
             pd.DataFrame({"k": ["e"], "ts": [_ts(20000)]}),
             pd.DataFrame({"k": ["f", "g"], "ts": [_ts(19000), _ts(8500)]})]
WM_SCHEMA = "k string, ts timestamp"
WM_OUT = "k string, info string"


def test_a_the_watermark_survives_a_restart_with_the_checkpoint_on_a_file_uri(cluster, spark, tmp_path):
    from rhino.spark import transform_with_state

    src = tmp_path / "src"

    def stream():
        return spark.readStream.schema(WM_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))

    # Spark's own operator, stopped after batch 1 and restarted from its checkpoint
    _add_files(src, dict(enumerate(WM_FRAMES[:2])))
    got_s: list[pd.DataFrame] = []
    ck_s = (tmp_path / "ck-spark").as_uri()

    def spark_run():
        out = (stream().withWatermark("ts", "1 second").groupBy("k")
               .transformWithStateInPandas(WatermarkProbe(), outputStructType=WM_OUT, outputMode="Update",
                                           timeMode="EventTime"))
        _run(out, _collect(got_s), ck_s)

    # Rhino: the same, each run a new operator object (the driver side starts from nothing)
    ck_r = (tmp_path / "ck-rhino").as_uri()  # file:///...: a Hadoop URI, Spark's and Rhino's
    assert ck_r.startswith("file:///")
    got_r: list[pd.DataFrame] = []
    ops = []

    def rhino_run():
        op = transform_with_state(WatermarkProbe(), key="k", output_schema=WM_OUT, operator_id="lc-watermark",
                                  coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                  parallelism=2, replicas=1, locality=False, time_mode="EventTime", event_time="ts",
                                  watermark_delay="1 second", checkpoint_location=ck_r)
        ops.append(op)
        try:
            _run(stream(), op.for_each_batch(_collect(got_r)), ck_r)
        finally:
            op.close()

    spark_run()
    rhino_run()
    assert sorted(set(pd.concat(got_s)["batch"])) == [0, 1] == sorted(set(pd.concat(got_r)["batch"]))
    _add_files(src, {i: WM_FRAMES[i] for i in range(2, 5)})
    spark_run()
    rhino_run()

    s, r = _norm(got_s), _norm(got_r)
    assert sorted(set(s["batch"])) == list(range(5)), s
    # on Spark: after the restart, batch 2 runs with watermark 9 s and drops a's and b's rows as late
    b2 = s[(s["batch"] == 2) & ~s["k"].str.endswith("-expired")]
    assert sorted(b2["k"]) == ["c", "d"] and set(b2["info"]) == {f"rows=1 wm={T0 + 9000}"}, s
    b4 = s[s["batch"] == 4]
    assert "g" not in set(b4["k"]) and f"ts={T0 + 15000} wm={T0 + 19000}" in set(b4["info"]), s
    # Rhino gives Spark's answer, the restarted driver with the restored watermark
    pd.testing.assert_frame_equal(r, s)
    again = ops[1]
    assert [(x.batch, x.watermark_ms) for x in again.reports] == [(2, T0 + 9000), (3, T0 + 9000), (4, T0 + 19000)]
    # kept under the query's checkpoint location, through Hadoop's filesystem
    files = sorted(p.name for p in (tmp_path / "ck-rhino" / "rhino-lc-watermark").iterdir())
    assert files[-1] == f"watermark-{4:020d}.json" and not [f for f in files if f.endswith(".tmp")], files


# ---- b. a fresh checkpoint is refused, naming rhino drop; after the drop it starts over ---------


class RunningCount(StatefulProcessor):
    def init(self, handle):
        self.st = handle.getValueState("st", "n long, s long")

    def handleInputRows(self, key, rows, timerValues):
        n, s = self.st.get() or (0, 0)
        for pdf in rows:
            n += len(pdf)
            s += int(pdf["v"].sum())
        self.st.update((n, s))
        yield pd.DataFrame({"k": [int(key[0])], "n": [n], "s": [s]})

    def close(self):
        pass


COUNT_OUT = "k long, n long, s long"


def _counts_op(cluster: dict, name: str, namespace: str) -> Any:
    from rhino.spark import transform_with_state

    return transform_with_state(RunningCount(), key="k", output_schema=COUNT_OUT, operator_id=name,
                                namespace=namespace, coordinator=cluster["coordinator"],
                                secret_file=str(cluster["secret_file"]), parallelism=2, replicas=1, locality=False)


def _counts_stream(spark: Any, src: Path) -> Any:
    return spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).parquet(str(src))


def _running_counts(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """pandas: per file (batch), each of its keys with its running count and sum after it."""
    tot: dict[int, tuple[int, int]] = {}
    rows = []
    for b, pdf in enumerate(frames):
        for k, g in pdf.groupby("k"):
            n, s = tot.get(int(k), (0, 0))
            tot[int(k)] = (n + len(g), s + int(g["v"].sum()))
            rows.append((int(k), *tot[int(k)], b))
    return _canon(pd.DataFrame(rows, columns=["k", "n", "s", "batch"]))


def _canon(df: pd.DataFrame) -> pd.DataFrame:
    return df[["k", "n", "s", "batch"]].astype("int64").sort_values(["batch", "k"]).reset_index(drop=True)


def test_b_a_fresh_checkpoint_is_refused_naming_rhino_drop_and_starts_over_after_the_drop(cluster, cc, spark,
                                                                                           tmp_path):
    from rhino.spark import FreshCheckpointError

    frames = [pd.DataFrame({"k": [1, 2, 2], "v": [1, 2, 3]}), pd.DataFrame({"k": [2, 3], "v": [4, 5]})]
    src = tmp_path / "src"
    _add_files(src, dict(enumerate(frames)))
    oid = rhino.operator_id("lc-fresh", "tenant1")
    first: list[pd.DataFrame] = []
    op = _counts_op(cluster, "lc-fresh", "tenant1")
    try:
        _run(_counts_stream(spark, src), op.for_each_batch(_collect(first)), str(tmp_path / "ck-1"))
    finally:
        op.close()
    assert cc.placement(oid).last_batch == 1
    pd.testing.assert_frame_equal(_canon(pd.concat(first)), _running_counts(frames))

    # the same query code from a fresh checkpoint: refused at its batch 0, before anything ran
    caught: list[BaseException] = []
    fresh: list[pd.DataFrame] = []

    def fresh_run() -> Any:
        op = _counts_op(cluster, "lc-fresh", "tenant1")
        each = op.for_each_batch(_collect(fresh))

        def body(df, b):
            try:
                each(df, b)
            except Exception as e:  # the driver's own exception, before Spark wraps it
                caught.append(e)
                raise
        try:
            return _run(_counts_stream(spark, src), body, str(tmp_path / "ck-2"), may_fail=True)
        finally:
            op.close()

    q = fresh_run()
    assert q.exception() is not None and len(caught) == 1, (q.exception(), caught)
    e = caught[0]
    assert isinstance(e, FreshCheckpointError) and isinstance(e, rhino.InvalidArgumentError), repr(e)
    assert "state through batch 1, but this query starts at batch 0" in str(e), str(e)
    assert "rhino drop lc-fresh --namespace tenant1" in str(e), str(e)
    assert "FreshCheckpointError" in str(q.exception()), str(q.exception())[:2000]
    assert not fresh and cc.placement(oid).last_batch == 1  # nothing ran, nothing committed

    # rhino drop (its Python form), then the same fresh query starts over from nothing
    dropped = cc.drop_operator(oid, idle_s=0)
    assert dropped["operator_id"] == oid and not dropped["not_reached"], dropped
    assert oid not in {o.get("operator_id") for o in cc.status().get("operators", [])}
    caught.clear()
    q = fresh_run()
    assert q.exception() is None and not caught, (q.exception(), caught)
    pd.testing.assert_frame_equal(_canon(pd.concat(fresh)), _running_counts(frames))
    assert cc.placement(oid).last_batch == 1


# ---- c. the same operator name in two namespaces -------------------------------------------------


def test_c_the_same_operator_name_in_two_namespaces_does_not_interfere(cluster, cc, spark, tmp_path):
    # the same keys in both jobs, with other values and another number of batches
    jobs = {"jobA": [pd.DataFrame({"k": [1, 1, 2], "v": [1, 2, 3]}), pd.DataFrame({"k": [1, 2], "v": [4, 5]})],
            "jobB": [pd.DataFrame({"k": [1, 2, 2, 2], "v": [100, 200, 300, 400]}),
                     pd.DataFrame({"k": [2], "v": [500]}), pd.DataFrame({"k": [1, 3], "v": [600, 700]})]}
    got: dict[str, list[pd.DataFrame]] = {ns: [] for ns in jobs}
    ops = {ns: _counts_op(cluster, "counts", ns) for ns in jobs}
    queries = []
    try:
        for ns, frames in jobs.items():  # both queries at once
            _add_files(tmp_path / ns, dict(enumerate(frames)))
            queries.append(_counts_stream(spark, tmp_path / ns).writeStream
                           .foreachBatch(ops[ns].for_each_batch(_collect(got[ns])))
                           .option("checkpointLocation", str(tmp_path / f"ck-{ns}")).trigger(availableNow=True)
                           .start())
        for q in queries:
            q.awaitTermination(180)
            assert q.exception() is None, q.exception()
    finally:
        for q in queries:
            q.stop()
        for op in ops.values():
            op.close()
    for ns, frames in jobs.items():
        pd.testing.assert_frame_equal(_canon(pd.concat(got[ns])), _running_counts(frames), obj=ns)
        assert ops[ns].operator_id == f"{ns}..counts"
        assert cc.placement(f"{ns}..counts").last_batch == len(frames) - 1
    with pytest.raises(rhino.RhinoError):  # nothing in the default namespace
        cc.placement("counts")
