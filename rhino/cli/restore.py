"""`rhino restore`: build a checkpoint's RocksDB directory from a replica store.

For an operator who wants a checkpoint out of a worker's store by hand: to
read it with another RocksDB reader, to hand it to a job, or to keep a copy
before a risky change. It calls `ReplicaStore.restore_files`, the same code a
new owner uses, so the result is what a failover would open: hard links by
default (O(files), no bytes copied), or an independent copy with ``--copy``.
The directory is staged and renamed into place, so TARGET either appears
whole or not at all, and an existing TARGET is never overwritten.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional, TextIO

from ..errors import InvalidArgumentError, NotFoundError
from .progress import Progress
from .verify import open_store

__all__ = ["restore_checkpoint", "format_restore"]


def restore_checkpoint(path: str, target: str, *, operator_id: str, instance: int,
                       checkpoint_id: Optional[int] = None, copy: bool = False, full_verify: bool = False,
                       progress: bool = True, stream: Optional[TextIO] = None) -> dict[str, Any]:
    """Restores one checkpoint (the newest by default) of `operator_id`/`instance` to `target`."""
    store = open_store(path)
    held = store.checkpoints(operator_id, instance)
    if not held:
        have = ", ".join(f"{op}/{i}" for op, i in sorted(store.instances())) or "none"
        raise NotFoundError(f"{path} holds no checkpoints of {operator_id}/{instance} (it holds: {have})")
    cid = held[-1] if checkpoint_id is None else checkpoint_id
    if cid not in held:
        raise NotFoundError(f"{path} holds no checkpoint {cid} of {operator_id}/{instance} "
                            f"(it holds: {', '.join(map(str, held))})")
    if not target:
        raise InvalidArgumentError("the restore target is empty: name the directory to create")
    if os.path.lexists(target):
        raise InvalidArgumentError(f"{target} already exists; refusing to overwrite it")

    stream = stream if stream is not None else sys.stderr
    # Only the stages that move bytes take long enough to need a bar: checking checksums, copying.
    slow = {"check": full_verify, "place": copy}
    bars: dict[str, Progress] = {}

    def report(stage: str, files_done: int, files_total: int, bytes_done: int, bytes_total: int) -> None:
        if not (progress and slow[stage]):
            return
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = Progress("verify" if stage == "check" else "copy", bytes_total, stream=stream)
            bar.__enter__()
        bar.advance(bytes_done - bar.done)
        if files_done == files_total:
            bar.finish()

    t0 = time.perf_counter()
    try:
        st = store.restore_files(operator_id, instance, cid, target, mode="copy" if copy else "link",
                                 verify="full" if full_verify else "size", progress=report)
    except BaseException:
        for bar in bars.values():
            bar.abandon()  # stopped (Ctrl-C, a damaged file): no bar may claim 100%
        raise
    return {
        "store": path,
        "operator_id": operator_id,
        "instance": instance,
        "checkpoint_id": cid,
        "target": target,
        "mode": "copy" if copy else "link",
        "verify": "full" if full_verify else "size",
        "files": st.files,
        "linked_files": st.linked_files,
        "copied_files": st.copied_files,
        "copied_bytes": st.copied_bytes,
        "total_bytes": st.total_bytes,
        "fell_back_to_copy": st.fell_back_to_copy,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def format_restore(r: dict[str, Any]) -> str:
    from .._sizes import format_bytes

    how = (f"{r['linked_files']} hard-linked, {r['copied_files']} copied ({format_bytes(r['copied_bytes'])})"
           + ("; links failed across file systems, so it copied" if r["fell_back_to_copy"] else ""))
    checked = "sizes and checksums" if r["verify"] == "full" else "sizes"
    return "\n".join([
        f"restored   checkpoint {r['checkpoint_id']} of {r['operator_id']}/{r['instance']} "
        f"({format_bytes(r['total_bytes'])} in {r['files']} files) in {r['seconds']:.3f} s",
        f"to         {r['target']}",
        f"files      {how}; {checked} checked first",
    ])
