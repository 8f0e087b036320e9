"""One task of a Rhino stateful operator: instance i, batch b, run inside a
Spark executor's Python worker (from ``mapInArrow``; partition i = instance i).

The steps, one round trip each to the instance's primary worker (design §2, §5):
1. open a session for (operator, i, b, epoch): it sees exactly version b-1;
2. event time: scan the timer index for what expires at this batch's watermark;
3. prefetch the key records of every key of the batch and of every expiring
   timer in **one** ``get_batch``;
4. run the processor per key locally (``handleInputRows``, then
   ``handleExpiredTimer`` in (time, key) order, as Spark does);
5. write back the changed records and timer buckets, and commit b in barrier
   mode: the batch counts only once checkpoint b is complete on the chain.

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

from ..state.encoding import RECORD_PREFIX, KeyRecord, decode_key
from .glue import concat_frames, group_rows
from ..state.handle import RhinoProcessorHandle
from ..state.timers import TimerIndex

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
    time_mode: str  # "none" | "eventtime"
    event_time: Optional[str]
    input_schema_json: str
    output_schema_json: str
    timezone: str
    secret: bytes
    coordinator: str
    placement: dict
    bucket_ms: int = 1000
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
    import pandas as pd
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


class _Batch:
    """The key records of one batch of one instance."""

    def __init__(self) -> None:
        self.records: dict[bytes, KeyRecord] = {}
        self.current: Optional[bytes] = None

    def record(self) -> KeyRecord:
        return self.records[self.current]  # type: ignore[index]


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
        self.batch = _Batch()
        self.handle = RhinoProcessorHandle(spec.time_mode)
        self.handle._bind(self.batch.record)
        self.handle.watermark_ms = spec.watermark_ms
        self.index = TimerIndex(self.part, spec.bucket_ms) if spec.time_mode == "eventtime" else None
        # per key: (record key bytes, the key tuple as the processor gets it, first row, end row)
        self.groups: list[tuple[bytes, tuple, int, int]] = []
        self.pdf: Any = None
        self.expired: list[tuple[int, bytes]] = []
        self.fired: list[tuple[int, bytes]] = []
        self.outputs: list = []
        self.fetched: list[Optional[bytes]] = []
        self.puts = self.deletes = 0
        self.t: dict[str, float] = {}
        self.result: Optional[CommitResult] = None
        self.rolled_back = False

    def run(self, s: Session, t0: float) -> "_InstanceBatch":
        """Steps 2-5 in the open session ``s`` (opened at ``t0``)."""
        self.t["start"], self.t["open"] = t0, time.time()
        self._group()
        self.t["group"] = time.time()
        if self.index is not None:  # design: after the data, as Spark's processTimers
            self.expired = self.index.expired(s, self.my_vnodes, self.spec.watermark_ms)
        self.t["timers"] = time.time()
        self._prefetch(s)
        self.t["fetch"] = time.time()
        self._process()
        self.t["process"] = time.time()
        self._write_back(s)
        self.t["write"] = time.time()
        self.result = s.commit("barrier")
        self.t["commit"] = time.time()
        self.rolled_back = bool(s.rolled_back)
        return self

    def _group(self) -> None:
        # by the key's record bytes (as routing computed them), the key tuple as Spark's
        # pandas conversion gives it (what handleInputRows gets)
        table = self.table
        if table is not None and table.num_rows:
            self.pdf, self.groups = group_rows(table, _to_pandas(table, self.in_schema, self.spec.timezone),
                                               self.spec.key_columns)

    def _prefetch(self, s: Session) -> None:
        """One get_batch of every record the batch can touch."""
        ekeys = sorted({g[0] for g in self.groups} | {ek for _, ek in self.expired})
        self.fetched = s.get_batch(ekeys) if ekeys else []
        for k, v in zip(ekeys, self.fetched):
            self.batch.records[k] = KeyRecord(v)
        for ek, kt, _, _ in self.groups:
            self.batch.records[ek].key = kt

    def _process(self) -> None:
        from pyspark.sql.streaming.stateful_processor import TimerValues

        spec, processor, batch = self.spec, self.spec.processor, self.batch
        processor.init(self.handle)
        tv = TimerValues(currentProcessingTimeInMs=int(time.time() * 1000),
                         currentWatermarkInMs=spec.watermark_ms if spec.time_mode == "eventtime" else -1)
        for ek, kt, a, b in self.groups:
            batch.current = ek
            rows = self.pdf.iloc[a:b]
            if spec.mode == "rows":
                from pyspark.sql import Row

                it = iter([Row(**r) for r in rows.to_dict("records")])
            else:
                it = iter([rows])
            _collect(processor.handleInputRows(kt, it, tv), self.outputs, spec.mode)
        if self.index is not None:
            self._fire_timers(tv)
        batch.current = None
        processor.close()

    def _fire_timers(self, tv: Any) -> None:
        """The timers that expire now: the stored ones, and ones registered just now at or
        before the watermark, in (time, key) order."""
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo

        batch, wm = self.batch, self.spec.watermark_ms
        due = set(self.expired)
        for ek, r in batch.records.items():
            for ts in r.timers - r.stored_timers:
                if ts <= wm:
                    due.add((ts, ek))
        for ts, ek in sorted(due):
            r = batch.records[ek]
            if ts not in r.timers:  # deleted by the processor meanwhile
                continue
            r.timers.discard(ts)
            r.dirty = True
            self.fired.append((ts, ek))
            batch.current = ek
            key = r.key if r.key is not None else decode_key(ek[len(RECORD_PREFIX):])
            _collect(self.spec.processor.handleExpiredTimer(key, tv, ExpiredTimerInfo(ts)), self.outputs,
                     self.spec.mode)

    def _write_back(self, s: Session) -> None:
        """The changed records, then the timer index by difference."""
        index = self.index
        puts_k: list[bytes] = []
        puts_v: list[bytes] = []
        dels: list[bytes] = []
        changes: list[tuple[int, int, bytes, bool]] = []
        dirty = [(ek, r) for ek, r in self.batch.records.items() if r.dirty]
        vn_of: dict[bytes, int] = {}
        if dirty:
            vns = self.part.vnodes([ek for ek, _ in dirty])
            vn_of = {ek: int(v) for (ek, _), v in zip(dirty, vns)}
        fired_of: dict[bytes, set[int]] = {}
        for ts, k in self.fired:
            fired_of.setdefault(k, set()).add(ts)
        for ek, r in dirty:
            if r.empty():
                dels.append(ek)
            else:
                puts_k.append(ek)
                puts_v.append(r.encode())
            if index is not None:
                fired_here = fired_of.get(ek, set())
                for ts in r.timers - r.stored_timers:
                    changes.append((vn_of[ek], ts, ek, True))
                for ts in r.stored_timers - r.timers - fired_here:
                    changes.append((vn_of[ek], ts, ek, False))
        if index is not None:
            index.remove_fired(self.fired, vn_of)
            if changes:
                index.update(s, changes)
            pk, pv, dk = index.writes()
            puts_k += pk
            puts_v += pv
            dels += dk
        if puts_k:
            s.put_batch(puts_k, puts_v)
        if dels:
            s.delete_batch(dels)
        self.puts, self.deletes = len(puts_k), len(dels)

    def finish(self, out_schema: Any) -> tuple[Optional[pa.RecordBatch], dict]:
        """The output as Arrow, and the task's stats (its meta row) with the batch's per-vnode load."""
        spec, t, res = self.spec, self.t, self.result
        assert res is not None
        out = (_to_arrow(self.outputs, out_schema, spec.timezone) if spec.mode == "pandas"
               else _rows_to_arrow(self.outputs, out_schema))
        load: dict[str, list[float]] = {}
        if self.groups:
            load = vnode_load(self.part.vnodes([g[0] for g in self.groups]), self.placement["num_vnodes"],
                              ops=[g[3] - g[2] for g in self.groups])
        stats = dict(keys=len(self.groups), records_read=len(self.fetched),
                     records_found=sum(v is not None for v in self.fetched), puts=self.puts, deletes=self.deletes,
                     timers_fired=len(self.fired), output_rows=0 if out is None else out.num_rows,
                     open_s=t["open"] - t["start"], group_s=t["group"] - t["open"], timers_s=t["timers"] - t["group"],
                     fetch_s=t["fetch"] - t["timers"], process_s=t["process"] - t["fetch"],
                     write_s=t["write"] - t["process"], commit_s=t["commit"] - t["write"],
                     replicate_s=res.replicate_s, checkpoint_bytes=int(res.stats.get("checkpoint_bytes", 0)),
                     rolled_back=self.rolled_back, load=load)
        return out, stats


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
