"""Roles bound to certificates under TLS (issue 46 item 1; docs/protocol.md §2, "TLS" and
"Roles"): a certificate names the roles it admits as URI SANs ``rhino-role:<role>``, and a
server refuses a client proving any other role at the handshake. On a real ``rhino worker``
(127.0.0.210) and a real ``rhino coordinator`` (127.0.0.211), both with TLS, and
certificates from ``rhino certs init`` (the client's: 127.0.0.1's):

- the task certificate (``127.0.0.1-task.pem``, role task only) proving the admin role (the
  root secret, which a task must never hold but might steal), the coordinator's or a
  worker's credential is refused with ``rhino.PermissionDeniedError`` naming the
  certificate's role and the role asked, at the worker and at the coordinator; each refusal
  is logged, and the server serves on (an admin's request after it, the worker's committed
  state intact);
- the same task certificate proving its job's task credential works: a session writes and
  commits on an operator of its namespace, and the coordinator answers ``status``;
- a host certificate (roles admin, coordinator, worker) proving the coordinator's credential
  works (a fence), as do the admin's and a worker's; proving a task credential it is refused
  (a host's certificate is not its tasks');
- a certificate without any ``rhino-role:`` SAN (a company CA that does not mark roles)
  admits every role.

Against a build without the check, the refusals of the first and fourth items fail: the
handshake succeeds (and the admin's fence with the task certificate takes effect).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cryptography")

import rhino  # noqa: E402
from rhino.coordinator.client import connect_coordinator  # noqa: E402
from rhino.credential import Credential  # noqa: E402
from rhino.tls.certs import init, issue, load_ca  # noqa: E402
from rhino_testing.harness.workers import SECRET, CoordinatorProcess, WorkerProcess, write_secret  # noqa: E402

FIRST_HOST = 210  # 127.0.0.210-211: the worker, the coordinator (tests/test_test_hosts.py)
W_HOST, COORD_HOST = (f"127.0.0.{FIRST_HOST + i}" for i in range(2))
CLIENT_HOST = "127.0.0.1"
OP = rhino.operator_id("counts", "jobA")
SCRATCH = rhino.operator_id("scratch", "jobA")  # never created: a fence of it harms no other test
TASK = Credential.task(SECRET, "jobA")
COORDINATOR = Credential.derive(SECRET, "coordinator")
WORKER = Credential.derive(SECRET, "worker", "w9")
DENIED_LOG = "rhino: permission denied:"


def _tls_args(t: rhino.TLS) -> list[str]:
    return ["--tls-cert", t.cert, "--tls-key", t.key, "--tls-ca", t.ca]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls-roles") / "certs"
    init(d, [W_HOST, COORD_HOST, CLIENT_HOST])  # `rhino certs init DIR --hosts ...`
    ca_cert, ca_key = load_ca(d)
    cert, key = issue(ca_cert, ca_key, CLIENT_HOST, roles=None)  # a company CA's: no role named
    (d / "unmarked.pem").write_bytes(cert)
    (d / "unmarked.key").write_bytes(key)
    return d


@pytest.fixture(scope="module")
def cluster(certs, tmp_path_factory):
    root = tmp_path_factory.mktemp("tls-roles-cluster")
    sf = write_secret(root, SECRET)
    co = CoordinatorProcess(root, secret_file=sf, host=COORD_HOST, heartbeat_timeout=30.0,
                            extra_args=_tls_args(rhino.TLS.from_dir(certs, COORD_HOST))).start()
    try:
        w = WorkerProcess(root, "w9", W_HOST, secret_file=sf, metrics=False,
                          extra_args=["--coordinator", co.address] + _tls_args(rhino.TLS.from_dir(certs, W_HOST))
                          ).start()
    except BaseException:
        co.stop()
        raise
    try:
        # the worker registers with its worker credential and its host's certificate
        with connect_coordinator(co.address, secret=SECRET, tls=host_tls(certs)) as cc:
            deadline = time.monotonic() + 30
            while [x["state"] for x in cc.status()["workers"]] != ["alive"]:
                assert time.monotonic() < deadline, "the worker did not register"
                time.sleep(0.05)
        with rhino.connect(w.address, secret=SECRET, tls=host_tls(certs)) as c:  # the admin
            c.open_instance(OP, 0, epoch=1, num_vnodes=8)
            with c.session(OP, 0, batch=0, epoch=1) as s:
                s.put_batch(np.arange(10, dtype=np.int64), [b"v%d" % i for i in range(10)])
                s.commit()
        yield w, co
        assert w.alive() and co.alive(), "a server died"
    finally:
        w.stop()
        co.stop()


def host_tls(certs: Path) -> rhino.TLS:
    return rhino.TLS.from_dir(certs, CLIENT_HOST)


def task_tls(certs: Path) -> rhino.TLS:
    return rhino.TLS.from_dir(certs, CLIENT_HOST, task=True)


def unmarked_tls(certs: Path) -> rhino.TLS:
    return rhino.TLS(str(certs / "unmarked.pem"), str(certs / "unmarked.key"), str(certs / "ca.pem"))


def _denied_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if DENIED_LOG in line and "certificate" in line]


def _wait_for_log(log: Path, n: int) -> list[str]:
    deadline = time.monotonic() + 10
    while len(_denied_lines(log)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return _denied_lines(log)


def _values(w: WorkerProcess, certs: Path, batch: int) -> list:
    """The instance's committed values, read by the admin with the host's certificate."""
    with rhino.connect(w.address, secret=SECRET, tls=host_tls(certs)) as c, \
            c.session(OP, 0, batch=batch, epoch=1) as s:
        return s.get_batch(np.arange(10, dtype=np.int64))


def test_the_task_certificate_cannot_prove_another_role(cluster, certs):
    w, co = cluster
    before = len(_denied_lines(w.log_path))
    with rhino.connect(w.address, secret=SECRET, tls=host_tls(certs)) as admin:
        fence_before = admin.status(SCRATCH, 0)["fence_epoch"]
    for secret, role in ((SECRET, "admin"), (Credential.derive(SECRET, "admin"), "admin"),
                         (COORDINATOR, "coordinator"), (WORKER, "worker")):
        with pytest.raises(rhino.PermissionDeniedError) as e:
            with rhino.connect(w.address, secret=secret, tls=task_tls(certs), client_id="thief") as c:
                c.fence(SCRATCH, 0, epoch=(1 << 64) - 1)  # what a stolen root would be for
        msg = str(e.value)
        assert f"its TLS certificate admits the role task only, not {role}" in msg, msg
        assert "thief" in msg and "w9" in msg, msg
    for secret, role in ((SECRET, "admin"), (COORDINATOR, "coordinator")):
        with pytest.raises(rhino.PermissionDeniedError, match=f"admits the role task only, not {role}"):
            with connect_coordinator(co.address, secret=secret, tls=task_tls(certs), client_id="thief") as cc:
                cc.declare_dead("w9")  # the connection is made at the first call
    # logged by the worker, and it serves on: nothing was fenced, the state reads back
    lines = _wait_for_log(w.log_path, before + 1)
    assert len(lines) > before and "refused a connection" in lines[-1], lines
    with rhino.connect(w.address, secret=SECRET, tls=host_tls(certs)) as admin:
        assert admin.status(SCRATCH, 0)["fence_epoch"] == fence_before < (1 << 64) - 1
    assert _values(w, certs, 1) == [b"v%d" % i for i in range(10)]
    with connect_coordinator(co.address, secret=SECRET, tls=host_tls(certs)) as cc:
        assert [x["state"] for x in cc.status()["workers"]] == ["alive"]
    assert w.alive() and co.alive()


def test_the_task_certificate_proves_the_task_role(cluster, certs):
    w, co = cluster
    with rhino.connect(w.address, secret=TASK, tls=task_tls(certs), client_id="spark-task-1") as c:
        assert c.status(OP, 0)["version"] == 0
        with c.session(OP, 0, batch=1, epoch=1) as s:
            assert s.get_batch(np.arange(3, dtype=np.int64)) == [b"v0", b"v1", b"v2"]
            s.put_batch(np.array([3], dtype=np.int64), [b"task"])
            s.commit()
    assert _values(w, certs, 2)[3] == b"task"
    with connect_coordinator(co.address, secret=TASK, tls=task_tls(certs)) as cc:
        assert "workers" in cc.status()


def test_a_host_certificate_proves_the_infrastructure_roles_not_the_task(cluster, certs):
    w, co = cluster
    with rhino.connect(w.address, secret=COORDINATOR, tls=host_tls(certs)) as c:
        c.fence(OP, 0, epoch=2)  # the coordinator's business
        assert c.status(OP, 0)["fence_epoch"] == 2
    # a worker's: a store query (as a chain member asks another)
    assert 0 in rhino.query_store(w.address, secret=WORKER, operator_id=OP, instance=0, tls=host_tls(certs))
    with connect_coordinator(co.address, secret=COORDINATOR, tls=host_tls(certs)) as cc:
        assert "workers" in cc.status()
    with pytest.raises(rhino.PermissionDeniedError,
                       match="admits the roles admin, coordinator, worker only, not task"):
        rhino.connect(w.address, secret=TASK, tls=host_tls(certs)).close()


def test_a_certificate_without_role_names_admits_any_role(cluster, certs):
    w, co = cluster
    t = unmarked_tls(certs)
    assert 0 in rhino.query_store(w.address, secret=WORKER, operator_id=OP, instance=0, tls=t)
    for secret in (SECRET, COORDINATOR, WORKER, TASK):
        if secret is not WORKER:  # a worker may not ask for an instance's status
            with rhino.connect(w.address, secret=secret, tls=t) as c:
                assert c.status(OP, 0)["version"] >= 0
        with connect_coordinator(co.address, secret=secret, tls=t) as cc:
            assert "workers" in cc.status()
