"""The coordinator's methods, declared once (docs/protocol.md §8.2).

Each method of the coordinator protocol is named here, with the type its answer is
parsed into (:mod:`.types`; a JSON object as is where none is given). The coordinator
serves exactly these, each its public method of the same name called with the
request's arguments as keywords (:meth:`.Coordinator.handle`); the clients' methods
(:mod:`.client`) parse their answers by this table. ``tests/test_coordinator_api.py``
holds the coordinator, the clients and the method list of docs/protocol.md §8.2 to it,
so none of them can gain or lose a method alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .types import CommitAnswer, Placement

__all__ = ["Method", "METHODS", "LANE_METHODS"]


@dataclass(frozen=True)
class Method:
    """One method: its ``name`` on the wire, the class its answer is parsed into
    (``answer.from_wire``; None: the JSON object as is), whether a coordinator
    rebuilding its metadata from the workers (``--rebuild``) serves it meanwhile, and
    whether it is in the liveness ``lane``: handled by threads of its own, never queued
    behind calls that hold the coordinator's lock or call workers (docs/protocol.md §8.1).
    A lane method must not take the coordinator's lock."""

    name: str
    answer: Optional[type] = None
    while_rebuilding: bool = False
    lane: bool = False

    def parse(self, result: Any) -> Any:
        """The method's answer, as its client returns it."""
        return result if self.answer is None else self.answer.from_wire(result)


# In the order of docs/protocol.md §8.2.
METHODS: dict[str, Method] = {m.name: m for m in (
    # the workers
    Method("register", while_rebuilding=True),
    Method("heartbeat", while_rebuilding=True, lane=True),
    # a job's batches
    Method("create_operator", Placement),
    Method("placement", Placement),
    Method("begin_batch", Placement),
    Method("commit_batch", CommitAnswer),
    Method("report_unreachable", Placement),
    Method("state_schema"),
    Method("set_state_schema"),
    # reconfigurations and their view
    Method("handover"),
    Method("rescale"),
    Method("rebalance"),
    Method("cancel_plan"),
    Method("status", while_rebuilding=True, lane=True),
    Method("declare_dead"),
    Method("decommission"),
    Method("autoscale"),
    Method("drop_operator"),
)}

# The liveness lane (Method.lane), as the server's transport takes it.
LANE_METHODS: list[str] = [m.name for m in METHODS.values() if m.lane]
