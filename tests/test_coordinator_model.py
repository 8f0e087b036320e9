"""Model-based test of the coordinator (docs/design.md §3-§4) against real
processes: five ``rhino worker`` processes on 127.0.0.2..6 and one
``rhino coordinator`` on 127.0.0.1, the workers registered with it and sending
heartbeats (a silent worker is declared dead after 1 s).

A micro-batch engine (:mod:`rhino_testing.harness.engine`) drives them as Spark's
operator will: before every batch it asks the coordinator for the routing
table (the barrier where handover steps run), routes each key by its vnode,
commits one session per instance on its primary in barrier mode, and reports
the batch done. Hypothesis draws interleavings of:

- batches of writes and deletes;
- SIGKILL of a worker (the coordinator detects it by heartbeat, fails its
  primaries over to chain members by hard-link takeover and repairs the
  chains) and its restart;
- SIGKILL and restart of the coordinator itself;
- handovers with each migration strategy (all-at-once, fluid, batched), to an
  existing or a new instance;
- rescaling up and down; rebalancing (replicas and load).

After every step:
1. **Committed state equals the model**, twice: through sessions on every
   instance (what a task sees), and from the stores with an independent reader:
   each instance's last complete checkpoint, restored out of a *chain member's*
   store and read with rocksdict, restricted to the vnodes the instance owned
   while that batch ran (from the routing history in the coordinator's SQLite,
   read with ``sqlite3``), united over instances.
2. **In every epoch each vnode has exactly one owner**: every epoch's table in
   the history is total over live instances; and at the current epoch each
   instance is hosted at that epoch by exactly one worker, its primary, whose
   vnodes are exactly the table's.
3. **Every instance's last complete checkpoint is held by r live workers**
   (its chain members' own stores), once repair has finished.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import rhino
from rhino.coordinator.client import connect_coordinator
from rhino_testing.harness.workers import SECRET, CoordinatorProcess, WorkerProcess, read_rocksdb, write_secret
from rhino_testing.harness.engine import MicroBatchEngine

V = 16
R = 2
N_KEYS = 600
EXAMPLES = int(os.environ.get("RHINO_COORD_EXAMPLES", "6"))
STEPS = int(os.environ.get("RHINO_COORD_STEPS", "12"))


TRACE = os.environ.get("RHINO_COORD_TRACE")


def trace(*a) -> None:
    if TRACE:
        print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


def wait_for(cond, what: str, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except rhino.RhinoError as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


class CoordinatorMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        trace("example starts")
        self.root = Path(tempfile.mkdtemp(prefix="rhino-coord-model-"))
        trace("dir", self.root)
        self.secret_file = write_secret(self.root, SECRET)
        self.coord = CoordinatorProcess(self.root, secret_file=self.secret_file, heartbeat_timeout=1.0).start()
        self.workers = [WorkerProcess(self.root, f"w{n}", f"127.0.0.{n}", secret_file=self.secret_file, metrics=False,
                                      extra_args=["--coordinator", self.coord.address,
                                                  "--coordinator-heartbeat", "0.2"]).start()
                        for n in range(2, 7)]
        self.client = connect_coordinator(self.coord.address, secret=SECRET, request_timeout=120.0)
        wait_for(lambda: sum(w["state"] == "alive" for w in self.client.status()["workers"]) == 5, "registrations")
        self.op = "model"
        self.client.create_operator(self.op, parallelism=3, num_vnodes=V, replicas=R)
        self.engine = MicroBatchEngine(self.client, self.op, secret=SECRET)
        self.batch = 0
        self.model: dict[bytes, bytes] = {}
        self.epoch_of_batch: dict[int, int] = {}
        self.rng = np.random.default_rng(0)

    def teardown(self) -> None:
        if not hasattr(self, "root"):
            return
        self.engine.close()
        self.client.close()
        for w in self.workers:
            w.stop()
        self.coord.stop()
        if not os.environ.get("RHINO_COORD_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)

    # ---- helpers -------------------------------------------------------------------------
    def run_batch(self, puts: dict[int, bytes], dels: list[int]) -> None:
        r = self.engine.run_batch(self.batch, puts, dels)
        self.epoch_of_batch[self.batch] = r.epoch
        self.model.update({kb(k): v for k, v in puts.items()})
        for k in dels:
            self.model.pop(kb(k), None)
        self.batch += 1

    def random_batch(self) -> None:
        keys = self.rng.choice(N_KEYS, size=60, replace=False)
        dels = self.rng.choice(N_KEYS, size=6, replace=False)
        self.run_batch({int(k): self.rng.bytes(16) for k in keys}, [int(k) for k in dels if k not in keys])

    def run_until_plans_done(self, limit: int = 30) -> None:
        for _ in range(limit):
            self.random_batch()
            if not self.client.status()["plans_in_flight"]:
                return
        raise AssertionError("plans still in flight after 30 batches")

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def repaired(self) -> bool:
        s = self.client.status()
        dead = {w["id"] for w in s["workers"] if w["state"] == "dead"}
        alive_ids = {w.id for w in self.alive()}
        registered = {w["id"] for w in s["workers"] if w["state"] == "alive"}
        if registered != alive_ids:
            return False
        for o in s["operators"]:
            for i in o["instances"]:
                members = [i["primary"], *i["chain"]]
                if any(m in dead or m not in alive_ids for m in members) or len(i["chain"]) < o["replicas"]:
                    return False
        return True

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.coord.dir / 'coordinator.db'}?mode=ro", uri=True, timeout=10)

    # ---- rules ----------------------------------------------------------------------------
    @rule(n=st.integers(10, 80), dels=st.integers(0, 10))
    def write_batch(self, n: int, dels: int) -> None:
        trace('write_batch', n, dels)
        keys = self.rng.choice(N_KEYS, size=n, replace=False)
        d = self.rng.choice(N_KEYS, size=dels, replace=False)
        self.run_batch({int(k): self.rng.bytes(int(self.rng.integers(1, 40))) for k in keys},
                       [int(k) for k in d if k not in keys])

    @precondition(lambda self: len(self.alive()) == 5)
    @rule(which=st.integers(0, 4), mid_batch=st.booleans())
    def kill_worker(self, which: int, mid_batch: bool) -> None:
        trace('kill_worker', which, mid_batch)
        w = self.workers[which]
        w.kill()
        if mid_batch:
            # The engine finds the primary gone (or a stale epoch), reports it,
            # and runs the batch again after the failover.
            self.random_batch()
        wait_for(self.repaired, f"failover and chain repair after {w.id} died")

    @precondition(lambda self: len(self.alive()) < 5)
    @rule()
    def restart_worker(self) -> None:
        trace('restart_worker', '')
        for w in self.workers:
            if not w.alive():
                w.start()
        wait_for(self.repaired, "the restarted worker to register")
        self.random_batch()

    @rule(mid_batch=st.booleans())
    def restart_coordinator(self, mid_batch: bool) -> None:
        trace('restart_coordinator', mid_batch)
        self.coord.kill()
        if mid_batch:
            time.sleep(0.3)
        self.coord.start()
        wait_for(lambda: self.client.status() is not None, "the coordinator to answer")
        wait_for(self.repaired, "the workers to register again")

    @rule(strategy=st.sampled_from(["all-at-once", "fluid", "batched"]), k=st.integers(1, 4),
          new_instance=st.booleans(), seed=st.integers(0, 1000))
    def handover(self, strategy: str, k: int, new_instance: bool, seed: int) -> None:
        trace('handover', strategy, k, new_instance, seed)
        pl = self.client.placement(self.op)
        active = pl.instance_order()
        if new_instance:
            to = max(active) + 1 + int(self._max_instance_ever())
        else:
            to = active[seed % len(active)]
        movable = [v for v, i in enumerate(pl.assignment) if i != to]
        if len(active) == 1 and not new_instance:
            return
        rng = np.random.default_rng(seed)
        vnodes = sorted(int(v) for v in rng.choice(movable, size=min(k, len(movable)), replace=False))
        # Never empty an instance by accident: that is rescaling's job.
        counts = {i: pl.assignment.count(i) for i in active}
        for v in list(vnodes):
            o = pl.assignment[v]
            if counts[o] <= 1:
                vnodes.remove(v)
            else:
                counts[o] -= 1
        if not vnodes:
            return
        self.client.handover(self.op, vnodes, to, strategy=strategy)
        self.run_until_plans_done()
        pl = self.client.placement(self.op)
        assert all(pl.assignment[v] == to for v in vnodes)

    def _max_instance_ever(self) -> int:
        with self.db() as c:
            return c.execute("SELECT MAX(instance) FROM instances WHERE operator_id=?", (self.op,)).fetchone()[0] or 0

    @rule(up=st.booleans(), strategy=st.sampled_from(["all-at-once", "fluid", "batched"]))
    def rescale(self, up: bool, strategy: str) -> None:
        trace('rescale', up, strategy)
        p = len(self.client.placement(self.op).instances)
        target = min(p + 1, 5) if up else max(p - 1, 1)
        if target == p:
            return
        self.client.rescale(self.op, target, strategy=strategy)
        self.run_until_plans_done()
        assert len(self.client.placement(self.op).instances) == target

    @rule()
    def rebalance(self) -> None:
        trace('rebalance', '')
        self.client.rebalance(self.op, strategy="batched")
        self.run_until_plans_done()
        wait_for(self.repaired, "replica rebalance")

    # ---- invariants -------------------------------------------------------------------------
    @invariant()
    def state_equals_model(self) -> None:
        if self.batch == 0:
            return
        pl = self.client.placement(self.op)
        assert pl.last_batch == self.batch - 1
        part = rhino.Partitioner(num_vnodes=V)
        seen: dict[bytes, bytes] = {}
        for i, info in pl.instances.items():
            with rhino.connect(info.address, secret=SECRET) as c:
                with c.session(self.op, i, batch=self.batch, epoch=pl.epoch) as s:
                    got = dict(s.scan(page_size=400))
                    s.abort()
            if got:
                keys = np.array([int.from_bytes(k, "little", signed=True) for k in got], dtype=np.int64)
                owners = np.asarray(pl.assignment)[part.vnodes(keys)]
                assert (owners == i).all(), f"instance {i} serves keys of vnodes it does not own"
            assert not (seen.keys() & got.keys())
            seen.update(got)
        assert seen == self.model

    @invariant()
    def checkpoints_equal_model(self) -> None:
        """The last complete checkpoint of every instance, from a chain member's
        store, read with rocksdict, restricted to the vnodes it owned during that batch."""
        if self.batch == 0:
            return
        b = self.batch - 1
        with self.db() as c:
            row = c.execute("SELECT assignment FROM routing_history WHERE operator_id=? AND epoch=?",
                            (self.op, self.epoch_of_batch[b])).fetchone()
            table = json.loads(row[0])
            insts = c.execute("SELECT instance, chain FROM instances WHERE operator_id=? AND state='active'",
                              (self.op,)).fetchall()
        owners_at_b = {v: i for v, i in enumerate(table)}
        union: dict[bytes, bytes] = {}
        for i in sorted(set(table)):
            # The instance that ran batch b may have been retired since (scaled in):
            # find a store holding its checkpoint b among all workers.
            holders = [w for w in self.alive() if b in rhino.ReplicaStore(str(w.dir)).checkpoints(self.op, i)]
            chain = next((json.loads(ch) for ii, ch in insts if ii == i), [])
            holders.sort(key=lambda w: (w.id not in chain, w.id))
            assert holders, f"no live worker holds checkpoint {b} of instance {i}"
            target = Path(tempfile.mkdtemp(dir=self.root)) / "r"
            rhino.ReplicaStore(str(holders[0].dir)).restore(self.op, i, b, str(target)).close()
            for name, cf in read_rocksdb(target).items():
                if name.startswith("vnode-") and owners_at_b.get(int(name.split("-")[1])) == i:
                    union.update(cf)
            shutil.rmtree(target.parent, ignore_errors=True)
        assert union == self.model

    @invariant()
    def one_owner_per_vnode_per_epoch(self) -> None:
        with self.db() as c:
            hist = c.execute("SELECT epoch, assignment, primaries FROM routing_history WHERE operator_id=? "
                             "ORDER BY epoch", (self.op,)).fetchall()
            epoch = c.execute("SELECT epoch FROM operators WHERE operator_id=?", (self.op,)).fetchone()[0]
        assert [h[0] for h in hist] == sorted({h[0] for h in hist}) and hist[-1][0] == epoch
        for e, assignment, primaries in hist:
            table, prim = json.loads(assignment), json.loads(primaries)
            assert len(table) == V and all(str(i) in prim for i in table), f"epoch {e}: a vnode without a live owner"
        pl = self.client.placement(self.op)
        hosted_at_epoch: dict[int, list[str]] = {}
        for w in self.alive():
            with rhino.connect(w.unix_socket, secret=SECRET) as c:
                for h in c.instances():
                    if h["operator_id"] == self.op and h["epoch"] == pl.epoch:
                        hosted_at_epoch.setdefault(h["instance"], []).append(w.id)
                        assert sorted(h["vnodes"]) == [v for v, i in enumerate(pl.assignment)
                                                       if i == h["instance"]], f"{w.id} hosts other vnodes"
        for i, info in pl.instances.items():
            assert hosted_at_epoch.get(i) == [info.primary], \
                f"instance {i} at epoch {pl.epoch} is hosted by {hosted_at_epoch.get(i)}"
        assert set(hosted_at_epoch) == set(pl.instances)

    @invariant()
    def last_checkpoint_held_by_r_workers(self) -> None:
        if self.batch == 0:
            return
        pl = self.client.placement(self.op)
        alive = {w.id: w for w in self.alive()}
        for i, info in pl.instances.items():
            last = info.last_complete
            holders = [m for m in info.chain if m in alive and
                       last in rhino.ReplicaStore(str(alive[m].dir)).checkpoints(self.op, i)]
            assert len(holders) == R, f"instance {i}: checkpoint {last} held by {holders}, chain {list(info.chain)}"


CoordinatorMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
    suppress_health_check=list(HealthCheck), phases=[Phase.generate], derandomize=True)
TestCoordinatorModel = CoordinatorMachine.TestCase
