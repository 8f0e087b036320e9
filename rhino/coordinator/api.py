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

__all__ = ["Method", "METHODS", "LANE_METHODS", "authorize"]

# Who may call what (docs/protocol.md §2, "Roles", and §8.2): the roles of rhino/credential.py.
ADMIN = frozenset({"admin"})
WORKERS = frozenset({"admin", "worker"})  # a worker as its own id only (its credential's scope)
JOBS = frozenset({"admin", "task"})  # a task for its own namespace's operators only
EVERYONE = frozenset({"admin", "coordinator", "worker", "task"})


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
    roles: frozenset = ADMIN  # the roles that may call it (docs/protocol.md §2, "Roles")

    def parse(self, result: Any) -> Any:
        """The method's answer, as its client returns it."""
        return result if self.answer is None else self.answer.from_wire(result)


# In the order of docs/protocol.md §8.2.
METHODS: dict[str, Method] = {m.name: m for m in (
    # the workers
    Method("register", while_rebuilding=True, roles=WORKERS),
    Method("heartbeat", while_rebuilding=True, lane=True, roles=WORKERS),
    # a job's batches
    Method("create_operator", Placement, roles=JOBS),
    Method("placement", Placement, roles=JOBS),
    Method("begin_batch", Placement, roles=JOBS),
    Method("commit_batch", CommitAnswer, roles=JOBS),
    Method("report_unreachable", Placement, roles=JOBS),
    Method("state_schema", roles=JOBS),
    Method("set_state_schema", roles=JOBS),
    # reconfigurations and their view
    Method("handover"),
    Method("rescale"),
    Method("rebalance"),
    Method("cancel_plan"),
    Method("status", while_rebuilding=True, lane=True, roles=EVERYONE),
    Method("declare_dead"),
    Method("decommission"),
    Method("autoscale"),
    Method("drop_operator"),
)}

# The liveness lane (Method.lane), as the server's transport takes it.
LANE_METHODS: list[str] = [m.name for m in METHODS.values() if m.lane]


def authorize(method: str, args: Any, role: str, scope: str, peer: str = "") -> None:
    """Raises PermissionDeniedError unless a caller that proved ``role`` with ``scope``
    may call ``method`` with ``args`` (docs/protocol.md §2, "Roles"): the method's
    roles, a task only for operators of its own namespace, a worker only as its own id.
    ``peer`` names the caller in the message. An unknown method passes here, and the
    coordinator refuses it by name."""
    from ..errors import PermissionDeniedError
    from .naming import SEPARATOR

    spec = METHODS.get(method)
    if spec is None:
        return
    who = f"{role}" + (f" {scope!r}" if scope else "") + (f" ({peer})" if peer else "")
    if role not in spec.roles:
        raise PermissionDeniedError(f"the coordinator refused {method} from {who}: it is for "
                                    f"{', '.join(sorted(spec.roles))} only")
    if not isinstance(args, dict):
        return  # the coordinator refuses it as malformed
    if role == "task" and spec.roles == JOBS:  # a job's method: the operator must be its namespace's
        op = args.get("operator_id")
        ns = op.split(SEPARATOR, 1)[0] if isinstance(op, str) and SEPARATOR in op else ""
        if not isinstance(op, str) or ns != scope:
            where = f"namespace {ns!r}" if ns else "the default namespace"
            raise PermissionDeniedError(f"the coordinator refused {method} of operator {op!r} from {who}: it is in "
                                        f"{where}, and a task credential admits its own namespace only")
    if role == "worker" and spec.roles == WORKERS and args.get("worker_id") != scope:
        raise PermissionDeniedError(f"the coordinator refused {method} as worker {args.get('worker_id')!r} from "
                                    f"{who}: a worker credential registers and heartbeats as its own id only")
