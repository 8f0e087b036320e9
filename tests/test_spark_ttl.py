"""State TTL (``ttlDurationMs``): the same processor object on Spark's own
``transformWithStateInPandas`` (RocksDB, ``timeMode="ProcessingTime"``, the only
time mode in which Spark allows TTL) and on rhino.spark from ``foreachBatch``, over
the same file stream with the same timing: the same output, batch by batch.

Spark's TTL semantics (/work/ttl-facts.md has the sources): a write at batch time t
(the micro-batch's timestamp, fixed for the batch) sets expiry t + ttl; the entry is
visible in every batch whose time is < t + ttl and invisible from the first batch
whose time is >= t + ttl; reads never refresh; every list element and map entry has
its own expiry. ``TimerValues.getCurrentProcessingTimeInMs()`` is that batch time.

How the timing is controlled. Batch times are wall-clock times, so a test cannot fix
them, only place them. Spark's query and Rhino's run side by side, each over its own
copy of the stream, one file per micro-batch (``maxFilesPerTrigger=1``, a 100 ms
processing-time trigger, the queries running all along); the test adds the same files
to both at the same times, each group when both have finished the previous one, at a
time chosen from the batch times seen so far:

    batch:  0        1  2 (back to back)  ...pause...   3     4          5
    time:   warm-up  a1 a2                >= a2+T+1.5s  s1  s1+0.6T  s1+1.3T

so every pair of batches is clearly closer than T (1-2, 3-4, 4-5) or clearly farther
(1-2 against 3-5; 3 against 5: the "staircase" where an update refreshes and a read
does not). Batch 0 warms both engines up (a first batch takes seconds: Python workers,
RocksDB, the operator's creation) and touches keys no other batch uses, so its time
does not matter. A batch takes 1-2.5 s here (more on a busy machine), so "back to
back" is about that far apart; hence T = 6 s. Each run's actual batch times are
checked afterwards: every pair at least ``MARGIN_MS`` away from T, on the designed
side, else the test fails saying the timing, not the state, went wrong.

Spark's batch times come from its offset log (``batchTimestampMs``). Rhino's are
taken as the entry of its ``foreachBatch`` call or up to ``RHINO_SLACK_MS`` later
(rhino.spark fixes a batch's time when the batch begins at the coordinator, at the
start of ``process_batch``); ExpiringMapProcessor reports the time the processor saw
(``getCurrentProcessingTimeInMs``), which is checked to lie in that call. Spark's
output is also checked against a pure-Python model of the semantics above, fed with
Spark's own batch times.

Spark runs with ``spark.sql.streaming.noDataMicroBatches.enabled=false``: in
ProcessingTime mode it would otherwise run an (eviction-only, output-free) batch at
every trigger, which moves batch ids and burns CPU. Outputs do not depend on it.

``RHINO_TTL_SPARK_ONLY=1`` runs the Spark half only (then skips).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

# The processors below travel to Spark's Python workers by value (they cannot import this module).
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

T_MS = 6000  # the TTL of every state variable below
MARGIN_MS = 300  # how far from T every pair of batch times (their bounds) must be
TRIGGER = "100 milliseconds"
# The schedule: groups of files (batch ids) added together, each when every run has finished the
# previous group and (anchor batch, delay ms) has passed since the anchor's batch time (at the
# latest of the runs); None: at once. Files added together become consecutive batches.
SCHEDULE = [([0], None), ([1, 2], None), ([3], (2, T_MS + 1500)), ([4], (3, int(0.6 * T_MS))),
            ([5], (3, int(1.3 * T_MS)))]
# Which pairs (i, j) must be closer than T (the others but batch 0's: farther).
NEAR = {(1, 2), (3, 4), (4, 5)}
RHINO_SLACK_MS = 300  # Rhino's batch time: from the entry of its foreachBatch call to this much later


# ---- the processors ----------------------------------------------------------------------

class DedupProcessor(StatefulProcessor):
    """Emits (k, v) only if k was not seen within T (ValueState "seen" with TTL T, written at
    every sighting, so a sighting refreshes it; reading it does not)."""

    def init(self, handle):
        self.seen = handle.getValueState("seen", "v long", ttlDurationMs=T_MS)

    def handleInputRows(self, key, rows, timerValues):
        out = []
        for pdf in rows:
            for v in pdf["v"].tolist():
                if self.seen.get() is None:
                    out.append(v)
                self.seen.update((v,))
        if out:
            yield pd.DataFrame({"k": [key[0]] * len(out), "v": out})


class ExpiringMapProcessor(StatefulProcessor):
    """MapState e -> x with TTL T: each input row (k, e, x) adds x to entry e (restarting from 0
    once the entry expired) and appends e to a ListState "recent" with TTL T. Emits per key:
    its live entries, the live elements of "recent", and the batch's processing time."""

    def init(self, handle):
        self.m = handle.getMapState("m", "e long", "x long", ttlDurationMs=T_MS)
        self.recent = handle.getListState("recent", "e long", ttlDurationMs=T_MS)

    def handleInputRows(self, key, rows, timerValues):
        for pdf in rows:
            for e, x in zip(pdf["e"].tolist(), pdf["x"].tolist()):
                old = self.m.getValue((e,))
                self.m.updateValue((e,), (x + (old[0] if old else 0),))
                self.recent.appendValue((e,))
        live = sorted((k[0], v[0]) for k, v in self.m.iterator())
        recent = sorted(r[0] for r in self.recent.get())
        yield pd.DataFrame({"k": [key[0]], "n": [len(live)],
                            "entries": [" ".join(f"{e}:{x}" for e, x in live)],
                            "recent": [" ".join(str(e) for e in recent)],
                            "pt": [timerValues.getCurrentProcessingTimeInMs()]})


DEDUP_OUT = "k long, v long"
MAP_OUT = "k long, n long, entries string, recent string, pt long"


# ---- the inputs (one list of rows per micro-batch) ------------------------------------------

def dedup_batches() -> list[list[tuple]]:
    """Keys 1..9 placed by hand (see the comments), plus filler keys 100.. at random."""
    hand = [
        list(range(900, 930)),  # the warm-up: keys in every partition, so every Python worker starts
        [1, 2, 3, 4, 5],
        [1, 2, 6],  # 1, 2 seen within T: dropped
        [1, 3, 7, 8],  # after the pause: 1, 3 expired, emitted again
        [7, 9],  # 7 dropped, and refreshed
        [7, 8, 9, 6],  # 7, 9 dropped (7: the refresh at 4); 8 (seen at 3 only) and 6 emitted
    ]
    rng = random.Random(7)
    out = []
    for b, keys in enumerate(hand):
        keys = keys + (rng.sample(range(100, 130), 12) if b else [])
        out.append([(k, b * 1000 + k) for k in keys])
    return out


def map_batches() -> list[list[tuple]]:
    """(k, e, x) rows: keys 1..3 by hand, filler keys 100.. at random."""
    hand = [
        [(k, 1, 1) for k in range(900, 930)],  # the warm-up: keys in every partition
        [(1, 1, 1), (1, 2, 1), (2, 1, 5)],
        [(1, 1, 2), (1, 3, 1), (2, 2, 1), (3, 7, 1)],  # 1:1 -> 3
        [(1, 4, 1), (2, 1, 1)],  # after the pause: 1's entries 1-3 gone, 2:1 starts again at 1
        [(1, 5, 1), (3, 8, 1)],  # 1 has 4, 5: entry 4 was read at 4 (iterator) ...
        [(1, 6, 1), (2, 2, 1), (3, 8, 2)],  # ... and is gone at 5 all the same; 2: 2:1 only; 3:8 -> 3
    ]
    rng = random.Random(11)
    out = []
    for b, rows in enumerate(hand):
        filler = [(rng.randrange(100, 115), rng.randrange(4), rng.randrange(1, 9)) for _ in range(12 if b else 0)]
        out.append(rows + filler)
    return out


# ---- Spark's semantics, as a model -------------------------------------------------------------

def dedup_model(batches, times) -> list[list[tuple]]:
    expiry: dict[int, int] = {}
    out = []
    for rows, t in zip(batches, times):
        got = []
        for k, v in rows:
            if not (k in expiry and t < expiry[k]):
                got.append((k, v))
            expiry[k] = t + T_MS
        out.append(sorted(got))
    return out


def map_model(batches, times) -> list[list[tuple]]:
    m: dict[tuple, tuple] = {}  # (k, e) -> (x, expiry)
    recent: dict[int, list] = {}  # k -> [(e, expiry)]
    out = []
    for rows, t in zip(batches, times):
        for k, e, x in rows:
            old = m.get((k, e))
            m[(k, e)] = (x + (old[0] if old and t < old[1] else 0), t + T_MS)
            recent.setdefault(k, []).append((e, t + T_MS))
        got = []
        for k in sorted({r[0] for r in rows}):
            live = sorted((e, x) for (kk, e), (x, exp) in m.items() if kk == k and t < exp)
            rec = sorted(e for e, exp in recent[k] if t < exp)
            got.append((k, len(live), " ".join(f"{e}:{x}" for e, x in live), " ".join(map(str, rec))))
        out.append(got)
    return out


# ---- fixtures (as tests/test_spark_operator.py) ----------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("sparkttl")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    # no empty batches between files (see the module's doc)
    s = local_spark("rhino-test-ttl", rocksdb=True, **{"spark.sql.streaming.noDataMicroBatches.enabled": "false"})
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


# ---- the runs: streaming queries fed the same files at the same times ----------------------------

def _now_ms() -> int:
    return int(time.time() * 1000)


class _Run:
    """One streaming query over its own copy of the stream: per batch id its output (pandas),
    the bounds (lo, hi) of its batch time in ms, and (Rhino) when its foreachBatch call began
    and ended."""

    def __init__(self, name: str, src: Path) -> None:
        self.name, self.src = name, src
        src.mkdir()
        self.query = None
        self.outputs: dict[int, pd.DataFrame] = {}
        self.times: dict[int, tuple[int, int]] = {}
        self.calls: dict[int, tuple[int, int]] = {}
        self.cv = threading.Condition()

    def record(self, b: int, pdf: pd.DataFrame, lo: int, hi: int) -> None:
        with self.cv:
            self.outputs[b] = pdf
            self.times.setdefault(b, (lo, hi))
            self.cv.notify_all()

    def wait(self, n: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cv:
            while len(self.outputs) < n:
                if not self.query.isActive:
                    raise AssertionError(f"{self.name}: the query stopped: {self.query.exception()}")
                assert time.monotonic() < deadline, f"{self.name}: batch {n - 1} did not finish"
                self.cv.wait(0.2)


def _add_file(src: Path, i: int, rows: list[tuple], columns: list[str]) -> None:
    """File i of the stream, written whole under a name Spark ignores, then renamed in. Its
    modification time orders it after file i-1 even within one clock tick (the file source
    takes files in that order)."""
    tmp = src / f".part-{i:03d}.parquet"
    pd.DataFrame(rows, columns=columns).astype("int64").to_parquet(tmp)
    t = time.time() + i * 0.01
    os.utime(tmp, (t, t))
    os.replace(tmp, src / f"part-{i:03d}.parquet")


def _feed(runs: list[_Run], batches: list, columns: list[str]) -> None:
    """Adds each group of files to every run's source at once, when the schedule says, and
    waits for every run to have processed them."""
    for files, after in SCHEDULE:
        if after is not None:
            anchor, delay = after
            at = max(r.times[anchor][1] for r in runs) + delay
            time.sleep(max(0.0, (at - _now_ms()) / 1000))
        for r in runs:
            for i in files:
                _add_file(r.src, i, batches[i], columns)
        for r in runs:
            r.wait(files[-1] + 1)


def _stream(spark, src: Path, schema: str):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))


def _spark_batch_time(ck: Path, b: int) -> int:
    """batchTimestampMs of batch b, from Spark's offset log."""
    for line in (ck / "offsets" / str(b)).read_text().splitlines():
        if "batchTimestampMs" in line:
            return int(json.loads(line)["batchTimestampMs"])
    raise AssertionError(f"no batchTimestampMs in {ck}/offsets/{b}")


def start_spark(spark, tmp: Path, processor, schema: str, out_schema: str) -> _Run:
    """Spark's own operator: transformWithStateInPandas, RocksDB, ProcessingTime."""
    run, ck = _Run("spark", tmp / "src-spark"), tmp / "ck-spark"

    def sink(df, b):
        t = _spark_batch_time(ck, b)
        run.record(b, df.toPandas(), t, t)

    run.query = (_stream(spark, run.src, schema).groupBy("k")
                 .transformWithStateInPandas(processor, outputStructType=out_schema, outputMode="Append",
                                             timeMode="ProcessingTime")
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(ck))
                 .trigger(processingTime=TRIGGER).start())
    return run


def start_rhino(spark, cluster, tmp: Path, processor, op_id: str, schema: str, out_schema: str) -> _Run:
    """rhino.spark's operator, from foreachBatch over the same stream."""
    from rhino.spark import transform_with_state

    run, ck = _Run("rhino", tmp / "src-rhino"), tmp / "ck-rhino"
    op = transform_with_state(processor, key="k", output_schema=out_schema, operator_id=op_id,
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=3, replicas=2, locality=False, time_mode="ProcessingTime",
                              checkpoint_location=str(ck))
    got: dict[int, pd.DataFrame] = {}
    step = op.for_each_batch(lambda df, b: got.__setitem__(b, df.toPandas()))

    def fe(df, b):
        lo = _now_ms()
        step(df, b)
        run.calls.setdefault(b, (lo, _now_ms()))
        run.record(b, got[b], lo, min(run.calls[b][1], lo + RHINO_SLACK_MS))

    run.query = (_stream(spark, run.src, schema).writeStream.foreachBatch(fe)
                 .option("checkpointLocation", str(ck)).trigger(processingTime=TRIGGER).start())
    run.op = op
    return run


def run_both(spark, cluster, tmp: Path, processor_cls, op_id: str, schema: str, out_schema: str,
             batches: list) -> list[_Run]:
    """Spark's run and (unless RHINO_TTL_SPARK_ONLY) Rhino's, side by side on the same schedule."""
    runs = [start_spark(spark, tmp, processor_cls(), schema, out_schema)]
    try:
        if not os.environ.get("RHINO_TTL_SPARK_ONLY"):
            runs.append(start_rhino(spark, cluster, tmp, processor_cls(), op_id, schema, out_schema))
        _feed(runs, batches, [f.split()[0] for f in schema.split(",")])
    finally:
        for r in runs:
            r.query.stop()
            if hasattr(r, "op"):
                r.op.close()
    return runs


# ---- checks ----------------------------------------------------------------------------------

def check_timing(run: _Run, n: int) -> None:
    """Every pair of batch times (but the warm-up's) at least MARGIN_MS from T, on the side
    the schedule meant."""
    assert sorted(run.times) == list(range(n)), f"{run.name}: batches {sorted(run.times)}"
    bad = []
    for i in range(1, n):
        for j in range(i + 1, n):
            (ilo, ihi), (jlo, jhi) = run.times[i], run.times[j]
            near = jhi - ilo <= T_MS - MARGIN_MS
            far = jlo - ihi >= T_MS + MARGIN_MS
            if not (near if (i, j) in NEAR else far):
                bad.append(((i, j), "near" if (i, j) in NEAR else "far", (jlo - ihi, jhi - ilo)))
    assert not bad, (f"{run.name}: the batch times missed the schedule (T={T_MS} ms, margin {MARGIN_MS}; "
                     f"a machine too busy?): {bad}; times {run.times}")


def rows_of(run: _Run, n: int, columns: list[str]) -> list[list[tuple]]:
    """Per batch, its output rows (the given columns) as sorted tuples of Python values."""
    return [sorted(tuple(x.item() if hasattr(x, "item") else x for x in r)
                   for r in run.outputs[b][columns].itertuples(index=False, name=None)) for b in range(n)]


def _spark_only() -> None:
    if os.environ.get("RHINO_TTL_SPARK_ONLY"):
        pytest.skip("RHINO_TTL_SPARK_ONLY: Spark's half passed; Rhino's half not run")


# ---- the tests --------------------------------------------------------------------------------

def test_value_state_ttl_dedup_equals_sparks_own_operator(cluster, spark, tmp_path):
    batches = dedup_batches()
    n = len(batches)
    runs = run_both(spark, cluster, tmp_path, DedupProcessor, "ttl-dedup", "k long, v long", DEDUP_OUT, batches)
    s = runs[0]
    check_timing(s, n)
    got_s = rows_of(s, n, ["k", "v"])
    assert got_s == dedup_model(batches, [s.times[b][0] for b in range(n)])
    hand = [[k for k, _ in rows if k < 100] for rows in got_s]
    assert hand == [[], [1, 2, 3, 4, 5], [6], [1, 3, 7, 8], [9], [6, 8]], hand
    _spark_only()
    r = runs[1]
    check_timing(r, n)
    assert rows_of(r, n, ["k", "v"]) == got_s


def test_map_and_list_state_ttl_equal_sparks_own_operator(cluster, spark, tmp_path):
    batches = map_batches()
    n = len(batches)
    cols = ["k", "n", "entries", "recent"]
    runs = run_both(spark, cluster, tmp_path, ExpiringMapProcessor, "ttl-map", "k long, e long, x long",
                    MAP_OUT, batches)
    s = runs[0]
    check_timing(s, n)
    got_s = rows_of(s, n, cols)
    assert got_s == map_model(batches, [s.times[b][0] for b in range(n)])
    k1 = [[r[2:] for r in rows if r[0] == 1] for rows in got_s]
    assert k1 == [[], [("1:1 2:1", "1 2")], [("1:3 2:1 3:1", "1 1 2 3")], [("4:1", "4")],
                  [("4:1 5:1", "4 5")], [("5:1 6:1", "5 6")]], k1
    k2 = [[r[2:] for r in rows if r[0] == 2] for rows in got_s]
    assert k2 == [[], [("1:5", "1")], [("1:5 2:1", "1 2")], [("1:1", "1")], [], [("2:1", "2")]], k2
    # TimerValues' processing time is the batch time (the offset log's batchTimestampMs)
    assert all(set(s.outputs[b]["pt"]) == {s.times[b][0]} for b in range(n))
    _spark_only()
    r = runs[1]
    check_timing(r, n)
    assert rows_of(r, n, cols) == got_s
    # one processing time per batch (the TTL clock), within the batch's foreachBatch call
    pts = {b: set(r.outputs[b]["pt"]) for b in range(n)}
    assert all(len(pts[b]) == 1 and r.calls[b][0] <= min(pts[b]) <= r.calls[b][1] for b in range(n)), \
        (pts, r.calls)
