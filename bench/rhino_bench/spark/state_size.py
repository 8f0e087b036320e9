"""``rhino-bench spark state-size``: the cost of a micro-batch that touches one key holding a
large MapState or ListState, Rhino against Spark's own ``transformWithStateInPandas`` with
the RocksDB state store provider, in the same run, with the same processor object.

    rhino-bench spark state-size --json --out bench/results/state_size.jsonl \\
        --plot bench/results/state_size.png --report bench/results/state_size.md

Workload, per kind (``--kinds map,list``) and per N (``--entries 1k,100k,1M``), each
system on a fresh operator (Rhino) or checkpoint (Spark):

* one key (k=0) holding N entries: in a MapState (``"ek long"`` -> ``"ev long"``), or in a
  ListState (``"ev long"``); the same :class:`BigKeyProcessor` object on both systems;
* the input is one Parquet file per micro-batch (columns ``k long, op int, a long,
  b long``), read by a file stream with ``maxFilesPerTrigger=1`` and
  ``Trigger.AvailableNow``: both systems see the same micro-batches;
* **fill**: batches of one row each, ``op=FILL a b``: the processor adds entries
  ``a..b-1`` to the big key (ListState: one ``appendList``; MapState: one ``updateValue``
  per entry, the only way Spark's API offers); ``--fill-chunk`` entries per batch (default
  100k, so N=1M fills over 10 batches); their times are reported (``fill_s``), not judged;
* **touch**: ``--warmup`` (discarded) then ``--batches`` measured batches, each with ONE
  touch of the big key (MapState: ``getValue`` of an existing entry, then ``updateValue``
  of it; ListState: one ``appendValue``) among ``--small-keys`` other keys, each touched
  the same way on its own small state;
* **check** (not timed): one batch that reads every key's whole state (count and sum);
  the outputs of all batches must be equal on both systems (``outputs_agree``).

Measured per system, kind and N (one JSON line, ``record: "measurement"``):

* ``batch_s``: the median, over the measured batches, of Spark's
  ``durationMs.triggerExecution`` (the whole micro-batch: the file source, the stateful
  operator, the sink, the commit; the same measure for both systems, as in
  ``rhino-bench spark throughput``); ``batch_s_all`` lists them, ``sink_s`` is the
  part spent inside ``foreachBatch`` (the operator's Spark job and the output's collect);
* ``bytes_written``: the median, over the measured batches, of the bytes one batch adds
  to the state's durable checkpoint. Rhino: the instances' checkpoint delta (the
  commit's ``delta_bytes``: the files new in checkpoint b, summed over the instances, from
  the tasks' meta rows, or read from checkpoint b's manifest in the primary's store when
  the meta rows do not carry it; ``bytes_written_source`` says which). Spark: the bytes of
  files new
  or grown in the query's checkpoint ``state/`` directory after the batch (what the
  RocksDB provider uploaded: new SST files, the zipped metadata).
  Also, per batch and median: Rhino's ``replicated_bytes`` (the checkpoint bytes the
  primaries sent to the first member of their chains, the workers' metrics; each member
  passes them on, so r copies land in all: it equals the delta when nothing was lost),
  ``logical_bytes`` (key and value bytes of the committed write batches, the workers'
  metrics), ``disk_write_bytes`` (``/proc/<pid>/io`` ``write_bytes`` of all Rhino workers:
  WAL, flushes, compactions, checkpoints and replicas together); Spark's
  RocksDB metrics of the batch (``rocksdbBytesCopied``, ``rocksdbTotalBytesWritten``,
  ``...WrittenByFlush``, ``...WrittenByCompaction``), and the bytes new in its local
  RocksDB working directories (``local_new_bytes``: the live DB's SSTs and logs).

Targets (reported, not asserted): Rhino's ``batch_s`` at the largest N at most 2x its
``batch_s`` at the smallest; Rhino's ``batch_s`` at most Spark's at every N and kind.

Setup: one local Spark (``local[2]`` by default, ``--master``), ``--partitions`` shuffle
partitions = Rhino instances, a ``rhino coordinator`` and ``--replicas + 1`` ``rhino worker``
processes on 127.0.0.N.. (``--first-host``; the chains hold r replicas). Rhino's tasks
reach the workers over loopback TCP (no locality pinning in local mode: the Unix socket
would only help Rhino). Spark's state store settings are its defaults (no changelog
checkpointing) unless ``--spark-conf``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import (BenchRun, RhinoCluster, Scenario, bench_main, source_line, spark_flags, spark_session,
                     start_rhino)
from .common import loadavg, median, non_negative_int, percentile, positive_float, positive_int, round_floats, say

__all__ = ["main", "BigKeyProcessor", "plan_batches", "summarize", "SYSTEMS", "KINDS", "TARGET_FLAT",
           "DirBytes", "parse_entries"]

SYSTEMS = ("rhino", "spark-rocksdb")
KINDS = ("map", "list")
OP_FILL, OP_TOUCH, OP_CHECK = 0, 1, 2
INPUT_SCHEMA = "k long, op int, a long, b long"
OUTPUT_SCHEMA = "k long, op int, a long, b long"
BIG_KEY = 0
TARGET_FLAT = 2.0  # Rhino's batch_s at the largest N <= 2x its batch_s at the smallest
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_SPARK_METRICS = ("rocksdbBytesCopied", "rocksdbFilesCopied", "rocksdbFilesReused", "rocksdbTotalBytesWritten",
                  "rocksdbTotalBytesWrittenByFlush", "rocksdbTotalBytesWrittenByCompaction",
                  "rocksdbZipFileBytesUncompressed", "rocksdbSstFileSize", "rocksdbCommitFlushLatency",
                  "rocksdbCommitCheckpointLatency", "rocksdbCommitFileSyncLatencyMs", "rocksdbCommitCompactLatency",
                  "rocksdbCommitWriteBatchLatency", "rocksdbCommitPauseLatency")
_TASK_FIELDS = ("read_s", "open_s", "group_s", "timers_s", "fetch_s", "process_s", "write_s", "commit_s",
                "replicate_s")


# ---- the processor (the same object runs on both systems) ----------------------------------

try:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - the CLI checks for PySpark before importing this module
    _Base = object  # type: ignore[assignment,misc]


class BigKeyProcessor(_Base):  # type: ignore[misc,valid-type]
    """One state variable per key, a MapState (``kind="map"``) or a ListState (``"list"``),
    driven by the input rows' ``op``:

    * FILL a b: add entries a..b-1 (map: ``updateValue((j,), (j,))`` per entry; list: one
      ``appendList`` of them); emits (k, FILL, a, b - a);
    * TOUCH a b: map: ``getValue((a,))``, then ``updateValue((a,), (b,))``; emits (k, TOUCH, a,
      the old value or -1); list: ``appendValue((b,))``; emits (k, TOUCH, a, b);
    * CHECK: reads the whole state; emits (k, CHECK, count, sum of the values).
    """

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.kind = kind
        self.state: Any = None

    def init(self, handle: Any) -> None:
        if self.kind == "map":
            self.state = handle.getMapState("entries", "ek long", "ev long")
        else:
            self.state = handle.getListState("entries", "ev long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import pandas as pd

        k = int(key[0])
        out = []
        for pdf in rows:
            for op, a, b in zip(pdf["op"].tolist(), pdf["a"].tolist(), pdf["b"].tolist()):
                out.append((k, int(op)) + self._apply(int(op), int(a), int(b)))
        yield pd.DataFrame(out, columns=["k", "op", "a", "b"])

    def _apply(self, op: int, a: int, b: int) -> tuple[int, int]:
        st = self.state
        if op == OP_FILL:
            if self.kind == "map":
                for j in range(a, b):
                    st.updateValue((j,), (j,))
            else:
                st.appendList([(j,) for j in range(a, b)])
            return a, b - a
        if op == OP_TOUCH:
            if self.kind == "map":
                old = st.getValue((a,))
                st.updateValue((a,), (b,))
                return a, (int(old[0]) if old is not None else -1)
            st.appendValue((b,))
            return a, b
        if op == OP_CHECK:
            n = s = 0
            if self.kind == "map":
                for _, v in st.iterator():
                    n += 1
                    s += int(v[0])
            else:
                for v in st.get():
                    n += 1
                    s += int(v[0])
            return n, s
        raise ValueError(f"unknown op {op}")

    def close(self) -> None:
        pass


# ---- the input: one Parquet file per micro-batch ---------------------------------------------


@dataclass
class Batch:
    index: int
    phase: str  # fill | warmup | measure | check
    rows: list[tuple[int, int, int, int]]


def plan_batches(n: int, *, fill_chunk: int, warmup: int, batches: int, small_keys: int,
                 seed: int = 7) -> list[Batch]:
    """The micro-batches of one (N) workload, in order (the same for both kinds and systems)."""
    rng = random.Random(seed * 1_000_003 + n)
    out: list[Batch] = []
    for start in range(0, n, fill_chunk):
        out.append(Batch(len(out), "fill", [(BIG_KEY, OP_FILL, start, min(n, start + fill_chunk))]))
    for i in range(warmup + batches):
        t = len(out)
        rows = [(BIG_KEY, OP_TOUCH, rng.randrange(n), 1_000_000_000 + t)]
        rows += [(k, OP_TOUCH, t % 7, t) for k in range(1, small_keys + 1)]
        out.append(Batch(t, "warmup" if i < warmup else "measure", rows))
    out.append(Batch(len(out), "check", [(k, OP_CHECK, 0, 0) for k in range(small_keys + 1)]))
    return out


def write_inputs(directory: Path, plan: list[Batch]) -> None:
    """One Parquet file per batch, with strictly increasing modification times (Spark's file
    source takes files in that order; files written within one clock tick could swap)."""
    import pandas as pd

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 10 * len(plan) - 100
    for b in plan:
        pdf = pd.DataFrame(b.rows, columns=["k", "op", "a", "b"]).astype(
            {"k": "int64", "op": "int32", "a": "int64", "b": "int64"})
        path = directory / f"batch-{b.index:05d}.parquet"
        pdf.to_parquet(path, index=False)
        os.utime(path, (base + 10 * b.index, base + 10 * b.index))


# ---- bytes on disk ---------------------------------------------------------------------------


class DirBytes:
    """Bytes written under some directories between two snapshots: a file (by device and
    inode, so a hard link counts once) not seen before counts whole, a file seen before
    counts its growth. A file created and deleted between two snapshots is missed. ``match``:
    only directories whose path below a root contains it."""

    def __init__(self, roots: Sequence[Path], match: Optional[str] = None) -> None:
        self.roots = [Path(r) for r in roots]
        self.match = match
        self.seen = self._scan()

    def _scan(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for root in self.roots:
            for dirpath, _dirs, files in os.walk(root):
                if self.match and self.match not in os.path.relpath(dirpath, root):
                    continue
                for f in files:
                    try:
                        st = os.stat(os.path.join(dirpath, f), follow_symlinks=False)
                    except OSError:  # removed meanwhile
                        continue
                    out[(st.st_dev, st.st_ino)] = st.st_size
        return out

    def step(self) -> tuple[int, int]:
        """(bytes new since the last step, bytes there now)."""
        cur = self._scan()
        new = sum(size if key not in self.seen else max(0, size - self.seen[key]) for key, size in cur.items())
        self.seen = cur
        return new, sum(cur.values())


def _proc_write_bytes(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RhinoProbe:
    """After each batch: the Rhino workers' disk writes (``/proc/<pid>/io``) and their metrics
    counters (key and value bytes committed, checkpoint bytes replicated), as deltas."""

    def __init__(self, workers: list[Any], operator_id: str) -> None:
        self.workers = workers
        self.op = operator_id
        self.last = self._read()

    def _metric_sum(self, name: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for w in self.workers:
            try:
                text = w.metrics_text()
            except OSError:
                continue
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name in (name, name.removesuffix("_total")) and s.labels.get("operator") == self.op:
                        total += s.value
        return total

    def _read(self) -> dict[str, float]:
        io = [_proc_write_bytes(w.pid) for w in self.workers]
        return {"disk_write_bytes": float(sum(x for x in io if x is not None)),
                "logical_bytes": self._metric_sum("rhino_session_bytes_written_total"),
                "replicated_bytes": self._metric_sum("rhino_instance_replicated_bytes_total")}

    def step(self) -> dict[str, int]:
        cur = self._read()
        d = {k: int(cur[k] - self.last[k]) for k in cur}
        self.last = cur
        return d


def _manifest_delta(workers: list[Any], primary: Optional[str], operator_id: str, instance: int,
                    batch: int) -> dict:
    """The delta of checkpoint ``batch`` of an instance, read from the manifest in its
    primary's store (``<worker dir>/checkpoints/<operator>/<instance>/<id:020d>.manifest``, a
    JSON line and a checksum line): the bytes and number of its files new since the parent
    checkpoint (what the commit's stats call ``delta_bytes``, ``delta_files``)."""
    w = next((w for w in workers if w.id == primary), None)
    if w is None:
        return {}
    path = Path(w.dir) / "checkpoints" / operator_id / str(instance) / f"{batch:020d}.manifest"
    try:
        m = json.loads(path.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return {}
    delta = [f for f in m.get("files", []) if f.get("in_delta")]
    return {"delta_bytes": sum(int(f["size"]) for f in delta), "delta_files": len(delta),
            "delta_from": "manifest"}


# ---- one run: one system, one kind, one N --------------------------------------------------


@dataclass
class RunResult:
    system: str
    kind: str
    entries: int
    batches: dict[int, dict] = field(default_factory=dict)  # by batch id
    outputs: dict[int, Any] = field(default_factory=dict)  # by batch id: pandas frames
    progress: dict[int, dict] = field(default_factory=dict)
    seconds: float = 0.0


def _stream(spark: Any, input_dir: Path) -> Any:
    return spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(input_dir))


def run_once(spark: Any, *, system: str, kind: str, n: int, input_dir: Path, work: Path, cluster: Optional[dict],
             parallelism: int, replicas: int, timeout_s: float, operator_id: str,
             spark_local_dir: Optional[Path]) -> RunResult:
    """Runs every batch of ``input_dir`` through one system; per batch its sink time, its
    output and its bytes; Spark's progress reports."""
    res = RunResult(system=system, kind=kind, entries=n)
    ck = work / "query"
    proc = BigKeyProcessor(kind)
    op = None
    if system == "spark-rocksdb":
        state_bytes = DirBytes([ck / "state"])  # it appears at the first batch
        local_bytes = DirBytes([spark_local_dir], match="StateStore") if spark_local_dir else None

        def sink(df: Any, batch_id: int) -> None:
            t0 = time.perf_counter()
            pdf = df.toPandas()
            t1 = time.perf_counter()
            new, total = state_bytes.step()
            rec = {"sink_s": t1 - t0, "ckpt_new_bytes": new, "ckpt_total_bytes": total}
            if local_bytes is not None:
                rec["local_new_bytes"], rec["local_total_bytes"] = local_bytes.step()
            rec["measure_s"] = time.perf_counter() - t1
            res.outputs[int(batch_id)] = pdf
            res.batches[int(batch_id)] = rec

        out = _stream(spark, input_dir).groupBy("k").transformWithStateInPandas(
            proc, OUTPUT_SCHEMA, "Append", "None")
        writer = out.writeStream.outputMode("append").foreachBatch(sink)
    else:
        from rhino.spark import transform_with_state

        assert cluster is not None
        op = transform_with_state(proc, key="k", output_schema=OUTPUT_SCHEMA, operator_id=operator_id,
                                  coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                  parallelism=parallelism, replicas=replicas, locality=False)
        probe: list[RhinoProbe] = []

        def sink(df: Any, batch_id: int) -> None:
            if not probe:  # the operator's counters start at its first batch
                probe.append(RhinoProbe(cluster["workers"], operator_id))
            t0 = time.perf_counter()
            pdf = op.process_batch(df, batch_id).to_pandas()
            t1 = time.perf_counter()
            rep = op.reports[-1]
            rec: dict[str, Any] = {"sink_s": t1 - t0, "op_s": rep.seconds, "attempts": rep.attempts,
                                   "begin_s": rep.begin_s, "job_s": rep.job_s, "commit_s": rep.commit_s}
            tasks = rep.tasks
            for t in tasks:
                if t.get("delta_bytes") is None:
                    t.update(_manifest_delta(cluster["workers"], t.get("primary"), operator_id, t["instance"],
                                             int(batch_id)))
            for f in ("checkpoint_bytes", "delta_bytes", "delta_files", "keys", "puts", "deletes", "round_trips"):
                vals = [t.get(f) for t in tasks]
                rec[f] = int(sum(v for v in vals if v is not None)) if any(v is not None for v in vals) else None
            rec["delta_from"] = next((t.get("delta_from") for t in tasks if t.get("delta_from")), None)
            if tasks:
                slow = max(tasks, key=lambda t: t["end"] - t["start"])
                rec["critical_task_s"] = {f: slow.get(f) for f in _TASK_FIELDS}
            rec.update(probe[0].step())
            rec["measure_s"] = time.perf_counter() - t1
            res.outputs[int(batch_id)] = pdf
            res.batches[int(batch_id)] = rec

        writer = _stream(spark, input_dir).writeStream.foreachBatch(sink)
    t0 = time.time()
    q = writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    try:
        deadline = time.time() + timeout_s
        while not q.awaitTermination(0.5):
            for p in q.recentProgress or []:
                res.progress.setdefault(int(p["batchId"]), p)
            if time.time() > deadline:
                raise TimeoutError(f"{system} {kind} N={n} did not finish in {timeout_s:g} s")
    finally:
        if q.isActive:
            q.stop()
        if op is not None:
            op.close()
    res.seconds = time.time() - t0
    for p in q.recentProgress or []:
        res.progress.setdefault(int(p["batchId"]), p)
    for b, rec in res.batches.items():
        p = res.progress.get(b) or {}
        rec["trigger_s"] = (p.get("durationMs") or {}).get("triggerExecution", 0) / 1000.0 if p else None
        rec["rows_in"] = p.get("numInputRows")
        ops = p.get("stateOperators") or []
        if ops:
            cm = ops[0].get("customMetrics") or {}
            rec["spark_rocksdb"] = {k: cm[k] for k in _SPARK_METRICS if k in cm}
            rec["spark_state_op"] = {k: ops[0].get(k) for k in ("numRowsTotal", "numRowsUpdated", "allUpdatesTimeMs",
                                                                "commitTimeMs", "memoryUsedBytes")}
    return res


# ---- from a run to its JSON line ---------------------------------------------------------------


def _outputs_digest(res: RunResult) -> tuple[str, int]:
    """A digest of every output row of the run (sorted), and the number of rows."""
    import pandas as pd

    frames = [f for f in res.outputs.values() if len(f)]
    if not frames:
        return hashlib.sha256(b"").hexdigest()[:16], 0
    df = pd.concat(frames, ignore_index=True).astype("int64").sort_values(["k", "op", "a", "b"])
    h = hashlib.sha256()
    for row in df.itertuples(index=False):
        h.update(("%d,%d,%d,%d\n" % tuple(row)).encode())
    return h.hexdigest()[:16], len(df)


def _check_values(res: RunResult, plan: list["Batch"]) -> dict:
    """The check batch's output for the big key: (entries, sum)."""
    bid = plan[-1].index
    pdf = res.outputs.get(bid)
    if pdf is None or not len(pdf):
        return {}
    row = pdf[(pdf["k"] == BIG_KEY) & (pdf["op"] == OP_CHECK)]
    if not len(row):
        return {}
    return {"check_entries": int(row["a"].iloc[0]), "check_sum": int(row["b"].iloc[0])}


def measurement(res: RunResult, plan: list[Batch], *, command: str, parameters: dict) -> dict:
    """The run's JSON line (``record: "measurement"``)."""
    phase = {b.index: b.phase for b in plan}
    missing = sorted(set(phase) - set(res.batches))
    meas = [res.batches[b.index] for b in plan if b.phase == "measure" and b.index in res.batches]
    fill = [res.batches[b.index] for b in plan if b.phase == "fill" and b.index in res.batches]

    def med(key: str) -> Optional[float]:
        return median([r[key] for r in meas if r.get(key) is not None])

    def all_of(key: str) -> list:
        return [r.get(key) for r in meas]

    batch_s = [r["trigger_s"] for r in meas if r.get("trigger_s") is not None]
    digest, rows = _outputs_digest(res)
    rec: dict[str, Any] = {
        "record": "measurement", "system": res.system, "kind": res.kind, "entries": res.entries,
        "batch_s": median(batch_s), "batch_s_p95": percentile(batch_s, 95), "batch_s_all": batch_s,
        "sink_s": med("sink_s"), "measured_batches": len(meas),
        "fill_s": sum(r["trigger_s"] or 0.0 for r in fill), "fill_batches": len(fill),
        "fill_batch_s": [r["trigger_s"] for r in fill],
        "run_s": res.seconds, "output_rows": rows, "output_digest": digest, "missing_batches": missing,
        "batch_s_max": max(batch_s) if batch_s else None, "loadavg_1_5_15": loadavg(),
    }
    rec.update(_check_values(res, plan))
    if res.system == "rhino":
        deltas = all_of("delta_bytes")
        if any(d is not None for d in deltas):
            where = ("the primaries' checkpoint manifests" if any(r.get("delta_from") == "manifest" for r in meas)
                     else "the commit stats in the tasks' meta rows")
            rec["bytes_written"], rec["bytes_written_source"] = med("delta_bytes"), \
                f"checkpoint delta: bytes of the files new in checkpoint b, summed over the instances (from {where})"
        else:
            rec["bytes_written"], rec["bytes_written_source"] = None, \
                "missing: the tasks' meta rows carry no delta_bytes"
        rec["bytes_written_all"] = deltas
        for k in ("replicated_bytes", "logical_bytes", "disk_write_bytes", "checkpoint_bytes", "delta_files",
                  "puts", "round_trips", "op_s", "job_s", "begin_s", "commit_s"):
            rec[k] = med(k)
        rec["replicated_bytes_all"] = all_of("replicated_bytes")
        rec["disk_write_bytes_all"] = all_of("disk_write_bytes")
        crit = [r["critical_task_s"] for r in meas if r.get("critical_task_s")]
        rec["critical_task_s"] = {f: median([c[f] for c in crit if c.get(f) is not None]) for f in _TASK_FIELDS} \
            if crit else None
        rec["attempts_max"] = max((r.get("attempts") or 1 for r in meas), default=None)
    else:
        rec["bytes_written"] = med("ckpt_new_bytes")
        rec["bytes_written_source"] = ("bytes of files new or grown in the query checkpoint's state/ directory "
                                       "after the batch (what the RocksDB provider uploaded)")
        rec["bytes_written_all"] = all_of("ckpt_new_bytes")
        rec["checkpoint_dir_bytes_last"] = meas[-1].get("ckpt_total_bytes") if meas else None
        rec["local_new_bytes"] = med("local_new_bytes")
        rec["local_new_bytes_all"] = all_of("local_new_bytes")
        sm = [r.get("spark_rocksdb") or {} for r in meas]
        rec["spark_rocksdb_metrics"] = {k: median([m[k] for m in sm if m.get(k) is not None])
                                        for k in _SPARK_METRICS if any(k in m for m in sm)}
        so = [r.get("spark_state_op") or {} for r in meas]
        rec["spark_state_op"] = {k: median([m[k] for m in so if m.get(k) is not None])
                                 for k in ("allUpdatesTimeMs", "commitTimeMs", "numRowsTotal", "memoryUsedBytes")}
    bw = [x for x in rec.get("bytes_written_all") or [] if x is not None]
    rec["bytes_written_mean"] = sum(bw) / len(bw) if bw else None  # with the compactions' batches
    rec["bytes_written_max"] = max(bw) if bw else None
    rec["measure_overhead_s"] = med("measure_s")
    rec["command"] = command
    rec["parameters"] = parameters
    return round_floats(rec)


def summarize(records: list[dict]) -> dict:
    """The targets, from the measurement lines of one run."""
    ms = [r for r in records if r.get("record") == "measurement"]
    out: dict[str, Any] = {"record": "summary", "flatness": {}, "rhino_vs_spark": {}, "outputs_agree": {}}
    for kind in KINDS:
        rh = sorted((r for r in ms if r["system"] == "rhino" and r["kind"] == kind and r.get("batch_s")),
                    key=lambda r: r["entries"])
        if len(rh) >= 2:
            ratio = rh[-1]["batch_s"] / rh[0]["batch_s"]
            out["flatness"][kind] = {"from_entries": rh[0]["entries"], "to_entries": rh[-1]["entries"],
                                     "ratio": round(ratio, 3), "target": TARGET_FLAT,
                                     "met": ratio <= TARGET_FLAT}
        for r in rh:
            sp = next((s for s in ms if s["system"] == "spark-rocksdb" and s["kind"] == kind
                       and s["entries"] == r["entries"] and s.get("batch_s")), None)
            if sp is None:
                continue
            key = f"{kind}/{r['entries']}"
            out["rhino_vs_spark"][key] = {"spark_over_rhino": round(sp["batch_s"] / r["batch_s"], 3),
                                          "met": r["batch_s"] <= sp["batch_s"]}
        for r in ms:
            if r["kind"] != kind:
                continue
            others = [s for s in ms if s["kind"] == kind and s["entries"] == r["entries"]]
            if len({s["system"] for s in others}) == len(SYSTEMS):
                out["outputs_agree"][f"{kind}/{r['entries']}"] = len({s["output_digest"] for s in others}) == 1
    met = [v["met"] for v in out["flatness"].values()] + [v["met"] for v in out["rhino_vs_spark"].values()]
    out["all_targets_met"] = bool(met) and all(met)
    return out


# ---- plot and report ----------------------------------------------------------------------------

_COLORS = {("rhino", "map"): "#d04040", ("rhino", "list"): "#e09090",
           ("spark-rocksdb", "map"): "#303030", ("spark-rocksdb", "list"): "#909090"}


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [r for r in records if r.get("record") == "measurement"]
    if not ms:
        return
    fig, axs = plt.subplots(1, 2, figsize=(13, 4.8))
    for (system, kind), color in _COLORS.items():
        rr = sorted((r for r in ms if r["system"] == system and r["kind"] == kind and r.get("batch_s")),
                    key=lambda r: r["entries"])
        if not rr:
            continue
        style = "-o" if kind == "map" else "--s"
        axs[0].plot([r["entries"] for r in rr], [r["batch_s"] for r in rr], style, color=color,
                    label=f"{system}, {kind}")
        bw = [(r["entries"], r["bytes_written"]) for r in rr if r.get("bytes_written")]
        if bw:
            axs[1].plot([x for x, _ in bw], [y for _, y in bw], style, color=color, label=f"{system}, {kind}")
        mean = [(r["entries"], _bw_stat(r, "mean")) for r in rr if _bw_stat(r, "mean")]
        if mean:
            axs[1].plot([x for x, _ in mean], [y for _, y in mean], ":", color=color, marker=style[-1],
                        markerfacecolor="none", label=f"{system}, {kind}: mean (with compactions)")
    axs[0].set_xscale("log")
    axs[0].set_ylim(bottom=0)
    axs[0].set_xlabel("entries in the big key (N)")
    axs[0].set_ylabel("seconds per micro-batch (median)")
    axs[0].set_title("One touch of the big key per batch: batch time")
    axs[0].legend(fontsize=8)
    axs[1].set_xscale("log")
    axs[1].set_yscale("log")
    axs[1].set_xlabel("entries in the big key (N)")
    axs[1].set_ylabel("bytes added to the checkpoint per batch")
    axs[1].set_title("Bytes written per batch (median; dotted: mean)")
    axs[1].legend(fontsize=7)
    for ax in axs:
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bw_stat(r: dict, which: str) -> Optional[float]:
    """The mean or max of a measurement's bytes_written_all (older lines lack the fields)."""
    if r.get(f"bytes_written_{which}") is not None:
        return r[f"bytes_written_{which}"]
    bw = [x for x in r.get("bytes_written_all") or [] if x is not None]
    if not bw:
        return None
    return sum(bw) / len(bw) if which == "mean" else max(bw)


def _fmt_bytes(x: Any) -> str:
    if x is None:
        return "-"
    x = float(x)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(x) < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(x)


def report(records: list[dict], path: str) -> None:
    from rhino._machine import machine_summary

    setup = next((r for r in records if r.get("record") == "setup"), {})
    command = setup.get("command", "")
    summ_rec = next((r for r in records[::-1] if r.get("record") == "summary"), None)
    elapsed_s = (summ_rec or {}).get("elapsed_s")

    ms = sorted((r for r in records if r.get("record") == "measurement"),
                key=lambda r: (r["kind"], r["entries"], r["system"]))
    summ = summarize(records)

    def f(x: Any, d: int = 3) -> str:
        return "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))

    L = ["# Large per-key state: one touch of a key holding N entries, Rhino vs Spark's RocksDB state store", "",
         f"Command: `{command}`", "",
         f"Run at {setup.get('started')} on {machine_summary(setup.get('machine', {}))}"
         + (f"; the whole run took {elapsed_s / 60:.1f} min." if elapsed_s else "."), "",
         "Parameters: " + ", ".join(f"{k}={v}" for k, v in setup.get("parameters", {}).items()), "",
         source_line(setup.get("source") or {}, summ_rec), "",
         "Spark settings: " + (", ".join(f"`{k}={v}`" for k, v in setup.get("spark_conf", {}).items())
                               or "Spark's defaults") + " (besides the RocksDB provider, the session's "
         "`spark.sql.shuffle.partitions` = Rhino's instances, UTC).", "",
         "Workload (bench/rhino_bench/spark/state_size.py): the same `BigKeyProcessor` object on both systems, "
         "over the same micro-batches (one Parquet file each, a file stream with maxFilesPerTrigger=1). Key 0 "
         "holds N entries in a MapState (or a ListState); after the fill batches, each measured batch touches "
         "it once (map: `getValue` + `updateValue` of an existing entry; list: one `appendValue`) among the "
         "small keys, each touched alike. `batch_s`: median of Spark's `triggerExecution` over the measured "
         "batches (the whole micro-batch, both systems). `bytes_written`: median bytes one batch adds to the "
         "durable checkpoint (Rhino: the commit's checkpoint delta on the primaries; Spark: files new in the "
         "checkpoint's `state/` directory); `mean` and `max` over the same batches show what the median leaves "
         "out: the batches whose flush triggered a compaction of the big key's data. `replicated` (Rhino): bytes the primaries sent down their chains. "
         "`disk writes` (Rhino): `/proc/<pid>/io` write_bytes of all workers (WAL, flush, compaction, replicas). "
         "`local new` (Spark): bytes new in its local RocksDB working directories. Fill: the fill batches' total "
         "time (not judged).", "",
         "| kind | N | system | batch_s median | p95 | vs Spark | bytes_written | mean | max | replicated "
         "| disk writes | local new | fill (s, batches) | outputs |",
         "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in ms:
        sp = next((s for s in ms if s["system"] == "spark-rocksdb" and s["kind"] == r["kind"]
                   and s["entries"] == r["entries"]), None)
        vs = (sp["batch_s"] / r["batch_s"]) if sp and sp.get("batch_s") and r.get("batch_s") else None
        agree = summ["outputs_agree"].get(f"{r['kind']}/{r['entries']}")
        L.append(f"| {r['kind']} | {r['entries']:,} | {r['system']} | {f(r.get('batch_s'))} | "
                 f"{f(r.get('batch_s_p95'))} | {f(vs, 2) + 'x' if vs and r['system'] == 'rhino' else '-'} | "
                 f"{_fmt_bytes(r.get('bytes_written'))} | {_fmt_bytes(_bw_stat(r, 'mean'))} | "
                 f"{_fmt_bytes(_bw_stat(r, 'max'))} | {_fmt_bytes(r.get('replicated_bytes'))} | "
                 f"{_fmt_bytes(r.get('disk_write_bytes'))} | {_fmt_bytes(r.get('local_new_bytes'))} | "
                 f"{f(r.get('fill_s'), 1)} ({r.get('fill_batches')}) | "
                 f"{'agree' if agree else ('DIFFER' if agree is False else '-')} |")
    rh = [r for r in ms if r["system"] == "rhino" and r.get("critical_task_s")]
    if rh:
        fields = list(_TASK_FIELDS)
        L += ["", "Rhino, the slowest task of each measured batch (median seconds; `replicate_s` is inside "
              "`commit_s`), and the driver's parts:", "",
              "| kind | N | " + " | ".join(fields) + " | round trips | driver begin | job | commit |",
              "|---|---:|" + "---:|" * (len(fields) + 4)]
        for r in rh:
            c = r["critical_task_s"]
            L.append(f"| {r['kind']} | {r['entries']:,} | " + " | ".join(f(c.get(x)) for x in fields)
                     + f" | {f(r.get('round_trips'))} | {f(r.get('begin_s'))} | {f(r.get('job_s'))} | "
                       f"{f(r.get('commit_s'))} |")
    sp = [r for r in ms if r["system"] == "spark-rocksdb" and r.get("spark_rocksdb_metrics")]
    if sp:
        L += ["", "Spark's RocksDB metrics of the measured batches (medians; bytes):", "",
              "| kind | N | BytesCopied | TotalBytesWritten | ByFlush | ByCompaction | SstFileSize | allUpdatesTimeMs "
              "| commitTimeMs |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sp:
            m, so = r["spark_rocksdb_metrics"], r.get("spark_state_op") or {}
            L.append(f"| {r['kind']} | {r['entries']:,} | {_fmt_bytes(m.get('rocksdbBytesCopied'))} | "
                     f"{_fmt_bytes(m.get('rocksdbTotalBytesWritten'))} | "
                     f"{_fmt_bytes(m.get('rocksdbTotalBytesWrittenByFlush'))} | "
                     f"{_fmt_bytes(m.get('rocksdbTotalBytesWrittenByCompaction'))} | "
                     f"{_fmt_bytes(m.get('rocksdbSstFileSize'))} | {f(so.get('allUpdatesTimeMs'))} | "
                     f"{f(so.get('commitTimeMs'))} |")
    L += ["", "Targets (reported, not asserted):", ""]
    for kind, v in summ["flatness"].items():
        L.append(f"- Rhino, {kind}: batch_s at N={v['to_entries']:,} is {v['ratio']}x its batch_s at "
                 f"N={v['from_entries']:,} (target <= {TARGET_FLAT:g}x): **{'met' if v['met'] else 'not met'}**.")
    for key, v in summ["rhino_vs_spark"].items():
        L.append(f"- Rhino at least as fast as Spark's own, {key}: Spark's batch_s / Rhino's = "
                 f"{v['spark_over_rhino']}x: **{'met' if v['met'] else 'not met'}**.")
    for key, v in summ["outputs_agree"].items():
        if not v:
            L.append(f"- The outputs of {key} DIFFER between the systems.")
    L.append("")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(L))


# ---- the command -------------------------------------------------------------------------------


def parse_entries(text: str) -> list[int]:
    """'1k,100k,1M' -> [1000, 100000, 1000000]."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        mult = {"k": 1_000, "m": 1_000_000}.get(item[-1].lower(), 1)
        num = item[:-1] if mult > 1 else item
        try:
            v = int(float(num) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected a count like 1000, 100k or 1M") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: must be >= 1")
        out.append(v)
    if not out:
        raise argparse.ArgumentTypeError("no entries given")
    return sorted(set(out))


def _choices(allowed: Sequence[str], what: str) -> Any:
    def parse(text: str) -> list[str]:
        out = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in out if x not in allowed]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}: choose from {', '.join(allowed)}")
        return out

    return parse


class StateSize(Scenario):
    name = "spark state-size"
    description = ("Per-batch time and bytes written when each micro-batch touches one key holding N MapState or "
                   "ListState entries: Rhino vs Spark's transformWithStateInPandas with RocksDB, same processor, "
                   "same run.")
    workdir_prefix = "rhino-state-size-"
    summary_on_failure = False

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--entries", type=parse_entries, default=[1_000, 100_000, 1_000_000],
                        help="entries in the big key, comma-separated (default 1k,100k,1M)")
        ap.add_argument("--kinds", type=_choices(KINDS, "kind"), default=list(KINDS), help="map,list (default both)")
        ap.add_argument("--systems", type=_choices(SYSTEMS, "system"), default=list(SYSTEMS),
                        help="rhino,spark-rocksdb (default both)")
        ap.add_argument("--batches", type=positive_int, default=10, help="measured batches per run (default 10)")
        ap.add_argument("--warmup", type=non_negative_int, default=2,
                        help="touch batches run before the measured ones, not counted (default 2)")
        ap.add_argument("--fill-chunk", type=positive_int, default=100_000,
                        help="entries added per fill batch (default 100000)")
        ap.add_argument("--small-keys", type=non_negative_int, default=100,
                        help="other keys touched in every measured batch (default 100)")
        ap.add_argument("--partitions", type=positive_int, default=2,
                        help="Spark's shuffle partitions = Rhino's instances (default 2)")
        ap.add_argument("--replicas", type=non_negative_int, default=2, help="Rhino's r (default 2)")
        spark_flags(ap, first_host=70)
        ap.add_argument("--seed", type=int, default=7, help="which entries the touches pick (default 7)")
        ap.add_argument("--no-warmup-run", dest="warmup_run", action="store_false",
                        help="skip the discarded first run of each system and kind (N=100) that warms up the JVM, "
                             "Spark's Python workers and the workers' connections")
        ap.add_argument("--timeout", type=positive_float, default=3600.0, help="per run, s (default 3600)")

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.first_host + args.replicas > 254:
            ap.error("--first-host: the workers must fit 127.0.0.2..254")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {"entries": args.entries, "kinds": args.kinds, "systems": args.systems, "batches": args.batches,
                "warmup": args.warmup, "fill_chunk": args.fill_chunk, "small_keys": args.small_keys,
                "partitions": args.partitions, "replicas": args.replicas, "master": args.master,
                "seed": args.seed, "warmup_run": args.warmup_run, "run_id": run_id}

    def run(self, br: BenchRun) -> None:
        args, base = br.args, br.base
        say(f"starting Spark ({args.master})" + (f", a coordinator and {args.replicas + 1} Rhino workers at "
                                                  f"127.0.0.{args.first_host}.." if "rhino" in args.systems else ""))
        env = _start(br)
        if args.warmup_run:
            _warm_up(env, args, base, br.run_id)
        for n in args.entries:
            plan = plan_batches(n, fill_chunk=args.fill_chunk, warmup=args.warmup, batches=args.batches,
                                small_keys=args.small_keys, seed=args.seed)
            input_dir = base / f"input-{n}"
            write_inputs(input_dir, plan)
            for kind in args.kinds:
                for system in args.systems:
                    say(f"{system}, {kind}, N={n:,}: {len(plan)} batches ({sum(b.phase == 'fill' for b in plan)} fill)")
                    work = base / f"{system}-{kind}-{n}"
                    res = run_once(env.spark, system=system, kind=kind, n=n, input_dir=input_dir, work=work,
                                   cluster=env.cluster, parallelism=args.partitions, replicas=args.replicas,
                                   timeout_s=args.timeout, operator_id=f"ss-{kind}-{n}-{br.run_id}",
                                   spark_local_dir=env.local_dir)
                    rec = br.emit(measurement(res, plan, command=br.command, parameters=br.parameters))
                    say(f"  {system}, {kind}, N={n:,}: batch_s {rec['batch_s']}, bytes_written "
                        f"{rec.get('bytes_written')}, fill {rec['fill_s']:.1f} s")
                    shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(input_dir, ignore_errors=True)






@dataclass
class _Env:
    spark: Any
    cluster: Optional[RhinoCluster]
    local_dir: Path


def _start(br: BenchRun) -> _Env:
    """The coordinator and workers (if Rhino runs) and the SparkSession; their stops go on the run's stack."""
    args = br.args
    cluster = None
    if "rhino" in args.systems:
        cluster = start_rhino(br.base / "rhino", br.stack, workers=args.replicas + 1, first_host=args.first_host,
                              heartbeat_timeout=2.0)
    # Spark's state server warns at every getValue of an absent map key (the small keys' first touch): errors only
    conf = {"spark.sql.streaming.numRecentProgressUpdates": "1000",
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER, **br.spark_conf}
    spark = spark_session(br.stack, br.base, app="rhino-bench-state-size", master=args.master,
                          partitions=args.partitions, conf=conf)
    return _Env(spark=spark, cluster=cluster, local_dir=br.base / "spark-local")


def _warm_up(env: _Env, args: argparse.Namespace, base: Path, run_id: str) -> None:
    """One discarded run per system and kind on N=100: the first queries of a process pay for
    the JIT, Spark's Python workers and the connections, which would count against whichever
    configuration ran first."""
    plan = plan_batches(100, fill_chunk=100, warmup=0, batches=2, small_keys=args.small_keys, seed=args.seed)
    input_dir = base / "input-warmup"
    write_inputs(input_dir, plan)
    for kind in args.kinds:
        for system in args.systems:
            work = base / f"warmup-{system}-{kind}"
            res = run_once(env.spark, system=system, kind=kind, n=100, input_dir=input_dir, work=work,
                           cluster=env.cluster, parallelism=args.partitions, replicas=args.replicas,
                           timeout_s=args.timeout, operator_id=f"ss-warmup-{kind}-{run_id}",
                           spark_local_dir=env.local_dir)
            say(f"warm-up run: {system}, {kind}, N=100: {len(res.batches)} batches in {res.seconds:.1f} s")
            shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(input_dir, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(StateSize(summarize=summarize, report=report, plot=plot), argv)


if __name__ == "__main__":
    sys.exit(main())
