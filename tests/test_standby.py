"""Standby directories: a replica's newest checkpoint, ready to be renamed into place by a takeover.

ReplicaStore.refresh_standby keeps standby/<op>/<instance>/db equal to the instance's newest
checkpoint by the difference from what it held; restore_files(take_standby=True) renames it
into place when it holds exactly the checkpoint asked for, and builds the directory as before
otherwise. Facts are checked independently: inodes with os.stat, contents with rocksdict
against a dict model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import rhino
from helpers import expected_column_families, held_keys, key_bytes, same_inode

OP = "op"


def _partitioner() -> rhino.Partitioner:
    return rhino.Partitioner(num_key_groups=1 << 10, num_vnodes=8, seed=5)


def _write(db: rhino.StateBackend, model: dict[bytes, bytes], rng: np.random.Generator, n: int, start: int) -> None:
    keys = np.array(held_keys(db.partitioner, set(db.vnodes), n, start=start), dtype=np.int64)
    values = [rng.bytes(int(rng.integers(20, 200))) for _ in keys]
    db.put_batch(keys, values)
    model.update({key_bytes(int(k)): v for k, v in zip(keys, values)})


@pytest.fixture
def live(tmp_path: Path):
    """A live state that flushes SSTs at every checkpoint, its model, and an rng."""
    db = rhino.StateBackend.open(str(tmp_path / "live"), partitioner=_partitioner(), operator_id=OP, instance=0,
                                 checkpoint_wal_bytes=0)
    yield db, {}, np.random.default_rng(3)
    db.close()


def _standby(store: rhino.ReplicaStore) -> tuple[Path, Path]:
    root = Path(store.path) / "standby" / OP / "0"
    return root / "db", root / "checkpoint"


def _assert_state(read_rocksdb, path: Path, model: dict[bytes, bytes]) -> None:
    want = expected_column_families(model, _partitioner(), range(8))
    got = read_rocksdb(path)
    assert {n: kv for n, kv in got.items() if n != "default"} == {n: kv for n, kv in want.items() if n != "default"}


def test_refresh_links_the_newest_checkpoint_and_a_restore_renames_it(tmp_path, store, live, read_rocksdb):
    db, model, rng = live
    _write(db, model, rng, 3000, 0)
    m = db.checkpoint(store, 1)
    assert store.refresh_standby(OP, 0) is True
    assert store.refresh_standby(OP, 0) is False  # already there
    sdb, marker = _standby(store)
    assert marker.read_text().strip() == "1"
    assert sorted(os.listdir(sdb)) == sorted(f.name for f in m.files)
    for f in m.files:
        pooled = store.pool_path(f.identity)
        # SSTs are the pooled files themselves; RocksDB's mutable files are private copies
        assert same_inode(sdb / f.name, pooled) == f.name.endswith(".sst"), f.name
        assert (sdb / f.name).read_bytes() == Path(pooled).read_bytes()
    inodes = {n: os.stat(sdb / n).st_ino for n in os.listdir(sdb)}

    target = tmp_path / "taken"
    st = store.restore_files(OP, 0, 1, str(target), take_standby=True)
    assert st.from_standby is True
    assert st.files == len(m.files) and st.linked_files == sum(f.name.endswith(".sst") for f in m.files)
    assert {n: os.stat(target / n).st_ino for n in os.listdir(target)} == inodes  # renamed, not rebuilt
    assert not sdb.exists() and not marker.exists()
    db.close()
    _assert_state(read_rocksdb, target, model)


def test_refresh_follows_checkpoints_by_their_difference(tmp_path, store, live, read_rocksdb):
    db, model, rng = live
    _write(db, model, rng, 3000, 0)
    m1 = db.checkpoint(store, 1)
    store.refresh_standby(OP, 0)
    sdb, marker = _standby(store)
    before = {n: os.stat(sdb / n).st_ino for n in os.listdir(sdb)}
    _write(db, model, rng, 2000, 5000)
    db.compact()  # replaces SSTs: some files of checkpoint 1 are gone from checkpoint 2
    m2 = db.checkpoint(store, 2)
    assert store.refresh_standby(OP, 0) is True
    assert marker.read_text().strip() == "2"
    assert sorted(os.listdir(sdb)) == sorted(f.name for f in m2.files)
    both = {f.name for f in m1.files if f.name.endswith(".sst")} & {f.name for f in m2.files}
    for name in both:  # an SST both checkpoints share stays the same link
        assert os.stat(sdb / name).st_ino == before[name]
    for f in m2.files:
        assert (sdb / f.name).read_bytes() == Path(store.pool_path(f.identity)).read_bytes()
    db.close()
    target = tmp_path / "taken"
    assert store.restore_files(OP, 0, 2, str(target), take_standby=True).from_standby
    _assert_state(read_rocksdb, target, model)


def test_a_standby_of_another_checkpoint_is_left_and_the_directory_built(tmp_path, store, live, read_rocksdb):
    db, model, rng = live
    _write(db, model, rng, 2000, 0)
    db.checkpoint(store, 1)
    at_1 = dict(model)
    _write(db, model, rng, 2000, 5000)
    db.checkpoint(store, 2)
    store.refresh_standby(OP, 0)
    db.close()
    target = tmp_path / "at-1"
    st = store.restore_files(OP, 0, 1, str(target), take_standby=True)
    assert st.from_standby is False and st.linked_files > 0
    assert _standby(store)[1].read_text().strip() == "2"  # kept for a takeover of checkpoint 2
    _assert_state(read_rocksdb, target, at_1)
    # Without take_standby (a user's restore, a rebuild) it is never used.
    assert store.restore_files(OP, 0, 2, str(tmp_path / "at-2"), take_standby=False).from_standby is False
    _assert_state(read_rocksdb, tmp_path / "at-2", model)


@pytest.mark.parametrize("damage", ["truncated", "replaced", "extra", "missing", "no-marker"])
def test_a_damaged_standby_is_never_used(tmp_path, store, live, read_rocksdb, damage):
    db, model, rng = live
    _write(db, model, rng, 3000, 0)
    m = db.checkpoint(store, 1)
    db.close()
    store.refresh_standby(OP, 0)
    sdb, marker = _standby(store)
    sst = next(f.name for f in m.files if f.name.endswith(".sst"))
    if damage == "truncated":
        name = next(f.name for f in m.files if f.name.startswith("MANIFEST"))
        os.truncate(sdb / name, os.path.getsize(sdb / name) - 1)
    elif damage == "replaced":  # same bytes, but not the pooled file: a link that was broken
        shutil.copyfile(sdb / sst, tmp_path / "copy")
        os.replace(tmp_path / "copy", sdb / sst)
    elif damage == "extra":
        (sdb / "999999.sst").write_bytes(b"x")
    elif damage == "missing":
        os.unlink(sdb / sst)
    else:  # a refresh that died part-way: it removes the marker first
        marker.unlink()
    target = tmp_path / "taken"
    st = store.restore_files(OP, 0, 1, str(target), take_standby=True)
    assert st.from_standby is False and st.files == len(m.files)
    _assert_state(read_rocksdb, target, model)
    if damage != "no-marker":
        assert not sdb.exists(), "a standby that does not match its checkpoint is removed"
    assert store.refresh_standby(OP, 0) is True  # and rebuilt by the next refresh
    assert sorted(os.listdir(sdb)) == sorted(f.name for f in m.files)
    assert store.restore_files(OP, 0, 1, str(tmp_path / "again"), take_standby=True).from_standby


def test_gc_drops_a_standby_that_is_not_of_the_newest_checkpoint(tmp_path, store, live):
    db, model, rng = live
    _write(db, model, rng, 3000, 0)
    m1 = db.checkpoint(store, 1)
    store.refresh_standby(OP, 0)
    assert store.gc()["standbys_removed"] == 0
    _write(db, model, rng, 3000, 5000)
    db.compact()
    db.checkpoint(store, 2)  # no refresh: the standby is of checkpoint 1
    store.retain(OP, 0, 1)
    g = store.gc()
    assert g["standbys_removed"] == 1 and not _standby(store)[0].parent.exists()
    # Nothing of checkpoint 1 outlives its pool entry through a standby link.
    for f in m1.files:
        assert not os.path.exists(store.pool_path(f.identity)) or f.identity in {
            x.identity for x in store.manifest(OP, 0, 2).files}


def test_refresh_of_an_instance_without_checkpoints_removes_its_standby(store, live):
    db, model, rng = live
    _write(db, model, rng, 500, 0)
    db.checkpoint(store, 1)
    store.refresh_standby(OP, 0)
    assert _standby(store)[0].exists()
    store.retain(OP, 0, 0)
    assert store.refresh_standby(OP, 0) is False
    assert not _standby(store)[0].parent.exists()
    with pytest.raises(rhino.PathOutsideStoreError):
        store.refresh_standby("../x", 0)


def test_refreshes_and_gc_at_once_never_deadlock(store, live):
    """A refresh and GC take the store's lock and the instance's mutex in the same order."""
    import threading

    db, model, rng = live
    _write(db, model, rng, 500, 0)
    db.checkpoint(store, 1)
    marker = _standby(store)[1]
    stop = threading.Event()
    errors: list[BaseException] = []

    def refresh() -> None:
        try:
            for _ in range(300):
                marker.unlink(missing_ok=True)  # stale: GC takes the instance's mutex to drop it
                store.refresh_standby(OP, 0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            stop.set()

    def gc() -> None:
        try:
            while not stop.is_set():
                store.gc()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=refresh, daemon=True), threading.Thread(target=gc, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "deadlock: a refresh and GC wait for each other"
    assert not errors, errors
