"""The operator's event-time watermarks, by Spark's rule: batch b's timers fire at the
largest event time seen through batch b-1, minus the delay (0 before any event; Spark's
``eventTimeWatermarkForEviction``), and its late rows are those at or before the watermark
batch b-1 ran with (``eventTimeWatermarkForLateEvents``): one batch behind.

The largest event time of each committed batch is kept in a small file beside the
query's checkpoint (``checkpoint_location``), so that a restarted driver runs each
batch again with the watermark it first ran with."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["Watermarks"]

# Batches kept in the file: a replay reruns at most the last batch, a few more cost nothing.
KEPT_BATCHES = 16


class Watermarks:
    """The largest event time per batch, and the watermark each batch runs with."""

    def __init__(self, operator_id: str, delay_ms: int, checkpoint_location: Optional[str]) -> None:
        self.delay_ms = delay_ms
        self.path = (Path(checkpoint_location) / f"rhino-{operator_id}-watermark.json"
                     if checkpoint_location else None)
        self._max_event: dict[int, Optional[int]] = self._load()

    def _load(self) -> dict[int, Optional[int]]:
        if self.path is None or not self.path.exists():
            return {}
        return {int(k): v for k, v in json.loads(self.path.read_text()).items()}

    def for_batch(self, batch: int) -> int:
        """The event-time watermark batch ``batch`` runs with (ms; 0 before any event)."""
        prev = [b for b in self._max_event if b < batch]
        if not prev:
            return 0
        m = self._max_event[max(prev)]
        return max(0, m - self.delay_ms) if m is not None else 0

    def for_late_rows(self, batch: int) -> int:
        """The watermark batch ``batch`` drops late rows by: the one batch ``batch - 1`` ran
        with (0 for the first two batches), as Spark's ``eventTimeWatermarkForLateEvents``."""
        return self.for_batch(batch - 1) if batch > 0 else 0

    def committed(self, batch: int, max_events: Iterable[Optional[int]]) -> None:
        """Records batch ``batch``'s largest event time (its tasks' ``max_event_ms``) and
        saves the file: written to a temporary name, then renamed over the old one."""
        mx = [m for m in max_events if m is not None]
        prev = [m for b, m in self._max_event.items() if b < batch and m is not None]
        self._max_event[batch] = max(mx + prev) if (mx or prev) else None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep = dict(sorted(self._max_event.items())[-KEPT_BATCHES:])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, self.path)
