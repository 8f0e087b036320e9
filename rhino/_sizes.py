"""Byte sizes as people write them on a command line: ``256M``, ``1G``, ``4096``.

Suffixes are binary (K = 1024, M = 1024**2, ...), as in ``dd``/``truncate``;
an optional trailing ``B`` or ``iB`` is accepted (``512KiB``, ``1GB``).
"""

from __future__ import annotations

import re

__all__ = ["parse_size", "parse_sizes", "format_bytes"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"256M"`` -> 268435456. Raises ValueError on anything else."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"invalid size {text!r}: expected e.g. 512K, 256M, 1G or a number of bytes")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least 1 byte")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """``"256M,1G"`` -> [268435456, 1073741824]."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"invalid size list {text!r}: expected e.g. 256M,1G,4G")
    return [parse_size(p) for p in parts]


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; exact below 1 KiB."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if n < 100 else f"{n:.0f} {unit}"
    raise AssertionError("unreachable")
