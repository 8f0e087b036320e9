"""Golden tests of NEXMark Q5, Q8 and Q11 on rhino.spark: the processors of
rhino_testing.nexmark.queries, unmodified, run from foreachBatch on Rhino state
(real `rhino worker` processes on 127.0.0.2..4, a real coordinator, local Spark),
against two oracles over the same events: an independent pandas computation
(rhino_testing.nexmark.oracle) and Spark's own transformWithStateInPandas with the
RocksDB state store provider running the same processor class."""

from __future__ import annotations

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402

from rhino_testing.nexmark import oracle  # noqa: E402
from rhino_testing.nexmark.generator import generate  # noqa: E402
from rhino_testing.nexmark.pipeline import run_pipeline  # noqa: E402
from rhino_testing.nexmark.source import config_from_options  # noqa: E402
from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

EVENTS_PER_BATCH = 2500
BATCHES = 6
SOURCE = {"interEventDelayUs": 2000, "payloadBytes": 32}  # 500 events per second of event time
PARAMS = {"q5": {"window_ms": 4000, "slide_ms": 2000}, "q8": {"window_ms": 5000}, "q11": {"gap_ms": 2000}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("nexmark-rhino")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-nexmark")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def events():
    return generate(0, EVENTS_PER_BATCH * BATCHES, config=config_from_options(SOURCE)).to_pandas()


def _canon(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True) if len(df) else df


@pytest.mark.parametrize("query", ["q5", "q8", "q11"])
def test_query_on_rhino_equals_pandas_and_sparks_own_operator(query, cluster, spark, events, tmp_path):
    common = dict(query=query, events_per_batch=EVENTS_PER_BATCH, max_events=EVENTS_PER_BATCH * BATCHES,
                  source_options=SOURCE, params=PARAMS[query])
    rh = run_pipeline(spark, system="rhino", checkpoint_dir=tmp_path / "rhino", operator_id=f"golden-{query}",
                      coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]), parallelism=3,
                      replicas=2, locality=False, **common)
    sp = run_pipeline(spark, system="spark", checkpoint_dir=tmp_path / "spark", **common)
    # The windows both have closed: Rhino's last batch ran at watermark wm; Spark may have run a
    # no-data batch after its last data batch, so it can be ahead: compare up to Rhino's watermark.
    wm = rh.operator.reports[-1].watermark_ms
    p = PARAMS[query]
    want = _canon(oracle.closed(query, oracle.compute(query, events, **p), wm, **p))
    got = _canon(oracle.closed(query, rh.output(), wm, **p))
    spark_out = _canon(oracle.closed(query, sp.output(), wm, **p))
    assert len(want) >= 5, f"{query}: too few closed results to compare ({len(want)})"
    pd.testing.assert_frame_equal(got, want, check_dtype=False, obj=f"{query} on Rhino vs pandas")
    pd.testing.assert_frame_equal(got, spark_out, check_dtype=False, obj=f"{query} on Rhino vs Spark's own")
    # Rhino emitted nothing beyond what was closed (every output row is final)
    assert len(_canon(rh.output())) == len(got)
