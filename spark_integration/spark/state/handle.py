"""The ``StatefulProcessorHandle`` a processor gets in ``init`` when it runs on
Rhino: the same methods as PySpark's (``getValueState``, ``getListState``,
``getMapState``, ``registerTimer``, ``deleteTimer``, ``listTimers``,
``deleteIfExists``), served from the key records the task prefetched for the
batch (``encoding.KeyRecord``), so no state call leaves the process.

The state objects subclass PySpark's ``ValueState`` / ``ListState`` /
``MapState``, so a processor that checks types still works. They act on the
record of the handle's current grouping key, which the task sets before each
``handleInputRows`` / ``handleExpiredTimer`` call (as Spark's implicit key).

Left out, and refused with an error rather than ignored: TTL
(``ttlDurationMs``) and processing-time timers (time mode ``ProcessingTime``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from pyspark.sql.streaming.stateful_processor import (ListState, MapState, StatefulProcessorHandle,
                                                      ValueState)

from .encoding import KeyRecord

__all__ = ["RhinoProcessorHandle", "UnsupportedFeatureError"]


class UnsupportedFeatureError(NotImplementedError):
    """A transformWithState feature that rhino.spark does not implement (TTL, processing-time timers)."""


def _no_ttl(name: str, ttl: Optional[int]) -> None:
    if ttl is not None:
        raise UnsupportedFeatureError(
            f"state {name!r}: TTL (ttlDurationMs={ttl}) is not supported by rhino.spark; "
            "clear state with a timer instead (see spark_integration/README.md)")


class _RhinoState:
    def __init__(self, handle: "RhinoProcessorHandle", name: str) -> None:
        self._handle = handle
        self._name = name

    def _rec(self) -> KeyRecord:
        return self._handle._record()

    def _touch(self) -> KeyRecord:
        r = self._handle._record()
        r.dirty = True
        return r


class RhinoValueState(_RhinoState, ValueState):
    def exists(self) -> bool:
        return self._name in self._rec().values

    def get(self) -> Optional[tuple]:
        return self._rec().values.get(self._name)

    def update(self, newValue: tuple) -> None:
        if newValue is None:
            raise ValueError(f"ValueState {self._name!r}: update(None); use clear() to remove the value")
        self._touch().values[self._name] = tuple(newValue)

    def clear(self) -> None:
        r = self._rec()
        if self._name in r.values:
            del self._touch().values[self._name]


class RhinoListState(_RhinoState, ListState):
    def exists(self) -> bool:
        return bool(self._rec().lists.get(self._name))

    def get(self) -> Iterator[tuple]:
        return iter(list(self._rec().lists.get(self._name, ())))

    def put(self, newState: list) -> None:
        self._touch().lists[self._name] = [tuple(v) for v in newState]
        if not self._rec().lists[self._name]:
            del self._rec().lists[self._name]

    def appendValue(self, newState: tuple) -> None:
        self._touch().lists.setdefault(self._name, []).append(tuple(newState))

    def appendList(self, newState: list) -> None:
        if newState:
            self._touch().lists.setdefault(self._name, []).extend(tuple(v) for v in newState)

    def clear(self) -> None:
        r = self._rec()
        if self._name in r.lists:
            del self._touch().lists[self._name]


class RhinoMapState(_RhinoState, MapState):
    def _map(self) -> dict:
        return self._rec().maps.get(self._name, {})

    def exists(self) -> bool:
        return bool(self._map())

    def getValue(self, key: tuple) -> Optional[tuple]:
        return self._map().get(tuple(key))

    def containsKey(self, key: tuple) -> bool:
        return tuple(key) in self._map()

    def updateValue(self, key: tuple, value: tuple) -> None:
        self._touch().maps.setdefault(self._name, {})[tuple(key)] = tuple(value)

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        return iter(list(self._map().items()))

    def keys(self) -> Iterator[tuple]:
        return iter(list(self._map().keys()))

    def values(self) -> Iterator[tuple]:
        return iter(list(self._map().values()))

    def removeKey(self, key: tuple) -> None:
        m = self._map()
        k = tuple(key)
        if k in m:
            del self._touch().maps[self._name][k]
            if not self._rec().maps[self._name]:
                del self._rec().maps[self._name]

    def clear(self) -> None:
        r = self._rec()
        if self._name in r.maps:
            del self._touch().maps[self._name]


class RhinoProcessorHandle(StatefulProcessorHandle):
    """The handle of one processor instance in one task.

    ``_record`` is set by the task: a callable returning the current key's
    ``KeyRecord`` (loaded by the batch's prefetch)."""

    def __init__(self, time_mode: str) -> None:
        # PySpark's handle wraps an API client that talks to the JVM; there is none here.
        self._time_mode = time_mode.lower()
        self._record_of: Optional[Callable[[], KeyRecord]] = None
        self._states: dict[str, tuple[str, Any]] = {}
        self.watermark_ms = 0

    # ---- what the task sets --------------------------------------------------
    def _bind(self, record_of: Callable[[], KeyRecord]) -> None:
        self._record_of = record_of

    def _record(self) -> KeyRecord:
        if self._record_of is None:
            raise RuntimeError("state used outside handleInputRows / handleExpiredTimer "
                               "(rhino.spark sets the grouping key only for those calls)")
        return self._record_of()

    def _state(self, kind: str, name: str, cls: type) -> Any:
        got = self._states.get(name)
        if got is not None:
            if got[0] != kind:
                raise ValueError(f"state {name!r} is already a {got[0]}, not a {kind}")
            return got[1]
        st = cls(self, name)
        self._states[name] = (kind, st)
        return st

    # ---- PySpark's StatefulProcessorHandle ------------------------------------
    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ValueState:
        _no_ttl(stateName, ttlDurationMs)
        return self._state("ValueState", stateName, RhinoValueState)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ListState:
        _no_ttl(stateName, ttlDurationMs)
        return self._state("ListState", stateName, RhinoListState)

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,
                    ttlDurationMs: Optional[int] = None) -> MapState:
        _no_ttl(stateName, ttlDurationMs)
        return self._state("MapState", stateName, RhinoMapState)

    def _check_timers(self) -> None:
        if self._time_mode != "eventtime":
            raise UnsupportedFeatureError(
                f"timers need time_mode='EventTime' (this operator runs with {self._time_mode!r}); "
                "rhino.spark does not implement processing-time timers")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers()
        r = self._record()
        ts = int(expiryTimestampMs)
        if ts not in r.timers:
            r.timers.add(ts)
            r.dirty = True

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers()
        r = self._record()
        ts = int(expiryTimestampMs)
        if ts in r.timers:
            r.timers.discard(ts)
            r.dirty = True

    def listTimers(self) -> Iterator[int]:
        self._check_timers()
        return iter(sorted(self._record().timers))

    def deleteIfExists(self, stateName: str) -> None:
        r = self._record()
        for d in (r.values, r.lists, r.maps):
            if stateName in d:
                del d[stateName]
                r.dirty = True
