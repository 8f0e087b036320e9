"""Plans are per operator (docs/design.md §4, "Plans"): a plan of one operator
never blocks another's, an operator has one open plan at a time, and an open
plan, one left waiting by a stopped query say, is listed by ``rhino status``
and cancelled (``Coordinator.cancel_plan``, ``rhino cancel-plan``) between two
of its steps.

An in-process coordinator against real ``rhino worker`` processes, as in
tests/test_coordinator.py (its fixture and helpers); who owns each vnode is
checked on the workers themselves (what each hosts, at which epoch, with
which vnodes), not only in the coordinator's metadata.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
import test_coordinator as tc
from rhino.coordinator.handover_manager import HandoverManager
from rhino.coordinator.metadata import SCHEMA_VERSION, Metadata
from rhino.coordinator.server import CoordinatorServer
from rhino_testing.harness.engine import MicroBatchEngine
from rhino_testing.harness.workers import SECRET
from test_coordinator_cli import rhino_cli

cluster = tc.cluster  # four workers on 127.0.0.2-5
make = tc.make
A, B = "opa", "opb"
V = 16


class OpJob(tc.Job):
    """test_coordinator.Job (batches of puts and deletes, a dict model) for a named operator."""

    def __init__(self, cc, op: str, seed: int = 0) -> None:  # no super(): its engine would be tc.OP's
        self.op = op
        self.engine = MicroBatchEngine(cc, op, secret=SECRET, retry_sleep=0.05)
        self.cc = cc
        self.rng = np.random.default_rng(seed)
        self.model: dict[int, bytes] = {}
        self.batch = 0

    def state(self) -> dict[int, bytes]:
        pl = self.cc.placement(self.op)
        out: dict[int, bytes] = {}
        for i, info in pl.instances.items():
            with rhino.connect(info.address, secret=SECRET) as c:
                with c.session(self.op, i, batch=self.batch, epoch=pl.epoch) as s:
                    out.update({int.from_bytes(k, "little", signed=True): v for k, v in s.scan(page_size=500)})
                    s.abort()
        return out

    def run_until_ended(self, coord, plan_id: int, limit: int = 30) -> str:
        """Runs batches until plan ``plan_id`` is no longer open; its final state."""
        for _ in range(limit):
            if not coord.meta.plan(plan_id).open:
                break
            self.run(1)
        return coord.meta.plan(plan_id).state


def assert_one_owner(cc, ws, op: str) -> None:
    """On the workers: every active instance of ``op`` is hosted exactly once,
    by its primary, at the operator's epoch; nothing else of ``op`` is hosted;
    the vnodes they host are the coordinator's table, each vnode once."""
    pl = cc.placement(op)
    hosted: dict[int, list[tuple[str, int, list[int]]]] = {}
    for w in ws:
        if not w.alive():
            continue
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            for h in c.instances():
                if h["operator_id"] == op:
                    hosted.setdefault(int(h["instance"]), []).append((w.id, int(h["epoch"]), sorted(h["vnodes"])))
    assert set(hosted) == set(pl.instances), f"{op}: hosted {hosted}, placement {pl.instances}"
    owners: list[list[int]] = [[] for _ in pl.assignment]
    for i, hs in hosted.items():
        assert len(hs) == 1, f"{op}/{i} hosted by {hs}"
        worker, epoch, vnodes = hs[0]
        assert worker == pl.instances[i].primary and epoch == pl.epoch, (op, i, hs, pl.epoch)
        for v in vnodes:
            owners[v].append(i)
    assert all(len(o) == 1 for o in owners), f"{op}: owners per vnode {owners}"
    assert tuple(o[0] for o in owners) == pl.assignment


def plans_of(cc, op: str) -> list[dict]:
    (o,) = [o for o in cc.status()["operators"] if o["operator_id"] == op]
    return o["plans"]


def test_a_plan_of_one_operator_never_blocks_another(cluster) -> None:
    """A's plan stays open (A's batches stop); B is rescaled, handed over and
    rebalanced meanwhile, each plan completing at B's barriers; a second plan
    of A (or of B while B has one) is refused with the open plan's id, kind,
    state and how to cancel it. Then A runs again and its plan completes."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    for op in (A, B):
        cc.create_operator(op, parallelism=2, num_vnodes=V, replicas=2)
    ja, jb = OpJob(cc, A, seed=1), OpJob(cc, B, seed=2)
    ja.run(2)
    jb.run(2)
    pa = cc.rescale(A, 3, strategy="fluid")  # several steps; A's query stops here for a while
    assert pa["steps"] > 1

    pb = cc.rescale(B, 3, strategy="batched")  # refused before plans were per operator
    for ask in (lambda: cc.rescale(A, 4), lambda: cc.handover(A, [0], 1), lambda: cc.rebalance(A)):
        with pytest.raises(rhino.InvalidArgumentError,
                           match=rf"open plan, #{pa['plan']} rescale 2->3 \(fluid\), scheduled, step 0/{pa['steps']}"
                                 rf".*rhino cancel-plan {A} --plan {pa['plan']}"):
            ask()
    with pytest.raises(rhino.InvalidArgumentError, match=rf"#{pb['plan']} rescale 2->3 \(batched\)"):
        cc.handover(B, [0], 0)
    assert [p["id"] for p in plans_of(cc, A)] == [pa["plan"]] and [p["id"] for p in plans_of(cc, B)] == [pb["plan"]]

    assert jb.run_until_ended(coord, pb["plan"]) == "done"
    assert len(cc.placement(B).instances) == 3
    mine = [v for v, i in enumerate(cc.placement(B).assignment) if i == 0][:2]
    hb = cc.handover(B, mine, 2, strategy="fluid")
    assert jb.run_until_ended(coord, hb["plan"]) == "done"
    assert all(cc.placement(B).assignment[v] == 2 for v in mine)
    rb = cc.rebalance(B, strategy="batched")
    for p in rb["plans"]:
        assert jb.run_until_ended(coord, p["plan"]) == "done"
    every = cc.rebalance(None, replicas=False)  # over every operator: A's open plan skips A only
    assert [s["operator_id"] for s in every["skipped"]] == [A] and every["skipped"][0]["open_plan"] == pa["plan"]
    for p in every["plans"]:
        assert p["plan"] != pa["plan"]
        assert jb.run_until_ended(coord, p["plan"]) == "done"
    a_plan = coord.meta.plan(pa["plan"])
    assert (a_plan.state, a_plan.steps_done) == ("scheduled", 0)  # B's barriers ran none of A's steps
    assert_one_owner(cc, ws, B)

    for _ in range(pa["steps"] + 2):  # A's query runs again, B's alongside
        ja.run(1)
        jb.run(1)
    assert coord.meta.plan(pa["plan"]).state == "done" and not cc.status()["plans_in_flight"]
    for op, job in ((A, ja), (B, jb)):
        assert len(cc.placement(op).instances) == 3
        assert_one_owner(cc, ws, op)
        assert job.state() == job.model
        job.engine.close()
    coord.close()


def test_a_plan_left_open_is_listed_and_cancelled(cluster) -> None:
    """A's query stops with a rescale scheduled: ``status`` (and ``rhino
    status``) lists it under A with its age; the client cancels it, a new
    rescale is accepted, the CLI cancels that one, and a third one completes
    once A runs again."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    server = CoordinatorServer(coord, "127.0.0.1", 0, secret=SECRET)
    env = {"RHINO_COORDINATOR": server.address, "RHINO_SECRET_FILE": str(tmp / "secret")}
    try:
        for op in (A, B):
            cc.create_operator(op, parallelism=2, num_vnodes=V, replicas=2)
        ja = OpJob(cc, A, seed=3)
        ja.run(2)  # then A's query stops
        before = cc.placement(A)
        p1 = cc.rescale(A, 3, strategy="batched")
        time.sleep(0.2)
        (row,) = plans_of(cc, A)
        assert (row["id"], row["kind"], row["strategy"], row["state"], row["steps_done"], row["steps"],
                row["after_batch"]) == (p1["plan"], "rescale 2->3", "batched", "scheduled", 0, p1["steps"], 1)
        assert row["age_s"] >= 0.2 and plans_of(cc, B) == []
        text = rhino_cli("status", env=env)
        assert text.returncode == 0, text.stderr
        assert f"open plan #{p1['plan']} rescale 2->3 (batched) scheduled, step 0/{p1['steps']}, after batch 1, age" \
            in text.stdout and f"rhino cancel-plan {A} --plan {p1['plan']}" in text.stdout
        assert "open plan: none" in text.stdout  # B's

        out = cc.cancel_plan(A)  # its only open plan
        assert (out["plan"], out["state"], out["was"], out["steps_done"]) == (p1["plan"], "cancelled", "scheduled", 0)
        assert out["moves_dropped"] == p1["moves"]
        assert coord.meta.plan(p1["plan"]).state == "cancelled" and plans_of(cc, A) == []
        ev = [e for e in cc.status()["events"] if e["kind"] == "plan_cancelled"]
        assert [(e["plan"], e["operator"], e["was"]) for e in ev] == [(p1["plan"], A, "scheduled")]
        after = cc.placement(A)
        assert (after.assignment, after.epoch) == (before.assignment, before.epoch)

        p2 = cc.rescale(A, 3, strategy="fluid")  # accepted now
        r = rhino_cli("cancel-plan", A, "--plan", str(p2["plan"]), "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"] == "cancelled" and coord.meta.plan(p2["plan"]).state == "cancelled"
        text = rhino_cli("status", env=env)
        assert text.returncode == 0 and "open plan: none" in text.stdout and "PLANS IN FLIGHT: none" in text.stdout

        p3 = cc.rescale(A, 3, strategy="batched")
        assert ja.run_until_ended(coord, p3["plan"]) == "done"  # A's query runs again
        assert len(cc.placement(A).instances) == 3
        assert_one_owner(cc, ws, A)
        assert ja.state() == ja.model
        ja.engine.close()
    finally:
        server.close()
        coord.close()


def test_cancel_bad_input(cluster) -> None:
    """An unknown operator or plan, another operator's plan, a plan already
    ended, an operator with no open plan: clear errors (client and CLI), and
    the coordinator goes on serving."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    server = CoordinatorServer(coord, "127.0.0.1", 0, secret=SECRET)
    env = {"RHINO_COORDINATOR": server.address, "RHINO_SECRET_FILE": str(tmp / "secret")}
    try:
        for op in (A, B):
            cc.create_operator(op, parallelism=2, num_vnodes=V, replicas=2)
        ja = OpJob(cc, A, seed=4)
        ja.run(2)
        mine = [v for v, i in enumerate(cc.placement(A).assignment) if i == 0][:1]
        pa = cc.handover(A, mine, 1)["plan"]
        with pytest.raises(rhino.UnknownInstanceError, match="no operator 'nope'"):
            cc.cancel_plan("nope")
        with pytest.raises(rhino.InvalidArgumentError, match="no plan #9999"):
            cc.cancel_plan(A, 9999)
        with pytest.raises(rhino.InvalidArgumentError, match=f"plan #{pa} is a plan of operator {A}, not of {B}"):
            cc.cancel_plan(B, pa)
        with pytest.raises(rhino.InvalidArgumentError, match=f"operator {B} has no open plan"):
            cc.cancel_plan(B)
        for bad in ("1", True, 1.5, [pa], -1, 1 << 70):
            with pytest.raises(rhino.InvalidArgumentError, match="plan id"):
                cc.cancel_plan(A, bad)
        with pytest.raises(rhino.InvalidArgumentError, match="cancel_plan"):
            cc.call("cancel_plan", operator_id=A, plan_id=pa, force=True)
        assert coord.meta.plan(pa).open  # none of that touched it
        ja.run(1)  # the handover's only step: done
        with pytest.raises(rhino.InvalidArgumentError, match=f"plan #{pa} of {A} is done .*only an open plan"):
            cc.cancel_plan(A, pa)
        with pytest.raises(rhino.InvalidArgumentError, match=f"operator {A} has no open plan"):
            cc.cancel_plan(A)
        pc = cc.rescale(A, 3)["plan"]
        cc.cancel_plan(A, pc)
        with pytest.raises(rhino.InvalidArgumentError, match=f"plan #{pc} of {A} is cancelled"):
            cc.cancel_plan(A, pc)

        r = rhino_cli("cancel-plan", "nope", env=env)
        assert r.returncode == 1 and "UnknownInstanceError" in r.stderr and "Traceback" not in r.stderr
        r = rhino_cli("cancel-plan", A, "--plan", "9999", env=env)
        assert r.returncode == 1 and "InvalidArgumentError: no plan #9999" in r.stderr, r.stderr
        r = rhino_cli("cancel-plan", A, env=env)
        assert r.returncode == 1 and f"operator {A} has no open plan" in r.stderr
        r = rhino_cli("cancel-plan", A, "--plan", "-3", env=env)
        assert r.returncode == 2 and "expected an integer from 0" in r.stderr and "Traceback" not in r.stderr

        ja.run(2)  # the coordinator goes on
        assert_one_owner(cc, ws, A)
        assert ja.state() == ja.model
        ja.engine.close()
    finally:
        server.close()
        coord.close()


def test_cancel_a_running_plan_between_steps(cluster) -> None:
    """A fluid rescale (one vnode per step) cancelled after its first step:
    the step stays done (a third instance with one vnode), the others are
    dropped, no epoch changes; workers and coordinator agree, the operator
    keeps running batches, and a new plan finishes (here: undoes) the rescale."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(A, parallelism=2, num_vnodes=V, replicas=2)
    ja = OpJob(cc, A, seed=5)
    ja.run(2)
    p = cc.rescale(A, 3, strategy="fluid")
    assert p["steps"] >= 3
    ja.run(1)  # step 1 ran at the barrier before this batch
    row = coord.meta.plan(p["plan"])
    assert (row.state, row.steps_done) == ("running", 1)
    pl = cc.placement(A)
    assert len(pl.instances) == 3 and pl.assignment.count(2) == 1
    assert_one_owner(cc, ws, A)

    out = cc.cancel_plan(A, p["plan"])
    assert (out["was"], out["steps_done"], out["steps"]) == ("running", 1, p["steps"])
    assert out["moves_dropped"] == p["moves"] - 1 and out["epoch"] == pl.epoch
    assert coord.meta.plan(p["plan"]).state == "cancelled" and "after step 1/" in coord.meta.plan(p["plan"]).message
    ja.run(3)  # nothing more moves
    now = cc.placement(A)
    assert (now.assignment, now.epoch) == (pl.assignment, pl.epoch)
    assert_one_owner(cc, ws, A)
    assert ja.state() == ja.model

    p2 = cc.rescale(A, 2)
    assert ja.run_until_ended(coord, p2["plan"]) == "done"
    assert cc.placement(A).instance_order() == [0, 1]
    assert_one_owner(cc, ws, A)
    assert ja.state() == ja.model
    ja.engine.close()
    coord.close()


def test_cancel_undoes_a_step_left_half_done(cluster, monkeypatch) -> None:
    """A step the coordinator left without commit or abort (an unexpected
    exception after the workers applied it) is undone first, as a restarted
    coordinator would undo it, then the plan is cancelled."""
    tmp, ws = cluster
    coord, cc = make(tmp, ws)
    cc.create_operator(A, parallelism=2, num_vnodes=V, replicas=2)
    ja = OpJob(cc, A, seed=6)
    ja.run(2)
    before = cc.placement(A)
    real = HandoverManager._apply

    def fail_after_apply(self, *a, **kw):
        real(self, *a, **kw)  # the workers imported and dropped...
        raise RuntimeError("boom")  # ...and the coordinator failed before its commit

    monkeypatch.setattr(HandoverManager, "_apply", fail_after_apply)
    p = cc.handover(A, [v for v, i in enumerate(before.assignment) if i == 0][:2], 1)
    with pytest.raises(RuntimeError, match="boom"):
        cc.begin_batch(A, ja.batch)
    monkeypatch.setattr(HandoverManager, "_apply", real)
    assert coord.meta.handover_in_flight(A) is not None and coord.meta.plan(p["plan"]).state == "running"

    out = cc.cancel_plan(A)
    assert out["state"] == "cancelled" and "was undone first" in out["message"]
    assert coord.meta.handover_in_flight(A) is None and coord.meta.plan(p["plan"]).state == "cancelled"
    kinds = [e["kind"] for e in cc.status()["events"]]
    assert kinds.index("handover_aborted") < kinds.index("plan_cancelled")
    after = cc.placement(A)
    assert after.assignment == before.assignment and after.epoch > before.epoch
    ja.run(2)
    assert_one_owner(cc, ws, A)
    assert ja.state() == ja.model
    ja.engine.close()
    coord.close()


_V1_PLANS = """CREATE TABLE plans (
  id INTEGER PRIMARY KEY AUTOINCREMENT, operator_id TEXT NOT NULL, kind TEXT NOT NULL,
  strategy TEXT NOT NULL, steps TEXT NOT NULL, steps_done INTEGER NOT NULL DEFAULT 0,
  after_batch INTEGER, state TEXT NOT NULL
    CHECK (state IN ('scheduled', 'running', 'done', 'aborted')),
  created_at REAL NOT NULL, updated_at REAL NOT NULL, message TEXT NOT NULL DEFAULT '',
  bytes_moved INTEGER NOT NULL DEFAULT 0, seconds REAL NOT NULL DEFAULT 0,
  placement TEXT NOT NULL DEFAULT '{}')"""


def test_metadata_of_schema_version_1_is_migrated(tmp_path: Path) -> None:
    """A database of a coordinator of before 'cancelled' (schema 1, whose CHECK
    refuses it) is migrated on open: plans keep their ids and fields, may be
    cancelled, and new ids go on after the highest."""
    d = tmp_path / "coord"
    d.mkdir()
    db = sqlite3.connect(d / "coordinator.db")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute(_V1_PLANS)
    for pid, state in ((3, "done"), (7, "scheduled")):
        db.execute("INSERT INTO plans (id, operator_id, kind, strategy, steps, after_batch, state, created_at,"
                   " updated_at) VALUES (?, 'q', 'rescale 2->3', 'fluid', '[[[0,0,2]]]', 4, ?, 1.0, 2.0)",
                   (pid, state))
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("UPDATE plans SET state='cancelled' WHERE id=7")
    db.commit()
    db.close()

    meta = Metadata(d)
    assert meta.get_meta("schema_version") == str(SCHEMA_VERSION) == "2"
    assert [(p.id, p.state, p.steps, p.after_batch) for p in meta.plans()] == \
        [(3, "done", [[[0, 0, 2]]], 4), (7, "scheduled", [[[0, 0, 2]]], 4)]
    assert [p.id for p in meta.plans("q", open_only=True)] == [7] and meta.plans("other") == []
    with meta.tx() as c:
        meta.cancel_plan(c, 7, "test")
        new = meta.insert_plan(c, "q", "handover", "fluid", [[[1, 0, 1]]], 5, {})
    assert meta.plan(7).state == "cancelled" and not meta.plan(7).open and new == 8
    meta.close()
    meta = Metadata(d)  # a migrated database opens as it is
    assert [p.state for p in meta.plans()] == ["done", "cancelled", "scheduled"]
    meta.close()
