"""What every micro-benchmark records for bench/report_micro.py."""

from __future__ import annotations


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
