"""Bounds on what a peer can make a worker spend (issue 46).

Before authentication a peer is anybody, so a listener reads at most
kMaxHandshakeFrameBytes (1 KiB) of a frame from it (docs/protocol.md §2):

- A frame header announcing more, before the handshake, is answered with an ErrorRsp
  (Corruption, "over the pre-auth limit of 1024 bytes") and the connection is closed; the
  worker logs it.
- A flood of 2,000 unauthenticated connections, each sending a header that announces a
  4 MiB payload (within max_frame_bytes), leaves the worker's RSS within 64 MiB of where it
  was: 2,000 x 4 MiB would be 8 GiB if each got its buffer. A real session is served after.

An instance has at most 65536 vnodes (column families; docs/protocol.md §7.1 `open`):
more is InvalidArgument naming the limit, and the worker serves on. The coordinator's
create_operator refuses num_vnodes outside [1, 65536] before it places anything.

Each listener bounds its connections (docs/protocol.md §2, "Connection limits"), tried on a
worker (127.0.0.185) with small caps, flooded from 127.0.0.186-188 while the legitimate
client connects from 127.0.0.1:

- a flood of silent handshakes from one address: that address keeps
  max_unauthenticated_per_peer of them, every other one is refused with an ErrorRsp
  (ResourceExhausted, naming the bound) and closed, the worker logs it and its RSS stays
  within 32 MiB; a new TCP client, a connection opened before, and the Unix socket are
  served during the flood and after it;
- handshakes from more addresses fill max_unauthenticated_connections: then a new TCP
  client's connect fails with rhino.ResourceExhaustedError naming it, while the connection
  opened before and the Unix socket serve on, and TCP serves again once the flood goes;
- authenticated connections: one address holds at most max_connections_per_peer, the
  listener at most max_connections, each refusal named; the rest serve on.

The coordinator's listener (_core.CoordServer) refuses the same way, counted in its metrics.

What a worker queues for one peer is bounded (docs/protocol.md §2, --max-outbound-bytes): a
raw client that pipelines 120 GetReqs of 1 MiB answers and reads none is not read past the
bound (plus the 16 requests a connection may have in progress), the worker's RSS stays within
64 MiB of where it was, the pause is counted and logged, another connection is served, and the
client, once it reads, gets all 120 answers; with no bound (0) the worker queues them all.

The frames are built by tests/dataplane_wire.py, written from the document.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import selectors
import socket
import time

import numpy as np
import pytest

import rhino
from dataplane_wire import CORRUPTION, HEADER, Dec, Enc, RawClient, checksum, decode_status, frame, parse_header
from rhino import _core
from rhino.coordinator.client import LocalCoordinatorClient
from rhino.coordinator.coordinator import Coordinator
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

OP = "preauth"
FLOOD = 2000
ANNOUNCED = 4 << 20
RSS_BOUND_KIB = 64 << 10

# The capped worker and the addresses its floods come from (tests/test_test_hosts.py).
HOSTS = (185, 186, 187, 188, 189)
CAPPED_HOST, FLOOD_A, FLOOD_B, FLOOD_C, COORD_HOST = (f"127.0.0.{n}" for n in HOSTS)
MAX_CONNECTIONS, MAX_UNAUTH, MAX_PER_PEER, MAX_UNAUTH_PER_PEER = 40, 16, 24, 8
CAPS = ["--max-connections", str(MAX_CONNECTIONS), "--max-unauthenticated-connections", str(MAX_UNAUTH),
        "--max-connections-per-peer", str(MAX_PER_PEER), "--max-unauthenticated-per-peer", str(MAX_UNAUTH_PER_PEER)]
RESOURCE_EXHAUSTED = next(n for n, name, _ in _core.status_codes() if name == "ResourceExhausted")
CONN_FLOOD = 1000
CONN_RSS_BOUND_KIB = 32 << 10


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("preauth")
    w = WorkerProcess(root, "w1", "127.0.0.2", secret_file=write_secret(root, SECRET), metrics=False).start()
    with rhino.connect(w.unix_socket, secret=SECRET) as c:
        c.open_instance(OP, 0, epoch=1, num_vnodes=4)
        with c.session(OP, 0, batch=0, epoch=1) as s:
            s.put_batch(np.arange(10, dtype=np.int64), [b"v%d" % i for i in range(10)])
            s.commit()
    yield w
    assert w.alive(), "the worker died"
    w.stop()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _served(w: WorkerProcess) -> None:
    with rhino.connect(w.address, secret=SECRET) as c, c.session(OP, 0, batch=1, epoch=1) as s:
        assert s.get_batch(np.arange(10, dtype=np.int64)) == [b"v%d" % i for i in range(10)]


def test_a_big_frame_before_authentication_is_refused_by_name(worker) -> None:
    with RawClient(worker.address) as raw:
        raw.send(frame("HelloReq", length=1025))
        h, p = raw.recv()
        assert h["type"] == "ErrorRsp"
        code, msg = decode_status(p)
        assert code == CORRUPTION
        assert "before authentication is over the pre-auth limit of 1024 bytes" in msg, msg
        assert raw.closed_by_peer()
    assert "frame before authenticating (at most 1024)" in worker.log_path.read_text()
    _served(worker)


def test_a_flood_of_unauthenticated_4_mib_frames_costs_no_buffers(worker) -> None:
    host, port = worker.address.rsplit(":", 1)
    header = frame("HelloReq", length=ANNOUNCED)
    before = _rss_kib(worker.pid)
    peak = before
    socks: list[socket.socket] = []
    try:
        for i in range(FLOOD):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(header)
            socks.append(s)
            if i % 100 == 0:
                peak = max(peak, _rss_kib(worker.pid))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, _rss_kib(worker.pid))
            time.sleep(0.05)
    finally:
        for s in socks:
            s.close()
    print(f"RSS before {before} KiB, peak {peak} KiB during the flood")
    assert peak - before < RSS_BOUND_KIB, f"RSS grew by {(peak - before) >> 10} MiB during the flood"
    assert worker.alive()
    _served(worker)


@pytest.mark.parametrize("num_vnodes", [65537, 1 << 30])
def test_num_vnodes_over_the_limit_is_refused_by_name(worker, num_vnodes) -> None:
    with rhino.connect(worker.unix_socket, secret=SECRET) as c:
        start = time.monotonic()
        with pytest.raises(rhino.InvalidArgumentError, match="over the limit of 65536 vnodes"):
            c.open_instance(OP, 5, epoch=1, num_vnodes=num_vnodes, num_key_groups=1 << 30)
        assert time.monotonic() - start < 5  # refused before any column family is made
    assert worker.alive()
    _served(worker)


def test_hosted_instances_and_checkpoint_readers_are_bounded_by_name(tmp_path) -> None:
    """A worker with --max-instances 2 and --max-checkpoint-readers 2 (docs/protocol.md
    §7.1, "Bounds"): a third instance's open, and a takeover of one, are refused with
    ResourceExhaustedError naming the option, before anything is made or fenced; so is a
    third reader while two are open, and a reader opens again once one closed. Each refusal
    is in the worker's log, and the worker serves its sessions throughout."""
    w = WorkerProcess(tmp_path, "w1", "127.0.0.2", secret_file=write_secret(tmp_path, SECRET), metrics=False,
                      extra_args=["--max-instances", "2", "--max-checkpoint-readers", "2"]).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            for i in (0, 1):
                c.open_instance(OP, i, epoch=1, num_vnodes=4)
                with c.session(OP, i, batch=0, epoch=1) as s:
                    s.put_batch(np.arange(10, dtype=np.int64), [b"v%d" % k for k in range(10)])
                    s.commit()
            c.open_instance(OP, 1, epoch=2, num_vnodes=4)  # a re-open of a hosted one is not one more
            with pytest.raises(rhino.ResourceExhaustedError, match=r"hosts 2 instances.*--max-instances"):
                c.open_instance(OP, 2, epoch=1, num_vnodes=4)
            with pytest.raises(rhino.ResourceExhaustedError, match="--max-instances"):
                c.takeover(OP, 3, epoch=1, checkpoint=0)
            assert sorted(i["instance"] for i in c.instances()) == [0, 1]
            assert not (w.dir / "state" / "instances" / OP / "2").exists()
            # the refused takeover raised no fence: fence_epoch 0 (none seen)
            assert c.status(OP, 3)["fence_epoch"] == 0
            readers = [c.read_checkpoint(OP, 0), c.read_checkpoint(OP, 1)]
            with pytest.raises(rhino.ResourceExhaustedError, match=r"2 checkpoint readers open.*--max-checkpoint"):
                c.read_checkpoint(OP, 0)
            with c.session(OP, 0, batch=1, epoch=1) as s:  # sessions are served meanwhile
                assert s.get_batch(np.arange(3, dtype=np.int64)) == [b"v0", b"v1", b"v2"]
                s.abort()
            readers.pop().close()
            deadline = time.monotonic() + 10
            while True:  # the worker drops a closed reader as its stream ends
                try:
                    readers.append(c.read_checkpoint(OP, 1))
                    break
                except rhino.ResourceExhaustedError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            for r in readers:
                r.close()
        log = w.log_path.read_text()
        assert "refused a checkpoint reader" in log and "its limit (--max-instances)" in log
    finally:
        assert w.alive(), "the worker died"
        w.stop()


# ---- connection limits (docs/protocol.md §2, "Connection limits") ----------------------------


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A worker with small connection caps. Its handshake deadline (peer_timeout_ms) is long, so
    that it holds the flood's silent handshakes until the test closes them."""
    root = tmp_path_factory.mktemp("conncap")
    w = WorkerProcess(root, "w1", CAPPED_HOST, secret_file=write_secret(root, SECRET), metrics=False,
                      peer_timeout_ms=20000, extra_args=CAPS).start()
    with rhino.connect(w.unix_socket, secret=SECRET) as c:
        c.open_instance(OP, 0, epoch=1, num_vnodes=4)
        with c.session(OP, 0, batch=0, epoch=1) as s:
            s.put_batch(np.arange(10, dtype=np.int64), [b"v%d" % i for i in range(10)])
            s.commit()
    yield w
    assert w.alive(), "the worker died"
    w.stop()


def _read_session(c) -> None:
    with c.session(OP, 0, batch=1, epoch=1) as s:
        assert s.get_batch(np.arange(10, dtype=np.int64)) == [b"v%d" % i for i in range(10)]
        s.abort()


def _served_tcp(w: WorkerProcess) -> None:
    with rhino.connect(w.address, secret=SECRET) as c:
        _read_session(c)


def _served_unix(w: WorkerProcess) -> None:
    with rhino.connect(w.unix_socket, secret=SECRET) as c:
        _read_session(c)


def _open(w: WorkerProcess, source: str, n: int) -> list[socket.socket]:
    """n TCP connections from `source` that send nothing: handshakes in progress."""
    host, port = w.address.rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0)) for _ in range(n)]


def _readable(socks, timeout: float) -> list[socket.socket]:
    """The sockets with something to read (or closed), by epoll: a flood's descriptors run past
    the 1024 that select() can take, as they do in a pytest worker that already holds many."""
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        return [key.fileobj for key, _ in sel.select(timeout)]


def _sort_out(socks: list[socket.socket], settle: float = 2.0) -> tuple[list[socket.socket], list[str]]:
    """Splits connections into those the worker holds (silent) and those it refused: for each
    refused one, the ErrorRsp's message, after checking it is ResourceExhausted and that the
    connection was closed after it."""
    pending = set(socks)
    refused: list[str] = []
    deadline = time.monotonic() + settle
    while pending and time.monotonic() < deadline:
        readable = _readable(pending, 0.1)
        for s in readable:
            pending.discard(s)
            s.settimeout(5)
            data = b""
            while True:
                try:
                    chunk = s.recv(4096)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                data += chunk
            h = parse_header(data[:HEADER])
            payload = data[HEADER:HEADER + h["length"]]
            assert h["type"] == "ErrorRsp" and checksum(payload) == h["payload_checksum"], h
            code, msg = decode_status(payload)
            assert code == RESOURCE_EXHAUSTED, (code, msg)
            assert len(data) == HEADER + h["length"], "the worker sent more than the refusal"
            refused.append(msg)
    return [s for s in socks if s in pending], refused


def _authed(w: WorkerProcess, source: str):
    """One authenticated raw connection from `source`, or the message of its refusal (which a
    refusing listener sends at once, before any handshake frame)."""
    host, port = w.address.rsplit(":", 1)
    raw = RawClient.__new__(RawClient)
    raw.sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    readable = _readable([raw.sock], 0.1)
    cn = os.urandom(16)
    if not readable:
        raw.send(frame("HelloReq", Enc().u32(1).bytes_(b"cap-test").bytes_(cn).done()))
    h, p = raw.recv()
    if h["type"] == "ErrorRsp":
        code, msg = decode_status(p)
        assert code == RESOURCE_EXHAUSTED, (code, msg)
        assert raw.closed_by_peer()
        raw.close()
        return msg
    assert h["type"] == "HelloRsp", h
    d = Dec(p)
    _worker_id, sn, _server_mac = d.bytes_(), d.bytes_(), d.bytes_()
    raw.send(frame("AuthReq", Enc().bytes_(hmac.new(SECRET, b"rhino-client" + sn + cn, hashlib.sha256).digest()).done()))
    h, p = raw.recv()
    assert h["type"] == "AuthRsp" and p == b"\x01", h
    return raw


def _close(socks) -> None:
    for s in socks:
        s.close()


def test_a_handshake_flood_from_one_address_is_refused_by_name_and_others_are_served(capped) -> None:
    before_open = rhino.connect(capped.address, secret=SECRET)  # authenticated before the flood
    try:
        rss_before = _rss_kib(capped.pid)
        flood = _open(capped, FLOOD_A, CONN_FLOOD)
        try:
            held, refused = _sort_out(flood)
            rss_peak = _rss_kib(capped.pid)
            # The address keeps its share of handshakes; every other connection is refused by name.
            assert len(held) == MAX_UNAUTH_PER_PEER, (len(held), len(refused))
            assert len(refused) == CONN_FLOOD - MAX_UNAUTH_PER_PEER
            assert all(f"refused a connection from {FLOOD_A}: {MAX_UNAUTH_PER_PEER} handshakes from {FLOOD_A} "
                       f"are in progress (max_unauthenticated_per_peer {MAX_UNAUTH_PER_PEER})" in m for m in refused), \
                refused[:3]
            # During the flood: a new TCP client, the connection opened before, the Unix socket.
            _served_tcp(capped)
            _read_session(before_open)
            _served_unix(capped)
        finally:
            _close(flood)
        print(f"RSS before {rss_before} KiB, after {CONN_FLOOD} connections {rss_peak} KiB")
        assert rss_peak - rss_before < CONN_RSS_BOUND_KIB, f"RSS grew by {(rss_peak - rss_before) >> 10} MiB"
        log = capped.log_path.read_text()
        assert f"rhino: worker w1's TCP listener refused a connection from {FLOOD_A}: " in log, log[-2000:]
        assert "refused so far)" in log
        # Rate-limited: one line a second at most, not one per refusal.
        assert log.count("w1's TCP listener refused a connection") < 30
        assert capped.alive()
        _read_session(before_open)
        _served_tcp(capped)
    finally:
        before_open.close()


def test_handshakes_from_many_addresses_fill_the_listener_and_tcp_serves_again_after(capped) -> None:
    before_open = rhino.connect(capped.address, secret=SECRET)
    try:
        floods = [_open(capped, FLOOD_A, MAX_UNAUTH_PER_PEER), _open(capped, FLOOD_B, MAX_UNAUTH_PER_PEER)]
        try:
            for f in floods:
                held, refused = _sort_out(f, settle=0.5)
                assert len(held) == MAX_UNAUTH_PER_PEER and not refused, refused
            third = _open(capped, FLOOD_C, 20)
            floods.append(third)
            held, refused = _sort_out(third)
            assert not held and len(refused) == 20
            assert all(f"{MAX_UNAUTH} handshakes are in progress (max_unauthenticated_connections {MAX_UNAUTH})" in m
                       for m in refused), refused[:3]
            # A client that connects now is told why, by name.
            with pytest.raises(rhino.ResourceExhaustedError, match="max_unauthenticated_connections"):
                rhino.connect(capped.address, secret=SECRET)
            # Authenticated connections and the other listener serve on.
            _read_session(before_open)
            _served_unix(capped)
        finally:
            for f in floods:
                _close(f)
        deadline = time.monotonic() + 10
        while True:  # the worker sees the flood's connections close
            try:
                _served_tcp(capped)
                break
            except rhino.ResourceExhaustedError:
                assert time.monotonic() < deadline, "TCP is not served again after the flood"
                time.sleep(0.1)
        assert capped.alive()
    finally:
        before_open.close()


def test_authenticated_connections_are_bounded_per_address_and_per_listener(capped) -> None:
    held: list = []
    try:
        for _ in range(MAX_PER_PEER):
            r = _authed(capped, FLOOD_A)
            assert isinstance(r, RawClient), r
            held.append(r)
        msg = _authed(capped, FLOOD_A)
        assert isinstance(msg, str) and (f"{MAX_PER_PEER} connections from {FLOOD_A} are open "
                                         f"(max_connections_per_peer {MAX_PER_PEER})") in msg, msg
        for source in (FLOOD_B, FLOOD_C):  # other addresses, until the listener is full
            for _ in range(MAX_PER_PEER):
                r = _authed(capped, source)
                if isinstance(r, str):
                    break
                held.append(r)
            if isinstance(r, str):
                break
        assert isinstance(r, str) and f"connections are open (max_connections {MAX_CONNECTIONS})" in r, r
        assert len(held) <= MAX_CONNECTIONS
        _served_unix(capped)  # the Unix socket is its own listener
        assert capped.alive()
    finally:
        _close(h.sock for h in held)
    deadline = time.monotonic() + 10
    while True:
        try:
            _served_tcp(capped)
            break
        except rhino.ResourceExhaustedError:
            assert time.monotonic() < deadline, "TCP is not served again after the connections closed"
            time.sleep(0.1)


def test_the_coordinators_listener_refuses_over_its_caps() -> None:
    def handler(method: str, args: str):
        return 0, "", "{}"

    server = _core.CoordServer(COORD_HOST, 0, SECRET, handler, max_connections=MAX_CONNECTIONS,
                               max_unauthenticated_connections=MAX_UNAUTH, max_connections_per_peer=MAX_PER_PEER,
                               max_unauthenticated_per_peer=MAX_UNAUTH_PER_PEER, peer_timeout_ms=20000)
    try:
        host, port = server.address.rsplit(":", 1)
        flood = [socket.create_connection((host, int(port)), timeout=10, source_address=(FLOOD_A, 0))
                 for _ in range(100)]
        try:
            held, refused = _sort_out(flood)
            assert len(held) == MAX_UNAUTH_PER_PEER and len(refused) == 100 - MAX_UNAUTH_PER_PEER
            assert all(f"the coordinator (coordinator) refused a connection from {FLOOD_A}" in m and
                       "(max_unauthenticated_per_peer 8)" in m for m in refused), refused[:3]
            assert server.metrics()["connections_refused"] == len(refused)
            c = _core.StateClient.connect(server.address, SECRET)  # another address is served meanwhile
            try:
                assert c.coord("echo", "{}") == "{}"
            finally:
                c.close()
        finally:
            _close(flood)
    finally:
        server.close()


def test_create_operator_refuses_num_vnodes_outside_the_workers_cap(capped, tmp_path) -> None:
    assert _core.MAX_NUM_VNODES == 65536
    with Coordinator(str(tmp_path / "coord"), secret=SECRET, heartbeat_timeout=3600) as coord:
        cc = LocalCoordinatorClient(coord)
        cc.register(capped.id, capped.address, unix_socket=str(capped.unix_socket), incarnation="test")
        for bad in (65537, 0, -1, 1 << 30):
            with pytest.raises(rhino.InvalidArgumentError, match=r"num_vnodes must be in \[1, 65536\]"):
                cc.create_operator("capop", parallelism=1, num_vnodes=bad, replicas=0)
            with pytest.raises(rhino.UnknownInstanceError):
                cc.placement("capop")  # nothing was placed
        assert cc.create_operator("capop", parallelism=1, num_vnodes=4, replicas=0).num_vnodes == 4
    assert capped.alive()


def _manifest_of_size(operator_id: str, checkpoint_id: int, size: int) -> bytes:
    """A well-formed manifest (the store's format, tests/dataplane_wire.py) naming one file of
    `size` bytes: the sizes are the sender's word, and a replica reserves them with fallocate."""
    import json

    import xxhash

    checksum_hex = "ab" * 16
    body = json.dumps({"format": 1, "operator_id": operator_id, "instance": 0, "checkpoint_id": checkpoint_id,
                       "parent_id": None, "epoch": 0, "version": 0,
                       "partitioner": {"num_key_groups": 32768, "num_vnodes": 256, "seed": 0}, "vnodes": [],
                       "files": [{"name": "000001.sst", "size": size, "checksum": checksum_hex,
                                  "identity": f"{checksum_hex}-{size}", "in_delta": True}],
                       "created_unix_ms": 0}, separators=(",", ":"))
    return (body + "\nxxh3:" + format(xxhash.xxh3_64_intdigest(body.encode()), "016x") + "\n").encode()


@pytest.mark.parametrize("size", [1 << 50, (1 << 62) + 12345])
def test_a_manifest_that_would_reserve_the_disk_is_refused_by_name(worker, size) -> None:
    """Issue 46: a stream's manifest names the sizes a replica reserves (fallocate). One
    naming more than the store's disk has free, less what open streams may still write and
    a margin kept for commits, is refused with NoSpace before anything is reserved; the
    worker logs it and serves on, and its disk is as free as before."""
    from dataplane_wire import open_stream_req

    before = os.statvfs(worker.dir)
    with RawClient(worker.address) as raw:
        assert raw.handshake(SECRET)[0]["type"] == "AuthRsp"
        raw.send(frame("OpenStreamReq", open_stream_req("hog", 0, 1, _manifest_of_size("hog", 1, size)),
                       stream_id=1, chain_version=1))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "OpenStreamRsp", h
        code, message = decode_status(p)
    assert code == 9, (code, message)  # NoSpace, protocol §3
    assert f"needs {size} bytes" in message and "free" in message and "kept for commits" in message, message
    after = os.statvfs(worker.dir)
    assert after.f_bavail * after.f_frsize > before.f_bavail * before.f_frsize - (64 << 20)  # nothing reserved
    time.sleep(0.2)
    # logged (at most once a second: the other case's line may stand for this one)
    assert "cannot take checkpoint 1 of hog/0" in worker.log_path.read_bytes().decode(errors="replace")
    assert worker.alive()
    _served(worker)
    # A stream whose file fits is admitted after it (the refused need was never kept).
    with RawClient(worker.address) as raw:
        assert raw.handshake(SECRET)[0]["type"] == "AuthRsp"
        raw.send(frame("OpenStreamReq", open_stream_req("fits", 0, 1, _manifest_of_size("fits", 1, 1 << 20)),
                       stream_id=1, chain_version=1))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "OpenStreamRsp" and decode_status(p)[0] == 0, decode_status(p)


def test_streams_per_connection_are_bounded_by_name_and_given_back(tmp_path) -> None:
    """Issue 46: a peer holds at most --max-streams-per-connection streams open on one
    connection. One more is answered ResourceExhausted on its own stream and logged; the
    connection serves on, another connection is not affected, and a stream that ends gives
    its place back."""
    from dataplane_wire import open_stream_req

    cap = 4
    w = WorkerProcess(tmp_path, "w1", "127.0.0.2", secret_file=write_secret(tmp_path, SECRET), metrics=False,
                      extra_args=["--max-streams-per-connection", str(cap)]).start()
    try:
        with RawClient(w.address) as raw:
            assert raw.handshake(SECRET)[0]["type"] == "AuthRsp"

            def open_stream(sid: int) -> tuple[dict, bytes]:
                m = _manifest_of_size("capped", sid, 1 << 10)  # a file the store lacks: the stream waits for it
                raw.send(frame("OpenStreamReq", open_stream_req("capped", 0, sid, m), stream_id=sid, chain_version=1))
                return raw.recv_skipping_heartbeats()

            for sid in range(1, cap + 1):
                h, p = open_stream(sid)
                assert h["type"] == "OpenStreamRsp" and decode_status(p)[0] == 0, decode_status(p)
            h, p = open_stream(cap + 1)
            assert h["type"] == "ErrorRsp" and h["stream_id"] == cap + 1, h
            code, message = decode_status(p)
            assert code == 18 and f"holds {cap} streams open" in message and "max_streams_per_connection" in message
            # Another connection is not affected, and this one still serves.
            _served_unix_or_tcp(w)
            raw.send(frame("AbortReq", Enc().bytes_(b"test: done").done(), stream_id=1, chain_version=1))
            deadline = time.monotonic() + 10
            while True:  # the aborted stream gives its place back
                h, p = open_stream(100 + int(time.monotonic() * 10) % 1000)
                if h["type"] == "OpenStreamRsp":
                    assert decode_status(p)[0] == 0, decode_status(p)
                    break
                assert time.monotonic() < deadline, "the aborted stream never gave its place back"
                time.sleep(0.2)
        assert "max_streams_per_connection" in w.log_path.read_text(errors="replace")
        assert w.alive()
    finally:
        w.stop()


def _served_unix_or_tcp(w: WorkerProcess) -> None:
    with rhino.connect(w.address, secret=SECRET) as c:
        assert c.instances() == []  # a worker that hosts nothing answers, on its own connection


# ---- outbound queues (docs/protocol.md §2, "Connection limits") ----------------------------

OUT_KEYS = [b"outbound-%02d" % i for i in range(16)]
OUT_VALUE = 64 << 10  # so that each GetRsp for the 16 keys is 1 MiB
OUT_REQUESTS = 120    # 120 MiB of answers owed
OUT_BOUND = 1 << 20   # --max-outbound-bytes 1M


def _out_value(i: int) -> bytes:
    return bytes([65 + i]) * OUT_VALUE


def _outbound_flooder(w: WorkerProcess) -> RawClient:
    """An authenticated raw TCP client with a small receive buffer (64 KiB), so that the kernel
    holds little of what the worker sends it, in a session of batch 1 of instance 0."""
    host, port = w.address.rsplit(":", 1)
    raw = RawClient.__new__(RawClient)
    raw.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    raw.sock.settimeout(10)
    raw.sock.connect((host, int(port)))
    assert raw.handshake(SECRET)[0]["type"] == "AuthRsp"
    raw.send(frame("SessionOpenReq", Enc().bytes_(OP).u32(0).u64(1).u64(1).done(), stream_id=1))
    h, p = raw.recv_skipping_heartbeats()
    assert h["type"] == "SessionOpenRsp" and decode_status(p)[0] == 0, decode_status(p)
    return raw


def _get_rsp_values(p: bytes) -> list[bytes]:
    d = Dec(p)
    code, message, found = d.u32(), d.bytes_(), d.bytes_()
    assert code == 0, message
    assert found == b"\x01" * len(OUT_KEYS), found
    values = [d.bytes_() for _ in range(d.u32())]
    d.end()
    return values


@pytest.mark.parametrize("bound", [OUT_BOUND, 0], ids=["bounded", "unbounded"])
def test_a_peer_that_reads_no_answers_is_not_read_past_the_outbound_bound(tmp_path, bound) -> None:
    """Issue 46: a peer that pipelines 120 GetReqs of 1 MiB answers each and reads none. With
    --max-outbound-bytes 1M the worker stops reading it once that much is queued: the answers
    queued stay within the bound plus those of the requests in progress (at most 16, one frame
    each), the worker's RSS grows by less than 64 MiB, the pause is counted and logged, and
    another connection is served meanwhile. Then the peer reads, and gets every answer it is
    owed, in order, intact. The control, with no bound (0), queues nearly all 120 MiB."""
    w = WorkerProcess(tmp_path, "w1", "127.0.0.2", secret_file=write_secret(tmp_path, SECRET),
                      peer_timeout_ms=20000,  # the flooder reads nothing for seconds, on purpose
                      extra_args=["--max-outbound-bytes", str(bound)]).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            for i in (0, 1):
                c.open_instance(OP, i, epoch=1, num_vnodes=4)
            with c.session(OP, 1, batch=0, epoch=1) as s:  # the bystander's instance
                s.put_batch(np.arange(10, dtype=np.int64), [b"v%d" % i for i in range(10)])
                s.commit()
        with RawClient(w.address) as raw:  # instance 0's 16 values of 64 KiB, by hand
            assert raw.handshake(SECRET)[0]["type"] == "AuthRsp"
            raw.send(frame("SessionOpenReq", Enc().bytes_(OP).u32(0).u64(0).u64(1).done(), stream_id=1))
            assert raw.recv_skipping_heartbeats()[0]["type"] == "SessionOpenRsp"
            raw.send(frame("WriteReq", Enc().u8(1).strs(OUT_KEYS).strs([_out_value(i) for i in range(16)]).done(),
                           stream_id=1))
            h, p = raw.recv_skipping_heartbeats()
            assert h["type"] == "SessionRsp" and decode_status(p)[0] == 0, decode_status(p)
            raw.send(frame("SessionCommitReq", Enc().u8(0).done(), stream_id=1))
            h, p = raw.recv_skipping_heartbeats()
            assert h["type"] == "SessionCommitRsp" and decode_status(p)[0] == 0, decode_status(p)

        flooder = _outbound_flooder(w)
        try:
            get = frame("GetReq", Enc().strs(OUT_KEYS).done(), stream_id=1)
            rss_before = _rss_kib(w.pid)
            flooder.send(get * OUT_REQUESTS)  # 33 KB: the sockets' buffers take it all
            rss_peak, out_peak = rss_before, 0.0
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:  # the worker settles, the flooder reads nothing
                rss_peak = max(rss_peak, _rss_kib(w.pid))
                out_peak = max(out_peak, w.metric("rhino_worker_outbound_bytes"))
                time.sleep(0.05)
            paused = w.metric("rhino_worker_reads_paused_total")
            print(f"--max-outbound-bytes {bound}: RSS {rss_before} KiB before, +{rss_peak - rss_before} KiB at "
                  f"the peak; {int(out_peak)} bytes queued at the peak; {paused:g} pauses")
            # Another connection is served meanwhile (its own instance: the flooder's session holds 0).
            _read_bystander(w)
            if bound == 0:
                assert out_peak > (OUT_REQUESTS - 20) << 20, out_peak
                assert paused == 0
            else:
                answer = 32 + 32 + len(OUT_KEYS) * (4 + OUT_VALUE)  # a GetRsp frame, header included
                assert paused >= 1
                assert out_peak <= bound + 17 * answer, out_peak
                assert rss_peak - rss_before < 64 << 10, f"RSS grew by {(rss_peak - rss_before) >> 10} MiB"
            # Now the flooder reads: every answer it is owed, in order, intact.
            want = [_out_value(i) for i in range(16)]
            for n in range(OUT_REQUESTS):
                h, p = flooder.recv_skipping_heartbeats()
                assert h["type"] == "GetRsp" and h["stream_id"] == 1, (n, h)
                assert _get_rsp_values(p) == want, n
            flooder.send(get)  # and it is served on
            h, p = flooder.recv_skipping_heartbeats()
            assert h["type"] == "GetRsp" and _get_rsp_values(p) == want
            if bound != 0:
                assert w.metric("rhino_worker_reads_paused_total") > paused  # resumed, paused again
        finally:
            flooder.close()
        deadline = time.monotonic() + 10
        while w.metric("rhino_worker_outbound_bytes") != 0:
            assert time.monotonic() < deadline, "the queue was not drained"
            time.sleep(0.05)
        log = w.log_path.read_text(errors="replace")
        if bound != 0:
            assert "reads its answers slower than they come" in log and f"(max_outbound_bytes {bound})" in log
            assert log.count("reads its answers slower than they come") <= 10  # at most one a second
        else:
            assert "reads its answers slower than they come" not in log
        assert w.alive()
    finally:
        w.stop()


def _read_bystander(w: WorkerProcess) -> None:
    with rhino.connect(w.address, secret=SECRET) as c, c.session(OP, 1, batch=1, epoch=1) as s:
        assert s.get_batch(np.arange(10, dtype=np.int64)) == [b"v%d" % i for i in range(10)]
        s.abort()
