"""Retention in a worker's replica store (src/cpp/store/retention.h): a worker keeps
the newest `--keep-checkpoints` checkpoints of every instance, and everything from a
hosted instance's last complete checkpoint on, and frees the pooled files no kept
checkpoint references. Real worker processes and sockets; the expected state comes
from a dict model kept by the test and is read back with rocksdict from checkpoints
restored out of the stores."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret

OP = "ret"
RETENTION = ["--retention-interval", "0.2"]


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path, SECRET)


def commit_batches(client, batches: range, model: dict[bytes, bytes], mode: str = "barrier") -> None:
    """Overwrites a third of 3000 keys per batch with 2 KiB values, so that every
    checkpoint adds files and compaction rewrites old ones."""
    for b in batches:
        rng = np.random.default_rng(b)
        keys = rng.choice(3000, size=1000, replace=False).astype(np.int64)
        values = [rng.bytes(2048) for _ in keys]
        with client.session(OP, 0, batch=b, epoch=1) as s:
            s.put_batch(keys, values)
            if b % 3 == 2:
                gone = keys[:50]
                s.delete_batch(gone)
            s.commit(mode)
        model.update({kb(k): v for k, v in zip(keys, values)})
        if b % 3 == 2:
            for k in gone:
                model.pop(kb(k), None)


def state_of(store_dir: Path, checkpoint: int, scratch: Path) -> dict[bytes, bytes]:
    target = scratch / f"restore-{store_dir.parent.name}-{checkpoint}-{time.monotonic_ns()}"
    rhino.ReplicaStore(str(store_dir)).restore_files(OP, 0, checkpoint, str(target))
    return {k: v for n, cf in read_rocksdb(target).items() if n.startswith("vnode-") for k, v in cf.items()}


def pool_matches_manifests(store_dir: Path) -> tuple[set[str], set[str]]:
    store = rhino.ReplicaStore(str(store_dir))
    referenced = {f.identity for op, i in store.instances() for c in store.checkpoints(op, i)
                  for f in store.manifest(op, i, c).files}
    return set(os.listdir(store_dir / "pool")), referenced


def wait_for(predicate, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_primary_and_replica_keep_the_newest_checkpoints_and_free_the_rest(tmp_path: Path,
                                                                           secret_file: Path) -> None:
    b = WorkerProcess(tmp_path, "b", "127.0.0.3", secret_file=secret_file, extra_args=RETENTION).start()
    a = WorkerProcess(tmp_path, "a", "127.0.0.2", secret_file=secret_file, extra_args=RETENTION).start()
    try:
        model: dict[bytes, bytes] = {}
        models: list[dict[bytes, bytes]] = []
        with rhino.connect(str(a.unix_socket), secret=SECRET) as c:
            c.open_instance(OP, 0, epoch=1, num_vnodes=8, chain=[b.address], chain_version=1)
            for batch in range(12):
                commit_batches(c, range(batch, batch + 1), model)
                models.append(dict(model))
        for w in (a, b):
            store = rhino.ReplicaStore(str(w.dir))
            wait_for(lambda: store.checkpoints(OP, 0) == [9, 10, 11], what=f"{w.id} to keep 9..11")
            wait_for(lambda: (lambda p, r: p == r)(*pool_matches_manifests(w.dir)),
                     what=f"{w.id}'s pool to hold only the kept checkpoints' files")
            assert w.metric("rhino_worker_checkpoints_retired_total") == 9
            assert w.metric("rhino_worker_gc_bytes_removed_total") > 0
            for cp in (9, 11):
                assert state_of(w.dir, cp, tmp_path) == models[cp], (w.id, cp)
        # A re-executed batch still rolls back one checkpoint: batch 11 again, from 10.
        with rhino.connect(str(a.unix_socket), secret=SECRET) as c:
            with c.session(OP, 0, batch=11, epoch=1) as s:
                assert dict(s.scan(page_size=1000)) == models[10]
                s.abort()
    finally:
        a.stop()
        b.stop()


def test_a_hosted_instance_keeps_its_last_complete_checkpoint(tmp_path: Path, secret_file: Path) -> None:
    """Asynchronous commits go on while the chain is down: the primary keeps its last
    complete checkpoint (what a takeover would restore) and every later one."""
    b = WorkerProcess(tmp_path, "b", "127.0.0.3", secret_file=secret_file, extra_args=RETENTION).start()
    a = WorkerProcess(tmp_path, "a", "127.0.0.2", secret_file=secret_file,
                      extra_args=RETENTION + ["--replication-timeout", "2"]).start()
    try:
        model: dict[bytes, bytes] = {}
        with rhino.connect(str(a.unix_socket), secret=SECRET) as c:
            c.open_instance(OP, 0, epoch=1, num_vnodes=8, chain=[b.address], chain_version=1)
            commit_batches(c, range(0, 2), model)
            complete = dict(model)
            b.stop()
            commit_batches(c, range(2, 9), model, mode="async")
        time.sleep(2.0)  # ten retention passes
        assert rhino.ReplicaStore(str(a.dir)).checkpoints(OP, 0) == list(range(1, 9))
        assert state_of(a.dir, 1, tmp_path) == complete
        assert state_of(a.dir, 8, tmp_path) == model
    finally:
        a.stop()
        b.stop()


def test_keep_zero_keeps_every_checkpoint(tmp_path: Path, secret_file: Path) -> None:
    a = WorkerProcess(tmp_path, "a", "127.0.0.2", secret_file=secret_file,
                      extra_args=RETENTION + ["--keep-checkpoints", "0"]).start()
    try:
        with rhino.connect(str(a.unix_socket), secret=SECRET) as c:
            c.open_instance(OP, 0, epoch=1, num_vnodes=8)
            commit_batches(c, range(0, 6), {})
        time.sleep(1.0)
        assert rhino.ReplicaStore(str(a.dir)).checkpoints(OP, 0) == list(range(6))
        assert a.metric("rhino_worker_checkpoints_retired_total") == 0
    finally:
        a.stop()


@pytest.mark.parametrize("args, message", [
    (["--keep-checkpoints", "1"], "--keep-checkpoints must be 0 (keep all) or at least 2"),
    (["--retention-interval", "0"], "--retention-interval must be in (0, 3600]"),
])
def test_bad_retention_flags_are_refused(tmp_path: Path, secret_file: Path, args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "rhino.daemon.worker", "--id", "x", "--dir", str(tmp_path / "x"),
                        "--listen", "127.0.0.1:0", "--secret-file", str(secret_file), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert message in r.stdout + r.stderr


def test_keep_one_is_refused_by_the_binding(tmp_path: Path) -> None:
    w = rhino.Worker(id="x", store_dir=str(tmp_path / "x"), secret=SECRET, keep_checkpoints=1)
    with pytest.raises(rhino.InvalidArgumentError, match="keep_checkpoints must be 0"):
        w.start()
