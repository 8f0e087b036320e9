"""Model-based test of the state service (docs/protocol.md §7) against real
``rhino worker`` processes.

Worker w2 (127.0.0.2) hosts instance op/0 and replicates every commit to w3
(127.0.0.3). Hypothesis draws interleavings of: sessions from a client on the
same host (the Unix socket) and from a client on another host (TCP, bound to
127.0.0.5); puts, deletes, gets and scans; commits (barrier and async) and
aborts; a client SIGKILLed mid-session; a SIGKILL and restart of w2; and the
re-execution of an already committed batch.

The model is a dict per committed batch. After every step the committed state
is read back through rocksdict from checkpoint `last` restored out of w2's own
store (an independent reader), and the rule `check_through_client` reads it
through a session as well. Nothing of an aborted or killed session may ever be
visible: the model never contains it, so any leak breaks the equality.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

NUM_VNODES = 16
KEYS = st.lists(st.integers(0, 47), min_size=1, max_size=12)
_ops = itertools.count()


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


class _Cluster:
    """Two worker processes shared by every example (each example uses its own operator id)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rhino-model-"))
        self.secret_file = write_secret(self.root, SECRET)
        self.w2 = WorkerProcess(self.root, "w2", "127.0.0.2", secret_file=self.secret_file, metrics=False).start()
        self.w3 = WorkerProcess(self.root, "w3", "127.0.0.3", secret_file=self.secret_file, metrics=False).start()

    def stop(self) -> None:
        for w in (self.w2, self.w3):
            w.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = _Cluster()
    yield c
    c.stop()


def _open_session(client: rhino.Client, op: str, batch: int) -> rhino.Session:
    # A killed client's session ends when the worker sees its socket close,
    # which happens on the worker's own threads right after the kill.
    deadline = time.monotonic() + 5
    while True:
        try:
            return client.session(op, 0, batch=batch, epoch=1)
        except rhino.SessionBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class ServiceMachine(RuleBasedStateMachine):
    cluster: _Cluster  # set by the test

    @initialize()
    def setup(self) -> None:
        c = self.cluster
        self.op = f"m{next(_ops)}"
        self.local = rhino.connect(c.w2.unix_socket, secret=SECRET)
        self.remote = rhino.connect(c.w2.address, secret=SECRET, bind_host="127.0.0.5")
        assert self.local.is_unix and not self.remote.is_unix
        self.local.open_instance(self.op, 0, epoch=1, num_vnodes=NUM_VNODES, chain=[c.w3.address], chain_version=1)
        self.history: dict[int, dict[bytes, bytes]] = {}
        self.last: int | None = None
        self.session: rhino.Session | None = None
        self.pending: dict[bytes, bytes | None] = {}
        self.base: dict[bytes, bytes] = {}
        self.batch = 0

    def teardown(self) -> None:
        if self.session is not None and self.session.open:
            self.session.abort()
        for c in (self.local, self.remote):
            c.close()

    # ---- the model ------------------------------------------------------------
    def view(self) -> dict[bytes, bytes]:
        out = dict(self.base)
        for k, v in self.pending.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    def committed(self) -> dict[bytes, bytes]:
        return {} if self.last is None else self.history[self.last]

    # ---- sessions -------------------------------------------------------------
    @precondition(lambda self: self.session is None)
    @rule(remote=st.booleans(), reexec=st.booleans())
    def open_session(self, remote: bool, reexec: bool) -> None:
        if reexec and self.last is not None:
            b = self.last  # batch `last` runs again: the worker rolls back to last - 1
        else:
            b = 0 if self.last is None else self.last + 1
        s = _open_session(self.remote if remote else self.local, self.op, b)
        assert s.version == (None if b == 0 else b - 1)
        assert s.rolled_back == (self.last is not None and b <= self.last)
        self.session, self.batch, self.pending = s, b, {}
        self.base = {} if b == 0 else self.history[b - 1]
        if s.rolled_back:
            # The rollback is durable: the worker's state and store are at b - 1
            # now, whether this session commits or not.
            self.history = {k: v for k, v in self.history.items() if k < b}
            self.last = None if b == 0 else b - 1

    @precondition(lambda self: self.session is not None)
    @rule(keys=KEYS, seed=st.integers(0, 255), size=st.sampled_from([1, 17, 300]))
    def put(self, keys: list[int], seed: int, size: int) -> None:
        values = [bytes([(seed + k) % 256]) * size + kb(self.batch) for k in keys]
        self.session.put_batch(np.array(keys, dtype=np.int64), values)
        for k, v in zip(keys, values):
            self.pending[kb(k)] = v

    @precondition(lambda self: self.session is not None)
    @rule(keys=KEYS)
    def delete(self, keys: list[int]) -> None:
        self.session.delete_batch(np.array(keys, dtype=np.int64))
        for k in keys:
            self.pending[kb(k)] = None

    @precondition(lambda self: self.session is not None)
    @rule(keys=KEYS)
    def get(self, keys: list[int]) -> None:
        got = self.session.get_batch([kb(k) for k in keys])
        view = self.view()
        assert got == [view.get(kb(k)) for k in keys]

    @precondition(lambda self: self.session is not None)
    @rule(page=st.sampled_from([1, 5, 4096]), prefix=st.sampled_from([b"", b"\x07"]))
    def scan(self, page: int, prefix: bytes) -> None:
        items = list(self.session.scan(page_size=page, prefix=prefix))
        keys = [k for k, _ in items]
        assert len(keys) == len(set(keys)), "a scan returned a key twice"
        assert dict(items) == {k: v for k, v in self.view().items() if k.startswith(prefix)}

    @precondition(lambda self: self.session is not None)
    @rule(mode=st.sampled_from(["barrier", "async"]))
    def commit(self, mode: str) -> None:
        r = self.session.commit(mode)
        assert r.version == self.batch
        assert r.replication == ("complete" if mode == "barrier" else "pending")
        self.history = {b: s for b, s in self.history.items() if b < self.batch}
        self.history[self.batch] = self.view()
        self.last = self.batch
        self.session = None

    @precondition(lambda self: self.session is not None)
    @rule()
    def abort(self) -> None:
        self.session.abort()
        self.session = None

    # ---- failures -------------------------------------------------------------
    @precondition(lambda self: self.session is None)
    @rule(keys=KEYS)
    def kill_client_mid_session(self, keys: list[int]) -> None:
        """A task process dies mid-session: nothing of its writes may be visible."""
        b = 0 if self.last is None else self.last + 1
        script = textwrap.dedent(f"""
            import sys, time, numpy as np, rhino
            c = rhino.connect({str(self.cluster.w2.unix_socket)!r}, secret=open({str(self.cluster.secret_file)!r}, "rb").read().strip())
            s = c.session({self.op!r}, 0, batch={b}, epoch=1)
            s.put_batch(np.array({keys!r}, dtype=np.int64), [b"killed"] * {len(keys)})
            s.delete_batch(np.arange(48, dtype=np.int64))
            print("ready", flush=True)
            time.sleep(60)
        """)
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()

    @precondition(lambda self: self.session is None)
    @rule()
    def restart_worker(self) -> None:
        """SIGKILL w2 and start it again: it hosts op/0 again at its newest checkpoint."""
        self.local.close()
        self.remote.close()
        w2 = self.cluster.w2
        w2.kill()
        w2.start()
        self.local = rhino.connect(w2.unix_socket, secret=SECRET)
        self.remote = rhino.connect(w2.address, secret=SECRET, bind_host="127.0.0.5")
        info = {(i["operator_id"], i["instance"]): i for i in self.local.instances()}
        assert info[(self.op, 0)]["version"] == self.last

    @precondition(lambda self: self.session is None)
    @rule(remote=st.booleans())
    def check_through_client(self, remote: bool) -> None:
        """The committed state, read through a session (then aborted)."""
        b = 0 if self.last is None else self.last + 1
        with _open_session(self.remote if remote else self.local, self.op, b) as s:
            assert dict(s.scan()) == self.committed()
            keys = list(range(48))
            view = self.committed()
            assert s.get_batch(np.array(keys, dtype=np.int64)) == [view.get(kb(k)) for k in keys]

    # ---- the invariant --------------------------------------------------------
    @invariant()
    def open_session_reads_its_own_view(self) -> None:
        """Inside a session, every key reads as the model's view: b-1 plus the session's writes."""
        if getattr(self, "session", None) is None:
            return
        keys = list(range(48))
        view = self.view()
        assert self.session.get_batch(np.array(keys, dtype=np.int64)) == [view.get(kb(k)) for k in keys]

    @invariant()
    def committed_state_matches_the_model(self) -> None:
        if not hasattr(self, "op"):
            return
        store = rhino.ReplicaStore(str(self.cluster.w2.dir))
        ids = store.checkpoints(self.op, 0)
        assert (ids[-1] if ids else None) == self.last
        if self.last is None:
            return
        target = Path(tempfile.mkdtemp(prefix="rhino-model-read-")) / "db"
        try:
            store.restore(self.op, 0, self.last, str(target)).close()
            cfs = read_rocksdb(target)
            state = {k: v for name, cf in cfs.items() if name.startswith("vnode-") for k, v in cf.items()}
            assert state == self.history[self.last]
        finally:
            shutil.rmtree(target.parent, ignore_errors=True)


@pytest.mark.slow
def test_service_model(cluster) -> None:
    ServiceMachine.cluster = cluster
    run = ServiceMachine.TestCase
    # No shrinking: with real processes it runs for minutes; the failing
    # sequence is printed as drawn, and its seed reproduces it.
    run.settings = settings(max_examples=int(os.environ.get("RHINO_MODEL_EXAMPLES", "12")), stateful_step_count=30,
                            deadline=None, suppress_health_check=list(HealthCheck),
                            phases=[Phase.explicit, Phase.reuse, Phase.generate])
    run().runTest()
