"""The grouped-pandas form, like Spark's ``applyInPandasWithState``:
``fn(key, pdf_iter, state) -> iterator of DataFrames``, with a ``GroupState``-like
``state`` (``exists``, ``get``, ``getOption``, ``update``, ``remove``,
``hasTimedOut``, ``setTimeoutTimestamp``, ``setTimeoutDuration``,
``getCurrentWatermarkMs``, ``getCurrentProcessingTimeMs``).

It runs as a StatefulProcessor on the same runtime: the group state is one
ValueState of ``state_schema`` (Spark's ``stateStructType``), and a timeout is a
timer: an event-time one for ``EventTimeTimeout`` (``setTimeoutTimestamp``), a
processing-time one for ``ProcessingTimeTimeout`` (``setTimeoutDuration``, from
the batch's time). As in Spark, the timeout is cleared before every call and
must be set again by the call that wants it; a key times out once the watermark
(event time) or the batch's time (processing time) is past its timeout
timestamp, and ``fn`` is then called with no rows and ``state.hasTimedOut``
True. A key with new rows in a batch is called with its rows, not timed out.
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

    def __init__(self, value: Any, timer: Any, watermark_ms: int, timed_out: bool, timeout: str,
                 now_ms: int) -> None:
        self._vs = value
        self._timer = timer
        self._wm = watermark_ms
        self._timed_out = timed_out
        self._timeout = timeout  # "notimeout" | "eventtimetimeout" | "processingtimetimeout"
        self._now = now_ms
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

    @property
    def oldTimeoutTimestamp(self) -> int:
        """PySpark's own property: -1 (``GroupState.NO_TIMESTAMP``) in every call, as Spark's
        streaming group state gives it (its state starts each call without a timeout; a
        previous call's timeout is not exposed). ``tests/test_spark_semantics.py`` checks
        it against Spark's own ``applyInPandasWithState``."""
        return -1

    def setTimeoutTimestamp(self, timestampMs: int) -> None:
        if self._timeout != "eventtimetimeout":
            raise InvalidArgumentError("setTimeoutTimestamp needs timeout='EventTimeTimeout' (Spark: cannot set "
                                       "a timeout timestamp without enabling event time timeout)")
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
        """The key times out once the batch's time is past this batch's time + ``durationMs``
        (ms, or a duration string such as ``"10 seconds"``)."""
        if self._timeout != "processingtimetimeout":
            raise InvalidArgumentError("setTimeoutDuration needs timeout='ProcessingTimeTimeout' (Spark: cannot "
                                       "set a timeout duration without enabling processing time timeout)")
        from .driver.config import parse_delay_ms

        ms = parse_delay_ms(durationMs)
        if ms <= 0:
            raise InvalidArgumentError(f"timeout duration must be positive, not {durationMs!r}")
        self.timeout_ms = self._now + ms

    def getCurrentWatermarkMs(self) -> int:
        return self._wm

    def getCurrentProcessingTimeMs(self) -> int:
        """The batch's time (the same for every key of the batch, and when it runs again), as Spark's."""
        return self._now


class GroupedProcessor(StatefulProcessor):
    """A StatefulProcessor that calls a grouped-pandas ``fn``."""

    def __init__(self, fn: Callable, timeout: str, state_schema: Any) -> None:
        self.fn = fn
        self.timeout = timeout.lower()
        self.state_schema = state_schema

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.value = handle.getValueState("__group_state", self.state_schema)

    def _call(self, key: Any, pdfs: Iterator[pd.DataFrame], tv: Any, timed_out: bool) -> Iterator[pd.DataFrame]:
        if self.timeout != "notimeout":
            for ts in list(self.handle.listTimers()):
                self.handle.deleteTimer(ts)  # the timeout is set again by each call (Spark's rule)
        st = RhinoGroupState(self.value, self.handle, tv.getCurrentWatermarkInMs(), timed_out, self.timeout,
                             tv.getCurrentProcessingTimeInMs())
        out = self.fn(key, pdfs, st)
        if out is not None:
            yield from out
        if st.timeout_ms is not None and not st.removed:
            # Spark times a key out when the watermark (or the batch's time) is *past* its timestamp;
            # a timer fires at <=.
            self.handle.registerTimer(st.timeout_ms + 1)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        return self._call(key, rows, timerValues, False)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        return self._call(key, iter([]), timerValues, True)

    def close(self) -> None:
        pass


def apply_in_pandas_with_state(fn: Callable, *, key: str | Sequence[str], output_schema: Any, state_schema: Any,
                               operator_id: str, coordinator: str, timeout: str = "NoTimeout", **kw: Any) -> Any:
    """The grouped-pandas operator: ``fn(key, pdf_iter, state)`` per key and batch.

    ``state_schema``: the StructType or DDL string of the group state (Spark's
    ``stateStructType``); ``state.update`` takes a tuple of its fields.

    ``timeout``: ``"NoTimeout"``, ``"EventTimeTimeout"`` (then ``event_time=``,
    ``watermark_delay=`` and ``checkpoint_location=`` as for
    :func:`rhino.spark.transform_with_state`) or
    ``"ProcessingTimeTimeout"`` (``state.setTimeoutDuration``; the batch's time is
    the coordinator's, fixed at the batch's first run). Other arguments are
    :func:`transform_with_state`'s."""
    from .operator import TransformWithState

    t = str(timeout).lower()
    if t not in ("notimeout", "eventtimetimeout", "processingtimetimeout"):
        raise InvalidArgumentError(f"timeout must be 'NoTimeout', 'EventTimeTimeout' or 'ProcessingTimeTimeout', "
                                   f"not {timeout!r}")
    if t == "eventtimetimeout":
        kw.setdefault("time_mode", "EventTime")
    if t == "processingtimetimeout":
        kw.setdefault("time_mode", "ProcessingTime")
    return TransformWithState(GroupedProcessor(fn, timeout, state_schema), key=key, output_schema=output_schema,
                              operator_id=operator_id, coordinator=coordinator, **kw)
