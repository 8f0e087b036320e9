"""Checkpoints, the replica store's file pool, and restore by hard links (issue 2 Build 5-6).

Facts are checked independently of Rhino: inodes with os.stat, contents with
rocksdict (its own RocksDB build) against a Python dict model, manifests by
parsing their JSON ourselves.

These tests are about the SST files of a checkpoint, so their state flushes at
every checkpoint (``checkpoint_wal_bytes=0``); checkpoints that carry the
write-ahead log instead are tested in test_wal_checkpoints.py.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

import rhino
from helpers import (
    cf_name,
    expected_column_families,
    flip_byte,
    held_keys,
    key_bytes,
    same_inode,
    split_by_vnode,
    sst_files,
    truncate_file,
)

OP = "op"
K, V = 1 << 10, 8


def _partitioner(v: int = V, k: int = K) -> rhino.Partitioner:
    return rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=17)


def _fill(db: rhino.StateBackend, model: dict[bytes, bytes], rng: np.random.Generator, n: int, start: int = 0) -> None:
    """Writes n int keys (batch), some bytes and str keys (single), and deletes a few; mirrors it in `model`."""
    held = set(db.vnodes)
    p = db.partitioner
    ints = np.array(held_keys(p, held, n, start=start), dtype=np.int64)
    values = [rng.bytes(int(rng.integers(1, 300))) for _ in range(len(ints))]
    db.put_batch(ints, values)
    model.update({key_bytes(int(k)): v for k, v in zip(ints, values)})
    for i in range(50):
        for key in (f"user-{start}-{i}", f"user-{start}-{i}".encode() + b"\x00\xff"):
            if p.vnode(key) in held:
                val = rng.bytes(40)
                db.put(key, val)
                model[key_bytes(key)] = val
    doomed = ints[: n // 20]
    db.delete_batch(doomed)
    for k in doomed.tolist():
        model.pop(key_bytes(k), None)
    db.delete(int(ints[-1]))
    model.pop(key_bytes(int(ints[-1])), None)


def _make_state(path: Path, n: int = 4000, seed: int = 0, vnodes=None, partitioner=None, instance: int = 0,
                operator_id: str = OP):
    p = partitioner or _partitioner()
    db = rhino.StateBackend.open(str(path), partitioner=p, operator_id=operator_id, instance=instance, vnodes=vnodes,
                                 checkpoint_wal_bytes=0)
    model: dict[bytes, bytes] = {}
    _fill(db, model, np.random.default_rng(seed), n)
    return db, model


def _assert_matches_model(contents: dict[str, dict[bytes, bytes]], model, partitioner, vnodes) -> None:
    """`contents` is what rocksdict read; it must be exactly the model, routed by the oracle."""
    assert set(contents) == {"default"} | {cf_name(v) for v in vnodes}
    assert all(k.startswith(b"rhino:") for k in contents["default"]), "default CF holds only Rhino metadata"
    want = expected_column_families(model, partitioner, vnodes)
    for name, kv in want.items():
        assert contents[name] == kv, f"column family {name} differs from the model"
    # No key of the model is missing or routed to a vnode the DB does not hold.
    assert sum(len(kv) for name, kv in contents.items() if name != "default") == len(model)


def _manifest_path(store_dir: Path, op: str, inst: int, cid: int) -> Path:
    return store_dir / "checkpoints" / op / str(inst) / f"{cid:020d}.manifest"


def _parse_manifest(path: Path) -> dict:
    """The manifest's JSON line, parsed by us (format: JSON line + 'xxh3:<hex>' trailer)."""
    return json.loads(path.read_bytes().split(b"\n", 1)[0])


# ---------------------------------------------------------------- real hard links


def test_restore_hard_links_immutable_files_and_copies_mutable_ones(tmp_path, store):
    db, _model = _make_state(tmp_path / "live")
    m = db.checkpoint(store, 1)
    db.close()
    target = tmp_path / "restored"
    stats = store.restore_files(OP, 0, 1, str(target))
    names = sorted(os.listdir(target))
    assert names == sorted(f.name for f in m.files), "the restored directory holds exactly the manifest's files"
    ssts = [f for f in m.files if f.name.endswith(".sst")]
    others = [f for f in m.files if not f.name.endswith(".sst")]
    assert ssts, "a checkpoint of a non-empty state has SST files"
    assert {"CURRENT"} <= {f.name for f in others}
    assert any(f.name.startswith("MANIFEST-") for f in others)
    for f in m.files:
        restored, pooled = target / f.name, Path(store.pool_path(f.identity))
        assert os.path.getsize(restored) == f.size == os.path.getsize(pooled)
        if f.name.endswith(".sst"):
            assert same_inode(restored, pooled), f"{f.name} is not a hard link to its pooled file"
            assert os.stat(pooled).st_nlink >= 2
        else:
            assert not same_inode(restored, pooled), f"mutable file {f.name} must be a copy"
            assert restored.read_bytes() == pooled.read_bytes()
    assert stats.files == len(m.files)
    assert stats.linked_files == len(ssts)
    assert stats.copied_files == len(others)
    assert stats.copied_bytes == sum(os.path.getsize(target / f.name) for f in others)
    assert stats.total_bytes == sum(os.path.getsize(target / f.name) for f in m.files)
    assert stats.fell_back_to_copy is False


def test_restored_db_read_by_rocksdict_matches_model(tmp_path, store, read_rocksdb):
    p = _partitioner()
    db, model = _make_state(tmp_path / "live", partitioner=p)
    m = db.checkpoint(store, 1, epoch=3)
    assert (m.operator_id, m.instance, m.checkpoint_id, m.epoch, m.parent_id) == (OP, 0, 1, 3, None)
    assert (m.num_key_groups, m.num_vnodes, m.seed) == (K, V, 17)
    assert m.vnodes == list(range(V))
    db.close()
    # The live DB itself, read by rocksdict: the model is right before we test the restore.
    _assert_matches_model(read_rocksdb(tmp_path / "live"), model, p, range(V))

    target = tmp_path / "restored"
    r = store.restore(OP, 0, 1, str(target))
    # While Rhino has it open, the restored SST files are the pooled inodes.
    for f in m.files:
        if f.name.endswith(".sst"):
            assert same_inode(target / f.name, store.pool_path(f.identity))
    rs = r.restore_stats
    assert rs.linked_files == sum(f.name.endswith(".sst") for f in m.files)
    assert rs.copied_files == len(m.files) - rs.linked_files and not rs.fell_back_to_copy
    assert r.last_checkpoint == 1 and r.vnodes == list(range(V))
    assert (r.operator_id, r.instance) == (OP, 0)
    keys = list(model)
    assert r.get_batch(keys) == [model[k] for k in keys]
    r.close()
    _assert_matches_model(read_rocksdb(target), model, p, range(V))


def test_writes_to_a_restored_db_never_touch_the_pool(tmp_path, store, read_rocksdb):
    """Hard-linked SSTs are shared with the pool: compaction in the restored DB must leave the pool intact."""
    p = _partitioner()
    db, model = _make_state(tmp_path / "live", partitioner=p)
    db.checkpoint(store, 1)
    db.close()
    r = store.restore(OP, 0, 1, str(tmp_path / "r1"))
    rng = np.random.default_rng(9)
    for round_ in range(6):  # several flushes per vnode: L0 compactions run
        keys = np.array(held_keys(p, range(V), 500, start=10**6 * (round_ + 1)), dtype=np.int64)
        r.put_batch(keys, [rng.bytes(64) for _ in keys])
        r.flush()
    r.delete_batch(np.array(held_keys(p, range(V), 4000), dtype=np.int64))
    r.flush()
    r.close()
    report = store.verify(full=True)
    assert report.ok, report.problems
    store.restore_files(OP, 0, 1, str(tmp_path / "r2"))
    _assert_matches_model(read_rocksdb(tmp_path / "r2"), model, p, range(V))


def test_copy_mode_restores_same_contents_without_links(tmp_path, store, read_rocksdb):
    p = _partitioner()
    db, model = _make_state(tmp_path / "live", partitioner=p)
    m = db.checkpoint(store, 1)
    db.close()
    target = tmp_path / "copied"
    r = store.restore(OP, 0, 1, str(target), mode="copy")
    rs = r.restore_stats
    assert rs.linked_files == 0
    assert rs.copied_files == rs.files == len(m.files)
    assert rs.copied_bytes == rs.total_bytes == m.total_bytes
    assert rs.fell_back_to_copy is False  # copying was asked for, not a fallback
    for f in m.files:  # (RocksDB replaces MANIFEST/OPTIONS on open; the SSTs stay)
        if f.name.endswith(".sst"):
            assert not same_inode(target / f.name, store.pool_path(f.identity))
    r.close()
    _assert_matches_model(read_rocksdb(target), model, p, range(V))


def test_restore_across_filesystems_falls_back_to_copy(tmp_path, store, read_rocksdb):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("/dev/shm is not available")
    if os.stat(shm).st_dev == os.stat(store.path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the store")
    p = _partitioner()
    db, model = _make_state(tmp_path / "live", partitioner=p, n=1500)
    m = db.checkpoint(store, 1)
    db.close()
    base = shm / f"rhino-test-{uuid.uuid4().hex}"
    try:
        r = store.restore(OP, 0, 1, str(base / "restored"))
        rs = r.restore_stats
        assert rs.fell_back_to_copy is True
        assert rs.linked_files == 0 and rs.copied_files == len(m.files)
        for f in m.files:
            if f.name.endswith(".sst"):
                assert os.stat(base / "restored" / f.name).st_dev != os.stat(store.pool_path(f.identity)).st_dev
        r.close()
        _assert_matches_model(read_rocksdb(base / "restored"), model, p, range(V))
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------- incremental checkpoints


def test_incremental_delta_is_the_new_sst_bytes(tmp_path, store, read_rocksdb):
    k, v, n, width = 1 << 12, 32, 200_000, 128
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v)
    live = tmp_path / "live"
    # A memtable budget well above the state, so that only checkpoints flush: then no column
    # family reaches RocksDB's L0 compaction trigger, and no compaction races our snapshots.
    db = rhino.StateBackend.open(str(live), partitioner=p, write_buffer_budget=512 << 20, checkpoint_wal_bytes=0)
    rng = np.random.default_rng(2024)
    keys = np.arange(n, dtype=np.int64)
    values = rng.integers(0, 256, size=(n, width), dtype=np.uint8)  # incompressible
    for i in range(0, n, 50_000):
        db.put_batch(keys[i : i + 50_000], values[i : i + 50_000])
    m1 = db.checkpoint(store, 1)
    assert m1.parent_id is None
    assert m1.delta_bytes == m1.total_bytes and all(f.in_delta for f in m1.files)
    assert m1.total_bytes > 20 << 20, "the state is tens of MB"

    # Update ~3% of the keys.
    updated = rng.choice(n, size=n * 3 // 100, replace=False)
    values[updated] = rng.integers(0, 256, size=(len(updated), width), dtype=np.uint8)
    before = sst_files(live)
    assert len(before) == v + 1, "one SST per column family (V vnodes + default): only the checkpoint flushed"
    db.put_batch(keys[updated], values[updated])
    m2 = db.checkpoint(store, 2)
    after = sst_files(live)

    # Independently: SST files that are new in the live DB since checkpoint 1 (new name or new inode).
    new = {name_ino: size for name_ino, size in after.items() if name_ino not in before}
    new_bytes = sum(new.values())
    assert new, "the checkpoint flushed the updates into new SST files"
    assert m2.parent_id == 1
    delta_ssts = {f.name: f.size for f in m2.files if f.in_delta and f.name.endswith(".sst")}
    assert delta_ssts == {name: size for (name, _ino), size in new.items()}
    assert new_bytes <= m2.delta_bytes <= new_bytes + (1 << 20)
    assert m2.delta_bytes < 0.25 * m2.total_bytes
    assert m2.delta_files == sum(f.in_delta for f in m2.files)

    # The delta is exactly the files whose content identity the parent does not have.
    parent_ids = {f.identity for f in m1.files}
    for f in m2.files:
        assert f.in_delta == (f.identity not in parent_ids), f.name
    # ... and the manifests on disk say the same (parsed by us, not by Rhino).
    j1 = _parse_manifest(_manifest_path(Path(store.path), OP, 0, 1))
    j2 = _parse_manifest(_manifest_path(Path(store.path), OP, 0, 2))
    assert j2["parent_id"] == 1
    on_disk_parent = {f["identity"] for f in j1["files"]}
    assert {f["identity"] for f in j2["files"] if f["in_delta"]}.isdisjoint(on_disk_parent)
    assert {f["identity"] for f in j2["files"] if not f["in_delta"]} <= on_disk_parent
    # Unchanged SSTs are the parent's pooled files (same identity and size), present in the live DB.
    for f in m2.files:
        if f.name.endswith(".sst") and not f.in_delta:
            assert any(name == f.name for name, _ in after)
            assert os.path.getsize(store.pool_path(f.identity)) == f.size

    db.close()
    store.restore_files(OP, 0, 2, str(tmp_path / "r2"))
    contents = read_rocksdb(tmp_path / "r2")
    got = {}
    for name, kv in contents.items():
        if name != "default":
            got.update(kv)
    assert len(got) == n
    want = {key_bytes(int(x)): values[x].tobytes() for x in range(n)}
    assert got == want


@pytest.mark.parametrize("mode", ["link", "copy"])
def test_restored_db_takes_a_small_next_checkpoint(tmp_path, store, read_rocksdb, mode):
    p = _partitioner()
    db, model = _make_state(tmp_path / "live", partitioner=p, n=6000)
    m1 = db.checkpoint(store, 1)
    db.close()
    target = tmp_path / "restored"
    r = store.restore(OP, 0, 1, str(target), mode=mode)
    assert r.last_checkpoint == 1
    if mode == "link":  # the precondition of the inode shortcut: restored SSTs are pooled inodes
        for f in m1.files:
            if f.name.endswith(".sst"):
                assert same_inode(target / f.name, store.pool_path(f.identity))
    # A few updates, then checkpoint 2 from the restored DB.
    rng = np.random.default_rng(3)
    some = [k for k in model if len(k) == 8][:40]
    vals = [rng.bytes(20) for _ in some]
    r.put_batch(some, vals)
    model.update(zip(some, vals))
    m2 = r.checkpoint(store, 2)
    assert m2.parent_id == 1
    assert m2.delta_bytes < 0.1 * m2.total_bytes
    # Every SST of checkpoint 1 is still there, not in the delta (content identity, not file names).
    m1_ssts = {(f.name, f.identity) for f in m1.files if f.name.endswith(".sst")}
    m2_old = {(f.name, f.identity) for f in m2.files if f.name.endswith(".sst") and not f.in_delta}
    assert m1_ssts <= m2_old
    # At most one new SST per column family flushed (V vnodes + the default one holding the metadata).
    assert sum(f.in_delta for f in m2.files if f.name.endswith(".sst")) <= V + 1
    r.close()
    store.restore_files(OP, 0, 2, str(tmp_path / "r2"))
    _assert_matches_model(read_rocksdb(tmp_path / "r2"), model, p, range(V))


def test_version_and_checkpoint_ids_travel_with_the_state(tmp_path, store):
    p = _partitioner()
    db, model = _make_state(tmp_path / "live", partitioner=p, n=500)
    key = next(iter(model))
    db.put_batch([key], [b"batch-5"], version=5)
    assert db.version == 5
    m1 = db.checkpoint(store, 10)
    assert m1.version == 5
    db.put_batch([key], [b"batch-6"], version=6)
    m2 = db.checkpoint(store, 11)
    assert (m2.version, m2.parent_id) == (6, 10)
    assert store.checkpoints(OP, 0) == [10, 11]
    assert (OP, 0) in [tuple(x) for x in store.instances()]
    db.close()
    r = store.restore(OP, 0, 10, str(tmp_path / "r10"))
    assert (r.version, r.last_checkpoint, r.get(key)) == (5, 10, b"batch-5")
    r.close()


# ---------------------------------------------------------------- retention and garbage collection


def test_retain_and_gc_remove_exactly_unreferenced_pool_files(tmp_path, store, read_rocksdb):
    p = _partitioner(v=4)
    db, model = _make_state(tmp_path / "live", partitioner=p, n=3000)
    rng = np.random.default_rng(1)
    for cid in range(1, 7):
        if cid > 1:  # overwrite and delete a lot, so that compaction retires old SSTs
            _fill(db, model, rng, 3000, start=0)
        db.checkpoint(store, cid)
    # Another instance in the same store: GC must keep its files too.
    other, other_model = _make_state(tmp_path / "other", partitioner=p, n=800, seed=5, instance=1)
    other.checkpoint(store, 1)
    other.close()

    pool = Path(store.path) / "pool"
    pool_before = {f: os.path.getsize(pool / f) for f in os.listdir(pool)}
    assert store.retain(OP, 0, keep_last=10) == []  # fewer than 10: nothing to do
    assert store.retain(OP, 0, keep_last=1) == [1, 2, 3, 4, 5]
    assert store.checkpoints(OP, 0) == [6]
    assert not _manifest_path(Path(store.path), OP, 0, 5).exists()

    referenced = {f["identity"] for f in _parse_manifest(_manifest_path(Path(store.path), OP, 0, 6))["files"]}
    referenced |= {f["identity"] for f in _parse_manifest(_manifest_path(Path(store.path), OP, 1, 1))["files"]}
    unreferenced = set(pool_before) - referenced
    assert unreferenced, "older checkpoints had files the newest one no longer needs"
    assert referenced <= set(pool_before)

    stats = store.gc()
    assert stats["files_removed"] == len(unreferenced)
    assert stats["bytes_removed"] == sum(pool_before[f] for f in unreferenced)
    assert set(os.listdir(pool)) == referenced
    assert store.gc()["files_removed"] == 0

    assert store.verify(full=True).ok
    with pytest.raises(rhino.NotFoundError):
        store.restore_files(OP, 0, 5, str(tmp_path / "gone"))
    store.restore_files(OP, 0, 6, str(tmp_path / "r6"))
    _assert_matches_model(read_rocksdb(tmp_path / "r6"), model, p, range(4))
    store.restore_files(OP, 1, 1, str(tmp_path / "other-r1"))
    _assert_matches_model(read_rocksdb(tmp_path / "other-r1"), other_model, p, range(4))

    # The live DB is unharmed by GC (its SSTs were hard links, not the only copies) and checkpoints on.
    _fill(db, model, rng, 200, start=50_000)
    m7 = db.checkpoint(store, 7)
    assert m7.parent_id == 6
    db.close()
    store.restore_files(OP, 0, 7, str(tmp_path / "r7"))
    _assert_matches_model(read_rocksdb(tmp_path / "r7"), model, p, range(4))


# ---------------------------------------------------------------- verify


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_verify_names_the_damaged_file(tmp_path, store, damage):
    db, _ = _make_state(tmp_path / "live", n=3000)
    m = db.checkpoint(store, 1)
    db.close()  # pooled files share inodes with the live DB's SSTs
    report = store.verify(full=True)
    assert report.ok and report.checkpoints == 1 and report.files_checked == len(m.files)
    assert report.bytes_checked == m.total_bytes

    victim = max((f for f in m.files if f.name.endswith(".sst")), key=lambda f: f.size)
    path = store.pool_path(victim.identity)
    if damage == "flip":
        flip_byte(path, victim.size // 2)
    elif damage == "truncate":
        truncate_file(path, 100)
    else:
        os.unlink(path)

    report = store.verify(full=True)
    assert not report.ok and not bool(report)
    assert [(x.operator_id, x.instance, x.checkpoint_id, x.file) for x in report.problems] == [
        (OP, 0, 1, victim.name)
    ]
    assert report.problems[0].detail
    scoped = store.verify(operator_id=OP, instance=0, full=True)
    assert [x.file for x in scoped.problems] == [victim.name]
    quick = store.verify(full=False)
    if damage == "flip":  # a size check cannot see a flipped byte; that is what full=True is for
        assert quick.ok
    else:
        assert [x.file for x in quick.problems] == [victim.name]


# ---------------------------------------------------------------- vnode export / import


def test_export_import_moves_exactly_those_vnodes(tmp_path, store, read_rocksdb):
    p = _partitioner()
    a, model_a = _make_state(tmp_path / "a", partitioner=p, vnodes=[0, 1, 2, 3], n=4000)
    b, model_b = _make_state(tmp_path / "b", partitioner=p, vnodes=[4, 5, 6, 7], n=2000, seed=1, instance=1)
    a.flush()
    moving = [1, 2]
    by_vnode = split_by_vnode(model_a, p)
    assert all(by_vnode.get(v) for v in moving)

    export = tmp_path / "export"
    a.export_vnodes(moving, str(export))
    exported = {}
    for root, _dirs, files in os.walk(export):
        for f in files:
            if f.endswith(".sst"):
                exported[f] = os.stat(os.path.join(root, f)).st_ino
    live_inodes = {ino for (_n, ino) in sst_files(tmp_path / "a")}
    assert exported and set(exported.values()) <= live_inodes, "an export is hard links to the live SSTs"
    assert a.vnodes == [0, 1, 2, 3], "exporting does not remove anything"

    assert b.import_vnodes(str(export)) == moving
    assert not export.exists(), "the import consumes the export"
    assert b.vnodes == [1, 2, 4, 5, 6, 7]
    b_inodes = {ino for (_n, ino) in sst_files(tmp_path / "b")}
    assert set(exported.values()) <= b_inodes, "imported files are hard links, not copies"
    for v in moving:
        assert dict(b.scan(v)) == by_vnode[v]

    a.drop_vnodes(moving)
    assert a.vnodes == [0, 3]
    for v in (0, 3):
        assert dict(a.scan(v)) == by_vnode.get(v, {})
    for v in moving:
        with pytest.raises(rhino.UnknownVnodeError):
            a.scan(v)

    # The moved data is B's now: it takes writes and checkpoints like its own.
    k = held_keys(p, [1], 1, start=10**9)[0]
    b.put(k, b"after-handover")
    moved_model = {key: val for v in moving for key, val in by_vnode[v].items()}
    expect_b = {**model_b, **moved_model, key_bytes(k): b"after-handover"}
    b.checkpoint(store, 1)
    b.close()
    a.close()
    store.restore_files(OP, 1, 1, str(tmp_path / "b-restored"))
    _assert_matches_model(read_rocksdb(tmp_path / "b-restored"), expect_b, p, [1, 2, 4, 5, 6, 7])
    expect_a = {key: val for v in (0, 3) for key, val in by_vnode.get(v, {}).items()}
    _assert_matches_model(read_rocksdb(tmp_path / "a"), expect_a, p, [0, 3])
