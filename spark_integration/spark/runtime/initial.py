"""Initial state, as ``transformWithState(..., initialState=...)``: the operator's first
batch carries the initial state's rows alongside its input.

Spark cogroups the input and the initial state by key and, in the query's first
batch, calls ``handleInitialState(key, rows, timerValues)`` for a key's initial
rows before ``handleInputRows`` for its input rows. Rhino does the same inside
the one stateful stage it already has: batch 0's input and the initial state
become one DataFrame (:func:`with_initial_state`), routed and sorted by key like
any batch, with a side column that sorts a key's initial rows first. A task
splits each key's rows by side (:class:`Sides`).

Because the initial state is applied inside batch 0, it commits with batch 0:
when batch 0 runs again (a failed attempt, a host lost, a Spark replay) every
instance rolls back first, so ``handleInitialState`` takes effect exactly once.
A later batch never sees it, as in Spark (a restarted query ignores it).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from rhino.errors import InvalidArgumentError

__all__ = ["SIDE", "INIT_PREFIX", "with_initial_state", "initial_frame", "Sides"]

SIDE = "__rhino_side"  # 0: an initial-state row, 1: an input row (a key's initial rows sort first)
INIT_PREFIX = "__rhino_init_"  # the initial state's own (non-key) columns, renamed apart


def initial_frame(initial_state: Any, key_columns: Sequence[str]) -> Any:
    """The initial state as a DataFrame: a DataFrame, or a ``GroupedData`` (Spark's form,
    ``df.groupBy(key)``) whose DataFrame has the operator's key columns."""
    from pyspark.sql import DataFrame, GroupedData

    if isinstance(initial_state, GroupedData):
        initial_state = initial_state._df
    if not isinstance(initial_state, DataFrame):
        raise InvalidArgumentError(f"initial_state must be a DataFrame or df.groupBy(<key>), not "
                                   f"{type(initial_state).__name__}")
    if initial_state.isStreaming:
        raise InvalidArgumentError("initial_state must be a batch DataFrame (a table), not a stream")
    missing = [c for c in key_columns if c not in initial_state.columns]
    if missing:
        raise InvalidArgumentError(f"the initial state lacks the key column(s) {missing} "
                                   f"(it has {initial_state.columns})")
    return initial_state


def with_initial_state(df: Any, initial: Any, key_columns: Sequence[str]) -> tuple[Any, list[str]]:
    """One DataFrame of ``df``'s rows and ``initial``'s: the key columns, :data:`SIDE`,
    ``df``'s other columns (null in initial rows) and ``initial``'s other columns under
    :data:`INIT_PREFIX` (null in input rows). Returns it and the initial state's columns."""
    from pyspark.sql import functions as F

    keys = list(key_columns)
    for k in keys:
        a, b = df.schema[k].dataType, initial.schema[k].dataType
        if a != b:
            raise InvalidArgumentError(f"key column {k!r} is {b.simpleString()} in the initial state but "
                                       f"{a.simpleString()} in the input: they must be the same type, as in Spark")
    data = [f for f in df.schema.fields if f.name not in keys]
    init = [f for f in initial.schema.fields if f.name not in keys]
    side = lambda v: F.lit(v).cast("int").alias(SIDE)  # noqa: E731
    null = lambda f, name: F.lit(None).cast(f.dataType).alias(name)  # noqa: E731
    rows = df.select(*keys, side(1), *[F.col(f"`{f.name}`") for f in data],
                     *[null(f, INIT_PREFIX + f.name) for f in init])
    inits = initial.select(*keys, side(0), *[null(f, f.name) for f in data],
                           *[F.col(f"`{f.name}`").alias(INIT_PREFIX + f.name) for f in init])
    return rows.unionByName(inits), list(initial.columns)


def _frame(pdf: Any, a: int, b: int, exact: list[str]) -> Any:
    """Rows [a, b) of ``pdf`` as a processor gets them, as on Spark: a fresh index from 0,
    and the ``exact`` columns (pandas' Int64, an integral column padded with nulls) as int64,
    or float64 where these rows hold a null (Spark's conversion of an integral column)."""
    import pandas as pd

    out = pdf.iloc[a:b]
    if exact:
        out = out.astype({c: ("float64" if out[c].hasnans else "int64") for c in exact})
    n = b - a
    index = _RANGES.get(n)
    if index is None:  # an index is immutable: frames of one length share one (a few µs a key)
        index = pd.RangeIndex(n)
        if n <= 64:
            _RANGES[n] = index
    out.index = index
    return out


_RANGES: dict[int, Any] = {}


def _exact(pdf: Any) -> list[str]:
    import pandas as pd

    return [c for c, t in pdf.dtypes.items() if isinstance(t, pd.Int64Dtype)]


class Sides:
    """A window's rows (pandas, sorted by key and side: ``glue.group_rows`` keeps the order
    within a key) seen as the input's and the initial state's: per key, :meth:`split` gives
    the key's initial rows, with the initial state's own columns, and where its input rows
    begin; :meth:`rows` a key's input rows. Columns are selected once per window, not per key."""

    def __init__(self, pdf: Any, key_columns: Sequence[str], input_columns: list[str],
                 initial_columns: Optional[list[str]]) -> None:
        self.initial_columns = initial_columns
        if initial_columns is None:
            self.data, self.side, self.init = pdf, None, None
            self.data_exact: list[str] = []
            return
        self.side = pdf[SIDE].to_numpy()
        self.data = pdf[input_columns]
        stored = [c if c in key_columns else INIT_PREFIX + c for c in initial_columns]
        self.init = pdf[stored].set_axis(initial_columns, axis=1)
        self.data_exact, self.init_exact = _exact(self.data), _exact(self.init)

    def rows(self, a: int, b: int) -> Any:
        """The key's input rows [a, b), as the processor gets them (:func:`_frame`)."""
        return _frame(self.data, a, b, self.data_exact)

    def split(self, a: int, b: int) -> tuple[Any, int]:
        """(the initial rows of the key in rows [a, b), or None; the first of its input rows)."""
        if self.side is None:
            return None, a
        n0 = int(np.count_nonzero(self.side[a:b] == 0))
        return (_frame(self.init, a, a + n0, self.init_exact) if n0 else None), a + n0
