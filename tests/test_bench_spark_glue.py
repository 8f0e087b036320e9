"""``rhino-bench spark glue`` runs end to end at a small size (a benchmark that breaks is
found here, not when its results are next wanted): every batch's output has one row per
key (checked inside the bench), the records carry the figures the report is made of, and
the report is written. The figures themselves are the bench's business
(bench/results/spark_glue_1m.md), not this test's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark")


def test_glue_bench_runs_and_reports(tmp_path):
    from rhino_bench.spark.glue import main

    out, report = tmp_path / "glue.jsonl", tmp_path / "glue.md"
    assert main(["--keys", "3000", "--batches", "2", "--mode", "both", "--processors", "count,null",
                 "--profile", "--first-host", "72", "--dir", str(tmp_path / "w"), "--out", str(out),
                 "--report", str(report)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    batches = [r for r in recs if r["record"] == "batch"]
    # 2 modes x 2 processors x (2 batches + 1 profiled)
    assert len(batches) == 12
    assert {(r["mode"], r["processor"]) for r in batches} == {(m, p) for m in ("pandas", "rows")
                                                               for p in ("count", "null")}
    for r in batches:
        assert r["keys"] == 3000 and r["task_cpu_s"] > 0 and r["processor_cpu_s"] >= 0
        assert r["phases_s"]["commit_s"] > 0 and r["round_trips"] > 0
        assert r["puts"] == (3000 if r["processor"] == "count" else 0)
    assert all(r["profile_top"] for r in batches if r["profiled"])
    floor = next(r for r in recs if r["record"] == "floor")
    assert floor["pandas_slice_us"] > 0
    summary = next(r for r in recs if r["record"] == "summary")
    assert set(summary["framework_cpu_us_per_key"]) == {"pandas", "rows"}
    text = report.read_text()
    assert "## The floor" in text and "## Profile (pandas mode" in text
