"""One field of a state row: how its Python value is checked and converted to what is
stored, and read back, per Spark type (the row codec's leaves: codec.py, and of nested
values: nested.py). The stored format is codec.py's docstring's, and docs/design.md's
"State row format"."""

from __future__ import annotations

import calendar
import datetime as _dt
import reprlib
import struct
import time
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any, Callable, Optional, Sequence

import numpy as np
from pyspark.sql.types import StructField, StructType

from .nested import NESTED_KINDS, CorruptNested, NestedCodec, adapt
from .schema import CorruptValueError, StateSchemaError, StateValueError, type_kind

__all__ = ["BadValue", "Field", "Layout", "U32", "is_null", "value_repr"]

_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_US = _dt.timedelta(microseconds=1)
_DEC_CTX = Context(prec=100)
U32 = struct.Struct("<I")
_NONE = type(None)
value_repr = reprlib.Repr()
value_repr.maxstring = value_repr.maxother = 40


class BadValue(Exception):
    """A value that does not fit its field (the message says why)."""


def _wrong(v: Any, want: str) -> BadValue:
    return BadValue(f"expected {want}, got {type(v).__name__} {value_repr.repr(v)}")


def is_null(v: Any) -> bool:
    if v is None:
        return True
    t = type(v)
    if t.__name__ in ("NAType", "NaTType") and t.__module__.startswith("pandas"):
        return True
    return isinstance(v, np.datetime64) and bool(np.isnat(v))


# ---- per-kind value conversions (Python value -> stored int/float/bytes, and back) -------------------
_RANGE = {"byte": 7, "short": 15, "int": 31, "long": 63}


def _integral(kind: str) -> Callable[[Any], int]:
    lo, hi = -(1 << _RANGE[kind]), (1 << _RANGE[kind]) - 1

    def norm(v: Any) -> int:
        if type(v) is not int:
            if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                v = int(v)
            else:
                raise _wrong(v, f"{kind} (int)")
        if not lo <= v <= hi:
            raise BadValue(f"{v} is out of range for {kind} [{lo}, {hi}]")
        return v
    return norm


def _floating(kind: str, key: bool) -> Callable[[Any], float]:
    f32 = kind == "float"

    def norm(v: Any) -> float:
        if type(v) is not float:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise _wrong(v, f"{kind} (float)")
            try:
                v = float(v)
            except OverflowError:
                raise BadValue(f"{value_repr.repr(v)} is out of range for {kind}") from None
        if v != v:
            return _NAN
        if key and v == 0.0:
            return 0.0
        if f32:
            try:
                struct.pack("<f", v)
            except OverflowError:  # numpy (and Spark's double -> float) make it an infinity
                return float("inf") if v > 0 else float("-inf")
        return v
    return norm


_NAN = float("nan")


def _boolean(v: Any) -> bool:
    if type(v) is bool or isinstance(v, np.bool_):
        return bool(v)
    raise _wrong(v, "boolean (bool)")


def _string(v: Any) -> bytes:
    if not isinstance(v, str):
        raise _wrong(v, "string (str)")
    try:
        return v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadValue(f"the string is not valid Unicode ({e.reason} at {e.start})") from None


def _binary(v: Any) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise _wrong(v, "binary (bytes)")


def _date(v: Any) -> int:
    if isinstance(v, _dt.date):
        return v.toordinal() - _EPOCH_ORDINAL
    if isinstance(v, np.datetime64):
        return int(v.astype("datetime64[D]").astype(np.int64))
    raise _wrong(v, "date (datetime.date)")


def _timestamp(ntz: bool) -> Callable[[Any], int]:
    want = "timestamp_ntz (datetime)" if ntz else "timestamp (datetime)"

    def norm(v: Any) -> int:
        if isinstance(v, np.datetime64):
            if ntz:
                return int(v.astype("datetime64[us]").astype(np.int64))
            v = v.astype("datetime64[us]").item()
        if not isinstance(v, _dt.datetime):
            raise _wrong(v, want)
        if type(v) is _dt.datetime:  # the same as below, faster
            if ntz:
                return (v.replace(tzinfo=None) - _EPOCH_NAIVE) // _US
            if v.tzinfo is None and _local_is_utc():
                return (v - _EPOCH_NAIVE) // _US
            if v.tzinfo is not None and v.utcoffset() is not None:
                return (v - _EPOCH_UTC) // _US
        try:  # PySpark's TimestampType / TimestampNTZType.toInternal
            if ntz:
                seconds = calendar.timegm(v.timetuple())
            else:
                seconds = calendar.timegm(v.utctimetuple()) if v.tzinfo else time.mktime(v.timetuple())
        except (OverflowError, ValueError) as e:
            raise BadValue(f"{value_repr.repr(v)} cannot be stored as a timestamp ({e})") from None
        return int(seconds) * 1000000 + v.microsecond
    return norm


def _decimal(precision: int, scale: int) -> Callable[[Any], int]:
    quantum = Decimal((0, (1,), -scale))
    limit = 10 ** precision

    def norm(v: Any) -> int:
        if isinstance(v, Decimal):
            d = v
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            d = Decimal(int(v))
        else:
            raise _wrong(v, f"decimal({precision},{scale}) (Decimal or int)")
        if not d.is_finite():
            raise BadValue(f"{d} cannot be stored as decimal({precision},{scale})")
        try:
            u = int(d.quantize(quantum, rounding=ROUND_HALF_UP, context=_DEC_CTX).scaleb(scale, _DEC_CTX))
        except InvalidOperation:
            u = limit
        if not -limit < u < limit:
            raise BadValue(f"{value_repr.repr(d)} is out of range for decimal({precision},{scale})")
        return u
    return norm


def _local_is_utc() -> bool:
    """The process's local time zone is UTC (read each time: ``time.tzset`` may change it)."""
    return time.timezone == 0 and time.altzone == 0 and not time.daylight


def _ts_local(us: int) -> _dt.datetime:  # PySpark's TimestampType.fromInternal
    if _local_is_utc():
        return _EPOCH_NAIVE + _dt.timedelta(microseconds=us)  # the same, faster
    return _dt.datetime.fromtimestamp(us // 1000000).replace(microsecond=us % 1000000)


def _ts_ntz(us: int) -> _dt.datetime:
    return _EPOCH_NAIVE + _dt.timedelta(microseconds=us)


def _date_py(days: int) -> _dt.date:
    return _dt.date.fromordinal(days + _EPOCH_ORDINAL)


# ---- one field -----------------------------------------------------------------------------------
_FIXED = {"byte": "<i1", "short": "<i2", "int": "<i4", "long": "<i8", "float": "<f4", "double": "<f8",
          "boolean": "u1", "date": "<i4", "timestamp": "<i8", "timestamp_ntz": "<i8", "decimal": "V16"}
_STRUCT = {"byte": "<b", "short": "<h", "int": "<i", "long": "<q", "float": "<f", "double": "<d",
           "boolean": "<B", "date": "<i", "timestamp": "<q", "timestamp_ntz": "<q"}
_FAST = {"byte": {int}, "short": {int}, "int": {int}, "long": {int}, "float": {float, int},
         "double": {float, int}, "boolean": {bool}, "string": {str}, "binary": {bytes}}
_ZERO = {"byte": 0, "short": 0, "int": 0, "long": 0, "float": 0.0, "double": 0.0, "boolean": False,
         "string": "", "binary": b"", "date": 0, "timestamp": 0, "timestamp_ntz": 0, "decimal": 0,
         "struct": b"", "array": b"", "map": b""}


class Field:
    """How one field is checked, stored and read back. A nested field (struct, array, map) is
    stored as a length and its bytes, made and read by its ``nested`` codec (``nested.py``);
    ``adapt``: how a value read with an older schema becomes one of the current schema."""

    def __init__(self, f: Any, var: str, key: bool) -> None:
        self.name, self.nullable = f.name, f.nullable
        self.kind = kind = type_kind(f.dataType, var=var, field=f.name)
        self.var, self.key = var, key
        self.dtype = np.dtype(_FIXED[kind]) if kind in _FIXED else None
        self.width = self.dtype.itemsize if self.dtype is not None else None
        self.nested: Optional[NestedCodec] = None
        self.adapt: Optional[Callable[[Any], Any]] = None
        self.norm: Callable[[Any], Any]
        self.py: Optional[Callable[[Any], Any]] = None
        self.pack: Callable[[Any], bytes]
        if kind in NESTED_KINDS:
            self.nested = NestedCodec(f.dataType, path=f.name, canonical=key, bad=BadValue,
                                      make_field=lambda n, dt, nl: Field(StructField(n, dt, nl), var, key))
            self.norm = self.nested.encode
            self.pack = _pack_var
            return
        self.norm = {
            "boolean": _boolean, "string": _string, "binary": _binary, "date": _date,
            "timestamp": _timestamp(False), "timestamp_ntz": _timestamp(True)}.get(kind) or (
            _integral(kind) if kind in _RANGE else _floating(kind, key) if kind in ("float", "double")
            else _decimal(f.dataType.precision, f.dataType.scale))
        self.py = {
            "date": _date_py, "timestamp": _ts_local, "timestamp_ntz": _ts_ntz, "boolean": bool}.get(kind)
        if kind == "decimal":
            self.py = lambda u, _s=-f.dataType.scale: Decimal(u).scaleb(_s, _DEC_CTX)
            self.limit = 10 ** f.dataType.precision
        fmt = struct.Struct(_STRUCT.get(kind, "<B"))
        self.pack = _pack_decimal if kind == "decimal" else _pack_var if self.dtype is None else fmt.pack
        self.unpack = fmt.unpack_from

    def error(self, msg: str, row: Optional[int], cls: type = StateValueError) -> StateSchemaError:
        return cls(msg, var=self.var, field=self.name, row=row)

    def nested_value(self, raw: bytes, row: int) -> Any:
        """The Python value of a nested field's stored bytes (adapted to the current schema)."""
        assert self.nested is not None
        try:
            v = self.nested.decode(raw)
        except CorruptNested as e:
            raise self.error(str(e), row, CorruptValueError) from None
        return v if self.adapt is None else self.adapt(v)

    def null_error(self, row: int) -> StateSchemaError:
        return self.error("the field is not nullable, got None", row)

    # ---- a column of a batch -> (null mask or None, (n, width) uint8 matrix or list of bytes) --------
    def column(self, col: Sequence[Any]) -> tuple[Optional[np.ndarray], Any]:
        types = set(map(type, col))
        mask = None
        if _NONE in types:
            nulls = [v is None for v in col]
            if not self.nullable:
                raise self.null_error(nulls.index(True))
            mask = np.array(nulls, dtype=bool)
            zero = _ZERO[self.kind]
            col = [zero if v is None else v for v in col]
            types.discard(_NONE)
            types.add(type(zero))
        if types <= _FAST.get(self.kind, set()):
            try:
                return mask, self._fast(col)
            except (OverflowError, UnicodeEncodeError, BadValue):
                pass  # the per-value path finds the value and says what is wrong with it
        return self._slow(col, mask)

    def _fast(self, col: Sequence[Any]) -> Any:
        kind = self.kind
        if kind == "string":
            return list(map(str.encode, col))
        if kind == "binary":
            return list(col)
        if kind in _RANGE:
            arr = np.array(col, dtype=np.int64)
            if kind != "long" and len(arr) and not (-(1 << _RANGE[kind]) <= arr.min()
                                                    and arr.max() < (1 << _RANGE[kind])):
                raise BadValue("out of range")
            return self._matrix(arr)
        if kind == "boolean":
            return self._matrix(np.array(col, dtype=bool))
        arr = np.array(col, dtype=np.float64)
        nan = np.isnan(arr)
        if nan.any():
            arr[nan] = _NAN
        if self.key:
            arr[arr == 0.0] = 0.0
        return self._matrix(arr)

    def _slow(self, col: Sequence[Any], mask: Optional[np.ndarray]) -> tuple[Optional[np.ndarray], Any]:
        out: list[Any] = []
        nulls: list[int] = []
        zero = b"" if self.dtype is None else 0
        for i, v in enumerate(col):
            if (mask is not None and mask[i]) or is_null(v):
                if not self.nullable:
                    raise self.null_error(i)
                nulls.append(i)
                out.append(zero)
                continue
            try:
                out.append(self.norm(v))
            except BadValue as e:
                raise self.error(str(e), i) from None
        if nulls:
            mask = np.zeros(len(col), dtype=bool)
            mask[nulls] = True
        return mask, (out if self.dtype is None else self._matrix(out))

    def _matrix(self, values: Any) -> np.ndarray:
        """The (n, width) uint8 matrix of stored values (ints, floats or bools)."""
        if self.kind == "decimal":
            lo = np.array([u & 0xFFFFFFFFFFFFFFFF for u in values], dtype="<u8")
            hi = np.array([u >> 64 for u in values], dtype="<i8")
            return np.stack([lo.view(np.uint8).reshape(-1, 8), hi.view(np.uint8).reshape(-1, 8)], axis=1
                            ).reshape(-1, 16)
        with np.errstate(over="ignore"):  # float32: out of range -> inf, as Spark's double -> float
            arr = np.asarray(values).astype(self.dtype)
        return arr.view(np.uint8).reshape(-1, self.width)

    def value(self, data: bytes, pos: int, row: int) -> Any:
        """The Python value of the stored fixed-width value at ``pos``."""
        if self.kind == "decimal":
            u = int.from_bytes(data[pos:pos + 16], "little", signed=True)
            if not -self.limit < u < self.limit:
                raise self.error("the stored decimal is out of its precision", row, CorruptValueError)
            return self.py(u)
        v = self.unpack(data, pos)[0]
        if self.py is None:
            return v
        if self.kind == "boolean" and v > 1:
            raise self.error("a stored boolean is not 0 or 1", row, CorruptValueError)
        try:
            return self.py(v)
        except (ValueError, OverflowError, OSError) as e:
            raise self.error(f"a stored {self.kind} is out of range ({e})", row, CorruptValueError) from None

    # ---- stored values of a batch -> Python ---------------------------------------------------------
    def values(self, m: np.ndarray, first_row: Callable[[np.ndarray], int]) -> list[Any]:
        """Python values of the (s, width) matrix of stored values."""
        if self.kind == "decimal":
            w = np.ascontiguousarray(m).view("<u8")
            ints = [(h << 64) | lo for lo, h in zip(w[:, 0].tolist(), w[:, 1].view("<i8").tolist())]
            bad = [i for i, u in enumerate(ints) if not -self.limit < u < self.limit]
            if bad:
                raise self.error("the stored decimal is out of its precision", first_row(np.array(bad)),
                                 CorruptValueError)
            return [self.py(u) for u in ints]
        arr = np.ascontiguousarray(m).view(self.dtype).reshape(-1)
        if self.kind == "boolean" and len(arr) and arr.max() > 1:
            raise self.error("a stored boolean is not 0 or 1", first_row(np.nonzero(arr > 1)[0]),
                             CorruptValueError)
        vals = arr.tolist()
        if self.py is None or self.kind == "boolean":
            return [bool(v) for v in vals] if self.kind == "boolean" else vals
        try:
            return list(map(self.py, vals))
        except (ValueError, OverflowError, OSError) as e:
            bad = next(i for i, v in enumerate(vals) if not _converts(self.py, v))
            raise self.error(f"a stored {self.kind} is out of range ({e})", first_row(np.array([bad])),
                             CorruptValueError) from None


def _converts(py: Callable[[Any], Any], v: Any) -> bool:
    try:
        py(v)
        return True
    except (ValueError, OverflowError, OSError):
        return False


def _pack_decimal(u: int) -> bytes:
    return u.to_bytes(16, "little", signed=True)


def _pack_var(b: bytes) -> bytes:
    return U32.pack(len(b)) + b


# ---- the fields of one schema version --------------------------------------------------------------
class Layout:
    """The fields of one schema (the current one or one of ``history``) and how to read them."""

    def __init__(self, schema: StructType, var: str, key: bool) -> None:
        self.schema = schema
        self.fields = [Field(f, var, key) for f in schema.fields]
        self.nb = (len(self.fields) + 7) // 8
        self.var = var
        self.index = {f.name: i for i, f in enumerate(self.fields)}

    def projection(self, current: "Layout") -> Optional[list[int]]:
        """For each current field, its index here (-1: absent, read as null); None: the same fields.
        Also sets how each nested field here becomes the current one's type (``Field.adapt``)."""
        for f in current.fields:
            if f.name in self.index:
                mine = self.fields[self.index[f.name]]
                mine.adapt = adapt(self.schema[f.name].dataType, current.schema[f.name].dataType)
        proj = [self.index.get(f.name, -1) for f in current.fields]
        return None if proj == list(range(len(self.fields))) else proj
