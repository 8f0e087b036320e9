"""A checkpoint reader: a committed checkpoint of an instance, read from one worker's own store."""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

from .. import _core
from .session import Session

__all__ = ["CheckpointReader"]


class CheckpointReader:
    """Reads committed checkpoint :attr:`checkpoint` of one instance, as one
    worker's replica store holds it (``Client.read_checkpoint``).

    The worker restores the checkpoint by hard links into a directory of its
    own and serves reads from it, with no query running and without touching
    the instance's live state or its session; it removes that directory when
    the reader ends (:meth:`close`, the end of a ``with`` block, a lost
    connection, the worker's idle timeout). Reads take the same keys as
    :class:`rhino.client.Session`'s. One thread at a time.
    """

    def __init__(self, handle: "_core.ClientSession", *, operator_id: str, instance: int, checkpoint: int,
                 vnodes: list[int]) -> None:
        self._h = handle
        # Its reads are a session's reads (the same requests, paged the same way).
        self._reads = Session(handle, operator_id=operator_id, instance=instance, batch=0, epoch=0,
                              version=None, rolled_back=False)
        self.operator_id = operator_id
        self.instance = instance
        #: The checkpoint read (the newest of the worker's store if none was named).
        self.checkpoint = checkpoint
        #: The vnodes (column families) the checkpoint holds, ascending.
        self.vnodes = sorted(vnodes)

    def get_batch(self, keys: Any) -> list[Optional[bytes]]:
        """The values of many keys in the checkpoint (None where absent)."""
        return self._reads.get_batch(keys)

    def get_batch_array(self, keys: Any, width: int) -> tuple[Any, Any]:
        """Fixed-width values: (uint8 array of shape (n, width), bool found mask)."""
        return self._reads.get_batch_array(keys, width)

    def get_batch_arrow(self, keys: Any, *, large: Optional[bool] = None) -> Any:
        """The values as a pyarrow binary array (null where absent), as ``Session.get_batch_arrow``."""
        return self._reads.get_batch_arrow(keys, large=large)

    def scan(self, *, vnode: Optional[int] = None, prefix: bytes = b"", page_size: int = 4096
             ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs of the checkpoint whose key starts with ``prefix``,
        of one vnode or of all (vnode by vnode, keys in order within each),
        fetched ``page_size`` at a time, as :meth:`rhino.client.Session.scan`."""
        return self._reads.scan(vnode=vnode, prefix=prefix, page_size=page_size)

    def scan_many(self, items: Sequence[tuple[Optional[int], bytes]], max_items: int
                  ) -> list[tuple[list[tuple[bytes, bytes]], bool]]:
        """One page of each ``(vnode, prefix)`` scan of the checkpoint, all in one
        round trip, as :meth:`rhino.client.Session.scan_many`."""
        return self._reads.scan_many(items, max_items)

    def close(self) -> None:
        """Ends the reader: the worker closes the checkpoint and removes its directory."""
        self._h.abort("the checkpoint reader was closed")

    @property
    def open(self) -> bool:
        return self._h.open

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._h.open else "closed"
        return f"<rhino.CheckpointReader {self.operator_id}/{self.instance} checkpoint {self.checkpoint} {state}>"
