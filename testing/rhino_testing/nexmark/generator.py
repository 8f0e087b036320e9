"""Deterministic, replayable NEXMark event generator (docs: /work/shared/NEXMARK.md).

Every event is a pure function of ``(config, event_id)``: :func:`generate` of any id range
``[a, b)`` gives exactly the rows of the same ids in any other range that covers them, so an
offset range of the streaming source can always be regenerated (the "upstream backup" that
exactly-once replay needs).

Rules (Beam's ``sdks/java/testing/nexmark`` generator, as written in NEXMARK.md):

* type: ``rem = id % 50``; ``rem < 1`` Person, ``rem < 4`` Auction, else Bid (1/3/46 per 50);
* person id ``1000 + id // 50``; auction id ``1000 + lastBase0AuctionId(id)``;
* an auction's seller is the hot person ``(lastPersonId // 100) * 100`` when
  ``nextInt(hot_sellers_ratio) > 0`` (3/4), else a recent person; a bid's auction is the hot
  auction ``(lastAuctionId // 100) * 100`` when ``nextInt(hot_auction_ratio) > 0`` (1/2), else a
  recent auction; its bidder the hot person ``(lastPersonId // 100) * 100 + 1`` when
  ``nextInt(hot_bidders_ratio) > 0`` (3/4), else a recent person;
* recent person (Beam's ``nextBase0PersonId``): ``numPeople - active + nextLong(active + 10)``
  with ``numPeople = lastBase0PersonId + 1``, ``active = min(numPeople, num_active_people)``;
  recent auction (``nextBase0AuctionId``): ``lo + nextLong(last - lo + 1 + 10)`` with
  ``lo = max(last - num_in_flight_auctions, 0)``; so both may name an id a little ahead;
* prices ``round(10 ** (u * 6) * 100)``, ``u`` uniform in [0, 1); reserve = initial bid + a price;
  category ``10 + nextInt(5)``; expires = ts + 1 + nextLong(2 * horizon) where horizon is the
  event-time span of ``num_in_flight_auctions * 50 // 3`` events (Beam's
  ``nextAuctionLengthMs``);
* event time ``base_time_ms + id * inter_event_delay_us // 1000`` (not wall clock), so event
  time never decreases with the id.

Randomness: **Philox4x64-10** (Random123), i.e. exactly NumPy's ``np.random.Philox``, used as a
counter-based function: the random block ``j`` of event ``id`` is Philox with
``key = seed`` (128-bit, as NumPy's ``key=``) applied to the 256-bit counter
``id << 64 | j`` (NumPy words ``[j, id, 0, 0]``). Block 0 (four 64-bit words) drives the
event's fields; blocks 1, 2, ... fill its payload (32 bytes per block). The rounds are
evaluated with NumPy over whole arrays of ids (:func:`philox4x64`), bit-identical to
``np.random.Philox(key=seed)`` positioned at that counter (the generator's test checks this).
We do not match Beam's ``java.util.Random(eventId)`` draws byte for byte, only its rules.
Integers below ``n`` come from 32 random bits as ``(u32 * n) >> 32`` (small ranges) or from 53
bits as ``floor(u53 / 2**53 * n)``, with a bias below 2**-20 for the ranges used here.

Schema: one flat table for the three event types (:data:`ARROW_SCHEMA`, Spark DDL
:data:`SPARK_SCHEMA_DDL`); columns of the other types are null. ``event_type`` is 0 Person,
1 Auction, 2 Bid; ``ts`` is a ``timestamp[us, UTC]`` holding whole milliseconds (Spark's
TimestampType, which ``withWatermark`` needs). ``payload`` is opaque random bytes, never null
(empty when its size is 0): its size per type sets the state size. The defaults give the Rhino
paper's record sizes under the nominal layout of :func:`nominal_record_bytes` (8 bytes per
numeric or timestamp field, strings' UTF-8 bytes, the payload): Person ~206 B, Auction 269 B,
Bid 32 B.

Throughput (``generate``, 1M events, default config, one core of this 2-core machine,
measured by ``python -m rhino_testing.nexmark.generator``, best of 3): 2.3-3.0M events/s
(0.33-0.44 s per 1M events, depending on the machine's other load; Person/Auction payloads of
147/213 B included).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = [
    "ARROW_SCHEMA", "AUCTION", "BID", "FIRST_AUCTION_ID", "FIRST_PERSON_ID", "NexmarkConfig", "PERSON",
    "SPARK_SCHEMA_DDL", "event_time_ms", "event_types", "generate", "last_base0_auction_id",
    "last_base0_person_id", "nominal_record_bytes", "philox4x64",
]

PERSON, AUCTION, BID = 0, 1, 2
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
PROPORTION_DENOMINATOR = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION  # 50
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_SELLER_RATIO = 100
HOT_AUCTION_RATIO = 100
HOT_BIDDER_RATIO = 100
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10

# Beam's word lists (Generator.java).
US_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
US_CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne"]
FIRST_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter",
               "Walter"]
LAST_NAMES = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
EMAIL_DOMAINS = ["gmail.com", "example.com", "mail.com", "nexmark.org"]

SPARK_SCHEMA_DDL = (
    "event_type TINYINT, event_id BIGINT, ts TIMESTAMP, "
    "person_id BIGINT, name STRING, email STRING, city STRING, state STRING, "
    "auction_id BIGINT, seller BIGINT, category BIGINT, initial_bid BIGINT, reserve BIGINT, "
    "expires TIMESTAMP, "
    "auction BIGINT, bidder BIGINT, price BIGINT, "
    "payload BINARY"
)

_TS = pa.timestamp("us", tz="UTC")
# Exactly what PySpark's to_arrow_schema(SPARK_SCHEMA_DDL, timezone="UTC") gives (all nullable),
# which a Python data source's Arrow batches must equal.
ARROW_SCHEMA = pa.schema([
    ("event_type", pa.int8()), ("event_id", pa.int64()), ("ts", _TS),
    ("person_id", pa.int64()), ("name", pa.string()), ("email", pa.string()), ("city", pa.string()),
    ("state", pa.string()),
    ("auction_id", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
    ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("expires", _TS),
    ("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
    ("payload", pa.binary()),
])

# Nominal sizes of the non-payload fields (8 B per numeric/timestamp field), for the defaults.
_PERSON_FIXED = 2 * 8      # person_id, ts (+ name, email, city, state bytes)
_AUCTION_FIXED = 7 * 8     # auction_id, ts, seller, category, initial_bid, reserve, expires
_BID_FIXED = 4 * 8         # auction, bidder, price, ts


def _mean_len(words: list[str]) -> float:
    return sum(len(w.encode()) for w in words) / len(words)


# Mean string bytes of a Person: "First Last", "first.last@domain", city, state.
_PERSON_STRINGS = ((_mean_len(FIRST_NAMES) + 1 + _mean_len(LAST_NAMES))
                   + (_mean_len(FIRST_NAMES) + 1 + _mean_len(LAST_NAMES) + 1 + _mean_len(EMAIL_DOMAINS))
                   + _mean_len(US_CITIES) + _mean_len(US_STATES))
PAPER_PERSON_BYTES, PAPER_AUCTION_BYTES, PAPER_BID_BYTES = 206, 269, 32
DEFAULT_PERSON_PAYLOAD = PAPER_PERSON_BYTES - _PERSON_FIXED - round(_PERSON_STRINGS)
DEFAULT_AUCTION_PAYLOAD = PAPER_AUCTION_BYTES - _AUCTION_FIXED
DEFAULT_BID_PAYLOAD = PAPER_BID_BYTES - _BID_FIXED  # 0


@dataclass(frozen=True)
class NexmarkConfig:
    """What the events depend on. Two equal configs give identical events."""

    seed: int = 0
    #: event time of event 0 (2020-09-13T12:26:40Z; a fixed constant, not 0, so that no event
    #: sits at Spark's initial watermark 0)
    base_time_ms: int = 1_600_000_000_000
    #: event-time spacing of consecutive ids: 100 us = Beam's 10,000 events per second
    inter_event_delay_us: int = 100
    person_payload_bytes: int = DEFAULT_PERSON_PAYLOAD
    auction_payload_bytes: int = DEFAULT_AUCTION_PAYLOAD
    bid_payload_bytes: int = DEFAULT_BID_PAYLOAD
    num_active_people: int = 1000
    num_in_flight_auctions: int = 100
    hot_sellers_ratio: int = 4
    hot_auction_ratio: int = 2
    hot_bidders_ratio: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2 ** 128:
            raise ValueError(f"seed must be in [0, 2**128), got {self.seed}")
        if self.inter_event_delay_us < 0:
            raise ValueError("inter_event_delay_us must be >= 0")
        for f in ("person_payload_bytes", "auction_payload_bytes", "bid_payload_bytes"):
            if getattr(self, f) < 0:
                raise ValueError(f"{f} must be >= 0")
        for f in ("num_active_people", "num_in_flight_auctions", "hot_sellers_ratio", "hot_auction_ratio",
                  "hot_bidders_ratio"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1")

    def replace(self, **changes) -> NexmarkConfig:
        return dataclasses.replace(self, **changes)

    @property
    def events_per_second(self) -> float:
        """Events per second of event time."""
        return math.inf if self.inter_event_delay_us == 0 else 1e6 / self.inter_event_delay_us


# --------------------------------------------------------------------------- Philox4x64-10

_M0, _M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157
_W0, _W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_U64 = (1 << 64) - 1


def _mulhilo(m: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) 64-bit halves of the 128-bit product m * x, elementwise."""
    m_lo, m_hi = np.uint64(m & 0xFFFFFFFF), np.uint64(m >> 32)
    x_lo = x & _MASK32
    x_hi = x >> _S32
    p00 = x_lo * m_lo
    p01 = x_lo * m_hi
    p10 = x_hi * m_lo
    mid = (p00 >> _S32) + (p01 & _MASK32) + (p10 & _MASK32)
    hi = x_hi * m_hi + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32)
    return hi, x * np.uint64(m)


def philox4x64(c0: np.ndarray, c1: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    """Philox4x64-10 of counters ``[c0, c1, 0, 0]`` (uint64 arrays) under the 128-bit key ``seed``.

    Equals NumPy's ``np.random.Philox(key=seed)`` output block for the counter
    ``c1 << 64 | c0``. Returns four uint64 arrays.
    """
    k0, k1 = seed & _U64, (seed >> 64) & _U64
    x0 = np.asarray(c0, dtype=np.uint64)
    x1 = np.asarray(c1, dtype=np.uint64)
    x2 = np.zeros_like(x0)
    x3 = np.zeros_like(x0)
    with np.errstate(over="ignore"):
        for r in range(10):
            if r:
                k0, k1 = (k0 + _W0) & _U64, (k1 + _W1) & _U64
            hi0, lo0 = _mulhilo(_M0, x0)
            hi1, lo1 = _mulhilo(_M1, x2)
            x0, x1, x2, x3 = hi1 ^ x1 ^ np.uint64(k0), lo1, hi0 ^ x3 ^ np.uint64(k1), lo0
    return x0, x1, x2, x3


def _below32(u: np.ndarray, n) -> np.ndarray:
    """Integers in [0, n) from the low 32 bits of ``u`` (n < 2**32; array or scalar)."""
    return (((u & _MASK32) * np.asarray(n, dtype=np.uint64)) >> _S32).astype(np.int64)


def _below32_hi(u: np.ndarray, n) -> np.ndarray:
    """Integers in [0, n) from the high 32 bits of ``u``."""
    return _below32(u >> _S32, n)


def _unit53(u: np.ndarray) -> np.ndarray:
    """Uniform doubles in [0, 1) from the top 53 bits of ``u``."""
    return (u >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _below53(u: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Integers in [0, n) (n >= 1, int64 array) from 53 bits of ``u``."""
    return np.minimum(np.floor(_unit53(u) * n).astype(np.int64), n - 1)


def _price(u: np.ndarray) -> np.ndarray:
    """Beam's nextPrice: round(10 ** (u * 6) * 100)."""
    return np.floor(np.power(10.0, _unit53(u) * 6.0) * 100.0 + 0.5).astype(np.int64)


# --------------------------------------------------------------------------- id rules

def event_types(ids: np.ndarray) -> np.ndarray:
    rem = ids % PROPORTION_DENOMINATOR
    return np.where(rem < PERSON_PROPORTION, PERSON,
                    np.where(rem < PERSON_PROPORTION + AUCTION_PROPORTION, AUCTION, BID)).astype(np.int8)


def last_base0_person_id(ids: np.ndarray) -> np.ndarray:
    """Base-0 id of the newest person at or before each event id."""
    epoch = ids // PROPORTION_DENOMINATOR
    off = np.minimum(ids % PROPORTION_DENOMINATOR, PERSON_PROPORTION - 1)
    return epoch * PERSON_PROPORTION + off


def last_base0_auction_id(ids: np.ndarray) -> np.ndarray:
    """Base-0 id of the newest auction at or before each event id (NEXMARK.md's 5 steps)."""
    epoch = ids // PROPORTION_DENOMINATOR
    off = ids % PROPORTION_DENOMINATOR
    before = off < PERSON_PROPORTION
    epoch = np.where(before, epoch - 1, epoch)
    off = np.where(before | (off >= PERSON_PROPORTION + AUCTION_PROPORTION), AUCTION_PROPORTION - 1,
                   off - PERSON_PROPORTION)
    return epoch * AUCTION_PROPORTION + off


def event_time_ms(ids: np.ndarray, config: NexmarkConfig) -> np.ndarray:
    return config.base_time_ms + (ids * config.inter_event_delay_us) // 1000


def _next_base0_person_id(ids: np.ndarray, u: np.ndarray, cfg: NexmarkConfig) -> np.ndarray:
    num_people = last_base0_person_id(ids) + 1
    active = np.minimum(num_people, cfg.num_active_people)
    return num_people - active + _below32(u, active + PERSON_ID_LEAD)


def _next_base0_auction_id(ids: np.ndarray, u: np.ndarray, cfg: NexmarkConfig) -> np.ndarray:
    last = last_base0_auction_id(ids)
    lo = np.maximum(last - cfg.num_in_flight_auctions, 0)
    return lo + _below32(u, last - lo + 1 + AUCTION_ID_LEAD)


# --------------------------------------------------------------------------- generation

_NAMES = pa.array([f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES])
_EMAILS = pa.array([f"{f.lower()}.{l.lower()}@{d}" for f in FIRST_NAMES for l in LAST_NAMES
                    for d in EMAIL_DOMAINS])
_CITIES = pa.array(US_CITIES)
_STATES = pa.array(US_STATES)

_CHUNK = 65536


def _scatter_i64(n: int, rows: np.ndarray, values: np.ndarray, typ: pa.DataType = pa.int64()) -> pa.Array:
    full = np.zeros(n, dtype=np.int64)
    full[rows] = values
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    return pa.array(full, type=pa.int64(), mask=mask).cast(typ) if typ != pa.int64() else \
        pa.array(full, type=pa.int64(), mask=mask)


def _take(words: pa.Array, n: int, rows: np.ndarray, idx: np.ndarray) -> pa.Array:
    full = np.zeros(n, dtype=np.int64)
    full[rows] = idx
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    return words.take(pa.array(full, mask=mask))


def _payload(ids: np.ndarray, types: np.ndarray, cfg: NexmarkConfig) -> pa.Array:
    sizes = np.array([cfg.person_payload_bytes, cfg.auction_payload_bytes, cfg.bid_payload_bytes],
                     dtype=np.int64)
    lengths = sizes[types]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2 ** 31:
        raise ValueError("payload of one chunk exceeds 2 GiB")
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for t in (PERSON, AUCTION, BID):
        size = int(sizes[t])
        if size == 0:
            continue
        rows = np.flatnonzero(types == t)
        if len(rows) == 0:
            continue
        nblocks = -(-size // 32)
        c0 = np.tile(np.arange(1, nblocks + 1, dtype=np.uint64), len(rows))
        c1 = np.repeat(ids[rows].astype(np.uint64), nblocks)
        words = np.stack(philox4x64(c0, c1, cfg.seed), axis=1)  # (rows * nblocks, 4)
        raw = words.astype("<u8").view(np.uint8).reshape(len(rows), nblocks * 32)[:, :size]
        data[(offsets[rows][:, None] + np.arange(size)).ravel()] = raw.ravel()
    return pa.Array.from_buffers(pa.binary(), len(ids),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _generate_chunk(start: int, end: int, cfg: NexmarkConfig) -> pa.RecordBatch:
    ids = np.arange(start, end, dtype=np.int64)
    n = len(ids)
    types = event_types(ids)
    ts_ms = event_time_ms(ids, cfg)
    r0, r1, r2, r3 = philox4x64(np.zeros(n, dtype=np.uint64), ids.astype(np.uint64), cfg.seed)

    p = np.flatnonzero(types == PERSON)
    a = np.flatnonzero(types == AUCTION)
    b = np.flatnonzero(types == BID)

    # Person: r0 lo/hi first/last name, r1 lo city, r1 hi state, r2 lo email domain.
    first = _below32(r0[p], len(FIRST_NAMES))
    last = _below32_hi(r0[p], len(LAST_NAMES))
    name_idx = first * len(LAST_NAMES) + last
    email_idx = name_idx * len(EMAIL_DOMAINS) + _below32(r2[p], len(EMAIL_DOMAINS))

    # Auction: r0 lo hot-seller coin, r0 hi expiry, r1 lo recent seller, r1 hi category,
    # r2 initial bid, r3 reserve increment.
    aid = ids[a]
    hot_seller = _below32(r0[a], cfg.hot_sellers_ratio) > 0
    seller = np.where(hot_seller,
                      (last_base0_person_id(aid) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
                      _next_base0_person_id(aid, r1[a], cfg)) + FIRST_PERSON_ID
    initial_bid = _price(r2[a])
    reserve = initial_bid + _price(r3[a])
    horizon_events = cfg.num_in_flight_auctions * PROPORTION_DENOMINATOR // AUCTION_PROPORTION
    horizon_ms = event_time_ms(aid + horizon_events, cfg) - ts_ms[a]
    expires = ts_ms[a] + 1 + _below53(r0[a], np.maximum(horizon_ms * 2, 1))
    # (_below53 uses r0's top 53 bits; the coin above its low 32: the 11 shared bits are harmless.)
    category = FIRST_CATEGORY_ID + _below32_hi(r1[a], NUM_CATEGORIES)

    # Bid: r0 lo hot-auction coin, r0 hi hot-bidder coin, r1 lo recent auction, r1 hi recent
    # bidder, r2 price.
    bid_ids = ids[b]
    hot_auction = _below32(r0[b], cfg.hot_auction_ratio) > 0
    auction = np.where(hot_auction,
                       (last_base0_auction_id(bid_ids) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                       _next_base0_auction_id(bid_ids, r1[b], cfg)) + FIRST_AUCTION_ID
    hot_bidder = _below32_hi(r0[b], cfg.hot_bidders_ratio) > 0
    bidder = np.where(hot_bidder,
                      (last_base0_person_id(bid_ids) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                      _next_base0_person_id(bid_ids, r1[b] >> _S32, cfg)) + FIRST_PERSON_ID
    price = _price(r2[b])

    columns = [
        pa.array(types, type=pa.int8()),
        pa.array(ids, type=pa.int64()),
        pa.array(ts_ms * 1000, type=pa.int64()).cast(_TS),
        _scatter_i64(n, p, ids[p] // PROPORTION_DENOMINATOR + FIRST_PERSON_ID),
        _take(_NAMES, n, p, name_idx),
        _take(_EMAILS, n, p, email_idx),
        _take(_CITIES, n, p, _below32(r1[p], len(US_CITIES))),
        _take(_STATES, n, p, _below32_hi(r1[p], len(US_STATES))),
        _scatter_i64(n, a, last_base0_auction_id(aid) + FIRST_AUCTION_ID),
        _scatter_i64(n, a, seller),
        _scatter_i64(n, a, category),
        _scatter_i64(n, a, initial_bid),
        _scatter_i64(n, a, reserve),
        _scatter_i64(n, a, expires * 1000, _TS),
        _scatter_i64(n, b, auction),
        _scatter_i64(n, b, bidder),
        _scatter_i64(n, b, price),
        _payload(ids, types, cfg),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def chunk_rows(config: NexmarkConfig) -> int:
    """Rows per generated RecordBatch: 65536, fewer when payloads are large (int32 offsets)."""
    biggest = max(config.person_payload_bytes, config.auction_payload_bytes, config.bid_payload_bytes, 1)
    return max(1, min(_CHUNK, (1 << 30) // biggest))


def generate_batches(start_id: int, end_id: int, *, config: NexmarkConfig = NexmarkConfig(),
                     max_rows: int | None = None):
    """Yields RecordBatches (schema :data:`ARROW_SCHEMA`) of events ``[start_id, end_id)`` in id order."""
    if start_id < 0 or end_id < start_id:
        raise ValueError(f"bad event id range [{start_id}, {end_id})")
    step = min(max_rows or _CHUNK, chunk_rows(config))
    for lo in range(start_id, end_id, step):
        yield _generate_chunk(lo, min(lo + step, end_id), config)


def generate(start_id: int, end_id: int, *, config: NexmarkConfig = NexmarkConfig()) -> pa.Table:
    """The events with ids ``[start_id, end_id)``, in id order, as a pyarrow Table."""
    batches = list(generate_batches(start_id, end_id, config=config))
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def nominal_record_bytes(table: pa.Table) -> np.ndarray:
    """Each row's nominal record size: 8 B per non-null numeric/timestamp field other than
    ``event_type``/``event_id``, plus the UTF-8 bytes of its strings and its payload."""
    import pyarrow.compute as pc

    total = np.zeros(table.num_rows, dtype=np.int64)
    for field in ARROW_SCHEMA:
        if field.name in ("event_type", "event_id"):
            continue
        col = table.column(field.name)
        if pa.types.is_string(field.type) or pa.types.is_binary(field.type):
            total += pc.fill_null(pc.binary_length(col), 0).to_numpy()
        else:
            total += 8 * pc.is_valid(col).to_numpy(zero_copy_only=False).astype(np.int64)
    return total


def _main() -> None:  # pragma: no cover - a measurement, not a test
    import time

    cfg = NexmarkConfig()
    generate(0, 10_000, config=cfg)
    n = 1_000_000
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        generate(0, n, config=cfg)
        best = min(best, time.perf_counter() - t0)
    print(f"{n} events in {best:.3f} s: {n / best / 1e6:.2f}M events/s")


if __name__ == "__main__":  # pragma: no cover
    _main()
