"""Initial state (``initial_state=``, Spark's ``initialState``): the same processor on
Spark's own ``transformWithStateInPandas`` (RocksDB) with ``initialState=`` and on
Rhino, over the same file stream, give the same output batch by batch; on Rhino,
batch 0 runs twice (its first commit refused, as after a failover) and the initial
state still counts once. Bad initial states are refused clearly.

Real `rhino worker` processes on 127.0.0.2..4, as in test_spark_operator."""

from __future__ import annotations

import os
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import RefuseFirstCommit, local_spark, rhino_cluster  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InitProcessor(StatefulProcessor):
    """Per key: a count and the values seen (ListState). The initial state sets the count to
    the sum of its ``init`` values, appends them, and registers a processing-time timer that is
    already due; input rows add to the count; the timer emits the key once."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "c long")
        self.hist = handle.getListState("hist", "v long")

    def handleInitialState(self, key, initialState, timerValues):
        vals = [int(v) for v in initialState["init"]]
        self.count.update(((self.count.get() or (0,))[0] + sum(vals),))
        for v in vals:
            self.hist.appendValue((v,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)

    def handleInputRows(self, key, rows, timerValues):
        vals = [int(v) for p in rows for v in p["v"]]
        c = (self.count.get() or (0,))[0] + len(vals)
        self.count.update((c,))
        for v in vals:
            self.hist.appendValue((v,))
        hist = [x[0] for x in self.hist.get()]
        yield pd.DataFrame({"k": [key[0]], "count": [c], "hist_sum": [sum(hist)], "hist_len": [len(hist)],
                            "why": ["data"]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"k": [key[0]], "count": [self.count.get()[0]], "hist_sum": [0], "hist_len": [0],
                            "why": ["timer"]})

    def close(self):
        pass


OUT = "k long, count long, hist_sum long, hist_len long, why string"
INIT = pd.DataFrame({"k": [1, 2, 2, 3, 4], "init": [100, 10, 20, 7, 40]})
BATCHES = [pd.DataFrame({"k": [1, 2, 5, 5], "v": [1, 2, 3, 4]}),
           pd.DataFrame({"k": [3, 4, 6, 1], "v": [5, 6, 7, 8]}),
           pd.DataFrame({"k": [2, 3], "v": [9, 10]})]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("initstate")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-initial-state", rocksdb=True)
    yield s
    s.stop()


def _op(cluster, **kw):
    from rhino.spark import transform_with_state

    return transform_with_state(InitProcessor(), key="k", output_schema=OUT, operator_id=kw.pop("op_id"),
                                coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                parallelism=3, replicas=1, locality=False, time_mode="ProcessingTime", **kw)


def _norm(frames) -> pd.DataFrame:
    df = pd.concat([f for f in frames if len(f)], ignore_index=True)
    cols = ["batch", "k", "why", "count", "hist_sum", "hist_len"]
    return df[cols].sort_values(cols).reset_index(drop=True).astype({c: "int64" for c in cols if c != "why"})


def test_initial_state_equals_sparks_own_and_counts_once_when_batch_0_runs_again(cluster, spark, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    base = time.time() - 100
    for i, pdf in enumerate(BATCHES):
        f = src / f"part-{i:03d}.parquet"
        pdf.to_parquet(f)
        os.utime(f, (base + i, base + i))  # the file source's order

    def stream():
        return spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).parquet(str(src))

    init_df = spark.createDataFrame(INIT)
    got_s: list[pd.DataFrame] = []
    ids_s: list[int] = []

    def sink_s(df, b):
        got_s.append(df.toPandas().assign(batch=b))
        ids_s.append(b)

    q = (stream().groupBy("k").transformWithStateInPandas(InitProcessor(), outputStructType=OUT,
                                                          outputMode="Update", timeMode="ProcessingTime",
                                                          initialState=init_df.groupBy("k"))
         .writeStream.foreachBatch(sink_s)
         .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
    # Spark's own operator with processing-time timers keeps running no-data batches under
    # availableNow (they emit nothing here), so awaitTermination never returns: wait for the
    # last file's batch, then stop it
    deadline = time.monotonic() + 180
    while max(ids_s, default=-1) < len(BATCHES) - 1 and q.isActive and time.monotonic() < deadline:
        time.sleep(0.2)
    q.stop()
    assert max(ids_s, default=-1) >= len(BATCHES) - 1, "Spark's own query did not run its batches in time"

    op = _op(cluster, op_id="initial", initial_state=init_df.groupBy("k"))
    op.control.client = RefuseFirstCommit(op.coordinator(), 0)
    got_r: dict[int, pd.DataFrame] = {}  # an idempotent sink, by batch id
    calls: list[int] = []

    def sink(df, b):
        calls.append(b)
        got_r[b] = df.toPandas().assign(batch=b)

    q = (stream().writeStream.foreachBatch(op.for_each_batch(sink))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert op.control.client.refused == 1 and op.reports[0].attempts == 2
    # the sink is fused with the stateful stage: it saw the refused attempt's output too,
    # which the accepted attempt's replaced
    assert calls.count(0) == 2 and len(calls) == len(got_r) + 1, calls

    s, r = _norm(got_s), _norm(list(got_r.values()))
    pd.testing.assert_frame_equal(r, s)
    # the independent expectation: batch 0 applies the initial state (sum, once), then the rows
    want0 = {(1, "data"): (101, 101, 2), (2, "data"): (31, 32, 3), (5, "data"): (2, 7, 2)}
    got0 = {(row.k, row.why): (row.count, row.hist_sum, row.hist_len)
            for row in s[s["batch"] == 0].itertuples() if row.why == "data"}
    assert got0 == want0, s
    # every key with an initial state had its timer fire once, in batch 0
    assert sorted(s[s["why"] == "timer"][["batch", "k"]].values.tolist()) == [[0, 1], [0, 2], [0, 3], [0, 4]]
    # keys 3 and 4 had only an initial state in batch 0; batch 1 continues from it
    b1 = s[(s["batch"] == 1) & (s["why"] == "data")].set_index("k")
    assert b1.loc[3, "count"] == 8 and b1.loc[4, "count"] == 41 and b1.loc[6, "count"] == 1
    assert b1.loc[1, "count"] == 102


def test_bad_initial_states_are_refused_clearly(cluster, spark):
    from rhino.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="lacks the key column"):
        _op(cluster, op_id="init-bad-1", initial_state=spark.createDataFrame(pd.DataFrame({"x": [1]})))
    with pytest.raises(InvalidArgumentError, match="DataFrame or df.groupBy"):
        _op(cluster, op_id="init-bad-2", initial_state=INIT)
    op = _op(cluster, op_id="init-bad-3",
             initial_state=spark.createDataFrame(pd.DataFrame({"k": ["a"], "init": [1]})))
    with pytest.raises(InvalidArgumentError, match="same type"):
        op.process_batch(spark.createDataFrame(BATCHES[0]), 0)

