"""Spark's semantics in the corners a user meets (issue 45, Build item 4): each test runs
one processor on Spark's own ``transformWithStateInPandas`` / ``transformWithState`` (the
oracle) and on Rhino over the same micro-batches (a file stream, one file per batch) and
compares what the processor saw and emitted:

- a fresh index (``RangeIndex`` from 0) on every pandas frame handed to a processor;
- Spark's column types (integers as int64, in the input and the initial state) and
  Spark's numeric conversions when state is written (a float in a long field is null);
- a variable used after ``deleteIfExists`` in ``init``: Spark's ``PySparkRuntimeError``;
- ``listTimers()`` inside ``handleExpiredTimer`` still lists the firing timer;
- late rows filtered by the previous batch's watermark, timers fired by the current one;
- a key's rows in frames of at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows;
- nested types (arrays, maps, structs) in every kind of state variable, read back as Spark
  gives them.

One SparkSession and one Rhino cluster (real ``rhino worker`` processes on
127.0.0.2..4) for the module; small frames, few batches."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

T0 = 1_000_000  # event times: ms after this


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("parity")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-parity", rocksdb=True)
    yield s
    s.stop()


def _ts(ms: int) -> pd.Timestamp:
    return pd.Timestamp(T0 + ms, unit="ms")


def _files(src: Path, frames: list[pd.DataFrame]) -> None:
    """One parquet file per micro-batch, in mtime order (Spark's file source takes them so)."""
    src.mkdir()
    base = time.time() - 100
    for i, pdf in enumerate(frames):
        f = src / f"part-{i:03d}.parquet"
        pdf.to_parquet(f, coerce_timestamps="us")
        os.utime(f, (base + i, base + i))


def _both(spark: Any, cluster: dict, tmp: Path, name: str, proc: Any, frames: list[pd.DataFrame], schema: str,
          out: str, *, mode: str = "pandas", time_mode: str = "None", initial: Optional[pd.DataFrame] = None,
          initial_schema: Optional[str] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The processor's output on Spark's own operator and on Rhino over the same batches (one
    file each): both sorted by (batch, every column), with a fresh index."""
    from rhino.spark import transform_with_state

    _files(tmp / "src", frames)
    event = time_mode == "EventTime"

    def stream():
        s = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(tmp / "src"))
        return s.withWatermark("ts", "1 second") if event else s

    init = spark.createDataFrame(initial, initial_schema) if initial is not None else None
    got_s: list[pd.DataFrame] = []
    got_r: list[pd.DataFrame] = []
    sink = lambda got: lambda df, b: got.append(df.toPandas().assign(batch=b))  # noqa: E731
    g = stream().groupBy("k")
    kw = {} if init is None else {"initialState": init.groupBy("k")}
    tws = g.transformWithStateInPandas if mode == "pandas" else g.transformWithState
    q = (tws(proc, outputStructType=out, outputMode="Update", timeMode=time_mode, **kw)
         .writeStream.foreachBatch(sink(got_s)).option("checkpointLocation", str(tmp / "ck-spark"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    rkw: dict = dict(event_time="ts", watermark_delay="1 second") if event else {}
    op = transform_with_state(proc, key="k", output_schema=out, operator_id=f"parity-{name}-{mode}", mode=mode,
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=1, locality=False, time_mode=time_mode,
                              initial_state=init, checkpoint_location=str(tmp / "ck-rhino"), **rkw)
    q = (stream().writeStream.foreachBatch(op.for_each_batch(sink(got_r)))
         .option("checkpointLocation", str(tmp / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)

    def norm(frames: list[pd.DataFrame]) -> pd.DataFrame:
        df = pd.concat(frames, ignore_index=True)
        return df.sort_values(["batch"] + [c for c in df.columns if c != "batch"]).reset_index(drop=True)

    return norm(got_s), norm(got_r)


# ---- a. a fresh index on every pandas frame ------------------------------------------------------


class IndexProbe(StatefulProcessor):
    """Per key: the index of its initial-state frame (and ``.at[0, ...]`` on it, which Spark's
    fresh index allows) and of its input frame."""

    def init(self, handle):
        self.seen = handle.getValueState("seen", "s string")

    def handleInitialState(self, key, initialState, timerValues):
        try:
            at0 = str(int(initialState.at[0, "initVal"]))
        except KeyError as e:
            at0 = f"KeyError {e}"
        self.seen.update((f"init index={list(initialState.index)} at0={at0}",))

    def handleInputRows(self, key, rows, timerValues):
        seen = (self.seen.get() or ("-",))[0]
        for pdf in rows:
            yield pd.DataFrame({"k": [key[0]], "index": [str(list(pdf.index))], "init": [seen]})

    def close(self):
        pass


def test_a_pandas_frames_have_a_fresh_index_as_on_spark(cluster, spark, tmp_path):
    frames = [pd.DataFrame({"k": ["a", "b", "b", "c", "c", "c"], "v": [1, 2, 3, 4, 5, 6]}),
              pd.DataFrame({"k": ["c", "b", "b", "a"], "v": [7, 8, 9, 10]})]
    initial = pd.DataFrame({"k": ["b", "c", "d"], "initVal": [120, 130, 140]})
    s, r = _both(spark, cluster, tmp_path, "index", IndexProbe(), frames, "k string, v long",
                 "k string, index string, init string", initial=initial, initial_schema="k string, initVal long")
    # on Spark: every frame's index starts at 0
    assert s[s["k"] == "c"]["index"].tolist() == ["[0, 1, 2]", "[0]"], s
    assert s[s["k"] == "b"]["init"].tolist() == ["init index=[0] at0=120"] * 2, s
    pd.testing.assert_frame_equal(r, s)


# ---- b. Spark's column types, and its numeric conversions when state is written ------------------


class TypeProbe(StatefulProcessor):
    """The dtypes of the input's and the initial state's frames; the initial value stored as
    the handler got it; and a float 120.0 and an int written into long / int / double fields."""

    def init(self, handle):
        self.init_val = handle.getValueState("init_val", "v long")
        self.seen = handle.getValueState("seen", "s string")
        self.num = handle.getValueState("num", "l long, i int, d double, f double")

    def handleInitialState(self, key, initialState, timerValues):
        self.init_val.update((initialState.at[0, "initVal"],))  # refused as a float before the fix
        self.seen.update((str(dict(initialState.dtypes.astype(str))),))

    def handleInputRows(self, key, rows, timerValues):
        self.num.update((120.0, 7.0, 3, 2.5))
        for pdf in rows:
            yield pd.DataFrame({"k": [key[0]], "dtypes": [str(dict(pdf.dtypes.astype(str)))],
                                "init_dtypes": [(self.seen.get() or ("-",))[0]],
                                "init_val": [repr(self.init_val.get())], "num": [repr(self.num.get())]})

    def close(self):
        pass


def test_b_column_types_and_numeric_state_conversions_as_on_spark(cluster, spark, tmp_path):
    frames = [pd.DataFrame({"k": ["a", "b", "b"], "i": pd.array([1, 2, 3], dtype="int32"),
                            "l": [10, 20, 30], "f": pd.array([1.5, 2.5, 3.5], dtype="float32"),
                            "d": [0.5, 1.5, 2.5]})]
    initial = pd.DataFrame({"k": ["b", "c"], "initVal": pd.array([120, 5], dtype="int32"), "big": [2**62 + 1, 7]})
    s, r = _both(spark, cluster, tmp_path, "types", TypeProbe(), frames, "k string, i int, l long, f float, d double",
                 "k string, dtypes string, init_dtypes string, init_val string, num string", initial=initial,
                 initial_schema="k string, initVal int, big long")
    want = str({"k": "object", "i": "int64", "l": "int64", "f": "float64", "d": "float64"})
    assert s["dtypes"].tolist() == [want, want], s
    assert s[s["k"] == "b"]["init_dtypes"].tolist() == [str({"k": "object", "initVal": "int64", "big": "int64"})]
    assert s[s["k"] == "b"]["init_val"].tolist() == ["(120,)"], s
    assert s["num"].tolist() == ["(None, None, None, 2.5)"] * 2, s  # Spark: a number of another kind is null
    pd.testing.assert_frame_equal(r, s)


# ---- c. a variable used after deleteIfExists in init ---------------------------------------------


class DroppedUse(StatefulProcessor):
    """``init`` gets three variables, then drops them; every use is tried and reported."""

    def init(self, handle):
        self.x = handle.getValueState("x", "v long")
        self.lst = handle.getListState("l", "v long")
        self.m = handle.getMapState("m", "k string", "v long")
        self.kept = handle.getValueState("kept", "v long")
        for name in ("x", "l", "m"):
            handle.deleteIfExists(name)

    def _tries(self):
        return [("x.exists", self.x.exists), ("x.get", self.x.get), ("x.update", lambda: self.x.update((1,))),
                ("x.clear", self.x.clear), ("l.exists", self.lst.exists), ("l.get", lambda: list(self.lst.get())),
                ("l.appendValue", lambda: self.lst.appendValue((1,))), ("l.put", lambda: self.lst.put([(1,)])),
                ("l.clear", self.lst.clear), ("m.exists", self.m.exists),
                ("m.getValue", lambda: self.m.getValue(("a",))), ("m.containsKey", lambda: self.m.containsKey(("a",))),
                ("m.updateValue", lambda: self.m.updateValue(("a",), (1,))), ("m.keys", lambda: list(self.m.keys())),
                ("m.removeKey", lambda: self.m.removeKey(("a",))), ("m.clear", self.m.clear),
                ("kept.get", self.kept.get)]

    def _report(self, key):
        out = []
        for what, f in self._tries():
            try:
                got = repr(f())
            except Exception as e:  # the class and Spark's message prefix (up to the colon)
                got = f"{type(e).__module__}.{type(e).__name__}: {str(e).split(':')[0]}"
            out.append((key, what, got))
        return out

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        yield pd.DataFrame(self._report(key[0]), columns=["k", "call", "got"])

    def close(self):
        pass


class DroppedUseRows(DroppedUse):
    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        for _ in rows:
            pass
        for k, what, got in self._report(key[0]):
            yield Row(k=k, call=what, got=got)


@pytest.mark.parametrize("mode", ["pandas", "rows"])
def test_c_dropped_variable_raises_sparks_error(cluster, spark, tmp_path, mode):
    proc = DroppedUse() if mode == "pandas" else DroppedUseRows()
    s, r = _both(spark, cluster, tmp_path, "dropped", proc, [pd.DataFrame({"k": ["a", "b"]})], "k string",
                 "k string, call string, got string", mode=mode)
    got = dict(zip(s[s["k"] == "a"]["call"], s[s["k"] == "a"]["got"]))
    err = "pyspark.errors.exceptions.base.PySparkRuntimeError: "
    assert got["x.exists"] == err + "Error checking value state exists", got
    assert got["m.updateValue"] == err + "Error updating map state value", got
    assert got["l.get"] == "[]" and got["kept.get"] == "None", got
    pd.testing.assert_frame_equal(r, s)


# ---- d. listTimers() inside handleExpiredTimer ---------------------------------------------------


class TimerLister(StatefulProcessor):
    """Registers a timer 5 s (event time) after each row, and one far ahead; each firing timer
    reports what ``listTimers()`` gives in its own callback."""

    def init(self, handle):
        self.h = handle

    def _rows(self, key, n, timerValues):
        return [(key, f"rows={n} wm={timerValues.getCurrentWatermarkInMs()}")]

    def _expired(self, key, timerValues, info):
        # sorted: Spark lists a key's timers in its store's key order, not by time
        return [(key + "-expired", f"ts={info.getExpiryTimeInMs()} listed={sorted(self.h.listTimers())}")]

    def handleInputRows(self, key, rows, timerValues):
        n = 0
        for pdf in rows:
            n += len(pdf)
            for t in pdf["ts"]:
                self.h.registerTimer(int(t.value // 1_000_000) + 5000)
        self.h.registerTimer(T0 + 10**9)
        yield pd.DataFrame(self._rows(key[0], n, timerValues), columns=["k", "info"])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame(self._expired(key[0], timerValues, expiredTimerInfo), columns=["k", "info"])

    def close(self):
        pass


class TimerListerRows(TimerLister):
    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        n = 0
        for row in rows:
            n += 1
            self.h.registerTimer(int(row.ts.timestamp() * 1000) + 5000)
        self.h.registerTimer(T0 + 10**9)
        for k, info in self._rows(key[0], n, timerValues):
            yield Row(k=k, info=info)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        from pyspark.sql import Row

        for k, info in self._expired(key[0], timerValues, expiredTimerInfo):
            yield Row(k=k, info=info)


@pytest.mark.parametrize("mode", ["pandas", "rows"])
def test_d_list_timers_in_handle_expired_timer_lists_the_firing_one(cluster, spark, tmp_path, mode):
    # batch 1's watermark (10 s - 1 s) fires a's timer at 5 s and b's at 6 s; no late rows
    frames = [pd.DataFrame({"k": ["a", "b", "a"], "ts": [_ts(0), _ts(1000), _ts(10000)]}),
              pd.DataFrame({"k": ["b"], "ts": [_ts(9500)]})]
    proc = TimerLister() if mode == "pandas" else TimerListerRows()
    s, r = _both(spark, cluster, tmp_path, "timers", proc, frames, "k string, ts timestamp", "k string, info string",
                 mode=mode, time_mode="EventTime")
    far = T0 + 10**9
    assert s[s["k"] == "a-expired"]["info"].tolist() == [f"ts={T0 + 5000} listed={[T0 + 5000, T0 + 15000, far]}"], s
    pd.testing.assert_frame_equal(r, s)


# ---- e. late rows: the previous batch's watermark; timers: the current one ------------------------


class LateProbe(TimerLister):
    """Per key and batch: the rows it got (so a row dropped as late shows), and its timers."""

    def _rows(self, key, n, timerValues):
        return [(key, f"rows={n} wm={timerValues.getCurrentWatermarkInMs()}")]

    def _expired(self, key, timerValues, info):
        return [(key + "-expired", f"ts={info.getExpiryTimeInMs()} wm={timerValues.getCurrentWatermarkInMs()}")]


class LateProbeRows(TimerListerRows):
    _rows = LateProbe._rows
    _expired = LateProbe._expired


@pytest.mark.parametrize("mode", ["pandas", "rows"])
def test_e_late_rows_use_the_previous_batchs_watermark(cluster, spark, tmp_path, mode):
    # batch 1 runs with watermark 10 s - 1 s but drops late rows by batch 0's (0): a's row at
    # 4 s is kept; batch 2 drops by batch 1's (9 s): a's row at 3 s and b's at 8 s are late,
    # c's at 9.5 s is not. The last batch moves no watermark (Spark would add a batch).
    frames = [pd.DataFrame({"k": ["a"], "ts": [_ts(10000)]}),
              pd.DataFrame({"k": ["a", "b"], "ts": [_ts(4000), _ts(12000)]}),
              pd.DataFrame({"k": ["a", "b", "c"], "ts": [_ts(3000), _ts(8000), _ts(9500)]})]
    proc = LateProbe() if mode == "pandas" else LateProbeRows()
    s, r = _both(spark, cluster, tmp_path, "late", proc, frames, "k string, ts timestamp", "k string, info string",
                 mode=mode, time_mode="EventTime")
    b1 = s[s["batch"] == 1]
    assert f"rows=1 wm={T0 + 9000}" in b1[b1["k"] == "a"]["info"].tolist(), s  # kept on Spark
    assert s[(s["batch"] == 2) & s["k"].isin(["a", "b"])].empty, s  # late on Spark
    pd.testing.assert_frame_equal(r, s)


# ---- f. a key's rows in frames of at most maxRecordsPerBatch rows --------------------------------


class ChunkProbe(StatefulProcessor):
    """Per key: the size and index of every frame its rows arrive in."""

    def init(self, handle):
        pass

    def handleInputRows(self, key, rows, timerValues):
        seen = [f"{len(pdf)}:{pdf.index[0]}" for pdf in rows]
        yield pd.DataFrame({"k": [key[0]], "frames": [" ".join(seen)]})

    def close(self):
        pass


def test_f_a_keys_rows_arrive_in_frames_of_max_records_per_batch(cluster, spark, tmp_path):
    frames = [pd.DataFrame({"k": ["a"] * 5 + ["b"] * 2 + ["c"], "v": range(8)}),
              pd.DataFrame({"k": ["b"] * 3, "v": range(3)})]
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    try:
        s, r = _both(spark, cluster, tmp_path, "chunks", ChunkProbe(), frames, "k string, v long",
                     "k string, frames string")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert s[s["k"] == "a"]["frames"].tolist() == ["2:0 2:0 1:0"], s
    pd.testing.assert_frame_equal(r, s)


# ---- g. nested types in state schemas: arrays, maps, structs -------------------------------------

NESTED_VALUE = "xs array<bigint>, counts map<string, bigint>, last struct<n: bigint, tag: string>"


def _shown(v):
    """``repr`` of a state value, the Python types showing, with a dict's entries sorted: Spark
    gives a map's entries in a Java HashMap's order, Rhino in the order they were written."""
    from pyspark.sql import Row

    if isinstance(v, dict):
        return "{" + ", ".join(f"{_shown(k)}: {_shown(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, Row):
        return "Row(" + ", ".join(f"{n}={_shown(x)}" for n, x in zip(v.__fields__, v)) + ")"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_shown(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    return repr(v)


class NestedProbe(StatefulProcessor):
    """Per key and batch: what each state variable gives back (``_shown``: the Python types
    show, a tuple from a Row too), then state written with nested values: a value state of an
    array, a map and a struct, a list state of structs, a map state whose user key is a struct
    and whose value holds an array of structs."""

    def init(self, handle):
        self.v = handle.getValueState("v", NESTED_VALUE)
        self.l = handle.getListState("l", "e struct<n: bigint, tags: array<string>>")
        self.m = handle.getMapState("m", "kk struct<p: string, q: bigint>", "vv array<struct<n: bigint>>")

    def _seen(self, key, ns):
        old = self.v.get()
        mk = ((key, 1),)  # the map's user key: one field, a struct
        out = [(key, "v", _shown(old)), (key, "l", _shown(list(self.l.get()))),
               (key, "m", _shown(self.m.getValue(mk) if self.m.containsKey(mk) else None))]
        xs = (list(old[0]) if old else []) + ns
        counts = dict(old[1]) if old else {}
        for n in ns:
            counts[f"c{n % 3}"] = counts.get(f"c{n % 3}", 0) + 1
        self.v.update((xs, counts, (ns[-1], f"t{len(xs)}")))
        self.l.appendList([((n, [f"a{n}", None] if n % 2 else []),) for n in ns])
        self.m.updateValue(mk, ([(n,) for n in xs],))
        return out

    def handleInputRows(self, key, rows, timerValues):
        ns = [int(n) for pdf in rows for n in pdf["n"]]
        yield pd.DataFrame(self._seen(key[0], ns), columns=["k", "var", "got"])

    def close(self):
        pass


class NestedProbeRows(NestedProbe):
    def handleInputRows(self, key, rows, timerValues):
        from pyspark.sql import Row

        for k, var, got in self._seen(key[0], [int(r.n) for r in rows]):
            yield Row(k=k, var=var, got=got)


@pytest.mark.parametrize("mode", ["pandas", "rows"])
def test_g_nested_state_types_as_on_spark(cluster, spark, tmp_path, mode):
    frames = [pd.DataFrame({"k": ["a", "b", "a"], "n": [1, 2, 3]}),
              pd.DataFrame({"k": ["a", "b"], "n": [4, 5]}),
              pd.DataFrame({"k": ["a"], "n": [6]})]
    proc = NestedProbe() if mode == "pandas" else NestedProbeRows()
    s, r = _both(spark, cluster, tmp_path, "nested", proc, frames, "k string, n long", "k string, var string, got string",
                 mode=mode)
    a2 = dict(zip(*[s[(s["k"] == "a") & (s["batch"] == 2)][c] for c in ("var", "got")]))
    assert "[1, 3, 4]" in a2["v"] and "'c1': 2" in a2["v"], s  # what Spark gave back, before the comparison
    assert a2["m"].startswith("Row(vv=[Row(n=1)"), s  # Spark's getValue gives a Row
    pd.testing.assert_frame_equal(r, s)
