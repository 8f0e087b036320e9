"""The input of ``rhino-bench spark elastic``: the ``"nexmark"`` source with an arrival rate
that changes while the query runs.

``nexmark_elastic`` is :class:`~rhino_testing.nexmark.source.NexmarkDataSource` (the same events,
offsets, replay and generator options) whose events *arrive* on a schedule read from a JSON
file (the ``scheduleFile`` option) at every ``latestOffset``; the benchmark's driver writes
the file, and may rewrite it while the query runs (atomically: it only ever appends
segments that start in the future, so the source and the driver always agree on the past):

    {"first": 0, "segments": [[t0, eps0], [t1, eps1], ..., [tn, 0.0]]}

``t`` are Unix times (``time.time()``; the source runs in the driver's Python worker, on the
same machine), ``eps`` events per second from that time until the next segment's; the last
segment lasts forever (a rate of 0 ends the stream's growth). Events ``[first, offset_at(t))``
have arrived by time ``t`` (:func:`offset_at`); each micro-batch reads every event that
has arrived (no read limit), so a query that falls behind gets larger batches: its backlog.

The schedule's arithmetic (:func:`offset_at`, :func:`arrival_time`) is pure and shared with
the benchmark, which so knows the offset at which each rate step begins.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from rhino_testing.nexmark.source import OFFSET_KEY, NexmarkDataSource, _BatchReader, _Settings, _StreamReader

__all__ = ["ElasticNexmarkSource", "SOURCE_NAME", "offset_at", "arrival_time", "write_schedule", "read_schedule",
           "offset_of", "segments_for"]

SOURCE_NAME = "nexmark_elastic"


# ---------------------------------------------------------------------------- the schedule (pure)


def offset_at(schedule: dict, t: float) -> int:
    """The id after the last event that has arrived by Unix time ``t``."""
    segs = sorted((float(a), float(r)) for a, r in schedule.get("segments", []))
    total = 0.0
    for i, (start, rate) in enumerate(segs):
        if t <= start:
            break
        end = segs[i + 1][0] if i + 1 < len(segs) else math.inf
        total += rate * (min(t, end) - start)
    # a tiny epsilon: 0.1 * 3 s is 0.30000000000000004, and 0.29999999999999993 must not lose an event
    return int(schedule.get("first", 0)) + int(math.floor(total + 1e-6))


def arrival_time(schedule: dict, offset: int) -> Optional[float]:
    """When event ``offset`` arrived: the least ``t`` with ``offset_at(t) > offset`` (None if it
    never arrives). For the age of a batch's oldest event."""
    need = offset - int(schedule.get("first", 0)) + 1  # events needed, this one included
    if need <= 0:
        segs = schedule.get("segments") or [[0.0, 0.0]]
        return float(min(a for a, _ in segs))
    segs = sorted((float(a), float(r)) for a, r in schedule.get("segments", []))
    total = 0.0
    for i, (start, rate) in enumerate(segs):
        end = segs[i + 1][0] if i + 1 < len(segs) else math.inf
        got = rate * (end - start) if rate > 0 else 0.0
        if rate > 0 and total + got >= need - 1e-6:
            return start + (need - total) / rate
        total += got
    return None


def write_schedule(path: str | Path, schedule: dict) -> None:
    """Atomically (a reader never sees half a file)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(schedule))
    os.replace(tmp, p)


def read_schedule(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------------------- the data source


class _ScheduledReader(_StreamReader):
    """The nexmark stream reader whose available events follow the schedule file."""

    def __init__(self, settings: _Settings, schedule_file: str) -> None:
        super().__init__(settings)
        self.schedule_file = schedule_file
        self._key: Any = None
        self._schedule: dict = {"first": settings.first, "segments": []}

    def _current(self) -> dict:
        try:
            st = os.stat(self.schedule_file)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            if key != self._key:
                self._schedule = read_schedule(self.schedule_file)
                self._key = key
        except (OSError, ValueError):
            pass  # not written yet, or being replaced: the last one read
        return self._schedule

    def _available(self, start: int) -> int | None:
        avail = offset_at(self._current(), time.time())
        if self.s.end is not None:
            avail = min(avail, self.s.end)
        if self._target is not None:
            avail = min(avail, self._target)
        return avail


class ElasticNexmarkSource(NexmarkDataSource):
    """``spark.dataSource.register(ElasticNexmarkSource)``; then ``format("nexmark_elastic")``
    with ``scheduleFile`` and any option of the ``nexmark`` source but ``eventsPerSecond``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _split(self) -> tuple[dict, str]:
        opts = {str(k).lower(): v for k, v in self.options.items()}
        path = opts.pop("schedulefile", None)
        if not path:
            raise ValueError("the nexmark_elastic source needs the scheduleFile option")
        if "eventspersecond" in opts:
            raise ValueError("nexmark_elastic: the arrival rate is the schedule's, not eventsPerSecond")
        return opts, str(path)

    def streamReader(self, schema: Any) -> Any:
        opts, path = self._split()
        return _ScheduledReader(_Settings(opts), path)

    def reader(self, schema: Any) -> Any:
        opts, _ = self._split()
        return _BatchReader(_Settings(opts))


def offset_of(value: Any) -> Optional[int]:
    """An offset as Spark's progress reports it (a JSON string or an object) -> the event id."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, dict):
        v = value.get(OFFSET_KEY)
        return int(v) if v is not None else None
    return None


def segments_for(*, start: float, rates: Sequence[float], base_eps: float, step_s: float) -> list[list[float]]:
    """Segments of the steps: rate ``rates[k] * base_eps`` from ``start + k * step_s``, then 0."""
    out = [[start + k * step_s, float(r) * base_eps] for k, r in enumerate(rates)]
    out.append([start + len(rates) * step_s, 0.0])
    return out
