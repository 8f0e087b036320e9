"""`rhino-bench service` runs end to end on a small batch and prints the rows
bench/README.md describes; bad options are usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def rhino(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino_bench", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_bench_service_small(tmp_path: Path) -> None:
    out = tmp_path / "service.jsonl"
    p = rhino("service", "--json", "--keys", "3000", "--repeat", "2", "--fixed-reps", "3",
              "--dir", str(tmp_path / "work"), "--out", str(out), "--report", str(tmp_path / "service.md"),
              "--plot", str(tmp_path / "service.png"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert rows == [json.loads(line) for line in out.read_text().splitlines()]
    tp = {(r["op"], r["transport"]): r for r in rows if r["figure"] == "throughput"}
    assert set(tp) == {(op, t) for op in ("put", "get", "put+commit") for t in ("in-process", "unix", "tcp")}
    for (op, t), r in tp.items():
        assert r["keys"] == 3000 and r["repeat"] == 2 and r["keys_per_s"] > 0
        if t != "in-process":
            assert r["ratio_min"] <= r["ratio_to_inprocess"] <= r["ratio_max"]
    assert "target_met" in tp[("get", "unix")] and "target_met" in tp[("put", "unix")]
    fixed = [r for r in rows if r["figure"] == "fixed_cost"]
    assert [r["replicas"] for r in fixed] == [0, 2]
    assert all(r["reps"] == 3 and r["open_ms_median"] > 0 for r in fixed)
    assert fixed[1]["last_commit"]["replicate_s"] is not None  # r=2 waited for the chain
    assert "| get | unix |" in (tmp_path / "service.md").read_text()
    assert (tmp_path / "service.png").stat().st_size > 0
    assert not (tmp_path / "work").exists()  # removed unless --keep


def test_bench_service_usage_errors(tmp_path: Path) -> None:
    p = rhino("service", "--keys", "0", "--dir", str(tmp_path / "w"), cwd=tmp_path)
    assert p.returncode == 2 and "--keys must be at least 1" in p.stderr
