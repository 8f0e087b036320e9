"""Batched put and get through the bindings against rocksdict's per-key calls.

Same data on both sides: 100k random int64 keys (8 little-endian bytes) and
100-byte random values. Rhino: StateBackend.put_batch with a NumPy int64 key
array and fixed-width NumPy values, get_batch_array (fixed-width NumPy values
out), get_batch (a list of bytes out) and get_batch_arrow (a pyarrow binary
array out; put_batch also takes one in); 256 vnodes, one column family each. rocksdict (raw mode):
`db[k] = v` and `db[k]` per key, keys and values already as bytes.
Puts overwrite the same keys every round (state updates); gets read a state
at rest (flushed to SST files). Target (issue 2): >= 3x rocksdict.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from rocksdict import Options, Rdict

import rhino

from benchutil import random_state, record

N = 100_000
VALUE_SIZE = 100


@pytest.fixture(scope="module")
def data(rng):
    return random_state(rng, N, VALUE_SIZE)


@pytest.fixture()
def rhino_db(tmp_path):
    db = rhino.StateBackend.open(str(tmp_path / "rhino"), partitioner=rhino.Partitioner())
    yield db
    db.close()


@pytest.fixture()
def rocks(tmp_path):
    db = Rdict(str(tmp_path / "rocksdict"), options=Options(raw_mode=True))
    yield db
    db.close()


def _rocksdict_put(db, key_bytes, value_bytes):
    for k, v in zip(key_bytes, value_bytes):
        db[k] = v


def _rocksdict_get(db, key_bytes):
    return [db[k] for k in key_bytes]


def test_put_rhino(benchmark, rhino_db, data):
    keys, values, _, _ = data
    benchmark.pedantic(rhino_db.put_batch, args=(keys, values), rounds=10, warmup_rounds=1)
    record(benchmark, figure="batched put", role="rhino", items=len(keys), unit="keys",
           what=f"put_batch(int64[{len(keys)}], uint8[{len(keys)},{VALUE_SIZE}])")


def test_put_rhino_arrow(benchmark, rhino_db, data):
    keys, _, _, value_bytes = data
    arrow_values = pa.array(value_bytes, type=pa.binary())
    benchmark.pedantic(rhino_db.put_batch, args=(keys, arrow_values), rounds=10, warmup_rounds=1)
    record(benchmark, figure="batched put, Arrow binary in", role="rhino", items=len(keys), unit="keys",
           baseline_figure="batched put", what=f"put_batch(int64[{len(keys)}], pyarrow binary[{len(keys)}])")


def test_put_rocksdict(benchmark, rocks, data):
    _, _, key_bytes, value_bytes = data
    benchmark.pedantic(_rocksdict_put, args=(rocks, key_bytes, value_bytes), rounds=10, warmup_rounds=1)
    record(benchmark, figure="batched put", role="baseline", items=len(key_bytes), unit="keys",
           what="rocksdict raw mode: db[k] = v per key")


def test_get_rhino(benchmark, rhino_db, data):
    keys, values, _, _ = data
    rhino_db.put_batch(keys, values)
    rhino_db.flush()
    got, found = benchmark.pedantic(rhino_db.get_batch_array, args=(keys, VALUE_SIZE), rounds=10, warmup_rounds=1)
    assert found.all() and np.array_equal(got, values)
    record(benchmark, figure="batched get", role="rhino", items=len(keys), unit="keys",
           what=f"get_batch_array(int64[{len(keys)}], {VALUE_SIZE}) -> uint8[{len(keys)},{VALUE_SIZE}], found mask")


def test_get_rhino_list(benchmark, rhino_db, data):
    keys, values, _, value_bytes = data
    rhino_db.put_batch(keys, values)
    rhino_db.flush()
    got = benchmark.pedantic(rhino_db.get_batch, args=(keys,), rounds=10, warmup_rounds=1)
    assert got == value_bytes
    record(benchmark, figure="batched get, list of bytes", role="rhino", items=len(keys), unit="keys",
           baseline_figure="batched get", what=f"get_batch(int64[{len(keys)}]) -> list of bytes")


def test_get_rhino_arrow(benchmark, rhino_db, data):
    keys, values, _, value_bytes = data
    rhino_db.put_batch(keys, values)
    rhino_db.flush()
    got = benchmark.pedantic(rhino_db.get_batch_arrow, args=(keys,), rounds=10, warmup_rounds=1)
    assert got.null_count == 0 and got.to_pylist() == value_bytes
    record(benchmark, figure="batched get, Arrow binary out", role="rhino", items=len(keys), unit="keys",
           baseline_figure="batched get", what=f"get_batch_arrow(int64[{len(keys)}]) -> pyarrow binary")


def test_get_rocksdict(benchmark, rocks, data):
    _, _, key_bytes, value_bytes = data
    _rocksdict_put(rocks, key_bytes, value_bytes)
    rocks.flush()
    got = benchmark.pedantic(_rocksdict_get, args=(rocks, key_bytes), rounds=10, warmup_rounds=1)
    assert got[0] == value_bytes[0] and got[-1] == value_bytes[-1]
    record(benchmark, figure="batched get", role="baseline", items=len(key_bytes), unit="keys",
           what="rocksdict raw mode: db[k] per key")
