"""A handover's worker side (docs/design.md §4 step 4, docs/protocol.md §7.4).

At the barrier after batch b, a target imports vnodes by hard links from its
worker's replica of the origin's checkpoint b, and the origin drops them
(`reconfigure`). Checkpoint b predates the handover, so the worker keeps the
steps as the redo of version b: a re-executed batch b+1 (a rollback to b), and
a takeover at b on another worker, run them again. A new instance is instead
checkpointed at b with its imports. `replicate` bulk-copies a checkpoint to
another worker. Expected states come from a dict model; one checkpoint is read
with rocksdict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

OP = "hand"
V = 16
N = 3000


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


@pytest.fixture
def workers(tmp_path: Path):
    secret_file = write_secret(tmp_path, SECRET)
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False).start()
          for n in (2, 3, 4, 5)]
    yield ws
    for w in ws:
        if w.alive():
            w.stop()


PART = rhino.Partitioner(num_vnodes=V)


class Model:
    """The committed state per key, and which instance owns each vnode."""

    def __init__(self, owner: dict[int, int]) -> None:
        self.state: dict[bytes, bytes] = {}
        self.owner = dict(owner)

    def of(self, instance: int) -> dict[bytes, bytes]:
        keys = np.array([int.from_bytes(k, "little", signed=True) for k in self.state], dtype=np.int64)
        vn = PART.vnodes(keys) if len(keys) else np.array([], dtype=np.int32)
        return {kb(k): self.state[kb(k)] for k, v in zip(keys, vn) if self.owner[int(v)] == instance}


def run_batch(clients: dict[int, rhino.Client], batch: int, epoch: int, model: Model, rng) -> None:
    keys = rng.choice(N, size=400, replace=False).astype(np.int64)
    gone = rng.choice(N, size=40, replace=False).astype(np.int64)
    values = {kb(k): rng.bytes(24) for k in keys}
    for i, c in clients.items():
        mine = keys[[model.owner[int(v)] == i for v in PART.vnodes(keys)]]
        dead = gone[[model.owner[int(v)] == i for v in PART.vnodes(gone)]]
        with c.session(OP, i, batch=batch, epoch=epoch) as s:
            s.put_batch(mine, [values[kb(k)] for k in mine])
            s.delete_batch(dead)
            assert s.commit().replication in ("complete", "none")
    model.state.update(values)
    for k in gone:
        model.state.pop(kb(k), None)


def scan(c: rhino.Client, i: int, batch: int, epoch: int) -> dict[bytes, bytes]:
    with c.session(OP, i, batch=batch, epoch=epoch) as s:
        out = dict(s.scan(page_size=700))
        s.abort()
        return out


def test_handover_redo_new_instance_and_bulk_copy(workers, tmp_path: Path) -> None:
    a, b, c, d = workers
    rng = np.random.default_rng(5)
    ca, cb, cc, cd = (rhino.connect(w.unix_socket, secret=SECRET) for w in workers)
    e = 1
    # Instance 0 on A (vnodes 0..7, chain [B, C]); instance 1 on B (8..15, chain [C, A]).
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, vnodes=range(0, 8), chain=[b.address, c.address], chain_version=1)
    cb.open_instance(OP, 1, epoch=e, num_vnodes=V, vnodes=range(8, 16), chain=[c.address, a.address], chain_version=1)
    model = Model({v: (0 if v < 8 else 1) for v in range(V)})
    clients = {0: ca, 1: cb}
    for batch in range(3):
        run_batch(clients, batch, e, model, rng)

    # Handover at the barrier after batch 2: vnodes 0..2 go from 0 to 1. B holds
    # checkpoint 2 of instance 0 (it is in 0's chain). Epoch e+1 first.
    e += 1
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, chain=[b.address, c.address], chain_version=1)
    cb.open_instance(OP, 1, epoch=e, num_vnodes=V, chain=[c.address, a.address], chain_version=1)
    imp = [{"op": "import", "from_operator": OP, "from_instance": 0, "checkpoint": 2, "vnodes": [0, 1, 2]}]
    drop = [{"op": "drop", "vnodes": [0, 1, 2]}]
    info = cb.reconfigure(OP, 1, epoch=e, version=2, ops=imp)
    assert info["vnodes"] == [0, 1, 2] + list(range(8, 16)) and info["replicated"] is False
    ca.reconfigure(OP, 0, epoch=e, version=2, ops=drop)
    for v in (0, 1, 2):
        model.owner[v] = 1
    assert scan(cb, 1, 3, e) == model.of(1)
    assert scan(ca, 0, 3, e) == model.of(0)
    # A retried step is harmless (idempotent), and a stale epoch is refused.
    cb.reconfigure(OP, 1, epoch=e, version=2, ops=imp)
    with pytest.raises(rhino.StaleEpochError):
        ca.reconfigure(OP, 0, epoch=e - 1, version=2, ops=drop)
    with pytest.raises(rhino.InvalidArgumentError):
        ca.reconfigure(OP, 0, epoch=e, version=1, ops=drop)  # not at that barrier
    with pytest.raises(rhino.InvalidArgumentError):
        ca.reconfigure(OP, 0, epoch=e, version=2, ops=[{"op": "shuffle", "vnodes": [1]}])

    # Batch 3 runs under the new table; then batch 3 runs again: both
    # instances roll back to checkpoint 2 and redo the handover.
    before = {k: v for k, v in model.state.items()}
    run_batch(clients, 3, e, model, rng)
    snapshot3 = {k: v for k, v in model.state.items()}
    model.state = before
    assert scan(cb, 1, 3, e) == model.of(1)  # rolled back to 2, import redone
    assert scan(ca, 0, 3, e) == model.of(0)  # rolled back to 2, drop redone
    run_batch(clients, 3, e, model, np.random.default_rng(99))
    assert scan(cb, 1, 4, e) == model.of(1)
    del snapshot3

    # A new instance 2 on C takes vnodes 3 and 4 from instance 0 at the barrier
    # after 3 (C holds 0's checkpoint 3): it is checkpointed at 3 with them and
    # replicated to its chain [D] before reconfigure returns.
    e += 1
    for cl, i, ch in ((ca, 0, [b.address, c.address]), (cb, 1, [c.address, a.address])):
        cl.open_instance(OP, i, epoch=e, num_vnodes=V, chain=ch, chain_version=1)
    cc.open_instance(OP, 2, epoch=e, num_vnodes=V, vnodes=[3, 4], chain=[d.address], chain_version=1)
    info = cc.reconfigure(OP, 2, epoch=e, version=3,
                          ops=[{"op": "import", "from_operator": OP, "from_instance": 0, "checkpoint": 3,
                                "vnodes": [3, 4]}])
    assert info["replicated"] is True and info["version"] == 3
    ca.reconfigure(OP, 0, epoch=e, version=3, ops=[{"op": "drop", "vnodes": [3, 4]}])
    model.owner[3] = model.owner[4] = 2
    assert rhino.ReplicaStore(str(d.dir)).checkpoints(OP, 2) == [3]
    target = tmp_path / "d-read"
    rhino.ReplicaStore(str(d.dir)).restore(OP, 2, 3, str(target)).close()
    cfs = read_rocksdb(target)  # an independent reader
    assert {k: v for n, cf in cfs.items() if n.startswith("vnode-") for k, v in cf.items()} == model.of(2)
    clients[2] = cc
    run_batch(clients, 4, e, model, rng)

    # B dies after the barrier-4 handover step of vnode 5 (0 -> 1), before
    # batch 5 commits: A takes instance 1 over from its replica of checkpoint
    # 4 and, given the redo, imports vnode 5 from its own store (A is 0's primary).
    e += 1
    for cl, i, ch in ((ca, 0, [b.address, c.address]), (cb, 1, [c.address, a.address]), (cc, 2, [d.address])):
        cl.open_instance(OP, i, epoch=e, num_vnodes=V, chain=ch, chain_version=1)
    redo = [{"op": "import", "from_operator": OP, "from_instance": 0, "checkpoint": 4, "vnodes": [5]}]
    cb.reconfigure(OP, 1, epoch=e, version=4, ops=redo)
    ca.reconfigure(OP, 0, epoch=e, version=4, ops=[{"op": "drop", "vnodes": [5]}])
    model.owner[5] = 1
    b.kill()
    cb.close()
    e += 1
    info = ca.takeover(OP, 1, epoch=e, checkpoint=4, chain=[c.address, d.address], chain_version=2,
                       redo_version=4, redo=redo)
    assert 5 in info["vnodes"]
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, chain=[c.address, d.address], chain_version=2)
    cc.open_instance(OP, 2, epoch=e, num_vnodes=V, chain=[d.address], chain_version=1)
    assert scan(ca, 1, 5, e) == model.of(1)
    # The new chain member D gets a bulk copy of checkpoint 4 from A (chain repair).
    r = ca.replicate(OP, 1, epoch=e, to=[d.address], chain_version=2, checkpoint=4)
    assert r["checkpoint"] == 4 and r["bytes_sent"] > 0
    assert 4 in rhino.ReplicaStore(str(d.dir)).checkpoints(OP, 1)
    with pytest.raises(rhino.NotFoundError):
        ca.replicate(OP, 1, epoch=e, to=[d.address], chain_version=2, checkpoint=77)
    clients = {0: ca, 1: ca, 2: cc}
    run_batch(clients, 5, e, model, rng)
    for i, cl in clients.items():
        assert scan(cl, i, 6, e) == model.of(i)
    # A restarted worker redoes nothing twice: A's instance 1 survives a restart.
    for cl in (ca, cc, cd):
        cl.close()
    a.stop()
    a.start()
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    assert scan(ca, 1, 6, e) == model.of(1)
    ca.close()


def test_commit_fails_fast_when_the_chain_cannot_drop_reexecuted_checkpoints(workers) -> None:
    """A re-executed batch first drops the chain's later checkpoints; if a chain
    member is dead, the barrier commit fails at once with the reason (it used to
    wait forever: the failure was dropped before the replication was marked active)."""
    a, b, c, _ = workers
    ca = rhino.connect(a.unix_socket, secret=SECRET, request_timeout=20)
    ca.open_instance(OP, 0, epoch=1, num_vnodes=V, chain=[b.address, c.address], chain_version=1)
    keys = np.arange(40, dtype=np.int64)
    for batch in range(2):
        with ca.session(OP, 0, batch=batch, epoch=1) as s:
            s.put_batch(keys, [b"v%d" % batch] * len(keys))
            s.commit()
    c.kill()
    with ca.session(OP, 0, batch=1, epoch=1) as s:  # batch 1 again: a rollback to 0
        assert s.rolled_back
        s.put_batch(keys, [b"w"] * len(keys))
        with pytest.raises(rhino.PeerDeadError, match="cannot drop the re-executed checkpoints"):
            s.commit()
    ca.close()
