"""The README's rhino.spark example ("## PySpark pipelines on Rhino") runs as
written, on local Spark, a real coordinator process and three real workers.
Only its addresses, paths and source table are replaced; its output is
checked against a pandas count of the same clicks."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402

from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"


def _block() -> str:
    text = README.read_text()
    sec = text[text.index("## PySpark pipelines on Rhino"):]
    sec = sec[: sec.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", sec, flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_readme_spark_example_runs(tmp_path: Path):
    root = tmp_path / "cluster"
    root.mkdir()
    sf = write_secret(root)
    coord = CoordinatorProcess(root, secret_file=sf, heartbeat_timeout=2.0).start()
    workers = []
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        for n in (2, 3, 4):
            workers.append(WorkerProcess(root, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                                         extra_args=["--coordinator", coord.address]).start())
        time.sleep(1.0)
        clicks = tmp_path / "clicks"
        clicks.mkdir()
        rows = pd.DataFrame({"user": [i % 7 for i in range(50)], "url": [f"/p{i}" for i in range(50)]})
        rows.iloc[:30].to_parquet(clicks / "a.parquet")
        rows.iloc[30:].to_parquet(clicks / "b.parquet")
        code = _block()
        for old, new in [
            ('SparkSession.builder.config(', 'SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config('),
            ('"10.0.0.1:7070"', repr(coord.address)),
            ('"/etc/rhino/secret"', repr(str(sf))),
            ('spark.readStream.table("clicks")',
             f'spark.readStream.schema("user long, url string").option("maxFilesPerTrigger", 1).parquet({str(clicks)!r})'),
            ("/data/job", str(tmp_path / "job")),
        ]:
            assert old in code, old
            code = code.replace(old, new)
        ns: dict = {}
        exec(compile(code, "README.md", "exec"), ns)
        spark = ns["spark"]
        try:
            (q,) = spark.streams.active
            q.processAllAvailable()
            q.stop()
            out = spark.read.parquet(str(tmp_path / "job" / "out")).toPandas()
        finally:
            spark.stop()
        # the last batch's count per user equals pandas' count over all the clicks
        last = out.sort_values("batch").groupby("user").last()["clicks"].sort_index()
        want = rows.groupby("user").size().sort_index()
        assert last.to_dict() == want.to_dict()
    finally:
        for w in workers:
            w.stop()
        coord.stop()
