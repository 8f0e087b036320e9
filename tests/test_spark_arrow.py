"""Rhino state inside PySpark's Arrow path (`mapInArrow`), on a real local Spark.

Two jobs play two micro-batches of a keyed stream. Each task opens the state
of its partition, reads the previous values of its batch's keys with
`get_batch_arrow` (pyarrow int64 keys straight from the RecordBatch), writes
the new ones with `put_batch` (a pyarrow binary column as values) and returns
both as Arrow columns that Spark takes as BinaryType. Oracles: a Python dict
replay of the two batches, and rocksdict reading the partitions' state
directories afterwards.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from rhino_testing.harness.workers import read_rocksdb  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv's rhino and pyarrow
    session = (SparkSession.builder.master("local[2]").appName("rhino-test-arrow")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _step(spark, root: Path, rows: list[tuple[int, bytes]]):
    """One micro-batch: per partition, read the old values and write the new ones."""
    import pyarrow as pa

    state_root = str(root)

    def per_partition(batches):
        import rhino
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        db = rhino.StateBackend.open(f"{state_root}/p{part}", partitioner=rhino.Partitioner(num_vnodes=8))
        try:
            for b in batches:
                keys, values = b.column("key"), b.column("payload")
                before = db.get_batch_arrow(keys)
                db.put_batch(keys, values)
                yield pa.RecordBatch.from_arrays([keys, before, db.get_batch_arrow(keys)],
                                                 names=["key", "before", "after"])
        finally:
            db.close()

    df = spark.createDataFrame(rows, "key long, payload binary")
    # Hash partitioning by key sends a key to the same partition, hence the same state, every time.
    out = df.repartition(2, "key").mapInArrow(per_partition, "key long, before binary, after binary")
    return {r["key"]: (r["before"], r["after"]) for r in out.collect()}


def test_state_carries_across_two_mapInArrow_jobs(spark, tmp_path):
    first = [(k, b"a%d" % k) for k in range(0, 100)]
    second = [(k, b"b%d" % k) for k in range(50, 150)]

    got1 = _step(spark, tmp_path, first)
    got2 = _step(spark, tmp_path, second)

    model: dict[int, bytes] = {}
    expect1 = {}
    for k, v in first:
        expect1[k] = (model.get(k), v)
        model[k] = v
    expect2 = {}
    for k, v in second:
        expect2[k] = (model.get(k), v)
        model[k] = v
    assert {k: (None if b is None else bytes(b), bytes(a)) for k, (b, a) in got1.items()} == expect1
    assert {k: (None if b is None else bytes(b), bytes(a)) for k, (b, a) in got2.items()} == expect2

    # rocksdict, reading the partitions' state directories, sees exactly the replayed state.
    seen = {}
    parts = sorted(tmp_path.glob("p*"))
    assert len(parts) == 2
    for p in parts:
        for name, cf in read_rocksdb(p).items():
            if name.startswith("vnode-"):
                seen.update(cf)
    assert seen == {k.to_bytes(8, "little", signed=True): v for k, v in model.items()}
