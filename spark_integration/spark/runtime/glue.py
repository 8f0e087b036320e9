"""Rhino's per-record glue in a task: grouping a batch's rows by key, and
gathering the processor's outputs. Kept apart from the task's protocol steps
so ``bench/rhino_bench/spark/glue.py`` can time them against the naive forms they replaced
(bench/results/spark_glue.md has the profile and the figures).

- Grouping: one stable sort of the rows by key code, then each key's rows are a
  contiguous slice (a cheap view), instead of a fancy-indexed copy per key.
- Outputs: the processor yields one small DataFrame per key (or per fired
  timer); ``pd.concat`` of thousands of them costs more than the processor.
  Columns are concatenated with NumPy instead, then one DataFrame is built.
  They are folded as they come (:class:`OutputFrames`), so that at most a few
  hundred are alive: a DataFrame is some fifty objects that Python's cyclic
  garbage collector walks at every collection (alone, a new frame cost 50 µs,
  75 µs with 20,000 kept and 94 µs with 100,000). In a whole task at 1M keys the
  gain was within the run-to-run noise (bench/README.md, "The task's per-key
  cost").
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from .routing import routing_keys

__all__ = ["group_rows", "concat_frames", "OutputFrames"]


def group_rows(table: pa.Table, pdf: pd.DataFrame, key_columns: list[str]
               ) -> tuple[pd.DataFrame, list[tuple[bytes, tuple, int, int]]]:
    """The rows sorted by key, and per key: (the key's routing bytes, the key tuple as
    the processor gets it, first row, end row) in order of first appearance."""
    rks = routing_keys(table, key_columns)
    codes, uniques = pd.factorize(pd.Series(rks, dtype=object), sort=False)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    ends = np.r_[starts[1:], len(order)]
    spdf = pdf.take(order).reset_index(drop=True)
    keyvals = [spdf[c].to_numpy(dtype=object)[starts] for c in key_columns]
    groups = []
    for j, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        kt = tuple(v[j].item() if isinstance(v[j], np.generic) else v[j] for v in keyvals)
        groups.append((uniques[sorted_codes[a]], kt, a, b))
    return spdf, groups


def concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat(frames, ignore_index=True)`` for many small frames with the same columns,
    by column: far cheaper than pandas' general concat for thousands of frames."""
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return pd.DataFrame()
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    cols = list(frames[0].columns)
    dt = frames[0].dtypes
    one = dt.iloc[0] if cols else None
    # Only frames of one numeric dtype are stacked as 2-D blocks; anything else (strings, mixed
    # int/float columns, whose block would upcast int64 to float64 and lose bits above 2**53)
    # takes pandas' general concat.
    if (not cols or dt.nunique() != 1 or not isinstance(one, np.dtype) or one.kind not in "biufcmM"
            or any(list(f.columns) != cols for f in frames)):
        return pd.concat(frames, ignore_index=True)
    blocks = [f.to_numpy() for f in frames]
    if all(b.dtype == blocks[0].dtype for b in blocks):
        return pd.DataFrame(np.concatenate(blocks), columns=cols)
    return pd.concat(frames, ignore_index=True)


class OutputFrames:
    """The processor's output frames of a window, folded (``concat_frames``) every ``fold``
    of them, so that at most about ``fold`` + n / ``fold`` DataFrames are alive at once (the
    module's docstring says why). ``frames()`` is what ``concat_frames`` of all of them,
    in order, gives the same rows from."""

    def __init__(self, fold: int = 256) -> None:
        self.fold = fold
        self.done: list[pd.DataFrame] = []
        self.pending: list[pd.DataFrame] = []

    def append(self, frame: pd.DataFrame) -> None:
        self.pending.append(frame)
        if len(self.pending) >= self.fold:
            self.done.append(concat_frames(self.pending))
            self.pending = []

    def frames(self) -> list[pd.DataFrame]:
        return self.done + self.pending

    def __len__(self) -> int:
        return len(self.done) + len(self.pending)

