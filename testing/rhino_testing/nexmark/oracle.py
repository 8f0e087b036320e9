"""Independent pandas answers to NEXMark Q5, Q8 and Q11, to check the processors against.

Nothing here is shared with :mod:`.queries` (only the generator's flat event columns are
assumed): each query is a whole-table pandas computation over all events at once.

* :func:`compute` ``(name, events_pdf, **params)`` -> DataFrame with the query's output columns
  (times in epoch ms), sorted;
* :func:`closed` ``(name, out_pdf, watermark_ms, **params)`` -> the rows that are final at that
  watermark: a window or session is closed when its closing time (Q5 ``window_end``, Q8
  ``window_start + window_ms``, Q11 ``session_end``) is ``<= watermark_ms``, which is when
  an event-time timer at that time fires. A finite stream's last windows stay open, so tests
  compare ``closed(oracle)`` with the streaming output at the final watermark.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["COLUMNS", "DEFAULTS", "closed", "compute", "q5", "q8", "q11", "ts_ms"]

COLUMNS = {
    "q5": ["window_start", "window_end", "auction", "count"],
    "q8": ["person_id", "name", "reserve", "window_start"],
    "q11": ["bidder", "bid_count", "session_start", "session_end"],
}
DEFAULTS = {"q5": {"window_ms": 10_000, "slide_ms": 5_000}, "q8": {"window_ms": 10_000},
            "q11": {"gap_ms": 10_000}}


def ts_ms(series: pd.Series) -> np.ndarray:
    """Epoch milliseconds of a timestamp column (tz-aware or naive UTC) or of int64 ms."""
    if pd.api.types.is_integer_dtype(series):
        return series.to_numpy(dtype=np.int64)
    s = pd.to_datetime(series, utc=True)
    return ((s - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)).to_numpy(dtype=np.int64)


def _sorted(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return df[COLUMNS[name]].sort_values(COLUMNS[name], kind="stable").reset_index(drop=True)


def q5(events: pd.DataFrame, window_ms: int = 10_000, slide_ms: int = 5_000) -> pd.DataFrame:
    """Hot items: per sliding window, every auction with the most bids."""
    bids = events[events["event_type"] == 2]
    t = ts_ms(bids["ts"])
    auction = bids["auction"].to_numpy(dtype=np.int64)
    parts = []
    # Every window start s = k * slide with s <= t < s + window; the latest is floor(t / slide) * slide.
    latest = np.floor_divide(t, slide_ms) * slide_ms
    back = 0
    while back * slide_ms < window_ms:
        s = latest - back * slide_ms
        inside = t < s + window_ms
        parts.append(pd.DataFrame({"window_start": s[inside], "auction": auction[inside]}))
        back += 1
    pairs = pd.concat(parts, ignore_index=True)
    counts = pairs.groupby(["window_start", "auction"]).size().rename("count").reset_index()
    top = counts.groupby("window_start")["count"].transform("max")
    out = counts[counts["count"] == top].copy()
    out["window_end"] = out["window_start"] + window_ms
    return _sorted(out.astype({"window_start": np.int64, "window_end": np.int64, "auction": np.int64,
                               "count": np.int64}), "q5")


def q8(events: pd.DataFrame, window_ms: int = 10_000) -> pd.DataFrame:
    """New users: persons joined with the auctions they open in the same tumbling window."""
    people = events[events["event_type"] == 0]
    auctions = events[events["event_type"] == 1]
    p = pd.DataFrame({"person_id": people["person_id"].to_numpy(dtype=np.int64),
                      "name": people["name"].to_numpy(),
                      "window_start": np.floor_divide(ts_ms(people["ts"]), window_ms) * window_ms})
    a = pd.DataFrame({"person_id": auctions["seller"].to_numpy(dtype=np.int64),
                      "reserve": auctions["reserve"].to_numpy(dtype=np.int64),
                      "window_start": np.floor_divide(ts_ms(auctions["ts"]), window_ms) * window_ms})
    return _sorted(p.merge(a, on=["person_id", "window_start"], how="inner"), "q8")


def q11(events: pd.DataFrame, gap_ms: int = 10_000) -> pd.DataFrame:
    """User sessions: per bidder, bids no more than ``gap_ms`` apart, closed ``gap_ms`` after the last."""
    bids = events[events["event_type"] == 2]
    df = pd.DataFrame({"bidder": bids["bidder"].to_numpy(dtype=np.int64), "t": ts_ms(bids["ts"])})
    df = df.sort_values(["bidder", "t"], kind="stable").reset_index(drop=True)
    new_bidder = df["bidder"].ne(df["bidder"].shift())
    gap = df["t"].diff().fillna(np.inf) >= gap_ms
    df["session"] = (new_bidder | gap).cumsum()
    out = df.groupby("session").agg(bidder=("bidder", "first"), bid_count=("t", "size"),
                                    session_start=("t", "min"), last=("t", "max"))
    out["session_end"] = out["last"] + gap_ms
    return _sorted(out.astype({"bid_count": np.int64}), "q11")


_QUERIES = {"q5": q5, "q8": q8, "q11": q11}


def compute(name: str, events: pd.DataFrame, **params: int) -> pd.DataFrame:
    """The query's full answer over all of ``events`` (every window, closed or not)."""
    return _QUERIES[name](events, **params)


def closed(name: str, out: pd.DataFrame, watermark_ms: int, **params: int) -> pd.DataFrame:
    """The rows of ``out`` whose window/session closes at or before ``watermark_ms``, sorted."""
    if name == "q5":
        closing = out["window_end"]
    elif name == "q8":
        closing = out["window_start"] + int(params.get("window_ms", DEFAULTS["q8"]["window_ms"]))
    elif name == "q11":
        closing = out["session_end"]
    else:
        raise KeyError(name)
    return _sorted(out[closing.astype(np.int64) <= watermark_ms], name)
