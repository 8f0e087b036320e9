"""Routing a batch's rows to the operator's instances (design §5, step 2).

Each row gets its instance's shuffle token (``runtime/routing.py``): in the JVM
(``io.rhino.spark.KeyRouter``) where the key's types and the helper jar allow, so the
rows make no trip through a Python worker before the stateful stage, else by a
``mapInArrow`` pass. ``repartition(P, token)`` then makes partition p instance
``placement.instance_order()[p]``, sorted by key within it."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Optional

from rhino.coordinator.types import Placement
from rhino.engine import first_error_line

from ..runtime.routing import PART_COLUMN, jvm_key_kinds, partition_tokens, tag_batches, tag_in_jvm
from .config import OperatorConfig

__all__ = ["Router", "BatchInput", "auto_input_copies"]

log = logging.getLogger("rhino.spark")


class Router:
    """Tags rows with their instance's token; remembers per application whether the JVM can."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.mode: Optional[str] = None  # the last batch's: "jvm" or "python" (BatchReport.routing)
        self._jvm_in: dict[str, bool] = {}  # application id -> KeyRouter available

    def tag(self, df: Any, placement: Placement, token_of: list[int]) -> Any:
        """``df`` with the routing column."""
        from pyspark.sql.types import LongType, StructField, StructType

        table = dict(placement.partitioner_args(), assignment=list(placement.assignment), tokens=token_of)
        keys = self.config.keys
        kinds = jvm_key_kinds(df.schema, keys)
        if kinds is not None and self._jvm_routing(df.sparkSession.sparkContext):
            self.mode = "jvm"
            return tag_in_jvm(df, keys, kinds, **table)
        self.mode = "python"
        schema = StructType(list(df.schema.fields) + [StructField(PART_COLUMN, LongType(), False)])
        return df.mapInArrow(partial(tag_batches, key_columns=keys, **table), schema)

    def _jvm_routing(self, sc: Any) -> bool:
        """Whether ``io.rhino.spark.KeyRouter`` can route in this application (checked once)."""
        app = sc.applicationId
        if app not in self._jvm_in:
            from ..scheduling.locality import _ensure_class

            try:
                _ensure_class(sc)  # the helper jar, in the driver and the executors
                self._jvm_in[app] = bool(sc._jvm.io.rhino.spark.KeyRouter.available())
                why = "XXH3 (Parquet's shaded OpenHFT hashing) is not on Spark's class path"
            except Exception as e:  # noqa: BLE001 - no jar, no javac, an old jar: the Python pass routes
                self._jvm_in[app] = False
                why = first_error_line(str(e))
            if not self._jvm_in[app]:
                log.info("rhino.spark %s: rows are routed by a Python pass (%s)", self.config.operator_id, why)
        return self._jvm_in[app]


class BatchInput:
    """One batch's routed and shuffled rows, kept across its attempts, then released.

    A batch that runs again (a failover moved a primary: a new epoch, same routing table)
    reuses the first attempt's shuffle: the same RDD object keeps its ShuffleDependency, so
    Spark's DAG scheduler skips the map stage whose outputs it still has and recomputes
    only those lost with a dead executor (with ``input_copies``, none: see :meth:`_cache`).
    Only the stateful stage runs again, pinned anew."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._by_route: dict[tuple, tuple[Any, Any]] = {}
        self._cached: list[Any] = []
        self.copies = 1  # the copies of the input this batch keeps (BatchReport.input_copies)

    def rows(self, spark: Any, df: Any, placement: Placement, sort: list[str]) -> tuple[Any, Any]:
        """The shuffled rows as Spark's own RDD of InternalRows and its schema (no Python
        round trip), for the placement's routing table."""
        instances = placement.instance_order()
        nparts = len(instances)
        route = (nparts, placement.num_key_groups, placement.num_vnodes, placement.seed, placement.assignment,
                 tuple(instances))
        if route not in self._by_route:
            tokens = partition_tokens(spark, nparts)
            token_of = [-1] * (max(instances) + 1)  # by instance number; retired numbers get none
            for p, i in enumerate(instances):
                token_of[i] = tokens[p]
            # Each partition sorted by key (Spark's external sort, which spills), as Spark's own
            # operator sorts: the task then streams it a window of whole keys at a time.
            tagged = self.router.tag(df, placement, token_of)
            routed = self._cache(tagged.repartition(nparts, PART_COLUMN).sortWithinPartitions(*sort))
            self._by_route.clear()
            self._by_route[route] = (routed._jdf.queryExecution().toRdd(), routed._jdf.schema())
        return self._by_route[route]

    def _cache(self, routed: Any) -> Any:
        """With ``input_copies`` > 1, the routed input (after the shuffle, sorted) cached on
        the executors with that many copies on distinct executors (Spark's block
        replication, memory then disk).

        The shuffle's map output lives only on the executor that wrote it. When a host is lost
        mid-batch with a map task's output, Spark runs that map task again before any rerun
        task can start, reading and routing its source split again (1.7-2.3 s of the 2.5-2.9 s
        rerun launch in bench/results/spark_recovery.2026-11-26.md, one-partition source).
        Cached after the shuffle, each instance's partition is stored, with its copy sent to
        another executor, when its task of the first attempt begins (Spark unrolls a cached
        partition before the task reads it): a rerun task reads the surviving copy, and the
        DAG scheduler, which finds every partition cached, runs no map stage at all."""
        copies = self.router.config.input_copies
        if copies is None:
            copies = auto_input_copies(routed.sparkSession.sparkContext)
        self.copies = copies
        if copies <= 1:
            return routed
        from pyspark import StorageLevel

        cached = routed.persist(StorageLevel(True, True, False, False, copies))
        self._cached.append(cached)
        return cached

    def release(self) -> None:
        """Drops the batch's cached input once the batch is done."""
        cached, self._cached = self._cached, []
        for df in cached:
            try:
                df.unpersist(blocking=False)
            except Exception as e:  # noqa: BLE001 - a cleanup: Spark's ContextCleaner frees it later anyway
                log.debug("rhino.spark %s: releasing a cached input: %s", self.router.config.operator_id, e)


def auto_input_copies(sc: Any) -> int:
    """The default ``input_copies``: 2 while the application has at least two executors
    (a copy has somewhere to go), else 1 (local mode, one executor: Spark would log a failed
    replication for every block). Measured in ``bench/results/spark_input_copies.md``: the
    copy costs a steady batch about 9% and saves a rerun's map stage (1.6-2.0 s there) when a
    host is lost mid-batch with the batch's map output."""
    try:
        # the status tracker lists the driver too
        executors = len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1
    except Exception:  # noqa: BLE001 - a stopping SparkContext: no copy this batch
        return 1
    return 2 if executors >= 2 else 1
