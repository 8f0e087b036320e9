"""Warming a new host's Spark executor before a query's tasks run there (``make demo`` and
``rhino-bench spark elastic``, when a host joins)."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["warm_executor"]


def warm_executor(spark: Any, ip: str, say: Callable[[str], None]) -> bool:
    """Runs a small job on the executor of host ``ip``, so that its Python workers have started
    (the RDD one and the SQL ``mapInArrow`` one, which the operator's tasks use) and imported
    what the query's tasks import, and its JVM has run a shuffle, before any of the query's
    tasks runs there: else the first batch that uses the host waits seconds for that (a cost
    of joining, not of a rescale). True once the job ran there; ``say`` gets a failure."""
    import pyarrow as pa

    from rhino.spark.scheduling.locality import with_preferred_locations

    def warm(batches: Any) -> Any:
        import importlib
        import os

        for m in ("numpy", "pandas", "pyarrow", "rhino.spark.runtime.task", "rhino_testing.nexmark.source"):
            importlib.import_module(m)
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"host": [os.environ.get("SPARK_LOCAL_IP", "")]})

    sc = spark.sparkContext
    for _ in range(3):
        try:
            rdd = with_preferred_locations(sc.parallelize([(0,)], 1), [[ip]])
            # two Python UDFs in a row: two Python workers in one task, as the source's stage has
            df = spark.createDataFrame(rdd, "x long").mapInArrow(warm, "host string").mapInArrow(warm, "host string")
            hosts = [r.host for r in df.repartition(1).mapInArrow(warm, "host string").union(df).collect()]
            if ip in hosts:
                return True
        except Exception as e:  # noqa: BLE001 - the caller goes on with a cold executor
            say(f"warming the executor on {ip} failed: {type(e).__name__}: {str(e)[:200]}")
            return False
    return False
