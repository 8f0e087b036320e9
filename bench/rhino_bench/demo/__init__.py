"""``rhino-bench demo`` (``make demo``): NEXMark Q8 on a local Spark + Rhino cluster that changes
under the running query: a host joins, the query is rescaled 3->4, a host is decommissioned and a
host SIGKILLed (:mod:`.spark`; ``--kill-only``: the SIGKILL alone); ``--data-plane``: the
single-host demonstration of the core and the data plane (:mod:`.dataplane`)."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(argv or [])
    if "--data-plane" not in argv:
        from .spark import main as spark_demo

        return int(spark_demo(argv) or 0)
    from rhino._sizes import parse_size

    from .dataplane import run_demo

    p = argparse.ArgumentParser(prog="rhino-bench demo --data-plane",
                                description="The data-plane demonstration: build, checkpoint, replicate, "
                                            "restore, verify on one host.")
    p.add_argument("--data-plane", action="store_true", required=True)
    p.add_argument("--dir", default=".demo", help="work directory, removed and recreated (default: %(default)s)")
    p.add_argument("--size", default="384M", help="state size (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        size = parse_size(args.size)
    except ValueError as e:
        p.error(str(e))
    return run_demo(args.dir, size)
