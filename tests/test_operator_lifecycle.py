"""An operator's lifecycle (issue 45 item 3) against real processes: a ``rhino
coordinator`` and three ``rhino worker`` processes on 127.0.0.190-192, shared by the
module's tests.

- Namespaces: two jobs use the same operator name in two namespaces, and each one's state
  is its own (read back through sessions, against a dict model of what each job wrote).
- ``rhino drop`` (the command, as a user runs it): refused while the operator runs (a
  batch in flight, a recent call of its driver, a session open on a worker), then every
  trace is gone: checked on disk (``os.walk`` of every worker's directory, the pooled
  files against the manifests that remain, read as files) and in the coordinator's SQLite
  (``sqlite3``, every text value of every table); the other namespace's operator is
  untouched, and the name can be created again from nothing.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino.coordinator.client import connect_coordinator
from rhino.coordinator.naming import operator_id, split_operator_id
from rhino_testing.harness.engine import MicroBatchEngine
from rhino_testing.harness.workers import SECRET, CoordinatorProcess, WorkerProcess, write_secret

FIRST_HOST = 190  # 127.0.0.190-192 (tests/test_test_hosts.py)
V = 16
A = operator_id("counts", "jobA")
B = operator_id("counts", "jobB")


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lifecycle")
    sf = write_secret(tmp, SECRET)
    co = CoordinatorProcess(tmp, secret_file=sf, heartbeat_timeout=3.0).start()
    ws = [WorkerProcess(tmp, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                        extra_args=["--coordinator", co.address]).start()
          for n in range(FIRST_HOST, FIRST_HOST + 3)]
    cc = connect_coordinator(co.address, secret=SECRET)
    deadline = time.monotonic() + 30
    while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 3:
        assert time.monotonic() < deadline, "workers did not register"
        time.sleep(0.1)
    yield {"tmp": tmp, "sf": sf, "co": co, "ws": ws, "cc": cc,
           "env": {"RHINO_COORDINATOR": co.address, "RHINO_SECRET_FILE": str(sf)}}
    cc.close()
    for w in ws:
        if w.alive():
            w.stop()
    co.stop()


def rhino_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


class Job:
    """Batches of random puts and deletes on one operator, and the dict they should leave."""

    def __init__(self, cc, op: str, seed: int) -> None:
        self.cc, self.op = cc, op
        self.engine = MicroBatchEngine(cc, op, secret=SECRET, retry_sleep=0.05)
        self.rng = np.random.default_rng(seed)
        self.model: dict[int, bytes] = {}
        self.batch = 0

    def run(self, n: int = 1) -> None:
        for _ in range(n):
            puts = {int(k): self.rng.bytes(12) for k in self.rng.choice(400, 60, replace=False)}
            dels = [int(k) for k in self.rng.choice(400, 6, replace=False) if int(k) not in puts]
            self.engine.run_batch(self.batch, puts, dels)
            self.model.update(puts)
            for k in dels:
                self.model.pop(k, None)
            self.batch += 1

    def state(self) -> dict[int, bytes]:
        """Every instance's committed state, read back through a session of the next batch."""
        pl = self.cc.placement(self.op)
        out: dict[int, bytes] = {}
        for i, info in pl.instances.items():
            with rhino.connect(info.address, secret=SECRET) as c:
                with c.session(self.op, i, batch=self.batch, epoch=pl.epoch) as s:
                    out.update({int.from_bytes(k, "little", signed=True): v for k, v in s.scan(page_size=500)})
                    s.abort()
        return out


def traces_on_disk(ws, op: str) -> list[str]:
    """Every path under any worker's directory with a component that is the operator's id."""
    found = []
    for w in ws:
        for root, dirs, files in os.walk(w.dir):
            for name in dirs + files:
                if name == op:
                    found.append(os.path.join(root, name))
    return found


def traces_in_metadata(db: Path, op: str) -> list[tuple[str, str]]:
    """(table, value) of every text value of the coordinator's SQLite that names the operator
    (as itself, as a JSON string, or as the key of a meta entry: ``kind:<op>``)."""
    found = []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for t in tables:
            for row in c.execute(f"SELECT * FROM {t}"):
                for v in row:
                    if isinstance(v, str) and (v == op or json.dumps(op) in v or v.endswith(":" + op)):
                        found.append((t, v))
    return found


def pooled_and_referenced(w) -> tuple[set[str], set[str]]:
    """The pool's files, and the identities the committed manifests on disk reference (each
    manifest is a JSON line, then its checksum trailer: docs/protocol.md §3)."""
    pool = set(os.listdir(w.dir / "pool")) if (w.dir / "pool").is_dir() else set()
    refs: set[str] = set()
    for root, _, files in os.walk(w.dir / "checkpoints"):
        for f in files:
            if f.endswith(".manifest"):
                doc = json.loads(Path(root, f).read_text().splitlines()[0])
                refs |= {e["identity"] for e in doc["files"]}
    return pool, refs


def test_namespaced_ids_are_plain_directory_names_and_split_back_one_way():
    assert operator_id("counts") == "counts" and operator_id("counts", "jobA") == "jobA..counts"
    assert split_operator_id("jobA..counts") == ("jobA", "counts") and split_operator_id("a.b") == (None, "a.b")
    for bad_ns in ("a.b", "", "x" * 65, "a/b", "../x"):
        with pytest.raises(rhino.InvalidArgumentError, match="namespace"):
            operator_id("counts", bad_ns)
    for bad in ("", ".x", "a..b", "a/b", "é"):
        with pytest.raises(rhino.InvalidArgumentError, match="operator name"):
            operator_id(bad, "jobA")
    with pytest.raises(rhino.InvalidArgumentError, match="over 128"):
        operator_id("n" * 100, "s" * 40)
    assert len(operator_id("n" * 62, "s" * 64)) == 128


def test_two_jobs_use_one_name_in_two_namespaces_without_interference(running):
    cc, ws = running["cc"], running["ws"]
    cc.create_operator(A, parallelism=2, num_vnodes=V, replicas=1)
    cc.create_operator(B, parallelism=3, num_vnodes=V, replicas=2)  # another shape: nothing is shared
    a, b = Job(cc, A, seed=1), Job(cc, B, seed=2)
    a.run(2)
    b.run(3)
    a.run(1)
    assert a.state() == a.model and b.state() == b.model and a.model != b.model
    ops = {o["operator_id"]: o for o in cc.status()["operators"]}
    assert (ops[A]["namespace"], ops[A]["name"], ops[A]["last_batch"]) == ("jobA", "counts", 2)
    assert (ops[B]["namespace"], ops[B]["name"], ops[B]["last_batch"]) == ("jobB", "counts", 2)
    # each has its own directories on the workers, named by its id
    assert traces_on_disk(ws, A) and traces_on_disk(ws, B)
    running["jobs"] = (a, b)


def test_drop_is_refused_while_the_operator_runs(running):
    cc, env = running["cc"], running["env"]
    a, b = running["jobs"]
    # just used by its driver: refused with the default idle time (60 s)
    r = rhino_cli("drop", "counts", "--namespace", "jobA", env=env)
    assert r.returncode == 1 and "OperatorRunningError" in r.stderr and "called the coordinator" in r.stderr, r
    # a batch in flight (begun, not committed) is refused whatever the idle time
    cc.begin_batch(A, a.batch)
    with pytest.raises(rhino.OperatorRunningError, match=f"batch {a.batch} is in flight"):
        cc.drop_operator(A, idle_s=0)
    a.run(1)  # the batch runs to its commit
    # a session open on a primary (a task the coordinator did not see begin): refused
    pl = cc.placement(A)
    info = pl.instances[1]
    with rhino.connect(info.address, secret=SECRET) as c:
        s = c.session(A, 1, batch=a.batch, epoch=pl.epoch)
        with pytest.raises(rhino.OperatorRunningError, match=f"instance 1 has an open session on worker "
                                                              f"{info.primary}"):
            cc.drop_operator(A, idle_s=0)
        s.abort()
    # and a worker itself refuses to drop an instance with an open session
    with rhino.connect(info.address, secret=SECRET) as c:
        s = c.session(A, 1, batch=a.batch, epoch=pl.epoch)
        with pytest.raises(rhino.SessionBusyError, match="open session"):
            c.drop(A, 1, epoch=pl.epoch)
        s.abort()
    assert A in {o["operator_id"] for o in cc.status()["operators"]}
    assert a.state() == a.model  # nothing of it went


def test_drop_removes_every_trace_and_leaves_the_other_namespace_alone(running):
    cc, ws, env = running["cc"], running["ws"], running["env"]
    a, b = running["jobs"]
    assert traces_on_disk(ws, A) and traces_in_metadata(running["co"].dir / "coordinator.db", A)
    r = rhino_cli("drop", "counts", "--namespace", "jobA", "--idle-for", "0", "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["operator_id"] == A and sorted(out["workers"]) == sorted(w.id for w in ws), out
    assert out["not_reached"] == []
    assert traces_on_disk(ws, A) == []
    assert traces_in_metadata(running["co"].dir / "coordinator.db", A) == []
    checked = 0
    for w in ws:
        gcs = [d["gc"] for d in out["workers"][w.id].values()]
        if all(isinstance(g, dict) for g in gcs):  # the store was not busy: no file of A is left in the pool
            pool, refs = pooled_and_referenced(w)
            assert pool <= refs, (w.id, sorted(pool - refs)[:5])
            checked += 1
    assert checked >= 2, out  # a retention pass may hold one store's lock at that moment, hardly two
    assert A not in {o["operator_id"] for o in cc.status()["operators"]}
    with pytest.raises(rhino.UnknownInstanceError):
        cc.placement(A)
    # the other namespace's operator of the same name: its state and its batches go on
    assert b.state() == b.model
    b.run(1)
    assert b.state() == b.model
    # dropping what is not there is UnknownInstance, with a message
    r = rhino_cli("drop", "counts", "--namespace", "jobA", "--idle-for", "0", env=env)
    assert r.returncode == 1 and "UnknownInstanceError" in r.stderr, r


def test_a_dropped_name_starts_over_from_nothing(running):
    """Created again, the operator has none of its old state, and its epochs start above
    the dropped one's (workers may still remember those in memory)."""
    cc = running["cc"]
    cc.create_operator(A, parallelism=2, num_vnodes=V, replicas=2)
    pl = cc.placement(A)
    assert pl.last_batch is None and pl.epoch > 1
    again = Job(cc, A, seed=9)
    assert again.state() == {}
    again.run(2)
    assert again.state() == again.model
