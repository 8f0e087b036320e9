"""The coordinator: the Replication Manager and the Handover Manager of the
Rhino paper (§3.3, §4.1), over the workers' state service (docs/design.md §3-§4).

It keeps the metadata (:mod:`.metadata`), takes every decision under one lock
and in one SQLite transaction, and drives the workers through their instance
requests (docs/protocol.md §7.1): ``open`` (hosting, a new epoch or chain),
``takeover``, ``reconfigure``, ``replicate`` and ``close``. It runs in-process
(the Spark driver hosts it on a thread) or as ``rhino coordinator``
(:mod:`.server`), where the same methods are served over the framed,
authenticated protocol (docs/protocol.md §8).

Vocabulary of the methods below:

- An operator's **epoch** is its routing epoch. Every reconfiguration (a
  failover, a chain repair, a handover step, an abort) raises it, and every
  live instance of the operator is re-opened at the new epoch, so a worker
  refuses requests of the old one (docs/protocol.md §7.5).
- A micro-batch engine calls :meth:`begin_batch` before batch b (this is the
  barrier after b-1 where handovers run), then commits one session per
  instance, then :meth:`commit_batch`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import asdict, replace
from typing import Any, Callable, Optional

from ..errors import (BusyError, InvalidArgumentError, OperatorRunningError, ResourceExhaustedError, RhinoError,
                      StaleEpochError, UnknownInstanceError)
from . import copies
from .api import METHODS
from .autoscaler import DECISIONS_KEPT, DEFAULT_STRATEGY, AutoscaleSettings, Autoscaler, validate_report
from .gateway import WorkerGateway
from .handover_manager import HandoverManager, describe_plan
from .metadata import EPOCH_FLOOR_KEY, Metadata, PlanRow, WorkerRow
from .naming import split_operator_id
from .replication_manager import ReplicationManager
from .types import BatchTime, CommitAnswer, InstancePlacement, Placement

__all__ = ["Coordinator"]

logger = logging.getLogger("rhino.coordinator")

# drop_operator: a query runs an operator its driver or tasks called within this many
# seconds (the default of idle_s), or that has a batch in flight begun within IN_FLIGHT_S
DROP_IDLE_S = 60.0
IN_FLIGHT_S = 3600.0


class Coordinator:
    """The Replication and Handover Managers over one metadata directory.

    ``heartbeat_timeout``: a worker silent that long is declared dead, fenced
    and its instances failed over. ``request_timeout`` bounds one request to a
    worker (a bulk copy excepted: ``copy_timeout``).

    What it holds, and who is given what: ``meta`` (:class:`.Metadata`, all
    SQL); ``workers`` (:class:`.WorkerGateway`: the clients of the workers,
    the live workers and their addresses); ``rm`` (:class:`.ReplicationManager`)
    and ``hm`` (:class:`.HandoverManager`), each given ``meta``, ``workers``
    and the log. The coordinator itself keeps the lock every decision is
    taken under, the workers' heartbeats and the failure detector.
    """

    def __init__(self, directory: str, *, secret: bytes | str, heartbeat_timeout: float = 3.0,
                 request_timeout: float = 60.0, copy_timeout: float = 600.0, handover_timeout: float = 120.0,
                 client_id: str = "coordinator", log: Optional[Callable[..., None]] = None,
                 detector_interval: float = 0.1, rebuilding: bool = False, tls: Any = None) -> None:
        if heartbeat_timeout <= 0 or request_timeout <= 0:
            raise InvalidArgumentError("timeouts must be positive")
        self.meta = Metadata(directory)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self._log = log or (lambda event, **f: None)
        self.lock = threading.RLock()  # every decision, in order
        self._seen: dict[str, float] = {}  # worker id -> monotonic time of its last heartbeat
        self._pending_retry_at = 0.0  # monotonic time the detector last retried pending reconfigurations
        # operator -> the batch begun and not yet committed (since this process started):
        # a decommission moves such an operator off at its next barrier, any other at once
        self._in_flight: dict[str, int] = {}
        # operator -> monotonic time of the last call of its driver or tasks (create_operator,
        # begin_batch, commit_batch, placement, state_schema, set_state_schema,
        # report_unreachable): drop_operator refuses an operator that was active lately. A
        # restarted coordinator counts every operator as active at its start.
        self._started = time.monotonic()
        self._active: dict[str, float] = {}
        self._in_flight_at: dict[str, float] = {}  # operator -> monotonic time its batch in flight began
        # operators whose replicas move onto a worker that joined, at their next barrier
        self._rebalance_at_barrier: set[str] = set()
        self._stop = threading.Event()
        # --rebuild: until the metadata is rebuilt from the workers, only
        # registrations, heartbeats and status are served.
        self.rebuilding = rebuilding
        self.workers = WorkerGateway(self.meta, secret=secret, client_id=client_id, request_timeout=request_timeout,
                                     copy_timeout=copy_timeout, handover_timeout=handover_timeout, tls=tls)
        self.rm = ReplicationManager(self.meta, self.workers, self.log)
        self.hm = HandoverManager(self.meta, self.workers, self.log)
        # A restarted coordinator gives every worker it knew time to notice the
        # lost connection and reconnect (the workers back off up to 1 s) before
        # it counts heartbeats again: a restart must not fail healthy workers over.
        grace = max(5.0, 2 * self.heartbeat_timeout) - self.heartbeat_timeout
        now = time.monotonic() + grace
        for w in self.meta.workers():
            if w.alive:
                self._seen[w.id] = now
        self._detector = threading.Thread(target=self._detect, args=(detector_interval,),
                                          name="rhino-failure-detector", daemon=True)
        self._detector.start()
        self._resume()

    # ---- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        self._stop.set()
        self._detector.join(timeout=5)
        self.workers.close()
        with self.lock:
            self.meta.close()

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def log(self, event: str, **fields: Any) -> None:
        self._log(event, **fields)

    # ---- workers: registration and liveness -------------------------------------------
    def register(self, worker_id: str, address: str, *, unix_socket: Optional[str] = None,
                 rack: Optional[str] = None, zone: Optional[str] = None, incarnation: str = "") -> dict:
        """A worker (re)joins. A worker that was declared dead comes back empty of
        primaries: instances it still hosts whose primary moved are closed there."""
        if not worker_id or not address or ":" not in address:
            raise InvalidArgumentError("register needs a worker id and its 'host:port'")
        incarnation = incarnation or uuid.uuid4().hex
        with self.lock:
            old = self.meta.worker(worker_id)
            row = WorkerRow(id=worker_id, address=address, unix_socket=unix_socket,
                            host=address.rsplit(":", 1)[0], rack=rack, zone=zone, state="alive",
                            incarnation=incarnation, registered_at=time.time(), dead_since=None)
            with self.meta.tx() as c:
                self.meta.upsert_worker(c, row)
                self.meta.event(c, "worker_registered", worker=worker_id, address=address,
                                rejoined=bool(old and not old.alive), restarted=bool(old and old.incarnation != incarnation))
            self._seen[worker_id] = time.monotonic()
            self.workers.drop_client(worker_id)
            self.log("worker_registered", worker=worker_id, address=address)
            if worker_id in self.workers.draining():
                # back after (or during) its decommission: it may be placed on again
                self._set_draining(self.workers.draining() - {worker_id})
                self.log("decommission_ended", worker=worker_id, reason="the worker registered again")
            if not self.rebuilding:
                try:
                    self.rm.reconcile_worker(row)
                    self.rm.repair_all()
                    if old is None or not old.alive:
                        # A worker joined (or came back): replicas move onto it
                        # while that evens out the replica load (design §3), each
                        # operator at its next batch barrier (at once if it has no
                        # batch in flight), so that no running batch is cut short.
                        for op in self.meta.operators():
                            if op.operator_id in self._in_flight:
                                self._rebalance_at_barrier.add(op.operator_id)
                            else:
                                self.rm.rebalance_replicas(op.operator_id)
                except RhinoError as e:  # the worker may die again meanwhile; the detector handles that
                    self.log("reconcile_failed", worker=worker_id, error=str(e))
            # It could not heartbeat while this call ran (a repair may copy GBs).
            self._seen[worker_id] = time.monotonic()
        return {"worker_id": worker_id, "incarnation": incarnation, "heartbeat_timeout": self.heartbeat_timeout}

    def heartbeat(self, worker_id: str, incarnation: str) -> dict:
        """A worker's heartbeat. The late messages of a worker declared dead (or
        of an older incarnation) are refused: it must register again."""
        w = self.meta.worker(worker_id)
        if w is None:
            raise UnknownInstanceError(f"worker {worker_id} is not registered here: register first")
        if not w.alive:
            raise StaleEpochError(f"worker {worker_id} was declared dead at {w.dead_since}: register again")
        if w.incarnation != incarnation:
            raise StaleEpochError(f"worker {worker_id}: heartbeat of incarnation {incarnation}, "
                                  f"registered as {w.incarnation}: register again")
        self._seen[worker_id] = time.monotonic()
        return {"ok": True}

    def _detect(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if self.rebuilding:
                continue
            now = time.monotonic()
            late = [wid for wid, t in list(self._seen.items()) if now - t > self.heartbeat_timeout]
            for wid in late:
                try:
                    with self.lock:
                        # Checked again under the lock: a long decision may have
                        # held it while this worker's heartbeats kept coming.
                        seen = self._seen.get(wid)
                        age = time.monotonic() - seen if seen is not None else 0.0
                        if seen is None or age <= self.heartbeat_timeout:
                            continue
                        self.declare_dead(wid, f"no heartbeat for {age:.1f} s")
                except Exception as e:  # never let the detector die
                    self.log("failover_failed", worker=wid, error=f"{type(e).__name__}: {e}")
            self._retry_pending(now)

    def _retry_pending(self, now: float) -> None:
        """A reconfiguration left pending (one operator's failed while a worker's loss
        was handled: replication_manager.py) is decided again, under a newer epoch, at
        most once per heartbeat timeout: until then that operator's tasks are refused."""
        if now - self._pending_retry_at < self.heartbeat_timeout:
            return
        self._pending_retry_at = now
        try:
            pending = [op.operator_id for op in self.meta.operators()
                       if self.meta.pending_reconfiguration(op.operator_id) is not None]
            for operator_id in pending:
                with self.lock:
                    doc = self.meta.pending_reconfiguration(operator_id)
                    if doc is None:  # carried out meanwhile
                        continue
                    try:
                        # only the pending ones: a chain merely short (too few workers) is not
                        # touched, which would move its operator to a new epoch every time
                        reason = str(doc.get("reason", "reconfiguration"))
                        if not reason.endswith(" (retried)"):
                            reason += " (retried)"
                        self.rm.reconfigure_operator(operator_id, reason, leaving=self.rm._leaving(doc))
                    except RhinoError as e:
                        self.rm._failed(operator_id, "retry of a pending reconfiguration", e)
        except Exception as e:  # never let the detector die
            self.log("pending_reconfiguration_retry_failed", error=f"{type(e).__name__}: {e}")

    def declare_dead(self, worker_id: str, reason: str) -> dict:
        """Fences a worker off: it is marked dead, every operator with an
        instance or a replica on it moves to a new epoch, its primaries fail
        over to chain members and its chains are repaired."""
        with self.lock:
            w = self.meta.worker(worker_id)
            if w is None or not w.alive:
                self._seen.pop(worker_id, None)
                return {"worker": worker_id, "already_dead": True}
            t0 = time.monotonic()
            with self.meta.tx() as c:
                self.meta.mark_worker_dead(c, worker_id)
                self.meta.event(c, "worker_dead", worker=worker_id, reason=reason)
            dead_tx_s = time.monotonic() - t0
            self._seen.pop(worker_id, None)
            self.workers.drop_client(worker_id)
            self.log("worker_dead", worker=worker_id, reason=reason)
            out = self.rm.recover_from_loss(worker_id)
            out["recovery_s"] = time.monotonic() - t0
            # per operator, where the time went (replication_manager.reconfigure_operator)
            phases = {op: {k: rep[k] for k in _FAILOVER_PHASES if k in rep} for op, rep in out["operators"].items()}
            with self.meta.tx() as c:
                self.meta.event(c, "failover_done", worker=worker_id, recovery_s=round(out["recovery_s"], 4),
                                dead_tx_s=round(dead_tx_s, 4), phases=phases,
                                operators=sorted(out["operators"]), errors=out.get("errors", {}))
            return out

    # ---- operators -------------------------------------------------------------------
    def create_operator(self, operator_id: str, *, parallelism: int, num_vnodes: int = 256, replicas: int = 2,
                        num_key_groups: int = 1 << 15, seed: int = 0, placement: str = "balanced",
                        min_copies: Optional[int] = None, min_copies_strict: Optional[bool] = None,
                        min_copies_wait_s: Optional[float] = None) -> dict:
        """Places a new operator: the initial routing table from the
        consistent-hash ring, primaries spread over the workers, a chain of
        ``replicas`` other workers per instance; every instance is opened on its
        primary. Creating an existing operator returns its current placement (a
        restarted driver): ``parallelism`` is the initial one only, and a different
        count is adopted from the coordinator (an ``operator_adopted`` event); a
        different ``num_vnodes``, ``num_key_groups``, ``seed`` or ``replicas`` is
        refused, naming each field's two values (issue 45).

        ``min_copies``, ``min_copies_strict``, ``min_copies_wait_s``: the live copies each
        instance must have before a batch runs, and whether a batch waits for them
        (coordinator/copies.py); each one given replaces the operator's setting, the others
        keep theirs (1, False, 30 s at first)."""
        self._touch(operator_id)
        with self.lock:
            given = (min_copies, min_copies_strict, min_copies_wait_s)
            if any(x is not None for x in given) and self.meta.operator(operator_id) is None:
                # checked before the operator exists: a refused setting creates nothing
                copies.merged(copies.CopiesPolicy(), *given).checked(replicas, operator_id)
            self.rm.create_operator(operator_id, parallelism=parallelism, num_vnodes=num_vnodes, replicas=replicas,
                                    num_key_groups=num_key_groups, seed=seed, placement=placement)
            if any(x is not None for x in given):
                op = self.meta.require_operator(operator_id)
                policy = copies.merged(copies.load_policy(self.meta, operator_id), *given).checked(op.replicas,
                                                                                                    operator_id)
                with self.meta.tx() as c:
                    copies.save_policy(self.meta, c, operator_id, policy)
            return self.placement(operator_id)

    def placement(self, operator_id: str) -> dict:
        """The current routing table and placement of an operator: what a task
        needs to route keys and reach each instance's primary (a :class:`.Placement`
        on the wire)."""
        self._touch(operator_id)
        return self._placement(operator_id).to_wire()

    def _placement(self, operator_id: str) -> Placement:
        op = self.meta.require_operator(operator_id)
        workers = {w.id: w for w in self.meta.workers()}
        insts = {}
        for r in self.meta.instances(operator_id):
            p = workers.get(r.primary_worker)
            insts[r.instance] = InstancePlacement(
                primary=r.primary_worker, address=p.address if p else None,
                unix_socket=p.unix_socket if p else None, host=p.host if p else None, chain=tuple(r.chain),
                chain_addresses=tuple(workers[x].address for x in r.chain if x in workers),
                chain_version=r.chain_version, last_complete=r.last_complete, bytes=r.bytes)
        bt = self.meta.get_meta(_BATCH_TIME_KEY + operator_id)
        return Placement(operator_id=operator_id, epoch=op.epoch, num_vnodes=op.num_vnodes,
                         num_key_groups=op.num_key_groups, seed=op.seed, replicas=op.replicas,
                         last_batch=op.last_batch, assignment=tuple(self.meta.assignment(operator_id)),
                         instances=insts, batch_time=BatchTime.from_wire(json.loads(bt)) if bt else None)

    def begin_batch(self, operator_id: str, batch: int, *, batch_time_ms: Optional[int] = None) -> dict:
        """The barrier before ``batch``: runs the handover steps due after
        ``batch - 1`` (docs/design.md §4), then returns the placement to route
        the batch with. ``batch`` is the next batch, or the same one again (a
        re-execution).

        ``batch_time_ms``: the caller's clock at the batch's first begin. The
        first value given for a batch is kept, and every begin of that batch
        answers it as the placement's ``batch_time_ms`` (a batch that runs again
        keeps its time: TTL and processing-time timers see the same time, design
        §5). Never earlier than the previous batch's time."""
        _uint("batch", batch)
        if batch_time_ms is not None and (not isinstance(batch_time_ms, int) or isinstance(batch_time_ms, bool)):
            raise InvalidArgumentError(f"batch_time_ms must be an integer (ms), not {batch_time_ms!r}")
        self._touch(operator_id)
        with self.lock:
            op = self.meta.require_operator(operator_id)
            nxt = 0 if op.last_batch is None else op.last_batch + 1
            if batch != nxt:
                raise InvalidArgumentError(f"operator {operator_id} completed batch {op.last_batch}: "
                                           f"the next batch is {nxt}, not {batch}")
            if batch > 0:
                self.hm.run_due(operator_id, batch - 1)
            # the barrier before `batch`: off the workers being decommissioned, onto those that joined
            self._drain(operator_id, f"decommission (barrier before batch {batch})")
            if operator_id in self._rebalance_at_barrier:
                self._rebalance_at_barrier.discard(operator_id)
                try:
                    self.rm.rebalance_replicas(operator_id)
                except RhinoError as e:  # a worker died meanwhile: the detector handles that
                    self.log("rebalance_failed", operator=operator_id, error=f"{type(e).__name__}: {e}")
            policy = copies.load_policy(self.meta, operator_id)
            short = self._short_of_copies(operator_id, policy)
        if short and policy.strict:
            short = self._wait_for_copies(operator_id, batch, policy)  # [] or ResourceExhaustedError
        with self.lock:
            op = self.meta.require_operator(operator_id)
            if (0 if op.last_batch is None else op.last_batch + 1) != batch:  # committed meanwhile (a second driver)
                raise InvalidArgumentError(f"operator {operator_id} completed batch {op.last_batch} while batch "
                                           f"{batch} waited for its copies")
            if short:
                self.log("batch_short_of_copies", operator=operator_id, batch=batch,
                         instances={s.instance: s.copies for s in short}, min_copies=policy.min_copies)
                with self.meta.tx() as c:
                    self.meta.event(c, "batch_short_of_copies", operator=operator_id, batch=batch,
                                    instances=[s.to_wire() for s in short])
            self._in_flight[operator_id] = batch
            self._in_flight_at[operator_id] = time.monotonic()
            placement = replace(self._placement(operator_id), attempt=self._attempt_token(),
                                short_of_copies=tuple(short))
            if batch_time_ms is not None:
                placement = replace(placement, batch_time_ms=self._batch_time(operator_id, batch, batch_time_ms))
            return placement.to_wire()

    def _short_of_copies(self, operator_id: str, policy: copies.CopiesPolicy) -> list:
        """The instances short of ``policy.min_copies`` after a chain repair was tried for
        them (coordinator/copies.py). REQUIRES: lock."""
        if policy.min_copies <= 1:
            return []  # the primary is a copy, and a dead one was failed over already
        short = copies.short_of_copies(self.meta.instances(operator_id), self.workers.alive_ids(), policy.min_copies)
        if short:
            self.log("copies_short_repairing", operator=operator_id, instances={s.instance: s.copies for s in short},
                     min_copies=policy.min_copies)
            self.rm.repair_all()  # a failure stays pending and is logged there
            short = copies.short_of_copies(self.meta.instances(operator_id), self.workers.alive_ids(),
                                           policy.min_copies)
        return short

    def _wait_for_copies(self, operator_id: str, batch: int, policy: copies.CopiesPolicy) -> list:
        """min_copies strict: waits (without the lock: a worker must be able to register)
        for a repair that gives every instance its copies, at most ``policy.wait_s``."""
        deadline = time.monotonic() + policy.wait_s
        self.log("batch_waits_for_copies", operator=operator_id, batch=batch, min_copies=policy.min_copies,
                 wait_s=policy.wait_s)
        while True:
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
            with self.lock:
                short = self._short_of_copies(operator_id, policy)
            if not short:
                self.log("copies_restored", operator=operator_id, batch=batch)
                return []
            if time.monotonic() >= deadline:
                which = ", ".join(f"instance {s.instance} has {s.copies}" for s in short)
                self.log("batch_refused_short_of_copies", operator=operator_id, batch=batch, detail=which)
                with self.lock, self.meta.tx() as c:
                    self.meta.event(c, "batch_refused_short_of_copies", operator=operator_id, batch=batch,
                                    instances=[s.to_wire() for s in short])
                raise ResourceExhaustedError(
                    f"batch {batch} of operator {operator_id} needs {policy.min_copies} live copies of every "
                    f"instance (min_copies, strict): {which}, and no chain repair gave them within "
                    f"{policy.wait_s:g} s; add a worker, or lower min_copies")

    def _attempt_token(self) -> int:
        """A new attempt token (the attempt fence, docs/protocol.md §7.2): above every token
        issued before, by this coordinator or an earlier one on the same metadata, and at
        least the clock in µs, so that a coordinator rebuilt from the workers (``--rebuild``:
        the metadata is new) still issues tokens above the workers' highest. REQUIRES: lock."""
        got = self.meta.get_meta(_ATTEMPT_KEY)
        token = max(int(got) + 1 if got else 1, int(time.time() * 1_000_000))
        with self.meta.tx() as c:
            self.meta.set_meta(c, _ATTEMPT_KEY, str(token))
        return token

    def _batch_time(self, operator_id: str, batch: int, proposed_ms: int) -> int:
        """The batch's time: the one stored for ``batch``, else ``proposed_ms`` (raised to
        the previous batch's time, so batch time never goes back), stored."""
        key = _BATCH_TIME_KEY + operator_id
        got = self.meta.get_meta(key)
        doc = json.loads(got) if got else None
        if doc is not None and doc["batch"] == batch:
            return int(doc["time_ms"])
        t = max(int(proposed_ms), int(doc["time_ms"]) if doc is not None else proposed_ms)
        # the times of the latest batches too: a state reader filters expired TTL entries of
        # an older checkpoint with its batch's time
        recent = dict((doc or {}).get("recent") or {})
        if doc is not None:
            recent[str(doc["batch"])] = int(doc["time_ms"])
        recent = dict(sorted(recent.items(), key=lambda kv: int(kv[0]))[-_BATCH_TIMES_KEPT:])
        with self.meta.tx() as c:
            self.meta.set_meta(c, key, json.dumps({"batch": batch, "time_ms": t, "recent": recent}))
        return t

    def state_schema(self, operator_id: str) -> dict:
        """The operator's state schema document (its state variables, their ids and
        schema versions; written by ``rhino.spark``), and its revision (0: none yet)."""
        self._touch(operator_id)
        self.meta.require_operator(operator_id)
        got = self.meta.get_meta(f"state_schema:{operator_id}")
        return json.loads(got) if got else {"revision": 0, "doc": None}

    def set_state_schema(self, operator_id: str, doc: dict, revision: int) -> dict:
        """Replaces the state schema document if it is still at ``revision`` (a
        compare-and-set: two drivers cannot both register a change); answers the new
        revision. The coordinator stores the document; the caller checks compatibility."""
        if not isinstance(doc, dict):
            raise InvalidArgumentError("the state schema document must be a JSON object")
        with self.lock:
            cur = self.state_schema(operator_id)
            if cur["revision"] != revision:
                raise BusyError(f"operator {operator_id}: the state schema is at revision "
                                      f"{cur['revision']}, not {revision} (another driver changed it): read it again")
            new = {"revision": revision + 1, "doc": doc}
            with self.meta.tx() as c:
                self.meta.set_meta(c, f"state_schema:{operator_id}", json.dumps(new))
            return {"revision": revision + 1}

    def commit_batch(self, operator_id: str, batch: int, *, instances: Optional[dict] = None,
                     load: Optional[dict] = None, epoch: Optional[int] = None,
                     report: Optional[dict] = None) -> dict:
        """Batch ``batch`` is done: every instance committed it in barrier mode,
        so checkpoint ``batch`` is complete on every chain. ``instances`` maps an
        instance to its commit stats (``checkpoint_bytes``); ``load`` maps a vnode
        to ``[ops, bytes]`` of this batch (the Handover Manager balances on it).

        ``epoch``, if given, is the epoch every instance committed the batch at:
        the commit is refused (StaleEpochError) if a reconfiguration happened
        since. An instance taken over meanwhile was restored from its last
        complete checkpoint, b-1, so b is not complete everywhere and the
        engine must run the batch again (every instance rolls back to b-1).

        ``report``, optional: the batch's measurements for the autoscaler
        (:func:`.autoscaler.validate_report`: ``batch_s``, ``records``, ``busy_s``
        and ``records_by_instance`` per instance, ``began_unix``). When the
        operator's autoscaling is on (:meth:`autoscale`), the policy decides on it
        after the commit and may plan a rescale, which runs at the next barrier.
        A bad report never stops the commit: the batch is committed, the report
        is ignored, and the answer's ``report_error`` says why (an
        InvalidArgumentError's message); nor does an autoscaling failure
        (``autoscale.error``). The answer's ``autoscale`` is the decision."""
        _uint("batch", batch)
        self._touch(operator_id)
        with self.lock:
            op = self.meta.require_operator(operator_id)
            nxt = 0 if op.last_batch is None else op.last_batch + 1
            if batch != nxt:
                raise InvalidArgumentError(f"operator {operator_id}: commit of batch {batch}, expected {nxt}")
            rep, report_error = None, None
            if report is not None:
                try:
                    rep = validate_report(report)
                except InvalidArgumentError as e:
                    report_error = f"InvalidArgumentError: {e}"
            if epoch is not None and int(epoch) != op.epoch:
                raise StaleEpochError(f"operator {operator_id}: batch {batch} was committed at epoch {epoch}, "
                                      f"but the operator is at epoch {op.epoch} now (a reconfiguration "
                                      "happened during the batch): run it again")
            stats = {int(k): v for k, v in (instances or {}).items()}
            self._in_flight.pop(operator_id, None)
            self._in_flight_at.pop(operator_id, None)
            with self.meta.tx() as c:
                self.meta.set_last_batch(c, operator_id, batch)
                for r in self.meta.instances(operator_id):
                    r.last_complete = batch
                    if r.instance in stats and "checkpoint_bytes" in stats[r.instance]:
                        r.bytes = int(stats[r.instance]["checkpoint_bytes"])
                    if r.redo_version is not None and batch >= r.redo_version + 2:
                        r.redo_version, r.redo = None, []
                    self.meta.put_instance(c, r)
                for v, (ops, nbytes) in (load or {}).items():
                    self.meta.add_vnode_load(c, operator_id, int(v), float(ops), float(nbytes), batch)
            # The batch is committed: nothing below may undo or refuse it.
            decision = None
            if report_error is not None:
                self.log("report_refused", operator=operator_id, batch=batch, error=report_error)
                logger.warning("operator %s batch %d: report ignored: %s", operator_id, batch, report_error)
            elif rep is not None:
                decision = self._autoscale_after_commit(operator_id, batch, rep)
            return CommitAnswer(operator_id=operator_id, last_batch=batch, report_error=report_error,
                                autoscale=decision).to_wire()

    def report_unreachable(self, operator_id: str, instance: int, worker_id: Optional[str] = None) -> dict:
        """A task could not reach an instance's primary. If the worker does not
        answer the coordinator either, it is declared dead at once (no waiting
        for the heartbeat timeout) and the instance fails over. Returns the
        placement to retry with."""
        self._touch(operator_id)
        with self.lock:
            r = self.meta.instance(operator_id, instance)
            if r is None:
                raise UnknownInstanceError(f"no instance {operator_id}/{instance}")
            wid = worker_id or r.primary_worker
            w = self.meta.worker(wid)
            if w is not None and w.alive:
                try:
                    self.workers.drop_client(wid)
                    self.workers.client(w).instances()
                except RhinoError as e:
                    self.declare_dead(wid, f"reported unreachable ({e})")
            return self.placement(operator_id)

    # ---- handovers ---------------------------------------------------------------------
    def handover(self, operator_id: str, vnodes: list[int], to: int, *, strategy: str = "all-at-once",
                 after_batch: Optional[int] = None, on: Optional[str] = None) -> dict:
        """Plans moving ``vnodes`` to instance ``to`` (a new instance number
        creates it, on worker ``on`` if given) at the barrier after
        ``after_batch`` (default: the next barrier), in steps of ``strategy``.
        Refused (InvalidArgumentError) while the operator has an open plan;
        other operators' plans do not matter (plans are per operator)."""
        with self.lock:
            return self.hm.plan_handover(operator_id, vnodes, to, strategy=strategy, after_batch=after_batch, on=on)

    def rescale(self, operator_id: str, parallelism: int, *, strategy: str = "all-at-once",
                after_batch: Optional[int] = None, on: Optional[list[str]] = None) -> dict:
        """Plans a new parallelism. New instances go to workers holding the
        origins' replicas, or to the workers ``on`` (horizontal scaling).
        Refused while the operator has an open plan, as :meth:`handover`."""
        with self.lock:
            return self.hm.plan_rescale(operator_id, parallelism, strategy=strategy, after_batch=after_batch, on=on)

    def rebalance(self, operator_id: Optional[str] = None, *, replicas: bool = True, load: bool = True,
                  strategy: str = "batched", after_batch: Optional[int] = None) -> dict:
        """Rebalances replicas over the live workers (at once) and, driven by
        the measured per-vnode load, vnodes over instances (a plan per operator).

        Load plans are per operator: one named operator with an open plan is
        refused (InvalidArgumentError, before anything moves); over every
        operator (``operator_id`` None), those with an open plan are skipped
        and listed in ``skipped`` with their open plan, the others are planned."""
        with self.lock:
            if load and operator_id:
                self.meta.require_operator(operator_id)
                self.hm.refuse_if_open(operator_id, "load rebalance")
            out: dict[str, Any] = {}
            if replicas:
                out["replicas"] = self.rm.rebalance_replicas(operator_id)
            if load:
                ops = [operator_id] if operator_id else [o.operator_id for o in self.meta.operators()]
                out["plans"], out["skipped"] = [], []
                for o in ops:
                    busy = self.hm.open_plan(o)
                    if busy is not None:
                        out["skipped"].append({"operator_id": o, "open_plan": busy.id,
                                               "why": f"it has an open plan, {describe_plan(busy)}"})
                        continue
                    p = self.hm.plan_balance(o, strategy=strategy, after_batch=after_batch)
                    if p is not None:
                        out["plans"].append(p)
            return out

    def cancel_plan(self, operator_id: str, plan_id: Optional[int] = None) -> dict:
        """Cancels the open plan ``plan_id`` of ``operator_id`` (None: its open
        plan), between two steps: the steps done stay done, the rest are
        dropped, no worker is asked anything (:meth:`.HandoverManager.cancel_plan`
        says why that is safe). Errors: UnknownInstanceError (operator),
        InvalidArgumentError (no open plan, an unknown plan, another
        operator's, one already ended)."""
        with self.lock:
            return self.hm.cancel_plan(operator_id, plan_id)

    # ---- the autoscaler -------------------------------------------------------------------
    def autoscale(self, operator_id: str, *, enabled: bool = True, min_parallelism: Optional[int] = None,
                  max_parallelism: Optional[int] = None, utilization: float = 0.7, cooldown_batches: int = 3,
                  strategy: str = DEFAULT_STRATEGY, cores_per_worker: int = 1, scale_in_margin: float = 0.2,
                  scale_in_reports: int = 3) -> dict:
        """Turns the operator's autoscaler on (or off: ``enabled=False``) with these settings
        (:mod:`.autoscaler` says what each does). From then on every ``commit_batch`` with a
        report is decided on, and a rescale it asks for is planned with ``strategy`` and runs
        at the operator's next barriers. Kept in the metadata (a restarted coordinator goes
        on with it). Turning it off keeps the settings and the decisions (``rhino status``);
        ``min_parallelism`` and ``max_parallelism`` may then be left out. Answers the
        operator's autoscaling as ``status`` shows it. Errors: UnknownInstanceError (no such
        operator), InvalidArgumentError (a bad setting)."""
        with self.lock:
            op = self.meta.require_operator(operator_id)
            doc = self._autoscale_doc(operator_id) or {}
            old = doc.get("settings") or {}
            if not isinstance(enabled, bool):
                raise InvalidArgumentError(f"autoscale: enabled must be true or false, got {enabled!r}")
            if min_parallelism is None or max_parallelism is None:
                if enabled or not old:
                    raise InvalidArgumentError("autoscale: min_parallelism and max_parallelism are needed to turn "
                                               "autoscaling on")
                settings = AutoscaleSettings(**dict(old, enabled=False))
            else:
                settings = AutoscaleSettings(enabled=enabled, min_parallelism=min_parallelism,
                                             max_parallelism=max_parallelism, utilization=utilization,
                                             cooldown_batches=cooldown_batches, strategy=strategy,
                                             cores_per_worker=cores_per_worker, scale_in_margin=scale_in_margin,
                                             scale_in_reports=scale_in_reports)
            settings.check(op.num_vnodes)
            doc["settings"] = asdict(settings)
            with self.meta.tx() as c:
                self.meta.set_meta(c, _AUTOSCALE_KEY + operator_id, json.dumps(doc))
                self.meta.event(c, "autoscale_set", operator=operator_id, **doc["settings"])
            self.log("autoscale_set", operator=operator_id, **doc["settings"])
            logger.info("operator %s: autoscaling %s: %s", operator_id, "on" if settings.enabled else "off",
                        doc["settings"])
            return self._autoscale_status(operator_id)

    def _autoscale_doc(self, operator_id: str) -> Optional[dict]:
        """The operator's autoscaling in the metadata: ``settings``, the policy's ``state``,
        the ``last`` decision and the last rescale ``decisions``; None if never set."""
        got = self.meta.get_meta(_AUTOSCALE_KEY + operator_id)
        return json.loads(got) if got else None

    def _autoscale_status(self, operator_id: str) -> Optional[dict]:
        doc = self._autoscale_doc(operator_id)
        if doc is None:
            return None
        st = doc.get("settings") or {}
        return {"enabled": bool(st.get("enabled")), "settings": st, "last": doc.get("last"),
                "decisions": doc.get("decisions") or []}

    def _autoscale_after_commit(self, operator_id: str, batch: int, rep: Any) -> Optional[dict]:
        """The autoscaler's decision on the report of ``batch``, just committed (the caller
        holds the lock), and its rescale planned if it asks for one. Never raises: the batch
        is committed already; a failure is logged and answered as ``error``."""
        doc = self._autoscale_doc(operator_id)
        if doc is None or not (doc.get("settings") or {}).get("enabled"):
            return None
        try:
            settings = AutoscaleSettings(**doc["settings"])
            policy = Autoscaler(settings, doc.get("state"))
            usable = self.workers.alive_ids() - self.workers.draining()
            d = policy.observe(rep, batch=batch, parallelism=len(self.meta.instances(operator_id)),
                               plan_open=self.hm.open_plan(operator_id) is not None,
                               workers_available=len(usable), now=time.time())
            out = d.doc()
            if d.rescale:
                try:
                    # the lock is held: the Handover Manager directly (self.rescale would take it again)
                    plan = self.hm.plan_rescale(operator_id, d.to, strategy=settings.strategy, after_batch=None)
                    out["plan"] = plan["plan"]
                except RhinoError as e:
                    out["error"] = f"{type(e).__name__}: {e}"
            doc["state"], doc["last"] = policy.to_doc(), out
            if d.rescale:
                doc["decisions"] = ((doc.get("decisions") or []) + [out])[-DECISIONS_KEPT:]
            with self.meta.tx() as c:
                self.meta.set_meta(c, _AUTOSCALE_KEY + operator_id, json.dumps(doc))
                if d.rescale:  # the event has its own time
                    self.meta.event(c, "autoscale_decision", operator=operator_id,
                                    **{k: v for k, v in out.items() if k != "at"})
            if d.rescale:
                self.log("autoscale_decision", operator=operator_id, **{k: v for k, v in out.items() if k != "at"})
                logger.info("operator %s batch %d: autoscaler: %s%s", operator_id, batch, d.reason,
                            f" (plan #{out['plan']})" if "plan" in out else f"; not planned: {out.get('error')}")
            else:
                logger.debug("operator %s batch %d: autoscaler: hold: %s", operator_id, batch, d.reason)
            return out
        except Exception as e:  # noqa: BLE001 - the commit stands whatever the autoscaler does
            err = f"{type(e).__name__}: {e}"
            self.log("autoscale_failed", operator=operator_id, batch=batch, error=err)
            logger.exception("operator %s batch %d: autoscaler failed", operator_id, batch)
            return {"batch": batch, "action": "hold", "error": err}

    # ---- status -------------------------------------------------------------------------
    # ---- decommission ------------------------------------------------------------------
    def decommission(self, worker_id: str, *, force: bool = False) -> dict:
        """Moves everything off a live worker before it is taken away (design §3): nothing new
        is placed on it from now on, and each operator with a primary or a replica on it moves
        off it at its next batch barrier (its next ``begin_batch``): its primaries are taken
        over by chain members (hard links: at a barrier, the last complete checkpoint is the
        primary's state) and its chains are repaired from the primaries, then its instances
        there are closed. So no batch fails. An operator with no batch in flight moves at
        once; ``force=True`` moves every operator at once (a batch in flight then runs again,
        exactly-once). Call it again (or ``status``) to see what still holds the worker:
        ``drained`` is true once nothing does; then stop the worker. A decommissioned worker
        that registers again is placed on again."""
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidArgumentError("decommission needs a worker id")
        with self.lock:
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
                if op.operator_id in self._in_flight and not force:
                    continue  # at its next barrier
                self._drain(op.operator_id, "decommission" + (" (forced)" if force else " (no batch in flight)"))
            return self._drain_status(worker_id)

    def _drain_status(self, worker_id: str) -> dict:
        holding = self._holding(worker_id)
        drained = not holding
        return {"worker": worker_id, "draining": worker_id in self.workers.draining(), "drained": drained,
                "operators": holding,
                "waiting_for_barrier": sorted(op for op in holding if op in self._in_flight)}

    def _holding(self, worker_id: str) -> list[str]:
        """The operators with a primary or a replica on the worker."""
        return sorted({r.operator_id for op in self.meta.operators() for r in self.meta.instances(op.operator_id)
                       if r.primary_worker == worker_id or worker_id in r.chain})

    def _set_draining(self, ids: set[str]) -> None:
        from .gateway import DRAINING_KEY

        with self.meta.tx() as c:
            self.meta.set_meta(c, DRAINING_KEY, json.dumps(sorted(ids)))

    def _drain(self, operator_id: str, reason: str) -> None:
        """Moves an operator off the workers being decommissioned (the caller holds the lock,
        at a barrier of the operator's, or with no batch of it in flight)."""
        leaving = self.workers.draining()
        if not leaving:
            return
        rows = self.meta.instances(operator_id)
        touching = {w for r in rows for w in [r.primary_worker, *r.chain] if w in leaving}
        if not touching:
            return
        alive = self.workers.alive_ids()
        try:
            self.rm.reconfigure_operator(operator_id, f"{reason}: {', '.join(sorted(touching))}",
                                         leaving=frozenset(touching))
        except RhinoError as e:
            # left pending (with what was leaving): retried by the detector, or at the next barrier
            self.rm._failed(operator_id, reason, e)
            return
        for wid in sorted(touching & alive):
            w = self.meta.worker(wid)
            if w is not None:
                # its instances of this operator are owned elsewhere now: fenced and closed
                self.rm.reconcile_worker(w)
            if not self._holding(wid):
                with self.meta.tx() as c:
                    self.meta.event(c, "decommission_drained", worker=wid)
                self.log("decommission_drained", worker=wid)

    # ---- dropping an operator (issue 45) ----------------------------------------------------
    def _touch(self, operator_id: Any) -> None:
        if isinstance(operator_id, str):
            self._active[operator_id] = time.monotonic()

    def _running(self, operator_id: str, idle_s: float) -> Optional[str]:
        """Why a query runs the operator (None: it does not). It runs while a batch of it
        is in flight (begun and not committed, for at most IN_FLIGHT_S: a driver that died
        mid-batch does not hold it forever), or while its driver or tasks called the
        coordinator in the last ``idle_s`` seconds (a restarted coordinator counts each
        operator as called at its start)."""
        now = time.monotonic()
        if operator_id in self._in_flight and now - self._in_flight_at.get(operator_id, now) < IN_FLIGHT_S:
            return (f"its batch {self._in_flight[operator_id]} is in flight (begun "
                    f"{now - self._in_flight_at[operator_id]:.1f} s ago, not committed)")
        last = self._active.get(operator_id, self._started)
        if now - last < idle_s:
            who = "its driver or tasks called the coordinator" if operator_id in self._active else \
                "the coordinator started"
            return f"{who} {now - last:.1f} s ago (less than idle_s={idle_s:g} s)"
        return None

    def drop_operator(self, operator_id: str, *, idle_s: float = DROP_IDLE_S) -> dict:
        """Drops an operator: every live worker removes every trace of each of its
        instances (protocol §7.1 ``drop``: live state, checkpoints, standby, fences),
        then its metadata goes in one transaction (every row and event naming it). A
        query that runs it is refused (OperatorRunningError: :meth:`_running`), and so
        is a worker's drop while a session is open (SessionBusyError): the metadata
        stays, and the drop can be asked again. A worker that is dead now keeps its copy
        (``not_reached``); nothing names it any more. New operators start above every
        epoch and chain version the dropped one used (workers may still remember them)."""
        if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) or idle_s < 0:
            raise InvalidArgumentError(f"idle_s must be a number of seconds >= 0, not {idle_s!r}")
        with self.lock:
            op = self.meta.require_operator(operator_id)
            why = self._running(operator_id, float(idle_s))
            if why is not None:
                raise OperatorRunningError(f"operator {operator_id} is running: {why}; stop its query, then "
                                           "drop it")
            rows = self.meta.instances(operator_id, active_only=False)
            instances = sorted({r.instance for r in rows})
            epoch = op.epoch + 1
            pending = self.meta.pending_reconfiguration(operator_id) or {}
            floor = max([epoch, int(pending.get("epoch") or 0) + 1] + [r.chain_version + 1 for r in rows]
                        + [int(st.get("chain_version") or 0) + 1 for st in pending.get("steps", [])])
            out: dict[str, Any] = {"operator_id": operator_id, "instances": instances, "workers": {},
                                   "not_reached": sorted(w.id for w in self.meta.workers() if not w.alive)}
            alive = self.workers.alive_workers()
            # 1. a session open on a primary (a task of a batch this coordinator has not
            # seen begin: one of before its restart) is a query running it too
            for r in self.meta.instances(operator_id):
                if r.primary_worker in {w.id for w in alive}:
                    st = self.workers.client(r.primary_worker).status(operator_id, r.instance, wait=False)
                    if st.get("busy") or st.get("session_open"):
                        raise OperatorRunningError(
                            f"operator {operator_id} is running: instance {r.instance} has "
                            f"{'an open session' if st.get('session_open') else 'a commit under way'} on worker "
                            f"{r.primary_worker}; stop its query, then drop it")
            # 2. fenced everywhere first, so that no session of the old epoch opens or commits
            # while the instances go; 3. dropped everywhere (a worker still refuses with
            # SessionBusyError if a session opened meanwhile: the metadata stays, ask again)
            for w in alive:
                cl = self.workers.client(w)
                for i in instances:
                    cl.fence(operator_id, i, epoch=epoch)
            for w in alive:
                cl = self.workers.client(w)
                out["workers"][w.id] = {str(i): cl.drop(operator_id, i, epoch=epoch) for i in instances}
            plans = [p.id for p in self.meta.plans(operator_id, open_only=True)]
            with self.meta.tx() as c:
                self.meta.delete_operator(c, operator_id)
                cur = int(self.meta.get_meta(EPOCH_FLOOR_KEY) or 1)
                self.meta.set_meta(c, EPOCH_FLOOR_KEY, str(max(cur, floor)))
            for d in (self._in_flight, self._in_flight_at, self._active):
                d.pop(operator_id, None)
            self._rebalance_at_barrier.discard(operator_id)
            out["plans_dropped"] = plans
            self.log("operator_dropped", operator=operator_id, instances=instances, workers=sorted(out["workers"]))
            logger.info("operator %s dropped: %d instances, on workers %s", operator_id, len(instances),
                        ", ".join(sorted(out["workers"])) or "none")
            return out

    def status(self) -> dict:
        now = time.monotonic()
        leaving = self.workers.draining()
        workers = []
        for w in self.meta.workers():
            seen = self._seen.get(w.id)
            entry = {"id": w.id, "address": w.address, "host": w.host, "rack": w.rack, "zone": w.zone,
                     "state": w.state, "heartbeat_age_s": None if seen is None else round(now - seen, 3),
                     "dead_since": w.dead_since}
            if w.id in leaving:
                entry["decommission"] = self._drain_status(w.id)
            workers.append(entry)
        ops = []
        for o in self.meta.operators():
            insts = []
            for r in self.meta.instances(o.operator_id):
                insts.append({"instance": r.instance, "primary": r.primary_worker, "chain": r.chain,
                              "chain_version": r.chain_version, "last_complete": r.last_complete, "bytes": r.bytes,
                              "vnodes": sum(1 for x in self.meta.assignment(o.operator_id) if x == r.instance),
                              "replica_lag": self.rm.replica_lag(r, o.last_batch)})
            ns, name = _split_id(o.operator_id)
            ops.append({"operator_id": o.operator_id, "namespace": ns, "name": name, "epoch": o.epoch,
                        "last_batch": o.last_batch,
                        "replicas": o.replicas, "num_vnodes": o.num_vnodes, "instances": insts,
                        "plans": [_plan_status(p) for p in self.meta.plans(o.operator_id, open_only=True)],
                        "autoscale": self._autoscale_status(o.operator_id)})
        plans = [_plan_status(p) for p in self.meta.plans(open_only=True)]
        return {"workers": workers, "operators": ops, "plans_in_flight": plans, "events": self.meta.events(20)}

    # ---- the transport's entry point ----------------------------------------------------------
    def handle(self, method: str, args: dict) -> Any:
        """Dispatches one request of the coordinator protocol (docs/protocol.md §8.2): a
        method api.py declares, this object's public method of that name, called with the
        request's arguments as keywords."""
        spec = METHODS.get(method)
        if spec is None:
            raise InvalidArgumentError(f"unknown coordinator method {method!r}")
        if self.rebuilding and not spec.while_rebuilding:
            raise BusyError("the coordinator is rebuilding its metadata from the workers; retry shortly")
        if not isinstance(args, dict):
            raise InvalidArgumentError("the arguments must be a JSON object")
        try:
            return getattr(self, method)(**args)
        except TypeError as e:
            raise InvalidArgumentError(f"{method}: {e}") from None

    # ---- internals ------------------------------------------------------------------------
    def _resume(self) -> None:
        """After a restart: finish what a killed coordinator left half done."""
        with self.lock:
            self.rm.resume()
            self.hm.resume()


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


def _uint(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {v!r}")


_BATCH_TIMES_KEPT = 1024  # batch times kept besides the latest (checkpoints kept are far fewer)
_BATCH_TIME_KEY = "batch_time:"  # + operator id: the metadata's entry of its batch times (a BatchTime's JSON)
_ATTEMPT_KEY = "attempt_token"  # the last attempt token begin_batch issued (docs/protocol.md §7.2)

# a failover's phases, per operator, in its failover_done event (seconds)
_FAILOVER_PHASES = ("decide_s", "plan_tx_s", "fence_s", "copy_s", "commit_tx_s", "asked")
_AUTOSCALE_KEY = "autoscale:"  # + operator id: the metadata's entry of its autoscaling (JSON)
