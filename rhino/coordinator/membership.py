"""Workers joining and dying, as the coordinator decides them (docs/design.md §3): a
registration, and a worker declared dead (by the failure detector of liveness.py, or at
once when a task reports it unreachable and it does not answer the coordinator either)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Optional

from ..errors import InvalidArgumentError, RhinoError
from .metadata import WorkerRow

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["register", "declare_dead"]

# a failover's phases, per operator, in its failover_done event (seconds)
_FAILOVER_PHASES = ("decide_s", "plan_tx_s", "fence_s", "copy_s", "commit_tx_s", "asked")


def register(coord: "Coordinator", worker_id: str, address: str, *, unix_socket: Optional[str],
             rack: Optional[str], zone: Optional[str], incarnation: str) -> dict:
    """The coordinator's ``register``, which documents it."""
    if not worker_id or not address or ":" not in address:
        raise InvalidArgumentError("register needs a worker id and its 'host:port'")
    incarnation = incarnation or uuid.uuid4().hex
    with coord.lock:
        old = coord.meta.worker(worker_id)
        row = WorkerRow(id=worker_id, address=address, unix_socket=unix_socket,
                        host=address.rsplit(":", 1)[0], rack=rack, zone=zone, state="alive",
                        incarnation=incarnation, registered_at=time.time(), dead_since=None)
        with coord.meta.tx() as c:
            coord.meta.upsert_worker(c, row)
            coord.meta.event(c, "worker_registered", worker=worker_id, address=address,
                             rejoined=bool(old and not old.alive), restarted=bool(old and old.incarnation != incarnation))
        coord.detector.heard(worker_id)
        coord.workers.drop_client(worker_id)
        coord.log("worker_registered", worker=worker_id, address=address)
        coord.decommissions.ended(worker_id)  # back after (or during) its decommission
        if not coord.rebuilding:
            try:
                coord.rm.reconcile_worker(row)
                coord.rm.repair_all()
                if old is None or not old.alive:
                    # A worker joined (or came back): replicas move onto it
                    # while that evens out the replica load (design §3), each
                    # operator at its next batch barrier (at once if it has no
                    # batch in flight), so that no running batch is cut short.
                    for op in coord.meta.operators():
                        if coord.batches.in_flight(op.operator_id):
                            coord.batches.rebalance_at_barrier.add(op.operator_id)
                        else:
                            coord.rm.rebalance_replicas(op.operator_id)
            except RhinoError as e:  # the worker may die again meanwhile; the detector handles that
                coord.log("reconcile_failed", worker=worker_id, error=str(e))
        # It could not heartbeat while this call ran (a repair may copy GBs).
        coord.detector.heard(worker_id)
    return {"worker_id": worker_id, "incarnation": incarnation, "heartbeat_timeout": coord.heartbeat_timeout}


def declare_dead(coord: "Coordinator", worker_id: str, reason: str) -> dict:
    """The coordinator's ``declare_dead``, which documents it."""
    with coord.lock:
        w = coord.meta.worker(worker_id)
        if w is None or not w.alive:
            coord.detector.forget(worker_id)
            return {"worker": worker_id, "already_dead": True}
        t0 = time.monotonic()
        with coord.meta.tx() as c:
            coord.meta.mark_worker_dead(c, worker_id)
            coord.meta.event(c, "worker_dead", worker=worker_id, reason=reason)
        dead_tx_s = time.monotonic() - t0
        coord.detector.forget(worker_id)
        coord.workers.drop_client(worker_id)
        coord.log("worker_dead", worker=worker_id, reason=reason)
        out = coord.rm.recover_from_loss(worker_id)
        out["recovery_s"] = time.monotonic() - t0
        # per operator, where the time went (replication_manager.reconfigure_operator)
        phases = {op: {k: rep[k] for k in _FAILOVER_PHASES if k in rep} for op, rep in out["operators"].items()}
        with coord.meta.tx() as c:
            coord.meta.event(c, "failover_done", worker=worker_id, recovery_s=round(out["recovery_s"], 4),
                            dead_tx_s=round(dead_tx_s, 4), phases=phases,
                            operators=sorted(out["operators"]), errors=out.get("errors", {}))
        return out
