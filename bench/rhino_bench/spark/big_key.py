"""``rhino-bench spark big-key``: one grouping key whose MapState holds ``--size`` (1 GiB)
of entries, written, read back through the processor and through the state reader, and
moved by a handover (issue 27: "a key with 1 GiB of MapState is written, read back
through the processor and through the state reader, and moved by a handover").

    rhino-bench spark big-key --json --out bench/results/big_key.jsonl \\
        --report bench/results/big_key.md

Everything goes through the public API: ``rhino.spark.transform_with_state`` and its
``process_batch(df, batch_id)`` (what ``foreachBatch`` calls), the coordinator client's
``handover`` / ``placement`` / ``status``, and ``spark.read.format("rhino-state")``.

Setup: a ``rhino coordinator`` process and ``--partitions`` (3) ``rhino worker``
processes on 127.0.0.N.. (``--first-host``), r = ``--replicas`` (2), a local Spark
(``local[2]``); one operator of ``--partitions`` instances running
:class:`RecordStoreProcessor`, an ordinary ``StatefulProcessor``: per key a MapState
``records`` (``rid long`` -> ``seq long, payload binary``); an input row ``(k, FILL, a, n)``
makes it store records ``a .. a+n-1`` of key k (``updateValue`` per record; the payload
of record j is ``--value-bytes`` bytes derived from (k, j), incompressible), a row
``(k, SCAN, 0, 0)`` makes it iterate the key's map (``iterator()``) and emit one row:
the entries, the sum of the record ids, of ``seq``, of ``crc32(payload)`` and of the
payload lengths.

Steps (one JSON line each, ``record: "step"``; every line has the command and parameters):

1. ``fill``: key 0's map grows to ``--size`` of payload (``size // value_bytes`` records)
   over batches of at most ``--batch-bytes`` of payload (a worker session holds at most
   1 GiB of uncommitted writes), each batch also filling ``--small-keys`` small keys
   (``--small-entries`` records each). Per batch: its time and parts (the driver's
   begin, the Spark job, the commit), the big key's task (process, write-back, commit,
   replication), the key and value bytes the workers committed (their metrics).
2. ``read_processor``: one batch of SCAN rows for every key; the outputs are compared
   with a model of what was written (records, sums of ids, seq, crc32 and lengths,
   computed in the driver from the fill plan), not with anything Rhino says.
3. ``read_state_reader``: ``spark.read.format("rhino-state")`` of ``records`` at that
   batch; per key, the rows, the same sums by Spark SQL aggregates (``crc32``,
   ``length``), the ``partition_id`` (the key's instance), compared with the model.
4. ``handover``: the big key's vnode (``layout.vnodes_of(partitioner,
   [encode_key((0,))])``) is handed over to the next instance
   (``coordinator.handover(op, vnodes=[v], to=j)``); the next batch's ``begin_batch``
   runs it. That batch also adds ``--post-handover-entries`` records to the big key (so
   the moved key is written on its new instance). Reported: the coordinator's
   ``handover_step`` event (its seconds, the bytes it copied), the batch's ``begin_s``
   against the fill batches' median ``begin_s``, and the placement before and after.
5. ``read_processor_after_handover`` and ``read_state_reader_after_handover``: steps 2
   and 3 again; the big map must now be streamed by instance j's task and read from
   instance j's checkpoint.

A step that fails records its error (the exception's class and message, the
traceback's tail) and ends the run: later steps need it. The last line is the
``summary``: every check, pass or fail, and the run's time. Also per step: peak resident
memory of the Rhino workers, Spark's JVM and its Python workers (sampled each second
from /proc), and the bytes in the workers' directories (hard links once).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, source_line, spark_flags, spark_session, start_rhino
from ..procmem import MemorySampler
from .common import Emitter, loadavg, median, non_negative_int, positive_float, positive_int, round_floats, say

if TYPE_CHECKING:
    from rhino.coordinator.types import Placement

__all__ = ["main", "RecordStoreProcessor", "Model", "payload", "plan_fill", "BigKey", "STEPS"]

OP_FILL, OP_SCAN = 0, 1
BIG_KEY = 0
VAR = "records"
INPUT_SCHEMA = "k long, op int, a long, n long"
OUTPUT_SCHEMA = "k long, op int, entries long, rid_sum long, seq_sum long, crc_sum long, payload_bytes long"
AGG_FIELDS = ("entries", "rid_sum", "seq_sum", "crc_sum", "payload_bytes")
SESSION_LIMIT = 1 << 30  # a worker session's uncommitted writes (key and value bytes), StateServiceOptions
# Per-entry bytes besides the payload, about: key = head 3 + routing (encode_key((k,))) + map key
# 9 + trailer 6; value = schema version 2 + null bitmap 1 + seq 8 + payload length 4.
ENTRY_OVERHEAD_EST = 48
PREFETCH = 64  # rhino.spark's prefetch per collection and key (rhino.spark.driver.config.PREFETCH_ENTRIES)
STEPS = ("fill", "read_processor", "read_state_reader", "handover", "read_processor_after_handover",
         "read_state_reader_after_handover")


# ---- the processor -------------------------------------------------------------------------------


def payload(k: int, j: int, nbytes: int) -> bytes:
    """Record j of key k's payload: ``nbytes`` pseudo-random (incompressible) bytes."""
    return hashlib.shake_128(b"%d:%d" % (k, j)).digest(nbytes)


try:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - the CLI checks for PySpark before importing this module
    _Base = object  # type: ignore[assignment,misc]


class RecordStoreProcessor(_Base):  # type: ignore[misc,valid-type]
    """A per-key record store: a MapState ``records`` (``rid long`` -> ``seq long, payload
    binary``). Input rows ``(k, op, a, n)``:

    * FILL a n: stores records a .. a+n-1 (one ``updateValue`` each); emits (k, FILL, n, 0...);
    * SCAN: iterates the map (``iterator()``) and emits (k, SCAN, entries, sum of record
      ids, sum of seq, sum of crc32(payload), sum of payload lengths).
    """

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = int(value_bytes)
        self.records: Any = None

    def init(self, handle: Any) -> None:
        self.records = handle.getMapState(VAR, "rid long", "seq long, payload binary")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import pandas as pd

        k = int(key[0])
        out = []
        for pdf in rows:
            for op, a, n in zip(pdf["op"].tolist(), pdf["a"].tolist(), pdf["n"].tolist()):
                if op == OP_FILL:
                    for j in range(a, a + n):
                        self.records.updateValue((j,), (j, payload(k, j, self.value_bytes)))
                    out.append((k, OP_FILL, n, 0, 0, 0, 0))
                elif op == OP_SCAN:
                    entries = rid_sum = seq_sum = crc_sum = nbytes = 0
                    for (rid,), (seq, data) in self.records.iterator():
                        entries += 1
                        rid_sum += rid
                        seq_sum += seq
                        crc_sum += zlib.crc32(data)
                        nbytes += len(data)
                    out.append((k, OP_SCAN, entries, rid_sum, seq_sum, crc_sum, nbytes))
                else:
                    raise ValueError(f"unknown op {op}")
        yield pd.DataFrame(out, columns=["k", "op"] + list(AGG_FIELDS))

    def close(self) -> None:
        pass


# ---- the model: what was written ----------------------------------------------------------------


class Model:
    """Per key, the aggregates of the records written (the fill plan replayed in the driver:
    the same payload function, none of Rhino's output). Records are never overwritten: a
    fill of a range that overlaps an earlier one is refused."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = int(value_bytes)
        self.aggs: dict[int, dict[str, int]] = {}
        self.ranges: dict[int, list[tuple[int, int]]] = {}
        self.seconds = 0.0

    def fill(self, k: int, a: int, n: int) -> None:
        t0 = time.perf_counter()
        for lo, hi in self.ranges.get(k, []):
            if a < hi and lo < a + n:
                raise ValueError(f"key {k}: records {a}..{a + n - 1} overlap {lo}..{hi - 1}")
        self.ranges.setdefault(k, []).append((a, a + n))
        g = self.aggs.setdefault(k, {f: 0 for f in AGG_FIELDS})
        crc = 0
        for j in range(a, a + n):
            crc += zlib.crc32(payload(k, j, self.value_bytes))
        g["entries"] += n
        g["rid_sum"] += (a + a + n - 1) * n // 2
        g["seq_sum"] += (a + a + n - 1) * n // 2
        g["crc_sum"] += crc
        g["payload_bytes"] += n * self.value_bytes
        self.seconds += time.perf_counter() - t0

    def next_rid(self, k: int) -> int:
        """The first record id after every record of key k written so far."""
        return max((hi for _, hi in self.ranges.get(k, [])), default=0)

    def expected(self, k: int) -> dict[str, int]:
        return dict(self.aggs.get(k, {f: 0 for f in AGG_FIELDS}))

    def keys(self) -> list[int]:
        return sorted(self.aggs)


def plan_fill(size: int, value_bytes: int, batch_bytes: int) -> list[tuple[int, int]]:
    """The big key's fill batches: (first record, records) each, ``batch_bytes`` of payload
    at most, ``size // value_bytes`` records in all (at least one)."""
    total = max(1, size // value_bytes)
    per = max(1, batch_bytes // value_bytes)
    return [(a, min(per, total - a)) for a in range(0, total, per)]


# ---- measuring: disk ------------------------------------------------------------------


def dir_bytes(root: Path) -> int:
    """Bytes of the files under ``root``, a hard-linked file once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                st = os.stat(os.path.join(dirpath, f), follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _metric_sum(workers: list[Any], name: str, operator_id: str) -> Optional[float]:
    from prometheus_client.parser import text_string_to_metric_families

    total, got = 0.0, False
    for w in workers:
        try:
            text = w.metrics_text()
        except OSError:
            continue
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in (name, name.removesuffix("_total")) and s.labels.get("operator") == operator_id:
                    total += s.value
                    got = True
    return total if got else None


# ---- the run ---------------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    spark: Any
    cluster: dict
    em: Emitter
    command: str
    parameters: dict
    sampler: MemorySampler
    op: Any = None
    model: Model = field(default_factory=lambda: Model(1))
    batch: int = 0
    vnode: Optional[int] = None
    checks: dict[str, bool] = field(default_factory=dict)
    fill_begin_s: list[float] = field(default_factory=list)
    failed: Optional[str] = None
    admin: Any = None  # the admin's coordinator client (coord())

    # ---- helpers ------------------------------------------------------------------------------
    @property
    def operator_id(self) -> str:
        return self.parameters["operator_id"]

    def coord(self) -> Any:
        """The admin's coordinator client (the cluster's root secret): a handover is the
        admin's to ask, not the job's (its driver holds a task credential: docs/protocol.md
        §2, "Roles")."""
        if self.admin is None:
            from rhino.coordinator.client import connect_coordinator
            from rhino.replication import read_secret_file

            self.admin = connect_coordinator(self.cluster["coordinator"],
                                             secret=read_secret_file(self.cluster["secret_file"]))
        return self.admin

    def small_keys(self) -> list[int]:
        return list(range(1, self.args.small_keys + 1))

    def run_batch(self, rows: list[tuple[int, int, int, int]]) -> tuple[Any, Any, float]:
        """One micro-batch through ``process_batch``: (output pandas frame, BatchReport, seconds)."""
        import pandas as pd

        pdf = pd.DataFrame(rows, columns=["k", "op", "a", "n"]).astype(
            {"k": "int64", "op": "int32", "a": "int64", "n": "int64"})
        df = self.spark.createDataFrame(pdf, schema=INPUT_SCHEMA)
        b = self.batch
        t0 = time.perf_counter()
        out = self.op.process_batch(df, b).to_pandas()
        dt = time.perf_counter() - t0
        self.batch += 1
        return out, self.op.reports[-1], dt

    def placement(self) -> Placement:
        return self.coord().placement(self.operator_id)

    def big_vnode(self, placement: Placement) -> int:
        import rhino
        from rhino.spark.state.encoding import encode_key
        from rhino.spark.state.layout import vnodes_of

        part = rhino.Partitioner(**placement.partitioner_args())
        return int(vnodes_of(part, [encode_key((BIG_KEY,))])[0])

    def logical_bytes(self) -> Optional[float]:
        return _metric_sum(self.cluster["workers"], "rhino_session_bytes_written_total", self.operator_id)

    def replicated_bytes(self) -> Optional[float]:
        return _metric_sum(self.cluster["workers"], "rhino_instance_replicated_bytes_total", self.operator_id)

    def check(self, name: str, ok: bool) -> bool:
        self.checks[name] = bool(ok)
        if not ok:
            say(f"  CHECK FAILED: {name}")
        return bool(ok)

    def emit_step(self, rec: dict, t0: float) -> dict:
        rec = {"record": "step", **rec}
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        rec.update(self.sampler.take())
        rec["rhino_dir_bytes"] = dir_bytes(self.cluster["root"])
        rec["disk_free_bytes"] = shutil.disk_usage(self.cluster["root"]).free
        rec["loadavg_1_5_15"] = loadavg()
        rec["command"] = self.command
        rec["parameters"] = self.parameters
        self.em.emit(round_floats(rec))
        return rec

    # ---- step 1: fill ---------------------------------------------------------------------------
    def fill(self) -> dict:
        a = self.args
        plan = plan_fill(a.size, a.value_bytes, a.batch_bytes)
        total = sum(n for _, n in plan)
        say(f"fill: key {BIG_KEY} gets {total:,} records of {a.value_bytes} B payload "
            f"({_fmt(total * a.value_bytes)}) in {len(plan)} batches, among {a.small_keys} small keys")
        t0 = time.perf_counter()
        batches = []
        rec: dict[str, Any] = {"step": "fill", "ok": False, "records": 0, "payload_bytes": 0, "batches": batches}
        try:
            logical0 = replicated0 = None
            done = 0
            for i, (start, n) in enumerate(plan):
                rows = [(BIG_KEY, OP_FILL, start, n)]
                small_start = i * a.small_entries
                rows += [(k, OP_FILL, small_start, a.small_entries) for k in self.small_keys() if a.small_entries]
                for k, _, s, m in rows:
                    self.model.fill(k, s, m)
                b = self.batch
                _out, rep, dt = self.run_batch(rows)
                if self.vnode is None:  # the operator exists now
                    pl = self.placement()
                    self.vnode = self.big_vnode(pl)
                    rec["big_key_vnode"] = self.vnode
                    rec["placement"] = _placement_summary(pl, self.vnode)
                    logical0, replicated0 = 0.0, 0.0  # the operator's counters start at its first batch
                inst = self.placement_instance()
                task = next((t for t in rep.tasks if t["instance"] == inst), {})
                logical = self.logical_bytes()
                replicated = self.replicated_bytes()
                row = {"batch": b, "records": n, "payload_bytes": n * a.value_bytes, "seconds": dt,
                       "begin_s": rep.begin_s, "job_s": rep.job_s, "commit_s": rep.commit_s,
                       "attempts": rep.attempts, "big_key_instance": inst,
                       "big_key_task": _task_summary(task)}
                if logical is not None and logical0 is not None:
                    row["logical_bytes"] = logical - logical0
                    logical0 = logical
                if replicated is not None and replicated0 is not None:
                    row["replicated_bytes"] = replicated - replicated0
                    replicated0 = replicated
                batches.append(row)
                self.fill_begin_s.append(rep.begin_s)
                done += n
                rate = (n * a.value_bytes) / dt / (1 << 20)
                say(f"  fill batch {b}: {done:,}/{total:,} records ({_fmt(done * a.value_bytes)}) in {dt:.1f} s "
                    f"({rate:.1f} MiB/s; job {rep.job_s:.1f} s: process {task.get('process_s', 0):.1f}, "
                    f"write {task.get('write_s', 0):.1f}, commit {task.get('commit_s', 0):.1f} s)")
            rec.update(records=total, payload_bytes=total * a.value_bytes, ok=True)
        except Exception as e:  # noqa: BLE001 - recorded, then the run stops
            rec["error"] = _error(e)
            self.failed = "fill"
        secs = [r["seconds"] for r in batches]
        rec["batch_s_median"] = median(secs)
        rec["batch_s_max"] = max(secs) if secs else None
        rec["fill_s"] = sum(secs)
        rec["payload_mib_per_s"] = (sum(r["payload_bytes"] for r in batches) / sum(secs) / (1 << 20)) if secs else None
        rec["logical_bytes"] = sum(r.get("logical_bytes") or 0 for r in batches) or None
        rec["model_s"] = self.model.seconds
        self.check("fill: every batch committed in one attempt",
                   bool(batches) and all(r["attempts"] == 1 for r in batches) and "error" not in rec)
        return self.emit_step(rec, t0)

    def placement_instance(self) -> int:
        return self.placement().assignment[self.vnode]

    # ---- steps 2 and 5: read through the processor ----------------------------------------------
    def read_processor(self, step: str, want_instance: int) -> dict:
        keys = self.model.keys()
        say(f"{step}: a batch of SCAN rows for {len(keys)} keys; the processor iterates each key's map")
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"step": step, "ok": False, "batch": self.batch, "expected_instance": want_instance}
        try:
            out, rep, dt = self.run_batch([(k, OP_SCAN, 0, 0) for k in keys])
            scan = out[out["op"] == OP_SCAN]
            got = {int(r.k): {f: int(getattr(r, f)) for f in AGG_FIELDS} for r in scan.itertuples(index=False)}
            want = {k: self.model.expected(k) for k in keys}
            big_task = next((t for t in rep.tasks if t["instance"] == want_instance), {})
            streamed = sorted(t["instance"] for t in rep.tasks if t.get("large_reads", 0) > 0)
            rec.update(seconds_batch=dt, begin_s=rep.begin_s, job_s=rep.job_s, commit_s=rep.commit_s,
                       attempts=rep.attempts, big_key=got.get(BIG_KEY), expected_big_key=want[BIG_KEY],
                       small_keys_equal=all(got.get(k) == want[k] for k in keys if k != BIG_KEY),
                       big_key_task=_task_summary(big_task), instances_streaming=streamed,
                       payload_mib_per_s=want[BIG_KEY]["payload_bytes"] / max(big_task.get("process_s", dt), 1e-9)
                       / (1 << 20))
            ok = self.check(f"{step}: the big key's entries and sums equal the model",
                            got.get(BIG_KEY) == want[BIG_KEY])
            ok &= self.check(f"{step}: every small key equals the model", rec["small_keys_equal"])
            # A map larger than the task's prefetch (PREFETCH entries) is streamed (a large read); the
            # small keys stay under it unless --small-entries makes them grow past it.
            small_fit = all(self.model.expected(k)["entries"] <= PREFETCH for k in keys if k != BIG_KEY)
            rec["small_keys_under_prefetch"] = small_fit
            ok &= self.check(f"{step}: the big map was streamed by instance {want_instance}'s task"
                             + (" (and by no other)" if small_fit else ""),
                             streamed == [want_instance] if small_fit else want_instance in streamed)
            if not ok:
                rec["got"] = got
                rec["want"] = want
            rec["ok"] = bool(ok)
            say(f"  {step}: {got.get(BIG_KEY, {}).get('entries', 0):,} entries in {dt:.1f} s (the big key's task: "
                f"fetch {big_task.get('fetch_s', 0):.1f} s, process {big_task.get('process_s', 0):.1f} s, "
                f"{big_task.get('round_trips')} round trips); "
                f"{'equal to the model' if ok else 'NOT equal to the model'}")
        except Exception as e:  # noqa: BLE001
            rec["error"] = _error(e)
            self.check(f"{step}: ran", False)
        if not rec["ok"]:
            self.failed = step
        return self.emit_step(rec, t0)

    # ---- steps 3 and 5: read through the state reader --------------------------------------------
    def read_state_reader(self, step: str, want_instance: int) -> dict:
        from pyspark.sql import functions as F

        from rhino.spark import register_state_source

        batch = self.batch - 1  # the last committed batch
        say(f"{step}: spark.read.format('rhino-state') of {VAR!r} at batch {batch}, aggregated by Spark SQL")
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"step": step, "ok": False, "batch": batch, "expected_instance": want_instance}
        try:
            register_state_source(self.spark)
            df = (self.spark.read.format("rhino-state").option("coordinator", self.cluster["coordinator"])
                  .option("secretFile", str(self.cluster["secret_file"])).option("operatorId", self.operator_id)
                  .option("stateVarName", VAR).option("batchId", str(batch)).load())
            agg = (df.groupBy(F.col("key.k").alias("k"))
                   .agg(F.count(F.lit(1)).alias("entries"), F.sum("user_map_key.rid").alias("rid_sum"),
                        F.sum("user_map_value.seq").alias("seq_sum"),
                        F.sum(F.crc32(F.col("user_map_value.payload"))).alias("crc_sum"),
                        F.sum(F.length(F.col("user_map_value.payload"))).alias("payload_bytes"),
                        F.sort_array(F.collect_set("partition_id")).alias("partitions")))
            t1 = time.perf_counter()
            rows = agg.collect()
            dt = time.perf_counter() - t1
            got = {int(r["k"]): {f: int(r[f]) for f in AGG_FIELDS} for r in rows}
            parts = {int(r["k"]): list(r["partitions"]) for r in rows}
            keys = self.model.keys()
            want = {k: self.model.expected(k) for k in keys}
            rec.update(query_s=dt, big_key=got.get(BIG_KEY), expected_big_key=want[BIG_KEY],
                       big_key_partitions=parts.get(BIG_KEY),
                       small_keys_equal=all(got.get(k) == want[k] for k in keys if k != BIG_KEY),
                       unexpected_keys=sorted(set(got) - set(keys)),
                       payload_mib_per_s=want[BIG_KEY]["payload_bytes"] / dt / (1 << 20))
            ok = self.check(f"{step}: the big key's rows and sums equal the model", got.get(BIG_KEY) == want[BIG_KEY])
            ok &= self.check(f"{step}: every small key equals the model, and no other key",
                             rec["small_keys_equal"] and not rec["unexpected_keys"])
            ok &= self.check(f"{step}: the big key's rows come from instance {want_instance} (partition_id)",
                             parts.get(BIG_KEY) == [want_instance])
            if not ok:
                rec["got"] = got
                rec["want"] = want
            rec["ok"] = bool(ok)
            say(f"  {step}: {got.get(BIG_KEY, {}).get('entries', 0):,} rows of the big key in {dt:.1f} s, "
                f"partition_id {parts.get(BIG_KEY)}; {'equal to the model' if ok else 'NOT equal to the model'}")
        except Exception as e:  # noqa: BLE001
            rec["error"] = _error(e)
            self.check(f"{step}: ran", False)
        if not rec["ok"]:
            self.failed = step
        return self.emit_step(rec, t0)

    # ---- step 4: handover -----------------------------------------------------------------------
    def handover(self) -> tuple[dict, Optional[int]]:
        a = self.args
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"step": "handover", "ok": False, "vnode": self.vnode}
        target: Optional[int] = None
        try:
            before = self.placement()
            origin = before.assignment[self.vnode]
            target = (origin + 1) % len(before.instances)
            o_w = before.instances[origin].primary
            t_w = before.instances[target].primary
            say(f"handover: vnode {self.vnode} (the big key's) from instance {origin} on {o_w} to instance "
                f"{target} on {t_w}; it runs at the next batch's begin_batch")
            plan = self.coord().handover(self.operator_id, [self.vnode], target)
            rec.update(origin=origin, target=target, origin_worker=o_w, target_worker=t_w,
                       target_in_origin_chain=t_w in before.instances[origin].chain, plan=plan,
                       placement_before=_placement_summary(before, self.vnode), epoch_before=before.epoch)
            # the batch that triggers it: small keys, and new records of the big key (on its new instance)
            rows = [(k, OP_FILL, self.model.next_rid(k), a.small_entries)
                    for k in self.small_keys() if a.small_entries]
            if a.post_handover_entries:
                rows.append((BIG_KEY, OP_FILL, self.model.next_rid(BIG_KEY), a.post_handover_entries))
            for k, _, s, m in rows:
                self.model.fill(k, s, m)
            b = self.batch
            _out, rep, dt = self.run_batch(rows)
            after = self.placement()
            events = [e for e in self.coord().status().get("events", [])
                      if e.get("kind") == "handover_step" and e.get("plan") == plan.get("plan")]
            ev = events[-1] if events else None
            begin_med = median(self.fill_begin_s)
            rec.update(batch=b, batch_s=dt, begin_s=rep.begin_s, job_s=rep.job_s, commit_s=rep.commit_s,
                       attempts=rep.attempts, fill_begin_s_median=begin_med,
                       handover_in_begin_s=(rep.begin_s - begin_med) if begin_med is not None else None,
                       handover_step_event=ev, handover_step_s=ev.get("seconds") if ev else None,
                       bytes_copied=ev.get("bytes_copied") if ev else None,
                       placement_after=_placement_summary(after, self.vnode), epoch_after=after.epoch,
                       post_handover_records=a.post_handover_entries,
                       big_key_task=_task_summary(next((t for t in rep.tasks if t["instance"] == target), {})))
            ok = self.check("handover: the coordinator ran the step (a handover_step event of the plan)",
                            ev is not None)
            ok &= self.check(f"handover: the placement routes vnode {self.vnode} to instance {target}",
                             after.assignment[self.vnode] == target)
            ok &= self.check("handover: the operator moved to a new epoch", after.epoch > before.epoch)
            ok &= self.check("handover: the batch that ran it committed in one attempt", rep.attempts == 1)
            rec["ok"] = bool(ok)
            say(f"  handover: step {ev.get('seconds') if ev else '?'} s (coordinator), bytes copied "
                f"{ev.get('bytes_copied') if ev else '?'}; the batch's begin_s {rep.begin_s:.2f} s (fill batches' "
                f"median {begin_med if begin_med is None else round(begin_med, 2)} s); batch {dt:.1f} s")
        except Exception as e:  # noqa: BLE001
            rec["error"] = _error(e)
            self.check("handover: ran", False)
        if not rec["ok"]:
            self.failed = "handover"
        return self.emit_step(rec, t0), target


def _task_summary(t: dict) -> dict:
    keep = ("instance", "primary", "keys", "puts", "deletes", "round_trips", "entries_read", "entries_written",
            "large_reads", "open_s", "fetch_s", "process_s", "write_s", "commit_s", "replicate_s",
            "checkpoint_bytes", "rolled_back")
    out = {k: t.get(k) for k in keep if k in t}
    if "start" in t and "end" in t:
        out["task_s"] = t["end"] - t["start"]
    return out


def _placement_summary(pl: Placement, vnode: Optional[int]) -> dict:
    return {"epoch": pl.epoch, "last_batch": pl.last_batch,
            "vnode_instance": None if vnode is None else pl.assignment[vnode],
            "instances": {str(i): {"primary": x.primary, "chain": list(x.chain), "bytes": x.bytes,
                                   "vnodes": pl.assignment.count(i)}
                          for i, x in sorted(pl.instances.items())}}


def _error(e: BaseException) -> dict:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    text = str(e)
    say(f"  ERROR: {type(e).__name__}: {text[:2000]}")
    return {"type": type(e).__name__, "message": text[:8000], "traceback_tail": "".join(tb)[-6000:]}



def _fmt(n: Optional[float]) -> str:
    if n is None:
        return "-"
    from rhino._sizes import format_bytes

    return format_bytes(float(n))


# ---- setup --------------------------------------------------------------------------------------


def _size(text: str) -> int:
    from rhino._sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class BigKey(Scenario):
    name = "spark big-key"
    description = ("One key whose MapState holds --size of entries: written, read back through the processor "
                   "and through the rhino-state reader, and moved by a handover; each checked against a model "
                   "of what was written.")
    workdir_prefix = "rhino-big-key-"

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--size", type=_size, default=1 << 30, help="payload bytes in the big key's map (default 1G)")
        ap.add_argument("--value-bytes", type=_size, default=1024, help="payload bytes per map entry (default 1024)")
        ap.add_argument("--batch-bytes", type=_size, default=128 << 20,
                        help="payload bytes of the big key written per fill batch, at most (default 128M; a worker "
                             "session holds at most 1 GiB of uncommitted writes)")
        ap.add_argument("--small-keys", type=non_negative_int, default=4,
                        help="other keys, filled alongside (default 4)")
        ap.add_argument("--small-entries", type=non_negative_int, default=4,
                        help="records each small key gets per fill batch and in the handover's batch (default 4)")
        ap.add_argument("--post-handover-entries", type=non_negative_int, default=1024,
                        help="records added to the big key by the batch that runs the handover (default 1024)")
        ap.add_argument("--partitions", type=positive_int, default=3,
                        help="instances (one rhino worker each; default 3)")
        ap.add_argument("--replicas", type=non_negative_int, default=2, help="Rhino's r (default 2)")
        spark_flags(ap, first_host=76)
        ap.add_argument("--request-timeout", type=positive_float, default=120.0,
                        help="the operator's per-request timeout to the workers, s (transform_with_state's "
                             "request_timeout; default 120)")
        ap.add_argument("--timeout", type=positive_float, default=7200.0,
                        help="the whole run, s: then it stops where it is and says so (default 7200)")

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.value_bytes > args.batch_bytes:
            ap.error("--value-bytes must be at most --batch-bytes")
        if args.value_bytes > args.size:
            ap.error("--value-bytes must be at most --size")
        per = args.batch_bytes // args.value_bytes
        est = per * (args.value_bytes + ENTRY_OVERHEAD_EST) + args.small_keys * args.small_entries * (
            args.value_bytes + ENTRY_OVERHEAD_EST)
        if est > SESSION_LIMIT:
            ap.error(f"--batch-bytes {args.batch_bytes}: a fill batch would hold about {est} bytes of keys and "
                     f"values, more than a worker session's {SESSION_LIMIT} bytes of uncommitted writes")
        if args.partitions < 2:
            ap.error("--partitions must be at least 2 (the handover moves the key to another instance)")
        if args.first_host + args.partitions - 1 > 254:
            ap.error("--first-host: the workers must fit 127.0.0.2..254")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        plan = plan_fill(args.size, args.value_bytes, args.batch_bytes)
        return {"size": args.size, "value_bytes": args.value_bytes, "batch_bytes": args.batch_bytes,
                "records": sum(n for _, n in plan), "fill_batches": len(plan), "small_keys": args.small_keys,
                "small_entries": args.small_entries, "post_handover_entries": args.post_handover_entries,
                "partitions": args.partitions, "replicas": args.replicas, "master": args.master,
                "request_timeout": args.request_timeout, "operator_id": f"big-key-{run_id}", "run_id": run_id}

    def run(self, br: BenchRun) -> None:
        args, stack = br.args, br.stack
        self.run_state: Optional[Run] = None

        def _alarm(_signum: int, _frame: Any) -> None:
            raise _RunTimeout(f"the run took longer than --timeout {args.timeout:g} s")

        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(int(args.timeout))
        stack.callback(signal.alarm, 0)
        say(f"starting a coordinator, {args.partitions} Rhino workers at 127.0.0.{args.first_host}.. and Spark "
            f"({args.master}) in {br.base}")
        cluster = start_rhino(br.base / "rhino", stack, workers=args.partitions, first_host=args.first_host)
        spark = spark_session(stack, br.base, app="rhino-bench-big-key", master=args.master,
                              partitions=args.partitions, conf=br.spark_conf)
        sampler = MemorySampler({w.id: w.pid for w in cluster.workers}).start()
        stack.callback(sampler.stop)
        run = self.run_state = Run(args=args, spark=spark, cluster=cluster, em=br.em, command=br.command,
                                   parameters=br.parameters, sampler=sampler, model=Model(args.value_bytes))
        from rhino.spark import transform_with_state

        run.op = transform_with_state(RecordStoreProcessor(args.value_bytes), key="k", output_schema=OUTPUT_SCHEMA,
                                      operator_id=br.parameters["operator_id"], coordinator=cluster.coordinator,
                                      secret_file=str(cluster.secret_file), parallelism=args.partitions,
                                      replicas=args.replicas, locality=False, request_timeout=args.request_timeout)
        stack.callback(run.op.close)
        sampler.take()  # the start-up's peaks are not a step's
        try:
            _steps(run)
        except _RunTimeout as e:
            say(f"TIMEOUT: {e}")
            run.failed = run.failed or "timeout"
            run.checks["finished within --timeout"] = False

    def summary(self, br: BenchRun, failed: bool) -> dict:
        run = getattr(self, "run_state", None)
        checks = run.checks if run is not None else {}
        stopped = run.failed if run is not None else "setup"
        summ = summarize(br.records, br.elapsed(), checks, stopped)
        say(f"done in {br.elapsed() / 60:.1f} min: "
            f"{'all checks passed' if summ['all_passed'] else 'NOT all checks passed'}"
            + (f" (stopped at {stopped})" if stopped else ""))
        return summ

    def exit_code(self, br: BenchRun, summary: Optional[dict], rc: Optional[int]) -> int:
        return 0 if summary and summary["all_passed"] else 1



def _steps(run: "Run") -> None:
    """The steps in order; a failed step ends the run (later steps need it)."""
    run.fill()
    if run.failed is None:
        origin = run.placement_instance()
        run.read_processor("read_processor", origin)
    if run.failed is None:
        run.read_state_reader("read_state_reader", origin)
    if run.failed is None:
        _h, target = run.handover()
        if run.failed is None and target is not None:
            run.read_processor("read_processor_after_handover", target)
            if run.failed is None:
                run.read_state_reader("read_state_reader_after_handover", target)


def summarize(records: list[dict], elapsed_s: Optional[float], checks: dict[str, bool],
              failed: Optional[str]) -> dict:
    steps = {r["step"]: r for r in records if r.get("record") == "step"}
    out: dict[str, Any] = {"record": "summary", "checks": checks, "all_passed": bool(checks) and all(checks.values())
                           and failed is None and set(STEPS) <= set(steps),
                           "failed_step": failed, "steps_run": [s for s in STEPS if s in steps],
                           "elapsed_s": None if elapsed_s is None else round(elapsed_s, 1)}
    f = steps.get("fill") or {}
    out["fill_s"] = f.get("fill_s")
    out["fill_payload_mib_per_s"] = f.get("payload_mib_per_s")
    for s in ("read_processor", "read_processor_after_handover"):
        if s in steps:
            out[f"{s}_s"] = steps[s].get("seconds_batch")
    for s in ("read_state_reader", "read_state_reader_after_handover"):
        if s in steps:
            out[f"{s}_s"] = steps[s].get("query_s")
    h = steps.get("handover") or {}
    out["handover_step_s"] = h.get("handover_step_s")
    out["handover_begin_s"] = h.get("begin_s")
    out["handover_bytes_copied"] = h.get("bytes_copied")
    return round_floats(out)


# ---- the report ----------------------------------------------------------------------------------


def _step_cells(r: dict, f: Any) -> str:
    """The time and detail cells of one step's row in the report."""
    s = r["step"]
    if s == "fill":
        return (f"{f(r.get('fill_s'), 1)} s | {r.get('records', 0):,} records, {_fmt(r.get('payload_bytes'))} of "
                f"payload in {len(r.get('batches', []))} batches ({f(r.get('payload_mib_per_s'), 1)} MiB/s; per "
                f"batch median {f(r.get('batch_s_median'), 1)} s, max {f(r.get('batch_s_max'), 1)} s); key and "
                f"value bytes committed: {_fmt(r.get('logical_bytes'))}")
    if s.startswith("read_processor"):
        bk, t = r.get("big_key") or {}, r.get("big_key_task") or {}
        return (f"{f(r.get('seconds_batch'), 1)} s | {bk.get('entries', 0):,} entries iterated by instance "
                f"{t.get('instance')}'s task (its processor {f(t.get('process_s'), 1)} s: "
                f"{f(r.get('payload_mib_per_s'), 1)} MiB/s of payload; {t.get('round_trips')} round trips); "
                f"{'equal to the model' if r.get('ok') else 'see the JSON line'}")
    if s.startswith("read_state_reader"):
        bk = r.get("big_key") or {}
        return (f"{f(r.get('query_s'), 1)} s | {bk.get('entries', 0):,} rows of the big key at batch "
                f"{r.get('batch')}, partition_id {r.get('big_key_partitions')} "
                f"({f(r.get('payload_mib_per_s'), 1)} MiB/s of payload through Spark SQL count/sum/crc32); "
                f"{'equal to the model' if r.get('ok') else 'see the JSON line'}")
    if s == "handover":
        return (f"{f(r.get('handover_step_s'), 3)} s | vnode {r.get('vnode')}: instance {r.get('origin')} "
                f"({r.get('origin_worker')}) -> {r.get('target')} ({r.get('target_worker')}), target worker in "
                f"the origin's chain: {r.get('target_in_origin_chain')}; bytes copied {r.get('bytes_copied')}; "
                f"the batch that ran it: begin_s {f(r.get('begin_s'), 2)} s (fill batches' median "
                f"{f(r.get('fill_begin_s_median'), 2)} s), whole batch {f(r.get('batch_s'), 1)} s; epoch "
                f"{r.get('epoch_before')} -> {r.get('epoch_after')}")
    return "- | -"


def report(records: list[dict], path: str) -> None:
    from rhino._machine import machine_summary

    setup = next((r for r in records if r.get("record") == "setup"), {})
    summ = next((r for r in records[::-1] if r.get("record") == "summary"), None)
    steps = {r["step"]: r for r in records if r.get("record") == "step"}
    p = setup.get("parameters", {})

    def f(x: Any, d: int = 2) -> str:
        return "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))

    el = (summ or {}).get("elapsed_s")
    L = ["# One key with a large MapState: written, read back, moved (rhino.spark)", "",
         f"Command: `{setup.get('command')}`", "",
         f"Run at {setup.get('started')} on {machine_summary(setup.get('machine', {}))}"
         + (f"; the whole run took {el / 60:.1f} min ({el:.0f} s)." if el else "; the run did not finish."), "",
         "Parameters: " + ", ".join(f"{k}={v}" for k, v in p.items()), "",
         source_line(setup.get("source") or {}, summ), "",
         "What runs (bench/rhino_bench/spark/big_key.py): an ordinary `StatefulProcessor` "
         "(`RecordStoreProcessor`: per key a MapState `records`, `rid long` -> `seq long, payload binary`) on "
         "`rhino.spark.transform_with_state`, one micro-batch at a time through `process_batch` (what "
         "`foreachBatch` calls), on a local Spark, a `rhino coordinator` process and "
         f"{p.get('partitions')} `rhino worker` processes (r={p.get('replicas')}). A FILL row makes the processor "
         "`updateValue` records a..a+n-1 of its key (payload: `value_bytes` pseudo-random bytes of (key, record)); "
         "a SCAN row makes it iterate the key's map (`iterator()`) and emit the entries and the sums of the record "
         "ids, of `seq`, of `crc32(payload)` and of the payload lengths. Every read is compared with a model of "
         "what was written, computed in the driver from the fill plan.", ""]
    L += ["| step | result | time | detail |", "|---|---|---:|---|"]
    for s in STEPS:
        r = steps.get(s)
        if r:
            L.append(f"| {s} | {'ok' if r.get('ok') else 'FAILED'} | " + _step_cells(r, f) + " |")
    for r in steps.values():
        if r.get("error"):
            e = r["error"]
            L += ["", f"**{r['step']} failed**: `{e.get('type')}: {e.get('message', '')[:1500]}`"]
    fl = steps.get("fill")
    if fl and fl.get("batches"):
        L += ["", "Fill batches: the driver's parts (begin_batch at the coordinator, the Spark job, "
                  "commit_batch), then the big key's task (its processor, the write-back, the commit with the "
                  "chain's barrier replication, of which replication), its instance's checkpoint bytes, and the key "
                  "and value bytes all workers committed and the checkpoint bytes the primaries sent down their "
                  "chains (the workers' metrics):", "",
              "| batch | records | s | begin | job | commit_batch | task: process | write | commit | replicate | "
              "checkpoint | key+value bytes | replicated |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
              "---:|---:|"]
        for b in fl["batches"]:
            t = b.get("big_key_task") or {}
            L.append(f"| {b['batch']} | {b['records']:,} | {f(b['seconds'], 1)} | {f(b['begin_s'])} | "
                     f"{f(b['job_s'], 1)} | {f(b['commit_s'])} | {f(t.get('process_s'), 1)} | "
                     f"{f(t.get('write_s'), 1)} | {f(t.get('commit_s'), 1)} | {f(t.get('replicate_s'), 1)} | "
                     f"{_fmt(t.get('checkpoint_bytes'))} | {_fmt(b.get('logical_bytes'))} | "
                     f"{_fmt(b.get('replicated_bytes'))} |")
    L += ["", "Peak resident memory per step (MiB; sampled each second) and the bytes in the workers' "
              "directories after it (hard links once):", "",
          "| step | Rhino workers (max) | Spark JVM | Spark Python worker (max) | driver | min MemAvailable | "
          "workers' dirs |", "|---|---:|---:|---:|---:|---:|---:|"]
    for s in STEPS:
        r = steps.get(s)
        if not r:
            continue
        pk = r.get("peak_rss_mib") or {}
        wmax = max((v for k, v in pk.items() if k.startswith("rhino_worker_")), default=None)
        L.append(f"| {s} | {f(wmax, 0)} | {f(pk.get('spark_jvm'), 0)} | {f(pk.get('spark_python_max'), 0)} | "
                 f"{f(pk.get('driver_python'), 0)} | {f(r.get('min_mem_available_mib'), 0)} | "
                 f"{_fmt(r.get('rhino_dir_bytes'))} |")
    if summ:
        L += ["", "Checks:", ""]
        for name, ok in (summ.get("checks") or {}).items():
            L.append(f"- {'PASS' if ok else 'FAIL'}: {name}")
        L += ["", f"**{'All checks passed.' if summ.get('all_passed') else 'NOT all checks passed'}**"
              + (f" (stopped at step {summ['failed_step']})" if summ.get("failed_step") else "")]
    L.append("")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(L))


# ---- the command ---------------------------------------------------------------------------------


class _RunTimeout(Exception):
    pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(BigKey(report=report), argv)


if __name__ == "__main__":
    sys.exit(main())
