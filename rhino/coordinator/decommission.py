"""Taking a worker away without failing a batch (docs/design.md §3, ``rhino decommission``).

A worker being decommissioned is *draining*: nothing new is placed on it (the gateway's
``draining`` set, kept in the metadata), and each operator with a primary or a replica on
it moves off it at its next batch barrier. Its primaries are taken over by chain members
(hard links: at a barrier, the last complete checkpoint is the primary's state), its
chains are repaired from the primaries, then its instances there are closed. So no batch
fails. An operator with no batch in flight moves at once; ``force`` moves every operator
at once (a batch in flight then runs again, exactly once). A decommissioned worker that
registers again is placed on again.
"""

from __future__ import annotations

import json
from typing import Callable

from ..errors import InvalidArgumentError, RhinoError, UnknownInstanceError
from .batches import BatchLedger
from .gateway import DRAINING_KEY, WorkerGateway
from .metadata import Metadata
from .replication_manager import ReplicationManager

__all__ = ["Decommissioner"]


class Decommissioner:
    """Drains workers. Every method REQUIRES the coordinator's lock."""

    def __init__(self, meta: Metadata, workers: WorkerGateway, rm: Callable[[], ReplicationManager],
                 batches: BatchLedger, log: Callable[..., None]) -> None:
        self.meta = meta
        self.workers = workers
        self._rm = rm
        self.batches = batches
        self.log = log

    def start(self, worker_id: str, force: bool) -> dict:
        """The coordinator's ``decommission``: answers :meth:`status`."""
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidArgumentError("decommission needs a worker id")
        w = self.meta.worker(worker_id)
        if w is None:
            raise UnknownInstanceError(f"no worker {worker_id!r} is registered here")
        if not w.alive:
            raise InvalidArgumentError(f"worker {worker_id} is dead (since {w.dead_since}): its instances "
                                       "have failed over already; nothing to drain")
        leaving = self.workers.draining()
        if worker_id not in leaving:
            if not self.workers.workers_info() or {x.id for x in self.workers.workers_info()} == {worker_id}:
                raise InvalidArgumentError(f"worker {worker_id} is the only one left to place state on")
            self._set_draining(leaving | {worker_id})
            with self.meta.tx() as c:
                self.meta.event(c, "decommission_started", worker=worker_id, force=bool(force))
            self.log("decommission_started", worker=worker_id, force=bool(force))
        for op in self.meta.operators():
            if self.batches.in_flight(op.operator_id) and not force:
                continue  # at its next barrier
            self.drain(op.operator_id, "decommission" + (" (forced)" if force else " (no batch in flight)"))
        return self.status(worker_id)

    def ended(self, worker_id: str) -> None:
        """The worker registered again: it may be placed on again."""
        if worker_id in self.workers.draining():
            self._set_draining(self.workers.draining() - {worker_id})
            self.log("decommission_ended", worker=worker_id, reason="the worker registered again")

    def status(self, worker_id: str) -> dict:
        """What still holds the worker: ``drained`` once nothing does."""
        holding = self._holding(worker_id)
        return {"worker": worker_id, "draining": worker_id in self.workers.draining(), "drained": not holding,
                "operators": holding,
                "waiting_for_barrier": sorted(op for op in holding if self.batches.in_flight(op))}

    def _holding(self, worker_id: str) -> list[str]:
        """The operators with a primary or a replica on the worker."""
        return sorted({r.operator_id for op in self.meta.operators() for r in self.meta.instances(op.operator_id)
                       if r.primary_worker == worker_id or worker_id in r.chain})

    def _set_draining(self, ids: set[str]) -> None:
        with self.meta.tx() as c:
            self.meta.set_meta(c, DRAINING_KEY, json.dumps(sorted(ids)))

    def drain(self, operator_id: str, reason: str) -> None:
        """Moves an operator off the workers being decommissioned (at a barrier of the
        operator's, or with no batch of it in flight)."""
        leaving = self.workers.draining()
        if not leaving:
            return
        rows = self.meta.instances(operator_id)
        touching = {w for r in rows for w in [r.primary_worker, *r.chain] if w in leaving}
        if not touching:
            return
        alive = self.workers.alive_ids()
        rm = self._rm()
        try:
            rm.reconfigure_operator(operator_id, f"{reason}: {', '.join(sorted(touching))}",
                                    leaving=frozenset(touching))
        except RhinoError as e:
            # left pending (with what was leaving): retried by the detector, or at the next barrier
            rm.failed(operator_id, reason, e)
            return
        for wid in sorted(touching & alive):
            w = self.meta.worker(wid)
            if w is not None:
                # its instances of this operator are owned elsewhere now: fenced and closed
                rm.reconcile_worker(w)
            if not self._holding(wid):
                with self.meta.tx() as c:
                    self.meta.event(c, "decommission_drained", worker=wid)
                self.log("decommission_drained", worker=wid)
