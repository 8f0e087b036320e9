"""Issue 47: a running operator's processor swapped at a batch barrier, its state kept,
against Spark's own path for the same change on the same processors and micro-batches.

The oracle is Spark's ``transformWithStateInPandas`` (RocksDB state store, Avro state
encoding: Spark evolves a state schema only with it) run with the old processor up to the
cut, stopped, and restarted from its checkpoint with the new processor: the restart Spark
supports for compatible state. Each run of Spark's query reads the files there are, one
per batch (``availableNow``, ``maxFilesPerTrigger=1``). Rhino's query is one query that
runs through every cut: its sink asks for the swap after the batch before the cut, and the
swap takes effect at the cut's barrier.

Real `rhino worker` processes on 127.0.0.2..4 and a real `rhino coordinator`, as in
test_spark_operator."""

from __future__ import annotations

import json
import sys

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402
from test_spark_operator import SessionProcessor  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

OUT = "k long, n long, note string"
OUT_WIDE = "k long, n long, last long, note string"


class P1(StatefulProcessor):
    """A count per key."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        n = (self.n.get() or (0,))[0] + len(pdf)
        self.n.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "note": ["p1"]})

    def close(self):
        pass


class P2(P1):
    """A logic change, the same variables: each row counts twice."""

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        n = (self.n.get() or (0,))[0] + 2 * len(pdf)
        self.n.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "note": ["p2"]})


class P3(P1):
    """A variable added: the sum of v, which starts empty."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long")
        self.total = handle.getValueState("total", "t long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        n = (self.n.get() or (0,))[0] + 2 * len(pdf)
        t = (self.total.get() or (0,))[0] + int(pdf["v"].sum())
        self.n.update((n,))
        self.total.update((t,))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "note": [f"p3 t={t}"]})


class P4(P1):
    """A nullable field added to a variable's schema: the last v, None in values written before."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long, last long")
        self.total = handle.getValueState("total", "t long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        old = self.n.get()
        seen = "none" if old is None else ("null" if old[1] is None else str(old[1]))
        n = (old[0] if old else 0) + 2 * len(pdf)
        t = (self.total.get() or (0,))[0] + int(pdf["v"].sum())
        self.n.update((n, int(pdf["v"].iloc[-1])))
        self.total.update((t,))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "note": [f"p4 t={t} last_before={seen}"]})


class P5(P1):
    """A variable removed (total)."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long, last long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        old = self.n.get()
        n = (old[0] if old else 0) + 2 * len(pdf)
        self.n.update((n, int(pdf["v"].iloc[-1])))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "note": [f"p5 last_before={old[1] if old else None}"]})


class P6(P5):
    """The output schema changed: a column added."""

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        old = self.n.get()
        n = (old[0] if old else 0) + 2 * len(pdf)
        self.n.update((n, int(pdf["v"].iloc[-1])))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "last": [old[1] if old else None], "note": ["p6"]})


# (the cut, the processor from it, its output schema): each kind of change of issue 47
STEPS = [(0, P1, OUT), (2, P2, OUT), (3, P3, OUT), (4, P4, OUT), (5, P5, OUT), (6, P6, OUT_WIDE)]
BATCHES = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("swap")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-swap", rocksdb=True, **{"spark.sql.streaming.stateStore.encodingFormat": "avro"})
    yield s
    s.stop()


def _files(src, batches: int, seed: int = 47) -> None:
    import os
    import random
    import time

    rng = random.Random(seed)
    base = time.time() - 1000
    for b in range(batches):
        f = src / f"part-{b:03d}.parquet"
        pd.DataFrame({"k": [rng.randrange(4) for _ in range(6)], "v": [rng.randrange(100) for _ in range(6)]}
                     ).to_parquet(f)
        # Spark's file source takes files by modification time: one file per batch, in order
        os.utime(f, (base + b, base + b))


class _Sink:
    """Each batch's output (its last delivery: foreachBatch is at-least-once), with its columns."""

    def __init__(self) -> None:
        self.batches: dict[int, pd.DataFrame] = {}
        self.after: dict[int, callable] = {}  # batch -> what to do once its output is in

    def __call__(self, df, b) -> None:
        self.batches[int(b)] = df.toPandas()
        if int(b) in self.after:
            self.after.pop(int(b))()

    def frame(self) -> pd.DataFrame:
        frames = [f.assign(batch=b) for b, f in sorted(self.batches.items()) if len(f)]
        out = pd.concat(frames, ignore_index=True)
        out["last"] = out["last"].astype("Int64") if "last" in out else pd.NA
        return out.sort_values(["batch", "k"]).reset_index(drop=True)[["batch", "k", "n", "last", "note"]]


def _stream(spark, src):
    return spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).parquet(str(src))


def _spark_oracle(spark, src, ck, steps=STEPS, batches=BATCHES) -> _Sink:
    """Spark's path: each processor runs from its cut in a restart of the query from its
    checkpoint, the files up to the next cut there."""
    import shutil

    sink = _Sink()
    all_files = sorted(src.iterdir())
    live = src.parent / "spark-src"
    live.mkdir()
    ends = [cut for cut, _, _ in steps[1:]] + [batches]
    for (cut, proc, schema), end in zip(steps, ends):
        for f in all_files[cut:end]:
            shutil.copy2(f, live / f.name)  # and its modification time
        q = (_stream(spark, live).groupBy("k")
             .transformWithStateInPandas(proc(), outputStructType=schema, outputMode="Update", timeMode="None")
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        assert max(sink.batches) == end - 1, (cut, sorted(sink.batches))
    return sink


def test_swaps_of_each_kind_equal_sparks_restart_with_the_new_processor(cluster, spark, tmp_path):
    """A logic change, a variable added, a field added to a variable, a variable removed, an
    output-schema change: each swapped live on Rhino at its cut equals Spark's restart
    with the new processor at the same cut, batch by batch."""
    from rhino.spark import transform_with_state

    src = tmp_path / "src"
    src.mkdir()
    _files(src, BATCHES)
    want = _spark_oracle(spark, src, tmp_path / "ck-spark").frame()

    op = transform_with_state(P1(), key="k", output_schema=OUT, operator_id="swap-kinds",
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=1, locality=False)
    sink = _Sink()
    swaps = []
    for cut, proc, schema in STEPS[1:]:
        sink.after[cut - 1] = lambda proc=proc, schema=schema: swaps.append(op.swap(proc(), output_schema=schema))
    q = (_stream(spark, src).writeStream.foreachBatch(op.for_each_batch(sink))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    try:
        got = sink.frame()
        pd.testing.assert_frame_equal(got, want)
        # each swap took effect at the first barrier after it was asked for: its cut
        assert [s.wait(0) for s in swaps] == [cut for cut, _, _ in STEPS[1:]]
        versions = [r.code_version for r in op.reports]
        assert len(set(versions)) == len(STEPS)
        assert {r.batch for r in op.reports if r.swapped_from} == {cut for cut, _, _ in STEPS[1:]}
        # the coordinator's record: which code runs from which batch
        doc = op.control.read_doc()
        assert [(e["from_batch"], e["processor"].split(":")[1]) for e in doc["code"]] == [
            (cut, proc.__qualname__) for cut, proc, _ in STEPS]
        # the removed variable's entries went in the cut's batch (p5's), on every instance
        dropped = {d["name"]: d["batch"] for d in doc["dropped"]}
        assert dropped == {"total": 5}
        assert sum(t.get("dropped_entries", 0) for r in op.reports if r.batch == 5 for t in r.tasks) == 4
    finally:
        op.close()


class Incompatible(P1):
    """The count's field becomes a string: not an evolution Spark or Rhino allows."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n string")


def _rhino_query(spark, src, op, sink, ck):
    q = (_stream(spark, src).writeStream.foreachBatch(op.for_each_batch(sink))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def test_an_incompatible_swap_is_refused_rhino_swap_swaps_and_a_restart_with_old_code_is_refused(
        cluster, spark, tmp_path):
    """While P1 runs: ``op.swap`` to an incompatible processor is refused when asked, naming
    the variable and field, and P1 goes on with no batch lost; ``rhino swap`` (the external
    trigger, a real CLI process) names P2, which the driver loads and puts in force at the
    next barrier. Then the driver restarts: with P1's code it is refused, naming both
    versions; with P2's it goes on, exactly once. The whole output equals Spark's restart
    with P2 at the same cut."""
    import shutil
    import subprocess

    from rhino.spark import transform_with_state
    from rhino.spark.driver.code_version import CodeVersionError
    from rhino.spark.state.schema import StateSchemaError

    src, live = tmp_path / "src", tmp_path / "live"
    src.mkdir()
    live.mkdir()
    _files(src, 6, seed=7)
    want = _spark_oracle(spark, src, tmp_path / "ck-spark", steps=[(0, P1, OUT), (2, P2, OUT)], batches=6).frame()
    files = sorted(src.iterdir())

    def op_of(proc):
        return transform_with_state(proc, key="k", output_schema=OUT, operator_id="swap-cli",
                                    coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                                    parallelism=2, replicas=1, locality=False)

    op = op_of(P1())
    sink = _Sink()
    refused = []
    cli = []

    def after_batch_1():
        with pytest.raises(StateSchemaError, match="'n'.*'n'") as e:
            op.swap(Incompatible())
        refused.append(str(e.value))
        cmd = [sys.executable, "-m", "rhino.cli.main", "swap", "swap-cli", f"{__name__}:P2",
               "--coordinator", cluster["coordinator"], "--secret-file", str(cluster["secret_file"]), "--json"]
        cli.append(subprocess.run(cmd, capture_output=True, text=True, timeout=60))

    sink.after[1] = after_batch_1
    for f in files[:4]:
        shutil.copy2(f, live / f.name)
    ck = tmp_path / "ck-rhino"
    try:
        _rhino_query(spark, live, op, sink, ck)
        assert refused and cli[0].returncode == 0, (refused, cli[0].stderr)
        req = json.loads(cli[0].stdout)["request"]
        assert [r.batch for r in op.reports] == [0, 1, 2, 3]  # none lost to the refusal
        doc = op.control.read_doc()
        assert [(e["from_batch"], e["processor"], e["request"]) for e in doc["code"]] == [
            (0, f"{__name__}:P1", None), (2, f"{__name__}:P2", req)]
        assert "swap_request" not in doc
        v1, v2 = doc["code"][0]["version"], doc["code"][1]["version"]
        status = subprocess.run([sys.executable, "-m", "rhino.cli.main", "status", "--coordinator",
                                 cluster["coordinator"], "--secret-file", str(cluster["secret_file"])],
                                capture_output=True, text=True, timeout=60)
        assert f"code: {v2} ({__name__}:P2) from batch 2, 2 versions" in status.stdout, status.stdout
    finally:
        op.close()
    # the driver restarts with the old code: refused, both versions named
    for f in files[4:]:
        shutil.copy2(f, live / f.name)
    old = op_of(P1())
    with pytest.raises(Exception, match=f"(?s)CodeVersionError.*{v1}.*{v2}.*since batch 2") as e:
        _rhino_query(spark, live, old, _Sink(), ck)
    assert isinstance(e.value, CodeVersionError) or "CodeVersionError" in str(e.value)
    old.close()
    new = op_of(P2())
    try:
        _rhino_query(spark, live, new, sink, ck)
        assert new.code_version == v2
        pd.testing.assert_frame_equal(sink.frame(), want)
    finally:
        new.close()


class Sessions1(SessionProcessor):
    """Event time: test_spark_operator's sessions (a timer at last + GAP emits a key's span
    and count), each row tagged with the processor that emitted it."""

    TAG = "t1"

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        for pdf in super().handleExpiredTimer(key, timerValues, expiredTimerInfo):
            yield pdf.assign(why=self.TAG)


class Sessions2(Sessions1):
    """The same sessions, told apart by who emitted them: timers registered by Sessions1 fire here."""

    TAG = "t2"


def test_timers_registered_before_a_swap_fire_in_the_new_processor_as_on_sparks_restart(cluster, spark, tmp_path):
    """Event-time timers belong to the key, not to the code: those Sessions1 registered
    before the cut fire in Sessions2 after it, on Rhino (a live swap) as on Spark (a restart
    with the new processor). The batch before the cut moves no watermark, so neither system
    fires a timer between the two (Spark's no-data batch at a stop)."""
    import os
    import random
    import shutil
    import time

    from rhino.spark import transform_with_state

    cut, batches = 4, 8
    src, live = tmp_path / "src", tmp_path / "spark-live"
    src.mkdir()
    live.mkdir()
    rng = random.Random(3)
    t, base = 1_000_000, time.time() - 100
    for b in range(batches):
        if b == cut - 1:  # within the last second: no later event, the watermark stays
            rows = [{"k": rng.randrange(6), "ts": pd.Timestamp(t - rng.randrange(900), unit="ms")} for _ in range(20)]
        else:
            # keys 3-5 get input before the cut only: their timers, registered by Sessions1,
            # can only fire in Sessions2; a long gap now and then ends sessions before the cut
            rows = []
            for _ in range(20):
                t += rng.choice([10, 100, 700, 2500, 6000])
                rows.append({"k": rng.randrange(6 if b < cut else 3), "ts": pd.Timestamp(t, unit="ms")})
        f = src / f"part-{b:03d}.parquet"
        pd.DataFrame(rows).to_parquet(f, coerce_timestamps="us")
        os.utime(f, (base + b, base + b))
    f = src / "part-999.parquet"  # far ahead: every session's timer is due after it
    pd.DataFrame([{"k": 99, "ts": pd.Timestamp(t + 60_000, unit="ms")}]).to_parquet(f, coerce_timestamps="us")
    os.utime(f, (base + batches, base + batches))
    out = "k long, first long, last long, n long, why string"

    def stream(where):
        return (spark.readStream.schema("k long, ts timestamp").option("maxFilesPerTrigger", 1).parquet(str(where))
                .withWatermark("ts", "1 second"))

    got_spark: list[pd.DataFrame] = []
    files = sorted(src.iterdir())
    for proc, part in ((Sessions1, files[:cut]), (Sessions2, files[cut:])):
        for f in part:
            shutil.copy2(f, live / f.name)
        q = (stream(live).groupBy("k").transformWithStateInPandas(proc(), outputStructType=out, outputMode="Append",
                                                                   timeMode="EventTime")
             .writeStream.foreachBatch(lambda df, b: got_spark.append(df.toPandas()))
             .option("checkpointLocation", str(tmp_path / "ck-spark")).trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None, q.exception()

    op = transform_with_state(Sessions1(), key="k", output_schema=out, operator_id="swap-timers",
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=1, locality=False, time_mode="EventTime", event_time="ts",
                              watermark_delay="1 second", checkpoint_location=str(tmp_path / "ck-rhino"))
    got_rhino: list[pd.DataFrame] = []

    def sink(df, b):
        got_rhino.append(df.toPandas())
        if b == cut - 1:
            op.swap(Sessions2())

    q = (stream(src).writeStream.foreachBatch(op.for_each_batch(sink))
         .option("checkpointLocation", str(tmp_path / "ck-rhino")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    try:
        # Rhino fires a timer in the batch after the watermark passed it; Spark runs a no-data
        # batch at the end: one more (empty) batch applies the last watermark
        got_rhino.append(op.process_batch(spark.createDataFrame([], "k long, ts timestamp"),
                                          op.reports[-1].batch + 1).to_pandas())
        norm = lambda fs: (pd.concat([f for f in fs if len(f)], ignore_index=True)  # noqa: E731
                           .sort_values(["k", "first"]).reset_index(drop=True))
        s, r = norm(got_spark), norm(got_rhino)
        pd.testing.assert_frame_equal(r.astype({c: "int64" for c in ("k", "first", "last", "n")}),
                                      s.astype({c: "int64" for c in ("k", "first", "last", "n")}))
        # the timers Sessions1 registered for keys 3-5 (no input after the cut) fired in Sessions2
        assert set(r[(r["why"] == "t2") & (r["k"] >= 3)]["k"]) == {3, 4, 5}, r
        assert (r["why"] == "t1").any(), r  # and some fired before the cut, in the old code
    finally:
        op.close()


class M2(P1):
    """The count moved into a new variable of another shape, which the schema rules cannot
    express (a migration fills it): stats = (count, the count at the swap x 100)."""

    def init(self, handle):
        self.stats = handle.getValueState("stats", "count long, scaled long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        count, scaled = self.stats.get() or (0, None)
        count += len(pdf)
        self.stats.update((count, scaled))
        yield pd.DataFrame({"k": [key[0]], "n": [count], "note": [f"m2 scaled={scaled}"]})


def _migrate_n(key, old, proc):
    """Once per key at the cut: the old count into the new variable."""
    n = old["n"].get()
    if n is not None:
        proc.stats.update((n[0], n[0] * 100))


def test_a_swap_with_a_migration_runs_it_once_per_key_even_when_its_batch_runs_again(cluster, spark):
    """P1's count moves into M2's new variable by a per-key migration at the cut (batch 2);
    the old variable is removed there. The cut's first commit is refused (as after a
    failover), so batch 2 runs again from batch 1's state: the migration runs again, and the
    output equals a pandas model in which it ran once."""
    import random

    from spark_fixtures import RefuseFirstCommit

    from rhino.spark import transform_with_state

    rng = random.Random(11)
    batches = [pd.DataFrame({"k": [rng.randrange(5) for _ in range(8)], "v": [1] * 8}) for _ in range(5)]
    op = transform_with_state(P1(), key="k", output_schema=OUT, operator_id="swap-migrate",
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=1, locality=False)
    got = []
    try:
        for b, pdf in enumerate(batches):
            if b == 2:
                op.swap(M2(), migrate=_migrate_n)
                op.control.client = RefuseFirstCommit(op.coordinator(), 2)
            got.append(op.process_batch(spark.createDataFrame(pdf), b).to_pandas().assign(batch=b))
        rep = next(r for r in op.reports if r.batch == 2)
        assert rep.attempts == 2 and op.control.client.refused == 1, rep
        assert sum(t.get("migrated_keys", 0) for t in rep.tasks) == len(set(pd.concat(batches[:2])["k"]))
        assert op.control.read_doc()["dropped"] == [{"name": "n", "id": 1, "kind": "value", "ttl": False,
                                                     "batch": 2}]
    finally:
        op.close()
    # the model: counts per key; at the cut, scaled = the count then x 100, once
    rows, count, scaled = [], {}, {}
    for b, pdf in enumerate(batches):
        if b == 2:
            scaled = {k: c * 100 for k, c in count.items()}
        for k, n in pdf.groupby("k").size().items():
            count[k] = count.get(k, 0) + int(n)
            note = "p1" if b < 2 else f"m2 scaled={scaled.get(k)}"
            rows.append({"k": int(k), "n": count[k], "note": note, "batch": b})
    want = pd.DataFrame(rows).sort_values(["batch", "k"]).reset_index(drop=True)
    out = pd.concat(got, ignore_index=True).sort_values(["batch", "k"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(out[["k", "n", "note", "batch"]].astype({"k": "int64", "n": "int64"}),
                                  want.astype({"k": "int64", "n": "int64"}))
