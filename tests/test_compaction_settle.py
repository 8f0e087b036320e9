"""StateBackend.wait_for_compactions: the LSM shape stops changing once it returns True.

The oracle is rocksdict (its own RocksDB build), which lists the live SST files
of the DB read-only while Rhino holds it open: once settled, two listings some
time apart are identical, and compaction has merged the L0 pile a fast load
leaves behind.
"""

from __future__ import annotations

import time

import pytest

import rhino
from rhino_testing.workload import build_state

from helpers import live_sst_files

VNODES = 4
L0_TRIGGER = 4  # RocksDB's level0_file_num_compaction_trigger, which Rhino does not change


def _loaded(tmp_path) -> rhino.StateBackend:
    # 1 MiB memtables over 4 vnodes: a 192 MiB load at full speed flushes each
    # vnode ~48 times, faster than two background threads merge them.
    db = rhino.StateBackend.open(str(tmp_path / "db"), partitioner=rhino.Partitioner(num_vnodes=VNODES),
                                 write_buffer_budget=VNODES << 20)
    build_state(db, 192 << 20, progress=False)
    return db


def test_settled_state_stops_changing_and_has_merged_its_l0(tmp_path):
    db = _loaded(tmp_path)
    try:
        assert db.wait_for_compactions(120) is True
        settled = live_sst_files(tmp_path / "db")
        time.sleep(0.5)
        assert live_sst_files(tmp_path / "db") == settled  # no flush or compaction ran since
        l0 = [f for f in settled if f["level"] == 0]
        # Every vnode (and the default column family) is below the trigger.
        assert len(l0) <= (L0_TRIGGER - 1) * (VNODES + 1)
        assert db.wait_for_compactions(0) is True  # and stays settled
    finally:
        db.close()


def test_a_read_only_backend_is_settled_at_once(tmp_path):
    # Closed with compactions still owed: a read-only open will never run them.
    _loaded(tmp_path).close()
    ro = rhino.StateBackend.open(str(tmp_path / "db"), read_only=True, create=False)
    try:
        t0 = time.perf_counter()
        assert ro.wait_for_compactions(30) is True
        assert time.perf_counter() - t0 < 5.0
    finally:
        ro.close()


def test_timeout_bounds_the_wait(tmp_path):
    db = _loaded(tmp_path)
    try:
        t0 = time.perf_counter()
        result = db.wait_for_compactions(0.05)
        assert isinstance(result, bool)
        assert time.perf_counter() - t0 < 5.0
    finally:
        db.close()


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_bad_timeout_raises_value_error(tmp_path, bad):
    with rhino.StateBackend.open(str(tmp_path / "db")) as db:
        with pytest.raises(ValueError, match="timeout"):
            db.wait_for_compactions(bad)


def test_closed_backend_raises(tmp_path):
    db = rhino.StateBackend.open(str(tmp_path / "db"))
    db.close()
    with pytest.raises(rhino.RhinoError):
        db.wait_for_compactions(1)
