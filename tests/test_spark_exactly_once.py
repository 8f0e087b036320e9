"""Exactly-once under a host loss: NEXMark Q8 on rhino.spark over a real 3-host
Spark standalone cluster (127.0.0.x), r=2, with one host SIGKILLed mid-run
(its Spark worker, executors and Rhino worker at once). The query is not
restarted; its output must equal the failure-free run's, batch by batch, and
the failure-free run must equal an independent pandas computation of Q8.

`RHINO_EXACTLY_ONCE_TRIALS` sets the number of killed-host trials (1 here;
`make chaos` runs 20)."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402

from rhino_testing.harness.spark_cluster import LocalCluster  # noqa: E402
from rhino_testing.nexmark import oracle  # noqa: E402
from rhino_testing.nexmark.generator import generate  # noqa: E402
from rhino_testing.nexmark.source import config_from_options  # noqa: E402
from rhino_testing.nexmark.pipeline import run_pipeline  # noqa: E402

TRIALS = int(os.environ.get("RHINO_EXACTLY_ONCE_TRIALS", "1"))
EVENTS_PER_BATCH = 3000
BATCHES = 10
PARAMS = {"window_ms": 4000}
SOURCE = {"interEventDelayUs": 500, "payloadBytes": 64}  # 2000 events per second of event time


def _canon(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    return df.sort_values(list(df.columns)).reset_index(drop=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("eo-cluster")
    with LocalCluster.up(d, hosts=3, first_host=30, heartbeat_timeout=2.0) as cl:
        spark = cl.spark_session("rhino-exactly-once")
        try:
            yield cl, spark
        finally:
            spark.stop()


def test_q8_with_a_killed_host_equals_the_failure_free_run(cluster, tmp_path):
    cl, spark = cluster
    common = dict(system="rhino", query="q8", events_per_batch=EVENTS_PER_BATCH,
                  max_events=EVENTS_PER_BATCH * BATCHES, source_options=SOURCE, params=PARAMS,
                  coordinator=cl.coordinator, secret_file=str(cl.secret_file), parallelism=3, replicas=2)
    ref = run_pipeline(spark, checkpoint_dir=tmp_path / "ref", operator_id="q8-ref", **common)
    want = _canon(ref.output())
    # the failure-free run against pandas over the same events (closed windows only)
    events_pdf = generate(0, EVENTS_PER_BATCH * BATCHES,
                          config=config_from_options(SOURCE)).to_pandas()
    last_wm = ref.operator.reports[-1].watermark_ms
    expect = _canon(oracle.closed("q8", oracle.compute("q8", events_pdf, **PARAMS), last_wm, **PARAMS))
    got_closed = _canon(oracle.closed("q8", ref.output(), last_wm, **PARAMS))
    assert len(expect) > 20
    pd.testing.assert_frame_equal(got_closed, expect, check_dtype=False)

    rng = random.Random(2026)
    for trial in range(TRIALS):
        host = 1 + trial % 3
        kill_at = rng.randrange(2, BATCHES - 3)
        killed: dict = {}

        def on_batch(batch_id: int, run) -> None:
            if batch_id == kill_at and not killed:
                def kill() -> None:
                    time.sleep(rng.uniform(0.05, 0.6))  # lands inside the next batch
                    killed["t"] = time.time()
                    killed["pids"] = cl.kill_host(host)
                threading.Thread(target=kill, daemon=True).start()

        run = run_pipeline(spark, checkpoint_dir=tmp_path / f"t{trial}", operator_id=f"q8-t{trial}",
                           on_batch=on_batch, **common)
        assert killed, "the host was not killed"
        got = _canon(run.output())
        pd.testing.assert_frame_equal(got, want, check_dtype=False,
                                      obj=f"trial {trial}: Q8 output with host {host} killed after batch {kill_at}")
        # the loss was felt: some batch after the kill ran more than once, or at a new epoch
        after = [r for r in run.operator.reports if r.started >= killed["t"] - 1]
        assert any(r.attempts > 1 or r.epoch > run.operator.reports[0].epoch for r in after), \
            [(r.batch, r.attempts, r.epoch, r.errors) for r in run.operator.reports]
        cl.restart_host(host)
        cl.wait_for_executors(spark)
