"""The frame and message codec (docs/protocol.md §1-§4), checked on a live worker.

The extension ships no codec binding: the C++ decoder is exercised where it
runs, on the bytes a worker reads from its socket. Frames are built by
tests/dataplane_wire.py (written from the document, not from the C++), and
what the worker sends back is parsed by it too, so each side decodes what the
other encodes. Every malformed case of §1 is answered with an ErrorRsp that
names it, and only that connection is closed: the worker keeps serving. The
C++ decoder is also fuzzed on its own (fuzz/frame_fuzzer.cc, `make fuzz`),
which checks that every message and frame re-encodes to the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import struct
import threading
from contextlib import closing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rhino
from rhino import _core

import dataplane_wire as wire
from dataplane_wire import CORRUPTION, INVALID_ARGUMENT, OK, PATH_OUTSIDE_STORE, Dec, Enc, RawClient

MAX = _core.MAX_FRAME_BYTES
SECRET = b"frame-test-secret"
OP = "op"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("frame")
    # Two checkpoints in the worker's store, for StoreQueryReq to list.
    store = rhino.ReplicaStore(str(root / "store"))
    with rhino.StateBackend.open(str(root / "db"), operator_id=OP, instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=8)) as st_:
        for cid in (1, 2):
            st_.put(b"k%d" % cid, b"v")
            st_.checkpoint(store, cid)
    w = _core.Worker(id="w-frame", store_dir=str(root / "store"), secret=SECRET)
    w.start()
    yield w
    w.stop()


def address(w) -> str:
    return f"127.0.0.1:{w.port}"


def authed(w) -> RawClient:
    raw = RawClient(address(w))
    h, p = raw.handshake(SECRET)
    assert h["type"] == "AuthRsp" and p == b"\x01" and raw.server_authentic
    return raw


def recv_frame(raw: RawClient) -> bytes:
    """The next frame other than a heartbeat, as the exact bytes the worker sent."""
    while True:
        head = raw._read(wire.HEADER)
        h = wire.parse_header(head)
        data = head + (raw._read(h["length"]) if h["length"] else b"")
        if h["type"] == "HeartbeatReq":
            raw.send(wire.frame("HeartbeatRsp", data[wire.HEADER:]))
        elif h["type"] != "HeartbeatRsp":
            return data


def still_serving(w) -> None:
    with authed(w) as raw:
        raw.send(wire.frame("StoreQueryReq", Enc().bytes_(OP).u32(0).done(), stream_id=1))
        h, p = wire.parse_frame(recv_frame(raw))
        assert h["type"] == "StoreQueryRsp"


def refused(w, data: bytes) -> tuple[int, str]:
    """Sends `data` on an authenticated connection: the (code, message) of the
    ErrorRsp that answers it, once the worker has closed the connection."""
    with authed(w) as raw:
        raw.send(data)
        h, p = wire.parse_frame(recv_frame(raw))
        assert h["type"] == "ErrorRsp", h
        status = wire.decode_status(p)
        assert raw.closed_by_peer()
    still_serving(w)
    return status


# ---- each side decodes what the other encodes ---------------------------------


def test_python_frames_decode_in_cpp_with_every_field(worker):
    with authed(worker) as raw:
        # A connection-level request on stream 0: the answer echoes its nonce.
        raw.send(wire.frame("HeartbeatReq", Enc().u64(0xDEADBEEF12345678).done(), chain_version=2**40 + 3))
        while True:
            h, p = raw.recv()
            if h["type"] == "HeartbeatRsp" and Dec(p).u64() == 0xDEADBEEF12345678:
                break
            if h["type"] == "HeartbeatReq":
                raw.send(wire.frame("HeartbeatRsp", p))
        # A stream request: the answer comes on the same stream, with its chain version.
        raw.send(wire.frame("StoreQueryReq", Enc().bytes_(OP).u32(0).done(), stream_id=77, chain_version=9))
        h, p = wire.parse_frame(recv_frame(raw))
        assert (h["type"], h["stream_id"], h["chain_version"]) == ("StoreQueryRsp", 77, 9)
        d = Dec(p)
        assert (d.u32(), d.bytes_()) == (OK, b"")
        assert d.u64s() == [1, 2]
        d.end()


def test_cpp_frames_parse_in_python_and_the_encoders_agree(worker):
    with RawClient(address(worker)) as raw:
        cn = b"n" * 16
        raw.send(wire.frame("HelloReq", Enc().u32(1).bytes_(b"raw").bytes_(cn).done()))
        data = recv_frame(raw)
        h, p = wire.parse_frame(data)
        assert h["type"] == "HelloRsp"
        d = Dec(p)
        worker_id, sn, mac = d.bytes_(), d.bytes_(), d.bytes_()
        d.end()
        assert worker_id == b"w-frame" and len(sn) == 16
        assert mac == hmac.new(SECRET, b"rhino-server" + cn + sn, hashlib.sha256).digest()
        assert data == wire.frame("HelloRsp", p)  # byte-identical encoders
    with authed(worker) as raw:
        raw.send(wire.frame("CommitReq", b"", stream_id=5, chain_version=4))  # no stream 5: a late frame, dropped
        raw.send(wire.frame(99, b"", stream_id=9))
        data = recv_frame(raw)
        h, p = wire.parse_frame(data)
        assert data == wire.frame("ErrorRsp", p, stream_id=h["stream_id"], chain_version=h["chain_version"])
        assert wire.decode_status(p) == (CORRUPTION, wire.decode_status(p)[1])


def manifest(cid: int, files: list[tuple[str, bytes]], **kw) -> bytes:
    return wire.manifest_bytes(OP, 5, cid, files, **kw)


def test_a_python_primary_replicates_a_checkpoint_to_the_worker(worker):
    """§4 from the primary's side, by hand: OpenStreamReq/Rsp, ChunkReq and
    CreditRsp, CommitReq/Rsp, then the store lists the checkpoint."""
    files = [("000009.sst", b"s" * 5000), ("CURRENT", b"MANIFEST-000001\n")]
    with authed(worker) as raw:
        raw.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 5, 3, manifest(3, files), chunk_bytes=4096,
                                                                 window=4), stream_id=1, chain_version=1))
        h, p = wire.parse_frame(recv_frame(raw))
        assert (h["type"], h["stream_id"], h["chain_version"]) == ("OpenStreamRsp", 1, 1)
        d = Dec(p)
        assert (d.u32(), d.bytes_()) == (OK, b"")
        needed = d.u32s()
        credits = d.u32()
        member_files = d.u32s()
        member_bytes = d.u64s()
        d.end()
        assert needed == [0, 1] and 1 <= credits <= 4
        assert member_files == [2] and member_bytes == [sum(len(c) for _, c in files)]
        chunks = [(i, off, content[off:off + 4096]) for i, (_, content) in enumerate(files)
                  for off in range(0, len(content), 4096)]
        for i, off, data in chunks:
            if credits == 0:
                h, p = wire.parse_frame(recv_frame(raw))
                assert h["type"] == "CreditRsp"
                credits += Dec(p).u32()
            raw.send(wire.frame("ChunkReq", wire.chunk_req(i, off, data), stream_id=1, chain_version=1))
            credits -= 1
        raw.send(wire.frame("CommitReq", b"", stream_id=1, chain_version=1))
        while True:
            h, p = wire.parse_frame(recv_frame(raw))
            if h["type"] != "CreditRsp":
                break
        assert h["type"] == "CommitRsp" and wire.decode_status(p) == (OK, "")
    assert _core.query_store(address(worker), secret=SECRET, operator_id=OP, instance=5) == [3]


# ---- §1 validation: each malformed case is refused, by name ---------------------


def test_oversized_length_is_refused_before_any_allocation(worker):
    for length in (0xFFFFFFFF, MAX + 1):
        code, msg = refused(worker, wire.frame("ChunkReq", b"", stream_id=1, length=length))
        assert code == CORRUPTION and "exceeds max_frame_bytes" in msg


def test_bad_header_checksum_is_refused_first(worker):
    good = wire.frame("HeartbeatReq", Enc().u64(1).done())
    assert "header checksum" in refused(worker, wire.frame("HeartbeatReq", Enc().u64(1).done(), header_checksum=0))[1]
    # a flipped bit anywhere in the first 28 bytes, even in `length`, is caught by it
    for byte in (0, 4, 5, 6, 8, 12, 16, 24, 27):
        bad = bytearray(good)
        bad[byte] ^= 0x10
        assert "header checksum" in refused(worker, bytes(bad))[1], byte


def test_bad_payload_checksum_is_refused(worker):
    f = bytearray(wire.frame("HeartbeatReq", Enc().u64(1).done()))
    f[-1] ^= 1
    assert "payload checksum" in refused(worker, bytes(f))[1]


@pytest.mark.parametrize("type_id", [0, 32, 99, 255])
def test_unknown_type_is_refused(worker, type_id):
    assert f"unknown message type {type_id}" in refused(worker, wire.frame(type_id, b""))[1]


@pytest.mark.parametrize("kwargs, match", [({"magic": 0x12345678}, "magic"), ({"version": 2}, "protocol version"),
                                           ({"flags": 1}, "flags")])
def test_bad_magic_version_flags_are_refused(worker, kwargs, match):
    assert match in refused(worker, wire.frame("CommitReq", b"", **kwargs))[1]


def test_a_truncated_frame_hurts_nothing(worker):
    with authed(worker) as raw:
        raw.send(wire.frame("HeartbeatReq", Enc().u64(1).done())[:-3])  # the worker waits for the rest...
    still_serving(worker)  # ...and the client leaving is all that happens


@pytest.mark.parametrize(
    "name, payload, match",
    [
        ("HeartbeatReq", b"\1\2\3", "runs past the end"),
        ("HeartbeatReq", Enc().u64(1).u8(0).done(), "trailing bytes"),
        ("StoreQueryReq", Enc().bytes_(OP).done(), "runs past the end"),
        ("StoreQueryReq", Enc().bytes_(OP).u32(0).u8(0).done(), "trailing bytes"),
        ("OpenStreamReq", Enc().bytes_("op").u32(0).u64(1).u32(1).u32(1).u32(17).done(), "exceeds its limit"),
        ("OpenStreamReq", Enc().bytes_("op").u32(0).done(), "runs past the end"),
    ],
)
def test_malformed_payloads_are_refused(worker, name, payload, match):
    stream = 0 if name == "HeartbeatReq" else 1
    code, msg = refused(worker, wire.frame(name, payload, stream_id=stream))
    assert code == CORRUPTION and match in msg, msg


def test_a_malformed_error_rsp_closes_the_connection(worker):
    with authed(worker) as raw:
        raw.send(wire.frame("ErrorRsp", Enc().u32(1).u32(1000).done()))
        assert raw.closed_by_peer()
    still_serving(worker)


def test_coordinator_messages_are_refused_by_a_worker(worker):
    code, msg = refused(worker, wire.frame("CoordReq", wire.coord_req("report_batch", "{}"), stream_id=1))
    assert code == CORRUPTION and "unexpected CoordReq sent to worker w-frame" in msg


def test_coord_method_bounds_are_inclusive():
    # CoordReq.method is [a-z_]{1,64} (§8), checked by the coordinator's decoder.
    server = _core.CoordServer("127.0.0.1", 0, SECRET, lambda m, a: (0, "", json.dumps(m)), threads=1)
    try:
        for method in ["a", "_", "a" * 64, "report_batch"]:
            with closing(_core.StateClient.connect(server.address, SECRET)) as c:
                assert json.loads(c.coord(method, "{}")) == method
        with authed_to(server.address) as raw:
            raw.send(wire.frame("CoordReq", wire.coord_req("a" * 65, "{}"), stream_id=1))
            h, p = wire.parse_frame(recv_frame(raw))
            assert h["type"] == "ErrorRsp" and "exceeds its limit of 64" in wire.decode_status(p)[1]
    finally:
        server.close()


def authed_to(addr: str) -> RawClient:
    raw = RawClient(addr)
    h, p = raw.handshake(SECRET)
    assert h["type"] == "AuthRsp" and p == b"\x01"
    return raw


# ---- what a worker answers, as a client decodes it ------------------------------


class FakeWorker:
    """A server that does the §2 handshake, then answers the first request
    with `answer` (or, if `auth_rsp` is given, answers the AuthReq with it)."""

    def __init__(self, answer: bytes = b"", auth_rsp: bytes | None = None) -> None:
        self.answer, self.auth_rsp = answer, auth_rsp
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(5)
        raw = RawClient.__new__(RawClient)
        raw.sock = conn
        try:
            h, p = raw.recv()
            d = Dec(p)
            d.u32(), d.bytes_()
            cn, sn = d.bytes_(), b"s" * 16
            mac = hmac.new(SECRET, b"rhino-server" + cn + sn, hashlib.sha256).digest()
            raw.send(wire.frame("HelloRsp", Enc().bytes_(b"fake").bytes_(sn).bytes_(mac).done()))
            raw.recv()  # AuthReq (its MAC is not checked here)
            raw.send(wire.frame("AuthRsp", self.auth_rsp if self.auth_rsp is not None else b"\x01"))
            if self.auth_rsp is None:
                h, _ = raw.recv_skipping_heartbeats()
                raw.send(wire.frame(self.answer_type, self.answer, stream_id=h["stream_id"]))
            raw.closed_by_peer(5)
        except (OSError, ConnectionError):
            pass
        finally:
            conn.close()
            self.sock.close()

    answer_type = "StoreQueryRsp"


@pytest.mark.parametrize(
    "answer, match",
    [
        (Enc().u32(0).bytes_(b"").u32(0xFFFFFFFF).done(), "list<u64>"),  # a forged count: refused before reserving
        (Enc().u32(0).bytes_(b"").u64s([1]).u8(0).done(), "trailing bytes"),
        (Enc().u32(0).done(), "runs past the end"),
    ],
)
def test_a_client_refuses_a_malformed_answer(answer, match):
    fake = FakeWorker(answer)
    with pytest.raises(rhino.CorruptionError, match=match):
        _core.query_store(fake.address, secret=SECRET, operator_id=OP, instance=0, timeout_ms=5000)


def test_a_client_refuses_an_auth_rsp_that_is_neither_0_nor_1():
    fake = FakeWorker(auth_rsp=b"\x02")
    with pytest.raises(rhino.RhinoError, match="neither 0 nor 1"):
        _core.query_store(fake.address, secret=SECRET, operator_id=OP, instance=0, timeout_ms=5000)


def test_a_client_decodes_a_good_answer():
    fake = FakeWorker(Enc().u32(0).bytes_(b"").u64s([1, 2, 2**63]).done())
    assert _core.query_store(fake.address, secret=SECRET, operator_id=OP, instance=0) == [1, 2, 2**63]


# ---- names from the network stay inside the store -------------------------------


def open_refused(w, files, *, operator_id=OP, identity=None, cid=1, **kw) -> tuple[int, str]:
    """The status of the OpenStreamRsp answering an OpenStreamReq (§4 step 1)."""
    m = wire.manifest_bytes(operator_id, 0, cid, files, identity=identity)
    with authed(w) as raw:
        raw.send(wire.frame("OpenStreamReq", wire.open_stream_req(operator_id, 0, 1, m, **kw), stream_id=1))
        h, p = wire.parse_frame(recv_frame(raw))
        assert h["type"] == "OpenStreamRsp", h
        return wire.decode_status(p)


@pytest.mark.parametrize("name", ["..", ".", "../evil.sst", "/etc/passwd", "a/b.sst", "x\0y.sst", ""])
def test_path_traversal_file_names_are_refused(worker, name):
    assert open_refused(worker, [("000001.sst", b"ok"), (name, b"evil")])[0] == PATH_OUTSIDE_STORE


@pytest.mark.parametrize(
    "forge",
    [
        lambda n, c, s: "../../../tmp/evil",
        lambda n, c, s: "/etc/passwd",
        lambda n, c, s: f"{c}-{s}/../x",
        lambda n, c, s: f"{c}-{s + 1}",  # well formed, but not this file's identity
        lambda n, c, s: f"{'0' * 32}-{s}",
    ],
)
def test_forged_identities_are_refused(worker, forge):
    code, msg = open_refused(worker, [("000001.sst", b"data")], identity=forge)
    assert code == PATH_OUTSIDE_STORE and "identity" in msg


@pytest.mark.parametrize("operator_id", ["../op", "op/x", ".hidden", "a" * 128 + "b"])
def test_bad_operator_ids_are_refused(worker, operator_id):
    code, msg = open_refused(worker, [("f", b"x")], operator_id=operator_id)
    assert code == PATH_OUTSIDE_STORE and "operator id" in msg


def test_undecodable_bytes_from_a_peer_give_the_documented_error(worker):
    # The error message quotes the operator id the peer sent, and such bytes need not be UTF-8.
    m = wire.manifest_bytes("op", 0, 1, [("f", b"x")])
    with authed(worker) as raw:
        raw.send(wire.frame("OpenStreamReq", wire.open_stream_req(b"\x80p", 0, 1, m), stream_id=1))  # type: ignore[arg-type]
        h, p = wire.parse_frame(recv_frame(raw))
        d = Dec(p)
        assert d.u32() == PATH_OUTSIDE_STORE and b"operator id" in d.bytes_()


def test_duplicate_names_and_mismatched_manifests_are_refused(worker):
    code, msg = open_refused(worker, [("f", b"x"), ("f", b"y")])
    assert code == INVALID_ARGUMENT and "twice" in msg
    code, msg = open_refused(worker, [("f", b"x")], cid=2)  # the manifest says checkpoint 2
    assert code == INVALID_ARGUMENT and "not the requested" in msg
    code, msg = open_refused(worker, [("f", b"x")], chunk_bytes=0)
    assert code == INVALID_ARGUMENT and "chunk_bytes" in msg
    code, msg = open_refused(worker, [("f", b"x")], downstream=["nohost"])
    assert code == INVALID_ARGUMENT and "host:port" in msg
    m = wire.manifest_bytes(OP, 0, 1, [("f", b"x")])
    with authed(worker) as raw:
        raw.send(wire.frame("OpenStreamReq", wire.open_stream_req(OP, 0, 1, m[:-5] + b"0000\n"), stream_id=1))
        h, p = wire.parse_frame(recv_frame(raw))
        code, msg = wire.decode_status(p)
        assert code == CORRUPTION and "manifest" in msg


def test_python_and_cpp_agree_on_content_checksums(tmp_path):
    # dataplane_wire.manifest_bytes writes checksums as the store does (XXH3-128 hex).
    import xxhash

    with rhino.StateBackend.open(str(tmp_path / "db"), operator_id="op", instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=8)) as st_:
        st_.put(b"k", b"v")
        st_.flush()
        store = rhino.ReplicaStore(str(tmp_path / "store"))
        m = st_.checkpoint(store, 1)
    for f in m.files:
        with open(store.pool_path(f.identity), "rb") as fh:
            data = fh.read()
        assert xxhash.xxh3_128(data).hexdigest() == f.checksum
        assert f.identity == f"{f.checksum}-{len(data)}"


# ---- fuzzing a live worker: whatever the bytes, no crash ---------------------------

SEEDS = [
    wire.frame("HeartbeatReq", Enc().u64(1).done()),
    wire.frame("ChunkReq", wire.chunk_req(0, 0, b"abc"), stream_id=1, chain_version=1),
    wire.frame("OpenStreamReq", wire.open_stream_req(OP, 0, 1, wire.manifest_bytes(OP, 0, 1, [("f", b"x")])),
               stream_id=1),
    wire.frame("StoreQueryReq", Enc().bytes_(OP).u32(0).done(), stream_id=1),
]


def _send_and_leave(w, data: bytes) -> None:
    with authed(w) as raw:
        raw.send(data)
        raw.closed_by_peer(0.05)


def _with_valid_checksums(data: bytes) -> bytes:
    """Re-seals header and payload checksums so mutations reach the payload decoders."""
    if len(data) < 32:
        return data
    head = bytearray(data[:32])
    payload = data[32:]
    head[12:16] = struct.pack("<I", len(payload))
    head[24:28] = struct.pack("<I", wire.checksum(payload))
    head[28:32] = struct.pack("<I", wire.checksum(bytes(head[:28])))
    return bytes(head) + payload


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=256))
def test_fuzz_random_bytes(worker, data):
    _send_and_leave(worker, data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.sampled_from(SEEDS), flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
       cut=st.integers(0, 64))
def test_fuzz_mutated_frames_with_valid_checksums(worker, seed, flips, cut):
    data = bytearray(seed)
    for pos, val in flips:
        data[pos % len(data)] = val
    data = bytes(data[: len(data) - cut]) if cut < len(data) - 32 else bytes(data)
    _send_and_leave(worker, _with_valid_checksums(data))


def test_the_worker_survived_the_fuzzing(worker):
    still_serving(worker)
    assert re.match(r"\d+", str(worker.metrics()["rejected_frames"]))
