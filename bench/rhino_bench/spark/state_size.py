"""``rhino-bench spark state-size``: the cost of a micro-batch that touches one key holding a
large MapState or ListState, Rhino against Spark's own ``transformWithStateInPandas`` with
the RocksDB state store provider, in the same run, with the same processor object.

    rhino-bench spark state-size --json --out bench/results/state_size.jsonl \
        --plot bench/results/state_size.png --report bench/results/state_size.md

How it runs and what each record holds: bench/README.md, "Large per-key state".
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import BenchRun, RhinoCluster, Scenario, bench_main, spark_flags, spark_session, start_rhino
from ..report import choices
from .common import ROCKSDB_PROVIDER, non_negative_int, positive_float, positive_int, say
from .state_size_report import plot, report, summarize
from .state_size_run import DirBytes, measurement, run_once
from .state_size_workload import (BIG_KEY, KINDS, OP_TOUCH, SYSTEMS, TARGET_FLAT, BigKeyProcessor,
                                  plan_batches, write_inputs)

__all__ = ["main", "BigKeyProcessor", "plan_batches", "summarize", "SYSTEMS", "KINDS", "TARGET_FLAT",
           "DirBytes", "parse_entries", "BIG_KEY", "OP_TOUCH"]

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
        ap.add_argument("--kinds", type=choices(KINDS, "kind"), default=list(KINDS), help="map,list (default both)")
        ap.add_argument("--systems", type=choices(SYSTEMS, "system"), default=list(SYSTEMS),
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
