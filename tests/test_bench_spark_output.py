"""`rhino-bench spark output`: a tiny run of both systems, checking the JSON lines' fields,
that stdout holds nothing else, and that each system's output has 10 x the input rows
(counted here from the Parquet input files); the processor and the summary on their own;
the argument errors (exit 2).

The run uses a 1-host cluster (127.0.0.130; two Rhino instances, r=0; one batch of 2,000
rows per system, no warm-up): starting a 3-host cluster alone took 50 s on this loaded
2-core machine, and the test is to stay within 90 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_bench

pyspark = pytest.importorskip("pyspark")

from rhino_bench.spark import output  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_bench([sys.executable, "-m", "rhino_bench", "spark", "output", *args], cwd=REPO, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--systems", "flink"], "unknown system"),
    (["--input-rows", "0"], "must be >= 1"),
])
def test_bad_arguments_exit_2(args, message):
    p = _bench(*args, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


class _Value:
    def __init__(self) -> None:
        self.v = None

    def get(self):
        return self.v

    def update(self, v) -> None:
        self.v = v


class _Handle:
    def __init__(self) -> None:
        self.states: dict[str, _Value] = {}

    def getValueState(self, name, schema):
        return self.states.setdefault(name, _Value())


def test_processor_emits_fanout_rows_and_counts_per_key():
    import pandas as pd

    p = output.FanOutProcessor(3)
    h = _Handle()
    p.init(h)
    out = pd.concat(list(p.handleInputRows((5,), iter([pd.DataFrame({"k": [5, 5], "v": [10, 11]}),
                                                       pd.DataFrame({"k": [5], "v": [12]})]), None)))
    assert len(out) == 9 and set(out["k"]) == {5}
    assert list(out["v"]) == [10, 10, 10, 11, 11, 11, 12, 12, 12] and list(out["j"]) == [0, 1, 2] * 3
    assert list(out["seen"]) == [0] * 3 + [1] * 3 + [2] * 3
    assert h.states["count"].v == (3,)
    out = pd.concat(list(p.handleInputRows((5,), iter([pd.DataFrame({"k": [5], "v": [13]})]), None)))
    assert list(out["seen"]) == [3] * 3 and h.states["count"].v == (4,)


def test_summary_judges_the_targets():
    setup = {"record": "setup", "parameters": {"window_rows": 1000, "fanout": 10}}

    def batches(system, rps, drv):
        return [{"record": "batch", "system": system, "batch": i, "warmup": i == 0, "output_rows": 100,
                 "expected_output_rows": 100, "trigger_s": 100 / r, "rows_per_s": r, "driver_rss_mb": d,
                 "python_worker_peak_rss_mb": 200.0, "python_worker_start_rss_mb": 150.0,
                 "python_worker_growth_mb": 50.0}
                for i, (r, d) in enumerate(zip(rps, drv))]

    rh = output.system_record("rhino", batches("rhino", [10, 200, 200], [400, 410, 420]))
    sp = output.system_record("spark-rocksdb", batches("spark-rocksdb", [10, 100, 100], [400, 500, 600]))
    assert rh["rows_per_s"] == 200 and sp["rows_per_s"] == 100  # the warm-up batch is left out
    assert rh["driver_rss_flat"] and not sp["driver_rss_flat"]
    s = output.summarize([setup, rh, sp])
    assert s["rhino_vs_spark"] == 2.0 and s["rhino_vs_spark_target_met"]
    assert not s["driver_rss_flat"] and s["outputs_expected"]
    assert s["rhino_worker_growth_mb"] == 50.0
    assert s["window_mb"] == round(output.window_bytes(1000, 10) / (1 << 20), 1)


def test_tiny_run_both_systems(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "so.jsonl"
    work = tmp_path / "w"
    p = _bench("--input-rows", "2000", "--keys", "100", "--warmup", "0", "--batches", "1", "--hosts", "1",
               "--parallelism", "2", "--replicas", "0", "--first-host", "130",
               "--json", "--out", str(out), "--dir", str(work), "--report", str(tmp_path / "so.md"),
               "--plot", str(tmp_path / "so.png"))
    assert p.returncode == 0, p.stderr[-4000:]
    recs = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]  # nothing but JSON on stdout
    assert recs == [json.loads(x) for x in out.read_text().splitlines()]
    assert recs[0]["record"] == "setup" and recs[-1]["record"] == "summary"
    assert recs[0]["driver_jvm_xmx"] == "-Xmx1g"
    assert recs[0]["spark_conf"]["spark.driver.maxResultSize"] == "64m"
    # the input, counted here: one Parquet file per batch, in order
    files = sorted((work / "input").glob("*.parquet"))
    inputs = [pq.read_metadata(f).num_rows for f in files]
    assert inputs == [2000]
    bs = [r for r in recs if r["record"] == "batch"]
    assert sorted((r["system"], r["batch"]) for r in bs) == [("rhino", 0), ("spark-rocksdb", 0)]
    for r in bs:
        assert r["output_rows"] == 10 * inputs[r["batch"]], r
        assert r["input_rows"] == inputs[r["batch"]]
        assert r["warmup"] is False
        assert r["trigger_s"] > 0 and r["rows_per_s"] > 0
        assert r["driver_rss_mb"] > 100 and r["python_driver_rss_mb"] > 0
        assert r["python_worker_peak_rss_mb"] > 0 and r["python_workers"] >= 1
        assert r["python_worker_growth_mb"] >= 0
        assert r["stages"] and all(st["duration_s"] is not None for st in r["stages"])
        if r["system"] == "rhino":
            assert r["rhino_rows_out"] == r["output_rows"] and r["rhino_attempts"] == 1 and r["rhino_tasks"] == 2
            assert set(r["task_slowest_s"]) >= {"read_s", "process_s", "write_s", "output_s"}
    sys_ = {r["system"]: r for r in recs if r["record"] == "system"}
    assert set(sys_) == {"rhino", "spark-rocksdb"}
    for r in sys_.values():
        assert r["outputs_expected"] and r["steady_batches"] == 1 and r["rows_per_s"] > 0
        assert r["driver_rss_first_mb"] and r["driver_rss_last_mb"] and r["driver_rss_max_mb"]
    summ = recs[-1]
    assert summ["outputs_expected"] and summ["rhino_vs_spark"] > 0
    assert (tmp_path / "so.md").read_text().startswith("# Spark output")
    assert (tmp_path / "so.png").stat().st_size > 1000
