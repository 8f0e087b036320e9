"""The ``"nexmark"`` PySpark data source: NEXMark events as a stream (and as a batch table).

Register once per session, then read::

    from rhino_testing.nexmark.source import NexmarkDataSource
    spark.dataSource.register(NexmarkDataSource)
    events = (spark.readStream.format("nexmark")
              .option("eventsPerBatch", 10_000).option("maxEvents", 100_000).load())

Offsets are event-id ranges: an offset is ``{"next_event_id": n}``, the first id not yet read,
and a micro-batch ``(start, end]`` holds exactly the events ``[start, end)`` of
:func:`rhino_testing.nexmark.generator.generate`, whenever and however often it is read: replay
after a failure regenerates the same rows (the "upstream backup" of exactly-once replay).
The schema is :data:`~rhino_testing.nexmark.generator.SPARK_SCHEMA_DDL`; ``read`` yields Arrow
RecordBatches.

Options (case-insensitive; numbers as strings or ints):

* ``eventsPerBatch`` -- each ``latestOffset`` call advances by exactly this many events (the
  default read limit ``ReadMaxRows``), so micro-batch k holds ``[first + k*n, first + (k+1)*n)``;
* ``eventsPerSecond`` -- events become available at this wall-clock rate from the time the
  reader starts (counted from the first start offset it sees); combined with ``eventsPerBatch``
  a batch holds at most that many;
* ``maxEvents`` -- the stream ends after this many events (``firstEventId + maxEvents``);
  required by the batch reader, and by a stream that has neither of the two options above;
* ``firstEventId`` (default 0);
* ``numPartitions`` (default 1) -- each range is split into this many contiguous id ranges;
* ``rowsPerBatch`` (default 65536) -- rows per Arrow RecordBatch;
* generator config: ``seed``, ``baseTimeMs``, ``interEventDelayUs``, ``payloadBytes`` (Person
  and Auction payload), ``personPayloadBytes``, ``auctionPayloadBytes``, ``bidPayloadBytes``,
  ``numActivePeople``, ``numInFlightAuctions``, ``hotSellersRatio``, ``hotAuctionRatio``,
  ``hotBiddersRatio`` (defaults of :class:`~rhino_testing.nexmark.generator.NexmarkConfig`).

Trigger.AvailableNow is supported: the target is the end of what is available when the query
starts (``maxEvents``, or the rate's current position).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .generator import SPARK_SCHEMA_DDL, NexmarkConfig, generate_batches

__all__ = ["NexmarkDataSource", "config_from_options", "OFFSET_KEY"]

OFFSET_KEY = "next_event_id"

_CONFIG_OPTIONS = {
    "seed": "seed",
    "basetimems": "base_time_ms",
    "intereventdelayus": "inter_event_delay_us",
    "personpayloadbytes": "person_payload_bytes",
    "auctionpayloadbytes": "auction_payload_bytes",
    "bidpayloadbytes": "bid_payload_bytes",
    "numactivepeople": "num_active_people",
    "numinflightauctions": "num_in_flight_auctions",
    "hotsellersratio": "hot_sellers_ratio",
    "hotauctionratio": "hot_auction_ratio",
    "hotbiddersratio": "hot_bidders_ratio",
}
_OTHER_OPTIONS = {"payloadbytes", "eventsperbatch", "eventspersecond", "maxevents", "firsteventid",
                  "numpartitions", "rowsperbatch", "path"}


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def config_from_options(options: Mapping[str, Any]) -> NexmarkConfig:
    """The generator config the given source options describe (unknown options are an error)."""
    opts = _lower(options)
    unknown = set(opts) - set(_CONFIG_OPTIONS) - _OTHER_OPTIONS
    if unknown:
        raise ValueError(f"unknown nexmark option(s): {sorted(unknown)}")
    kwargs: dict[str, int] = {}
    if "payloadbytes" in opts:
        kwargs["person_payload_bytes"] = kwargs["auction_payload_bytes"] = int(opts["payloadbytes"])
    for opt, field in _CONFIG_OPTIONS.items():
        if opt in opts:
            kwargs[field] = int(opts[opt])
    return NexmarkConfig(**kwargs)


class _Range(InputPartition):
    """Events ``[start, end)``."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class _Settings:
    """Parsed options shared by the stream and batch readers (picklable plain values)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        opts = _lower(options)
        self.config = config_from_options(options)
        self.first = int(opts.get("firsteventid", 0))
        self.max_events = int(opts["maxevents"]) if "maxevents" in opts else None
        self.events_per_batch = int(opts["eventsperbatch"]) if "eventsperbatch" in opts else None
        self.events_per_second = float(opts["eventspersecond"]) if "eventspersecond" in opts else None
        self.num_partitions = int(opts.get("numpartitions", 1))
        self.rows_per_batch = int(opts.get("rowsperbatch", 65536))
        if self.first < 0:
            raise ValueError("firstEventId must be >= 0")
        if self.max_events is not None and self.max_events < 0:
            raise ValueError("maxEvents must be >= 0")
        if self.events_per_batch is not None and self.events_per_batch < 1:
            raise ValueError("eventsPerBatch must be >= 1")
        if self.events_per_second is not None and not self.events_per_second > 0:
            raise ValueError("eventsPerSecond must be > 0")
        if self.num_partitions < 1 or self.rows_per_batch < 1:
            raise ValueError("numPartitions and rowsPerBatch must be >= 1")

    @property
    def end(self) -> int | None:
        """The id after the last event, or None for an endless stream."""
        return None if self.max_events is None else self.first + self.max_events

    def split(self, start: int, end: int) -> list[_Range]:
        n = end - start
        if n <= 0:
            return []
        parts = min(self.num_partitions, n)
        bounds = [start + n * i // parts for i in range(parts + 1)]
        return [_Range(bounds[i], bounds[i + 1]) for i in range(parts)]

    def read(self, partition: _Range) -> Iterator[Any]:
        yield from generate_batches(partition.start, partition.end, config=self.config,
                                    max_rows=self.rows_per_batch)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: _Settings) -> None:
        self.s = settings
        self._t0: float | None = None       # wall time of the first latestOffset (rate anchor)
        self._anchor: int | None = None     # the start offset then
        self._target: int | None = None     # Trigger.AvailableNow's end

    def initialOffset(self) -> dict:
        return {OFFSET_KEY: self.s.first}

    def _available(self, start: int) -> int | None:
        """The id after the last event available now (None: unbounded)."""
        avail = self.s.end
        if self.s.events_per_second is not None:
            if self._t0 is None:
                self._t0, self._anchor = time.monotonic(), start
            by_rate = self._anchor + int((time.monotonic() - self._t0) * self.s.events_per_second)
            avail = by_rate if avail is None else min(avail, by_rate)
        if self._target is not None:
            avail = self._target if avail is None else min(avail, self._target)
        return avail

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start[OFFSET_KEY])
        avail = self._available(begin)
        if isinstance(limit, ReadMaxRows):
            end = begin + limit.max_rows if avail is None else min(avail, begin + limit.max_rows)
        elif avail is not None:
            end = avail
        elif self.s.events_per_batch is not None:
            # Read-all on an endless stream (e.g. Trigger.Once): one batch of the configured size.
            end = begin + self.s.events_per_batch
        else:
            raise ValueError("an endless nexmark stream needs eventsPerBatch, eventsPerSecond or maxEvents")
        return {OFFSET_KEY: max(begin, end)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.s.events_per_batch is not None:
            return ReadMaxRows(self.s.events_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        avail = self._available(self.s.first)
        if avail is None:
            raise ValueError("Trigger.AvailableNow on an endless nexmark stream: set maxEvents or eventsPerSecond")
        self._target = avail

    def reportLatestOffset(self) -> dict | None:
        return None if self.s.end is None else {OFFSET_KEY: self.s.end}

    def partitions(self, start: dict, end: dict) -> list[_Range]:
        return self.s.split(int(start[OFFSET_KEY]), int(end[OFFSET_KEY]))

    def read(self, partition: _Range) -> Iterator[Any]:
        return self.s.read(partition)

    def commit(self, end: dict) -> None:
        pass


class _BatchReader(DataSourceReader):
    def __init__(self, settings: _Settings) -> None:
        if settings.end is None:
            raise ValueError("spark.read.format('nexmark') needs maxEvents")
        self.s = settings

    def partitions(self) -> list[_Range]:
        return self.s.split(self.s.first, self.s.end) or [_Range(self.s.first, self.s.first)]

    def read(self, partition: _Range) -> Iterator[Any]:
        return self.s.read(partition)


class NexmarkDataSource(DataSource):
    """``spark.dataSource.register(NexmarkDataSource)``; then ``format("nexmark")``."""

    @classmethod
    def name(cls) -> str:
        return "nexmark"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def streamReader(self, schema) -> DataSourceStreamReader:
        return _StreamReader(_Settings(self.options))

    def reader(self, schema) -> DataSourceReader:
        return _BatchReader(_Settings(self.options))
