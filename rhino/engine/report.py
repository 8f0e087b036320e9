"""The per-batch report ``commit_batch`` takes for the coordinator's autoscaler
(``rhino/coordinator/autoscaler.py``; docs/design.md §4, "The autoscaler"), built by
the driver from the instances' commit stats (``AttemptResult.instances``).

An instance's commit stats may say, besides ``checkpoint_bytes``:

- its records: ``records`` (the records it processed), else ``rows_in`` (a
  ``rhino.spark`` task's input rows);
- its busy time: ``busy_s``, else the sum of a ``rhino.spark`` task's processing
  phases, :data:`BUSY_FIELDS`.

Why those phases: the autoscaler wants each instance's *true* processing rate, records
over *useful* time (DS2 §3), not over the task's wall time. A task's phases
(``runtime/task.py``) are: ``open_s`` (connect, open the session, a rollback to b-1),
``read_s`` (take the input from Spark's iterator: the shuffle read and its Arrow
decoding), ``group_s`` (group rows by key), ``fetch_s`` (prefetch the keys' state),
``process_s`` (the user's processor), ``write_s`` (write the state back into the
session), ``timers_s`` (fire due timers) and ``commit_s`` (the barrier commit, which
waits for the checkpoint to reach the chain). The ones in :data:`BUSY_FIELDS` grow with
the records an instance gets, and shrink when it gets fewer: the useful time. In a
micro-batch the input is all there when the stage starts, so ``read_s`` is decoding, not
waiting for an upstream operator, and counts. ``open_s`` and ``commit_s`` do not: they are
per batch, whatever the records (the commit mostly waits for the replicas: DS2's waiting
time), and the autoscaler's utilization leaves room for them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

__all__ = ["BUSY_FIELDS", "batch_report", "instance_busy_s", "instance_records"]

BUSY_FIELDS = ("read_s", "group_s", "fetch_s", "process_s", "write_s", "timers_s")


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def instance_records(stats: Mapping[str, Any]) -> Optional[int]:
    """The records an instance processed, from its commit stats; None if they do not say."""
    for k in ("records", "rows_in"):
        v = _num(stats.get(k))
        if v is not None:
            return int(v)
    return None


def instance_busy_s(stats: Mapping[str, Any]) -> Optional[float]:
    """An instance's busy (useful) seconds, from its commit stats; None if they do not say."""
    v = _num(stats.get("busy_s"))
    if v is not None:
        return v
    parts = [_num(stats.get(k)) for k in BUSY_FIELDS if k in stats]
    parts = [p for p in parts if p is not None]
    return sum(parts) if parts else None


def batch_report(instances: Mapping[Any, Any], *, began_unix: float, ended_unix: float) -> Optional[dict]:
    """The report of a batch that began (its first ``begin_batch``) at ``began_unix`` and
    whose work ended at ``ended_unix`` (``time.time()``), from ``instances`` (instance ->
    commit stats); None when no instance says how many records it processed (nothing to
    report: ``commit_batch`` is then called without one)."""
    records: dict[str, int] = {}
    busy: dict[str, float] = {}
    for i, stats in instances.items():
        if not isinstance(stats, Mapping):
            continue
        n = instance_records(stats)
        if n is None:
            continue
        records[str(i)] = n
        b = instance_busy_s(stats)
        if b is not None:
            busy[str(i)] = b
    if not records:
        return None
    return {"batch_s": max(0.0, float(ended_unix) - float(began_unix)), "records": sum(records.values()),
            "busy_s": busy, "records_by_instance": records, "began_unix": float(began_unix)}
