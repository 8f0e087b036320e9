"""The ``rhino-bench`` command: Rhino's benchmarks, the demo and the local-cluster harness.

  rhino-bench restore --sizes 256M,1G,4G [--json] [--dir D] [--out FILE] ...
  rhino-bench replicate --workers 3 --replicas 1,2 --size 2G [--json] ...
  rhino-bench overhead [--pairs 3] [--duration 16] [--checkpoint-interval 2] [--json] ...
  rhino-bench service [--json] [--repeat 25] [--fixed-reps 50] ...
  rhino-bench handover [--strategies all-at-once,fluid,batched] [--state 256M] [--repeat 2] [--json] ...
  rhino-bench failover --sizes 1G,2G,4G [--json] [--out FILE] ...
  rhino-bench takeover-open [--size 1.5G] [--repeat 5] [--json] ...   a takeover's restore, with and without fsyncs
  rhino-bench spark recovery|throughput ...         NEXMark Q8 on Rhino vs Spark's own operator
  rhino-bench spark state-size [--entries 1k,100k,1M] [--kinds map,list] [--json] ...   one big key, both systems
  rhino-bench spark big-key [--size 1G] [--json] ...   1 GiB of MapState: written, read, handed over
  rhino-bench spark output [--input-rows 2000000] [--json] ...   10 rows out per row in: rows/s, driver and worker RSS
  rhino-bench spark initial-state [--keys 10M] [--json] ...   loading N keys as initial state, both systems
  rhino-bench spark glue [--keys 1000000] [--mode both] [--profile] ...   the task's per-key cost around the processor
  rhino-bench spark elastic [--rates 1,3,1] [--strategy all-at-once] [--json] ...   the rate steps; Rhino's autoscaler
  rhino-bench spark modify [--size 1G] [--routes swap,spark-restart-changelog] [--json] ...   a code change, both systems
  rhino-bench demo [--kill-only] [--state 256M] [--dir D]   (--data-plane [--size 384M]: one host)
  rhino-bench cluster up|down|status|kill-host|restart-host ...   the local 3-host Spark + Rhino cluster

Every subcommand has --help. Results and the commands that made them are in bench/results/
(bench/README.md). This package is not part of the ``rhino-state`` wheel: it is the
repository's development tooling, installed into the development venv by ``make setup``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

EXIT_USAGE = 2

# Subcommands whose modules parse their own arguments (main(argv)), with one line of help each.
_DELEGATED = {
    ("restore",): ("rhino_bench.restore", "hard-link restore vs copy restore vs cp -al, per state size"),
    ("replicate",): ("rhino_bench.replicate", "chain-replication throughput vs the disk and loopback limits"),
    ("overhead",): ("rhino_bench.overhead", "a primary's writes/s while its checkpoints replicate (r=2) vs r=0"),
    ("service",): ("rhino_bench.service", "sessions over the Unix socket and TCP vs in-process StateBackend, "
                                          "and the per-batch fixed cost at r=0 and r=2"),
    ("handover",): ("rhino_bench.handover", "the writer's batch latency while vnodes move, per migration strategy"),
    ("failover",): ("rhino_bench.failover", "recovery after a SIGKILL: takeover by hard links vs a DFS-style fetch"),
    ("takeover-open",): ("rhino_bench.takeover_open", "a takeover's restore (build + RocksDB open) with and without "
                                                      "fsyncs, quiet and under fsync-heavy writers"),
    ("spark", "recovery"): ("rhino_bench.spark.recovery",
                            "NEXMark Q8 host-loss recovery: Rhino vs Spark's RocksDB state store"),
    ("spark", "throughput"): ("rhino_bench.spark.throughput",
                              "NEXMark Q8 steady state: Rhino r=0, r=2 and Spark's RocksDB state store"),
    ("spark", "state-size"): ("rhino_bench.spark.state_size",
                              "one touch per batch of a key holding N MapState / ListState entries: Rhino vs "
                              "Spark's RocksDB state store"),
    ("spark", "big-key"): ("rhino_bench.spark.big_key", "one key with 1 GiB of MapState: written, read back, handed over"),
    ("spark", "output"): ("rhino_bench.spark.output",
                          "a stateful operator emitting 10 rows per input row: output rows/s, the driver's RSS and "
                          "the Python workers' peak RSS, Rhino vs Spark's RocksDB state store"),
    ("spark", "initial-state"): ("rhino_bench.spark.initial_state",
                                 "loading N keys as a new query's initial state: Rhino vs Spark's RocksDB state store"),
    ("spark", "glue"): ("rhino_bench.spark.glue",
                        "the per-key cost of rhino.spark's task around the processor, at 1M keys per batch, "
                        "with its profile and the floor pandas sets"),
    ("spark", "modify"): ("rhino_bench.spark.modify",
                          "changing a running Q8's code: Rhino's live processor swap vs Spark's restart"),
    ("spark", "elastic"): ("rhino_bench.spark.elastic",
                           "NEXMark Q8 while the input rate steps 1x -> 3x -> 1x: Rhino with the autoscaler vs "
                           "Spark's RocksDB state store, and Spark's remedy (a restart with more executors) timed"),
    ("demo",): ("rhino_bench.demo:main", "NEXMark Q8 on a local Spark + Rhino cluster while a host joins, the "
                                         "query is rescaled 3->4, a host is decommissioned and one killed "
                                         "(--kill-only: the kill alone; --data-plane: the single-host data-plane "
                                         "demonstration)"),
    ("cluster",): ("rhino_testing.harness.spark_cluster", "the local multi-host Spark + Rhino cluster"),
}

_SPARK = {"spark", "demo", "cluster"}


def _usage(file=sys.stdout) -> None:
    print(__doc__.strip(), file=file)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _usage(sys.stdout if argv else sys.stderr)
        return 0 if argv else EXIT_USAGE
    for prefix, (target, _) in _DELEGATED.items():
        if tuple(argv[: len(prefix)]) != prefix:
            continue
        name, _, func = target.partition(":")
        try:
            if prefix[0] in _SPARK and "--data-plane" not in argv:
                from rhino.spark import require_pyspark

                require_pyspark()
            module = importlib.import_module(name)
            return int(getattr(module, func or "main")(argv[len(prefix):]) or 0)
        except KeyboardInterrupt:  # the benchmarks have stopped their workers on the way out
            print("rhino-bench: interrupted", file=sys.stderr)
            return 130
        except ImportError as e:  # the extension is not built, or PySpark is missing: say so
            print(f"rhino-bench: error: {e}; run `make setup`", file=sys.stderr)
            return EXIT_USAGE
        except Exception as e:  # noqa: BLE001 - a Rhino error mid-run: its message, no traceback
            from rhino.errors import RhinoError

            if not isinstance(e, RhinoError):
                raise
            print(f"rhino-bench: error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    if argv[0] == "spark":
        print("rhino-bench spark: expected one of: recovery, throughput, state-size, big-key, output, initial-state, "
              "modify, elastic, glue", file=sys.stderr)
    else:
        print(f"rhino-bench: unknown command {argv[0]!r}", file=sys.stderr)
    _usage(sys.stderr)
    return EXIT_USAGE


def help_lines() -> list[str]:
    """One line per subcommand, for docs and --help tests."""
    return [f"rhino-bench {' '.join(p)}: {h}" for p, (_, h) in _DELEGATED.items()]


if __name__ == "__main__":
    sys.exit(main())
