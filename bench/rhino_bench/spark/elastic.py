"""``rhino-bench spark elastic``: NEXMark Q8 while its input rate steps 1x -> 3x -> 1x, on
Rhino with the coordinator's autoscaler against Spark's own ``transformWithStateInPandas``
with the RocksDB state store, which cannot rescale its state (issue 29, Build 5).

    rhino-bench spark elastic --json --out bench/results/spark_elastic.jsonl \
        --report bench/results/spark_elastic.md --plot bench/results/spark_elastic.png

How it runs and what each record holds: bench/README.md, "Elasticity: the input rate steps".
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Optional, Sequence


from ..frame import BenchRun, Scenario, bench_main, parser
from ..report import choices
from .common import host_number, loadavg, non_negative_int, positive_float, positive_int, say
from .elastic_report import (RECOVERED_TARGET, SPIKE_TARGET, SYSTEMS, plot, report, rescale_windows, step_recovery,
                             summarize, summarize_system)
from .elastic_run import HOSTS, run_system

__all__ = ["main", "build_parser", "summarize", "summarize_system", "step_recovery", "rescale_windows", "plot",
           "report", "SYSTEMS", "RECOVERED_TARGET", "SPIKE_TARGET"]

_ALIASES = {"rhino": "rhino", "spark": "spark-rocksdb", "spark-rocksdb": "spark-rocksdb"}
STRATEGIES = ("all-at-once", "fluid", "batched")


# --------------------------------------------------------------------------- arguments


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
    ap.add_argument("--systems", type=choices(SYSTEMS, "system", _ALIASES, in_order=True), default=list(SYSTEMS),
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


# --------------------------------------------------------------------------- main


def _scenario() -> Elastic:
    return Elastic(summarize=summarize, report=report, plot=plot)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(_scenario(), argv)
