"""An executor SIGKILLed while the sink reads a batch's output (issue 28, Build 1), on a
real 3-host standalone cluster: the output's blocks on that executor are lost (the
output's lineage ends at its checkpoint, so Spark cannot recompute them, and never runs
the stateful tasks again by itself); ``for_each_batch`` runs the batch again from b-1
and calls the sink again with the same batch id. The sink's final output is exactly the
failure-free one. Its own module: the cluster's SparkSession must be the only one.

Oracle: a pandas computation over the same micro-batches.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark import cloudpickle  # noqa: E402

import rhino.spark  # noqa: E402

from test_spark_output import Fanout, batches_of, canon, fanout_oracle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules["test_spark_output"])


def test_an_executor_killed_while_the_sink_runs_reruns_the_batch_exactly_once(tmp_path):
    from rhino_bench.harness.spark_cluster import LocalCluster

    batches = batches_of(4, 3_000, 200, seed=2)
    with LocalCluster.up(tmp_path / "cluster", hosts=3, first_host=44, heartbeat_timeout=600.0) as cl:
        spark = cl.spark_session("rhino-output-kill")
        try:
            op = rhino.spark.transform_with_state(Fanout(), key="k", output_schema="k long, j long, n long",
                                                  operator_id="fanout-kill", coordinator=cl.coordinator,
                                                  secret_file=str(cl.secret_file), parallelism=3, replicas=2)
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

            fn = op.for_each_batch(write)
            for b, pdf in enumerate(batches):
                fn(spark.createDataFrame(pdf), b)
        finally:
            spark.stop()
    assert killed
    assert [r["batch"] for r in op.output_reruns] == [2], op.output_reruns
    for b, want in enumerate(fanout_oracle(batches)):
        got = pd.read_parquet(sink / f"batch={b}")
        pd.testing.assert_frame_equal(canon(got), canon(want))
