"""Routing int64 keys to vnodes: Rhino's vectorized C++ partitioner against a
pure-Python partitioner on pyspark.rdd.portable_hash, as PySpark's
partitionBy computes `portable_hash(key) % partitions` per record.

Both take a NumPy int64 array and return NumPy int32 vnodes, so the baseline
pays its conversion (tolist / np.array) like any caller would. The baseline
runs on fewer keys (it is ~100x slower); the report compares keys per second.
Target (issue 2): Rhino >= 100 M keys/s on one core, and >= 100x the baseline.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from pyspark.rdd import portable_hash

import rhino

from benchutil import record

N_RHINO = 10_000_000
N_PYTHON = 200_000
V = 256


@pytest.fixture(scope="module")
def keys(rng) -> np.ndarray:
    return rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, N_RHINO, dtype=np.int64)


def python_partitioner(keys: np.ndarray, num_vnodes: int = V) -> np.ndarray:
    return np.array([portable_hash(k) % num_vnodes for k in keys.tolist()], dtype=np.int32)


def test_routing_rhino(benchmark, keys):
    p = rhino.Partitioner(num_key_groups=1 << 15, num_vnodes=V)
    out = benchmark.pedantic(p.vnodes, args=(keys,), rounds=15, warmup_rounds=2)
    assert out.dtype == np.int32 and out.shape == keys.shape and 0 <= out.min() and out.max() < V
    # CPU time of one more call on this thread (the C++ loop runs on the calling
    # thread with the GIL released): the rate per busy core, whatever else runs.
    t0 = time.thread_time()
    p.vnodes(keys)
    cpu = time.thread_time() - t0
    record(benchmark, figure="routing", role="rhino", items=N_RHINO, unit="keys",
           what="Partitioner.vnodes(int64 array), K=2^15, V=256", cpu_items_per_s=N_RHINO / cpu if cpu else None)


def test_routing_python_portable_hash(benchmark, keys):
    sub = keys[:N_PYTHON]
    out = benchmark.pedantic(python_partitioner, args=(sub,), rounds=7, warmup_rounds=1)
    assert out.dtype == np.int32 and out.shape == sub.shape
    t0 = time.thread_time()
    python_partitioner(sub)
    cpu = time.thread_time() - t0
    record(benchmark, figure="routing", role="baseline", items=N_PYTHON, unit="keys",
           what="[portable_hash(k) % 256 for k in keys.tolist()] -> int32 array",
           cpu_items_per_s=N_PYTHON / cpu if cpu else None)
