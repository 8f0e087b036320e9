"""`rhino-bench spark recovery|throughput`: small, fast runs of both commands on a
local 3-host cluster (127.0.0.50-52 and .53-55), checking the JSON fields and their
sanity, and the argument errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_bench

pyspark = pytest.importorskip("pyspark")

from rhino_bench.spark import recovery, recovery_report, throughput  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _rhino(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_bench([sys.executable, "-m", "rhino_bench", "spark", *args], cwd=REPO, timeout=timeout)


def _lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip().startswith("{")]


@pytest.mark.parametrize("args, message", [
    (["recovery", "--sizes", "lots"], "invalid size"),
    (["recovery", "--sizes", "16M", "--systems", "flink"], "unknown system"),
    (["recovery", "--spark-conf", "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=false"],
     "choose them with --systems"),
    (["recovery", "--sizes", "16M", "--kill-host", "4"], "hosts 1..3"),
    (["recovery", "--kill-at", "1.5"], "[0, 1)"),
    (["recovery", "--first-host", "1"], "first host"),
    (["recovery", "--spark-conf", "novalue"], "KEY=VALUE"),
    (["recovery", "--trials", "0"], "must be >= 1"),
    (["throughput", "--configs", "rhino-r9"], "unknown configuration"),
    (["throughput", "--batches", "0"], "must be >= 1"),
    (["throughput", "--events-per-batch", "x"], "not an integer"),
    (["throughput", "--spark-conf", "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true"],
     "choose them with --configs"),
])
def test_bad_arguments_exit_2(args, message):
    p = _rhino(*args, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_recovery_small(tmp_path):
    out = tmp_path / "rec.jsonl"
    # the smallest run that still goes through every phase: 4 MiB is reached within the 4 batches the
    # bench measures its steady batch over. Two batches after the kill: when the kill lands after the
    # victim's stateful task has ended (a loaded machine), Spark moves the lost stores, and loads them
    # from its checkpoint location, only in the second. Spark with changelog checkpointing (its
    # recommended setting) is the baseline here; without it is the same path with the setting off,
    # run by the full benchmark
    p = _rhino("recovery", "--sizes", "4M", "--events-per-batch", "6000", "--payload-bytes", "4096",
               "--after-batches", "2", "--systems", "rhino,spark-rocksdb-changelog", "--first-host", "50", "--json", "--out", str(out), "--dir", str(tmp_path / "w"),
               "--report", str(tmp_path / "rec.md"), "--plot", str(tmp_path / "rec.png"), timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    recs = _lines(p.stdout)
    assert recs == _lines(out.read_text())
    kinds = [r["record"] for r in recs]
    assert kinds[0] == "setup" and kinds[-1] == "summary"
    rr = {r["system"]: r for r in recs if r["record"] == "recovery"}
    assert set(rr) == {"rhino", "spark-rocksdb-changelog"}
    for r in rr.values():
        assert r["size_bytes"] == 4 << 20
        assert r["state_bytes_at_kill"] >= r["size_bytes"]
        for f in ("recovery_s", "state_restore_s", "detection_s", "scheduling_s", "replay_s"):
            assert r[f] is not None and r[f] >= 0, (f, r)
        if r.get("restore_batch", r["recovered_batch"]) == r["recovered_batch"]:
            # (a kill just after the victim's stateful task leaves the restore to the next batch)
            assert r["recovery_s"] >= r["state_restore_s"]
        # (a kill that landed after the victim's stateful task had ended, as its own figures
        # say, leaves that batch nothing to recover: it may end before the loss is detected)
        missed = (r.get("kill_into_victim_task_s") or 0) >= (r.get("victim_task_s") or float("inf"))
        if not missed:
            assert r["recovery_s"] >= r["detection_s"], r
        assert "locality" in r
    rh = rr["rhino"]
    assert 0.95 <= rh["locality"] <= 1.0
    assert rh["lost_instances"] and rh["takeover_restore_s"] is not None
    assert rr["spark-rocksdb-changelog"]["stores_loaded_from_dfs"] >= 1
    summ = recs[-1]
    assert summ["per_size"] and "restore_speedup" in summ["per_size"][0]
    assert summ["per_size"][0]["baseline"] == "spark-rocksdb-changelog"
    assert (tmp_path / "rec.md").read_text().startswith("# Spark recovery")
    assert (tmp_path / "rec.png").stat().st_size > 1000


def test_throughput_small(tmp_path):
    # r=2 against Spark's own operator with changelog checkpointing (Spark's recommended setting): the
    # headline ratio; r=0 (no replication) is the same code path with an empty chain, and Spark without
    # the change log the same path with the setting off, both run by the full benchmark (make bench)
    p = _rhino("throughput", "--events-per-batch", "5000", "--batches", "3", "--warmup", "1", "--first-host", "53",
               "--configs", "rhino-r2,spark-rocksdb-changelog", "--json", "--dir", str(tmp_path / "w"), "--report", str(tmp_path / "tp.md"),
               "--plot", str(tmp_path / "tp.png"), timeout=420)
    assert p.returncode == 0, p.stderr[-4000:]
    recs = _lines(p.stdout)
    tp = {r["config"]: r for r in recs if r["record"] == "throughput"}
    assert set(tp) == {"rhino-r2", "spark-rocksdb-changelog"}
    assert tp["spark-rocksdb-changelog"]["changelog_checkpointing"] is True
    for r in tp.values():
        assert r["batches"] == 3 and r["events"] == 15000
        assert r["events_per_s"] > 0
        assert 0 < r["latency_median_s"] <= r["latency_p95_s"]
    # the same events give the same output on both
    assert len({r["output_rows"] for r in tp.values()}) == 1
    assert tp["rhino-r2"]["locality"] >= 0.95
    assert set(tp["rhino-r2"]["task_breakdown_s"]) >= {"open_s", "fetch_s", "process_s", "write_s", "commit_s",
                                                        "replicate_s"}
    summ = recs[-1]
    assert summ["record"] == "summary" and "r2_vs_spark" in summ and "r2_cost_vs_r0" not in summ
    assert summ["spark_baseline"] == "spark-rocksdb-changelog"
    assert (tmp_path / "tp.png").stat().st_size > 1000


def test_summaries_from_records():
    recs = [{"record": "recovery", "system": "rhino", "size_bytes": 1 << 30, "state_restore_s": 0.03,
             "recovery_s": 4.0, "locality": 1.0, "state_bytes_at_kill": 1 << 30},
            {"record": "recovery", "system": "spark-rocksdb", "size_bytes": 1 << 30, "state_restore_s": 3.0,
             "recovery_s": 9.0, "locality": None, "state_bytes_at_kill": 1 << 30}]
    s = recovery.summarize(recs)
    assert s["restore_speedup_at_largest"] == 100.0 and s["restore_target_met"] and s["recovery_target_met"]
    assert s["spark_restore_s_per_gib"] == 3.0
    # several trials: the medians are compared (one bad Rhino trial of three does not decide)
    more = [dict(recs[0], recovery_s=12.0), dict(recs[0], recovery_s=5.0),
            dict(recs[1], recovery_s=8.0), dict(recs[1], recovery_s=7.0)]
    m = recovery.summarize(recs + more)["per_size"][0]
    assert m["trials"] == [3, 3] and m["recovery_below_baseline"] and m["recovery_speedup"] == round(8.0 / 5.0, 2)
    worse = [dict(recs[0], recovery_s=12.0), dict(recs[0], recovery_s=10.0)]
    assert not recovery.summarize(recs + worse)["recovery_target_met"]
    # both Spark baselines: the ratios are against the one that recovered fastest (less favourable),
    # and Rhino must recover faster than each
    cl = dict(recs[1], system="spark-rocksdb-changelog", recovery_s=6.0, state_restore_s=1.5)
    row = recovery.summarize(recs + [cl])["per_size"][0]
    assert row["baseline"] == "spark-rocksdb-changelog" and row["recovery_speedup"] == 1.5
    assert row["restore_speedup"] == 50.0 and row["by_baseline"]["spark-rocksdb"]["recovery_speedup"] == 2.25
    assert recovery.summarize(recs + [dict(cl, recovery_s=3.5)])["recovery_target_met"] is False
    t = throughput.summarize([
        {"record": "throughput", "config": "rhino-r0", "events_per_s": 100.0, "latency_median_s": 1.0,
         "locality": 1.0, "critical_task_breakdown_s": {"commit_s": 0.1}},
        {"record": "throughput", "config": "rhino-r2", "events_per_s": 95.0, "latency_median_s": 1.0,
         "locality": 1.0, "critical_task_breakdown_s": {"commit_s": 0.2}},
        {"record": "throughput", "config": "spark-rocksdb", "events_per_s": 50.0, "latency_median_s": 2.0}])
    assert t["r2_vs_spark"] == 1.9 and t["r2_cost_target_met"] and t["r2_minus_r0_critical_task_s"]["commit_s"] == 0.1
    # with both Spark baselines, the ratio is the less favourable one: against the faster baseline
    both = throughput.summarize([
        {"record": "throughput", "config": "rhino-r2", "events_per_s": 95.0, "latency_median_s": 1.0},
        {"record": "throughput", "config": "spark-rocksdb", "events_per_s": 50.0, "latency_median_s": 2.0},
        {"record": "throughput", "config": "spark-rocksdb-changelog", "events_per_s": 76.0, "latency_median_s": 1.5}])
    assert both["spark_baseline"] == "spark-rocksdb-changelog" and both["r2_vs_spark"] == 1.25
    assert both["r2_vs_spark_by_baseline"] == {"spark-rocksdb": 1.9, "spark-rocksdb-changelog": 1.25}


def test_the_rerun_timeline_from_a_record():
    rec = {"system": "rhino", "spark_executor_removed_s": 0.3, "attempt_cancelled_s": 0.4,
           "watch": [{"reported": [{"at": 0.41, "answered": 0.6}], "exited_at": 0.65}],
           "job_attempt_start_s": 0.7, "rerun_job_setup_s": 0.05, "rerun_task_start_s": 0.95,
           "stages_after_kill": [
               {"stage": "9.0", "status": "FAILED", "submitted_s": -3.0, "stateful": True},
               {"stage": "10.0", "status": "COMPLETE", "submitted_s": 0.8, "tasks": 3, "stateful": True},
               {"stage": "11.0", "status": "COMPLETE", "submitted_s": 5.0, "tasks": 1, "stateful": False}]}
    steps = recovery_report._rerun_steps(rec)
    assert [t for _, t in steps] == [0.3, 0.4, 0.6, 0.65, 0.7, 0.75, 0.8, 0.95]
    assert "stateful stage" in steps[6][0] and "rerun task" in steps[7][0]
    # a record of before the watch's answer and the setup time: those steps are left out
    old = {k: v for k, v in rec.items() if k not in ("watch", "rerun_job_setup_s")}
    assert [t for _, t in recovery_report._rerun_steps(old)] == [0.3, 0.4, 0.7, 0.8, 0.95]
