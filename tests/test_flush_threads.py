"""StateBackend's `flush_threads` option: a checkpoint flushes every vnode at once.

Oracles: a Python dict of everything written, and rocksdict (its own RocksDB
build) reading the restored checkpoints.
"""

from __future__ import annotations

import numpy as np
import pytest

import rhino

from helpers import key_bytes

OP = "op"


@pytest.mark.parametrize("flush_threads", [1, 2, 4])
def test_checkpoints_hold_exactly_what_was_written(tmp_path, store, read_rocksdb, flush_threads):
    # 64 vnodes with something in every memtable at each checkpoint: the
    # flushes of one checkpoint overlap on the flush threads.
    p = rhino.Partitioner(num_vnodes=64)
    db = rhino.StateBackend.open(str(tmp_path / "db"), partitioner=p, flush_threads=flush_threads)
    rng = np.random.default_rng(flush_threads)
    model: dict[bytes, bytes] = {}
    try:
        for cid in (1, 2, 3):
            keys = rng.integers(-(2**62), 2**62, 20_000, dtype=np.int64)
            values = rng.integers(0, 256, (len(keys), 64), dtype=np.uint8)
            db.put_batch(keys, values)
            model.update({key_bytes(int(k)): v.tobytes() for k, v in zip(keys, values)})
            db.checkpoint(store, cid)
            target = tmp_path / f"restored-{cid}"
            store.restore_files(OP, 0, cid, str(target))
            contents = read_rocksdb(target)
            got = {k: v for name, kv in contents.items() if name != "default" for k, v in kv.items()}
            assert got == model, f"checkpoint {cid} differs from what was written"
        db.flush()  # the public flush takes the same path
    finally:
        db.close()


@pytest.mark.parametrize("bad", [0, 17])
def test_out_of_range_is_refused_before_anything_is_written(tmp_path, store, bad):
    with pytest.raises(rhino.InvalidArgumentError, match="flush_threads must be 1..16"):
        rhino.StateBackend.open(str(tmp_path / "db"), flush_threads=bad)
    assert not (tmp_path / "db").exists()
    with rhino.StateBackend.open(str(tmp_path / "src")) as db:
        db.put(1, b"x")
        db.checkpoint(store, 1)
    with pytest.raises(ValueError, match="flush_threads must be 1..16"):
        store.restore(OP, 0, 1, str(tmp_path / "restored"), flush_threads=bad)
    assert not (tmp_path / "restored").exists()


def test_negative_is_a_type_error(tmp_path):
    with pytest.raises(TypeError):
        rhino.StateBackend.open(str(tmp_path / "db"), flush_threads=-1)
