"""How each task's meta row (its stats: epoch, timings, round trips, load) reaches the
driver: through a Spark accumulator, not with the output.

The output of a batch stays on the executors (``operator.py``); only these small rows
travel to the driver, with each task's completion. Spark merges the accumulator updates
of successful task attempts only (a failed attempt's are dropped). One accumulator serves
an operator for its life; each row names the batch and the driver's attempt it belongs
to, so a row that arrives late from a cancelled attempt is told apart, and a task that
ran twice and succeeded both times (a stage retried after a lost executor) is counted
once (:func:`take`).
"""

from __future__ import annotations

from typing import Any

from pyspark.accumulators import AccumulatorParam

__all__ = ["TaskMetaParam", "new_meta_accumulator", "seen", "take"]


class TaskMetaParam(AccumulatorParam):
    """A list of meta rows (dicts), merged by concatenation."""

    def zero(self, value: Any) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:  # noqa: N802 - PySpark's name
        value1.extend(value2)
        return value1


def new_meta_accumulator(sc: Any) -> Any:
    return sc.accumulator([], TaskMetaParam())


def take(acc: Any, batch: int, attempt: int) -> list[dict]:
    """The rows of (batch, attempt), one per instance (the latest run of each), and empties
    the accumulator."""
    rows, acc._value = list(acc.value), []
    best: dict[int, dict] = {}
    for r in rows:
        if r.get("batch") != batch or r.get("driver_attempt") != attempt:
            continue
        cur = best.get(r["instance"])
        if cur is None or (r["epoch"], r.get("end", 0)) > (cur["epoch"], cur.get("end", 0)):
            best[r["instance"]] = r
    return [best[i] for i in sorted(best)]


def seen(acc: Any, batch: int, attempt: int) -> set[int]:
    """The instances whose task of (batch, attempt) ran to its end so far (the accumulator
    is left as it is)."""
    return {r["instance"] for r in acc.value if r.get("batch") == batch and r.get("driver_attempt") == attempt}
