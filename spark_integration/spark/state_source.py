"""``spark.read.format("rhino-state")``: a committed checkpoint of a rhino.spark
operator's state as a typed DataFrame, like Spark's own ``statestore`` format
for ``transformWithState``. No query needs to run: each instance's checkpoint
is read from a worker's replica store (``state/reader.py``).

Register it once per SparkSession (nothing is registered on import)::

    from rhino.spark.state_source import register_state_source
    register_state_source(spark)
    df = (spark.read.format("rhino-state")
          .option("coordinator", "127.0.0.1:7100").option("secretFile", "/etc/rhino/secret")
          .option("operatorId", "sessions").option("stateVarName", "count")
          .load())

Options:

- ``coordinator`` (``host:port``), and ``secretFile`` or ``secret``: the cluster.
- ``operatorId``: the operator (``transform_with_state(operator_id=...)``).
- ``stateVarName``: the state variable to read; or ``readRegisteredTimers=true``
  for the registered timers.
- ``batchId``: a committed batch (default: the operator's last committed one).
- ``includeExpired`` (default false): with TTL, entries expired at the batch's
  time are not returned (the coordinator keeps the times of the latest 1024
  batches; an older batch of a TTL variable is refused); ``includeExpired=true``
  returns every stored entry, expired ones included.
- ``pageSize`` (default 4096): entries per scan request.

Columns (Spark's ``statestore`` format for transformWithState):

==============  ===========================================================
ValueState      ``key``, ``value``, ``partition_id``
ListState       ``key``, ``list_element``, ``partition_id`` (a row per element,
                in list order)
MapState        ``key``, ``user_map_key``, ``user_map_value``, ``partition_id``
timers          ``key``, ``expiration_timestamp_ms``, ``partition_id``
==============  ===========================================================

``key`` is a struct of the grouping key's columns; ``value``, ``list_element``,
``user_map_key`` and ``user_map_value`` are structs of the declared schemas (the
current version: values written with an older one are read through it).
``partition_id`` is the Rhino instance. One input partition per instance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (DataType, IntegerType, LongType, StructField, StructType, TimestampNTZType,
                               TimestampType)

from .state.reader import TIMERS, ReadPlan, StateReadError, plan_read, read_pages

__all__ = ["RhinoStateDataSource", "register_state_source", "output_schema"]

NAME = "rhino-state"


def register_state_source(spark: Any) -> None:
    """Makes ``spark.read.format("rhino-state")`` available in this SparkSession."""
    spark.dataSource.register(RhinoStateDataSource)


def output_schema(plan: ReadPlan) -> StructType:
    """The DataFrame schema of a read (see the module's table)."""
    key = StructType.fromJson(json.loads(plan.grouping_key))
    pid = StructField("partition_id", IntegerType(), False)
    if plan.kind == TIMERS:
        return StructType([StructField("key", key, False),
                           StructField("expiration_timestamp_ms", LongType(), False), pid])
    e = plan.entry or {}
    value = StructType.fromJson(json.loads(e["versions"][str(e["current"])]))
    if plan.kind == "value":
        return StructType([StructField("key", key, False), StructField("value", value, True), pid])
    if plan.kind == "list":
        return StructType([StructField("key", key, False), StructField("list_element", value, True), pid])
    user_key = StructType.fromJson(json.loads(e["key_schema"]))
    return StructType([StructField("key", key, False), StructField("user_map_key", user_key, False),
                       StructField("user_map_value", value, True), pid])


def _column(values: list, dt: DataType, at: pa.DataType) -> pa.Array:
    """An Arrow array of one column's Python values (structs as tuples), as PySpark's
    data source conversion would build it, column by column instead of value by value."""
    if isinstance(dt, StructType):
        n = len(dt.fields)
        mask = None
        if any(v is None for v in values):
            mask = pa.array([v is None for v in values])
            values = [((None,) * n) if v is None else v for v in values]
        cols = list(zip(*values)) if values else [()] * n
        children = [_column(list(c), f.dataType, at.field(i).type) for i, (c, f) in enumerate(zip(cols, dt.fields))]
        return pa.StructArray.from_arrays(children, fields=[at.field(i) for i in range(n)], mask=mask)
    if isinstance(dt, (TimestampType, TimestampNTZType)):
        from pyspark.sql.conversion import LocalDataToArrowConversion

        conv = LocalDataToArrowConversion._create_converter(dt)  # a naive TIMESTAMP is local time
        values = [conv(v) for v in values]
    return pa.array(values, type=at)


def rows_to_batch(rows: list[tuple], schema: StructType, arrow_schema: pa.Schema) -> pa.RecordBatch:
    """One Arrow record batch of the data source's rows (what ``read`` yields)."""
    cols = list(zip(*rows)) if rows else [()] * len(schema.fields)
    return pa.RecordBatch.from_arrays([_column(list(c), f.dataType, arrow_schema.field(i).type)
                                       for i, (c, f) in enumerate(zip(cols, schema.fields))], schema=arrow_schema)


def _flag(options: Any, name: str) -> bool:
    v = str(options.get(name, "false")).strip().lower()
    if v not in ("true", "false"):
        raise StateReadError(f"option {name} must be true or false, not {options.get(name)!r}")
    return v == "true"


def _int(options: Any, name: str) -> Optional[int]:
    v = options.get(name)
    if v is None or str(v).strip() == "":
        return None
    try:
        return int(str(v).strip())
    except ValueError:
        raise StateReadError(f"option {name} must be an integer, not {v!r}") from None


def _required(options: Any, name: str) -> str:
    v = options.get(name)
    if not v:
        raise StateReadError(f"the rhino-state source needs option {name!r}")
    return str(v)


class _Request:
    """The options of one read, checked."""

    def __init__(self, options: Any) -> None:
        self.coordinator = _required(options, "coordinator")
        self.operator_id = _required(options, "operatorId")
        if options.get("secret"):
            self.secret = str(options["secret"]).encode()
        elif options.get("secretFile"):
            from rhino.replication import read_secret_file

            self.secret = read_secret_file(Path(options["secretFile"]))
        else:
            raise StateReadError("the rhino-state source needs option 'secretFile' (or 'secret'): "
                                 "the job's task credential, or the cluster's shared secret")
        from rhino.credential import Credential

        if not isinstance(self.secret, Credential):
            # The readers run in executors: they get the operator's namespace's task
            # credential, never the root (docs/protocol.md §2, "Roles").
            ns = self.operator_id.split("..", 1)[0] if ".." in self.operator_id else ""
            self.secret = Credential.task(self.secret, ns)
        self.state_var = options.get("stateVarName") or None
        self.timers = _flag(options, "readRegisteredTimers")
        self.batch = _int(options, "batchId")
        self.include_expired = _flag(options, "includeExpired")
        self.page_size = _int(options, "pageSize") or 4096
        if self.page_size <= 0:
            raise StateReadError("option pageSize must be positive")

    def plan(self) -> ReadPlan:
        from rhino.coordinator.client import connect_coordinator

        with connect_coordinator(self.coordinator, secret=self.secret, client_id="rhino-state-source") as c:
            return plan_read(c, self.operator_id, state_var=self.state_var, timers=self.timers,
                             batch=self.batch, include_expired=self.include_expired)


class RhinoStateDataSource(DataSource):
    """The ``rhino-state`` data source (batch reads only)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return output_schema(_Request(self.options).plan())

    def reader(self, schema: StructType) -> "RhinoStateReader":
        req = _Request(self.options)
        plan = req.plan()
        want = output_schema(plan)
        if schema.fieldNames() != want.fieldNames():
            raise StateReadError(f"the rhino-state source reads {want.simpleString()}; do not give it another "
                                 f"schema ({schema.simpleString()})")
        return RhinoStateReader(plan, req.secret, req.page_size)


class _Instance(InputPartition):
    def __init__(self, instance: int) -> None:
        super().__init__(instance)
        self.instance = instance


class RhinoStateReader(DataSourceReader):
    """One input partition per Rhino instance; each reads that instance's checkpoint."""

    def __init__(self, plan: ReadPlan, secret: bytes, page_size: int) -> None:
        self.plan = plan
        self.secret = secret
        self.page_size = page_size

    def partitions(self) -> list[InputPartition]:
        return [_Instance(i) for i in sorted(self.plan.instances)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Arrow record batches, a page of entries each, built column by column
        (about 3.5x faster than PySpark's conversion of tuples, value by value, on a
        100k-entry map page; ``tests/test_state_reader.py`` checks they are equal)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = output_schema(self.plan)
        arrow_schema = to_arrow_schema(schema, timezone="UTC")  # what PySpark checks a batch against
        for rows in read_pages(self.plan, int(partition.value), self.secret, page_size=self.page_size):
            yield rows_to_batch(rows, schema, arrow_schema)
