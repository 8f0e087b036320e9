"""The coordinator in-process (as the Spark driver will host it) against real
``rhino worker`` processes: bad input, a handover step that fails and aborts,
a coordinator killed in the middle of a step, and ``--rebuild`` from the
workers' stores. The expected state is a dict model of what the engine wrote.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino.coordinator.client import LocalCoordinatorClient
from rhino.coordinator.coordinator import Coordinator
from rhino.coordinator.handover_manager import HandoverManager
from rhino.coordinator.rebuild import rebuild_from_workers
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret
from rhino_testing.harness.engine import MicroBatchEngine

OP = "op"
V = 16


@pytest.fixture
def cluster(tmp_path: Path):
    sf = write_secret(tmp_path, SECRET)
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False).start() for n in (2, 3, 4, 5)]
    yield tmp_path, ws
    for w in ws:
        if w.alive():
            w.stop()


def make(tmp_path: Path, ws, **kw) -> tuple[Coordinator, LocalCoordinatorClient]:
    coord = Coordinator(str(tmp_path / "coord"), secret=SECRET, heartbeat_timeout=3600, **kw)
    cc = LocalCoordinatorClient(coord)
    for w in ws:
        if w.alive():
            cc.register(w.id, w.address, unix_socket=str(w.unix_socket), incarnation="test")
    return coord, cc


class Job:
    def __init__(self, cc, seed: int = 0) -> None:
        self.engine = MicroBatchEngine(cc, OP, secret=SECRET, retry_sleep=0.05)
        self.cc = cc
        self.rng = np.random.default_rng(seed)
        self.model: dict[int, bytes] = {}
        self.batch = 0

    def run(self, n: int = 1) -> None:
        for _ in range(n):
            puts = {int(k): self.rng.bytes(12) for k in self.rng.choice(1000, 80, replace=False)}
            dels = [int(k) for k in self.rng.choice(1000, 8, replace=False) if int(k) not in puts]
            self.engine.run_batch(self.batch, puts, dels)
            self.model.update(puts)
            for k in dels:
                self.model.pop(k, None)
            self.batch += 1

    def state(self) -> dict[int, bytes]:
        pl = self.cc.placement(OP)
        out: dict[int, bytes] = {}
        for i, info in pl.instances.items():
            with rhino.connect(info.address, secret=SECRET) as c:
                with c.session(OP, i, batch=self.batch, epoch=pl.epoch) as s:
                    out.update({int.from_bytes(k, "little", signed=True): v for k, v in s.scan(page_size=500)})
                    s.abort()
        return out


def test_bad_input(cluster) -> None:
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    with pytest.raises(rhino.InvalidArgumentError, match="unknown coordinator method"):
        cc.call("launch_missiles")
    with pytest.raises(rhino.InvalidArgumentError):
        cc.call("placement", operator_id=OP, extra=1)
    with pytest.raises(rhino.InvalidArgumentError, match="parallelism"):
        cc.create_operator(OP, parallelism=0, num_vnodes=V)
    with pytest.raises(rhino.InvalidArgumentError, match="replicas"):
        cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=4)  # 4 workers cannot give 4 replicas + a primary
    with pytest.raises(rhino.UnknownInstanceError):
        cc.placement("nope")
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2)
    assert cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2).epoch == 1  # idempotent
    # the parallelism given is the initial one: another count is adopted from the coordinator
    assert sorted(cc.create_operator(OP, parallelism=3, num_vnodes=V, replicas=2).instances) == [0, 1]
    with pytest.raises(rhino.InvalidArgumentError, match="next batch is 0"):
        cc.begin_batch(OP, 5)
    with pytest.raises(rhino.UnknownVnodeError):
        cc.handover(OP, [V + 3], 0)
    with pytest.raises(rhino.InvalidArgumentError, match="strategy"):
        cc.handover(OP, [0], 1, strategy="teleport")
    with pytest.raises(rhino.UnknownInstanceError, match="not registered"):
        cc.heartbeat("w99", "x")
    with pytest.raises(rhino.StaleEpochError, match="incarnation"):
        cc.heartbeat("w2", "another-process")
    coord.close()


def test_begin_batch_issues_attempt_tokens_that_only_rise_and_the_sessions_carry_them(cluster) -> None:
    """The attempt fence (docs/protocol.md §7.2): every begin_batch, a batch's rerun too,
    answers a new token above the last, at least the clock in µs, and above the last after
    a coordinator restart on the same metadata. The engine's sessions carry it: once batch
    1 ran, a session of batch 1 with an older token is refused."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    assert cc.placement(OP).attempt is None  # begin_batch's answer only
    t0 = time.time() * 1e6
    tokens = [cc.begin_batch(OP, 0).attempt, cc.begin_batch(OP, 0).attempt]
    assert tokens[0] >= t0 and tokens[1] > tokens[0]
    job = Job(cc)
    job.run(2)  # batches 0 and 1, each with a token of its own begin
    coord.close()
    coord, cc = make(tmp, ws)
    after = cc.begin_batch(OP, 2)
    assert after.attempt > tokens[1] and after.last_batch == 1
    info = after.instances[0]
    with rhino.connect(info.address, secret=SECRET) as c:
        with pytest.raises(rhino.StaleAttemptError, match="superseded attempt"):
            c.session(OP, 0, batch=1, epoch=after.epoch, attempt=tokens[1], committed=0)
        with c.session(OP, 0, batch=2, epoch=after.epoch, attempt=after.attempt, committed=1) as s:
            assert s.version == 1
            s.abort()
    coord.close()


def test_an_existing_operator_adopts_the_parallelism_and_names_what_cannot_change(cluster) -> None:
    """Issue 45: create_operator of an existing operator with another parallelism returns
    its current placement and records the adoption; a differing num_vnodes, num_key_groups,
    seed or replicas is refused, each field named with the operator's value, the call's and
    the fix."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    pl = cc.create_operator(OP, parallelism=5, num_vnodes=V, replicas=1)
    assert sorted(pl.instances) == [0, 1] and pl.epoch == 1
    (ev,) = [e for e in coord.meta.events() if e["kind"] == "operator_adopted"]
    assert (ev["operator"], ev["asked_parallelism"], ev["parallelism"]) == (OP, 5, 2)
    with pytest.raises(rhino.InvalidArgumentError) as e:
        cc.create_operator(OP, parallelism=2, num_vnodes=2 * V, replicas=1, seed=7)
    msg = str(e.value)
    assert f"num_vnodes={V} (this call: num_vnodes={2 * V})" in msg and "seed=0 (this call: seed=7)" in msg, msg
    assert f"pass num_vnodes={V}, seed=0, or drop the operator and start over" in msg, msg
    with pytest.raises(rhino.InvalidArgumentError, match=r"replicas=1 \(this call: replicas=2\)"):
        cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2)
    with pytest.raises(rhino.InvalidArgumentError, match=r"num_key_groups=32768 \(this call: num_key_groups=1024\)"):
        cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1, num_key_groups=1024)
    assert [e["kind"] for e in coord.meta.events()].count("operator_adopted") == 1
    coord.close()


def test_failed_step_aborts_then_failover(cluster) -> None:
    """The target's worker dies before the barrier: the step fails, is undone at
    a new epoch with the old table, and the loss is then handled by failover."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2)
    job = Job(cc)
    job.run(3)
    pl = cc.placement(OP)
    before = pl.assignment
    target_worker = pl.instances[1].primary
    victim = next(w for w in ws if w.id == target_worker)
    mine = [v for v, i in enumerate(before) if i == 0][:3]
    plan = cc.handover(OP, mine, 1)
    victim.kill()  # nobody tells the coordinator: the step finds out
    pl2 = cc.begin_batch(OP, job.batch)
    assert pl2.assignment == before and pl2.epoch > pl.epoch + 1
    (row,) = [p for p in coord.meta.plans() if p.id == plan["plan"]]
    assert row.state == "aborted" and row.message
    cc.declare_dead(victim.id, "test")
    job.run(3)
    assert job.state() == {k: v for k, v in job.model.items()}
    coord.close()


def test_coordinator_killed_mid_step_resumes_by_abort(cluster, monkeypatch) -> None:
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2)
    job = Job(cc, seed=1)
    job.run(2)
    before = cc.placement(OP).assignment
    real = HandoverManager._apply

    def die_after_apply(self, *a, **kw):
        real(self, *a, **kw)  # the workers imported and dropped...
        raise SystemExit("killed")  # ...and the coordinator died before its commit

    monkeypatch.setattr(HandoverManager, "_apply", die_after_apply)
    cc.handover(OP, [v for v, i in enumerate(before) if i == 0][:2], 1)
    with pytest.raises(SystemExit):
        cc.begin_batch(OP, job.batch)
    monkeypatch.setattr(HandoverManager, "_apply", real)
    coord.detector.stop()  # the dead process's threads
    coord2 = Coordinator(str(tmp / "coord"), secret=SECRET, heartbeat_timeout=3600)  # resume() aborts the step
    cc2 = LocalCoordinatorClient(coord2)
    assert cc2.placement(OP).assignment == before
    assert not cc2.status()["plans_in_flight"]
    job.cc = job.engine.coord = cc2
    job.run(3)
    assert job.state() == job.model
    coord2.close()


def test_rebuild_from_the_workers(cluster) -> None:
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=3, num_vnodes=V, replicas=2)
    job = Job(cc, seed=2)
    job.run(2)
    cc.handover(OP, [0, 1], 5)
    job.run(3)
    old = cc.placement(OP)
    coord.close()
    shutil.rmtree(tmp / "coord")  # the metadata is lost
    coord2, cc2 = make(tmp, ws, rebuilding=True)
    with pytest.raises(rhino.BusyError):
        cc2.placement(OP)
    summary = rebuild_from_workers(coord2)
    assert summary["operators"][OP]["last_batch"] == job.batch - 1
    new = cc2.placement(OP)
    assert new.assignment == old.assignment and new.epoch > old.epoch
    assert {i: (x.primary, x.chain) for i, x in new.instances.items()} == \
        {i: (x.primary, x.chain) for i, x in old.instances.items()}
    job.cc = job.engine.coord = cc2
    job.run(2)
    assert job.state() == job.model
    coord2.close()


def test_plan_for_a_future_batch_and_cost_placement(cluster) -> None:
    """A handover scheduled for the barrier after batch 4 runs there, not
    before; the cost-aware placement gives every instance r distinct workers
    other than its primary."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    pl = cc.create_operator(OP, parallelism=3, num_vnodes=V, replicas=2, placement="cost")
    for i in pl.instances.values():
        assert len(set(i.chain)) == 2 and i.primary not in i.chain
    job = Job(cc, seed=4)
    job.run(2)
    mine = [v for v, i in enumerate(cc.placement(OP).assignment) if i == 0][:2]
    with pytest.raises(rhino.InvalidArgumentError, match="still ahead"):
        cc.handover(OP, mine, 2, after_batch=0)
    plan = cc.handover(OP, mine, 2, after_batch=4)
    job.run(3)  # batches 2, 3, 4: the plan waits
    assert all(cc.placement(OP).assignment[v] == 0 for v in mine)
    assert [p["id"] for p in cc.status()["plans_in_flight"]] == [plan["plan"]]
    job.run(1)  # batch 5 starts at the barrier after 4
    assert all(cc.placement(OP).assignment[v] == 2 for v in mine)
    assert not cc.status()["plans_in_flight"]
    assert job.state() == job.model
    coord.close()


def test_horizontal_scaling_onto_a_new_worker(cluster) -> None:
    """A worker that joins holds nothing; a rescale that places a new instance
    on it first bulk-copies the origins' checkpoint there (bytes move), then
    the target imports from that copy."""
    tmp, ws = cluster
    first = ws[:3]
    coord, cc = make(tmp, first)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    job = Job(cc, seed=5)
    job.run(2)
    newcomer = ws[3]
    cc.register(newcomer.id, newcomer.address, unix_socket=str(newcomer.unix_socket), incarnation="test")
    with pytest.raises(rhino.InvalidArgumentError, match="not a live registered worker"):
        cc.rescale(OP, 3, on=["w99"])
    plan = cc.rescale(OP, 3, on=[newcomer.id])
    job.run(2)
    pl = cc.placement(OP)
    new = [i for i in pl.instances if i not in (0, 1)]
    assert len(new) == 1 and pl.instances[new[0]].primary == newcomer.id
    (row,) = [p for p in coord.meta.plans() if p.id == plan["plan"]]
    assert row.state == "done" and row.bytes_moved > 0  # the bulk copy
    assert job.state() == job.model
    coord.close()


def test_horizontal_scaling_onto_a_new_worker_without_waiting_for_the_copy(cluster) -> None:
    """With ``handover="early"`` (design §4.1) the same rescale copies nothing first: the new
    instance takes its vnodes on the origins' checkpoint, serves them from the barrier on by
    reading through to it, and its worker copies and merges the base in the background."""
    tmp, ws = cluster
    first = ws[:3]
    coord, cc = make(tmp, first, handover="early")
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    job = Job(cc, seed=6)
    job.run(2)
    newcomer = ws[3]
    cc.register(newcomer.id, newcomer.address, unix_socket=str(newcomer.unix_socket), incarnation="test")
    plan = cc.rescale(OP, 3, on=[newcomer.id])
    job.run(1)  # the step runs at this batch's barrier; the batch reads the moved keys through
    pl = cc.placement(OP)
    (new,) = [i for i in pl.instances if i not in (0, 1)]
    assert pl.instances[new].primary == newcomer.id
    (row,) = [p for p in coord.meta.plans() if p.id == plan["plan"]]
    assert row.state == "done" and row.bytes_moved == 0  # no bulk copy
    assert job.state() == job.model
    with rhino.connect(newcomer.unix_socket, secret=SECRET) as c:
        merged_by = time.monotonic() + 30
        while c.status(OP, new)["bases"]:
            assert time.monotonic() < merged_by, "the base was not merged within 30 s"
            time.sleep(0.05)
    job.run(2)
    assert job.state() == job.model
    with pytest.raises(rhino.InvalidArgumentError, match="handover must be"):
        Coordinator(str(tmp / "coord2"), secret=SECRET, handover="later")
    coord.close()


def test_an_explicit_start_begins_after_the_last_committed_batch(cluster) -> None:
    """``begin_batch(first=True)`` (issue 47: a stage inserted into a running chain): a new
    operator's first batch may be 5, and after batch 5 it may resume at 9, across the gap,
    with a handover planned after batch 5 run at that barrier (the barrier after the last
    committed batch, not after 8); without ``first``, or at a batch not after the last
    committed one, it is refused. The state read back at the end equals the model."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    job = Job(cc)
    with pytest.raises(rhino.InvalidArgumentError, match="the next batch is 0, not 5"):
        cc.begin_batch(OP, 5)
    job.batch = 5
    job.engine.run_batch(5, {k: b"five" for k in range(100)}, first=True)
    job.model.update({k: b"five" for k in range(100)})
    assert cc.placement(OP).last_batch == 5
    with pytest.raises(rhino.InvalidArgumentError, match="the next batch is 6, not 9"):
        cc.begin_batch(OP, 9)
    for b in (5, 3):
        with pytest.raises(rhino.InvalidArgumentError, match=r"the next batch is 6 or later \(first=true"):
            cc.begin_batch(OP, b, first=True)
    pl = cc.placement(OP)
    v = pl.assignment.index(0)
    cc.handover(OP, [v], 1, after_batch=5)
    job.engine.run_batch(9, {k: b"nine" for k in range(50, 150)}, deletes=[0, 1], first=True)
    job.model.update({k: b"nine" for k in range(50, 150)})
    for k in (0, 1):
        job.model.pop(k)
    pl = cc.placement(OP)
    assert pl.last_batch == 9 and pl.assignment[v] == 1 and pl.epoch > 1
    job.batch = 10
    assert job.state() == job.model
    job.engine.close()
    coord.close()
