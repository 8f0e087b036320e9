"""A takeover's open leaves RocksDB's OPTIONS file to a background thread (open_without_sync.h).

DB::Open writes every column family's options to a new OPTIONS file and parses it back, ~70%
of the open's CPU with a column family per vnode. An unsynced open (a takeover's, a
rollback's) keeps the checkpoint's OPTIONS file through the open and writes the new one right
after it; a checkpoint writes it first if that has not happened yet, so every checkpoint holds
one. Checked on the files themselves, and the state with rocksdict against a model.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

import rhino
from helpers import expected_column_families, key_bytes

OP = "op"


def _options_files(d: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := re.fullmatch(r"OPTIONS-(\d+)", p.name)))


def _checkpointed(tmp_path: Path, store: rhino.ReplicaStore, model: dict) -> rhino.Partitioner:
    part = rhino.Partitioner(num_vnodes=16)
    db = rhino.StateBackend.open(str(tmp_path / "live"), partitioner=part, operator_id=OP, instance=0,
                                 checkpoint_wal_bytes=0)
    keys = np.arange(3000, dtype=np.int64)
    db.put_batch(keys, [b"v%d" % k for k in keys])
    model.update({key_bytes(int(k)): b"v%d" % k for k in keys})
    db.checkpoint(store, 1)
    db.close()
    return part


def test_an_unsynced_restore_writes_the_options_file_after_the_open(tmp_path, store, read_rocksdb):
    model: dict[bytes, bytes] = {}
    part = _checkpointed(tmp_path, store, model)
    checkpoint_options = [f.name for f in store.manifest(OP, 0, 1).files if f.name.startswith("OPTIONS-")]
    assert len(checkpoint_options) == 1
    target = tmp_path / "taken-over"
    db = store.restore(OP, 0, 1, str(target), sync=False)
    first = int(checkpoint_options[0].split("-")[1])
    deadline = time.monotonic() + 10
    while not [n for n in _options_files(target) if n > first] and time.monotonic() < deadline:
        time.sleep(0.01)
    # the checkpoint's file, kept through the open, and the one written after it
    assert first in _options_files(target) and max(_options_files(target)) > first
    assert not list(target.glob("OPTIONS-*.dbtmp"))
    # the next checkpoint holds the new OPTIONS file, and the state is the model's
    keys = np.arange(3000, 3100, dtype=np.int64)
    db.put_batch(keys, [b"w"] * len(keys))
    model.update({key_bytes(int(k)): b"w" for k in keys})
    m = db.checkpoint(store, 2)
    names = [f.name for f in m.files if f.name.startswith("OPTIONS-")]
    assert names == [f"OPTIONS-{max(_options_files(target)):06d}"]
    db.close()
    got = read_rocksdb(target)
    want = expected_column_families(model, part, range(16))
    assert {n: kv for n, kv in got.items() if n != "default"} == {n: kv for n, kv in want.items() if n != "default"}


def test_a_checkpoint_right_after_the_open_holds_an_options_file(tmp_path, store):
    """However the background write and the checkpoint race, the checkpoint has the file."""
    _checkpointed(tmp_path, store, {})
    for i in range(5):
        db = store.restore(OP, 0, 1 + i, str(tmp_path / f"t{i}"), sync=False)
        m = db.checkpoint(store, 2 + i)
        db.close()
        assert [f.name for f in m.files if f.name.startswith("OPTIONS-")], f"round {i}: no OPTIONS file"
