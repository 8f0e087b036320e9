"""Which code runs which batch of an operator (issue 47; Bartnik et al. §4.3, a UDF
replaced at a checkpoint-aligned cut).

An operator's code is its processor and output schema. Its **version** is a name: the
one given (``code_version=``), or a fingerprint of the processor's classes (their
source) and its constructor's arguments, so that an edit deployed to the driver is a
new version without anyone naming it.

The state schema document at the coordinator (``state/variables.py``) keeps the
operator's code history, ``"code": [{"version", "processor", "from_batch", "at",
"request"}, ...]`` in the order the versions came into force: a version runs from its
``from_batch`` until the next entry's. Written before the batch runs, it is the record
of which code ran which batch: a batch that runs again (a host lost in it, or a driver
restarted in it) runs with the code of its first attempt, and a driver restarted with
an older version than the one in force is refused (:class:`CodeVersionError`) instead
of running old code on state the new code wrote.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from typing import Any, Optional

from rhino.errors import InvalidArgumentError

__all__ = ["CodeVersionError", "code_version_of", "processor_name", "in_force", "check_version", "record"]


class CodeVersionError(InvalidArgumentError):
    """The driver's code is not the operator's code in force, and cannot replace it."""


def processor_name(processor: Any) -> str:
    """``module:Class`` of a processor, as ``rhino swap`` names code."""
    cls = type(processor)
    return f"{cls.__module__}:{cls.__qualname__}"


def _plain(v: Any) -> str:
    """A deterministic text of one constructor argument: the value of a plain one, the
    type of anything else (an object's repr may hold its address)."""
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return type(v).__name__ + "(" + ",".join(_plain(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ",".join(f"{_plain(k)}:{_plain(x)}" for k, x in sorted(v.items(), key=lambda kv: repr(kv[0]))) + "}"
    return type(v).__qualname__


def code_version_of(processor: Any) -> str:
    """``Class@<12 hex>``: the fingerprint of the processor's own classes' source (every
    class of its MRO that is not PySpark's or Python's) and of its attributes before
    ``init`` (its constructor's arguments). The same code gives the same version in any
    process; a class whose source cannot be read counts by its name only."""
    h = hashlib.sha256()
    for cls in type(processor).__mro__:
        mod = cls.__module__ or ""
        if mod == "builtins" or mod.split(".")[0] == "pyspark":
            continue
        h.update(f"{mod}:{cls.__qualname__}\n".encode())
        try:
            h.update(inspect.getsource(cls).encode())
        except (OSError, TypeError):
            pass
    for k, v in sorted(getattr(processor, "__dict__", {}).items()):
        h.update(f"{k}={_plain(v)}\n".encode())
    return f"{type(processor).__qualname__}@{h.hexdigest()[:12]}"


def history(doc: Optional[dict]) -> list[dict]:
    return list((doc or {}).get("code") or [])


def in_force(doc: Optional[dict], batch: Optional[int] = None) -> Optional[dict]:
    """The history's entry in force at ``batch`` (the last one if None); None if none."""
    entries = [e for e in history(doc) if batch is None or int(e["from_batch"]) <= int(batch)]
    return entries[-1] if entries else None


def check_version(doc: Optional[dict], version: str, operator_id: str) -> bool:
    """Whether ``version`` is new to the operator (True: it comes into force with this
    driver's first batch, as a swap at a restart does). Raises CodeVersionError if it is an
    older version than the one in force."""
    cur = in_force(doc)
    if cur is None or cur["version"] == version:
        return cur is None
    if any(e["version"] == version for e in history(doc)):
        raise CodeVersionError(
            f"operator {operator_id}: this driver runs code version {version}, but the operator runs "
            f"{cur['version']} ({cur['processor']}) since batch {cur['from_batch']}: its state was written by "
            f"the newer code. Restart the driver with {cur['version']}'s code; to go back to {version} on "
            "purpose, swap to it from a running driver (op.swap), or start with a new code_version= name")
    return True


def record(doc: dict, version: str, processor: Any, from_batch: int, request: Optional[str] = None,
           migrate_from: Optional[dict] = None) -> dict:
    """``doc`` with ``version`` in force from ``from_batch`` (entries of a later batch, of a
    life that never committed, are dropped: a replayed batch's history is its own).
    ``migrate_from``: a swap with a per-key migration, the variables it reads (so that a
    driver restarted in that batch runs the same migration)."""
    kept = [e for e in history(doc) if int(e["from_batch"]) < int(from_batch)]
    kept.append({"version": version, "processor": processor_name(processor), "from_batch": int(from_batch),
                 "at": round(time.time(), 3), "request": request})
    if migrate_from is not None:
        kept[-1]["migrate_from"] = migrate_from
    doc["code"] = kept
    return doc
