"""A chain repair that adds back a worker holding an old checkpoint of a batch
the primary ran again (docs/design.md §3 failure model, docs/protocol.md §7.3).

A worker W held checkpoint N as a chain member, was killed, and the chain was
repaired without it; the primary then ran batch N again (a replay: rolled back
to N-1 by hard links, checkpoint N committed again with other files), which
only the chain members of the day were told to drop. W restarts with its store
and is added back by the next repair: the bulk copy of the primary's
checkpoint N must not meet W's old one (the replica stream refuses "checkpoint
N is already committed here with different files"), so the coordinator drops
what W holds of the instance first. Checked against real ``rhino worker``
processes; W's store is read directly (its manifests, and rocksdict on a
restore of its checkpoint), not through the coordinator's own claims.

Also: one operator whose reconfiguration fails does not stop the loss of a
worker from being handled for the others (a stub gateway, real metadata).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

import rhino
from rhino.coordinator.metadata import InstanceRow, Metadata, OperatorRow, WorkerRow
from rhino.coordinator.replication_manager import ReplicationManager
from rhino.errors import RhinoIOError
from rhino_testing.harness.workers import SECRET
from helpers import StubWorkerGateway
import test_coordinator
from test_coordinator import OP, V, Job, make

cluster = test_coordinator.cluster  # the fixture: four workers w2..w5 on 127.0.0.2-5

N = 2  # the batch that runs again


def identities(store_dir: Path, checkpoint: int) -> list[str]:
    """The content identities of checkpoint ``checkpoint`` of OP/0 in a worker's own store."""
    return sorted(f.identity for f in rhino.ReplicaStore(str(store_dir)).manifest(OP, 0, checkpoint).files)


def rocksdict_values(store_dir: Path, checkpoint: int, target: Path, read_rocksdb) -> dict[bytes, bytes]:
    """Every vnode's keys and values of a checkpoint in a worker's store, read by rocksdict."""
    rhino.ReplicaStore(str(store_dir)).restore(OP, 0, checkpoint, str(target)).close()
    return {k: v for n, cf in read_rocksdb(target).items() if n.startswith("vnode-") for k, v in cf.items()}


def as_keys(model: dict[int, bytes]) -> dict[bytes, bytes]:
    return {k.to_bytes(8, "little", signed=True): v for k, v in model.items()}


def test_repair_adds_back_a_worker_holding_an_old_checkpoint_of_a_reexecuted_batch(cluster, read_rocksdb) -> None:
    tmp, ws = cluster
    by_id = {w.id: w for w in ws}
    coord, cc = make(tmp, ws)
    cc.create_operator(OP, parallelism=1, num_vnodes=V, replicas=2)
    job = Job(cc, seed=7)
    job.run(N)  # batches 0 .. N-1
    through_n_minus_1 = dict(job.model)
    job.run(1)  # batch N, committed by the coordinator
    inst = cc.placement(OP).instances[0]
    assert inst.last_complete == N
    primary, (w_id, b_id) = inst.primary, inst.chain
    (spare,) = [w.id for w in ws if w.id not in (primary, w_id, b_id)]
    w = by_id[w_id]
    old_n = identities(w.dir, N)

    # W crashes; the chain is repaired onto the spare.
    w.kill()
    out = cc.declare_dead(w_id, "test: SIGKILL")
    assert not out.get("errors") and OP in out["operators"]
    assert cc.placement(OP).instances[0].chain == (b_id, spare)

    # The primary runs batch N again (a replay of a batch the coordinator
    # committed), with other writes: checkpoint N gets other files.
    pl = cc.placement(OP)
    rng = np.random.default_rng(99)
    keys = np.unique(rng.choice(1000, 60, replace=False).astype(np.int64))
    puts = {int(k): b"replayed-" + rng.bytes(8) for k in keys}
    with rhino.connect(pl.instances[0].address, secret=SECRET) as c:
        with c.session(OP, 0, batch=N, epoch=pl.epoch) as s:
            assert s.rolled_back
            s.put_batch(keys, [puts[int(k)] for k in keys])
            assert s.commit("barrier").replication == "complete"
    job.model = {**through_n_minus_1, **puts}
    new_n = identities(by_id[primary].dir, N)
    assert new_n != old_n
    for m in (b_id, spare):  # the members of the day dropped their old N first (the worker's own discard)
        assert identities(by_id[m].dir, N) == new_n

    # W restarts with its store intact and rejoins; it still holds the old N.
    w.start()
    assert identities(w.dir, N) == old_n
    cc.register(w_id, w.address, unix_socket=str(w.unix_socket), incarnation="test-2")
    assert cc.placement(OP).instances[0].chain == (b_id, spare)  # one instance: nothing to rebalance

    # Another member crashes: the repair adds W back, and must succeed.
    by_id[b_id].kill()
    out = cc.declare_dead(b_id, "test: SIGKILL")
    assert out["errors"] == {} and OP in out["operators"]
    assert coord.meta.pending_reconfiguration(OP) is None
    inst = cc.placement(OP).instances[0]
    assert inst.primary == primary and inst.chain == (spare, w_id)
    assert out["operators"][OP]["copies"]["0"]["to"] == [w_id]

    # W holds the primary's checkpoint N, and nothing of the earlier stint:
    # from its store, from its own answer, and read by rocksdict.
    assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 0) == [N]
    assert identities(w.dir, N) == new_n
    with rhino.connect(w.unix_socket, secret=SECRET) as c:
        assert c.status(OP, 0)["checkpoints"] == [N]
    assert rocksdict_values(w.dir, N, tmp / "read-w", read_rocksdb) == as_keys(job.model)

    # A takeover from W gives the re-executed state, and the job goes on there.
    by_id[spare].kill()
    assert cc.declare_dead(spare, "test: SIGKILL")["errors"] == {}
    by_id[primary].kill()
    out = cc.declare_dead(primary, "test: SIGKILL")
    assert out["errors"] == {} and out["operators"][OP]["takeovers"]["0"]["worker"] == w_id
    assert cc.placement(OP).instances[0].primary == w_id
    assert job.state() == job.model
    job.run(2)
    assert job.state() == job.model
    coord.close()


# ---- one operator's failure does not stop the others -------------------------------------------


class StubClient:
    """A worker's client that records its calls; ``open`` fails for the operators in ``failing``."""

    def __init__(self, wid: str, calls: list, failing: set[str]) -> None:
        self.wid, self.calls, self.failing = wid, calls, failing

    def _note(self, action: str, operator_id: str, **kw: Any) -> None:
        self.calls.append((self.wid, action, operator_id, kw))

    def open_instance(self, operator_id: str, instance: int, **kw: Any) -> dict:
        self._note("open", operator_id, epoch=kw["epoch"])
        if operator_id in self.failing:
            raise RhinoIOError(f"{self.wid}: disk trouble for {operator_id}")
        return {}

    def discard_after(self, operator_id: str, instance: int, *, epoch: int, after: Any) -> list[int]:
        self._note("discard_after", operator_id, epoch=epoch, after=after)
        return [3]

    def replicate(self, operator_id: str, instance: int, **kw: Any) -> dict:
        self._note("replicate", operator_id, checkpoint=kw["checkpoint"], to=kw["to"])
        return {"bytes_sent": 10, "seconds": 0.0}


class StubGateway(StubWorkerGateway):
    def __init__(self, meta: Metadata) -> None:
        super().__init__(meta, lambda wid: StubClient(wid, self.calls, self.failing))


def _two_operators_w4_dead(meta: Metadata) -> None:
    """Operators a and b, one instance each: primary w1, chain w2, w4; w4 dead."""
    now = time.time()
    with meta.tx() as c:
        for n in (1, 2, 3, 4):
            meta.upsert_worker(c, WorkerRow(id=f"w{n}", address=f"w{n}:1", unix_socket=None, host="h", rack=None,
                                            zone=None, state="alive", incarnation="x", registered_at=now,
                                            dead_since=None))
        for op_id in ("a", "b"):
            meta.put_operator(c, OperatorRow(operator_id=op_id, num_vnodes=4, num_key_groups=64, seed=0, replicas=2,
                                             placement="balanced", epoch=1, last_batch=3, created_at=now))
            meta.set_assignment(c, op_id, [0, 0, 0, 0])
            meta.put_instance(c, InstanceRow(operator_id=op_id, instance=0, primary_worker="w1", chain=["w2", "w4"],
                                             chain_version=1, state="active", last_complete=3, bytes=100,
                                             redo_version=None, redo=[]))
            meta.record_epoch(c, op_id, 1, "created")
        meta.mark_worker_dead(c, "w4")


def test_one_failing_operator_does_not_stop_the_others(tmp_path: Path) -> None:
    meta = Metadata(str(tmp_path / "meta"))
    gw = StubGateway(meta)
    logged: list = []
    rm = ReplicationManager(meta, gw, lambda event, **f: logged.append((event, f)))
    _two_operators_w4_dead(meta)
    assert [op.operator_id for op in meta.operators()] == ["a", "b"]  # the failing one comes first
    gw.failing = {"a"}

    out = rm.recover_from_loss("w4")
    assert set(out["errors"]) == {"a"} and "disk trouble" in out["errors"]["a"]
    assert set(out["operators"]) == {"b"}
    assert meta.pending_reconfiguration("a") is not None  # left for a retry
    assert meta.instance("a", 0).chain == ["w2", "w4"] and meta.operator("a").epoch == 1
    assert meta.pending_reconfiguration("b") is None
    assert meta.instance("b", 0).chain == ["w2", "w3"] and meta.operator("b").epoch == 2
    assert any(e == "reconfigure_failed" and f["operator"] == "a" for e, f in logged)
    assert any(e["kind"] == "reconfigure_failed" for e in meta.events(20))
    # b's new member dropped what it held of the instance, then got the copy of last_complete.
    b_calls = [(wid, action, kw) for wid, action, op_id, kw in gw.calls if op_id == "b" and action != "open"]
    assert b_calls == [("w3", "discard_after", {"epoch": 2, "after": None}),
                       ("w1", "replicate", {"checkpoint": 3, "to": ["w3:1"]})]

    # A rebalance leaves the pending operator alone; the next repair (a worker
    # registers) carries it out.
    assert "a" not in rm.rebalance_replicas(None)
    assert ("rebalance_skipped", {"operator": "a", "reason": "a reconfiguration is pending"}) in logged
    gw.failing = set()
    assert rm.repair_all() == {}
    assert meta.pending_reconfiguration("a") is None
    assert meta.instance("a", 0).chain == ["w2", "w3"] and meta.operator("a").epoch == 3  # past the pending 2
    meta.close()


def test_the_failure_detector_retries_a_pending_reconfiguration(tmp_path: Path) -> None:
    """A reconfiguration left pending is decided again by the detector's next pass (at most
    once per heartbeat timeout), not only when a worker registers."""
    from rhino.coordinator.coordinator import Coordinator

    meta = Metadata(str(tmp_path / "meta"))
    _two_operators_w4_dead(meta)
    meta.close()
    logged: list = []
    coord = Coordinator(str(tmp_path / "meta"), secret=SECRET, heartbeat_timeout=60.0, detector_interval=3600.0,
                        log=lambda event, **f: logged.append((event, f)))
    try:
        gw = StubGateway(coord.meta)
        coord.rm = ReplicationManager(coord.meta, gw, coord.log)
        gw.failing = {"a"}
        coord.rm.recover_from_loss("w4")
        assert coord.meta.pending_reconfiguration("a") is not None
        t = time.monotonic() + 1000  # long after any earlier pass
        coord.detector.retry_pending(t)  # still failing: stays pending, logged again
        assert coord.meta.pending_reconfiguration("a") is not None
        assert sum(e == "reconfigure_failed" for e, _ in logged) == 2
        gw.failing = set()
        coord.detector.retry_pending(t + 1)  # within the heartbeat timeout of the last pass: not yet
        assert coord.meta.pending_reconfiguration("a") is not None
        coord.detector.retry_pending(t + 61)
        assert coord.meta.pending_reconfiguration("a") is None
        assert coord.meta.instance("a", 0).chain == ["w2", "w3"]
        # b was done at the loss and is left alone by the retries (no new epoch)
        assert coord.meta.operator("b").epoch == 2
    finally:
        coord.close()
