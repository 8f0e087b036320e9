"""Shared fixtures: fresh store / state directories and an independent RocksDB reader.

Keep this file small and generic: fixtures only. Helpers that one test file
needs live in that file; helpers several files share live in tests/helpers.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import rhino
from rhino_testing.harness.workers import read_rocksdb as _read_rocksdb


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


# ---- short-lived JVMs ----------------------------------------------------------------------

# Every JVM the suite starts runs for seconds to a few minutes, and on 2 cores HotSpot's C2
# compiler thread and G1's GC threads are most of what it spends: the throughput bench's smoke
# run took 122 s of CPU and 102 s of wall time with the defaults, 67 s and 70 s with these
# (2026-12-03, quiet machine). Both variables are Spark's own: spark-class reads the first for
# the master and worker daemons, PySpark's gateway hands the second to spark-submit for every
# driver (local[2] or on a LocalCluster, in this process or in a bench run it starts), and the
# executors get theirs through the conf. What a test checks does not depend on JIT tiers;
# `make bench` runs with the JVM's defaults, and describe_machine() records these when set.
SHORT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", SHORT_JVM_OPTIONS)
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f'--driver-java-options "{SHORT_JVM_OPTIONS}" '
                                             f'--conf "spark.executor.extraJavaOptions={SHORT_JVM_OPTIONS}" pyspark-shell')


# ---- markers -------------------------------------------------------------------------------

_SPARK_WORDS = ("pyspark", "local_spark", "spark_fixtures", "LocalCluster")
_spark_modules: dict[str, bool] = {}


def _uses_spark(path: Path) -> bool:
    key = str(path)
    if key not in _spark_modules:
        text = path.read_text(errors="replace")
        _spark_modules[key] = any(w in text for w in _SPARK_WORDS)
    return _spark_modules[key]


# The modules that take longest (the CI log's --durations), first: ``make test`` runs the suite on
# two pytest-xdist workers, one module at a time each (``--dist loadfile``), and a long module
# that starts last would leave one core idle at the end. Only the order changes; a module
# missing from the list runs after these, in the usual order.
SLOW_FIRST = (
    "test_spark_bench.py", "test_bench_smoke.py", "test_spark_host_loss.py", "test_spark_elastic_chaos.py",
    "test_spark_hosts_join_leave.py", "test_bench_state_size.py", "test_spark_exactly_once.py",
    "test_spark_chain_exactly_once.py", "test_coordinator_model.py", "test_spark_cluster.py",
    "test_bench_spark_output.py", "test_service_model.py", "test_spark_output.py", "test_spark_live_reconfigure.py",
    "test_spark_restart.py", "test_spark_lifecycle.py", "test_spark_output_lost.py", "test_spark_parity.py", "test_spark_ttl.py",
    "test_spark_operator.py", "test_spark_locality.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``spark`` every test of a module that starts Spark (it names PySpark or the Spark
    fixtures), so that ``make test-quick`` (``-m "not spark"``) leaves them out; puts the
    slowest modules first (``SLOW_FIRST``)."""
    for item in items:
        if _uses_spark(Path(str(item.fspath))):
            item.add_marker(pytest.mark.spark)
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: keeps the rest's order
