"""The event-time timer index of an instance, kept in the instance's own state.

A key's timers live in its key record (``listTimers`` reads them there). To find
the keys whose timers expire at a watermark without reading every record, the
index groups timers into **buckets**: one Rhino key per (vnode, time bucket of
``bucket_ms``), whose value lists the (expiry ms, grouping key) pairs in it.

A bucket must live in the vnode of the keys it lists, or a handover that moves
the vnode would separate a key from its timers. Rhino routes a key by the hash
of its bytes, so the bucket key carries a **salt**: ``TIMER_PREFIX + bucket +
salt``, with the smallest salt whose hash falls in the vnode. The salts of a
time bucket are found for every vnode at once, by hashing a few hundred
candidate keys in one vectorized call, and cached per process: a batch's timers
fall in a handful of time buckets.

Bucket keys sort by time within a vnode, so the expired ones are a prefix of a
per-vnode ``scan``: firing timers reads only what expires (plus one page).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, Iterable

import numpy as np

from .encoding import TIMER_PREFIX

__all__ = ["TimerIndex", "bucket_key", "parse_bucket_key"]

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_OFFSET = 1 << 63  # signed ms -> unsigned, keeping the order
_SALT_CACHE: dict[tuple, np.ndarray] = {}


def _salts(partitioner: Any, bucket: int) -> np.ndarray:
    """salt[v] for every vnode v: the smallest salt whose bucket key hashes into v."""
    ck = (partitioner.num_key_groups, partitioner.num_vnodes, partitioner.seed, bucket)
    got = _SALT_CACHE.get(ck)
    if got is not None:
        return got
    n = partitioner.num_vnodes
    salts = np.full(n, -1, dtype=np.int64)
    head = TIMER_PREFIX + _U64.pack(bucket + _OFFSET)
    start, step = 0, max(1024, 8 * n)
    while (salts < 0).any():
        if start > 10_000_000:
            raise RuntimeError(f"no timer bucket salt found for some vnodes of bucket {bucket}")
        cands = [head + _U32.pack(s) for s in range(start, start + step)]
        vn = np.asarray(partitioner.vnodes(cands))
        uniq, first = np.unique(vn, return_index=True)  # the first (smallest) salt in each vnode
        fresh = salts[uniq] < 0
        salts[uniq[fresh]] = start + first[fresh]
        start += step
    if len(_SALT_CACHE) > 100_000:
        _SALT_CACHE.clear()
    _SALT_CACHE[ck] = salts
    return salts


def bucket_key(partitioner: Any, vnode: int, bucket: int) -> bytes:
    return TIMER_PREFIX + _U64.pack(bucket + _OFFSET) + _U32.pack(int(_salts(partitioner, bucket)[vnode]))


def parse_bucket_key(key: bytes) -> int:
    """The time bucket of a bucket key."""
    return _U64.unpack_from(key, len(TIMER_PREFIX))[0] - _OFFSET


class TimerIndex:
    """The buckets of one instance touched by one batch: what expired, and the
    additions and removals to write back."""

    def __init__(self, partitioner: Any, bucket_ms: int) -> None:
        self.part = partitioner
        self.bucket_ms = int(bucket_ms)
        #: bucket key -> {(ts, encoded key)} as read (None: not read yet)
        self._buckets: dict[bytes, set] = {}
        self._changed: set[bytes] = set()

    def _key(self, vnode: int, ts: int) -> bytes:
        return bucket_key(self.part, vnode, ts // self.bucket_ms)

    def expired(self, session: Any, vnodes: Iterable[int], watermark_ms: int) -> list[tuple[int, bytes]]:
        """The (ts, encoded key) pairs with ts <= watermark in the instance's
        ``vnodes``, in (ts, key) order; their buckets are loaded."""
        last_bucket = watermark_ms // self.bucket_ms
        out: list[tuple[int, bytes]] = []
        for v in vnodes:
            for k, val in session.scan(vnode=int(v), prefix=TIMER_PREFIX, page_size=8):
                if parse_bucket_key(k) > last_bucket:
                    break
                entries = set(pickle.loads(val))
                self._buckets[k] = entries
                out.extend(e for e in entries if e[0] <= watermark_ms)
        out.sort()
        return out

    def update(self, session: Any, changes: list[tuple[int, int, bytes, bool]]) -> None:
        """Applies (vnode, ts, encoded key, add?) changes: reads the buckets not
        loaded yet in one request, then marks them for ``write``."""
        keyed = [(self._key(v, ts), ts, ek, add) for v, ts, ek, add in changes]
        need = sorted({k for k, *_ in keyed if k not in self._buckets})
        if need:
            for k, val in zip(need, session.get_batch(need)):
                self._buckets[k] = set(pickle.loads(val)) if val is not None else set()
        for k, ts, ek, add in keyed:
            if add:
                self._buckets[k].add((ts, ek))
            else:
                self._buckets[k].discard((ts, ek))
            self._changed.add(k)

    def remove_fired(self, fired: list[tuple[int, bytes]], vnode_of: dict[bytes, int]) -> None:
        for ts, ek in fired:
            k = self._key(vnode_of[ek], ts)
            b = self._buckets.get(k)
            if b is not None:
                b.discard((ts, ek))
                self._changed.add(k)

    def writes(self) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """(put keys, put values, delete keys) of the changed buckets."""
        pk: list[bytes] = []
        pv: list[bytes] = []
        dk: list[bytes] = []
        for k in sorted(self._changed):
            b = self._buckets[k]
            if b:
                pk.append(k)
                pv.append(pickle.dumps(sorted(b), protocol=5))
            else:
                dk.append(k)
        return pk, pv, dk
