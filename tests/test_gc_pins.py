"""Garbage collection on a busy replica (issue 46, item 4): a replication stream pins its
manifest's files instead of holding the replica store's lock for its whole life, so a
replica that always has a stream open still collects, and its pool stays bounded.

Real worker processes: a primary ``a`` hosts an instance replicated to ``b`` and commits
batch after batch (every commit a new checkpoint down the chain, compaction rewriting old
files); meanwhile a stream to ``b`` is held open and stalled for the whole run, by this
test's own protocol code (it never sends the file its manifest names). Before pins, that
stream's shared lock deferred every GC pass on ``b`` and its pool grew with every batch.

Checked from outside the worker: ``b``'s pool directory, listed, against the files its
kept manifests reference (read with rhino.ReplicaStore), sampled through the run; its
metrics; and the state of the newest checkpoint restored from ``b`` and read with rocksdict
against a dict model. ``RHINO_GC_SOAK_SECONDS`` sets how long the primary commits (default
20 s in ``make test``; ``make chaos`` runs 600 s, issue 46's ten minutes)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import numpy as np

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret
import dataplane_wire as wire

FIRST_HOST = 230  # 127.0.0.230-231 (tests/test_test_hosts.py)
A_HOST, B_HOST = f"127.0.0.{FIRST_HOST}", f"127.0.0.{FIRST_HOST + 1}"
OP = "gcpins"
SOAK_S = float(os.environ.get("RHINO_GC_SOAK_SECONDS", "20"))
RETENTION = ["--retention-interval", "0.2", "--keep-checkpoints", "2"]


class StalledStream:
    """A replication stream to `address` that opens and then sends its file 100 bytes
    every 10 s (110 chunks: 18 minutes), so that it lives through the whole run without
    tripping the worker's 60 s idle timeout. Answers the worker's heartbeats."""

    CHUNK, EVERY_S = 100, 10.0

    def __init__(self, address: str) -> None:
        self.raw = wire.RawClient(address)
        rsp = self.raw.handshake(SECRET)
        assert rsp[0]["type"] == "AuthRsp", rsp
        self.content = content = b"slowly sent" * 1000
        manifest = wire.manifest_bytes("stalled", 0, 1, [("000001.sst", content)])
        self.raw.send(wire.frame("OpenStreamReq", wire.open_stream_req("stalled", 0, 1, manifest),
                                 stream_id=1, chain_version=1))
        h, p = self.raw.recv_skipping_heartbeats()
        assert h["type"] == "OpenStreamRsp", h
        code, message = wire.decode_status(p)
        assert code == 0, message
        self.stop = threading.Event()
        self.raw.sock.settimeout(0.5)
        self.thread = threading.Thread(target=self._heartbeats, daemon=True)
        self.thread.start()

    def _heartbeats(self) -> None:
        offset, last = 0, time.monotonic()
        while not self.stop.is_set():
            if time.monotonic() - last > self.EVERY_S and offset + self.CHUNK < len(self.content):
                self.raw.send(wire.frame("ChunkReq", wire.chunk_req(0, offset, self.content[offset:offset + self.CHUNK]),
                                         stream_id=1, chain_version=1))
                offset, last = offset + self.CHUNK, time.monotonic()
            try:
                self.raw.recv_skipping_heartbeats()  # credits come back here, and are not needed
            except socket.timeout:
                continue
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.raw.close()


def pool_and_referenced(store_dir: Path) -> tuple[dict[str, int], set[str]]:
    pool = store_dir / "pool"
    files = {}
    for n in os.listdir(pool):
        try:
            files[n] = (pool / n).stat().st_size
        except FileNotFoundError:  # collected between the listing and the stat
            pass
    store = rhino.ReplicaStore(str(store_dir))
    for _ in range(20):
        try:
            referenced = {f.identity for op, i in store.instances() for c in store.checkpoints(op, i)
                          for f in store.manifest(op, i, c).files}
            return files, referenced
        except rhino.NotFoundError:  # a manifest retired between the listing and the read
            time.sleep(0.05)
    raise AssertionError("the replica's manifests kept changing under the listing")


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_replica_with_a_stream_always_open_keeps_collecting(tmp_path: Path) -> None:
    secret_file = write_secret(tmp_path, SECRET)
    b = WorkerProcess(tmp_path, "b", B_HOST, secret_file=secret_file, extra_args=RETENTION).start()
    a = WorkerProcess(tmp_path, "a", A_HOST, secret_file=secret_file, extra_args=RETENTION).start()
    stalled = None
    try:
        stalled = StalledStream(b.address)
        model: dict[bytes, bytes] = {}
        samples: list[tuple[int, int]] = []  # (pool bytes, bytes its kept manifests reference) on b
        with rhino.connect(str(a.unix_socket), secret=SECRET) as c:
            c.open_instance(OP, 0, epoch=1, num_vnodes=8, chain=[b.address], chain_version=1)
            batch, start, last_sample = 0, time.monotonic(), 0.0
            while time.monotonic() - start < SOAK_S or batch < 12:
                rng = np.random.default_rng(batch)
                keys = rng.choice(2000, size=500, replace=False).astype(np.int64)
                values = [rng.bytes(1024) for _ in keys]
                with c.session(OP, 0, batch=batch, epoch=1) as s:
                    s.put_batch(keys, values)
                    assert s.commit("barrier").replication == "complete"
                model.update({int(k).to_bytes(8, "little", signed=True): v for k, v in zip(keys, values)})
                batch += 1
                if time.monotonic() - last_sample > 1.0:
                    files, referenced = pool_and_referenced(b.dir)
                    samples.append((sum(files.values()), sum(files.get(i, 0) for i in referenced)))
                    last_sample = time.monotonic()
        assert b.proc.poll() is None
        # With the stalled stream still open, the pool comes down to what the kept manifests
        # reference: GC ran past it. (Before pins it never did: every pass was deferred.)
        wait_for(lambda: (lambda f, r: set(f) == r)(*pool_and_referenced(b.dir)), 30,
                 "b's pool to hold only its kept checkpoints' files while a stream is open")
        files, _ = pool_and_referenced(b.dir)
        assert b.metric("rhino_worker_gc_pins") >= 1  # the stalled stream's pin, honoured
        wait_for(lambda: b.metric("rhino_worker_pool_bytes") == sum(pool_and_referenced(b.dir)[0].values()), 10,
                 "the pool_bytes metric to match the pool")
        # Bounded all along: never more than a few retention intervals' checkpoints over the kept ones.
        worst = max(p / max(r, 1) for p, r in samples)
        assert worst < 4, f"b's pool reached {worst:.1f}x what its kept checkpoints reference: {samples}"
        # The newest checkpoint on b holds the state.
        store = rhino.ReplicaStore(str(b.dir))
        newest = store.checkpoints(OP, 0)[-1]
        assert newest == batch - 1
        target = tmp_path / "restored"
        store.restore_files(OP, 0, newest, str(target))
        state = {k: v for n, cf in read_rocksdb(target).items() if n.startswith("vnode-") for k, v in cf.items()}
        assert state == model
        print(f"{batch} batches in {SOAK_S:.0f}+ s; b's pool at most {worst:.2f}x its kept checkpoints' files; "
              f"{len(files)} files at the end")
    finally:
        if stalled is not None:
            stalled.close()
        a.stop()
        b.stop()
