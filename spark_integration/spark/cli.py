"""``rhino spark ...``: the Spark layer's commands (dispatch only).

  rhino spark demo [--dir D] [--state 256M] ...          NEXMark Q8, 3 hosts, a host killed mid-run
  rhino spark bench recovery --sizes 1G,2G,4G [--json]    recovery after a host loss: Rhino vs Spark's RocksDB store
  rhino spark bench throughput [--json]                   Q8 steady state: Rhino r=0, r=2, Spark's RocksDB store
  rhino spark cluster up|down|status|kill-host|restart-host ...   the local multi-host harness
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

_COMMANDS = {
    ("demo",): "rhino.spark.demo",
    ("bench", "recovery"): "rhino.spark.bench.recovery",
    ("bench", "throughput"): "rhino.spark.bench.throughput",
    ("cluster",): "rhino.spark.cluster",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for prefix, module in _COMMANDS.items():
        if tuple(argv[: len(prefix)]) == prefix:
            from . import require_pyspark

            require_pyspark()
            return int(importlib.import_module(module).main(argv[len(prefix):]) or 0)
    print(__doc__.strip(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if argv and argv[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
