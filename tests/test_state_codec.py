"""rhino.spark's state row codec and schemas (spark_integration/spark/state/{codec,schema}.py).

No Spark session and no JVM: schemas are parsed in Python, and PySpark's own
``toInternal`` / ``fromInternal`` (pure Python) are the oracle for what Spark
stores and what ``ValueState.get`` returns. The format is also read by an
independent decoder written from the format's description (docs/design.md,
"State row format"), run in a subprocess that imports only pyarrow and the
standard library.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
from decimal import Context, Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (BinaryType, BooleanType, ByteType, CharType, DateType, DecimalType, DoubleType,
                               FloatType, IntegerType, LongType, Row, ShortType, StringType, StructField,
                               StructType, TimestampNTZType, TimestampType, VarcharType)

from rhino.spark.state import codec as codec_mod
from rhino.spark.state.codec import RowCodec
from rhino.spark.state.schema import (CorruptValueError, IncompatibleSchemaError, SchemaParseError,
                                      StateSchemaError, StateValueError, UnknownVersionError,
                                      UnsupportedTypeError, evolve, parse_schema, type_kind)

VEC = codec_mod._VECTOR_MIN  # batches of at least this many rows take the vectorized path


@pytest.fixture(autouse=True, scope="module")
def _utc() -> Any:
    """Naive timestamps are local time (as in PySpark): the module runs in UTC, one test elsewhere."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


# ---- schemas -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ddl,expected", [
    ("c long, name string", StructType([StructField("c", LongType()), StructField("name", StringType())])),
    ("auction BIGINT", StructType([StructField("auction", LongType())])),
    ("a: byte, b: decimal(  16 , 8   ) ",
     StructType([StructField("a", ByteType()), StructField("b", DecimalType(16, 8))])),
    ("a tinyint, b smallint, c short, d int, e integer, f real, g float, h double, i boolean",
     StructType([StructField("a", ByteType()), StructField("b", ShortType()), StructField("c", ShortType()),
                 StructField("d", IntegerType()), StructField("e", IntegerType()), StructField("f", FloatType()),
                 StructField("g", FloatType()), StructField("h", DoubleType()), StructField("i", BooleanType())])),
    ("d DATE, t TIMESTAMP, l timestamp_ltz, n TIMESTAMP_NTZ, b binary",
     StructType([StructField("d", DateType()), StructField("t", TimestampType()),
                 StructField("l", TimestampType()), StructField("n", TimestampNTZType()),
                 StructField("b", BinaryType())])),
    ("x decimal, y dec(5), z numeric(38, 38)",
     StructType([StructField("x", DecimalType(10, 0)), StructField("y", DecimalType(5, 0)),
                 StructField("z", DecimalType(38, 38))])),
    ("a DOUBLE, b CHAR( 50 ), c varchar(3)",
     StructType([StructField("a", DoubleType()), StructField("b", CharType(50)), StructField("c", VarcharType(3))])),
    ("struct<a:int NOT NULL, `b c`: string COMMENT 'the ''b'' \\'field\\''>",
     StructType([StructField("a", IntegerType(), False),
                 StructField("b c", StringType(), True, {"comment": "the b 'field'"})])),
    ("`we``ird` long not null", StructType([StructField("we`ird", LongType(), False)])),
])
def test_ddl_parses_like_spark(ddl: str, expected: StructType) -> None:
    got = parse_schema(ddl, var="v")
    assert got == expected
    assert [f.metadata for f in got.fields] == [f.metadata for f in expected.fields]
    assert parse_schema(expected, var="v") is expected


@pytest.mark.parametrize("ddl,cls,field,words", [
    ("a array<interval day>", UnsupportedTypeError, "a.element", "type interval"),
    ("a long, m map<map<int, int>, int>", UnsupportedTypeError, "m.key", "cannot be or hold a map"),
    ("a long, s struct<x: int, x: long>", SchemaParseError, "s.x", "appears twice"),
    ("a long, s struct<>", SchemaParseError, "s", "the struct has no field"),
    ("a array<int", SchemaParseError, "a", "expected '>'"),
    ("m map<string>", SchemaParseError, "m", "expected ','"),
    ("i interval day", UnsupportedTypeError, "i", "type interval"),
    ("v variant", UnsupportedTypeError, "v", "type variant"),
    ("s string collate UTF8_LCASE", UnsupportedTypeError, "s", "collated"),
    ("d decimal(40, 2)", UnsupportedTypeError, "d", "out of range"),
    ("a long,", SchemaParseError, None, "expected a field name"),
    ("a long b long", SchemaParseError, None, "unexpected text"),
    ("a", SchemaParseError, "a", "expected a type"),
    ("a long not", SchemaParseError, "a", "'null'"),
    ("a char", SchemaParseError, "a", "needs a length"),
    ("a long, A long, a int", SchemaParseError, "a", "appears twice"),
    ("", SchemaParseError, None, "expected a field name"),
])
def test_ddl_errors_name_the_variable_and_field(ddl: str, cls: type, field: Any, words: str) -> None:
    with pytest.raises(cls) as ei:
        parse_schema(ddl, var="counts")
    assert isinstance(ei.value, StateSchemaError) and isinstance(ei.value, ValueError)
    assert ei.value.var == "counts" and ei.value.field == field
    assert "state 'counts'" in str(ei.value) and words in str(ei.value)
    if field is not None:
        assert f"field {field!r}" in str(ei.value)
    if cls is UnsupportedTypeError and words not in ("out of range", "cannot be or hold a map"):
        assert "supported types: boolean" in str(ei.value)


def test_struct_type_with_unsupported_field_is_refused() -> None:
    from pyspark.sql.types import ArrayType, DayTimeIntervalType, MapType
    bad = DayTimeIntervalType()
    for dt_, where in ((ArrayType(bad), "n.element"), (MapType(StringType(), bad), "n.value"),
                       (StructType([StructField("x", bad)]), "n.x")):
        with pytest.raises(UnsupportedTypeError, match=f"state 'v', field '{where}': type .* is not supported"):
            parse_schema(StructType([StructField("a", LongType()), StructField("n", dt_)]), var="v")
    with pytest.raises(SchemaParseError, match="StructType or a DDL string, not int"):
        parse_schema(5, var="v")


def _s(ddl: str) -> StructType:
    return parse_schema(ddl, var="v")


@pytest.mark.parametrize("old,new,changes", [
    ("a long", "a long", []),
    ("a long", "a long, b string", ["added b string"]),
    ("a long, b string", "a long", ["removed b"]),
    ("a long, b string", "b string, a long", ["reordered"]),
    ("a int, b float", "a long, b double", ["widened a int -> bigint", "widened b float -> double"]),
    ("a tinyint", "a smallint", ["widened a tinyint -> smallint"]),
    ("a long not null", "a long", ["made a nullable"]),
    ("a string", "a varchar(3)", []),
])
def test_evolve_allows_what_spark_allows(old: str, new: str, changes: list[str]) -> None:
    assert evolve(_s(old), _s(new), "st") == changes


@pytest.mark.parametrize("old,new,field,words", [
    ("a long", "a int", "a", "type changed from bigint to int"),
    ("a long", "a string", "a", "type changed"),
    ("a double", "a float", "a", "type changed"),
    ("a int", "a double", "a", "type changed"),
    ("a decimal(10,2)", "a decimal(12,2)", "a", "type changed"),
    ("a string", "a binary", "a", "type changed"),
    ("a long", "a long, b long not null", "b", "must be nullable"),
    ("a long", "a long not null", "a", "cannot become non-nullable"),
])
def test_evolve_refuses_the_rest(old: str, new: str, field: str, words: str) -> None:
    with pytest.raises(IncompatibleSchemaError) as ei:
        evolve(_s(old), _s(new), "st")
    assert ei.value.var == "st" and ei.value.field == field
    assert str(ei.value).startswith(f"state 'st', field {field!r}: ") and words in str(ei.value)


# ---- random rows -------------------------------------------------------------------------------------
_KINDS = ["byte", "short", "int", "long", "float", "double", "boolean", "string", "binary", "date",
          "timestamp", "timestamp_ntz", "decimal"]
_TYPES = {"byte": ByteType(), "short": ShortType(), "int": IntegerType(), "long": LongType(),
          "float": FloatType(), "double": DoubleType(), "boolean": BooleanType(), "string": StringType(),
          "binary": BinaryType(), "date": DateType(), "timestamp": TimestampType(),
          "timestamp_ntz": TimestampNTZType()}
_TIMES = dict(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))


def _value_strategy(t: Any) -> st.SearchStrategy:
    if isinstance(t, DecimalType):
        top = 10 ** t.precision - 1  # unscaled; st.decimals rounds bounds of more than 28 digits
        return st.integers(-top, top).map(lambda u: Decimal(u).scaleb(-t.scale, Context(prec=80)))
    bits = {ByteType: 7, ShortType: 15, IntegerType: 31, LongType: 63}.get(type(t))
    if bits is not None:
        return st.integers(-(1 << bits), (1 << bits) - 1)
    return {FloatType: st.floats(width=32), DoubleType: st.floats(), BooleanType: st.booleans(),
            StringType: st.text(), BinaryType: st.binary(), DateType: st.dates(),
            TimestampType: st.datetimes(**_TIMES) | st.datetimes(**_TIMES, timezones=st.just(dt.timezone.utc)),
            TimestampNTZType: st.datetimes(**_TIMES)}[type(t)]


@st.composite
def schemas(draw: Any, max_fields: int = 12) -> StructType:
    fields = []
    for i in range(draw(st.integers(1, max_fields))):
        kind = draw(st.sampled_from(_KINDS))
        if kind == "decimal":
            p = draw(st.integers(1, 38))
            t = DecimalType(p, draw(st.integers(0, p)))
        else:
            t = _TYPES[kind]
        fields.append(StructField(f"f{i}", t, draw(st.booleans())))
    return StructType(fields)


@st.composite
def schema_and_rows(draw: Any, min_rows: int = 0, max_rows: int = 40) -> tuple[StructType, list[tuple]]:
    schema = draw(schemas())
    cols = [_value_strategy(f.dataType) for f in schema.fields]
    row = st.tuples(*[st.none() | c if f.nullable else c for f, c in zip(schema.fields, cols)])
    return schema, draw(st.lists(row, min_size=min_rows, max_size=max_rows))


def _pyspark_view(schema: StructType, row: tuple) -> tuple:
    """What PySpark stores for ``row`` and gives back (toInternal, then fromInternal); floats as float32
    round them, decimals rounded to the scale, binary as bytes."""
    out = []
    for f, v in zip(schema.fields, schema.fromInternal(schema.toInternal(row))):
        if v is None:
            out.append(None)
        elif isinstance(f.dataType, FloatType):
            out.append(float(np.float32(v)))
        elif isinstance(f.dataType, DecimalType):
            out.append(v.quantize(Decimal(1).scaleb(-f.dataType.scale), context=Context(prec=80)))
        elif isinstance(f.dataType, BinaryType):
            out.append(bytes(v))
        else:
            out.append(v)
    return tuple(out)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b and (not isinstance(a, Decimal) or a.as_tuple() == b.as_tuple())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_and_rows(), st.sampled_from([None, 0, 7, 65535]))
def test_round_trip_random_rows(case: tuple[StructType, list[tuple]], version: Any) -> None:
    schema, rows = case
    codec = RowCodec(schema, var="v", version=version)
    per_row = [codec.encode_one(r) for r in rows]
    padded = rows + rows[:1] * max(0, VEC - len(rows))  # at least VEC rows: the vectorized path
    vectorized = codec.encode(padded)
    assert vectorized[:len(rows)] == per_row  # the two paths write the same bytes
    if version is not None:
        assert all(b[:2] == version.to_bytes(2, "big") for b in per_row)
    want = [_pyspark_view(schema, r) for r in rows]
    assert _same(tuple(codec.decode(vectorized)[:len(rows)]), tuple(want))
    assert _same(tuple(codec.decode_one(b) for b in per_row), tuple(want))


def test_decode_returns_what_pyspark_returns() -> None:
    codec = RowCodec("i int, l long, f float, d double, b boolean, s string, y binary, day date, "
                     "t timestamp, n timestamp_ntz, m decimal(7,3)", var="v", version=1)
    row = (1, 2, 0.1, 0.1, True, "é", b"\x00\xff", dt.date(1969, 12, 31), dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
           dt.datetime(1, 1, 1), Decimal("1.5"))
    for got in (codec.decode([codec.encode_one(row)])[0], codec.decode(codec.encode([row] * VEC))[0]):
        assert _same(got, (1, 2, float(np.float32(0.1)), 0.1, True, "é", b"\x00\xff", dt.date(1969, 12, 31),
                           dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(1, 1, 1), Decimal("1.500")))
        assert [type(v) for v in got] == [int, int, float, float, bool, str, bytes, dt.date, dt.datetime,
                                          dt.datetime, Decimal]


def test_naive_timestamps_are_local_time_as_in_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    """TimestampType takes a naive datetime in the process's time zone (time.mktime), as PySpark does."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:  # monkeypatch puts back the module's TZ after the test; tzset is ours to redo
        codec = RowCodec("t timestamp, n timestamp_ntz", var="v", version=None)
        naive = dt.datetime(2024, 7, 1, 12, 0)
        aware = dt.datetime(2024, 7, 1, 16, 0, tzinfo=dt.timezone.utc)
        b = codec.encode_one((naive, naive))
        assert b == codec.encode_one((aware, naive)) == codec.encode([(naive, naive)] * VEC)[0]
        us = int.from_bytes(b[1:9], "little")
        assert us == TimestampType().toInternal(naive) == 1719849600 * 10**6
        assert int.from_bytes(b[9:17], "little") == TimestampNTZType().toInternal(naive) == 1719835200 * 10**6
        assert codec.decode_one(b) == (naive, naive)
    finally:
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.datetimes(**_TIMES) | st.datetimes(**_TIMES, timezones=st.just(dt.timezone(dt.timedelta(hours=5)))),
                min_size=1, max_size=40))
def test_timestamps_in_a_zone_with_dst_match_pyspark(values: list[dt.datetime]) -> None:
    os.environ["TZ"] = "Europe/Berlin"
    time.tzset()
    try:
        codec = RowCodec("t timestamp", var="v", version=None)
        want = [TimestampType().toInternal(v) for v in values]
        rows = [(v,) for v in values]
        for blobs in ([codec.encode_one(r) for r in rows], codec.encode(rows * VEC)[:len(rows)]):
            assert [int.from_bytes(b[1:], "little", signed=True) for b in blobs] == want
            assert [r[0] for r in codec.decode(blobs)] == [TimestampType().fromInternal(us) for us in want]
    finally:
        os.environ["TZ"] = "UTC"
        time.tzset()


# ---- the values a processor writes -----------------------------------------------------------------------
def test_numpy_and_pandas_scalars_are_converted_as_spark_converts_them() -> None:
    codec = RowCodec("i int, l long, f float, d double, b boolean, s string, y binary, day date, "
                     "t timestamp, n timestamp_ntz, m decimal(10,2)", var="v", version=2)
    plain = (3, -4, 1.5, 2.25, True, "x", b"ab", dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 6),
             dt.datetime(2024, 1, 2, 3, 4, 5, 6), Decimal("1.25"))
    ts = pd.Timestamp("2024-01-02 03:04:05.000006789")  # nanoseconds are dropped, as Spark does
    numpyish = (np.int32(3), np.int64(-4), np.float32(1.5), np.float64(2.25), np.bool_(True), np.str_("x"),
                bytearray(b"ab"), pd.Timestamp("2024-01-02 17:00"), ts,
                np.datetime64("2024-01-02T03:04:05.000006789"), Decimal("1.25"))
    aware = (3, -4, 1.5, 2.25, True, "x", memoryview(b"ab"), np.datetime64("2024-01-02"),
             pd.Timestamp("2024-01-02 04:04:05.000006", tz="Europe/Berlin"), ts.to_pydatetime(warn=False),
             Decimal("1.245"))  # rounded half up to the scale
    want = codec.encode_one(plain)
    for row in (numpyish, aware):
        assert codec.encode_one(row) == want
        assert codec.encode([row] * VEC) == [want] * VEC
    assert codec.decode_one(want) == plain
    nulls = (pd.NA, None, np.nan, None, None, None, None, pd.NaT, np.datetime64("NaT"), None, None)
    got = codec.decode(codec.encode([nulls] * VEC))[0]
    assert got[:2] == (None, None) and math.isnan(got[2]) and got[3:] == (None,) * 8


def test_rows_as_tuples_lists_rows_and_dicts() -> None:
    codec = RowCodec("a long, b string", var="v", version=1)
    want = codec.encode_one((1, "x"))
    forms = [(1, "x"), [1, "x"], Row(a=1, b="x"), Row("a", "b")(1, "x"), {"b": "x", "a": 1}]
    for form in forms:
        assert codec.encode_one(form) == want
    assert codec.encode(forms * 4) == [want] * len(forms) * 4
    assert codec.decode_one(codec.encode_one({"a": 1})) == (1, None)  # a missing nullable field is null
    # A Row is a tuple: PySpark's StructType.toInternal takes its values in order, whatever their names.
    assert codec.encode_one(Row(x=1, y="x")) == want
    with pytest.raises(StateValueError, match="row 0, field 'a': expected long"):
        codec.encode_one(Row(b="x", a=1))


_GOOD = {"byte": 1, "short": 1, "int": 1, "long": 1, "float": 1.0, "double": 1.0, "boolean": True, "string": "s",
         "binary": b"b", "date": dt.date(2024, 1, 1), "timestamp": dt.datetime(2024, 1, 1),
         "timestamp_ntz": dt.datetime(2024, 1, 1), "decimal": Decimal(1)}


def test_batches_may_be_iterables_and_blobs_any_bytes_like() -> None:
    codec = RowCodec("a long, s string", var="v", version=1)
    rows = [(i, str(i)) for i in range(3 * VEC)]
    blobs = codec.encode(r for r in rows)
    assert blobs == codec.encode(rows) and codec.encode([]) == [] and codec.decode([]) == []
    for n in (1, len(rows)):
        assert codec.decode(memoryview(b) for b in blobs[:n]) == rows[:n]
        assert codec.decode([bytearray(b) for b in blobs[:n]]) == rows[:n]


def _error(codec: RowCodec, rows: list[Any]) -> StateSchemaError:
    """The error of encoding ``rows`` on both paths (one row; a vectorized batch): the same one."""
    with pytest.raises(StateValueError) as one:
        codec.encode(rows[-1:])
    assert one.value.row == 0
    batch = rows[:-1] * VEC + rows[-1:]
    with pytest.raises(StateValueError) as many:
        codec.encode(batch)
    assert many.value.row == len(batch) - 1 >= VEC
    assert (type(one.value), one.value.var, one.value.field) == (type(many.value), many.value.var,
                                                                   many.value.field)
    assert str(many.value) == str(one.value).replace("row 0", f"row {len(batch) - 1}")
    return many.value


@pytest.mark.parametrize("ddl,bad,field,words", [
    ("c long", ("3",), "c", "expected long (int), got str '3'"),
    ("c long", (1.0,), "c", "expected long (int), got float 1.0"),
    ("c long", (True,), "c", "expected long (int), got bool True"),
    ("c long", (2**63,), "c", "out of range for long"),
    ("c int", (2**31,), "c", "out of range for int"),
    ("c tinyint", (np.int64(128),), "c", "out of range for byte"),
    ("c double", ("1.5",), "c", "expected double (float), got str"),
    ("c double", (10**400,), "c", "out of range for double"),
    ("c boolean", (1,), "c", "expected boolean (bool), got int 1"),
    ("a long, s string", (1, b"x"), "s", "expected string (str), got bytes"),
    ("a long, s string", (1, "\ud800"), "s", "not valid Unicode"),
    ("y binary", ("x",), "y", "expected binary (bytes), got str"),
    ("d date", ("2024-01-01",), "d", "expected date (datetime.date), got str"),
    ("t timestamp", (dt.date(2024, 1, 1),), "t", "expected timestamp (datetime), got date"),
    ("m decimal(4,2)", (Decimal("100"),), "m", "out of range for decimal(4,2)"),
    ("m decimal(4,2)", (1.5,), "m", "expected decimal(4,2) (Decimal or int), got float"),
    ("m decimal(4,2)", (Decimal("NaN"),), "m", "cannot be stored"),
    ("c long not null, d long", (None, 1), "c", "not nullable, got None"),
    ("c long, d long not null", (1, pd.NA), "d", "not nullable, got None"),
    ("c long, d long not null", {"c": 1}, "d", "not nullable, got None"),
    ("c long, d long", (1,), "d", "1 values for 2 fields (c, d)"),
    ("c long, d long", (1, 2, 3), None, "3 values for 2 fields (c, d)"),
    ("c long, d long", {"c": 1, "e": 2}, None, "unknown field 'e' (the fields are c, d)"),
    ("c long", 5, None, "a state row is a tuple, a Row or a dict, not int"),
])
def test_wrong_values_name_the_variable_row_and_field(ddl: str, bad: Any, field: Any, words: str) -> None:
    codec = RowCodec(ddl, var="count", version=1)
    good = {"c": 1, "d": 2} if isinstance(bad, dict) else tuple(_GOOD[type_kind(f.dataType)] for f in codec.schema.fields)
    e = _error(codec, [good, bad])
    assert e.var == "count" and e.field == field
    assert str(e).startswith("state 'count', row ")
    assert words in str(e)
    if field is not None:
        assert f"field {field!r}: " in str(e)


# ---- map keys: canonical bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize("ddl,same", [
    ("k long", [(1,), (np.int64(1),), (np.int8(1),), [1], {"k": 1}, Row(k=1)]),
    ("k double", [(0.0,), (-0.0,), (np.float64(-0.0),), (0,), (np.int64(0),)]),
    ("k double", [(float("nan"),), (-float("nan"),), (np.float64("nan"),), (np.float32("nan"),)]),
    ("k float", [(0.5,), (np.float32(0.5),), (np.float64(0.5),)]),
    ("k decimal(10,2)", [(Decimal("1"),), (Decimal("1.0"),), (Decimal("1.000"),), (1,), (Decimal("-0.00") + 1,)]),
    ("k string, n long", [("é", 1), (np.str_("é"), np.int32(1))]),
    ("k timestamp", [(dt.datetime(2024, 1, 1),), (pd.Timestamp("2024-01-01"),), (np.datetime64("2024-01-01"),),
                     (dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),)]),
    ("k date", [(dt.date(2024, 1, 1),), (np.datetime64("2024-01-01"),), (pd.Timestamp("2024-01-01"),)]),
    ("k boolean", [(True,), (np.bool_(True),)]),
    ("k binary", [(b"a",), (bytearray(b"a"),), (memoryview(b"a"),), (np.bytes_(b"a"),)]),
])
def test_key_bytes_are_canonical(ddl: str, same: list[Any]) -> None:
    codec = RowCodec(ddl, var="m", version=None)
    want = codec.encode_one(same[0])
    assert all(codec.encode_one(k) == want for k in same)
    assert codec.encode(same * VEC) == [want] * len(same) * VEC
    assert _same(tuple(codec.decode([want] * VEC)), (codec.decode_one(want),) * VEC)


def test_key_bytes_have_no_version_and_differ_for_different_keys() -> None:
    codec = RowCodec("a long, b string", var="m", version=None)
    assert codec.encode_one((1, "x")) == bytes([0]) + (1).to_bytes(8, "little") + b"\x01\x00\x00\x00x"
    keys = [(i, s) for i in (0, 1, -1, 256) for s in ("", "x", "xy", None)]
    assert len(set(codec.encode(keys * 2))) == len(keys)


# ---- evolution -------------------------------------------------------------------------------------------
def test_old_values_stay_readable_after_allowed_changes() -> None:
    v1 = RowCodec("a int, b float, gone string, c long not null", var="st", version=1)
    v2 = RowCodec("c long, b double, added date, a long", var="st", version=2,
                  history={1: "a int, b float, gone string, c long not null"})
    old_rows = [(i, i / 4, f"s{i}", -i) for i in range(40)] + [(None, None, None, 7)]
    old = v1.encode(old_rows)
    new = v2.encode([(9, 0.1, dt.date(2024, 1, 1), 2**40)])
    want_old = [(c, b, None, a) for a, b, _g, c in old_rows]
    assert v2.decode(old) == want_old  # vectorized, one version
    assert [v2.decode_one(b) for b in old] == want_old
    mixed = v2.decode(old + new + old[:3])
    assert mixed == want_old + [(9, 0.1, dt.date(2024, 1, 1), 2**40)] + want_old[:3]
    assert v2.history == {1: v1.schema, 2: v2.schema}


def test_widened_float_reads_the_float32_value() -> None:
    v1 = RowCodec("x float", var="st", version=1)
    v2 = RowCodec("x double", var="st", version=2, history={1: "x float"})
    assert v2.decode_one(v1.encode_one((0.1,))) == (float(np.float32(0.1)),)


def test_incompatible_history_and_unknown_versions_are_refused() -> None:
    with pytest.raises(IncompatibleSchemaError, match="state 'st', field 'a': type changed from bigint to int"):
        RowCodec("a int", var="st", version=2, history={1: "a long"})
    with pytest.raises(IncompatibleSchemaError, match="state 'st', field 'b': a field added .* must be nullable"):
        RowCodec("a long, b long not null", var="st", version=2, history={1: "a long"})
    with pytest.raises(StateSchemaError, match="history\\[2\\] is not the schema of the current version"):
        RowCodec("a long", var="st", version=2, history={2: "a int"})
    with pytest.raises(StateSchemaError, match="an unversioned codec"):
        RowCodec("a long", var="st", version=None, history={1: "a long"})
    with pytest.raises(StateSchemaError, match=r"a schema version is an int in \[0, 65535\], not 65536"):
        RowCodec("a long", var="st", version=65536)
    v3 = RowCodec("a long", var="st", version=3)
    v2 = RowCodec("a long", var="st", version=2, history={1: "a long"})
    for blobs in ([v3.encode_one((1,))], v2.encode([(1,)] * VEC) + v3.encode([(1,)])):
        with pytest.raises(UnknownVersionError) as ei:
            v2.decode(blobs)
        assert ei.value.row == len(blobs) - 1
        assert "schema version 3, which this codec does not know (known: [1, 2])" in str(ei.value)


@pytest.mark.parametrize("ddl,blob,words", [
    ("a long", b"\x00", "shorter than the schema version"),
    ("a long", b"\x00\x01", "truncated in the null bitmap"),
    ("a long", b"\x00\x01\x00\x01\x02", "truncated"),
    ("a long", b"\x00\x01\x00" + bytes(8) + b"!", "1 bytes after the last field"),
    ("a long", b"\x00\x01\x02", "null bits set past the last field"),
    ("a long not null", b"\x00\x01\x01", "null in a non-nullable field"),
    ("s string", b"\x00\x01\x00\x05\x00\x00\x00abc", "a length past the end"),
    ("s string", b"\x00\x01\x00\x02\x00\x00\x00\xff\xfe", "not valid UTF-8"),
    ("b boolean", b"\x00\x01\x00\x02", "a stored boolean is not 0 or 1"),
    ("d date", b"\x00\x01\x00\xff\xff\xff\x7f", "a stored date is out of range"),
    ("m decimal(2,0)", b"\x00\x01\x00" + (100).to_bytes(16, "little"), "out of its precision"),
])
def test_corrupt_values_are_refused_on_both_paths(ddl: str, blob: bytes, words: str) -> None:
    codec = RowCodec(ddl, var="st", version=1)
    good = codec.encode_one((None,) if "not null" not in ddl else (1,))
    for blobs in ([blob], [good] * VEC + [blob]):
        with pytest.raises(CorruptValueError) as ei:
            codec.decode(blobs)
        assert ei.value.var == "st" and ei.value.row == len(blobs) - 1 and words in str(ei.value)


# ---- the documented format -------------------------------------------------------------------------------
def test_the_worked_example_of_the_format_doc() -> None:
    """The example in docs/design.md, "State row format", byte for byte."""
    codec = RowCodec("id long, name string, score double, day date, tag string", var="v", version=2)
    blob = codec.encode_one((42, "Zoë", None, dt.date(2024, 3, 1), None))
    assert blob.hex(" ") == ("00 02 14 2a 00 00 00 00 00 00 00 04 00 00 00 5a 6f c3 ab 47 4d 00 00")
    assert codec.decode([blob] * VEC)[0] == codec.decode_one(blob) == (42, "Zoë", None, dt.date(2024, 3, 1), None)


# The independent decoder: written from the format's description, with pyarrow and the standard library
# only. It reads one JSON request a line ({"fields": [...], "version": v or null, "blobs": [hex]}) and
# answers a line: the decoded rows as an Arrow IPC stream (base64), one column per field.
INDEPENDENT_DECODER = r'''
import sys
sys.modules["pandas"] = sys.modules["numpy"] = sys.modules["pickle"] = None  # pyarrow runs without them
import base64, decimal, json, struct
import pyarrow as pa

FIXED = {"byte": ("<b", pa.int8()), "short": ("<h", pa.int16()), "int": ("<i", pa.int32()),
         "long": ("<q", pa.int64()), "float": ("<f", pa.float32()), "double": ("<d", pa.float64()),
         "boolean": ("<B", pa.bool_()), "date": ("<i", pa.date32()),
         "timestamp": ("<q", pa.timestamp("us", tz="UTC")), "timestamp_ntz": ("<q", pa.timestamp("us"))}
CTX = decimal.Context(prec=80)

def arrow_type(f):
    if f["type"] == "decimal":
        return pa.decimal128(f["precision"], f["scale"])
    return FIXED[f["type"]][1] if f["type"] in FIXED else (pa.string() if f["type"] == "string" else pa.binary())

def decode(fields, version, blobs):
    cols = [[] for _ in fields]
    nb = (len(fields) + 7) // 8
    for blob in blobs:
        pos = 0
        if version is not None:
            assert struct.unpack_from(">H", blob)[0] == version
            pos = 2
        nulls = int.from_bytes(blob[pos:pos + nb], "little")
        pos += nb
        for i, f in enumerate(fields):
            t = f["type"]
            if nulls >> i & 1:
                v = None
            elif t in FIXED:
                v = struct.unpack_from(FIXED[t][0], blob, pos)[0]
                pos += struct.calcsize(FIXED[t][0])
                v = bool(v) if t == "boolean" else v
            elif t == "decimal":
                u = int.from_bytes(blob[pos:pos + 16], "little", signed=True)
                v = decimal.Decimal(u).scaleb(-f["scale"], CTX)
                pos += 16
            else:
                n = struct.unpack_from("<I", blob, pos)[0]
                v = blob[pos + 4:pos + 4 + n]
                v = v.decode("utf-8") if t == "string" else v
                pos += 4 + n
            cols[i].append(v)
        assert pos == len(blob), "trailing bytes"
    return pa.table([pa.array(c, type=arrow_type(f)) for c, f in zip(cols, fields)],
                    names=[f["name"] for f in fields])

for line in sys.stdin:
    req = json.loads(line)
    table = decode(req["fields"], req["version"], [bytes.fromhex(b) for b in req["blobs"]])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "pandas", "pickle", "rhino", "pyspark")
                    and sys.modules[m] is not None)
    print(json.dumps({"ipc": base64.b64encode(sink.getvalue().to_pybytes()).decode(), "loaded": loaded}),
          flush=True)
'''


@pytest.fixture(scope="module")
def independent_decoder() -> Any:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([sys.executable, "-I", "-c", INDEPENDENT_DECODER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)

    def decode(schema: StructType, version: Any, blobs: list[bytes]) -> pa.Table:
        fields = []
        for f in schema.fields:
            kind = type_kind(f.dataType)
            d = {"name": f.name, "type": kind}
            if kind == "decimal":
                d.update(precision=f.dataType.precision, scale=f.dataType.scale)
            fields.append(d)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"fields": fields, "version": version, "blobs": [b.hex() for b in blobs]}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, "the independent decoder failed (see its stderr above)"
        answer = json.loads(line)
        assert answer["loaded"] == []  # neither numpy, pandas, pickle, rhino nor pyspark was imported
        return pa.ipc.open_stream(base64.b64decode(answer["ipc"])).read_all()

    yield decode
    proc.stdin.close()  # type: ignore[union-attr]
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()  # type: ignore[union-attr]


def _as_internal(schema: StructType, rows: list[tuple]) -> list[tuple]:
    """Rows with dates and timestamps as Spark's internal ints (days, µs) and floats as float32 values."""
    return [tuple(None if v is None else f.dataType.toInternal(v) if isinstance(f.dataType, (DateType, TimestampType,
                                                                                              TimestampNTZType))
                  else v for f, v in zip(schema.fields, r)) for r in rows]


def _arrow_internal(table: pa.Table) -> list[tuple]:
    cols = []
    for col in table.columns:
        if pa.types.is_timestamp(col.type):
            col = col.cast(pa.int64())
        elif pa.types.is_date32(col.type):
            col = col.cast(pa.int32())
        cols.append(col.to_pylist())
    return list(zip(*cols)) if cols else []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema_and_rows(min_rows=1), st.sampled_from([None, 1, 300]))
def test_an_independent_pyarrow_decoder_reads_the_format(independent_decoder: Any,
                                                         case: tuple[StructType, list[tuple]], version: Any) -> None:
    schema, rows = case
    codec = RowCodec(schema, var="v", version=version)
    blobs = codec.encode(rows + rows[:1] * VEC)
    table = independent_decoder(schema, version, blobs)
    assert table.num_rows == len(blobs)
    assert _same(tuple(_arrow_internal(table)), tuple(_as_internal(schema, codec.decode(blobs))))


def test_long_values_are_copied_in_place_with_bounded_memory():
    """Values longer than 64 bytes on average take the per-value copy (not the per-byte index):
    the same bytes as the row path, and memory near the output's size."""
    import tracemalloc

    c = RowCodec(parse_schema("id long, s string, b binary", var="big"), var="big", version=1)
    rows = [(i, None if i % 7 == 0 else "s" * (i % 300), bytes([i % 256]) * (i % 2000)) for i in range(200)]
    assert c.encode(rows) == [c.encode_one(r) for r in rows]
    assert c.decode(c.encode(rows)) == rows
    big = [(i, None, b"x" * 1024) for i in range(16 * 1024)]  # 16 MiB of values
    tracemalloc.start()
    out = c.encode(big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(out) == len(big)
    # the buffer and the rows cut from it (a per-byte index took 17x)
    assert peak < 2.5 * 16 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB to encode 16 MiB"
