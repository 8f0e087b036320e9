"""``rhino-bench spark big-key``: the run's steps (fill, read through the processor, read through
the state reader, handover), each measured, checked against the model and emitted as a JSON line."""

from __future__ import annotations

import argparse
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..procmem import MemorySampler
from .big_key_report import _fmt
from .common import Emitter, loadavg, median, round_floats, say
from .big_key_workload import AGG_FIELDS, BIG_KEY, INPUT_SCHEMA, Model, OP_FILL, OP_SCAN, PREFETCH, VAR, plan_fill

if TYPE_CHECKING:
    from rhino.coordinator.types import Placement


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

            self.admin = connect_coordinator(self.cluster.coordinator,
                                             secret=read_secret_file(self.cluster.secret_file))
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
        return _metric_sum(self.cluster.workers, "rhino_session_bytes_written_total", self.operator_id)

    def replicated_bytes(self) -> Optional[float]:
        return _metric_sum(self.cluster.workers, "rhino_instance_replicated_bytes_total", self.operator_id)

    def check(self, name: str, ok: bool) -> bool:
        self.checks[name] = bool(ok)
        if not ok:
            say(f"  CHECK FAILED: {name}")
        return bool(ok)

    def emit_step(self, rec: dict, t0: float) -> dict:
        rec = {"record": "step", **rec}
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        rec.update(self.sampler.take())
        rec["rhino_dir_bytes"] = dir_bytes(self.cluster.root)
        rec["disk_free_bytes"] = shutil.disk_usage(self.cluster.root).free
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
            df = (self.spark.read.format("rhino-state").option("coordinator", self.cluster.coordinator)
                  .option("secretFile", str(self.cluster.secret_file)).option("operatorId", self.operator_id)
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


