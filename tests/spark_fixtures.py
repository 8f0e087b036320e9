"""The real processes the rhino.spark tests run against, started the same way in each
module: a ``rhino coordinator`` and ``rhino worker`` processes on 127.0.0.N (each its
own host, design §6), and a local SparkSession. Fixtures stay in the test modules
(their scope and settings differ); these build what they yield."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@contextlib.contextmanager
def rhino_cluster(root: Path, *, hosts: Sequence[int] = (2, 3, 4), heartbeat_timeout: float = 2.0
                  ) -> Iterator[dict]:
    """A coordinator and one registered worker per host; yields ``root``, ``secret_file``,
    ``secret``, ``coordinator`` (its address), ``workers`` (the processes) and
    ``coordinator_process`` (a restart keeps its address)."""
    from rhino.coordinator.client import connect_coordinator

    sf = write_secret(root)
    coord = CoordinatorProcess(root, secret_file=sf, heartbeat_timeout=heartbeat_timeout).start()
    workers: list[Any] = []
    try:
        for n in hosts:
            workers.append(WorkerProcess(root, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                                         extra_args=["--coordinator", coord.address]).start())
        secret = sf.read_bytes().strip()
        deadline = time.monotonic() + 20
        with connect_coordinator(coord.address, secret=secret) as cc:
            while len([w for w in cc.status()["workers"] if w.get("alive", True)]) < len(hosts):
                assert time.monotonic() < deadline, "workers did not register"
                time.sleep(0.2)
        yield {"root": root, "secret_file": sf, "secret": secret, "coordinator": coord.address, "workers": workers,
               "coordinator_process": coord}
    finally:
        for w in workers:
            w.stop()
        coord.stop()


def local_spark(app: str, *, partitions: int = 3, rocksdb: bool = False, **conf: str) -> Any:
    """A ``local[2]`` SparkSession in UTC without its UI; ``rocksdb``: Spark's own operators keep
    their state in the RocksDB provider (the baseline); ``conf``: more settings."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    b = (SparkSession.builder.master("local[2]").appName(app).config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", str(partitions)).config("spark.sql.session.timeZone", "UTC"))
    if rocksdb:
        b = b.config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    for k, v in conf.items():
        b = b.config(k, v)
    return b.getOrCreate()


class RefuseFirstCommit:
    """A coordinator client, except that the first commit_batch of batch ``b`` is refused as
    stale, as after a failover during the batch (docs/protocol.md §8.2): the batch runs again."""

    def __init__(self, inner: Any, b: int) -> None:
        self.inner, self.b, self.refused = inner, b, 0

    def commit_batch(self, op: str, b: int, **kw: Any) -> Any:
        if b == self.b and not self.refused:
            from rhino.errors import StaleEpochError

            self.refused += 1
            raise StaleEpochError(f"injected: batch {b} ran at a stale epoch")
        return self.inner.commit_batch(op, b, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
