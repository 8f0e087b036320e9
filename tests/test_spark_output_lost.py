"""An executor SIGKILLed while the sink runs (issue 28, Build 1), on a real 3-host
standalone cluster, for both forms of ``for_each_batch``. The sink's final output is
exactly the failure-free one either way. Its own module: the cluster's SparkSession must
be the only one.

- Materialized (``materialize=True``): the batch's output is checkpointed on the executors
  and committed before the sink reads it. The executor dies before the sink reads it: its
  blocks are lost (the lineage ends at the checkpoint, so Spark cannot recompute them, and
  never runs the stateful tasks again by itself); ``for_each_batch`` runs the batch again
  from b-1 and calls the sink again with the same batch id.
- Fused (the default): the sink's own job runs the stateful tasks. The executor dies while
  they run (its Rhino worker lives on): Spark runs the lost task again, which starts from
  b-1 in a session of the same epoch and gives the same output; had the loss moved the
  operator to a new epoch, the whole batch, sink included, would run again from b-1. The
  batch commits only after the sink returned. (A whole host SIGKILLed while fused sinks
  run: test_spark_exactly_once.py and test_spark_chain_exactly_once.py.)

Oracle: a pandas computation over the same micro-batches.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark import cloudpickle  # noqa: E402

import rhino.spark  # noqa: E402

from test_spark_output import Fanout, batches_of, canon, fanout_oracle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules["test_spark_output"])
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class SlowFanout(Fanout):
    """Fanout, 50 ms per key: the stateful stage runs for a few seconds, long enough to kill
    an executor while it runs."""

    def handleInputRows(self, key, rows, timerValues):
        time.sleep(0.05)
        yield from super().handleInputRows(key, rows, timerValues)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from rhino_testing.harness.spark_cluster import LocalCluster

    # heartbeats never time out here: only the batch watch can tell the coordinator of the loss
    with LocalCluster.up(tmp_path_factory.mktemp("cluster"), hosts=3, first_host=60, heartbeat_timeout=600.0) as cl:
        spark = cl.spark_session("rhino-output-kill")
        try:
            yield cl, spark
        finally:
            spark.stop()


def _op(cl, processor, name):
    return rhino.spark.transform_with_state(processor, key="k", output_schema="k long, j long, n long",
                                            operator_id=name, coordinator=cl.coordinator,
                                            secret_file=str(cl.secret_file), parallelism=3, replicas=2)


def _check(sink, batches):
    for b, want in enumerate(fanout_oracle(batches)):
        got = pd.read_parquet(sink / f"batch={b}")
        pd.testing.assert_frame_equal(canon(got), canon(want))


def test_materialized_an_executor_killed_before_the_sink_reads_reruns_the_batch_exactly_once(cluster, tmp_path):
    cl, spark = cluster
    cl.wait_for_executors(spark)
    batches = batches_of(4, 3_000, 200, seed=2)
    op = _op(cl, Fanout(), "fanout-kill")
    sink = tmp_path / "sink"
    killed: list[int] = []

    def write(df, b):
        if b == 2 and not killed:
            # The output of batch 2 is on the executors; one of them dies before the
            # sink reads it.
            pids = cl.executor_pids(2)
            assert pids, "no executor on host 2"
            for p in pids:
                os.kill(p, signal.SIGKILL)
            killed.extend(pids)
        df.write.mode("overwrite").parquet(str(sink / f"batch={b}"))

    fn = op.for_each_batch(write, materialize=True)
    for b, pdf in enumerate(batches):
        fn(spark.createDataFrame(pdf), b)
    assert killed
    assert [r["batch"] for r in op.output_reruns] == [2], op.output_reruns
    _check(sink, batches)


def test_fused_an_executor_killed_while_the_sink_runs_the_stateful_tasks_exactly_once(cluster, tmp_path):
    cl, spark = cluster
    # the last test killed host 2's executor: its Spark worker starts a new one
    cl.wait_for_executors(spark)
    sc = spark.sparkContext
    batches = batches_of(4, 3_000, 200, seed=3)
    op = _op(cl, SlowFanout(), "fanout-fused-kill")
    sink = tmp_path / "sink"
    killed: list[int] = []
    running_at_kill: list[int] = []
    calls: list[int] = []
    killed_at: list[float] = []

    def kill_when_tasks_run():
        # once the sink's job runs tasks (the stateful stage: the shuffle map stage is short),
        # wait a little, then SIGKILL host 2's executor while they run
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = sc.statusTracker()
            active = [st.getStageInfo(s) for s in st.getActiveStageIds()]
            if any(i is not None and i.numActiveTasks > 0 and "parquet" in (i.name or "") for i in active):
                time.sleep(0.5)
                running_at_kill.extend((i.name, i.numActiveTasks) for i in
                                       (st.getStageInfo(s) for s in st.getActiveStageIds())
                                       if i is not None and i.numActiveTasks > 0)
                killed_at.append(time.time())
                for p in cl.executor_pids(2):
                    os.kill(p, signal.SIGKILL)
                    killed.append(p)
                return
            time.sleep(0.05)

    def write(df, b):
        calls.append(b)
        if b == 2 and not killed:
            threading.Thread(target=kill_when_tasks_run, daemon=True).start()
        df.write.mode("overwrite").parquet(str(sink / f"batch={b}"))

    fn = op.for_each_batch(write)
    for b, pdf in enumerate(batches):
        fn(spark.createDataFrame(pdf), b)
    assert killed and running_at_kill, (killed, running_at_kill)
    rep = op.reports[2]
    # Spark ran the lost task again (its Rhino worker lives: same epoch, from b-1, the same
    # output), or, had the loss moved the operator to a new epoch, the whole batch ran again,
    # sink included
    retried = [t["instance"] for t in rep.tasks if t["start"] > killed_at[0]]
    assert retried or rep.attempts >= 2, rep
    assert calls.count(2) == rep.attempts and calls.count(3) == 1, calls
    assert op.output_reruns == []  # nothing was materialized, so nothing could be lost
    _check(sink, batches)
