"""NEXMark Q5, Q8, Q11 (rhino_testing.nexmark.queries) and their pandas oracles.

* Beam's known Q5 answer (NEXMARK.md, SqlQuery5Test) through PySpark's own ``TwsTester``, with
  the windows of each bid written out by hand; hand-computed Q8 and Q11 cases the same way.
* Q5, Q8, Q11 on generated data run on Spark's own ``transformWithStateInPandas`` with the
  RocksDB state store (local[2], the nexmark source, several micro-batches, the watermark),
  compared with the independent pandas oracle on the windows closed at the final watermark.
"""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.tws_tester import TwsTester  # noqa: E402

from rhino_testing.nexmark import oracle  # noqa: E402
from rhino_testing.nexmark.generator import NexmarkConfig, generate  # noqa: E402
from rhino_testing.nexmark.queries import QUERIES  # noqa: E402

# Beam's SqlQuery5Test: window 10 s, slide 5 s.
Q5_BIDS = [(1, 437342), (1, 447342), (1, 452342), (2, 452342)]
# Each bid in the two sliding windows holding it, by hand: (window_start, auction, ts_ms).
Q5_EXPLODED = [
    (430000, 1, 437342), (435000, 1, 437342),
    (440000, 1, 447342), (445000, 1, 447342),
    (445000, 1, 452342), (450000, 1, 452342),
    (445000, 2, 452342), (450000, 2, 452342),
]
# NEXMARK.md's table: (window_start, window_end, auction, count).
Q5_EXPECTED = [
    (430000, 440000, 1, 1),
    (435000, 445000, 1, 1),
    (440000, 450000, 1, 1),
    (445000, 455000, 1, 2),
    (450000, 460000, 1, 1),
    (450000, 460000, 2, 1),
]


def _tester(name: str, **params) -> TwsTester:
    return TwsTester(QUERIES[name].processor_factory(**params), timeMode="EventTime",
                     eventTimeExtractor=lambda row: int(row["ts_ms"]))


def _rows(df: pd.DataFrame, columns: list[str]) -> list[tuple]:
    if df is None or len(df) == 0:
        return []
    return sorted(tuple(int(v) if isinstance(v, (int, np.integer)) else v for v in r)
                  for r in df[columns].itertuples(index=False))


def _feed(tester: TwsTester, key_col: str, df: pd.DataFrame) -> list[pd.DataFrame]:
    """One 'micro-batch': each key's rows (split in two calls when it has several)."""
    outs = []
    for key, group in df.groupby(key_col, sort=False):
        group = group.reset_index(drop=True)
        half = len(group) // 2
        for part in ([group] if half == 0 else [group.iloc[half:], group.iloc[:half]]):
            outs.append(tester.testInPandas(int(key), part.reset_index(drop=True)))
    return outs


def test_q5_beams_known_answer_on_twstester():
    tester = _tester("q5")
    df = pd.DataFrame(Q5_EXPLODED, columns=["window_start", "auction", "ts_ms"])
    df = df.sample(frac=1.0, random_state=4).reset_index(drop=True)     # any order
    outs = _feed(tester, "window_start", df)
    assert all(len(o) == 0 for o in outs)          # nothing before the watermark passes a window
    cols = ["window_start", "window_end", "auction", "count"]
    # The watermark at 445000 closes exactly the windows ending at or before it.
    early = _rows(tester.setWatermark(445000), cols)
    assert early == [r for r in Q5_EXPECTED if r[1] <= 445000]
    rest = _rows(tester.setWatermark(10 ** 9), cols)
    assert sorted(early + rest) == Q5_EXPECTED
    assert tester.peekMapState("counts", 445000) == {}   # a closed window's state is gone


def test_q5_oracle_on_beams_known_answer():
    events = pd.DataFrame({"event_type": 2, "auction": [a for a, _ in Q5_BIDS],
                           "ts": pd.to_datetime([t for _, t in Q5_BIDS], unit="ms", utc=True)})
    got = oracle.compute("q5", events, window_ms=10_000, slide_ms=5_000)
    assert _rows(got, list(got.columns)) == Q5_EXPECTED


def test_q5_counts_accumulate_across_batches_and_late_bids_do_not_count():
    tester = _tester("q5", window_ms=10_000, slide_ms=5_000)
    first = pd.DataFrame([(440000, 1, 441000), (440000, 2, 442000)], columns=["window_start", "auction", "ts_ms"])
    # Two bids for auction 1 at or below the watermark 445000: late, so no tie with auction 2.
    second = pd.DataFrame([(440000, 2, 446000), (440000, 1, 445000), (440000, 2, 448000), (440000, 1, 444000)],
                          columns=first.columns)
    _feed(tester, "window_start", first)
    tester.setWatermark(445000)
    _feed(tester, "window_start", second)
    assert _rows(tester.setWatermark(450000), ["auction", "count"]) == [(2, 3)]


def test_q11_sessions_by_hand_on_twstester():
    tester = _tester("q11", gap_ms=10_000)
    cols = ["bidder", "bid_count", "session_start", "session_end"]
    # Batch 1, out of order: bidder 7 at 14999 and 1000; bidder 8 at 1; bidder 9 at 1000 and 15000;
    # bidder 11 at 200, 250 and, exactly one gap after 250, at 10250, 10300: two sessions, as
    # [200, 250 + gap) ends where [10250, ...) starts (_feed hands one call 250 and 10250).
    b1 = pd.DataFrame({"bidder": [7, 8, 7, 9, 9, 11, 11, 11, 11, 10],
                       "ts_ms": [14999, 1, 1000, 15000, 1000, 200, 10300, 250, 10250, 100]})
    _feed(tester, "bidder", b1)
    # Batch 2: 5000 for 7 (joins), 25000 for 7 (>= gap after 14999: a new session),
    # 8000 for 9 (bridges its two sessions into one), 10100 for 10 (exactly one gap after its 100).
    b2 = pd.DataFrame({"bidder": [7, 7, 9, 10], "ts_ms": [25000, 5000, 8000, 10100]})
    _feed(tester, "bidder", b2)
    assert _rows(tester.setWatermark(10000), cols) == []
    assert _rows(tester.setWatermark(10001), cols) == [(8, 1, 1, 10001)]
    assert _rows(tester.setWatermark(10250), cols) == [(10, 1, 100, 10100), (11, 2, 200, 10250)]
    assert _rows(tester.setWatermark(10 ** 9), cols) == [(7, 1, 25000, 35000), (7, 3, 1000, 24999),
                                                         (9, 3, 1000, 25000), (10, 1, 10100, 20100),
                                                         (11, 2, 10250, 20300)]
    assert tester.peekListState("sessions", 7) == []


def test_q11_oracle_by_hand():
    events = pd.DataFrame({"event_type": 2, "bidder": [7, 8, 7, 9, 9, 7, 7, 9, 10, 10],
                           "ts": pd.to_datetime([14999, 1, 1000, 15000, 1000, 25000, 5000, 8000, 10100, 100],
                                                unit="ms")})
    got = oracle.compute("q11", events, gap_ms=10_000)
    assert _rows(got, oracle.COLUMNS["q11"]) == [(7, 1, 25000, 35000), (7, 3, 1000, 24999), (8, 1, 1, 10001),
                                                  (9, 3, 1000, 25000), (10, 1, 100, 10100), (10, 1, 10100, 20100)]


def _q8_rows(rows):
    cols = ["person_id", "kind", "ts_ms", "name", "email", "city", "state", "auction_id", "category",
            "initial_bid", "reserve", "expires_ms", "payload"]
    return pd.DataFrame(rows, columns=cols)


def test_q8_by_hand_on_twstester():
    tester = _tester("q8", window_ms=10_000)
    nan = np.nan
    person = (1001, 0, 1500, "Kate Smith", "k@x", "Bend", "OR", nan, nan, nan, nan, nan, b"p" * 200)
    auctions = [(1001, 1, 2000, None, None, None, None, 5, 10, 1, 50, 9000, b"a" * 300),
                (1001, 1, 9999, None, None, None, None, 6, 11, 1, 60, 19000, b"b" * 300),
                (1001, 1, 10000, None, None, None, None, 7, 12, 1, 70, 29000, b"c" * 300),
                (1002, 1, 3000, None, None, None, None, 8, 12, 1, 80, 9000, b"d" * 300)]   # no such person
    _feed(tester, "person_id", _q8_rows([auctions[1], person, auctions[0], auctions[2], auctions[3]]))
    # Full records, payload included, are kept until their window closes.
    stored = tester.peekListState("persons", 1001)
    assert len(stored) == 1 and stored[0][-1] == b"p" * 200
    assert sorted(a[2] for a in tester.peekListState("auctions", 1001)) == [5, 6, 7]
    cols = ["person_id", "name", "reserve", "window_start"]
    assert _rows(tester.setWatermark(10000), cols) == [(1001, "Kate Smith", 50, 0), (1001, "Kate Smith", 60, 0)]
    assert tester.peekListState("persons", 1001) == []
    assert [a[2] for a in tester.peekListState("auctions", 1001)] == [7]
    assert tester.peekListState("auctions", 1002) == []
    assert _rows(tester.setWatermark(20000), cols) == []     # window 10000 has no person
    assert tester.peekListState("auctions", 1001) == []


def test_query_registry_api():
    assert set(QUERIES) == {"q5", "q8", "q11"}
    assert QUERIES["q5"].key == ["window_start"]
    assert QUERIES["q8"].key == ["person_id"]
    assert QUERIES["q11"].key == ["bidder"]
    for name, q in QUERIES.items():
        assert q.time_mode == "EventTime" and q.event_time_column == "ts"
        assert [c.split()[0] for c in q.output_schema.split(", ")] == oracle.COLUMNS[name]
        p = q.processor_factory()
        assert pickle.loads(pickle.dumps(p)).__dict__ == p.__dict__   # shipped to executors
    assert QUERIES["q5"].processor_factory(window_ms=60_000, slide_ms=10_000).window_ms == 60_000
    with pytest.raises(TypeError):
        QUERIES["q11"].processor_factory(window_ms=1)


# -------------------------------------------------------------- on Spark's own operator


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    from rhino_testing.nexmark.source import NexmarkDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("rhino-test-nexmark-queries")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NexmarkDataSource)
    yield session
    session.stop()


def test_q5_prepare_explodes_into_sliding_windows(spark):
    events = spark.createDataFrame(
        [(2, pd.Timestamp(t, unit="ms", tz="UTC").to_pydatetime(), a) for a, t in Q5_BIDS]
        + [(1, pd.Timestamp(0, unit="ms", tz="UTC").to_pydatetime(), None)],
        "event_type TINYINT, ts TIMESTAMP, auction BIGINT")
    got = QUERIES["q5"].prepare(events).select("window_start", "auction", "ts_ms").collect()
    assert sorted(tuple(r) for r in got) == sorted(Q5_EXPLODED)


N_EVENTS, PER_BATCH = 4000, 1000
SOURCE_OPTS = {"seed": 7, "interEventDelayUs": 2500, "numActivePeople": 20, "payloadBytes": 64}
CONFIG = NexmarkConfig(seed=7, inter_event_delay_us=2500, num_active_people=20, person_payload_bytes=64,
                       auction_payload_bytes=64)
PARAMS = {"q5": {"window_ms": 2000, "slide_ms": 1000}, "q8": {"window_ms": 2000}, "q11": {"gap_ms": 300}}


@pytest.mark.parametrize("name", ["q5", "q8", "q11"])
def test_query_on_spark_transformWithStateInPandas_rocksdb_equals_oracle(spark, tmp_path, name):
    q = QUERIES[name]
    params = PARAMS[name]
    events = (spark.readStream.format("nexmark").options(**SOURCE_OPTS)
              .option("eventsPerBatch", PER_BATCH).option("maxEvents", N_EVENTS).option("numPartitions", 2).load())
    table = f"nexmark_{name}"
    query = (q.transform(events, **params).writeStream.format("memory").queryName(table).outputMode("append")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        progress = query.recentProgress
    finally:
        query.stop()
    assert [p["numInputRows"] for p in progress if p["numInputRows"]] == [PER_BATCH] * (N_EVENTS // PER_BATCH)
    watermark_ms = int(pd.Timestamp(progress[-1]["eventTime"]["watermark"]).value // 10 ** 6)

    got = spark.table(table).toPandas()
    want_all = oracle.compute(name, generate(0, N_EVENTS, config=CONFIG).to_pandas(), **params)
    want = oracle.closed(name, want_all, watermark_ms, **params)
    end_ms = CONFIG.base_time_ms + N_EVENTS * CONFIG.inter_event_delay_us // 1000
    assert watermark_ms > end_ms - 1000            # the final watermark reached the stream's end
    assert len(want) >= 5 and len(want) < len(want_all) + 1
    # Everything emitted is final at that watermark, and it is the oracle's answer, as multisets.
    assert len(oracle.closed(name, got, watermark_ms, **params)) == len(got)
    cols = oracle.COLUMNS[name]
    assert _rows(got, cols) == _rows(want, cols)
    if name == "q11":
        assert (want["bid_count"] > 1).sum() >= 5   # real sessions, not only single bids
