"""Routing a batch's rows to instances, in Spark: the ``_rhino_part`` column.

A row goes to the instance that owns its key's vnode under the batch's routing
table (design §1). The vnode is the one the worker files the key's entries
under: the vnode of their routing part, the key's ``encode_key`` bytes
(``state/layout.py``), so it is computed on the same bytes.

Spark then shuffles with ``repartition(P, "_rhino_part")``, which puts a row in
partition ``pmod(hash(_rhino_part), P)`` (Murmur3, seed 42). The column holds,
for the p-th instance in number order, a **token**: a number whose hash lands in
partition p, so that partition p of the shuffle is exactly that instance (the
driver passes ``tokens`` indexed by instance number). Tokens are found once per P
by asking Spark itself to hash a range of numbers (no re-implementation of its
hash to drift from it).

The column is computed in the JVM where it can be (``tag_in_jvm``: a Java UDF,
``io.rhino.spark.KeyRouter``, for keys of integer, string, binary and boolean
columns), so a batch's rows make no trip through a Python worker before the
stateful stage; otherwise by ``tag_batches``, a ``mapInArrow`` pass over the
C++ partitioner. Both encode the key as ``encode_key`` does and hash it with
XXH3 and the job's seed; a test checks that they agree.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa

import rhino

from ..state.encoding import encode_key
from ..state.layout import vnodes_of

__all__ = ["PART_COLUMN", "partition_tokens", "tag_batches", "routing_keys", "jvm_key_kinds", "tag_in_jvm"]

PART_COLUMN = "_rhino_part"
_TOKENS: dict[int, list[int]] = {}


def partition_tokens(spark: Any, partitions: int) -> list[int]:
    """token[i]: a long whose ``pmod(hash(token), partitions)`` is i."""
    got = _TOKENS.get(partitions)
    if got is not None:
        return got
    n = 64 * partitions + 1024
    rows = spark.range(0, n).selectExpr("id", f"pmod(hash(id), {partitions}) AS p").groupBy("p") \
        .agg({"id": "min"}).collect()
    found = {int(r["p"]): int(r["min(id)"]) for r in rows}
    if len(found) != partitions:
        raise RuntimeError(f"could not find a shuffle token for every one of {partitions} partitions")
    _TOKENS[partitions] = [found[i] for i in range(partitions)]
    return _TOKENS[partitions]


def routing_keys(table: pa.Table | pa.RecordBatch, key_columns: list[str]) -> list[bytes]:
    """The routing part (``encode_key``) of every row's grouping key: vectorized for
    one integer key column, one Python call per row otherwise."""
    if len(key_columns) == 1:
        col = table.column(key_columns[0])
        t = col.type
        if pa.types.is_integer(t) and col.null_count == 0:
            v = col.to_numpy(zero_copy_only=False).astype(">i8")
            # b"i" + 8 big-endian bytes, as encode_key((int,)) writes it
            raw = np.empty((len(v), 9), dtype=np.uint8)
            raw[:, 0] = ord("i")
            raw[:, 1:] = v.view(np.uint8).reshape(-1, 8)
            return [bytes(r) for r in raw]
    cols = [table.column(c).to_pylist() for c in key_columns]
    return [encode_key(tuple(k)) for k in zip(*cols)]


def tag_batches(batches: Iterator[pa.RecordBatch], *, key_columns: list[str], num_key_groups: int,
                num_vnodes: int, seed: int, assignment: list[int], tokens: list[int]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: appends ``_rhino_part`` (the token of the row's instance;
    ``tokens[i]`` is instance number i's)."""
    part = rhino.Partitioner(num_key_groups=num_key_groups, num_vnodes=num_vnodes, seed=seed)
    inst_of_vnode = np.asarray(assignment, dtype=np.int64)
    tok = np.asarray(tokens, dtype=np.int64)
    for b in batches:
        if b.num_rows == 0:
            continue
        vn = np.asarray(vnodes_of(part, routing_keys(b, key_columns)))
        col = pa.array(tok[inst_of_vnode[vn]], pa.int64())
        yield pa.RecordBatch.from_arrays(list(b.columns) + [col], names=list(b.schema.names) + [PART_COLUMN])


def jvm_key_kinds(schema: Any, key_columns: list[str]) -> Optional[str]:
    """``KeyRouter``'s tag of each key column (``i`` integer, ``s`` string, ``b`` binary,
    ``B`` boolean), or None if a column has a type only the Python pass encodes
    (floats, dates and timestamps, whose conversions to Python values are Spark's)."""
    from pyspark.sql.types import (BinaryType, BooleanType, ByteType, IntegerType, LongType, ShortType,
                                   StringType)

    kinds = []
    for c in key_columns:
        t = schema[c].dataType
        if isinstance(t, (ByteType, ShortType, IntegerType, LongType)):
            kinds.append("i")
        elif isinstance(t, StringType) and t == StringType():  # a collated string compares otherwise
            kinds.append("s")
        elif isinstance(t, BinaryType):
            kinds.append("b")
        elif isinstance(t, BooleanType):
            kinds.append("B")
        else:
            return None
    return "".join(kinds)


def tag_in_jvm(df: Any, key_columns: list[str], kinds: str, *, num_key_groups: int, num_vnodes: int,
               seed: int, assignment: list[int], tokens: list[int]) -> Any:
    """``df`` with ``_rhino_part`` computed in the JVM (``KeyRouter``); the same column as
    ``tag_batches`` gives. ``io.rhino.spark.KeyRouter`` must be loadable (the helper jar,
    ``scheduling/jar.py``) and ``KeyRouter.available()``."""
    from pyspark.sql import DataFrame

    spark = df.sparkSession
    gw = spark.sparkContext._gateway
    jkeys = gw.new_array(gw.jvm.java.lang.String, len(key_columns))
    for i, c in enumerate(key_columns):
        jkeys[i] = c
    # one byte[] (py4j sets a Java array's elements one round trip each)
    jtokens = np.asarray([tokens[assignment[v]] for v in range(num_vnodes)], dtype=">i8").tobytes()
    jseed = seed - (1 << 64) if seed >= (1 << 63) else seed  # the same 64 bits as a Java long
    jdf = gw.jvm.io.rhino.spark.KeyRouter.withTokens(df._jdf, jkeys, kinds, PART_COLUMN, jseed,
                                                      num_key_groups, num_vnodes, jtokens)
    return DataFrame(jdf, spark)
