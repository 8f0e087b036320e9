"""One task of a Rhino stateful operator: instance i, batch b, run inside a
Spark executor's Python worker (from ``mapInArrow``; partition i = instance i).

The steps, a constant number of round trips to the instance's primary worker
whatever the number of keys and state variables (design §2, §5; the task's
meta row reports them as ``round_trips``):
1. open a session for (operator, i, b, epoch): it sees exactly version b-1;
2. event time: scan the timers due at this batch's watermark, one pipelined
   scan over the instance's vnodes;
3. prefetch the state of every key of the batch and of every due timer: one
   ``get_batch`` of the values, one pipelined scan of the collections and timer
   sets (``state/store.py``);
4. run the processor per key locally (``handleInputRows``, then
   ``handleExpiredTimer`` in (time, key) order, as Spark does);
5. write back the changed entries (``state/writeback.py``), and commit b in
   barrier mode with the batch's time (the TTL clock): the batch counts only
   once checkpoint b is complete on the chain.

The session, and what a failure means, are the engine's
(:class:`rhino.engine.InstanceRun`): a primary that cannot be reached is
reported to the coordinator, which fails the instance over to a chain member
(a takeover by hard links); the task then runs again there, at the new epoch,
from b-1. The driver accepts the batch only if the epoch did not change
meanwhile (the engine's commit carries the epoch), so a takeover during a batch
reruns the whole batch: exactly-once either way. A real error (a corrupt
checkpoint, a full disk, a wrong secret, the processor's own) is raised as
itself.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa

import rhino
from rhino.client.session import CommitResult, Session
from rhino.engine import InstanceRun, WorkerClients, vnode_load

from ..state.encoding import decode_key
from ..state.handle import RhinoProcessorHandle
from ..state.layout import vnodes_of
from ..state.store import BatchState
from ..state.variables import variables_of
from ..state.writeback import write_back
from .glue import concat_frames, group_rows

__all__ = ["TaskSpec", "run_partition", "META_COLUMN"]

META_COLUMN = "_rhino_meta"
# Per Python worker process: Spark reuses the process across tasks, and its clients with it.
_CLIENTS: dict[bytes, WorkerClients] = {}  # by the cluster's secret
_COORDS: dict[str, Any] = {}


@dataclass
class TaskSpec:
    operator_id: str
    batch: int
    epoch: int
    watermark_ms: int
    key_columns: list[str]
    processor: Any
    mode: str  # "pandas" | "rows"
    time_mode: str  # "none" | "eventtime" | "processingtime"
    event_time: Optional[str]
    input_schema_json: str
    output_schema_json: str
    timezone: str
    secret: bytes
    coordinator: str
    placement: dict
    state_doc: Optional[dict] = None  # the operator's state schema document (state/variables.py)
    batch_time_ms: int = 0  # the batch's time (the coordinator's; the same when it runs again)
    prefetch_entries: int = 64  # per collection and key: more is read on demand
    request_timeout: float = 120.0
    failover_wait_s: float = 60.0
    # False when the driver's batch watch runs (operator watch_hosts): it cancels the attempt
    # and runs the batch again at the new epoch, so a task need not wait for it itself
    wait_for_failover: bool = True
    extra: dict = field(default_factory=dict)


# ---- connections --------------------------------------------------------------------------


def this_host() -> str:
    """The host this task runs on: the executor's SPARK_LOCAL_IP (set per host, design §8),
    else the address of the host name."""
    ip = os.environ.get("SPARK_LOCAL_IP")
    if ip:
        return ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _clients(spec: TaskSpec) -> WorkerClients:
    c = _CLIENTS.get(spec.secret)
    if c is None:
        c = WorkerClients(secret=spec.secret, client_id=f"spark-task-{os.getpid()}",
                          request_timeout=spec.request_timeout)
        _CLIENTS[spec.secret] = c
    return c


def _coordinator(spec: TaskSpec) -> Any:
    c = _COORDS.get(spec.coordinator)
    if c is None:
        from rhino.coordinator.client import connect_coordinator

        c = connect_coordinator(spec.coordinator, secret=spec.secret)
        _COORDS[spec.coordinator] = c
    return c


# ---- Arrow <-> pandas, as Spark converts for transformWithStateInPandas ------------------


def _schema(js: str) -> Any:
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(js))


def _to_pandas(table: pa.Table, schema: Any, timezone: str) -> Any:
    import pandas as pd
    from pyspark.sql.conversion import ArrowArrayToPandasConversion

    cols = {}
    for f in schema.fields:
        cols[f.name] = ArrowArrayToPandasConversion.convert(table.column(f.name), f.dataType, ser_name=f.name,
                                                            timezone=timezone, struct_in_pandas="dict")
    return pd.DataFrame(cols, index=pd.RangeIndex(table.num_rows))


def _to_arrow(frames: list, schema: Any, timezone: str) -> Optional[pa.RecordBatch]:
    from pyspark.sql.conversion import PandasToArrowConversion

    pdf = concat_frames(frames)
    if not len(pdf):
        return None
    missing = [f.name for f in schema.fields if f.name not in pdf.columns]
    if missing:
        raise ValueError(f"the processor's output lacks columns {missing} of the output schema "
                         f"({schema.simpleString()}); it has {list(pdf.columns)}")
    return PandasToArrowConversion.convert(pdf[[f.name for f in schema.fields]], schema, timezone=timezone,
                                           assign_cols_by_name=True, safecheck=True)


# ---- the task -----------------------------------------------------------------------------


def _event_ms(col: pa.ChunkedArray) -> np.ndarray:
    """Event times in ms since the epoch (timestamps of any unit, or integers as ms)."""
    t = col.type
    if pa.types.is_timestamp(t):
        unit = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[t.unit]
        raw = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return (raw * unit).astype(np.int64) if unit >= 1 else raw // int(round(1 / unit))
    return col.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _read_input(spec: TaskSpec, batches: Iterator[pa.RecordBatch], in_schema: Any
                ) -> tuple[Optional[pa.Table], int, Optional[int], int]:
    """The task's rows as one table, late rows dropped: (table, rows in, the newest
    event time in ms, late rows)."""
    tables = [pa.Table.from_batches([b]) for b in batches]
    names = [f.name for f in in_schema.fields]
    table = pa.concat_tables(tables).select(names) if tables else None
    rows_in = table.num_rows if table is not None else 0
    max_event = None
    if table is not None and rows_in and spec.event_time:
        ev = _event_ms(table.column(spec.event_time))
        max_event = int(ev.max())
        # Spark drops rows at or before the watermark as late (its late-event filter).
        if spec.watermark_ms > 0:
            keep = ev > spec.watermark_ms
            if not keep.all():
                table = table.filter(pa.array(keep))
    late = rows_in - (table.num_rows if table is not None else 0)
    return table, rows_in, max_event, late


def run_partition(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    t_start = time.time()
    ctx = TaskContext.get()
    instance = ctx.partitionId() if ctx is not None else int(spec.extra.get("instance", 0))
    attempt = ctx.attemptNumber() if ctx is not None else 0
    in_schema = _schema(spec.input_schema_json)
    out_schema = _schema(spec.output_schema_json)
    table, rows_in, max_event, late = _read_input(spec, batches, in_schema)
    t_read = time.time()

    host = this_host()
    run = InstanceRun(_clients(spec), lambda: _coordinator(spec), spec.operator_id, instance, batch=spec.batch,
                      placement=spec.placement, epoch=spec.epoch, host=host,
                      wait_for_failover=spec.wait_for_failover, failover_wait_s=spec.failover_wait_s)
    done = run.run(lambda s, placement: _InstanceBatch(spec, instance, placement, table, in_schema).run(
        s, run.started_at))
    out, stats = done.finish(out_schema)
    t_end = time.time()
    info = run.info
    meta = {"instance": instance, "attempt": attempt, "host": host, "local": run.local, "primary": info.get("primary"),
            "primary_host": info.get("host"), "epoch": run.epoch, "rows_in": rows_in, "late_rows": late,
            "max_event_ms": max_event, "start": t_start, "read_s": t_read - t_start, "end": t_end,
            "errors": run.errors, **stats}
    if out is not None:
        yield _with_meta(out, meta_schema(out_schema))
    yield _meta_batch(out_schema, meta)


class _InstanceBatch:
    """One run of the processor over the batch in one session of the instance: the
    steps of the module docstring, each a method, with their timings."""

    def __init__(self, spec: TaskSpec, instance: int, placement: dict, table: Optional[pa.Table],
                 in_schema: Any) -> None:
        self.spec = spec
        self.placement = placement
        self.table = table
        self.in_schema = in_schema
        self.part = rhino.Partitioner(num_key_groups=placement["num_key_groups"],
                                      num_vnodes=placement["num_vnodes"], seed=placement["seed"])
        assignment = np.asarray(placement["assignment"], dtype=np.int64)
        self.my_vnodes = np.flatnonzero(assignment == instance)
        self.variables = variables_of(spec.state_doc)
        self.handle = RhinoProcessorHandle(spec.time_mode, self.variables)
        self.handle.watermark_ms = spec.watermark_ms
        self.st: Optional[BatchState] = None
        # per key: (routing bytes, the key tuple as the processor gets it, first row, end row)
        self.groups: list[tuple[bytes, tuple, int, int]] = []
        self.key_of: dict[bytes, tuple] = {}
        self.pdf: Any = None
        self.due: list[tuple[int, bytes]] = []
        self.outputs: list = []
        self.puts = self.deletes = 0
        self.t: dict[str, float] = {}
        self.result: Optional[CommitResult] = None
        self.rolled_back = False
        self.round_trips = 0

    def run(self, s: Session, t0: float) -> "_InstanceBatch":
        """Steps 2-5 in the open session ``s`` (opened at ``t0``)."""
        spec = self.spec
        self.t["start"], self.t["open"] = t0, time.time()
        rt0 = getattr(s, "round_trips", 0)
        self.st = BatchState(s, self.part, self.variables, batch=spec.batch, now_ms=spec.batch_time_ms,
                             timers=spec.time_mode != "none", small=spec.prefetch_entries)
        self.handle._bind(self.st)
        self._group()
        self.t["group"] = time.time()
        if spec.time_mode != "none":  # design: after the data, as Spark's processTimers
            self.due = self.st.due_timers(self.my_vnodes, _timer_time(spec))
        self.t["timers"] = time.time()
        self.st.prefetch([g[0] for g in self.groups] + [g for _, g in self.due])
        self.t["fetch"] = time.time()
        self._process()
        self.t["process"] = time.time()
        self.puts, self.deletes = write_back(self.st)
        self.t["write"] = time.time()
        self.result = s.commit("barrier", batch_time_ms=spec.batch_time_ms)
        self.t["commit"] = time.time()
        self.round_trips = getattr(s, "round_trips", 0) - rt0
        self.rolled_back = bool(s.rolled_back)
        return self

    def _group(self) -> None:
        # by the key's routing bytes (as routing computed them), the key tuple as Spark's
        # pandas conversion gives it (what handleInputRows gets)
        table = self.table
        if table is not None and table.num_rows:
            self.pdf, self.groups = group_rows(table, _to_pandas(table, self.in_schema, self.spec.timezone),
                                               self.spec.key_columns)
            self.key_of = {g: kt for g, kt, _, _ in self.groups}

    def _timer_values(self) -> Any:
        from pyspark.sql.streaming.stateful_processor import TimerValues

        spec = self.spec
        # Spark's: the batch's time unless the time mode is None, the watermark in event time
        return TimerValues(currentProcessingTimeInMs=spec.batch_time_ms if spec.time_mode != "none" else -1,
                           currentWatermarkInMs=spec.watermark_ms if spec.time_mode == "eventtime" else -1)

    def _process(self) -> None:
        spec, processor, st = self.spec, self.spec.processor, self.st
        assert st is not None
        processor.init(self.handle)
        tv = self._timer_values()
        for g, kt, a, b in self.groups:
            st.current = g
            rows = self.pdf.iloc[a:b]
            if spec.mode == "rows":
                from pyspark.sql import Row

                it = iter([Row(**r) for r in rows.to_dict("records")])
            else:
                it = iter([rows])
            _collect(processor.handleInputRows(kt, it, tv), self.outputs, spec.mode)
        if spec.time_mode != "none":
            self._fire_timers(tv)
        st.current = None
        processor.close()

    def _fire_timers(self, tv: Any) -> None:
        """The timers that expire now: the stored ones, and ones registered just now at or
        before the watermark, in (time, key) order."""
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo

        st, wm = self.st, _timer_time(self.spec)
        assert st is not None
        due = set(self.due)
        for g, cell in st.timers.items():
            for ts in cell.now - cell.stored:
                if ts <= wm:
                    due.add((ts, g))
        for ts, g in sorted(due):
            st.current = g
            cell = st.timer_cell()
            if ts not in cell.now:  # deleted by the processor meanwhile
                continue
            cell.now.discard(ts)
            cell.stored.discard(ts)  # fired: deleted at the write-back, even if registered again
            st.fired.append((ts, g))
            key = self.key_of.get(g)
            if key is None:
                key = decode_key(g)
            _collect(self.spec.processor.handleExpiredTimer(key, tv, ExpiredTimerInfo(ts)), self.outputs,
                     self.spec.mode)

    def finish(self, out_schema: Any) -> tuple[Optional[pa.RecordBatch], dict]:
        """The output as Arrow, and the task's stats (its meta row) with the batch's per-vnode load."""
        spec, t, res, st = self.spec, self.t, self.result, self.st
        assert res is not None and st is not None
        out = (_to_arrow(self.outputs, out_schema, spec.timezone) if spec.mode == "pandas"
               else _rows_to_arrow(self.outputs, out_schema))
        load: dict[str, list[float]] = {}
        if self.groups:
            load = vnode_load(vnodes_of(self.part, [g[0] for g in self.groups]), self.placement["num_vnodes"],
                              ops=[g[3] - g[2] for g in self.groups])
        stats = dict(keys=len(self.groups), puts=self.puts, deletes=self.deletes, timers_fired=len(st.fired),
                     output_rows=0 if out is None else out.num_rows, round_trips=self.round_trips,
                     open_s=t["open"] - t["start"], group_s=t["group"] - t["open"], timers_s=t["timers"] - t["group"],
                     fetch_s=t["fetch"] - t["timers"], process_s=t["process"] - t["fetch"],
                     write_s=t["write"] - t["process"], commit_s=t["commit"] - t["write"],
                     replicate_s=res.replicate_s, checkpoint_bytes=int(res.stats.get("checkpoint_bytes", 0)),
                     delta_bytes=int(res.stats.get("delta_bytes", 0)), delta_files=int(res.stats.get("delta_files", 0)),
                     rolled_back=self.rolled_back, load=load, **st.stats)
        return out, stats


def _timer_time(spec: TaskSpec) -> int:
    """The time timers fire at: the watermark in event time, the batch's time in processing time."""
    return spec.watermark_ms if spec.time_mode == "eventtime" else spec.batch_time_ms


def _collect(result: Any, outputs: list, mode: str) -> None:
    if result is None:
        return
    for item in result:
        outputs.append(item)


def _rows_to_arrow(rows: list, schema: Any) -> Optional[pa.RecordBatch]:
    import pandas as pd

    if not rows:
        return None
    pdf = pd.DataFrame([r.asDict() if hasattr(r, "asDict") else dict(r) for r in rows])
    return _to_arrow([pdf], schema, "UTC")


def meta_schema(out_schema: Any) -> pa.Schema:
    """The Arrow schema of the task's output: the operator's columns (nullable) and the meta column."""
    from pyspark.sql.pandas.types import to_arrow_schema

    base = to_arrow_schema(out_schema)
    fields = [f.with_nullable(True) for f in base] + [pa.field(META_COLUMN, pa.string(), True)]
    return pa.schema(fields)


def _with_meta(rb: pa.RecordBatch, sch: pa.Schema) -> pa.RecordBatch:
    cols = [rb.column(i) for i in range(rb.num_columns)] + [pa.nulls(rb.num_rows, pa.string())]
    return pa.RecordBatch.from_arrays(cols, schema=sch)


def _meta_batch(out_schema: Any, meta: dict) -> pa.RecordBatch:
    sch = meta_schema(out_schema)
    cols = [pa.nulls(1, f.type) for f in sch][:-1] + [pa.array([json.dumps(meta, default=str)], pa.string())]
    return pa.RecordBatch.from_arrays(cols, schema=sch)
