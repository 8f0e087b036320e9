"""Synthetic keyed state for the demo and the restore benchmark.

Keys are distinct int64 values (an odd-multiplier bijection of 0..n-1, so they
spread over all vnodes); values are random, hence incompressible, bytes, so the
bytes on disk match the bytes written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from rhino.cli.progress import Progress

__all__ = ["keys_for", "random_values", "BuildResult", "build_state"]

# 2^64 / golden ratio, odd: multiplication by it is a bijection on uint64.
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def keys_for(start: int, n: int) -> np.ndarray:
    """The int64 keys with indices start .. start+n-1 (distinct for distinct indices)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    return (idx * _SPREAD).view(np.int64)


def random_values(gen: np.random.Generator, n: int, value_size: int) -> np.ndarray:
    """An (n, value_size) uint8 array of random bytes (fast: raw generator output)."""
    words = -(-n * value_size // 8)
    raw = gen.bit_generator.random_raw(words)
    return raw.view(np.uint8)[: n * value_size].reshape(n, value_size)


@dataclass
class BuildResult:
    keys: int
    bytes_written: int  # keys * (8 + value_size)
    seconds: float


def build_state(db, target_bytes: int, *, value_size: int = 1024, batch_bytes: int = 8 << 20,
                seed: int = 0, version: Optional[int] = 1, label: str = "building state",
                progress: bool = True,
                on_batch: Optional[Callable[[int, np.ndarray, np.ndarray], None]] = None) -> BuildResult:
    """Writes about `target_bytes` of values (random, `value_size` bytes each) into `db`
    through ``put_batch`` with int64 NumPy keys, showing a progress bar on stderr.

    `on_batch(first_index, keys, values)` is called after each batch is written.
    The last batch carries `version`, so the state's version is set atomically with it.
    """
    if value_size < 1:
        raise ValueError("value_size must be at least 1")
    n_total = max(1, target_bytes // value_size)
    per_batch = max(1, batch_bytes // value_size)
    gen = np.random.default_rng(seed)
    t0 = time.perf_counter()
    with Progress(label, n_total * value_size, enabled=progress) as bar:
        for first in range(0, n_total, per_batch):
            n = min(per_batch, n_total - first)
            keys = keys_for(first, n)
            values = random_values(gen, n, value_size)
            last = first + n >= n_total
            db.put_batch(keys, values, version=version if last else None)
            if on_batch is not None:
                on_batch(first, keys, values)
            bar.advance(n * value_size)
    return BuildResult(keys=n_total, bytes_written=n_total * (8 + value_size),
                       seconds=time.perf_counter() - t0)
