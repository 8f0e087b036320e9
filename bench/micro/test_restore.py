"""Local restore of a small (64 MiB) checkpoint: hard links against copies.

ReplicaStore.restore_files builds the RocksDB directory of a checkpoint
(link or copy every file, fsync, rename) without opening it. The page cache is
warm here; `rhino-bench restore` measures cold restores of 256 MiB to 4 GiB.
"""

from __future__ import annotations

import os
import shutil

import pytest

import rhino
from rhino_testing.workload import build_state

from benchutil import record

SIZE = 64 << 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("restore")
    db = rhino.StateBackend.open(str(root / "live"), partitioner=rhino.Partitioner(), operator_id="bench")
    build_state(db, SIZE, value_size=1024, progress=False)
    store = rhino.ReplicaStore(str(root / "store"))
    manifest = db.checkpoint(store, 1)
    db.close()
    return root, store, manifest


def _restore(benchmark, checkpoint, mode: str, rounds: int):
    root, store, manifest = checkpoint
    target = str(root / f"restored-{mode}")

    def setup():
        shutil.rmtree(target, ignore_errors=True)

    stats = benchmark.pedantic(lambda: store.restore_files("bench", 0, 1, target, mode=mode),
                               setup=setup, rounds=rounds, warmup_rounds=1)
    assert sorted(os.listdir(target)) == sorted(f.name for f in manifest.files)
    shutil.rmtree(target, ignore_errors=True)
    return stats, manifest


def test_restore_hardlink(benchmark, checkpoint):
    stats, m = _restore(benchmark, checkpoint, "link", rounds=15)
    assert stats.linked_files > 0
    record(benchmark, figure="restore 64 MiB", role="rhino", items=len(m.files), unit="files",
           what="ReplicaStore.restore_files(mode='link')", bytes=m.total_bytes,
           linked_files=stats.linked_files, copied_files=stats.copied_files)


def test_restore_copy(benchmark, checkpoint):
    stats, m = _restore(benchmark, checkpoint, "copy", rounds=5)
    assert stats.linked_files == 0
    record(benchmark, figure="restore 64 MiB", role="baseline", items=len(m.files), unit="files",
           what="ReplicaStore.restore_files(mode='copy')", bytes=m.total_bytes,
           linked_files=stats.linked_files, copied_files=stats.copied_files)
