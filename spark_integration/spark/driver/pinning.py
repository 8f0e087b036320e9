"""Pinning (design §5, step 3): partition p of a batch's shuffle prefers the host of its
instance's primary, so its task reaches the worker over the Unix socket. The
preference is a narrow JVM wrapper (``io.rhino.spark.PreferredLocationsRDD``) that the
DAG scheduler reads; instances that moved since the last job start first on their new
hosts (``scheduling/moved_first.py``)."""

from __future__ import annotations

from typing import Any, Optional

from rhino.coordinator.types import Placement
from rhino.errors import InvalidArgumentError

__all__ = ["Pinner"]


class Pinner:
    """Turns the shuffled rows into the stateful stage's input DataFrame, pinned."""

    def __init__(self, locality: bool) -> None:
        self.locality = locality
        self._hosts: dict[int, Optional[str]] = {}  # each instance's host in the last job

    def pin(self, spark: Any, jrdd: Any, jschema: Any, placement: Placement) -> Any:
        """The rows as a DataFrame, partition p preferring the host of its instance's primary."""
        from pyspark.sql import DataFrame

        if not self.locality:
            return DataFrame(spark._jsparkSession.internalCreateDataFrame(jrdd, jschema, False), spark)

        from py4j.java_collections import ListConverter

        from ..scheduling.locality import _ensure_class
        from ..scheduling.moved_first import executors_by_host, moved, preferred_locations

        order = placement.instance_order()
        now = {i: placement.instances[i].host or None for i in order}
        sc = spark.sparkContext
        execs = executors_by_host(sc) if moved(order, now, self._hosts) else {}
        hosts = preferred_locations(order, now, self._hosts, execs)
        self._hosts = now
        try:
            # spark.jars of the session, or (a later session in a process whose JVM started without
            # it) the jar added to the driver's class loader and shipped with addJar
            _ensure_class(sc)
        except RuntimeError as e:
            raise InvalidArgumentError(f"{e}; or pass locality=False") from e
        client = sc._gateway._gateway_client
        conv = ListConverter()
        jhosts = conv.convert([conv.convert(h, client) for h in hosts], client)
        pinned = sc._jvm.io.rhino.spark.PreferredLocationsRDD(jrdd, jhosts)
        return DataFrame(spark._jsparkSession.internalCreateDataFrame(pinned, jschema, False), spark)
