"""Real errors inside a Spark task reach the driver as themselves, not as a failover wait.

On a real local Spark (local[2]) with real ``rhino coordinator`` and ``rhino worker``
processes, each error is provoked for real, inside the task of a ``rhino.spark``
operator:

- AuthFailedError: the processor connects to the worker with a wrong secret;
- CorruptionError: the worker's own checkpoint b-1 is corrupted on disk, then batch b
  runs again (a Spark replay): the session's rollback restores that checkpoint;
- NoSpaceError: the worker's directory is a small tmpfs (a private mount namespace),
  and the processor's state does not fit.

Each is a subclass of OSError, which the task once took for an unreachable primary: it
reported the worker and waited ``failover_wait_s`` for a failover that never came, and
the driver ran the batch again. Now the task raises it at once, the driver's
classification (by class name) does not rerun it, and the error Spark raises on the
driver names the class. The operators run with ``watch_hosts=False``: tasks then wait
for a failover themselves on an unreachable primary (the path the bug took).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from rhino.engine import Action, classify_failure, failure_class_name  # noqa: E402
from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAILOVER_WAIT_S = 60.0  # what the old task waited per attempt for a failover that never came


class CountProcessor(StatefulProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        c = (self.count.get() or (0,))[0] + n
        self.count.update((c,))
        yield pd.DataFrame({"k": [key[0]], "count": [c]})

    def close(self):
        pass


class WrongSecretProcessor(StatefulProcessor):
    """Reaches a worker with a secret it does not know (as an executor given the wrong secret file)."""

    def __init__(self, address):
        self.address = address

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        import rhino

        rhino.connect(self.address, secret=b"not the cluster's secret: 0123456789abcdef")
        return iter([])

    def close(self):
        pass


class BigStateProcessor(StatefulProcessor):
    """Keeps 1 MB of state per key: more than the small disk holds."""

    def init(self, handle):
        self.blob = handle.getValueState("blob", "b string")

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        self.blob.update(("x" * (1 << 20),))
        return iter([])

    def close(self):
        pass


class SmallDiskWorker(WorkerProcess):
    """A worker whose directory (replica store and live state) is a tmpfs of ``size_mb``,
    mounted in a private mount namespace: its log and Unix socket stay outside."""

    size_mb = 24

    def command(self, port):
        self.dir.mkdir(parents=True, exist_ok=True)
        return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={self.size_mb}m tmpfs "$0" && exec "$@"',
                str(self.dir), *super().command(port)]


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def _start(root: Path, worker_cls=WorkerProcess, n: int = 2) -> dict:
    sf = write_secret(root)
    coord = CoordinatorProcess(root, secret_file=sf, heartbeat_timeout=2.0).start()
    w = None
    try:
        w = worker_cls(root, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                       extra_args=["--coordinator", coord.address]).start()
        from rhino.coordinator.client import connect_coordinator

        deadline = time.monotonic() + 20
        with connect_coordinator(coord.address, secret=sf.read_bytes().strip()) as cc:
            while not cc.status()["workers"]:
                assert time.monotonic() < deadline, "the worker did not register"
                time.sleep(0.2)
    except BaseException:
        if w is not None:
            w.stop()
        coord.stop()
        raise
    return {"root": root, "secret_file": sf, "coordinator": coord, "worker": w}


def _stop(c: dict) -> None:
    c["worker"].stop()
    c["coordinator"].stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = _start(tmp_path_factory.mktemp("engine-errors"))
    yield c
    _stop(c)


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    s = (SparkSession.builder.master("local[2]").appName("rhino-test-engine-errors")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    yield s
    s.stop()


def _op(c: dict, processor, op_id: str, schema: str):
    from rhino.spark import transform_with_state

    return transform_with_state(processor, key="k", output_schema=schema, operator_id=op_id,
                                coordinator=c["coordinator"].address, secret_file=str(c["secret_file"]),
                                parallelism=1, replicas=0, locality=False, watch_hosts=False,
                                failover_wait_s=FAILOVER_WAIT_S, max_batch_attempts=3)


def _df(spark, n: int = 8):
    return spark.createDataFrame(pd.DataFrame({"k": list(range(n)), "v": list(range(n))}))


def _raised_as_itself(op, run, name: str) -> str:
    """Runs ``run()``, which must fail with rhino.errors.``name`` raised in the task: at once
    (no failover wait, no rerun), named as the task's exception in the error Spark raised."""
    reports = len(op.reports)
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        run()
    took = time.monotonic() - t0
    text = str(ei.value)
    assert f"rhino.errors.{name}" in text, text[-3000:]
    assert failure_class_name(text) == f"rhino.errors.{name}", text[-3000:]
    assert classify_failure(text) is Action.RAISE
    # not the engine's "failed N times" after reruns, nor a timeout of a failover wait
    assert "failed 3 times" not in text and "RhinoTimeoutError" not in text, text[-3000:]
    assert took < FAILOVER_WAIT_S, f"{name} took {took:.1f} s: waited for a failover"
    assert len(op.reports) == reports
    return text


def test_auth_failed_in_a_task_reaches_the_driver_as_itself(cluster, spark):
    _op(cluster, CountProcessor(), "warm", "k long, count long").process_batch(_df(spark), 0)  # Spark's first job
    op = _op(cluster, WrongSecretProcessor(cluster["worker"].address), "auth", "k long")
    _raised_as_itself(op, lambda: op.process_batch(_df(spark), 0), "AuthFailedError")


def _corrupt_manifest(store: Path, operator_id: str, instance: int, checkpoint: int) -> None:
    """Changes one byte of the JSON body of a checkpoint's manifest in a worker's replica
    store (its trailer's checksum then fails: docs/protocol.md, the store's format)."""
    path = store / "checkpoints" / operator_id / str(instance) / f"{checkpoint:020d}.manifest"
    data = bytearray(path.read_bytes())
    i = data.index(b'"size":') + len(b'"size":')
    data[i] = ord("9") if data[i] != ord("9") else ord("8")
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def test_corruption_in_a_task_reaches_the_driver_as_itself(cluster, spark):
    op = _op(cluster, CountProcessor(), "corrupt", "k long, count long")
    op.process_batch(_df(spark), 0)
    op.process_batch(_df(spark), 1)
    # Spark runs batch 1 again (a replay after a driver restart): the worker rolls its state
    # back to checkpoint 0, from its own replica store, whose manifest is now corrupt.
    _corrupt_manifest(cluster["worker"].dir, "corrupt", 0, 0)
    _raised_as_itself(op, lambda: op.process_batch(_df(spark), 1), "CorruptionError")


def test_no_space_in_a_task_reaches_the_driver_as_itself(tmp_path, spark):
    if not _can_mount_tmpfs():
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (needs root or user namespaces)")
    small = _start(tmp_path, SmallDiskWorker, n=3)
    try:
        op = _op(small, BigStateProcessor(), "full", "k long")
        text = _raised_as_itself(op, lambda: op.process_batch(_df(spark, 48), 0), "NoSpaceError")
        assert "No space left" in text or "space" in text.lower()
    finally:
        _stop(small)
