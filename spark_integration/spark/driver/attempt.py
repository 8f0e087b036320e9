"""One attempt at a micro-batch: what the driver knows of it (:class:`AttemptContext`)
and what its tasks get (:class:`AttemptSpec`, shipped with the operator's
:class:`~rhino.spark.driver.config.OperatorConfig`).

An attempt is fixed by the coordinator's ``begin_batch`` (design §5): the batch, the
epoch its sessions open at, the placement (routing table and each instance's primary)
and the batch's time; the driver adds the watermark and the session's time zone. A
batch that runs again is a new attempt with the same batch time and watermark, so it
runs identically."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from rhino.coordinator.types import Placement

__all__ = ["AttemptContext", "AttemptSpec"]


@dataclass(frozen=True)
class AttemptSpec:
    """What every task of one attempt gets, besides the operator's config."""

    batch: int
    attempt: int  # the driver's attempt number at this batch (1, 2, ...)
    epoch: int
    watermark_ms: int
    timezone: str
    placement: Placement
    batch_time_ms: int  # the coordinator's, fixed at the batch's first run (the TTL clock)
    state_doc: Optional[dict]  # the operator's state schema document (state/variables.py)
    input_schema_json: str
    instances: tuple[int, ...]  # partition p runs instance instances[p]
    meta: Any = None  # the driver's accumulator of the tasks' meta rows (runtime/meta.py)
    # batch 0 with an initial state (runtime/initial.py): the input's own columns, and the
    # initial state's (its rows carry them under INIT_PREFIX); None otherwise
    input_columns: Optional[list[str]] = None
    initial_columns: Optional[list[str]] = None
    # the watermark late rows are dropped by: the one the previous batch ran with (Spark's
    # eventTimeWatermarkForLateEvents; driver/watermark.py); timers fire at watermark_ms
    late_watermark_ms: int = 0
    # pandas mode: a key's rows reach handleInputRows in frames of at most this many rows
    # (Spark's spark.sql.execution.arrow.maxRecordsPerBatch; 0: one frame)
    max_records_per_batch: int = 0


@dataclass
class AttemptContext:
    """The driver's view of one attempt: its spec's fields, and the batch watch that
    cancels it when a host is lost (``scheduling/host_loss.py``; None with ``watch_hosts`` off)."""

    batch: int
    attempt: int
    epoch: int
    watermark_ms: int
    timezone: str
    placement: Placement
    batch_time_ms: int
    watch: Optional[Any] = None
    late_watermark_ms: int = 0
    max_records_per_batch: int = 0

    def spec(self, *, state_doc: Optional[dict], input_schema_json: str, instances: list[int], meta: Any,
             input_columns: Optional[list[str]] = None, initial_columns: Optional[list[str]] = None) -> AttemptSpec:
        return AttemptSpec(batch=self.batch, attempt=self.attempt, epoch=self.epoch, watermark_ms=self.watermark_ms,
                           timezone=self.timezone, placement=self.placement, batch_time_ms=self.batch_time_ms,
                           state_doc=state_doc, input_schema_json=input_schema_json, instances=tuple(instances),
                           meta=meta, input_columns=input_columns, initial_columns=initial_columns,
                           late_watermark_ms=self.late_watermark_ms,
                           max_records_per_batch=self.max_records_per_batch)
