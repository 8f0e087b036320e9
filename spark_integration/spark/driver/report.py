"""What each micro-batch did (:class:`BatchReport`), kept in a bounded ring on the
operator (``op.reports``) and logged in full, one line per batch, to the
``rhino.spark.reports`` logger: a query that runs for months keeps its history in
its logs, not in the driver's memory."""

from __future__ import annotations

import collections
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

__all__ = ["BatchReport", "ReportRing", "REPORTS_KEPT"]

log = logging.getLogger("rhino.spark.reports")

# The reports an operator keeps in memory (about 1-3 KiB each with a few tasks).
REPORTS_KEPT = 1000


@dataclass
class BatchReport:
    """What one micro-batch did: per attempt errors, per task stats, timings."""

    batch: int
    epoch: int
    attempts: int
    watermark_ms: int
    rows_out: int
    started: float
    ended: float
    begin_s: float
    job_s: float
    commit_s: float
    tasks: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # from the last attempt's start to its Spark action (the job that runs the stateful
    # tasks): the driver's own planning (pinning, the task spec, the query plan)
    job_setup_s: Optional[float] = None
    # how rows were routed to instances: "jvm" (KeyRouter) or "python" (runtime/routing.py)
    routing: Optional[str] = None
    # the instances the batch ran on (the coordinator's current parallelism), and the
    # config's, the initial one: they differ after a rescale (issue 45)
    parallelism: Optional[int] = None
    initial_parallelism: Optional[int] = None
    # the copies of the batch's routed input the executors kept (input_copies; 2 by default
    # with two executors or more: driver/routing.py)
    input_copies: Optional[int] = None
    # the instances that ran with fewer live copies of their state than min_copies (each
    # {"instance", "copies", "min_copies"}): the coordinator's begin_batch said so
    short_of_copies: list[dict] = field(default_factory=list)
    # the code the batch ran (driver/code_version.py), and the swap that took effect in it
    code_version: Optional[str] = None
    swapped_from: Optional[str] = None

    @property
    def parallelism_adopted(self) -> bool:
        """The batch ran at the coordinator's parallelism, not the one in the code."""
        return None not in (self.parallelism, self.initial_parallelism) and self.parallelism != self.initial_parallelism

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def locality(self) -> float:
        """The share of tasks that ran on their primary's host."""
        if not self.tasks:
            return 1.0
        return sum(1 for t in self.tasks if t.get("host") == t.get("primary_host")) / len(self.tasks)


class ReportRing(collections.deque):
    """The last :data:`REPORTS_KEPT` reports, oldest first; indexes and slices as a list."""

    def __init__(self, operator_id: str, kept: int = REPORTS_KEPT) -> None:
        super().__init__(maxlen=kept)
        self.operator_id = operator_id

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return list(self)[i]
        return super().__getitem__(i)

    def append(self, rep: BatchReport) -> None:  # type: ignore[override]
        super().append(rep)
        if log.isEnabledFor(logging.INFO):
            log.info("%s", json.dumps({"operator": self.operator_id, **asdict(rep)}, default=str))
