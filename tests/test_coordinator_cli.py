"""``rhino coordinator``, ``rhino worker --coordinator`` and the operator's
commands (``rhino status``, ``handover``, ``rescale``, ``rebalance``) as a user
runs them: real processes, the command line, exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rhino.coordinator.client import connect_coordinator
from rhino_testing.harness.workers import SECRET, CoordinatorProcess, WorkerProcess, write_secret
from rhino_testing.harness.engine import MicroBatchEngine


def rhino_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def running(tmp_path: Path):
    sf = write_secret(tmp_path, SECRET)
    co = CoordinatorProcess(tmp_path, secret_file=sf, heartbeat_timeout=2.0).start()
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                        extra_args=["--coordinator", co.address, "--rack", f"r{n % 2}"]).start() for n in (2, 3, 4)]
    cc = connect_coordinator(co.address, secret=SECRET)
    deadline = time.monotonic() + 20
    while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 3:
        assert time.monotonic() < deadline, "workers did not register"
        time.sleep(0.1)
    yield tmp_path, sf, co, ws, cc
    cc.close()
    for w in ws:
        w.stop()
    co.stop()


def test_operator_commands(running) -> None:
    tmp, sf, co, ws, cc = running
    env = {"RHINO_COORDINATOR": co.address, "RHINO_SECRET_FILE": str(sf)}
    cc.create_operator("q", parallelism=2, num_vnodes=16, replicas=1)
    engine = MicroBatchEngine(cc, "q", secret=SECRET)
    rng = np.random.default_rng(3)
    batch = 0

    def run(n: int) -> None:
        nonlocal batch
        for _ in range(n):
            engine.run_batch(batch, {int(k): rng.bytes(8) for k in rng.choice(500, 40, replace=False)})
            batch += 1

    run(2)
    out = rhino_cli("status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert {w["id"] for w in s["workers"]} == {"w2", "w3", "w4"} and {w["rack"] for w in s["workers"]} == {"r0", "r1"}
    assert s["operators"][0]["last_batch"] == 1 and len(s["operators"][0]["instances"]) == 2
    text = rhino_cli("status", env=env)
    assert text.returncode == 0 and "OPERATOR q" in text.stdout and "PLANS IN FLIGHT: none" in text.stdout

    h = rhino_cli("handover", "--operator", "q", "--vnodes", "0-2,5", "--to", "1", "--strategy", "fluid", "--json",
                  env=env)
    assert h.returncode == 0, h.stderr
    moves = json.loads(h.stdout)["moves"]
    assert "step" in rhino_cli("status", env=env).stdout
    run(moves + 1)
    assert all(cc.placement("q").assignment[v] == 1 for v in (0, 1, 2, 5))

    r = rhino_cli("rescale", "q", "3", "--strategy", "batched", "--json", env=env)
    assert r.returncode == 0, r.stderr
    run(json.loads(r.stdout)["steps"] + 1)
    assert len(cc.placement("q").instances) == 3
    b = rhino_cli("rebalance", "--operator", "q", "--json", env=env)
    assert b.returncode == 0, b.stderr
    engine.close()

    # Bad input: clear messages and exit codes, no traceback.
    bad = rhino_cli("handover", "--operator", "q", "--vnodes", "x-y", "--to", "1", env=env)
    assert bad.returncode == 2 and "expected vnodes" in bad.stderr
    bad = rhino_cli("handover", "--operator", "q", "--vnodes", "99", "--to", "1", env=env)
    assert bad.returncode == 1 and "UnknownVnodeError" in bad.stderr and "Traceback" not in bad.stderr
    bad = rhino_cli("status")
    assert bad.returncode != 0 and "no coordinator" in bad.stderr
    wrong = tmp / "wrong"
    wrong.write_text("not-the-secret\n")
    wrong.chmod(0o600)
    bad = rhino_cli("status", "--coordinator", co.address, "--secret-file", str(wrong))
    assert bad.returncode == 1 and "AuthFailedError" in bad.stderr


def test_bad_configuration(tmp_path: Path) -> None:
    sf = write_secret(tmp_path, SECRET)
    r = rhino_cli("coordinator", "--dir", str(tmp_path / "c"), "--secret-file", str(sf), "--heartbeat-timeout", "0")
    assert r.returncode == 2 and "heartbeat-timeout" in r.stderr
    r = rhino_cli("coordinator", "--dir", str(tmp_path / "c"), "--secret-file", str(sf), "--rebuild")
    assert r.returncode == 2 and "expect-workers" in r.stderr
    r = rhino_cli("worker", "--id", "w", "--dir", str(tmp_path / "w"), "--listen", "127.0.0.2:0", "--secret-file",
                  str(sf), "--coordinator", "nowhere")
    assert r.returncode == 2 and "bad_configuration" in r.stderr


def test_heartbeats_go_on_during_a_long_commit(tmp_path: Path) -> None:
    """A commit holds its instance for its write and checkpoint; the worker's
    metrics sampler waits for that lock, and used to hold the GIL meanwhile, so
    the heartbeat thread stopped and a healthy worker was declared dead."""
    import rhino

    sf = write_secret(tmp_path, SECRET)
    co = CoordinatorProcess(tmp_path, secret_file=sf, heartbeat_timeout=1.0).start()
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=sf, metrics=False,
                      extra_args=["--coordinator", co.address, "--coordinator-heartbeat", "0.2"]).start()
    try:
        with connect_coordinator(co.address, secret=SECRET) as cc:
            deadline = time.monotonic() + 20
            while not any(x["state"] == "alive" for x in cc.status()["workers"]):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            with rhino.connect(w.unix_socket, secret=SECRET, request_timeout=120) as c:
                c.open_instance("big", 0, epoch=1, num_vnodes=8)
                keys = np.arange(400_000, dtype=np.int64)
                values = np.random.default_rng(0).integers(0, 255, size=(len(keys), 512), dtype=np.uint8)
                with c.session("big", 0, batch=0, epoch=1) as s:
                    s.put_batch(keys, values)  # ~200 MB: the commit takes seconds
                    r = s.commit()
                assert r.write_s + r.checkpoint_s > 1.0, "the commit was too short to show anything"
            time.sleep(0.5)
            s = cc.status()
            assert [x["state"] for x in s["workers"]] == ["alive"]
            assert not [e for e in s["events"] if e["kind"] == "worker_dead"], s["events"]
    finally:
        w.stop()
        co.stop()
