"""Mutual TLS on the workers' TCP links (docs/protocol.md §2, "TLS"), on real `rhino worker`
processes with certificates from `rhino certs init`:

- a session over TCP works with TLS, and so does chain replication between two TLS workers
  (the replica's store, read on its own, holds the checkpoint);
- a client whose certificate another CA signed, an expired client certificate, a plaintext
  client, a TLS client on a plaintext listener, and a server whose certificate names another
  host are each refused with a TLSError saying why (or, for the plaintext client, which cannot
  know, a closed connection), the listener logs the refusal and counts it, and the worker
  keeps serving with its committed state intact;
- bad TLS options are refused at start, naming the file.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import numpy as np
import pytest

pytest.importorskip("cryptography")

import rhino  # noqa: E402
from rhino.tls.certs import init, issue, load_ca  # noqa: E402
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret  # noqa: E402

OP = "tls"
H2, H3 = "127.0.0.2", "127.0.0.3"


def tls_args(t: rhino.TLS) -> list[str]:
    return ["--tls-cert", t.cert, "--tls-key", t.key, "--tls-ca", t.ca]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    init(root / "good", [H2, H3, "127.0.0.1"])
    init(root / "other", [H2])
    ca_cert, ca_key = load_ca(root / "good")
    now = dt.datetime.now(dt.timezone.utc)
    cert, key = issue(ca_cert, ca_key, "127.0.0.1", not_before=now - dt.timedelta(days=30),
                      not_after=now - dt.timedelta(days=1))
    (root / "expired.pem").write_bytes(cert)
    (root / "expired.key").write_bytes(key)
    return root


@pytest.fixture(scope="module")
def workers(pki, tmp_path_factory):
    root = tmp_path_factory.mktemp("tls-workers")
    secret_file = write_secret(root, SECRET)
    w3 = WorkerProcess(root, "w3", H3, secret_file=secret_file, metrics=False,
                       extra_args=tls_args(rhino.TLS.from_dir(pki / "good", H3))).start()
    w2 = WorkerProcess(root, "w2", H2, secret_file=secret_file, metrics=False,
                       extra_args=tls_args(rhino.TLS.from_dir(pki / "good", H2))).start()
    plain = WorkerProcess(root, "w4", "127.0.0.4", secret_file=secret_file, metrics=False).start()
    yield w2, w3, plain
    for w in (w2, w3, plain):
        assert w.alive(), f"worker {w.id} died"
        w.stop()


def client_tls(pki) -> rhino.TLS:
    return rhino.TLS.from_dir(pki / "good", "127.0.0.1")


def committed(w2, pki, batch: int) -> list:
    with rhino.connect(w2.address, secret=SECRET, tls=client_tls(pki)) as c, \
            c.session(OP, 0, batch=batch, epoch=1) as s:
        return s.get_batch(np.arange(50, dtype=np.int64))


def test_a_session_over_tls_and_chain_replication_to_a_tls_replica(workers, pki, tmp_path, read_rocksdb):
    w2, w3, _ = workers
    with rhino.connect(w2.address, secret=SECRET, tls=client_tls(pki)) as c:
        c.open_instance(OP, 0, epoch=1, num_vnodes=8, chain=[w3.address], chain_version=1)
        with c.session(OP, 0, batch=0, epoch=1) as s:
            s.put_batch(np.arange(50, dtype=np.int64), [b"v%d" % i for i in range(50)])
            s.commit()  # barrier: complete only once w3 committed checkpoint 0 (over TLS)
    assert committed(w2, pki, 1) == [b"v%d" % i for i in range(50)]
    # the replica's own store holds checkpoint 0, and rocksdict reading its restore finds the values
    store = rhino.ReplicaStore(str(w3.dir))
    assert 0 in store.checkpoints(OP, 0)
    store.restore(OP, 0, 0, str(tmp_path / "restored"))
    values = sorted(v for name, cf in read_rocksdb(tmp_path / "restored").items() if name.startswith("vnode-")
                    for v in cf.values())
    assert values == sorted(b"v%d" % i for i in range(50))


def _refusals(w) -> list[str]:
    return [line for line in w.log_path.read_text().splitlines() if "refused a connection" in line]


def test_bad_peers_are_refused_and_the_worker_keeps_serving(workers, pki):
    w2, _, plain = workers
    before = len(_refusals(w2))

    other = rhino.TLS.from_dir(pki / "other", H2)  # signed by a CA w2 does not trust
    with pytest.raises(rhino.TLSError, match="unknown ca|certificate"):
        rhino.connect(w2.address, secret=SECRET, tls=rhino.TLS(other.cert, other.key, client_tls(pki).ca))

    expired = rhino.TLS(str(pki / "expired.pem"), str(pki / "expired.key"), client_tls(pki).ca)
    with pytest.raises(rhino.TLSError, match="expired|certificate"):
        rhino.connect(w2.address, secret=SECRET, tls=expired)

    # a plaintext client cannot tell why: the connection just closes (or times out)
    with pytest.raises((rhino.PeerDeadError, rhino.RhinoTimeoutError)):
        rhino.connect(w2.address, secret=SECRET, peer_timeout=2.0)

    # the client refuses a server whose certificate does not trust... our CA: w2 presents a
    # certificate from "good", the client trusts only "other"
    with pytest.raises(rhino.TLSError, match="certificate refused"):
        rhino.connect(w2.address, secret=SECRET, tls=rhino.TLS(other.cert, other.key, other.ca))

    # a TLS client on a plaintext listener
    with pytest.raises(rhino.TLSError, match="does not speak TLS|wrong version|packet length"):
        rhino.connect(plain.address, secret=SECRET, tls=client_tls(pki))

    # the listener logged each refusal with its reason
    deadline = time.monotonic() + 10
    while len(_refusals(w2)) < before + 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = _refusals(w2)[before:]
    assert len(lines) >= 4, lines
    joined = "\n".join(lines)
    assert "expired" in joined
    assert "does not speak TLS" in joined or "wrong version number" in joined or "http request" in joined
    # and it still serves, with the committed state intact
    assert committed(w2, pki, 1) == [b"v%d" % i for i in range(50)]
    assert w2.alive()


def test_a_server_certificate_naming_another_host_is_refused(pki, tmp_path):
    # w5 listens on 127.0.0.5 with 127.0.0.3's certificate: a client dialling 127.0.0.5 refuses it
    secret_file = write_secret(tmp_path, SECRET)
    w5 = WorkerProcess(tmp_path, "w5", "127.0.0.5", secret_file=secret_file, metrics=False,
                       extra_args=tls_args(rhino.TLS.from_dir(pki / "good", H3))).start()
    try:
        with pytest.raises(rhino.TLSError, match="IP address mismatch"):
            rhino.connect(w5.address, secret=SECRET, tls=client_tls(pki))
        assert w5.alive()
    finally:
        w5.stop()


def test_bad_tls_options_fail_the_start_naming_the_file(pki, tmp_path):
    good = rhino.TLS.from_dir(pki / "good", H2)
    secret_file = write_secret(tmp_path, SECRET)
    for args, needle in [
        (["--tls-cert", good.cert], "--tls-key, --tls-ca"),
        (["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", good.key, "--tls-ca", good.ca], "missing.pem"),
        (["--tls-cert", good.cert, "--tls-key", str(pki / "other" / f"{H2}.key"), "--tls-ca", good.ca],
         "does not belong"),
        (["--tls-cert", good.cert, "--tls-key", good.key, "--tls-ca", good.key], "holds no PEM certificate"),
    ]:
        w = WorkerProcess(tmp_path, "wbad", H2, secret_file=secret_file, metrics=False, extra_args=args)
        with pytest.raises(RuntimeError) as e:
            w.start(timeout=20)
        assert needle in str(e.value), (args, str(e.value)[-800:])
        w.stop()
    with pytest.raises(rhino.InvalidArgumentError, match="missing.pem"):
        rhino.connect(f"{H2}:1", secret=SECRET, tls=rhino.TLS(str(tmp_path / "missing.pem"), good.key, good.ca))


# ---- a live TLS listener, fed what a stranger might send before any handshake -------------
def _client_hello() -> bytes:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
    from make_corpus import client_hello

    return client_hello()


def test_garbage_and_truncated_client_hellos_leave_the_listener_serving(workers, pki):
    import random
    import socket

    w2, _, _ = workers
    host, port = w2.address.rsplit(":", 1)
    hello = _client_hello()
    rng = random.Random(7)
    inputs = [hello[:n] for n in (1, 5, 9, 40, len(hello) // 2, len(hello) - 1)]
    inputs += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))) for _ in range(30)]
    inputs += [hello[:5] + bytes(rng.getrandbits(8) for _ in range(200)) for _ in range(10)]  # a record, garbage in it
    for data in inputs:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)  # then nothing more: the listener must give up, not wait forever
            try:
                while s.recv(4096):
                    pass
            except (ConnectionResetError, socket.timeout):
                pass
    assert w2.alive()
    assert committed(w2, pki, 1) == [b"v%d" % i for i in range(50)]


# ---- the coordinator, registration, batches and a takeover, all over TLS ------------------
def test_a_tls_cluster_runs_batches_and_fails_over_a_killed_worker(pki, tmp_path):
    from test_coordinator_cli import rhino_cli

    from rhino.coordinator.client import connect_coordinator
    from rhino_testing.harness.engine import MicroBatchEngine
    from rhino_testing.harness.workers import CoordinatorProcess

    good = pki / "good"
    secret_file = write_secret(tmp_path, SECRET)
    # the coordinator on 127.0.0.1 with that host's certificate; workers register over TLS
    co = CoordinatorProcess(tmp_path, secret_file=secret_file, heartbeat_timeout=2.0,
                            extra_args=tls_args(rhino.TLS.from_dir(good, "127.0.0.1"))).start()
    hosts = [H2, H3, "127.0.0.4"]
    if not (good / "127.0.0.4.pem").exists():
        init(good, ["127.0.0.4"])
    ws = [WorkerProcess(tmp_path, f"w{h.rsplit('.', 1)[1]}", h, secret_file=secret_file, metrics=False,
                        extra_args=["--coordinator", co.address] + tls_args(rhino.TLS.from_dir(good, h))).start()
          for h in hosts]
    tls = client_tls(pki)
    cc = connect_coordinator(co.address, secret=SECRET, tls=tls)
    engine = MicroBatchEngine(cc, "q", secret=SECRET, tls=tls, retry_sleep=0.1)
    try:
        deadline = time.monotonic() + 30
        while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 3:
            assert time.monotonic() < deadline, "the workers did not register over TLS"
            time.sleep(0.1)
        # a plaintext client, another CA's certificate and an expired one are refused by the
        # coordinator's listener too, each logged with its reason, and it keeps serving
        with pytest.raises((rhino.PeerDeadError, rhino.RhinoTimeoutError)):
            connect_coordinator(co.address, secret=SECRET, peer_timeout=2.0).status()
        other = rhino.TLS.from_dir(pki / "other", H2)
        with pytest.raises(rhino.TLSError, match="unknown ca|certificate"):
            connect_coordinator(co.address, secret=SECRET, tls=rhino.TLS(other.cert, other.key, tls.ca)).status()
        expired = rhino.TLS(str(pki / "expired.pem"), str(pki / "expired.key"), tls.ca)
        with pytest.raises(rhino.TLSError, match="expired|certificate"):
            connect_coordinator(co.address, secret=SECRET, tls=expired).status()
        deadline = time.monotonic() + 10
        while len(_refusals(co)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_refusals(co)) >= 3 and "expired" in "\n".join(_refusals(co)), _refusals(co)
        assert len(cc.status()["workers"]) == 3
        # the command line, with the TLS files from the environment
        env = {"RHINO_COORDINATOR": co.address, "RHINO_SECRET_FILE": str(secret_file)}
        tls_env = {"RHINO_TLS_CERT": tls.cert, "RHINO_TLS_KEY": tls.key, "RHINO_TLS_CA": tls.ca}
        out = rhino_cli("status", "--json", env={**env, **tls_env})
        assert out.returncode == 0, out.stderr
        assert {w["id"] for w in json.loads(out.stdout)["workers"]} == {"w2", "w3", "w4"}
        assert rhino_cli("status", env={**env, "RHINO_TLS_CERT": tls.cert}).returncode != 0  # some, not all
        cc.create_operator("q", parallelism=2, num_vnodes=16, replicas=1)
        rng = np.random.default_rng(5)
        model: dict[int, bytes] = {}
        for b in range(3):
            puts = {int(k): rng.bytes(10) for k in rng.choice(400, 60, replace=False)}
            engine.run_batch(b, puts)
            model.update(puts)
        before = cc.placement("q")
        victim_id = before.instances[0].primary
        next(w for w in ws if w.id == victim_id).kill()  # SIGKILL: the coordinator finds out by heartbeats
        for b in range(3, 6):
            puts = {int(k): rng.bytes(10) for k in rng.choice(400, 60, replace=False)}
            engine.run_batch(b, puts)
            model.update(puts)
        after = cc.placement("q")
        assert after.epoch > before.epoch and after.instances[0].primary != victim_id
        # every instance's state, read over TCP with TLS, equals the model
        got: dict[int, bytes] = {}
        for i, info in after.instances.items():
            with rhino.connect(info.address, secret=SECRET, tls=tls) as c, \
                    c.session("q", i, batch=6, epoch=after.epoch) as s:
                got.update({int.from_bytes(k, "little", signed=True): v for k, v in s.scan(page_size=500)})
                s.abort()
        assert got == model
    finally:
        engine.close()
        cc.close()
        for w in ws:
            if w.alive():
                w.stop()
        co.stop()
