"""The frame and message codec (docs/protocol.md §1, §3), pure: no sockets.

The C++ decoder (`_core.decode_frame`, the very code a worker runs on every
frame) is checked against an independent Python encoder (dataplane_wire), and
every malformed case of §1 is shown to be rejected with a Status, never a crash.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rhino
from rhino import _core

import dataplane_wire as wire

MAX = _core.MAX_FRAME_BYTES


def decode(data: bytes, max_frame_bytes: int = MAX) -> dict:
    return _core.decode_frame(data, max_frame_bytes)


# ---- round trips -------------------------------------------------------------


def test_python_frames_decode_in_cpp_with_every_field():
    f = wire.frame("HeartbeatReq", wire.Enc().u64(0xDEADBEEF).done(), stream_id=7, chain_version=2**40 + 3)
    d = decode(f)
    assert d["type"] == "HeartbeatReq" and d["type_id"] == 12
    assert d["stream_id"] == 7 and d["chain_version"] == 2**40 + 3 and d["length"] == 8
    assert d["message"] == {"nonce": 0xDEADBEEF}


def test_cpp_frames_parse_in_python():
    payload = wire.Enc().u32(5).bytes_(b"boom").done()
    f = _core.encode_frame(16, payload, stream_id=9, chain_version=4)
    h, p = wire.parse_frame(f)
    assert h == {"type": "ErrorRsp", "stream_id": 9, "length": len(payload), "chain_version": 4,
                 "payload_checksum": wire.checksum(payload)}
    assert wire.decode_status(p) == (5, "boom")
    assert f == wire.frame("ErrorRsp", payload, stream_id=9, chain_version=4)  # byte-identical encoders


def test_every_message_round_trips():
    m = wire.manifest_bytes("op", 3, 17, [("000001.sst", b"a" * 100), ("CURRENT", b"MANIFEST-000001\n")])
    cases = {
        "HelloReq": (wire.Enc().u32(1).bytes_(b"w1").bytes_(b"n" * 16).done(),
                     {"proto": 1, "worker_id": b"w1", "client_nonce": b"n" * 16}),
        "HelloRsp": (wire.Enc().bytes_(b"w2").bytes_(b"s" * 16).bytes_(b"m" * 32).done(),
                     {"worker_id": b"w2", "server_nonce": b"s" * 16, "server_mac": b"m" * 32}),
        "AuthReq": (wire.Enc().bytes_(b"c" * 32).done(), {"client_mac": b"c" * 32}),
        "AuthRsp": (wire.Enc().u8(1).done(), {"ok": True}),
        "OpenStreamReq": (wire.open_stream_req("op", 3, 17, m, chunk_bytes=4096, window=8,
                                               downstream=["127.0.0.3:7000", "127.0.0.4:7000"]),
                          {"operator_id": "op", "instance": 3, "checkpoint_id": 17, "chunk_bytes": 4096,
                           "window": 8, "downstream": ["127.0.0.3:7000", "127.0.0.4:7000"],
                           "files": ["000001.sst", "CURRENT"]}),
        "OpenStreamRsp": (wire.Enc().u32(0).bytes_(b"").u32s([0, 2]).u32(16).u32s([2, 1]).u64s([10, 5]).done(),
                          {"code": 0, "message": b"", "needed": [0, 2], "credits": 16,
                           "member_needed_files": [2, 1], "member_needed_bytes": [10, 5]}),
        "ChunkReq": (wire.chunk_req(2, 1 << 33, b"xyz"), {"file_index": 2, "offset": 1 << 33, "data": b"xyz"}),
        "CreditRsp": (wire.Enc().u32(3).done(), {"credits": 3}),
        "CommitReq": (b"", {}),
        "CommitRsp": (wire.Enc().u32(9).bytes_(b"disk full").done(), {"code": 9, "message": b"disk full"}),
        "AbortReq": (wire.Enc().bytes_(b"why").done(), {"reason": b"why"}),
        "HeartbeatRsp": (wire.Enc().u64(1).done(), {"nonce": 1}),
        "StoreQueryReq": (wire.Enc().bytes_(b"op").u32(2).done(), {"operator_id": b"op", "instance": 2}),
        "StoreQueryRsp": (wire.Enc().u32(0).bytes_(b"").u64s([1, 2, 2**63]).done(),
                          {"code": 0, "message": b"", "checkpoints": [1, 2, 2**63]}),
        "ErrorRsp": (wire.Enc().u32(100).bytes_(b"stale").done(), {"code": 100, "message": b"stale"}),
        # The coordinator's (§8).
        "CoordReq": (wire.coord_req("report_batch", b'{"batch":3}'),
                     {"method": "report_batch", "args": b'{"batch":3}'}),
        "CoordRsp": (wire.Enc().u32(102).bytes_(b"stale epoch").bytes_(b"").done(),
                     {"code": 102, "message": b"stale epoch", "result": b""}),
    }
    for name, (payload, expect) in cases.items():
        d = decode(wire.frame(name, payload, stream_id=1, chain_version=5))
        assert d["type"] == name
        assert d["message"] == expect, name
        assert decode(_core.encode_frame(wire.TYPES[name], payload, stream_id=1, chain_version=5)) == d


def test_python_and_cpp_agree_on_content_checksums(tmp_path):
    # dataplane_wire.manifest_bytes writes checksums as the store does (XXH3-128 hex).
    import xxhash

    with rhino.StateBackend.open(str(tmp_path / "db"), operator_id="op", instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=8)) as st:
        st.put(b"k", b"v")
        st.flush()
        store = rhino.ReplicaStore(str(tmp_path / "store"))
        m = st.checkpoint(store, 1)
    for f in m.files:
        with open(store.pool_path(f.identity), "rb") as fh:
            data = fh.read()
        assert xxhash.xxh3_128(data).hexdigest() == f.checksum
        assert f.identity == f"{f.checksum}-{len(data)}"


# ---- §1 validation: each malformed case is rejected ----------------------------


def test_oversized_length_is_rejected_before_any_allocation():
    f = wire.frame("ChunkReq", b"", length=0xFFFFFFFF)
    with pytest.raises(rhino.CorruptionError, match="exceeds max_frame_bytes"):
        decode(f)
    f = wire.frame("ChunkReq", wire.chunk_req(0, 0, b"x" * 84))  # a 100-byte payload
    with pytest.raises(rhino.CorruptionError, match="exceeds max_frame_bytes"):
        decode(f, 99)
    assert decode(f, 100)["length"] == 100


def test_bad_header_checksum_is_rejected_first():
    good = wire.frame("HeartbeatReq", wire.Enc().u64(1).done())
    with pytest.raises(rhino.CorruptionError, match="header checksum"):
        decode(wire.frame("HeartbeatReq", wire.Enc().u64(1).done(), header_checksum=0))
    # a flipped bit anywhere in the first 28 bytes, even in `length`, is caught by it
    for byte in range(28):
        bad = bytearray(good)
        bad[byte] ^= 0x10
        with pytest.raises(rhino.CorruptionError, match="header checksum"):
            decode(bytes(bad))


def test_bad_payload_checksum_is_rejected():
    f = bytearray(wire.frame("HeartbeatReq", wire.Enc().u64(1).done()))
    f[-1] ^= 1
    with pytest.raises(rhino.CorruptionError, match="payload checksum"):
        decode(bytes(f))


@pytest.mark.parametrize("type_id", [0, 32, 99, 255])
def test_unknown_type_is_rejected(type_id):
    with pytest.raises(rhino.CorruptionError, match=f"unknown message type {type_id}"):
        decode(wire.frame(type_id, b""))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"magic": 0x12345678}, "magic"),
        ({"version": 2}, "protocol version"),
        ({"flags": 1}, "flags"),
    ],
)
def test_bad_magic_version_flags_are_rejected(kwargs, match):
    with pytest.raises(rhino.CorruptionError, match=match):
        decode(wire.frame("CommitReq", b"", **kwargs))


def test_truncated_and_overlong_frames_are_rejected():
    f = wire.frame("HeartbeatReq", wire.Enc().u64(1).done())
    with pytest.raises(rhino.CorruptionError, match="truncated frame"):
        decode(f[:20])
    with pytest.raises(rhino.CorruptionError, match="truncated frame payload"):
        decode(f[:-1])
    with pytest.raises(rhino.CorruptionError, match="trailing bytes"):
        decode(f + b"\0")


@pytest.mark.parametrize(
    "name, payload, match",
    [
        ("HeartbeatReq", b"\1\2\3", "runs past the end"),
        ("HeartbeatReq", wire.Enc().u64(1).u8(0).done(), "trailing bytes"),
        ("CommitReq", b"\0", "trailing bytes"),
        ("AuthRsp", b"\2", "neither 0 nor 1"),
        ("ErrorRsp", wire.Enc().u32(1).u32(1000).done(), "runs past the end"),
        # a forged list count is refused before anything is reserved for it
        ("StoreQueryRsp", wire.Enc().u32(0).bytes_(b"").u32(0xFFFFFFFF).done(), "list<u64>"),
        ("OpenStreamRsp", wire.Enc().u32(0).bytes_(b"").u32(1 << 30).done(), "list<u32>"),
        ("HelloReq", wire.Enc().u32(1).bytes_(b"w").bytes_(b"n" * 17).done(), "exceeds its limit"),
        ("OpenStreamReq", wire.Enc().bytes_("op").u32(0).u64(1).u32(1).u32(1).u32(17).done(), "exceeds its limit"),
        # CoordReq.method is [a-z_]{1,64} (§8), checked by the decoder itself
        ("CoordReq", wire.coord_req("", "{}"), r"\[a-z_\]"),
        ("CoordReq", wire.coord_req("Report", "{}"), r"\[a-z_\]"),
        ("CoordReq", wire.coord_req("a-b", "{}"), r"\[a-z_\]"),
        ("CoordReq", wire.coord_req(b"\xc3\xa9", "{}"), r"\[a-z_\]"),
        ("CoordReq", wire.coord_req("a" * 65, "{}"), "exceeds its limit of 64"),
        ("CoordReq", wire.coord_req("ok", "{}")[:-1], "runs past the end"),
        ("CoordReq", wire.coord_req("ok", "{}") + b"\0", "trailing bytes"),
        ("CoordReq", wire.Enc().bytes_("ok").u32((1 << 20) + 1).done(), "exceeds its limit"),
        ("CoordRsp", wire.Enc().u32(0).bytes_(b"").u32((16 << 20) + 1).done(), "exceeds its limit"),
        ("CoordRsp", wire.Enc().u32(0).bytes_(b"").bytes_(b"{}").u8(0).done(), "trailing bytes"),
    ],
)
def test_malformed_payloads_are_rejected(name, payload, match):
    with pytest.raises(rhino.CorruptionError, match=match):
        decode(wire.frame(name, payload))


def test_coord_method_bounds_are_inclusive():
    for method in ["a", "_", "a" * 64, "report_batch"]:
        assert decode(wire.frame("CoordReq", wire.coord_req(method, "")))["message"]["method"] == method


# ---- names from the network stay inside the store -----------------------------


def open_req(files, *, operator_id="op", identity=None):
    m = wire.manifest_bytes(operator_id, 0, 1, files, identity=identity)
    return wire.frame("OpenStreamReq", wire.open_stream_req(operator_id, 0, 1, m))


@pytest.mark.parametrize("name", ["..", ".", "../evil.sst", "/etc/passwd", "a/b.sst", "x\0y.sst", ""])
def test_path_traversal_file_names_are_rejected(name):
    with pytest.raises(rhino.PathOutsideStoreError):
        decode(open_req([("000001.sst", b"ok"), (name, b"evil")]))


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
def test_forged_identities_are_rejected(forge):
    with pytest.raises(rhino.PathOutsideStoreError, match="identity"):
        decode(open_req([("000001.sst", b"data")], identity=forge))


@pytest.mark.parametrize("operator_id", ["../op", "op/x", ".hidden", "", "a" * 129])
def test_bad_operator_ids_are_rejected(operator_id):
    with pytest.raises(rhino.PathOutsideStoreError, match="operator id"):
        decode(open_req([("f", b"x")], operator_id=operator_id))


def test_undecodable_bytes_from_a_peer_give_the_documented_error_not_a_unicode_error():
    # Found by the fuzz test below: the error message quotes the operator id
    # the peer sent, and such bytes need not be UTF-8.
    m = wire.manifest_bytes("op", 0, 1, [("f", b"x")])
    frame = wire.frame("OpenStreamReq", wire.open_stream_req(b"\x80p", 0, 1, m))  # type: ignore[arg-type]
    with pytest.raises(rhino.PathOutsideStoreError, match=r"operator id '\\x80p'"):
        decode(frame)


def test_duplicate_names_and_mismatched_manifests_are_rejected():
    with pytest.raises(rhino.InvalidArgumentError, match="twice"):
        decode(open_req([("f", b"x"), ("f", b"y")]))
    m = wire.manifest_bytes("op", 0, 2, [("f", b"x")])  # says checkpoint 2
    with pytest.raises(rhino.InvalidArgumentError, match="not the requested"):
        decode(wire.frame("OpenStreamReq", wire.open_stream_req("op", 0, 1, m)))
    with pytest.raises(rhino.CorruptionError, match="manifest"):
        decode(wire.frame("OpenStreamReq", wire.open_stream_req("op", 0, 1, m[:-5] + b"0000\n")))
    with pytest.raises(rhino.InvalidArgumentError, match="chunk_bytes"):
        decode(wire.frame("OpenStreamReq", wire.open_stream_req("op", 0, 2, m, chunk_bytes=0)))
    with pytest.raises(rhino.InvalidArgumentError, match="host:port"):
        decode(wire.frame("OpenStreamReq", wire.open_stream_req("op", 0, 2, m, downstream=["nohost"])))


# ---- fuzzing: whatever the bytes, a Status and never a crash ---------------------

SEEDS = [
    wire.frame("HeartbeatReq", wire.Enc().u64(1).done()),
    wire.frame("ChunkReq", wire.chunk_req(0, 0, b"abc"), stream_id=1, chain_version=1),
    open_req([("000001.sst", b"x" * 10), ("CURRENT", b"y")]),
    wire.frame("StoreQueryRsp", wire.Enc().u32(0).bytes_(b"").u64s([1, 2]).done()),
    wire.frame("CoordReq", wire.coord_req("report_batch", b'{"batch":3}'), stream_id=1),
]


def _decode_or_status(data: bytes) -> None:
    try:
        decode(data)
    except rhino.RhinoError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_fuzz_random_bytes(data):
    _decode_or_status(data)


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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
       st.integers(0, 64))
def test_fuzz_mutated_frames_with_valid_checksums(seed, flips, cut):
    data = bytearray(seed)
    for pos, val in flips:
        data[pos % len(data)] = val
    data = bytes(data[: len(data) - cut]) if cut < len(data) - 32 else bytes(data)
    _decode_or_status(_with_valid_checksums(data))
