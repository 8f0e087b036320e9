"""NEXMark Q5, Q8 and Q11 as standard PySpark ``StatefulProcessor``s (pandas mode).

Each query is a :class:`Query` in :data:`QUERIES` (``"q5"``, ``"q8"``, ``"q11"``)::

    q = QUERIES["q5"]
    prepared = q.prepare(events.withWatermark(q.event_time_column, q.watermark_delay))
    out = prepared.groupBy(*q.key).transformWithStateInPandas(
        q.processor_factory(), q.output_schema, q.output_mode, q.time_mode)
    # or simply: out = q.transform(events)

``prepare(df, **params)`` is the stateless step from the flat event stream
(:data:`~rhino_testing.nexmark.generator.SPARK_SCHEMA_DDL`) to the processor's input; it keeps
the event-time column ``ts`` (so a watermark set before or after it applies) and adds ``ts_ms``
(epoch milliseconds, what the processors read). ``params`` are the window sizes, the same for
``prepare`` and ``processor_factory`` (defaults Beam's): Q5 ``window_ms=10000, slide_ms=5000``,
Q8 ``window_ms=10000``, Q11 ``gap_ms=10000``. All times in outputs are epoch milliseconds
(BIGINT).

The processors use only the public API: ``handle.getValueState/getListState/getMapState`` and
``handle.registerTimer/deleteTimer/listTimers`` with event-time timers; output comes only from
``handleExpiredTimer``, i.e. once the watermark passes a window's (session's) closing time, so
every output row is final. ``handleInputRows`` does its state work eagerly and returns an
(often empty) iterator of DataFrames. They do not depend on the order of keys, of rows within a
key, or of the DataFrames of one call: rows are sorted before use and outputs are sorted, so the
same batches give the same outputs and the same state. Rows at or below the current watermark
are dropped, as Spark's own late-event filter does (a runtime that does not filter gets the same
results).

Watermark: the nexmark source's event time never decreases with the event id and a micro-batch
is an id range, so a delay of 1 ms is enough: with delay 0, Spark would drop as late the events
of a batch that share the millisecond of the previous batch's newest event (the late filter is
``ts <= watermark``). :data:`WATERMARK_DELAY` is that delay; a source with out-of-order event
time needs a larger one.

Query choices:

* **Q5** (hot items): key ``window_start``; ``prepare`` explodes each bid into the sliding
  windows that contain it (``window_start`` a multiple of ``slide_ms``, ``window_start <= ts <
  window_start + window_ms``). MapState ``auction -> count``; a timer at the window end emits
  every auction at the window's maximum count (ties: all) as ``(window_start, window_end,
  auction, count)`` and clears the window. Small, read-modify-write state.
* **Q8** (new users): key ``person_id`` (persons by ``person_id``, auctions by ``seller``);
  tumbling windows ``window_start = ts - ts % window_ms``. The full person and auction records
  (with payload) are appended to ListStates: large, append-only state. A timer at the window
  end emits Beam's form, once per matching (person, auction) pair of that window,
  ``(person_id, name, reserve, window_start)`` (``window_start`` added so results of different
  windows are told apart), then removes that window's records.
* **Q11** (user sessions): key ``bidder``; session windows with gap ``gap_ms``: a bid at ``t``
  joins a session ``[start, last]`` when ``t < last + gap_ms`` (sessions merge when their
  ``[start, last + gap)`` spans overlap). ListState of open sessions ``(start, last, count)``,
  one timer per session at ``last + gap_ms``; when it fires the session is emitted as
  ``(bidder, bid_count, session_start, session_end = last + gap_ms)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from .generator import AUCTION, BID, PERSON

__all__ = ["QUERIES", "Query", "Q5HotItems", "Q8NewUsers", "Q11UserSessions", "WATERMARK_DELAY",
           "WATERMARK_DELAY_MS"]

WATERMARK_DELAY = "1 millisecond"
WATERMARK_DELAY_MS = 1

Q5_OUTPUT = "window_start BIGINT, window_end BIGINT, auction BIGINT, count BIGINT"
Q8_OUTPUT = "person_id BIGINT, name STRING, reserve BIGINT, window_start BIGINT"
Q11_OUTPUT = "bidder BIGINT, bid_count BIGINT, session_start BIGINT, session_end BIGINT"


def _concat(rows: Iterator[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in rows if len(f)]
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _on_time(pdf: pd.DataFrame, timer_values: TimerValues) -> pd.DataFrame:
    """The rows after the current watermark (Spark's late-event filter, repeated here)."""
    if pdf.empty:
        return pdf
    wm = timer_values.getCurrentWatermarkInMs()
    if wm is None or wm < 0:
        return pdf
    return pdf[pdf["ts_ms"].to_numpy(dtype=np.int64) > wm]


def _ts_ms() -> Any:
    return F.unix_millis(F.col("ts")).alias("ts_ms")


# --------------------------------------------------------------------------- Q5

def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if int(v) <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")


def prepare_q5(df: DataFrame, window_ms: int = 10_000, slide_ms: int = 5_000) -> DataFrame:
    """Bids exploded into their sliding windows: ``window_start, auction, ts, ts_ms``."""
    _check_positive(window_ms=window_ms, slide_ms=slide_ms)
    n = -(-window_ms // slide_ms)
    ts_ms = F.col("ts_ms")
    return (df.where(F.col("event_type") == BID)
            .select("auction", "ts", _ts_ms())
            .withColumn("_i", F.explode(F.sequence(F.lit(0), F.lit(n - 1))))
            .withColumn("window_start", ts_ms - F.pmod(ts_ms, F.lit(slide_ms)) - F.col("_i") * slide_ms)
            .where(F.col("window_start") + window_ms > ts_ms)
            .select("window_start", "auction", "ts", "ts_ms"))


class Q5HotItems(StatefulProcessor):
    """Per window (key ``window_start``): bids per auction; at the window's end, the auctions at
    the maximum count (all of them on a tie)."""

    def __init__(self, window_ms: int = 10_000, slide_ms: int = 5_000) -> None:
        _check_positive(window_ms=window_ms, slide_ms=slide_ms)
        self.window_ms = int(window_ms)
        self.slide_ms = int(slide_ms)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.counts = handle.getMapState("counts", "auction BIGINT", "count BIGINT")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        pdf = _on_time(_concat(rows), timerValues)
        if pdf.empty:
            return iter([])
        window_end = int(key[0]) + self.window_ms
        counts = pdf["auction"].astype(np.int64).value_counts().sort_index()
        for auction, n in zip(counts.index.tolist(), counts.tolist()):
            old = self.counts.getValue((auction,))
            self.counts.updateValue((auction,), ((int(old[0]) if old is not None else 0) + n,))
        if window_end not in set(self.handle.listTimers()):
            self.handle.registerTimer(window_end)
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        window_start = int(key[0])
        entries = [(int(k[0]), int(v[0])) for k, v in self.counts.iterator()]
        self.counts.clear()
        if not entries:
            return iter([])
        top = max(c for _, c in entries)
        hot = sorted(a for a, c in entries if c == top)
        return iter([pd.DataFrame({
            "window_start": np.full(len(hot), window_start, dtype=np.int64),
            "window_end": np.full(len(hot), window_start + self.window_ms, dtype=np.int64),
            "auction": np.array(hot, dtype=np.int64),
            "count": np.full(len(hot), top, dtype=np.int64),
        })])

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- Q8

_Q8_COLUMNS = ["person_id", "kind", "ts", "ts_ms", "name", "email", "city", "state", "auction_id",
               "category", "initial_bid", "reserve", "expires_ms", "payload"]
Q8_PERSON_STATE = ("window_start BIGINT, ts_ms BIGINT, person_id BIGINT, name STRING, email STRING, "
                   "city STRING, state STRING, payload BINARY")
Q8_AUCTION_STATE = ("window_start BIGINT, ts_ms BIGINT, auction_id BIGINT, seller BIGINT, category BIGINT, "
                    "initial_bid BIGINT, reserve BIGINT, expires_ms BIGINT, payload BINARY")


def prepare_q8(df: DataFrame, window_ms: int = 10_000) -> DataFrame:
    """Persons and auctions keyed by the person (``seller`` for auctions); ``kind`` 0/1."""
    _check_positive(window_ms=window_ms)
    et = F.col("event_type")
    return (df.where(et.isin(PERSON, AUCTION))
            .select(F.when(et == PERSON, F.col("person_id")).otherwise(F.col("seller")).alias("person_id"),
                    et.alias("kind"), "ts", _ts_ms(), "name", "email", "city", "state", "auction_id",
                    "category", "initial_bid", "reserve", F.unix_millis(F.col("expires")).alias("expires_ms"),
                    "payload"))


def _ints(s: pd.Series) -> list[int]:
    return s.astype(np.int64).tolist()


class Q8NewUsers(StatefulProcessor):
    """Per person: the person's record and the records of its auctions, by tumbling window; at
    a window's end, one row per (person, auction) pair of that window."""

    def __init__(self, window_ms: int = 10_000) -> None:
        _check_positive(window_ms=window_ms)
        self.window_ms = int(window_ms)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.persons = handle.getListState("persons", Q8_PERSON_STATE)
        self.auctions = handle.getListState("auctions", Q8_AUCTION_STATE)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        # Plain NumPy and lists rather than pandas operations: a key has a few rows per batch,
        # where pandas' fixed cost per call (about 4 ms a key here) would be most of the work
        # of both systems' tasks.
        pdf = _concat(rows)
        if pdf.empty:
            return iter([])
        person_id = int(key[0])
        ts = pdf["ts_ms"].to_numpy(dtype=np.int64)
        windows = ts - ts % self.window_ms
        kind = pdf["kind"].to_numpy(dtype=np.int64)
        wm = timerValues.getCurrentWatermarkInMs()
        on_time = ts > wm if wm is not None and wm >= 0 else np.ones(len(ts), dtype=bool)
        payload = pdf["payload"].to_numpy()
        persons = np.flatnonzero(on_time & (kind == PERSON)).tolist()
        auctions = np.flatnonzero(on_time & (kind == AUCTION)).tolist()
        if persons:
            name, email, city, state = (pdf[c].to_numpy() for c in ("name", "email", "city", "state"))
            persons.sort(key=lambda i: (ts[i], name[i]))  # list.sort is stable, as Spark's is
            self.persons.appendList([
                (int(windows[i]), int(ts[i]), person_id, name[i], email[i], city[i], state[i], bytes(payload[i]))
                for i in persons])
        if auctions:
            auction_id, category, initial_bid, reserve, expires_ms = (
                pdf[c].to_numpy()[auctions].astype(np.int64).tolist()
                for c in ("auction_id", "category", "initial_bid", "reserve", "expires_ms"))
            order = sorted(range(len(auctions)), key=lambda j: (ts[auctions[j]], auction_id[j]))
            self.auctions.appendList([
                (int(windows[auctions[j]]), int(ts[auctions[j]]), auction_id[j], person_id, category[j],
                 initial_bid[j], reserve[j], expires_ms[j], bytes(payload[auctions[j]]))
                for j in order])
        if not persons and not auctions:
            return iter([])
        registered = set(self.handle.listTimers())
        ends = {int(w) + self.window_ms for w in np.unique(windows[on_time])}
        for end in sorted(ends - registered):
            self.handle.registerTimer(end)
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        window_start = expiredTimerInfo.getExpiryTimeInMs() - self.window_ms
        persons = [tuple(p) for p in self.persons.get()]
        auctions = [tuple(a) for a in self.auctions.get()]
        these_p = sorted((p for p in persons if p[0] == window_start), key=lambda p: (p[1], p[2]))
        these_a = sorted((a for a in auctions if a[0] == window_start), key=lambda a: (a[1], a[2]))
        for state, records, these in ((self.persons, persons, these_p), (self.auctions, auctions, these_a)):
            if not these:
                continue
            rest = [r for r in records if r[0] != window_start]
            if rest:
                state.put(rest)
            else:
                state.clear()
        pairs = [(p[2], p[3], a[6]) for p in these_p for a in these_a]
        if not pairs:
            return iter([])
        return iter([pd.DataFrame({
            "person_id": np.array([x[0] for x in pairs], dtype=np.int64),
            "name": [x[1] for x in pairs],
            "reserve": np.array([x[2] for x in pairs], dtype=np.int64),
            "window_start": np.full(len(pairs), window_start, dtype=np.int64),
        })])

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- Q11

def prepare_q11(df: DataFrame, gap_ms: int = 10_000) -> DataFrame:
    """Bids: ``bidder, ts, ts_ms``."""
    _check_positive(gap_ms=gap_ms)
    return df.where(F.col("event_type") == BID).select("bidder", "ts", _ts_ms())


class Q11UserSessions(StatefulProcessor):
    """Per bidder: open sessions ``(start, last, count)``; a session is emitted when the watermark
    reaches ``last + gap_ms``."""

    def __init__(self, gap_ms: int = 10_000) -> None:
        _check_positive(gap_ms=gap_ms)
        self.gap_ms = int(gap_ms)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.sessions = handle.getListState("sessions", "start_ms BIGINT, last_ms BIGINT, count BIGINT")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        pdf = _on_time(_concat(rows), timerValues)
        if pdf.empty:
            return iter([])
        gap = self.gap_ms
        ts = np.sort(pdf["ts_ms"].to_numpy(dtype=np.int64))
        # This batch's own sessions: a new one wherever consecutive bids are >= gap apart.
        cut = np.flatnonzero(np.diff(ts) >= gap) + 1
        starts = np.concatenate(([0], cut))
        ends = np.concatenate((cut, [len(ts)]))
        spans = [(int(ts[s]), int(ts[e - 1]), int(e - s)) for s, e in zip(starts, ends)]
        old = [(int(s[0]), int(s[1]), int(s[2])) for s in self.sessions.get()]
        merged: list[list[int]] = []
        for start, last, count in sorted(old + spans):
            if merged and start < merged[-1][1] + gap:
                merged[-1][1] = max(merged[-1][1], last)
                merged[-1][2] += count
            else:
                merged.append([start, last, count])
        self.sessions.put([tuple(m) for m in merged])
        want = {last + gap for _, last, _ in merged}
        have = set(self.handle.listTimers())
        for t in sorted(have - want):
            self.handle.deleteTimer(t)
        for t in sorted(want - have):
            self.handle.registerTimer(t)
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        sessions = sorted((int(s[0]), int(s[1]), int(s[2])) for s in self.sessions.get())
        done = [s for s in sessions if s[1] + self.gap_ms <= expiry]
        rest = [s for s in sessions if s[1] + self.gap_ms > expiry]
        if not done:
            return iter([])
        if rest:
            self.sessions.put(rest)
        else:
            self.sessions.clear()
        bidder = int(key[0])
        return iter([pd.DataFrame({
            "bidder": np.full(len(done), bidder, dtype=np.int64),
            "bid_count": np.array([s[2] for s in done], dtype=np.int64),
            "session_start": np.array([s[0] for s in done], dtype=np.int64),
            "session_end": np.array([s[1] + self.gap_ms for s in done], dtype=np.int64),
        })])

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Query:
    """One NEXMark query: the stateless step, the key, the processor and what running it needs."""

    name: str
    key: list[str]
    output_schema: str
    defaults: Mapping[str, int]
    processor_class: type[StatefulProcessor]
    prepare_fn: Callable[..., DataFrame] = field(repr=False)
    watermark_delay: str = WATERMARK_DELAY
    watermark_delay_ms: int = WATERMARK_DELAY_MS
    event_time_column: str = "ts"
    time_mode: str = "EventTime"
    output_mode: str = "Append"

    def params(self, **overrides: int) -> dict[str, int]:
        """The defaults with ``overrides`` applied (unknown names are an error)."""
        unknown = set(overrides) - set(self.defaults)
        if unknown:
            raise TypeError(f"{self.name}: unknown parameter(s) {sorted(unknown)}; "
                            f"known: {sorted(self.defaults)}")
        return {**self.defaults, **{k: int(v) for k, v in overrides.items()}}

    def prepare(self, df: DataFrame, **params: int) -> DataFrame:
        return self.prepare_fn(df, **self.params(**params))

    def processor_factory(self, **params: int) -> StatefulProcessor:
        return self.processor_class(**self.params(**params))

    def transform(self, events: DataFrame, **params: int) -> DataFrame:
        """The whole query on Spark's own ``transformWithStateInPandas`` (watermark included)."""
        prepared = self.prepare(events.withWatermark(self.event_time_column, self.watermark_delay), **params)
        return prepared.groupBy(*self.key).transformWithStateInPandas(
            self.processor_factory(**params), self.output_schema, self.output_mode, self.time_mode)


QUERIES: dict[str, Query] = {
    "q5": Query("q5", ["window_start"], Q5_OUTPUT, {"window_ms": 10_000, "slide_ms": 5_000}, Q5HotItems,
                prepare_q5),
    "q8": Query("q8", ["person_id"], Q8_OUTPUT, {"window_ms": 10_000}, Q8NewUsers, prepare_q8),
    "q11": Query("q11", ["bidder"], Q11_OUTPUT, {"gap_ms": 10_000}, Q11UserSessions, prepare_q11),
}
