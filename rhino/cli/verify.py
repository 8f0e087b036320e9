"""`rhino verify`: re-check the committed checkpoints of a replica store.

What an operator runs on a worker's store after a crash, a disk error or a
copy by hand, before trusting it with a restore. It reads the store the way a
restore does (`ReplicaStore.verify`): every file of every committed checkpoint
must be in the pool with its manifest's size and, unless ``--quick``, its
XXH3-128 checksum. A pooled file shared by several checkpoints is read once.

The store is opened only when it looks like one (pool/ and checkpoints/), so a
mistyped path is an error instead of a new, empty store that "verifies".
Exit status: 0 when every checkpoint is intact, 1 when a problem was found,
2 for a bad path or selection.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional, TextIO

from .._sizes import format_bytes
from ..errors import InvalidArgumentError, NotFoundError
from .progress import Progress

__all__ = ["open_store", "verify_store", "format_verify", "bytes_to_read"]


def open_store(path: str):
    from .. import ReplicaStore

    if not os.path.exists(path):
        raise NotFoundError(f"{path}: no such file or directory")
    if not (os.path.isdir(os.path.join(path, "pool")) and os.path.isdir(os.path.join(path, "checkpoints"))):
        raise InvalidArgumentError(f"{path} is not a replica store (it has no pool/ and checkpoints/)")
    return ReplicaStore(path)


def bytes_to_read(store, selection: list[tuple[str, int]]) -> int:
    """What a full verify of `selection` reads: each pooled identity once, at its manifest size."""
    sizes: dict[str, int] = {}
    for op, inst in selection:
        for cid in store.checkpoints(op, inst):
            try:
                m = store.manifest(op, inst, cid)
            except Exception:  # noqa: BLE001 - a damaged manifest is verify's to report, not ours
                continue
            for f in m.files:
                sizes[f.identity] = f.size
    return sum(sizes.values())


def verify_store(path: str, *, operator_id: Optional[str] = None, instance: Optional[int] = None,
                 full: bool = True, progress: bool = True, stream: Optional[TextIO] = None) -> dict[str, Any]:
    """Verifies the store at `path` (all instances, one operator's, or one instance) and returns a dict.

    Raises NotFoundError / InvalidArgumentError for a path that is not a store or a selection it
    does not hold. Problems found in the store are in the result (``ok`` False), not raised.
    """
    if instance is not None and operator_id is None:
        raise InvalidArgumentError("--instance needs --operator")
    store = open_store(path)
    held = sorted(store.instances())
    selection = [(op, i) for op, i in held
                 if (operator_id is None or op == operator_id) and (instance is None or i == instance)]
    if (operator_id is not None or instance is not None) and not selection:
        what = operator_id if instance is None else f"{operator_id}/{instance}"
        have = ", ".join(f"{op}/{i}" for op, i in held) or "none"
        raise NotFoundError(f"{path} holds no checkpoints of {what} (it holds: {have})")

    stream = stream if stream is not None else sys.stderr
    # The whole store is one call, so a file that several instances share (content-addressed: small
    # RocksDB files often are) is read once; a selection is one call per instance.
    calls = [("", 0, selection)] if operator_id is None else [(op, i, [(op, i)]) for op, i in selection]
    totals = [bytes_to_read(store, sel) if full else 0 for _, _, sel in calls]
    bar = Progress("verify", sum(totals), stream=stream, enabled=progress and full and sum(totals) > 0)
    checkpoints = files = read = 0
    problems: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with bar:
        for op, inst, _ in calls:
            base = read

            def report(files_checked: int, bytes_checked: int, base: int = base) -> None:
                bar.advance(base + bytes_checked - bar.done)

            r = store.verify(operator_id=op, instance=inst, full=full, progress=report)
            checkpoints += r.checkpoints
            files += r.files_checked
            read += r.bytes_checked
            problems += [{"operator_id": p.operator_id, "instance": p.instance, "checkpoint_id": p.checkpoint_id,
                          "file": p.file, "detail": p.detail} for p in r.problems]
    seconds = time.perf_counter() - t0
    return {
        "path": path,
        "level": "full" if full else "size",
        "instances": [{"operator_id": op, "instance": i} for op, i in selection],
        "checkpoints": checkpoints,
        "files_checked": files,
        "bytes_checked": read,
        "seconds": round(seconds, 3),
        "problems": problems,
        "ok": not problems,
    }


def format_verify(r: dict[str, Any]) -> str:
    what = "sizes and checksums" if r["level"] == "full" else "sizes only (--quick)"
    lines = [f"store      {r['path']}",
             f"checked    {len(r['instances'])} instance(s), {r['checkpoints']} checkpoint(s), "
             f"{r['files_checked']} file reference(s); {what}",
             f"read       {format_bytes(r['bytes_checked'])} in {r['seconds']:.2f} s"]
    if r["ok"]:
        lines.append("result     OK: every committed checkpoint is intact")
    else:
        lines.append(f"result     {len(r['problems'])} PROBLEM(S): do not restore the checkpoints listed")
        for p in r["problems"]:
            f = p["file"] or "(manifest)"
            lines.append(f"  {p['operator_id']}/{p['instance']} checkpoint {p['checkpoint_id']}: {f}: {p['detail']}")
    return "\n".join(lines)
