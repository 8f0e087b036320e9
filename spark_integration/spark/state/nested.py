"""The bytes of a nested state field: ``array<T>``, ``map<K, V>`` and ``struct<...>``.

A nested field of a state row is stored like a string or binary field: a u32
little-endian length, then its bytes (docs/design.md, "State row format",
"Nested fields"). Those bytes are, recursively:

    struct<f1, ..., fn>   null bitmap ceil(n/8) bytes, then each non-null field in order
                          (exactly a row without the version)
    array<T>              u32 LE count c, null bitmap ceil(c/8) bytes, then each non-null element
    map<K, V>             u32 LE count c, then the c keys (never null, so no bitmap), then the
                          values as an array's body: null bitmap ceil(c/8) bytes, each non-null value

where each element, key, value or field is what it is in a row: fixed width for
numbers, dates, timestamps and decimals, u32 length and bytes for strings,
binaries and nested values. A map keeps its entries in the order the dict gave
them (as Spark's maps do); in a map's *key* (``version=None``, the canonical
encoding) the entries are sorted by their keys' bytes, so equal dicts give equal
bytes. A null key, or two keys equal once converted (two NaNs), is refused, as
Spark refuses them.

Values written are what PySpark's ``toInternal`` takes: a tuple, list, ``Row``
or dict for a struct, a list, tuple or numpy array for an array, a ``Mapping``
for a map. Values read are what PySpark gives back: a ``Row`` for a struct, a
list for an array, a dict for a map.

The leaves are the row codec's own fields (``field.Field``), made by
``codec.py``, which also owns the error for a value that does not fit;
``CorruptNested`` here is for bytes that are not a value of the type.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Mapping, Optional

import numpy as np
from pyspark.sql.types import ArrayType, DataType, MapType, Row, StructType

__all__ = ["NESTED_KINDS", "CorruptNested", "NestedCodec", "adapt", "nested_kind"]

NESTED_KINDS = ("struct", "array", "map")
_U32 = struct.Struct("<I")


def nested_kind(dt: DataType) -> Optional[str]:
    """"struct", "array" or "map" for a nested type, else None."""
    if isinstance(dt, StructType):
        return "struct"
    if isinstance(dt, ArrayType):
        return "array"
    if isinstance(dt, MapType):
        return "map"
    return None


class CorruptNested(Exception):
    """Bytes that are not a value of the nested type (the message says where and why)."""


def _bitmap(nulls: list[bool]) -> bytes:
    bits = 0
    for i, isnull in enumerate(nulls):
        if isnull:
            bits |= 1 << i
    return bits.to_bytes((len(nulls) + 7) // 8, "little")


class _Reader:
    """A cursor over one nested value's bytes."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.end = data, 0, len(data)

    def take(self, n: int, what: str) -> int:
        """The position of the next ``n`` bytes, consumed."""
        at = self.pos
        if at + n > self.end:
            raise CorruptNested(f"truncated in {what}")
        self.pos = at + n
        return at

    def count(self, what: str) -> int:
        n = _U32.unpack_from(self.data, self.take(4, what))[0]
        if (n + 7) // 8 > self.end - self.pos:  # each element takes a bit of a bitmap at least
            raise CorruptNested(f"{what} is {n}, more than the value holds")
        return n

    def bits(self, n: int, what: str) -> int:
        nb = (n + 7) // 8
        at = self.take(nb, what)
        b = int.from_bytes(self.data[at:at + nb], "little")
        if b >> n:
            raise CorruptNested(f"null bits set past the last {what.split()[-1]}")
        return b


class NestedCodec:
    """Encodes and decodes the values of one nested type.

    ``make_field(name, dt, nullable)`` builds the row codec's field (``field.Field``) for an
    element, key, value or struct field (for a nested one, a field whose ``nested`` is a
    ``NestedCodec`` in turn); ``bad`` is the row codec's exception for a value that does not fit.
    ``path`` names this value in messages (``n``, ``n.element``, ``n.value.x``); ``canonical``
    (a map's user key): a map's entries are sorted by their keys' bytes."""

    def __init__(self, dt: DataType, *, path: str, canonical: bool,
                 make_field: Callable[[str, DataType, bool], Any], bad: type[Exception]) -> None:
        self.dt, self.path, self.bad, self.canonical = dt, path, bad, canonical
        self.kind = nested_kind(dt)
        if self.kind == "struct":
            self.fields = [make_field(f"{path}.{f.name}", f.dataType, f.nullable) for f in dt.fields]
            self.names = [f.name for f in dt.fields]
        elif self.kind == "array":
            self.element = make_field(f"{path}.element", dt.elementType, dt.containsNull)
        else:
            self.k = make_field(f"{path}.key", dt.keyType, False)
            self.v = make_field(f"{path}.value", dt.valueType, dt.valueContainsNull)

    # ---- Python value -> bytes ----------------------------------------------------------------------
    def encode(self, v: Any) -> bytes:
        if self.kind == "struct":
            # by name from a dict, by position from a tuple, list or Row (as PySpark's toInternal)
            if isinstance(v, Mapping):
                extra = set(v) - set(self.names)
                if extra:
                    raise self.bad(f"unknown field {sorted(map(str, extra))[0]!r} in {self.path} (its fields "
                                   f"are {', '.join(self.names)})")
                values = [v.get(name) for name in self.names]
            elif isinstance(v, (tuple, list)):
                if len(v) != len(self.fields):
                    raise self.bad(f"{len(v)} values for the {len(self.fields)} fields of {self.path} "
                                   f"({', '.join(self.names)})")
                values = list(v)
            else:
                raise self.bad(f"expected a struct (tuple, Row or dict) at {self.path}, got {type(v).__name__}")
            return self._values(self.fields, values)
        if self.kind == "array":
            if isinstance(v, np.ndarray):
                v = list(v)
            if not isinstance(v, (list, tuple)):
                raise self.bad(f"expected an array (list) at {self.path}, got {type(v).__name__}")
            return _U32.pack(len(v)) + self._values([self.element] * len(v), v)
        if not isinstance(v, Mapping):
            raise self.bad(f"expected a map (dict) at {self.path}, got {type(v).__name__}")
        keys = []
        for k in v.keys():
            if _null(k):
                raise self.bad(f"a key of {self.path} is null (Spark refuses null map keys)")
            keys.append(self._leaf(self.k, k))
        if len(set(keys)) != len(keys):
            raise self.bad(f"two keys of {self.path} are the same value (Spark refuses duplicate map keys)")
        values = list(v.values())
        if self.canonical:
            order = sorted(range(len(keys)), key=keys.__getitem__)
            keys, values = [keys[i] for i in order], [values[i] for i in order]
        return _U32.pack(len(keys)) + b"".join(keys) + self._values([self.v] * len(values), values)

    def _values(self, fields: list[Any], values: Any) -> bytes:
        """A null bitmap, then the non-null values, ``values[i]`` of ``fields[i]``."""
        nulls: list[bool] = []
        parts: list[bytes] = [b""]
        for f, x in zip(fields, values):
            if _null(x):
                if not f.nullable:
                    raise self.bad(f"{f.name} is not nullable, got None")
                nulls.append(True)
            else:
                nulls.append(False)
                parts.append(self._leaf(f, x))
        parts[0] = _bitmap(nulls)
        return b"".join(parts)

    def _leaf(self, f: Any, x: Any) -> bytes:
        if f.nested is not None:
            return f.pack(f.nested.encode(x))  # its messages name their own path
        try:
            return f.pack(f.norm(x))
        except self.bad as e:
            raise self.bad(f"{f.name}: {e}") from None

    # ---- bytes -> Python value ----------------------------------------------------------------------
    def decode(self, data: bytes) -> Any:
        r = _Reader(data)
        out = self._read(r)
        if r.pos != r.end:
            raise CorruptNested(f"{r.end - r.pos} bytes after the value of {self.path}")
        return out

    def _read(self, r: _Reader) -> Any:
        if self.kind == "struct":
            vals = self._read_values(r, self.fields, f"the null bitmap of {self.path}")
            return Row(**dict(zip(self.names, vals)))
        n = r.count(f"the count of {self.path}")
        if self.kind == "array":
            return self._read_values(r, [self.element] * n, f"the null bitmap of {self.path}")
        keys = [self._one(r, self.k) for _ in range(n)]
        return dict(zip(keys, self._read_values(r, [self.v] * n, f"the null bitmap of {self.path} values")))

    def _read_values(self, r: _Reader, fields: list[Any], what: str) -> list[Any]:
        bits = r.bits(len(fields), what)
        out: list[Any] = []
        for i, f in enumerate(fields):
            if bits >> i & 1:
                if not f.nullable:
                    raise CorruptNested(f"null in {f.name}, which is not nullable")
                out.append(None)
            else:
                out.append(self._one(r, f))
        return out

    def _one(self, r: _Reader, f: Any) -> Any:
        if f.width is not None:
            at = r.take(f.width, f.name)
            try:
                return f.value(r.data, at, 0)
            except ValueError as e:  # the field's CorruptValueError
                raise CorruptNested(getattr(e, "reason", str(e))) from None
        n = _U32.unpack_from(r.data, r.take(4, f"the length of {f.name}"))[0]
        raw = r.data[r.take(n, f.name):r.pos]
        if f.nested is not None:
            return f.nested.decode(raw)
        if f.kind == "binary":
            return raw
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptNested(f"{f.name}: a stored string is not valid UTF-8") from None


def _null(x: Any) -> bool:
    if x is None:
        return True
    t = type(x)
    if t.__name__ in ("NAType", "NaTType") and t.__module__.startswith("pandas"):
        return True
    return isinstance(x, np.datetime64) and bool(np.isnat(x))


def adapt(old: DataType, new: DataType) -> Optional[Callable[[Any], Any]]:
    """How a value read with ``old`` (a nested type) becomes one of ``new``, a compatible evolution
    of it (``schema.evolve``): struct fields matched by name, absent ones null; None: unchanged."""
    ko, kn = nested_kind(old), nested_kind(new)
    if ko is None or ko != kn:
        return None
    if ko == "struct":
        subs = {f.name: adapt(old[f.name].dataType, f.dataType) for f in new.fields if f.name in old.names}
        if [f.name for f in new.fields] == old.names and not any(subs.values()):
            return None
        names = [f.name for f in new.fields]

        def struct_(v: Any) -> Any:
            if v is None:
                return None
            d = v.asDict()
            return Row(**{n: (subs[n](d[n]) if subs.get(n) else d.get(n)) for n in names})
        return struct_
    if ko == "array":
        sub = adapt(old.elementType, new.elementType)
        return None if sub is None else (lambda v: None if v is None else [sub(x) for x in v])
    sub = adapt(old.valueType, new.valueType)
    return None if sub is None else (lambda v: None if v is None else {k: sub(x) for k, x in v.items()})
