"""Checkpoints that copy the write-ahead log instead of flushing every vnode.

A checkpoint whose WAL holds less than ``checkpoint_wal_bytes`` hard-links the
SST files it has and copies the WAL; a restore replays it. Oracles: a Python
dict of everything written, rocksdict (its own RocksDB build) reading each
restored checkpoint, and the file names in each checkpoint's manifest.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import rhino

from helpers import key_bytes

OP = "op"


def _delta_kinds(store: rhino.ReplicaStore, cid: int) -> set[str]:
    """The kinds of file new in checkpoint `cid`: 'sst', 'log', 'MANIFEST', ..."""
    m = store.manifest(OP, 0, cid)
    return {f.name.rsplit(".", 1)[-1] if "." in f.name else f.name.split("-")[0] for f in m.files if f.in_delta}


def _restored_contents(store, tmp_path, read_rocksdb, cid: int) -> dict[bytes, bytes]:
    target = tmp_path / f"restored-{cid}"
    store.restore_files(OP, 0, cid, str(target))
    contents = read_rocksdb(target)
    return {k: v for name, kv in contents.items() if name != "default" for k, v in kv.items()}


def _write(db, rng, model, n: int, width: int = 64) -> None:
    keys = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    values = rng.integers(0, 256, (n, width), dtype=np.uint8)
    db.put_batch(keys, values)
    model.update({key_bytes(int(k)): v.tobytes() for k, v in zip(keys, values)})


def test_small_checkpoints_carry_the_wal_and_restore_exactly(tmp_path, store, read_rocksdb):
    p = rhino.Partitioner(num_vnodes=32)
    db = rhino.StateBackend.open(str(tmp_path / "db"), partitioner=p, checkpoint_wal_bytes=1 << 20)
    rng = np.random.default_rng(1)
    model: dict[bytes, bytes] = {}
    try:
        for cid in range(1, 6):  # ~10 KiB of WAL each: far below the bound
            _write(db, rng, model, 100)
            db.checkpoint(store, cid)
            kinds = _delta_kinds(store, cid)
            assert "log" in kinds and "sst" not in kinds, f"checkpoint {cid} flushed: its delta is {kinds}"
            assert _restored_contents(store, tmp_path, read_rocksdb, cid) == model, f"checkpoint {cid} differs"
        # Past the bound, the checkpoint flushes: the delta is SST files.
        _write(db, rng, model, 20_000, width=128)  # ~3 MB of WAL
        db.checkpoint(store, 6)
        assert "sst" in _delta_kinds(store, 6)
        assert _restored_contents(store, tmp_path, read_rocksdb, 6) == model
        wal = sum(f.size for f in store.manifest(OP, 0, 6).files if f.name.endswith(".log"))
        assert wal < 64 << 10, f"the flushed checkpoint still carries {wal} bytes of WAL"
    finally:
        db.close()


def test_zero_flushes_at_every_checkpoint(tmp_path, store, read_rocksdb):
    db = rhino.StateBackend.open(str(tmp_path / "db"), partitioner=rhino.Partitioner(num_vnodes=8),
                                 checkpoint_wal_bytes=0)
    rng = np.random.default_rng(2)
    model: dict[bytes, bytes] = {}
    try:
        for cid in (1, 2):
            _write(db, rng, model, 50)
            db.checkpoint(store, cid)
            assert "sst" in _delta_kinds(store, cid)
            assert _restored_contents(store, tmp_path, read_rocksdb, cid) == model
    finally:
        db.close()


@pytest.mark.parametrize("mode", ["link", "copy"])
def test_a_restored_wal_checkpoint_goes_on_and_leaves_the_pool_intact(tmp_path, store, read_rocksdb, mode):
    # The restored DB replays the copied WAL and keeps writing: the next
    # checkpoints (from the restored DB) hold everything, and no pooled file
    # changed under the restore (a full verify re-hashes every pooled file).
    p = rhino.Partitioner(num_vnodes=16)
    rng = np.random.default_rng(3)
    model: dict[bytes, bytes] = {}
    with rhino.StateBackend.open(str(tmp_path / "db"), partitioner=p) as db:
        for cid in (1, 2):
            _write(db, rng, model, 200)
            db.checkpoint(store, cid)
    assert "log" in _delta_kinds(store, 2)
    restored = store.restore(OP, 0, 2, str(tmp_path / f"r-{mode}"), mode=mode)
    try:
        got = {}
        for k in model:
            got[k] = restored.get(k)
        assert got == model
        for cid in (3, 4):
            _write(restored, rng, model, 200)
            restored.checkpoint(store, cid)
            assert _restored_contents(store, tmp_path, read_rocksdb, cid) == model
    finally:
        restored.close()
    report = store.verify(full=True)
    assert report.ok, [p.detail for p in report.problems]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_wal_fails_the_restore_instead_of_dropping_writes(tmp_path, store, damage):
    # RocksDB's default recovery would end the replay at a bad record and open
    # without the writes after it; a checkpoint's WAL must replay whole.
    with rhino.StateBackend.open(str(tmp_path / "db"), partitioner=rhino.Partitioner(num_vnodes=8)) as db:
        _write(db, np.random.default_rng(4), {}, 2000)
        db.checkpoint(store, 1)
    (wal,) = [f for f in store.manifest(OP, 0, 1).files if f.name.endswith(".log")]
    path = store.pool_path(wal.identity)
    os.chmod(path, 0o644)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    with open(path, "wb") as f:
        f.write(bytes(data))
    target = tmp_path / "r"
    with pytest.raises(rhino.CorruptionError):
        store.restore(OP, 0, 1, str(target), verify="size" if damage == "flip" else "full")
    assert not target.exists()
