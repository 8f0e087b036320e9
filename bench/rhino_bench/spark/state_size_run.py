"""``rhino-bench spark state-size``: one run (one system, one kind, one N) on the stream of
micro-batches, what it wrote to disk, and its JSON line."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .common import loadavg, median, percentile, round_floats
from .state_size_workload import (BIG_KEY, Batch, BigKeyProcessor, INPUT_SCHEMA, OP_CHECK, OUTPUT_SCHEMA,
                                  _SPARK_METRICS, _TASK_FIELDS)


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
                                  coordinator=cluster.coordinator, secret_file=str(cluster.secret_file),
                                  parallelism=parallelism, replicas=replicas, locality=False)
        probe: list[RhinoProbe] = []

        def sink(df: Any, batch_id: int) -> None:
            if not probe:  # the operator's counters start at its first batch
                probe.append(RhinoProbe(cluster.workers, operator_id))
            t0 = time.perf_counter()
            pdf = op.process_batch(df, batch_id).to_pandas()
            t1 = time.perf_counter()
            rep = op.reports[-1]
            rec: dict[str, Any] = {"sink_s": t1 - t0, "op_s": rep.seconds, "attempts": rep.attempts,
                                   "begin_s": rep.begin_s, "job_s": rep.job_s, "commit_s": rep.commit_s}
            tasks = rep.tasks
            for t in tasks:
                if t.get("delta_bytes") is None:
                    t.update(_manifest_delta(cluster.workers, t.get("primary"), operator_id, t["instance"],
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
