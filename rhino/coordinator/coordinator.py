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

import logging
import threading
from dataclasses import replace
from typing import Any, Callable, Optional

from ..errors import BusyError, InvalidArgumentError, RhinoError, StaleEpochError, UnknownInstanceError
from . import copies, membership, state_schema
from .api import METHODS
from .autoscaler import DEFAULT_STRATEGY, validate_report
from .autoscaling import Autoscaling
from .batches import DROP_IDLE_S, BatchLedger
from .decommission import Decommissioner
from .drop import drop_operator
from .gateway import WorkerGateway
from .handover_manager import HandoverManager
from .liveness import FailureDetector
from .metadata import Metadata
from .replication_manager import ReplicationManager
from .status import cluster_status
from .types import CommitAnswer, InstancePlacement, Placement

__all__ = ["Coordinator"]

logger = logging.getLogger("rhino.coordinator")


class Coordinator:
    """The Replication and Handover Managers over one metadata directory.

    ``heartbeat_timeout``: a worker silent that long is declared dead, fenced
    and its instances failed over. ``request_timeout`` bounds one request to a
    worker (a bulk copy excepted: ``copy_timeout``).

    What it holds, and who is given what: ``meta`` (:class:`.Metadata`, all
    SQL); ``workers`` (:class:`.WorkerGateway`: the clients of the workers,
    the live workers and their addresses); ``rm`` (:class:`.ReplicationManager`)
    and ``hm`` (:class:`.HandoverManager`), each given ``meta``, ``workers``
    and the log; ``detector`` (:class:`.FailureDetector`: heartbeats and the
    thread that acts on silence); ``batches`` (:class:`.BatchLedger`: batches in
    flight, attempt tokens, batch times); ``autoscaling``, ``decommissions`` and
    ``copies`` (their modules). The coordinator itself keeps the lock every
    decision is taken under, and is the one place the protocol's methods are.
    """

    def __init__(self, directory: str, *, secret: bytes | str, heartbeat_timeout: float = 3.0,
                 request_timeout: float = 60.0, copy_timeout: float = 600.0, handover_timeout: float = 120.0,
                 client_id: str = "coordinator", log: Optional[Callable[..., None]] = None,
                 detector_interval: float = 0.1, rebuilding: bool = False, tls: Any = None,
                 handover: str = "copy-first") -> None:
        if heartbeat_timeout <= 0 or request_timeout <= 0:
            raise InvalidArgumentError("timeouts must be positive")
        if handover not in ("copy-first", "early"):
            raise InvalidArgumentError(f"handover must be 'copy-first' or 'early', not {handover!r}")
        self.meta = Metadata(directory)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self._log = log or (lambda event, **f: None)
        self.lock = threading.RLock()  # every decision, in order
        self.workers = WorkerGateway(self.meta, secret=secret, client_id=client_id, request_timeout=request_timeout,
                                     copy_timeout=copy_timeout, handover_timeout=handover_timeout, tls=tls)
        self.rm = ReplicationManager(self.meta, self.workers, self.log)
        self.hm = HandoverManager(self.meta, self.workers, self.log, early=handover == "early")
        self.batches = BatchLedger(self.meta)
        self.autoscaling = Autoscaling(self.meta, self.workers, self.hm, self.log)
        self.decommissions = Decommissioner(self.meta, self.workers, lambda: self.rm, self.batches, self.log)
        self.copies = copies.CopiesGuard(self.meta, self.workers.alive_ids, lambda: self.rm.repair_all(), self.lock,
                                         self.log)
        self.detector = FailureDetector(self.meta, timeout=self.heartbeat_timeout, lock=self.lock, log=self.log,
                                        declare_dead=self.declare_dead, rm=lambda: self.rm)
        # --rebuild: until the metadata is rebuilt from the workers, only
        # registrations, heartbeats and status are served.
        self.rebuilding = rebuilding
        self.detector.start(detector_interval, [w.id for w in self.meta.workers() if w.alive],
                            grace=max(5.0, 2 * self.heartbeat_timeout) - self.heartbeat_timeout)
        self._resume()

    @property
    def rebuilding(self) -> bool:
        """Rebuilding the metadata from the workers (``--rebuild``): nobody is declared
        dead meanwhile, and only the methods api.py marks are served."""
        return self.detector.paused

    @rebuilding.setter
    def rebuilding(self, value: bool) -> None:
        self.detector.paused = bool(value)

    # ---- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        self.detector.stop()
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
        return membership.register(self, worker_id, address, unix_socket=unix_socket, rack=rack, zone=zone,
                                   incarnation=incarnation)

    def heartbeat(self, worker_id: str, incarnation: str) -> dict:
        """A worker's heartbeat (liveness.py): refused for a worker declared dead or an older
        incarnation, which must register again."""
        return self.detector.heartbeat(worker_id, incarnation)

    def declare_dead(self, worker_id: str, reason: str) -> dict:
        """Fences a worker off: it is marked dead, every operator with an
        instance or a replica on it moves to a new epoch, its primaries fail
        over to chain members and its chains are repaired."""
        return membership.declare_dead(self, worker_id, reason)

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
        self.batches.touch(operator_id)
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
        self.batches.touch(operator_id)
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
        return Placement(operator_id=operator_id, epoch=op.epoch, num_vnodes=op.num_vnodes,
                         num_key_groups=op.num_key_groups, seed=op.seed, replicas=op.replicas,
                         last_batch=op.last_batch, assignment=tuple(self.meta.assignment(operator_id)),
                         instances=insts, batch_time=self.batches.stored_batch_time(operator_id))

    def begin_batch(self, operator_id: str, batch: int, *, batch_time_ms: Optional[int] = None,
                    first: bool = False) -> dict:
        """The barrier before ``batch``: runs the handover steps due after the
        last committed batch (docs/design.md §4), then returns the placement to
        route the batch with. ``batch`` is the next batch, or the same one again
        (a re-execution).

        ``first``: the driver starts the operator at ``batch`` (issue 47: an
        operator inserted into a running chain, or re-added after a removal).
        ``batch`` may then be any batch after the last committed one: a new
        operator's first batch b > 0, whose sessions see no version, or a gap
        after the batch it last committed, whose state its sessions see (the
        placement's ``last_batch``, which the attempt fence carries to the
        workers: docs/protocol.md §7.2). Only an explicit start may skip
        batches, so a driver's mistake (a fresh Spark checkpoint) is still
        refused.

        ``batch_time_ms``: the caller's clock at the batch's first begin. The
        first value given for a batch is kept, and every begin of that batch
        answers it as the placement's ``batch_time_ms`` (a batch that runs again
        keeps its time: TTL and processing-time timers see the same time, design
        §5). Never earlier than the previous batch's time."""
        _uint("batch", batch)
        if batch_time_ms is not None and (not isinstance(batch_time_ms, int) or isinstance(batch_time_ms, bool)):
            raise InvalidArgumentError(f"batch_time_ms must be an integer (ms), not {batch_time_ms!r}")
        if not isinstance(first, bool):
            raise InvalidArgumentError(f"first must be a boolean, not {first!r}")
        self.batches.touch(operator_id)
        with self.lock:
            op = self.meta.require_operator(operator_id)
            nxt = 0 if op.last_batch is None else op.last_batch + 1
            if not _begins(batch, op.last_batch, first):
                start = " or later (first=true: an explicit start)" if first else ""
                raise InvalidArgumentError(f"operator {operator_id} completed batch {op.last_batch}: "
                                           f"the next batch is {nxt}{start}, not {batch}")
            if op.last_batch is not None:
                # the barrier after the last committed batch: batch - 1, but across a gap
                # the instances are at the batch before it (issue 47)
                self.hm.run_due(operator_id, op.last_batch)
            # the barrier before `batch`: off the workers being decommissioned, onto those that joined
            self.decommissions.drain(operator_id, f"decommission (barrier before batch {batch})")
            if operator_id in self.batches.rebalance_at_barrier:
                self.batches.rebalance_at_barrier.discard(operator_id)
                try:
                    self.rm.rebalance_replicas(operator_id)
                except RhinoError as e:  # a worker died meanwhile: the detector handles that
                    self.log("rebalance_failed", operator=operator_id, error=f"{type(e).__name__}: {e}")
            policy = copies.load_policy(self.meta, operator_id)
            short = self.copies.short(operator_id, policy)
        if short and policy.strict:
            short = self.copies.wait(operator_id, batch, policy)  # [] or ResourceExhaustedError
        with self.lock:
            op = self.meta.require_operator(operator_id)
            if not _begins(batch, op.last_batch, first):  # committed meanwhile (a second driver)
                raise InvalidArgumentError(f"operator {operator_id} completed batch {op.last_batch} while batch "
                                           f"{batch} waited for its copies")
            if short:
                self.log("batch_short_of_copies", operator=operator_id, batch=batch,
                         instances={s.instance: s.copies for s in short}, min_copies=policy.min_copies)
                with self.meta.tx() as c:
                    self.meta.event(c, "batch_short_of_copies", operator=operator_id, batch=batch,
                                    instances=[s.to_wire() for s in short])
            self.batches.begun(operator_id, batch)
            placement = replace(self._placement(operator_id), attempt=self.batches.attempt_token(),
                                short_of_copies=tuple(short))
            if batch_time_ms is not None:
                placement = replace(placement, batch_time_ms=self.batches.batch_time(operator_id, batch, batch_time_ms))
            return placement.to_wire()

    def state_schema(self, operator_id: str) -> dict:
        """The operator's state schema document (its state variables, their ids and
        schema versions; written by ``rhino.spark``), and its revision (0: none yet)."""
        self.batches.touch(operator_id)
        return state_schema.load(self.meta, operator_id)

    def set_state_schema(self, operator_id: str, doc: dict, revision: int) -> dict:
        """Replaces the state schema document if it is still at ``revision`` (a
        compare-and-set: two drivers cannot both register a change); answers the new
        revision. The coordinator stores the document; the caller checks compatibility."""
        self.batches.touch(operator_id)
        with self.lock:
            return state_schema.replace_if_at(self.meta, operator_id, doc, revision)

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
        self.batches.touch(operator_id)
        with self.lock:
            op = self.meta.require_operator(operator_id)
            nxt = 0 if op.last_batch is None else op.last_batch + 1
            # after the next batch only the batch begun at an explicit start (begin_batch's
            # first: issue 47), which this coordinator began
            if batch != nxt and not (batch > nxt and self.batches.in_flight_batch(operator_id) == batch):
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
            self.batches.record_commit(operator_id, batch, instances or {}, load or {})
            # The batch is committed: nothing below may undo or refuse it.
            decision = None
            if report_error is not None:
                self.log("report_refused", operator=operator_id, batch=batch, error=report_error)
                logger.warning("operator %s batch %d: report ignored: %s", operator_id, batch, report_error)
            elif rep is not None:
                decision = self.autoscaling.after_commit(operator_id, batch, rep)
            return CommitAnswer(operator_id=operator_id, last_batch=batch, report_error=report_error,
                                autoscale=decision).to_wire()

    def report_unreachable(self, operator_id: str, instance: int, worker_id: Optional[str] = None) -> dict:
        """A task could not reach an instance's primary. If the worker does not
        answer the coordinator either, it is declared dead at once (no waiting
        for the heartbeat timeout) and the instance fails over. Returns the
        placement to retry with."""
        self.batches.touch(operator_id)
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
                out["plans"], out["skipped"] = self.hm.plan_balance_all(operator_id, strategy=strategy,
                                                                        after_batch=after_batch)
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
            return self.autoscaling.configure(operator_id, enabled, min_parallelism, max_parallelism,
                                              utilization=utilization, cooldown_batches=cooldown_batches,
                                              strategy=strategy, cores_per_worker=cores_per_worker,
                                              scale_in_margin=scale_in_margin, scale_in_reports=scale_in_reports)

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
        with self.lock:
            return self.decommissions.start(worker_id, force)

    # ---- dropping an operator (issue 45) ----------------------------------------------------
    def drop_operator(self, operator_id: str, *, idle_s: float = DROP_IDLE_S) -> dict:
        """Drops an operator: every live worker removes every trace of each of its
        instances (protocol §7.1 ``drop``: live state, checkpoints, standby, fences),
        then its metadata goes in one transaction (every row and event naming it). A
        query that runs it is refused (OperatorRunningError: :meth:`_running`), and so
        is a worker's drop while a session is open (SessionBusyError): the metadata
        stays, and the drop can be asked again. A worker that is dead now keeps its copy
        (``not_reached``); nothing names it any more. New operators start above every
        epoch and chain version the dropped one used (workers may still remember them)."""
        with self.lock:
            return drop_operator(self.meta, self.workers, self.batches, self.log, operator_id, idle_s)

    def status(self) -> dict:
        """The workers, the operators with their instances and open plans, and the latest
        events, as ``rhino status`` shows them (status.py)."""
        return cluster_status(self)

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


def _uint(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {v!r}")


def _begins(batch: int, last_batch: Optional[int], first: bool) -> bool:
    """Whether ``begin_batch`` may begin ``batch`` of an operator whose last committed
    batch is ``last_batch``: the next one, or, at an explicit start (``first``), any
    later one (issue 47). The last committed batch itself is not begun again: the
    engine replays it (rhino/engine/driver.py)."""
    nxt = 0 if last_batch is None else last_batch + 1
    return batch == nxt or (first and batch >= nxt)
