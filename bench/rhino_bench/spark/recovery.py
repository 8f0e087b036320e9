"""``rhino-bench spark recovery``: recovery of NEXMark Q8 after a host is SIGKILLed
mid-batch, Rhino against Spark's own ``transformWithStateInPandas`` with the RocksDB
state store provider, per state size (the Rhino paper's Table 1, on Spark).

    rhino-bench spark recovery --sizes 1G,2G,4G --json --out bench/results/spark_recovery.jsonl \\
        --plot bench/results/spark_recovery.png --report bench/results/spark_recovery.md

Per (size, system), on a fresh 3-host :class:`~rhino_testing.harness.spark_cluster.LocalCluster`
(127.0.0.N.., one core per host, heartbeat timeout ``--heartbeat-timeout``):

1. Q8 runs with a huge window (``window_ms`` 10^12: no window closes, nothing is
   cleared, the state only grows) over ``--events-per-batch`` events per micro-batch,
   Person and Auction payloads of ``--payload-bytes`` (bids, 46 of 50 events, are
   filtered out by Q8's ``prepare``; the generator has no option to leave them out,
   and they are small: no payload).
2. After each batch the operator's state size is read: Rhino, the sum of the
   instances' ``checkpoint_bytes`` (each instance's live checkpoint, on its primary);
   Spark, ``stateOperators[0].customMetrics.rocksdbSstFileSize`` of the last progress
   report (the live RocksDB SST bytes over its partitions). Once it reaches the size,
   host ``--kill-host`` is SIGKILLed (its Spark worker, executor, Python workers and
   Rhino worker) ``--kill-at`` x the median batch duration after the batch ends, i.e.
   inside the next batch.
3. The query runs on until ``--after-batches`` batches completed after the kill, then
   stops; the cluster is taken down.

Fields (seconds; t=0 is the kill's first SIGKILL, after the harness listed the host's
processes: ``kill_listing_s`` says how long that listing took):

* ``recovery_s``: to the end of the first batch that completed after the kill (its
  ``foreachBatch`` sink returned).
* ``detection_s``: to the failure being declared. Rhino: the coordinator marks the
  worker dead (``dead_since``: heartbeat timeout, or at once when a task reports it
  unreachable and it does not answer the coordinator either). Spark: the driver removes
  the lost executor (``removeTime`` of the REST API's ``allexecutors``).
* ``replay_s``: re-running the lost batch's upstream work before the stateful task:
  Rhino, from the start of the batch attempt that succeeded to the start of the lost
  instance's task in it (source, ``prepare``, routing shuffle); Spark, the resubmitted
  upstream (shuffle map) stages after the kill.
* ``scheduling_s``: the rest between detection and the rerun stateful task's start
  (``rerun_task_start_s - detection_s - replay_s``): Spark's task rescheduling (locality
  wait, stage resubmission), Rhino's failed attempt, ``commit_batch`` refusal, and
  ``begin_batch`` of the next attempt.
* ``rerun_task_start_s``: Spark's launch of the stateful task that ran the lost
  partition again (its ``launchTime`` in Spark's REST API), for both systems. Rhino's
  ``rerun_python_start_s`` is when that task's Python code began: after the executor got
  a Python worker for it, which after a cancelled attempt is a new one, whose imports
  (pandas, pyarrow, the processor) take 0.5-1.5 s here; Spark's own operator's rerun
  task pays the same start inside its task. (Records before 2026-11-26 19:30 UTC gave
  Rhino's Python-side start as ``rerun_task_start_s``.)
* ``state_restore_s``: from the rerun stateful task's start until its state is ready.
  Spark: the RocksDB provider's load of the lost partition's store from the checkpoint
  location (``rocksdbLoadLatencyMs`` of the batch: copy the snapshot's files from the
  "DFS", open RocksDB; only that partition loads from DFS, ``rocksdbNumLoadedFromDfs``).
  Rhino: the takeover's restore on the new primary (``restore_s``: hard links from its
  own replica store, then open; done by the coordinator right at detection) plus the
  rerun task's session open (``open_s``; a rollback to b-1 by hard links if needed). Both
  are counted, though the takeover runs before the task starts.
* ``coordinator_failover_s`` (Rhino): the coordinator's whole failover of the lost worker
  (``failover_done``: the takeover, the other instances re-opened at the new epoch, chain
  repair, its metadata); the next attempt begins after it. ``coordinator_fence_s``: of that,
  the takeovers and re-opens. The takeover's ``restore`` also has its open's own CPU time
  and run-queue wait (``open_cpu_s``, ``open_wait_s``); ``reopens``, per surviving instance,
  its re-open at the new epoch (``request_s``; the worker's ``fence_s``, ``lock_wait_s``
  for the instance, ``save_s`` of its placement; ``deferred``: the instance was busy, with
  the cancelled attempt's commit, and the placement applies when that commit lets go).
  ``sink_unwind_waits``: how long the rerun waited, with its output already materialized,
  for the cancelled attempt's sink call to return before calling the sink again
  (driver/sink.py). ``coordinator_failover_phases``:
  the whole failover in parts: the worker marked dead (``dead_tx_s``, a metadata commit),
  then this operator's decision (``decide_s``: the chain members asked which checkpoints
  they hold), its plan made durable (``plan_tx_s``), the fence (``fence_s``), chain-repair
  copies (``copy_s``) and the commit of the new epoch (``commit_tx_s``).
* ``watch`` (Rhino): the driver's batch watch of each attempt the loss touched:
  ``cancelled_at`` (it cancelled the attempt's job), its report of the lost worker to the
  coordinator (``at``, and ``answered``: the coordinator's failover was done), ``exited_at``
  (the attempt's Spark job returned, failed) and ``failed_at`` (the attempt was given up).
  ``job_attempt_start_s``: the successful attempt began (after ``begin_batch``);
  ``rerun_job_setup_s``: from there to its Spark action (the driver's own planning).
* ``rerun_batch_s``: the recovered batch's own duration; ``steady_batch_s``: the median
  batch before the kill.
* ``locality``: the share of Rhino tasks that ran on their primary's host in the steady
  batches before the kill (Spark: null).

The baseline's "DFS" (Spark's checkpoint location) is a directory on the same local
disk here: its "fetch" is a local file copy, which favours the baseline.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, spark_flags
from .common import fraction, median, positive_float, positive_int, say, spark_rest, spark_time

__all__ = ["main", "run_one", "SPEEDUP_TARGET", "FLAT_TARGET", "LOCALITY_TARGET"]

SPEEDUP_TARGET = 10.0   # Rhino's state restore vs the baseline's, at the largest size
FLAT_TARGET = 2.0       # Rhino's state restore at the largest size vs the smallest
LOCALITY_TARGET = 0.95
RERUN_START_TARGET_S = 1.0  # median rerun_task_start_s, Rhino, every size (issue 29)
RESTORE_TARGET_S = 0.100    # median state_restore_s, Rhino, every size (issue 29)
HUGE_WINDOW_MS = 10 ** 12
SYSTEMS = {"rhino": "rhino", "spark": "spark-rocksdb", "spark-rocksdb": "spark-rocksdb",
           "spark-changelog": "spark-rocksdb-changelog", "spark-rocksdb-changelog": "spark-rocksdb-changelog"}
# Spark's baselines: its RocksDB state store with Spark's default (a snapshot uploaded at every commit)
# and with changelog checkpointing, its recommended production setting (a change log per batch, a
# snapshot every few batches; a restore loads the snapshot and replays the log). Each ratio in the
# summary is against the less favourable of those that ran.
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
SPARK_BASELINES = {"spark-rocksdb": "false", "spark-rocksdb-changelog": "true"}


def _sizes(text: str) -> list[int]:
    from rhino._sizes import parse_sizes

    try:
        sizes = parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if any(s < (1 << 20) for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be at least 1M")
    return sizes


def _systems(text: str) -> list[str]:
    out = []
    for s in (x.strip() for x in text.split(",") if x.strip()):
        if s not in SYSTEMS:
            raise argparse.ArgumentTypeError(f"unknown system {s!r}: choose from rhino, spark-rocksdb, "
                                             "spark-rocksdb-changelog")
        if SYSTEMS[s] not in out:
            out.append(SYSTEMS[s])
    if not out:
        raise argparse.ArgumentTypeError("no system given")
    return out


class Recovery(Scenario):
    name = "spark recovery"
    description = ("Recovery of NEXMark Q8 after a host is SIGKILLed mid-batch: Rhino vs Spark's "
                   "transformWithStateInPandas with the RocksDB state store.")
    workdir_prefix = "rhino-spark-recovery-"
    spark = False  # each run's cluster has a session of its own
    summary_on_failure = False
    summary_extras = False

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--sizes", type=_sizes, default=_sizes("1G,2G,4G"),
                        help="state sizes at which a host is killed (default 1G,2G,4G)")
        ap.add_argument("--systems", type=_systems, default=["rhino", "spark-rocksdb", "spark-rocksdb-changelog"],
                        help="comma-separated, from rhino, spark-rocksdb (Spark's default: a snapshot per commit), "
                             "spark-rocksdb-changelog (changelog checkpointing on) (default all three)")
        ap.add_argument("--keep", action="store_true", help="keep each run's directory (state, logs)")
        ap.add_argument("--events-per-batch", type=positive_int, default=100_000)
        ap.add_argument("--payload-bytes", type=positive_int, default=8192,
                        help="Person and Auction payload bytes (default 8192)")
        ap.add_argument("--parallelism", type=positive_int, default=3, help="Rhino instances (default 3)")
        ap.add_argument("--replicas", type=positive_int, default=2, help="Rhino's r (default 2)")
        ap.add_argument("--input-copies", type=positive_int, default=2, choices=(1, 2, 3),
                        help="Rhino's input_copies: each batch's routed input cached on this many executors, so "
                             "a lost host's map output is rebuilt from a copy, not the source (default 2; 1 = off)")
        ap.add_argument("--heartbeat-timeout", type=positive_float, default=2.0,
                        help="Rhino coordinator's heartbeat timeout, s (default 2.0)")
        spark_flags(ap, first_host=60, master=None,
                    conf_help="extra Spark conf for both systems' sessions (repeatable); default: Spark's defaults")
        ap.add_argument("--kill-host", type=positive_int, default=2, help="host number (1..3) to kill (default 2)")
        ap.add_argument("--kill-at", type=fraction, default=0.5,
                        help="the kill lands this fraction of the way through the killed host's stateful task (by "
                             "its duration in the last batch) (default 0.5)")
        ap.add_argument("--after-batches", type=positive_int, default=2,
                        help="batches to complete after the kill before stopping (default 2)")
        ap.add_argument("--trials", type=positive_int, default=1,
                        help="runs per size and system, interleaved; the summary compares medians (default 1)")
        ap.add_argument("--timeout", type=positive_float, default=3600.0, help="per run, s (default 3600)")

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if CHANGELOG_CONF in args.spark_conf_dict:
            ap.error(f"--spark-conf {CHANGELOG_CONF}: each Spark system sets it (spark-rocksdb: false, "
                     "spark-rocksdb-changelog: true); choose them with --systems")
        if not 1 <= args.kill_host <= 3:
            ap.error(f"--kill-host {args.kill_host}: the cluster has hosts 1..3")
        if args.first_host + 2 > 254:
            ap.error("--first-host: the cluster's 3 hosts must fit 127.0.0.2..254")
        if args.replicas > 2:
            ap.error(f"--replicas {args.replicas}: at most 2 on 3 hosts")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {"sizes": args.sizes, "systems": args.systems, "events_per_batch": args.events_per_batch,
                "payload_bytes": args.payload_bytes, "window_ms": HUGE_WINDOW_MS, "parallelism": args.parallelism,
                "replicas": args.replicas, "input_copies": args.input_copies,
                "heartbeat_timeout": args.heartbeat_timeout, "kill_host": args.kill_host, "kill_at": args.kill_at,
                "after_batches": args.after_batches, "trials": args.trials, "hosts": 3,
                "first_host": args.first_host}

    def run(self, br: BenchRun) -> int:
        args = br.args
        failed = 0
        for size, trial, system in [(size, trial, system) for size in args.sizes for trial in range(args.trials)
                                    for system in args.systems]:
            d = br.base / (f"{system}-{size}" + (f"-t{trial}" if args.trials > 1 else ""))
            t0 = time.time()
            try:
                rec = run_one(system=system, size=size, workdir=d, args=args, spark_conf=br.spark_conf)
                rec["wall_s"] = round(time.time() - t0, 1)
                rec["trial"] = trial
                br.emit(rec)
                say(f"{system} {size / 2**30:g} GiB: recovery {rec['recovery_s']:.2f} s, state restore "
                    f"{rec.get('state_restore_s')} s, detection {rec.get('detection_s')} s")
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:
                failed += 1
                say(f"{system} {size} failed: {type(e).__name__}: {e}")
                br.emit({"record": "error", "system": system, "size_bytes": size,
                         "error": f"{type(e).__name__}: {e}"[:2000]})
            finally:
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
        return 1 if failed else 0

    def replay_records(self, records: list[dict], args: argparse.Namespace) -> list[dict]:
        """All the file's runs, combined (the medians over their trials); one setup record whose
        command names them all."""
        setups = [r for r in records if r.get("record") == "setup"]
        setup = dict(setups[-1]) if setups else {}
        if len(setups) > 1:
            setup["command"] = " ; ".join(s.get("command", "") for s in setups)
        return [setup] + [r for r in records if r.get("record") in ("recovery", "error")] if setups else []





# --------------------------------------------------------------------------- one run


def _rhino_size(run: Any) -> int:
    reps = run.operator.reports if run.operator is not None else []
    return sum(int(t.get("checkpoint_bytes") or 0) for t in reps[-1].tasks) if reps else 0


def _spark_state(p: Optional[dict]) -> dict:
    if not p:
        return {}
    ops = p.get("stateOperators") or []
    return ops[0] if ops else {}


def _spark_size(run: Any) -> int:
    sq = run.query
    try:
        p = sq.lastProgress if sq is not None else None
    except Exception:
        p = None
    so = _spark_state(p)
    cm = so.get("customMetrics") or {}
    # With changelog checkpointing a commit flushes nothing: between snapshots the new state is in the
    # memtables, which memoryUsedBytes counts, and not in the SST files.
    return max(int(cm.get("rocksdbSstFileSize") or 0), int(so.get("memoryUsedBytes") or 0))


def run_one(*, system: str, size: int, workdir: Path, args: argparse.Namespace, spark_conf: dict) -> dict:
    """One (size, system): a fresh cluster, grow, kill, measure. Returns the record."""
    from rhino_testing.harness.spark_cluster import LocalCluster
    from rhino_testing.nexmark.pipeline import run_pipeline

    workdir.mkdir(parents=True, exist_ok=True)
    sysname = "rhino" if system == "rhino" else "spark"
    bytes_per_event = 0.08 * (args.payload_bytes + 250)
    # enough events to reach the size twice over, then stop_when ends the run
    max_events = int(size / bytes_per_event * 2.5) + (args.after_batches + 8) * args.events_per_batch
    say(f"{system} {size / 2**30:.2f} GiB: starting a 3-host cluster at 127.0.0.{args.first_host}")
    with LocalCluster.up(workdir / "cluster", hosts=3, first_host=args.first_host,
                         heartbeat_timeout=args.heartbeat_timeout) as cl:
        conf = dict(spark_conf, **({CHANGELOG_CONF: SPARK_BASELINES[system]} if system in SPARK_BASELINES else {}))
        spark = cl.spark_session(f"rhino-bench-recovery-{system}", **conf)
        try:
            ui = spark.sparkContext.uiWebUrl
            app_id = spark.sparkContext.applicationId
            victim = cl.host(args.kill_host)
            st: dict[str, Any] = {"kill_t": None, "scheduled": False, "size_at_kill": None, "kill_batch": None}
            ends: list[float] = []
            last_log = [0.0]

            def on_batch(b: int, run: Any) -> None:
                now = time.time()
                ends.append(now)
                size_now = _rhino_size(run) if sysname == "rhino" else _spark_size(run)
                if now - last_log[0] > 15 and not st["scheduled"]:
                    last_log[0] = now
                    say(f"  {system}: batch {b}, state {size_now / 2**20:.0f} MiB of {size / 2**20:.0f} MiB")
                if st["scheduled"] or size_now < size or len(ends) < 4:
                    return
                st["scheduled"] = True
                st["size_at_kill"] = size_now
                st["kill_batch"] = b + 1
                gaps = [y - x for x, y in zip(ends[1:-1], ends[2:])] or [1.0]
                st["steady_batch_s"] = median(gaps)

                def kill() -> None:
                    # Mid-batch means while the victim host's stateful task (its instance / its
                    # shuffle partition's state store) runs: wait for it to run, then kill --kill-at
                    # of the way through it (by its duration in the last completed batch); a task
                    # that ended before that is missed, and the next batch's is tried.
                    running = False
                    for _ in range(20):
                        dur = _victim_task_seconds(ui, app_id, args.parallelism, victim.ip) or 1.0
                        # a short task can run between two polls of Spark's UI: after a few
                        # batches' time without seeing one, kill anyway (recorded below as
                        # victim_task_running False) rather than let the run end unkilled
                        launched = _wait_victim_task(ui, app_id, args.parallelism, victim.ip,
                                                     timeout=max(15.0, 5 * st["steady_batch_s"]))
                        if launched is None:
                            break
                        time.sleep(max(0.0, launched + args.kill_at * dur - time.time()))
                        if _victim_task_running(ui, app_id, args.parallelism, victim.ip):
                            running = True
                            break
                        st["missed"] = st.get("missed", 0) + 1
                    # as seen just before the kill: the task may still end in between
                    st["victim_task_running"] = running
                    t = time.time()
                    st["pids"] = cl.kill_host(args.kill_host)
                    # the loss is the first signal, after kill_host's process listing
                    st["kill_t"] = cl.killed_at(args.kill_host) or t
                    st["kill_listing_s"] = st["kill_t"] - t
                    st["stateful_stage_s"] = dur
                    st["kill_into_stage_s"] = (st["kill_t"] - launched) if launched else None
                    say(f"  {system}: SIGKILLed host {args.kill_host} ({victim.ip}) "
                        f"{st['kill_into_stage_s'] or 0:.2f} s into its stateful task (last one took {dur:.2f} s), "
                        f"state {size_now / 2**20:.0f} MiB")

                threading.Thread(target=kill, daemon=True, name="bench-kill").start()

            def stop_when(run: Any) -> bool:
                k = st["kill_t"]
                return k is not None and sum(1 for x in run.batches if x["sink_end"] > k) >= args.after_batches

            run = run_pipeline(spark, system=sysname, query="q8", checkpoint_dir=workdir / "ck",
                               events_per_batch=args.events_per_batch, max_events=max_events,
                               source_options={"payloadBytes": args.payload_bytes},
                               params={"window_ms": HUGE_WINDOW_MS}, operator_id=f"q8-recovery-{size}",
                               coordinator=cl.coordinator, secret_file=str(cl.secret_file),
                               parallelism=args.parallelism, replicas=args.replicas, on_batch=on_batch,
                               stop_when=stop_when, timeout_s=args.timeout,
                               operator_options={"input_copies": args.input_copies} if sysname == "rhino" else None)
            if st["kill_t"] is None:
                raise RuntimeError(f"{system}: the state never reached {size} bytes "
                                   f"(last {_rhino_size(run) if sysname == 'rhino' else _spark_size(run)})")
            rec = _common_fields(system, size, run, st, args)
            if sysname == "rhino":
                rec.update(_rhino_breakdown(run, st, cl, victim, ui, app_id))
            else:
                rec.update(_spark_breakdown(run, st, ui, app_id, victim.ip))
            _finish(rec)
            return rec
        finally:
            try:
                spark.stop()
            except Exception:
                pass


def _victim_tasks(ui: str, app_id: str, nparts: int, ip: str, status: str) -> list[tuple[dict, dict]]:
    out = []
    for s in spark_rest(ui, f"applications/{app_id}/stages?status={status}"):
        if s.get("numTasks") == nparts and not (s.get("name") or "").startswith("run at"):
            tl = spark_rest(ui, f"applications/{app_id}/stages/{s['stageId']}/{s['attemptId']}/taskList?length=100")
            out += [(s, t) for t in tl if t.get("host") == ip]
    return out


def _victim_task_seconds(ui: str, app_id: str, nparts: int, ip: str) -> Optional[float]:
    """The duration of the victim host's task in the last completed stateful stage."""
    try:
        done = [(s, t) for s, t in _victim_tasks(ui, app_id, nparts, ip, "complete") if t.get("status") == "SUCCESS"]
    except Exception:
        return None
    if not done:
        return None
    s, t = max(done, key=lambda x: x[0]["stageId"])
    return (t.get("duration") or 0) / 1000.0


def _victim_task_running(ui: str, app_id: str, nparts: int, ip: str) -> Optional[float]:
    """The launch time of the victim host's running stateful task, if there is one."""
    try:
        run = [t for _, t in _victim_tasks(ui, app_id, nparts, ip, "active") if t.get("status") == "RUNNING"]
    except Exception:
        return None
    return spark_time(run[0]["launchTime"]) if run else None


def _wait_victim_task(ui: str, app_id: str, nparts: int, ip: str, *, timeout: float) -> Optional[float]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = _victim_task_running(ui, app_id, nparts, ip)
        if t is not None:
            return t
        time.sleep(0.05)
    return None


def _common_fields(system: str, size: int, run: Any, st: dict, args: argparse.Namespace) -> dict:
    k = st["kill_t"]
    after = sorted((b for b in run.batches if b["sink_end"] > k), key=lambda b: b["sink_end"])
    first = after[0]
    before = [b for b in run.batches if b["sink_end"] <= k]
    return {
        "record": "recovery", "system": system, "size_bytes": size, "state_bytes_at_kill": st["size_at_kill"],
        "recovered_batch": first["batch"],
        "recovery_s": first["sink_end"] - k, "steady_batch_s": st.get("steady_batch_s"),
        "batches_before_kill": len(before), "events_per_batch": args.events_per_batch,
        "victim_task_s": st.get("stateful_stage_s"), "kill_into_victim_task_s": st.get("kill_into_stage_s"),
        "kill_missed": st.get("missed", 0), "victim_task_running_at_kill": st.get("victim_task_running"),
        "payload_bytes": args.payload_bytes, "kill_unix": k, "killed_pids": len(st.get("pids") or []),
        "kill_listing_s": st.get("kill_listing_s"),
    }


def _rhino_breakdown(run: Any, st: dict, cl: Any, victim: Any, ui: str, app_id: str) -> dict:
    k = st["kill_t"]
    reps = run.operator.reports
    steady = [r for r in reps if r.ended <= k and r.batch > 0]
    tasks = [t for r in steady for t in r.tasks]
    locality = (sum(1 for t in tasks if t.get("host") == t.get("primary_host")) / len(tasks)) if tasks else None
    lost = sorted({t["instance"] for t in (steady[-1].tasks if steady else []) if t.get("primary_host") == victim.ip})
    rep = next(r for r in reps if r.ended > k)
    job_start = rep.ended - rep.commit_s - rep.job_s
    # the lost instance's task in the successful attempt (else the latest task of the batch)
    cand = [t for t in rep.tasks if t["instance"] in lost] or list(rep.tasks)
    task = max(cand, key=lambda t: t["start"])
    status = cl.coordinator_status()
    wid = victim.rhino_worker.id
    dead_since = next((w.get("dead_since") for w in status["workers"] if w["id"] == wid), None)
    takeovers, reopens = {}, {}
    fence = None
    for ev in status.get("events", []):
        if ev.get("kind") == "reconfigured" and ev.get("at", 0) >= k - 1 and ev.get("takeover_figures"):
            takeovers.update(ev["takeover_figures"])
            reopens.update(ev.get("reopen_figures") or {})
            fence = ev.get("fence_s", fence)
    # the coordinator's whole failover of the lost worker (declare_dead: takeovers, re-opens at
    # the new epoch, chain repair, its metadata); the next attempt begins after it (host_loss.py)
    done = next((ev for ev in status.get("events", [])
                 if ev.get("kind") == "failover_done" and ev.get("worker") == wid), {})
    failover = done.get("recovery_s")
    # its phases: the worker marked dead, then this operator's decision, durable plan, fence,
    # copies and commit (coordinator.py's _FAILOVER_PHASES)
    failover_phases = dict((done.get("phases") or {}).get(run.operator.operator_id) or {},
                           dead_tx_s=done.get("dead_tx_s"))
    figs = [takeovers[str(i)] for i in lost if str(i) in takeovers] or list(takeovers.values())
    takeover_restore = max((f.get("restore_s") or 0.0) for f in figs) if figs else None
    detection = (dead_since - k) if dead_since else None
    # who found the loss: the driver's batch watch / a task ("reported unreachable") or the heartbeat
    detected_by = next((ev.get("reason") for ev in status.get("events", [])
                        if ev.get("kind") == "worker_dead" and ev.get("worker") == wid), None)
    cancels = [w["cancelled_at"] for w in getattr(run.operator, "watch_log", [])
               if w.get("cancelled_at") and w["cancelled_at"] >= k]
    # the task of the lost instance that succeeded: it may have started before the detection
    # (a Spark task retry that found the primary dead, reported it and waited for the takeover).
    # Its start is Spark's launch of it, as for the baseline (derive_stages); the Python
    # side's start (after the executor got a Python worker for it) is rerun_python_start_s.
    python_start = task["start"] - k
    rerun_start = python_start
    rest = _spark_stages(ui, app_id, k, dead_since or k)
    part = sorted(t["instance"] for t in rep.tasks).index(task["instance"])
    launched = _launch_of(rest.get("stages_after_kill") or [], part, python_start)
    if launched is not None:
        rerun_start = launched
    if rest.get("stages_after_kill") is not None:
        rest.update(derive_stages(rest["stages_after_kill"], (dead_since or k) - k, rerun_start))
    replay = rest.get("replay_s") or 0.0
    open_s = float(task.get("open_s") or 0.0)
    restore = (takeover_restore or 0.0) + open_s
    inside = sum(float(task.get(f) or 0.0) for f in ("read_s", "open_s", "group_s", "timers_s", "fetch_s",
                                                       "process_s", "write_s", "commit_s"))
    return {
        "detection_s": detection, "detected_by": detected_by,
        "attempt_cancelled_s": (min(cancels) - k) if cancels else None,
        "watch": [dict(w, **{x: round(w[x] - k, 4) for x in ("cancelled_at", "exited_at", "failed_at") if w.get(x)},
                       reported=[dict(r, **{x: round(r[x] - k, 4) for x in ("at", "answered") if r.get(x)})
                                 for r in w.get("reported", [])])
                  for w in getattr(run.operator, "watch_log", []) if (w.get("cancelled_at") or 0) >= k - 1
                  or any(r["at"] >= k - 1 for r in w.get("reported", []))],
        "replay_s": replay,
        "scheduling_s": max(0.0, rerun_start - (detection or 0.0) - replay),
        "rerun_task_start_s": rerun_start, "rerun_python_start_s": python_start, "state_restore_s": restore,
        "rerun_task_failover_wait_s": max(0.0, (task["end"] - task["start"]) - inside),
        "job_attempt_start_s": job_start - k, "rerun_job_setup_s": rep.job_setup_s, "failed_tasks_after_kill": rest.get("failed_tasks_after_kill"),
        "spark_executor_removed_s": _executor_removed(ui, app_id, victim.ip, k),
        "stages_after_kill": rest.get("stages_after_kill"),
        "takeover_restore_s": takeover_restore, "session_open_s": open_s,
        "coordinator_failover_s": failover, "coordinator_fence_s": fence,
        "coordinator_failover_phases": failover_phases, "reopens": reopens,
        "sink_unwind_waits": [w for w in getattr(run.operator, "sink_unwind_waits", []) if w["batch"] == rep.batch],
        "rerun_fetch_s": task.get("fetch_s"), "rerun_task_s": task["end"] - task["start"],
        "rerun_batch_s": rep.ended - rep.started, "attempts": rep.attempts, "epoch_after": rep.epoch,
        "batch_errors": rep.errors[:4], "lost_instances": lost, "rerun_host": task.get("host"),
        "rerun_local": task.get("host") == task.get("primary_host"),
        "locality": locality, "steady_tasks": len(tasks),
        "steady_task_breakdown_s": _task_means(tasks),
        "takeover": {str(i): takeovers.get(str(i)) for i in lost},
    }


def _launch_of(rows: list[dict], part: int, python_start: float) -> Optional[float]:
    """Spark's launch of partition ``part``'s task that ran the rerun: the latest successful
    launch of that partition, in a stage of the Spark REST rows, at or before the Python
    side's start of it (None if the REST rows do not have it)."""
    cands = [r["launch_s"][str(part)] for r in rows if str(part) in (r.get("launch_s") or {})
             and r["launch_s"][str(part)] <= python_start + 0.001]
    return max(cands) if cands else None


def _task_means(tasks: list[dict]) -> dict:
    out = {}
    for f in ("read_s", "open_s", "group_s", "timers_s", "fetch_s", "process_s", "write_s", "commit_s",
              "replicate_s"):
        xs = [float(t.get(f) or 0.0) for t in tasks]
        out[f] = round(sum(xs) / len(xs), 4) if xs else None
    return out


def _spark_stages(ui: str, app_id: str, k: float, detected: float) -> dict:
    """From Spark's REST API: every stage attempt running at the kill or after it (with the
    launch time of its last successful task), then :func:`derive_stages`."""
    out: dict[str, Any] = {}
    try:
        stages = spark_rest(ui, f"applications/{app_id}/stages")
        recent = [s for s in stages if s.get("status") != "SKIPPED"
                  and (spark_time(s.get("completionTime")) or 1e18) >= k]
        rows = []
        for s in sorted(recent, key=lambda s: spark_time(s.get("submissionTime")) or 0):
            tl = spark_rest(ui, f"applications/{app_id}/stages/{s['stageId']}/{s['attemptId']}/taskList?length=500")
            ok = [spark_time(t["launchTime"]) for t in tl if t.get("status") == "SUCCESS"]
            rows.append({"stage": f"{s['stageId']}.{s['attemptId']}", "tasks": s.get("numTasks"),
                         "status": s.get("status"),
                         "submitted_s": round((spark_time(s.get("submissionTime")) or k) - k, 3),
                         "completed_s": round(spark_time(s["completionTime"]) - k, 3) if s.get("completionTime")
                         else None,
                         "last_success_launch_s": round(max(ok) - k, 3) if ok else None,
                         "failed_tasks": sum(1 for t in tl if t.get("status") == "FAILED"),
                         "name": (s.get("name") or "")[:40],
                         # each successful task's launch, by its partition index (JSON keys: str)
                         "launch_s": {str(t["index"]): round(spark_time(t["launchTime"]) - k, 3)
                                      for t in tl if t.get("status") == "SUCCESS" and "index" in t}})
        out["stages_after_kill"] = rows
        out.update(derive_stages(rows, detected - k))
    except Exception as e:  # the REST API is best effort
        out["rest_error"] = f"{type(e).__name__}: {e}"
    return out


def derive_stages(rows: list[dict], detection_s: float, rerun_start_s: Optional[float] = None) -> dict:
    """The stateful stage is the one with a task per shuffle partition (its retries keep its
    stage id, with fewer tasks). The rerun stateful task: in the first retry attempt of a
    stateful stage submitted after the detection, if there is one (the stage failed, e.g. a
    FetchFailed for map output on the lost host), else the last-launched successful task of
    the first stateful stage (a task-level retry). The replay: the other stages submitted
    after the detection and before that (the re-run of the lost map output)."""
    nparts = max((r["tasks"] or 0) for r in rows) if rows else 0
    sid = lambda r: r["stage"].split(".")[0]  # noqa: E731
    att = lambda r: int(r["stage"].split(".")[1])  # noqa: E731
    stateful = {sid(r) for r in rows if r["tasks"] == nparts and att(r) == 0 and not r["name"].startswith("run at")}
    for r in rows:
        r["stateful"] = sid(r) in stateful
    out: dict[str, Any] = {"failed_tasks_after_kill": sum(r.get("failed_tasks") or 0 for r in rows),
                           "resubmitted_stages": sum(1 for r in rows if att(r) > 0)}
    retry = [r for r in rows if r["stateful"] and att(r) > 0 and r["submitted_s"] >= detection_s]
    first = min((int(sid(r)) for r in rows if r["stateful"]), default=None)
    if retry:
        rr = retry[0]
        start = rr.get("last_success_launch_s")
        start = rr["submitted_s"] if start is None else start
    elif first is not None:
        rr = next(r for r in rows if r["stateful"] and int(sid(r)) == first)
        start = rr.get("last_success_launch_s")
    else:
        rr, start = None, None
    if rerun_start_s is not None:  # known from the task itself (Rhino's task meta)
        start = rerun_start_s
    if rr is not None and start is not None:
        out["rerun_task_start_s"] = start
        out["rerun_stage"] = rr["stage"]
    out["replay_s"] = sum((r["completed_s"] - r["submitted_s"]) for r in rows
                          if not r["stateful"] and r["completed_s"] is not None and r["submitted_s"] >= detection_s
                          and (start is None or r["submitted_s"] < start))
    return out


def _executor_removed(ui: str, app_id: str, ip: str, k: float) -> Optional[float]:
    """When Spark's driver removed the killed host's executor, seconds after the kill."""
    try:
        gone = [e for e in spark_rest(ui, f"applications/{app_id}/allexecutors")
                if e.get("hostPort", "").startswith(ip + ":") and e.get("removeTime")]
        return round(spark_time(gone[0]["removeTime"]) - k, 4) if gone else None
    except Exception:
        return None


def _spark_breakdown(run: Any, st: dict, ui: str, app_id: str, victim_ip: str) -> dict:
    k = st["kill_t"]
    out: dict[str, Any] = {"locality": None, "attempts": None}
    removed = None
    try:
        execs = spark_rest(ui, f"applications/{app_id}/allexecutors")
        gone = [e for e in execs if e.get("hostPort", "").startswith(victim_ip + ":") and e.get("removeTime")]
        removed = spark_time(gone[0]["removeTime"]) if gone else None
        out["detection_s"] = (removed - k) if removed else None
        out["executor_remove_reason"] = gone[0].get("removeReason") if gone else None
    except Exception as e:
        out["rest_error"] = f"{type(e).__name__}: {e}"
    out.update(_spark_stages(ui, app_id, k, removed or k))
    # the state load of the recovered batch (and any batch after the kill that loaded from DFS)
    loads = []
    for b, p in sorted(run.progress.items()):
        sb = next((x for x in run.batches if x["batch"] == b), None)
        if sb is None or sb["sink_end"] <= k:
            continue
        cm = _spark_state(p).get("customMetrics") or {}
        loads.append((b, cm))
    # The batch that pays the restore: the first after the kill whose tasks loaded a store
    # from the checkpoint location. Usually the recovered batch itself; the next one when
    # the kill landed after the victim's stateful task had ended (its stores then move at
    # the next batch's scheduling).
    paid = next(((b, cm) for b, cm in loads if (cm.get("rocksdbNumLoadedFromDfs") or 0) > 0), None)
    if paid is None and loads:
        paid = loads[0]
    first = paid[1] if paid else {}
    out["restore_batch"] = paid[0] if paid else None
    out["state_restore_s"] = (first.get("rocksdbLoadLatencyMs") or 0) / 1000.0 if loads else None
    out["state_load_from_snapshot_s"] = (first.get("rocksdbLoadFromSnapshotLatencyMs") or 0) / 1000.0 \
        if first else None
    out["stores_loaded_from_dfs"] = first.get("rocksdbNumLoadedFromDfs")
    out["restore_batch_metrics"] = {kk: first.get(kk) for kk in (
        "rocksdbLoadLatencyMs", "rocksdbLoadFromSnapshotLatencyMs", "rocksdbReplayChangeLogLatencyMs",
        "rocksdbNumLoadedFromDfs", "rocksdbSstFileSize", "rocksdbBytesCopied", "rocksdbFilesCopied")}
    sb = next((x for x in run.batches if x["sink_end"] > k), None)
    if sb is not None:
        p = run.progress.get(sb["batch"])
        out["rerun_batch_s"] = (p or {}).get("durationMs", {}).get("triggerExecution", 0) / 1000.0 if p else None
    if out.get("rerun_task_start_s") is not None:
        det = out.get("detection_s") or 0.0
        out["scheduling_s"] = max(0.0, out["rerun_task_start_s"] - det - (out.get("replay_s") or 0.0))
    else:
        out.setdefault("scheduling_s", None)
    return out


def _finish(rec: dict) -> None:
    for kk, v in list(rec.items()):
        if isinstance(v, float):
            rec[kk] = round(v, 4)


# --------------------------------------------------------------------------- summary, report, plot


def _valid(r: dict) -> bool:
    """A recovery record that counts (not marked ``discarded``: e.g. a kill that missed)."""
    return r.get("record") == "recovery" and not r.get("discarded")


def _median_record(rs: list[dict]) -> dict:
    """One (system, size): the median of each figure over its trials (a single trial: itself)."""
    if len(rs) == 1:
        return dict(rs[0], trials=1)
    out = dict(rs[-1], trials=len(rs))
    for f in ("recovery_s", "state_restore_s", "detection_s", "scheduling_s", "replay_s", "locality",
              "state_bytes_at_kill", "rerun_task_start_s"):
        xs = [r[f] for r in rs if r.get(f) is not None]
        out[f] = median(xs) if xs else None
    return out


def summarize(records: list[dict]) -> dict:
    """Per size, Rhino against the baseline on the median over trials (``--trials``, or
    several runs combined with ``--from``)."""
    rr = [r for r in records if _valid(r)]
    groups: dict[tuple, list[dict]] = {}
    for r in rr:
        groups.setdefault((r["system"], r["size_bytes"]), []).append(r)
    by = {k: _median_record(v) for k, v in groups.items()}
    sizes = sorted({r["size_bytes"] for r in rr})
    rows = []
    for s in sizes:
        a = by.get(("rhino", s))
        bases = [c for c in SPARK_BASELINES if (c, s) in by]
        if a and bases:
            # the less favourable baseline for Rhino: the one that recovers fastest
            c = min(bases, key=lambda c: by[(c, s)].get("recovery_s") or float("inf"))
            b, ga, gb = by[(c, s)], groups[("rhino", s)], groups[(c, s)]
            rows.append({"size_bytes": s, "trials": [len(ga), len(gb)], "baseline": c,
                         "restore_speedup": _ratio(b.get("state_restore_s"), a.get("state_restore_s")),
                         "recovery_speedup": _ratio(b.get("recovery_s"), a.get("recovery_s")),
                         "recovery_below_baseline": all(a["recovery_s"] < by[(x, s)]["recovery_s"] for x in bases),
                         "by_baseline": {x: {"restore_speedup": _ratio(by[(x, s)].get("state_restore_s"),
                                                                       a.get("state_restore_s")),
                                             "recovery_speedup": _ratio(by[(x, s)].get("recovery_s"),
                                                                        a.get("recovery_s"))} for x in bases},
                         "rhino_recovery_s": [r["recovery_s"] for r in ga],
                         "baseline_recovery_s": [r["recovery_s"] for r in gb]})
    rh = [by[("rhino", s)] for s in sizes if ("rhino", s) in by]
    out: dict[str, Any] = {"record": "summary", "per_size": rows}
    if rows:
        top = rows[-1]
        out["restore_speedup_at_largest"] = top["restore_speedup"]
        out["restore_target_met"] = bool(top["restore_speedup"] and top["restore_speedup"] >= SPEEDUP_TARGET)
        out["recovery_target_met"] = all(r["recovery_below_baseline"] for r in rows)
    if len(rh) >= 2 and rh[0].get("state_restore_s"):
        flat = rh[-1]["state_restore_s"] / rh[0]["state_restore_s"]
        out["rhino_restore_growth"] = round(flat, 3)
        out["rhino_restore_flat"] = flat <= FLAT_TARGET
    locs = [r["locality"] for r in rh if r.get("locality") is not None]
    if locs:
        out["locality_min"] = round(min(locs), 4)
        out["locality_target_met"] = min(locs) >= LOCALITY_TARGET
    # issue 29's absolute targets, on Rhino's medians at every size
    starts = {s: by[("rhino", s)].get("rerun_task_start_s") for s in sizes if ("rhino", s) in by}
    restores = {s: by[("rhino", s)].get("state_restore_s") for s in sizes if ("rhino", s) in by}
    if starts and all(v is not None for v in starts.values()):
        out["rhino_rerun_task_start_median_s"] = {str(k): v for k, v in starts.items()}
        out["rerun_start_target_met"] = all(v <= RERUN_START_TARGET_S for v in starts.values())
    if restores and all(v is not None for v in restores.values()):
        out["rhino_state_restore_median_s"] = {str(k): v for k, v in restores.items()}
        out["restore_abs_target_met"] = all(v <= RESTORE_TARGET_S for v in restores.values())
    for c in SPARK_BASELINES:
        sp = [by[(c, s)] for s in sizes if (c, s) in by]
        per_gib = [r["state_restore_s"] / (r["state_bytes_at_kill"] / 2**30) for r in sp
                   if r.get("state_restore_s") and r.get("state_bytes_at_kill")]
        if per_gib:
            key = "spark_restore_s_per_gib" + ("" if c == "spark-rocksdb" else "_changelog")
            out[key] = round(sum(per_gib) / len(per_gib), 3)
    return out


def _takeover_opens(rr: list[dict]) -> list[dict]:
    """Rhino's takeover restores that report their open's CPU and run-queue wait (since 2026-11-27)."""
    out = []
    for r in rr:
        for fig in (r.get("takeover") or {}).values() if r.get("system") == "rhino" else ():
            rs = (fig or {}).get("restore") or {}
            if "open_cpu_s" in rs:
                out.append({"size_bytes": r["size_bytes"], "trial": r.get("trial", 0) + 1, "open_s": rs["open_s"],
                            "open_cpu_s": rs["open_cpu_s"], "open_wait_s": rs["open_wait_s"],
                            "failover_s": r.get("coordinator_failover_s")})
    return out


def _rerun_steps(r: dict) -> list[tuple[str, float]]:
    """Rhino's rerun launch, step by step (seconds from the kill), from one record's fields;
    what a record predating a field lacks is left out."""
    steps: list[tuple[str, Optional[float]]] = [("Spark removed the executor", r.get("spark_executor_removed_s")),
                                               ("the batch watch cancelled the attempt", r.get("attempt_cancelled_s"))]
    for w in r.get("watch") or []:
        for rep in w.get("reported") or []:
            steps.append(("the coordinator's failover answered the watch's report", rep.get("answered")))
        steps.append(("the cancelled attempt's job returned", w.get("exited_at")))
    start = r.get("job_attempt_start_s")
    steps.append(("the next attempt began (after begin_batch)", start))
    if start is not None and r.get("rerun_job_setup_s") is not None:
        steps.append(("it called its Spark action", start + r["rerun_job_setup_s"]))
    for st in r.get("stages_after_kill") or []:
        if (st.get("submitted_s") or -1) >= 0 and st.get("status") == "COMPLETE":
            kind = "stateful stage" if st.get("stateful") else f"stage {st['stage']} ({st.get('tasks')} task(s))"
            steps.append((f"the {kind} was submitted", st["submitted_s"]))
            if st.get("stateful"):
                break
    steps.append(("the lost instance's rerun task launched", r.get("rerun_task_start_s")))
    return [(what, t) for what, t in steps if t is not None]


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or not b:
        return None
    return round(a / b, 2)


_PARTS = [("detection_s", "detection"), ("scheduling_s", "scheduling"), ("replay_s", "replay"),
          ("state_restore_s", "state restore")]


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rr = sorted((r for r in records if _valid(r)), key=lambda r: (r["size_bytes"], r["system"]))
    if not rr:
        return
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(13.0, 7.0 + 0.75 * len(rr)), 5),
                                  gridspec_kw={"width_ratios": [max(1.2, len(rr) / 5), 1]})
    labels, bottoms = [], [0.0] * len(rr)
    colors = {"detection_s": "#999999", "scheduling_s": "#f0a030", "replay_s": "#60a0e0",
              "state_restore_s": "#d04040"}
    xs = range(len(rr))
    for f, name in _PARTS:
        vals = [max(0.0, r.get(f) or 0.0) for r in rr]
        ax.bar(xs, vals, bottom=bottoms, color=colors[f], label=name)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    rest = [max(0.0, r["recovery_s"] - b) for r, b in zip(rr, bottoms)]
    ax.bar(xs, rest, bottom=bottoms, color="#cccccc", hatch="//", label="rest of the rerun batch")
    for i, r in enumerate(rr):
        labels.append(f"{r['size_bytes'] / 2**30:g} GiB\n" + {"rhino": "Rhino", "spark-rocksdb": "Spark",
                                                               "spark-rocksdb-changelog": "Spark changelog"}[r["system"]])
        ax.text(i, r["recovery_s"], f"{r['recovery_s']:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("seconds from the SIGKILL")
    ax.set_title("Recovery of NEXMark Q8 after a host loss (recovery_s, broken down)")
    ax.legend(fontsize=8)
    sizes = sorted({r["size_bytes"] for r in rr})
    for sysname, lab, c in (("rhino", "Rhino (takeover + session open)", "#d04040"),
                            ("spark-rocksdb", "Spark RocksDB (rocksdbLoadLatencyMs)", "#404040"),
                            ("spark-rocksdb-changelog", "Spark RocksDB, changelog (rocksdbLoadLatencyMs)", "#808080")):
        pts = [(r["size_bytes"] / 2**30, r.get("state_restore_s")) for r in rr if r["system"] == sysname]
        pts = [(a, b) for a, b in pts if b is not None]
        if pts:
            ax2.scatter([p[0] for p in pts], [p[1] for p in pts], color=c, s=14, alpha=0.6)
            xs2 = sorted({p[0] for p in pts})
            ax2.plot(xs2, [median([b for a, b in pts if a == x]) for x in xs2], "o-", color=c,
                     label=lab + (" (median)" if len(pts) > len(xs2) else ""))
    ax2.set_xlabel("state (GiB)")
    ax2.set_ylabel("state_restore_s")
    ax2.set_yscale("log")
    ax2.set_title("State restore of the rerun task vs state size")
    ax2.legend(fontsize=8)
    if sizes:
        ax2.set_xticks([s / 2**30 for s in sizes])
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(records: list[dict], path: str) -> None:
    from rhino._machine import machine_summary

    setup = next((r for r in records if r.get("record") == "setup"), {})
    command = setup.get("command", "")
    rr = sorted((r for r in records if _valid(r)), key=lambda r: (r["size_bytes"], r["system"]))
    summ = summarize(records)
    L = ["# Spark recovery: NEXMark Q8 after a host loss, Rhino vs Spark's RocksDB state store", "",
         f"Command: `{command}`", "",
         f"Run at {setup.get('started')} on {machine_summary(setup.get('machine', {}))}.", "",
         "Parameters: " + ", ".join(f"{k}={v}" for k, v in setup.get("parameters", {}).items()), "",
         "Spark settings: " + (", ".join(f"`{k}={v}`" for k, v in setup.get("spark_conf", {}).items())
                               or "Spark's defaults") + " (besides the cluster's: one 1-core executor per host, "
         "`spark.sql.shuffle.partitions=3`, `spark.python.task.killTimeout=200ms` (only cancelled tasks feel it, "
         "and only Rhino's batch watch cancels); `spark.network.timeout`, heartbeats, `spark.locality.wait` (3 s), "
         "`spark.task.maxFailures` (4) are Spark's defaults; state store: RocksDB provider, its defaults; "
         f"`spark-rocksdb` with `{CHANGELOG_CONF}=false` (Spark's default: a snapshot uploaded at every commit), "
         "`spark-rocksdb-changelog` with it `true` (Spark's recommended production setting: a change log per "
         "batch, a snapshot every few; a restore replays the log)).", "",
         "**The baseline's \"DFS\" (Spark's checkpoint location) is a directory on the same local disk**: its "
         "state fetch is a local file copy (no network, page cache warm), which favours the baseline.", "",
         "Seconds from the SIGKILL:", "",
         "| state | system | trial | recovery | detection | scheduling | replay | state restore | "
         "rerun task start | rerun batch | steady batch | attempts | locality |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(x: Any, d: int = 3) -> str:
        return "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))

    seen: dict[tuple, int] = {}
    for r in rr:
        # trials numbered per size and system, in the order run (also across runs combined with --from)
        n = seen[(r["system"], r["size_bytes"])] = seen.get((r["system"], r["size_bytes"]), 0) + 1
        L.append(f"| {r['size_bytes'] / 2**30:g} GiB ({(r.get('state_bytes_at_kill') or 0) / 2**30:.2f} GiB at "
                 f"kill) | {r['system']} | {n} | {f(r.get('recovery_s'))} | "
                 f"{f(r.get('detection_s'))} | "
                 f"{f(r.get('scheduling_s'))} | {f(r.get('replay_s'))} | {f(r.get('state_restore_s'))} | "
                 f"{f(r.get('rerun_task_start_s'))} | {f(r.get('rerun_batch_s'))} | {f(r.get('steady_batch_s'))} | "
                 f"{f(r.get('attempts'))} | {f(r.get('locality'))} |")
    L += ["", "Ratios (baseline / Rhino, same run; with several trials, of the medians; against the Spark "
          "baseline that recovered fastest, the less favourable for Rhino):", ""]
    for row in summ.get("per_size", []):
        line = (f"- {row['size_bytes'] / 2**30:g} GiB, against {row.get('baseline', 'spark-rocksdb')}: state restore "
                f"{row['restore_speedup']}x, recovery {row['recovery_speedup']}x")
        others = {k: v for k, v in (row.get("by_baseline") or {}).items() if k != row.get("baseline")}
        line += "".join(f" (against {k}: state restore {v['restore_speedup']}x, recovery {v['recovery_speedup']}x)"
                        for k, v in others.items())
        if max(row.get("trials") or [1]) > 1:
            line += (f" (recovery per trial: Rhino {', '.join(f'{x:.2f}' for x in row['rhino_recovery_s'])} s; "
                     f"baseline {', '.join(f'{x:.2f}' for x in row['baseline_recovery_s'])} s)")
        L.append(line)
    L += ["", "Targets:", ""]
    if "restore_target_met" in summ:
        L.append(f"- Rhino's state restore >= {SPEEDUP_TARGET:g}x faster than the baseline's at the largest size: "
                 f"{summ['restore_speedup_at_largest']}x: **{'met' if summ['restore_target_met'] else 'not met'}**.")
    if "rhino_restore_flat" in summ:
        L.append(f"- Rhino's state restore flat in size (largest / smallest <= {FLAT_TARGET:g}): "
                 f"{summ['rhino_restore_growth']}x: **{'met' if summ['rhino_restore_flat'] else 'not met'}**.")
    if "recovery_target_met" in summ:
        L.append(f"- Rhino's recovery below the baseline's at every size: "
                 f"**{'met' if summ['recovery_target_met'] else 'not met'}**.")
    if "rerun_start_target_met" in summ:
        med = ", ".join(f"{int(k) / 2**30:g} GiB {v:.3f} s" for k, v in summ["rhino_rerun_task_start_median_s"].items())
        L.append(f"- Rhino's median rerun_task_start_s <= {RERUN_START_TARGET_S:g} s at every size ({med}): "
                 f"**{'met' if summ['rerun_start_target_met'] else 'not met'}**.")
    if "restore_abs_target_met" in summ:
        med = ", ".join(f"{int(k) / 2**30:g} GiB {1000 * v:.0f} ms" for k, v in summ["rhino_state_restore_median_s"].items())
        L.append(f"- Rhino's median state_restore_s <= {1000 * RESTORE_TARGET_S:.0f} ms at every size ({med}): "
                 f"**{'met' if summ['restore_abs_target_met'] else 'not met'}**.")
    if "locality_target_met" in summ:
        L.append(f"- Locality of Rhino's steady batches >= {LOCALITY_TARGET:.0%}: min {summ['locality_min']:.1%}: "
                 f"**{'met' if summ['locality_target_met'] else 'not met'}**.")
    if "spark_restore_s_per_gib" in summ:
        L.append(f"- Spark's state restore costs {summ['spark_restore_s_per_gib']} s per GiB of state here.")
    if "spark_restore_s_per_gib_changelog" in summ:
        L.append(f"- With changelog checkpointing, {summ['spark_restore_s_per_gib_changelog']} s per GiB.")
    opens = _takeover_opens(rr)
    if opens:
        L += ["", "Rhino's takeover opens (the opening thread's own figures, src/cpp/util/sched.h; what is left of "
              "the open is I/O):", ""]
        L += [f"- {o['size_bytes'] / 2**30:g} GiB, trial {o['trial']}: open {1000 * o['open_s']:.0f} ms, of which "
              f"CPU {1000 * o['open_cpu_s']:.0f} ms and run-queue wait {1000 * o['open_wait_s']:.0f} ms"
              + (f"; the coordinator's whole failover {o['failover_s']:.3f} s" if o.get("failover_s") else "")
              for o in opens]
    timelines = [(r, _rerun_steps(r)) for r in rr if r.get("system") == "rhino"]
    if any(steps for _, steps in timelines):
        L += ["", "Rhino's rerun launch, step by step (seconds from the kill):", ""]
        L += [f"- {r['size_bytes'] / 2**30:g} GiB, trial {r.get('trial', 0) + 1}: "
              + "; ".join(f"{t:.2f} {what}" for what, t in steps) for r, steps in timelines if steps]
    L += ["", "Definitions: see the docstring of `bench/rhino_bench/spark/recovery.py` and the "
          "`Spark recovery` section of `bench/README.md`.", ""]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(L))


# --------------------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(Recovery(summarize=summarize, report=report, plot=plot), argv)


if __name__ == "__main__":
    sys.exit(main())
