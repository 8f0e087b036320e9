"""Takeover: the primitive of failover (docs/design.md §4, docs/protocol.md §7.1).

Worker A (w2) hosts instance i and replicates each commit to B (w3) and C (w4),
r = 2. A is SIGKILLed. B takes i over from its **own** replica of the last
complete checkpoint, by hard links, under epoch e+1, with the chain [C]. The
next batch's session runs on B and sees exactly the model's state; its commit
reaches C. Afterwards a session or an import at epoch e is refused everywhere.
The expected state comes from a dict model, and is also read with rocksdict
from the checkpoint C holds.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

OP = "q8"
N = 2000


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


@pytest.fixture
def workers(tmp_path: Path):
    secret_file = write_secret(tmp_path, SECRET)
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False).start()
          for n in (2, 3, 4)]
    yield ws
    for w in ws:
        if w.alive():
            w.stop()


def run_batch(client: rhino.Client, batch: int, epoch: int, model: dict[bytes, bytes], rng,
              value_bytes: int = 40) -> None:
    keys = rng.choice(N, size=300, replace=False).astype(np.int64)
    gone = rng.choice(N, size=30, replace=False).astype(np.int64)
    values = [rng.bytes(value_bytes) for _ in keys]
    with client.session(OP, 0, batch=batch, epoch=epoch) as s:
        assert s.version == (None if batch == 0 else batch - 1)
        s.put_batch(keys, values)
        s.delete_batch(gone)
        r = s.commit()  # barrier: the whole chain holds the checkpoint
        assert r.replication == "complete" and r.version == batch
    model.update({kb(k): v for k, v in zip(keys, values)})
    for k in gone:
        model.pop(kb(k), None)


def state_through(client: rhino.Client, batch: int, epoch: int) -> dict[bytes, bytes]:
    with client.session(OP, 0, batch=batch, epoch=epoch) as s:
        return dict(s.scan(page_size=500))


def test_takeover_after_sigkill(workers, tmp_path: Path) -> None:
    a, b, c = workers
    rng = np.random.default_rng(7)
    model: dict[bytes, bytes] = {}
    e = 3
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    ca.open_instance(OP, 0, epoch=e, num_vnodes=32, chain=[b.address, c.address], chain_version=1)
    # Batch 0 writes more than a checkpoint's WAL bound (256 KiB), so its
    # checkpoint flushes SSTs; batches 1-3 are small and ride in the WAL.
    for batch in range(4):
        run_batch(ca, batch, e, model, rng, value_bytes=4096 if batch == 0 else 40)
    last = 3
    for w in (b, c):  # r = 2: both hold the last complete checkpoint in their own stores
        assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 0)[-1] == last

    # After each commit a replica readies the newest checkpoint's directory
    # (replica_store.h, RefreshStandby), off its commit path: wait for B's.
    marker = Path(b.dir) / "standby" / OP / "0" / "checkpoint"
    deadline = time.monotonic() + 10
    while not (marker.exists() and marker.read_text().strip() == str(last)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.read_text().strip() == str(last)

    a.kill()  # SIGKILL: the host is gone
    ca.close()

    cb = rhino.connect(b.unix_socket, secret=SECRET)
    info = cb.takeover(OP, 0, epoch=e + 1, chain=[c.address], chain_version=2)
    assert info["checkpoint"] == last and info["version"] == last and info["epoch"] == e + 1
    # Built by hard links to B's own pool: every SST of the checkpoint is a
    # link; only RocksDB's small mutable files (MANIFEST, OPTIONS, the WAL of
    # batches 1-3, replayed when the DB opens) are copied.
    manifest = rhino.ReplicaStore(str(b.dir)).manifest(OP, 0, last)
    ssts = [f for f in manifest.files if f.name.endswith(".sst")]
    rs = info["restore"]
    assert ssts and rs["linked_files"] == len(ssts) and rs["files"] == len(manifest.files)
    assert rs["copied_files"] == len(manifest.files) - len(ssts)  # MANIFEST, CURRENT, OPTIONS, WAL
    # the takeover's time, in parts that add up to no more than the whole (protocol.md §7.1)
    parts = [rs[k] for k in ("lock_wait_s", "discard_s", "build_s", "open_s", "save_s")]
    assert all(p >= 0 for p in parts) and sum(parts) <= info["restore_s"] and info["queued_s"] >= 0
    # ... made ahead of time: the takeover renamed B's standby directory into place.
    assert rs["from_standby"] is True and not marker.exists()
    assert not (Path(b.dir) / "standby" / OP / "0" / "db").exists()
    assert any(f.name.endswith(".log") and f.size > 0 for f in manifest.files)
    # The open's own thread's figures (util/sched.h): it ran on the CPU (the WAL
    # replay alone needs some), and CPU time plus run-queue wait fit in its wall time.
    assert 0 < rs["open_cpu_s"] and rs["open_wait_s"] >= 0
    assert rs["open_cpu_s"] + rs["open_wait_s"] <= rs["open_s"] + 0.002

    # The next batch's session runs on B and sees the model's state at `last`.
    assert state_through(cb, last + 1, e + 1) == model
    run_batch(cb, last + 1, e + 1, model, rng)
    assert state_through(cb, last + 2, e + 1) == model

    # C got checkpoint last+1 from B; read it with rocksdict, independently of Rhino.
    cstore = rhino.ReplicaStore(str(c.dir))
    assert cstore.checkpoints(OP, 0)[-1] == last + 1
    target = tmp_path / "read-c"
    cstore.restore(OP, 0, last + 1, str(target)).close()
    cfs = read_rocksdb(target)
    assert {k: v for n, cf in cfs.items() if n.startswith("vnode-") for k, v in cf.items()} == model

    # Epoch e is refused everywhere afterwards (C learns e+1 the way the
    # coordinator will tell every worker: a fence).
    cc = rhino.connect(c.unix_socket, secret=SECRET)
    cc.fence(OP, 0, epoch=e + 1)
    for client in (cb, cc):
        with pytest.raises(rhino.StaleEpochError):
            client.session(OP, 0, batch=last + 2, epoch=e)
    with pytest.raises(rhino.StaleEpochError):
        cb.import_vnodes(OP, 0, epoch=e, from_operator=OP, from_instance=0, checkpoint=last, vnodes=[0])
    with pytest.raises(rhino.StaleEpochError):
        cc.open_instance(OP, 0, epoch=e, num_vnodes=32)
    with pytest.raises(rhino.StaleEpochError):
        cc.takeover(OP, 0, epoch=e)

    # A comes back: it still hosts i at epoch e (from its instance.json), until
    # it is fenced; then its stale sessions are refused too.
    a.start()
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    ca.fence(OP, 0, epoch=e + 1)
    with pytest.raises(rhino.StaleEpochError):
        ca.session(OP, 0, batch=last + 1, epoch=e)
    for client in (ca, cb, cc):
        client.close()


def test_import_and_move_vnodes(workers) -> None:
    """Vnodes move from a replica's checkpoint into a hosted instance, and between
    two instances on one worker; the moved keys read back, the others stay."""
    a, b, _ = workers
    rng = np.random.default_rng(11)
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    part = rhino.Partitioner(num_vnodes=8)
    ca.open_instance(OP, 0, epoch=1, num_vnodes=8, vnodes=range(0, 4), chain=[b.address], chain_version=1)
    keys = np.arange(N, dtype=np.int64)
    vn = part.vnodes(keys)
    mine = keys[vn < 4]
    values = {kb(k): rng.bytes(16) for k in mine}
    with ca.session(OP, 0, batch=0, epoch=1) as s:
        s.put_batch(mine, [values[kb(k)] for k in mine])
        s.commit()

    # On B: a new instance 1 of the same operator holds vnodes 4..7; it imports
    # vnodes 0 and 1 from B's replica of instance 0's checkpoint 0.
    cb = rhino.connect(b.unix_socket, secret=SECRET)
    cb.open_instance(OP, 1, epoch=1, num_vnodes=8, vnodes=range(4, 8))
    assert cb.import_vnodes(OP, 1, epoch=1, from_operator=OP, from_instance=0, checkpoint=0,
                            vnodes=[0, 1]) == [0, 1]
    moved = mine[np.isin(part.vnodes(mine), [0, 1])]
    with cb.session(OP, 1, batch=0, epoch=1) as s:
        assert s.get_batch(moved) == [values[kb(k)] for k in moved]
        with pytest.raises(rhino.UnknownVnodeError):
            s.get_batch(mine[part.vnodes(mine) == 2][:1])
    # An import into an instance with an open session waits for the batch boundary.
    s = cb.session(OP, 1, batch=0, epoch=1)
    with pytest.raises(rhino.SessionBusyError):
        cb.import_vnodes(OP, 1, epoch=1, from_operator=OP, from_instance=0, checkpoint=0, vnodes=[2])
    s.abort()

    # Between two hosted instances on A: vnode 3 moves from instance 0 to a new instance 2.
    ca.open_instance(OP, 2, epoch=1, num_vnodes=8, vnodes=[4])
    assert ca.move_vnodes(OP, 0, epoch=1, to_operator=OP, to_instance=2, to_epoch=1, vnodes=[3]) == [3]
    v3 = mine[part.vnodes(mine) == 3]
    with ca.session(OP, 2, batch=0, epoch=1) as s:
        assert s.get_batch(v3) == [values[kb(k)] for k in v3]
    with ca.session(OP, 0, batch=1, epoch=1) as s:
        with pytest.raises(rhino.UnknownVnodeError):
            s.get_batch(v3[:1])
        rest = mine[part.vnodes(mine) < 3]
        assert s.get_batch(rest) == [values[kb(k)] for k in rest]
    listed = {(i["operator_id"], i["instance"]): i["vnodes"] for i in ca.instances()}
    assert listed[(OP, 0)] == [0, 1, 2] and listed[(OP, 2)] == [3, 4]
    ca.close()
    cb.close()


def test_takeover_directory_damaged_by_a_crash_is_rebuilt(workers) -> None:
    """A takeover builds and opens its directory without one fsync (the checkpoint
    stays durable in the store; src/cpp/state/open_without_sync.h) and makes it
    durable afterwards. A host crash before that can leave the live DB damaged: the
    restarted worker then rebuilds it from the newest checkpoint of its store, and
    nothing committed is lost. The crash's lost writes are played by hand: B is
    SIGKILLed and its live DB's MANIFEST and CURRENT are cut to nothing."""
    a, b, c = workers
    rng = np.random.default_rng(11)
    model: dict[bytes, bytes] = {}
    e = 5
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    ca.open_instance(OP, 0, epoch=e, num_vnodes=32, chain=[b.address, c.address], chain_version=1)
    for batch in range(3):
        run_batch(ca, batch, e, model, rng, value_bytes=4096 if batch == 0 else 40)
    a.kill()
    ca.close()
    cb = rhino.connect(b.unix_socket, secret=SECRET)
    info = cb.takeover(OP, 0, epoch=e + 1, chain=[c.address], chain_version=2)
    assert info["checkpoint"] == 2
    run_batch(cb, 3, e + 1, model, rng)  # committed: checkpoint 3 in B's store and C's
    cb.close()
    b.kill()

    dbs = [p.parent for p in Path(b.dir).rglob("CURRENT") if "instances" in p.parts]
    assert len(dbs) == 1, dbs  # B's live DB of the instance
    for f in dbs[0].iterdir():
        if f.name == "CURRENT" or f.name.startswith("MANIFEST-"):
            f.write_bytes(b"")

    offset = b.log_path.stat().st_size
    b.start()
    log = b.log_path.read_bytes()[offset:].decode(errors="replace")
    assert "rebuilt from checkpoint 3" in log, log[-2000:]
    cb = rhino.connect(b.unix_socket, secret=SECRET)
    assert state_through(cb, 4, e + 1) == model  # the dict model, not Rhino's word
    run_batch(cb, 4, e + 1, model, rng)
    assert state_through(cb, 5, e + 1) == model
    cb.close()
