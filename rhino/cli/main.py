"""The `rhino` command line: argument parsing and dispatch only.

  rhino version
  rhino inspect PATH [--json] [--exact]
  rhino bench restore --sizes 256M,1G,4G [--json] [--dir D] [--out FILE] ...
  rhino bench replicate --workers 3 --replicas 1,2 --size 2G [--json] ...
  rhino bench overhead [--pairs 3] [--duration 16] [--checkpoint-interval 2] [--json] [--out FILE] ...
  rhino bench handover [--strategies all-at-once,fluid,batched] [--state 256M] [--repeat 2] [--json] ...
  rhino bench failover --sizes 1G,2G,4G [--json] [--out FILE] ...
  rhino worker --id ID --dir DIR --listen 127.0.0.N:PORT --secret-file FILE [--coordinator HOST:PORT] ...
  rhino coordinator --listen HOST:PORT --dir DIR --secret-file FILE [--rebuild --expect-workers N]
  rhino status | handover | rebalance | rescale ... --coordinator HOST:PORT --secret-file FILE
  rhino spark bench recovery|throughput ... | rhino spark demo ...   (the Spark layer: rhino.spark.cli)
  rhino demo [--data-plane] [--dir D] [--size 384M]

User errors (a missing path, a bad size, any rhino.RhinoError) print one line
on stderr and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional, Sequence

from .._argtypes import uint32, uint64

EXIT_USAGE = 2


def _size(text: str) -> int:
    from .._sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sizes(text: str) -> list[int]:
    from .._sizes import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def cmd_version(args: argparse.Namespace) -> int:
    import rhino
    from rhino import _core
    from .._machine import loaded_library

    print(f"rhino {rhino.__version__}")
    print(f"python {sys.version.split()[0]} ({sys.executable})")
    print(f"_core {os.path.realpath(_core.__file__)}")
    shared = loaded_library("librocksdb")
    print(f"rocksdb {_core.ROCKSDB_VERSION}, {_core.ROCKSDB_BUILD}" + (f" [{shared}]" if shared else ""))
    print(f"crc32c {_core.ROCKSDB_CRC32C}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..inspection import format_report, inspect_path

    report = inspect_path(args.path, exact=args.exact)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import format_verify, verify_store

    result = verify_store(args.path, operator_id=args.operator, instance=args.instance, full=not args.quick,
                          progress=not (args.quiet or args.json))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_verify(result))
    return 0 if result["ok"] else 1


def cmd_restore(args: argparse.Namespace) -> int:
    from .restore import format_restore, restore_checkpoint

    result = restore_checkpoint(args.path, args.target, operator_id=args.operator, instance=args.instance,
                                checkpoint_id=args.checkpoint, copy=args.copy, full_verify=args.full_verify,
                                progress=not (args.quiet or args.json))
    print(json.dumps(result, indent=2) if args.json else format_restore(result))
    return 0


def cmd_bench_restore(args: argparse.Namespace) -> int:
    from ..bench.restore import run

    command = "rhino " + " ".join(shlex.quote(a) for a in args.argv)
    run(args.sizes, base_dir=args.dir, value_size=args.value_size, repeats=args.repeats,
        compaction=args.compaction, keep=args.keep,
        use_drop_caches=not args.no_drop_caches, json_lines=args.json, out_file=args.out, command=command)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.data_plane:
        from .demo import run_demo

        return run_demo(args.dir or ".demo", args.size or _size("384M"))
    # The main job: NEXMark Q8 on a local 3-host Spark + Rhino cluster, surviving a killed host.
    from ..spark.demo import main as spark_demo

    extra = ["--dir", args.dir] if args.dir else []
    if args.size:
        extra += ["--state", str(args.size)]
    return int(spark_demo(extra) or 0)


# Subcommands that own their argument parsing (their modules have main(argv)).
_DELEGATED = {
    ("worker",): ("rhino.daemon.worker", "the worker daemon: replica store and data-plane server of one host"),
    ("coordinator",): ("rhino.coordinator.server", "the coordinator: Replication and Handover Managers, as a process"),
    ("status",): ("rhino.cli.control:main_status", "workers, instances, chains, replica lag, epochs, plans in flight"),
    ("handover",): ("rhino.cli.control:main_handover", "move vnodes to an instance at the next batch barrier"),
    ("rebalance",): ("rhino.cli.control:main_rebalance", "rebalance replicas, and vnodes by measured load"),
    ("rescale",): ("rhino.cli.control:main_rescale", "change an operator's parallelism by vnode handovers"),
    ("spark",): ("rhino.spark.cli", "the Spark layer: bench recovery | bench throughput | demo (rhino spark --help)"),
    ("bench", "replicate"): ("rhino.bench.replicate",
                             "chain-replication throughput vs the disk and loopback limits, same run"),
    ("bench", "overhead"): ("rhino.bench.overhead",
                            "a primary's writes/s while its checkpoints replicate (r=2) vs r=0, same run"),
    ("bench", "service"): ("rhino.bench.service",
                           "sessions over the Unix socket and TCP vs in-process StateBackend, and the per-batch "
                           "fixed cost at r=0 and r=2, same run"),
    ("bench", "handover"): ("rhino.bench.handover",
                            "the writer's batch latency while vnodes move to a new instance, per migration strategy"),
    ("bench", "failover"): ("rhino.bench.failover",
                            "recovery after a SIGKILL: takeover by hard links vs a DFS-style full fetch, per size"),
}


def _delegate(argv: list[str]) -> Optional[int]:
    for prefix, (module, _) in _DELEGATED.items():
        if tuple(argv[: len(prefix)]) == prefix:
            import importlib

            name, _, func = module.partition(":")
            return int(getattr(importlib.import_module(name), func or "main")(argv[len(prefix):]) or 0)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rhino",
        description="Rhino: keyed RocksDB state of PySpark jobs, checkpointed incrementally and "
                    "restored by hard links.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("version", help="package version, the _core module, and the RocksDB it was built with")
    p.set_defaults(func=cmd_version)

    p = sub.add_parser("inspect", help="vnodes, key counts, sizes and checkpoints of a state dir or replica store",
                       description="PATH is a live state directory (RocksDB, has CURRENT; opened read-only), "
                                   "a replica store (has pool/ and checkpoints/), or a directory holding "
                                   "live/ and store/ (what `rhino demo` creates).")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--exact", action="store_true",
                   help="count keys exactly by scanning every vnode (default: RocksDB estimates)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="re-check a replica store's committed checkpoints (sizes and checksums)",
                       description="Checks every file of every committed checkpoint in the replica store at "
                                   "STORE against its manifest: present in the pool, of the recorded size and "
                                   "(unless --quick) of the recorded XXH3-128 checksum. A file shared by several "
                                   "checkpoints is read once. Progress goes to stderr. Exit status: 0 when "
                                   "everything is intact, 1 when a problem was found, 2 for a bad path or "
                                   "selection. Safe while a worker serves the store.")
    p.add_argument("path", metavar="STORE", help="a replica store (a worker's --dir)")
    p.add_argument("--operator", metavar="OP", help="only this operator's instances")
    p.add_argument("--instance", type=uint32, metavar="N", help="only this instance (needs --operator)")
    p.add_argument("--quick", action="store_true",
                   help="check presence and sizes only, O(files), without reading the data")
    p.add_argument("--json", action="store_true", help="print the result as JSON (no progress lines)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("restore", help="build a checkpoint's RocksDB directory from a replica store (hard links)",
                       description="Restores one checkpoint of one instance from the replica store at STORE "
                                   "into TARGET (which must not exist), as a new owner would: hard links by "
                                   "default, an independent copy with --copy. Every file is checked first "
                                   "(size; with --full-verify also its checksum). TARGET appears whole or not "
                                   "at all; Ctrl-C stops it and leaves nothing.")
    p.add_argument("path", metavar="STORE", help="a replica store (a worker's --dir)")
    p.add_argument("target", metavar="TARGET", help="the RocksDB directory to create")
    p.add_argument("--operator", required=True, metavar="OP")
    p.add_argument("--instance", required=True, type=uint32, metavar="N")
    p.add_argument("--checkpoint", type=uint64, metavar="ID", help="checkpoint id (default: the newest committed)")
    p.add_argument("--copy", action="store_true", help="copy the files instead of hard-linking them")
    p.add_argument("--full-verify", action="store_true", help="re-hash every file before placing it")
    p.add_argument("--json", action="store_true", help="print the result as JSON (no progress lines)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_restore)

    bench = sub.add_parser("bench", help="benchmarks")
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    bsub.required = True
    p = bsub.add_parser("restore", help="hard-link restore vs copy restore vs cp -al, per state size",
                        description="For each size: build a state and checkpoint it right away, and time "
                                    "hard-link restores of that checkpoint; then let compactions drain, "
                                    "checkpoint again, and time hard-link restore, copy restore and `cp -al` "
                                    "of the same files, all in the same run. Prints one JSON object per size "
                                    "with --json.")
    p.add_argument("--sizes", type=_sizes, required=True, metavar="LIST",
                   help="comma-separated state sizes, e.g. 256M,1G,4G (K/M/G/T are powers of 1024)")
    p.add_argument("--json", action="store_true", help="one JSON object per line and per size on stdout")
    p.add_argument("--dir", default=".bench-restore", help="work directory (default: %(default)s)")
    p.add_argument("--out", metavar="FILE", help="also append the JSON lines to FILE")
    p.add_argument("--value-size", type=_positive_int, default=1024, help="bytes per value (default: %(default)s)")
    p.add_argument("--repeats", type=_positive_int, default=5,
                   help="timed runs per measurement; the median is reported (default: %(default)s)")
    p.add_argument("--compaction", choices=["level", "universal"], default="level",
                   help="compaction style of the state's vnodes (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the state, store and restored directories")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the page cache before timed runs (it is dropped when we may)")
    p.set_defaults(func=cmd_bench_restore)

    # Listed for --help; main() hands their arguments to their own parsers.
    sub.add_parser("worker", help=_DELEGATED[("worker",)][1] + " (rhino worker --help)", add_help=False)
    for name in ("coordinator", "status", "handover", "rebalance", "rescale", "spark"):
        sub.add_parser(name, help=_DELEGATED[(name,)][1] + f" (rhino {name} --help)", add_help=False)
    bsub.add_parser("replicate", help=_DELEGATED[("bench", "replicate")][1] + " (rhino bench replicate --help)",
                    add_help=False)
    bsub.add_parser("overhead", help=_DELEGATED[("bench", "overhead")][1] + " (rhino bench overhead --help)",
                    add_help=False)
    bsub.add_parser("service", help=_DELEGATED[("bench", "service")][1] + " (rhino bench service --help)",
                    add_help=False)
    for name in ("handover", "failover"):
        bsub.add_parser(name, help=_DELEGATED[("bench", name)][1] + f" (rhino bench {name} --help)", add_help=False)

    p = sub.add_parser("demo", help="NEXMark Q8 on a local 3-host Spark + Rhino cluster with a host killed "
                                    "mid-run (--data-plane: the single-host data-plane demonstration)")
    p.add_argument("--data-plane", action="store_true",
                   help="the data-plane demonstration: build, checkpoint, replicate, restore, verify on one host")
    p.add_argument("--dir", default=None,
                   help="work directory, removed and recreated (default: .demo, or .demo-spark for the Spark demo)")
    p.add_argument("--size", type=_size, default=None,
                   help="state size, e.g. 384M (data plane default: 384M; Spark demo: see rhino spark demo --help)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        delegated = _delegate(argv)
    except KeyboardInterrupt:  # the benchmarks have stopped their workers on the way out
        print("rhino: interrupted", file=sys.stderr)
        return 130
    except ImportError as e:  # the extension is not built: say so, no traceback
        print(f"rhino: error: cannot import the compiled core ({e}); run `make setup`", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - a Rhino error mid-run: its message, no traceback
        from ..errors import RhinoError

        if not isinstance(e, RhinoError):
            raise
        print(f"rhino: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if delegated is not None:
        return delegated
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        from ..errors import RhinoError
    except ImportError as e:  # the extension is not built: say so, no traceback
        print(f"rhino: error: cannot import the compiled core ({e}); run `make setup`", file=sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except RhinoError as e:
        print(f"rhino: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # e.g. a permission problem or a full disk in Python code
        print(f"rhino: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("rhino: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
