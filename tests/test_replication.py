"""Chain replication with real worker processes on real sockets (issue 3).

Workers are `python -m rhino.daemon.worker` daemons on distinct loopback addresses
(127.0.0.2, .3, .4, ...), each with its own replica store, started with setsid
and stopped or killed by PID. The primary is this test process: it holds a
real RocksDB instance (rhino.StateBackend), checkpoints it into its own store
and replicates the checkpoint down the chain (docs/protocol.md §4).
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash

import rhino
from rhino import _core
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

import dataplane_wire as wire

OP = "q8-join"
# Workers here declare a silent peer dead after 1.5 s (the daemon's default: 3 s), so failures show fast.
QUICK_PEERS = {"heartbeat_ms": 250, "peer_timeout_ms": 1500}
CHUNK = 64 << 10
WINDOW = 4


# ---- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def cluster(root):
    secret_file = write_secret(root)
    workers = {}
    try:
        for n in (2, 3, 4, 5):
            workers[n] = WorkerProcess(root, f"w{n}", f"127.0.0.{n}", **QUICK_PEERS, secret_file=secret_file).start()
        yield workers
    finally:
        for w in workers.values():
            if w.alive():
                assert w.stop() == 0, f"{w.id} did not shut down cleanly: {w.log_path.read_text()[-2000:]}"


class Primary:
    """One operator instance on the primary: live RocksDB state, its store, and a model."""

    def __init__(self, root: Path, instance: int, vnodes: int = 8) -> None:
        self.instance = instance
        self.store_dir = root / f"primary-{instance}"
        self.store = rhino.ReplicaStore(str(self.store_dir))
        self.db = rhino.StateBackend.open(str(root / f"live-{instance}"), operator_id=OP, instance=instance,
                                          partitioner=rhino.Partitioner(num_vnodes=vnodes))
        self.model: dict[int, bytes] = {}
        self.rng = np.random.default_rng(instance)

    def write(self, keys: np.ndarray, value_bytes: int, version: int) -> None:
        values = [self.rng.bytes(value_bytes) for _ in range(len(keys))]
        self.db.put_batch(keys.astype(np.int64), values, version=version)
        self.model.update(zip(keys.tolist(), values))
        self.db.flush()

    def checkpoint(self, cid: int) -> rhino.Manifest:
        return self.db.checkpoint(self.store, cid)

    def replicate(self, cid: int, chain: list[WorkerProcess], version: int, **kw):
        kw.setdefault("chunk_bytes", CHUNK)
        kw.setdefault("window", WINDOW)
        kw.setdefault("timeout", 30.0)
        kw.setdefault("peer_timeout", 1.5)
        return rhino.replicate(self.store, OP, self.instance, cid, [w.address for w in chain],
                               chain_version=version, secret=SECRET, **kw)


def unique_bytes(files) -> int:
    seen, n = set(), 0
    for f in files:
        if f.identity not in seen:
            seen.add(f.identity)
            n += f.size
    return n


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return xxhash.xxh3_128(f.read()).hexdigest()


def missing_identities(w: WorkerProcess, m: rhino.Manifest) -> set[str]:
    return {f.identity for f in m.files if not (w.dir / "pool" / f.identity).exists()}


def staging_dirs(w: WorkerProcess) -> list[str]:
    tmp = w.dir / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def wait_until(pred, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---- the happy path: 3 processes, 3 addresses -------------------------------------


@pytest.fixture(scope="module")
def primary0(root):
    p = Primary(root, 0)
    p.write(np.arange(30_000), 200, version=1)
    yield p
    p.db.close()


def test_chain_replicates_a_checkpoint_to_three_worker_processes(cluster, primary0, root):
    chain = [cluster[2], cluster[3], cluster[4]]
    m = primary0.checkpoint(1)
    h = primary0.replicate(1, chain, version=1)
    max_in_flight = 0
    while not h.done:  # §4 step 3: never more chunks in flight than credits granted
        max_in_flight = max(max_in_flight, h.progress()["in_flight_credits"])
        time.sleep(0.001)
    r = h.wait()
    assert max_in_flight <= WINDOW
    n_files = len({f.identity for f in m.files})
    assert r["member_needed_files"] == [n_files] * 3
    assert r["bytes_sent"] == unique_bytes(m.files) == r["member_needed_bytes"][0] > 1_000_000
    assert h.progress()["state"] == "complete"

    for w in chain:
        replica = rhino.ReplicaStore(str(w.dir))
        assert replica.checkpoints(OP, 0) == [1]
        rm = replica.manifest(OP, 0, 1)
        assert [(f.name, f.identity) for f in rm.files] == [(f.name, f.identity) for f in m.files]
        for f in m.files:
            mine, theirs = primary0.store.pool_path(f.identity), replica.pool_path(f.identity)
            # byte-identical, and a different inode: the bytes crossed the socket
            assert file_digest(theirs) == file_digest(mine) == f.checksum
            assert os.stat(theirs).st_ino != os.stat(mine).st_ino
        assert replica.verify(full=True).ok
        assert staging_dirs(w) == []
        assert rhino.query_store(w.address, secret=SECRET, operator_id=OP, instance=0) == [1]

    # A hard-link restore from the tail's store is the primary's exact state.
    tail = rhino.ReplicaStore(str(cluster[4].dir))
    stats = tail.restore_files(OP, 0, 1, str(root / "restored-from-w4"))
    assert stats.linked_files > 0 and stats.fell_back_to_copy is False
    ours = primary0.store.restore_files(OP, 0, 1, str(root / "restored-from-primary"))
    assert ours.files == stats.files
    from_replica = read_rocksdb(root / "restored-from-w4")
    assert from_replica == read_rocksdb(root / "restored-from-primary")
    values = {}
    for cf, kv in from_replica.items():
        if cf != "default":
            values.update(kv)
    assert values == {k.to_bytes(8, "little", signed=True): v for k, v in primary0.model.items()}

    with tail.restore(OP, 0, 1, str(root / "opened-from-w4")) as db:
        keys = np.arange(0, 30_000, 997, dtype=np.int64)
        assert db.get_batch(keys) == [primary0.model[k] for k in keys.tolist()]
        assert db.version == 1

    # Prometheus metrics of each member agree with what moved.
    for w in chain:
        assert w.metric("rhino_worker_checkpoints_total", 'state="complete"') == 1
        assert w.metric("rhino_worker_bytes_written_total") == r["bytes_sent"]
        assert w.metric("rhino_replica_last_committed_checkpoint", f'operator="{OP}",instance="0"') == 1
        assert w.metric("rhino_replica_lag_checkpoints", f'operator="{OP}",instance="0"') == 0
        assert w.metric("rhino_worker_active_streams") == 0
    assert cluster[2].metric("rhino_worker_bytes_sent_total") == r["bytes_sent"]  # forwarded to w3
    assert cluster[4].metric("rhino_worker_bytes_sent_total") == 0  # the tail forwards nothing


def test_incremental_checkpoint_sends_only_the_delta(cluster, primary0):
    chain = [cluster[2], cluster[3], cluster[4]]
    before = cluster[4].metric("rhino_worker_bytes_received_total")
    primary0.write(np.arange(30_000, 31_000), 200, version=2)  # new keys: new SSTs
    m2 = primary0.checkpoint(2)
    assert 0 < m2.delta_bytes < m2.total_bytes / 4
    r = primary0.replicate(2, chain, version=1).wait()
    assert r["bytes_sent"] == m2.delta_bytes
    assert r["member_needed_bytes"] == [m2.delta_bytes] * 3
    assert cluster[4].metric("rhino_worker_bytes_received_total") - before == m2.delta_bytes
    for w in chain:
        assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 0) == [1, 2]


def test_replacement_member_gets_a_bulk_copy_from_its_predecessor(cluster, primary0):
    # w3 is replaced by an empty w5 (a repaired chain, higher version): the
    # primary sends nothing, w2 reads the files from its own pool (§4 step 1).
    m2 = primary0.store.manifest(OP, 0, 2)
    r = primary0.replicate(2, [cluster[2], cluster[5], cluster[4]], version=2).wait()
    assert r["bytes_sent"] == 0
    assert r["member_needed_files"] == [0, len({f.identity for f in m2.files}), 0]
    w5 = rhino.ReplicaStore(str(cluster[5].dir))
    assert w5.checkpoints(OP, 0) == [2]
    assert w5.verify(full=True).ok


# ---- security ----------------------------------------------------------------------


def test_wrong_secret_is_rejected(cluster, primary0):
    w = cluster[2]
    with pytest.raises(rhino.AuthFailedError):
        rhino.query_store(w.address, secret=b"not the secret", operator_id=OP, instance=0)
    h = rhino.replicate(primary0.store, OP, 0, 1, [w.address], chain_version=9, secret=b"wrong")
    with pytest.raises(rhino.AuthFailedError):
        h.wait(10)
    # A client that ignores the server's proof and answers with a bad mac is refused by the server.
    before = w.metric("rhino_worker_auth_failures_total")
    with wire.RawClient(w.address) as c:
        h_, p = c.handshake(b"wrong secret")
        assert c.server_authentic is False
        assert h_["type"] == "ErrorRsp" and wire.decode_status(p)[0] == wire.AUTH_FAILED
        assert c.closed_by_peer()
    assert w.metric("rhino_worker_auth_failures_total") == before + 1
    # Nothing but the handshake is accepted before it completes.
    with wire.RawClient(w.address) as c:
        c.send(wire.frame("StoreQueryReq", wire.Enc().bytes_(OP).u32(0).done(), stream_id=1))
        h_, p = c.recv()
        assert h_["type"] == "ErrorRsp" and "before authentication" in wire.decode_status(p)[1]
        assert c.closed_by_peer()


@pytest.mark.parametrize(
    "bad_frame, why",
    [
        (wire.frame("ChunkReq", b"", stream_id=1, length=0x7FFFFFFF), "exceeds max_frame_bytes"),
        (wire.frame("HeartbeatReq", wire.Enc().u64(1).done(), header_checksum=0x1234), "header checksum"),
        (wire.frame("HeartbeatReq", wire.Enc().u64(1).done(), payload_checksum=0x1234), "payload checksum"),
        (wire.frame(42, b""), "unknown message type"),
        (wire.frame("HeartbeatReq", b"\1\2"), "runs past the end"),
        (wire.frame("OpenStreamReq", b"\xff" * 40, stream_id=3), "invalid OpenStreamReq"),
    ],
)
def test_invalid_frames_get_an_error_and_a_closed_connection_not_a_crash(cluster, bad_frame, why):
    w = cluster[3]
    before = w.metric("rhino_worker_rejected_frames_total")
    with wire.RawClient(w.address) as c:
        h, p = c.handshake(SECRET)
        assert h["type"] == "AuthRsp" and c.server_authentic
        c.send(bad_frame)
        h, p = c.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp"
        code, msg = wire.decode_status(p)
        assert code == wire.CORRUPTION and why in msg
        assert c.closed_by_peer()
    assert w.alive()
    assert w.metric("rhino_worker_rejected_frames_total") == before + 1
    assert rhino.query_store(w.address, secret=SECRET, operator_id=OP, instance=0) == [1, 2]


@pytest.mark.parametrize("name", ["..", "../../escaped.sst", "/tmp/rhino-escaped.sst", "sub/dir.sst", "x\0y"])
def test_path_traversal_names_are_refused_and_nothing_is_written(cluster, root, name):
    w = cluster[4]
    content = b"evil" * 100
    m = wire.manifest_bytes(OP, 11, 1, [("000001.sst", b"fine"), (name, content)])
    before = set(os.listdir(root))
    with wire.RawClient(w.address) as c:
        c.handshake(SECRET)
        c.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 11, 1, m), stream_id=1, chain_version=1))
        h, p = c.recv_skipping_heartbeats()
        assert h["type"] == "OpenStreamRsp"
        code, msg = wire.decode_status(p)
        assert code == wire.PATH_OUTSIDE_STORE and "plain file name" in msg
        # the refused stream takes no chunk
        c.send(wire.frame("ChunkReq", wire.chunk_req(1, 0, content), stream_id=1, chain_version=1))
        c.send(wire.frame("HeartbeatReq", wire.Enc().u64(7).done()))
        while True:  # the next answer is our heartbeat's, not a reaction to the chunk
            h, p = c.recv()
            if h["type"] == "HeartbeatReq":
                continue
            assert h["type"] == "HeartbeatRsp" and wire.Dec(p).u64() == 7
            break
    with pytest.raises(rhino.PathOutsideStoreError):
        rhino.query_store(w.address, secret=SECRET, operator_id="../" + OP, instance=0)
    assert not Path("/tmp/rhino-escaped.sst").exists()
    assert set(os.listdir(root)) == before
    assert not (w.dir.parent / "escaped.sst").exists() and not (w.dir / "escaped.sst").exists()
    assert staging_dirs(w) == []
    assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 11) == []


def test_protocol_violations_abort_only_their_stream(cluster):
    w = cluster[4]
    data = b"0123456789" * 1000
    m = wire.manifest_bytes(OP, 12, 1, [("000001.sst", data)])
    with wire.RawClient(w.address) as c:
        c.handshake(SECRET)
        c.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 12, 1, m, chunk_bytes=4096, window=2),
                          stream_id=1, chain_version=1))
        h, p = c.recv_skipping_heartbeats()
        d = wire.Dec(p)
        assert h["type"] == "OpenStreamRsp" and d.u32() == 0
        d.bytes_()
        assert d.u32s() == [0] and d.u32() == 2
        c.send(wire.frame("ChunkReq", wire.chunk_req(0, 0, data[:4096]), stream_id=1, chain_version=1))
        h, p = c.recv_skipping_heartbeats()
        assert h["type"] == "CreditRsp"  # on disk, nothing to forward: the credit comes back
        wait_until(lambda: len(staging_dirs(w)) == 1, what="staging")
        c.send(wire.frame("ChunkReq", wire.chunk_req(0, 9999, data[:10]), stream_id=1, chain_version=1))
        h, p = c.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp" and "offset" in wire.decode_status(p)[1]
        # the connection survives: other streams may share it
        c.send(wire.frame("StoreQueryReq", wire.Enc().bytes_(OP).u32(12).done(), stream_id=2))
        h, p = c.recv_skipping_heartbeats()
        assert h["type"] == "StoreQueryRsp"
    wait_until(lambda: staging_dirs(w) == [], what="partial data to be discarded")
    assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 12) == []


def test_a_corrupted_chunk_fails_the_xxh3_check_and_commits_nothing(cluster):
    w = cluster[3]
    data = b"A" * 5000
    m = wire.manifest_bytes(OP, 13, 1, [("000001.sst", data)])
    with wire.RawClient(w.address) as c:
        c.handshake(SECRET)
        c.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 13, 1, m), stream_id=1, chain_version=1))
        h, _ = c.recv_skipping_heartbeats()
        assert h["type"] == "OpenStreamRsp"
        c.send(wire.frame("ChunkReq", wire.chunk_req(0, 0, b"B" * 5000), stream_id=1, chain_version=1))
        kinds = []
        while True:
            h, p = c.recv_skipping_heartbeats()
            kinds.append(h["type"])
            if h["type"] == "ErrorRsp":
                code, msg = wire.decode_status(p)
                assert code == wire.CORRUPTION and "XXH3-128" in msg
                break
    wait_until(lambda: staging_dirs(w) == [], what="staging cleanup")
    assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 13) == []


def test_a_large_chunk_trickled_in_pieces_arrives_whole_and_small_frames_after_it_are_not_held_back(cluster):
    """A payload over 4 KiB is read with the socket's low-water mark at the part still due
    (docs/protocol.md): bytes that come slowly must still all arrive, and the mark must not
    outlive the payload, or the next small frame would wait for bytes that never come."""
    w = cluster[3]
    data = os.urandom((300 << 10) + 1000)  # one chunk, over the mark's 256 KiB cap
    m = wire.manifest_bytes(OP, 21, 1, [("000001.sst", data)])
    with wire.RawClient(w.address) as c:
        c.handshake(SECRET)
        c.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 21, 1, m, chunk_bytes=512 << 10, window=2),
                          stream_id=1, chain_version=1))
        h, _ = c.recv_skipping_heartbeats()
        assert h["type"] == "OpenStreamRsp"
        f = wire.frame("ChunkReq", wire.chunk_req(0, 0, data), stream_id=1, chain_version=1)
        for i in range(0, len(f), 16 << 10):
            c.send(f[i:i + (16 << 10)])
            time.sleep(0.003)
        h, _ = c.recv_skipping_heartbeats()
        assert h["type"] == "CreditRsp"
        t0 = time.monotonic()
        c.send(wire.frame("StoreQueryReq", wire.Enc().bytes_(OP).u32(21).done(), stream_id=2))
        h, _ = c.recv_skipping_heartbeats()  # the client's socket times out after 5 s
        assert h["type"] == "StoreQueryRsp" and time.monotonic() - t0 < 2.0
        c.send(wire.frame("CommitReq", b"", stream_id=1, chain_version=1))
        h, p = c.recv_skipping_heartbeats()
        assert h["type"] == "CommitRsp", (h["type"], p)
    store = rhino.ReplicaStore(str(w.dir))
    assert store.checkpoints(OP, 21) == [1]
    (pooled,) = store.manifest(OP, 21, 1).files
    assert (w.dir / "pool" / pooled.identity).read_bytes() == data


# ---- fencing ------------------------------------------------------------------------


def test_stale_chain_version_is_rejected(cluster, root):
    p = Primary(root, 7)
    try:
        p.write(np.arange(2000), 50, version=1)
        p.checkpoint(1)
        chain = [cluster[2], cluster[3]]
        p.replicate(1, chain, version=5).wait()
        p.write(np.arange(2000, 3000), 50, version=2)
        p.checkpoint(2)
        before = cluster[2].metric("rhino_worker_stale_rejections_total")
        with pytest.raises(rhino.StaleChainVersionError, match="stale"):
            p.replicate(2, chain, version=4).wait()
        assert cluster[2].metric("rhino_worker_stale_rejections_total") == before + 1
        for w in chain:
            assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 7) == [1]
        # the fence is durable: it survives in the store
        assert (cluster[2].dir / "fences" / OP / "7").read_text().strip() == "5"
        # a member fenced further down the chain also fails the whole stream
        p.replicate(2, [cluster[4]], version=6).wait()
        with pytest.raises(rhino.StaleChainVersionError):
            p.replicate(2, [cluster[2], cluster[4]], version=5).wait()
        assert rhino.ReplicaStore(str(cluster[2].dir)).checkpoints(OP, 7) == [1]
        assert p.replicate(2, [cluster[2], cluster[4]], version=6).wait()["checkpoint_id"] == 2
    finally:
        p.db.close()


# ---- failures -------------------------------------------------------------------------


def test_member_killed_mid_transfer_aborts_cleanly_and_a_repaired_chain_completes(cluster, root):
    secret_file = root / "secret"
    # w6 kills itself (SIGKILL) right after writing its first chunk to staging.
    w6 = WorkerProcess(root, "w6", "127.0.0.6", **QUICK_PEERS, secret_file=secret_file,
                       env={"RHINO_CRASH_POINT": "replica.after_chunk_write"}).start()
    p = Primary(root, 3)
    try:
        p.write(np.arange(20_000), 100, version=1)
        m = p.checkpoint(1)
        t0 = time.monotonic()
        with pytest.raises((rhino.PeerDeadError, rhino.AbortedError)) as e:
            p.replicate(1, [cluster[2], w6, cluster[4]], version=1).wait()
        assert time.monotonic() - t0 < 10
        assert "w2" in str(e.value) or "w6" in str(e.value) or "127.0.0.6" in str(e.value)
        w6.proc.wait(timeout=10)
        assert w6.proc.returncode == -signal.SIGKILL
        # no partial checkpoint anywhere; partial data discarded
        for w in (cluster[2], cluster[4]):
            wait_until(lambda: staging_dirs(w) == [], what=f"{w.id} staging cleanup")
            assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 3) == []
        assert len(staging_dirs(w6)) == 1  # the dead process's leftovers
        # retry on a repaired chain with a higher chain version
        repaired = [cluster[2], cluster[5], cluster[4]]
        lacking = [len(missing_identities(w, m)) for w in repaired]  # other instances may share a few files
        r = p.replicate(1, repaired, version=2).wait()
        assert r["member_needed_files"] == lacking and lacking[0] > 0
        for w in (cluster[2], cluster[5], cluster[4]):
            assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 3) == [1]
        # the restarted worker cleans its staging and verifies clean
        w6.env = {}
        w6.start()
        assert staging_dirs(w6) == []
        report = rhino.ReplicaStore(str(w6.dir)).verify(full=True)
        assert report.ok and report.checkpoints == 0
        assert any(e.get("event") == "store_verified" for e in w6.events())
        # and, being fenced at version 1 only, it can join version 2 of the chain
        p.replicate(1, [cluster[2], w6], version=2).wait()
        assert rhino.ReplicaStore(str(w6.dir)).checkpoints(OP, 3) == [1]
    finally:
        p.db.close()
        if w6.alive():
            assert w6.stop() == 0


def test_replication_times_out_when_the_chain_does_not_ack(cluster, root):
    # A member that accepts connections but never answers: the primary gives up
    # at its timeout and does not mark the checkpoint complete.
    import socket

    p = Primary(root, 4)
    silent = socket.socket()
    silent.bind(("127.0.0.8", 0))
    silent.listen()
    try:
        p.write(np.arange(100), 10, version=1)
        p.checkpoint(1)
        t0 = time.monotonic()
        with pytest.raises(rhino.RhinoTimeoutError):
            rhino.replicate(p.store, OP, 4, 1, [f"127.0.0.8:{silent.getsockname()[1]}"], chain_version=1,
                            secret=SECRET, timeout=1.0, peer_timeout=5.0).wait()
        assert 0.9 < time.monotonic() - t0 < 5
        # an unreachable successor is reported by the member, by address
        closed = socket.socket()
        closed.bind(("127.0.0.9", 0))
        ghost = f"127.0.0.9:{closed.getsockname()[1]}"
        closed.close()
        with pytest.raises(rhino.PeerDeadError, match="127.0.0.9"):
            rhino.replicate(p.store, OP, 4, 1, [cluster[2].address, ghost], chain_version=1, secret=SECRET).wait()
    finally:
        silent.close()
        p.db.close()


def test_disk_full_on_a_replica_fails_the_chain_and_spares_complete_checkpoints(cluster, root):
    limit = 256 << 10

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    wf = WorkerProcess(root, "wfull", "127.0.0.10", **QUICK_PEERS, secret_file=root / "secret",
                       preexec_fn=small_files, metrics=False).start()
    p = Primary(root, 5, vnodes=2)
    try:
        p.write(np.arange(200), 100, version=1)
        m1 = p.checkpoint(1)
        assert max(f.size for f in m1.files) < limit
        p.replicate(1, [cluster[2], wf], version=1).wait()
        p.write(np.arange(200, 5200), 300, version=2)  # SSTs of ~750 KB each: over the limit
        m2 = p.checkpoint(2)
        assert max(f.size for f in m2.files) > limit
        with pytest.raises(rhino.NoSpaceError, match="wfull") as e:
            p.replicate(2, [cluster[2], wf], version=1).wait()
        assert "File too large" in str(e.value) or "No space" in str(e.value)
        assert wf.alive()  # SIGXFSZ is ignored: EFBIG, not a killed worker
        for w in (cluster[2], wf):
            wait_until(lambda: staging_dirs(w) == [], what="staging cleanup")
            store = rhino.ReplicaStore(str(w.dir))
            assert store.checkpoints(OP, 5) == [1]  # the earlier checkpoint is intact...
            assert store.verify(operator_id=OP, instance=5, full=True).ok
        assert p.store.verify(full=True).ok  # ...and so is the primary
        assert p.store.checkpoints(OP, 5) == [1, 2]
    finally:
        p.db.close()
        wf.stop()


def test_a_failed_fsync_on_a_replica_fails_the_chain_and_commits_nothing(cluster, root):
    """Members fsync received files on a background thread while the stream goes on (file_syncer.h);
    an fsync that fails there must still stop the commit, with a clear error and no crash."""
    wb = WorkerProcess(root, "wfsync", "127.0.0.14", **QUICK_PEERS, secret_file=root / "secret", metrics=False,
                       env={"RHINO_FAULT_POINT": "replica.file_fsync_fails"}).start()
    p = Primary(root, 18)  # an instance no other test of this module uses
    try:
        p.write(np.arange(3000), 100, version=1)
        p.checkpoint(1)
        for chain in ([cluster[2], wb], [wb, cluster[2]]):  # the tail, then the middle member
            with pytest.raises(rhino.RhinoIOError, match="fsync") as e:
                p.replicate(1, chain, version=1).wait()
            assert "wfsync" in str(e.value)
            assert wb.alive()
            for w in (cluster[2], wb):
                wait_until(lambda: staging_dirs(w) == [], what=f"{w.id} staging cleanup")
                assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 18) == []
        # a repaired chain completes, and what it holds verifies
        p.replicate(1, [cluster[2], cluster[4]], version=2).wait()
        for w in (cluster[2], cluster[4]):
            store = rhino.ReplicaStore(str(w.dir))
            assert store.checkpoints(OP, 18) == [1]
            assert store.verify(operator_id=OP, instance=18, full=True).ok
    finally:
        p.db.close()
        wb.stop()


# ---- lifecycle -------------------------------------------------------------------------


def test_sigterm_shuts_down_cleanly_and_sigkill_restart_verifies_clean(cluster):
    w = cluster[4]
    assert w.stop() == 0
    events = [e["event"] for e in w.events()]
    assert "stopping" in events and events[-1] == "stopped"
    w.start()
    w.kill(signal.SIGKILL)
    w.start()
    assert rhino.ReplicaStore(str(w.dir)).verify(full=True).ok
    assert rhino.query_store(w.address, secret=SECRET, operator_id=OP, instance=0) == [1, 2]


def _thread_nice_values(pid: int) -> set[int]:
    """Every thread's nice value, from /proc (field 19 of stat; the comm field may hold spaces)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            out.add(int(f.read().rsplit(")", 1)[1].split()[16]))
    return out


def _autogroup_nice(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None  # kernel without autogroup scheduling


def test_worker_nice_lowers_every_thread_and_its_autogroup(cluster, root):
    """By default a worker keeps the priority it was started with; --nice N lowers every thread (they are
    all started after it) and, since the daemon is its own session, its autogroup."""
    w = cluster[2]
    parent_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert _thread_nice_values(w.proc.pid) == {parent_nice}

    low = WorkerProcess(root, "w9", "127.0.0.9", **QUICK_PEERS, secret_file=w.secret_file,
                        extra_args=["--nice", "13"]).start()
    try:
        assert len(os.listdir(f"/proc/{low.proc.pid}/task")) > 2  # the C++ runtime's threads are there
        assert _thread_nice_values(low.proc.pid) == {max(13, parent_nice)}
        if _autogroup_nice(os.getpid()) is not None:
            assert _autogroup_nice(low.proc.pid) == 13
        prio = [e for e in low.events() if e.get("event") == "priority"]
        assert prio and prio[-1]["nice"] == max(13, parent_nice)
        # and it still serves: a store query answers
        assert rhino.query_store(low.address, secret=SECRET, operator_id=OP, instance=0) == []
    finally:
        assert low.stop() == 0


def _thread_policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_worker_threads_run_under_sched_batch_by_default_and_sched_normal_restores_the_normal_policy(cluster, root):
    """Every thread of a default worker is SCHED_BATCH (its wake-ups never preempt an executor's thread);
    --sched normal leaves them all under SCHED_OTHER. Both are logged, and both serve."""
    w = cluster[2]
    assert len(os.listdir(f"/proc/{w.proc.pid}/task")) > 2  # the C++ runtime's threads are there
    assert _thread_policies(w.proc.pid) == {os.SCHED_BATCH}
    assert [e for e in w.events() if e.get("event") == "priority"][-1]["sched"] == "batch"

    normal = WorkerProcess(root, "w15", "127.0.0.15", **QUICK_PEERS, secret_file=w.secret_file,
                           extra_args=["--sched", "normal"]).start()
    try:
        assert len(os.listdir(f"/proc/{normal.proc.pid}/task")) > 2
        assert _thread_policies(normal.proc.pid) == {os.SCHED_OTHER}
        assert [e for e in normal.events() if e.get("event") == "priority"][-1]["sched"] == "normal"
        assert rhino.query_store(normal.address, secret=SECRET, operator_id=OP, instance=0) == []
    finally:
        assert normal.stop() == 0


def test_a_stream_whose_peer_goes_quiet_is_aborted_after_the_idle_timeout(cluster, root):
    # The connection stays alive (heartbeats are answered), but the stream
    # gets no frame: the worker must not keep its staging forever.
    w = WorkerProcess(root, "widle", "127.0.0.12", **QUICK_PEERS, secret_file=root / "secret", metrics=False,
                      extra_args=["--stream-idle-timeout-ms", "800"]).start()
    try:
        m = wire.manifest_bytes(OP, 14, 1, [("000001.sst", b"x" * 10_000)])
        with wire.RawClient(w.address) as c:
            c.handshake(SECRET)
            c.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 14, 1, m, chunk_bytes=4096),
                              stream_id=1, chain_version=1))
            h, _ = c.recv_skipping_heartbeats()
            assert h["type"] == "OpenStreamRsp"
            c.send(wire.frame("ChunkReq", wire.chunk_req(0, 0, b"x" * 4096), stream_id=1, chain_version=1))
            t0 = time.monotonic()
            while True:
                h, p = c.recv_skipping_heartbeats()
                if h["type"] == "ErrorRsp":
                    break
            code, msg = wire.decode_status(p)
            assert code == wire.TIMEOUT and "no frame" in msg
            assert 0.5 < time.monotonic() - t0 < 5
        wait_until(lambda: staging_dirs(w) == [], what="staging cleanup")
    finally:
        assert w.stop() == 0


# ---- flow control --------------------------------------------------------------------


class StingyTail:
    """A hand-written chain tail (this test's own protocol code) that grants 2
    credits and never returns one: the chain must stall, not buffer."""

    CREDITS = 2

    def __init__(self, host: str) -> None:
        import socket
        import threading

        self.srv = socket.socket()
        self.srv.bind((host, 0))
        self.srv.listen()
        self.address = f"{host}:{self.srv.getsockname()[1]}"
        self.chunks = 0
        self.aborted = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import hashlib
        import hmac
        import json

        conn, _ = self.srv.accept()
        c = wire.RawClient.__new__(wire.RawClient)
        c.sock = conn
        conn.settimeout(0.2)
        try:
            h, p = self._recv(c)
            d = wire.Dec(p)
            d.u32(), d.bytes_()
            cn, sn = d.bytes_(), os.urandom(16)
            key = SECRET
            if d.remaining():  # the role the client names (docs/protocol.md §2, "Roles"): its key from the root
                role, scope = d.bytes_(), d.bytes_()
                key = hmac.new(SECRET, b"rhino-credential\0" + role + b"\0" + scope, hashlib.sha256).digest()
            mac = hmac.new(key, b"rhino-server" + cn + sn, hashlib.sha256).digest()
            c.send(wire.frame("HelloRsp", wire.Enc().bytes_(b"stingy").bytes_(sn).bytes_(mac).done()))
            self._recv(c)  # AuthReq: trusted, this is a test double
            c.send(wire.frame("AuthRsp", wire.Enc().u8(1).done()))
            h, p = self._recv(c)
            assert h["type"] == "OpenStreamReq"
            d = wire.Dec(p)
            d.bytes_(), d.u32(), d.u64(), d.u32(), d.u32()
            n_down = d.u32()
            for _ in range(n_down):
                d.bytes_()
            body = d.bytes_().split(b"\n")[0]
            files = json.loads(body)["files"]
            seen, needed = set(), []
            for i, f in enumerate(files):
                if f["identity"] not in seen:
                    seen.add(f["identity"])
                    needed.append(i)
            rsp = (wire.Enc().u32(0).bytes_(b"").u32s(needed).u32(self.CREDITS).u32s([len(needed)])
                   .u64s([sum(files[i]["size"] for i in needed)]).done())
            c.send(wire.frame("OpenStreamRsp", rsp, stream_id=h["stream_id"], chain_version=h["chain_version"]))
            while not self.aborted.is_set():
                h, p = self._recv(c)
                if h["type"] == "ChunkReq":
                    self.chunks += 1  # ...and no CreditRsp, ever
                elif h["type"] == "AbortReq":
                    self.aborted.set()
        except (OSError, AssertionError):
            pass
        finally:
            conn.close()

    def _recv(self, c: wire.RawClient) -> tuple[dict, bytes]:
        import socket

        while True:
            try:
                h, p = c.recv()
            except socket.timeout:
                c.send(wire.frame("HeartbeatReq", wire.Enc().u64(0).done()))  # stay alive while stalled
                continue
            if h["type"] == "HeartbeatReq":
                c.send(wire.frame("HeartbeatRsp", p))
                continue
            if h["type"] != "HeartbeatRsp":
                return h, p

    def close(self) -> None:
        self.srv.close()


def test_credits_bound_memory_and_back_pressure_reaches_the_primary(cluster, root):
    p = Primary(root, 6)
    tail = StingyTail("127.0.0.11")
    try:
        p.write(np.arange(40_000), 100, version=1)
        m = p.checkpoint(1)
        assert m.total_bytes > 5 * (2 * WINDOW + StingyTail.CREDITS) * CHUNK
        h = rhino.replicate(p.store, OP, 6, 1, [cluster[2].address, cluster[3].address, tail.address],
                            chain_version=1, secret=SECRET, chunk_bytes=CHUNK, window=WINDOW, timeout=30.0)
        # The chain fills its buffers, then stalls: each hop holds at most WINDOW chunks.
        wait_until(lambda: tail.chunks == StingyTail.CREDITS, what="the tail's two chunks")
        time.sleep(2.0)  # longer than peer_timeout: heartbeats keep the stalled chain alive
        stalled = h.progress()
        time.sleep(0.5)
        assert h.progress()["bytes_sent"] == stalled["bytes_sent"], "the primary kept sending without credit"
        assert stalled["state"] == "transferring" and stalled["credits"] == 0
        assert stalled["in_flight_credits"] == WINDOW
        assert stalled["bytes_sent"] <= (2 * WINDOW + StingyTail.CREDITS) * CHUNK
        assert tail.chunks == StingyTail.CREDITS
        for w in (cluster[2], cluster[3]):
            assert w.metric("rhino_worker_in_flight_credits") == WINDOW  # buffers held: the window, no more
            assert w.metric("rhino_worker_active_streams") == 1
        # Cancelling aborts down the chain; staged data is discarded everywhere.
        h.cancel()
        with pytest.raises(rhino.AbortedError, match="cancelled"):
            h.wait(10)
        assert tail.aborted.wait(10)
        for w in (cluster[2], cluster[3]):
            wait_until(lambda: staging_dirs(w) == [], what=f"{w.id} staging cleanup")
            assert w.metric("rhino_worker_in_flight_credits") == 0
            assert w.metric("rhino_worker_active_streams") == 0
            assert rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 6) == []
    finally:
        tail.close()
        p.db.close()


def test_reused_chunk_buffers_are_bounded_once_a_wide_window_drains(cluster, root):
    """A member that held 48 chunks of 1 MiB (a wide window, stalled by a stingy
    tail) keeps at most 32 MiB of their buffers for reuse once the stream ends
    (src/cpp/util/buffer_pool.h), and exports that as a gauge."""
    window, chunk = 48, 1 << 20
    wide = WorkerProcess(root, "wwide", "127.0.0.12", **QUICK_PEERS, secret_file=root / "secret",
                         extra_args=["--max-window", str(window)]).start()
    p = Primary(root, 17)  # an instance no other test of this module uses (the root is shared)
    tail = StingyTail("127.0.0.13")
    try:
        p.write(np.arange(12_000), 8_000, version=1)  # about 96 MB of incompressible values
        m = p.checkpoint(1)
        assert m.total_bytes > (window + 8) * chunk
        h = rhino.replicate(p.store, OP, 17, 1, [wide.address, tail.address], chain_version=1, secret=SECRET,
                            chunk_bytes=chunk, window=window, timeout=60.0)
        wait_until(lambda: wide.metric("rhino_worker_in_flight_credits") == window, what="a full window held")
        h.cancel()
        with pytest.raises(rhino.AbortedError):
            h.wait(10)
        wait_until(lambda: wide.metric("rhino_worker_in_flight_credits") == 0, what="the window released")
        cached = wide.metric("rhino_worker_buffer_pool_cached_bytes")
        assert 16 * chunk <= cached <= 32 << 20, cached
    finally:
        tail.close()
        p.db.close()
        wide.stop()
