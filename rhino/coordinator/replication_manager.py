"""The Replication Manager (Rhino paper §3.3, §4.2 phase 1; docs/design.md §3).

It decides where each instance's primary and replica chain live, and carries
those decisions out on the workers:

- initial placement of an operator (primaries spread, chains by bin packing
  or by a minimum-cost assignment: :mod:`.placement`);
- **loss of a worker**: every operator touching it moves to a new epoch. Its
  primaries fail over to a chain member that holds the last complete
  checkpoint (a takeover by hard links: no state moves), and every chain it
  was in is repaired: the replacement gets a bulk copy from a surviving
  holder, never from the dead worker, and the chain version goes up;
- a worker that joins: replicas are rebalanced onto it.

Crash safety: a reconfiguration is first written to the metadata as
*pending* (the new rows and epoch), then carried out with idempotent worker
requests, then committed. A coordinator killed in between finds it pending
at its restart and carries it out again: the same decision, never a second one.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Optional

from .. import _core
from ..errors import InvalidArgumentError, RhinoError
from .gateway import WorkerGateway
from .metadata import EPOCH_FLOOR_KEY, InstanceRow, Metadata, OperatorRow, WorkerRow
from .naming import check_operator_id

# The workers' cap on an instance's vnodes (kMaxNumVnodes in rhino/state_backend.h).
MAX_NUM_VNODES: int = _core.MAX_NUM_VNODES
from .placement import InstanceInfo, place_chains, rebalance_chains, repair_chains
from .reconfiguration import Reconfiguration, ReconfigStep

__all__ = ["ReplicationManager"]


class ReplicationManager:
    """Placement and chain repair over ``meta``, carried out on the workers
    through ``workers``; every decision is logged to ``log``. The caller holds
    the coordinator's lock around each call."""

    def __init__(self, meta: Metadata, workers: WorkerGateway, log: Callable[..., None]) -> None:
        self._asked: list[dict] = []  # the last decision's questions to chain members (their figures)
        self.meta = meta
        self.workers = workers
        self.log = log

    # ---- status ----------------------------------------------------------------------
    def replica_lag(self, r: InstanceRow, last_batch: Optional[int]) -> Optional[dict]:
        """Batches each chain member is behind the last complete batch (from the
        member's own store); None where the member does not answer."""
        out: dict[str, Any] = {}
        for wid in r.chain:
            w = self.meta.worker(wid)
            if w is None or not w.alive:
                out[wid] = None
                continue
            try:
                ids = self.workers.client(w).status(r.operator_id, r.instance)["checkpoints"]
                newest = ids[-1] if ids else None
                out[wid] = None if last_batch is None or newest is None else max(0, last_batch - newest)
            except RhinoError:
                out[wid] = None
        return out

    # ---- an operator is born -----------------------------------------------------------
    def create_operator(self, operator_id: str, *, parallelism: int, num_vnodes: int, replicas: int,
                        num_key_groups: int, seed: int, placement: str) -> None:
        """Places a new operator (docs/design.md §3 Phase 1) and opens every
        instance on its primary.

        An existing operator is left as it is. ``parallelism`` is only the initial
        one: a different count (the operator was rescaled since, by a person or the
        autoscaler) is adopted from the coordinator, with an ``operator_adopted``
        event (issue 45). What cannot change (num_vnodes, num_key_groups, seed,
        replicas) must match: InvalidArgumentError names each field that differs.

        ``num_vnodes`` must be in [1, MAX_NUM_VNODES] (65536, the workers' cap on an
        instance's column families, issue 46): refused before anything is placed."""
        if isinstance(num_vnodes, bool) or not isinstance(num_vnodes, int) or not 1 <= num_vnodes <= MAX_NUM_VNODES:
            raise InvalidArgumentError(f"num_vnodes must be in [1, {MAX_NUM_VNODES}] (the most vnodes a worker "
                                       f"gives an instance), got {num_vnodes!r}")
        if not isinstance(parallelism, int) or parallelism < 1 or parallelism > num_vnodes:
            raise InvalidArgumentError(f"parallelism must be in [1, num_vnodes={num_vnodes}], got {parallelism!r}")
        if not isinstance(replicas, int) or replicas < 0:
            raise InvalidArgumentError(f"replicas must be >= 0, got {replicas!r}")
        if placement not in ("balanced", "cost"):
            raise InvalidArgumentError(f"placement must be 'balanced' or 'cost', got {placement!r}")
        _core.Partitioner(num_key_groups=num_key_groups, num_vnodes=num_vnodes, seed=seed)  # validates K and V
        existing = self.meta.operator(operator_id)
        if existing is not None:
            self._adopt(existing, parallelism=parallelism, num_vnodes=num_vnodes, num_key_groups=num_key_groups,
                        seed=seed, replicas=replicas)
            return
        check_operator_id(operator_id)  # a plain directory name on every worker (naming.py)
        workers = self.workers.workers_info()
        if len(workers) < replicas + 1:
            raise InvalidArgumentError(f"{len(workers)} live workers cannot give {replicas} replicas "
                                       f"and a primary to each instance (need {replicas + 1})")
        # 1 unless operators were dropped: then above every epoch and chain version a dropped
        # operator used, which workers may still remember in memory (Coordinator.drop_operator)
        epoch = int(self.meta.get_meta(EPOCH_FLOOR_KEY) or 1)
        table = _core.RoutingTable.from_ring(num_vnodes, parallelism, epoch=epoch, seed=seed)
        assignment = [int(x) for x in table.assignment]
        ids = sorted(w.id for w in workers)
        primaries = {i: ids[i % len(ids)] for i in range(parallelism)}
        infos = [InstanceInfo(key=(operator_id, i), primary=primaries[i]) for i in range(parallelism)]
        chains = place_chains(infos, workers, replicas, mode=placement)
        rows = [InstanceRow(operator_id=operator_id, instance=i, primary_worker=primaries[i],
                            chain=chains[(operator_id, i)], chain_version=epoch, state="active", last_complete=None,
                            bytes=0, redo_version=None, redo=[]) for i in range(parallelism)]
        op = OperatorRow(operator_id=operator_id, num_vnodes=num_vnodes, num_key_groups=num_key_groups, seed=seed,
                         replicas=replicas, placement=placement, epoch=epoch, last_batch=None, created_at=time.time())
        for r in rows:
            vn = [v for v, i in enumerate(assignment) if i == r.instance]
            self.workers.client(r.primary_worker).open_instance(
                operator_id, r.instance, epoch=epoch, vnodes=vn, chain=self.workers.addresses(r.chain),
                chain_version=r.chain_version, **op.partitioner_args())
        with self.meta.tx() as c:
            self.meta.put_operator(c, op)
            self.meta.set_assignment(c, operator_id, assignment)
            for r in rows:
                self.meta.put_instance(c, r)
            self.meta.record_epoch(c, operator_id, epoch, "created")
            self.meta.event(c, "operator_created", operator=operator_id, parallelism=parallelism, replicas=replicas)
        self.log("operator_created", operator=operator_id, parallelism=parallelism, replicas=replicas)

    def _adopt(self, existing: OperatorRow, *, parallelism: int, **fixed: int) -> None:
        """A create_operator of an existing operator: refused if a field that cannot
        change differs (each named, with the operator's value, the call's and the fix);
        else a different parallelism is adopted from the coordinator and recorded."""
        diff = [(k, getattr(existing, k), v) for k, v in fixed.items() if getattr(existing, k) != v]
        if diff:
            what = ", ".join(f"{k}={have} (this call: {k}={asked})" for k, have, asked in diff)
            fix = ", ".join(f"{k}={have}" for k, have, _ in diff)
            raise InvalidArgumentError(f"operator {existing.operator_id} exists with {what}, which cannot change; "
                                       f"pass {fix}, or drop the operator and start over")
        current = len(self.meta.instances(existing.operator_id))
        if current != parallelism:
            with self.meta.tx() as c:
                self.meta.event(c, "operator_adopted", operator=existing.operator_id, asked_parallelism=parallelism,
                                parallelism=current)
            self.log("operator_adopted", operator=existing.operator_id, asked_parallelism=parallelism,
                     parallelism=current)

    # ---- loss of a worker ----------------------------------------------------------------
    def recover_from_loss(self, dead_worker: str) -> dict:
        """Moves every operator touching ``dead_worker`` to a new epoch (failover
        and chain repair). Returns ``{"worker", "operators": {op: report},
        "errors": {op: message}}``.

        One operator's failure does not stop the others: it is logged, recorded
        under ``errors`` (and as a ``reconfigure_failed`` event), and its
        reconfiguration stays pending, to be decided again and carried out by
        the next :meth:`repair_all` (a worker registers) or :meth:`resume` (the
        coordinator restarts). Nothing is raised for it: the worker is already
        declared dead, and the callers (the failure detector, a task's
        ``report_unreachable``) need the other operators failed over."""
        out: dict[str, Any] = {"worker": dead_worker, "operators": {}, "errors": {}}
        for op in self.meta.operators():
            rows = self.meta.instances(op.operator_id)
            if any(r.primary_worker == dead_worker or dead_worker in r.chain for r in rows):
                try:
                    out["operators"][op.operator_id] = self.reconfigure_operator(op.operator_id,
                                                                                 f"{dead_worker} lost")
                except RhinoError as e:
                    out["errors"][op.operator_id] = self.failed(op.operator_id, f"{dead_worker} lost", e)
        return out

    def repair_all(self) -> dict:
        """Fills chains that are short (a degraded replica group) now that
        workers are available, and moves off dead workers; pending
        reconfigurations (a repair that failed) are decided again here. Returns
        ``{op: message}`` of the operators whose repair failed: each is logged,
        stays pending and is tried again next time; the others go on."""
        alive = self.workers.alive_ids()
        errors: dict[str, str] = {}
        for op in self.meta.operators():
            rows = self.meta.instances(op.operator_id)
            pending = self.meta.pending_reconfiguration(op.operator_id)
            if pending is not None or any(
                    r.primary_worker not in alive or len(r.chain) < op.replicas or any(m not in alive for m in r.chain)
                    for r in rows):
                try:
                    self.reconfigure_operator(op.operator_id, "chain repair", leaving=self._leaving(pending))
                except RhinoError as e:
                    errors[op.operator_id] = self.failed(op.operator_id, "chain repair", e)
        return errors

    def retry_pending(self, operator_id: str, doc: Reconfiguration) -> None:
        """Decides again, under a newer epoch, the reconfiguration ``doc`` left pending for
        the operator (the failure detector's retry: liveness.py). Only the pending one: a
        chain merely short (too few workers) is not touched, which would move its operator
        to a new epoch every time. A failure stays pending, logged."""
        reason = doc.reason
        if not reason.endswith(" (retried)"):
            reason += " (retried)"
        try:
            self.reconfigure_operator(operator_id, reason, leaving=self._leaving(doc))
        except RhinoError as e:
            self.failed(operator_id, "retry of a pending reconfiguration", e)

    def _leaving(self, pending: Optional[Reconfiguration]) -> frozenset[str]:
        """The workers a pending reconfiguration was moving off (a decommission) that are
        still leaving: its retry goes on moving off them."""
        if not pending or not pending.leaving:
            return frozenset()
        draining = getattr(self.workers, "draining", None)
        return frozenset(pending.leaving) & frozenset(draining() if draining else ())

    def failed(self, operator_id: str, reason: str, e: RhinoError) -> str:
        """Logs (and records as an event) a reconfiguration that failed; it stays pending."""
        message = f"{type(e).__name__}: {e}"
        self.log("reconfigure_failed", operator=operator_id, reason=reason, error=message)
        try:
            with self.meta.tx() as c:
                self.meta.event(c, "reconfigure_failed", operator=operator_id, reason=reason, error=message)
        except Exception as e2:  # the metadata's own trouble must not hide the first error
            self.log("event_not_recorded", operator=operator_id, error=f"{type(e2).__name__}: {e2}")
        return message

    def reconfigure_operator(self, operator_id: str, reason: str, *, leaving: frozenset[str] = frozenset()) -> dict:
        """Moves an operator to a new epoch with every instance on live workers:
        fail over dead primaries, repair chains, re-open the rest (fencing).

        ``leaving``: live workers being decommissioned, moved off as if they were
        lost, at a batch barrier (the caller's): their primaries are taken over by
        a chain member, which holds the last complete checkpoint (the primary's
        live state at a barrier), and the chains they are in are repaired from
        the primaries. Their instances are closed afterwards (``drain``)."""
        t0 = time.monotonic()
        self._asked: list[dict] = []
        op = self.meta.require_operator(operator_id)
        alive = self.workers.alive_ids() - set(leaving)
        workers = self.workers.workers_info()
        rows = self.meta.instances(operator_id)
        pending = self.meta.pending_reconfiguration(operator_id)
        epoch = max(op.epoch, pending.epoch if pending else 0) + 1
        plan: list[ReconfigStep] = []
        infos: list[InstanceInfo] = []
        for r in rows:
            step = ReconfigStep(instance=r.instance, old_primary=r.primary_worker)
            primary = r.primary_worker
            chain = list(r.chain)
            if primary not in alive:
                new = self._failover_target(r, alive)
                if new is None:
                    step.lost = True
                    self.log("instance_unrecoverable", operator=operator_id, instance=r.instance,
                             reason="no live worker holds its last complete checkpoint")
                    plan.append(step)
                    continue
                step.takeover = True
                chain = [m for m in chain if m != new]
                primary = new
            step.primary, step.chain = primary, chain
            infos.append(InstanceInfo(key=r.key, primary=primary, bytes=r.bytes, chain=tuple(chain)))
            plan.append(step)
        # One call over every instance, so replacements spread by load.
        fixes = repair_chains(infos, workers, op.replicas, dead={m for i in infos for m in i.chain} - alive)
        by_key = {r.instance: r for r in rows}
        for step in plan:
            if step.lost:
                continue
            r = by_key[step.instance]
            fix = fixes.get(r.key)
            if fix is not None:
                step.chain, step.added, step.copy_from = list(fix.chain), list(fix.added), fix.copy_from
            changed = step.chain != r.chain or step.primary != r.primary_worker
            step.chain_version = r.chain_version + (1 if changed else 0)
        doc = Reconfiguration(epoch=epoch, reason=reason, steps=plan, leaving=sorted(leaving))
        t1 = time.monotonic()
        with self.meta.tx() as c:
            self.meta.set_pending_reconfiguration(c, operator_id, doc)
            self.meta.event(c, "reconfigure_planned", operator=operator_id, epoch=epoch, reason=reason)
        t2 = time.monotonic()
        report = self.carry_out(operator_id, doc)
        # where a failover's time goes: the decision (the chain members asked which
        # checkpoints they hold), the durable plan, then carry_out's own phases
        report["decide_s"], report["plan_tx_s"] = round(t1 - t0, 4), round(t2 - t1, 4)
        report["asked"] = self._asked
        return report

    def _failover_target(self, r: InstanceRow, alive: set[str]) -> Optional[str]:
        """The first live chain member holding the last complete checkpoint."""
        for wid in r.chain:
            if wid not in alive:
                continue
            if r.last_complete is None:
                return wid
            try:
                t = time.monotonic()
                st = self.workers.client(wid).status(r.operator_id, r.instance)
                ids = st["checkpoints"]
                # a failover's decision waits for these answers (replication_manager's report)
                self._asked.append({"worker": wid, "instance": r.instance, "request_s": round(time.monotonic() - t, 4),
                                    "queued_s": st.get("queued_s")})
            except RhinoError:
                continue
            if r.last_complete in ids:
                return wid
        return None

    def carry_out(self, operator_id: str, doc: Reconfiguration) -> dict:
        """Executes a pending reconfiguration (idempotent requests), then commits it."""
        op = self.meta.require_operator(operator_id)
        epoch = doc.epoch
        rows = {r.instance: r for r in self.meta.instances(operator_id)}
        assignment = self.meta.assignment(operator_id)
        t0 = time.monotonic()
        report: dict[str, Any] = {"epoch": epoch, "takeovers": {}, "reopens": {}, "copies": {}}
        # 1. Every instance on its (new) primary at the new epoch: takeovers and
        #    re-opens (the fence). They are independent requests to different
        #    instances, sent in parallel: a failover's next batch waits for all
        #    of them, and one re-open's fsyncs on a busy disk must not delay
        #    another's takeover. Takeovers go first.
        steps = sorted(doc.steps, key=lambda s: not s.takeover)
        with ThreadPoolExecutor(max_workers=max(1, len(steps)), thread_name_prefix="rhino-fence") as pool:
            futures = [pool.submit(self._place, op, epoch, s, rows[s.instance], assignment, report)
                       for s in steps]
        placed = {s.instance: f for s, f in zip(steps, futures)}
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:  # the reconfiguration stays pending; the first error says why
            raise errors[0]
        new_rows = [placed[s.instance].result() for s in doc.steps]
        report["fence_s"] = time.monotonic() - t0
        # 2. Bulk copies of the last complete checkpoint to new chain members,
        #    from the (surviving) primary: never from the dead worker.
        t1 = time.monotonic()
        for s, r in zip(doc.steps, new_rows):
            if s.lost or not s.added or r.last_complete is None:
                continue
            # What an added member still holds of the instance from an earlier
            # stint is of another history if a batch ran again meanwhile: it
            # would refuse the copy of last_complete. Dropped first.
            self._drop_earlier_stints(operator_id, r.instance, s.added, epoch)
            res = self.workers.client(r.primary_worker).replicate(
                operator_id, r.instance, epoch=epoch, to=self.workers.addresses(s.added),
                chain_version=r.chain_version, checkpoint=r.last_complete, timeout=self.workers.copy_timeout)
            report["copies"][str(r.instance)] = {"to": s.added, "bytes": res["bytes_sent"], "seconds": res["seconds"]}
        report["copy_s"] = time.monotonic() - t1
        t2 = time.monotonic()
        with self.meta.tx() as c:
            for r in new_rows:
                self.meta.put_instance(c, r)
            self.meta.record_epoch(c, operator_id, epoch, doc.reason)
            self.meta.clear_pending_reconfiguration(c, operator_id)
            self.meta.event(c, "reconfigured", operator=operator_id, epoch=epoch, reason=doc.reason,
                            takeovers=sorted(report["takeovers"]), copies=sorted(report["copies"]),
                            takeover_figures=report["takeovers"], reopen_figures=report["reopens"],
                            fence_s=round(report["fence_s"], 4),
                            copy_s=round(report["copy_s"], 4))
        report["commit_tx_s"] = round(time.monotonic() - t2, 4)
        self.log("reconfigured", operator=operator_id, epoch=epoch, reason=doc.reason)
        return report

    def _place(self, op: OperatorRow, epoch: int, s: ReconfigStep, r: InstanceRow, assignment: list[int],
               report: dict) -> InstanceRow:
        """One step of :meth:`carry_out`'s fence: the instance on its (new) primary at
        ``epoch``, taken over from the last complete checkpoint or re-opened. Returns its
        new row; the request's figures go to ``report`` (``takeovers``, ``reopens``)."""
        if s.lost:
            return r
        assert s.primary is not None  # every step not lost has a primary
        operator_id = op.operator_id
        chain_addr = self.workers.addresses(s.chain)
        cl = self.workers.client(s.primary)
        t, sent = time.monotonic(), time.time()
        if s.takeover and r.last_complete is not None:
            info = cl.takeover(operator_id, r.instance, epoch=epoch, checkpoint=r.last_complete,
                               chain=chain_addr, chain_version=s.chain_version,
                               redo_version=r.redo_version, redo=r.redo)
            report["takeovers"][str(r.instance)] = {"worker": s.primary, "restore_s": info.get("restore_s"),
                                                    "request_s": time.monotonic() - t,
                                                    "sent_unix": sent, "restore": info.get("restore"),
                                                    "queued_s": info.get("queued_s")}
        else:
            # A takeover of an instance that never completed a checkpoint starts it empty.
            vn = [v for v, i in enumerate(assignment) if i == r.instance] if s.takeover else None
            info = cl.open_instance(operator_id, r.instance, epoch=epoch, vnodes=vn, chain=chain_addr,
                                    chain_version=s.chain_version, **op.partitioner_args())
            report["reopens"][str(r.instance)] = {"worker": s.primary, "request_s": round(time.monotonic() - t, 4),
                                                  "sent_unix": sent, "reopen": (info or {}).get("reopen"),
                                                  "queued_s": (info or {}).get("queued_s")}
        return replace(r, primary_worker=s.primary, chain=list(s.chain), chain_version=s.chain_version)

    def _drop_earlier_stints(self, operator_id: str, instance: int, added: list[str], epoch: int) -> None:
        """Drops what new chain members hold of an instance, before its bulk copy.

        An added member may hold checkpoints of the instance from an earlier
        stint in its chain (a worker that was lost and came back with its
        store). Batches may have run again since: a re-executed batch commits
        its checkpoint again with other files, and only the chain members of
        the day are told to drop the old ones (docs/protocol.md §7.3). So what
        the member holds is of another history: its checkpoint last_complete
        would make the copy fail ("already committed here with different
        files"), and an older one would be what a rollback restores after a
        takeover there. It holds nothing the chain needs, so all of it goes
        (``after`` None), not only last_complete on: the member then holds
        exactly the primary's copy, as a fresh replacement does. Its pooled
        files stay until the store's GC, so the copy still sends only what
        the member lacks. Idempotent: a carry_out run again (a coordinator
        killed meanwhile) drops the copy the first run made and makes it
        again, from the same pooled files."""
        for m in added:
            removed = self.workers.client(m).discard_after(operator_id, instance, epoch=epoch, after=None)
            if removed:
                self.log("stale_checkpoints_dropped", operator=operator_id, instance=instance, worker=m,
                         checkpoints=removed)

    def resume(self) -> None:
        for op in self.meta.operators():
            pending = self.meta.pending_reconfiguration(op.operator_id)
            if pending is None:
                continue
            try:
                # The workers may have changed since: decide again from the
                # committed rows under a newer epoch (the same decision when
                # nothing changed), then carry it out.
                self.reconfigure_operator(op.operator_id, pending.reason + " (resumed)",
                                          leaving=self._leaving(pending))
            except RhinoError as e:
                self.log("resume_failed", operator=op.operator_id, error=str(e))

    # ---- a worker (re)joins ---------------------------------------------------------------
    def reconcile_worker(self, w: WorkerRow) -> None:
        """Closes instances a returning worker still hosts but no longer owns
        (their primary moved while it was away), after fencing them at the
        operator's current epoch."""
        try:
            hosted = self.workers.client(w).instances()
        except RhinoError:
            return
        for h in hosted:
            op = self.meta.operator(h["operator_id"])
            r = self.meta.instance(h["operator_id"], h["instance"])
            if op is None or r is None:
                continue
            if r.primary_worker != w.id or r.state != "active":
                cl = self.workers.client(w)
                cl.fence(h["operator_id"], h["instance"], epoch=op.epoch)
                cl.close_instance(h["operator_id"], h["instance"], epoch=op.epoch)
                self.log("stale_instance_closed", worker=w.id, operator=h["operator_id"], instance=h["instance"])

    def rebalance_replicas(self, operator_id: Optional[str]) -> dict:
        """Moves replicas onto under-loaded workers (a worker that joined)."""
        out = {}
        for op in self.meta.operators():
            if operator_id is not None and op.operator_id != operator_id:
                continue
            if self.meta.pending_reconfiguration(op.operator_id) is not None:
                # A repair that failed is still to be carried out (repair_all,
                # resume): it decides from the committed rows under a newer
                # epoch. A rebalance written over it would drop that decision.
                self.log("rebalance_skipped", operator=op.operator_id, reason="a reconfiguration is pending")
                continue
            rows = self.meta.instances(op.operator_id)
            infos = [InstanceInfo(key=r.key, primary=r.primary_worker, bytes=r.bytes, chain=tuple(r.chain)) for r in rows]
            changes = rebalance_chains(infos, self.workers.workers_info(), op.replicas)
            if not changes:
                continue
            epoch = op.epoch + 1
            steps = []
            for r in rows:
                fix = changes.get(r.key)
                step = ReconfigStep(instance=r.instance, old_primary=r.primary_worker, primary=r.primary_worker,
                                    chain=list(r.chain), chain_version=r.chain_version)
                if fix is not None:
                    step.chain, step.added, step.chain_version = list(fix.chain), list(fix.added), r.chain_version + 1
                steps.append(step)
            doc = Reconfiguration(epoch=epoch, reason="replica rebalance", steps=steps)
            with self.meta.tx() as c:
                self.meta.set_pending_reconfiguration(c, op.operator_id, doc)
            out[op.operator_id] = self.carry_out(op.operator_id, doc)
        return out
