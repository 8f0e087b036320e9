"""``rhino-bench spark elastic``: NEXMark Q8 while its input rate steps 1x -> 3x -> 1x, on
Rhino with the coordinator's autoscaler against Spark's own ``transformWithStateInPandas``
with the RocksDB state store, which cannot rescale its state (issue 29, Build 5).

    rhino-bench spark elastic --json --out bench/results/spark_elastic.jsonl \\
        --report bench/results/spark_elastic.md --plot bench/results/spark_elastic.png

Per system, on a fresh local cluster (:class:`~rhino_testing.harness.spark_cluster.LocalCluster`,
hosts 127.0.0.N.. from ``--first-host``, one 1-core executor and one Rhino worker per host):
3 hosts, and a spare host (the 4th address) that joins the running application
(``spark_conf(spare_hosts=1)``, ``add_host``; its executor is warmed, as ``make demo`` does):

* ``rhino``: the spare host joins before the query starts, so the autoscaler has 4 workers
  to place on. Q8 runs from ``foreachBatch`` on Rhino state (``--parallelism`` instances at
  the start, r=``--replicas``). Once the warm-up is over, the autoscaler is turned on
  (``CoordinatorClient.autoscale(op, min_parallelism, max_parallelism, strategy,
  utilization, cooldown_batches)``); from then on it alone decides the parallelism.
* ``spark-rocksdb``: Spark's own operator at the same rates, with 3 executors and
  ``spark.sql.shuffle.partitions=3`` (its state partitions, fixed for the life of the
  checkpoint). Then its only remedy, a separate phase (below).

**The input rate.** The source is the ``nexmark`` source with an arrival schedule
(:mod:`.elastic_source`): events *arrive* at a rate, whatever the query does, and each
micro-batch (a processing-time trigger of ``--trigger-interval`` S seconds) reads every event
that has arrived. A system that keeps up runs one batch per S seconds, each with the events
of the last S seconds; one that falls behind gets larger batches (its backlog), and its
batches run back to back. The rate is ``--base-events`` E events per trigger interval at
1x (E / S events/s). The first ``--warmup-batches`` batches run at ``--warmup-events`` per
interval; then the steps of ``--rates`` (default 1,3,1) follow, each lasting
``--batches-per-step`` N trigger intervals (N x S seconds of wall time: N batches for a system
that keeps up). ``--base-events auto`` (the default) sizes E from the warm-up of the Rhino run:
E = ``--base-load`` x the true processing rate of one instance (records over busy seconds,
the autoscaler's own measure, DS2 §3, converted to events) x S; so at 3x one instance
cannot keep up, while 1x needs one. The Spark run uses the same E.

**Per batch** (a ``batch`` line): its start (Spark's progress ``timestamp``; ``t`` in seconds
from the query's start), the phase and the rate step its events belong to (a batch belongs to
step k once it read an event that arrived in step k), the rate in effect (``rate_x``,
``events_per_s``), ``events`` (``numInputRows``), the batch latency ``latency_s`` (Spark's
``durationMs.triggerExecution``, for both systems, as the other Spark benchmarks), the age of
its oldest event at its end (``oldest_event_age_s``, the backlog's delay), the parallelism in
effect (Rhino: the instances that ran the batch, the coordinator's placement at its barrier;
Spark: the stateful operator's ``numShufflePartitions``), and whether it failed (Rhino: run
again, ``attempts`` > 1). Rhino's batches also carry the autoscaler's decision on them (the
coordinator's ``status()``: scale out/in or hold, and why).

**Per reconfiguration** (a ``reconfiguration`` line, Rhino): the autoscaler's decision (its
batch, from -> to, its reason with the measured input rate and true rate), the plan, and the
batches at whose barriers its steps ran (the coordinator's ``handover_step`` events), with
each step's seconds and bytes copied.

**Spark's remedy** (a ``restart`` line; ``--restart-batches 0`` skips it). After the steps
(nothing arrives after the last one; the query reads its backlog for up to
``--drain-batches`` trigger intervals), at the same state: the spare host joins and its
executor registers with the application and is warmed (``host_join_s``, not counted below);
then the query is stopped and started again from its checkpoint, with 4 executors but the
same 3 state partitions (Spark never changes them for a checkpoint), while events arrive at
the peak rate (``max(--rates)``) from the stop request on. Timed: ``stop_s``
(``query.stop()``), ``restart_s`` (from ``start()`` of the new query to the end of its first
completed batch: planning, the state stores loaded from the checkpoint on their executors,
the batch itself, which holds the events that arrived during the outage), ``remedy_s`` = the
stop request to that end (the query's outage), ``first_batch_s`` and ``state_load_s`` (its
``rocksdbLoadLatencyMs``); then the latency of the next batches at the peak rate
(``--restart-batches`` in all, the first included): with more executors but the same
partitions, does it keep up? (``caught_up_at_stop`` false: the query was still behind, and
the stop interrupted a batch, which the restarted query runs first.)

**The summary** (one ``summary`` line per system):

* ``recovered_within_batches``: the worst over the rate changes of: the batches of the new
  step before the one from which every batch of the step is under the trigger interval
  (``recovered_all_steps`` false if a step ended over it; then the step's batch count);
* ``rescale_spike_x``: the largest batch latency during a rescale (from the batch after the
  decision to the batch whose barrier ran the plan's last step) over the steady median (the
  batches of the first 1x step after the warm-up, outside any rescale); Spark: null;
* ``failed_batches``; ``parallelism_min``, ``parallelism_max`` (over the steps);
  ``parallelism_by_step`` and ``parallelism_follows_rate`` (each step's last batch's
  parallelism moves with the rate); ``steady_median_s``; and the targets, reported, not
  asserted: within 5 batches, parallelism follows the rate, no failed batch, each rescale's
  largest batch <= 2x the steady median.

``--from JSONL`` redoes the summary, the report and the plot from saved lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from rhino_testing.harness.warm import warm_executor

from ..frame import BenchRun, Scenario, bench_main, parser
from .common import (Emitter, host_number, loadavg, median, non_negative_int, positive_float, positive_int,
                     round_floats, say, spark_time)

__all__ = ["main", "build_parser", "summarize", "summarize_system", "step_recovery", "rescale_windows", "plot",
           "report", "SYSTEMS", "RECOVERED_TARGET", "SPIKE_TARGET"]

SYSTEMS = ("rhino", "spark-rocksdb")
_ALIASES = {"rhino": "rhino", "spark": "spark-rocksdb", "spark-rocksdb": "spark-rocksdb"}
STRATEGIES = ("all-at-once", "fluid", "batched")
RECOVERED_TARGET = 5     # batches after a rate step until the latency is back under the trigger interval
SPIKE_TARGET = 2.0       # a rescale's largest batch over the steady median
HOSTS = 3                # the cluster's hosts; the spare one is host 4


# --------------------------------------------------------------------------- arguments


def _systems(text: str) -> list[str]:
    out: list[str] = []
    for s in (x.strip() for x in text.split(",") if x.strip()):
        if s not in _ALIASES:
            raise argparse.ArgumentTypeError(f"unknown system {s!r}: choose from rhino, spark-rocksdb")
        if _ALIASES[s] not in out:
            out.append(_ALIASES[s])
    if not out:
        raise argparse.ArgumentTypeError("no system given")
    return [s for s in SYSTEMS if s in out]  # Rhino first: its warm-up sizes --base-events auto


def _rates(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates {text!r}: expected numbers, e.g. 1,3,1") from None
    if not out or any(not x > 0 for x in out):
        raise argparse.ArgumentTypeError(f"--rates {text!r}: each rate must be > 0")
    return out


def _base_events(text: str) -> Optional[int]:
    if text.strip().lower() == "auto":
        return None
    return positive_int(text)


class Elastic(Scenario):
    name = "spark elastic"
    description = ("NEXMark Q8 while the input rate steps 1x -> 3x -> 1x: Rhino with the autoscaler vs Spark's "
                   "transformWithStateInPandas with RocksDB (which cannot rescale its state), on a local 3-host "
                   "cluster with a spare host.")
    workdir_prefix = "rhino-spark-elastic-"
    summary_on_failure = False
    summary_extras = False

    def flags(self, ap: argparse.ArgumentParser) -> None:
        _flags(ap)

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.first_host + HOSTS > 254:
            ap.error(f"--first-host: the {HOSTS} hosts and the spare one must fit 127.0.0.2..254")
        if args.min_parallelism > args.max_parallelism:
            ap.error("--min-parallelism is above --max-parallelism")
        if args.max_parallelism > HOSTS + 1:
            ap.error(f"--max-parallelism: at most {HOSTS + 1} (one 1-core executor per host, the spare one included)")
        if args.replicas > HOSTS - 1:
            ap.error(f"--replicas: at most {HOSTS - 1} on {HOSTS} hosts")
        if args.vnodes is not None and args.vnodes < args.max_parallelism:
            ap.error("--vnodes must be at least --max-parallelism")
        if "rhino" not in args.systems and args.base_events is None:
            ap.error("--base-events auto sizes the rate from the Rhino run's warm-up: give --base-events E "
                     "without rhino")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        params = {k: getattr(args, k) for k in (
            "systems", "rates", "batches_per_step", "trigger_interval", "base_events", "base_load",
            "warmup_batches", "warmup_events", "drain_batches", "strategy", "parallelism", "min_parallelism",
            "max_parallelism", "utilization", "cooldown_batches", "replicas", "vnodes", "window_ms",
            "payload_bytes", "source_partitions", "restart_batches", "first_host")}
        params["trigger_interval_s"] = params.pop("trigger_interval")
        return dict(params, hosts=HOSTS, spare_hosts=1)

    def setup_extra(self, args: argparse.Namespace) -> dict:
        return {"loadavg_1_5_15": loadavg()}

    def run(self, br: BenchRun) -> int:
        shared: dict[str, Any] = {"base_events": br.args.base_events}
        failed = 0
        for system in br.args.systems:
            try:
                run_system(system, br.args, br.em, br.base, br.spark_conf, shared)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:  # noqa: BLE001 - the other system still runs
                failed += 1
                say(f"{system} failed: {type(e).__name__}: {e}")
                br.emit({"record": "error", "system": system, "error": f"{type(e).__name__}: {e}"[:2000]})
        return 1 if failed else 0

    def summary(self, br: BenchRun, failed: bool) -> list[dict]:
        out = summarize(br.records)
        for s in out:
            s["elapsed_s"] = round(time.time() - br.t_wall, 1)
            say(f"{s['system']}: recovered within {s['recovered_within_batches']} batches "
                f"(all steps: {s['recovered_all_steps']}), rescale spike {s['rescale_spike_x']}x, "
                f"{s['failed_batches']} failed batches, parallelism {s['parallelism_min']}..{s['parallelism_max']} "
                f"{s['parallelism_by_step']}; targets met: {s['targets_met']}")
        return out

    def replay_records(self, records: list[dict], args: argparse.Namespace) -> list[dict]:
        return records





def build_parser() -> argparse.ArgumentParser:
    return parser(_scenario())


def _flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--systems", type=_systems, default=list(SYSTEMS),
                    help="rhino, spark-rocksdb or both, comma-separated (default both; Rhino runs first)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    g = ap.add_argument_group("the input rate")
    g.add_argument("--rates", type=_rates, default=_rates("1,3,1"),
                   help="the rate steps, multiples of --base-events (default 1,3,1)")
    g.add_argument("--batches-per-step", type=positive_int, default=10,
                   help="each step lasts this many trigger intervals (default 10)")
    g.add_argument("--trigger-interval", type=positive_float, default=10.0,
                   help="the processing-time trigger, s (default 10)")
    g.add_argument("--base-events", type=_base_events, default=None, metavar="E|auto",
                   help="events per trigger interval at 1x; auto (default): sized from the Rhino run's warm-up "
                        "(--base-load)")
    g.add_argument("--base-load", type=positive_float, default=0.35,
                   help="with --base-events auto: 1x = this fraction of one Rhino instance's true processing "
                        "rate (default 0.35: 3x is more than one instance can do)")
    g.add_argument("--warmup-batches", type=positive_int, default=5,
                   help="batches before the steps begin, at --warmup-events (default 5)")
    g.add_argument("--warmup-events", type=positive_int, default=None,
                   help="events per trigger interval during the warm-up (default: --base-events, or 50000 with "
                        "auto)")
    g.add_argument("--drain-batches", type=non_negative_int, default=6,
                   help="after the last step (nothing arrives then), wait at most this many trigger intervals for "
                        "the backlog to be read (default 6)")
    g = ap.add_argument_group("Rhino and its autoscaler")
    g.add_argument("--strategy", choices=STRATEGIES, default="all-at-once",
                   help="the autoscaler's migration strategy (default all-at-once: one barrier per rescale; the "
                        "handover benchmark measured its spike the smallest, steps being hard links). fluid and "
                        "batched move about one vnode per instance per barrier: give them few vnodes (--vnodes 8), "
                        "or a rescale outlasts a step")
    g.add_argument("--parallelism", type=positive_int, default=1, help="Rhino instances at the start (default 1)")
    g.add_argument("--min-parallelism", type=positive_int, default=1, help="the autoscaler's minimum (default 1)")
    g.add_argument("--max-parallelism", type=positive_int, default=HOSTS + 1,
                   help=f"the autoscaler's maximum (default {HOSTS + 1}: one instance per host and core)")
    g.add_argument("--utilization", type=positive_float, default=0.7, help="the autoscaler's headroom (default 0.7)")
    g.add_argument("--cooldown-batches", type=non_negative_int, default=3,
                   help="the autoscaler's cooldown after a rescale (default 3)")
    g.add_argument("--replicas", type=non_negative_int, default=2, help="Rhino's r (default 2)")
    g.add_argument("--vnodes", type=positive_int, default=None, help="the operator's vnodes (default: the operator's)")
    g = ap.add_argument_group("the query and the cluster")
    g.add_argument("--window-ms", type=positive_int, default=10_000, help="Q8's window, event time (default 10000)")
    g.add_argument("--payload-bytes", type=positive_int, default=None,
                   help="Person and Auction payload bytes (default: the generator's)")
    g.add_argument("--source-partitions", type=positive_int, default=HOSTS,
                   help=f"the source's partitions per batch (default {HOSTS})")
    g.add_argument("--restart-batches", type=non_negative_int, default=2,
                   help="Spark's remedy: batches run at the peak rate after the restart with more executors, the "
                        "first included (default 2; 0 skips the remedy)")
    g.add_argument("--first-host", type=host_number, default=150,
                   help="hosts are 127.0.0.N.. and the spare one N+3 (default 150)")
    g.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark conf for both systems' sessions (repeatable)")
    g.add_argument("--timeout", type=positive_float, default=1800.0, help="per system, s (default 1800)")


# --------------------------------------------------------------------------- the summary (pure)


def _data(rows: list[dict]) -> list[dict]:
    """Batches that read events (a no-data batch only moves the watermark)."""
    return sorted((r for r in rows if (r.get("events") or 0) > 0 and r.get("latency_s") is not None),
                  key=lambda r: r["batch"])


def _in_steps(rows: list[dict]) -> list[dict]:
    return [r for r in _data(rows) if r.get("phase") == "steps" and r.get("step") is not None]


def rescale_windows(rows: list[dict], reconfs: list[dict]) -> list[dict]:
    """Per planned reconfiguration, the batches it spans: from the batch after its decision
    through the batch whose barrier ran its last step (a plan that never finished: through the
    last batch that ran one of its steps). Each with its largest batch latency."""
    out = []
    lat = {r["batch"]: r["latency_s"] for r in _data(rows)}
    for c in reconfs:
        d = c.get("decided_batch")
        if d is None or c.get("plan") is None:
            continue
        done = c.get("done_batch")
        if done is None and c.get("step_batches"):
            done = max(b for b in c["step_batches"] if b is not None) if any(
                b is not None for b in c["step_batches"]) else None
        if done is None:
            continue
        bs = sorted(b for b in lat if d < b <= done)
        worst = max(bs, key=lambda b: lat[b]) if bs else None
        out.append({"plan": c.get("plan"), "action": c.get("action"), "from": c.get("from"), "to": c.get("to"),
                    "decided_batch": d, "done_batch": done, "batches": bs, "finished": c.get("done_batch") is not None,
                    "worst_batch": worst, "worst_s": lat[worst] if worst is not None else None})
    return out


def steady_median(rows: list[dict], windows: list[dict]) -> Optional[float]:
    """The median latency of the first step's batches (after the warm-up) outside any rescale."""
    busy = {b for w in windows for b in w["batches"]}
    return median([r["latency_s"] for r in _in_steps(rows) if r["step"] == 0 and r["batch"] not in busy])


def step_recovery(rows: list[dict], trigger_s: float) -> list[dict]:
    """Per rate step after the first: how many of its batches ran before the one from which
    every batch of the step is under the trigger interval."""
    steps = _in_steps(rows)
    out = []
    for k in sorted({r["step"] for r in steps}):
        bs = [r for r in steps if r["step"] == k]
        if k == 0:
            continue
        lat = [r["latency_s"] for r in bs]
        n = len(bs)
        for i in range(len(bs) - 1, -1, -1):
            if not lat[i] < trigger_s:
                break
            n = i
        out.append({"step": k, "rate_x": bs[0].get("rate_x"), "batches": len(bs), "first_batch": bs[0]["batch"],
                    "recovered_within_batches": n, "recovered": bool(bs) and n < len(bs),
                    "latency_max_s": max(lat), "parallelism_end": bs[-1].get("parallelism"),
                    "parallelism_max": max((r.get("parallelism") or 0) for r in bs)})
    return out


def _by_step(rows: list[dict]) -> list[dict]:
    steps = _in_steps(rows)
    out = []
    for k in sorted({r["step"] for r in steps}):
        bs = [r for r in steps if r["step"] == k]
        ps = [r["parallelism"] for r in bs if r.get("parallelism") is not None]
        out.append({"step": k, "rate_x": bs[0].get("rate_x"), "batches": len(bs),
                    "parallelism_end": bs[-1].get("parallelism"), "parallelism_min": min(ps) if ps else None,
                    "parallelism_max": max(ps) if ps else None,
                    "latency_median_s": median([r["latency_s"] for r in bs]),
                    "latency_max_s": max(r["latency_s"] for r in bs)})
    return out


def _follows(by_step: list[dict]) -> Optional[bool]:
    """Each change of rate moved the parallelism the same way (by the steps' last batches)."""
    verdicts = []
    for a, b in zip(by_step, by_step[1:]):
        if a["rate_x"] is None or b["rate_x"] is None or a["rate_x"] == b["rate_x"]:
            continue
        if a["parallelism_end"] is None or b["parallelism_end"] is None:
            verdicts.append(False)
            continue
        up = b["rate_x"] > a["rate_x"]
        verdicts.append(b["parallelism_end"] > a["parallelism_end"] if up
                        else b["parallelism_end"] < a["parallelism_end"])
    return all(verdicts) if verdicts else None


def summarize_system(system: str, rows: list[dict], reconfs: list[dict], trigger_s: float,
                     restart: Optional[dict] = None, failures: int = 0) -> dict:
    """The summary line of one system, from its batch and reconfiguration lines."""
    windows = rescale_windows(rows, reconfs)
    steady = steady_median(rows, windows)
    rec = step_recovery(rows, trigger_s)
    steps = _in_steps(rows)
    ps = [r["parallelism"] for r in steps if r.get("parallelism") is not None]
    by_step = _by_step(rows)
    spikes = [w["worst_s"] / steady for w in windows if w["worst_s"] is not None and steady]
    failed = sum(1 for r in rows if r.get("failed") and r.get("phase") not in ("pre_restart", "restart")) + failures
    out: dict[str, Any] = {
        "record": "summary", "system": system,
        "recovered_within_batches": max((s["recovered_within_batches"] for s in rec), default=None),
        "recovered_all_steps": all(s["recovered"] for s in rec) if rec else None,
        "rescale_spike_x": max(spikes) if spikes else None,
        "failed_batches": failed,
        "parallelism_min": min(ps) if ps else None, "parallelism_max": max(ps) if ps else None,
        "parallelism_by_step": [s["parallelism_end"] for s in by_step],
        "parallelism_follows_rate": _follows(by_step),
        "steady_median_s": steady, "trigger_interval_s": trigger_s,
        "latency_max_s": max((r["latency_s"] for r in steps), default=None),
        "batches": len(steps), "rescales": len(windows),
        "per_step": rec, "by_step": by_step,
        "per_rescale": [dict(w, spike_x=(w["worst_s"] / steady if w["worst_s"] is not None and steady else None))
                        for w in windows],
    }
    r = out["recovered_within_batches"]
    out["targets"] = {
        "recovered_within_5": None if r is None else bool(out["recovered_all_steps"] and r <= RECOVERED_TARGET),
        "parallelism_follows_rate": out["parallelism_follows_rate"],
        "no_failed_batch": failed == 0,
        "rescale_spike_at_most_2x": None if not windows else bool(spikes and len(spikes) == len(windows)
                                                                   and max(spikes) <= SPIKE_TARGET),
    }
    out["targets_met"] = all(v is True for v in out["targets"].values())
    if restart is not None:
        out["restart"] = {k: restart.get(k) for k in (
            "remedy_s", "stop_s", "restart_s", "first_batch_s", "state_load_s", "host_join_s", "executors_before",
            "executors_after", "state_partitions_before", "state_partitions_after", "latency_after_median_s",
            "kept_up_after")}
        if steady and restart.get("first_batch_s") is not None:
            out["restart"]["first_batch_x"] = restart["first_batch_s"] / steady
    return round_floats(out)


def _trigger_s(records: list[dict], system: str) -> Optional[float]:
    for r in records:
        if r.get("record") == "schedule" and r.get("system") == system and r.get("trigger_interval_s"):
            return float(r["trigger_interval_s"])
    for r in records:
        if r.get("record") == "setup":
            v = (r.get("parameters") or {}).get("trigger_interval_s")
            if v:
                return float(v)
    return None


def _last_schedule(records: list[dict], system: str) -> Optional[dict]:
    """The system's schedule as last written (Spark's remedy appends a segment)."""
    return next((r for r in reversed(records) if r.get("record") == "schedule" and r.get("system") == system), None)


def summarize(records: list[dict]) -> list[dict]:
    """One summary per system present in ``records``."""
    out = []
    for system in SYSTEMS:
        rows = [r for r in records if r.get("record") == "batch" and r.get("system") == system]
        if not rows:
            continue
        reconfs = [r for r in records if r.get("record") == "reconfiguration" and r.get("system") == system]
        restart = next((r for r in records if r.get("record") == "restart" and r.get("system") == system), None)
        failures = sum(1 for r in records if r.get("record") == "query_failed" and r.get("system") == system)
        out.append(summarize_system(system, rows, reconfs, _trigger_s(records, system) or 0.0, restart, failures))
    return out


# --------------------------------------------------------------------------- the plot


_COLORS = {"rhino": "#d04040", "spark-rocksdb": "#404040"}


def plot(records: list[dict], path: str) -> None:
    """Per system a column: the rate (planned, and what each batch read), the parallelism, the
    batch latency (the trigger interval dashed); each reconfiguration marked (its decision
    solid, the barriers of its steps dotted), Spark's restart shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in SYSTEMS if any(r.get("record") == "batch" and r.get("system") == s for r in records)]
    if not systems:
        return
    fig, axs = plt.subplots(3, len(systems), figsize=(7.5 * len(systems), 9), sharex="col", squeeze=False,
                            gridspec_kw={"height_ratios": [1, 0.8, 1.6]})
    for j, system in enumerate(systems):
        rows = sorted((r for r in records if r.get("record") == "batch" and r.get("system") == system),
                      key=lambda r: r["batch"])
        rows = [r for r in rows if r.get("t") is not None]
        sched = _last_schedule(records, system)
        trig = _trigger_s(records, system)
        ax_r, ax_p, ax_l = axs[0][j], axs[1][j], axs[2][j]
        color = _COLORS[system]
        # the rate: planned (the schedule's segments) and read (events over the time since the last batch)
        if sched and sched.get("segments_t"):
            segs = sched["segments_t"]
            xs, ys = [], []
            for i, (t, eps) in enumerate(segs):
                t_next = segs[i + 1][0] if i + 1 < len(segs) else (rows[-1]["t"] + rows[-1]["latency_s"]
                                                                   if rows else t)
                xs += [t, t_next]
                ys += [eps, eps]
            ax_r.plot(xs, ys, color="tab:blue", linewidth=1.5, label="arrival rate (schedule)")
        prev = None
        pts = []
        for r in rows:
            if prev is not None and r["t"] > prev["t"] and r.get("events"):
                pts.append((r["t"], r["events"] / (r["t"] - prev["t"])))
            prev = r
        if pts:
            ax_r.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, color=color, label="read per batch / interval")
        ax_r.set_ylabel("events/s")
        ax_r.set_title(f"{system}: NEXMark Q8, input rate steps" + (f", trigger {trig:g} s" if trig else ""),
                       fontsize=10)
        ax_r.legend(fontsize=7, loc="upper left")
        # the parallelism
        xs = [r["t"] for r in rows]
        ps = [r.get("parallelism") for r in rows]
        if rows:
            ax_p.step(xs + [xs[-1] + rows[-1]["latency_s"]], ps + [ps[-1]], where="post", color=color)
        ax_p.set_ylabel("parallelism" if system == "rhino" else "state partitions")
        top = max([p for p in ps if p is not None] or [1])
        ax_p.set_ylim(0, top + 1)
        # the latency: one bar per batch that read events, spanning its run; a failed one hatched
        bars = [r for r in rows if r.get("events")]
        bar_c = ["#b0b0b0" if r.get("phase") in ("warmup",) else "tab:orange"
                 if r.get("phase") in ("pre_restart", "restart") else color for r in bars]
        ax_l.bar([r["t"] for r in bars], [r["latency_s"] for r in bars],
                 width=[max(0.2, r["latency_s"]) for r in bars], align="edge", color=bar_c, edgecolor="white",
                 linewidth=0.3)
        failed = [r for r in bars if r.get("failed")]
        if failed:
            ax_l.bar([r["t"] for r in failed], [r["latency_s"] for r in failed],
                     width=[max(0.2, r["latency_s"]) for r in failed], align="edge", fill=False, hatch="xx",
                     edgecolor="black", linewidth=0.5, label="failed (run again)")
        if trig:
            ax_l.axhline(trig, color="black", linestyle="--", linewidth=1, label=f"trigger interval {trig:g} s")
        ax_l.set_ylabel("batch latency (s)")
        ax_l.set_xlabel("seconds since the query started (grey: warm-up; orange: Spark's restart phase)")
        # the reconfigurations
        for c in (r for r in records if r.get("record") == "reconfiguration" and r.get("system") == system):
            if c.get("decided_t") is not None:
                for ax in (ax_r, ax_p, ax_l):
                    ax.axvline(c["decided_t"], color="tab:purple", linewidth=1)
                ax_l.annotate(f"{c.get('action', '?')} {c.get('from')}->{c.get('to')}", (c["decided_t"], 1),
                              xycoords=("data", "axes fraction"), xytext=(2, -10), textcoords="offset points",
                              fontsize=7, color="tab:purple", rotation=90, va="top")
            for t in c.get("step_t") or []:
                if t is not None:
                    for ax in (ax_p, ax_l):
                        ax.axvline(t, color="tab:purple", linewidth=1, linestyle=":")
        rs = next((r for r in records if r.get("record") == "restart" and r.get("system") == system), None)
        if rs and rs.get("stop_t") is not None and rs.get("first_end_t") is not None:
            for ax in (ax_r, ax_p, ax_l):
                ax.axvspan(rs["stop_t"], rs["first_end_t"], color="tab:orange", alpha=0.15)
            ax_l.annotate(f"query stopped, restarted with more executors: {rs.get('remedy_s', 0):.1f} s",
                          (rs["stop_t"], 0.97), xycoords=("data", "axes fraction"), fontsize=7, va="top", ha="right")
        for st in (sched or {}).get("steps", []):
            for ax in (ax_r, ax_p, ax_l):
                ax.axvline(st["t"], color="tab:blue", linewidth=0.8, alpha=0.5)
        ax_l.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- the report


def _f(x: Any, d: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{d}f}"
    return str(x)


def _met(v: Optional[bool]) -> str:
    return "n/a" if v is None else ("**met**" if v else "**not met**")


def report(records: list[dict], path: str) -> None:
    setup = next((r for r in records[::-1] if r.get("record") == "setup"), {})
    command = setup.get("command", "")
    from rhino._machine import machine_summary

    summ = {s["system"]: s for s in summarize(records)}
    L = ["# Spark elastic: NEXMark Q8 while the input rate steps, Rhino's autoscaler vs Spark's RocksDB state store",
         "", f"Command: `{command}`", "",
         f"Run at {setup.get('started')} on {machine_summary(setup.get('machine', {}))}"
         + (f", load average at the start {setup.get('loadavg_1_5_15')}" if setup.get("loadavg_1_5_15") else "")
         + ".", "",
         "Parameters: " + ", ".join(f"{k}={v}" for k, v in (setup.get("parameters") or {}).items()), "",
         "Spark settings: " + (", ".join(f"`{k}={v}`" for k, v in (setup.get("spark_conf") or {}).items())
                               or "Spark's defaults") + " (besides the cluster's: one 1-core executor per host, "
         "`spark.sql.shuffle.partitions=3`; RocksDB state store provider with its defaults).", "",
         "Each system ran on a fresh local cluster: 3 hosts and a spare one (Rhino: joined before the query, "
         "for the autoscaler; Spark: joined for its remedy). Events arrive on a schedule; each batch reads what "
         "has arrived (a processing-time trigger), so a system that falls behind gets larger batches. Batch "
         "latency is Spark's `durationMs.triggerExecution` for both systems. Definitions: the docstring of "
         "`bench/rhino_bench/spark/elastic.py` and the `Spark elastic` section of `bench/README.md`.", ""]
    for c in (r for r in records if r.get("record") == "calibration"):
        L += [f"`--base-events auto`: one Rhino instance's true rate in the warm-up was "
              f"{_f(c.get('instance_events_per_s'), 0)} events/s ({_f(c.get('instance_records_per_s'), 0)} records/s "
              f"over busy time, {_f(c.get('events_per_record'), 1)} events per record), so 1x = "
              f"{c.get('base_load')} x that = **{c.get('base_events'):,} events per trigger interval**.", ""]
    for sc in filter(None, (_last_schedule(records, system) for system in SYSTEMS)):
        L += [f"{sc['system']}: steps " + ", ".join(f"{s['rate_x']:g}x ({s['events_per_s']:.0f} events/s) from "
                                                    f"t={s['t']:.0f} s" for s in sc.get("steps", []))
              + f"; the schedule ended at t={_f(sc.get('end_t'), 0)} s.", ""]
    L += ["## Summary", "",
          "| system | recovered within (batches) | all steps recovered | rescale spike | failed batches | "
          "parallelism min | max | by step | follows rate | steady median (s) | largest batch (s) | rescales |",
          "|---|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|"]
    for s in summ.values():
        spike = "-" if s["rescale_spike_x"] is None else f"{s['rescale_spike_x']:.2f}x"
        L.append(f"| {s['system']} | {_f(s['recovered_within_batches'])} | {_f(s['recovered_all_steps'])} | "
                 f"{spike} | {s['failed_batches']} | {_f(s['parallelism_min'])} | "
                 f"{_f(s['parallelism_max'])} | {s['parallelism_by_step']} | {_f(s['parallelism_follows_rate'])} | "
                 f"{_f(s['steady_median_s'])} | {_f(s['latency_max_s'])} | {s['rescales']} |")
    L += ["", "## Targets (reported, not asserted)", ""]
    for s in summ.values():
        t = s["targets"]
        L += [f"{s['system']}:", "",
              f"- back under the trigger interval ({_f(s['trigger_interval_s'], 1)} s) within {RECOVERED_TARGET} "
              f"batches after each step: worst {_f(s['recovered_within_batches'])}"
              f"{'' if s['recovered_all_steps'] in (True, None) else ' (a step ended still over it)'}: "
              f"{_met(t['recovered_within_5'])}",
              f"- parallelism follows the rate (each step's last batch): {s['parallelism_by_step']}: "
              f"{_met(t['parallelism_follows_rate'])}",
              f"- no batch fails: {s['failed_batches']} failed: {_met(t['no_failed_batch'])}",
              f"- each rescale's largest batch <= {SPIKE_TARGET:g}x the steady median ({_f(s['steady_median_s'])} s): "
              + (", ".join(f"{w['action']} {w['from']}->{w['to']} {_f(w['spike_x'])}x (batch {w['worst_batch']})"
                           for w in s["per_rescale"]) or "no rescale")
              + f": {_met(t['rescale_spike_at_most_2x'])}", ""]
        if s.get("per_step"):
            L += ["| step | rate | batches | recovered within | recovered | largest batch (s) | parallelism at its end |",
                  "|---:|---:|---:|---:|---|---:|---:|"]
            for p in s["per_step"]:
                L.append(f"| {p['step']} | {_f(p['rate_x'], 1)}x | {p['batches']} | {p['recovered_within_batches']} | "
                         f"{_f(p['recovered'])} | {_f(p['latency_max_s'])} | {_f(p['parallelism_end'])} |")
            L.append("")
    reconfs = [r for r in records if r.get("record") == "reconfiguration"]
    if reconfs:
        L += ["## Reconfigurations (the autoscaler's decisions and their plans)", "",
              "| system | decided on batch | t (s) | action | plan | strategy | steps at the barriers of batches | "
              "step seconds | bytes copied | reason |", "|---|---:|---:|---|---:|---|---|---|---:|---|"]
        for c in reconfs:
            L.append(f"| {c['system']} | {_f(c.get('decided_batch'))} | {_f(c.get('decided_t'), 1)} | "
                     f"{c.get('action')} {c.get('from')}->{c.get('to')} | {_f(c.get('plan'))} | {_f(c.get('strategy'))} | "
                     f"{c.get('step_batches')} | {c.get('step_seconds')} | {_f(c.get('bytes_copied'))} | "
                     f"{str(c.get('reason') or c.get('error') or '')[:300]} |")
        L.append("")
    for rs in (r for r in records if r.get("record") == "restart"):
        L += ["## Spark's remedy: stop the query, restart it with more executors, same state partitions", "",
              f"After the steps, state {_f((rs.get('state_bytes_at_stop') or 0) / 2**20, 1)} MiB (RocksDB SST "
              f"files). The spare host joined first, while nothing arrived ({_f(rs.get('host_join_s'), 1)} s, not "
              f"counted): executors {rs.get('executors_before')} -> {rs.get('executors_after')}. Then the query was "
              f"stopped ({'caught up' if rs.get('caught_up_at_stop') else 'still behind: a batch in flight was cut'}) "
              f"and started again from its checkpoint, with events arriving at the peak rate "
              f"({_f(rs.get('rate_x'), 1)}x) from the stop request on; state partitions "
              f"{rs.get('state_partitions_before')} -> {rs.get('state_partitions_after')}.", "",
              f"- `stop_s` (query.stop()): {_f(rs.get('stop_s'))} s",
              f"- `restart_s` (start() of the new query to the end of its first batch): {_f(rs.get('restart_s'))} s; "
              f"that batch {rs.get('first_batch')}: {_f(rs.get('first_batch_s'))} s, {rs.get('first_batch_events')} "
              f"events, state load {_f(rs.get('state_load_s'))} s ({rs.get('stores_loaded_from_dfs')} stores "
              f"loaded from the checkpoint)",
              f"- **`remedy_s`** (the stop request to the end of the first batch after the restart: the query's "
              f"outage): **{_f(rs.get('remedy_s'))} s**",
              f"- then {rs.get('batches_after')} more batch(es) at the peak rate: latency median "
              f"{_f(rs.get('latency_after_median_s'))} s against the trigger interval {_f(rs.get('trigger_interval_s'), 1)} "
              f"s: {'kept up' if rs.get('kept_up_after') else 'still behind'} "
              f"({', '.join(_f(x) for x in rs.get('latencies_after_s') or [])} s)", ""]
    for system in SYSTEMS:
        rows = sorted((r for r in records if r.get("record") == "batch" and r.get("system") == system),
                      key=lambda r: r["batch"])
        if not rows:
            continue
        L += [f"## {system}: every batch", "",
              "| batch | t (s) | phase | step | rate | events | latency (s) | oldest event age (s) | parallelism | "
              "failed | autoscaler |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in rows:
            d = r.get("decision") or {}
            dec = (f"{d.get('action')} {d.get('from')}->{d.get('to')}" if d.get("action") not in (None, "hold")
                   else ("hold" if d else ""))
            L.append(f"| {r['batch']} | {_f(r.get('t'), 1)} | {r.get('phase')} | {_f(r.get('step'))} | "
                     f"{_f(r.get('rate_x'), 1)} | {_f(r.get('events'))} | {_f(r.get('latency_s'))} | "
                     f"{_f(r.get('oldest_event_age_s'))} | {_f(r.get('parallelism'))} | "
                     f"{'yes' if r.get('failed') else ''} | {dec} |")
        L.append("")
    for q in (r for r in records if r.get("record") == "query_failed"):
        L += [f"**{q.get('system')}: the query failed**: {q.get('error')}", ""]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(L))


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


# --------------------------------------------------------------------------- main


def _scenario() -> Elastic:
    return Elastic(summarize=summarize, report=report, plot=plot)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(_scenario(), argv)


if __name__ == "__main__":
    sys.exit(main())
