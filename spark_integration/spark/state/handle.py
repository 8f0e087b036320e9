"""The ``StatefulProcessorHandle`` a processor gets in ``init`` when it runs on
Rhino: the same methods as PySpark's (``getValueState``, ``getListState``,
``getMapState``, ``registerTimer``, ``deleteTimer``, ``listTimers``,
``deleteIfExists``), served from the batch's state (``store.BatchState``): one
entry per value, list element, map entry and timer, prefetched for the batch.

The state objects subclass PySpark's ``ValueState`` / ``ListState`` /
``MapState``, so a processor that checks types still works. They act on the
grouping key the task sets before each ``handleInputRows`` /
``handleExpiredTimer`` call (as Spark's implicit key). Values are the tuples
of the declared schema, checked and encoded at the write-back (``codec.py``).

Values are written as Spark writes them: a number of another kind than its field's (a
float 120.0 in a long field, an int in a double one) becomes null, as Spark's JVM side
converts it (``_spark_number``). A variable that ``init`` got and then dropped with
``deleteIfExists`` (and did not get again) raises Spark's ``PySparkRuntimeError``, with
PySpark's message for the call, when it is used.

Timers need a time mode (``EventTime``: they fire at the watermark;
``ProcessingTime``: at the batch's time); with ``None`` they are refused, as in
Spark.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np
from pyspark.sql.streaming.stateful_processor import (ListState, MapState, StatefulProcessorHandle,
                                                      ValueState)

from pyspark.errors import PySparkRuntimeError

from .schema import StateSchemaError, type_kind
from .store import BatchState
from .variables import VarInfo

__all__ = ["RhinoProcessorHandle", "UnsupportedFeatureError"]


class UnsupportedFeatureError(NotImplementedError):
    """A transformWithState feature that rhino.spark does not implement, or not in this time mode."""


def _row(name: str, v: Any) -> tuple:
    if v is None:
        raise ValueError(f"state {name!r}: a value of None; use clear() to remove it")
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise StateSchemaError(f"state {name!r}: a value must be a tuple of the schema's fields, not "
                               f"{type(v).__name__} {v!r}")
    return tuple(v)


_INTEGRAL = frozenset(("byte", "short", "int", "long"))
_FLOATING = frozenset(("float", "double"))


def _spark_kinds(schema: Any) -> list[Optional[str]]:
    """Per field, its kind where Spark's numeric conversion applies to it (nullable integral,
    floating and boolean fields), else None."""
    kinds: list[Optional[str]] = []
    for f in schema.fields:
        k = type_kind(f.dataType)
        kinds.append(k if f.nullable and (k in _INTEGRAL or k in _FLOATING or k == "boolean") else None)
    return kinds


def _spark_number(kind: Optional[str], v: Any) -> Any:
    """A number as Spark stores it in a field of ``kind``: PySpark makes a numpy scalar a
    Python one and pickles the row to the JVM, where ``EvaluatePython.makeFromJava`` keeps an
    int in an integral field, a float in a float or double one and a bool in a boolean one;
    any other number there becomes null (a float 120.0 in a long field, an int in a double
    one, a bool in either). Other values are left to the codec's checks."""
    if kind is None:
        return v
    if isinstance(v, np.generic) and isinstance(v, (np.bool_, np.integer, np.floating)):
        v = v.item()
    t = type(v)
    if t is bool:
        return v if kind == "boolean" else None
    if t is int:
        return v if kind in _INTEGRAL else None
    if t is float:
        return v if kind in _FLOATING else None
    return v


def _spark_row(kinds: list[Optional[str]], row: tuple) -> tuple:
    if len(row) != len(kinds) or not any(kinds):
        return row  # the codec says what is wrong with the row
    return tuple(_spark_number(k, v) for k, v in zip(kinds, row))


class _RhinoState:
    _WHAT = ""  # "Value state" ...: how Spark names the kind in its error

    def __init__(self, st: "RhinoProcessorHandle", var: VarInfo) -> None:
        self._h = st
        self._var = var
        self._name = var.name
        self._kinds = _spark_kinds(var.codec.schema)
        self._key_kinds = _spark_kinds(var.key_codec.schema) if var.key_codec is not None else []

    def _value(self, v: Any) -> tuple:
        """A value row as Spark would store it (``_spark_number`` per field)."""
        return _spark_row(self._kinds, _row(self._name, v))

    def _key(self, v: Any) -> tuple:
        """A map's user key as Spark would store it."""
        return _spark_row(self._key_kinds, _row(self._name, v))

    @property
    def _st(self) -> BatchState:
        return self._h._state()

    def _usable(self, error: str) -> None:
        """Raises Spark's error where Spark's state server refuses the call: the variable was
        dropped by ``deleteIfExists`` in ``init`` after this object was got (and not got again).
        ``error``: PySpark's message for the call (its ``*_state_client.py``)."""
        if self._name in self._h.unusable:
            raise PySparkRuntimeError(f"{error}: {self._WHAT} {self._name} is not initialized.")

    def _gone(self) -> bool:
        """Whether the variable is dropped (where Spark answers as empty instead of raising)."""
        return self._name in self._h.unusable


class RhinoValueState(_RhinoState, ValueState):
    _WHAT = "Value state"

    def exists(self) -> bool:
        self._usable("Error checking value state exists")
        return self._st.value(self._var).value is not None

    def get(self) -> Optional[tuple]:
        self._usable("Error getting value state")
        return self._st.value(self._var).value

    def update(self, newValue: tuple) -> None:
        self._usable("Error updating value state")
        cell = self._st.value(self._var)
        cell.value = self._value(newValue)
        cell.expiry = self._st.expiry_for(self._var)
        cell.dirty = True

    def clear(self) -> None:
        self._usable("Error clearing value state")
        cell = self._st.value(self._var)
        if cell.value is not None:
            cell.value, cell.expiry, cell.dirty = None, None, True


class RhinoListState(_RhinoState, ListState):
    _WHAT = "List state"

    def _items(self) -> Iterator[tuple]:
        if self._gone():
            return
        st = self._st
        cell = st.list_cell(self._var)
        if not cell.replaced:
            if cell.complete:
                yield from (v for _, v, _ in cell.stored)
            else:
                yield from st.stream_list(self._var, cell)
        yield from (v for v, _ in cell.appended)

    def exists(self) -> bool:
        self._usable("Error checking value state exists")  # sic: PySpark's list_state_client
        cell = self._st.list_cell(self._var)
        if cell.appended or (not cell.replaced and cell.stored):
            return True
        return not cell.replaced and not cell.complete and next(self._items(), None) is not None

    def get(self) -> Iterator[tuple]:
        return self._items()

    def put(self, newState: list) -> None:
        self._usable("Error updating value state")
        rows = [self._value(v) for v in newState]
        if not rows:
            raise ValueError(f"ListState {self._name!r}: put([]) with an empty list; use clear() to remove "
                             "the list (Spark refuses an empty put too)")
        cell = self._st.list_cell(self._var)
        e = self._st.expiry_for(self._var)
        cell.replaced = True
        cell.appended = [(r, e) for r in rows]

    def appendValue(self, newState: tuple) -> None:
        self._usable("Error updating value state")
        cell = self._st.list_cell(self._var)
        cell.appended.append((self._value(newState), self._st.expiry_for(self._var)))

    def appendList(self, newState: list) -> None:
        self._usable("Error updating value state")
        rows = [self._value(v) for v in newState]
        if rows:
            e = self._st.expiry_for(self._var)
            self._st.list_cell(self._var).appended.extend((r, e) for r in rows)

    def clear(self) -> None:
        self._usable("Error clearing value state")
        cell = self._st.list_cell(self._var)
        cell.replaced = True
        cell.appended = []


class RhinoMapState(_RhinoState, MapState):
    _WHAT = "Map state"
    _value_row: Any = None  # the Row class of getValue's answers, made at the first

    def _kb(self, key: Any) -> bytes:
        return self._var.key_codec.encode([self._key(key)])[0]

    def _lookup(self, key: Any) -> Optional[tuple]:
        """(user key, value, expiry) of one entry, or None."""
        st = self._st
        cell = st.map_cell(self._var)
        kb = self._kb(key)
        if kb in cell.changes:
            return cell.changes[kb]
        if cell.cleared:
            return None
        got = cell.stored.get(kb)
        if got is not None or cell.complete:
            return got
        return st.map_get(self._var, cell, kb)

    def exists(self) -> bool:
        self._usable("Error checking map state exists")
        return next(self._entries(), None) is not None

    def getValue(self, key: tuple) -> Optional[tuple]:
        """The value as Spark's ``getValue`` gives it: a ``Row`` with the value schema's field
        names (its other reads give tuples)."""
        self._usable("Error getting value")
        got = self._lookup(key)
        if got is None:
            return None
        if self._value_row is None:
            from pyspark.sql import Row

            self._value_row = Row(*self._var.codec.schema.names)
        return self._value_row(*got[1])

    def containsKey(self, key: tuple) -> bool:
        self._usable("Error checking if map state contains key")
        return self._lookup(key) is not None

    def updateValue(self, key: tuple, value: tuple) -> None:
        self._usable("Error updating map state value")
        k = self._key(key)
        kb = self._var.key_codec.encode([k])[0]
        self._st.map_cell(self._var).changes[kb] = (k, self._value(value), self._st.expiry_for(self._var))

    def _entries(self) -> Iterator[tuple[tuple, tuple]]:
        if self._gone():
            return
        st = self._st
        cell = st.map_cell(self._var)
        if not cell.cleared:
            stored = (((kb, uk, v) for kb, (uk, v, _) in cell.stored.items()) if cell.complete
                      else st.stream_map(self._var))
            for kb, uk, v in stored:
                if kb not in cell.changes:
                    yield uk, v
        for ch in list(cell.changes.values()):
            if ch is not None:
                yield ch[0], ch[1]

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        return self._entries()

    def keys(self) -> Iterator[tuple]:
        return (k for k, _ in self._entries())

    def values(self) -> Iterator[tuple]:
        return (v for _, v in self._entries())

    def removeKey(self, key: tuple) -> None:
        self._usable("Error removing key from map state")
        kb = self._kb(key)
        self._st.map_cell(self._var).changes[kb] = None

    def clear(self) -> None:
        self._usable("Error clearing map state")
        cell = self._st.map_cell(self._var)
        cell.cleared = True
        cell.changes = {}


_KINDS = {"value": ("ValueState", RhinoValueState), "list": ("ListState", RhinoListState),
          "map": ("MapState", RhinoMapState)}


class RhinoProcessorHandle(StatefulProcessorHandle):
    """The handle of one processor instance in one task. The task binds the batch's
    :class:`~rhino.spark.state.store.BatchState` (``_bind``) before ``init``."""

    def __init__(self, time_mode: str, variables: dict[str, VarInfo]) -> None:
        # PySpark's handle wraps an API client that talks to the JVM; there is none here.
        self._time_mode = time_mode.lower()
        self._vars = variables
        self._batch: Optional[BatchState] = None
        self._states: dict[str, Any] = {}
        self.watermark_ms = 0
        self.dropped: set[str] = set()  # variables deleteIfExists dropped in init()
        # dropped after they were got, and not got again: unusable, as on Spark (its state
        # server refuses a variable whose column family was removed)
        self.unusable: set[str] = set()

    def _bind(self, st: BatchState) -> None:
        self._batch = st

    def _state(self) -> BatchState:
        if self._batch is None:
            raise RuntimeError("state used outside a batch")
        return self._batch

    def _get(self, kind: str, name: str) -> Any:
        var = self._vars.get(name)
        if var is None:
            raise StateSchemaError(f"state {name!r} was not declared when the operator started (rhino.spark "
                                   "reads the declared state variables from init() on the driver)")
        if var.kind != kind:
            raise StateSchemaError(f"state {name!r} is a {_KINDS[var.kind][0]}, not a {_KINDS[kind][0]}")
        self.unusable.discard(name)
        st = self._states.get(name)
        if st is None:
            st = self._states[name] = _KINDS[kind][1](self, var)
        return st

    # ---- PySpark's StatefulProcessorHandle ------------------------------------
    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ValueState:
        return self._get("value", stateName)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: Optional[int] = None) -> ListState:
        return self._get("list", stateName)

    def getMapState(self, stateName: str, userKeySchema: Any, valueSchema: Any,
                    ttlDurationMs: Optional[int] = None) -> MapState:
        return self._get("map", stateName)

    def _check_timers(self) -> None:
        if self._time_mode == "none":
            raise UnsupportedFeatureError(
                "timers need time_mode='EventTime' or 'ProcessingTime' (this operator runs with time mode "
                "'None'), as in Spark")

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers()
        self._state().timer_cell().now.add(int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._check_timers()
        self._state().timer_cell().now.discard(int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        self._check_timers()
        return iter(sorted(self._state().timer_cell().now))

    def deleteIfExists(self, stateName: str) -> None:
        """In ``init``: the variable is dropped, every key's entries (Spark drops its column
        family); the task deletes them before the batch's rows (``dropped``). For one key
        (from ``handleInputRows`` or a timer): that key's value, list or map."""
        var = self._vars.get(stateName)
        if var is None:
            return
        if self._batch is None or self._batch.current is None:
            self.dropped.add(stateName)
            self.unusable.add(stateName)
            return
        self._get(var.kind, stateName).clear()

    def heads_dropped(self) -> list[bytes]:
        """The key heads of the variables ``init`` dropped (``layout.Heads``)."""
        return [self._vars[n].heads.head for n in sorted(self.dropped)]
