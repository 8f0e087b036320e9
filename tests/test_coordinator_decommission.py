"""Decommissioning a worker (issue 29, "hosts join and leave"; docs/design.md §3): everything
is moved off a live worker at batch barriers, no batch fails, and then the worker can be
stopped without a failover. Real ``rhino worker`` processes; the coordinator in-process (as
the Spark driver hosts it), and once as a process driven by the ``rhino decommission`` CLI.

Oracles: a dict model of what the engine wrote (read back through sessions), and the
workers' own instance listings (which instances each one hosts, at which epoch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rhino
from rhino_testing.harness.workers import SECRET
import test_coordinator
from test_coordinator import OP, V, Job, make

cluster = test_coordinator.cluster  # the fixture: four workers w2..w5 on 127.0.0.2-5


def hosted(ws) -> dict[str, list[tuple[int, int]]]:
    """(instance, epoch) of OP that each live worker hosts, by its own listing."""
    out = {}
    for w in ws:
        if not w.alive():
            continue
        with rhino.connect(w.address, secret=SECRET) as c:
            out[w.id] = sorted((h["instance"], h["epoch"]) for h in c.instances() if h["operator_id"] == OP)
    return out


def check_placement(cc, ws, leaving: str) -> None:
    pl = cc.placement(OP)
    st = {o["operator_id"]: o for o in cc.status()["operators"]}[OP]
    for r in st["instances"]:
        assert r["primary"] != leaving and leaving not in r["chain"], r
        assert len(r["chain"]) == 2, r  # repaired to r=2 on the other workers
    # each instance hosted exactly once, by its primary, at the operator's epoch; none on the leaver
    by_worker = hosted(ws)
    assert by_worker.get(leaving, []) == []
    hosts = sorted((i, wid, e) for wid, xs in by_worker.items() for i, e in xs)
    assert hosts == sorted((i, info.primary, pl.epoch) for i, info in pl.instances.items())


def test_decommission_moves_everything_off_at_barriers_and_no_batch_fails(cluster) -> None:
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2)
    job = Job(cc, seed=4)
    job.run(3)
    pl = cc.placement(OP)
    leaving = pl.instances[0].primary  # a primary, and a chain member of the other instance

    # asked while a batch is in flight: it waits for the operator's next barrier
    real_commit = cc.commit_batch
    seen: list[dict] = []

    def commit_after_asking(op, b, **kw):
        if b == 3 and not seen:
            seen.append(cc.decommission(leaving))
        return real_commit(op, b, **kw)

    cc.commit_batch = commit_after_asking
    job.run(1)  # batch 3: committed at its epoch, not refused
    cc.commit_batch = real_commit
    (first,) = seen
    assert first["drained"] is False and first["waiting_for_barrier"] == [OP], first
    assert cc.placement(OP).epoch == pl.epoch  # nothing moved during the batch
    epochs_before = cc.placement(OP).epoch

    job.run(1)  # batch 4's barrier moves the operator off
    out = cc.decommission(leaving)
    assert out["drained"] is True and out["operators"] == [], out
    assert cc.placement(OP).epoch == epochs_before + 1
    check_placement(cc, ws, leaving)
    w = next(s for s in cc.status()["workers"] if s["id"] == leaving)
    assert w["decommission"]["drained"] is True
    job.run(3)
    assert job.state() == job.model

    # now it can go: stopped, then found dead, without any failover
    epoch = cc.placement(OP).epoch
    next(x for x in ws if x.id == leaving).stop()
    cc.declare_dead(leaving, "stopped after its decommission")
    assert cc.placement(OP).epoch == epoch
    job.run(2)
    assert job.state() == job.model
    coord.close()


def test_decommission_of_an_idle_operator_is_at_once_and_bad_input_is_refused(cluster) -> None:
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2)
    job = Job(cc, seed=5)
    job.run(2)
    leaving = cc.placement(OP).instances[1].primary
    out = cc.decommission(leaving)  # no batch in flight: moved now
    assert out["drained"] is True, out
    check_placement(cc, ws, leaving)
    # nothing new is placed on it: a second operator avoids it
    cc.create_operator("other", parallelism=3, num_vnodes=V, replicas=2)
    other = {o["operator_id"]: o for o in cc.status()["operators"]}["other"]
    assert all(r["primary"] != leaving and leaving not in r["chain"] for r in other["instances"])
    job.run(2)
    assert job.state() == job.model

    with pytest.raises(rhino.InvalidArgumentError, match="decommissioned"):
        cc.rescale(OP, 3, on=[leaving])
    with pytest.raises(rhino.UnknownInstanceError):
        cc.decommission("w99")
    with pytest.raises(rhino.InvalidArgumentError):
        cc.decommission("")
    victim = next(w for w in ws if w.id != leaving)
    victim.kill()
    cc.declare_dead(victim.id, "test")
    with pytest.raises(rhino.InvalidArgumentError, match="dead"):
        cc.decommission(victim.id)

    # registering again ends its decommission: it may be placed on again
    w = next(x for x in ws if x.id == leaving)
    cc.register(w.id, w.address, unix_socket=str(w.unix_socket), incarnation="test-2")
    assert "decommission" not in next(s for s in cc.status()["workers"] if s["id"] == leaving)
    coord.close()


def test_decommission_cli(tmp_path: Path) -> None:
    from rhino.coordinator.client import connect_coordinator
    from rhino_testing.harness.engine import MicroBatchEngine
    from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret

    sf = write_secret(tmp_path, SECRET)
    co = CoordinatorProcess(tmp_path, secret_file=sf, heartbeat_timeout=2.0).start()
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                        extra_args=["--coordinator", co.address]).start() for n in (2, 3, 4)]
    cc = connect_coordinator(co.address, secret=SECRET)
    env = {**os.environ, "RHINO_COORDINATOR": co.address, "RHINO_SECRET_FILE": str(sf)}
    try:
        deadline = time.monotonic() + 20
        while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 3:
            assert time.monotonic() < deadline, "workers did not register"
            time.sleep(0.1)
        cc.create_operator("q", parallelism=2, num_vnodes=16, replicas=1)
        engine = MicroBatchEngine(cc, "q", secret=SECRET)
        engine.run_batch(0, {k: b"x" for k in range(50)})
        leaving = cc.placement("q").instances[0].primary
        p = subprocess.run([sys.executable, "-m", "rhino", "decommission", leaving, "--wait", "10", "--json"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["drained"] is True
        text = subprocess.run([sys.executable, "-m", "rhino", "status"], capture_output=True, text=True,
                              timeout=120, env=env)
        assert "decommissioned: drained" in text.stdout, text.stdout
        bad = subprocess.run([sys.executable, "-m", "rhino", "decommission", "w99"], capture_output=True,
                             text=True, timeout=120, env=env)
        assert bad.returncode == 1 and "UnknownInstanceError" in bad.stderr
        engine.run_batch(1, {k: b"y" for k in range(50)})
    finally:
        cc.close()
        for w in ws:
            w.stop()
        co.stop()
