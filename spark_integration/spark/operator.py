"""The driver side of a Rhino stateful operator, used from ``foreachBatch``.

Per micro-batch b (Spark's batch id; checkpoint id = b, design §5):

1. ``begin_batch(b)`` at the coordinator (through the engine,
   :class:`rhino.engine.BatchDriver`): the barrier where due handovers run; it
   returns the routing table and each instance's primary.
2. Route: each row is tagged with its instance's shuffle token, in the JVM
   (``KeyRouter``) or by a ``mapInArrow`` pass (``runtime/routing.py``), and ``repartition(P, token)`` makes partition p =
   instance ``instance_order(placement)[p]``, the p-th instance number in order
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
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa

from rhino.engine import (BUSY_FIELDS, Action, Attempt, AttemptResult, BatchDriver, RerunBatch, classify,
                          classify_failure)
from rhino.errors import InvalidArgumentError, RhinoError
from rhino.tls.config import TLS, for_host

from .errors import InputLostError
from .runtime.initial import SIDE, initial_frame, with_initial_state
from .runtime.meta import new_meta_accumulator, seen, take
from .runtime.routing import PART_COLUMN, jvm_key_kinds, partition_tokens, tag_batches, tag_in_jvm
from .runtime.task import TaskSpec, output_arrow_schema, run_partition, this_host

__all__ = ["TransformWithState", "transform_with_state", "BatchReport"]

log = logging.getLogger("rhino.spark")

_DELAY = re.compile(r"^\s*(\d+)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?)\s*$", re.I)
_UNIT_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
            "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000,
            "hours": 3_600_000}


def parse_delay_ms(delay: Any) -> int:
    """'10 seconds' / '500 ms' / an int of ms -> ms."""
    if isinstance(delay, (int, float)) and not isinstance(delay, bool):
        if delay < 0:
            raise InvalidArgumentError(f"watermark delay must be >= 0, not {delay}")
        return int(delay)
    m = _DELAY.match(str(delay))
    if not m:
        raise InvalidArgumentError(f"watermark delay {delay!r}: write it as '<n> ms|seconds|minutes|hours'")
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower()]


@dataclass
class BatchReport:
    """What one micro-batch did: per attempt errors, per task stats, timings."""

    batch: int
    epoch: int
    attempts: int
    watermark_ms: int
    rows_out: int
    started: float
    ended: float
    begin_s: float
    job_s: float
    commit_s: float
    tasks: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # from the last attempt's start to its Spark action (the job that runs the stateful
    # tasks): the driver's own planning (pinning, the task spec, the query plan)
    job_setup_s: Optional[float] = None
    # how rows were routed to instances: "jvm" (KeyRouter) or "python" (runtime/routing.py)
    routing: Optional[str] = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def locality(self) -> float:
        """The share of tasks that ran on their primary's host."""
        if not self.tasks:
            return 1.0
        return sum(1 for t in self.tasks if t.get("host") == t.get("primary_host")) / len(self.tasks)


class TransformWithState:
    """A ``transformWithState``-style operator whose state lives in Rhino workers.

    See :func:`transform_with_state` for the arguments."""

    def __init__(self, processor: Any, *, key: str | Sequence[str], output_schema: Any, operator_id: str,
                 coordinator: str, secret: Any = None, secret_file: Optional[str] = None, parallelism: int = 2,
                 replicas: int = 2, num_vnodes: Optional[int] = None, time_mode: str = "None",
                 event_time: Optional[str] = None, watermark_delay: Any = 0, mode: str = "pandas",
                 checkpoint_location: Optional[str] = None, locality: bool = True, max_batch_attempts: int = 5,
                 placement: str = "balanced", request_timeout: float = 120.0,
                 failover_wait_s: float = 60.0, watch_hosts: bool = True,
                 clock: Optional[Callable[[], float]] = None, task_window_rows: int = 100_000,
                 initial_state: Any = None, tls: Any = None, input_copies: int = 1) -> None:
        from pyspark.sql.types import StructType

        from rhino._secret import secret_bytes

        if not operator_id or not isinstance(operator_id, str):
            raise InvalidArgumentError("operator_id must be a non-empty string")
        if mode not in ("pandas", "rows"):
            raise InvalidArgumentError(f"mode must be 'pandas' (transformWithStateInPandas) or 'rows' "
                                       f"(transformWithState), not {mode!r}")
        tm = str(time_mode).lower()
        if tm not in ("none", "eventtime", "processingtime"):
            raise InvalidArgumentError(f"time_mode must be 'None', 'EventTime' or 'ProcessingTime', not {time_mode!r}")
        if tm == "eventtime" and not event_time:
            raise InvalidArgumentError("time_mode='EventTime' needs event_time=<the event-time column>")
        if isinstance(task_window_rows, bool) or not isinstance(task_window_rows, int) or task_window_rows < 1:
            raise InvalidArgumentError(f"task_window_rows must be a positive int, not {task_window_rows!r}")
        if isinstance(input_copies, bool) or not isinstance(input_copies, int) or not 1 <= input_copies <= 3:
            raise InvalidArgumentError(f"input_copies must be 1, 2 or 3, not {input_copies!r}")
        if int(parallelism) < 1 or int(replicas) < 0:
            raise InvalidArgumentError("parallelism must be >= 1 and replicas >= 0")
        if secret is None and secret_file is None:
            raise InvalidArgumentError("pass secret= or secret_file= (the cluster's shared secret)")
        if secret is None:
            secret = Path(secret_file).read_bytes().strip()
        self.secret = secret_bytes(secret)
        if tls is not None and not isinstance(tls, TLS):
            raise InvalidArgumentError(f"tls must be a rhino.TLS or None, not {type(tls).__name__}")
        self.tls: Optional[TLS] = tls  # its paths may hold {host}: each process's own host (runtime/task.py)
        self.processor = processor
        self.key_columns = [key] if isinstance(key, str) else list(key)
        if not self.key_columns:
            raise InvalidArgumentError("key must name at least one column")
        self.output_schema = (StructType.fromDDL(output_schema) if isinstance(output_schema, str)
                              else output_schema)
        self.operator_id = operator_id
        self.coordinator_address = coordinator
        self.parallelism = int(parallelism)
        self.replicas = int(replicas)
        self.num_vnodes = int(num_vnodes) if num_vnodes else max(64, 16 * self.parallelism)
        self.time_mode = tm
        self.event_time = event_time
        self.delay_ms = parse_delay_ms(watermark_delay)
        self.mode = mode
        self.locality = locality
        self.max_batch_attempts = max_batch_attempts
        self.task_window_rows = task_window_rows
        # applied in batch 0 only (runtime/initial.py), as Spark applies it in the query's first
        self.initial_state = None if initial_state is None else initial_frame(initial_state, self.key_columns)
        self.state_doc: Optional[dict] = None  # the state schema document, read at the first batch
        self.placement_mode = placement
        self.request_timeout = request_timeout
        self.failover_wait_s = failover_wait_s
        self.watch_hosts = bool(watch_hosts)
        self.input_copies = input_copies
        self._routing: Optional[str] = None  # the last batch's (BatchReport.routing)
        self._jvm_router_in: dict[str, bool] = {}  # application id -> routing in the JVM (_tag)
        self._cached_inputs: list[Any] = []  # this batch's routed input, cached (input_copies > 1)
        # the batch clock, in ms (a test's manual clock; the wall clock by default)
        self.clock: Callable[[], float] = clock if clock is not None else (lambda: time.time() * 1000)
        self._known_hosts: Optional[set[str]] = None  # executor hosts seen last (host_loss.py)
        self._pinned_hosts: dict[int, Optional[str]] = {}  # each instance's host in the last job (moved_first.py)
        self._action_at: Optional[float] = None  # when the last attempt called its Spark action (job_setup_s)
        self.watch_log: list[dict] = []  # what the batch watches reported or cancelled
        self.checkpoint_location = Path(checkpoint_location) if checkpoint_location else None
        self.reports: list[BatchReport] = []
        # the last batch's output (a DataFrame on the executors), released when the next runs
        self.last_output: Any = None
        self._meta_acc: Any = None  # the tasks' meta rows (runtime/meta.py), one per operator
        self.output_reruns: list[dict] = []  # batches run again because their output was lost
        # a fused sink call an attempt gave up on while its cancelled job unwinds (_act), and
        # how long a rerun waited for it before calling the sink again
        self._unwinding_sink: Optional[threading.Thread] = None
        self.sink_unwind_waits: list[dict] = []
        self._coord: Any = None
        self._created = False
        self._lock = threading.Lock()
        self._max_event: dict[int, Optional[int]] = self._load_watermarks()

    # ---- the coordinator --------------------------------------------------------------------
    def coordinator(self) -> Any:
        if self._coord is None:
            from rhino.coordinator.client import connect_coordinator

            self._coord = connect_coordinator(self.coordinator_address, secret=self.secret,
                                              tls=for_host(self.tls, this_host()))
        return self._coord

    def _ensure_created(self, in_schema: Any) -> None:
        if not self._created:
            self.coordinator().create_operator(self.operator_id, parallelism=self.parallelism,
                                               num_vnodes=self.num_vnodes, replicas=self.replicas,
                                               placement=self.placement_mode)
            self.state_doc = self._register_state(in_schema)
            self._created = True

    def _register_state(self, in_schema: Any) -> dict:
        """The state variables ``init`` declares, registered at the coordinator (ids, schema
        versions); an incompatible change is refused here, before any batch runs
        (``state/variables.py``)."""
        from rhino.errors import BusyError

        from .state.variables import declared_variables, resolve_schema_doc

        from pyspark.sql.types import StructType

        declared = declared_variables(self.processor)
        ttl = sorted(n for n, d in declared.items() if d.ttl_ms is not None)
        if ttl and self.time_mode != "processingtime":
            # Spark refuses the same (CANNOT_ASSIGN_TTL_IN_TIME_MODE): TTL runs on batch time
            raise InvalidArgumentError(f"state {ttl[0]!r} has a TTL, which needs time_mode='ProcessingTime' "
                                       f"(this operator runs with time mode {self.time_mode!r}), as in Spark")
        grouping = StructType([in_schema[c] for c in self.key_columns])
        for _ in range(5):
            cur = self.coordinator().state_schema(self.operator_id)
            doc, changed = resolve_schema_doc(cur["doc"], declared, grouping_key=grouping)
            if not changed:
                return doc
            try:
                self.coordinator().set_state_schema(self.operator_id, doc, cur["revision"])
                return doc
            except BusyError:  # another driver changed it meanwhile: read it again
                continue
        raise InvalidArgumentError(f"operator {self.operator_id}: the state schema kept changing under this "
                                   "driver (another driver of the same operator?)")

    # ---- the watermark (Spark's rule: from the max event time through b-1, minus the delay) ---
    def _wm_path(self) -> Optional[Path]:
        return self.checkpoint_location / f"rhino-{self.operator_id}-watermark.json" if self.checkpoint_location else None

    def _load_watermarks(self) -> dict[int, Optional[int]]:
        p = self._wm_path()
        if p is None or not p.exists():
            return {}
        return {int(k): v for k, v in json.loads(p.read_text()).items()}

    def _save_watermarks(self) -> None:
        p = self._wm_path()
        if p is None:
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        keep = dict(sorted(self._max_event.items())[-16:])
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, p)

    def watermark_for(self, batch: int) -> int:
        """The event-time watermark batch ``batch`` runs with (ms; 0 before any event)."""
        prev = [b for b in self._max_event if b < batch]
        if not prev:
            return 0
        m = self._max_event[max(prev)]
        return max(0, m - self.delay_ms) if m is not None else 0

    # ---- one batch -----------------------------------------------------------------------------
    def transform(self, df: Any, batch_id: int) -> Any:
        """Runs the operator on one micro-batch and returns its output as a DataFrame whose
        rows stay on the executors (for any ``foreachBatch`` function).

        Call it once per batch, with Spark's batch id. The DataFrame is valid until the
        next batch of this operator runs: its rows are then released."""
        with self._lock:
            self._release_output()
            out = self._process(df, int(batch_id))
            self.last_output = out
            return out

    def process_batch(self, df: Any, batch_id: int) -> pa.Table:
        """:meth:`transform`, with the output collected to the driver as an Arrow table: for
        tests and small outputs (it goes through the driver's memory)."""
        return self.transform(df, batch_id).toArrow()

    def _release_output(self) -> None:
        """Frees the previous batch's output blocks on the executors."""
        out, self.last_output = self.last_output, None
        if out is not None:
            self._unpersist_checkpoint(out)

    def _unpersist_checkpoint(self, out: Any) -> None:
        """Frees the blocks of a DataFrame made by ``localCheckpoint`` (``_run_job``)."""
        try:
            # SparkContext.unpersistRDD drops the blocks as RDD.unpersist does, without its
            # warning that a locally checkpointed RDD cannot be recomputed (we know).
            rdd = out._jdf.queryExecution().logical().rdd()
            out.sparkSession.sparkContext._jsc.sc().unpersistRDD(rdd.id(), False)
        except Exception as e:  # noqa: BLE001 - a cleanup: Spark's ContextCleaner frees it later anyway
            log.debug("rhino.spark %s: releasing a materialized output: %s", self.operator_id, e)

    def _process(self, df: Any, b: int, sink: Optional[Callable[[Any, int], None]] = None) -> Any:
        spark = df.sparkSession
        t0 = time.time()
        tz = spark.conf.get("spark.sql.session.timeZone")
        in_schema = df.schema
        for c in self.key_columns + ([self.event_time] if self.event_time else []):
            if c not in in_schema.names:
                raise InvalidArgumentError(f"column {c!r} is not in the input ({in_schema.simpleString()})")
        self._ensure_created(in_schema)
        wm = self.watermark_for(b) if self.time_mode == "eventtime" else 0
        shuffled: dict = {}  # the batch's routed, shuffled rows, kept across attempts (see _run_job)
        driver = BatchDriver(self.coordinator(), self.operator_id, max_attempts=self.max_batch_attempts,
                             retry_sleep=0.5, replay=True, name=f"rhino.spark {self.operator_id}",
                             clock=lambda: int(self.clock()))
        try:
            done = driver.run(b, lambda a: self._attempt(spark, df, a, wm, tz, shuffled, sink))
        finally:
            self._release_inputs()
        a = done.attempt
        data, tasks = done.result.value
        mx = [t["max_event_ms"] for t in tasks if t.get("max_event_ms") is not None]
        prev = [self._max_event[x] for x in self._max_event if x < b and self._max_event[x] is not None]
        self._max_event[b] = max(mx + prev) if (mx or prev) else None
        self._save_watermarks()
        rep = BatchReport(batch=b, epoch=max(t["epoch"] for t in tasks), attempts=a.number, watermark_ms=wm,
                          rows_out=sum(int(t.get("output_rows", 0)) for t in tasks), started=t0,
                          ended=done.committed_at, begin_s=a.started_at - a.begun_at,
                          job_s=done.ran_at - a.started_at, commit_s=done.committed_at - done.ran_at,
                          tasks=sorted(tasks, key=lambda t: t["instance"]), errors=done.errors,
                          job_setup_s=(self._action_at - a.started_at) if self._action_at else None,
                          routing=self._routing)
        self.reports.append(rep)
        return data

    def _attempt(self, spark: Any, df: Any, a: Attempt, wm: int, tz: str, shuffled: dict,
                 sink: Optional[Callable[[Any, int], None]] = None) -> AttemptResult:
        """One attempt at the batch: the Spark job, one task per instance (with ``sink``: the
        sink's own jobs, see :meth:`_run_job`). A failed job is run again if the engine's
        classification of its error says so (by the task's exception class), else raised; the
        stats of the tasks go to the commit."""
        b, placement = a.batch, a.placement
        nparts = len(placement["instances"])
        watch = self._watch(spark, a.epoch, placement, f"rhino-{self.operator_id}-{b}-{a.number}")
        try:
            with watch if watch is not None else contextlib.nullcontext():
                data, tasks = self._run_job(spark, df, b, a.epoch, wm, placement, nparts, tz, shuffled, watch,
                                            a.number, sink)
        except Exception as e:  # a failed Spark job (task retries exhausted, an executor lost...)
            text = str(e)
            if watch is not None and watch.cancelled:
                # the operator moved to a new epoch: this attempt could not commit (host_loss.py)
                self.watch_log.append(dict(watch.summary(), batch=b, attempt=a.number, failed_at=time.time()))
                why = (f"the operator moved to epoch {watch.new_epoch}" if watch.new_epoch is not None
                       else "a host holding a primary was lost")
                raise RerunBatch(f"cancelled: {why}"
                                 + "".join(f"; {r['worker']} on {r['host']} reported lost" for r in watch.reported),
                                 sleep=False) from None
            if _output_lost(e):
                # our input is another operator's output, partly lost with an executor:
                # running this batch again would fail again (errors.py)
                raise InputLostError(f"operator {self.operator_id} batch {b}: part of its input (another "
                                     "operator's output) was lost with an executor (CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND):"
                                     f" run the chain again from its first operator; {_first_error_line(text)}"
                                     ) from None
            if _job_failure_action(e) is Action.RAISE:
                # a real error: the processor's own, bad data, a corrupt or full store, a wrong
                # secret...: running the batch again would fail again
                raise
            msg = _first_error_line(text) or type(e).__name__
            log.warning("rhino.spark %s batch %d attempt %d failed: %s", self.operator_id, b, a.number, msg)
            raise RerunBatch(f"job: {type(e).__name__}: {msg}") from None
        if watch is not None and watch.reported:
            self.watch_log.append(dict(watch.summary(), batch=b, attempt=a.number))
        missing = sorted(set(instance_order(placement)) - {t["instance"] for t in tasks})
        if missing:
            raise RerunBatch(f"no result from instances {missing}", sleep=False)
        load: dict[str, list[float]] = {}
        for t in tasks:
            for v, x in t.get("load", {}).items():
                load[v] = x
        return AttemptResult(epoch=min(t["epoch"] for t in tasks), load=load, value=(data, tasks),
                             instances={str(t["instance"]): _commit_stats(t) for t in tasks})

    def _watch(self, spark: Any, epoch: int, placement: dict, tag: str) -> Optional[Any]:
        """The attempt's :class:`~rhino.spark.scheduling.host_loss.BatchWatch` (None if
        ``watch_hosts`` is off)."""
        if not self.watch_hosts:
            return None
        from .scheduling.host_loss import BatchWatch, executor_hosts

        sc = spark.sparkContext
        if self._known_hosts is None:
            self._known_hosts = executor_hosts(sc) or set()
        return BatchWatch(operator_id=self.operator_id, epoch=epoch, placement=placement,
                          coordinator=self.coordinator(), hosts=lambda: executor_hosts(sc),
                          cancel=lambda: sc.cancelJobsWithTag(tag), known_hosts=self._known_hosts,
                          tag=tag)

    def _run_job(self, spark: Any, df: Any, b: int, epoch: int, wm: int, placement: dict, nparts: int,
                 tz: str, shuffled: dict, watch: Optional[Any] = None, attempt: int = 1,
                 sink: Optional[Callable[[Any, int], None]] = None) -> tuple[Any, list[dict]]:
        """The attempt's Spark job: the stateful stage runs once, its output materialized on
        the executors. Returns (the output DataFrame, the tasks' meta rows).

        With ``sink`` (``for_each_batch``'s fused form), nothing is materialized: the sink gets
        the stateful stage's output as a lazy DataFrame, and its own jobs run the stateful
        tasks, fused with its write, as Spark's own operator feeds its sink. Every run of a
        task starts from b-1 in a session of this epoch, and the batch's time and watermark
        are fixed, so a task Spark runs again (a lost executor, a second action of the sink)
        gives the same output; the batch commits only after the sink returned, at the epoch
        every task ran at. Instances whose task the sink did not run to its end (it read only
        part of the output) are completed by one more job, whose output is dropped."""
        from functools import partial

        # A batch that runs again (a failover moved a primary: a new epoch, same routing table)
        # reuses the first attempt's shuffle: the same RDD object keeps its ShuffleDependency, so
        # Spark's DAG scheduler skips the map stage whose outputs it still has and recomputes only
        # those lost with a dead executor (with input_copies, none: the shuffled partitions are
        # cached twice, see _cache_input). Only the stateful stage runs again, pinned anew.
        # Partition p of the shuffle is instance instances[p]: instance numbers are not
        # 0..P-1 once a rescale retired some (a retired number is never reused).
        instances = instance_order(placement)
        route_key = (nparts, placement["num_key_groups"], placement["num_vnodes"], placement["seed"],
                     tuple(placement["assignment"]), tuple(instances))
        input_columns = initial_columns = None
        sort = list(self.key_columns)
        if b == 0 and self.initial_state is not None:
            # the first batch carries the initial state: one DataFrame, a key's initial rows first
            input_columns = list(df.columns)
            df, initial_columns = with_initial_state(df, self.initial_state, self.key_columns)
            sort.append(SIDE)
        if route_key not in shuffled:
            tokens = partition_tokens(spark, nparts)
            # the token of each instance number (by number; retired numbers get none)
            token_of = [-1] * (max(instances) + 1)
            for p, i in enumerate(instances):
                token_of[i] = tokens[p]
            # Each partition sorted by key (Spark's external sort, which spills), as Spark's own
            # operator sorts: the task then streams it a window of whole keys at a time.
            tagged = self._tag(df, placement, token_of)
            routed = self._cache_input(tagged.repartition(nparts, PART_COLUMN).sortWithinPartitions(*sort))
            # Spark's own RDD of InternalRows (the shuffle's output, no Python round trip)
            shuffled.clear()
            shuffled[route_key] = (routed._jdf.queryExecution().toRdd(), routed._jdf.schema())
        jrdd, jschema = shuffled[route_key]
        routed = self._pin(spark, jrdd, jschema, placement, nparts)
        spec = TaskSpec(operator_id=self.operator_id, batch=b, epoch=epoch, watermark_ms=wm,
                        key_columns=self.key_columns, processor=self.processor, mode=self.mode,
                        time_mode=self.time_mode, event_time=self.event_time,
                        input_schema_json=df.schema.json(), output_schema_json=self.output_schema.json(),
                        timezone=tz, secret=self.secret, coordinator=self.coordinator_address,
                        tls=None if self.tls is None else self.tls.as_dict(),
                        placement=placement, state_doc=self.state_doc,
                        batch_time_ms=int(placement.get("batch_time_ms") or self.clock()),
                        request_timeout=self.request_timeout,
                        failover_wait_s=self.failover_wait_s, wait_for_failover=not self.watch_hosts,
                        meta=self._meta_accumulator(spark), driver_attempt=attempt,
                        window_rows=self.task_window_rows, input_columns=input_columns,
                        initial_columns=initial_columns, instances=instances)
        from pyspark.sql.pandas.types import from_arrow_schema

        out_schema = from_arrow_schema(output_arrow_schema(self.output_schema))
        result = routed.mapInArrow(partial(run_partition, spec), out_schema)
        # The job tag the watch cancels by is a property of a thread's jobs: of the action's
        # own thread (_act), or of this one (Spark's streaming thread, when called from
        # foreachBatch) for the sink's jobs, taken back before the next batch.
        sc = spark.sparkContext
        self._action_at = time.time()
        if sink is None:
            # Materialized once, on the executors (memory, spilling to disk): the job that
            # runs the stateful tasks. The DataFrame's lineage ends here, so nothing the
            # sink does can run them again.
            return self._act(sc, lambda: result.localCheckpoint(eager=True), watch), take(spec.meta, b, attempt)
        self._run_sink(sc, sink, result, b, spec, instances, watch)
        return None, take(spec.meta, b, attempt)

    def _tag(self, df: Any, placement: dict, token_of: list[int]) -> Any:
        """``df`` with the routing column (``runtime/routing.py``): computed in the JVM where
        the key's types and the helper jar allow, so the rows make no trip through a Python
        worker before the stateful stage; else by a ``mapInArrow`` pass."""
        from functools import partial

        from pyspark.sql.types import LongType, StructField, StructType

        table = dict(num_key_groups=placement["num_key_groups"], num_vnodes=placement["num_vnodes"],
                     seed=placement["seed"], assignment=list(placement["assignment"]), tokens=token_of)
        kinds = jvm_key_kinds(df.schema, self.key_columns)
        if kinds is not None and self._jvm_routing(df.sparkSession.sparkContext):
            self._routing = "jvm"
            return tag_in_jvm(df, self.key_columns, kinds, **table)
        self._routing = "python"
        schema = StructType(list(df.schema.fields) + [StructField(PART_COLUMN, LongType(), False)])
        return df.mapInArrow(partial(tag_batches, key_columns=self.key_columns, **table), schema)

    def _jvm_routing(self, sc: Any) -> bool:
        """Whether ``io.rhino.spark.KeyRouter`` can route in this application (checked once)."""
        app = sc.applicationId
        if app not in self._jvm_router_in:
            from .scheduling.locality import _ensure_class

            try:
                _ensure_class(sc)  # the helper jar, in the driver and the executors
                self._jvm_router_in[app] = bool(sc._jvm.io.rhino.spark.KeyRouter.available())
                why = "XXH3 (Parquet's shaded OpenHFT hashing) is not on Spark's class path"
            except Exception as e:  # noqa: BLE001 - no jar, no javac, an old jar: the Python pass routes
                self._jvm_router_in[app] = False
                why = _first_error_line(str(e))
            if not self._jvm_router_in[app]:
                log.info("rhino.spark %s: rows are routed by a Python pass (%s)", self.operator_id, why)
        return self._jvm_router_in[app]

    def _run_sink(self, sc: Any, sink: Callable[[Any, int], None], result: Any, b: int, spec: TaskSpec,
                  instances: list[int], watch: Optional[Any]) -> None:
        """``_run_job``'s fused form: the sink's own jobs run the stateful tasks (``result``
        is the stateful stage's lazy output); instances whose task the sink did not run to
        its end are completed by one more job, its output dropped."""

        def sink_jobs() -> None:
            sink(result, b)
            if seen(spec.meta, b, spec.driver_attempt) != set(instances):
                result.write.format("noop").mode("overwrite").save()

        if watch is None:
            sink_jobs()  # the user's code, in this thread
            return
        earlier = self._unwinding_sink
        if earlier is not None and earlier.is_alive():
            # An earlier attempt's sink call, given up when its watch settled (_act), is
            # still unwinding its cancelled job. The sink is never called twice at once (a
            # file sink's abort deletes the _temporary directory the next call writes
            # into), but the rerun's stateful tasks need not wait for that: they run now,
            # materialized on the executors as transform's are, and the sink gets their
            # output once the earlier call has returned. The batch still commits after the
            # sink returned, at the epoch every task ran at.
            out = self._act(sc, lambda: result.localCheckpoint(eager=True), watch)
            t = time.time()
            earlier.join()
            self.sink_unwind_waits.append({"batch": b, "attempt": spec.driver_attempt,
                                           "waited_s": round(time.time() - t, 4)})
            self._unwinding_sink = None

            def sink_then_release() -> None:
                try:
                    sink(out, b)
                finally:  # in the sink's thread: a given-up call still frees its input when it returns
                    self._unpersist_checkpoint(out)

            try:
                self._act(sc, sink_then_release, watch, user_code=True)
            except Exception as e:
                if _output_lost(e):  # our own output, not an upstream operator's: run the batch again
                    raise RerunBatch(f"output lost while the sink ran: {_first_error_line(str(e))}") from None
                raise
            return
        self._act(sc, sink_jobs, watch, user_code=True)

    def _act(self, sc: Any, action: Callable[[], Any], watch: Optional[Any], user_code: bool = False) -> Any:
        """Runs the attempt's Spark action and returns its result.

        With a batch watch, the action runs in a thread that inherits this one's Spark local
        properties (the streaming query's), adds the job tag the watch cancels by (the tag is
        a property of the thread's jobs: this thread has nothing to take back, no py4j call
        to make, when it gives up), and this thread stops waiting for it once the watch is
        ``settled``: the attempt is
        cancelled and the coordinator has failed the lost host over. The cancelled job's error
        would still have to come back: PySpark converts it with a py4j round trip per
        exception class it checks, each a context switch to the driver's JVM and back, which
        took 0.5 s on a loaded 2-core host (the recovery bench's ``watch`` timeline, 2026-11-27).
        The abandoned thread ends when the job's error arrives; nothing reads its result.
        With ``user_code`` (the action calls the user's sink), the abandoned thread is kept
        (``_unwinding_sink``): the sink is not called again before it has returned."""
        if watch is None:
            return action()
        from pyspark import SparkContext
        from pyspark.util import InheritableThread

        # InheritableThread copies the active context's properties (none without one: a test)
        thread = InheritableThread if SparkContext._active_spark_context is not None else threading.Thread

        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                sc.addJobTag(watch.tag)
                try:
                    box["value"] = action()
                finally:
                    sc.removeJobTag(watch.tag)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

        th = thread(target=run, name=f"rhino-action-{self.operator_id}", daemon=True)
        th.start()
        while not done.wait(0.01):
            if watch.settled.is_set():
                if user_code:
                    self._unwinding_sink = th
                raise RhinoError(f"operator {self.operator_id}: the attempt was cancelled (a lost host, a new "
                                 "epoch) and the coordinator has acted: not waiting for its Spark job to unwind")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _cache_input(self, routed: Any) -> Any:
        """With ``input_copies`` > 1, the batch's routed input (after the shuffle, sorted) cached
        on the executors with that many copies on distinct executors (Spark's block
        replication, memory then disk).

        The shuffle's map output lives only on the executor that wrote it. When a host is lost
        mid-batch with a map task's output, Spark runs that map task again before any rerun
        task can start, reading and routing its source split again (1.7-2.3 s of the 2.5-2.9 s
        rerun launch in bench/results/spark_recovery.2026-11-26.md, one-partition source). Cached after
        the shuffle, each instance's partition is stored, with its copy sent to another
        executor, when its task of the first attempt begins (Spark unrolls a cached partition
        before the task reads it): a rerun task reads the surviving copy, and the DAG
        scheduler, which finds every partition cached, runs no map stage at all."""
        if self.input_copies <= 1:
            return routed
        from pyspark import StorageLevel

        cached = routed.persist(StorageLevel(True, True, False, False, self.input_copies))
        self._cached_inputs.append(cached)
        return cached

    def _release_inputs(self) -> None:
        """Drops the batch's cached input (``_cache_input``) once the batch is done."""
        cached, self._cached_inputs = self._cached_inputs, []
        for df in cached:
            try:
                df.unpersist(blocking=False)
            except Exception as e:  # noqa: BLE001 - a cleanup: Spark's ContextCleaner frees it later anyway
                log.debug("rhino.spark %s: releasing a cached input: %s", self.operator_id, e)

    def _meta_accumulator(self, spark: Any) -> Any:
        if self._meta_acc is None:
            self._meta_acc = new_meta_accumulator(spark.sparkContext)
        return self._meta_acc

    def _pin(self, spark: Any, jrdd: Any, jschema: Any, placement: dict, nparts: int) -> Any:
        """The routed rows as a DataFrame, partition p preferring the host of its instance's primary."""
        from pyspark.sql import DataFrame

        if not self.locality:
            return DataFrame(spark._jsparkSession.internalCreateDataFrame(jrdd, jschema, False), spark)

        from py4j.java_collections import ListConverter

        from .scheduling.locality import _ensure_class

        from .scheduling.moved_first import executors_by_host, moved, preferred_locations

        order = instance_order(placement)
        now = {i: placement["instances"][str(i)]["host"] or None for i in order}
        # the instances that moved since the last job start first on their new hosts
        execs = executors_by_host(spark.sparkContext) if moved(order, now, self._pinned_hosts) else {}
        hosts = preferred_locations(order, now, self._pinned_hosts, execs)
        self._pinned_hosts = now
        sc = spark.sparkContext
        jvm = sc._jvm
        try:
            # spark.jars of the session, or (a later session in a process whose JVM started without
            # it) the jar added to the driver's class loader and shipped with addJar
            _ensure_class(sc)
        except RuntimeError as e:
            raise InvalidArgumentError(f"{e}; or pass locality=False") from e
        client = sc._gateway._gateway_client
        conv = ListConverter()
        jhosts = conv.convert([conv.convert(h, client) for h in hosts], client)
        # Wrapped so that partition p prefers its instance's host, then a DataFrame again for
        # mapInArrow: the DAG scheduler takes the preference from this narrow ancestor.
        pinned = jvm.io.rhino.spark.PreferredLocationsRDD(jrdd, jhosts)
        jdf = spark._jsparkSession.internalCreateDataFrame(pinned, jschema, False)
        return DataFrame(jdf, spark)

    # ---- foreachBatch -----------------------------------------------------------------------
    def for_each_batch(self, sink: Optional[Callable[[Any, int], None]] = None, *,
                       materialize: bool = False) -> Callable[[Any, int], None]:
        """The function to pass to ``writeStream.foreachBatch``: runs the batch and calls
        ``sink(output_df, batch_id)`` (no sink: the output is dropped). Sinks must be idempotent by batch id, as ``foreachBatch``
        sinks are: the sink may be called more than once for a batch.

        By default the sink is fused with the stateful stage, as with Spark's own operator:
        ``output_df`` is lazy, the sink's own job runs the stateful tasks and writes their
        output as it comes (nothing is materialized), and the batch commits after the sink
        returned. Like the DataFrame Spark's own ``foreachBatch`` gets, each action on it runs
        the stateful stage again (the same output: every run starts from b-1 with the batch's
        fixed time): a sink that reads it more than once should ``persist()`` it, or pass
        ``materialize=True``. A failure during the sink (a host lost, a commit refused) runs the
        whole batch again, sink included, with the same batch id.

        With ``materialize=True``, the output is :meth:`transform`'s (checkpointed on the
        executors, committed before the sink runs). If the sink fails because an executor
        holding part of it was lost, the batch runs again (rolled back to b-1 first) and the
        sink is called again with the same batch id, up to ``max_batch_attempts`` times."""

        def fused(df: Any, batch_id: int) -> None:
            with self._lock:
                self._release_output()
                # no sink: the job that completes the tasks (_run_job) runs them, output dropped
                self._process(df, int(batch_id), sink=sink if sink is not None else _drop_output)

        def fn(df: Any, batch_id: int) -> None:
            for n in range(1, self.max_batch_attempts + 1):
                out = self.transform(df, batch_id)
                if sink is None:
                    return
                try:
                    sink(out, batch_id)
                    return
                except Exception as e:  # noqa: BLE001 - only a lost output is handled
                    if not _output_lost(e) or n == self.max_batch_attempts:
                        raise
                    log.warning("rhino.spark %s batch %d: part of the output was lost with an executor while "
                                "the sink ran (%s); the batch runs again", self.operator_id, batch_id,
                                _first_error_line(str(e)))
                    self.output_reruns.append({"batch": int(batch_id), "attempt": n, "error": _first_error_line(str(e))})

        return fn if materialize else fused

    def close(self) -> None:
        if self._coord is not None:
            self._coord.close()
            self._coord = None


def instance_order(placement: dict) -> list[int]:
    """The instance numbers of a placement in partition order: partition p of a batch's
    shuffle, and its task, is instance ``instance_order(placement)[p]``."""
    return sorted(int(i) for i in placement["instances"])


def _drop_output(df: Any, batch_id: int) -> None:
    """``for_each_batch()``'s sink: none."""


def _job_failure_action(e: Exception) -> Action:
    """The engine's classification of a failed job: a failure Spark reports (the task's
    exception travels as text) by the class named in its text, any other exception (the
    driver's own) by its class."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    if isinstance(e, (Py4JError, PySparkException)):
        return classify_failure(str(e))
    return classify(e)


def _commit_stats(task: dict) -> dict:
    """What ``commit_batch`` gets of one task: its checkpoint's bytes (the coordinator's
    placement weighs them), and the records it processed and its busy phases, from which
    the autoscaler measures the instance's true rate (rhino/engine/report.py)."""
    out = {"checkpoint_bytes": task.get("checkpoint_bytes", 0), "rows_in": int(task.get("rows_in", 0))}
    out.update({k: float(task.get(k) or 0.0) for k in BUSY_FIELDS})
    return out


def _first_error_line(text: str) -> str:
    """The most telling line of a Spark job failure: the Python exception, if there is one."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("rhino.errors.", "pyspark.", "Caused by")) or "Error:" in ln:
            return ln[:400]
    return lines[0][:400] if lines else ""


def _output_lost(e: Exception) -> bool:
    """True if a job failed because blocks of a checkpointed output were lost with their
    executor (Spark's ``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``), or an operator downstream
    reported its input lost so (:class:`~rhino.spark.errors.InputLostError`)."""
    if isinstance(e, InputLostError):
        return True
    text = str(e)
    return "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in text or ("Checkpoint block" in text and "not found" in text)


def transform_with_state(processor: Any, *, key: str | Sequence[str], output_schema: Any, operator_id: str,
                         coordinator: str, **kw: Any) -> TransformWithState:
    """A stateful operator that runs an unmodified PySpark ``StatefulProcessor`` on Rhino state.

    - ``processor``: a ``pyspark.sql.streaming.stateful_processor.StatefulProcessor``
      (pandas mode by default: ``handleInputRows(key, Iterator[pd.DataFrame], timerValues)``;
      ``mode="rows"`` for the Row form of ``transformWithState``).
    - ``key``: the grouping column(s); ``output_schema``: a StructType or DDL string.
    - ``operator_id``: the operator's name at the coordinator (its state's identity).
    - ``coordinator``: ``"host:port"`` of the coordinator (``rhino coordinator``, or one
      the driver hosts); ``secret`` / ``secret_file``: the cluster's shared secret.
    - ``tls``: a ``rhino.TLS`` when the cluster runs mutual TLS; ``{host}`` in its paths
      becomes each process's own host (the driver's, each task's executor's), so one
      setting names every host's certificate.
    - ``parallelism`` (instances), ``replicas`` (r, default 2), ``num_vnodes``.
    - ``time_mode``: ``"None"``, ``"EventTime"`` (with ``event_time=<column>`` and
      ``watermark_delay``, e.g. ``"10 seconds"``) or ``"ProcessingTime"``: timers
      fire at the watermark or at the batch's time (fixed by the coordinator at the
      batch's first run, the same when it runs again). With ``"ProcessingTime"``,
      state variables may have a TTL (``ttlDurationMs``), measured in batch time.
    - ``checkpoint_location``: a directory for the operator's watermark (survives a
      driver restart; Spark's own checkpoint location is a good place).
    - ``task_window_rows`` (default 100,000): a task works through its partition (sorted by
      key) this many input rows of whole keys at a time, and streams each window's output:
      its memory is bounded by the window and the largest key, not by the partition.
    - ``initial_state``: a DataFrame (a table, e.g. ``spark.table(...)``) or ``df.groupBy(key)``,
      as Spark's ``initialState``: in the operator's first batch (batch 0, and again if it
      runs again, from empty state), ``handleInitialState(key, rows, timerValues)`` is
      called for each key's initial rows (a pandas DataFrame, or one ``Row`` at a time in
      row mode) before its input rows. The key columns must have the input's names and types.
    - ``clock``: a function returning the time in ms that a batch's time is taken from
      at its first run (default: the wall clock; tests pass a manual clock).
    - ``watch_hosts`` (default True): while a batch runs, report a host whose executors
      Spark's driver lost to the coordinator (failover in a fraction of a second instead of
      the heartbeat timeout), and cancel an attempt that can no longer commit
      (``scheduling/host_loss.py``).
    - ``input_copies`` (default 1): with 2 (or 3), each batch's input, read, routed and
      shuffled, is cached on the executors with that many copies on distinct executors
      (memory, then disk), and dropped when the batch ends. A host lost mid-batch then does
      not take the batch's only input with it: the rerun reads the other copy, with no map
      stage to run again and no source to read again. It costs a copy of each batch's
      input in the executors' storage memory (or disk), sent to another executor while the
      batch runs.

    Use: ``query = stream.writeStream.foreachBatch(op.for_each_batch(sink)).start()``, or
    ``out = op.transform(df, batch_id)`` inside any ``foreachBatch`` function (the output
    DataFrame, on the executors; two operators can be chained this way).
    """
    return TransformWithState(processor, key=key, output_schema=output_schema, operator_id=operator_id,
                              coordinator=coordinator, **kw)
