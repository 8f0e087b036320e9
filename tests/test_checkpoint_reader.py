"""Checkpoint readers (docs/protocol.md §7.9): a committed checkpoint of an
instance read from one worker's own replica store, on a replica and on the
primary while a session of the instance is open, with real worker processes.

Expected contents come from a dict model of what each batch wrote, and from
rocksdict (its own RocksDB build) reading the directory the worker restored
the checkpoint into; vnodes from the xxhash oracle of tests/helpers.py. The
worker's directory is checked to go when the reader ends: on close, when the
client process is killed (-9), after the idle timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from helpers import flip_byte, split_by_vnode, truncate_file
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

import dataplane_wire as wire
from dataplane_wire import CORRUPTION, OK, Dec, Enc, RawClient

OP = "ckr"
NV = 16
PART = rhino.Partitioner(num_vnodes=NV)
BATCHES = 4


def batch_writes(b: int, model: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Batch b's puts (new keys, overwrites) and deletes of keys it finds in the model."""
    rng = np.random.default_rng(b)
    puts = {b"%s:%05d" % (rng.choice([b"a", b"b", b"c"]), k): b"v%d-%d" % (b, k) * int(rng.integers(1, 6))
            for k in rng.choice(3000, size=700, replace=False)}
    gone = sorted(model)[b::7][:60]
    return puts, [k for k in gone if k not in puts]


def reader_dirs(w: WorkerProcess) -> list[Path]:
    tmp = w.state_dir / "tmp"
    return sorted(p for p in tmp.iterdir() if p.name.startswith("read-")) if tmp.is_dir() else []


def wait_until(cond, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def rocksdict_state(path: Path) -> dict[str, dict[bytes, bytes]]:
    """The vnode column families of the RocksDB at `path`, read by rocksdict."""
    return {n: cf for n, cf in read_rocksdb(path).items() if n.startswith("vnode-")}


class Chain:
    """A primary (w2) whose instance's checkpoints go down a chain of two replicas (w3, w4)."""

    def __init__(self, root: Path) -> None:
        secret_file = write_secret(root, SECRET)
        self.w3 = WorkerProcess(root, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
        self.w4 = WorkerProcess(root, "w4", "127.0.0.4", secret_file=secret_file, metrics=False).start()
        self.w2 = WorkerProcess(root, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
        self.models: dict[int, dict[bytes, bytes]] = {}

    def commit_batches(self) -> None:
        model: dict[bytes, bytes] = {}
        with rhino.connect(self.w2.unix_socket, secret=SECRET) as c:
            c.open_instance(OP, 0, epoch=1, num_vnodes=NV, chain=[self.w3.address, self.w4.address],
                            chain_version=1)
            for b in range(BATCHES):
                puts, gone = batch_writes(b, model)
                with c.session(OP, 0, batch=b, epoch=1) as s:
                    s.put_batch(list(puts), list(puts.values()))
                    s.delete_batch(gone)
                    assert s.commit().replication == "complete"  # barrier: the whole chain holds b
                model.update(puts)
                for k in gone:
                    del model[k]
                self.models[b] = dict(model)

    def stop(self) -> None:
        for w in (self.w2, self.w3, self.w4):
            w.stop()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    ch = Chain(tmp_path_factory.mktemp("ckr"))
    try:
        ch.commit_batches()
        yield ch
    finally:
        ch.stop()


def check_reader(r, model: dict[bytes, bytes], *, page_size: int = 97) -> None:
    """A reader's scans and lookups against the model and the oracle's vnodes."""
    assert dict(r.scan(page_size=page_size)) == model
    by_vnode = split_by_vnode(model, PART)
    for v in r.vnodes:
        assert list(r.scan(vnode=v, page_size=page_size)) == sorted(by_vnode.get(v, {}).items())
    assert dict(r.scan(prefix=b"b:", page_size=page_size)) == {k: v for k, v in model.items() if k.startswith(b"b:")}
    probe = sorted(model)[::3] + [b"absent", b"a:99999"]
    assert r.get_batch(probe) == [model.get(k) for k in probe]
    pages = r.scan_many([(v, b"a:") for v in r.vnodes[:4]], 0)  # one round trip, as a session's
    for v, (entries, done) in zip(r.vnodes[:4], pages):
        assert done and entries == sorted((k, x) for k, x in by_vnode.get(v, {}).items() if k.startswith(b"a:"))


# ---- reading ---------------------------------------------------------------------------


@pytest.mark.parametrize("replica", ["w3", "w4"])
def test_a_replica_reads_each_checkpoint(chain: Chain, replica: str) -> None:
    """Every checkpoint, from each replica of the chain (a worker that does not host
    the instance): what the model says, and what rocksdict reads in its directory."""
    w = getattr(chain, replica)
    with rhino.connect(w.address, secret=SECRET) as c:
        for b in range(BATCHES):
            with c.read_checkpoint(OP, 0, b) as r:
                assert (r.checkpoint, r.vnodes) == (b, list(range(NV)))
                check_reader(r, chain.models[b])
                [d] = reader_dirs(w)  # restored for this reader, under the worker's tmp area
                merged = {k: v for cf in rocksdict_state(d).values() for k, v in cf.items()}
                assert merged == chain.models[b]
                assert rocksdict_state(d) == {f"vnode-{v:05d}": split_by_vnode(chain.models[b], PART).get(v, {})
                                              for v in range(NV)}
            assert reader_dirs(w) == []  # gone with the reader
        with c.read_checkpoint(OP, 0) as r:  # None: the newest in this worker's store
            assert r.checkpoint == BATCHES - 1
            check_reader(r, chain.models[BATCHES - 1], page_size=4096)
    assert reader_dirs(w) == []


def test_the_primary_reads_while_a_session_is_open(chain: Chain) -> None:
    """Readers on the primary, while the instance's session of the next batch is open
    with writes of its own: they see their checkpoints, not the session's writes; the
    session sees its own; it commits with the readers still open, which go on reading
    what they read."""
    b = BATCHES
    with rhino.connect(chain.w2.unix_socket, secret=SECRET) as c:
        s = c.session(OP, 0, batch=b, epoch=1)
        puts, gone = batch_writes(b, chain.models[b - 1])
        s.put_batch(list(puts), list(puts.values()))
        s.delete_batch(gone)
        old, newest = c.read_checkpoint(OP, 0, 1), c.read_checkpoint(OP, 0)
        try:
            assert (old.checkpoint, newest.checkpoint) == (1, b - 1)
            assert len(reader_dirs(chain.w2)) == 2
            check_reader(old, chain.models[1])
            check_reader(newest, chain.models[b - 1])
            k = next(iter(puts))
            assert s.get_batch([k]) == [puts[k]]
            with pytest.raises(rhino.SessionBusyError):  # readers are not sessions: this one still is
                c.session(OP, 0, batch=b, epoch=1)
            s.commit()
            model = dict(chain.models[b - 1])
            model.update(puts)
            for key in gone:
                del model[key]
            chain.models[b] = model
            check_reader(newest, chain.models[b - 1])
        finally:
            old.close()
            newest.close()
        with c.read_checkpoint(OP, 0) as r:
            assert r.checkpoint == b
            check_reader(r, chain.models[b])
    assert reader_dirs(chain.w2) == []


def test_many_readers_at_once(chain: Chain) -> None:
    """Readers of every checkpoint, on both replicas, from threads at the same time."""
    errors: list[BaseException] = []
    start = threading.Barrier(2 * BATCHES)

    def run(w: WorkerProcess, b: int) -> None:
        try:
            with rhino.connect(w.address, secret=SECRET) as c, c.read_checkpoint(OP, 0, b) as r:
                start.wait(timeout=60)
                for _ in range(3):
                    assert dict(r.scan(page_size=50)) == chain.models[b]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w, b)) for w in (chain.w3, chain.w4) for b in range(BATCHES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert reader_dirs(chain.w3) == reader_dirs(chain.w4) == []


def test_writes_and_commit_are_refused(chain: Chain) -> None:
    """The reader is a session on the wire (CheckpointReader has no write methods,
    so its handle sends them): writes are refused (InvalidArgument) and it goes on
    reading; a commit, which ends a session whatever its outcome, is refused and
    ends the reader."""
    with rhino.connect(chain.w3.address, secret=SECRET) as c, c.read_checkpoint(OP, 0, 2) as r:
        assert not hasattr(r, "put_batch") and not hasattr(r, "commit")
        with pytest.raises(rhino.InvalidArgumentError, match="read-only"):
            r._h.put_batch([b"a:00001"], [b"x"])
        with pytest.raises(rhino.InvalidArgumentError, match="read-only"):
            r._h.delete_batch([b"a:00001"])
        check_reader(r, chain.models[2])
        with pytest.raises(rhino.InvalidArgumentError, match="read-only"):
            r._h.commit("barrier")
        assert not r.open
        wait_until(lambda: reader_dirs(chain.w3) == [], what="the reader's directory to go")


def test_a_missing_checkpoint_is_not_found(chain: Chain) -> None:
    with rhino.connect(chain.w4.address, secret=SECRET) as c:
        with pytest.raises(rhino.NotFoundError, match=r"checkpoint 99 of ckr/0 is not in worker w4's"):
            c.read_checkpoint(OP, 0, 99)
        with pytest.raises(rhino.NotFoundError, match=r"checkpoint 1 of ckr/7 is not in worker w4's"):
            c.read_checkpoint(OP, 7, 1)
        with pytest.raises(rhino.NotFoundError, match=r"no checkpoint of nope/0 is in worker w4's"):
            c.read_checkpoint("nope", 0)
        with pytest.raises(rhino.InvalidArgumentError, match="operator id"):
            c.read_checkpoint("../x", 0)
        with c.read_checkpoint(OP, 0, 0) as r:  # the same connection, and the worker, serve on
            check_reader(r, chain.models[0])
    assert reader_dirs(chain.w4) == []


# ---- the directory goes with the reader -------------------------------------------------

_HOLD_A_READER = """
import sys, time, rhino
c = rhino.connect(sys.argv[1], secret=sys.argv[2].encode())
r = c.read_checkpoint(sys.argv[3], 0, int(sys.argv[4]))
print(r.checkpoint, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("replica", ["w3", "w2"])
def test_a_killed_client_leaves_no_directory(chain: Chain, replica: str) -> None:
    w = getattr(chain, replica)
    address = str(w.unix_socket) if replica == "w2" else w.address
    with subprocess.Popen([sys.executable, "-c", _HOLD_A_READER, address, SECRET.decode(), OP, "1"],
                          stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline().strip() == "1"
            assert len(reader_dirs(w)) == 1
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            wait_until(lambda: reader_dirs(w) == [], what="the reader's directory to go")
        finally:
            if proc.poll() is None:
                proc.kill()
    with rhino.connect(w.address, secret=SECRET) as c, c.read_checkpoint(OP, 0, 1) as r:  # serves on
        check_reader(r, chain.models[1])


# ---- damaged checkpoints, the idle timeout, the wire ---------------------------------


@pytest.fixture(scope="module")
def lone(tmp_path_factory):
    """A worker that hosts nothing, whose store holds checkpoint 5 of instances 0-3 of
    "lone" (written by an embedded StateBackend), with a short idle timeout. The
    checkpoints of 0-2 carry their writes in the WAL; that of 3 flushed them to SSTs."""
    root = tmp_path_factory.mktemp("lone")
    store = rhino.ReplicaStore(str(root / "w5"))
    models = {}
    for i in range(4):
        with rhino.StateBackend.open(str(root / f"db{i}"), operator_id="lone", instance=i,
                                     partitioner=rhino.Partitioner(num_vnodes=8),
                                     checkpoint_wal_bytes=0 if i == 3 else 1 << 20) as st:
            models[i] = {b"k%04d" % k: b"i%d-%d" % (i, k) * 8 for k in range(2000)}
            st.put_batch(list(models[i]), list(models[i].values()))
            st.checkpoint(store, 5)
    w = WorkerProcess(root, "w5", "127.0.0.5", secret_file=write_secret(root, SECRET), metrics=False,
                      extra_args=["--session-idle-timeout", "2"]).start()
    try:
        yield w, store, models
    finally:
        w.stop()


def pooled(store: rhino.ReplicaStore, instance: int, suffix: str) -> list[str]:
    m = store.manifest("lone", instance, 5)
    found = [store.pool_path(f.identity) for f in m.files if f.name.endswith(suffix)]
    assert found, f"checkpoint 5 of lone/{instance} has no {suffix} file"
    return found


def test_a_damaged_checkpoint_is_corruption(lone) -> None:
    """A garbled manifest, a truncated file and a flipped byte: CorruptionError each,
    no directory left behind, and the worker goes on serving the sound one."""
    w, store, models = lone
    manifest = Path(store.path) / "checkpoints" / "lone" / "1" / f"{5:020d}.manifest"
    manifest.write_bytes(manifest.read_bytes()[:-9] + b"garbage\n")
    truncate_file(pooled(store, 2, ".log")[0], 100)
    for p in pooled(store, 3, ".sst"):
        flip_byte(p, 10)  # in the first data block: the size is right, the block checksum is not
    with rhino.connect(w.address, secret=SECRET) as c:
        for i in (1, 2, 3):
            with pytest.raises(rhino.CorruptionError, match=f"cannot read checkpoint 5 of lone/{i} on worker w5"):
                with c.read_checkpoint("lone", i, 5) as r:
                    dict(r.scan())  # a flipped byte in a block read only by a scan would fail here
            assert reader_dirs(w) == []
        with c.read_checkpoint("lone", 0) as r:
            assert (r.checkpoint, r.vnodes) == (5, list(range(8)))
            assert dict(r.scan()) == models[0]


def test_an_idle_reader_is_ended_by_the_worker(lone) -> None:
    w, _store, models = lone
    with rhino.connect(w.address, secret=SECRET) as c:
        r = c.read_checkpoint("lone", 0, 5)
        assert r.get_batch([b"k0001"]) == [models[0][b"k0001"]]
        assert len(reader_dirs(w)) == 1
        wait_until(lambda: reader_dirs(w) == [], timeout=20, what="the idle reader's directory to go")
        with pytest.raises(rhino.AbortedError, match="session-idle-timeout"):
            r.get_batch([b"k0001"])
        r.close()


def test_the_wire_of_a_reader(lone) -> None:
    """SessionOpenReq with the appended reader fields, built from docs/protocol.md by
    tests/dataplane_wire.py, and the answer's appended checkpoint and vnodes; reader
    fields with read = 0 are a malformed frame."""
    w, _store, models = lone
    with RawClient(w.address) as raw:
        raw.handshake(SECRET)
        open_req = Enc().bytes_("lone").u32(0).u64(0).u64(0).u8(1).u8(1).u64(5).done()
        raw.send(wire.frame("SessionOpenReq", open_req, stream_id=3))
        h, p = raw.recv_skipping_heartbeats()
        assert (h["type"], h["stream_id"]) == ("SessionOpenRsp", 3)
        d = Dec(p)
        assert (d.u32(), d.bytes_()) == (OK, b"")
        d.u8(), d.u64(), d.u8()  # has_version, version, rolled_back
        assert (d.u64(), d.u32s()) == (5, list(range(8)))
        d.end()
        scan = Enc().u8(0).u32(0).bytes_(b"k000").u8(0).u32(0).bytes_(b"").u32(0).done()
        raw.send(wire.frame("ScanReq", scan, stream_id=3))
        h, p = raw.recv_skipping_heartbeats()
        d = Dec(p)
        assert (h["type"], d.u32(), d.bytes_(), d.u8()) == ("ScanRsp", OK, b"", 1)
        d.u32()
        keys, values = [d.bytes_() for _ in range(d.u32())], [d.bytes_() for _ in range(d.u32())]
        d.end()
        assert dict(zip(keys, values)) == {k: v for k, v in models[0].items() if k.startswith(b"k000")}
        raw.send(wire.frame("SessionAbortReq", Enc().bytes_(b"done").done(), stream_id=3))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "SessionRsp" and Dec(p).u32() == OK
    wait_until(lambda: reader_dirs(w) == [], what="the reader's directory to go")
    with RawClient(w.address) as raw:
        raw.handshake(SECRET)
        raw.send(wire.frame("SessionOpenReq", Enc().bytes_("lone").u32(0).u64(0).u64(0).u8(0).u8(0).u64(0).done(),
                            stream_id=5))
        h, p = raw.recv_skipping_heartbeats()
        assert h["type"] == "ErrorRsp" and wire.decode_status(p)[0] == CORRUPTION
        assert raw.closed_by_peer()
