"""``rhino-bench spark state-size``: the workload: the processor (the same object on both systems),
its input rows and their micro-batches, and the constants the run and the report share."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSTEMS = ("rhino", "spark-rocksdb")
KINDS = ("map", "list")
OP_FILL, OP_TOUCH, OP_CHECK = 0, 1, 2
INPUT_SCHEMA = "k long, op int, a long, b long"
OUTPUT_SCHEMA = "k long, op int, a long, b long"
BIG_KEY = 0
TARGET_FLAT = 2.0  # Rhino's batch_s at the largest N <= 2x its batch_s at the smallest
_SPARK_METRICS = ("rocksdbBytesCopied", "rocksdbFilesCopied", "rocksdbFilesReused", "rocksdbTotalBytesWritten",
                  "rocksdbTotalBytesWrittenByFlush", "rocksdbTotalBytesWrittenByCompaction",
                  "rocksdbZipFileBytesUncompressed", "rocksdbSstFileSize", "rocksdbCommitFlushLatency",
                  "rocksdbCommitCheckpointLatency", "rocksdbCommitFileSyncLatencyMs", "rocksdbCommitCompactLatency",
                  "rocksdbCommitWriteBatchLatency", "rocksdbCommitPauseLatency")
_TASK_FIELDS = ("read_s", "open_s", "group_s", "timers_s", "fetch_s", "process_s", "write_s", "commit_s",
                "replicate_s")


# ---- the processor (the same object runs on both systems) ----------------------------------

try:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - the CLI checks for PySpark before importing this module
    _Base = object  # type: ignore[assignment,misc]


class BigKeyProcessor(_Base):  # type: ignore[misc,valid-type]
    """One state variable per key, a MapState (``kind="map"``) or a ListState (``"list"``),
    driven by the input rows' ``op``:

    * FILL a b: add entries a..b-1 (map: ``updateValue((j,), (j,))`` per entry; list: one
      ``appendList`` of them); emits (k, FILL, a, b - a);
    * TOUCH a b: map: ``getValue((a,))``, then ``updateValue((a,), (b,))``; emits (k, TOUCH, a,
      the old value or -1); list: ``appendValue((b,))``; emits (k, TOUCH, a, b);
    * CHECK: reads the whole state; emits (k, CHECK, count, sum of the values).
    """

    def __init__(self, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.kind = kind
        self.state: Any = None

    def init(self, handle: Any) -> None:
        if self.kind == "map":
            self.state = handle.getMapState("entries", "ek long", "ev long")
        else:
            self.state = handle.getListState("entries", "ev long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import pandas as pd

        k = int(key[0])
        out = []
        for pdf in rows:
            for op, a, b in zip(pdf["op"].tolist(), pdf["a"].tolist(), pdf["b"].tolist()):
                out.append((k, int(op)) + self._apply(int(op), int(a), int(b)))
        yield pd.DataFrame(out, columns=["k", "op", "a", "b"])

    def _apply(self, op: int, a: int, b: int) -> tuple[int, int]:
        st = self.state
        if op == OP_FILL:
            if self.kind == "map":
                for j in range(a, b):
                    st.updateValue((j,), (j,))
            else:
                st.appendList([(j,) for j in range(a, b)])
            return a, b - a
        if op == OP_TOUCH:
            if self.kind == "map":
                old = st.getValue((a,))
                st.updateValue((a,), (b,))
                return a, (int(old[0]) if old is not None else -1)
            st.appendValue((b,))
            return a, b
        if op == OP_CHECK:
            n = s = 0
            if self.kind == "map":
                for _, v in st.iterator():
                    n += 1
                    s += int(v[0])
            else:
                for v in st.get():
                    n += 1
                    s += int(v[0])
            return n, s
        raise ValueError(f"unknown op {op}")

    def close(self) -> None:
        pass


# ---- the input: one Parquet file per micro-batch ---------------------------------------------


@dataclass
class Batch:
    index: int
    phase: str  # fill | warmup | measure | check
    rows: list[tuple[int, int, int, int]]


def plan_batches(n: int, *, fill_chunk: int, warmup: int, batches: int, small_keys: int,
                 seed: int = 7) -> list[Batch]:
    """The micro-batches of one (N) workload, in order (the same for both kinds and systems)."""
    rng = random.Random(seed * 1_000_003 + n)
    out: list[Batch] = []
    for start in range(0, n, fill_chunk):
        out.append(Batch(len(out), "fill", [(BIG_KEY, OP_FILL, start, min(n, start + fill_chunk))]))
    for i in range(warmup + batches):
        t = len(out)
        rows = [(BIG_KEY, OP_TOUCH, rng.randrange(n), 1_000_000_000 + t)]
        rows += [(k, OP_TOUCH, t % 7, t) for k in range(1, small_keys + 1)]
        out.append(Batch(t, "warmup" if i < warmup else "measure", rows))
    out.append(Batch(len(out), "check", [(k, OP_CHECK, 0, 0) for k in range(small_keys + 1)]))
    return out


def write_inputs(directory: Path, plan: list[Batch]) -> None:
    """One Parquet file per batch, with strictly increasing modification times (Spark's file
    source takes files in that order; files written within one clock tick could swap)."""
    import pandas as pd

    directory.mkdir(parents=True, exist_ok=True)
    base = time.time() - 10 * len(plan) - 100
    for b in plan:
        pdf = pd.DataFrame(b.rows, columns=["k", "op", "a", "b"]).astype(
            {"k": "int64", "op": "int32", "a": "int64", "b": "int64"})
        path = directory / f"batch-{b.index:05d}.parquet"
        pdf.to_parquet(path, index=False)
        os.utime(path, (base + 10 * b.index, base + 10 * b.index))
