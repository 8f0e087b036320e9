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

A primary that cannot be reached is reported to the coordinator, which fails
the instance over to a chain member (a takeover by hard links); the task then
runs again there, at the new epoch, from b-1. The driver accepts the batch
only if the epoch did not change meanwhile (``commit_batch(epoch=...)``), so a
takeover during a batch reruns the whole batch: exactly-once either way.
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
from rhino.client import connect
from rhino.errors import (PeerDeadError, RhinoError, RhinoIOError, RhinoTimeoutError, SessionBusyError,
                          StaleEpochError)

from ..state.encoding import RECORD_PREFIX, KeyRecord, decode_key
from .glue import concat_frames, group_rows
from ..state.handle import RhinoProcessorHandle
from ..state.timers import TimerIndex

__all__ = ["TaskSpec", "run_partition", "META_COLUMN"]

META_COLUMN = "_rhino_meta"
_UNREACHABLE = (PeerDeadError, RhinoIOError, RhinoTimeoutError, ConnectionError, OSError)
_CLIENTS: dict[str, Any] = {}  # per Python worker process: Spark reuses them across tasks
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


def _client(address: str, secret: bytes, timeout: float) -> Any:
    c = _CLIENTS.get(address)
    if c is None or not c.is_open:
        c = connect(address, secret=secret, client_id=f"spark-task-{os.getpid()}", request_timeout=timeout)
        _CLIENTS[address] = c
    return c


def _drop_client(address: Optional[str]) -> None:
    c = _CLIENTS.pop(address, None) if address else None
    if c is not None:
        try:
            c.close()
        except RhinoError:
            pass


def _coordinator(spec: TaskSpec) -> Any:
    c = _COORDS.get(spec.coordinator)
    if c is None:
        from rhino.coordinator.client import connect_coordinator

        c = connect_coordinator(spec.coordinator, secret=spec.secret)
        _COORDS[spec.coordinator] = c
    return c


def _address(info: dict, host: str) -> tuple[str, bool]:
    """The address to reach a primary at, and whether it is local (the Unix socket on its host)."""
    sock = info.get("unix_socket")
    if sock and info.get("host") == host and os.path.exists(sock):
        return sock, True
    return info["address"], False


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


def run_partition(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    t_start = time.time()
    ctx = TaskContext.get()
    instance = ctx.partitionId() if ctx is not None else int(spec.extra.get("instance", 0))
    attempt = ctx.attemptNumber() if ctx is not None else 0
    in_schema = _schema(spec.input_schema_json)
    out_schema = _schema(spec.output_schema_json)
    tables = [pa.Table.from_batches([b]) for b in batches]
    names = [f.name for f in in_schema.fields]
    table = pa.concat_tables(tables).select(names) if tables else None
    rows_in = table.num_rows if table is not None else 0
    t_read = time.time()

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

    host = this_host()
    placement = spec.placement
    epoch = spec.epoch
    errors: list[str] = []
    deadline = time.monotonic() + spec.failover_wait_s
    while True:
        info = placement["instances"][str(instance)]
        address, local = _address(info, host)
        try:
            out, stats = _run_once(spec, instance, epoch, placement, table, in_schema, out_schema, address)
            break
        except StaleEpochError as e:
            if not spec.wait_for_failover:
                raise
            errors.append(f"{type(e).__name__}: {e}")
            placement, epoch = _newer_placement(spec, placement, epoch, instance, deadline)
        except SessionBusyError as e:
            # A task of an attempt the driver cancelled (a new epoch) may still hold the
            # instance's session: the worker aborts it when that task's connection closes.
            if time.monotonic() > deadline:
                raise
            msg = f"{type(e).__name__}: {e}"
            if not errors or errors[-1] != msg:
                errors.append(msg)
            time.sleep(0.2)
        except _UNREACHABLE as e:
            # The primary, or a member of its chain (a barrier commit waits for the chain), is
            # gone. Report the primary: if the coordinator cannot reach it either, it fails the
            # instance over at once. A dead chain member is found by its missed heartbeats;
            # either way the epoch moves on, and the task runs again at the new one.
            errors.append(f"{type(e).__name__} at {address}: {e}")
            _drop_client(address)
            try:
                _coordinator(spec).report_unreachable(spec.operator_id, instance, info.get("primary"))
            except RhinoError as e2:
                errors.append(f"report_unreachable: {e2}")
            if not spec.wait_for_failover:
                raise
            placement, epoch = _newer_placement(spec, placement, epoch, instance, deadline)
    t_end = time.time()
    meta = {"instance": instance, "attempt": attempt, "host": host, "local": local, "primary": info.get("primary"),
            "primary_host": info.get("host"), "epoch": epoch, "rows_in": rows_in, "late_rows": late,
            "max_event_ms": max_event, "start": t_start, "read_s": t_read - t_start, "end": t_end,
            "errors": errors, **stats}
    if out is not None:
        yield _with_meta(out, meta_schema(out_schema))
    yield _meta_batch(out_schema, meta)


def _newer_placement(spec: TaskSpec, placement: dict, epoch: int, instance: int, deadline: float,
                     grace_s: float = 10.0) -> tuple[dict, int]:
    """Waits until the coordinator has moved on to a new epoch (a failover, a chain
    repair) and returns the new placement; after ``grace_s`` without one (a passing
    network error), the same placement again. Refuses a new placement whose routing
    table changed: the rows were routed by the old one, so the driver must rerun the
    batch."""
    until = min(deadline, time.monotonic() + grace_s)
    p = None
    while True:
        try:
            p = _coordinator(spec).placement(spec.operator_id)
        except RhinoError:
            p = None
        if p is not None and p["epoch"] > epoch and p["instances"][str(instance)].get("address"):
            if list(p["assignment"]) != list(placement["assignment"]):
                raise StaleEpochError(f"the routing table of {spec.operator_id} changed during batch "
                                      f"{spec.batch} (epoch {epoch} -> {p['epoch']}): the batch runs again")
            return p, int(p["epoch"])
        if time.monotonic() > until:
            if time.monotonic() > deadline:
                raise RhinoTimeoutError(f"instance {instance} of {spec.operator_id}: no new placement after "
                                        f"{spec.failover_wait_s:g} s (the coordinator is at epoch "
                                        f"{p['epoch'] if p else '?'})")
            return placement, epoch
        time.sleep(0.1)


def _run_once(spec: TaskSpec, instance: int, epoch: int, placement: dict, table: Optional[pa.Table],
              in_schema: Any, out_schema: Any, address: str) -> tuple[Optional[pa.RecordBatch], dict]:
    from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

    t0 = time.time()
    part = rhino.Partitioner(num_key_groups=placement["num_key_groups"], num_vnodes=placement["num_vnodes"],
                             seed=placement["seed"])
    assignment = np.asarray(placement["assignment"], dtype=np.int64)
    my_vnodes = np.flatnonzero(assignment == instance)
    client = _client(address, spec.secret, spec.request_timeout)
    processor = spec.processor
    handle = RhinoProcessorHandle(spec.time_mode)
    batch = _Batch()
    handle._bind(batch.record)
    handle.watermark_ms = spec.watermark_ms
    outputs: list = []
    stats: dict[str, Any] = {}
    with client.session(spec.operator_id, instance, batch=spec.batch, epoch=epoch) as s:
        t_open = time.time()
        # group the input by key: by the key's record bytes (as routing computed them), the key
        # tuple as Spark's pandas conversion gives it (what handleInputRows gets)
        groups: list[tuple[bytes, tuple, int, int]] = []
        pdf = None
        if table is not None and table.num_rows:
            pdf, groups = group_rows(table, _to_pandas(table, in_schema, spec.timezone), spec.key_columns)
        t_group = time.time()
        # expired timers (design: after the data, as Spark's processTimers)
        index = TimerIndex(part, spec.bucket_ms) if spec.time_mode == "eventtime" else None
        expired = index.expired(s, my_vnodes, spec.watermark_ms) if index is not None else []
        t_timers = time.time()
        # one prefetch of every record the batch can touch
        ekeys = sorted({g[0] for g in groups} | {ek for _, ek in expired})
        values = s.get_batch(ekeys) if ekeys else []
        for k, v in zip(ekeys, values):
            batch.records[k] = KeyRecord(v)
        for ek, kt, _, _ in groups:
            batch.records[ek].key = kt
        t_fetch = time.time()

        processor.init(handle)
        tv = TimerValues(currentProcessingTimeInMs=int(time.time() * 1000),
                         currentWatermarkInMs=spec.watermark_ms if spec.time_mode == "eventtime" else -1)
        for ek, kt, a, b in groups:
            batch.current = ek
            rows = pdf.iloc[a:b]
            if spec.mode == "rows":
                from pyspark.sql import Row

                it = iter([Row(**r) for r in rows.to_dict("records")])
            else:
                it = iter([rows])
            _collect(processor.handleInputRows(kt, it, tv), outputs, spec.mode)
        # timers that expire now: the stored ones, and ones registered just now at or before the watermark
        fired: list[tuple[int, bytes]] = []
        if index is not None:
            due = set(expired)
            for ek, r in batch.records.items():
                for ts in r.timers - r.stored_timers:
                    if ts <= spec.watermark_ms:
                        due.add((ts, ek))
            for ts, ek in sorted(due):
                r = batch.records[ek]
                if ts not in r.timers:  # deleted by the processor meanwhile
                    continue
                r.timers.discard(ts)
                r.dirty = True
                fired.append((ts, ek))
                batch.current = ek
                key = r.key if r.key is not None else decode_key(ek[len(RECORD_PREFIX):])
                _collect(processor.handleExpiredTimer(key, tv, ExpiredTimerInfo(ts)), outputs, spec.mode)
        batch.current = None
        processor.close()
        t_proc = time.time()

        # write back: records, then the timer index by difference
        puts_k: list[bytes] = []
        puts_v: list[bytes] = []
        dels: list[bytes] = []
        changes: list[tuple[int, int, bytes, bool]] = []
        dirty = [(ek, r) for ek, r in batch.records.items() if r.dirty]
        vn_of: dict[bytes, int] = {}
        if dirty:
            vns = part.vnodes([ek for ek, _ in dirty])
            vn_of = {ek: int(v) for (ek, _), v in zip(dirty, vns)}
        fired_of: dict[bytes, set[int]] = {}
        for ts, k in fired:
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
            index.remove_fired(fired, vn_of)
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
        t_write = time.time()
        res = s.commit("barrier")
        t_commit = time.time()
    out = _to_arrow(outputs, out_schema, spec.timezone) if spec.mode == "pandas" else _rows_to_arrow(outputs, out_schema)
    load: dict[str, list[float]] = {}
    if groups:
        kv = part.vnodes([g[0] for g in groups])
        sizes = np.array([g[3] - g[2] for g in groups], dtype=np.float64)
        ops = np.bincount(kv, weights=sizes, minlength=placement["num_vnodes"])
        load = {str(int(v)): [float(ops[v]), 0.0] for v in np.flatnonzero(ops)}
    stats.update(keys=len(groups), records_read=len(ekeys), records_found=sum(v is not None for v in values),
                 puts=len(puts_k), deletes=len(dels), timers_fired=len(fired),
                 output_rows=0 if out is None else out.num_rows, open_s=t_open - t0, group_s=t_group - t_open,
                 timers_s=t_timers - t_group, fetch_s=t_fetch - t_timers, process_s=t_proc - t_fetch,
                 write_s=t_write - t_proc, commit_s=t_commit - t_write, replicate_s=res.replicate_s,
                 checkpoint_bytes=int(res.stats.get("checkpoint_bytes", 0)), rolled_back=bool(s.rolled_back),
                 load=load)
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
