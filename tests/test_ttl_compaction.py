"""The TTL clock and the compaction filter (docs/protocol.md §7.2 step 3, §7.8).

A routed key with flag TTL holds its expiry (int64 big-endian, ms) in its
value's first 8 bytes; a commit's ``batch_time_ms`` is the instance's clock,
stored with the state version; a compaction drops the TTL entries whose
expiry is <= the clock. Checked against real `rhino worker` processes, with
an independent oracle: the checkpoint's directory is rebuilt here from its
manifest and the pool by hard links (pure Python), and read with rocksdict
(its own RocksDB build, read-only, all column families).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

V = 8


def ttl_value(expiry: int, payload: bytes) -> bytes:
    return struct.pack(">q", expiry) + payload


def entries() -> dict[str, dict[bytes, bytes]]:
    """The test's model: TTL entries expiring at 100 and at 300, entries that are not TTL
    (routed without the flag, plain) whose values also start with a small number, and a
    TTL entry whose value is too short to hold an expiry."""
    groups = [b"grp-%04d" % i for i in range(300)]
    return {
        "exp100": {rhino.routed_key(b"v\x00\x01", g, ttl=True): ttl_value(100, b"a" * 40) for g in groups},
        "exp300": {rhino.routed_key(b"v\x00\x02", g, ttl=True): ttl_value(300, b"b" * 40) for g in groups},
        "no_ttl": {rhino.routed_key(b"v\x00\x03", g): ttl_value(100, b"c") for g in groups[:50]},
        "plain": {b"plain-%d" % i: ttl_value(5, b"d") for i in range(50)},
        "short": {rhino.routed_key(b"v\x00\x04", g, ttl=True): b"xyz" for g in groups[:10]},
    }


def checkpoint_dir(store_dir: Path, op: str, instance: int, checkpoint: int, target: Path) -> Path:
    """The checkpoint's RocksDB directory, built from its manifest (JSON line + xxh3 trailer)
    by hard-linking each file's pooled content (pool/<identity>) under its name."""
    manifest = store_dir / "checkpoints" / op / str(instance) / f"{checkpoint:020d}.manifest"
    body = json.loads(manifest.read_text().split("\n", 1)[0])
    target.mkdir(parents=True)
    for f in body["files"]:
        os.link(store_dir / "pool" / f["identity"], target / f["name"])
    return target


def stored(path: Path) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """(every vnode's entries, the default column family) of a RocksDB directory, via rocksdict."""
    cfs = read_rocksdb(path)
    return {k: v for n, cf in cfs.items() if n.startswith("vnode-") for k, v in cf.items()}, cfs["default"]


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path, SECRET)


def test_compaction_drops_what_the_clock_expired_and_checkpoints_say_so(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    model = entries()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("ttl", 0, epoch=1, num_vnodes=V)
            assert c.status("ttl", 0)["ttl_clock"] is None
            with c.session("ttl", 0, batch=0, epoch=1) as s:
                for part in model.values():
                    s.put_batch(list(part), list(part.values()))
                s.commit(batch_time_ms=200)
            assert c.status("ttl", 0)["ttl_clock"] == 200
            # Refused while a session is open; the session goes on.
            with c.session("ttl", 0, batch=1, epoch=1) as s:
                with pytest.raises(rhino.SessionBusyError):
                    c.compact("ttl", 0, epoch=1)
                s.abort()
            with pytest.raises(rhino.StaleEpochError):
                c.compact("ttl", 0, epoch=0)
            out = c.compact("ttl", 0, epoch=1)
            assert out["ttl_clock"] == 200 and 0 < out["bytes_after"] < out["bytes_before"]
            with c.session("ttl", 0, batch=1, epoch=1) as s:
                # The live state no longer holds the expired entries; the rest reads as written.
                assert s.get_batch(list(model["exp100"])) == [None] * len(model["exp100"])
                for name in ("exp300", "no_ttl", "plain", "short"):
                    assert s.get_batch(list(model[name])) == list(model[name].values()), name
                s.put_batch([b"b1"], [b"x"])
                s.commit()  # no batch time: the clock stays
            assert c.status("ttl", 0)["ttl_clock"] == 200
        # The oracle: checkpoint 1 (after the compaction) and 0 (before it), read by rocksdict.
        kept = {k: v for name in ("exp300", "no_ttl", "plain", "short") for k, v in model[name].items()}
        one, meta = stored(checkpoint_dir(w.dir, "ttl", 0, 1, tmp_path / "c1"))
        assert one == {**kept, b"b1": b"x"}
        assert struct.unpack("<q", meta[b"rhino:ttl_clock"]) == (200,)
        zero, meta0 = stored(checkpoint_dir(w.dir, "ttl", 0, 0, tmp_path / "c0"))
        assert zero == {k: v for part in model.values() for k, v in part.items()}
        assert struct.unpack("<q", meta0[b"rhino:ttl_clock"]) == (200,)
        # Batch 1 runs again: rolled back to checkpoint 0, which still holds what it held.
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            with c.session("ttl", 0, batch=1, epoch=1) as s:
                assert s.rolled_back
                assert s.get_batch(list(model["exp100"])) == list(model["exp100"].values())
                assert dict(s.scan()) == zero
            assert c.status("ttl", 0)["ttl_clock"] == 200
    finally:
        w.stop()


def test_the_clock_survives_a_killed_worker(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    model = entries()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("ttlk", 0, epoch=1, num_vnodes=V)
            with c.session("ttlk", 0, batch=0, epoch=1) as s:
                s.put_batch(list(model["exp100"]) + list(model["exp300"]),
                            list(model["exp100"].values()) + list(model["exp300"].values()))
                s.commit(batch_time_ms=200)
        w.kill()  # SIGKILL: no clean shutdown
        assert w.proc.returncode == -9
        w.start()
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            assert c.status("ttlk", 0)["ttl_clock"] == 200
            c.compact("ttlk", 0, epoch=1)
            with c.session("ttlk", 0, batch=1, epoch=1) as s:
                assert dict(s.scan()) == model["exp300"]
                s.commit(batch_time_ms=300)  # now the 300s expire too, at the next compaction
            c.compact("ttlk", 0, epoch=1)
            with c.session("ttlk", 0, batch=2, epoch=1) as s:
                assert list(s.scan()) == []
    finally:
        w.stop()


def test_a_batch_time_must_be_an_int64_clock(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("ttlb", 0, epoch=1, num_vnodes=V)
            with c.session("ttlb", 0, batch=0, epoch=1) as s:
                for bad in (-(2**63), 2**63, 1.5, True):
                    with pytest.raises(rhino.InvalidArgumentError):
                        s.commit(batch_time_ms=bad)
                assert s.open
                s.commit(batch_time_ms=-5)  # a negative time is a time
            assert c.status("ttlb", 0)["ttl_clock"] == -5
    finally:
        w.stop()


def test_embedded_state_backend_clock_and_compact(tmp_path: Path) -> None:
    """StateBackend.set_ttl_clock / ttl_clock / compact, the clock kept across a reopen, and
    a vnode imported from another state compacting through the filter too."""
    model = entries()
    part = rhino.Partitioner(num_key_groups=1 << 10, num_vnodes=V)
    everything = {k: v for p in model.values() for k, v in p.items()}
    with rhino.StateBackend.open(str(tmp_path / "a"), partitioner=part) as a:
        a.put_batch(list(everything), list(everything.values()))
        a.export_vnodes([0, 1], str(tmp_path / "export"))
    with rhino.StateBackend.open(str(tmp_path / "b"), partitioner=part, vnodes=[0, 1]) as b:
        # Two more columns are kept empty: only the imported vnodes hold data.
        b.drop_vnodes([0, 1])
        assert sorted(b.import_vnodes(str(tmp_path / "export"))) == [0, 1]
        assert b.ttl_clock is None
        b.compact()  # no clock: nothing expires
        assert sum(len(b.scan(v)) for v in (0, 1)) == sum(part.vnode(k) in (0, 1) for k in everything)
        with pytest.raises(rhino.InvalidArgumentError):
            b.set_ttl_clock(-(2**63))
        b.set_ttl_clock(200)
        out = b.compact()
        assert out["bytes_after"] < out["bytes_before"]
    with rhino.StateBackend.open(str(tmp_path / "b"), partitioner=part) as b:
        assert b.ttl_clock == 200
        left = {k: v for vn in (0, 1) for k, v in b.scan(vn)}
    want = {k: v for k, v in everything.items() if k not in model["exp100"] and part.vnode(k) in (0, 1)}
    assert left == want and want
    with rhino.StateBackend.open(str(tmp_path / "a"), partitioner=part) as a:
        a.set_ttl_clock(400)
        a.compact()
        assert {k for v in range(V) for k, _ in a.scan(v)} == set(model["no_ttl"]) | set(model["plain"]) | set(
            model["short"])


def test_commit_frames_with_and_without_a_batch_time(tmp_path: Path, secret_file: Path) -> None:
    """SessionCommitReq as docs/protocol.md §3 writes it, sent by hand (tests/dataplane_wire.py):
    ``u8 mode`` alone keeps the clock (every older client), ``u8 mode, i64 batch_time_ms``
    (little-endian, as every payload integer) sets it, and anything in between is malformed."""
    import dataplane_wire as wire

    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()

    def session(raw: wire.RawClient, stream: int, batch: int) -> None:
        raw.send(wire.frame("SessionOpenReq", wire.Enc().bytes_("ttlw").u32(0).u64(batch).u64(1).done(),
                            stream_id=stream))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "SessionOpenRsp" and wire.decode_status(p)[0] == wire.OK, p

    def commit(raw: wire.RawClient, stream: int, payload: bytes) -> tuple[str, int]:
        raw.send(wire.frame("SessionCommitReq", payload, stream_id=stream))
        h, p = raw.recv_skipping_heartbeats()
        return h["type"], wire.decode_status(p)[0]

    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("ttlw", 0, epoch=1, num_vnodes=V)
            with wire.RawClient(str(w.unix_socket)) as raw:
                raw.handshake(SECRET)
                session(raw, 1, 0)
                assert commit(raw, 1, wire.Enc().u8(0).u64(2**64 - 7).done()) == ("SessionCommitRsp", wire.OK)
                assert c.status("ttlw", 0)["ttl_clock"] == -7
                session(raw, 3, 1)
                assert commit(raw, 3, wire.Enc().u8(0).done()) == ("SessionCommitRsp", wire.OK)
                assert c.status("ttlw", 0)["ttl_clock"] == -7
                session(raw, 5, 2)
                assert commit(raw, 5, wire.Enc().u8(0).u32(1).done()) == ("ErrorRsp", wire.CORRUPTION)
                assert raw.closed_by_peer()
            assert c.status("ttlw", 0)["version"] == 1  # the malformed commit wrote nothing
    finally:
        w.stop()
