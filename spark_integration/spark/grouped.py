"""The grouped-pandas form, like Spark's ``applyInPandasWithState``:
``fn(key, pdf_iter, state) -> iterator of DataFrames``, with a ``GroupState``-like
``state`` (``exists``, ``get``, ``getOption``, ``update``, ``remove``,
``hasTimedOut``, ``setTimeoutTimestamp``, ``getCurrentWatermarkMs``).

It runs as a StatefulProcessor on the same runtime: the group state is one
ValueState of ``state_schema`` (Spark's ``stateStructType``), and an event-time timeout is an event-time timer. As in Spark, the
timeout is cleared before every call and must be set again by the call that
wants it; a key times out once the watermark passes its timeout timestamp,
and ``fn`` is then called with no rows and ``state.hasTimedOut`` True.
``GroupStateTimeout.ProcessingTimeTimeout`` is not supported (no processing-time
timers) and is refused.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from rhino.errors import InvalidArgumentError

__all__ = ["RhinoGroupState", "GroupedProcessor", "apply_in_pandas_with_state"]


class RhinoGroupState:
    """What ``fn`` gets as ``state``: PySpark's ``GroupState`` methods and properties
    (``exists``, ``get``, ``getOption`` and ``hasTimedOut`` are properties, as there)."""

    def __init__(self, value: Any, timer: Any, watermark_ms: int, timed_out: bool, event_time: bool) -> None:
        self._vs = value
        self._timer = timer
        self._wm = watermark_ms
        self._timed_out = timed_out
        self._event_time = event_time
        self.timeout_ms: Optional[int] = None
        self.removed = False

    @property
    def exists(self) -> bool:
        return self._vs.exists()

    @property
    def get(self) -> tuple:
        v = self._vs.get()
        if v is None:
            raise ValueError("state is not set (check state.exists first)")
        return v

    @property
    def getOption(self) -> Optional[tuple]:
        return self._vs.get()

    def update(self, newValue: tuple) -> None:
        if newValue is None:
            raise ValueError("update(None): use remove()")
        self._vs.update(tuple(newValue))
        self.removed = False

    def remove(self) -> None:
        self._vs.clear()
        self.removed = True

    @property
    def hasTimedOut(self) -> bool:
        return self._timed_out

    def setTimeoutTimestamp(self, timestampMs: int) -> None:
        if not self._event_time:
            raise InvalidArgumentError("setTimeoutTimestamp needs timeout='EventTimeTimeout'")
        import datetime

        if isinstance(timestampMs, datetime.datetime):
            from pyspark.sql.types import TimestampType

            timestampMs = TimestampType().toInternal(timestampMs) // 1000
        if int(timestampMs) <= 0:
            raise InvalidArgumentError(f"timeout timestamp must be positive, not {timestampMs}")
        if int(timestampMs) < self._wm:
            raise InvalidArgumentError(f"timeout timestamp {timestampMs} is before the watermark {self._wm}")
        self.timeout_ms = int(timestampMs)

    def setTimeoutDuration(self, durationMs: Any) -> None:
        raise InvalidArgumentError("processing-time timeouts are not supported by rhino.spark")

    def getCurrentWatermarkMs(self) -> int:
        return self._wm

    def getCurrentProcessingTimeMs(self) -> int:
        import time

        return int(time.time() * 1000)


class GroupedProcessor(StatefulProcessor):
    """A StatefulProcessor that calls a grouped-pandas ``fn``."""

    def __init__(self, fn: Callable, timeout: str, state_schema: Any) -> None:
        self.fn = fn
        self.event_time = timeout.lower() == "eventtimetimeout"
        self.state_schema = state_schema

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.value = handle.getValueState("__group_state", self.state_schema)

    def _call(self, key: Any, pdfs: Iterator[pd.DataFrame], wm: int, timed_out: bool) -> Iterator[pd.DataFrame]:
        if self.event_time:
            for ts in list(self.handle.listTimers()):
                self.handle.deleteTimer(ts)  # the timeout is set again by each call (Spark's rule)
        st = RhinoGroupState(self.value, self.handle, wm, timed_out, self.event_time)
        out = self.fn(key, pdfs, st)
        if out is not None:
            yield from out
        if st.timeout_ms is not None and not st.removed:
            # Spark times a key out when the watermark is *past* its timestamp; a timer fires at <=.
            self.handle.registerTimer(st.timeout_ms + 1)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        return self._call(key, rows, timerValues.getCurrentWatermarkInMs(), False)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        return self._call(key, iter([]), timerValues.getCurrentWatermarkInMs(), True)

    def close(self) -> None:
        pass


def apply_in_pandas_with_state(fn: Callable, *, key: str | Sequence[str], output_schema: Any, state_schema: Any,
                               operator_id: str, coordinator: str, timeout: str = "NoTimeout", **kw: Any) -> Any:
    """The grouped-pandas operator: ``fn(key, pdf_iter, state)`` per key and batch.

    ``state_schema``: the StructType or DDL string of the group state (Spark's
    ``stateStructType``); ``state.update`` takes a tuple of its fields.

    ``timeout``: ``"NoTimeout"`` or ``"EventTimeTimeout"`` (then ``event_time=`` and
    ``watermark_delay=`` as for :func:`rhino.spark.transform_with_state`). Other
    arguments are :func:`transform_with_state`'s."""
    from .operator import TransformWithState

    t = str(timeout).lower()
    if t == "processingtimetimeout":
        raise InvalidArgumentError("timeout='ProcessingTimeTimeout' is not supported by rhino.spark")
    if t not in ("notimeout", "eventtimetimeout"):
        raise InvalidArgumentError(f"timeout must be 'NoTimeout' or 'EventTimeTimeout', not {timeout!r}")
    if t == "eventtimetimeout":
        kw.setdefault("time_mode", "EventTime")
    return TransformWithState(GroupedProcessor(fn, timeout, state_schema), key=key, output_schema=output_schema,
                              operator_id=operator_id, coordinator=coordinator, **kw)
