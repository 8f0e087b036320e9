"""What ``rhino status`` shows: the coordinator's view of its workers and operators."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from ..errors import InvalidArgumentError
from . import state_schema
from .metadata import PlanRow
from .naming import split_operator_id

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["cluster_status"]


def cluster_status(coord: "Coordinator") -> dict:
    """The coordinator's ``status``: every worker (its heartbeat's age, a decommission's
    progress), every operator (its instances, their replica lag, its open plans and its
    autoscaling), the open plans and the latest events. Read without the coordinator's
    lock: each metadata read is consistent on its own."""
    now = time.monotonic()
    leaving = coord.workers.draining()
    workers = []
    for w in coord.meta.workers():
        age = coord.detector.age(w.id, now)
        entry = {"id": w.id, "address": w.address, "host": w.host, "rack": w.rack, "zone": w.zone,
                 "state": w.state, "heartbeat_age_s": None if age is None else round(age, 3),
                 "dead_since": w.dead_since}
        if w.id in leaving:
            entry["decommission"] = coord.decommissions.status(w.id)
        workers.append(entry)
    ops = []
    for o in coord.meta.operators():
        insts = []
        for r in coord.meta.instances(o.operator_id):
            insts.append({"instance": r.instance, "primary": r.primary_worker, "chain": r.chain,
                          "chain_version": r.chain_version, "last_complete": r.last_complete, "bytes": r.bytes,
                          "vnodes": sum(1 for x in coord.meta.assignment(o.operator_id) if x == r.instance),
                          "replica_lag": coord.rm.replica_lag(r, o.last_batch)})
        ns, name = _split_id(o.operator_id)
        ops.append({"operator_id": o.operator_id, "namespace": ns, "name": name, "epoch": o.epoch,
                    "last_batch": o.last_batch,
                    "replicas": o.replicas, "num_vnodes": o.num_vnodes, "instances": insts,
                    "plans": [_plan_status(p) for p in coord.meta.plans(o.operator_id, open_only=True)],
                    "autoscale": coord.autoscaling.status(o.operator_id), **_code(coord, o.operator_id)})
    plans = [_plan_status(p) for p in coord.meta.plans(open_only=True)]
    return {"workers": workers, "operators": ops, "plans_in_flight": plans, "events": coord.meta.events(20)}


def _code(coord: "Coordinator", operator_id: str) -> dict:
    """The operator's code as its drivers recorded it in its state schema document
    (rhino.spark's ``driver/code_version.py``): the version in force and the batch it runs
    from, the code history's length, and a swap request still waiting for a barrier."""
    doc = state_schema.load(coord.meta, operator_id)["doc"] or {}
    history = doc.get("code") or []
    waiting = doc.get("swap_request")
    return {"code": dict(history[-1], versions=len(history)) if history else None,
            "swap_request": {k: waiting.get(k) for k in ("id", "code", "at")} if isinstance(waiting, dict) else None}


def _plan_status(p: PlanRow) -> dict:
    """An open plan as ``status`` shows it: ``age_s`` since it was planned,
    ``idle_s`` since its last change (its last step, or its planning)."""
    now = time.time()
    return {"id": p.id, "operator_id": p.operator_id, "kind": p.kind, "strategy": p.strategy, "state": p.state,
            "steps": len(p.steps), "steps_done": p.steps_done, "after_batch": p.after_batch, "message": p.message,
            "created_at": p.created_at, "age_s": round(max(0.0, now - p.created_at), 3),
            "idle_s": round(max(0.0, now - p.updated_at), 3)}


def _split_id(op_id: str) -> tuple[Optional[str], str]:
    """(namespace, name) of an operator id; an id of before namespaces that does not
    parse (a name with '..') is its own name, in the default namespace."""
    try:
        return split_operator_id(op_id)
    except InvalidArgumentError:
        return None, op_id
