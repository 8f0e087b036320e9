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

import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

HOSTS = (214, 215, 216)
OP = "early"
V = 16
N = 2000
MOVED = [0, 1, 2, 3]


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


PART = rhino.Partitioner(num_vnodes=V)


def start(tmp_path: Path, target_args: list[str], origin_args: list[str] | None = None) -> list[WorkerProcess]:
    secret_file = write_secret(tmp_path, SECRET)
    return [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False,
                          extra_args=target_args if n == HOSTS[-1] else origin_args).start() for n in HOSTS]


def stop(ws: list[WorkerProcess]) -> None:
    for w in ws:
        if w.alive():
            w.stop()


@pytest.fixture
def workers(tmp_path: Path):
    """A, B and a target C whose background copy of a base never gets far (1 byte a
    second): every read of a moved vnode that C did not write goes through to the base."""
    ws = start(tmp_path, ["--base-copy-rate", "1"])
    yield ws
    stop(ws)


@pytest.fixture
def retiring_workers(tmp_path: Path):
    """As ``workers``, with A and B keeping only their newest 2 checkpoints, retired every 0.2 s."""
    ws = start(tmp_path, ["--base-copy-rate", "1"], ["--keep-checkpoints", "2", "--retention-interval", "0.2"])
    yield ws
    stop(ws)


@pytest.fixture
def copying_workers(tmp_path: Path):
    """A, B and a target C that copies bases at the default rate."""
    ws = start(tmp_path, [])
    yield ws
    stop(ws)


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


def move_on_base(ca: rhino.Client, cc: rhino.Client, a: WorkerProcess, b: WorkerProcess, rng) -> tuple[int, dict]:
    """Instance 0 on A (chain B) runs batches 0..2; at the barrier after batch 2 vnodes 0..3
    move to a new instance 1 on C, which holds no replica of instance 0: C takes them on
    the base (checkpoint 2 of instance 0, held by A and B) and A drops them. Returns the
    epoch after the move and the model of the committed state."""
    e = 1
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, chain=[b.address], chain_version=1)
    state: dict[bytes, bytes] = {}
    for batch in range(3):
        write_batch(ca, 0, batch, e, state, range(V), rng)
    e += 1
    ca.open_instance(OP, 0, epoch=e, num_vnodes=V, chain=[b.address], chain_version=1)
    cc.open_instance(OP, 1, epoch=e, num_vnodes=V, vnodes=MOVED, chain=[], chain_version=0)
    step = [{"op": "import_on_base", "from_operator": OP, "from_instance": 0, "checkpoint": 2,
             "vnodes": MOVED, "hosts": [a.address, b.address]}]
    info = cc.reconfigure(OP, 1, epoch=e, version=2, ops=step)
    assert info["vnodes"] == MOVED
    ca.reconfigure(OP, 0, epoch=e, version=2, ops=[{"op": "drop", "vnodes": MOVED}])
    return e, state


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
    e, state = move_on_base(ca, cc, a, b, rng)
    # Nothing was copied into the target's state or store at the barrier (its background
    # copy writes under state/tmp, and at 1 byte a second it never gets to merge).
    copied = [p for p in Path(c.dir).rglob("*.sst") if "tmp" not in p.relative_to(c.dir).parts]
    assert not copied, "the early hand-over copies nothing to the target at the barrier"
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


def test_the_base_lands_in_the_background_and_merges_under_the_targets_writes(copying_workers, tmp_path) -> None:
    a, b, c = copying_workers
    ca, cc = (rhino.connect(w.unix_socket, secret=SECRET) for w in (a, c))
    rng = np.random.default_rng(49)
    e, state = move_on_base(ca, cc, a, b, rng)

    # Batch 3 writes and deletes on the target (base keys among them) while the base is
    # copied; its open session holds the merge off until it commits, so the base lands
    # under those writes.
    keys = rng.choice(N, size=400, replace=False).astype(np.int64)
    keys = keys[np.isin(PART.vnodes(keys), MOVED)]
    dead, live = keys[: len(keys) // 3], keys[len(keys) // 3:]
    base_keys_deleted = [k for k in dead if kb(k) in state]
    assert base_keys_deleted, "the batch deletes keys only the base holds"
    values = [rng.bytes(16) for _ in live]
    with cc.session(OP, 1, batch=3, epoch=e) as s:
        s.put_batch(live, values)
        s.delete_batch(dead)
        time.sleep(1.0)  # the copy of a few thousand entries is done by now, and waits
        s.commit()
    after_3 = dict(state)
    after_3.update({kb(k): v for k, v in zip(live, values)})
    for k in dead:
        after_3.pop(kb(k), None)
    merged_by = time.monotonic() + 30
    while cc.status(OP, 1)["bases"]:
        assert time.monotonic() < merged_by, "the base was not merged within 30 s"
        time.sleep(0.05)
    scanned, looked_up = read(cc, 1, 4, e)
    assert scanned == owned(after_3, MOVED) and looked_up == owned(after_3, MOVED)

    # Batch 4 commits a checkpoint of the merged state: rocksdict, reading it, sees the model.
    ops_4 = (np.array([], dtype=np.int64), [], np.array([], dtype=np.int64))
    commit(cc, 1, 4, e, ops_4)
    target = tmp_path / "c-read"
    rhino.ReplicaStore(str(c.dir)).restore(OP, 1, 4, str(target)).close()
    cfs = read_rocksdb(target)
    assert {k: v for n, cf in cfs.items() if n.startswith("vnode-") for k, v in cf.items()} == owned(after_3, MOVED)

    # Batch 4 runs again: the target rolls back to checkpoint 3, taken before the merge, so the
    # vnodes are on their base again, read through as before, and merged again.
    with cc.session(OP, 1, batch=4, epoch=e) as s:
        assert s.rolled_back
        assert dict(s.scan(page_size=300)) == owned(after_3, MOVED)
        s.abort()
    merged_by = time.monotonic() + 30
    while cc.status(OP, 1)["bases"]:
        assert time.monotonic() < merged_by, "the base was not merged again within 30 s"
        time.sleep(0.05)
    # Merged, the target needs its base no more: with both of the base's workers gone it
    # reads every key itself.
    ca.close()
    a.kill()
    b.kill()
    scanned, looked_up = read(cc, 1, 4, e)
    assert scanned == owned(after_3, MOVED) and looked_up == owned(after_3, MOVED)
    cc.close()


def test_the_base_outlives_retention_on_every_worker_that_held_it(retiring_workers) -> None:
    """The origin goes on committing, and its workers keep only their newest two checkpoints;
    the base's checkpoint stays on both while the target's copy has not merged it (the
    target holds it there, service/checkpoint_holds.h), so its chain member still serves it
    when the origin's primary is SIGKILLed."""
    a, b, c = retiring_workers
    ca, cc = (rhino.connect(w.unix_socket, secret=SECRET) for w in (a, c))
    rng = np.random.default_rng(50)
    e, state = move_on_base(ca, cc, a, b, rng)
    at_barrier = owned(state, MOVED)
    time.sleep(1.0)  # the target's copier holds the base on A and B at once
    rest = [v for v in range(V) if v not in MOVED]
    for batch in range(3, 9):
        write_batch(ca, 0, batch, e, state, rest, rng)
    time.sleep(1.0)  # several retention passes
    for w in (a, b):
        kept = rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 0)
        assert 2 in kept, (w.id, kept)  # held
        assert 0 not in kept and 1 not in kept and 8 in kept, (w.id, kept)  # retention ran: older ones went
    a.kill()
    ca.close()
    scanned, looked_up = read(cc, 1, 3, e)
    assert scanned == at_barrier and looked_up == at_barrier
    cc.close()
