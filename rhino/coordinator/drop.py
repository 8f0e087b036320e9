"""Dropping an operator: every trace of it, on every worker and in the metadata (issue 45,
``rhino drop``; docs/protocol.md §7.1 ``drop``)."""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import InvalidArgumentError, OperatorRunningError
from .batches import BatchLedger
from .gateway import WorkerGateway
from .metadata import EPOCH_FLOOR_KEY, Metadata

__all__ = ["drop_operator"]

logger = logging.getLogger("rhino.coordinator")


def drop_operator(meta: Metadata, workers: WorkerGateway, batches: BatchLedger, log: Callable[..., None],
                  operator_id: str, idle_s: float) -> dict:
    """The coordinator's ``drop_operator``, which documents it. REQUIRES: the
    coordinator's lock."""
    if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) or idle_s < 0:
        raise InvalidArgumentError(f"idle_s must be a number of seconds >= 0, not {idle_s!r}")
    op = meta.require_operator(operator_id)
    why = batches.running(operator_id, float(idle_s))
    if why is not None:
        raise OperatorRunningError(f"operator {operator_id} is running: {why}; stop its query, then drop it")
    rows = meta.instances(operator_id, active_only=False)
    instances = sorted({r.instance for r in rows})
    epoch = op.epoch + 1
    pending = meta.pending_reconfiguration(operator_id)
    # New operators start above every epoch and chain version this one used: workers may
    # still remember them.
    floor = max([epoch, (pending.epoch + 1) if pending else 0] + [r.chain_version + 1 for r in rows]
                + [st.chain_version + 1 for st in (pending.steps if pending else [])])
    out: dict[str, Any] = {"operator_id": operator_id, "instances": instances, "workers": {},
                           "not_reached": sorted(w.id for w in meta.workers() if not w.alive)}
    alive = workers.alive_workers()
    _refuse_if_a_session_is_open(meta, workers, operator_id, {w.id for w in alive})
    # Fenced everywhere first, so that no session of the old epoch opens or commits while
    # the instances go; then dropped everywhere (a worker still refuses with SessionBusyError
    # if a session opened meanwhile: the metadata stays, and the drop can be asked again).
    for w in alive:
        cl = workers.client(w)
        for i in instances:
            cl.fence(operator_id, i, epoch=epoch)
    for w in alive:
        cl = workers.client(w)
        out["workers"][w.id] = {str(i): cl.drop(operator_id, i, epoch=epoch) for i in instances}
    plans = [p.id for p in meta.plans(operator_id, open_only=True)]
    with meta.tx() as c:
        meta.delete_operator(c, operator_id)
        cur = int(meta.get_meta(EPOCH_FLOOR_KEY) or 1)
        meta.set_meta(c, EPOCH_FLOOR_KEY, str(max(cur, floor)))
    batches.forget(operator_id)
    out["plans_dropped"] = plans
    log("operator_dropped", operator=operator_id, instances=instances, workers=sorted(out["workers"]))
    logger.info("operator %s dropped: %d instances, on workers %s", operator_id, len(instances),
                ", ".join(sorted(out["workers"])) or "none")
    return out


def _refuse_if_a_session_is_open(meta: Metadata, workers: WorkerGateway, operator_id: str, alive: set) -> None:
    """A session open on a primary (a task of a batch this coordinator has not seen begin:
    one of before its restart) is a query running the operator too."""
    for r in meta.instances(operator_id):
        if r.primary_worker in alive:
            st = workers.client(r.primary_worker).status(operator_id, r.instance, wait=False)
            if st.get("session_open") or st.get("busy"):
                raise OperatorRunningError(
                    f"operator {operator_id} is running: instance {r.instance} has "
                    f"{'an open session' if st.get('session_open') else 'a commit under way'} on worker "
                    f"{r.primary_worker}; stop its query, then drop it")
