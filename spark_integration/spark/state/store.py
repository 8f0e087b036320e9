"""The state of one instance during one batch: what the task prefetched, what the
processor changed, and the write-back before the commit (layout: ``layout.py``).

Round trips per batch are constant, not one per key or per variable:

1. (event time) the due timers: one pipelined scan of ``t`` per vnode of the
   instance (``Session.scan_many``); a vnode with more due timers than a page
   is scanned on;
2. one ``get_batch`` of every ValueState of every key of the batch;
3. one ``scan_many`` of every ListState, MapState and timer set of every key,
   at most ``small`` entries each. A collection that fits is **complete** and
   served from memory; a larger one is read on demand: a MapState's
   ``getValue`` reads one entry, its ``iterator`` and a ListState's ``get``
   stream by prefix scan, page by page. No collection is ever read whole
   unless the processor iterates it;
4. the write-back: one ``delete_batch`` and one ``put_batch`` (the client
   splits them into frames; the worker's session has no per-key cap).

TTL (Spark's semantics): an entry written with a TTL expires ``ttl_ms`` after
its last update, in batch time; it is invisible from the first batch whose
time is at or past its expiry (``expiry <= now``), and the worker's compaction
filter removes it physically later.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

import rhino

from . import layout
from .layout import KEY_TIMERS, TIME_INDEX
from .variables import VarInfo

__all__ = ["BatchState"]


def _tail(key: bytes) -> bytes:
    got = rhino.split_routed_key(key)
    if got is None:
        raise ValueError(f"a plain key {key[:40]!r} among rhino.spark's routed entries (the state is corrupt)")
    return got[2]


class _Value:
    __slots__ = ("value", "expiry", "dirty")

    def __init__(self, value: Optional[tuple], expiry: Optional[int]) -> None:
        self.value, self.expiry, self.dirty = value, expiry, False


class _List:
    __slots__ = ("stored", "complete", "appended", "replaced", "n")

    def __init__(self, stored: list, complete: bool) -> None:
        self.stored = stored  # [(tail, value, expiry)] visible, in order
        self.complete = complete
        self.appended: list[tuple[tuple, Optional[int]]] = []
        self.replaced = False  # the stored elements are deleted at the write-back
        self.n = 0


class _Map:
    __slots__ = ("stored", "complete", "changes", "cleared")

    def __init__(self, stored: dict, complete: bool) -> None:
        self.stored = stored  # {user key bytes: (user key, value, expiry)}, visible ones (a cache if not complete)
        self.complete = complete
        self.changes: dict[bytes, Optional[tuple]] = {}  # user key bytes -> (user key, value, expiry) | None
        self.cleared = False


class _Timers:
    __slots__ = ("stored", "complete", "now")

    def __init__(self, stored: set, complete: bool) -> None:
        self.stored = stored
        self.complete = complete
        self.now = set(stored)


class BatchState:
    """One batch's state of one instance, over its open session."""

    def __init__(self, session: Any, part: Any, variables: dict[str, VarInfo], *, batch: int, now_ms: int,
                 timers: bool, small: int = 64) -> None:
        self.s = session
        self.part = part
        self.vars = variables
        self.batch = int(batch)
        self.now = int(now_ms)
        self.use_timers = timers
        self.small = int(small)
        self.current: Optional[bytes] = None  # the grouping key (its bytes) the processor is called for
        self.vnode_of: dict[bytes, int] = {}
        self.values: dict[tuple[int, bytes], _Value] = {}
        self.lists: dict[tuple[int, bytes], _List] = {}
        self.maps: dict[tuple[int, bytes], _Map] = {}
        self.timers: dict[bytes, _Timers] = {}
        self.fired: list[tuple[int, bytes]] = []
        self.stats = {"entries_read": 0, "entries_written": 0, "entries_deleted": 0, "large_reads": 0}

    # ---- helpers ---------------------------------------------------------------------------
    def _live(self, var: VarInfo, blob: bytes) -> tuple[Optional[int], bytes]:
        """(expiry, payload) of a stored value; expiry None for a variable without TTL."""
        if var.ttl_ms is None:
            return None, blob
        return layout.unpack_expiry(blob), blob[8:]

    def _visible(self, expiry: Optional[int]) -> bool:
        return expiry is None or expiry > self.now

    def expiry_for(self, var: VarInfo) -> Optional[int]:
        return None if var.ttl_ms is None else self.now + var.ttl_ms

    def _decode(self, var: VarInfo, blobs: list[bytes]) -> list[tuple[Optional[int], Optional[tuple]]]:
        """(expiry, value) per stored value; value None if expired."""
        parts = [self._live(var, b) for b in blobs]
        keep = [i for i, (e, _) in enumerate(parts) if self._visible(e)]
        vals = var.codec.decode([parts[i][1] for i in keep]) if keep else []
        out: list[tuple[Optional[int], Optional[tuple]]] = [(e, None) for e, _ in parts]
        for i, v in zip(keep, vals):
            out[i] = (parts[i][0], v)
        return out

    def require_current(self) -> bytes:
        if self.current is None:
            raise RuntimeError("state used outside handleInputRows / handleExpiredTimer "
                               "(rhino.spark sets the grouping key only for those calls)")
        return self.current

    def _vnodes(self, gs: list[bytes]) -> None:
        need = [g for g in gs if g not in self.vnode_of]
        if need:
            for g, v in zip(need, layout.vnodes_of(self.part, need)):
                self.vnode_of[g] = int(v)

    # ---- step 1: due timers -------------------------------------------------------------------
    def due_timers(self, vnodes: Iterable[int], upto_ms: int) -> list[tuple[int, bytes]]:
        """(time, grouping key) of the stored timers at or before ``upto_ms`` in ``vnodes``, in
        (time, key) order."""
        vnodes = [int(v) for v in vnodes]
        out: list[tuple[int, bytes]] = []
        if not vnodes:
            return out
        pages = self.s.scan_many([(v, TIME_INDEX) for v in vnodes], self.small)
        for v, (entries, done) in zip(vnodes, pages):
            mine: list[tuple[int, bytes]] = []
            if self._take_due(entries, upto_ms, mine, v) and not done:
                # more due timers than one page in this vnode: scan it on, from the start
                mine = []
                self.stats["large_reads"] += 1
                for page in _pages(self.s.scan(vnode=v, prefix=TIME_INDEX)):
                    if not self._take_due(page, upto_ms, mine, v):
                        break
            out += mine
        out.sort()
        return out

    def _take_due(self, entries: list, upto_ms: int, out: list, vnode: int) -> bool:
        """Adds the due timers of ``entries`` (of ``vnode``); False once one is not due
        (the rest are later: ``t`` entries sort by time)."""
        for k, _ in entries:
            head, g, _t, _f = rhino.split_routed_key(k)
            ts = layout.time_ms_of_timer(head)
            if ts > upto_ms:
                return False
            out.append((ts, g))
            self.vnode_of[g] = vnode
        return True

    # ---- steps 2-3: prefetch ------------------------------------------------------------------
    def prefetch(self, gs: list[bytes]) -> None:
        """Loads the values, and the collections up to ``small`` entries, of keys ``gs``."""
        gs = sorted(set(gs))
        if not gs:
            return
        self._vnodes(gs)
        vals = [v for v in self.vars.values() if v.kind == "value"]
        if vals:
            keys = [k for v in vals for k in v.heads.keys(gs)]
            blobs = self.s.get_batch(keys)
            self.stats["entries_read"] += sum(b is not None for b in blobs)
            for j, var in enumerate(vals):
                mine = blobs[j * len(gs):(j + 1) * len(gs)]
                found = [i for i, b in enumerate(mine) if b is not None]
                dec = self._decode(var, [mine[i] for i in found])
                for g in gs:
                    self.values[(var.id, g)] = _Value(None, None)
                for i, (e, val) in zip(found, dec):
                    self.values[(var.id, gs[i])] = _Value(val, e)
        self._prefetch_collections(gs)

    def _prefetch_collections(self, gs: list[bytes]) -> None:
        colls = [v for v in self.vars.values() if v.kind in ("list", "map")]
        items: list[tuple[int, bytes]] = []
        owners: list[tuple[Optional[VarInfo], bytes]] = []
        for var in colls:
            for g in gs:
                items.append((self.vnode_of[g], var.heads.prefix(g)))
                owners.append((var, g))
        if self.use_timers:
            for g in gs:
                items.append((self.vnode_of[g], KEY_TIMERS + g))
                owners.append((None, g))
        if not items:
            return
        pages = self.s.scan_many(items, self.small)
        by_var: dict[int, list] = {}
        for (var, g), (entries, done) in zip(owners, pages):
            self.stats["entries_read"] += len(entries)
            if var is None:
                self.timers[g] = _Timers({layout.time_ms_of_timer(_tail(k)) for k, _ in entries}, bool(done))
            else:
                by_var.setdefault(var.id, []).append((var, g, entries, bool(done)))
        for groups in by_var.values():
            self._load_collections(groups)

    def _load_collections(self, groups: list) -> None:
        """Decodes one variable's prefetched entries, in one codec call."""
        var = groups[0][0]
        flat = [(g, k, b) for _, g, entries, _ in groups for k, b in entries]
        dec = self._decode(var, [b for _, _, b in flat])
        keys_dec: list = []
        if var.kind == "map":
            live = [i for i, (_, v) in enumerate(dec) if v is not None]
            ukeys = var.key_codec.decode([_tail(flat[i][1]) for i in live]) if live else []
            keys_dec = [None] * len(flat)
            for i, uk in zip(live, ukeys):
                keys_dec[i] = uk
        per: dict[bytes, list] = {}
        for i, (g, k, _) in enumerate(flat):
            e, v = dec[i]
            if v is not None:
                per.setdefault(g, []).append((k, v, e, keys_dec[i] if keys_dec else None))
        for _, g, _, done in groups:
            got = per.get(g, [])
            if var.kind == "list":
                self.lists[(var.id, g)] = _List([(_tail(k), v, e) for k, v, e, _ in got], done)
            else:
                self.maps[(var.id, g)] = _Map({_tail(k): (uk, v, e) for k, v, e, uk in got}, done)

    # ---- what the state objects call ----------------------------------------------------------
    def value(self, var: VarInfo) -> _Value:
        g = self.require_current()
        cell = self.values.get((var.id, g))
        if cell is None:  # a key the prefetch did not know (a timer's key registered late): read it
            self._vnodes([g])
            blob = self.s.get_batch([var.heads.key(g)])[0]
            self.stats["large_reads"] += 1
            e, v = self._decode(var, [blob])[0] if blob is not None else (None, None)
            cell = self.values[(var.id, g)] = _Value(v, e)
        return cell

    def list_cell(self, var: VarInfo) -> _List:
        g = self.require_current()
        cell = self.lists.get((var.id, g))
        if cell is None:
            cell = self.lists[(var.id, g)] = _List([], False)
        return cell

    def map_cell(self, var: VarInfo) -> _Map:
        g = self.require_current()
        cell = self.maps.get((var.id, g))
        if cell is None:
            cell = self.maps[(var.id, g)] = _Map({}, False)
        return cell

    def timer_cell(self) -> _Timers:
        g = self.require_current()
        cell = self.timers.get(g)
        if cell is None or not cell.complete:
            self._vnodes([g])
            stored = {layout.time_ms_of_timer(_tail(k))
                      for page in _pages(self.s.scan(vnode=self.vnode_of[g], prefix=KEY_TIMERS + g)) for k, _ in page}
            self.stats["large_reads"] += 1
            old = cell
            cell = self.timers[g] = _Timers(stored, True)
            if old is not None:  # changes made before the full read
                cell.now = (stored | (old.now - old.stored)) - (old.stored - old.now)
        return cell

    def stream_list(self, var: VarInfo, cell: _List) -> Iterator[tuple]:
        """The stored elements of a list larger than the prefetch, page by page."""
        g = self.require_current()
        self._vnodes([g])
        self.stats["large_reads"] += 1
        for page in _pages(self.s.scan(vnode=self.vnode_of[g], prefix=var.heads.prefix(g))):
            for _e, v in self._decode(var, [b for _, b in page]):
                if v is not None:
                    yield v

    def stream_map(self, var: VarInfo) -> Iterator[tuple[bytes, tuple, tuple]]:
        """(user key bytes, user key, value) of the stored entries of a large map, page by page."""
        g = self.require_current()
        self._vnodes([g])
        self.stats["large_reads"] += 1
        for page in _pages(self.s.scan(vnode=self.vnode_of[g], prefix=var.heads.prefix(g))):
            dec = self._decode(var, [b for _, b in page])
            live = [i for i, (_, v) in enumerate(dec) if v is not None]
            tails = [_tail(page[i][0]) for i in live]
            for i, t, uk in zip(live, tails, var.key_codec.decode(tails) if tails else []):
                yield t, uk, dec[i][1]

    def map_get(self, var: VarInfo, cell: _Map, kb: bytes) -> Optional[tuple]:
        """One entry of a map not wholly in memory: one read, then cached."""
        g = self.require_current()
        self._vnodes([g])
        self.stats["large_reads"] += 1
        blob = self.s.get_batch([var.heads.key(g, kb)])[0]
        if blob is None:
            return None
        e, v = self._decode(var, [blob])[0]
        if v is None:
            return None
        cell.stored[kb] = (var.key_codec.decode([kb])[0], v, e)
        return cell.stored[kb]

    def stored_keys(self, var: VarInfo, g: bytes) -> Iterator[bytes]:
        """Every stored key of one collection (for a clear of a large one), page by page."""
        self._vnodes([g])
        for page in _pages(self.s.scan(vnode=self.vnode_of[g], prefix=var.heads.prefix(g))):
            for k, _ in page:
                yield k


def _pages(it: Any) -> Iterator[list]:
    """``Session.scan`` yields (key, value) pairs or pages of them: pages, either way."""
    page: list = []
    for x in it:
        if isinstance(x, list):
            if page:
                yield page
                page = []
            yield x
            continue
        page.append(x)
        if len(page) >= 4096:
            yield page
            page = []
    if page:
        yield page
