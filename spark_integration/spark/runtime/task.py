"""One task of a Rhino stateful operator: instance i, batch b, run inside a
Spark executor's Python worker (from ``mapInArrow``; partition i = instance i).

The task streams: its rows arrive sorted by key (the driver sorts each partition,
as Spark's own operator does), and it works through them a **window** of whole
keys at a time: at most ``task_window_rows`` rows, or one key's rows if that key
has more. Its memory is bounded by the window and the largest key, not by the
partition. Per window, a constant number of round trips to the instance's
primary worker, whatever the number of keys and state variables (design §2, §5;
the meta row reports ``round_trips`` and ``windows``):
1. open a session for (operator, i, b, epoch), once: it sees exactly version b-1;
2. per window: prefetch the state of its keys (one ``get_batch`` of the
   values, one pipelined scan of the collections and timer sets:
   ``state/store.py``), run the processor per key (``handleInitialState`` with
   the key's initial-state rows in the first batch, ``runtime/initial.py``; then
   ``handleInputRows``), write
   the changes back into the session (``state/writeback.py``), and stream the
   window's output to Spark as Arrow;
3. then the timers due at this batch's time (the watermark in event time, the
   batch's time in processing time): one pipelined scan over the instance's
   vnodes (it sees what step 2 wrote, so timers registered in this batch are
   among them), fired in (time, key) order, as Spark does, in windows of keys;
4. commit b in barrier mode with the batch's time (the TTL clock): the batch
   counts only once checkpoint b is complete on the chain.

The session, and what a failure means, are the engine's
(:class:`rhino.engine.InstanceRun`): a primary that cannot be reached when the
session opens is reported to the coordinator, which fails the instance over to a
chain member (a takeover by hard links); the task then runs again there, at the
new epoch, from b-1. A failure after the task began streaming output raises:
Spark drops the failed attempt's output and runs the task again. The driver
accepts the batch only if the epoch did not change meanwhile (the engine's commit
carries the epoch), so a takeover during a batch reruns the whole batch:
exactly-once either way. With the driver's batch watch on, a task whose attempt is
doomed (the epoch moved on) ends its own Python worker rather than wait for Spark's
monitor to kill it (``runtime/doomed.py``). A real error (a corrupt checkpoint, a full disk, a wrong
secret, the processor's own) is raised as itself.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa

import rhino
from rhino.client.session import CommitResult, Session
from rhino.coordinator.types import Placement
from rhino.engine import InstanceRun, vnode_load

from ..state.encoding import decode_key
from ..state.handle import RhinoProcessorHandle
from ..state.layout import vnodes_of
from ..state.store import BatchState
from ..state.variables import VarInfo, heads_dropped_in, variables_of
from ..state.writeback import write_back
from ..driver.attempt import AttemptSpec
from ..driver.config import PREFETCH_ENTRIES, OperatorConfig
from .doomed import DoomedAttemptWatch
from .connections import clients, coordinator, primary_epoch, this_host
from .convert import (frames_to_arrow, output_arrow_schema, row_groups, rows_of, rows_to_arrow, spark_schema,
                      to_pandas)
from .glue import OutputFrames, group_rows
from .initial import SIDE, Sides

__all__ = ["run_partition"]




# ---- the task -----------------------------------------------------------------------------


def _event_ms(col: pa.ChunkedArray) -> np.ndarray:
    """Event times in ms since the epoch (timestamps of any unit, or integers as ms)."""
    t = col.type
    if pa.types.is_timestamp(t):
        unit = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[t.unit]
        raw = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return (raw * unit).astype(np.int64) if unit >= 1 else raw // int(round(1 / unit))
    return col.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _key_starts(table: pa.Table, key_columns: list[str]) -> np.ndarray:
    """The rows (after the first) where a new key begins; the rows are sorted by key."""
    import pyarrow.compute as pc

    n = table.num_rows
    changed = np.zeros(max(n - 1, 0), dtype=bool)
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    for c in key_columns:
        col = table.column(c)
        a, b = col.slice(1), col.slice(0, n - 1)
        ne = pc.fill_null(pc.not_equal(a, b), True)  # a null next to a value differs...
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))  # ...two nulls are one key
        ne = pc.and_(ne, pc.invert(both_null))
        changed |= np.asarray(ne.to_numpy(zero_copy_only=False), dtype=bool)
    return np.flatnonzero(changed) + 1


def windows(batches: Iterator[pa.RecordBatch], names: list[str], key_columns: list[str],
            window_rows: int) -> Iterator[pa.Table]:
    """The task's rows (sorted by key) in tables of whole keys: at most ``window_rows`` rows
    each, or one key's rows if that key has more."""
    buf: Optional[pa.Table] = None
    for rb in batches:
        if not rb.num_rows:
            continue
        t = pa.Table.from_batches([rb]).select(names)
        buf = t if buf is None else pa.concat_tables([buf, t])
        while buf.num_rows > window_rows:
            starts = _key_starts(buf, key_columns)
            fit = starts[starts <= window_rows]
            if len(fit):
                cut = int(fit[-1])
            else:  # the first key alone is larger than a window: it is one, once it ends
                more = starts[starts > window_rows]
                if not len(more):
                    break
                cut = int(more[0])
            yield buf.slice(0, cut)
            buf = buf.slice(cut)
    if buf is not None and buf.num_rows:
        yield buf


def run_partition(cfg: OperatorConfig, spec: AttemptSpec,
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task of partition p (instance ``spec.instances[p]``) of one attempt."""
    from pyspark import TaskContext

    t_start = time.time()
    ctx = TaskContext.get()
    instance = spec.instances[ctx.partitionId() if ctx is not None else 0]
    attempt = ctx.attemptNumber() if ctx is not None else 0
    host = this_host()
    # with the driver's batch watch on, a task of an attempt it cancels ends itself
    # (runtime/doomed.py); without it, the task waits for a failover itself (InstanceRun)
    watch: Any = contextlib.nullcontext()
    if cfg.watch_hosts:
        watch = DoomedAttemptWatch(lambda: coordinator(cfg), cfg.operator_id, spec.epoch,
                                   local_epoch=primary_epoch(cfg, spec, instance, host),
                                   what=f"the task of instance {instance}, batch {spec.batch} (driver attempt "
                                        f"{spec.attempt}, epoch {spec.epoch})")
    with watch:
        yield from _run_instance(cfg, spec, instance, attempt, host, t_start, batches)


def _run_instance(cfg: OperatorConfig, spec: AttemptSpec, instance: int, attempt: int, host: str, t_start: float,
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    out_arrow = output_arrow_schema(cfg.output_schema)
    # with the driver's watch on, the driver cancels the attempt and runs the batch again at
    # the new epoch, so the task need not wait for a failover itself
    run = InstanceRun(clients(cfg), lambda: coordinator(cfg), cfg.operator_id, instance, batch=spec.batch,
                      placement=spec.placement, epoch=spec.epoch, host=host,
                      wait_for_failover=not cfg.watch_hosts, failover_wait_s=cfg.failover_wait_s)
    s = run.open()
    ib = _InstanceBatch(cfg, spec, instance, run.placement)
    try:
        with s:
            for rb in ib.run(s, run.started_at, batches):
                # nullable, and a timestamp's zone is UTC (an instant either way: Spark reads it so)
                yield pa.RecordBatch.from_arrays([c if c.type == f.type else c.cast(f.type)
                                                  for c, f in zip(rb.columns, out_arrow)], schema=out_arrow)
    except BaseException as e:
        run.failed(e)
        raise
    info = run.info
    meta = {"batch": spec.batch, "driver_attempt": spec.attempt, "instance": instance, "attempt": attempt,
            "host": host, "local": run.local, "primary": run.primary, "primary_host": info.host if info else None,
            "epoch": run.epoch, "start": t_start, "end": time.time(), "errors": run.errors, **ib.stats()}
    if spec.meta is not None:  # to the driver with the task's completion (runtime/meta.py)
        spec.meta.add([meta])


class _InstanceBatch:
    """One run of the processor over the batch in one session of the instance: the
    steps of the module docstring, window by window, with their timings."""

    def __init__(self, cfg: OperatorConfig, spec: AttemptSpec, instance: int, placement: Placement) -> None:
        self.cfg, self.spec = cfg, spec
        self.keys = cfg.keys
        self.placement = placement
        self.in_schema = spark_schema(spec.input_schema_json)
        self.out_schema = cfg.output_schema
        self.part = rhino.Partitioner(**placement.partitioner_args())
        assignment = np.asarray(placement.assignment, dtype=np.int64)
        self.my_vnodes = np.flatnonzero(assignment == instance)
        self.variables = variables_of(spec.state_doc)
        self.handle = RhinoProcessorHandle(cfg.time_mode, self.variables)
        self.handle.watermark_ms = spec.watermark_ms
        self.st: Optional[BatchState] = None
        self.key_of: dict[bytes, tuple] = {}
        self.result: Optional[CommitResult] = None
        self.rolled_back = False
        self.round_trips = 0
        self.t = dict.fromkeys(("read", "group", "timers", "fetch", "process", "write", "commit"), 0.0)
        self.n = dict(rows_in=0, late_rows=0, keys=0, puts=0, deletes=0, timers_fired=0, output_rows=0, windows=0,
                      max_window_rows=0)
        self.store_stats: dict[str, int] = {}
        self.max_event: Optional[int] = None
        self.load_keys: list[bytes] = []
        self.load_ops: list[int] = []
        self.open_s = 0.0

    def _clock(self, phase: str, t0: float) -> float:
        now = time.time()
        self.t[phase] += now - t0
        return now

    def _state(self, s: Session) -> BatchState:
        """A fresh BatchState for a window (what the last one held was written back)."""
        if self.st is not None:
            for k, v in self.st.stats.items():
                self.store_stats[k] = self.store_stats.get(k, 0) + v
        spec = self.spec
        self.st = BatchState(s, self.part, self.variables, batch=spec.batch, now_ms=spec.batch_time_ms,
                             timers=self.cfg.time_mode != "none", small=PREFETCH_ENTRIES)
        self.handle._bind(self.st)
        return self.st

    def run(self, s: Session, t0: float, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Steps 2-4 in the open session ``s`` (opened at ``t0``): yields the output."""
        cfg = self.cfg
        self.open_s = time.time() - t0
        rt0 = getattr(s, "round_trips", 0)
        cfg.processor.init(self.handle)
        if cfg.migrate is not None and cfg.migrate_batch == self.spec.batch:
            self._migrate(s)
        self._drop_variables(s)
        tv = self._timer_values()
        names = [f.name for f in self.in_schema.fields]
        t = time.time()
        for window in windows(batches, names, self.keys, cfg.task_window_rows):
            t = self._clock("read", t)
            out = self._input_window(s, window, tv)
            if out is not None:
                yield out
            t = time.time()
        self._clock("read", t)
        if cfg.time_mode != "none":
            yield from self._timers(s, tv)
        cfg.processor.close()
        t = time.time()
        self.result = s.commit("barrier", batch_time_ms=self.spec.batch_time_ms)
        self._clock("commit", t)
        self._state(s)  # folds the last window's store stats in
        self.round_trips = getattr(s, "round_trips", 0) - rt0
        self.rolled_back = bool(s.rolled_back)

    def _migrate(self, s: Session, page: int = 4096) -> None:
        """A swap's per-key migration, in its batch (driver/swap.py): ``migrate(key, old,
        processor)`` once per grouping key with an entry of an old variable in the instance,
        a window of keys at a time; ``old`` reads the old variables (as the old code wrote
        them, never written here), the processor's own are written back as after its input."""
        cfg, spec = self.cfg, self.spec
        old_vars = {name: VarInfo(name, e) for name, e in (cfg.migrate_from or {}).items()}
        gs: set[bytes] = set()
        for var in old_vars.values():
            for k, _ in s.scan(prefix=var.heads.head, page_size=page):
                parts = rhino.split_routed_key(k)
                if parts is not None:
                    gs.add(parts[1])
        old_handle = RhinoProcessorHandle(cfg.time_mode, old_vars)
        old = {name: old_handle._get(v.kind, name) for name, v in old_vars.items()}
        keys = sorted(gs)
        step = cfg.task_window_rows
        for i in range(0, len(keys), step):
            chunk = keys[i:i + step]
            st = self._state(s)
            before = BatchState(s, self.part, old_vars, batch=spec.batch, now_ms=spec.batch_time_ms, timers=False,
                                small=PREFETCH_ENTRIES)
            old_handle._bind(before)
            t = time.time()
            st.prefetch(chunk)
            before.prefetch(chunk)
            for g in chunk:
                st.current = before.current = g
                cfg.migrate(decode_key(g), old, cfg.processor)
            st.current = before.current = None
            self._write_back(st, t)
        self.n["migrated_keys"] = len(keys)

    def _drop_variables(self, s: Session, page: int = 4096) -> None:
        """The variables ``init`` dropped (``deleteIfExists``): every entry of theirs in the
        instance's vnodes is deleted in the session, before the batch's rows. One paged scan
        per variable (a round trip when it is already empty)."""
        n = 0
        # and those a code change removed in this batch (a swap's, issue 47)
        for head in self.handle.heads_dropped() + heads_dropped_in(self.spec.state_doc, self.spec.batch):
            keys: list[bytes] = []
            for k, _ in s.scan(prefix=head, page_size=page):
                keys.append(k)
                if len(keys) >= page:
                    s.delete_batch(keys)
                    n, keys = n + len(keys), []
            if keys:
                s.delete_batch(keys)
                n += len(keys)
        self.n["dropped_entries"] = n

    def _input_window(self, s: Session, table: pa.Table, tv: Any) -> Optional[pa.RecordBatch]:
        cfg, spec = self.cfg, self.spec
        table = self._drop_late(table)
        self.n["windows"] += 1
        self.n["max_window_rows"] = max(self.n["max_window_rows"], table.num_rows)
        if not table.num_rows:
            return None
        st = self._state(s)
        t = time.time()
        if cfg.mode == "rows":
            pdf, groups = row_groups(table, self.keys)
        else:
            pdf, groups = group_rows(table, to_pandas(table, self.in_schema, spec.timezone,
                                                       padded=spec.initial_columns is not None), self.keys)
        # the key tuples as handleInputRows gets them, for timers fired in this window (only its
        # keys: memory stays bounded; timers of other keys get decode_key's tuples)
        self.key_of = {g: kt for g, kt, _, _ in groups}
        t = self._clock("group", t)
        st.prefetch([g[0] for g in groups])
        t = self._clock("fetch", t)
        outputs: Any = [] if cfg.mode == "rows" else OutputFrames()
        sides = Sides(pdf, self.keys, spec.input_columns or [f.name for f in self.in_schema.fields],
                      spec.initial_columns)
        # row mode: the window's Row objects made in one pass, each key's a slice of them
        window_rows = rows_of(sides.data) if cfg.mode == "rows" and spec.initial_columns is None else None
        for g, kt, a, b in groups:
            st.current = g
            init, a = sides.split(a, b)
            if init is not None:
                # what it returns is dropped, as Spark drops it (it has no output)
                for one in (rows_of(init) if cfg.mode == "rows" else [init]):
                    cfg.processor.handleInitialState(kt, one, tv)
            if a == b:
                continue
            if window_rows is not None:
                it = iter(window_rows[a:b])
            elif cfg.mode == "rows":
                it = iter(rows_of(sides.rows(a, b)))
            else:  # in frames of at most maxRecordsPerBatch rows, as Spark hands them over
                step = spec.max_records_per_batch or (b - a)
                it = (sides.rows(i, min(i + step, b)) for i in range(a, b, step))
            _collect(cfg.processor.handleInputRows(kt, it, tv), outputs, cfg.mode)
        st.current = None
        self.n["keys"] += len(groups)
        self.load_keys += [g[0] for g in groups]
        self.load_ops += [g[3] - g[2] for g in groups]
        t = self._clock("process", t)
        self._write_back(st, t)
        return self._output(outputs)

    def _drop_late(self, table: pa.Table) -> pa.Table:
        """Counts the window's rows and event times; drops the rows at or before the previous
        batch's watermark (``spec.late_watermark_ms``), as Spark's late-event filter does
        (``eventTimeWatermarkForLateEvents``; timers fire at this batch's own watermark)."""
        spec = self.spec
        data = None  # with an initial state: which rows are input rows (the rest are kept)
        if spec.initial_columns is not None and table.num_rows:
            data = table.column(SIDE).to_numpy(zero_copy_only=False) == 1
        self.n["rows_in"] += table.num_rows if data is None else int(data.sum())
        event_time = self.cfg.event_time
        if not event_time or not table.num_rows or (data is not None and not data.any()):
            return table
        ev = _event_ms(table.column(event_time))
        mx = int(ev.max() if data is None else ev[data].max())
        self.max_event = mx if self.max_event is None else max(self.max_event, mx)
        if spec.late_watermark_ms > 0:
            keep = ev > spec.late_watermark_ms
            if data is not None:
                keep = keep | ~data
            if not keep.all():
                self.n["late_rows"] += int((~keep).sum())
                table = table.filter(pa.array(keep))
        return table

    def _write_back(self, st: BatchState, t: float) -> None:
        puts, deletes = write_back(st)
        self.n["puts"] += puts
        self.n["deletes"] += deletes
        self._clock("write", t)

    def _output(self, outputs: Any) -> Optional[pa.RecordBatch]:
        if isinstance(outputs, OutputFrames):
            outputs = outputs.frames()
        out = (frames_to_arrow(outputs, self.out_schema, self.spec.timezone) if self.cfg.mode == "pandas"
               else rows_to_arrow(outputs, self.out_schema))
        if out is not None:
            self.n["output_rows"] += out.num_rows
        return out

    def _timer_values(self) -> Any:
        from pyspark.sql.streaming.stateful_processor import TimerValues

        spec = self.spec
        # Spark's (PySpark's get_timestamps): -1 and -1 in time mode None; otherwise the batch's
        # time and the watermark, which is 0 in processing time (no event-time watermark)
        given = self.cfg.time_mode != "none"
        return TimerValues(currentProcessingTimeInMs=spec.batch_time_ms if given else -1,
                           currentWatermarkInMs=spec.watermark_ms if given else -1)

    def _timers(self, s: Session, tv: Any) -> Iterator[pa.RecordBatch]:
        """Step 3: the stored timers due now (those registered by this batch's input too, which
        the session has), fired in (time, key) order, a window of them at a time."""
        t = time.time()
        due = self._state(s).due_timers(self.my_vnodes, _timer_time(self.cfg, self.spec))
        t = self._clock("timers", t)
        step = self.cfg.task_window_rows
        for i in range(0, len(due), step):
            chunk = due[i:i + step]
            st = self._state(s) if i else self.st
            assert st is not None
            st.prefetch([g for _, g in chunk])
            t = self._clock("fetch", t)
            outputs: Any = [] if self.cfg.mode == "rows" else OutputFrames()
            self._fire(st, chunk, tv, outputs)
            t = self._clock("process", t)
            self._write_back(st, t)
            out = self._output(outputs)
            if out is not None:
                yield out
            t = time.time()

    def _fire(self, st: BatchState, due: list[tuple[int, bytes]], tv: Any, outputs: list) -> None:
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo

        for ts, g in due:
            st.current = g
            cell = st.timer_cell()
            if ts not in cell.now:  # deleted by the processor meanwhile
                continue
            st.fired.append((ts, g))
            self.n["timers_fired"] += 1
            key = self.key_of.get(g)
            if key is None:
                key = decode_key(g)
            # the firing timer is still listed during its own callback, and deleted after it
            # (even if the callback registered it again), as PySpark deletes it
            _collect(self.cfg.processor.handleExpiredTimer(key, tv, ExpiredTimerInfo(ts)), outputs,
                     self.cfg.mode)
            cell = st.timer_cell()
            cell.now.discard(ts)
            cell.stored.discard(ts)  # fired: deleted at the write-back
        st.current = None

    def stats(self) -> dict:
        """The task's stats (its meta row), with the batch's per-vnode load."""
        t, res = self.t, self.result
        assert res is not None
        load: dict[str, list[float]] = {}
        if self.load_keys:
            load = vnode_load(vnodes_of(self.part, self.load_keys), self.placement.num_vnodes, ops=self.load_ops)
        return dict(self.n, max_event_ms=self.max_event, round_trips=self.round_trips, read_s=t["read"],
                    open_s=self.open_s, group_s=t["group"], timers_s=t["timers"], fetch_s=t["fetch"],
                    process_s=t["process"], write_s=t["write"], commit_s=t["commit"], replicate_s=res.replicate_s,
                    checkpoint_bytes=int(res.stats.get("checkpoint_bytes", 0)),
                    delta_bytes=int(res.stats.get("delta_bytes", 0)), delta_files=int(res.stats.get("delta_files", 0)),
                    rolled_back=self.rolled_back, load=load, **self.store_stats)


def _timer_time(cfg: OperatorConfig, spec: AttemptSpec) -> int:
    """The time timers fire at: the watermark in event time, the batch's time in processing time."""
    return spec.watermark_ms if cfg.time_mode == "eventtime" else spec.batch_time_ms


def _collect(result: Any, outputs: Any, mode: str) -> None:
    if result is None:
        return
    for item in result:
        outputs.append(item)
