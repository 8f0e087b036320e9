"""The bytes of a state value: a typed row encoding derived from the declared schema.

``RowCodec(schema, var=..., version=...)`` turns rows (tuples, PySpark ``Row``s
or dicts) into bytes and back, checking every value against its field when it
is written. The format is stable and documented (docs/design.md, "State row
format"): it can be read without Python, and without this module.

    row   = [u16 big-endian schema version]        (absent when version is None)
            null bitmap: ceil(n/8) bytes, bit i (byte i // 8, bit i % 8, LSB first) = field i is null
            per non-null field, in schema order:
              byte/short/int/long      int8/16/32/64 little-endian
              float/double             IEEE 754 binary32/binary64 little-endian (NaN as the quiet NaN)
              boolean                  1 byte, 0 or 1
              date                     int32 LE days since 1970-01-01
              timestamp, timestamp_ntz int64 LE microseconds since 1970-01-01 00:00 (UTC for timestamp)
              decimal(p, s)            int128 LE two's complement, the unscaled value (value * 10**s)
              string/binary            u32 LE length, then the UTF-8 / raw bytes

Values are converted as PySpark converts them before they reach Spark's state
store: numpy scalars to Python (``np.int64`` -> int ...), ``datetime`` and
``pandas.Timestamp`` to microseconds (a naive one in the process's local time
zone, as ``TimestampType.toInternal``), ``date`` to days, ``Decimal`` rounded
half-up to the field's scale. ``None``, ``pandas.NA`` and ``NaT`` are null.
``decode`` gives back what PySpark's ``ValueState.get`` gives: tuples of int,
float, bool, str, bytes, ``datetime.date``, naive ``datetime.datetime`` (local
time for timestamp, as ``TimestampType.fromInternal``) and ``Decimal``; binary
comes back as ``bytes`` (hashable, so it can be part of a map key).

With ``version=None`` (map state's user keys) the encoding is canonical: the
same logical value always gives the same bytes (``1`` and ``np.int64(1)``,
``0.0`` and ``-0.0``, every NaN), so the bytes can be looked up. With a
version, ``decode`` also reads values written with an older schema of
``history`` (matched by field name, see ``schema.evolve``).

Batches are vectorized with numpy (one buffer, fields written and read at
computed offsets for every row at once); a batch under ``_VECTOR_MIN`` rows
takes a per-row path with ``struct``, which is also the reference the tests
compare the vectorized path with.
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .field import U32, BadValue, Field, Layout, is_null, value_repr
from .schema import CorruptValueError, StateSchemaError, StateValueError, UnknownVersionError, evolve, parse_schema

__all__ = ["RowCodec"]

_VECTOR_MIN = 32
_SCATTER_BYTES_PER_ROW = 64  # at most this many string/binary bytes per row on average: one scatter
_U16BE = struct.Struct(">H")


# ---- the codec ---------------------------------------------------------------------------------------
class RowCodec:
    """Encodes and decodes the rows of one state variable (see the module docstring for the format).

    ``schema``: a ``StructType`` or a DDL string. ``version``: the schema version written before each
    row (u16 big-endian, 0..65535), or None for no prefix and a canonical encoding (map user keys).
    ``history``: {version: schema} of older versions whose values ``decode`` must still read; each
    must evolve into ``schema`` (``schema.evolve``) or the constructor raises."""

    def __init__(self, schema: Any, *, var: str, version: Optional[int],
                 history: Mapping[int, Any] = {}) -> None:  # noqa: B006 (read only)
        self.var = var
        self.schema = parse_schema(schema, var=var)
        self.version = version
        self._layout = Layout(self.schema, var, key=version is None)
        self._head = b"" if version is None else _U16BE.pack(self._check_version(version))
        self._layouts: dict[int, tuple[Layout, Optional[list[int]]]] = {}
        if version is None and history:
            raise StateSchemaError("an unversioned codec (map keys) has no history", var=var)
        for v, old in dict(history).items():
            old = parse_schema(old, var=var)
            self._check_version(v)
            if v == version:
                if old != self.schema:
                    raise StateSchemaError(f"history[{v}] is not the schema of the current version {v}", var=var)
                continue
            evolve(old, self.schema, var)
            lay = Layout(old, var, key=False)
            self._layouts[v] = (lay, lay.projection(self._layout))
        if version is not None:
            self._layouts[version] = (self._layout, None)
        self.history = {v: lay.schema for v, (lay, _) in self._layouts.items()}

    def _check_version(self, v: Any) -> int:
        if type(v) is not int or not 0 <= v <= 0xFFFF:
            raise StateSchemaError(f"a schema version is an int in [0, 65535], not {v!r}", var=self.var)
        return v

    def __repr__(self) -> str:
        return f"RowCodec({self.schema.simpleString()!r}, var={self.var!r}, version={self.version!r})"

    # ---- rows as tuples in schema order -------------------------------------------------------------
    def _as_tuple(self, row: Any, i: int) -> tuple:
        fields = self._layout.fields
        if isinstance(row, Mapping):  # by name, as StructType.toInternal; a Row is a tuple (positional)
            by_name = row
            extra = set(by_name) - set(self._layout.index)
            if extra:
                raise StateValueError(f"unknown field {sorted(map(str, extra))[0]!r} (the fields are "
                                      f"{', '.join(f.name for f in fields)})", var=self.var, row=i)
            return tuple(by_name.get(f.name) for f in fields)
        if not isinstance(row, (tuple, list)):
            raise StateValueError(f"a state row is a tuple, a Row or a dict, not {type(row).__name__} "
                                  f"({value_repr.repr(row)})", var=self.var, row=i)
        if len(row) != len(fields):
            missing = fields[len(row)].name if len(row) < len(fields) else None
            raise StateValueError(f"{len(row)} values for {len(fields)} fields "
                                  f"({', '.join(f.name for f in fields)})", var=self.var, row=i, field=missing)
        return tuple(row)

    def _columns(self, rows: Sequence[Any]) -> list[Sequence[Any]]:
        k = len(self._layout.fields)
        if set(map(type, rows)) != {tuple} or set(map(len, rows)) != {k}:
            rows = [self._as_tuple(r, i) for i, r in enumerate(rows)]
        return [list(map(itemgetter(j), rows)) for j in range(k)]

    # ---- encode -------------------------------------------------------------------------------------
    def encode(self, rows: Sequence[Any]) -> list[bytes]:
        """The bytes of each row; a value that does not fit its field raises a ``StateValueError``
        naming the variable, the row's index and the field."""
        if not isinstance(rows, (list, tuple)):
            rows = list(rows)
        if len(rows) < _VECTOR_MIN:
            return [self._encode_row(self._as_tuple(r, i), i) for i, r in enumerate(rows)]
        return self._encode_many(rows)

    def encode_one(self, row: Any) -> bytes:
        return self._encode_row(self._as_tuple(row, 0), 0)

    def _encode_row(self, values: tuple, i: int) -> bytes:
        parts = [self._head, b""]
        bits = 0
        for j, (f, v) in enumerate(zip(self._layout.fields, values)):
            if v is None or is_null(v):
                if not f.nullable:
                    raise f.null_error(i)
                bits |= 1 << j
                continue
            try:
                parts.append(f.pack(f.norm(v)))
            except BadValue as e:
                raise f.error(str(e), i) from None
        parts[1] = bits.to_bytes(self._layout.nb, "little")
        return b"".join(parts)

    def _encode_many(self, rows: Sequence[Any]) -> list[bytes]:
        lay = self._layout
        n, k = len(rows), len(lay.fields)
        cols = self._columns(rows)
        nulls = np.zeros((n, k), dtype=bool)
        data: list[Any] = []
        for j, f in enumerate(lay.fields):
            mask, d = f.column(cols[j])
            if mask is not None:
                nulls[:, j] = mask
            if f.width is None:  # the u32 length, then the bytes
                lens = np.fromiter(map(len, d), dtype=np.int64, count=n)
                d = (lens, d)
            data.append(d)
        present = ~nulls
        head = len(self._head) + lay.nb
        rowlen = np.full(n, head, dtype=np.int64)
        for j, f in enumerate(lay.fields):
            rowlen += present[:, j] * (f.width if f.width is not None else 4 + data[j][0])
        ends = np.cumsum(rowlen)
        starts = ends - rowlen
        if len(data) == sum(f.width is not None for f in lay.fields) and not nulls.any():
            return self._encode_uniform(data, n, int(rowlen[0]))
        buf = np.zeros(int(ends[-1]), dtype=np.uint8)
        if self._head:
            _scatter(buf, starts, np.frombuffer(self._head * n, dtype=np.uint8).reshape(n, 2), None)
        if nulls.any():
            bitmap = np.packbits(nulls, axis=1, bitorder="little")
            _scatter(buf, starts + len(self._head), bitmap, None)
        pos = starts + head
        for j, f in enumerate(lay.fields):
            sel = None if not nulls[:, j].any() else present[:, j]
            if f.width is not None:
                _scatter(buf, pos, data[j], sel)
                pos = pos + (f.width if sel is None else f.width * sel)
                continue
            lens, blobs = data[j]
            _scatter(buf, pos, lens.astype("<u4").view(np.uint8).reshape(n, 4), sel)
            total = int(lens.sum())
            if total and total <= _SCATTER_BYTES_PER_ROW * n:
                # short values: one scatter, through an index of 8 bytes per byte of them
                src = np.cumsum(lens) - lens
                dest = np.repeat(pos + 4 - src, lens) + np.arange(total)
                buf[dest] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
            elif total:
                # long values: each copied in place; the index would cost 8x their bytes (a 128 MiB
                # batch of 1 KiB values took 2 GiB more memory)
                mv = memoryview(buf)
                for at, ln, b in zip((pos + 4).tolist(), lens.tolist(), blobs):
                    if ln:
                        mv[at:at + ln] = b
            pos = pos + (4 + lens if sel is None else (4 + lens) * sel)
        mv = memoryview(buf)  # the rows cut from the buffer itself: no whole copy of it first
        return [bytes(mv[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]

    def _encode_uniform(self, data: list[np.ndarray], n: int, width: int) -> list[bytes]:
        """No null and no string or binary field: every row has the same layout."""
        buf = np.zeros((n, width), dtype=np.uint8)
        at = len(self._head)
        if at:
            buf[:, :at] = np.frombuffer(self._head, dtype=np.uint8)
        at += self._layout.nb  # the bitmap stays 0
        for m in data:
            buf[:, at:at + m.shape[1]] = m
            at += m.shape[1]
        out = buf.tobytes()
        return [out[i:i + width] for i in range(0, n * width, width)]

    # ---- decode -------------------------------------------------------------------------------------
    def decode(self, blobs: Sequence[bytes]) -> list[tuple]:
        """The rows (tuples in the current schema's order) of stored bytes, older versions included."""
        if not isinstance(blobs, (list, tuple)):
            blobs = list(blobs)
        if len(blobs) < _VECTOR_MIN:
            return [self._decode_row(b, i) for i, b in enumerate(blobs)]
        return self._decode_many(blobs)

    def decode_one(self, blob: bytes) -> tuple:
        return self._decode_row(blob, 0)

    def _layout_of(self, data: bytes, i: int) -> tuple[Layout, Optional[list[int]], int]:
        if self.version is None:
            return self._layout, None, 0
        if len(data) < 2:
            raise CorruptValueError(f"{len(data)} bytes, shorter than the schema version", var=self.var, row=i)
        v = _U16BE.unpack_from(data)[0]
        got = self._layouts.get(v)
        if got is None:
            raise UnknownVersionError(f"written with schema version {v}, which this codec does not know "
                                      f"(known: {sorted(self._layouts)})", var=self.var, row=i)
        return got[0], got[1], 2

    def _decode_row(self, data: bytes, i: int) -> tuple:
        if type(data) is not bytes:
            data = bytes(data)
        lay, proj, pos = self._layout_of(data, i)
        end = len(data)
        if pos + lay.nb > end:
            raise CorruptValueError("truncated in the null bitmap", var=self.var, row=i)
        bits = int.from_bytes(data[pos:pos + lay.nb], "little")
        if bits >> len(lay.fields):
            raise CorruptValueError("null bits set past the last field", var=self.var, row=i)
        pos += lay.nb
        out: list[Any] = []
        for j, f in enumerate(lay.fields):
            if bits >> j & 1:
                if not f.nullable:
                    raise f.error("null in a non-nullable field", i, CorruptValueError)
                out.append(None)
                continue
            pos, v = _read_one(f, data, pos, end, i)
            out.append(v)
        if pos != end:
            raise CorruptValueError(f"{end - pos} bytes after the last field", var=self.var, row=i)
        if proj is None:
            return tuple(out)
        return tuple(None if p < 0 else out[p] for p in proj)

    def _decode_many(self, blobs: Sequence[bytes]) -> list[tuple]:
        n = len(blobs)
        lens = np.fromiter(map(len, blobs), dtype=np.int64, count=n)
        joined = b"".join(blobs)
        buf = np.frombuffer(joined, dtype=np.uint8)
        ends = np.cumsum(lens)
        starts = ends - lens
        if self.version is None:
            return self._decode_group(self._layout, None, buf, joined, starts, ends, np.arange(n))
        short = np.nonzero(lens < 2)[0]
        if len(short):
            self._layout_of(blobs[int(short[0])], int(short[0]))
        versions = (buf[starts].astype(np.int64) << 8) | buf[starts + 1]
        found = np.unique(versions)
        if len(found) == 1:
            lay, proj = self._group_layout(int(found[0]), blobs, versions)
            return self._decode_group(lay, proj, buf, joined, starts + 2, ends, np.arange(n))
        out: list[Any] = [None] * n
        for v in found.tolist():
            idx = np.nonzero(versions == v)[0]
            lay, proj = self._group_layout(v, blobs, versions)
            rows = self._decode_group(lay, proj, buf, joined, starts[idx] + 2, ends[idx], idx)
            for i, r in zip(idx.tolist(), rows):
                out[i] = r
        return out

    def _group_layout(self, v: int, blobs: Sequence[bytes], versions: np.ndarray
                      ) -> tuple[Layout, Optional[list[int]]]:
        if v not in self._layouts:
            i = int(np.nonzero(versions == v)[0][0])
            self._layout_of(blobs[i], i)  # raises UnknownVersionError
        return self._layouts[v]

    def _decode_group(self, lay: Layout, proj: Optional[list[int]], buf: np.ndarray, joined: bytes,
                      pos: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> list[tuple]:
        """The rows whose fields start at ``pos`` (after the version), all written with ``lay``."""
        m, k = len(pos), len(lay.fields)

        def corrupt(bad: np.ndarray, msg: str, f: Optional[Field] = None) -> CorruptValueError:
            i = int(rows[int(np.nonzero(bad)[0][0])])
            return CorruptValueError(msg, var=self.var, field=None if f is None else f.name, row=i)

        if (pos + lay.nb > ends).any():
            raise corrupt(pos + lay.nb > ends, "truncated in the null bitmap")
        bitmap = _gather(buf, pos, lay.nb, None)
        bits = np.unpackbits(bitmap, axis=1, bitorder="little")
        if (bits[:, k:] != 0).any():
            raise corrupt(bits[:, k:].any(axis=1), "null bits set past the last field")
        nulls = bits[:, :k].astype(bool)
        pos = pos + lay.nb
        cols: list[list[Any]] = []
        for j, f in enumerate(lay.fields):
            isnull = nulls[:, j]
            sel = None if not isnull.any() else ~isnull
            if sel is not None and not f.nullable:
                raise corrupt(isnull, "null in a non-nullable field", f)
            p = pos if sel is None else pos[sel]
            e = ends if sel is None else ends[sel]
            chosen = rows if sel is None else rows[sel]
            pos, vals = _read_column(f, buf, joined, pos, p, e, sel, lambda b: int(chosen[b[0]]),
                                     lambda bad, msg: corrupt(_expand(bad, sel), msg, f))
            cols.append(vals if sel is None else _with_nulls(vals, sel))
        if (pos != ends).any():
            extra = int((ends - pos)[pos != ends][0])
            raise corrupt(pos != ends, f"{extra} bytes after the last field")
        if proj is not None:
            cols = [cols[p] if p >= 0 else [None] * m for p in proj]
        return list(zip(*cols))


# ---- vectorized helpers ------------------------------------------------------------------------------
def _scatter(buf: np.ndarray, pos: np.ndarray, m: np.ndarray, sel: Optional[np.ndarray]) -> None:
    """buf[pos[i] : pos[i] + width] = m[i] for each row i (selected by ``sel``)."""
    width = m.shape[1]
    if sel is not None:
        pos, m = pos[sel], m[sel]
    buf[pos[:, None] + np.arange(width)] = m


def _gather(buf: np.ndarray, pos: np.ndarray, width: int, sel: Optional[np.ndarray]) -> np.ndarray:
    if sel is not None:
        pos = pos[sel]
    return buf[pos[:, None] + np.arange(width)]


def _expand(bad: np.ndarray, sel: Optional[np.ndarray]) -> np.ndarray:
    """A mask over the selected rows as a mask over all rows."""
    if sel is None:
        return bad
    full = np.zeros(len(sel), dtype=bool)
    full[np.nonzero(sel)[0][bad]] = True
    return full


def _with_nulls(vals: list[Any], sel: np.ndarray) -> list[Any]:
    col: list[Any] = [None] * len(sel)
    for i, v in zip(np.nonzero(sel)[0].tolist(), vals):
        col[i] = v
    return col


def _read_column(f: Field, buf: np.ndarray, joined: bytes, pos: np.ndarray, p: np.ndarray, e: np.ndarray,
                 sel: Optional[np.ndarray], row_of: Callable[[np.ndarray], int],
                 corrupt: Callable[[np.ndarray, str], CorruptValueError]) -> tuple[np.ndarray, list[Any]]:
    """Reads field ``f`` of the selected rows (at ``p``, ending at ``e``); the next field's positions."""
    if f.width is not None:
        if (p + f.width > e).any():
            raise corrupt(p + f.width > e, "truncated")
        vals = f.values(_gather(buf, p, f.width, None), row_of)
        return pos + (f.width if sel is None else f.width * sel), vals
    if (p + 4 > e).any():
        raise corrupt(p + 4 > e, "truncated in a length")
    lens = np.ascontiguousarray(_gather(buf, p, 4, None)).view("<u4").reshape(-1).astype(np.int64)
    if (p + 4 + lens > e).any():
        raise corrupt(p + 4 + lens > e, "a length past the end of the value")
    a = (p + 4).tolist()
    b = (p + 4 + lens).tolist()
    if f.kind == "binary":
        vals = [joined[x:y] for x, y in zip(a, b)]
    elif f.nested is not None:
        vals = [f.nested_value(joined[x:y], row_of(np.array([j]))) for j, (x, y) in enumerate(zip(a, b))]
    else:
        try:
            vals = [joined[x:y].decode("utf-8") for x, y in zip(a, b)]
        except UnicodeDecodeError:
            bad = np.array([_bad_utf8(joined[x:y]) for x, y in zip(a, b)])
            raise corrupt(bad, "a stored string is not valid UTF-8") from None
    step = np.zeros(len(pos), dtype=np.int64)
    if sel is None:
        step = 4 + lens
    else:
        step[sel] = 4 + lens
    return pos + step, vals


def _bad_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def _read_one(f: Field, data: bytes, pos: int, end: int, i: int) -> tuple[int, Any]:
    """Field ``f`` of one stored row at ``pos``: (the next position, the Python value)."""
    if f.width is not None:
        if pos + f.width > end:
            raise f.error("truncated", i, CorruptValueError)
        return pos + f.width, f.value(data, pos, i)
    if pos + 4 > end:
        raise f.error("truncated in a length", i, CorruptValueError)
    n = U32.unpack_from(data, pos)[0]
    pos += 4
    if pos + n > end:
        raise f.error("a length past the end of the value", i, CorruptValueError)
    raw = data[pos:pos + n]
    if f.kind == "binary":
        return pos + n, raw
    if f.nested is not None:
        return pos + n, f.nested_value(raw, i)
    try:
        return pos + n, raw.decode("utf-8")
    except UnicodeDecodeError:
        raise f.error("a stored string is not valid UTF-8", i, CorruptValueError) from None
