"""Live reconfiguration of a running rhino.spark query (issue 29).

Reconfigurations asked WHILE ``writeStream.foreachBatch(op.for_each_batch(sink))`` runs
(a real local Spark, real ``rhino worker`` processes on 127.0.0.94..97 and a real
``rhino coordinator`` process): each plan's steps run at the operator's own barriers
(``begin_batch``, docs/design.md §4), between two batches of the running query.

- One query: rescale 3->4 (fluid), a handover of two vnodes (batched), rescale 4->2
  (all-at-once, through the ``rhino rescale`` command), a load rebalance; each asked once
  the previous plan is gone from ``status``.
- Two queries sharing one coordinator: each rescaled while the other has a plan open and
  waiting for its barrier (its stream idle; or its plan scheduled a few batches ahead). One
  is scaled in, then out again: its instances are then 0, 1 and 3 (a retired number is not
  reused), and partition p of a batch runs instance sorted(instances)[p].

The input is a file stream fed on demand (one file per batch, strictly increasing mtimes,
``maxFilesPerTrigger=1``), a few files ahead of the committed batches, so the query keeps
running batches for as long as plans wait for barriers. Sinks are idempotent by batch id
(a dict): a fused sink is called again when its batch runs again. Oracles: pandas running
counts over the same files, batch by batch (exactly-once). Ownership is checked on the
workers' own instance listings: each vnode one owner, at the operator's final epoch.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino  # noqa: E402
import rhino.spark  # noqa: E402
from rhino.coordinator.client import connect_coordinator  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

from spark_fixtures import local_spark, rhino_cluster  # noqa: E402
from test_coordinator_cli import rhino_cli  # noqa: E402

# the processor travels to Spark's Python workers by value (they cannot import tests/)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = (94, 95, 96, 97)  # 127.0.0.94..97: no other test module's workers
V = 12  # vnodes per operator: a rescale moves a few, so a fluid plan is a few batches
ROWS = 200  # input rows per file (per batch)
AHEAD = 2  # files written ahead of the committed batches


class RunningCount(StatefulProcessor):
    """Per key: a running count and sum of ``v`` in one ValueState; one output row per key
    and batch with both after the batch."""

    def init(self, handle):
        self.st = handle.getValueState("st", "n long, s long")

    def handleInputRows(self, key, rows, timerValues):
        n, s = self.st.get() or (0, 0)
        for pdf in rows:
            n += len(pdf)
            s += int(pdf["v"].sum())
        self.st.update((n, s))
        yield pd.DataFrame({"k": [int(key[0])], "n": [n], "s": [s]})

    def close(self):
        pass


def make_frames(n: int, seed: int) -> list[pd.DataFrame]:
    """n batches of skewed keys (six hot keys): the per-vnode load is uneven, so a load
    rebalance has something to move."""
    rng = np.random.default_rng(seed)
    keys = np.arange(48)
    w = np.where(keys < 6, 8.0, 1.0)
    w /= w.sum()
    return [pd.DataFrame({"k": rng.choice(keys, ROWS, p=w), "v": rng.integers(0, 1000, ROWS)}) for _ in range(n)]


def oracle(frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Per batch: each key of the batch with its running count and sum after it."""
    tot: dict[int, tuple[int, int]] = {}
    out = []
    for pdf in frames:
        rows = []
        for k, g in pdf.groupby("k"):
            n, s = tot.get(int(k), (0, 0))
            tot[int(k)] = (n + len(g), s + int(g["v"].sum()))
            rows.append((int(k), *tot[int(k)]))
        out.append(pd.DataFrame(rows, columns=["k", "n", "s"]))
    return out


def canon(df: pd.DataFrame) -> pd.DataFrame:
    return df[["k", "n", "s"]].astype("int64").sort_values(["k", "n", "s"]).reset_index(drop=True)


def assert_outputs_equal_oracle(got: dict[int, pd.DataFrame], frames: list[pd.DataFrame]) -> None:
    """Batch by batch: the sink saw batches 0..n-1, each equal to the oracle's (so no batch
    was lost, none counted twice)."""
    assert sorted(got) == list(range(len(frames))), f"batches seen by the sink: {sorted(got)}"
    for b, want in enumerate(oracle(frames)):
        pd.testing.assert_frame_equal(canon(got[b]), canon(want), obj=f"batch {b}")


class FedStream:
    """A query of ``op`` over a directory of parquet files, fed on demand: file i is
    ``frames[i]``, with mtime base+i (Spark's file source takes files in mtime order), written
    atomically (renamed in). ``top_up`` keeps ``AHEAD`` files ahead of the committed batches
    while ``feeding``."""

    def __init__(self, spark, op, root: Path, frames: list[pd.DataFrame]) -> None:
        self.spark, self.op, self.root, self.frames = spark, op, root, frames
        self.src = root / "in"
        self.src.mkdir(parents=True)
        self.base = time.time() - 10_000
        self.written = 0
        self.feeding = True
        self.got: dict[int, pd.DataFrame] = {}
        self.sink_calls: dict[int, int] = {}
        self.query = None

    def sink(self, df, b: int) -> None:  # idempotent by batch id
        self.got[b] = df.toPandas()
        self.sink_calls[b] = self.sink_calls.get(b, 0) + 1

    def write_next(self) -> None:
        i = self.written
        assert i < len(self.frames), f"{self.op.operator_id}: out of input ({i} files): the plans took too long"
        tmp = self.root / f".part-{i:03d}.tmp"
        self.frames[i].to_parquet(tmp, index=False)
        os.utime(tmp, (self.base + i, self.base + i))
        os.replace(tmp, self.src / f"part-{i:03d}.parquet")
        self.written += 1

    def committed(self) -> int:
        """Batches committed so far (0..n-1)."""
        return len({r.batch for r in self.op.reports})

    def top_up(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise AssertionError(f"{self.op.operator_id}: the query failed: {self.query.exception()}")
        while self.feeding and self.written < self.committed() + AHEAD:
            self.write_next()

    def start(self) -> "FedStream":
        self.top_up()
        self.query = (self.spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1)
                      .parquet(str(self.src)).writeStream.foreachBatch(self.op.for_each_batch(self.sink))
                      .option("checkpointLocation", str(self.root / "ck")).trigger(processingTime="200 milliseconds")
                      .queryName(self.op.operator_id).start())
        return self

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()

    def finish(self, streams: list["FedStream"]) -> None:
        """Stops feeding, waits until every file written is committed, stops the query."""
        self.feeding = False
        wait_until(lambda: self.committed() >= self.written, streams, f"{self.op.operator_id} to drain its input")
        self.stop()


def wait_until(cond, streams: list[FedStream], what: str, timeout: float = 120.0) -> None:
    """Polls ``cond`` while feeding ``streams``; a query that failed fails the test at once."""
    deadline = time.monotonic() + timeout
    while True:
        for s in streams:
            s.top_up()
        if cond():
            return
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)


def open_plans(cc, op_id: str) -> list[dict]:
    (o,) = [o for o in cc.status()["operators"] if o["operator_id"] == op_id]
    return o["plans"]


def plan_gone(cc, op_id: str, plan_id: int):
    return lambda: all(p["id"] != plan_id for p in open_plans(cc, op_id))


def coordinator_rows(cluster, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
    """Rows of the coordinator's own database, read only (plans, events)."""
    db = sqlite3.connect(f"file:{cluster['root'] / 'coordinator' / 'coordinator.db'}?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def assert_plans_ran_between_batches(cluster, op, plan_ids: list[int]) -> dict[int, list[int]]:
    """Each plan is done, and each of its steps ran at a barrier of the running query: at
    the begin of some batch k >= 1 (after batch k-1 had committed, before k did), batch k-1
    ran at an older epoch and batch k at the step's (or a newer one). Returns, per plan,
    the batches its steps ran before."""
    reports = {r.batch: r for r in op.reports}  # the last report of each batch
    steps = coordinator_rows(cluster, "SELECT at, detail FROM events WHERE kind='handover_step' ORDER BY id")
    out: dict[int, list[int]] = {}
    for pid in plan_ids:
        (p,) = coordinator_rows(cluster, "SELECT * FROM plans WHERE id=?", (pid,))
        assert (p["operator_id"], p["state"]) == (op.operator_id, "done"), dict(p)
        mine = [(s["at"], json.loads(s["detail"])) for s in steps if json.loads(s["detail"])["plan"] == pid]
        assert [d["step"] for _, d in mine] == list(range(1, len(json.loads(p["steps"])) + 1)), (pid, mine)
        out[pid] = []
        for at, d in mine:
            k = next((b for b in sorted(reports) if reports[b].started <= at <= reports[b].ended), None)
            assert k is not None and k >= 1 and k - 1 in reports, \
                f"plan {pid} step {d['step']} at {at} ran in no batch of the query: " \
                f"{[(b, r.started, r.ended) for b, r in sorted(reports.items())]}"
            assert k - 1 >= p["after_batch"], (pid, d, k, p["after_batch"])
            assert reports[k - 1].ended <= at, (pid, d, k)  # the barrier after batch k-1
            assert reports[k - 1].epoch < d["epoch"] <= reports[k].epoch, (pid, d, k, reports[k - 1].epoch,
                                                                           reports[k].epoch)
            out[pid].append(k)
        assert abs(p["updated_at"] - mine[-1][0]) < 1.0  # done with its last step
    return out


def assert_one_owner(cluster, op_id: str) -> dict:
    """On the workers' own listings: every active instance of ``op_id`` is hosted exactly
    once, by its primary, at the operator's epoch; nothing else of it is hosted; each vnode
    has exactly one owner, the coordinator's table. Returns the placement."""
    with connect_coordinator(cluster["coordinator"], secret=cluster["secret"]) as cc:
        pl = cc.placement(op_id)
    hosted: dict[int, list[tuple[str, int, list[int]]]] = {}
    for w in cluster["workers"]:
        with rhino.connect(str(w.unix_socket), secret=cluster["secret"]) as c:
            for h in c.instances():
                if h["operator_id"] == op_id:
                    hosted.setdefault(int(h["instance"]), []).append((w.id, int(h["epoch"]), sorted(h["vnodes"])))
    assert set(hosted) == set(pl.instances), f"{op_id}: hosted {hosted}, placement {pl.instances}"
    owners: list[list[int]] = [[] for _ in pl.assignment]
    for i, hs in hosted.items():
        assert len(hs) == 1, f"{op_id}/{i} hosted by {hs}"
        worker, epoch, vnodes = hs[0]
        assert worker == pl.instances[i].primary and epoch == pl.epoch, (op_id, i, hs, pl.epoch)
        for v in vnodes:
            owners[v].append(i)
    assert all(len(o) == 1 for o in owners), f"{op_id}: owners per vnode {owners}"
    assert tuple(o[0] for o in owners) == pl.assignment
    return pl


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("live"), hosts=HOSTS) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-live-reconfigure")
    yield s
    s.stop()


@pytest.fixture
def cc(cluster):
    with connect_coordinator(cluster["coordinator"], secret=cluster["secret"]) as c:
        yield c


def _op(cluster, name: str, *, replicas: int):
    return rhino.spark.transform_with_state(RunningCount(), key="k", output_schema="k long, n long, s long",
                                            operator_id=name, coordinator=cluster["coordinator"],
                                            secret_file=str(cluster["secret_file"]), parallelism=3,
                                            replicas=replicas, num_vnodes=V, locality=False)


def test_rescale_handover_rescale_rebalance_while_the_query_runs(cluster, spark, cc, tmp_path):
    op = _op(cluster, "live", replicas=2)
    s = FedStream(spark, op, tmp_path, make_frames(40, seed=1))
    streams = [s]
    env = {"RHINO_COORDINATOR": cluster["coordinator"], "RHINO_SECRET_FILE": str(cluster["secret_file"])}
    plans: list[int] = []
    t0 = time.monotonic()
    try:
        s.start()
        wait_until(lambda: s.committed() >= 2, streams, "the first batches")

        def run(ask, what: str) -> dict:
            """Asks for a plan while the query runs; waits until it is gone from status."""
            assert s.query.isActive
            p = ask()
            assert p["steps"] >= 1, (what, p)
            plans.append(p["plan"])
            wait_until(plan_gone(cc, op.operator_id, p["plan"]), streams, what)
            return p

        p = run(lambda: cc.rescale(op.operator_id, 4, strategy="fluid"), "rescale 3->4 (fluid)")
        assert p["steps"] == 3 == p["moves"]  # one vnode per step
        assert len(cc.placement(op.operator_id).instances) == 4
        asg = cc.placement(op.operator_id).assignment
        two = [v for v, i in enumerate(asg) if i == 0][:2]
        p = run(lambda: cc.handover(op.operator_id, two, 3, strategy="batched"), "a handover (batched)")
        assert p["steps"] == 2  # one vnode into the target per step
        assert [cc.placement(op.operator_id).assignment[v] for v in two] == [3, 3]

        def cli_rescale() -> dict:
            r = rhino_cli("rescale", op.operator_id, "2", "--strategy", "all-at-once", "--json", env=env)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        p = run(cli_rescale, "rescale 4->2 (all-at-once, rhino rescale)")
        assert p["steps"] == 1
        assert cc.placement(op.operator_id).instance_order() == [0, 1]
        before = cc.placement(op.operator_id).assignment

        def rebalance() -> dict:
            out = cc.rebalance(op.operator_id, strategy="batched")
            assert len(out["plans"]) == 1 and not out["skipped"], out  # the skewed load: something to move
            return out["plans"][0]

        run(rebalance, "a load rebalance")
        assert cc.placement(op.operator_id).assignment != before
        last_plan_batch = s.committed()
        wait_until(lambda: s.committed() >= last_plan_batch + 2, streams, "two batches after the last plan")
        s.finish(streams)
    finally:
        s.stop()
    took = time.monotonic() - t0

    frames = s.frames[:s.written]
    assert_outputs_equal_oracle(s.got, frames)
    pl = assert_one_owner(cluster, op.operator_id)
    assert pl.instance_order() == [0, 1] and pl.last_batch == len(frames) - 1
    assert sorted(t["instance"] for t in op.reports[-1].tasks) == [0, 1]  # the last batch ran at parallelism 2
    ran = assert_plans_ran_between_batches(cluster, op, plans)
    firsts = [ks[0] for ks in ran.values()]
    assert firsts == sorted(firsts) and max(max(ks) for ks in ran.values()) < len(frames) - 1
    # the parallelism each batch ran at followed the plans: 3, then 4, then 2
    widths = [len(r.tasks) for r in sorted(op.reports, key=lambda r: r.batch)]
    assert widths[0] == 3 and 4 in widths and widths[-1] == 2, widths
    print(f"\nlive reconfiguration: {len(frames)} batches, {len(plans)} plans, steps before batches {ran}, "
          f"{took:.1f} s; reruns {[r.batch for r in op.reports if r.attempts > 1]}")
    op.close()


def test_two_queries_each_rescaled_while_the_other_has_a_plan_open(cluster, spark, cc, tmp_path):
    a = FedStream(spark, _op(cluster, "live-a", replicas=1), tmp_path / "a", make_frames(40, seed=2))
    b = FedStream(spark, _op(cluster, "live-b", replicas=1), tmp_path / "b", make_frames(40, seed=3))
    A, B = a.op.operator_id, b.op.operator_id
    streams = [a, b]
    t0 = time.monotonic()
    try:
        a.start()
        b.start()
        wait_until(lambda: a.committed() >= 2 and b.committed() >= 2, streams, "both queries' first batches")

        # A's input stops: its query runs on, idle, so its plan waits for a barrier.
        a.feeding = False
        wait_until(lambda: a.committed() >= a.written, streams, f"{A} to drain its input")
        pa = cc.rescale(A, 2, strategy="all-at-once")
        a_batches = a.committed()
        pb = cc.rescale(B, 4, strategy="batched")  # B is rescaled meanwhile, its plan runs at B's barriers
        assert pb["steps"] == 3
        wait_until(plan_gone(cc, B, pb["plan"]), streams, f"{B}'s rescale 3->4")
        assert len(cc.placement(B).instances) == 4
        (row,) = open_plans(cc, A)
        assert (row["id"], row["state"], row["steps_done"]) == (pa["plan"], "scheduled", 0)
        assert a.committed() == a_batches and len(cc.placement(A).instances) == 3

        # The reverse: B's next plan is scheduled two batches ahead, B runs them and stops at
        # that barrier, its plan open; A runs again, and its plan and a second one complete.
        after = cc.placement(B).last_batch + 2
        pb2 = cc.rescale(B, 2, strategy="all-at-once", after_batch=after)
        b.feeding = False  # B's input: through batch `after`, then none
        while b.written < after + 1:
            b.write_next()
        wait_until(lambda: b.committed() >= after + 1, streams, f"{B} to reach batch {after}")
        a.feeding = True
        wait_until(plan_gone(cc, A, pa["plan"]), streams, f"{A}'s rescale 3->2")
        assert cc.placement(A).instance_order() == [0, 1]
        pa2 = cc.rescale(A, 3, strategy="fluid")  # a new instance number: 3 (2 was retired)
        wait_until(plan_gone(cc, A, pa2["plan"]), streams, f"{A}'s rescale 2->3")
        assert cc.placement(A).instance_order() == [0, 1, 3]
        (row,) = open_plans(cc, B)
        assert (row["id"], row["state"], row["steps_done"], row["after_batch"]) == (pb2["plan"], "scheduled", 0, after)
        assert len(cc.placement(B).instances) == 4

        b.feeding = True
        wait_until(plan_gone(cc, B, pb2["plan"]), streams, f"{B}'s rescale 4->2")
        n = (a.committed(), b.committed())
        wait_until(lambda: a.committed() >= n[0] + 1 and b.committed() >= n[1] + 1, streams, "a batch more each")
        a.finish(streams)
        b.finish(streams)
    finally:
        a.stop()
        b.stop()
    took = time.monotonic() - t0

    ran = {}
    for s, plans, width in ((a, [pa["plan"], pa2["plan"]], [0, 1, 3]), (b, [pb["plan"], pb2["plan"]], [0, 1])):
        assert_outputs_equal_oracle(s.got, s.frames[:s.written])
        pl = assert_one_owner(cluster, s.op.operator_id)
        assert pl.instance_order() == width and pl.last_batch == s.written - 1
        ran.update(assert_plans_ran_between_batches(cluster, s.op, plans))
        s.op.close()
    assert ran[pa["plan"]] == [a_batches]  # at A's first barrier once its input came back
    assert ran[pb2["plan"]] == [after + 1]  # at the barrier it was scheduled for, not before
    # A ran at 3 instances, then 2, then 0, 1 and 3 (a new number: partition p runs sorted(instances)[p])
    a_widths = [sorted(t["instance"] for t in r.tasks) for r in sorted(a.op.reports, key=lambda r: r.batch)]
    assert a_widths[0] == [0, 1, 2] and [0, 1] in a_widths and a_widths[-1] == [0, 1, 3], a_widths
    print(f"\ntwo queries: {a.written} and {b.written} batches, steps before batches {ran}, {took:.1f} s")
