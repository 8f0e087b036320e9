"""Hosts join and leave while a ``rhino.spark`` query runs (issue 29, Build 2), on a real
3-host standalone cluster (``LocalCluster``, 127.0.0.150..):

1. a host joins (``add_host``: a Spark worker and a Rhino worker, registered);
2. the operator is rescaled 3 -> 4 with the new instance on the new host (a bulk copy of
   the vnodes it takes, then a handover at a batch barrier);
3. host 1 is decommissioned (``decommission_host``): every primary and replica on it moves
   off at the operator's next batch barrier, then the host is stopped.

No batch fails or runs again (every batch commits at its first attempt), nothing is placed
on the decommissioned worker any more, and the output equals a pandas computation over the
same micro-batches, batch by batch. Its own module: the cluster's SparkSession must be the
only one.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark import cloudpickle  # noqa: E402

import rhino.spark  # noqa: E402

from test_spark_live_reconfigure import RunningCount, canon, oracle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules["test_spark_live_reconfigure"])

FILES = 24
ROWS = 400
KEYS = 60


def test_a_host_joins_the_query_rescales_onto_it_and_another_host_is_decommissioned(tmp_path):
    from rhino_testing.harness.spark_cluster import LocalCluster

    rng = np.random.default_rng(11)
    batches = [pd.DataFrame({"k": rng.integers(0, KEYS, ROWS), "v": rng.integers(0, 1000, ROWS)})
               for _ in range(FILES)]
    src = tmp_path / "src"
    src.mkdir()
    with LocalCluster.up(tmp_path / "cluster", hosts=3, first_host=150, heartbeat_timeout=2.0) as cl:
        spark = cl.spark_session("rhino-join-leave", spare_hosts=1)
        try:
            op = rhino.spark.transform_with_state(RunningCount(), key="k", output_schema="k long, n long, s long",
                                                  operator_id="join-leave", coordinator=cl.coordinator,
                                                  secret_file=str(cl.secret_file), parallelism=3, replicas=2)
            got: dict[int, pd.DataFrame] = {}  # an idempotent sink, by batch id

            def sink(df, b):
                got[b] = df.toPandas()

            base = time.time() - 1000
            written = []

            def write(i: int) -> None:
                f = src / f"part-{i:03d}.parquet"
                batches[i].to_parquet(f)
                os.utime(f, (base + i, base + i))  # the file source's order
                written.append(i)

            stop = threading.Event()

            def feed() -> None:  # one file every 0.8 s, while the reconfigurations happen
                for i in range(FILES):
                    if stop.is_set():
                        return
                    write(i)
                    time.sleep(0.8)

            q = (spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.foreachBatch(op.for_each_batch(sink))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="500 milliseconds")
                 .start())
            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            try:
                def committed() -> int:
                    return len(op.reports)

                def wait_for(n: int, timeout: float = 120.0) -> None:
                    deadline = time.monotonic() + timeout
                    while committed() < n:
                        assert q.isActive, q.exception()
                        assert time.monotonic() < deadline, f"only {committed()} batches in {timeout:g} s"
                        time.sleep(0.1)

                wait_for(2)
                new = cl.add_host()  # host 4
                cl.wait_for_executors(spark)
                new_worker = new.rhino_worker.id
                with cl.coordinator_client() as cc:
                    plan = cc.rescale("join-leave", 4, on=[new_worker])
                    deadline = time.monotonic() + 120
                    while [p for p in cc.status()["plans_in_flight"] if p["id"] == plan["plan"]]:
                        assert q.isActive, q.exception()
                        assert time.monotonic() < deadline, "the rescale did not finish"
                        time.sleep(0.1)
                    rescaled_at = committed()
                    leaving = cl.host(1).rhino_worker.id
                    drained = cl.decommission_host(1, timeout=120)
                    decommissioned_at = committed()
                    assert drained["drained"] is True
                    st = {o["operator_id"]: o for o in cc.status()["operators"]}["join-leave"]
                feeder.join(timeout=120)
                wait_for(FILES, timeout=180)
                q.processAllAvailable()
            finally:
                stop.set()
                q.stop()
        finally:
            spark.stop()

    # the rescale and the decommission happened while batches ran, before the last ones
    assert 2 <= rescaled_at <= decommissioned_at < FILES, (rescaled_at, decommissioned_at)
    # the new instance lives on the new host; nothing is left on the decommissioned worker
    insts = st["instances"]
    assert len(insts) == 4 and any(r["primary"] == new_worker for r in insts), insts
    assert all(r["primary"] != leaving and leaving not in r["chain"] for r in insts), insts
    assert {len(r["chain"]) for r in insts} == {2}, insts
    # no batch failed or ran again
    assert [r.attempts for r in op.reports] == [1] * len(op.reports), [(r.batch, r.attempts, r.errors)
                                                                         for r in op.reports]
    # exactly-once: every batch's output is the oracle's
    want = oracle(batches)
    assert sorted(got) == list(range(FILES))
    for b in range(FILES):
        pd.testing.assert_frame_equal(canon(got[b]), canon(want[b]))
