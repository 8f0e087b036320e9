"""What every micro-benchmark records for bench/report_micro.py."""

from __future__ import annotations

import numpy as np


def record(benchmark, *, figure: str, role: str, items: int, unit: str, **extra) -> None:
    """Fills benchmark.extra_info: figure (the name of a Rhino/baseline pair), role
    ("rhino" or "baseline"), items per call and their unit, and the rate at the
    median time. Call it after the benchmark ran."""
    info = benchmark.extra_info
    info.update(figure=figure, role=role, items=items, unit=unit, **extra)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        median = stats.stats.median
        info["median_s"] = median
        info["items_per_s"] = items / median if median > 0 else None


def random_state(rng: np.random.Generator, n: int, value_size: int) -> tuple:
    """``n`` distinct random int64 keys (shuffled) and random values of ``value_size`` bytes:
    (keys, values as uint8[n, value_size], keys as 8 little-endian bytes, values as bytes)."""
    keys = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64))
    rng.shuffle(keys)  # distinct, so both sides hold exactly the same entries
    values = np.frombuffer(rng.bytes(len(keys) * value_size), dtype=np.uint8).reshape(len(keys), value_size)
    return keys, values, [k.to_bytes(8, "little", signed=True) for k in keys.tolist()], [v.tobytes() for v in values]
