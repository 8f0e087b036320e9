"""One instance's part of a batch: a session on its primary at the placement's
epoch, and what to do when that fails (design §5, protocol §7.2, §7.5).

A primary that cannot be reached is reported to the coordinator, which fails the
instance over to a chain member if it cannot reach it either; the run then waits
for the newer epoch and runs again on the new primary, from b-1. The driver
accepts the batch only if the epoch did not change meanwhile, so a takeover
during a batch reruns the whole batch: exactly-once either way.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, TypeVar

from ..client.session import Session
from ..coordinator.types import InstancePlacement, Placement
from ..errors import RhinoError, RhinoTimeoutError, StaleEpochError, UnknownInstanceError
from .classify import Action, classify
from .clients import WorkerClients, primary_address

__all__ = ["InstanceRun"]

T = TypeVar("T")


class InstanceRun:
    """Runs ``work(session, placement)`` in a session of instance ``instance`` for
    ``batch`` on its primary, handling failures by :func:`~rhino.engine.classify`:

    - RETRY (the instance has an open session, e.g. of a cancelled attempt): again
      after ``busy_sleep``, until ``failover_wait_s`` has passed;
    - FAILOVER (the worker is unreachable): the client is dropped and the primary
      reported to the coordinator; then, with ``wait_for_failover``, the run waits
      for the coordinator's newer epoch and runs again on the new primary, else the
      error is raised (the driver reruns the batch);
    - RERUN (a stale epoch): with ``wait_for_failover`` likewise waits for the newer
      placement, else raises;
    - RAISE: raised as itself.

    The newer placement must keep the routing table (the rows were routed by the
    old one), or StaleEpochError is raised for the driver to rerun the batch.
    ``coordinator`` is a function returning the coordinator client (called only
    when needed). After :meth:`run`, ``placement``, ``epoch``, ``info`` (the
    instance's :class:`~rhino.coordinator.InstancePlacement`, None before its first
    open), ``address``, ``local``, ``started_at`` and ``errors`` describe what ran.
    """

    def __init__(self, clients: WorkerClients, coordinator: Callable[[], Any], operator_id: str, instance: int, *,
                 batch: int, placement: Placement, epoch: Optional[int] = None, host: Optional[str] = None,
                 wait_for_failover: bool = True, failover_wait_s: float = 60.0, busy_sleep: float = 0.2,
                 grace_s: float = 10.0) -> None:
        self.clients = clients
        self.coordinator = coordinator
        self.operator_id = operator_id
        self.instance = int(instance)
        self.batch = batch
        self.placement = placement
        self.epoch = placement.epoch if epoch is None else int(epoch)
        # the attempt fence (docs/protocol.md §7.2): the token begin_batch gave this attempt
        # and the operator's last committed batch then; kept from the attempt's placement,
        # not from a newer one fetched while waiting for a failover
        self.attempt = placement.attempt
        self.committed = placement.last_batch if placement.attempt is not None else None
        self.host = host
        self.wait_for_failover = wait_for_failover
        self.failover_wait_s = failover_wait_s
        self.busy_sleep = busy_sleep
        self.grace_s = grace_s
        self.info: Optional[InstancePlacement] = None
        self.address: Optional[str] = None
        self.local = False
        self.started_at = 0.0  # time.time() before the last connect and session open
        self.errors: list[str] = []

    @property
    def primary(self) -> Optional[str]:
        """The primary worker of the last open (None before the first)."""
        return self.info.primary if self.info is not None else None

    def run(self, work: Callable[[Session, Placement], T]) -> T:
        """``work(session, placement)`` in a session of the instance, run again as the failure
        rules above say."""
        return self._retrying(lambda: self._once(work))

    def open(self) -> Session:
        """The instance's session, opened under the same rules as :meth:`run`. What the caller
        then does in it is not retried: on a failure it calls :meth:`failed` and raises (a
        Spark task that already streamed output cannot run its work again)."""
        return self._retrying(self._open_once)

    def failed(self, e: BaseException) -> None:
        """A failure in a session from :meth:`open`: a primary that cannot be reached is
        reported to the coordinator (which fails it over); the caller raises ``e``."""
        if isinstance(e, Exception) and classify(e) is Action.FAILOVER:
            self.errors.append(f"{type(e).__name__} at {self.address}: {e}")
            self.report_unreachable()

    def _retrying(self, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.failover_wait_s
        while True:
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - classified, and raised again unless handled
                action = classify(e)
                if action is Action.RAISE:
                    raise
                if action is Action.RETRY:
                    self._busy(e, deadline)
                    continue
                if action is Action.FAILOVER:
                    self.errors.append(f"{type(e).__name__} at {self.address}: {e}")
                    self.report_unreachable()
                else:
                    self.errors.append(f"{type(e).__name__}: {e}")
                if not self.wait_for_failover:
                    raise
                self._newer_placement(deadline)

    def _once(self, work: Callable[[Session, Placement], T]) -> T:
        with self._open_once() as s:
            return work(s, self.placement)

    def _open_once(self) -> Session:
        self.info = self.placement.instances[self.instance]
        if not self.info.address and not self.info.unix_socket:
            raise UnknownInstanceError(f"instance {self.instance} of {self.operator_id} has no primary "
                                       f"(epoch {self.epoch})")
        self.address, self.local = primary_address(self.info, self.host)
        self.started_at = time.time()
        client = self.clients.get(self.address)
        return client.session(self.operator_id, self.instance, batch=self.batch, epoch=self.epoch,
                              attempt=self.attempt, committed=self.committed)

    def _busy(self, e: Exception, deadline: float) -> None:
        # A task of an attempt the driver cancelled (a new epoch) may still hold the
        # instance's session: the worker aborts it when that task's connection closes.
        if time.monotonic() > deadline:
            raise e
        msg = f"{type(e).__name__}: {e}"
        if not self.errors or self.errors[-1] != msg:
            self.errors.append(msg)
        time.sleep(self.busy_sleep)

    def report_unreachable(self) -> None:
        """The primary, or a member of its chain (a barrier commit waits for the chain), is
        gone: drop its client and report the primary. If the coordinator cannot reach it
        either, it fails the instance over at once; a dead chain member is found by its
        missed heartbeats. Either way the epoch moves on."""
        self.clients.drop(self.address)
        try:
            self.coordinator().report_unreachable(self.operator_id, self.instance, self.primary)
        except RhinoError as e2:
            self.errors.append(f"report_unreachable: {e2}")

    def _newer_placement(self, deadline: float) -> None:
        """Waits until the coordinator has moved on to a new epoch (a failover, a chain
        repair) and takes its placement; after ``grace_s`` without one (a passing network
        error), runs again on the same placement."""
        until = min(deadline, time.monotonic() + self.grace_s)
        p = None
        while True:
            try:
                p = self.coordinator().placement(self.operator_id)
            except RhinoError:
                p = None
            if p is not None and p.epoch > self.epoch:
                if p.assignment != self.placement.assignment:
                    raise StaleEpochError(f"the routing table of {self.operator_id} changed during batch "
                                          f"{self.batch} (epoch {self.epoch} -> {p.epoch}): the batch runs again")
                mine = p.instances.get(self.instance)
                if mine is not None and mine.address:
                    self.placement, self.epoch = p, p.epoch
                    return
            if time.monotonic() > until:
                if time.monotonic() > deadline:
                    raise RhinoTimeoutError(
                        f"instance {self.instance} of {self.operator_id}: no new placement after "
                        f"{self.failover_wait_s:g} s (the coordinator is at epoch {p.epoch if p else '?'})")
                return
            time.sleep(0.1)
