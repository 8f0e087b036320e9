"""Shared fixtures: fresh store / state directories and an independent RocksDB reader.

Keep this file small and generic: fixtures only. Helpers that one test file
needs live in that file; helpers several files share live in tests/helpers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import rhino
from rhino_bench.harness.workers import read_rocksdb as _read_rocksdb


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


@pytest.fixture
def read_rocksdb() -> Callable[[str | Path], dict[str, dict[bytes, bytes]]]:
    """read(path) -> {column family: {key: value}} of a RocksDB directory, via rocksdict (read-only).

    Close the Rhino handle first, or read a directory nobody writes to.
    """
    return _read_rocksdb


# ---- markers -------------------------------------------------------------------------------

_SPARK_WORDS = ("pyspark", "local_spark", "spark_fixtures", "LocalCluster")
_spark_modules: dict[str, bool] = {}


def _uses_spark(path: Path) -> bool:
    key = str(path)
    if key not in _spark_modules:
        text = path.read_text(errors="replace")
        _spark_modules[key] = any(w in text for w in _SPARK_WORDS)
    return _spark_modules[key]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``spark`` every test of a module that starts Spark (it names PySpark or the Spark
    fixtures), so that ``make test-quick`` (``-m "not spark"``) leaves them out."""
    for item in items:
        if _uses_spark(Path(str(item.fspath))):
            item.add_marker(pytest.mark.spark)
