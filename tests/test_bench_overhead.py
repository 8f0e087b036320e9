"""`rhino-bench overhead`, tiny: real worker processes on 127.0.0.2 and .3, a
few seconds of writes. Checks the output contract and, against the replicas'
own stores (opened after the workers stopped), that the r=2 phase really
replicated the checkpoints it reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import rhino

PHASE_FIELDS = ("phase", "replicas", "writes_per_s", "keys_written", "window_s", "checkpoints", "checkpoint_ids",
                "checkpoint_delta_bytes", "replication_bytes", "replications_completed",
                "replications_completed_ids", "cpu", "loadavg_after", "parameters", "run_id")
SUMMARY_FIELDS = ("writes_r0", "writes_r2", "drop", "drop_pairs", "target_drop", "target_met", "checkpoints_r0",
                  "checkpoints_r2", "replication_bytes_r2", "replications_completed_r2", "replicas_checkpoints",
                  "replicas_missing_completed", "cpu", "cpu_count", "loadavg", "machine", "parameters", "command")


@pytest.mark.parametrize("compaction", ["level", "universal"])
def test_tiny_run_contract_and_replicas(tmp_path: Path, compaction: str):
    work, out = tmp_path / "work", tmp_path / "overhead.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "rhino_bench", "overhead", "--pairs", "1", "--duration", "1.5", "--warmup", "0.6",
         "--checkpoint-interval", "0.3", "--initial-keys", "20000", "--batch-keys", "2000", "--value-size", "64",
         "--dir", str(work), "--keep", "--json", "--out", str(out), "--compaction", compaction],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    phases, summary = rows[:-1], rows[-1]
    assert [p["record"] for p in phases] == ["phase", "phase"] and summary["record"] == "summary"
    assert sorted(p["replicas"] for p in phases) == [0, 2]
    assert len({p["run_id"] for p in rows}) == 1
    for p in phases:
        for f in PHASE_FIELDS:
            assert f in p, f
        assert p["writes_per_s"] > 0 and p["keys_written"] > 0 and p["window_s"] > 0
        assert p["checkpoints"] > 0 and all(b > 0 for b in p["checkpoint_delta_bytes"])
        assert p["cpu"]["primary_cpu_s"] > 0
    for f in SUMMARY_FIELDS:
        assert f in summary, f
    assert summary["writes_r0"] > 0 and summary["writes_r2"] > 0
    assert abs(summary["drop"] - (1 - summary["writes_r2"] / summary["writes_r0"])) < 1e-3
    assert summary["target_met"] == (summary["drop"] <= 0.10)
    assert summary["cpu_count"] >= 1 and len(summary["loadavg"]) == 3
    assert all(row["parameters"]["compaction"] == compaction for row in rows)
    assert "PASS" in r.stderr or "FAIL" in r.stderr

    (r0,) = [p for p in phases if p["replicas"] == 0]
    (r2,) = [p for p in phases if p["replicas"] == 2]
    assert r0["replication_bytes"] == 0 and r0["replications_completed"] == 0
    assert r2["replication_bytes"] > 0 and r2["replications_completed"] > 0
    assert summary["replications_failed"] == 0
    assert summary["replicas_missing_completed"] == {"w2": [], "w3": []}

    # The replicas' own stores (the workers have stopped): every checkpoint the
    # bench saw complete, plus the initial bulk copy (id 1), is committed on
    # both members, and the stores verify clean (every file's checksum).
    completed = set(r2["replications_completed_ids"]) | {1}
    for w in ("w2", "w3"):
        store = rhino.ReplicaStore(str(work / w))
        held = set(store.checkpoints("bench", 0))
        assert completed <= held, (w, completed - held)
        assert summary["replicas_checkpoints"][w] == len(held)
        report = store.verify(full=True)
        assert report.ok, [p.detail for p in report.problems]
        newest = max(held)
        m = store.manifest("bench", 0, newest)
        assert m.total_bytes > 0 and m.checkpoint_id == newest
