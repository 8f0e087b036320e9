"""The `rhino` command line: argument parsing and dispatch only.

  rhino version
  rhino inspect PATH [--json] [--exact]
  rhino inspect --operator OP --coordinator HOST:PORT --secret-file FILE [--batch N] [--json]
  rhino verify STORE [--operator OP [--instance N]] [--quick] [--json]
  rhino restore STORE TARGET --operator OP --instance N [--checkpoint ID] [--copy]
  rhino worker --id ID --dir DIR --listen 127.0.0.N:PORT --secret-file FILE [--coordinator HOST:PORT] ...
  rhino coordinator --listen HOST:PORT --dir DIR --secret-file FILE [--rebuild --expect-workers N]
  rhino credential task --namespace NS --secret-file FILE --out CREDENTIAL
  rhino status | handover | rebalance | rescale | cancel-plan | decommission | autoscale | drop | swap ... --coordinator HOST:PORT --secret-file FILE

The benchmarks and the demo are not part of the library: they are the repository's
``rhino-bench`` command (bench/).

User errors (a missing path, a bad size, any rhino.RhinoError) print one line
on stderr and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

from .._argtypes import uint32, uint64

EXIT_USAGE = 2


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
    from ..errors import InvalidArgumentError

    if (args.path is None) == (args.operator is None):
        raise InvalidArgumentError("rhino inspect takes PATH or --operator OP, not both" if args.path is not None
                                   else "rhino inspect needs PATH, or --operator OP (with --coordinator)")
    if args.operator is not None:
        from .state import format_state, inspect_operator

        report = inspect_operator(args)
        print(json.dumps(report, indent=2) if args.json else format_state(report))
        return 0
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


# Subcommands that own their argument parsing (their modules have main(argv)).
_DELEGATED = {
    ("worker",): ("rhino.daemon.worker", "the worker daemon: replica store and data-plane server of one host"),
    ("coordinator",): ("rhino.coordinator.server", "the coordinator: Replication and Handover Managers, as a process"),
    ("status",): ("rhino.cli.control:main_status", "workers, instances, chains, replica lag, epochs, plans in flight"),
    ("handover",): ("rhino.cli.control:main_handover", "move vnodes to an instance at the next batch barrier"),
    ("rebalance",): ("rhino.cli.control:main_rebalance", "rebalance replicas, and vnodes by measured load"),
    ("rescale",): ("rhino.cli.control:main_rescale", "change an operator's parallelism by vnode handovers"),
    ("cancel-plan",): ("rhino.cli.control:main_cancel_plan", "cancel an operator's open plan between two of its steps"),
    ("decommission",): ("rhino.cli.control:main_decommission", "move everything off a worker before it is taken away"),
    ("autoscale",): ("rhino.cli.control:main_autoscale", "turn an operator's autoscaler on or off (DS2-style, rate-based)"),
    ("drop",): ("rhino.cli.control:main_drop", "drop an operator: its state on every worker and its metadata"),
    ("swap",): ("rhino.cli.swap:main_swap", "replace a running operator's processor at its next batch barrier"),
    ("certs",): ("rhino.cli.certs", "a CA and per-host certificates for trying mutual TLS out"),
    ("credential",): ("rhino.cli.credential", "one role's credential from the root secret (e.g. a Spark job's task "
                                              "credential)"),
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

    p = sub.add_parser("inspect", help="vnodes, key counts, sizes and checkpoints of a state dir or replica store; "
                                       "an operator's state variables and entry counts",
                       description="PATH is a live state directory (RocksDB, has CURRENT; opened read-only), "
                                   "a replica store (has pool/ and checkpoints/), or a directory holding "
                                   "live/ and store/ (what `rhino-bench demo --data-plane` creates). "
                                   "With --operator OP (and --coordinator, --secret-file) instead: the state "
                                   "variables of a rhino.spark operator (name, kind, id, schema, TTL, schema "
                                   "version) from the coordinator, and their entry counts in a committed "
                                   "checkpoint, read from the workers' replica stores (no query needs to run). "
                                   "That form imports rhino.spark's state layout (rhino.spark.state.reader) "
                                   "when it runs; it does not need PySpark.")
    p.add_argument("path", metavar="PATH", nargs="?")
    p.add_argument("--operator", metavar="OP", help="a rhino.spark operator: its state variables and entry counts")
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help="with --operator: the coordinator (default: $RHINO_COORDINATOR)")
    p.add_argument("--secret-file", metavar="FILE",
                   help="with --operator: the cluster's shared secret (default: $RHINO_SECRET_FILE)")
    p.add_argument("--batch", type=uint64, metavar="N",
                   help="with --operator: the committed batch whose checkpoint is counted (default: the last)")
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

    # Listed for --help; main() hands their arguments to their own parsers.
    sub.add_parser("worker", help=_DELEGATED[("worker",)][1] + " (rhino worker --help)", add_help=False)
    for name in ("coordinator", "status", "handover", "rebalance", "rescale", "cancel-plan", "decommission",
                 "autoscale", "drop", "swap", "certs", "credential"):
        sub.add_parser(name, help=_DELEGATED[(name,)][1] + f" (rhino {name} --help)", add_help=False)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        delegated = _delegate(argv)
    except KeyboardInterrupt:
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
