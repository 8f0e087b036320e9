"""The operator's output stays on the executors (issue 28, Build 1 and 6).

- ``for_each_batch(sink)`` hands the sink a distributed DataFrame, fused with the stateful
  stage (the default) or materialized on the executors: with ``spark.driver.maxResultSize``
  at 1 MiB, a batch of ~10 MiB of output goes to a Parquet sink that the executors write,
  while collecting the same DataFrame to the driver is refused by Spark. Only the tasks'
  meta rows reach the driver. A fused sink that reads only part of its output still
  commits every instance's state.
- Two Rhino operators chained in one ``foreachBatch`` function, each exactly-once.
- An executor SIGKILLed while the sink reads the output: test_spark_output_lost.py.

Oracles: pandas computations over the same micro-batches.
"""

from __future__ import annotations

import sys

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino.spark  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

# the processors below travel to the executors by value (the workers cannot import tests/)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

FANOUT = 10


class Fanout(StatefulProcessor):
    """Per key: a running count of its rows; emits FANOUT rows per input row, each with the
    count after this batch."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        k = int(key[0])
        seen = sum(len(pdf) for pdf in rows)
        n = (self.n.get()[0] if self.n.exists() else 0) + seen
        self.n.update((n,))
        yield pd.DataFrame({"k": [k] * (FANOUT * seen), "j": list(range(FANOUT * seen)), "n": [n] * (FANOUT * seen)})

    def close(self):
        pass


class Histogram(StatefulProcessor):
    """Keyed by ``n``: how many rows with that n it has seen over all batches."""

    def init(self, handle):
        self.c = handle.getValueState("c", "c long")

    def handleInputRows(self, key, rows, timerValues):
        seen = sum(len(pdf) for pdf in rows)
        c = (self.c.get()[0] if self.c.exists() else 0) + seen
        self.c.update((c,))
        yield pd.DataFrame({"n": [int(key[0])], "c": [c]})

    def close(self):
        pass


def fanout_oracle(batches: list[pd.DataFrame]) -> list[pd.DataFrame]:
    counts: dict[int, int] = {}
    out = []
    for pdf in batches:
        rows = []
        for k, g in pdf.groupby("k"):
            counts[k] = counts.get(k, 0) + len(g)
            rows += [(int(k), j, counts[k]) for j in range(FANOUT * len(g))]
        out.append(pd.DataFrame(rows, columns=["k", "j", "n"]))
    return out


def canon(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True).astype("int64")


def batches_of(n: int, rows: int, keys: int, seed: int = 0) -> list[pd.DataFrame]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [pd.DataFrame({"k": rng.integers(0, keys, rows), "v": rng.integers(0, 100, rows)}) for _ in range(n)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("output"), hosts=(81, 82, 83)) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    # A result larger than 1 MiB cannot reach the driver.
    s = local_spark("rhino-output", **{"spark.driver.maxResultSize": "1m"})
    yield s
    s.stop()


def _op(cluster, processor, name, out_schema, key="k", **kw):
    return rhino.spark.transform_with_state(processor, key=key, output_schema=out_schema, operator_id=name,
                                            coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                            parallelism=3, replicas=1, locality=False, **kw)


@pytest.mark.parametrize("materialize", [False, True], ids=["fused", "materialized"])
def test_output_goes_from_the_executors_to_the_sink_not_through_the_driver(cluster, spark, tmp_path, materialize):
    batches = batches_of(3, 40_000, 500)  # 400k output rows (~10 MiB) per batch
    op = _op(cluster, Fanout(), f"fanout-{materialize}", "k long, j long, n long")
    sink = tmp_path / "sink"
    refused: list[int] = []

    def write(df, b):
        if b == 2:
            # The same DataFrame collected to the driver is more than Spark lets through. Fused,
            # this action runs the stateful tasks too (and is aborted); the write below runs them
            # again from b-1: the same output.
            with pytest.raises(Exception, match="maxResultSize"):
                df.toArrow()
            refused.append(b)
        df.write.mode("overwrite").parquet(str(sink / f"batch={b}"))  # idempotent by batch id

    fn = op.for_each_batch(write, materialize=materialize)
    for b, pdf in enumerate(batches):
        fn(spark.createDataFrame(pdf), b)
    assert refused == [2]
    for b, want in enumerate(fanout_oracle(batches)):
        got = pd.read_parquet(sink / f"batch={b}")
        pd.testing.assert_frame_equal(canon(got), canon(want))
        assert op.reports[b].rows_out == len(want)
    # every task's meta row reached the driver, none of the output
    assert [sorted(t["instance"] for t in r.tasks) for r in op.reports] == [[0, 1, 2]] * 3
    assert [r.attempts for r in op.reports] == [1, 1, 1]


def test_a_fused_sink_that_reads_part_of_the_output_still_commits_every_instance(cluster, spark):
    batches = batches_of(3, 3_000, 100, seed=5)
    op = _op(cluster, Fanout(), "fanout-partial", "k long, j long, n long")
    heads: dict[int, int] = {}

    def peek(df, b):
        heads[b] = len(df.limit(5).collect())  # reads a few rows of one task's output

    fn = op.for_each_batch(peek)
    for b, pdf in enumerate(batches):
        fn(spark.createDataFrame(pdf), b)
    assert heads == {0: 5, 1: 5, 2: 5}
    assert [sorted(t["instance"] for t in r.tasks) for r in op.reports] == [[0, 1, 2]] * 3
    # every instance's state is the oracle's: the next batch's output equals it
    got = op.process_batch(spark.createDataFrame(batches[1]), 3).to_pandas()
    want = fanout_oracle(batches + [batches[1]])[3]
    pd.testing.assert_frame_equal(canon(got), canon(want))


def test_two_operators_chain_in_one_batch_each_exactly_once(cluster, spark):
    batches = batches_of(4, 300, 20, seed=1)
    first = _op(cluster, Fanout(), "chain-first", "k long, j long, n long")
    second = _op(cluster, Histogram(), "chain-second", "n long, c long", key="n")
    got: list[pd.DataFrame] = []

    def body(df, b):
        got.append(second.transform(first.transform(df, b), b).toPandas())

    for b, pdf in enumerate(batches):
        body(spark.createDataFrame(pdf), b)
    # batch 3 runs again (a replay of the last batch, as after a driver restart): the same output
    again = second.transform(first.transform(spark.createDataFrame(batches[3]), 3), 3).toPandas()
    pd.testing.assert_frame_equal(canon(again), canon(got[3]))

    hist: dict[int, int] = {}
    for b, out in enumerate(fanout_oracle(batches)):
        for n, g in out.groupby("n"):
            hist[int(n)] = hist.get(int(n), 0) + len(g)
        want = pd.DataFrame([(int(n), hist[int(n)]) for n in out["n"].unique()], columns=["n", "c"])
        pd.testing.assert_frame_equal(canon(got[b]), canon(want))


class CountThenTimer(StatefulProcessor):
    """Processing time: counts each key's rows; a timer 10 ms after the batch emits the count."""

    def init(self, handle):
        self.handle = handle
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        seen = sum(len(pdf) for pdf in rows)
        self.n.update(((self.n.get()[0] if self.n.exists() else 0) + seen,))
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 10)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"k": [int(key[0])], "n": [self.n.get()[0]]})
        self.n.clear()

    def close(self):
        pass


def test_a_task_works_through_its_partition_a_window_of_whole_keys_at_a_time(cluster, spark):
    import numpy as np

    rng = np.random.default_rng(3)
    # 200 small keys and one key (7) with 600 rows, in a window of 100 rows (16k output rows:
    # under this module's 1 MiB maxResultSize, collected)
    pdf = pd.DataFrame({"k": np.r_[rng.integers(0, 200, 1000), np.full(600, 7)], "v": 0}).sample(frac=1, random_state=1)
    op = _op(cluster, Fanout(), "windows", "k long, j long, n long", task_window_rows=100)
    out = op.process_batch(spark.createDataFrame(pdf), 0).to_pandas()
    pd.testing.assert_frame_equal(canon(out), canon(fanout_oracle([pdf])[0]))
    tasks = op.reports[0].tasks
    biggest = int(pdf.groupby("k").size().max())
    for t in tasks:
        if t["rows_in"]:
            # whole keys, at most 100 rows a window, or one key's rows if it has more
            assert t["max_window_rows"] <= max(100, biggest), t
            assert t["windows"] >= t["rows_in"] / (100 + biggest), t
    assert sum(t["windows"] for t in tasks) >= 10
    assert max(t["max_window_rows"] for t in tasks) == biggest  # key 7 came whole, in one window

    # Due timers fire a window of keys at a time, in (time, key) order, each with its state.
    clock = {"now": 1_000_000}
    op2 = _op(cluster, CountThenTimer(), "window-timers", "k long, n long", time_mode="ProcessingTime",
              task_window_rows=40, clock=lambda: clock["now"])
    op2.process_batch(spark.createDataFrame(pdf), 0)
    clock["now"] += 1000
    fired = op2.process_batch(spark.createDataFrame([], "k long, v long"), 1).to_pandas()
    want = pdf.groupby("k").size().rename("n").reset_index()
    pd.testing.assert_frame_equal(canon(fired), canon(want))
    assert sum(t["timers_fired"] for t in op2.reports[1].tasks) == len(want)


def test_rescaled_down_then_up_the_new_instance_number_is_routed(cluster, spark):
    """After 3 -> 2 (instance 2 retired) and 2 -> 3 (the new instance is number 3: a retired
    number is never reused), partition p of a batch runs instance ``sorted(instances)[p]``:
    every row reaches the instance that owns its vnode, and the output is exactly-once."""
    from rhino.coordinator.client import connect_coordinator

    batches = batches_of(5, 600, 60, seed=9)
    op = _op(cluster, Fanout(), "renumbered", "k long, j long, n long")
    got = [op.process_batch(spark.createDataFrame(batches[0]), 0).to_pandas()]
    with connect_coordinator(cluster["coordinator"], secret=cluster["secret"]) as cc:
        cc.rescale("renumbered", 2)
        got.append(op.process_batch(spark.createDataFrame(batches[1]), 1).to_pandas())  # its barrier: 3 -> 2
        cc.rescale("renumbered", 3)
        for b in (2, 3, 4):
            got.append(op.process_batch(spark.createDataFrame(batches[b]), b).to_pandas())
        instances = cc.placement("renumbered").instance_order()
    assert instances == [0, 1, 3]
    assert sorted(t["instance"] for t in op.reports[-1].tasks) == [0, 1, 3]
    for b, want in enumerate(fanout_oracle(batches)):
        pd.testing.assert_frame_equal(canon(got[b]), canon(want))
