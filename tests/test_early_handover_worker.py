"""The early hand-over's worker side (docs/design.md §4.1; issue 48): a target takes
vnodes *on a base* at the barrier (``reconfigure`` with an ``import_on_base`` step,
docs/protocol.md §7.4) and serves them at once, reading what it does not hold through
to the origin's committed checkpoint on a worker that holds it. Nothing is copied.

Real workers on 127.0.0.214-216: the origin's primary A, its chain member B, and a
fresh worker C that holds no replica. The oracle is a dict model of the committed
state; the target's answers come through its sessions (lookups and scans), so every
read of a moved vnode either is C's own entry or went through to the base.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

HOSTS = (214, 215, 216)
OP = "early"
V = 16
N = 2000
MOVED = [0, 1, 2, 3]


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


PART = rhino.Partitioner(num_vnodes=V)


@pytest.fixture
def workers(tmp_path: Path):
    secret_file = write_secret(tmp_path, SECRET)
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False).start()
          for n in HOSTS]
    yield ws
    for w in ws:
        if w.alive():
            w.stop()


def owned(state: dict[bytes, bytes], vnodes) -> dict[bytes, bytes]:
    keys = np.array([int.from_bytes(k, "little", signed=True) for k in state], dtype=np.int64)
    vn = PART.vnodes(keys) if len(keys) else np.array([], dtype=np.int32)
    return {kb(k): state[kb(k)] for k, v in zip(keys, vn) if int(v) in set(vnodes)}


def write_batch(c: rhino.Client, instance: int, batch: int, epoch: int, state: dict, vnodes, rng) -> tuple:
    """Random puts and deletes of keys of ``vnodes`` (many of them keys the base holds);
    returns them, to run the batch again."""
    keys = rng.choice(N, size=300, replace=False).astype(np.int64)
    keys = keys[np.isin(PART.vnodes(keys), list(vnodes))]
    cut = len(keys) // 4
    ops = (keys[cut:], [rng.bytes(16) for _ in keys[cut:]], keys[:cut])
    commit(c, instance, batch, epoch, ops)
    live, values, dead = ops
    state.update({kb(k): v for k, v in zip(live, values)})
    for k in dead:
        state.pop(kb(k), None)
    return ops


def commit(c: rhino.Client, instance: int, batch: int, epoch: int, ops: tuple) -> bool:
    """Runs a batch's writes and commits; whether the session rolled back first."""
    live, values, dead = ops
    with c.session(OP, instance, batch=batch, epoch=epoch) as s:
        s.put_batch(live, values)
        s.delete_batch(dead)
        s.commit()
        return s.rolled_back


def read(c: rhino.Client, instance: int, batch: int, epoch: int) -> tuple[dict, dict]:
    """The target's view at batch ``batch``: a scan, and a lookup of every key of its vnodes."""
    with c.session(OP, instance, batch=batch, epoch=epoch) as s:
        scanned = dict(s.scan(page_size=300))
        keys = np.arange(N, dtype=np.int64)
        keys = keys[np.isin(PART.vnodes(keys), MOVED)]  # every key of the moved vnodes, held or not
        got = s.get_batch(keys)
        s.abort()
    return scanned, {kb(k): v for k, v in zip(keys, got) if v is not None}


def test_a_target_on_a_fresh_worker_serves_moved_vnodes_at_once_through_to_the_base(workers) -> None:
    a, b, c = workers
    ca, cb, cc = (rhino.connect(w.unix_socket, secret=SECRET) for w in workers)
    rng = np.random.default_rng(48)
    e = 1
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, chain=[b.address], chain_version=1)
    state: dict[bytes, bytes] = {}
    for batch in range(3):
        write_batch(ca, 0, batch, e, state, range(V), rng)

    # The barrier after batch 2: vnodes 0..3 move to a new instance 1 on C, which holds
    # no replica of instance 0. C takes them on the base (checkpoint 2 of instance 0, held
    # by A and B); A drops them. Nothing is copied to C.
    e += 1
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, chain=[b.address], chain_version=1)
    cc.open_instance(OP, 1, epoch=e, num_vnodes=V, vnodes=MOVED, chain=[], chain_version=0)
    step = [{"op": "import_on_base", "from_operator": OP, "from_instance": 0, "checkpoint": 2,
             "vnodes": MOVED, "hosts": [a.address, b.address]}]
    info = cc.reconfigure(OP, 1, epoch=e, version=2, ops=step)
    assert info["vnodes"] == MOVED
    ca.reconfigure(OP, 0, epoch=e, version=2, ops=[{"op": "drop", "vnodes": MOVED}])
    assert not list(Path(c.dir).rglob("*.sst")), "the early hand-over copies nothing to the target"
    at_barrier = owned(state, MOVED)
    assert at_barrier, "the moved vnodes hold state"
    scanned, looked_up = read(cc, 1, 3, e)
    assert scanned == at_barrier and looked_up == at_barrier

    # Batch 3 writes and deletes on both sides (the target over base keys too).
    write_batch(ca, 0, 3, e, state, [v for v in range(V) if v not in MOVED], rng)
    before_3 = dict(state)
    ops_3 = write_batch(cc, 1, 3, e, state, MOVED, rng)
    scanned, looked_up = read(cc, 1, 4, e)
    assert scanned == owned(state, MOVED) and looked_up == owned(state, MOVED)

    # Batch 3 runs again on the target: it rolls back to checkpoint 2 (taken with the
    # vnodes on their base) and reads the same base, so it sees the state at the barrier.
    with cc.session(OP, 1, batch=3, epoch=e) as s:
        assert s.rolled_back
        assert dict(s.scan(page_size=300)) == owned(before_3, MOVED) == at_barrier
        s.abort()
    commit(cc, 1, 3, e, ops_3)  # and commits as it first did (already at 2: no second rollback)

    # The origin's primary dies: the base stays readable from its chain member B.
    a.kill()
    ca.close()
    scanned, looked_up = read(cc, 1, 4, e)
    assert scanned == owned(state, MOVED) and looked_up == owned(state, MOVED)
    for cl in (cb, cc):
        cl.close()


def test_an_import_on_base_step_is_checked(workers) -> None:
    a, _, c = workers
    cc = rhino.connect(c.unix_socket, secret=SECRET)
    cc.open_instance(OP, 1, epoch=1, num_vnodes=V, vnodes=MOVED)
    bad = [
        {"op": "import_on_base", "from_operator": OP, "from_instance": 0, "checkpoint": 2, "vnodes": [0],
         "hosts": []},
        {"op": "import_on_base", "from_operator": OP, "from_instance": 0, "checkpoint": 2, "vnodes": [0]},
        {"op": "import_on_base", "from_operator": "../x", "from_instance": 0, "checkpoint": 2, "vnodes": [0],
         "hosts": [a.address]},
    ]
    for step in bad:
        with pytest.raises(rhino.InvalidArgumentError):
            cc.reconfigure(OP, 1, epoch=1, version=0, ops=[step])
    cc.close()
