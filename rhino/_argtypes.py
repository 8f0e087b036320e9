"""argparse types shared by the command-line entry points: integers checked
against the unsigned C++ fields they land in, so a bad value is a usage error
instead of a pybind TypeError (whose message would echo every argument of the
call, a worker's shared secret included)."""

from __future__ import annotations

import argparse

__all__ = ["uint32", "uint64"]


def _unsigned(text: str, bits: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if not 0 <= v < 1 << bits:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {(1 << bits) - 1}, got {text!r}")
    return v


def uint32(text: str) -> int:
    return _unsigned(text, 32)


def uint64(text: str) -> int:
    return _unsigned(text, 64)
