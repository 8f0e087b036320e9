"""A chain of Rhino operators in one ``foreachBatch``, changed while it runs (issue 47,
after Bartnik et al., *On-the-fly Reconfiguration of Query Plans for Stateful Stream
Processing Engines*: operators introduced into, and taken out of, a running data flow at a
checkpoint-aligned cut, exactly once).

``Pipeline([op1, op2])`` runs, per micro-batch b, ``op1`` on the batch's input, ``op2`` on
``op1``'s output, and so on; each stage is a :class:`~rhino.spark.operator.TransformWithState`
named by its operator's name. While batches run, any thread may ask for

- ``insert(op, after=name)``: a new stage after ``name`` (``None``: at the front);
- ``remove(name, keep_state=True)``: the stage stops running; its state is kept for a later
  ``insert`` of an operator of the same name, or dropped at the coordinator.

**The barrier.** A request is applied at the start of the next batch id the pipeline
runs, before any stage runs (a batch run again, with the same id, keeps the chain it
started with). From that batch b on, the chain is the new one:

- an inserted operator's first batch is b (``TransformWithState.start_at``): with no
  committed batch it starts from empty state, and its ``initial_state`` rides in batch b;
  with state kept from a removal it resumes that state at b, across the gap of the
  batches it did not run. The coordinator begins b as an explicit start
  (``begin_batch(first=True)``), and the attempt fence tells each worker which committed
  version b's sessions see (none, or the batch before the gap: docs/protocol.md §7.2), so
  a rerun of b rolls back to it, exactly once as any batch; b's commit records that base
  with its version, so a replay of b (no fence: Spark's after a driver restart, or the
  chain run again after a lost output) rolls back to it too;
- a removed stage's last batch is b-1. With ``keep_state=False`` its operator is dropped
  at the coordinator (``CoordinatorClient.drop_operator``, as ``rhino drop``) at the
  barrier, before b runs: its last batch has committed, and the pipeline, its only
  driver, no longer runs it. Dropping is the admin role's (docs/protocol.md §2, "Roles"),
  which the stages' task credential does not have: the pipeline is given an admin
  coordinator client for it (``Pipeline(stages, admin=...)``).

Each request returns a :class:`Modification`: ``wait(timeout)`` answers the batch it took
effect at, ``pipe.modifications`` lists them in order, and each is logged with its batch
to the ``rhino.spark`` logger.

Requests are checked when asked, against the chain as the requests before them leave it
(an unknown stage, a name already in the chain, removing the last stage are refused at
once with ``InvalidArgumentError``), so applying them at the barrier cannot fail, except
for the drop of a removed stage's state (its error is the modification's).

**Output.** ``transform(df, b)`` returns the last stage's output, materialized on the
executors (each stage's ``transform``: committed before the next stage reads it).
``for_each_batch(sink)`` is the materialized form for ``writeStream.foreachBatch``: the
stages, then ``sink(last_output, b)``. A fused sink (``TransformWithState.for_each_batch``'s
default) fuses only one stateful stage with its sink; in a chain every stage but the last
is materialized anyway, so the chain's output is too: the simplest form that is correct
for every stage.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from rhino.errors import InvalidArgumentError, OperatorRunningError

from .driver.sink import sink_with_reruns, unpersist_checkpoint
from .operator import TransformWithState

__all__ = ["Pipeline", "Modification"]

log = logging.getLogger("rhino.spark")

# A removed stage's operator is dropped at the barrier: its last batch has committed, but a
# task of a cancelled attempt may still hold a session on a primary for a moment
# (runtime/doomed.py ends it within about 0.3 s); the drop is tried again for this long.
DROP_WAIT_S = 10.0


@dataclass(eq=False)  # a request is itself, not its fields
class Modification:
    """One request to change the chain, and, once applied, the batch it took effect at.

    ``kind`` is ``"insert"`` or ``"remove"``; ``stage`` the stage's name; ``after`` (insert)
    the stage it follows (None: the front); ``keep_state`` (remove) whether its state is
    kept. ``batch`` is None until the barrier that applied it."""

    kind: str
    stage: str
    after: Optional[str] = None
    keep_state: bool = True
    requested_at: float = field(default_factory=time.time)
    batch: Optional[int] = None
    applied_at: Optional[float] = None
    error: Optional[BaseException] = None  # the drop of a removed stage's state failed
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def done(self) -> bool:
        """True once the modification was applied (at :attr:`batch`)."""
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> int:
        """The batch the modification took effect at, once it has; TimeoutError if it has
        not within ``timeout`` seconds; the drop's error if a removed stage's state could
        not be dropped (the stage is removed all the same)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.describe()}: not applied within {timeout} s (no batch began since)")
        if self.error is not None:
            raise self.error
        assert self.batch is not None
        return self.batch

    def describe(self) -> str:
        if self.kind == "insert":
            return f"insert {self.stage!r} " + (f"after {self.after!r}" if self.after else "at the front")
        return f"remove {self.stage!r} ({'state kept' if self.keep_state else 'state dropped'})"

    def _applied(self, batch: int) -> None:
        self.batch, self.applied_at = batch, time.time()
        self._done.set()


class Pipeline:
    """An ordered chain of named stateful stages, run per micro-batch, changed at batch
    barriers (the module docstring). Thread-safe: ``insert`` and ``remove`` may be called
    from any thread while ``transform`` runs a batch."""

    def __init__(self, stages: Sequence[TransformWithState], *, admin: Any = None) -> None:
        """``stages``: the chain's operators, in order. ``admin``: a coordinator client with
        the admin role (``rhino.coordinator.client.connect_coordinator(address,
        secret=<the cluster's root secret>)``), needed only to drop a removed stage's state
        (``remove(name, keep_state=False)``)."""
        stages = list(stages)
        if not stages:
            raise InvalidArgumentError("a Pipeline needs at least one stage")
        names: list[str] = []
        for op in stages:
            names.append(_stage_name(op))
            if names.count(names[-1]) > 1:
                raise InvalidArgumentError(f"two stages are named {names[-1]!r}: a stage's name is its "
                                           "operator's, which holds its state")
        self._lock = threading.Lock()  # guards the requests and the chain they are checked against
        self._stages: list[TransformWithState] = stages  # GUARDED_BY(_lock); changed at barriers only
        self._pending: list[tuple[Modification, Optional[TransformWithState]]] = []  # GUARDED_BY(_lock)
        self._planned: list[str] = names  # GUARDED_BY(_lock): the chain once the pending requests apply
        self._run_lock = threading.Lock()  # one batch at a time
        self._batch: Optional[int] = None  # the batch id the last barrier was at
        self._admin = admin
        self.modifications: list[Modification] = []  # every request, in the order asked

    # ---- what the chain is ------------------------------------------------------------------
    @property
    def stages(self) -> list[TransformWithState]:
        """The stages that run now, in order (a copy)."""
        with self._lock:
            return list(self._stages)

    @property
    def names(self) -> list[str]:
        return [_stage_name(op) for op in self.stages]

    def stage(self, name: str) -> TransformWithState:
        """The running stage named ``name``; InvalidArgumentError if none is."""
        for op in self.stages:
            if _stage_name(op) == name:
                return op
        raise InvalidArgumentError(f"no stage {name!r} runs in the pipeline (its stages: {self.names})")

    # ---- requests (any thread) ------------------------------------------------------------------
    def insert(self, op: TransformWithState, *, after: Optional[str] = None) -> Modification:
        """Asks for ``op`` to run after stage ``after`` (None: first) from the next batch
        barrier: its first batch is that batch, from empty state (and its initial state),
        or from the state kept when a stage of its name was removed."""
        if not isinstance(op, TransformWithState):
            raise InvalidArgumentError(f"a stage is a rhino.spark.transform_with_state operator, not "
                                       f"{type(op).__name__}")
        name = _stage_name(op)
        with self._lock:
            if name in self._planned:
                raise InvalidArgumentError(f"a stage named {name!r} is already in the pipeline (or asked for): "
                                           "a stage's name is its operator's, which holds its state")
            if after is not None and after not in self._planned:
                raise InvalidArgumentError(f"no stage {after!r} to insert {name!r} after (the pipeline's stages, "
                                           f"with the requests not yet applied: {self._planned})")
            at = 0 if after is None else self._planned.index(after) + 1
            self._planned.insert(at, name)
            return self._ask(Modification("insert", name, after=after), op)

    def remove(self, name: str, *, keep_state: bool = True) -> Modification:
        """Asks for stage ``name`` to stop running from the next batch barrier; its state is
        kept (for a later :meth:`insert` of an operator of that name, which resumes it) or,
        with ``keep_state=False``, its operator is dropped at the coordinator there."""
        with self._lock:
            if name not in self._planned:
                raise InvalidArgumentError(f"no stage {name!r} to remove (the pipeline's stages, with the "
                                           f"requests not yet applied: {self._planned})")
            if not keep_state and self._admin is None:
                raise InvalidArgumentError(f"removing {name!r} with keep_state=False drops its operator at the "
                                           "coordinator, which is the admin role's: give the pipeline an admin "
                                           "client, Pipeline(stages, admin=connect_coordinator(address, "
                                           "secret=<the cluster's root secret>)), or keep the state and drop it "
                                           "later with rhino drop")
            if len(self._planned) == 1:
                raise InvalidArgumentError(f"{name!r} is the pipeline's last stage: a pipeline runs at least one "
                                           "(stop the query instead)")
            self._planned.remove(name)
            return self._ask(Modification("remove", name, keep_state=bool(keep_state)), None)

    def _ask(self, m: Modification, op: Optional[TransformWithState]) -> Modification:  # REQUIRES: _lock
        self._pending.append((m, op))
        self.modifications.append(m)
        log.info("rhino.spark pipeline: %s asked; it takes effect at the next batch", m.describe())
        return m

    # ---- one batch ------------------------------------------------------------------------------
    def transform(self, df: Any, batch_id: int) -> Any:
        """Runs batch ``batch_id`` through the chain: the barrier first (the requests asked
        since the last batch), then each stage on the previous one's output. Returns the last
        stage's output (materialized on the executors, valid until that stage's next batch)."""
        b = int(batch_id)
        with self._run_lock:
            stages = self._barrier(b)
            out = df
            for op in stages:
                out = op.transform(out, b)
            return out

    def for_each_batch(self, sink: Optional[Callable[[Any, int], None]] = None, *,
                       max_attempts: int = 5) -> Callable[[Any, int], None]:
        """The function for ``writeStream.foreachBatch``: the chain, then ``sink(output, b)``
        with the last stage's materialized output (no sink: the output is dropped). Sinks
        must be idempotent by batch id. If the sink fails because part of the output was
        lost with an executor, the chain runs the batch again (the stages that committed it
        replay it from b-1) and the sink is called again, up to ``max_attempts`` times."""

        def fn(df: Any, batch_id: int) -> None:
            sink_with_reruns(self.transform, sink, df, int(batch_id), attempts=max_attempts, what="pipeline")

        return fn

    def _barrier(self, b: int) -> list[TransformWithState]:
        """Applies the requests asked since the last barrier, at batch ``b``; returns the
        chain to run. A batch id run again keeps its chain: its requests wait for the next."""
        if b == self._batch:
            with self._lock:
                return list(self._stages)
        with self._lock:
            pending, self._pending = self._pending, []
            stages = list(self._stages)
        for m, op in pending:
            if m.kind == "insert":
                assert op is not None
                at = 0 if m.after is None else [_stage_name(s) for s in stages].index(m.after) + 1
                op.start_at(b)
                stages.insert(at, op)
            else:
                gone = next(s for s in stages if _stage_name(s) == m.stage)
                stages.remove(gone)
                # its last output (batch b-1's, which the sink has read) is not read again:
                # free its blocks on the executors, as its own next batch would have
                out, gone.last_output = gone.last_output, None
                if out is not None:
                    unpersist_checkpoint(out, gone.operator_id)
                if not m.keep_state:
                    m.error = _drop(self._admin, gone)
            with self._lock:
                self._stages = list(stages)
            m._applied(b)
            log.info("rhino.spark pipeline: %s at batch %d; the chain is now %s%s", m.describe(), b,
                     " -> ".join(_stage_name(s) for s in stages),
                     f" (the drop failed: {m.error})" if m.error is not None else "")
        self._batch = b
        return stages


def _stage_name(op: TransformWithState) -> str:
    """A stage's name: its operator's name (in its namespace)."""
    return op.config.name or op.operator_id


def _drop(admin: Any, op: TransformWithState) -> Optional[BaseException]:
    """Drops a removed stage's operator at the coordinator (``rhino drop``), through the
    ``admin`` client; None, or the error it gave up with. ``idle_s=0``: the pipeline is the
    operator's only driver and has stopped running it, its last batch committed."""
    deadline = time.monotonic() + DROP_WAIT_S
    while True:
        try:
            admin.drop_operator(op.operator_id, idle_s=0)
            op.close()
            return None
        except OperatorRunningError as e:  # a session of a cancelled task still open
            if time.monotonic() > deadline:
                return e
            time.sleep(0.2)
        except Exception as e:  # noqa: BLE001 - the stage is removed all the same; the error is reported
            return e
