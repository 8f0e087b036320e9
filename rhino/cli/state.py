"""``rhino inspect --operator OP``: the state variables of a rhino.spark operator
(name, kind, id, schema, TTL, schema version) and their entry counts in a
committed checkpoint.

The variables come from the operator's state schema document at the
coordinator; the counts from the checkpoint itself, read on a worker whose
replica store holds it (its primary, else a chain member), one scan per
variable head and instance. The state layout is rhino.spark's
(``rhino.spark.state.reader``), imported here only when this command runs; it
needs neither PySpark nor a running query.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["inspect_operator", "format_state"]


def inspect_operator(args: argparse.Namespace) -> dict[str, Any]:
    from ..coordinator.client import connect_coordinator
    from ..errors import InvalidArgumentError
    from ..replication import read_secret_file

    coordinator = args.coordinator or os.environ.get("RHINO_COORDINATOR")
    secret_file = args.secret_file or os.environ.get("RHINO_SECRET_FILE")
    if not coordinator:
        raise InvalidArgumentError("--operator needs a coordinator: pass --coordinator HOST:PORT or set "
                                   "RHINO_COORDINATOR")
    if not secret_file:
        raise InvalidArgumentError("--operator needs the cluster's secret: pass --secret-file FILE or set "
                                   "RHINO_SECRET_FILE")
    from rhino.spark.state.reader import count_entries  # rhino.spark's layout (no PySpark)

    secret = read_secret_file(secret_file)
    with connect_coordinator(coordinator, secret=secret, client_id="rhino-inspect") as c:
        return count_entries(c, args.operator, secret, batch=args.batch)


def format_state(r: dict[str, Any]) -> str:
    t = r["batch_time_ms"]
    lines = [f"operator {r['operator_id']}: checkpoint of batch {r['batch']}"
             + (f" (batch time {t} ms)" if t is not None else ""),
             f"grouping key: {r['grouping_key']}", ""]
    rows = [("NAME", "KIND", "ID", "VERSION", "TTL", "ENTRIES", "SCHEMA")]
    for v in r["variables"]:
        ttl = "-" if v["ttl_ms"] is None else f"{v['ttl_ms']} ms"
        entries = str(v["entries"])
        if "live" in v:
            entries += f" ({v['live']} live, {v['expired']} expired)"
        schema = v["schema"] if v["key_schema"] is None else f"{v['key_schema']} -> {v['schema']}"
        version = str(v["version"]) + (f" of {len(v['versions'])}" if len(v["versions"]) > 1 else "")
        rows.append((v["name"], v["type"], str(v["id"]), version, ttl, entries, schema))
    rows.append(("(timers)", "timers", "-", "-", "-", str(r["timers"]), "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])
    lines += ["", "read from: " + ", ".join(f"instance {i} on {a}" for i, a in sorted(r["instances"].items()))]
    return "\n".join(lines)
