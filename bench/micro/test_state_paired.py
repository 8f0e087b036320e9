"""Batched put/get against rocksdict, measured in interleaved pairs.

test_state_batch.py times Rhino's rounds, then rocksdict's: on a shared VM the
load drifts between the two blocks, and the ratio of their medians moved by a
third between back-to-back runs. Here each pair times one Rhino call and one
rocksdict call back to back (in ABBA order, so neither side always goes
first), and the figure is the median of the per-pair ratios, with their
spread. Both wall-clock and thread-CPU ratios are kept: the CPU ratio is what
the two sides cost on a core whatever else runs on the machine.

The same data and operations as test_state_batch.py: 100,000 distinct random
int64 keys, 100-byte random values, V = 256 vnodes; rocksdict in raw mode
with default options, one Python call per key; gets read flushed SST files.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np
import pytest
from rocksdict import Options, Rdict

import rhino

from benchutil import random_state

N = 100_000
VALUE_SIZE = 100
PAIRS = 12
SEED = 20241121


@pytest.fixture(scope="module")
def data():
    return random_state(np.random.default_rng(SEED), N, VALUE_SIZE)


@pytest.fixture()
def both(tmp_path, data):
    keys, values, key_bytes, value_bytes = data
    db = rhino.StateBackend.open(str(tmp_path / "rhino"), partitioner=rhino.Partitioner())
    rd = Rdict(str(tmp_path / "rocksdict"), options=Options(raw_mode=True))
    db.put_batch(keys, values)
    db.flush()
    for k, v in zip(key_bytes, value_bytes):
        rd[k] = v
    rd.flush()
    yield db, rd
    db.close()
    rd.close()


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - w0, time.thread_time() - c0


def _pairs(rhino_call: Callable[[], object], baseline_call: Callable[[], object]) -> dict:
    rhino_call(), baseline_call()  # warm-up
    wall, cpu, rhino_wall, base_wall = [], [], [], []
    for i in range(PAIRS):
        if i % 4 in (0, 3):  # ABBA
            rw, rc = _timed(rhino_call)
            bw, bc = _timed(baseline_call)
        else:
            bw, bc = _timed(baseline_call)
            rw, rc = _timed(rhino_call)
        wall.append(bw / rw)
        cpu.append(bc / rc if rc > 0 else float("nan"))
        rhino_wall.append(rw)
        base_wall.append(bw)
    return {
        "pairs": PAIRS,
        "ratio_wall_median": statistics.median(wall),
        "ratio_wall_min": min(wall),
        "ratio_wall_max": max(wall),
        "ratio_cpu_median": statistics.median(cpu),
        "ratio_cpu_min": min(cpu),
        "ratio_cpu_max": max(cpu),
        "rhino_wall_s": rhino_wall,
        "baseline_wall_s": base_wall,
        "ratios_wall": wall,
        "ratios_cpu": cpu,
    }


def _run(benchmark, figure: str, what: str, rhino_call, baseline_call) -> None:
    result = benchmark.pedantic(lambda: _pairs(rhino_call, baseline_call), rounds=1, iterations=1)
    benchmark.extra_info.update(paired_figure=figure, what=what, items=N, unit="keys", **result)


def test_paired_put(benchmark, both, data):
    db, rd = both
    keys, values, key_bytes, value_bytes = data

    def baseline():
        for k, v in zip(key_bytes, value_bytes):
            rd[k] = v

    _run(benchmark, "batched put", "put_batch(int64[N], uint8[N,100]) vs rocksdict db[k] = v per key",
         lambda: db.put_batch(keys, values), baseline)


def test_paired_get_array(benchmark, both, data):
    db, rd = both
    keys, values, key_bytes, _ = data
    got, found = db.get_batch_array(keys, VALUE_SIZE)
    assert found.all() and np.array_equal(got, values)
    _run(benchmark, "batched get", "get_batch_array(int64[N], 100) vs rocksdict db[k] per key",
         lambda: db.get_batch_array(keys, VALUE_SIZE), lambda: [rd[k] for k in key_bytes])


def test_paired_get_list(benchmark, both, data):
    db, rd = both
    keys, _, key_bytes, value_bytes = data
    assert db.get_batch(keys) == value_bytes
    _run(benchmark, "batched get, list of bytes", "get_batch(int64[N]) -> list of bytes vs rocksdict db[k] per key",
         lambda: db.get_batch(keys), lambda: [rd[k] for k in key_bytes])


def test_paired_get_arrow(benchmark, both, data):
    db, rd = both
    keys, _, key_bytes, value_bytes = data
    assert db.get_batch_arrow(keys).to_pylist() == value_bytes
    _run(benchmark, "batched get, Arrow binary out",
         "get_batch_arrow(int64[N]) -> pyarrow binary vs rocksdict db[k] per key",
         lambda: db.get_batch_arrow(keys), lambda: [rd[k] for k in key_bytes])
