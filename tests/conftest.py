"""Shared fixtures: fresh store / state directories and an independent RocksDB reader.

Keep this file small and generic: fixtures only. Helpers that one test file
needs live in that file; helpers several files share live in tests/helpers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import rocksdict

import rhino


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """Where a test's ReplicaStore lives (not created yet)."""
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path) -> rhino.ReplicaStore:
    """A fresh, empty ReplicaStore."""
    return rhino.ReplicaStore(str(store_dir))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """Where a test's live StateBackend lives (not created yet)."""
    return tmp_path / "state"


def _read_rocksdb(path: str | Path) -> dict[str, dict[bytes, bytes]]:
    """Every column family of the RocksDB at `path`, read by rocksdict read-only.

    Returns {column family name: {key: value}}. rocksdict bundles its own
    RocksDB, so this reader shares no code with Rhino.
    """
    path = str(path)
    names = rocksdict.Rdict.list_cf(path)
    raw = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(
        path,
        options=raw,
        column_families={n: rocksdict.Options(raw_mode=True) for n in names if n != "default"},
        access_type=rocksdict.AccessType.read_only(),
    )
    try:
        out = {"default": dict(db.items())}
        for n in names:
            if n == "default":
                continue
            cf = db.get_column_family(n)
            out[n] = dict(cf.items())
        return out
    finally:
        db.close()


@pytest.fixture
def read_rocksdb() -> Callable[[str | Path], dict[str, dict[bytes, bytes]]]:
    """read(path) -> {column family: {key: value}} of a RocksDB directory, via rocksdict (read-only).

    Close the Rhino handle first, or read a directory nobody writes to.
    """
    return _read_rocksdb
