"""An operator's per-batch figures where Spark users look for a stateful operator's.

Spark's own ``transformWithState`` reports a ``stateOperators`` block in each
``StreamingQueryProgress``. A Rhino operator runs inside ``foreachBatch``, where Spark
sees no stateful operator and offers no way to add to that progress: a ``observe`` inside
``foreachBatch`` is not collected into the query's ``observedMetrics`` (tried on Spark
4.3: it stays ``{}``). So the figures go to two places instead (docs/spark.md, "Metrics"):

- ``op.progress(batch_id)`` (and ``op.last_progress``): the batch's block in the shape
  and field names of Spark's ``StateOperatorProgress``, for a ``StreamingQueryListener``
  to join on ``event.progress.batchId`` in the driver;
- the Spark UI: the operator's jobs of each attempt are described ("rhino OP batch B
  attempt A: ..."), and each committed batch is a job of its own, with no task, whose
  description carries the figures (the Jobs page and its REST API).

Fields Rhino does not measure per batch are None, not zero: the state's total rows
(RocksDB would have to be asked for an estimate) and the memory it uses.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .report import BatchReport

__all__ = ["state_operator_progress", "describe_attempt", "describe_commit", "post_to_spark_ui"]

log = logging.getLogger("rhino.spark")

OPERATOR_NAME = "rhinoTransformWithState"
_DESCRIPTION = "spark.job.description"


def _sum(rep: BatchReport, key: str) -> int:
    return int(sum(t.get(key, 0) or 0 for t in rep.tasks))


def _max_ms(rep: BatchReport, key: str) -> int:
    return int(round(1000 * max((t.get(key, 0.0) or 0.0 for t in rep.tasks), default=0.0)))


def state_operator_progress(rep: BatchReport) -> dict:
    """The batch's figures as Spark's ``StateOperatorProgress`` JSON names them, with the
    ones only Rhino has under ``customMetrics``."""
    instances = rep.parallelism if rep.parallelism is not None else len(rep.tasks)
    return {
        "operatorName": OPERATOR_NAME,
        "numRowsTotal": None,  # not measured per batch
        "numRowsUpdated": _sum(rep, "puts"),
        "allUpdatesTimeMs": int(round(1000 * sum(t.get("write_s", 0.0) for t in rep.tasks))),
        "numRowsRemoved": _sum(rep, "deletes"),
        "allRemovalsTimeMs": None,  # written with the updates, in one write per window
        "commitTimeMs": _max_ms(rep, "commit_s"),
        "memoryUsedBytes": None,
        "numRowsDroppedByWatermark": _sum(rep, "late_rows"),
        "numShufflePartitions": instances,
        "numStateStoreInstances": instances,
        "customMetrics": {
            "numExpiredTimers": _sum(rep, "timers_fired"),
            "numInputRows": _sum(rep, "rows_in"),
            "numKeys": _sum(rep, "keys"),
            "numOutputRows": rep.rows_out,
            "stateBytes": _sum(rep, "checkpoint_bytes"),  # every instance's checkpoint of this batch
            "checkpointDeltaBytes": _sum(rep, "delta_bytes"),
            "replicateTimeMs": _max_ms(rep, "replicate_s"),
            "sessionOpenTimeMs": _max_ms(rep, "open_s"),  # a takeover's restore is inside it
            "rolledBackInstances": sum(1 for t in rep.tasks if t.get("rolled_back")),
            "attempts": rep.attempts,
            "epoch": rep.epoch,
            "batchTimeMs": int(round(1000 * rep.seconds)),
        },
    }


def describe_attempt(operator_id: str, batch: int, attempt: int, epoch: int, instances: int) -> str:
    """The description of an attempt's jobs in the Spark UI."""
    return f"rhino {operator_id} batch {batch} attempt {attempt}: {instances} instances at epoch {epoch}"


def describe_commit(operator_id: str, rep: BatchReport) -> str:
    """The description of a committed batch's job in the Spark UI: its figures in one line."""
    p = state_operator_progress(rep)
    m = p["customMetrics"]
    return (f"rhino {operator_id} batch {rep.batch} committed: {m['numInputRows']} rows in, {m['numKeys']} keys, "
            f"{p['numRowsUpdated']} state rows updated, {p['numRowsRemoved']} removed, "
            f"{m['numExpiredTimers']} timers fired, {p['numRowsDroppedByWatermark']} late rows dropped, "
            f"{m['numOutputRows']} rows out; state {m['stateBytes']} bytes (+{m['checkpointDeltaBytes']}), "
            f"commit {p['commitTimeMs']} ms, session open {m['sessionOpenTimeMs']} ms, "
            f"{rep.attempts} attempt{'s' if rep.attempts != 1 else ''}, epoch {rep.epoch}")


class JobDescription:
    """Sets the thread's Spark job description for a block, and puts back what was there
    (the user's own, or none)."""

    def __init__(self, sc: Any, text: str) -> None:
        self.sc, self.text = sc, text
        self.before: Optional[str] = None

    def __enter__(self) -> "JobDescription":
        self.before = self.sc.getLocalProperty(_DESCRIPTION)
        self.sc.setLocalProperty(_DESCRIPTION, self.text)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sc.setLocalProperty(_DESCRIPTION, self.before)


def post_to_spark_ui(sc: Any, text: str) -> None:
    """A job with no task, described by ``text``: it appears on the Spark UI's Jobs page (and
    in its REST API) at once, at the cost of a call to the driver's scheduler. Never raises:
    the batch is committed already."""
    try:
        with JobDescription(sc, text):
            sc.emptyRDD().count()
    except Exception as e:  # noqa: BLE001 - a report, not the batch
        log.debug("rhino.spark: the batch's figures did not reach the Spark UI: %s", e)
