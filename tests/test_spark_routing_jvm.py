"""Routing in the JVM (``io.rhino.spark.KeyRouter``) against the reference, the Python
pass over the C++ partitioner (``tag_batches``): the same ``_rhino_part`` for every row,
on keys of every type the JVM encodes, nulls and edge values included."""

from __future__ import annotations

import random
from functools import partial

import pytest

pytest.importorskip("pyspark")

from spark_fixtures import local_spark  # noqa: E402


@pytest.fixture(scope="module")
def spark():
    from rhino.spark.scheduling.locality import spark_conf_for_locality

    s = local_spark("rhino-routing-jvm", partitions=2, **spark_conf_for_locality())
    yield s
    s.stop()


def _rows(n: int, seed: int) -> list[tuple]:
    rnd = random.Random(seed)
    edge = [0, 1, -1, 2**63 - 1, -2**63, 0xF5, -11, 2**31]
    words = ["", "a", "ü", "日本語", "x" * 300, "tab\there", "🦏"]
    out = []
    for i in range(n):
        k = edge[i] if i < len(edge) else rnd.randrange(-2**63, 2**63)
        s = words[i % len(words)] + str(rnd.randrange(1000)) if i % 11 else None
        b = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40))) if i % 13 else None
        flag = None if i % 17 == 0 else bool(i % 2)
        out.append((k if i % 19 else None, rnd.randrange(-128, 128), rnd.randrange(-2**31, 2**31), s, b, flag))
    return out


@pytest.mark.parametrize("keys,seed,K,V", [
    (["k"], 0, 1 << 15, 256),
    (["k"], 2**64 - 5, 1 << 10, 7),            # a seed past 2^63, V not a power of two
    (["s"], 42, 1 << 15, 256),
    (["b"], 3, 1 << 4, 16),
    (["tiny", "i", "s", "flag"], 9, 1 << 15, 300),
    (["flag"], 0, 1, 1),                         # K = 1: one key group
])
def test_the_jvm_column_equals_the_python_pass(spark, keys, seed, K, V) -> None:
    from pyspark.sql.types import (BinaryType, BooleanType, ByteType, IntegerType, LongType, StringType,
                                   StructField, StructType)

    from rhino.spark.runtime.routing import PART_COLUMN, jvm_key_kinds, tag_batches, tag_in_jvm

    schema = StructType([StructField("k", LongType()), StructField("tiny", ByteType()),
                         StructField("i", IntegerType()), StructField("s", StringType()),
                         StructField("b", BinaryType()), StructField("flag", BooleanType())])
    df = spark.createDataFrame(_rows(500, seed % 1000), schema).repartition(3)
    rnd = random.Random(seed % 1000)
    instances = 5
    assignment = [rnd.randrange(instances) for _ in range(V)]
    tokens = [1000 + 7 * i for i in range(instances)]
    kinds = jvm_key_kinds(df.schema, keys)
    assert kinds is not None
    with_schema = StructType(list(schema.fields) + [StructField(PART_COLUMN, LongType(), False)])
    py = df.mapInArrow(partial(tag_batches, key_columns=keys, num_key_groups=K, num_vnodes=V, seed=seed,
                               assignment=assignment, tokens=tokens), with_schema)
    jvm = tag_in_jvm(df, keys, kinds, num_key_groups=K, num_vnodes=V, seed=seed, assignment=assignment,
                     tokens=tokens)

    def by_row(frame):
        return sorted((repr(tuple(r[:-1])), r[-1]) for r in frame.collect())

    expected, got = by_row(py), by_row(jvm)
    assert len(got) == 500 and got == expected
    assert len({t for _, t in got}) > 1 or instances == 1 or K == 1


def test_types_only_python_encodes_fall_back(spark) -> None:
    from pyspark.sql.types import DateType, DoubleType, LongType, StructField, StructType, TimestampType

    from rhino.spark.runtime.routing import jvm_key_kinds

    schema = StructType([StructField("k", LongType()), StructField("x", DoubleType()),
                         StructField("d", DateType()), StructField("t", TimestampType())])
    assert jvm_key_kinds(schema, ["k"]) == "i"
    for c in ("x", "d", "t"):
        assert jvm_key_kinds(schema, ["k", c]) is None


def test_a_bad_routing_table_is_a_clear_error(spark) -> None:
    from pyspark.errors.exceptions.captured import IllegalArgumentException

    from rhino.spark.runtime.routing import tag_in_jvm

    df = spark.range(3).withColumnRenamed("id", "k")
    with pytest.raises(IllegalArgumentException, match="bad routing table: K=1000"):  # K not a power of two
        tag_in_jvm(df, ["k"], "i", num_key_groups=1000, num_vnodes=4, seed=0, assignment=[0] * 4, tokens=[1])
