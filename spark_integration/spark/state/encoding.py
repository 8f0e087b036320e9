"""How a processor's state is laid out in an instance's RocksDB.

One grouping key = one Rhino key, whose value is a **key record**: every state
variable of that key (ValueState, ListState, MapState) and its timers, in one
value. A batch then reads the state of all its keys with one ``get_batch`` and
writes it back with one ``put_batch`` / ``delete_batch`` before the commit
(the issue's "batched state access"): per-key state calls never touch the
worker. Spark's own store keeps one row per state variable (and per map entry);
one record per key trades that granularity for one round trip per batch, and a
key's state is read and rewritten whole when it is touched. Keys whose state is
large and mostly cold would want the finer layout; NEXMark's do not.

Rhino keys:
- ``b"\\x00" + encode_key(grouping key)``: the key record;
- ``b"\\x01T" + ...``: a timer-index bucket (``timers.py``).
The prefix byte keeps the two apart under ``Session.scan(prefix=...)``.

``encode_key`` must give the same bytes for the same key on every executor
(the bytes are hashed to the key's vnode), so it is a fixed, typed encoding of
the key's components, not ``pickle`` (which writes ``1`` and ``numpy.int64(1)``
differently). Records are pickled (protocol 5): values are the processor's
own tuples, read back by the same processor.
"""

from __future__ import annotations

import datetime as _dt
import pickle
import struct
from typing import Any, Optional

import numpy as np

__all__ = ["encode_key", "decode_key", "record_key", "KeyRecord", "RECORD_PREFIX", "TIMER_PREFIX"]

RECORD_PREFIX = b"\x00"
TIMER_PREFIX = b"\x01T"

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


def record_key(encoded_key: bytes) -> bytes:
    return RECORD_PREFIX + encoded_key


class KeyRecord:
    """The state of one grouping key, decoded lazily from its stored value.

    ``values`` {state name: tuple}, ``lists`` {name: list of tuples}, ``maps``
    {name: {key tuple: value tuple}}, ``timers`` (a set of expiry ms)."""

    __slots__ = ("key", "values", "lists", "maps", "timers", "dirty", "stored_timers")

    def __init__(self, data: Optional[bytes] = None) -> None:
        #: the grouping key as the processor was given it (handleExpiredTimer gets the same tuple)
        self.key: Optional[tuple] = None
        if data is None:
            self.values: dict[str, tuple] = {}
            self.lists: dict[str, list] = {}
            self.maps: dict[str, dict] = {}
            self.timers: set[int] = set()
        else:
            try:
                self.key, v, l, m, t = pickle.loads(data)
            except Exception as e:  # a corrupt value must name itself, not crash the task obscurely
                raise ValueError(f"corrupt rhino.spark key record ({len(data)} bytes): {e}") from e
            self.values, self.lists, self.maps, self.timers = v, l, m, set(t)
        #: the timers as stored, to update the timer index by difference
        self.stored_timers: frozenset[int] = frozenset(self.timers)
        self.dirty = False

    def empty(self) -> bool:
        return not (self.values or self.lists or self.maps or self.timers)

    def encode(self) -> bytes:
        return pickle.dumps((self.key, self.values, self.lists, self.maps, sorted(self.timers)), protocol=5)
