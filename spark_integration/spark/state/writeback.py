"""The write-back of one batch's state changes before the commit (``store.py``):
every change becomes entry puts and deletes (layout: ``layout.py``), sent as
one ``delete_batch`` then one ``put_batch``. Deletes go first, so a key cleared
and written again in the same batch ends up written.

Values are encoded here, one codec call per state variable (vectorized); a
wrong value is refused with the variable, the field and the grouping key named
(``schema.StateSchemaError``), and nothing of the batch is committed.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import rhino
from rhino.errors import InvalidArgumentError

from . import layout
from .encoding import decode_key
from .schema import StateSchemaError, StateValueError
from .store import BatchState
from .variables import VarInfo

__all__ = ["write_back"]


def _encode(var: VarInfo, rows: list[tuple], expiries: list[Optional[int]], gs: list[bytes]) -> list[bytes]:
    try:
        blobs = var.codec.encode(rows)
    except StateSchemaError as e:
        row = getattr(e, "row", None)
        where = f" (grouping key {decode_key(gs[row])!r})" if isinstance(row, int) and 0 <= row < len(gs) else ""
        err = type(e)(f"{e}{where}")
        err.var, err.field, err.row = e.var, e.field, e.row
        raise err from None
    if var.ttl_ms is None:
        return blobs
    return [layout.pack_expiry(x) + b for x, b in zip(expiries, blobs)]


class _Writes:
    def __init__(self) -> None:
        self.put_k: list[bytes] = []
        self.put_v: list[bytes] = []
        self.dels: list[bytes] = []


def _values(st: BatchState, w: _Writes) -> None:
    by_var: dict[int, list] = {}
    for (vid, g), cell in st.values.items():
        if cell.dirty:
            by_var.setdefault(vid, []).append((g, cell))
    ids = {v.id: v for v in st.vars.values()}
    for vid, cells in by_var.items():
        var = ids[vid]
        live = [(g, c) for g, c in cells if c.value is not None]
        w.dels += [var.heads.key(g) for g, c in cells if c.value is None]
        if live:
            gs = [g for g, _ in live]
            w.put_k += var.heads.keys(gs)
            w.put_v += _encode(var, [c.value for _, c in live], [c.expiry for _, c in live], gs)


def _lists(st: BatchState, w: _Writes) -> None:
    ids = {v.id: v for v in st.vars.values()}
    by_var: dict[int, list] = {}
    for (vid, g), cell in st.lists.items():
        var = ids[vid]
        if cell.replaced:
            if cell.complete:
                w.dels += [var.heads.key(g, t) for t, _, _ in cell.stored]
            else:
                w.dels += list(st.stored_keys(var, g))
        if cell.appended:
            by_var.setdefault(vid, []).append((g, cell))
    for vid, cells in by_var.items():
        var = ids[vid]
        gs, tails, rows, exp = [], [], [], []
        for g, cell in cells:
            for i, (v, e) in enumerate(cell.appended):
                gs.append(g)
                tails.append(layout.list_seq(st.batch, i))
                rows.append(v)
                exp.append(e)
        w.put_k += var.heads.keys(gs, tails)
        w.put_v += _encode(var, rows, exp, gs)


def _maps(st: BatchState, w: _Writes) -> None:
    ids = {v.id: v for v in st.vars.values()}
    by_var: dict[int, list] = {}
    for (vid, g), cell in st.maps.items():
        var = ids[vid]
        if cell.cleared:
            if cell.complete:
                w.dels += [var.heads.key(g, kb) for kb in cell.stored]
            else:
                w.dels += list(st.stored_keys(var, g))
        for kb, ch in cell.changes.items():
            if ch is None:
                w.dels.append(var.heads.key(g, kb))
            else:
                by_var.setdefault(vid, []).append((g, kb, ch))
    for vid, items in by_var.items():
        var = ids[vid]
        gs = [g for g, _, _ in items]
        w.put_k += var.heads.keys(gs, [kb for _, kb, _ in items])
        w.put_v += _encode(var, [ch[1] for _, _, ch in items], [ch[2] for _, _, ch in items], gs)


def _timers(st: BatchState, w: _Writes) -> None:
    for ts, g in st.fired:
        w.dels += layout.timer_keys(g, ts)
    fired = set(st.fired)
    for g, cell in st.timers.items():
        for ts in cell.stored - cell.now:
            if (ts, g) not in fired:
                w.dels += layout.timer_keys(g, ts)
        for ts in cell.now - cell.stored:
            for k in layout.timer_keys(g, ts):
                w.put_k.append(k)
                w.put_v.append(b"")


def _too_large(st: BatchState, w: _Writes, e: Exception) -> Exception:
    """A value larger than a frame, named by its variable and grouping key (the worker's
    refusal names the entry's index only); nothing of the batch was written."""
    m = re.search(r"entry (\d+) ", str(e))
    if m is None or "does not fit in a frame" not in str(e):
        return e
    i = int(m.group(1))
    head, g, _, _ = rhino.split_routed_key(w.put_k[i])
    names = {v.heads.head: v.name for v in st.vars.values()}
    return StateValueError(f"a value of {len(w.put_v[i])} bytes is larger than one state entry can hold (one "
                           f"frame of the protocol, 4 MiB by default); keep large state in a ListState or "
                           f"MapState, whose elements are entries of their own (grouping key {decode_key(g)!r})",
                           var=names.get(head, repr(head)))


def write_back(st: BatchState) -> tuple[int, int]:
    """Sends the batch's changes to the session; returns (entries put, entries deleted)."""
    w = _Writes()
    _values(st, w)
    _lists(st, w)
    _maps(st, w)
    if st.use_timers:
        _timers(st, w)
    s: Any = st.s
    if w.dels:
        s.delete_batch(w.dels)
    if w.put_k:
        try:
            s.put_batch(w.put_k, w.put_v)
        except InvalidArgumentError as e:
            raise _too_large(st, w, e) from e
    st.stats["entries_written"] += len(w.put_k)
    st.stats["entries_deleted"] += len(w.dels)
    return len(w.put_k), len(w.dels)
