"""The schemas of a processor's state variables, read without a SparkSession.

A processor declares a state variable's schema as PySpark does:
``handle.getValueState("count", "c long")`` or with a ``StructType``. Spark
parses the DDL string in the JVM (``_parse_datatype_string`` needs a
SparkContext); rhino.spark reads it here, in Python, so the driver's recording
handle and the executors agree on the schema without a JVM call.

``parse_schema`` gives a ``StructType`` of the types the row codec stores
(``codec.py``; the byte format is described in docs/design.md, "State row
format"): boolean, tinyint/byte, smallint/short, int/integer, bigint/long,
float/real, double, decimal(p, s) with p <= 38, string (char(n) and varchar(n)
are stored as strings), binary, date, timestamp/timestamp_ltz and
timestamp_ntz, and the nested types of these: ``array<T>``, ``map<K, V>`` (a key
holds no map) and ``struct<...>``, to any depth. Intervals, time, variant and
collated strings are refused with an ``UnsupportedTypeError`` that names the
state variable and the field.

``evolve(old, new, var)`` is the compatibility rule between the schema a value
was written with and the one a processor declares now, as Spark 4's
transformWithState schema evolution allows it: adding a nullable field,
removing a field, reordering, widening an integral type (byte < short < int <
long) or float to double, and making a field nullable; inside a nested type the
same rules hold for a struct's fields, an array's element and a map's value,
and an array or map may start to hold nulls. A map's key type never changes.
Anything else (another type, a new non-nullable field, a nullable field made
non-nullable) raises an ``IncompatibleSchemaError`` naming the variable and the
field (``n.x``, ``n.element``, ``n.value`` inside a nested one).
"""

from __future__ import annotations

import re
from typing import Any, Optional

from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, ByteType, CharType, DataType, DateType, DecimalType,
                               DoubleType, FloatType, IntegerType, LongType, MapType, ShortType, StringType, StructField,
                               StructType, TimestampNTZType, TimestampType, VarcharType)

__all__ = ["StateSchemaError", "SchemaParseError", "UnsupportedTypeError", "IncompatibleSchemaError",
           "StateValueError", "UnknownVersionError", "CorruptValueError", "SUPPORTED_TYPES",
           "parse_schema", "evolve", "type_kind"]

SUPPORTED_TYPES = ("boolean, tinyint (byte), smallint (short), int (integer), bigint (long), float (real), "
                   "double, decimal(p, s) with p <= 38, string (char(n), varchar(n)), binary, date, "
                   "timestamp (timestamp_ltz), timestamp_ntz, and array<T>, map<K, V>, struct<...> of these")


class StateSchemaError(ValueError):
    """A state variable's schema, or a value written to it, is not what the codec can store.

    ``var`` is the state variable, ``field`` the field (None: the whole schema or row),
    ``row`` the index of the row in the batch (None: not about a row)."""

    def __init__(self, message: str, *, var: Optional[str] = None, field: Optional[str] = None,
                 row: Optional[int] = None) -> None:
        self.reason = message  # without the state, row and field
        where = [f"state {var!r}"] if var is not None else []
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.var, self.field, self.row = var, field, row


class SchemaParseError(StateSchemaError):
    """A DDL schema string that does not parse."""


class UnsupportedTypeError(StateSchemaError):
    """A field whose type the row codec does not store (nested types, intervals, ...)."""


class IncompatibleSchemaError(StateSchemaError):
    """A schema change that Spark's schema evolution does not allow."""


class StateValueError(StateSchemaError):
    """A value written to state that does not fit its field (type, range, null)."""


class UnknownVersionError(StateSchemaError):
    """A stored value written with a schema version the codec was not given."""


class CorruptValueError(StateSchemaError):
    """Stored bytes that are not a row of the schema they claim (truncated, trailing bytes, bad UTF-8)."""


# ---- kinds: what the codec stores, one per supported type -------------------------------------------
_INTEGRAL = {"byte": 0, "short": 1, "int": 2, "long": 3}
_KIND_OF_CLASS = {ByteType: "byte", ShortType: "short", IntegerType: "int", LongType: "long",
                  FloatType: "float", DoubleType: "double", BooleanType: "boolean", BinaryType: "binary",
                  DateType: "date", TimestampType: "timestamp", TimestampNTZType: "timestamp_ntz",
                  CharType: "string", VarcharType: "string", DecimalType: "decimal"}


MAX_NESTING = 32  # nested types inside one another, at most; deeper is refused, not a RecursionError


def type_kind(dt: DataType, *, var: Optional[str] = None, field: Optional[str] = None, depth: int = 0) -> str:
    """The codec's kind of a field type: "long", "string", "decimal", "struct", "array", "map", ...;
    refuses what it does not store (a nested type's parts included, named ``field.x``,
    ``field.element``, ``field.key``, ``field.value``)."""
    if isinstance(dt, (StructType, ArrayType, MapType)) and depth >= MAX_NESTING:
        raise UnsupportedTypeError(f"nested types are nested more than {MAX_NESTING} deep", var=var, field=field)
    if isinstance(dt, StructType):
        _check_fields(dt, var, prefix=f"{field}.", depth=depth + 1)
        return "struct"
    if isinstance(dt, ArrayType):
        type_kind(dt.elementType, var=var, field=f"{field}.element", depth=depth + 1)
        return "array"
    if isinstance(dt, MapType):
        if _holds_map(dt.keyType):
            raise UnsupportedTypeError("a map's key cannot be or hold a map (Spark refuses it too)", var=var,
                                       field=f"{field}.key")
        type_kind(dt.keyType, var=var, field=f"{field}.key", depth=depth + 1)
        type_kind(dt.valueType, var=var, field=f"{field}.value", depth=depth + 1)
        return "map"
    if type(dt) is StringType:
        if dt.collation != "UTF8_BINARY":
            raise UnsupportedTypeError(f"string collation {dt.collation} is not supported (only UTF8_BINARY); "
                                       f"supported types: {SUPPORTED_TYPES}", var=var, field=field)
        return "string"
    kind = _KIND_OF_CLASS.get(type(dt))
    if kind is None:
        raise UnsupportedTypeError(f"type {dt.simpleString()} is not supported in state; supported types: "
                                   f"{SUPPORTED_TYPES}", var=var, field=field)
    if kind == "decimal" and not (1 <= dt.precision <= 38 and 0 <= dt.scale <= dt.precision):
        raise UnsupportedTypeError(f"decimal({dt.precision},{dt.scale}) is out of range "
                                   "(1 <= precision <= 38, 0 <= scale <= precision)", var=var, field=field)
    return kind


def _holds_map(dt: DataType) -> bool:
    if isinstance(dt, MapType):
        return True
    if isinstance(dt, ArrayType):
        return _holds_map(dt.elementType)
    return isinstance(dt, StructType) and any(_holds_map(f.dataType) for f in dt.fields)


def _check_fields(schema: StructType, var: Optional[str], prefix: str = "", depth: int = 0) -> None:
    seen: set[str] = set()
    for f in schema.fields:
        if not isinstance(f.name, str) or not f.name:
            raise SchemaParseError(f"a field has no name ({f.name!r})", var=var, field=prefix.rstrip(".") or None)
        if f.name in seen:
            raise SchemaParseError("the field name appears twice", var=var, field=prefix + f.name)
        seen.add(f.name)
        type_kind(f.dataType, var=var, field=prefix + f.name, depth=depth)
    if not schema.fields:
        raise SchemaParseError("the struct has no field" if prefix else "the schema has no field", var=var,
                               field=prefix.rstrip(".") or None)


def _check_struct(schema: StructType, var: str) -> StructType:
    _check_fields(schema, var)
    return schema


def parse_schema(schema: Any, *, var: str) -> StructType:
    """The ``StructType`` of what a processor passes as a state schema: a ``StructType`` or a DDL
    string (``"c long, name string"``, ``"a: bigint NOT NULL"``, ``"struct<a:int>"``), parsed in Python."""
    if isinstance(schema, StructType):
        return _check_struct(schema, var)
    if isinstance(schema, str):
        return _check_struct(_DdlParser(schema, var).parse(), var)
    raise SchemaParseError(f"a state schema is a StructType or a DDL string, not {type(schema).__name__} "
                           f"({schema!r})", var=var)


# ---- DDL ---------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|([A-Za-z0-9_]+)|(\S))")
_SIMPLE: dict[str, DataType] = {
    "boolean": BooleanType(), "tinyint": ByteType(), "byte": ByteType(), "smallint": ShortType(),
    "short": ShortType(), "int": IntegerType(), "integer": IntegerType(), "bigint": LongType(),
    "long": LongType(), "float": FloatType(), "real": FloatType(), "double": DoubleType(),
    "date": DateType(), "timestamp": TimestampType(), "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(), "string": StringType(), "binary": BinaryType()}


class _DdlParser:
    """``[struct<] name [:] type [NOT NULL] [COMMENT 'text'] (, ...)* [>]``, Spark's DDL for a schema."""

    def __init__(self, text: str, var: str) -> None:
        self.text, self.var, self.toks, self.i = text, var, self._tokens(text, var), 0
        self.depth = 0

    @staticmethod
    def _tokens(text: str, var: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:  # only trailing blanks are left
                break
            pos = m.end()
            if m.group(1):
                out.append(("name", m.group(1)[1:-1].replace("``", "`")))
            elif m.group(2):
                out.append(("str", re.sub(r"\\(.)", r"\1", m.group(2)[1:-1])))
            elif m.group(3):
                out.append(("word", m.group(3)))
            else:
                out.append(("punct", m.group(4)))
        return out

    def _fail(self, what: str, field: Optional[str] = None) -> SchemaParseError:
        tok = self.toks[self.i][1] if self.i < len(self.toks) else "end of text"
        return SchemaParseError(f"cannot parse the schema {self.text!r}: {what} (at {tok!r})", var=self.var,
                                field=field)

    def _peek(self, value: Optional[str] = None) -> bool:
        if self.i >= len(self.toks):
            return False
        return value is None or self.toks[self.i][1].lower() == value

    def _take(self, value: str, field: Optional[str] = None) -> None:
        if not self._peek(value):
            raise self._fail(f"expected {value!r}", field)
        self.i += 1

    def parse(self) -> StructType:
        wrapped = (len(self.toks) > 1 and self.toks[0][0] == "word" and self.toks[0][1].lower() == "struct"
                   and self.toks[1][1] == "<")
        if wrapped:
            self.i = 2
        fields = [self._field()]
        while self._peek(","):
            self.i += 1
            fields.append(self._field())
        if wrapped:
            self._take(">")
        if self.i != len(self.toks):
            raise self._fail("unexpected text after the last field")
        return StructType(fields)

    def _field(self, prefix: str = "") -> StructField:
        """A field; ``prefix``: the path of the struct it is in (``n.``), for messages."""
        if self.i >= len(self.toks) or self.toks[self.i][0] not in ("name", "word"):
            raise self._fail("expected a field name", prefix.rstrip(".") or None)
        name = self.toks[self.i][1]
        self.i += 1
        if self._peek(":"):
            self.i += 1
        dt = self._type(prefix + name)
        nullable, meta = True, {}
        while self._peek("not") or self._peek("comment"):
            if self._peek("not"):
                self.i += 1
                self._take("null", name)
                nullable = False
            else:
                self.i += 1
                if self.i >= len(self.toks) or self.toks[self.i][0] != "str":
                    raise self._fail("expected a quoted comment", name)
                text = ""
                while self.i < len(self.toks) and self.toks[self.i][0] == "str":  # 'a' 'b' is 'ab', as in SQL
                    text += self.toks[self.i][1]
                    self.i += 1
                meta["comment"] = text
        return StructField(name, dt, nullable, meta)

    def _int_args(self, name: str, most: int) -> list[int]:
        if not self._peek("("):
            return []
        self.i += 1
        args: list[int] = []
        while True:
            if self.i >= len(self.toks) or not self.toks[self.i][1].isdigit():
                raise self._fail("expected a number", name)
            args.append(int(self.toks[self.i][1]))
            self.i += 1
            if not self._peek(","):
                break
            self.i += 1
        self._take(")", name)
        if len(args) > most:
            raise self._fail(f"at most {most} arguments", name)
        return args

    def _type(self, name: str) -> DataType:
        if self.i >= len(self.toks) or self.toks[self.i][0] != "word":
            raise self._fail("expected a type", name)
        word = self.toks[self.i][1].lower()
        self.i += 1
        if word in _SIMPLE:
            if word == "string" and self._peek("collate"):
                raise UnsupportedTypeError(f"collated strings are not supported; supported types: "
                                           f"{SUPPORTED_TYPES}", var=self.var, field=name)
            return _SIMPLE[word]
        if word in ("decimal", "dec", "numeric"):
            args = self._int_args(name, 2)
            return DecimalType(*args) if args else DecimalType(10, 0)
        if word in ("char", "character", "varchar"):
            args = self._int_args(name, 1)
            if len(args) != 1:
                raise self._fail(f"{word} needs a length", name)
            return VarcharType(args[0]) if word == "varchar" else CharType(args[0])
        if word in ("array", "map", "struct"):
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise UnsupportedTypeError(f"nested types are nested more than {MAX_NESTING} deep", var=self.var,
                                           field=name)
            try:
                return self._nested(word, name)
            finally:
                self.depth -= 1
        raise UnsupportedTypeError(f"type {word} is not supported in state; supported types: {SUPPORTED_TYPES}",
                                   var=self.var, field=name)

    def _nested(self, word: str, name: str) -> DataType:
        if word == "array":
            self._take("<", name)
            element = self._type(f"{name}.element")
            self._take(">", name)
            return ArrayType(element, True)
        if word == "map":
            self._take("<", name)
            key = self._type(f"{name}.key")
            self._take(",", name)
            value = self._type(f"{name}.value")
            self._take(">", name)
            return MapType(key, value, True)
        self._take("<", name)  # struct
        fields = [] if self._peek(">") else [self._field(prefix=f"{name}.")]
        while self._peek(","):
            self.i += 1
            fields.append(self._field(prefix=f"{name}."))
        self._take(">", name)
        return StructType(fields)


# ---- evolution ---------------------------------------------------------------------------------------
def _widens(old: str, new: str) -> bool:
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL[old] < _INTEGRAL[new]
    return old == "float" and new == "double"


def _evolve_type(old: DataType, new: DataType, var: str, path: str, changes: list[str]) -> None:
    """Checks that a value of type ``old`` reads as one of ``new`` (field ``path``); appends the
    changes in words, or raises an ``IncompatibleSchemaError``."""
    ko = type_kind(old, var=var, field=path)
    kn = type_kind(new, var=var, field=path)
    if ko == kn == "struct":
        changes.extend(evolve(old, new, var, prefix=f"{path}."))
        return
    if ko == kn == "array":
        _evolve_type(old.elementType, new.elementType, var, f"{path}.element", changes)
        _evolve_nulls(old.containsNull, new.containsNull, var, f"{path}.element", changes)
        return
    if ko == kn == "map":
        if old.keyType != new.keyType:  # keys are looked up by their bytes: those must not change
            raise IncompatibleSchemaError(f"a map's key type cannot change (from {old.keyType.simpleString()} "
                                          f"to {new.keyType.simpleString()})", var=var, field=f"{path}.key")
        _evolve_type(old.valueType, new.valueType, var, f"{path}.value", changes)
        _evolve_nulls(old.valueContainsNull, new.valueContainsNull, var, f"{path}.value", changes)
        return
    same = ko == kn and (ko != "decimal" or (old.precision, old.scale) == (new.precision, new.scale))
    if not same:
        if not _widens(ko, kn):
            raise IncompatibleSchemaError(
                f"type changed from {old.simpleString()} to {new.simpleString()}; only "
                "widening (byte < short < int < long, float < double) is allowed", var=var, field=path)
        changes.append(f"widened {path} {old.simpleString()} -> {new.simpleString()}")


def _evolve_nulls(old: bool, new: bool, var: str, path: str, changes: list[str]) -> None:
    if old and not new:
        raise IncompatibleSchemaError("a nullable field cannot become non-nullable (stored values may "
                                      "hold null)", var=var, field=path)
    if new and not old:
        changes.append(f"made {path} nullable")


def evolve(old: StructType, new: StructType, var: str, prefix: str = "") -> list[str]:
    """Checks that values written with ``old`` can be read as ``new`` (Spark 4's rules, see the module
    docstring); the changes in words (empty: the same schema), or an ``IncompatibleSchemaError``.
    ``prefix``: the path of a nested struct (``n.``)."""
    old_by = {f.name: f for f in old.fields}
    new_names = {f.name for f in new.fields}
    changes: list[str] = []
    for f in new.fields:
        path = prefix + f.name
        o = old_by.get(f.name)
        if o is None:
            type_kind(f.dataType, var=var, field=path)
            if not f.nullable:
                raise IncompatibleSchemaError("a field added to a state schema must be nullable (values "
                                              "written before have no value for it)", var=var, field=path)
            changes.append(f"added {path} {f.dataType.simpleString()}")
            continue
        _evolve_type(o.dataType, f.dataType, var, path, changes)
        _evolve_nulls(o.nullable, f.nullable, var, path, changes)
    changes.extend(f"removed {prefix}{o.name}" for o in old.fields if o.name not in new_names)
    if [f.name for f in old.fields if f.name in new_names] != [f.name for f in new.fields if f.name in old_by]:
        changes.append(f"reordered {prefix.rstrip('.')}" if prefix else "reordered")
    return changes
