"""How many live copies each instance's state has, against its operator's ``min_copies``
(issue 46, item 5; Kafka's ``min.insync.replicas`` is the counterpart).

A copy is a live worker that holds the instance's last complete checkpoint: its primary
(whose own store takes every checkpoint) and each member of its chain (a member added by
a repair gets a bulk copy before the repair is committed: replication_manager.py). With
``replicas = r`` a healthy instance has r + 1 copies; a worker lost with no spare to
repair onto leaves chains short.

Before each batch the coordinator counts them (``Coordinator.begin_batch``). An instance
short of ``min_copies`` has its chain repaired first, if a live worker can take a copy.
If it stays short:

- by default the batch runs with fewer copies, and ``begin_batch``'s answer, the
  driver's batch report and the coordinator's log and events say which instances, and
  how many copies each has;
- with ``strict``, the batch waits for a repair (a worker that registers), at most
  ``wait_s``, then is refused with ``ResourceExhaustedError``: it never commits with
  fewer copies than asked for.

The default ``min_copies = 1`` (the primary alone) changes nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from ..errors import InvalidArgumentError, ResourceExhaustedError
from .metadata import InstanceRow, Metadata
from .types import ShortOfCopies

__all__ = ["CopiesGuard", "CopiesPolicy", "load_policy", "save_policy", "short_of_copies"]

_KEY = "min_copies:"  # + operator id, in the metadata's key-value table


@dataclass(frozen=True)
class CopiesPolicy:
    min_copies: int = 1
    strict: bool = False
    wait_s: float = 30.0

    def checked(self, replicas: int, operator_id: str) -> "CopiesPolicy":
        """Itself, if an operator with ``replicas`` can ever meet it; else InvalidArgumentError."""
        if type(self.min_copies) is not int or self.min_copies < 1:
            raise InvalidArgumentError(f"min_copies must be an integer >= 1, got {self.min_copies!r}")
        if self.min_copies > replicas + 1:
            raise InvalidArgumentError(f"min_copies={self.min_copies} cannot be met by operator {operator_id}: "
                                       f"with replicas={replicas} each instance has at most {replicas + 1} copies")
        if type(self.strict) is not bool:
            raise InvalidArgumentError(f"min_copies_strict must be true or false, got {self.strict!r}")
        if not isinstance(self.wait_s, (int, float)) or isinstance(self.wait_s, bool) or not 0 <= self.wait_s <= 3600:
            raise InvalidArgumentError(f"min_copies_wait_s must be between 0 and 3600 seconds, got {self.wait_s!r}")
        return self


def load_policy(meta: Metadata, operator_id: str) -> CopiesPolicy:
    got = meta.get_meta(_KEY + operator_id)
    if not got:
        return CopiesPolicy()
    doc = json.loads(got)
    return CopiesPolicy(min_copies=int(doc["min_copies"]), strict=bool(doc["strict"]), wait_s=float(doc["wait_s"]))


def save_policy(meta: Metadata, c: Any, operator_id: str, policy: CopiesPolicy) -> None:
    meta.set_meta(c, _KEY + operator_id, json.dumps({"min_copies": policy.min_copies, "strict": policy.strict,
                                                     "wait_s": policy.wait_s}))


def merged(old: CopiesPolicy, min_copies: Optional[int], strict: Optional[bool],
           wait_s: Optional[float]) -> CopiesPolicy:
    """``old`` with each setting given (not None) replaced."""
    return CopiesPolicy(min_copies=old.min_copies if min_copies is None else min_copies,
                        strict=old.strict if strict is None else strict,
                        wait_s=old.wait_s if wait_s is None else wait_s)


def short_of_copies(rows: Iterable[InstanceRow], alive: set[str], min_copies: int) -> list[ShortOfCopies]:
    """The active instances with fewer than ``min_copies`` live copies, by instance number."""
    out = []
    for r in sorted(rows, key=lambda r: r.instance):
        if r.state != "active":
            continue
        copies = sum(1 for w in {r.primary_worker, *r.chain} if w in alive)
        if copies < min_copies:
            out.append(ShortOfCopies(instance=r.instance, copies=copies, min_copies=min_copies))
    return out


class CopiesGuard:
    """``begin_batch``'s check of an operator's copies: a chain repair first, then the batch
    runs short (the default) or waits for a repair (strict).

    ``repair()`` repairs every short chain it can (the Replication Manager's
    ``repair_all``: a failure stays pending, logged there); ``lock`` is the coordinator's."""

    def __init__(self, meta: Metadata, alive: Callable[[], set[str]], repair: Callable[[], Any], lock: Any,
                 log: Callable[..., None]) -> None:
        self.meta = meta
        self._alive = alive
        self._repair = repair
        self._lock = lock
        self.log = log

    def short(self, operator_id: str, policy: CopiesPolicy) -> list[ShortOfCopies]:
        """The instances short of ``policy.min_copies`` after a chain repair was tried for
        them. REQUIRES: lock."""
        if policy.min_copies <= 1:
            return []  # the primary is a copy, and a dead one was failed over already
        short = short_of_copies(self.meta.instances(operator_id), self._alive(), policy.min_copies)
        if short:
            self.log("copies_short_repairing", operator=operator_id, instances={s.instance: s.copies for s in short},
                     min_copies=policy.min_copies)
            self._repair()
            short = short_of_copies(self.meta.instances(operator_id), self._alive(), policy.min_copies)
        return short

    def wait(self, operator_id: str, batch: int, policy: CopiesPolicy) -> list[ShortOfCopies]:
        """Strict: waits for a repair that gives every instance its copies, at most
        ``policy.wait_s``, then ResourceExhaustedError. Called without the lock: a worker
        must be able to register meanwhile."""
        deadline = time.monotonic() + policy.wait_s
        self.log("batch_waits_for_copies", operator=operator_id, batch=batch, min_copies=policy.min_copies,
                 wait_s=policy.wait_s)
        while True:
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
            with self._lock:
                short = self.short(operator_id, policy)
            if not short:
                self.log("copies_restored", operator=operator_id, batch=batch)
                return []
            if time.monotonic() >= deadline:
                which = ", ".join(f"instance {s.instance} has {s.copies}" for s in short)
                self.log("batch_refused_short_of_copies", operator=operator_id, batch=batch, detail=which)
                with self._lock, self.meta.tx() as c:
                    self.meta.event(c, "batch_refused_short_of_copies", operator=operator_id, batch=batch,
                                    instances=[s.to_wire() for s in short])
                raise ResourceExhaustedError(
                    f"batch {batch} of operator {operator_id} needs {policy.min_copies} live copies of every "
                    f"instance (min_copies, strict): {which}, and no chain repair gave them within "
                    f"{policy.wait_s:g} s; add a worker, or lower min_copies")
