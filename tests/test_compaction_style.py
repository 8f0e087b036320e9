"""StateBackend's `compaction` option: leveled (the default) or universal compaction per vnode.

Oracles: a Python dict of everything written, read back by rocksdict (its own
RocksDB build), and rocksdict's listing of the live SST files.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.workload import build_state

from helpers import key_bytes, live_sst_files

VNODES = 4
OP = "op"


def _load(db: rhino.StateBackend, nbytes: int, value_size: int, seed: int = 0) -> dict[bytes, bytes]:
    """Loads `nbytes` of values through put_batch; returns the {key: value} model."""
    model: dict[bytes, bytes] = {}

    def record(_first, keys, values):
        for k, v in zip(keys.tolist(), values):
            model[key_bytes(k)] = v.tobytes()

    build_state(db, nbytes, value_size=value_size, batch_bytes=1 << 20, seed=seed, progress=False,
                on_batch=record)
    return model


def _assert_holds(contents: dict[str, dict[bytes, bytes]], model: dict[bytes, bytes]) -> None:
    got: dict[bytes, bytes] = {}
    for name, kv in contents.items():
        if name != "default":
            got.update(kv)
    assert len(got) == len(model)
    assert got == model


def _open(path: Path, compaction: str, **kw) -> rhino.StateBackend:
    return rhino.StateBackend.open(str(path), partitioner=rhino.Partitioner(num_vnodes=VNODES),
                                   write_buffer_budget=VNODES << 20, compaction=compaction, **kw)


def test_default_is_leveled(tmp_path):
    with rhino.StateBackend.open(str(tmp_path / "db")) as db:
        assert db.compaction == "level"


def test_universal_load_settles_and_stops_changing(tmp_path):
    # 1 MiB memtables over 4 vnodes: a 192 MiB load flushes each vnode ~48
    # times. Under universal compaction this used to leave vnodes at exactly
    # the trigger of four sorted runs, which RocksDB reports as pending
    # forever while picking nothing, and wait_for_compactions never returned
    # True.
    path = tmp_path / "db"
    db = _open(path, "universal")
    try:
        assert db.compaction == "universal"
        build_state(db, 192 << 20, progress=False)
        assert db.wait_for_compactions(60) is True
        settled = live_sst_files(path)
        time.sleep(0.5)
        assert live_sst_files(path) == settled  # no flush or compaction ran since
        # Universal compaction merged the ~48 flushes per vnode into a few sorted runs.
        assert len(settled) < 12 * (VNODES + 1)
        assert db.wait_for_compactions(0) is True
    finally:
        db.close()


def test_universal_state_holds_exactly_what_was_written(tmp_path, read_rocksdb):
    path = tmp_path / "db"
    db = _open(path, "universal")
    model = _load(db, 24 << 20, value_size=100)
    assert db.wait_for_compactions(60) is True
    db.close()
    _assert_holds(read_rocksdb(path), model)


@pytest.mark.parametrize("first,second", [("level", "universal"), ("universal", "level")])
def test_a_state_reopens_under_the_other_style(tmp_path, read_rocksdb, first, second):
    path = tmp_path / "db"
    db = _open(path, first)
    model = _load(db, 16 << 20, value_size=100, seed=1)
    db.wait_for_compactions(60)
    db.close()
    db = rhino.StateBackend.open(str(path), compaction=second, create=False)
    try:
        assert db.compaction == second
        # Write on through the other style's compactions, then check everything.
        model.update(_load(db, 16 << 20, value_size=100, seed=2))
        assert db.wait_for_compactions(60) is True
    finally:
        db.close()
    _assert_holds(read_rocksdb(path), model)


def test_restore_chooses_its_own_style(tmp_path, store, read_rocksdb):
    path = tmp_path / "db"
    db = _open(path, "level")
    model = _load(db, 8 << 20, value_size=100, seed=3)
    db.checkpoint(store, 1)
    db.close()
    restored = store.restore(OP, 0, 1, str(tmp_path / "restored"), compaction="universal")
    try:
        assert restored.compaction == "universal"
        keys = np.array([int.from_bytes(k, "little", signed=True) for k in list(model)[:1000]], dtype=np.int64)
        assert restored.get_batch(keys) == [model[key_bytes(int(k))] for k in keys]
    finally:
        restored.close()
    _assert_holds(read_rocksdb(tmp_path / "restored"), model)


@pytest.mark.parametrize("bad", ["leveled", "", "UNIVERSAL", "fifo"])
def test_unknown_style_raises_value_error(tmp_path, store, bad):
    with pytest.raises(ValueError, match="compaction must be 'level' or 'universal'"):
        rhino.StateBackend.open(str(tmp_path / "db"), compaction=bad)
    assert not (tmp_path / "db").exists()
    with pytest.raises(ValueError, match="compaction must be"):
        store.restore(OP, 0, 1, str(tmp_path / "restored"), compaction=bad)
    assert not (tmp_path / "restored").exists()


def test_wrong_type_raises_type_error(tmp_path):
    with pytest.raises(TypeError):
        rhino.StateBackend.open(str(tmp_path / "db"), compaction=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("origin,target", [("level", "universal"), ("universal", "level")])
def test_a_vnode_moves_between_styles(tmp_path, origin, target):
    # Export from one style, import into the other (a handover between
    # instances opened with different styles), then write on and compact.
    p = rhino.Partitioner(num_vnodes=VNODES)
    a = rhino.StateBackend.open(str(tmp_path / "a"), partitioner=p, vnodes=[0, 1], write_buffer_budget=2 << 20,
                                compaction=origin)
    b = rhino.StateBackend.open(str(tmp_path / "b"), partitioner=p, vnodes=[2, 3], instance=1, compaction=target)
    try:
        keys = np.arange(300_000, dtype=np.int64) * 7919
        keys = keys[p.vnodes(keys) == 1]
        rng = np.random.default_rng(5)
        model: dict[bytes, bytes] = {}
        for i in range(0, len(keys), 10_000):  # many small memtables: a multi-level LSM
            k, v = keys[i:i + 10_000], rng.integers(0, 256, (len(keys[i:i + 10_000]), 100), dtype=np.uint8)
            a.put_batch(k, v)
            model.update({key_bytes(int(x)): row.tobytes() for x, row in zip(k, v)})
        a.flush()
        assert a.wait_for_compactions(60) is True
        a.export_vnodes([1], str(tmp_path / "export"))
        assert b.import_vnodes(str(tmp_path / "export")) == [1]
        assert dict(b.scan(1)) == model
        overwritten = keys[::3]
        b.put_batch(overwritten, np.zeros((len(overwritten), 50), dtype=np.uint8))
        model.update({key_bytes(int(x)): bytes(50) for x in overwritten})
        b.flush()
        assert b.wait_for_compactions(60) is True
        assert dict(b.scan(1)) == model
    finally:
        a.close()
        b.close()
