"""One micro-batch of a Rhino stateful operator, on the driver.

Per micro-batch b (Spark's batch id; checkpoint id = b, design §5):

1. ``begin_batch(b)`` at the coordinator (through the engine,
   :class:`rhino.engine.BatchDriver`): the barrier where due handovers run; it
   returns the routing table and each instance's primary.
2. Route: each row is tagged with its instance's shuffle token, in the JVM
   (``KeyRouter``) or by a ``mapInArrow`` pass (``runtime/routing.py``), and ``repartition(P, token)`` makes partition p =
   instance ``placement.instance_order()[p]``, the p-th instance number in order
   (numbers have gaps once a rescale retired some).
3. Pin: partition p prefers the host of its instance's primary (the JVM helper
   in ``scheduling/``), so its task reaches the worker over the Unix socket.
4. Run: ``mapInArrow(run_partition)``, one task per instance
   (``runtime/task.py``): one session, one prefetch, the processor per key,
   one barrier commit. Each task also returns one meta row (its stats).
5. The engine commits b at the coordinator with the epoch E the tasks committed
   at: refused if a reconfiguration happened during the batch; then the whole
   batch runs again (every instance rolls back to b-1 first), which is what
   makes a host loss mid-batch exactly-once. A failed Spark job runs again only
   if the engine's classification of the task's exception says so
   (:func:`rhino.engine.classify_failure`); a real error is raised.
6. The output stays on the executors; only each task's small meta row reaches the
   driver (``runtime/meta.py``). ``for_each_batch(sink)`` fuses the sink with the
   stateful stage, as Spark's own operator feeds its sink: the sink gets the
   stateful stage's lazy output, its own job runs the tasks (step 4), and step 5
   follows the sink. ``transform`` (and ``for_each_batch(sink, materialize=True)``)
   materializes the output once, in the executors' block managers
   (``localCheckpoint``), after step 5, and hands it on as a distributed DataFrame.
   Sinks must be idempotent by batch id, as ``foreachBatch`` sinks are.

Fused, a task that Spark runs again (a lost executor, a second action of the sink)
starts from b-1 in a session of the same epoch, with the batch's fixed time and
watermark: the same output, as with Spark's own operator (for a deterministic
processor). A host lost meanwhile moves the operator to a new epoch, so the commit
is refused and the whole batch, sink included, runs again. The rerun's stateful
tasks do not wait for the cancelled sink call to return (a cancelled job's error takes
0.2-0.5 s to reach Python on a loaded host): while it is still returning, the rerun
materializes its output and hands it to the sink once that call has returned. The
sink is never called twice at once.

Materialized, the output DataFrame never runs the stateful tasks again: its lineage
ends at the checkpoint. If an executor holding part of it is lost before the sink has
read it, reading it fails (Spark's ``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``);
``for_each_batch`` then runs the whole batch again (every instance rolls back to b-1,
as below) and calls the sink again with the same batch id. Exactly-once either way.

A Spark replay of the last batch (the driver died after our commit but before
Spark's) runs b again the same way: same state, same output.
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import partial
from typing import Any, Callable, Optional

from rhino.coordinator.types import Placement
from rhino.errors import InvalidArgumentError
from rhino.engine import (BUSY_FIELDS, Action, Attempt, AttemptResult, BatchDriver, RerunBatch,
                          classify_job_failure, first_error_line)

from ..errors import FreshCheckpointError, InputLostError, output_lost
from ..runtime.initial import SIDE, with_initial_state
from ..runtime.meta import new_meta_accumulator, seen, take
from ..runtime.convert import output_arrow_schema
from ..runtime.task import run_partition
from .attempt import AttemptContext
from .config import OperatorConfig
from .control import Control
from .pinning import Pinner
from .progress import JobDescription, describe_attempt, describe_commit, post_to_spark_ui
from .report import BatchReport, ReportRing
from .routing import BatchInput, Router
from .sink import Sink, SinkRunner, materialize
from .watermark import HadoopFiles, Watermarks

__all__ = ["BatchRunner"]

log = logging.getLogger("rhino.spark")

# Seconds between attempts at a batch after a failure that is worth a rerun.
RETRY_SLEEP_S = 0.5


class BatchRunner:
    """Runs an operator's micro-batches: the stages of the module docstring, one object each."""

    def __init__(self, config: OperatorConfig, control: Control, clock: Callable[[], float],
                 initial_state: Any = None) -> None:
        self.config, self.control, self.clock = config, control, clock
        # applied in the operator's first batch only (runtime/initial.py): batch 0, or the
        # batch it was explicitly started at from empty state (start_at)
        self.initial_state = initial_state
        # the batch this driver explicitly starts the operator at (start_at; issue 47), or None
        self.start_batch: Optional[int] = None
        # in the checkpoint location, through the session's Hadoop filesystem: made at the
        # first batch, which brings the SparkSession (watermark.py)
        self._watermarks: Optional[Watermarks] = None
        self._start_checked = False  # the first batch of this driver is checked against the operator's
        self.router = Router(config)
        self.pinner = Pinner(config.locality)
        self.sink = SinkRunner(config.operator_id)
        self.reports = ReportRing(config.operator_id)
        self.watch_log: list[dict] = []  # what the batch watches reported or cancelled
        self._known_hosts: Optional[set[str]] = None  # executor hosts seen last (host_loss.py)
        self._meta_acc: Any = None  # the tasks' meta rows (runtime/meta.py), one per operator
        self._action_at: Optional[float] = None  # when the last attempt called its Spark action
        # called with b at batch b's barrier, before its first attempt (the operator's swaps)
        self.barrier: Optional[Callable[[int], None]] = None
        self.swapped_from: dict[int, str] = {}  # batch -> the version a swap in it replaced

    def run(self, df: Any, b: int, sink: Optional[Sink] = None) -> Any:
        """Runs batch ``b`` to its commit; returns its output (None with ``sink``)."""
        c = self.config
        spark = df.sparkSession
        t0 = time.time()
        tz = spark.conf.get("spark.sql.session.timeZone")
        for col in c.keys + ([c.event_time] if c.event_time else []):
            if col not in df.schema.names:
                raise InvalidArgumentError(f"column {col!r} is not in the input ({df.schema.simpleString()})")
        self.control.ensure_created(df.schema, b)
        if not self._start_checked:
            check_start(c, self.control.last_batch, b, start=self.start_batch)
            self._start_checked = True
        if self.barrier is not None and (self.control.last_batch is None or b > self.control.last_batch):
            # the barrier before a batch not yet committed: a swap takes effect here (swap.py)
            self.barrier(b)
            c = self.config
        if self._watermarks is None:
            # only event time has a watermark to keep: other queries write no files
            keep = c.time_mode == "eventtime" and c.checkpoint_location
            files = HadoopFiles(spark, c.checkpoint_location) if keep else None
            # files of batches after the operator's last committed one are of a dropped life
            self._watermarks = Watermarks(c.operator_id, c.delay_ms, files, last_batch=self.control.last_batch)
        wm = self.watermarks.for_batch(b) if c.time_mode == "eventtime" else 0
        batch_input = BatchInput(self.router)
        driver = BatchDriver(self.control.coordinator(), c.operator_id, max_attempts=c.max_batch_attempts,
                             retry_sleep=RETRY_SLEEP_S, replay=True, name=f"rhino.spark {c.operator_id}",
                             clock=lambda: int(self.clock()))
        try:
            done = driver.run(b, lambda a: self._attempt(spark, df, a, wm, tz, batch_input, sink),
                              first=b == self.start_batch)
        finally:
            batch_input.release()
        copies = batch_input.copies
        a = done.attempt
        data, tasks = done.result.value
        self.watermarks.committed(b, (t.get("max_event_ms") for t in tasks))
        short = [s.to_wire() for s in a.placement.short_of_copies]
        if short:
            log.warning("rhino.spark %s: batch %d committed with fewer live copies than min_copies: %s", c.operator_id,
                        b, ", ".join(f"instance {s['instance']} had {s['copies']}" for s in short))
        self.reports.append(BatchReport(
            batch=b, epoch=max(t["epoch"] for t in tasks), attempts=a.number, watermark_ms=wm,
            rows_out=sum(int(t.get("output_rows", 0)) for t in tasks), started=t0, ended=done.committed_at,
            begin_s=a.started_at - a.begun_at, job_s=done.ran_at - a.started_at,
            commit_s=done.committed_at - done.ran_at, tasks=sorted(tasks, key=lambda t: t["instance"]),
            errors=done.errors, job_setup_s=(self._action_at - a.started_at) if self._action_at else None,
            routing=self.router.mode, parallelism=len(a.placement.instances), initial_parallelism=c.parallelism,
            input_copies=copies, short_of_copies=short, code_version=c.code_version,
            swapped_from=self.swapped_from.get(b)))
        post_to_spark_ui(spark.sparkContext, describe_commit(c.operator_id, self.reports[-1]))
        return data

    def start_at(self, b: int) -> None:
        """Starts the operator at batch ``b`` (issue 47: a stage inserted into a running
        chain, ``rhino.spark.Pipeline``): its next batch is ``b``, the first of this driver
        even if the operator ran before. A new operator (or one dropped) starts from empty
        state, with its initial state, at ``b > 0``; one whose state was kept resumes it at
        ``b``, across the gap after the batch it last committed. The operator's creation,
        its state's registration and the start check run again at ``b``, against the
        coordinator as it is then."""
        self.start_batch = int(b)
        self._start_checked = False
        self._watermarks = None
        self.control.state_doc = None  # ensure_created runs again: the operator may have been dropped

    def _first_batch(self, b: int) -> bool:
        """Whether ``b`` is the operator's first batch from empty state, the one its
        initial state rides in: batch 0, or the batch it was explicitly started at with no
        committed batch. Also when that batch runs again (from empty state again)."""
        if b == 0:
            return True
        return b == self.start_batch and self.control.last_batch is None

    @property
    def watermarks(self) -> Watermarks:
        """The operator's watermarks (in memory only before the first batch)."""
        if self._watermarks is None:
            return Watermarks(self.config.operator_id, self.config.delay_ms, None)
        return self._watermarks

    def _attempt(self, spark: Any, df: Any, a: Attempt, wm: int, tz: str, batch_input: BatchInput,
                 sink: Optional[Sink]) -> AttemptResult:
        """One attempt at the batch: its Spark job(s). A failed job is run again if the
        engine's classification of its error says so, else raised; the stats of the tasks
        go to the commit."""
        b, placement = a.batch, a.placement
        # the coordinator's time of the batch, fixed at its first begin (0 is a time too: a
        # test clock's); the clock's only if the coordinator gave none
        batch_time_ms = placement.batch_time_ms if placement.batch_time_ms is not None else int(self.clock())
        late = self.watermarks.for_late_rows(b) if self.config.time_mode == "eventtime" else 0
        chunk = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000"))  # <= 0: unbounded
        ctx = AttemptContext(batch=b, attempt=a.number, epoch=a.epoch, watermark_ms=wm, timezone=tz,
                             placement=placement, batch_time_ms=batch_time_ms, late_watermark_ms=late,
                             max_records_per_batch=max(chunk, 0),
                             watch=self._watch(spark, a.epoch, placement,
                                               f"rhino-{self.config.operator_id}-{b}-{a.number}"))
        described = JobDescription(spark.sparkContext, describe_attempt(self.config.operator_id, b, a.number, a.epoch,
                                                                        len(placement.instances)))
        try:
            with described, ctx.watch if ctx.watch is not None else contextlib.nullcontext():
                data, tasks = self._job(spark, df, ctx, batch_input, sink)
        except Exception as e:  # a failed Spark job (task retries exhausted, an executor lost...)
            instead = self._instead(e, ctx)
            if instead is None:
                raise
            raise instead from None
        if ctx.watch is not None and ctx.watch.reported:
            self.watch_log.append(dict(ctx.watch.summary(), batch=b, attempt=a.number))
        missing = sorted(set(placement.instance_order()) - {t["instance"] for t in tasks})
        if missing:
            raise RerunBatch(f"no result from instances {missing}", sleep=False)
        load: dict[str, list[float]] = {}
        for t in tasks:
            load.update(t.get("load", {}))
        return AttemptResult(epoch=min(t["epoch"] for t in tasks), load=load, value=(data, tasks),
                             instances={str(t["instance"]): _commit_stats(t) for t in tasks})

    def _instead(self, e: Exception, ctx: AttemptContext) -> Optional[Exception]:
        """What a failed attempt raises instead of ``e``: RerunBatch when running the batch
        again can help, InputLostError when it cannot; None for a real error, raised as itself."""
        op, b, watch = self.config.operator_id, ctx.batch, ctx.watch
        text = str(e)
        if watch is not None and watch.cancelled:
            # the operator moved to a new epoch: this attempt could not commit (host_loss.py)
            self.watch_log.append(dict(watch.summary(), batch=b, attempt=ctx.attempt, failed_at=time.time()))
            why = (f"the operator moved to epoch {watch.new_epoch}" if watch.new_epoch is not None
                   else "a host holding a primary was lost")
            return RerunBatch(f"cancelled: {why}"
                              + "".join(f"; {r['worker']} on {r['host']} reported lost" for r in watch.reported),
                              sleep=False)
        if output_lost(e):
            # our input is another operator's output, partly lost with an executor:
            # running this batch again would fail again (errors.py)
            return InputLostError(f"operator {op} batch {b}: part of its input (another operator's output) was "
                                  "lost with an executor (CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND): run the chain again "
                                  f"from its first operator; {first_error_line(text)}")
        if classify_job_failure(e) is Action.RAISE:
            # a real error: the processor's own, bad data, a corrupt or full store, a wrong
            # secret...: running the batch again would fail again
            return None
        msg = first_error_line(text) or type(e).__name__
        log.warning("rhino.spark %s batch %d attempt %d failed: %s", op, b, ctx.attempt, msg)
        return RerunBatch(f"job: {type(e).__name__}: {msg}")

    def _watch(self, spark: Any, epoch: int, placement: Placement, tag: str) -> Optional[Any]:
        """The attempt's :class:`~rhino.spark.scheduling.host_loss.BatchWatch` (None if
        ``watch_hosts`` is off)."""
        if not self.config.watch_hosts:
            return None
        from ..scheduling.host_loss import BatchWatch, executor_hosts

        sc = spark.sparkContext
        if self._known_hosts is None:
            self._known_hosts = executor_hosts(sc) or set()
        return BatchWatch(operator_id=self.config.operator_id, epoch=epoch, placement=placement,
                          coordinator=self.control.coordinator(), hosts=lambda: executor_hosts(sc),
                          cancel=lambda: sc.cancelJobsWithTag(tag), known_hosts=self._known_hosts, tag=tag)

    def _job(self, spark: Any, df: Any, ctx: AttemptContext, batch_input: BatchInput,
             sink: Optional[Sink]) -> tuple[Any, list[dict]]:
        """The attempt's Spark job: the stateful stage runs once, its output materialized on
        the executors. Returns (the output DataFrame, the tasks' meta rows).

        With ``sink`` (``for_each_batch``'s fused form), nothing is materialized: the sink gets
        the stateful stage's output as a lazy DataFrame, and its own jobs run the stateful
        tasks, fused with its write, as Spark's own operator feeds its sink. Every run of a
        task starts from b-1 in a session of this epoch, and the batch's time and watermark
        are fixed, so a task Spark runs again (a lost executor, a second action of the sink)
        gives the same output; the batch commits only after the sink returned, at the epoch
        every task ran at."""
        from pyspark.sql.pandas.types import from_arrow_schema

        c, b = self.config, ctx.batch
        instances = ctx.placement.instance_order()
        input_columns = initial_columns = None
        sort = c.keys
        if self.initial_state is not None and self._first_batch(b):
            # the first batch carries the initial state: one DataFrame, a key's initial rows first
            input_columns = list(df.columns)
            df, initial_columns = with_initial_state(df, self.initial_state, c.keys)
            sort.append(SIDE)
        jrdd, jschema = batch_input.rows(spark, df, ctx.placement, sort)
        routed = self.pinner.pin(spark, jrdd, jschema, ctx.placement)
        if self._meta_acc is None:
            self._meta_acc = new_meta_accumulator(spark.sparkContext)
        spec = ctx.spec(state_doc=self.control.state_doc, input_schema_json=df.schema.json(), instances=instances,
                        meta=self._meta_acc, input_columns=input_columns, initial_columns=initial_columns)
        out_schema = from_arrow_schema(output_arrow_schema(c.output_schema))
        result = routed.mapInArrow(partial(run_partition, c, spec), out_schema)
        # The job tag the watch cancels by is a property of a thread's jobs: of the action's
        # own thread (SinkRunner.act), or of this one (Spark's streaming thread, when called
        # from foreachBatch) for the sink's jobs, taken back before the next batch.
        sc = spark.sparkContext
        self._action_at = time.time()
        if sink is None:
            return self.sink.act(sc, lambda: materialize(result), ctx.watch), take(self._meta_acc, b, ctx.attempt)
        self.sink.run(sc, sink, result, b, ctx.attempt,
                      lambda: seen(self._meta_acc, b, ctx.attempt) == set(instances), ctx.watch)
        return None, take(self._meta_acc, b, ctx.attempt)


def check_start(c: OperatorConfig, last_batch: Optional[int], b: int, *, start: Optional[int] = None) -> None:
    """Refuses a query whose first batch in this driver does not follow the operator's
    committed batches (issue 45): the next batch, or the last one again (a Spark replay).
    A query started from a fresh (or an older) Spark checkpoint on an operator that has
    state would otherwise run its batches against state they never made.

    An operator explicitly started at ``start`` (``BatchRunner.start_at``: a stage inserted
    into a running chain, issue 47) may also begin there when that is after its last
    committed batch: a new operator's first batch b > 0, or a resume after a gap."""
    if last_batch is None and b == 0:
        return
    if last_batch is not None and b in (last_batch, last_batch + 1):
        return
    if start is not None and b == start and (last_batch is None or b > last_batch):
        return
    name = f"rhino drop {c.name}" + (f" --namespace {c.namespace}" if c.namespace else "")
    explicit = (f" Only an operator explicitly started at batch {b} (a stage inserted into a running "
                "rhino.spark.Pipeline) may begin after a gap")
    if last_batch is None:
        raise FreshCheckpointError(
            f"operator {c.operator_id} has no committed batch, but this query starts at batch {b}: its Spark "
            "checkpoint is older than the operator (was the operator dropped?). Start the query from a fresh "
            "checkpoint location." + explicit + " or after none")
    if b < last_batch:
        raise FreshCheckpointError(
            f"operator {c.operator_id} exists with state through batch {last_batch}, but this query starts at "
            f"batch {b}: a fresh (or older) Spark checkpoint. Its batches would run against state they did not "
            f"make. To start over, stop every query of the operator and drop it first ({name}, or "
            f"CoordinatorClient.drop_operator({c.operator_id!r})); to keep the state, restart from the query's "
            "own checkpoint location")
    raise FreshCheckpointError(
        f"operator {c.operator_id} has state through batch {last_batch}, but this query starts at batch {b}: "
        "its Spark checkpoint is ahead of the operator's state (another operator of the same name?). Use the "
        f"query's own operator, or {name} and start from a fresh checkpoint." + explicit
        + " (Pipeline.insert of a stage removed with keep_state=True resumes its state)")


def _commit_stats(task: dict) -> dict:
    """What ``commit_batch`` gets of one task: its checkpoint's bytes (the coordinator's
    placement weighs them), and the records it processed and its busy phases, from which
    the autoscaler measures the instance's true rate (rhino/engine/report.py)."""
    out = {"checkpoint_bytes": task.get("checkpoint_bytes", 0), "rows_in": int(task.get("rows_in", 0))}
    out.update({k: float(task.get(k) or 0.0) for k in BUSY_FIELDS})
    return out
