"""Where a processor's state lives in an instance's RocksDB: one entry per value,
list element, map entry and timer (docs/design.md §2, "State layout").

Every stored key is a **routed key** (docs/protocol.md §7, "Keys"):
``head | routing | tail``, plus a trailer that the C++ partitioner reads. Its
routing part is the grouping key's canonical bytes (``encoding.encode_key``), so
every entry of a grouping key is in that key's vnode: handovers, rescales and
restores keep a key's state together, and a row is routed (``runtime/routing.py``)
by the same bytes. The composition itself is C++'s (``rhino.routed_keys``).

Heads (a kind byte, then the state variable's id, u16 big-endian):

=================  ======================  =================================
head               tail                    entry
=================  ======================  =================================
``v`` id           (none)                  a ValueState's value
``l`` id           seq, u64 BE             one ListState element, in order
``m`` id           the map key's row       one MapState entry
``T``              time, u64 BE (+2^63)    a key's timer (``listTimers``)
``t`` time         (none)                  the same timer, by time
=================  ======================  =================================

The ``t`` entries of a vnode sort by time, so the timers due at a watermark
are the front of one range scan (``prefix=b"t"``) per vnode, with no size cap.
A list element's seq is ``batch << 24 | n``: appends never read the list, and a
batch that runs again writes the same keys.

Values are the row codec's bytes (``codec.py``). A variable with a TTL sets
the TTL flag of its keys, and its values start with the expiry (i64 BE, batch
time in ms): the worker's compaction filter drops expired entries (no scan).
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import rhino

__all__ = ["Heads", "vnodes_of", "timer_key", "timer_keys", "time_ms_of_timer", "SEQ_BITS", "list_seq", "KIND_BYTES",
           "TIME_INDEX", "KEY_TIMERS"]

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_OFFSET = 1 << 63  # signed ms -> unsigned, keeping the order
SEQ_BITS = 24
KIND_BYTES = {"value": b"v", "list": b"l", "map": b"m"}
TIME_INDEX = b"t"
KEY_TIMERS = b"T"


def list_seq(batch: int, n: int) -> bytes:
    """The tail of the n-th element a batch appends to one list."""
    if n >= 1 << SEQ_BITS:
        raise ValueError(f"more than {1 << SEQ_BITS} appends to one list in one batch")
    return _U64.pack((int(batch) << SEQ_BITS) | n)


def seq_batch(tail: bytes) -> int:
    """The batch that appended a list element (from its tail)."""
    return _U64.unpack(tail)[0] >> SEQ_BITS


class Heads:
    """The keys of one state variable."""

    __slots__ = ("head", "ttl")

    def __init__(self, kind: str, var_id: int, ttl: bool) -> None:
        if not 0 <= var_id < 1 << 16:
            raise ValueError(f"state variable id {var_id} out of range")
        self.head = KIND_BYTES[kind] + _U16.pack(var_id)
        self.ttl = bool(ttl)

    def key(self, g: bytes, tail: bytes = b"") -> bytes:
        return rhino.routed_key(self.head, g, tail, ttl=self.ttl)

    def keys(self, gs: Sequence[bytes], tails: Sequence[bytes] | bytes = b"") -> list[bytes]:
        return rhino.routed_keys(self.head, gs, tails, ttl=self.ttl)

    def prefix(self, g: bytes) -> bytes:
        """The prefix of every entry of this variable for grouping key ``g``."""
        return self.head + g


def vnodes_of(part: Any, gs: Sequence[bytes]) -> Any:
    """The vnode of each grouping key's entries: of a routed key whose routing part is the
    key's bytes. Not ``part.vnodes(gs)``: a key's bytes may themselves end like a trailer
    (an int key ending in 0xF5 does), and would then be routed by the wrong part."""
    return part.vnodes(rhino.routed_keys(b"", gs, b""))


def timer_key(g: bytes, ts: int) -> bytes:
    return rhino.routed_key(KEY_TIMERS, g, _U64.pack(int(ts) + _OFFSET))


def timer_keys(g: bytes, ts: int) -> tuple[bytes, bytes]:
    """(by key, by time) of one timer."""
    t = _U64.pack(int(ts) + _OFFSET)
    return rhino.routed_key(KEY_TIMERS, g, t), rhino.routed_key(TIME_INDEX + t, g)


def time_ms_of_timer(tail_or_head: bytes) -> int:
    """The time of a timer, from the 8 bytes after its kind byte (a ``T`` tail or a ``t`` head)."""
    return _U64.unpack_from(tail_or_head, len(tail_or_head) - 8)[0] - _OFFSET


def pack_expiry(ms: int) -> bytes:
    return _I64.pack(int(ms))


def unpack_expiry(value: bytes) -> int:
    return _I64.unpack_from(value, 0)[0]
