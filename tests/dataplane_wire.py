"""An independent Python implementation of the data-plane wire format
(docs/protocol.md §1-§3), written from the document, not from the C++.

Tests use it two ways: to cross-check the C++ codec (each side decodes what
the other encodes), and as a hostile raw client that can send anything at all
to a live worker (forged lengths, bad checksums, traversal names...).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct

import xxhash

MAGIC = 0x314E4852
VERSION = 1
HEADER = 32

TYPES = {
    "HelloReq": 1,
    "HelloRsp": 2,
    "AuthReq": 3,
    "AuthRsp": 4,
    "OpenStreamReq": 5,
    "OpenStreamRsp": 6,
    "ChunkReq": 7,
    "CreditRsp": 8,
    "CommitReq": 9,
    "CommitRsp": 10,
    "AbortReq": 11,
    "HeartbeatReq": 12,
    "HeartbeatRsp": 13,
    "StoreQueryReq": 14,
    "StoreQueryRsp": 15,
    "ErrorRsp": 16,
    # The state service (§7).
    "InstanceReq": 17,
    "InstanceRsp": 18,
    "SessionOpenReq": 19,
    "SessionOpenRsp": 20,
    "GetReq": 21,
    "GetRsp": 22,
    "WriteReq": 23,
    "SessionRsp": 24,
    "ScanReq": 25,
    "ScanRsp": 26,
    "SessionCommitReq": 27,
    "SessionCommitRsp": 28,
    "SessionAbortReq": 29,
    # The coordinator (§8).
    "CoordReq": 30,
    "CoordRsp": 31,
}
NAMES = {v: k for k, v in TYPES.items()}

# Status codes on the wire (§3)
OK, NOT_FOUND, CORRUPTION, INVALID_ARGUMENT = 0, 1, 2, 3
PATH_OUTSIDE_STORE, NO_SPACE, TIMEOUT, ABORTED = 8, 9, 11, 13
STALE_CHAIN_VERSION, AUTH_FAILED = 100, 101
UNKNOWN_INSTANCE, SESSION_BUSY, STALE_EPOCH = 14, 15, 102


def checksum(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


def frame(
    type_: int | str,
    payload: bytes = b"",
    *,
    stream_id: int = 0,
    chain_version: int = 0,
    magic: int = MAGIC,
    version: int = VERSION,
    flags: int = 0,
    length: int | None = None,
    payload_checksum: int | None = None,
    header_checksum: int | None = None,
) -> bytes:
    """One frame; every field can be forged for negative tests."""
    t = TYPES[type_] if isinstance(type_, str) else type_
    n = len(payload) if length is None else length
    pc = checksum(payload) if payload_checksum is None else payload_checksum
    head = struct.pack("<IBBHIIQI", magic, version, t, flags, stream_id, n, chain_version, pc)
    hc = checksum(head) if header_checksum is None else header_checksum
    return head + struct.pack("<I", hc) + payload


def parse_header(head: bytes) -> dict:
    magic, version, t, flags, sid, n, cv, pc, hc = struct.unpack("<IBBHIIQII", head)
    assert hc == checksum(head[:28]), "header checksum"
    assert magic == MAGIC and version == VERSION and flags == 0
    return {"type": NAMES.get(t, t), "stream_id": sid, "length": n, "chain_version": cv, "payload_checksum": pc}


def parse_frame(data: bytes) -> tuple[dict, bytes]:
    h = parse_header(data[:HEADER])
    payload = data[HEADER:]
    assert len(payload) == h["length"]
    assert checksum(payload) == h["payload_checksum"], "payload checksum"
    return h, payload


# ---- payload codec (§3) ----


class Enc:
    def __init__(self) -> None:
        self.b = bytearray()

    def u8(self, v: int) -> Enc:
        self.b += struct.pack("<B", v)
        return self

    def u32(self, v: int) -> Enc:
        self.b += struct.pack("<I", v)
        return self

    def u64(self, v: int) -> Enc:
        self.b += struct.pack("<Q", v)
        return self

    def bytes_(self, v: bytes | str) -> Enc:
        v = v.encode() if isinstance(v, str) else v
        self.u32(len(v))
        self.b += v
        return self

    def u32s(self, vs: list[int]) -> Enc:
        self.u32(len(vs))
        for v in vs:
            self.u32(v)
        return self

    def u64s(self, vs: list[int]) -> Enc:
        self.u32(len(vs))
        for v in vs:
            self.u64(v)
        return self

    def strs(self, vs: list[str]) -> Enc:
        self.u32(len(vs))
        for v in vs:
            self.bytes_(v)
        return self

    def done(self) -> bytes:
        return bytes(self.b)


class Dec:
    def __init__(self, data: bytes) -> None:
        self.d = data
        self.p = 0

    def _take(self, n: int) -> bytes:
        assert self.p + n <= len(self.d), "runs past the end"
        v = self.d[self.p : self.p + n]
        self.p += n
        return v

    def u8(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        return struct.unpack("<I", self._take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self._take(8))[0]

    def bytes_(self) -> bytes:
        return self._take(self.u32())

    def u32s(self) -> list[int]:
        return [self.u32() for _ in range(self.u32())]

    def u64s(self) -> list[int]:
        return [self.u64() for _ in range(self.u32())]

    def remaining(self) -> int:
        return len(self.d) - self.p

    def end(self) -> None:
        assert self.p == len(self.d), "trailing bytes"


def open_stream_req(
    operator_id: str,
    instance: int,
    checkpoint_id: int,
    manifest: bytes,
    *,
    chunk_bytes: int = 1 << 20,
    window: int = 4,
    downstream: list[str] | None = None,
) -> bytes:
    return (
        Enc()
        .bytes_(operator_id)
        .u32(instance)
        .u64(checkpoint_id)
        .u32(chunk_bytes)
        .u32(window)
        .strs(downstream or [])
        .bytes_(manifest)
        .done()
    )


def chunk_req(file_index: int, offset: int, data: bytes) -> bytes:
    return Enc().u32(file_index).u64(offset).bytes_(data).done()


def coord_req(method: bytes | str, args: bytes | str) -> bytes:
    """A CoordReq payload (§8): `str method`, `str args`; nothing is checked, so that
    tests can send bad methods too."""
    return Enc().bytes_(method).bytes_(args).done()


def decode_coord_rsp(payload: bytes) -> tuple[int, str, str]:
    """A CoordRsp payload (§8): (code, message, result)."""
    d = Dec(payload)
    code, message, result = d.u32(), d.bytes_().decode(errors="replace"), d.bytes_().decode(errors="replace")
    d.end()
    return code, message, result


def decode_status(payload: bytes) -> tuple[int, str]:
    d = Dec(payload)
    return d.u32(), d.bytes_().decode(errors="replace")


def manifest_bytes(
    operator_id: str, instance: int, checkpoint_id: int, files: list[tuple[str, bytes]], *, identity=None
) -> bytes:
    """A manifest in the store's format (JSON line + xxh3 trailer) for files given
    as (name, content); `identity(name, checksum, size)` may forge identities."""
    entries = []
    for name, content in files:
        h = xxhash.xxh3_128(content).digest()
        # the C++ prints high64 then low64, each as 16 hex digits: the big-endian digest
        checksum_hex = h.hex()
        ident = f"{checksum_hex}-{len(content)}"
        if identity is not None:
            ident = identity(name, checksum_hex, len(content))
        entries.append(
            {"name": name, "size": len(content), "checksum": checksum_hex, "identity": ident, "in_delta": True}
        )
    body = json.dumps(
        {
            "format": 1,
            "operator_id": operator_id,
            "instance": instance,
            "checkpoint_id": checkpoint_id,
            "parent_id": None,
            "epoch": 0,
            "version": 0,
            "partitioner": {"num_key_groups": 32768, "num_vnodes": 256, "seed": 0},
            "vnodes": [],
            "files": entries,
            "created_unix_ms": 0,
        },
        separators=(",", ":"),
    )
    trailer = format(xxhash.xxh3_64_intdigest(body.encode()), "016x")
    return (body + "\nxxh3:" + trailer + "\n").encode()


# ---- a raw client ----


class RawClient:
    """A blocking socket speaking the protocol by hand."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        if "/" in address:  # a Unix domain socket (the state service, §7)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(address)
            return
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *a: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by peer")
            buf += chunk
        return buf

    def recv(self) -> tuple[dict, bytes]:
        h = parse_header(self._read(HEADER))
        payload = self._read(h["length"]) if h["length"] else b""
        assert checksum(payload) == h["payload_checksum"]
        return h, payload

    def recv_skipping_heartbeats(self) -> tuple[dict, bytes]:
        while True:
            h, p = self.recv()
            if h["type"] == "HeartbeatReq":
                self.send(frame("HeartbeatRsp", p))
                continue
            if h["type"] != "HeartbeatRsp":
                return h, p

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True if the peer closes the connection (after any frames it still sends)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def handshake(self, secret: bytes, *, client_mac: bytes | None = None) -> tuple[dict, bytes]:
        """§2 from the client side; returns the server's answer to AuthReq."""
        cn = os.urandom(16)
        self.send(frame("HelloReq", Enc().u32(1).bytes_(b"raw-test").bytes_(cn).done()))
        h, p = self.recv()
        assert h["type"] == "HelloRsp", h
        d = Dec(p)
        _worker_id, sn, server_mac = d.bytes_(), d.bytes_(), d.bytes_()
        expect = hmac.new(secret, b"rhino-server" + cn + sn, hashlib.sha256).digest()
        self.server_authentic = hmac.compare_digest(expect, server_mac)
        mac = client_mac if client_mac is not None else hmac.new(secret, b"rhino-client" + sn + cn, hashlib.sha256).digest()
        self.send(frame("AuthReq", Enc().bytes_(mac).done()))
        return self.recv()
