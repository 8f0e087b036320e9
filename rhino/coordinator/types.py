"""The coordinator's answers as typed values (docs/protocol.md §8.2).

On the wire an answer is a JSON object; these dataclasses are what the rest of Rhino
(the engine, ``rhino.spark``, the benchmarks) works with instead of string keys. The
coordinator builds its wire answers from them (``to_wire``), and its clients parse
what they receive (``from_wire``), so the wire format is defined here, once: the JSON
of ``to_wire()`` is byte for byte what docs/protocol.md §8.2 specifies, keys in order.

``from_wire`` checks every field it reads and raises CorruptionError naming the
bad one (a malformed answer is malformed data, as a bad frame is). Keys it does not
know are ignored: a newer coordinator may answer more than this client reads.

The values are frozen: one placement is shared by an attempt's driver, its batch
watch and (pickled) its tasks, and none of them may change what the others see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import CorruptionError

__all__ = ["BatchTime", "InstancePlacement", "ShortOfCopies", "Placement", "CommitAnswer"]


@dataclass(frozen=True)
class BatchTime:
    """The batch times the coordinator keeps for an operator (``begin_batch``'s
    ``batch_time_ms``): the latest batch's, and ``recent`` ones by batch number."""

    batch: int
    time_ms: int
    recent: dict[int, int]

    @classmethod
    def from_wire(cls, doc: Any, *, where: str = "batch_time") -> "BatchTime":
        recent = _field(doc, "recent", where)
        if not isinstance(recent, dict):
            raise _bad(f"{where}.recent", "a JSON object", recent)
        # map and zip loop in C: a task's doomed-attempt watch reads the placement every 0.1 s, and
        # ``recent`` holds up to 1024 batches
        try:
            times = dict(zip(map(int, recent), recent.values()))
        except ValueError:
            times = {}
        if len(times) != len(recent) or not set(map(type, times.values())) <= {int}:
            raise _bad(f"{where}.recent", "an object of batch numbers (decimal text) to integer times", recent)
        return cls(batch=_int(doc, "batch", where), time_ms=_int(doc, "time_ms", where), recent=times)

    def to_wire(self) -> dict:
        recent = dict(zip(map(str, self.recent), self.recent.values()))
        return {"batch": self.batch, "time_ms": self.time_ms, "recent": recent}


@dataclass(frozen=True)
class InstancePlacement:
    """One instance of a placement: its primary worker and how to reach it (``address``,
    and ``unix_socket`` on its ``host``; None for a worker the coordinator does not know),
    its replica chain (worker ids, head first, and the addresses of those it knows), the
    chain's version, its last complete checkpoint and that checkpoint's bytes."""

    primary: str
    address: Optional[str]
    unix_socket: Optional[str]
    host: Optional[str]
    chain: tuple[str, ...]
    chain_addresses: tuple[str, ...]
    chain_version: int
    last_complete: Optional[int]
    bytes: int

    @classmethod
    def from_wire(cls, doc: Any, *, where: str = "instance") -> "InstancePlacement":
        return cls(primary=_str(doc, "primary", where), address=_opt_str(doc, "address", where),
                   unix_socket=_opt_str(doc, "unix_socket", where), host=_opt_str(doc, "host", where),
                   chain=_strs(doc, "chain", where), chain_addresses=_strs(doc, "chain_addresses", where),
                   chain_version=_int(doc, "chain_version", where),
                   last_complete=_opt_int(doc, "last_complete", where), bytes=_int(doc, "bytes", where))

    def to_wire(self) -> dict:
        return {"primary": self.primary, "address": self.address, "unix_socket": self.unix_socket,
                "host": self.host, "chain": list(self.chain), "chain_addresses": list(self.chain_addresses),
                "chain_version": self.chain_version, "last_complete": self.last_complete, "bytes": self.bytes}


@dataclass(frozen=True)
class ShortOfCopies:
    """An instance with fewer live copies of its state than its operator's ``min_copies``
    (coordinator/copies.py), as ``begin_batch`` answered it."""

    instance: int
    copies: int
    min_copies: int

    @classmethod
    def from_wire(cls, doc: Any, *, where: str = "short_of_copies") -> "ShortOfCopies":
        return cls(instance=_int(doc, "instance", where), copies=_int(doc, "copies", where),
                   min_copies=_int(doc, "min_copies", where))

    def to_wire(self) -> dict:
        return {"instance": self.instance, "copies": self.copies, "min_copies": self.min_copies}


@dataclass(frozen=True)
class Placement:
    """An operator's routing table and placement at one epoch: what ``placement``,
    ``create_operator`` and ``report_unreachable`` answer, and ``begin_batch`` with the
    batch's time.

    ``assignment[v]`` is the instance of vnode v; ``instances`` maps an instance number
    to its placement (numbers have gaps once a rescale retired some, and a retired number
    is never reused). ``batch_time`` is what the coordinator keeps of its batch times;
    ``batch_time_ms`` is set on ``begin_batch``'s answer only, when the caller proposed
    a time: the batch's time, fixed at its first begin (design §5); ``attempt`` on
    ``begin_batch``'s answer only: the attempt's token (docs/protocol.md §7.2)."""

    operator_id: str
    epoch: int
    num_vnodes: int
    num_key_groups: int
    seed: int
    replicas: int
    last_batch: Optional[int]
    assignment: tuple[int, ...]
    instances: dict[int, InstancePlacement]
    batch_time: Optional[BatchTime]
    batch_time_ms: Optional[int] = None
    # begin_batch's answer only: the attempt's token, which its sessions carry (the attempt
    # fence, docs/protocol.md §7.2): strictly increasing across the coordinator
    attempt: Optional[int] = None
    # begin_batch's answer only: the instances short of min_copies that the batch runs
    # with anyway (coordinator/copies.py); empty when every instance has its copies
    short_of_copies: tuple[ShortOfCopies, ...] = ()

    def instance_order(self) -> list[int]:
        """The instance numbers in partition order: partition p of a batch's shuffle, and
        its task, is instance ``instance_order()[p]``."""
        return sorted(self.instances)

    def partitioner_args(self) -> dict[str, int]:
        """The keyword arguments of the :class:`rhino.Partitioner` that routes keys to vnodes."""
        return {"num_key_groups": self.num_key_groups, "num_vnodes": self.num_vnodes, "seed": self.seed}

    def batch_time_of(self, batch: int) -> Optional[int]:
        """The time of ``batch`` (ms) as the coordinator keeps it (the latest batch's and
        ``recent`` ones'); None if it does not know it."""
        bt = self.batch_time
        if bt is None:
            return None
        return bt.time_ms if bt.batch == batch else bt.recent.get(batch)

    @classmethod
    def from_wire(cls, doc: Any, *, where: str = "placement") -> "Placement":
        raw = _field(doc, "instances", where)
        if not isinstance(raw, dict):
            raise _bad(f"{where}.instances", "a JSON object", raw)
        instances = {_key(k, f"{where}.instances"): InstancePlacement.from_wire(v, where=f"{where}.instances[{k!r}]")
                     for k, v in raw.items()}
        num_vnodes = _int(doc, "num_vnodes", where)
        assignment = _field(doc, "assignment", where)
        if not isinstance(assignment, list) or len(assignment) != num_vnodes:
            raise _bad(f"{where}.assignment", f"a list of {num_vnodes} instance numbers (num_vnodes)", assignment)
        if not set(map(type, assignment)) <= {int} or min(assignment, default=0) < 0:
            v = next(v for v, i in enumerate(assignment) if type(i) is not int or i < 0)
            _as_int(assignment[v], f"{where}.assignment[{v}]", minimum=0)
        bt = _field(doc, "batch_time", where)
        return cls(operator_id=_str(doc, "operator_id", where), epoch=_int(doc, "epoch", where),
                   num_vnodes=num_vnodes, num_key_groups=_int(doc, "num_key_groups", where),
                   seed=_int(doc, "seed", where), replicas=_int(doc, "replicas", where),
                   last_batch=_opt_int(doc, "last_batch", where), assignment=tuple(assignment), instances=instances,
                   batch_time=None if bt is None else BatchTime.from_wire(bt, where=f"{where}.batch_time"),
                   batch_time_ms=_opt_int(doc, "batch_time_ms", where, absent=True),
                   attempt=_opt_int(doc, "attempt", where, absent=True),
                   short_of_copies=_short_of_copies(doc, where))

    def to_wire(self) -> dict:
        out = {"operator_id": self.operator_id, "epoch": self.epoch, "num_vnodes": self.num_vnodes,
               "num_key_groups": self.num_key_groups, "seed": self.seed, "replicas": self.replicas,
               "last_batch": self.last_batch, "assignment": list(self.assignment),
               "instances": {str(i): p.to_wire() for i, p in self.instances.items()},
               "batch_time": None if self.batch_time is None else self.batch_time.to_wire()}
        if self.batch_time_ms is not None:
            out["batch_time_ms"] = self.batch_time_ms
        if self.attempt is not None:
            out["attempt"] = self.attempt
        if self.short_of_copies:
            out["short_of_copies"] = [s.to_wire() for s in self.short_of_copies]
        return out


def _short_of_copies(doc: Any, where: str) -> tuple[ShortOfCopies, ...]:
    raw = _field(doc, "short_of_copies", where, absent=True)
    if raw is _ABSENT:
        return ()
    if not isinstance(raw, list):
        raise _bad(f"{where}.short_of_copies", "a list", raw)
    return tuple(ShortOfCopies.from_wire(x, where=f"{where}.short_of_copies[{i}]") for i, x in enumerate(raw))


@dataclass(frozen=True)
class CommitAnswer:
    """What ``commit_batch`` answers: the operator's ``last_batch`` (the one committed);
    ``report_error`` when the batch's report was refused (the batch is committed, the
    report ignored); ``autoscale``, the autoscaler's decision on the report when
    autoscaling is on (its fields: docs/protocol.md §8.2, ``Coordinator.autoscale``)."""

    operator_id: str
    last_batch: int
    report_error: Optional[str] = None
    autoscale: Optional[dict] = None

    @classmethod
    def from_wire(cls, doc: Any, *, where: str = "commit_batch's answer") -> "CommitAnswer":
        decision = _field(doc, "autoscale", where, absent=True)
        if decision is _ABSENT:
            decision = None
        elif not isinstance(decision, dict):
            raise _bad(f"{where}.autoscale", "a JSON object", decision)
        return cls(operator_id=_str(doc, "operator_id", where), last_batch=_int(doc, "last_batch", where),
                   report_error=_opt_str(doc, "report_error", where, absent=True), autoscale=decision)

    def to_wire(self) -> dict:
        out: dict[str, Any] = {"operator_id": self.operator_id, "last_batch": self.last_batch}
        if self.report_error is not None:
            out["report_error"] = self.report_error
        if self.autoscale is not None:
            out["autoscale"] = self.autoscale
        return out


# ---- checking what the wire gave ------------------------------------------------------------------

_ABSENT = object()


def _bad(name: str, expected: str, got: Any) -> CorruptionError:
    shown = repr(got)
    if len(shown) > 200:  # a whole table: its start tells enough
        shown = shown[:200] + "..."
    return CorruptionError(f"the coordinator's answer is malformed: {name} must be {expected}, got {shown}")


def _field(doc: Any, key: str, where: str, *, absent: bool = False) -> Any:
    """``doc[key]``; with ``absent``, a key the answer may leave out (then _ABSENT)."""
    if not isinstance(doc, dict):
        raise _bad(where, "a JSON object", doc)
    if key not in doc:
        if absent:
            return _ABSENT
        raise CorruptionError(f"the coordinator's answer is malformed: {where} has no {key!r}")
    return doc[key]


def _as_int(v: Any, name: str, *, minimum: Optional[int] = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
        raise _bad(name, "an integer" if minimum is None else f"an integer >= {minimum}", v)
    return v


def _int(doc: Any, key: str, where: str) -> int:
    return _as_int(_field(doc, key, where), f"{where}.{key}")


def _opt_int(doc: Any, key: str, where: str, *, absent: bool = False) -> Optional[int]:
    v = _field(doc, key, where, absent=absent)
    if v is None or v is _ABSENT:
        return None
    return _as_int(v, f"{where}.{key}")


def _str(doc: Any, key: str, where: str) -> str:
    v = _field(doc, key, where)
    if not isinstance(v, str):
        raise _bad(f"{where}.{key}", "a string", v)
    return v


def _opt_str(doc: Any, key: str, where: str, *, absent: bool = False) -> Optional[str]:
    v = _field(doc, key, where, absent=absent)
    if v is None or v is _ABSENT:
        return None
    if not isinstance(v, str):
        raise _bad(f"{where}.{key}", "a string or null", v)
    return v


def _strs(doc: Any, key: str, where: str) -> tuple[str, ...]:
    v = _field(doc, key, where)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(f"{where}.{key}", "a list of strings", v)
    return tuple(v)


def _key(k: str, where: str) -> int:
    """An instance number as a JSON object's key: its decimal text."""
    if not (k.isascii() and k.isdigit() and str(int(k)) == k):
        raise _bad(f"{where}'s keys", "instance numbers (decimal text)", k)
    return int(k)
