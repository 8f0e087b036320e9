"""Writes the seed corpus of fuzz/frame_fuzzer.cc: one valid frame of every
message type (each prefixed by the target's mode byte), into fuzz/corpus/frame;
and of fuzz/tls_fuzzer.cc, into fuzz/corpus/tls: a TLS 1.3 ClientHello from
Python's ssl (OpenSSL, as a Rhino client sends one), its truncations, a
plaintext HelloReq frame (a plaintext client) and an HTTP request.

    python fuzz/make_corpus.py

The frames are built by tests/dataplane_wire.py, the implementation of the
wire format written from docs/protocol.md (the extension has no codec binding),
and parsed back by it: every seed has a valid header and checksums.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import dataplane_wire as wire  # noqa: E402


def enc_bytes(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def manifest() -> bytes:
    files = []
    for name, content in [("000007.sst", b"s" * 300), ("CURRENT", b"MANIFEST-000005\n"), ("EMPTY", b"")]:
        h = xxhash.xxh3_128(content).hexdigest()
        files.append({"name": name, "size": len(content), "checksum": h, "identity": f"{h}-{len(content)}",
                      "in_delta": True})
    body = json.dumps({"format": 1, "operator_id": "op", "instance": 1, "checkpoint_id": 9, "parent_id": 8,
                       "epoch": 2, "version": 9, "partitioner": {"num_key_groups": 32768, "num_vnodes": 256,
                                                                 "seed": 0},
                       "vnodes": [0, 1], "files": files, "created_unix_ms": 1}, separators=(",", ":"))
    return (body + "\nxxh3:" + format(xxhash.xxh3_64_intdigest(body.encode()), "016x") + "\n").encode()


def main() -> None:
    out = Path(__file__).parent / "corpus" / "frame"
    out.mkdir(parents=True, exist_ok=True)
    u32 = lambda v: struct.pack("<I", v)  # noqa: E731
    u64 = lambda v: struct.pack("<Q", v)  # noqa: E731
    payloads = {
        1: u32(1) + enc_bytes(b"w1") + enc_bytes(b"n" * 16),
        2: enc_bytes(b"w2") + enc_bytes(b"s" * 16) + enc_bytes(b"m" * 32),
        3: enc_bytes(b"c" * 32),
        4: b"\x01",
        5: enc_bytes(b"op") + u32(1) + u64(9) + u32(4096) + u32(8)
        + u32(2) + enc_bytes(b"127.0.0.3:7000") + enc_bytes(b"127.0.0.4:7000") + enc_bytes(manifest()),
        6: u32(0) + enc_bytes(b"") + u32(2) + u32(0) + u32(2) + u32(16) + u32(1) + u32(2) + u32(1) + u64(316),
        7: u32(0) + u64(0) + enc_bytes(b"chunk-bytes"),
        8: u32(1),
        9: b"",
        10: u32(0) + enc_bytes(b""),
        11: enc_bytes(b"reason"),
        12: u64(1),
        13: u64(1),
        14: enc_bytes(b"op") + u32(1),
        15: u32(0) + enc_bytes(b"") + u32(2) + u64(8) + u64(9),
        16: u32(100) + enc_bytes(b"stale chain version"),
        # The state service (protocol §7).
        17: b"\x01" + enc_bytes(b"op") + u32(1) + u64(7) + enc_bytes(b'{"num_vnodes":16}'),
        18: u32(0) + enc_bytes(b"") + enc_bytes(b'{"epoch":7}'),
        19: enc_bytes(b"op") + u32(1) + u64(42) + u64(7),
        20: u32(0) + enc_bytes(b"") + b"\x01" + u64(41) + b"\x00",
        21: u32(2) + enc_bytes(b"k1") + enc_bytes(b"k2"),
        22: u32(0) + enc_bytes(b"") + enc_bytes(b"\x01\x00") + u32(1) + enc_bytes(b"v1"),
        23: b"\x01" + u32(1) + enc_bytes(b"k1") + u32(1) + enc_bytes(b"v1"),
        24: u32(0) + enc_bytes(b"") + u64(1),
        25: b"\x01" + u32(3) + enc_bytes(b"pre") + b"\x01" + u32(3) + enc_bytes(b"pre-9") + u32(100),
        26: u32(0) + enc_bytes(b"") + b"\x00" + u32(3) + u32(1) + enc_bytes(b"pre-a") + u32(1) + enc_bytes(b"v"),
        27: b"\x00",
        28: u32(0) + enc_bytes(b"") + u64(42) + enc_bytes(b'{"write_s":0.1}'),
        29: enc_bytes(b"client gave up"),
        # The coordinator (protocol §8).
        30: enc_bytes(b"report_batch") + enc_bytes(b'{"operator_id":"op","batch":42}'),
        31: u32(0) + enc_bytes(b"") + enc_bytes(b'{"epoch":7,"chain":["127.0.0.2:7000"]}'),
    }
    # Other, optional forms of a type: a seed each, next to its type's.
    variants = {
        # a checkpoint reader's SessionOpenReq and its answer (§7.9)
        "type19-reader": (19, enc_bytes(b"op") + u32(1) + u64(0) + u64(0) + b"\x01\x01" + u64(9)),
        # a fenced session's SessionOpenReq: the reader's fields as 0, 0, 0, then the attempt
        # fence (attempt, has_committed, committed; protocol §7.2)
        "type19-fenced": (19, enc_bytes(b"op") + u32(1) + u64(4) + u64(2) + b"\x00\x00" + u64(0) + u64(77)
                          + b"\x01" + u64(3)),
        "type20-reader": (20, u32(0) + enc_bytes(b"") + b"\x01" + u64(9) + b"\x00" + u64(9) + u32(2) + u32(0) + u32(1)),
        "type27-batch-time": (27, b"\x00" + u64(1_700_000_000_000)),  # SessionCommitReq with batch_time_ms
    }
    # Deeply nested JSON for every request that carries JSON (net/json_bounds.h):
    # each InstanceReq action's arguments, and a CoordReq's. The reconfigure's
    # `ops` and the takeover's `redo` are decoded from the DOM, so theirs nest
    # 100,000 levels (the request that once crashed a worker); the others need
    # only to pass the bound.
    for action in range(1, 14):
        levels = 100_000 if action in (3, 10) else 1_000
        field = {3: "redo", 10: "ops"}.get(action, "x")
        extra = {3: '"redo_version":1,', 10: '"version":1,'}.get(action, "")
        deep = ("{" + extra + f'"{field}":' + "[" * levels + "]" * levels + "}").encode()
        variants[f"type17-deep-action{action:02d}"] = (17, bytes([action]) + enc_bytes(b"op") + u32(1) + u64(7)
                                                      + enc_bytes(deep))
    variants["type30-deep"] = (30, enc_bytes(b"report_batch") + enc_bytes(("{\"a\":" * 1_000 + "1" + "}" * 1_000).encode()))
    seeds = [(f"type{t:02d}", t, p) for t, p in payloads.items()] + [(n, t, p) for n, (t, p) in variants.items()]
    for name, t, p in seeds:
        frame = wire.frame(t, p, stream_id=1 if t not in (1, 2, 3, 4, 12, 13) else 0, chain_version=3)
        header, payload = wire.parse_frame(frame)  # every seed is a well-formed frame
        assert header["type"] == wire.NAMES[t] and payload == p
        (out / name).write_bytes(b"\x00" + frame)
    print(f"wrote {len(seeds)} seeds to {out}", file=sys.stderr)


def client_hello() -> bytes:
    """The first flight of a TLS 1.3 client, over memory BIOs (no socket, no server)."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname="127.0.0.1")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def main_tls() -> None:
    out = Path(__file__).parent / "corpus" / "tls"
    out.mkdir(parents=True, exist_ok=True)
    hello = client_hello()
    assert hello[:1] == b"\x16", "a TLS handshake record"
    seeds = {"client-hello": hello, "plaintext-hello-req": wire.frame(1, b"\x01\x00" + b"\x00" * 20),
             "http": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "empty": b""}
    for n in (1, 5, 9, 40, len(hello) // 2, len(hello) - 1):
        seeds[f"client-hello-cut-{n}"] = hello[:n]
    for name, data in seeds.items():
        (out / name).write_bytes(data)
    print(f"wrote {len(seeds)} seeds to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
    main_tls()
