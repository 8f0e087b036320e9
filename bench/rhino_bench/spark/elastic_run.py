"""``rhino-bench spark elastic``: one system's run: the query on the local cluster while the input
rate steps, its batches as JSON lines, the autoscaler's reconfigurations (Rhino) and the restart with
more executors (Spark's remedy)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from rhino_testing.harness.warm import warm_executor

from .common import Emitter, median, round_floats, say, spark_time


HOSTS = 3                # the cluster's hosts; the spare one is host 4


# --------------------------------------------------------------------------- running one system


def _as_dict(p: Any) -> dict:
    """A StreamingQueryProgress as plain JSON (offsets and metrics included)."""
    try:
        return json.loads(p.json)
    except Exception:  # noqa: BLE001 - a dict subclass in PySpark 4: its items
        return dict(p)


def _interval(seconds: float) -> str:
    """A trigger interval as Spark parses it."""
    if float(seconds).is_integer():
        return f"{int(seconds)} seconds"
    return f"{int(round(seconds * 1000))} milliseconds"


class _QueryFailed(RuntimeError):
    pass


class SystemRun:
    """One system's run on its cluster: the query, its batches, the schedule, the autoscaler."""

    def __init__(self, system: str, args: argparse.Namespace, em: Emitter, cl: Any, spark: Any, work: Path,
                 shared: dict) -> None:
        self.system, self.args, self.em, self.cl, self.spark, self.work = system, args, em, cl, spark, work
        self.shared = shared
        self.S = float(args.trigger_interval)
        self.sched_file = work / "schedule.json"
        self.schedule: dict = {}
        self.origin: float = time.time()  # the query's start: t = 0 of every line
        self.steps: Optional[list[dict]] = None
        self.t_end: Optional[float] = None
        self.o_end: Optional[int] = None
        self.phase_override: Optional[str] = None
        self.rate_override: Optional[float] = None
        self.rows: list[dict] = []
        self.seen: set[int] = set()
        self.op: Any = None
        self.cc: Any = None
        self.sq: Any = None
        self.op_id = f"q8-elastic-{int(time.time())}"
        self.outputs: dict[int, int] = {}
        self.deadline = time.time() + args.timeout
        self.shuffle_partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))

    # ---- the query
    def _start_query(self) -> Any:
        from rhino_testing.nexmark.pipeline import ROCKSDB_PROVIDER
        from rhino_testing.nexmark.queries import QUERIES
        from .elastic_source import SOURCE_NAME, ElasticNexmarkSource

        a = self.args
        q = QUERIES["q8"]
        params = {"window_ms": a.window_ms}
        self.spark.dataSource.register(ElasticNexmarkSource)
        r = (self.spark.readStream.format(SOURCE_NAME).option("scheduleFile", str(self.sched_file))
             .option("numPartitions", int(a.source_partitions)))
        if a.payload_bytes:
            r = r.option("payloadBytes", int(a.payload_bytes))
        events = r.load()
        prepared = q.prepare(events.withWatermark(q.event_time_column, q.watermark_delay), **params)

        def sink(df: Any, batch_id: int) -> None:
            self.outputs[int(batch_id)] = len(df.toPandas())  # idempotent by batch id

        if self.system == "rhino":
            if self.op is None:
                from rhino.spark.operator import TransformWithState

                self.op = TransformWithState(
                    q.processor_factory(**params), key=q.key, output_schema=q.output_schema, operator_id=self.op_id,
                    coordinator=self.cl.coordinator, secret_file=str(self.cl.secret_file),
                    parallelism=a.parallelism, replicas=a.replicas, num_vnodes=a.vnodes, time_mode=q.time_mode,
                    event_time=q.event_time_column, watermark_delay=q.watermark_delay,
                    checkpoint_location=str(self.work / "ck" / "rhino"))
            writer = prepared.writeStream.foreachBatch(self.op.for_each_batch(sink))
        else:
            self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
            out = prepared.groupBy(*q.key).transformWithStateInPandas(
                q.processor_factory(**params), q.output_schema, q.output_mode, q.time_mode)
            writer = out.writeStream.outputMode("append").foreachBatch(sink)
        return (writer.option("checkpointLocation", str(self.work / "ck" / "query"))
                .trigger(processingTime=_interval(self.S)).start())

    def _write(self) -> None:
        from .elastic_source import write_schedule

        write_schedule(self.sched_file, self.schedule)

    # ---- the batches
    def _phase_of(self, end_off: Optional[int]) -> tuple[str, Optional[int], Optional[float]]:
        if self.phase_override is not None:
            return self.phase_override, None, self.rate_override
        if self.steps is None or end_off is None or end_off <= self.steps[0]["offset"]:
            return "warmup", None, None
        k = max(i for i, s in enumerate(self.steps) if end_off > s["offset"])
        return "steps", k, self.steps[k]["rate_x"]

    def _collect(self) -> None:
        """The batches completed since the last call: a line each, and a progress line."""
        from .elastic_source import arrival_time, offset_of

        try:
            last = self.sq.lastProgress  # one entry: cheap to poll
            if last is None or int(last["batchId"]) in self.seen:
                return
            progs = [_as_dict(p) for p in (self.sq.recentProgress or [])]
        except Exception:  # noqa: BLE001 - a query being stopped
            return
        for d in sorted(progs, key=lambda d: int(d.get("batchId", -1))):
            b = int(d.get("batchId", -1))
            if b < 0 or b in self.seen:
                continue
            self.seen.add(b)
            self._row(b, d, arrival_time, offset_of)

    def _row(self, b: int, d: dict, arrival_time: Callable, offset_of: Callable) -> None:
        lat = ((d.get("durationMs") or {}).get("triggerExecution") or 0) / 1000.0
        start = spark_time(d.get("timestamp")) or time.time() - lat
        src = (d.get("sources") or [{}])[0]
        s_off, e_off = offset_of(src.get("startOffset")), offset_of(src.get("endOffset"))
        events = int(d.get("numInputRows") or 0)
        phase, step, rate_x = self._phase_of(e_off)
        row: dict[str, Any] = {
            "record": "batch", "system": self.system, "batch": b, "phase": phase, "step": step, "rate_x": rate_x,
            "t": start - self.origin, "t_unix": start, "latency_s": lat, "events": events,
            "start_offset": s_off, "end_offset": e_off, "output_rows": self.outputs.get(b),
            "failed": False, "parallelism": None}
        if s_off is not None and events > 0:
            arrived = arrival_time(self.schedule, s_off)
            row["oldest_event_age_s"] = (start + lat - arrived) if arrived is not None else None
        if rate_x is not None and self.shared.get("base_events"):
            row["events_per_s"] = rate_x * self.shared["base_events"] / self.S
        note = ""
        if self.system == "rhino":
            rep = next((r for r in reversed(self.op.reports) if r.batch == b), None) if self.op else None
            if rep is not None:
                row.update(parallelism=len(rep.tasks), attempts=rep.attempts, failed=rep.attempts > 1,
                           barrier_s=rep.begin_s, rhino_batch_s=rep.seconds, epoch=rep.epoch,
                           errors=[str(e)[:300] for e in rep.errors[:2]])
            dec = self._decision(b)
            if dec is not None:
                row["decision"] = dec
                if dec.get("action") != "hold":
                    note = (f"; autoscaler: {dec.get('action')} {dec.get('from')} -> {dec.get('to')}"
                            + (f" (plan {dec['plan']})" if dec.get("plan") is not None else
                               f" (not planned: {dec.get('error')})"))
        else:
            ops = d.get("stateOperators") or []
            so = ops[0] if ops else {}
            cm = so.get("customMetrics") or {}
            row["parallelism"] = so.get("numShufflePartitions") or self.shuffle_partitions
            row["state_bytes"] = cm.get("rocksdbSstFileSize")
            if cm.get("rocksdbLoadLatencyMs") is not None:
                row["state_load_s"] = cm["rocksdbLoadLatencyMs"] / 1000.0
            row["stores_loaded_from_dfs"] = cm.get("rocksdbNumLoadedFromDfs")
        row = round_floats(row)
        self.rows.append(row)
        self.em.emit(row)
        where = phase if step is None else f"step {step} ({rate_x:g}x)"
        say(f"  {self.system} batch {b}: {where}, {events:,} events, {lat:.2f} s"
            + (" OVER the trigger interval" if lat >= self.S and events else "")
            + f", parallelism {row.get('parallelism')}"
            + (f", oldest event {row['oldest_event_age_s']:.1f} s old" if row.get("oldest_event_age_s") else "")
            + (f", attempts {row.get('attempts')}" if (row.get("attempts") or 1) > 1 else "") + note)

    def _decision(self, b: int) -> Optional[dict]:
        """The autoscaler's decision on batch ``b`` (its last one, as ``status()`` shows it)."""
        if self.cc is None:
            return None
        try:
            st = self.cc.status()
        except Exception:  # noqa: BLE001 - best effort; the events have every rescale anyway
            return None
        op = next((o for o in st.get("operators", []) if o.get("operator_id") == self.op_id), None)
        last = ((op or {}).get("autoscale") or {}).get("last")
        if not last or last.get("batch") != b:
            return None
        out = {k: last.get(k) for k in ("action", "from", "to", "reason", "plan", "error")}
        out["instances_after"] = len(op.get("instances") or [])
        return out

    def _data_batches(self) -> int:
        return sum(1 for r in self.rows if (r.get("events") or 0) > 0)

    def _drive(self, until: Callable[[], bool], what: str) -> None:
        while True:
            try:
                ended = self.sq.awaitTermination(0.5)
            except Exception as e:  # noqa: BLE001 - StreamingQueryException: the query failed
                self._collect()
                err = f"{type(e).__name__}: {str(e)[:1500]}"
                self.em.emit({"record": "query_failed", "system": self.system, "during": what, "error": err})
                raise _QueryFailed(err) from None
            self._collect()
            if ended:
                raise _QueryFailed(f"the query stopped during {what}")
            if until():
                return
            if time.time() > self.deadline:
                raise TimeoutError(f"{self.system}: {what} did not end within --timeout {self.args.timeout:g} s")

    # ---- the phases
    def run(self) -> None:
        a = self.args
        warm = a.warmup_events or self.shared.get("base_events") or 50_000
        self.origin = time.time()
        self.schedule = {"first": 0, "segments": [[self.origin, warm / self.S]]}
        self._write()
        if self.system == "rhino":
            self.cc = self.cl.coordinator_client()
        say(f"{self.system}: the query starts; warm-up: {a.warmup_batches} batches at {warm:,} events per "
            f"{self.S:g} s")
        self.sq = self._start_query()
        self._drive(lambda: self._data_batches() >= a.warmup_batches, "the warm-up")
        self._begin_steps()
        self._drive(self._steps_over, "the rate steps")
        if self.system == "spark-rocksdb" and a.restart_batches:
            self._remedy()

    def _calibrate(self) -> dict:
        from rhino.engine.report import instance_busy_s, instance_records

        reps = {r.batch: r for r in self.op.reports}
        ev = {r["batch"]: r["events"] for r in self.rows}
        use = [b for b in sorted(reps) if b >= 1 and ev.get(b)]
        use = use[-max(1, self.args.warmup_batches - 2):]
        rates, recs, events = [], 0, 0
        for b in use:
            for t in reps[b].tasks:
                n, busy = instance_records(t), instance_busy_s(t)
                if n and busy:
                    rates.append(n / busy)
                    recs += n
            events += ev[b]
        rec: dict[str, Any] = {"record": "calibration", "system": self.system, "batches": use,
                               "base_load": self.args.base_load, "trigger_interval_s": self.S}
        r = median(rates)
        if not r or not recs:
            base = self.args.warmup_events or 50_000
            rec.update(base_events=base, error="no task reported records and busy time: the warm-up's rate is used")
            return rec
        epr = events / recs
        base = max(1000, int(round(self.args.base_load * r * epr * self.S, -3)))
        rec.update(instance_records_per_s=r, events_per_record=epr, instance_events_per_s=r * epr,
                   task_rates=sorted(rates), base_events=base)
        return round_floats(rec)

    def _begin_steps(self) -> None:
        from .elastic_source import offset_at, segments_for

        a = self.args
        if self.shared.get("base_events") is None:
            if self.system == "rhino":
                cal = self._calibrate()
            else:  # the Rhino run failed before it calibrated
                cal = {"record": "calibration", "system": self.system, "base_load": a.base_load,
                       "base_events": a.warmup_events or 50_000,
                       "error": "the Rhino run did not size 1x: the warm-up's rate is used"}
            self.em.emit(cal)
            self.shared["base_events"] = cal["base_events"]
            say(f"{self.system}: calibrated: one instance does {cal.get('instance_events_per_s') or 0:,.0f} events/s "
                f"of busy time; 1x = {cal['base_events']:,} events per {self.S:g} s"
                + (f" ({cal['error']})" if cal.get("error") else ""))
        base = self.shared["base_events"]
        if self.system == "rhino":
            ans = self.cc.autoscale(self.op_id, min_parallelism=a.min_parallelism, max_parallelism=a.max_parallelism,
                                    strategy=a.strategy, utilization=a.utilization,
                                    cooldown_batches=a.cooldown_batches)
            self.em.emit({"record": "autoscale", "system": self.system, "operator": self.op_id,
                          "settings": (ans or {}).get("settings"), "t": time.time() - self.origin})
            say(f"{self.system}: the autoscaler is on: {(ans or {}).get('settings')}")
        start = time.time() + 1.0  # in the future: the source and this process agree on the past
        segs = segments_for(start=start, rates=a.rates, base_eps=base / self.S, step_s=a.batches_per_step * self.S)
        self.schedule = {"first": self.schedule["first"],
                         "segments": [s for s in self.schedule["segments"] if s[0] < start] + segs}
        self._write()
        self.steps = [{"step": k, "rate_x": r, "t_unix": segs[k][0], "t": segs[k][0] - self.origin,
                       "offset": offset_at(self.schedule, segs[k][0]), "events_per_s": segs[k][1]}
                      for k, r in enumerate(a.rates)]
        self.t_end = segs[-1][0]
        self.o_end = offset_at(self.schedule, self.t_end)
        self._emit_schedule()
        say(f"{self.system}: the rate steps begin: " + ", ".join(f"{s['rate_x']:g}x ({s['events_per_s']:,.0f} "
                                                                 f"events/s)" for s in self.steps)
            + f", {a.batches_per_step} x {self.S:g} s each")

    def _emit_schedule(self) -> None:
        self.em.emit(round_floats({
            "record": "schedule", "system": self.system, "trigger_interval_s": self.S,
            "base_events": self.shared.get("base_events"), "batches_per_step": self.args.batches_per_step,
            "steps": [{k: v for k, v in s.items() if k != "t_unix"} for s in (self.steps or [])],
            "end_t": (self.t_end - self.origin) if self.t_end else None, "end_offset": self.o_end,
            "origin_unix": self.origin,
            "segments_t": [[s[0] - self.origin, s[1]] for s in self.schedule["segments"]]}))

    def _steps_over(self) -> bool:
        now = time.time()
        if self.t_end is None or now < self.t_end:
            return False
        last = max((r["end_offset"] for r in self.rows if r.get("end_offset") is not None), default=0)
        return last >= (self.o_end or 0) or now >= self.t_end + self.args.drain_batches * self.S

    def _remedy(self) -> None:
        """Spark's only remedy, timed: stop the query, start it again with more executors."""
        a = self.args
        peak = max(a.rates)
        before = self.cl.executor_hosts(self.spark)
        say(f"{self.system}: Spark's remedy: the spare host joins first (nothing arrives meanwhile)")
        t_h = time.time()
        new = self.cl.add_host(progress=lambda s: say(f"  [cluster] {s}"))
        self.cl.wait_for_executors(self.spark, timeout=120)
        warmed = warm_executor(self.spark, new.ip, say)
        host_join_s = time.time() - t_h
        after = self.cl.executor_hosts(self.spark)
        self._collect()
        old = [r for r in self.rows if r.get("events")]
        last_old = old[-1] if old else {}
        caught_up = (last_old.get("end_offset") or 0) >= (self.o_end or 0)
        say(f"{self.system}: host {new.n} ({new.ip}) joined in {host_join_s:.1f} s; executors "
            f"{sum(before.values())} -> {sum(after.values())}; stopping the query"
            + ("" if caught_up else " (it is still behind: the batch in flight is interrupted)"))
        t_stop = time.time()
        self.sq.stop()
        t_stopped = time.time()
        self._collect()
        # From the stop request on, events arrive at the peak rate: the restarted query's first
        # batch holds the outage's. (The stopped query's source saw no event after t_stop.)
        self.schedule["segments"].append([t_stop, peak * self.shared["base_events"] / self.S])
        self._write()
        self._emit_schedule()
        self.phase_override, self.rate_override = "restart", peak
        t_start = time.time()
        self.sq = self._start_query()
        say(f"{self.system}: stopped in {t_stopped - t_stop:.1f} s; restarted from the checkpoint, events arriving "
            f"at {peak:g}x since the stop")

        def restarted() -> list[dict]:
            return [r for r in self.rows if r.get("phase") == "restart" and r.get("events")]

        self._drive(lambda: len(restarted()) >= a.restart_batches, "Spark's restart")
        rr = restarted()
        first = rr[0]
        first_end = first["t_unix"] + first["latency_s"]
        lat = [r["latency_s"] for r in rr]
        rec = {"record": "restart", "system": self.system, "rate_x": peak, "trigger_interval_s": self.S,
               "host_join_s": host_join_s, "executor_warmed": warmed,
               "executors_before": sum(before.values()), "executors_after": sum(after.values()),
               "state_partitions_before": last_old.get("parallelism"),
               "state_partitions_after": first.get("parallelism"),
               "state_bytes_at_stop": last_old.get("state_bytes"), "last_batch_before": last_old.get("batch"),
               "caught_up_at_stop": caught_up,
               "stop_s": t_stopped - t_stop, "restart_s": first_end - t_start, "remedy_s": first_end - t_stop,
               "first_batch": first["batch"], "first_batch_s": first["latency_s"],
               "first_batch_events": first.get("events"), "state_load_s": first.get("state_load_s"),
               "stores_loaded_from_dfs": first.get("stores_loaded_from_dfs"),
               "batches_after": len(rr) - 1, "latencies_after_s": lat[1:],
               "latency_after_median_s": median(lat[1:]),
               "kept_up_after": bool(lat[1:]) and all(x < self.S for x in lat[1:]),
               "stop_t": t_stop - self.origin, "first_end_t": first_end - self.origin}
        self.em.emit(round_floats(rec))
        say(f"{self.system}: remedy: {rec['remedy_s']:.1f} s from the stop request to the end of the first batch "
            f"after the restart (stop {rec['stop_s']:.1f} s, restart {rec['restart_s']:.1f} s, that batch "
            f"{first['latency_s']:.1f} s); the batches at {peak:g}x took " + ", ".join(f"{x:.1f}" for x in lat) + " s")

    # ---- the end
    def stop(self) -> None:
        if self.sq is not None:
            try:
                if self.sq.isActive:
                    self.sq.stop()
            except Exception:  # noqa: BLE001 - on the way out
                pass

    def reconfigurations(self) -> list[dict]:
        """Rhino: the autoscaler's decisions and their plans' steps, from the coordinator's log."""
        if self.system != "rhino":
            return []
        events = self.cl.coordinator_events()
        reps = sorted({r.batch: r for r in (self.op.reports if self.op else [])}.values(), key=lambda r: r.batch)
        starts = {r["batch"]: r["t_unix"] for r in self.rows}

        def batch_at(t: float) -> Optional[int]:
            for r in reps:
                if r.started <= t <= r.ended:
                    return r.batch
            nxt = [r for r in reps if r.started >= t]
            return nxt[0].batch if nxt else None

        scheduled = {e.get("plan"): e for e in events if e.get("kind") == "plan_scheduled"}
        steps: dict[Any, list[dict]] = {}
        for e in events:
            if e.get("kind") == "handover_step":
                steps.setdefault(e.get("plan"), []).append(e)
        ends = {e.get("plan"): e.get("kind") for e in events if e.get("kind") in ("handover_aborted", "plan_cancelled")}
        out = []
        for e in events:
            if e.get("kind") != "autoscale_decision" or e.get("operator") != self.op_id:
                continue
            plan = e.get("plan")
            ps = sorted(steps.get(plan, []), key=lambda s: s.get("step") or 0) if plan is not None else []
            sb = [batch_at(s["at"]) for s in ps]
            n_steps = (scheduled.get(plan) or {}).get("steps")
            done = sb[-1] if ps and n_steps is not None and len(ps) >= n_steps else None
            decided_at = e.get("at")
            d = e.get("batch")
            out.append(round_floats({
                "record": "reconfiguration", "system": self.system, "plan": plan, "action": e.get("action"),
                "from": e.get("from"), "to": e.get("to"), "decided_batch": d,
                "decided_t": (decided_at - self.origin) if decided_at else None,
                "decided_batch_t": (starts[d] - self.origin) if d in starts else None,
                "strategy": (scheduled.get(plan) or {}).get("strategy"), "moves": (scheduled.get(plan) or {}).get("moves"),
                "steps": n_steps, "step_batches": sb, "step_t": [s["at"] - self.origin for s in ps],
                "step_seconds": [s.get("seconds") for s in ps], "bytes_copied": sum(int(s.get("bytes_copied") or 0)
                                                                                  for s in ps),
                "done_batch": done, "ended": ends.get(plan), "reason": e.get("reason"), "error": e.get("error"),
                "numbers": e.get("numbers")}))
        return out


def run_system(system: str, args: argparse.Namespace, em: Emitter, base: Path, spark_conf: dict,
               shared: dict) -> None:
    from rhino_testing.harness.spark_cluster import LocalCluster

    work = base / system
    if work.exists():  # a --dir used before: its cluster down, its checkpoints gone (a query would resume them)
        if (work / "cluster" / "cluster.json").exists():
            with contextlib.suppress(Exception):
                LocalCluster.attach(work / "cluster").down()
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    say(f"{system}: starting a {HOSTS}-host cluster at 127.0.0.{args.first_host}")
    with LocalCluster.up(work / "cluster", hosts=HOSTS, first_host=args.first_host, heartbeat_timeout=2.0,
                         progress=lambda s: say(f"  [cluster] {s}")) as cl:
        # room for one more executor: the spare host
        spark = cl.spark_session(f"rhino-bench-elastic-{system}", spare_hosts=1, **spark_conf)
        run = None
        try:
            spark.sparkContext.setLogLevel("ERROR")
            info: dict[str, Any] = {"record": "run", "system": system}
            if system == "rhino":
                t_h = time.time()
                new = cl.add_host(progress=lambda s: say(f"  [cluster] {s}"))
                cl.wait_for_executors(spark, timeout=120)
                info.update(spare_host=new.ip, spare_worker=new.rhino_worker.id, executor_warmed=warm_executor(
                    spark, new.ip, say), host_join_s=round(time.time() - t_h, 2))
                say(f"{system}: the spare host {new.ip} joined in {info['host_join_s']:.1f} s, before the query")
            info["executors"] = sum(cl.executor_hosts(spark).values())
            run = SystemRun(system, args, em, cl, spark, work, shared)
            try:
                run.run()
            except _QueryFailed as e:
                say(f"{system}: the query failed: {e}")
            finally:
                run.stop()
                try:
                    for c in run.reconfigurations():
                        em.emit(c)
                except Exception as e:  # noqa: BLE001 - the batches are out already
                    say(f"{system}: reading the coordinator's reconfigurations failed: {type(e).__name__}: {e}")
                if run.op is not None:
                    with contextlib.suppress(Exception):
                        run.op.close()
                if run.cc is not None:
                    with contextlib.suppress(Exception):
                        run.cc.close()
            info["wall_s"] = round(time.time() - t0, 1)
            em.emit(info)
        finally:
            with contextlib.suppress(Exception):
                spark.stop()
