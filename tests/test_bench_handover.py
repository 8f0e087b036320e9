"""`rhino-bench handover` runs end to end at a tiny size and prints the rows
bench/README.md describes; its correctness check catches a state that differs
from what the writer wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rhino_bench import handover
from rhino.coordinator.client import LocalCoordinatorClient
from rhino.coordinator.coordinator import Coordinator
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret
from rhino_testing.harness.engine import MicroBatchEngine


def rhino(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino_bench", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_bench_handover_small(tmp_path: Path) -> None:
    out = tmp_path / "handover.jsonl"
    p = rhino("handover", "--json", "--state", "4M", "--strategies", "all-at-once,fluid", "--repeat", "1",
              "--num-vnodes", "16", "--batch-keys", "300", "--warmup-batches", "1", "--quiesce", "0",
              "--steady-batches", "3", "--after-batches", "1", "--dir", str(tmp_path / "work"), "--out", str(out),
              "--report", str(tmp_path / "handover.md"), "--plot", str(tmp_path / "handover.png"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert rows == [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["record"] == "setup" and rows[0]["state_bytes"] == 4 << 20
    runs = {r["strategy"]: r for r in rows if r["record"] == "run"}
    assert set(runs) == {"all-at-once", "fluid"}
    for s, r in runs.items():
        assert r["correct"] is True and r["verify"]["ok"] and not r["verify"]["problems"]
        assert r["verify"]["keys_checked"] == r["keys"] == (4 << 20) // 1024
        assert sum(r["verify"]["keys_per_instance"].values()) == r["keys"]
        assert r["target_instance"] == 2 and str(r["target_instance"]) in r["verify"]["keys_per_instance"]
        assert r["vnodes_moved"] == r["origin_vnodes"] // 2 >= 2
        # Vertical scaling: the new instance sits where the origin's checkpoint is, nothing was copied.
        assert r["vertical"] is True and r["bytes_moved"] == 0
        assert r["target_primary"] in [r["origin_primary"], *r["origin_chain"]]
        phases = [b["phase"] for b in r["timeline"]]
        assert phases.count("steady") == 3 and phases.count("after") == 1 and "migration" in phases
        assert sum(b["steps_run"] for b in r["timeline"]) == r["steps"]
        assert r["migration_s"] > 0 and r["steps_s"] <= r["migration_s"] + 1e-3
        assert r["max_during_s"] >= r["mean_during_s"] > 0
        assert r["ratio_max_to_steady"] == pytest.approx(r["max_during_s"] / r["steady_median_s"], rel=0.01)
    assert runs["all-at-once"]["steps"] == 1
    assert runs["fluid"]["steps"] == runs["fluid"]["vnodes_moved"]
    summary = {r["strategy"]: r for r in rows if r["record"] == "summary"}
    assert set(summary) == {"all-at-once", "fluid"} and all(s["correct"] for s in summary.values())
    assert "| fluid |" in (tmp_path / "handover.md").read_text()
    assert (tmp_path / "handover.png").stat().st_size > 0
    assert not (tmp_path / "work").exists()  # removed unless --keep


def test_handover_verify_catches_a_wrong_state(tmp_path: Path) -> None:
    """The check that makes the benchmark fail: a value other than the last
    written, a key on no instance, and a key the writer never wrote are all seen."""
    secret_file = write_secret(tmp_path, SECRET)
    workers = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False).start()
               for n in (2, 3)]
    coord = Coordinator(str(tmp_path / "coordinator"), secret=SECRET, heartbeat_timeout=3600.0)
    engine = None
    try:
        cl = LocalCoordinatorClient(coord)
        for w in workers:
            cl.register(w.id, w.address, incarnation="t")
        cl.create_operator(handover.OPERATOR, parallelism=2, num_vnodes=8, replicas=1)
        engine = MicroBatchEngine(cl, handover.OPERATOR, secret=SECRET)
        model = handover.Model(200, 16)
        rng = np.random.default_rng(1)
        keys = np.arange(100, dtype=np.int64)
        engine.run_batch(0, model.puts(keys, rng.integers(0, 256, size=(100, 16), dtype=np.uint8)))
        assert handover._verify(cl, engine, model)["ok"]
        model.values[7, 0] ^= 1  # the model says another value
        model.written[150] = True  # and a key nobody wrote to the workers
        v = handover._verify(cl, engine, model)
        assert not v["ok"]
        text = " ".join(v["problems"])
        assert "key 7 holds another value" in text and "1 written keys are on no instance" in text
        model.values[7, 0] ^= 1
        model.written[150] = False
        model.written[3] = False  # a key the workers hold that the model never wrote
        v = handover._verify(cl, engine, model)
        assert not v["ok"] and "key 3 was never written" in " ".join(v["problems"])
    finally:
        if engine is not None:
            engine.close()
        coord.close()
        for w in workers:
            w.stop()
        shutil.rmtree(tmp_path / "coordinator", ignore_errors=True)


def test_bench_handover_usage_errors(tmp_path: Path) -> None:
    p = rhino("handover", "--strategies", "sideways", "--dir", str(tmp_path / "w"), cwd=tmp_path)
    assert p.returncode == 2 and "strategies" in p.stderr
    p = rhino("handover", "--batch-keys", "0", "--dir", str(tmp_path / "w"), cwd=tmp_path)
    assert p.returncode == 2 and "--batch-keys must be at least 1" in p.stderr
