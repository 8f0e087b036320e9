"""The driver's side of a micro-batch (design §5): ``begin_batch`` at the
coordinator (the barrier where due handovers run; it returns the placement), the
batch's attempt, then the commit at the coordinator with the epoch the instances
committed at. The coordinator refuses that commit if the operator moved to a new
epoch meanwhile (a failover restores an instance to its last complete
checkpoint, b-1, even if it had committed b), and the whole batch runs again:
every instance rolls back to b-1, so state and output are those of one run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Optional, TypeVar

from ..coordinator.types import CommitAnswer, Placement
from ..errors import InvalidArgumentError, RhinoError, StaleEpochError
from .classify import Action, classify
from .report import batch_report

__all__ = ["BatchDriver", "Attempt", "AttemptResult", "BatchOutcome", "RerunBatch"]

T = TypeVar("T")


class RerunBatch(Exception):
    """Raised by an attempt that cannot be committed (cancelled, incomplete): the
    driver runs the batch again, after ``retry_sleep`` if ``sleep``."""

    def __init__(self, reason: str, *, sleep: bool = True) -> None:
        super().__init__(reason)
        self.sleep = sleep


@dataclass
class Attempt:
    """One attempt at a batch: the placement ``begin_batch`` gave it."""

    batch: int
    number: int  # 1-based
    placement: Placement
    replay: bool  # b is the last committed batch run again (a Spark replay): no commit
    errors: list[str]  # the batch's errors so far; an attempt may add its own notes
    begun_at: float = 0.0  # time.time() before begin_batch
    started_at: float = 0.0  # time.time() after it

    @property
    def epoch(self) -> int:
        return self.placement.epoch


@dataclass
class AttemptResult(Generic[T]):
    """What an attempt reports for the commit: the epoch every instance committed at
    (the smallest seen), per instance its commit stats (``checkpoint_bytes``), the
    per-vnode load, and the caller's own result."""

    epoch: int
    instances: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)
    value: Optional[T] = None


@dataclass
class BatchOutcome(Generic[T]):
    """A batch the coordinator accepted: its last attempt, that attempt's result, and
    the errors of the attempts before it."""

    attempt: Attempt
    result: AttemptResult[T]
    errors: list[str]
    ran_at: float  # time.time() when the attempt's work ended
    committed_at: float  # time.time() after the commit


class BatchDriver:
    """Runs batches of one operator against the coordinator.

    ``replay`` accepts a batch that is the operator's last committed one (Spark runs
    the last batch again after a driver restart: our commit landed, Spark's did not):
    it runs again, every instance rolling back to b-1, and is not committed again.
    """

    def __init__(self, coordinator: Any, operator_id: str, *, max_attempts: int = 20, retry_sleep: float = 0.25,
                 replay: bool = False, name: Optional[str] = None,
                 clock: Optional[Callable[[], int]] = None) -> None:
        #: ``clock()`` -> ms: when given, each batch gets a batch time at the coordinator
        #: (the placement's ``batch_time_ms``), fixed at its first begin and the same
        #: when it runs again or is replayed
        self.clock = clock
        self.coordinator = coordinator
        self.operator_id = operator_id
        self.max_attempts = max_attempts
        self.retry_sleep = retry_sleep
        self.replay = replay
        self.name = name or operator_id
        self._no_reports = False  # the coordinator takes no autoscaler reports (an older one)

    def begin(self, batch: int, *, first: bool = False) -> Placement:
        """``begin_batch``: the placement to route batch ``batch`` with. ``first``: the
        operator is started at ``batch`` (``Coordinator.begin_batch``), passed only when true."""
        kw: dict[str, Any] = {} if self.clock is None else {"batch_time_ms": int(self.clock())}
        if first:
            kw["first"] = True
        return self.coordinator.begin_batch(self.operator_id, batch, **kw)

    def begin_or_replay(self, batch: int, *, first: bool = False) -> tuple[Placement, bool]:
        """The batch's placement, and whether b is a replay of the last committed batch."""
        try:
            return self.begin(batch, first=first), False
        except InvalidArgumentError:
            if not self.replay:
                raise
            p = self.coordinator.placement(self.operator_id)
            if p.last_batch == batch:
                if self.clock is not None:  # the time its first run was given, as begin_batch answers it
                    p = replace(p, batch_time_ms=p.batch_time_of(batch))
                return p, True
            raise

    def commit(self, batch: int, *, epoch: int, instances: Optional[dict] = None,
               load: Optional[dict] = None, report: Optional[dict] = None) -> CommitAnswer:
        """Reports batch ``batch`` done at ``epoch``: every instance committed it in barrier
        mode. Raises StaleEpochError if the operator has moved to another epoch since
        (run the batch again). ``report``: the batch's measurements for the coordinator's
        autoscaler (:func:`.report.batch_report`), passed only when there is one."""
        if report is None or self._no_reports:
            return self.coordinator.commit_batch(self.operator_id, batch, instances=instances or {},
                                                 load=load or {}, epoch=epoch)
        try:
            return self.coordinator.commit_batch(self.operator_id, batch, instances=instances or {},
                                                 load=load or {}, epoch=epoch, report=report)
        except InvalidArgumentError as e:
            if "'report'" not in str(e):
                raise
            # a coordinator of before the autoscaler: it refused the whole call, so nothing
            # was committed; commit without reports from now on
            self._no_reports = True
            return self.commit(batch, epoch=epoch, instances=instances, load=load)

    def run(self, batch: int, attempt: Callable[[Attempt], AttemptResult[T]], *,
            first: bool = False) -> BatchOutcome[T]:
        """Runs ``attempt`` until the coordinator accepts the batch's commit. ``first``: the
        operator is started at ``batch`` (each attempt's ``begin_batch`` says so: an
        operator inserted into a running chain, or re-added after a gap; issue 47).

        An attempt that raises :class:`RerunBatch`, or an error that :func:`classify`
        does not call RAISE, is followed by another (a fresh ``begin_batch``: the
        coordinator's current placement); a RAISE error propagates as itself. After
        ``max_attempts`` a RhinoError names the last errors."""
        errors: list[str] = []
        # The batch began at its first attempt's begin: the autoscaler's input rate is the
        # batch's records over the time between two such begins (reruns included).
        began = time.time()
        for n in range(1, self.max_attempts + 1):
            begun_at = time.time()
            try:
                placement, replay = self.begin_or_replay(batch, first=first)
            except RhinoError as e:
                self._failed(e, f"attempt {n}: begin_batch: {type(e).__name__}: {e}", errors)
                continue
            a = Attempt(batch=batch, number=n, placement=placement, replay=replay, errors=errors, begun_at=begun_at,
                        started_at=time.time())
            try:
                res = attempt(a)
            except RerunBatch as e:
                errors.append(f"attempt {n}: {e}")
                if e.sleep:
                    time.sleep(self.retry_sleep)
                continue
            except Exception as e:  # noqa: BLE001 - classified, and raised again unless a rerun helps
                self._failed(e, f"attempt {n}: {type(e).__name__}: {e}", errors)
                continue
            ran_at = time.time()
            try:
                if not a.replay:
                    # Each instance's records and busy time come with its commit stats
                    # (``records``/``rows_in``, ``busy_s`` or the task's phases: report.py).
                    report = batch_report(res.instances or {}, began_unix=began, ended_unix=ran_at)
                    self.commit(batch, epoch=res.epoch, instances=res.instances, load=res.load, report=report)
            except (StaleEpochError, InvalidArgumentError) as e:
                # A reconfiguration during the batch (a failover may have restored an instance
                # to b-1 after it committed b): run the whole batch again. InvalidArgument: an
                # earlier commit of b landed (its answer was lost); begin_batch tells.
                errors.append(f"attempt {n}: commit_batch: {type(e).__name__}: {e}")
                continue
            return BatchOutcome(attempt=a, result=res, errors=errors, ran_at=ran_at, committed_at=time.time())
        raise RhinoError(f"{self.name}: batch {batch} failed {self.max_attempts} times: " + " | ".join(errors[-3:]))

    def _failed(self, e: Exception, note: str, errors: list[str]) -> None:
        if classify(e) is Action.RAISE:
            raise e
        errors.append(note)
        time.sleep(self.retry_sleep)
