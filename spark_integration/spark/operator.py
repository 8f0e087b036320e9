"""The driver side of a Rhino stateful operator, used from ``foreachBatch``: a facade
over the named stages of one micro-batch in ``driver/`` (the batch's steps are in
``driver/batch.py``'s docstring; docs/spark.md, "One micro-batch").

- ``driver/config.py``: the operator's settings, validated and frozen (what the
  executors get with each attempt);
- ``driver/control.py``: the coordinator connection, the operator's creation and its
  state's registration;
- ``driver/batch.py``: a batch's attempts, on the engine's ``BatchDriver``;
- ``driver/routing.py``, ``driver/pinning.py``, ``driver/sink.py``,
  ``driver/watermark.py``, ``driver/report.py``: one stage each.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa


from .driver.batch import BatchRunner
from .driver.config import OperatorConfig, parse_delay_ms
from .driver.control import Control
from .driver.progress import state_operator_progress
from .driver.report import BatchReport
from .driver.sink import Sink, sink_with_reruns, unpersist_checkpoint
from .driver.swap import Swap
from .driver.swapper import Swapper
from .runtime.initial import initial_frame

__all__ = ["TransformWithState", "transform_with_state", "BatchReport", "parse_delay_ms"]

log = logging.getLogger("rhino.spark")


class TransformWithState:
    """A ``transformWithState``-style operator whose state lives in Rhino workers.

    See :func:`transform_with_state` for the arguments."""

    def __init__(self, processor: Any, *, key: str | Sequence[str], output_schema: Any, operator_id: str,
                 coordinator: str, clock: Optional[Callable[[], float]] = None, initial_state: Any = None,
                 **kw: Any) -> None:
        self.config = OperatorConfig.of(processor, key=key, output_schema=output_schema, operator_id=operator_id,
                                        coordinator=coordinator, **kw)
        self.control = Control(self.config)
        # the batch clock, in ms (a test's manual clock; the wall clock by default)
        self.clock: Callable[[], float] = clock if clock is not None else (lambda: time.time() * 1000)
        initial = None if initial_state is None else initial_frame(initial_state, self.config.keys)
        self.runner = BatchRunner(self.config, self.control, lambda: self.clock(), initial)
        # the last batch's output (a DataFrame on the executors), released when the next runs
        self.last_output: Any = None
        self.output_reruns: list[dict] = []  # batches run again because their output was lost
        self._lock = threading.Lock()
        self.swapper = Swapper(self)  # swaps asked for, taken at the next barrier
        self.runner.barrier = self.swapper.barrier

    # What tests, benchmarks and users read of the operator.
    @property
    def operator_id(self) -> str:
        return self.config.operator_id

    @property
    def num_vnodes(self) -> int:
        return self.config.num_vnodes

    @property
    def parallelism(self) -> int:
        """The operator's current instance count: the last batch's, else the coordinator's
        at creation, else the config's (the initial one; issue 45)."""
        if self.reports and self.reports[-1].parallelism is not None:
            return self.reports[-1].parallelism
        return self.control.parallelism if self.control.parallelism is not None else self.config.parallelism

    @property
    def replicas(self) -> int:
        return self.config.replicas

    @property
    def code_version(self) -> str:
        """The version of the code in force (driver/code_version.py)."""
        return self.config.code_version

    def progress(self, batch_id: Optional[int] = None) -> Optional[dict]:
        """Batch ``batch_id``'s figures (the last batch's if None) in the shape of Spark's
        ``StateOperatorProgress``, for a ``StreamingQueryListener`` to join on
        ``event.progress.batchId`` (driver/progress.py); None if not among the reports kept."""
        reps = [r for r in self.reports if batch_id is None or r.batch == int(batch_id)]
        return state_operator_progress(reps[-1]) if reps else None

    @property
    def state_doc(self) -> Optional[dict]:
        return self.control.state_doc

    @property
    def reports(self) -> Any:
        """The last batches' :class:`BatchReport`, oldest first (a bounded ring: ``driver/report.py``)."""
        return self.runner.reports

    @property
    def watch_log(self) -> list[dict]:
        return self.runner.watch_log

    @property
    def sink_unwind_waits(self) -> list[dict]:
        return self.runner.sink.unwind_waits

    def coordinator(self) -> Any:
        """The operator's coordinator connection."""
        return self.control.coordinator()

    def watermark_for(self, batch: int) -> int:
        """The event-time watermark batch ``batch`` runs with (ms; 0 before any event)."""
        return self.runner.watermarks.for_batch(batch)

    # ---- one batch -----------------------------------------------------------------------------
    def transform(self, df: Any, batch_id: int) -> Any:
        """Runs the operator on one micro-batch and returns its output as a DataFrame whose
        rows stay on the executors (for any ``foreachBatch`` function).

        Call it once per batch, with Spark's batch id. The DataFrame is valid until the
        next batch of this operator runs: its rows are then released."""
        with self._lock:
            self._release_output()
            self.last_output = self.runner.run(df, int(batch_id))
            return self.last_output

    def start_at(self, batch_id: int) -> None:
        """Starts the operator at Spark batch ``batch_id``, its next batch (issue 47; what
        ``rhino.spark.Pipeline.insert`` calls): a new operator starts there from empty state
        (its ``initial_state`` applied in that batch), one whose state was kept resumes it
        there, across a gap after its last committed batch. Without it, only batch 0 or
        the batch after the last committed one may come first (``FreshCheckpointError``)."""
        with self._lock:
            self.runner.start_at(int(batch_id))

    def process_batch(self, df: Any, batch_id: int) -> pa.Table:
        """:meth:`transform`, with the output collected to the driver as an Arrow table: for
        tests and small outputs (it goes through the driver's memory)."""
        return self.transform(df, batch_id).toArrow()

    def _release_output(self) -> None:
        """Frees the previous batch's output blocks on the executors."""
        out, self.last_output = self.last_output, None
        if out is not None:
            unpersist_checkpoint(out, self.operator_id)

    # ---- changing the code: a swap at the next barrier (driver/swap.py, driver/swapper.py) -----
    def swap(self, processor: Any, *, output_schema: Any = None, code_version: Optional[str] = None,
             migrate: Optional[Callable[[tuple, dict, Any], None]] = None) -> Swap:
        """Asks for ``processor`` (and ``output_schema``, if given) to replace the operator's
        code from the next batch barrier, its state kept by variable name (issue 47); callable
        from any thread, while batches run. Checked now: an incompatible state variable (or
        a bad argument) raises here, and the old processor goes on. Returns the
        :class:`~rhino.spark.driver.swap.Swap`, whose ``wait()`` gives the batch from which
        the new code runs. ``code_version``: the new code's version name (default: its
        fingerprint). ``migrate``: ``migrate(key, old, processor)``, run once per key with state
        in the swap's batch, before its input (driver/swap.py)."""
        return self.swapper.ask(processor, output_schema, code_version, migrate)

    @property
    def swaps(self) -> list[Swap]:
        """The swaps a barrier took or refused, in order."""
        return self.swapper.swaps

    def set_config(self, new: OperatorConfig) -> None:
        """Replaces the operator's config everywhere it is read (a swap's barrier)."""
        self.config = self.control.config = self.runner.config = new

    # ---- foreachBatch -----------------------------------------------------------------------
    def for_each_batch(self, sink: Optional[Sink] = None, *,
                       materialize: bool = False) -> Callable[[Any, int], None]:
        """The function to pass to ``writeStream.foreachBatch``: runs the batch and calls
        ``sink(output_df, batch_id)`` (no sink: the output is dropped). Sinks must be
        idempotent by batch id, as ``foreachBatch`` sinks are: a failure during the sink (a
        host lost, a commit refused) runs the whole batch again, sink included.

        By default the sink is fused with the stateful stage, as with Spark's own operator:
        ``output_df`` is lazy, the sink's job runs the stateful tasks, and the batch commits
        after the sink returned; each action on it runs the stateful stage again (the same
        output), so a sink that reads it twice should ``persist()`` it. With
        ``materialize=True`` the output is :meth:`transform`'s, committed before the sink
        runs (``driver/sink.py``, :func:`sink_with_reruns`)."""

        def fused(df: Any, batch_id: int) -> None:
            with self._lock:
                self._release_output()
                # no sink: the job that completes the tasks (SinkRunner.run) runs them, output dropped
                self.runner.run(df, int(batch_id), sink=sink if sink is not None else _drop_output)

        if materialize:
            return lambda df, batch_id: sink_with_reruns(
                self.transform, sink, df, int(batch_id), attempts=self.config.max_batch_attempts,
                what=self.operator_id, reruns=self.output_reruns)
        return fused

    def close(self) -> None:
        self.control.close()


def _drop_output(df: Any, batch_id: int) -> None:
    """``for_each_batch()``'s sink: none."""


def transform_with_state(processor: Any, *, key: str | Sequence[str], output_schema: Any, operator_id: str,
                         coordinator: str, **kw: Any) -> TransformWithState:
    """A stateful operator that runs an unmodified PySpark ``StatefulProcessor`` on Rhino state.

    - ``processor``: a ``pyspark.sql.streaming.stateful_processor.StatefulProcessor``
      (pandas mode by default: ``handleInputRows(key, Iterator[pd.DataFrame], timerValues)``;
      ``mode="rows"`` for the Row form of ``transformWithState``).
    - ``key``: the grouping column(s); ``output_schema``: a StructType or DDL string.
    - ``operator_id``: the operator's name at the coordinator (its state's identity), in
      ``namespace`` (a job's or an application's id, ``[A-Za-z0-9_-]{1,64}``; default None,
      the default namespace): two jobs may use the same name in two namespaces. The id at
      the coordinator is ``rhino.operator_id(operator_id, namespace)``. A query whose
      first batch does not follow the operator's committed batches (a fresh Spark
      checkpoint on an operator with state) is refused with ``FreshCheckpointError``,
      which names ``rhino drop``.
    - ``coordinator``: ``"host:port"`` of the coordinator (``rhino coordinator``, or one
      the driver hosts); ``secret`` / ``secret_file``: the cluster's shared secret.
    - ``tls``: a ``rhino.TLS`` when the cluster runs mutual TLS; ``{host}`` in its paths
      becomes each process's own host (the driver's, each task's executor's), so one
      setting names every host's certificate: the hosts' task certificates
      (``{host}-task.pem`` of ``rhino certs init``, role task only), not the hosts' own.
    - ``parallelism`` (instances), ``replicas`` (r, default 2), ``num_vnodes``. The
      parallelism is the initial one: a driver restarted after a rescale runs at the
      coordinator's, says so in a warning and its reports (``BatchReport.parallelism``).
      ``num_vnodes`` defaults from it (max(64, 16 x parallelism)), so keep the code's
      parallelism, or pass the operator's ``num_vnodes``, to restart it.
    - ``min_copies`` (1 to replicas + 1), ``min_copies_strict``, ``min_copies_wait_s``: the live
      copies of each instance's state a batch needs; short ones are repaired first, then the
      batch runs and says so (``BatchReport.short_of_copies``), or, strict, waits for a repair.
    - ``time_mode``: ``"None"``, ``"EventTime"`` (with ``event_time=<column>`` and
      ``watermark_delay``, e.g. ``"10 seconds"``) or ``"ProcessingTime"``: timers
      fire at the watermark or at the batch's time (fixed by the coordinator at the
      batch's first run, the same when it runs again). With ``"ProcessingTime"``,
      state variables may have a TTL (``ttlDurationMs``), measured in batch time.
    - ``checkpoint_location``: the query's Spark checkpoint location (any Hadoop
      filesystem Spark checkpoints to: ``file://``, HDFS, ``s3a://``); the operator keeps
      its watermark there, under ``rhino-<operator id>/``, through Spark's Hadoop
      filesystem API, so it survives a driver restart. Required with ``"EventTime"``.
    - ``task_window_rows`` (default 100,000): a task works through its partition (sorted by
      key) this many input rows of whole keys at a time, and streams each window's output:
      its memory is bounded by the window and the largest key, not by the partition.
    - ``initial_state``: a DataFrame (a table, e.g. ``spark.table(...)``) or ``df.groupBy(key)``,
      as Spark's ``initialState``: in the operator's first batch (batch 0, or the batch
      ``start_at`` starts it at; again if it runs again, from empty state),
      ``handleInitialState(key, rows, timerValues)`` is called for each key's initial rows
      (a pandas DataFrame, or one ``Row`` at a time in row mode) before its input rows. The
      key columns must have the input's names and types.
    - ``clock``: a function returning the time in ms that a batch's time is taken from
      at its first run (default: the wall clock; tests pass a manual clock).
    - ``watch_hosts`` (default True): while a batch runs, report a host whose executors
      Spark's driver lost to the coordinator (failover in a fraction of a second instead of
      the heartbeat timeout), and cancel an attempt that can no longer commit
      (``scheduling/host_loss.py``).
    - ``input_copies`` (default: 2 while the application has two executors or more, else
      1): each batch's input, read, routed and shuffled, is cached on the executors with
      that many copies on distinct executors (memory, then disk), and dropped when the
      batch ends. A host lost mid-batch then does not take the batch's only input with it:
      the rerun reads the other copy, with no map stage to run again and no source to read
      again. It costs a copy of each batch's input in the executors' storage memory (or
      disk), sent to another executor while the batch runs: about 9% of a steady batch in
      ``bench/results/spark_input_copies.md``. 1 turns it off.

    Use: ``query = stream.writeStream.foreachBatch(op.for_each_batch(sink)).start()``, or
    ``out = op.transform(df, batch_id)`` inside any ``foreachBatch`` function (the output
    DataFrame, on the executors; two operators can be chained this way).
    """
    return TransformWithState(processor, key=key, output_schema=output_schema, operator_id=operator_id,
                              coordinator=coordinator, **kw)
