"""``rhino-bench spark recovery``: recovery of NEXMark Q8 after a host is SIGKILLed
mid-batch, Rhino against Spark's own ``transformWithStateInPandas`` with the RocksDB
state store provider, per state size (the Rhino paper's Table 1, on Spark).

    rhino-bench spark recovery --sizes 1G,2G,4G --json --out bench/results/spark_recovery.jsonl \
        --plot bench/results/spark_recovery.png --report bench/results/spark_recovery.md

How it runs and what each record holds: bench/README.md, "Spark recovery".
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, spark_flags
from ..report import choices
from .common import fraction, median, positive_float, positive_int, say
from .recovery_breakdown import (_common_fields, _finish, _rhino_breakdown, _spark_breakdown, _spark_state,
                                 _victim_task_running, _victim_task_seconds, _wait_victim_task)
from .recovery_report import (CHANGELOG_CONF, FLAT_TARGET, LOCALITY_TARGET, SPARK_BASELINES, SPEEDUP_TARGET, plot,
                              report, summarize)

__all__ = ["main", "run_one", "SPEEDUP_TARGET", "FLAT_TARGET", "LOCALITY_TARGET"]

HUGE_WINDOW_MS = 10 ** 12
SYSTEMS = {"rhino": "rhino", "spark": "spark-rocksdb", "spark-rocksdb": "spark-rocksdb",
           "spark-changelog": "spark-rocksdb-changelog", "spark-rocksdb-changelog": "spark-rocksdb-changelog"}


def _sizes(text: str) -> list[int]:
    from rhino._sizes import parse_sizes

    try:
        sizes = parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if any(s < (1 << 20) for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be at least 1M")
    return sizes


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
        ap.add_argument("--systems", type=choices(SYSTEMS.values(), "system", SYSTEMS), default=["rhino", "spark-rocksdb", "spark-rocksdb-changelog"],
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


# --------------------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(Recovery(summarize=summarize, report=report, plot=plot), argv)
