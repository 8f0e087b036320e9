"""A session: one client's reads and writes of one instance for one micro-batch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

from .. import _core
from ..errors import InvalidArgumentError

__all__ = ["Session", "CommitResult"]


@dataclass(frozen=True)
class CommitResult:
    """What a commit did: the version it wrote, and how long each part took.

    ``replication`` is "complete" (barrier mode: the chain holds checkpoint
    ``version``), "pending" (async mode: ask ``Client.status(..., checkpoint=)``)
    or "none" (the instance has no chain).
    """

    version: int
    replication: str
    write_s: float
    checkpoint_s: float
    replicate_s: Optional[float]
    keys: int
    bytes: int
    delta_bytes: int
    stats: dict = field(repr=False)


class Session:
    """Reads see the state at version ``batch - 1`` plus this session's own writes.

    Keys are a 1-D int64 NumPy array, a pyarrow array, or a sequence of bytes,
    str or int, as for :class:`rhino.StateBackend`; values are a sequence of
    bytes-like objects, a NumPy array of fixed-width rows, or a pyarrow binary
    array. Batches larger than one frame are streamed in several.

    Use it as a context manager: leaving the block without :meth:`commit`
    aborts the session. One thread at a time.
    """

    def __init__(self, handle: "_core.ClientSession", *, operator_id: str, instance: int, batch: int,
                 epoch: int, version: Optional[int], rolled_back: bool) -> None:
        self._h = handle
        self.operator_id = operator_id
        self.instance = instance
        self.batch = batch
        self.epoch = epoch
        #: The version this session sees (batch - 1), None for batch 0.
        self.version = version
        #: True if the worker's state was ahead and was rolled back for this session.
        self.rolled_back = rolled_back

    # ---- reads ---------------------------------------------------------------
    def get_batch(self, keys: Any) -> list[Optional[bytes]]:
        """The values of many keys (None where absent)."""
        return self._h.get_batch(keys)

    def get_batch_array(self, keys: Any, width: int) -> tuple[Any, Any]:
        """Fixed-width values: (uint8 array of shape (n, width), bool found mask)."""
        return self._h.get_batch_array(keys, width)

    def get_batch_arrow(self, keys: Any, *, large: Optional[bool] = None) -> Any:
        """The values as a pyarrow binary array (null where absent; large_binary if
        ``large``, or when the values total 2 GiB or more), as ``StateBackend.get_batch_arrow``."""
        return self._h.get_batch_arrow(keys, large=large)

    def scan(self, *, vnode: Optional[int] = None, prefix: bytes = b"", page_size: int = 4096
             ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs whose key starts with ``prefix``, of one vnode or of
        all the instance's vnodes (vnode by vnode, keys in order within each),
        fetched a page at a time: never a whole vnode in one list."""
        if isinstance(prefix, str):
            prefix = prefix.encode()
        if page_size <= 0:
            raise InvalidArgumentError("page_size must be positive")
        after_vnode: Optional[int] = None
        after_key: Optional[bytes] = None
        while True:
            keys, values, done, last_vnode = self._h._scan_page(vnode, bytes(prefix), after_vnode, after_key,
                                                                  page_size)
            yield from zip(keys, values)
            if done or not keys:
                return
            after_vnode, after_key = last_vnode, keys[-1]

    def scan_many(self, items: Sequence[tuple[Optional[int], bytes]], max_items: int
                  ) -> list[tuple[list[tuple[bytes, bytes]], bool]]:
        """The first ``max_items`` entries (0: as many as fit in one frame) of each
        ``(vnode, prefix)`` scan, all in one round trip: one scan request per item,
        sent back to back, then every answer read. Per item: its ``(key, value)``
        pairs in key order, and ``done`` (True: nothing more under that prefix in
        that vnode; a vnode of None scans every vnode of the instance)."""
        if isinstance(max_items, bool) or not isinstance(max_items, int) or not 0 <= max_items < 1 << 32:
            raise InvalidArgumentError(f"max_items must be an int in [0, 2**32), got {max_items!r}")
        reqs = []
        for vnode, prefix in items:
            if vnode is not None and (isinstance(vnode, bool) or not isinstance(vnode, int)
                                      or not 0 <= vnode < 1 << 32):
                raise InvalidArgumentError(f"a vnode must be an int in [0, 2**32) or None, got {vnode!r}")
            if isinstance(prefix, str):
                prefix = prefix.encode()
            reqs.append((vnode, bytes(prefix)))
        return self._h.scan_many(reqs, max_items)

    @property
    def round_trips(self) -> int:
        """Request/answer exchanges this session has waited for, its open included:
        each get_batch, put_batch, delete_batch, scan page, scan_many and commit
        counts one (a batch split into several frames sent back to back is still
        one), plus one per further wave a get had to send after an answer came
        (values that did not fit in one frame)."""
        return self._h.round_trips

    # ---- writes --------------------------------------------------------------
    def put_batch(self, keys: Any, values: Any) -> None:
        self._h.put_batch(keys, values)

    def delete_batch(self, keys: Any) -> None:
        self._h.delete_batch(keys)

    # ---- the end -------------------------------------------------------------
    def commit(self, mode: str = "barrier", *, batch_time_ms: Optional[int] = None) -> CommitResult:
        """Writes every update at version ``batch`` in one atomic write, takes
        checkpoint ``batch``, and replicates it down the instance's chain.
        ``barrier`` returns once the chain has committed it; ``async`` returns
        after the local checkpoint, with the replication under way.

        ``batch_time_ms`` (the batch's time, ms) becomes the instance's TTL
        clock in the same write: compactions then drop the routed keys with
        flag TTL whose expiry is at most it (docs/protocol.md §7.8). None keeps
        the clock as it is."""
        if batch_time_ms is not None and (isinstance(batch_time_ms, bool) or not isinstance(batch_time_ms, int)
                                          or not -(1 << 63) < batch_time_ms < 1 << 63):
            raise InvalidArgumentError(f"batch_time_ms must be an int64 above -2**63, got {batch_time_ms!r}")
        version, stats_json = self._h.commit(mode, batch_time_ms=batch_time_ms)
        stats = json.loads(stats_json) if stats_json else {}
        return CommitResult(version=version, replication=stats.get("replication", "none"),
                            write_s=stats.get("write_s", 0.0), checkpoint_s=stats.get("checkpoint_s", 0.0),
                            replicate_s=stats.get("replicate_s"), keys=stats.get("keys", 0),
                            bytes=stats.get("bytes", 0), delta_bytes=stats.get("delta_bytes", 0), stats=stats)

    def abort(self) -> None:
        """Drops every write of the session; the state stays at ``batch - 1``."""
        self._h.abort()

    @property
    def open(self) -> bool:
        return self._h.open

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._h.open:
            self._h.abort()

    def __repr__(self) -> str:
        state = "open" if self._h.open else "ended"
        return f"<rhino.Session {self.operator_id}/{self.instance} batch {self.batch} epoch {self.epoch} {state}>"
