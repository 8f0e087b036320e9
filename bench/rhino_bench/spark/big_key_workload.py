"""``rhino-bench spark big-key``: the workload: the processor, the payload of each record, the
model of what was written (computed in the driver from the fill plan) and the fill plan."""

from __future__ import annotations

import hashlib
import time
import zlib
from typing import Any


OP_FILL, OP_SCAN = 0, 1
BIG_KEY = 0
VAR = "records"
INPUT_SCHEMA = "k long, op int, a long, n long"
OUTPUT_SCHEMA = "k long, op int, entries long, rid_sum long, seq_sum long, crc_sum long, payload_bytes long"
AGG_FIELDS = ("entries", "rid_sum", "seq_sum", "crc_sum", "payload_bytes")
SESSION_LIMIT = 1 << 30  # a worker session's uncommitted writes (key and value bytes), StateServiceOptions
# Per-entry bytes besides the payload, about: key = head 3 + routing (encode_key((k,))) + map key
# 9 + trailer 6; value = schema version 2 + null bitmap 1 + seq 8 + payload length 4.
ENTRY_OVERHEAD_EST = 48
PREFETCH = 64  # rhino.spark's prefetch per collection and key (rhino.spark.driver.config.PREFETCH_ENTRIES)
STEPS = ("fill", "read_processor", "read_state_reader", "handover", "read_processor_after_handover",
         "read_state_reader_after_handover")


# ---- the processor -------------------------------------------------------------------------------


def payload(k: int, j: int, nbytes: int) -> bytes:
    """Record j of key k's payload: ``nbytes`` pseudo-random (incompressible) bytes."""
    return hashlib.shake_128(b"%d:%d" % (k, j)).digest(nbytes)


try:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - the CLI checks for PySpark before importing this module
    _Base = object  # type: ignore[assignment,misc]


class RecordStoreProcessor(_Base):  # type: ignore[misc,valid-type]
    """A per-key record store: a MapState ``records`` (``rid long`` -> ``seq long, payload
    binary``). Input rows ``(k, op, a, n)``:

    * FILL a n: stores records a .. a+n-1 (one ``updateValue`` each); emits (k, FILL, n, 0...);
    * SCAN: iterates the map (``iterator()``) and emits (k, SCAN, entries, sum of record
      ids, sum of seq, sum of crc32(payload), sum of payload lengths).
    """

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = int(value_bytes)
        self.records: Any = None

    def init(self, handle: Any) -> None:
        self.records = handle.getMapState(VAR, "rid long", "seq long, payload binary")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import pandas as pd

        k = int(key[0])
        out = []
        for pdf in rows:
            for op, a, n in zip(pdf["op"].tolist(), pdf["a"].tolist(), pdf["n"].tolist()):
                if op == OP_FILL:
                    for j in range(a, a + n):
                        self.records.updateValue((j,), (j, payload(k, j, self.value_bytes)))
                    out.append((k, OP_FILL, n, 0, 0, 0, 0))
                elif op == OP_SCAN:
                    entries = rid_sum = seq_sum = crc_sum = nbytes = 0
                    for (rid,), (seq, data) in self.records.iterator():
                        entries += 1
                        rid_sum += rid
                        seq_sum += seq
                        crc_sum += zlib.crc32(data)
                        nbytes += len(data)
                    out.append((k, OP_SCAN, entries, rid_sum, seq_sum, crc_sum, nbytes))
                else:
                    raise ValueError(f"unknown op {op}")
        yield pd.DataFrame(out, columns=["k", "op"] + list(AGG_FIELDS))

    def close(self) -> None:
        pass


# ---- the model: what was written ----------------------------------------------------------------


class Model:
    """Per key, the aggregates of the records written (the fill plan replayed in the driver:
    the same payload function, none of Rhino's output). Records are never overwritten: a
    fill of a range that overlaps an earlier one is refused."""

    def __init__(self, value_bytes: int) -> None:
        self.value_bytes = int(value_bytes)
        self.aggs: dict[int, dict[str, int]] = {}
        self.ranges: dict[int, list[tuple[int, int]]] = {}
        self.seconds = 0.0

    def fill(self, k: int, a: int, n: int) -> None:
        t0 = time.perf_counter()
        for lo, hi in self.ranges.get(k, []):
            if a < hi and lo < a + n:
                raise ValueError(f"key {k}: records {a}..{a + n - 1} overlap {lo}..{hi - 1}")
        self.ranges.setdefault(k, []).append((a, a + n))
        g = self.aggs.setdefault(k, {f: 0 for f in AGG_FIELDS})
        crc = 0
        for j in range(a, a + n):
            crc += zlib.crc32(payload(k, j, self.value_bytes))
        g["entries"] += n
        g["rid_sum"] += (a + a + n - 1) * n // 2
        g["seq_sum"] += (a + a + n - 1) * n // 2
        g["crc_sum"] += crc
        g["payload_bytes"] += n * self.value_bytes
        self.seconds += time.perf_counter() - t0

    def next_rid(self, k: int) -> int:
        """The first record id after every record of key k written so far."""
        return max((hi for _, hi in self.ranges.get(k, [])), default=0)

    def expected(self, k: int) -> dict[str, int]:
        return dict(self.aggs.get(k, {f: 0 for f in AGG_FIELDS}))

    def keys(self) -> list[int]:
        return sorted(self.aggs)


def plan_fill(size: int, value_bytes: int, batch_bytes: int) -> list[tuple[int, int]]:
    """The big key's fill batches: (first record, records) each, ``batch_bytes`` of payload
    at most, ``size // value_bytes`` records in all (at least one)."""
    total = max(1, size // value_bytes)
    per = max(1, batch_bytes // value_bytes)
    return [(a, min(per, total - a)) for a in range(0, total, per)]
