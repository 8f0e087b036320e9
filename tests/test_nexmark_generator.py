"""The NEXMark generator (rhino_testing.nexmark.generator) and the "nexmark" Spark source.

Expected values come from NEXMARK.md's rules written out again here in plain Python (one
event at a time), from NumPy's own Philox, and from statistics; the streaming source is read
by a real local Spark and compared with ``generate`` of the same id ranges.
"""

from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from rhino_testing.nexmark.generator import (
    ARROW_SCHEMA,
    NexmarkConfig,
    generate,
    nominal_record_bytes,
    philox4x64,
)

# -------------------------------------------------------------- NEXMARK.md, independently


def kind_of(i: int) -> int:
    rem = i % 50
    return 0 if rem < 1 else 1 if rem < 4 else 2


def last_person(i: int) -> int:
    """Person id of the newest person at or before event i (persons are ids 0, 50, 100, ...)."""
    return 1000 + i // 50


def last_base0_auction(i: int) -> int:
    epoch, off = i // 50, i % 50
    if off < 1:
        epoch, off = epoch - 1, 2
    elif off >= 4:
        off = 2
    else:
        off -= 1
    return epoch * 3 + off


def numpy_philox_block(seed: int, counter: int) -> list[int]:
    """The 4 words NumPy's Philox gives for ``counter`` (it increments before its first block)."""
    bg = np.random.Philox(key=seed)
    state = bg.state
    c = counter - 1
    state["state"]["counter"] = np.array([(c >> (64 * j)) & (2 ** 64 - 1) for j in range(4)], dtype=np.uint64)
    state["buffer_pos"] = 4
    bg.state = state
    return [int(x) for x in bg.random_raw(4)]


SMALL = NexmarkConfig(seed=11, inter_event_delay_us=333)

# -------------------------------------------------------------- RNG


@pytest.mark.parametrize("seed", [0, 7, 2 ** 64 + 12345])
def test_philox_is_numpys_philox_keyed_by_seed_with_counter_event_id(seed):
    ids = [0, 1, 49, 50, 123_456_789, 2 ** 40 + 3]
    for block in (0, 1, 5):
        got = philox4x64(np.full(len(ids), block, dtype=np.uint64), np.array(ids, dtype=np.uint64), seed)
        for n, eid in enumerate(ids):
            assert [int(w[n]) for w in got] == numpy_philox_block(seed, (eid << 64) | block)


# -------------------------------------------------------------- determinism and replay


def test_any_subrange_regenerates_identical_rows():
    whole = generate(0, 6000, config=SMALL)
    assert whole.schema == ARROW_SCHEMA and whole.num_rows == 6000
    assert whole.column("event_id").to_pylist() == list(range(6000))
    rng = np.random.default_rng(3)
    for _ in range(5):
        a, b = sorted(int(x) for x in rng.integers(0, 6000, size=2))
        assert generate(a, b, config=SMALL).equals(whole.slice(a, b - a))
    # A different partition split of the same range concatenates to the same table.
    cuts = [0, 1, 77, 2500, 2501, 5999, 6000]
    parts = [generate(cuts[k], cuts[k + 1], config=SMALL) for k in range(len(cuts) - 1)]
    assert pa.concat_tables(parts).equals(whole)
    assert generate(0, 6000, config=SMALL).equals(whole)  # again, same process


def test_seed_changes_the_draws_not_the_structure():
    a = generate(0, 2000, config=SMALL)
    b = generate(0, 2000, config=SMALL.replace(seed=12))
    for col in ("event_type", "event_id", "ts", "person_id", "auction_id"):
        assert a.column(col).equals(b.column(col))
    assert not a.column("price").equals(b.column("price"))
    assert not a.column("payload").equals(b.column("payload"))


# -------------------------------------------------------------- the rules of NEXMARK.md


def test_event_type_proportions_are_1_3_46_per_50():
    t = generate(0, 50_000, config=SMALL)
    types = t.column("event_type").to_numpy()
    assert [kind_of(i) for i in range(50_000)] == types.tolist()
    assert np.bincount(types).tolist() == [1000, 3000, 46000]
    # Type-specific columns are set exactly on their type's rows.
    for col, kind in (("person_id", 0), ("name", 0), ("seller", 1), ("reserve", 1), ("bidder", 2), ("price", 2)):
        valid = t.column(col).is_valid().to_numpy(zero_copy_only=False)
        assert (valid == (types == kind)).all(), col


def test_person_and_auction_ids_follow_the_formulas():
    t = generate(0, 20_000, config=SMALL).to_pandas()
    for row in t.itertuples():
        i = row.event_id
        if row.event_type == 0:
            assert row.person_id == 1000 + i // 50
        elif row.event_type == 1:
            assert row.auction_id == 1000 + last_base0_auction(i)
    # Auction ids are 1000, 1001, ... in order of their events, each once.
    auctions = t[t.event_type == 1].auction_id.astype(int).tolist()
    assert auctions == list(range(1000, 1000 + len(auctions)))


def test_sellers_bidders_and_bid_auctions_are_hot_or_recent():
    cfg = NexmarkConfig(seed=5, num_active_people=30, num_in_flight_auctions=40)
    t = generate(0, 30_000, config=cfg).to_pandas()
    for row in t.itertuples():
        i = row.event_id
        people = last_person(i) - 1000 + 1               # persons created so far
        active = min(people, 30)
        recent_people = range(1000 + people - active, 1000 + people + 10)
        if row.event_type == 1:
            hot = (last_person(i) // 100) * 100
            assert row.seller == hot or row.seller in recent_people, (i, row.seller)
        elif row.event_type == 2:
            hot_bidder = (last_person(i) // 100) * 100 + 1
            assert row.bidder == hot_bidder or row.bidder in recent_people, (i, row.bidder)
            last = last_base0_auction(i)
            hot_auction = 1000 + (last // 100) * 100
            recent = range(1000 + max(last - 40, 0), 1000 + last + 1 + 10)
            assert row.auction == hot_auction or row.auction in recent, (i, row.auction)


def test_hot_key_ratios_within_statistical_bounds():
    t = generate(0, 400_000, config=NexmarkConfig(seed=1)).to_pandas()
    ids = t.event_id.to_numpy()
    hot_person = 1000 + ((ids // 50) // 100) * 100
    last_auction = np.array([last_base0_auction(int(i)) for i in ids[t.event_type == 2]])

    a = (t.event_type == 1).to_numpy()
    b = (t.event_type == 2).to_numpy()
    seller_hot = np.mean(t.seller.to_numpy()[a] == hot_person[a])
    bidder_hot = np.mean(t.bidder.to_numpy()[b] == hot_person[b] + 1)
    auction_hot = np.mean(t.auction.to_numpy()[b] == 1000 + (last_auction // 100) * 100)

    def bounds(p, n, coincide):
        # p: the hot probability; a non-hot draw lands on the hot key with at most `coincide`.
        sigma = np.sqrt(p * (1 - p) / n)
        return p - 5 * sigma, p + (1 - p) * coincide + 5 * sigma

    lo, hi = bounds(0.75, a.sum(), 1 / 11)        # at least 11 recent people to choose from
    assert lo < seller_hot < hi, seller_hot
    lo, hi = bounds(0.75, b.sum(), 1 / 11)
    assert lo < bidder_hot < hi, bidder_hot
    lo, hi = bounds(0.5, b.sum(), 1 / 11)
    assert lo < auction_hot < hi, auction_hot
    # Recent (non-hot) bid auctions spread over the in-flight range, not all on one key.
    nonhot = t.auction.to_numpy()[b][t.auction.to_numpy()[b] != 1000 + (last_auction // 100) * 100]
    assert len(np.unique(nonhot)) > 1000


def test_event_time_formula_and_field_ranges():
    cfg = NexmarkConfig(seed=2, base_time_ms=1_234_567, inter_event_delay_us=333)
    t = generate(1000, 9000, config=cfg).to_pandas()
    want = [1_234_567 + i * 333 // 1000 for i in range(1000, 9000)]
    got = (t.ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
    assert got.tolist() == want
    a = t[t.event_type == 1]
    assert (a.expires > a.ts).all()
    assert (a.reserve >= a.initial_bid).all() and (a.initial_bid >= 100).all()
    assert set(a.category.astype(int)) <= set(range(10, 15))
    assert (t[t.event_type == 2].price >= 100).all()


def test_event_time_is_exact_in_milliseconds():
    cfg = NexmarkConfig(base_time_ms=7, inter_event_delay_us=2500)
    t = generate(0, 10, config=cfg)
    us = t.column("ts").cast(pa.int64()).to_pylist()
    assert us == [(7 + i * 2500 // 1000) * 1000 for i in range(10)]


# -------------------------------------------------------------- payload sizing


def test_default_record_sizes_follow_the_paper():
    t = generate(0, 50_000, config=NexmarkConfig(seed=3))
    size = nominal_record_bytes(t)
    types = t.column("event_type").to_numpy()
    assert abs(size[types == 0].mean() - 206) < 3
    assert (size[types == 1] == 269).all()
    assert (size[types == 2] == 32).all()


def test_payload_sizes_are_as_configured_and_incompressible():
    cfg = NexmarkConfig(seed=4, person_payload_bytes=1000, auction_payload_bytes=37, bid_payload_bytes=5)
    t = generate(0, 5000, config=cfg)
    types = t.column("event_type").to_numpy()
    lengths = np.array([len(p) for p in t.column("payload").to_pylist()])
    assert (lengths[types == 0] == 1000).all()
    assert (lengths[types == 1] == 37).all()
    assert (lengths[types == 2] == 5).all()
    blob = b"".join(p for p, k in zip(t.column("payload").to_pylist(), types) if k == 0)
    assert len(zlib.compress(blob)) > 0.99 * len(blob)   # random bytes: RocksDB cannot shrink them
    zero = generate(0, 100, config=cfg.replace(person_payload_bytes=0, auction_payload_bytes=0, bid_payload_bytes=0))
    assert set(zero.column("payload").to_pylist()) == {b""}


def test_large_payloads_are_chunked():
    cfg = NexmarkConfig(person_payload_bytes=3 << 20, auction_payload_bytes=0)
    t = generate(0, 1200, config=cfg)   # 24 persons x 3 MiB: several RecordBatches
    assert t.num_rows == 1200
    assert t.slice(1000, 1).column("payload").to_pylist()[0] == generate(1000, 1001, config=cfg).column(
        "payload").to_pylist()[0]


# -------------------------------------------------------------- the Spark source


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from rhino_testing.nexmark.source import NexmarkDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("rhino-test-nexmark-source")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NexmarkDataSource)
    yield session
    session.stop()


OPTS = {"seed": 9, "interEventDelayUs": 777, "payloadBytes": 50, "bidPayloadBytes": 3}
CFG = NexmarkConfig(seed=9, inter_event_delay_us=777, person_payload_bytes=50, auction_payload_bytes=50,
                    bid_payload_bytes=3)


def _as_generated(table: pa.Table) -> pa.Table:
    table = table.sort_by("event_id").select(ARROW_SCHEMA.names)
    return pa.Table.from_arrays([c.combine_chunks() for c in table.columns],
                                schema=ARROW_SCHEMA)


def _run_stream(spark, tmp_path, available_now: bool):
    batches: dict[int, pa.Table] = {}

    def collect(df, batch_id):
        batches[batch_id] = df.toArrow()

    reader = (spark.readStream.format("nexmark").options(**OPTS)
              .option("eventsPerBatch", 700).option("maxEvents", 2500).option("numPartitions", 3)
              .option("rowsPerBatch", 128).load())
    writer = reader.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
    if available_now:
        writer.trigger(availableNow=True).start().awaitTermination(120)
    else:
        q = writer.start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    return batches


@pytest.mark.parametrize("available_now", [False, True], ids=["processAllAvailable", "availableNow"])
def test_stream_batch_k_is_generate_of_its_id_range(spark, tmp_path, available_now):
    batches = _run_stream(spark, tmp_path, available_now)
    nonempty = {k: v for k, v in batches.items() if v.num_rows}
    assert sorted(nonempty) == [0, 1, 2, 3]
    for k, table in nonempty.items():
        lo, hi = k * 700, min((k + 1) * 700, 2500)
        assert _as_generated(table).equals(generate(lo, hi, config=CFG)), k


def test_batch_read_is_generate(spark):
    df = (spark.read.format("nexmark").options(**OPTS).option("maxEvents", 1500)
          .option("firstEventId", 100).option("numPartitions", 4).load())
    assert df.rdd.getNumPartitions() == 4
    assert _as_generated(df.toArrow()).equals(generate(100, 1600, config=CFG))


def test_source_options_are_checked():
    from rhino_testing.nexmark.source import config_from_options

    assert config_from_options({"SEED": "3", "payloadBytes": 10, "bidPayloadBytes": 1}) == NexmarkConfig(
        seed=3, person_payload_bytes=10, auction_payload_bytes=10, bid_payload_bytes=1)
    with pytest.raises(ValueError, match="unknown nexmark option"):
        config_from_options({"eventsPerBatchh": 3})


def test_stream_reader_offsets_without_spark(monkeypatch):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from rhino_testing.nexmark import source
    from rhino_testing.nexmark.source import OFFSET_KEY, NexmarkDataSource

    def reader(**options):
        return NexmarkDataSource({k: str(v) for k, v in options.items()}).streamReader(None)

    r = reader(eventsPerBatch=100, maxEvents=250, firstEventId=10)
    start = r.initialOffset()
    assert start == {OFFSET_KEY: 10} and r.getDefaultReadLimit() == ReadMaxRows(100)
    ends = []
    for _ in range(4):
        end = r.latestOffset(start, r.getDefaultReadLimit())
        ends.append(end[OFFSET_KEY])
        start = end
    assert ends == [110, 210, 260, 260]                       # then no new data: end == start
    assert r.latestOffset({OFFSET_KEY: 10}, ReadAllAvailable()) == {OFFSET_KEY: 260}
    parts = r.partitions({OFFSET_KEY: 10}, {OFFSET_KEY: 110})
    assert [(p.start, p.end) for p in parts] == [(10, 110)]
    parts = reader(maxEvents=10, numPartitions=3).partitions({OFFSET_KEY: 0}, {OFFSET_KEY: 10})
    assert [(p.start, p.end) for p in parts] == [(0, 3), (3, 6), (6, 10)]
    assert reader(maxEvents=10).partitions({OFFSET_KEY: 5}, {OFFSET_KEY: 5}) == []

    # A wall-clock rate: what is available grows with time (here a fake clock).
    now = [1000.0]
    monkeypatch.setattr(source.time, "monotonic", lambda: now[0])
    r = reader(eventsPerSecond=50, eventsPerBatch=1000)
    assert r.latestOffset({OFFSET_KEY: 0}, ReadMaxRows(1000)) == {OFFSET_KEY: 0}
    now[0] += 2.0
    assert r.latestOffset({OFFSET_KEY: 0}, ReadMaxRows(1000)) == {OFFSET_KEY: 100}
    assert r.latestOffset({OFFSET_KEY: 50}, ReadMaxRows(30)) == {OFFSET_KEY: 80}
    # Trigger.AvailableNow stops at what was available when the query started.
    r.prepareForTriggerAvailableNow()
    now[0] += 10.0
    assert r.latestOffset({OFFSET_KEY: 80}, ReadMaxRows(1000)) == {OFFSET_KEY: 100}
    assert r.latestOffset({OFFSET_KEY: 100}, ReadMaxRows(1000)) == {OFFSET_KEY: 100}
    with pytest.raises(ValueError, match="endless"):
        reader(eventsPerBatch=5).prepareForTriggerAvailableNow()
