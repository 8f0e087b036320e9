"""Roles (issue 46 item 1, docs/protocol.md §2 "Roles", docs/design.md §5.1): a client holding
a Spark job's task credential, and one holding a worker's credential, try what user code in a
task could try against real ``rhino worker`` processes (w1, w2 on 127.0.0.200-201) and a real
``rhino coordinator`` process (127.0.0.202), over plaintext and over mutual TLS. One cluster per
mode, shared by the module's tests.

Three operators run: ``jobA..counts`` (the attacker's own job), ``jobB..counts`` (another job)
and ``counts`` (the default namespace), each one instance with a primary and a replica, each
created and committed by its own job's task credential. The attacker holds jobA's task
credential, as ``rhino credential task --namespace jobA`` wrote it. Each of these is refused
with ``rhino.PermissionDeniedError`` (code 19):

- on a worker: ``fence`` at epoch 2**64-1 (of the hosted instance, of its replica, and over the
  Unix socket), ``discard_after``, ``takeover``, ``reconfigure`` and every other instance action
  but ``status``; a session, a checkpoint reader and a ``status`` on jobB's and on the default
  namespace's operator; a store query and a replication stream (a forged checkpoint);
- with a worker's credential: sessions, readers, ``status`` and ``fence``;
- at the coordinator: ``register`` and ``heartbeat`` as another worker's id (with the task
  credential, and with w1's credential as w2), ``declare_dead``, the admin-only methods, and
  the job methods on another namespace's operators.

After every refusal: every process is alive (``poll()`` is None); an admin client's ``status``
on each worker, and at the coordinator, answers as before (the fences, the checkpoints, the
epochs, the placements; the fence files and manifests on disk byte for byte); the attacker's
own connection serves on; and the committed state of every operator reads back intact with
rocksdict (its own RocksDB build, no Rhino code): the primary's live state directory, and a
restore of the newest checkpoint from the primary's and the replica's stores, against a dict
model of what each job committed. Each worker logs "rhino: permission denied: ..." on stderr.

Positive controls, so that a refuse-everything implementation fails: the same task credential
creates jobA's operator, begins and commits batches, opens a session on ``jobA..counts``,
writes and commits it (rocksdict then sees the new batch), reads its checkpoint and its status;
a credential forged from the task key (another role or namespace) is refused at the handshake;
the admin (root) and the coordinator role can fence; a worker's credential queries a store and
asks for ``discard_after``; and chain replication between the workers, with their own worker
credentials, completes on every commit.
"""

from __future__ import annotations

import itertools
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest

import rhino
from rhino import _core
from rhino.coordinator.client import connect_coordinator
from rhino.credential import Credential
from rhino.replication import read_secret_file
from rhino_testing.harness.workers import SECRET, CoordinatorProcess, WorkerProcess, read_rocksdb, write_secret

FIRST_HOST = 200  # 127.0.0.200-202: w1, w2, the coordinator (tests/test_test_hosts.py)
W1_HOST, W2_HOST, COORD_HOST = (f"127.0.0.{FIRST_HOST + i}" for i in range(3))
CLIENT_HOST = "127.0.0.1"  # where the clients connect from (their TLS certificate's name)
V = 8
A = rhino.operator_id("counts", "jobA")  # the attacker's own job
B = rhino.operator_id("counts", "jobB")  # another job
D = rhino.operator_id("counts")  # the default namespace
OPS = (A, B, D)
NAMESPACE = {A: "jobA", B: "jobB", D: None}
SCRATCH = rhino.operator_id("scratch", "jobA")  # never created: fences of it harm nobody
TOP = (1 << 64) - 1
PERMISSION_DENIED = 19
DENIED_LOG = "rhino: permission denied:"


# ---- the cluster ---------------------------------------------------------------------------------


@dataclass
class Cluster:
    mode: str
    root: Path
    secret_file: Path
    co: CoordinatorProcess
    ws: dict[str, WorkerProcess]
    tls: Optional[rhino.TLS]  # the clients' identity (127.0.0.1); None: plaintext
    task_tls: Optional[rhino.TLS]  # the task certificate of the clients' host (role task only)
    task: Credential  # jobA's, from the file `rhino credential task --namespace jobA` wrote
    model: dict[str, dict[int, bytes]] = field(default_factory=dict)  # op -> committed state
    last: dict[str, int] = field(default_factory=dict)  # op -> last committed batch
    primary: dict[str, WorkerProcess] = field(default_factory=dict)
    replica: dict[str, WorkerProcess] = field(default_factory=dict)
    # The admin's own connections (the root secret), one per worker and one to the coordinator,
    # opened once: every check after a refusal asks through them, so they must serve on too.
    _admins: dict[str, Any] = field(default_factory=dict)

    def admin(self, w: Optional[WorkerProcess] = None) -> Any:
        """The admin's client of worker `w`, or of the coordinator."""
        key = w.id if w is not None else "coordinator"
        if key not in self._admins:
            self._admins[key] = self.connect(w) if w is not None else self.coordinator()
        return self._admins[key]

    def close(self) -> None:
        for c in self._admins.values():
            c.close()

    def tls_for(self, secret: Any) -> Optional[rhino.TLS]:
        """The certificate a holder of `secret` has: a task credential the task certificate (as a
        Spark task does), anything else the host's (docs/protocol.md §2, "TLS")."""
        return self.task_tls if isinstance(secret, Credential) and secret.role == "task" else self.tls

    def connect(self, w: WorkerProcess, secret: Any = SECRET, **kw: Any) -> rhino.Client:
        return rhino.connect(w.address, secret=secret, tls=self.tls_for(secret), client_id="abuse-test", **kw)

    def coordinator(self, secret: Any = SECRET, **kw: Any):
        return connect_coordinator(self.co.address, secret=secret, tls=self.tls_for(secret), client_id="abuse-test",
                                   request_timeout=60.0, **kw)

    def placement(self, op: str):
        return self.admin().placement(op)


def _tls_args(t: Optional[rhino.TLS]) -> list[str]:
    return [] if t is None else ["--tls-cert", t.cert, "--tls-key", t.key, "--tls-ca", t.ca]


def _write_task_credential(root: Path, secret_file: Path) -> Credential:
    """jobA's task credential, as the CLI writes it for a job: an owner-only file that reads back
    as the credential derived from the root, not as the root."""
    path = root / "jobA.credential"
    r = subprocess.run([sys.executable, "-m", "rhino", "credential", "task", "--namespace", "jobA",
                        "--secret-file", str(secret_file), "--out", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SECRET not in path.read_bytes() and SECRET.hex().encode() not in path.read_bytes()
    cred = read_secret_file(path)
    assert isinstance(cred, Credential), cred
    assert (cred.role, cred.scope) == ("task", "jobA")
    assert cred == Credential.task(SECRET, "jobA") == Credential.derive(SECRET, "task", "jobA")
    assert cred.key != SECRET and len(cred.key) == 32
    assert cred.key.hex() not in repr(cred)
    return cred


def _batch_puts(op: str, batch: int) -> dict[int, bytes]:
    rng = np.random.default_rng(batch * 7 + OPS.index(op))
    return {int(k): b"%s/b%d/k%d" % (op.encode(), batch, k) for k in rng.choice(200, 40, replace=False)}


def run_batch(cl: Cluster, secret: Any, op: str, puts: dict[int, bytes], deletes: tuple[int, ...] = ()) -> None:
    """One batch of `op`, driven as a job drives it, with `secret` for the coordinator and the
    worker: begin_batch, a session on the primary with the attempt fence, a barrier commit (the
    chain's replication complete), commit_batch. The model follows."""
    batch = cl.last[op] + 1 if op in cl.last else 0
    keys = np.array(sorted(puts), dtype=np.int64)
    with cl.coordinator(secret) as cc:
        pl = cc.begin_batch(op, batch)
        info = pl.instances[0]
        with cl.connect(_by_id(cl, info.primary), secret) as c:
            with c.session(op, 0, batch=batch, epoch=pl.epoch, attempt=pl.attempt, committed=pl.last_batch) as s:
                s.put_batch(keys, [puts[int(k)] for k in keys])
                if deletes:
                    s.delete_batch(np.array(deletes, dtype=np.int64))
                r = s.commit("barrier")
        assert r.version == batch and r.replication == "complete", r
        cc.commit_batch(op, batch, instances={"0": {"checkpoint_bytes": int(r.stats.get("checkpoint_bytes", 0))}},
                        load={}, epoch=pl.epoch)
    model = cl.model.setdefault(op, {})
    model.update(puts)
    for k in deletes:
        model.pop(k, None)
    cl.last[op] = batch


def _by_id(cl: Cluster, worker_id: str) -> WorkerProcess:
    return cl.ws[worker_id]


@pytest.fixture(scope="module", params=["plain", "tls"])
def cluster(request, tmp_path_factory):
    mode = request.param
    root = tmp_path_factory.mktemp(f"abuse-{mode}")
    sf = write_secret(root, SECRET)
    tls_of: dict[str, Optional[rhino.TLS]] = {h: None for h in (W1_HOST, W2_HOST, COORD_HOST, CLIENT_HOST)}
    task_tls = None
    if mode == "tls":
        pytest.importorskip("cryptography")
        from rhino.tls.certs import init

        init(root / "certs", list(tls_of))  # `rhino certs init DIR --hosts ...`
        task_tls = rhino.TLS.from_dir(root / "certs", CLIENT_HOST, task=True)
        tls_of = {h: rhino.TLS.from_dir(root / "certs", h) for h in tls_of}
    co = CoordinatorProcess(root, secret_file=sf, host=COORD_HOST, heartbeat_timeout=30.0,
                            extra_args=_tls_args(tls_of[COORD_HOST])).start()
    ws: dict[str, WorkerProcess] = {}
    try:
        for wid, host in (("w1", W1_HOST), ("w2", W2_HOST)):
            ws[wid] = WorkerProcess(root, wid, host, secret_file=sf, metrics=False,
                                    extra_args=["--coordinator", co.address] + _tls_args(tls_of[host])).start()
        cl = Cluster(mode, root, sf, co, ws, tls_of[CLIENT_HOST], task_tls, _write_task_credential(root, sf))
        with cl.coordinator() as cc:  # the workers registered themselves, with their worker credentials
            deadline = time.monotonic() + 30
            while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 2:
                assert time.monotonic() < deadline, "the workers did not register"
                time.sleep(0.05)
        # Each job creates its operator and commits batch 0 with its own task credential.
        for op in OPS:
            cred = cl.task if op == A else Credential.task(SECRET, NAMESPACE[op])
            with cl.coordinator(cred) as cc:
                pl = cc.create_operator(op, parallelism=1, num_vnodes=V, replicas=1)
            info = pl.instances[0]
            assert len(info.chain) == 1 and info.chain[0] != info.primary, info
            cl.primary[op], cl.replica[op] = ws[info.primary], ws[info.chain[0]]
            run_batch(cl, cred, op, _batch_puts(op, 0))
        yield cl
        cl.close()
    finally:
        for w in ws.values():
            assert w.alive(), f"worker {w.id} died"
            w.stop()
        assert co.alive(), "the coordinator died"
        co.stop()


# ---- what "unharmed" means -----------------------------------------------------------------------

_reads = itertools.count()
_STATUS_FIELDS = ("fence_epoch", "hosted", "checkpoints", "epoch", "version", "chain", "chain_version")


def snapshot(cl: Cluster) -> dict:
    """What a refused request must not change: each worker's status of each operator (an admin
    client's), its fence files and checkpoint manifests on disk (bytes), and the coordinator's
    view of the workers and the placements."""
    out: dict = {}
    for w in cl.ws.values():
        c = cl.admin(w)
        for op in OPS:
            st = c.status(op, 0)
            out[(w.id, op)] = {k: st.get(k) for k in _STATUS_FIELDS}
        out[(w.id, "hosted")] = sorted((i["operator_id"], i["instance"], i["epoch"], i["db_name"])
                                       for i in c.instances())
        for d in (w.state_dir / "fences", w.dir / "fences", w.dir / "checkpoints"):
            for p in sorted(d.rglob("*")) if d.is_dir() else ():
                if p.is_file():
                    out[str(p)] = p.read_bytes()
    cc = cl.admin()
    out["workers"] = sorted((w["id"], w["address"], w["state"]) for w in cc.status()["workers"])
    for op in OPS:
        pl = cc.placement(op)
        i = pl.instances[0]
        out[("placement", op)] = (pl.epoch, pl.last_batch, i.primary, i.chain, i.chain_version, i.address)
    return out


def _as_keys(model: dict[int, bytes]) -> dict[bytes, bytes]:
    return {k.to_bytes(8, "little", signed=True): v for k, v in model.items()}


def rocksdict_vnodes(path: Path) -> dict[bytes, bytes]:
    """Every vnode column family's keys and values of the RocksDB at `path`, read by rocksdict."""
    out: dict[bytes, bytes] = {}
    cfs = read_rocksdb(path)
    vnode_cfs = [n for n in cfs if n.startswith("vnode-")]
    assert len(vnode_cfs) == V, sorted(cfs)
    for n in vnode_cfs:
        assert not out.keys() & cfs[n].keys(), f"a key in two vnodes of {path}"
        out.update(cfs[n])
    return out


def assert_intact(cl: Cluster) -> None:
    """Every operator's committed state, read by rocksdict: the primary's live state (opened
    read-only beside the worker) and a restore of the newest checkpoint from each store."""
    for op in OPS:
        want = _as_keys(cl.model[op])
        (info,) = [i for i in cl.admin(cl.primary[op]).instances() if i["operator_id"] == op and i["instance"] == 0]
        live = cl.primary[op].state_dir / "instances" / op / "0" / info["db_name"]
        assert rocksdict_vnodes(live) == want, f"{op}: the primary's live state changed"
        for w in (cl.primary[op], cl.replica[op]):
            target = cl.root / "reads" / f"{next(_reads)}-{w.id}-{op}"
            target.parent.mkdir(exist_ok=True)
            rhino.ReplicaStore(str(w.dir)).restore(op, 0, cl.last[op], str(target)).close()
            try:
                assert rocksdict_vnodes(target) == want, f"{op}: checkpoint {cl.last[op]} in {w.id}'s store changed"
            finally:
                shutil.rmtree(target, ignore_errors=True)


def assert_unharmed(cl: Cluster, before: dict, *, still_open: Optional[Callable[[], Any]] = None) -> None:
    for proc in (cl.co, *cl.ws.values()):
        assert proc.proc.poll() is None, f"{proc} exited with {proc.proc.returncode}"
    assert snapshot(cl) == before
    if still_open is not None:
        still_open()  # the attacker's connection serves on after its refusal
    assert_intact(cl)


def refused(cl: Cluster, before: dict, call: Callable[[], Any], *words: str,
            still_open: Optional[Callable[[], Any]] = None) -> str:
    """`call` raises PermissionDeniedError naming `words`, and the cluster is unharmed."""
    with pytest.raises(rhino.PermissionDeniedError) as ei:
        call()
    msg = str(ei.value)
    for w in words:
        assert w in msg, (w, msg)
    assert_unharmed(cl, before, still_open=still_open)
    return msg


def _own_status(c: rhino.Client) -> Callable[[], Any]:
    return lambda: c.status(A, 0)


# ---- positive controls ---------------------------------------------------------------------------


def test_permission_denied_is_its_own_error_and_code() -> None:
    assert (PERMISSION_DENIED, "PermissionDenied") in [(n, name) for n, name, _ in _core.status_codes()]
    assert issubclass(rhino.PermissionDeniedError, rhino.RhinoError)
    assert not issubclass(rhino.PermissionDeniedError, rhino.AuthFailedError)


def test_the_task_credential_runs_its_own_job(cluster) -> None:
    cl = cluster
    pl = cl.placement(A)
    with cl.coordinator(cl.task) as cc:  # the job's calls at the coordinator
        assert cc.placement(A).epoch == pl.epoch
        assert cc.state_schema(A)["revision"] == 0
    # A batch of jobA through the task credential: session, write, delete, commit, commit_batch.
    before_last = cl.last[A]
    run_batch(cl, cl.task, A, _batch_puts(A, before_last + 1), deletes=tuple(sorted(cl.model[A]))[:3])
    assert cl.last[A] == before_last + 1
    assert_intact(cl)  # rocksdict sees the batch the task committed, on the primary and the replica
    with cl.connect(cl.primary[A], cl.task) as c:
        st = c.status(A, 0)
        assert st["hosted"] and st["version"] == cl.last[A] and cl.last[A] in st["checkpoints"]
        with c.read_checkpoint(A, 0) as r:
            keys = np.array(sorted(cl.model[A]), dtype=np.int64)
            assert r.checkpoint == cl.last[A]
            assert r.get_batch(keys) == [cl.model[A][int(k)] for k in keys]
    with cl.connect(cl.replica[A], cl.task) as c, c.read_checkpoint(A, 0) as r:  # the replica's own copy
        assert r.get_batch(keys) == [cl.model[A][int(k)] for k in keys]
    # The same role from the root, over the Unix socket (a task on the worker's host).
    with rhino.connect(cl.primary[A].unix_socket, secret=SECRET, role="task", scope="jobA") as c:
        with c.session(A, 0, batch=cl.last[A] + 1, epoch=pl.epoch) as s:
            assert s.get_batch(keys) == [cl.model[A][int(k)] for k in keys]
            s.abort()
    with cl.coordinator(cl.task) as cc:  # status is for everyone (docs/protocol.md §8.2)
        assert {w["id"] for w in cc.status()["workers"]} == {"w1", "w2"}


def test_the_admin_and_the_coordinator_can_fence_what_the_task_cannot(cluster) -> None:
    """The refusal is of the role, not of the request: the task's fence of an instance of its own
    namespace is refused and changes nothing; the admin's (the root's) and the coordinator
    role's same fence is served and seen."""
    cl = cluster
    w = cl.replica[A]
    with cl.connect(w, cl.task) as c:
        with pytest.raises(rhino.PermissionDeniedError, match="fence"):
            c.fence(SCRATCH, 0, epoch=TOP)
    with cl.connect(w) as admin:
        assert admin.status(SCRATCH, 0)["fence_epoch"] == 0
        admin.fence(SCRATCH, 0, epoch=TOP)
        assert admin.status(SCRATCH, 0)["fence_epoch"] == TOP
    assert (w.state_dir / "fences" / SCRATCH / "0").read_bytes() == b"%d\n" % TOP  # on disk, as documented
    with cl.connect(w, Credential.derive(SECRET, "coordinator")) as c:
        c.fence(SCRATCH, 1, epoch=5)
        assert c.status(SCRATCH, 1)["fence_epoch"] == 5
        assert c.instances() is not None
    with cl.connect(w, SECRET, role="coordinator") as c:
        c.fence(SCRATCH, 1, epoch=6)
        assert c.status(SCRATCH, 1)["fence_epoch"] == 6
    # A worker's credential may ask for discard_after (a primary cleaning its chain).
    with cl.connect(w, Credential.derive(SECRET, "worker", "w1")) as c:
        assert c.discard_after(SCRATCH, 2, epoch=1, after=None) == []
    assert_intact(cl)


def test_a_credential_proves_its_own_role_and_scope_only(cluster) -> None:
    """The task key does not prove another role or namespace, nor serve as a root to derive from:
    each is refused at the handshake (AuthFailedError), by the workers and the coordinator."""
    cl = cluster
    before = snapshot(cl)
    key = cl.task.key
    with pytest.raises(TypeError):
        Credential.derive(cl.task, "admin")
    forged = [Credential("admin", "", key), Credential("coordinator", "", key), Credential("task", "jobB", key),
              Credential("task", "", key), Credential("worker", "w1", key)]
    for w in cl.ws.values():
        for f in forged:
            with pytest.raises(rhino.AuthFailedError):
                cl.connect(w, f).close()
        with pytest.raises(rhino.AuthFailedError):
            cl.connect(w, key).close()  # the task key as a root: derives an admin key nobody knows
        with pytest.raises(rhino.AuthFailedError):
            cl.connect(w, key, role="task", scope="jobA").close()
    for f in forged[:3]:
        with pytest.raises(rhino.AuthFailedError):
            cl.coordinator(f).close()
    assert_unharmed(cl, before)


# ---- the attacks on a worker ---------------------------------------------------------------------


def test_a_task_cannot_fence_an_instance_at_the_top_epoch(cluster) -> None:
    cl = cluster
    epoch = cl.placement(A).epoch
    time.sleep(1.1)  # past the log's rate limit (a line a second), so that this refusal is logged
    for w in (cl.primary[A], cl.replica[A]):  # the hosted instance, and its replica's fence
        before = snapshot(cl)
        with cl.connect(w, cl.task) as c:
            refused(cl, before, lambda: c.fence(A, 0, epoch=TOP), "fence", "task", still_open=_own_status(c))
            refused(cl, before, lambda: c.fence(A, 0, epoch=epoch + 1), "fence", still_open=_own_status(c))
        assert (cl.primary[A].state_dir / "fences" / A / "0").read_bytes() == b"%d\n" % epoch
    # Over the Unix socket too (no TLS there: the role is still proved).
    w = cl.primary[A]
    before = snapshot(cl)
    with rhino.connect(w.unix_socket, secret=cl.task) as c:
        refused(cl, before, lambda: c.fence(A, 0, epoch=TOP), "fence", still_open=_own_status(c))
    # The task still runs its batch at the coordinator's epoch: it was not fenced out.
    with cl.connect(w, cl.task) as c, c.session(A, 0, batch=cl.last[A] + 1, epoch=epoch) as s:
        s.abort()
    for w in (cl.primary[A], cl.replica[A]):
        lines = [ln for ln in w.log_path.read_text().splitlines() if DENIED_LOG in ln]
        assert any("fence" in ln for ln in lines), lines[-5:]


def _instance_attacks(cl: Cluster) -> dict[str, tuple[WorkerProcess, Callable[[rhino.Client], Any]]]:
    """Each instance action a task may not ask for, made so that the role is the only thing wrong
    with it (current epochs, real checkpoints, an instance the worker holds)."""
    pa, pb = cl.placement(A), cl.placement(B)
    prim, repl = cl.primary[A], cl.replica[A]
    e, last = pa.epoch, cl.last[A]
    return {
        # the replica's checkpoints of jobA: all of them would go
        "discard_after": (repl, lambda c: c.discard_after(A, 0, epoch=e, after=None)),
        # the replica would host jobA at an epoch above everything the coordinator hands out
        "takeover": (repl, lambda c: c.takeover(A, 0, epoch=TOP, checkpoint=last)),
        # half of the primary's vnodes would be dropped from its live state
        "reconfigure": (prim, lambda c: c.reconfigure(A, 0, epoch=e, version=last,
                                                      ops=[{"op": "drop", "vnodes": [0, 1, 2, 3]}], timeout=10)),
        "open": (prim, lambda c: c.open_instance(A, 0, epoch=e + 1, num_vnodes=V)),
        "close": (prim, lambda c: c.close_instance(A, 0, epoch=e)),
        "drop": (repl, lambda c: c.drop(A, 0, epoch=TOP)),
        "compact": (prim, lambda c: c.compact(A, 0, epoch=e)),
        "replicate": (prim, lambda c: c.replicate(A, 0, epoch=e, to=[repl.address], chain_version=1 << 62,
                                                  timeout=10)),
        "import": (prim, lambda c: c.import_vnodes(A, 0, epoch=e, from_operator=B, from_instance=0,
                                                   checkpoint=cl.last[B], vnodes=[0])),
        "move_vnodes": (prim, lambda c: c.move_vnodes(A, 0, epoch=e, to_operator=B, to_instance=0,
                                                      to_epoch=pb.epoch, vnodes=[0])),
        "list": (prim, lambda c: c.instances()),
    }


@pytest.mark.parametrize("action", ["discard_after", "takeover", "reconfigure", "open", "close", "drop", "compact",
                                    "replicate", "import", "move_vnodes", "list"])
def test_a_task_cannot_change_instances(cluster, action) -> None:
    cl = cluster
    w, attack = _instance_attacks(cl)[action]
    before = snapshot(cl)
    with cl.connect(w, cl.task) as c:
        refused(cl, before, lambda: attack(c), action, still_open=_own_status(c))
    assert DENIED_LOG in w.log_path.read_text()


def test_a_task_cannot_reach_another_namespace(cluster) -> None:
    """Sessions, checkpoint readers and status of jobB's and of the default namespace's operator,
    on the workers that hold them, at their current epochs: refused; the task's own namespace is
    not refused (an instance it does not have is UnknownInstance, not PermissionDenied)."""
    cl = cluster
    for op in (B, D):
        pl = cl.placement(op)
        for w in (cl.primary[op], cl.replica[op]):
            before = snapshot(cl)
            with cl.connect(w, cl.task) as c:
                if w is cl.primary[op]:
                    refused(cl, before, lambda: c.session(op, 0, batch=cl.last[op] + 1, epoch=pl.epoch), op, "task",
                            still_open=_own_status(c))
                refused(cl, before, lambda: c.read_checkpoint(op, 0), op, "task", still_open=_own_status(c))
                refused(cl, before, lambda: c.status(op, 0), op, still_open=_own_status(c))
    # Ids that only look like jobA's: the namespace is what comes before the first "..".
    before = snapshot(cl)
    with cl.connect(cl.primary[A], cl.task) as c:
        for op in ("jobA", "jobAB..counts", "job..counts"):
            refused(cl, before, lambda: c.session(op, 0, batch=1, epoch=1), op)
        with pytest.raises(rhino.UnknownInstanceError):  # its own namespace passes the check
            c.session(A, 5, batch=1, epoch=cl.placement(A).epoch)
        assert c.status(A, 0)["hosted"] is not None


def test_a_task_cannot_replicate_or_query_a_store(cluster, tmp_path) -> None:
    """A store query, and a replication stream of a forged checkpoint of jobA (id 1000, chain
    version 2**62) to jobA's replica: refused; nothing lands in the replica's store."""
    cl = cluster
    repl = cl.replica[A]
    before = snapshot(cl)
    refused(cl, before, lambda: rhino.query_store(repl.address, secret=cl.task, operator_id=A, instance=0,
                                                  tls=cl.tls_for(cl.task)))
    forged = 1000
    db = rhino.StateBackend.open(str(tmp_path / "live"), operator_id=A, instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=V))
    keys = np.array(sorted(cl.model[A]), dtype=np.int64)
    db.put_batch(keys, [b"forged"] * len(keys), version=forged)
    db.flush()
    store = rhino.ReplicaStore(str(tmp_path / "store"))
    db.checkpoint(store, forged)
    db.close()
    h = rhino.replicate(store, A, 0, forged, [repl.address], chain_version=1 << 62, secret=cl.task,
                        tls=cl.tls_for(cl.task), timeout=20.0)
    refused(cl, before, lambda: h.wait(30))
    assert forged not in rhino.ReplicaStore(str(repl.dir)).checkpoints(A, 0)


def test_a_worker_credential_is_held_to_replication(cluster) -> None:
    """w1's credential queries a store, asks for discard_after (the fence test of the positive
    controls) and opens checkpoint readers (a base's reads, design §4.1), but opens no session,
    asks no status, and fences nothing; its reader changes nothing."""
    cl = cluster
    cred = Credential.derive(SECRET, "worker", "w1")
    repl, prim = cl.replica[A], cl.primary[A]
    assert cl.last[A] in rhino.query_store(repl.address, secret=cred, operator_id=A, instance=0, tls=cl.tls)
    epoch = cl.placement(A).epoch
    before = snapshot(cl)
    with cl.connect(prim, cred) as c:

        def still() -> None:  # the worker's connection stays open, and its store queries are served
            assert c.is_open
            assert cl.last[A] in rhino.query_store(prim.address, secret=cred, operator_id=A, instance=0, tls=cl.tls)

        refused(cl, before, lambda: c.session(A, 0, batch=cl.last[A] + 1, epoch=epoch), "worker", still_open=still)
        r = c.read_checkpoint(A, 0)  # read-only: what a target reads a base with
        assert r.checkpoint == cl.last[A]
        r.close()
        assert snapshot(cl) == before
        refused(cl, before, lambda: c.status(A, 0), still_open=still)
        refused(cl, before, lambda: c.fence(A, 0, epoch=TOP), "fence", still_open=still)
        refused(cl, before, lambda: c.takeover(A, 0, epoch=TOP), "takeover", still_open=still)


# ---- the attacks on the coordinator --------------------------------------------------------------


def test_the_coordinator_refuses_by_role(cluster) -> None:
    cl = cluster
    before = snapshot(cl)
    w1, w2 = cl.ws["w1"], cl.ws["w2"]
    fake = f"{CLIENT_HOST}:1"
    w1_cred = Credential.derive(SECRET, "worker", "w1")
    with cl.coordinator(cl.task) as task, cl.coordinator(w1_cred) as worker, \
            cl.coordinator(Credential.derive(SECRET, "coordinator")) as coord_role:
        epoch = cl.placement(A).epoch

        def ok() -> None:  # every attacker's connection serves on, with what its role may ask
            assert task.placement(A).epoch == epoch  # the task's own job
            assert {w["id"] for w in coord_role.status()["workers"]} == {"w1", "w2"}
            with pytest.raises(rhino.StaleEpochError):  # w1 as itself passes; its made-up incarnation does not
                worker.heartbeat("w1", "not-its-incarnation")

        # register and heartbeat as another worker's id
        refused(cl, before, lambda: task.register("w2", fake, incarnation="evil"), "register", "task", still_open=ok)
        refused(cl, before, lambda: task.register("w1", fake, incarnation="evil"), "register", still_open=ok)
        refused(cl, before, lambda: worker.register("w2", fake, incarnation="evil"), "register", "w2", still_open=ok)
        refused(cl, before, lambda: worker.heartbeat("w2", "evil"), "heartbeat", still_open=ok)
        refused(cl, before, lambda: task.heartbeat("w1", "evil"), "heartbeat", still_open=ok)
        # declare a live worker dead
        for c in (task, worker, coord_role):
            refused(cl, before, lambda: c.declare_dead("w1", "abuse"), "declare_dead", still_open=ok)
        # the admin's methods, on the task's own operator
        for name, call in [("drop_operator", lambda: task.drop_operator(A, idle_s=0)),
                           ("decommission", lambda: task.decommission("w1", force=True)),
                           ("rescale", lambda: task.rescale(A, 2)),
                           ("handover", lambda: task.handover(A, [0, 1], 0)),
                           ("rebalance", lambda: task.rebalance(A)),
                           ("cancel_plan", lambda: task.cancel_plan(A)),
                           ("autoscale", lambda: task.autoscale(A, enabled=False))]:
            refused(cl, before, call, name, still_open=ok)
        # the job methods, on another namespace's operators, and from a worker
        nb = cl.last[B] + 1
        for name, call in [("placement", lambda: task.placement(B)),
                           ("placement", lambda: task.placement(D)),
                           ("begin_batch", lambda: task.begin_batch(B, nb)),
                           ("commit_batch", lambda: task.commit_batch(B, nb)),
                           ("create_operator", lambda: task.create_operator(rhino.operator_id("x", "jobB"),
                                                                            parallelism=1, num_vnodes=V, replicas=1)),
                           ("create_operator", lambda: task.create_operator("x", parallelism=1, num_vnodes=V,
                                                                            replicas=1)),
                           ("state_schema", lambda: task.state_schema(B)),
                           ("set_state_schema", lambda: task.set_state_schema(B, {}, 0)),
                           ("report_unreachable", lambda: task.report_unreachable(D, 0, "w1")),
                           ("placement", lambda: worker.placement(A)),
                           ("begin_batch", lambda: coord_role.begin_batch(A, cl.last[A] + 1))]:
            refused(cl, before, call, name, still_open=ok)
        status = cl.admin().status()
        assert {(w["id"], w["address"], w["state"]) for w in status["workers"]} == \
            {("w1", w1.address, "alive"), ("w2", w2.address, "alive")}
        text = cl.co.log_path.read_text()
        assert "permission_denied" in text or "permission denied" in text, text[-2000:]
        # status is for everyone (docs/protocol.md §8.2)
        for c in (task, worker, coord_role):
            assert {w["id"] for w in c.status()["workers"]} == {"w1", "w2"}, c
