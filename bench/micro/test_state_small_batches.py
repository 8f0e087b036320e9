"""Batched get in small batches: what a batch costs per vnode it touches.

A batch meets each vnode it touches with one RocksDB MultiGet, and a MultiGet
has a fixed cost however few keys it carries. So the same 100,000 lookups
cost more per key when they come in batches of 100 (about one key per vnode
at V = 256) than in one batch. Informational figures, no target: the issue's
target is judged on one batch (test_state_batch.py, test_state_paired.py).

Same data as test_state_batch.py (100,000 random int64 keys, 100-byte values,
V = 256, flushed), and its own rocksdict per-key baseline in this file, so
every ratio here is of one run.
"""

from __future__ import annotations

import numpy as np
import pytest
from rocksdict import Options, Rdict

import rhino

from benchutil import random_state, record

N = 100_000
VALUE_SIZE = 100


@pytest.fixture(scope="module")
def state(tmp_path_factory, rng):
    keys, values, key_bytes, value_bytes = random_state(rng, N, VALUE_SIZE)
    root = tmp_path_factory.mktemp("small-batches")
    db = rhino.StateBackend.open(str(root / "rhino"), partitioner=rhino.Partitioner())
    db.put_batch(keys, values)
    db.flush()
    rd = Rdict(str(root / "rocksdict"), options=Options(raw_mode=True))
    for k, v in zip(key_bytes, value_bytes):
        rd[k] = v
    rd.flush()
    yield db, rd, keys, values, key_bytes
    db.close()
    rd.close()


@pytest.mark.parametrize("batch", [100, 1_000, 10_000])
def test_get_in_batches(benchmark, state, batch):
    db, _, keys, values, _ = state
    batches = [keys[i:i + batch] for i in range(0, len(keys), batch)]

    def run():
        return [db.get_batch_array(b, VALUE_SIZE) for b in batches]

    got = benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    assert np.array_equal(np.concatenate([g for g, _ in got]), values)
    record(benchmark, figure=f"batched get in batches of {batch:,} keys", role="rhino", items=len(keys),
           unit="keys", baseline_figure="rocksdict per-key get (small-batch run)",
           what=f"get_batch_array in {len(batches)} batches of {batch} keys, V=256")


def test_get_rocksdict_small_batch_run(benchmark, state):
    _, rd, _, values, key_bytes = state
    got = benchmark.pedantic(lambda: [rd[k] for k in key_bytes], rounds=5, warmup_rounds=1)
    assert got[0] == values[0].tobytes() and got[-1] == values[-1].tobytes()
    record(benchmark, figure="rocksdict per-key get (small-batch run)", role="baseline", items=len(key_bytes),
           unit="keys", what="rocksdict raw mode: db[k] per key (baseline of the small-batch figures)")
