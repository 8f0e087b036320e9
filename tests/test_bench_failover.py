"""`rhino-bench failover` runs end to end at a tiny size: Rhino's takeover
restores by hard links with nothing over the network, the DFS-style baseline
moves the whole checkpoint over TCP, both read back what was written, and
the rows carry the fields bench/README.md describes (Rhino paper Table 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rhino_bench import failover

FIELDS = ("size_bytes", "method", "detection_s", "scheduling_s", "fetch_s", "load_s", "total_s",
          "total_excl_detection_s", "files", "linked_files", "copied_bytes", "network_bytes", "state_bytes")


def rhino(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino_bench", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_bench_failover_small(tmp_path: Path) -> None:
    out = tmp_path / "failover.jsonl"
    size = 8 << 20
    p = rhino("failover", "--sizes", "8M", "--json", "--settle-timeout", "3", "--dir", str(tmp_path / "work"),
              "--out", str(out), "--report", str(tmp_path / "failover.md"), "--plot", str(tmp_path / "failover.png"),
              cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert rows == [json.loads(line) for line in out.read_text().splitlines()]
    setup = rows[0]
    assert setup["record"] == "setup" and setup["sizes"] == [size]
    res = {r["method"]: r for r in rows if r["record"] == "failover"}
    assert set(res) == {"rhino", "dfs"}
    trials = [r for r in rows if r["record"] == "trial"]
    assert [(r["method"], r["rep"]) for r in trials] == [("rhino", 0), ("dfs", 0)]  # the trial's number
    for m, r in res.items():
        assert all(k in r for k in FIELDS), sorted(set(FIELDS) - set(r))
        assert r["size_bytes"] == size and r["state_bytes"] >= 0.9 * size
        assert r["state_correct"] is True and r["keys_checked"] > 0
        assert r["fetch_s"] > 0 and r["load_s"] > 0 and r["scheduling_s"] >= 0
        assert r["total_excl_detection_s"] == pytest.approx(r["scheduling_s"] + r["fetch_s"] + r["load_s"], abs=2e-3)
        if setup["detection"] != "none":
            # From the SIGKILL to the coordinator's declaration: about the timeout less the age of the
            # last heartbeat, plus the detector's period (a loaded machine delays both).
            assert 0 < r["detection_s"] <= setup["heartbeat_timeout_s"] + 1.5
            assert r["total_s"] == pytest.approx(r["detection_s"] + r["total_excl_detection_s"], abs=2e-3)
        else:
            assert r["detection_s"] is None and r["total_s"] is None and setup["detection_note"]
    rh, dfs = res["rhino"], res["dfs"]
    assert rh["detection_s"] == dfs["detection_s"] and rh["scheduling_s"] == dfs["scheduling_s"]  # shared
    # Rhino: a takeover on a chain member, by hard links, nothing over the network.
    assert rh["worker"].startswith(("w3", "w4")) and rh["killed"].startswith("w2")
    # Copied: CURRENT, OPTIONS, the MANIFEST and the write-ahead log a checkpoint carries (under 256 KiB).
    assert rh["linked_files"] > 0 and rh["linked_files"] + 4 >= rh["files"]
    assert rh["copied_bytes"] < (256 << 10) + (128 << 10)
    assert rh["copied_bytes"] < 0.1 * rh["state_bytes"]
    assert rh["network_bytes"] == 0
    # DFS-style: D got every byte of the checkpoint over TCP from a survivor.
    assert dfs["worker"].startswith("w5") and dfs["source"].startswith(("w3", "w4")) and dfs["source"] != rh["worker"]
    assert dfs["network_bytes"] >= dfs["state_bytes"] and dfs["received_bytes"] >= dfs["state_bytes"]
    assert dfs["fetch_s"] == pytest.approx(dfs["copy_s"] + dfs["link_build_s"], abs=2e-3)
    summary = rows[-1]
    assert summary["record"] == "summary" and summary["speedup"]["size"] == size
    assert summary["fetch_flat"]["met"] is False  # one size: nothing to compare
    text = (tmp_path / "failover.md").read_text()
    assert "| Rhino (takeover by hard links) |" in text and "DFS-style" in text
    assert (tmp_path / "failover.png").stat().st_size > 0
    assert not (tmp_path / "work").exists()  # removed unless --keep


def _row(size: int, method: str, fetch: float, excl: float) -> dict:
    return {"record": "failover", "size_bytes": size, "method": method, "fetch_s": fetch,
            "total_excl_detection_s": excl, "total_s": excl + 1.0}


def test_failover_targets_are_judged() -> None:
    g = 1 << 30
    ok = failover.summarize([_row(g, "rhino", 0.05, 0.5), _row(g, "dfs", 3.0, 4.0),
                             _row(4 * g, "rhino", 0.09, 0.6), _row(4 * g, "dfs", 13.0, 14.0)])
    assert ok["fetch_flat"]["ratio"] == 1.8 and ok["fetch_flat"]["met"] is True
    assert ok["speedup"]["ratio"] == pytest.approx(23.33, abs=0.01) and ok["speedup"]["met"] is True
    bad = failover.summarize([_row(g, "rhino", 0.05, 0.5), _row(g, "dfs", 3.0, 4.0),
                              _row(4 * g, "rhino", 0.11, 0.8), _row(4 * g, "dfs", 13.0, 14.0)])
    assert bad["fetch_flat"]["met"] is False and bad["speedup"]["met"] is False


def test_bench_failover_usage_errors(tmp_path: Path) -> None:
    p = rhino("failover", "--sizes", "lots", "--dir", str(tmp_path / "w"), cwd=tmp_path)
    assert p.returncode == 2 and "invalid size" in p.stderr
    p = rhino("failover", "--sizes", "8M", "--fill-batch-bytes", "2G", "--dir", str(tmp_path / "w"),
              cwd=tmp_path)
    assert p.returncode == 2 and "--fill-batch-bytes" in p.stderr


def _worker_pids(work: Path) -> set[int]:
    """Live `rhino.daemon.worker` processes whose command line names `work` (found through /proc)."""
    import os

    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"rhino.daemon.worker" in argv and any(str(work).encode() in a for a in argv):
            pids.add(int(name))
    return pids


def test_a_stopped_failover_bench_stops_its_workers(tmp_path: Path) -> None:
    """SIGTERM in the middle of the fill: the four workers are stopped and the work directory removed."""
    import signal
    import time

    work = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-m", "rhino_bench", "failover", "--sizes", "1G", "--dir", str(work),
                             "--fill-batch-bytes", "8M", "--json"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_worker_pids(work)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_worker_pids(work)) == 4
        time.sleep(1.0)  # into the fill
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert not _worker_pids(work)
    assert not any(work.glob("size-*"))
