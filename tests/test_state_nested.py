"""Nested types in state schemas: ``array<T>``, ``map<K, V>``, ``struct<...>``
(spark_integration/spark/state/nested.py and the row codec; issue 45, Build item 4).

No Spark session: PySpark's own ``toInternal`` / ``fromInternal`` (pure Python) are the
oracle for what a value reads back as (a ``Row`` for a struct, a list, a dict), and a
decoder written here from the byte layout in docs/design.md ("Nested fields"), importing
nothing of Rhino, is the oracle for the bytes. The same processors on Spark's own operator
are in tests/test_spark_parity.py (test g)."""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DataType, DateType, DecimalType, DoubleType,
                               IntegerType, LongType, MapType, Row, StringType, StructField, StructType)

from rhino.spark.state.codec import RowCodec
from rhino.spark.state.schema import (MAX_NESTING, CorruptValueError, IncompatibleSchemaError, StateValueError,
                                      UnsupportedTypeError, evolve, parse_schema)

VEC = 32  # batches of at least this many rows take the codec's vectorized path


# ---- the schema DDL ------------------------------------------------------------------------------

@pytest.mark.parametrize("ddl,expected", [
    ("a array<int>", StructType([StructField("a", ArrayType(IntegerType(), True))])),
    ("m map<string, bigint>", StructType([StructField("m", MapType(StringType(), LongType(), True))])),
    ("s struct<x: int NOT NULL, `y z` string COMMENT 'c'>",
     StructType([StructField("s", StructType([StructField("x", IntegerType(), False),
                                              StructField("y z", StringType(), True, {"comment": "c"})]))])),
    ("s struct<x int>, l array<array<map<int,struct<q:double>>>> not null",
     StructType([StructField("s", StructType([StructField("x", IntegerType())])),
                 StructField("l", ArrayType(ArrayType(MapType(IntegerType(), StructType(
                     [StructField("q", DoubleType())])))), False)])),
])
def test_ddl_parses_nested_types_as_spark_does(ddl: str, expected: StructType) -> None:
    # (Spark's DDL: an array's elements and a map's values may be null; `name: type` or `name type`)
    assert parse_schema(ddl, var="v") == expected


def test_simple_string_round_trips_through_the_parser() -> None:
    s = parse_schema("a array<struct<b: map<string, array<decimal(12,3)>>, c: date>>, d binary", var="v")
    assert parse_schema(s.simpleString(), var="v") == s


def test_nesting_deeper_than_the_limit_is_refused_not_a_recursion_error() -> None:
    ok = "a " + "array<" * MAX_NESTING + "int" + ">" * MAX_NESTING
    assert parse_schema(ok, var="v")
    for deep in (MAX_NESTING + 1, 100_000):
        with pytest.raises(UnsupportedTypeError, match=f"nested more than {MAX_NESTING} deep"):
            parse_schema("a " + "array<" * deep + "int" + ">" * deep, var="v")
    t: DataType = IntegerType()
    for _ in range(MAX_NESTING + 1):
        t = ArrayType(t)
    with pytest.raises(UnsupportedTypeError, match="nested more than"):
        parse_schema(StructType([StructField("a", t)]), var="v")


# ---- values: random nested schemas and values against PySpark's own conversions ------------------

_LEAVES = [LongType(), IntegerType(), StringType(), BinaryType(), BooleanType(), DoubleType(), DateType(),
           DecimalType(12, 3)]
_LEAF_VALUES = {
    "bigint": st.integers(-(1 << 63), (1 << 63) - 1), "int": st.integers(-(1 << 31), (1 << 31) - 1),
    "string": st.text(max_size=6), "binary": st.binary(max_size=6), "boolean": st.booleans(),
    "double": st.floats(allow_nan=False, width=64), "date": st.dates(),
    "decimal(12,3)": st.decimals(min_value=-10**8, max_value=10**8, places=3, allow_nan=False, allow_infinity=False),
}


def _types(depth: int = 0) -> st.SearchStrategy[DataType]:
    leaf = st.sampled_from(_LEAVES)
    if depth >= 3:
        return leaf
    inner = st.deferred(lambda: _types(depth + 1))
    key = st.sampled_from([LongType(), StringType(), IntegerType()])
    return st.one_of(
        leaf,
        st.builds(ArrayType, inner, st.booleans()),
        st.builds(MapType, key, inner, st.booleans()),
        st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=3).map(
            lambda fs: StructType([StructField(f"f{i}", t, n) for i, (t, n) in enumerate(fs)])))


def _values(t: DataType) -> st.SearchStrategy[Any]:
    if isinstance(t, ArrayType):
        e = _values(t.elementType)
        return st.lists(st.none() | e if t.containsNull else e, max_size=4)
    if isinstance(t, MapType):
        v = _values(t.valueType)
        return st.dictionaries(_values(t.keyType), st.none() | v if t.valueContainsNull else v, max_size=4)
    if isinstance(t, StructType):
        return st.tuples(*[st.none() | _values(f.dataType) if f.nullable else _values(f.dataType)
                           for f in t.fields])
    return _LEAF_VALUES[t.simpleString()]


@st.composite
def nested_rows(draw: Any) -> tuple[StructType, list[tuple]]:
    fields = draw(st.lists(st.tuples(_types(), st.booleans()), min_size=1, max_size=3))
    schema = StructType([StructField(f"c{i}", t, n) for i, (t, n) in enumerate(fields)])
    row = st.tuples(*[st.none() | _values(f.dataType) if f.nullable else _values(f.dataType)
                      for f in schema.fields])
    return schema, draw(st.lists(row, min_size=1, max_size=6))


def _plain(v: Any, ordered: bool = True) -> Any:
    """A value with Rows as (names, values), for a comparison that sees names and types;
    ``ordered=False``: a map's entries in any order (a map key's canonical encoding sorts them)."""
    if isinstance(v, Row):
        return ("Row", tuple(v.__fields__), tuple(_plain(x, ordered) for x in v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_plain(x, ordered) for x in v))
    if isinstance(v, dict):
        items = [(_plain(k, ordered), _plain(x, ordered)) for k, x in v.items()]
        return ("dict", tuple(items if ordered else sorted(items, key=repr)))
    if isinstance(v, (bytes, bytearray)):
        return ("bytes", bytes(v))
    if isinstance(v, Decimal):
        return ("Decimal", v.as_tuple())
    return (type(v).__name__, v)


def _pyspark_view(schema: StructType, row: tuple) -> tuple:
    """What PySpark stores for ``row`` and gives back (toInternal, then fromInternal)."""
    return tuple(schema.fromInternal(schema.toInternal(row)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nested_rows(), st.sampled_from([None, 3]))
def test_nested_values_read_back_as_pyspark_gives_them(case: tuple[StructType, list[tuple]], version: Any) -> None:
    schema, rows = case
    codec = RowCodec(schema, var="v", version=version)
    per_row = [codec.encode_one(r) for r in rows]
    padded = rows * (VEC // len(rows) + 1)
    assert codec.encode(padded)[:len(rows)] == per_row  # the vectorized path writes the same bytes
    ordered = version is not None  # a map key's maps are sorted by their keys' bytes
    want = [_plain(_pyspark_view(schema, r), ordered) for r in rows]
    assert [_plain(r, ordered) for r in codec.decode(per_row)] == want
    assert [_plain(r, ordered) for r in codec.decode(codec.encode(padded))[:len(rows)]] == want
    assert [_plain(_independent_row(schema, version, b), ordered) for b in per_row] == want


# ---- the bytes, read by a decoder written from docs/design.md -----------------------------------

_FIXED = {"bigint": "<q", "int": "<i", "boolean": "<B", "double": "<d", "date": "<i"}


def _independent_row(schema: StructType, version: Any, blob: bytes) -> tuple:
    pos = 0 if version is None else 2
    values, pos = _independent_fields([f.dataType for f in schema.fields], blob, pos, [f.nullable for f in schema.fields])
    assert pos == len(blob)
    return tuple(values)


def _independent_fields(types: list[DataType], b: bytes, pos: int, nullable: list[bool]) -> tuple[list, int]:
    """A null bitmap of len(types) bits, then each non-null value."""
    nb = (len(types) + 7) // 8
    bits = int.from_bytes(b[pos:pos + nb], "little")
    pos += nb
    out = []
    for i, t in enumerate(types):
        if bits >> i & 1:
            assert nullable[i]
            out.append(None)
        else:
            v, pos = _independent_value(t, b, pos)
            out.append(v)
    return out, pos


def _independent_value(t: DataType, b: bytes, pos: int) -> tuple[Any, int]:
    name = t.simpleString()
    if name in _FIXED:
        v = struct.unpack_from(_FIXED[name], b, pos)[0]
        pos += struct.calcsize(_FIXED[name])
        if name == "boolean":
            return bool(v), pos
        if name == "date":
            return dt.date(1970, 1, 1) + dt.timedelta(days=v), pos
        return v, pos
    if isinstance(t, DecimalType):
        return Decimal(int.from_bytes(b[pos:pos + 16], "little", signed=True)).scaleb(-t.scale), pos + 16
    n = struct.unpack_from("<I", b, pos)[0]
    body, end = b[pos + 4:pos + 4 + n], pos + 4 + n
    assert len(body) == n
    if name == "string":
        return body.decode("utf-8"), end
    if name == "binary":
        return body, end
    if isinstance(t, StructType):
        vals, p = _independent_fields([f.dataType for f in t.fields], body, 0, [f.nullable for f in t.fields])
        assert p == n
        return Row(**{f.name: v for f, v in zip(t.fields, vals)}), end
    count = struct.unpack_from("<I", body, 0)[0]
    p = 4
    if isinstance(t, ArrayType):
        vals, p = _independent_fields([t.elementType] * count, body, p, [t.containsNull] * count)
        assert p == n
        return vals, end
    keys = []
    for _ in range(count):
        k, p = _independent_value(t.keyType, body, p)
        keys.append(k)
    vals, p = _independent_fields([t.valueType] * count, body, p, [t.valueContainsNull] * count)
    assert p == n
    return dict(zip(keys, vals)), end


def test_the_worked_example_of_the_format_doc() -> None:
    """The example in docs/design.md, "Nested fields", byte for byte."""
    c = RowCodec("xs array<int>, m map<string, struct<n: bigint>>", var="v", version=1)
    blob = c.encode_one(([7, None], {"a": (5,), "b": None}))
    assert blob.hex(" ") == ("00 01 00 "                                      # version 1, no null field
                             "09 00 00 00 02 00 00 00 02 07 00 00 00 "        # xs: 9 bytes, 2 elements, 2nd null
                             "1c 00 00 00 02 00 00 00 01 00 00 00 61 "        # m: 28 bytes, 2 entries, key "a"
                             "01 00 00 00 62 02 "                             # key "b"; 2nd value null
                             "09 00 00 00 00 05 00 00 00 00 00 00 00")        # "a": struct, no null, n = 5
    assert c.decode_one(blob) == ([7, None], {"a": Row(n=5), "b": None})


# ---- canonical map keys, order, errors ------------------------------------------------------------

def test_a_map_keeps_its_order_in_a_value_and_is_canonical_in_a_key() -> None:
    value = RowCodec("m map<string, int>", var="v", version=1)
    got = value.decode_one(value.encode_one(({"b": 1, "a": 2},)))[0]
    assert list(got) == ["b", "a"]  # as Spark's maps keep the order they were built in
    key = RowCodec("m map<string, int>, s struct<x: double>", var="k", version=None)
    one = key.encode_one(({"b": 1, "a": 2}, (0.0,)))
    assert key.encode_one(({"a": 2, "b": 1}, (-0.0,))) == one  # equal keys, equal bytes
    assert key.encode([({"a": 2, "b": 1}, (-0.0,))] * VEC)[0] == one


@pytest.mark.parametrize("ddl,value,field,words", [
    ("m map<string, int>", {None: 1}, "m", "null (Spark refuses null map keys)"),
    ("m map<double, int>", {math.nan: 1, float("nan"): 2}, "m", "same value (Spark refuses duplicate map keys)"),
    ("a array<int>", [1, "2"], "a", "a.element: expected int"),
    ("a array<int>", 5, "a", "expected an array (list) at a"),
    ("m map<string, int>", [("a", 1)], "m", "expected a map (dict) at m"),
    ("s struct<x: int NOT NULL>", (None,), "s", "s.x is not nullable"),
    ("s struct<x: int, y: int>", (1,), "s", "1 values for the 2 fields of s"),
    ("s struct<x: int>", {"z": 1}, "s", "unknown field 'z' in s"),
    ("s struct<x: array<struct<y: bigint>>>", ([(1,), ("no",)],), "s", "s.x.element.y: expected long"),
])
def test_values_that_do_not_fit_name_the_path(ddl: str, value: Any, field: str, words: str) -> None:
    c = RowCodec(ddl, var="v", version=1)
    for encode in (lambda: c.encode_one((value,)), lambda: c.encode([(value,)] * VEC)):
        with pytest.raises(StateValueError) as ei:
            encode()
        assert ei.value.field == field and ei.value.row == 0 and words in str(ei.value), str(ei.value)


def _nested_blob(body: bytes) -> bytes:
    return b"\x00\x01\x00" + struct.pack("<I", len(body)) + body  # version 1, no null, one nested field


@pytest.mark.parametrize("body,words", [
    (b"\x02\x00\x00", "truncated"),                                    # an array's count cut short
    (struct.pack("<I", 0xFFFFFFFF) + b"\x00", "more than the value holds"),  # no allocation of 2^32 elements
    (struct.pack("<I", 1) + b"\x00", "truncated"),                     # one element, no bytes for it
    (struct.pack("<I", 1) + b"\x02" + b"\x00" * 4, "null bits set past the last"),
    (struct.pack("<I", 1) + b"\x00" + b"\x01\x00\x00\x00" + b"!", "1 bytes after the value"),
])
def test_corrupt_nested_bytes_are_refused_on_both_paths(body: bytes, words: str) -> None:
    c = RowCodec("a array<int>", var="v", version=1)
    for decode in (lambda b: c.decode_one(b), lambda b: c.decode([b] * VEC)):
        with pytest.raises(CorruptValueError) as ei:
            decode(_nested_blob(body))
        assert ei.value.field == "a" and words in str(ei.value), str(ei.value)


# ---- schema evolution inside nested types ----------------------------------------------------------

def test_nested_evolution_follows_the_top_level_rules() -> None:
    old = parse_schema("s struct<a: int, c: string>, l array<struct<x: float>>, m map<int, struct<z: int>>", var="v")
    new = parse_schema("s struct<b: string, a: bigint>, l array<struct<x: double, w: int>>, "
                       "m map<int, struct<y: string, z: bigint>>", var="v")
    assert evolve(old, new, "v") == ["added s.b string", "widened s.a int -> bigint", "removed s.c",
                                     "widened l.element.x float -> double", "added l.element.w int",
                                     "added m.value.y string", "widened m.value.z int -> bigint"]
    c1 = RowCodec(old, var="v", version=1)
    c2 = RowCodec(new, var="v", version=2, history={1: old})
    blob = c1.encode_one(((5, "gone"), [(1.5,), None], {3: (9,)}))
    want = (Row(b=None, a=5), [Row(x=1.5, w=None), None], {3: Row(y=None, z=9)})
    assert _plain(c2.decode_one(blob)) == _plain(want)
    assert [_plain(r) for r in c2.decode([blob] * VEC)] == [_plain(want)] * VEC


@pytest.mark.parametrize("old,new,field,words", [
    ("m map<int, int>", "m map<bigint, int>", "m.key", "key type cannot change"),
    ("a array<int>", "a array<string>", "a.element", "type changed from int to string"),
    ("s struct<a: int>", "s struct<a: int, b: int NOT NULL>", "s.b", "must be nullable"),
    ("a array<int>", "a int", "a", "type changed from array<int> to int"),
])
def test_nested_changes_spark_does_not_allow_are_refused(old: str, new: str, field: str, words: str) -> None:
    with pytest.raises(IncompatibleSchemaError) as ei:
        evolve(parse_schema(old, var="v"), parse_schema(new, var="v"), "v")
    assert ei.value.field == field and words in str(ei.value)


def test_an_array_or_map_may_start_to_hold_nulls_but_not_stop() -> None:
    no_nulls = StructType([StructField("a", ArrayType(IntegerType(), False))])
    nulls = StructType([StructField("a", ArrayType(IntegerType(), True))])
    assert evolve(no_nulls, nulls, "v") == ["made a.element nullable"]
    with pytest.raises(IncompatibleSchemaError, match="field 'a.element': a nullable field cannot become"):
        evolve(nulls, no_nulls, "v")
