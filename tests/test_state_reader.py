"""The state reader: ``spark.read.format("rhino-state")`` and ``rhino inspect --operator``
on a real local Spark (local[2]), real ``rhino worker`` processes on 127.0.0.2..4 and a
real ``rhino coordinator`` process.

The oracle is a model of each processor's state kept here, by replaying the input
batches in plain Python: the values, list order, map entries and timers fired at the
watermark of an event-time processor; the entries and their TTL expiry (at the batch
times of a manual clock) of a processing-time one (TTL needs ProcessingTime, as in Spark).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino  # noqa: E402
from spark_fixtures import local_spark, rhino_cluster  # noqa: E402

# The processors below travel to Spark's Python workers by value (they cannot import this module).
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

GAP_MS = 3000  # a key's timer: its latest event + GAP
TTL_MS = 2000  # the TTL processor's states
DELAY_MS = 1000  # the watermark delay
BASE_MS = 1_700_000_000_000


class ReaderProcessor(StatefulProcessor):
    """Per key (k, g): a count and sum (ValueState), its values (ListState: appended,
    or replaced when a batch brings a multiple of 10), counts per v % 4 (MapState;
    a multiple of 7 removes its entry), and one event-time timer at its latest
    event + GAP, which clears the count."""

    def init(self, handle):
        self.handle = handle
        self.total = handle.getValueState("total", "n long, s long")
        self.vals = handle.getListState("vals", "v long, tag string")
        self.bymod = handle.getMapState("bymod", "m int", "c long, half double")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows)).sort_values("v", kind="stable")
        vs = [int(v) for v in pdf["v"]]
        ts = max(int(t.value // 1_000_000) for t in pdf["ts"])
        n, s = self.total.get() or (0, 0)
        self.total.update((n + len(vs), s + sum(vs)))
        elems = [(v, f"t{v}") for v in vs]
        if any(v % 10 == 0 for v in vs):
            self.vals.put(elems)
        else:
            self.vals.appendList(elems)
        for v in vs:
            m = (v % 4,)
            if v % 7 == 0:
                self.bymod.removeKey(m)
            else:
                old = self.bymod.getValue(m)
                self.bymod.updateValue(m, ((old[0] if old else 0) + 1, v / 2))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        self.handle.registerTimer(ts + GAP_MS)
        return iter([])

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.total.clear()
        return iter([])

    def close(self):
        pass


class Model:
    """The processor's state, replayed in plain Python."""

    def __init__(self):
        self.total: dict = {}
        self.vals: dict = {}
        self.bymod: dict = {}
        self.timers: dict = {}  # key -> set of ms
        self.max_event: list = []
        self.fired = 0

    def watermark(self, b):
        return max(0, max(self.max_event[:b]) - DELAY_MS) if b > 0 else 0

    def apply(self, pdf, b):
        wm = self.watermark(b)
        for (k, g), grp in pdf.groupby(["k", "g"], sort=True):
            key = (int(k), g)
            vs = sorted(int(v) for v in grp["v"])
            ts = max(int(t.value // 1_000_000) for t in grp["ts"])
            n, s = self.total.get(key, (0, 0))
            self.total[key] = (n + len(vs), s + sum(vs))
            elems = [(v, f"t{v}") for v in vs]
            if any(v % 10 == 0 for v in vs):
                self.vals[key] = elems
            else:
                self.vals.setdefault(key, []).extend(elems)
            mp = self.bymod.setdefault(key, {})
            for v in vs:
                if v % 7 == 0:
                    mp.pop(v % 4, None)
                else:
                    mp[v % 4] = (mp.get(v % 4, (0, 0.0))[0] + 1, v / 2)
            self.timers[key] = {ts + GAP_MS}
        for key, ts_set in self.timers.items():
            for t in sorted(x for x in ts_set if x <= wm):
                ts_set.discard(t)
                self.total.pop(key, None)
                self.fired += 1
        self.max_event.append(max([int(t.value // 1_000_000) for t in pdf["ts"]] + self.max_event[-1:]))

    def snapshot(self):
        return copy.deepcopy({"total": self.total, "vals": self.vals, "bymod": self.bymod, "timers": self.timers})


class TTLProcessor(StatefulProcessor):
    """Processing time, every state with a TTL: per key its largest value (ValueState),
    its values (ListState, appended), and the last value per v % 3 (MapState)."""

    def init(self, handle):
        self.top = handle.getValueState("top", "v long", ttlDurationMs=TTL_MS)
        self.recent = handle.getListState("recent", "v long", ttlDurationMs=TTL_MS)
        self.last = handle.getMapState("last", "m long", "v long", ttlDurationMs=TTL_MS)

    def handleInputRows(self, key, rows, timerValues):
        vs = sorted(int(v) for p in rows for v in p["v"])
        self.top.update((vs[-1],))
        self.recent.appendList([(v,) for v in vs])
        for v in vs:
            self.last.updateValue((v % 3,), (v,))
        return iter([])

    def close(self):
        pass


class TTLModel:
    """TTLProcessor's entries, each with its expiry (the batch's time + TTL)."""

    def __init__(self):
        self.top: dict = {}  # k -> (v, expiry)
        self.recent: dict = {}  # k -> [(v, expiry)]
        self.last: dict = {}  # (k, m) -> (v, expiry)

    def apply(self, pdf, now):
        for k, grp in pdf.groupby("k", sort=True):
            vs = sorted(int(v) for v in grp["v"])
            self.top[int(k)] = (vs[-1], now + TTL_MS)
            self.recent.setdefault(int(k), []).extend((v, now + TTL_MS) for v in vs)
            for v in vs:
                self.last[(int(k), v % 3)] = (v, now + TTL_MS)

    def snapshot(self):
        return copy.deepcopy({"top": self.top, "recent": self.recent, "last": self.last})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("statereader")) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-state-reader")
    from rhino.spark.state_source import register_state_source

    register_state_source(s)
    yield s
    s.stop()


def _coord(cluster):
    from rhino.coordinator.client import connect_coordinator

    return connect_coordinator(cluster["coordinator"], secret=cluster["secret_file"].read_bytes().strip())


def _batch(b, rng, keys):
    rows = []
    for _ in range(14):
        k, g = rng.choice(keys)
        rows.append({"k": k, "g": g, "v": rng.randrange(100),
                     "ts": pd.Timestamp(BASE_MS + b * 3000 + rng.randrange(2000), unit="ms")})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def ran(cluster, spark, tmp_path_factory):
    """ReaderProcessor over 4 batches, and the model's state after each batch."""
    from rhino.spark import transform_with_state

    op_id = "reader"
    op = transform_with_state(ReaderProcessor(), key=["k", "g"], output_schema="k long", operator_id=op_id,
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=3, replicas=2, locality=False, time_mode="EventTime", event_time="ts",
                              watermark_delay="1 second",
                              checkpoint_location=str(tmp_path_factory.mktemp("reader-ck")))
    rng = __import__("random").Random(27)
    early = [(k, g) for k in range(4) for g in ("a", "b")]  # batch 0 only: their timers fire
    late = [(k, g) for k in range(4, 8) for g in ("a", "b")]
    model, snaps = Model(), []
    for b in range(4):
        pdf = _batch(b, rng, early + late if b == 0 else late)
        op.process_batch(spark.createDataFrame(pdf, "k long, g string, v long, ts timestamp"), b)
        model.apply(pdf, b)
        snaps.append(model.snapshot())
    with _coord(cluster) as cc:
        placement = cc.placement(op_id)
    op.close()
    # the data exercises what the reader must show
    last = snaps[-1]
    assert model.fired > 0 and any(last["timers"].values())
    assert any(len(v) > 1 for v in last["vals"].values())
    return {"op": op_id, "snaps": snaps, "placement": placement}


# the batch times of the TTL operator (a manual clock): batch 0's entries expire at batch 2,
# batch 1's at batch 3; batch 2's and 3's are live at batch 3
TTL_TIMES = [BASE_MS, BASE_MS + 1000, BASE_MS + 2000, BASE_MS + 3500]


@pytest.fixture(scope="module")
def ttl_ran(cluster, spark):
    """TTLProcessor over 4 batches at TTL_TIMES, and the model's entries after each batch."""
    from rhino.spark import transform_with_state

    clock = [0]
    op = transform_with_state(TTLProcessor(), key="k", output_schema="k long", operator_id="ttl-reader",
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=2, locality=False, time_mode="ProcessingTime",
                              clock=lambda: clock[0])
    rng = __import__("random").Random(31)
    model, snaps = TTLModel(), []
    with _coord(cluster) as cc:
        for b, now in enumerate(TTL_TIMES):
            clock[0] = now
            pdf = pd.DataFrame({"k": [rng.randrange(8 if b < 2 else 3) for _ in range(10)],  # 3..7: expire
                                "v": [rng.randrange(50) for _ in range(10)]})
            op.process_batch(spark.createDataFrame(pdf, "k long, v long"), b)
            bt = cc.placement("ttl-reader").batch_time
            assert (bt.batch, bt.time_ms) == (b, now)
            model.apply(pdf, now)
            snaps.append(model.snapshot())
    op.close()
    # the data exercises what the reader must hide: live and expired elements in one list
    now = TTL_TIMES[-1]
    assert any({e > now for _, e in els} == {True, False} for els in snaps[-1]["recent"].values())
    assert {e > now for _, e in snaps[-1]["top"].values()} == {True, False}
    return {"op": "ttl-reader", "snaps": snaps}


def _read(spark, cluster, op_id, **opts):
    r = (spark.read.format("rhino-state").option("coordinator", cluster["coordinator"])
         .option("secretFile", str(cluster["secret_file"])).option("operatorId", op_id))
    for k, v in opts.items():
        r = r.option(k, str(v).lower() if isinstance(v, bool) else str(v))
    return r.load()


def _instance_of(placement):
    """key -> the instance its vnode is assigned to (what partition_id must be)."""
    from rhino.spark.state.encoding import encode_key
    from rhino.spark.state.layout import vnodes_of

    part = rhino.Partitioner(**placement.partitioner_args())

    def of(key):
        return placement.assignment[int(vnodes_of(part, [encode_key(key)])[0])]

    return of


def _key(row):
    return (row["key"]["k"], row["key"]["g"])


def test_each_variable_and_the_timers_equal_the_model(ran, cluster, spark):
    last = ran["snaps"][-1]
    inst = _instance_of(ran["placement"])

    df = _read(spark, cluster, ran["op"], stateVarName="total")
    assert df.schema.simpleString() == ("struct<key:struct<k:bigint,g:string>,value:struct<n:bigint,s:bigint>,"
                                        "partition_id:int>")
    rows = df.collect()
    assert {_key(r): tuple(r["value"]) for r in rows} == last["total"]
    assert len(rows) == len(last["total"])
    assert all(r["partition_id"] == inst(_key(r)) for r in rows)

    df = _read(spark, cluster, ran["op"], stateVarName="vals")
    assert df.columns == ["key", "list_element", "partition_id"]
    got: dict = {}
    for r in df.collect():  # one partition per instance, each in scan order: list order per key
        got.setdefault(_key(r), []).append((r["list_element"]["v"], r["list_element"]["tag"]))
        assert r["partition_id"] == inst(_key(r))
    assert got == {k: v for k, v in last["vals"].items() if v}

    df = _read(spark, cluster, ran["op"], stateVarName="bymod")
    assert df.schema.simpleString() == ("struct<key:struct<k:bigint,g:string>,user_map_key:struct<m:int>,"
                                        "user_map_value:struct<c:bigint,half:double>,partition_id:int>")
    rows = df.collect()
    assert {(_key(r), r["user_map_key"]["m"]): tuple(r["user_map_value"]) for r in rows} == \
        {(k, m): v for k, mp in last["bymod"].items() for m, v in mp.items()}
    assert all(r["partition_id"] == inst(_key(r)) for r in rows)

    df = _read(spark, cluster, ran["op"], readRegisteredTimers=True)
    assert df.schema.simpleString() == ("struct<key:struct<k:bigint,g:string>,expiration_timestamp_ms:bigint,"
                                        "partition_id:int>")
    rows = df.collect()
    assert sorted((_key(r), r["expiration_timestamp_ms"]) for r in rows) == \
        sorted((k, t) for k, ts in last["timers"].items() for t in ts)
    assert all(r["partition_id"] == inst(_key(r)) for r in rows)


def _ttl_rows(spark, cluster, var, **opts):
    df = _read(spark, cluster, "ttl-reader", stateVarName=var, **opts)
    out: dict = {}
    for r in df.collect():
        k = r["key"]["k"]
        if var == "top":
            out[k] = r["value"]["v"]
        elif var == "recent":
            out.setdefault(k, []).append(r["list_element"]["v"])
        else:
            out[(k, r["user_map_key"]["m"])] = r["user_map_value"]["v"]
    return out


def _live(snap, var, now):
    """The model's entries of ``var`` not expired at ``now`` (None: all of them)."""
    def ok(e):
        return now is None or e > now

    if var == "recent":
        got = {k: [v for v, e in els if ok(e)] for k, els in snap["recent"].items()}
        return {k: v for k, v in got.items() if v}
    return {k: v for k, (v, e) in snap[var].items() if ok(e)}


def test_ttl_entries_expired_at_the_batchs_time_are_not_returned(ttl_ran, cluster, spark):
    """A value, list elements and map entries with a TTL: what the processor would see
    at the last batch's time (expiry > time), each list's live elements in order."""
    last, now = ttl_ran["snaps"][-1], TTL_TIMES[-1]
    for var in ("top", "recent", "last"):
        assert _ttl_rows(spark, cluster, var) == _live(last, var, now), var
    # includeExpired: the live entries and what is still stored of the expired ones (the
    # worker's compaction filter may have dropped some of them already)
    for var in ("top", "last"):
        got = _ttl_rows(spark, cluster, var, includeExpired=True)
        assert _live(last, var, now).items() <= got.items() <= _live(last, var, None).items(), var
    got = _ttl_rows(spark, cluster, "recent", includeExpired=True)
    every, live = _live(last, "recent", None), _live(last, "recent", now)
    assert set(live) <= set(got) <= set(every)
    for k, els in got.items():  # in list order: every live element, among elements of the list
        assert _subsequence(live.get(k, []), els) and _subsequence(els, every[k]), k


def _subsequence(a, b):
    it = iter(b)
    return all(any(x == y for y in it) for x in a)


def test_ttl_at_an_older_batch_filters_with_that_batchs_time(ttl_ran, cluster, spark):
    """The coordinator keeps the latest batches' times: an older checkpoint of a TTL
    variable hides what was expired at its own batch's time; includeExpired=true gives
    every stored entry."""
    snap = ttl_ran["snaps"][2]
    assert _ttl_rows(spark, cluster, "top", batchId=2) == _live(snap, "top", TTL_TIMES[2])
    got = _ttl_rows(spark, cluster, "top", batchId=2, includeExpired=True)
    assert _live(snap, "top", TTL_TIMES[2]).items() <= got.items() <= _live(snap, "top", None).items()


def test_an_earlier_batch_reads_its_own_checkpoint(ran, cluster, spark):
    for b in (1, 2):
        rows = _read(spark, cluster, ran["op"], stateVarName="total", batchId=b).collect()
        assert {_key(r): tuple(r["value"]) for r in rows} == ran["snaps"][b]["total"]
        rows = _read(spark, cluster, ran["op"], readRegisteredTimers=True, batchId=b).collect()
        assert sorted((_key(r), r["expiration_timestamp_ms"]) for r in rows) == \
            sorted((k, t) for k, ts in ran["snaps"][b]["timers"].items() for t in ts)
    # the workers keep the newest checkpoints only (retention, which runs after a commit in the
    # background): once checkpoint 0 is gone from every store, reading it fails, said clearly
    secret = cluster["secret_file"].read_bytes().strip()
    with _coord(cluster) as cc:
        pl = cc.placement(ran["op"])
    addrs = {a for inst in pl.instances.values() for a in (inst.address, *inst.chain_addresses)}
    deadline = time.monotonic() + 30
    while any(0 in rhino.query_store(a, secret=secret, operator_id=ran["op"], instance=i)
              for i, inst in pl.instances.items() for a in (inst.address, *inst.chain_addresses)):
        assert time.monotonic() < deadline, f"checkpoint 0 still retained on {sorted(addrs)}"
        time.sleep(0.2)
    with pytest.raises(Exception, match=r"checkpoint 0 of operator 'reader' instance \d could not be read from "
                                        r"any worker holding the instance .*NotFoundError"):
        _read(spark, cluster, ran["op"], stateVarName="total", batchId=0).collect()


def test_an_unknown_state_variable_is_refused_naming_the_known_ones(ran, cluster, spark):
    with pytest.raises(Exception, match=r"no state variable 'nope'; its state variables: bymod, total, vals"):
        _read(spark, cluster, ran["op"], stateVarName="nope").collect()
    with pytest.raises(Exception, match=r"stateVarName\): one of bymod, total, vals"):
        _read(spark, cluster, ran["op"]).collect()


def test_a_batch_that_is_not_committed_is_refused(ran, cluster, spark):
    with pytest.raises(Exception, match=r"batch 4 of operator 'reader' is not committed: its last committed "
                                        r"batch is 3"):
        _read(spark, cluster, ran["op"], stateVarName="total", batchId=4).collect()
    with pytest.raises(Exception, match="batchId must be an integer"):
        _read(spark, cluster, ran["op"], stateVarName="total", batchId="last").collect()


def test_a_chain_member_serves_when_the_primary_does_not_answer(ran, cluster):
    """Each instance read from its chain only (a dead address first, no primary): the same rows."""
    from rhino.spark.state.reader import StateReadError, plan_read, read_instance

    secret = cluster["secret_file"].read_bytes().strip()
    with _coord(cluster) as cc:
        plan = plan_read(cc, ran["op"], state_var="vals")
    want = [x for i in sorted(plan.instances) for x in read_instance(plan, i, secret)]
    assert len(want) == sum(len(v) for v in ran["snaps"][-1]["vals"].values())
    dead = "127.0.0.9:1"  # nothing listens there
    chains = {i: [dead] + a[1:] for i, a in plan.instances.items()}  # a[0] is the primary
    assert all(len(a) == 3 for a in chains.values())
    replicas = type(plan)(**{**plan.__dict__, "instances": chains})
    assert [x for i in sorted(plan.instances) for x in read_instance(replicas, i, secret)] == want
    # no worker at all: the error names what was tried
    nowhere = type(plan)(**{**plan.__dict__, "instances": {0: [dead]}})
    with pytest.raises(StateReadError, match=r"checkpoint 3 of operator 'reader' instance 0 could not be read.*"
                                             r"127\.0\.0\.9:1"):
        list(read_instance(nowhere, 0, secret))


_NO_PYSPARK = ("import sys; from rhino.cli.main import main; rc = main(sys.argv[1:]); "
               "assert 'pyspark' not in sys.modules, 'imported pyspark'; sys.exit(rc)")


def _inspect(cluster, op_id, *extra):
    """`rhino inspect --operator` in a real subprocess that must not import PySpark."""
    args = ["inspect", "--operator", op_id, "--coordinator", cluster["coordinator"],
            "--secret-file", str(cluster["secret_file"]), *extra]
    r = subprocess.run([sys.executable, "-c", _NO_PYSPARK, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_inspect_shows_the_variables_and_their_entry_counts(ran, ttl_ran, cluster):
    last = ran["snaps"][-1]
    rep = json.loads(_inspect(cluster, ran["op"], "--json"))
    assert rep["batch"] == 3 and rep["grouping_key"] == "struct<k:long,g:string>"
    assert [(v["name"], v["type"], v["id"], v["version"], v["ttl_ms"]) for v in rep["variables"]] == \
        [("bymod", "MapState", 1, 1, None), ("total", "ValueState", 2, 1, None), ("vals", "ListState", 3, 1, None)]
    by = {v["name"]: v for v in rep["variables"]}
    assert by["total"]["schema"] == "struct<n:long,s:long>"
    assert (by["bymod"]["key_schema"], by["bymod"]["schema"]) == ("struct<m:integer>", "struct<c:long,half:double>")
    assert by["total"]["entries"] == len(last["total"])
    assert by["vals"]["entries"] == sum(len(v) for v in last["vals"].values())
    assert by["bymod"]["entries"] == sum(len(m) for m in last["bymod"].values())
    assert rep["timers"] == sum(len(t) for t in last["timers"].values())
    # TTL: live and expired entries at the batch's time
    snap, now = ttl_ran["snaps"][-1], TTL_TIMES[-1]
    rep = json.loads(_inspect(cluster, "ttl-reader", "--json"))
    assert rep["batch_time_ms"] == now
    by = {v["name"]: v for v in rep["variables"]}
    for var, n_live, n_all in (("top", len(_live(snap, "top", now)), len(snap["top"])),
                               ("last", len(_live(snap, "last", now)), len(snap["last"])),
                               ("recent", sum(map(len, _live(snap, "recent", now).values())),
                                sum(map(len, snap["recent"].values())))):
        assert by[var]["ttl_ms"] == TTL_MS and by[var]["live"] == n_live, var
        assert by[var]["live"] + by[var]["expired"] == by[var]["entries"] <= n_all, var
    # an older batch: counted with its own time
    rep = json.loads(_inspect(cluster, "ttl-reader", "--json", "--batch", "2"))
    assert rep["batch"] == 2 and rep["batch_time_ms"] == TTL_TIMES[2] and "live" in rep["variables"][0]
    # the table
    out = _inspect(cluster, "ttl-reader")
    assert "operator ttl-reader: checkpoint of batch 3" in out
    line = next(x for x in out.splitlines() if x.startswith("top "))
    assert "ValueState" in line and f"{TTL_MS} ms" in line and "struct<v:long>" in line and "live" in line
    # errors: one line, status 2
    r = subprocess.run([sys.executable, "-m", "rhino.cli", "inspect", "--operator", ran["op"]],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "RHINO_COORDINATOR": ""})
    assert r.returncode == 2 and "--coordinator" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "rhino.cli", "inspect", "--operator", "nope", "--coordinator",
                        cluster["coordinator"], "--secret-file", str(cluster["secret_file"])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr


def test_arrow_batches_equal_pysparks_own_conversion_of_the_rows():
    """The reader yields Arrow batches built column by column; PySpark's data source
    conversion of the same rows as tuples (value by value) is the oracle, for every
    type the row codec stores, nulls included."""
    import datetime as dt
    from decimal import Decimal

    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    from rhino.spark.state.codec import RowCodec
    from rhino.spark.state.schema import parse_schema
    from rhino.spark.state.reader import ReadPlan
    from rhino.spark.state_source import RhinoStateDataSource, output_schema, rows_to_batch

    vs = parse_schema("a tinyint, b smallint, c int, d long, e float, f double, g boolean, h decimal(10,2), "
                      "i string, j binary, k date, l timestamp, m timestamp_ntz", var="all")
    ks = parse_schema("u string, w double", var="all")
    gk = parse_schema("k long, s string, t timestamp", var="all")
    entry = {"id": 1, "kind": "map", "ttl_ms": None, "key_schema": ks.json(), "versions": {"1": vs.json()},
             "current": 1}
    plan = ReadPlan(operator_id="x", batch=0, kind="map", var_name="all", entry=entry, grouping_key=gk.json(),
                    batch_time_ms=None, include_expired=False, instances={0: []})
    vc = RowCodec(vs, var="all", version=1, history={1: vs})
    rows_in = [(i - 3, 300 * i, -70000 * i, 1 << 40 | i, i / 3, -i / 7, i % 2 == 0, Decimal(i * 101) / 100,
                f"s{i}é", bytes([i, 0, 255]), dt.date(2024, 1, 1) + dt.timedelta(days=i),
                dt.datetime(2024, 3, 31, 1, 30) + dt.timedelta(minutes=37 * i),
                dt.datetime(1999, 12, 31, 23, 59, 59, 999999) + dt.timedelta(hours=i)) for i in range(40)]
    rows_in[5] = tuple(None for _ in rows_in[5])
    rows_in[7] = rows_in[7][:3] + (None,) + rows_in[7][4:11] + (None, None)
    values = vc.decode(vc.encode(rows_in))  # what the codec hands the reader
    rows = [((i, f"k{i % 3}", dt.datetime(2024, 6, 1, 12) + dt.timedelta(seconds=i)),
             (f"u{i}", None if i == 2 else i / 2), v, i % 3) for i, v in enumerate(values)]
    schema = output_schema(plan)
    ours = rows_to_batch(rows, schema, to_arrow_schema(schema, timezone="UTC"))
    theirs = list(records_to_arrow_batches(iter(rows), 1000, schema, RhinoStateDataSource({})))
    assert len(theirs) == 1 and ours.equals(theirs[0])
    assert rows_to_batch([], schema, to_arrow_schema(schema, timezone="UTC")).num_rows == 0


def test_arrow_batches_of_nested_values_equal_pysparks_own_conversion():
    """The same, for arrays, maps and structs inside state values (nulls at every level)."""
    import datetime as dt

    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    from rhino.spark.state.codec import RowCodec
    from rhino.spark.state.schema import parse_schema
    from rhino.spark.state.reader import ReadPlan
    from rhino.spark.state_source import RhinoStateDataSource, output_schema, rows_to_batch

    vs = parse_schema("a array<bigint>, m map<string, struct<x: double, d: date>>, "
                      "s struct<t: array<string>, n: struct<q: int>>", var="nested")
    gk = parse_schema("k long", var="nested")
    entry = {"id": 1, "kind": "list", "ttl_ms": None, "versions": {"1": vs.json()}, "current": 1}
    plan = ReadPlan(operator_id="x", batch=0, kind="list", var_name="nested", entry=entry, grouping_key=gk.json(),
                    batch_time_ms=None, include_expired=False, instances={0: []})
    vc = RowCodec(vs, var="nested", version=1, history={1: vs})
    rows_in = [([i, None, -i] if i % 3 else [], {f"k{i}": (i / 4, dt.date(2024, 1, 1 + i % 28)), "z": None},
                (["a", None] if i % 2 else None, None if i % 5 == 0 else (i,))) for i in range(40)]
    rows_in[4] = (None, None, None)
    values = vc.decode(vc.encode(rows_in))
    rows = [((i,), v, i % 3) for i, v in enumerate(values)]
    schema = output_schema(plan)
    ours = rows_to_batch(rows, schema, to_arrow_schema(schema, timezone="UTC"))
    theirs = list(records_to_arrow_batches(iter(rows), 1000, schema, RhinoStateDataSource({})))
    assert len(theirs) == 1 and ours.equals(theirs[0])


class CountProcessor(StatefulProcessor):
    def init(self, handle):
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(p) for p in rows)
        self.count.update(((self.count.get() or (0,))[0] + n,))
        return iter([])

    def close(self):
        pass


def test_reading_works_with_the_query_stopped(cluster, spark, tmp_path):
    """A streaming query runs the operator through foreachBatch and ends; then the state is read."""
    src = tmp_path / "src"
    src.mkdir()
    frames = []
    base = time.time() - 100
    for b in range(3):
        pdf = pd.DataFrame({"k": [(i * 5 + b) % 9 for i in range(30)]})
        frames.append(pdf)
        f = src / f"part-{b:03d}.parquet"
        pdf.to_parquet(f)
        os.utime(f, (base + b, base + b))  # the file source takes files in mtime order
    from rhino.spark import transform_with_state

    op = transform_with_state(CountProcessor(), key="k", output_schema="k long", operator_id="stopped",
                              coordinator=cluster["coordinator"], secret_file=str(cluster["secret_file"]),
                              parallelism=2, replicas=2, locality=False)
    q = (spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(src))
         .writeStream.foreachBatch(op.for_each_batch())
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert not q.isActive
    op.close()
    want = pd.concat(frames).groupby("k").size().to_dict()
    rows = _read(spark, cluster, "stopped", stateVarName="count").collect()
    assert {r["key"]["k"]: r["value"]["c"] for r in rows} == want
    assert {r["partition_id"] for r in rows} <= {0, 1}
