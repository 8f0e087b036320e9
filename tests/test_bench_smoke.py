"""Every ``rhino-bench`` subcommand runs end to end in ``make test``, at the smallest size that
still goes through all of its code, so that a broken benchmark fails CI (docs/testing.md).

Most subcommands have a module of their own that runs them small and checks their records
(test_bench_*.py, test_spark_bench.py, test_cli.py, test_spark_cluster.py);
``test_every_subcommand_has_a_smoke_run`` keeps that list complete. This module runs the
rest: ``takeover-open``, ``spark initial-state``, ``spark elastic`` and ``spark modify``. Each checks that the
command exits 0, that stdout holds JSON lines only, and the records every report is built from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_bench

from rhino_bench import cli

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _bench(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return run_bench([sys.executable, "-m", "rhino_bench", *args], cwd=REPO, timeout=timeout)


def _records(p: subprocess.CompletedProcess) -> list[dict]:
    lines = [x for x in p.stdout.splitlines() if x.strip()]
    return [json.loads(x) for x in lines]  # nothing but JSON on stdout


# Where each subcommand's end-to-end run lives: (module, a string the run's call has in it).
SMOKE_RUNS = {
    "restore": ("test_cli.py", '"restore"'),
    "replicate": ("test_cli.py", '"replicate"'),
    "overhead": ("test_bench_overhead.py", '"overhead"'),
    "service": ("test_bench_service.py", "test_bench_service_small"),
    "handover": ("test_bench_handover.py", "test_bench_handover_small"),
    "failover": ("test_bench_failover.py", "test_bench_failover_small"),
    "takeover-open": ("test_bench_smoke.py", '"takeover-open"'),
    "spark recovery": ("test_spark_bench.py", "test_recovery_small"),
    "spark throughput": ("test_spark_bench.py", "test_throughput_small"),
    "spark state-size": ("test_bench_state_size.py", "test_tiny_run_both_systems_agree"),
    "spark big-key": ("test_bench_big_key.py", "test_tiny_run_passes_every_check"),
    "spark output": ("test_bench_spark_output.py", "test_tiny_run_both_systems"),
    "spark initial-state": ("test_bench_smoke.py", '"initial-state"'),
    "spark elastic": ("test_bench_smoke.py", '"elastic"'),
    "spark modify": ("test_bench_smoke.py", '"modify"'),
    "spark glue": ("test_bench_spark_glue.py", "test_glue_bench_runs_and_reports"),
    "demo": ("test_cli.py", "test_demo_runs_and_verifies"),
    "cluster": ("test_spark_cluster.py", "rhino_testing.harness.spark_cluster"),
}


def test_every_subcommand_has_a_smoke_run():
    names = {line.split(":")[0].removeprefix("rhino-bench ") for line in cli.help_lines()}
    assert names == set(SMOKE_RUNS), "a new rhino-bench subcommand needs a smoke run in make test"
    for name, (module, needle) in SMOKE_RUNS.items():
        assert needle in (TESTS / module).read_text(), (name, module, needle)


def test_takeover_open_tiny(tmp_path):
    out = tmp_path / "to.jsonl"
    p = _bench("takeover-open", "--size", "8M", "--vnodes", "4", "--repeat", "1", "--writers", "1", "--busy", "1",
               "--dir", str(tmp_path / "w"), "--json", "--out", str(out), "--report", str(tmp_path / "to.md"),
               timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    recs = _records(p)
    assert recs and len(recs) == len([x for x in out.read_text().splitlines() if x.strip()])
    restores = [r for r in recs if "restore_s" in r or "open_s" in r]
    assert restores, recs[:3]
    loads = {r.get("load") for r in restores}
    assert {"quiet", "fsync-writers", "cpu-busy"} <= loads, loads
    for r in restores:
        for f in ("restore_s", "open_s"):
            if f in r:
                assert r[f] is not None and r[f] >= 0, (f, r)
    assert (tmp_path / "to.md").read_text().strip()


pyspark_needed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("pyspark") is None, reason="PySpark is not installed")


@pyspark_needed
@pytest.mark.spark
def test_spark_initial_state_tiny(tmp_path):
    out = tmp_path / "is.jsonl"
    p = _bench("spark", "initial-state", "--keys", "3000", "--probe-keys", "200", "--first-host", "170",
               "--dir", str(tmp_path / "w"), "--json", "--out", str(out), "--report", str(tmp_path / "is.md"),
               "--timeout", "300", timeout=600)
    assert p.returncode == 0, p.stderr[-6000:]
    recs = _records(p)
    assert recs == [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    systems = {r.get("system") for r in recs if r.get("system")}
    assert {"spark-rocksdb", "rhino"} <= systems, systems
    assert (tmp_path / "is.md").read_text().strip()


@pyspark_needed
@pytest.mark.spark
def test_spark_elastic_tiny(tmp_path):
    """The smallest run that passes through the command: Rhino with the autoscaler on, a
    warm-up batch and two rate steps of two batches, the spare host joining before the query.
    (Spark's own side is the same Q8 query as ``spark throughput``'s smoke run; its remedy is
    left to ``make bench``: it doubles the run.)"""
    out = tmp_path / "el.jsonl"
    p = _bench("spark", "elastic", "--systems", "rhino", "--rates", "1,2", "--batches-per-step", "2", "--trigger-interval", "2",
               "--base-events", "2000", "--warmup-batches", "1", "--drain-batches", "1", "--restart-batches", "0",
               "--max-parallelism", "2", "--first-host", "180", "--timeout", "400",
               "--dir", str(tmp_path / "w"), "--json", "--out", str(out), "--report", str(tmp_path / "el.md"),
               "--plot", str(tmp_path / "el.png"), timeout=900)
    assert p.returncode == 0, p.stderr[-6000:]
    recs = _records(p)
    assert recs == [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    kinds = [r["record"] for r in recs]
    assert kinds[0] == "setup" and "summary" in kinds, kinds
    runs = {r["system"]: r for r in recs if r["record"] == "run"}
    assert set(runs) == {"rhino"}, runs
    assert runs["rhino"].get("spare_host") and "executor_warmed" in runs["rhino"]
    batches = [r for r in recs if r["record"] == "batch"]
    assert batches and {b["system"] for b in batches} == {"rhino"}
    assert any(b.get("parallelism") for b in batches), batches[:2]
    assert re.search(r"spark elastic", (tmp_path / "el.md").read_text())
    assert (tmp_path / "el.png").stat().st_size > 1000


def test_spark_modify_tiny(tmp_path):
    """The routes of a code change at a few MiB of Q8 state: Rhino's swap, and an operator
    inserted after Q8, each at the first barrier after the request; Spark's restart from its
    checkpoint with the new code."""
    out = tmp_path / "m.jsonl"
    p = _bench("spark", "modify", "--size", "2M", "--events-per-batch", "4000", "--payload-bytes", "4096",
               "--after-batches", "1", "--routes", "swap,insert,spark-restart-changelog", "--shared-cluster",
               "--first-host", "84", "--json",
               "--out", str(out), "--report", str(tmp_path / "m.md"), "--plot", str(tmp_path / "m.png"),
               "--dir", str(tmp_path / "w"), timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    recs = _records(p)
    assert recs == [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    assert recs[0]["record"] == "setup" and recs[-1]["record"] == "summary"
    by = {r["route"]: r for r in recs if r["record"] == "modify"}
    assert set(by) == {"swap", "insert", "spark-restart-changelog"}
    for r in by.values():
        assert r["state_bytes"] >= 2 << 20 and r["request_to_effect_s"] > 0, r
        # (an attempt may fail on a loaded machine and run again: counted, with its errors, not
        # asserted away; seen once in three runs here, a Py4JJavaError planning a batch's input)
        assert r["failed_batches"] == len(r.get("failed_attempts", [])), r
        assert [b for b in r["batches"] if b[0] >= r["effect_batch"]], r  # a batch ran the new code
    swap, ins = by["swap"], by["insert"]
    assert swap["batches_delayed"] == 0 and ins["batches_delayed"] == 0, (swap, ins)  # the first barrier after
    assert ins["inserted_batches"][0] == ins["effect_batch"], ins  # the new operator's first batch
    assert swap["versions"][0].startswith("Q8NewUsers@") and swap["versions"][1].startswith("Q8V2@"), swap
    summ = recs[-1]
    assert summ["baseline"] == "spark-restart-changelog" and summ["speedup_vs_spark_restart"] > 0
    assert (tmp_path / "m.md").read_text().startswith("# Changing a running query")
    assert (tmp_path / "m.png").stat().st_size > 1000
