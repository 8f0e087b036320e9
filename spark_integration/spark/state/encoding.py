"""The canonical bytes of a grouping key: the **routing part** of every entry of
that key (``layout.py``), and what a row is routed by (``runtime/routing.py``).

``encode_key`` must give the same bytes for the same key on every executor
(the bytes are hashed to the key's vnode), so it is a fixed, typed encoding of
the key's components, not ``pickle`` (which writes ``1`` and ``numpy.int64(1)``
differently). Each component is a type tag and a fixed-width or
length-prefixed body, so an encoded key is never a proper prefix of another of
the same columns: a prefix scan of ``head + encode_key(k)`` finds k's entries
only.

``scheduling/java/io/rhino/spark/KeyRouter.java`` encodes keys of integer, string,
binary and boolean columns the same way, to route rows in the JVM: change both
together (``tests/test_spark_routing_jvm.py`` compares them).
"""

from __future__ import annotations

import datetime as _dt
import struct
from typing import Any

import numpy as np

__all__ = ["encode_key", "decode_key"]

_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_EPOCH = _dt.datetime(1970, 1, 1)


def _component(v: Any, out: bytearray) -> None:
    if isinstance(v, np.generic):
        v = v.item()
    if v is None:
        out += b"n"
    elif isinstance(v, bool):
        out += b"T" if v else b"F"
    elif isinstance(v, int):
        if -(1 << 63) <= v < (1 << 63):
            out += b"i" + _I64.pack(v)
        else:
            s = str(v).encode()
            out += b"I" + _I64.pack(len(s)) + s
    elif isinstance(v, float):
        out += b"f" + _F64.pack(v)
    elif isinstance(v, str):
        b = v.encode("utf-8")
        out += b"s" + _I64.pack(len(b)) + b
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        out += b"b" + _I64.pack(len(b)) + b
    elif isinstance(v, _dt.datetime):
        # pandas Timestamps are datetimes; a naive one is taken as is (Spark hands
        # keys over in the session's time zone, the same on every executor).
        import pandas as pd

        ns = pd.Timestamp(v).value
        out += b"t" + _I64.pack(ns)
    elif isinstance(v, _dt.date):
        out += b"d" + _I64.pack((v - _dt.date(1970, 1, 1)).days)
    else:
        raise TypeError(f"rhino.spark cannot use a grouping key component of type {type(v).__name__} "
                        f"({v!r}); supported: int, float, str, bytes, bool, None, date, timestamp")


def encode_key(key: tuple) -> bytes:
    """The canonical bytes of a grouping key (a tuple of its columns' values)."""
    out = bytearray()
    for v in key:
        _component(v, out)
    return bytes(out)


def decode_key(data: bytes) -> tuple:
    """The grouping key tuple of ``encode_key``'s bytes (timestamps as pandas Timestamps)."""
    out: list[Any] = []
    i = 0
    n = len(data)
    while i < n:
        tag = data[i:i + 1]
        i += 1
        if tag == b"n":
            out.append(None)
        elif tag == b"T":
            out.append(True)
        elif tag == b"F":
            out.append(False)
        elif tag == b"i":
            out.append(_I64.unpack_from(data, i)[0])
            i += 8
        elif tag == b"f":
            out.append(_F64.unpack_from(data, i)[0])
            i += 8
        elif tag in (b"s", b"b", b"I"):
            ln = _I64.unpack_from(data, i)[0]
            i += 8
            raw = data[i:i + ln]
            i += ln
            out.append(raw.decode("utf-8") if tag == b"s" else int(raw) if tag == b"I" else bytes(raw))
        elif tag == b"t":
            import pandas as pd

            out.append(pd.Timestamp(_I64.unpack_from(data, i)[0]))
            i += 8
        elif tag == b"d":
            out.append(_dt.date(1970, 1, 1) + _dt.timedelta(days=_I64.unpack_from(data, i)[0]))
            i += 8
        else:
            raise ValueError(f"corrupt grouping key bytes {data!r} (tag {tag!r} at {i - 1})")
    return tuple(out)
