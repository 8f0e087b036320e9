"""The operator's per-batch figures where Spark users look (issue 45, item 5): the same
processor on Spark's own ``transformWithStateInPandas`` and on Rhino over the same
micro-batches (one file each).

- ``op.progress(b)`` has Spark's ``StateOperatorProgress`` shape, and the state rows
  updated and removed in each batch equal those of Spark's own ``stateOperators`` block;
  the rows in and the keys equal the files' (pandas);
- the Spark UI's Jobs page (its REST API) has each committed batch as a job described with
  those figures, and the attempt's jobs described with the batch and the attempt.

Real ``rhino worker`` processes on 127.0.0.2..4 and a local SparkSession with its UI on."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CountThenClear(StatefulProcessor):
    """Per key: a count, updated by each batch with input; at 3 or more it is emitted and cleared."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.n.get() or (0,))[0] + sum(len(p) for p in rows)
        if n >= 3:
            self.n.clear()
            yield pd.DataFrame({"k": [key[0]], "n": [n]})
        else:
            self.n.update((n,))

    def close(self):
        pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("metrics")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-metrics", rocksdb=True, **{"spark.ui.enabled": "true", "spark.ui.port": "0"})
    yield s
    s.stop()


def test_per_batch_figures_match_sparks_state_operator_and_reach_the_spark_ui(cluster, spark, tmp_path):
    from rhino.spark import transform_with_state

    src = tmp_path / "src"
    src.mkdir()
    # batch 0: keys 1-4 (1 twice); batch 1: key 1 reaches 3 (cleared), 2 again; batch 2: 2 reaches 3, 5 new
    frames = [pd.DataFrame({"k": [1, 1, 2, 3, 4]}), pd.DataFrame({"k": [1, 2, 6]}), pd.DataFrame({"k": [2, 5]})]
    base = time.time() - 100
    for i, pdf in enumerate(frames):
        f = src / f"part-{i:03d}.parquet"
        pdf.to_parquet(f)
        os.utime(f, (base + i, base + i))
    out = "k long, n long"

    def stream():
        return spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(src))

    qs = (stream().groupBy("k").transformWithStateInPandas(CountThenClear(), outputStructType=out, outputMode="Update",
                                                           timeMode="None")
          .writeStream.foreachBatch(lambda df, b: df.count()).option("checkpointLocation", str(tmp_path / "ck-spark"))
          .trigger(availableNow=True).start())
    qs.awaitTermination(180)
    spark_ops = {p["batchId"]: p["stateOperators"][0] for p in qs.recentProgress if p["stateOperators"]}
    op = transform_with_state(CountThenClear(), key="k", output_schema=out, operator_id="metrics-count",
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=1, locality=False)
    qr = (stream().writeStream.foreachBatch(op.for_each_batch(lambda df, b: df.count()))
          .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    qr.awaitTermination(180)
    assert qr.exception() is None and qs.exception() is None
    for b, pdf in enumerate(frames):
        got = op.progress(b)
        assert got is not None and got["operatorName"] == "rhinoTransformWithState"
        assert set(spark_ops[b]) >= set(got) - {"customMetrics"}, "a field Spark's block does not have"
        for field in ("numRowsUpdated", "numRowsRemoved", "numRowsDroppedByWatermark"):
            assert got[field] == spark_ops[b][field], (b, field, got, spark_ops[b])
        assert got["customMetrics"]["numInputRows"] == len(pdf)
        assert got["customMetrics"]["numKeys"] == pdf["k"].nunique()
        assert got["numStateStoreInstances"] == 2
    assert op.progress() == op.progress(len(frames) - 1) and op.progress(99) is None
    # the Spark UI: a job per committed batch, described with its figures; the attempts' jobs too
    sc = spark.sparkContext
    jobs = json.load(urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/jobs"))
    described = [j.get("description") or "" for j in jobs]
    for b in range(len(frames)):
        p = op.progress(b)
        line = [d for d in described if d.startswith(f"rhino metrics-count batch {b} committed:")]
        assert len(line) == 1, described
        assert f"{p['customMetrics']['numInputRows']} rows in" in line[0]
        assert f"{p['numRowsUpdated']} state rows updated, {p['numRowsRemoved']} removed" in line[0]
        assert any(d.startswith(f"rhino metrics-count batch {b} attempt 1: 2 instances at epoch") for d in described)
    # the user's own description is theirs again after the batches
    assert sc.getLocalProperty("spark.job.description") is None
