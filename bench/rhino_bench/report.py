"""What the benchmarks' reports and command lines share: matplotlib set up for files, a
figure saved, Markdown written, and the flag types that parse sizes and numbers."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["pyplot", "save", "write_lines", "md_row", "md_table", "fmt", "setup_of", "last_summary", "run_header", "size_arg", "sizes_arg", "checked", "positive_int",
           "non_negative_int", "positive_float", "fraction", "choices"]


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """Lays out, writes (its folder made) and closes a figure."""
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """A Markdown report: its lines, each ended."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def md_row(*cells: Any) -> str:
    """One row of a Markdown table."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(header: Iterable[str], rows: Iterable[Iterable[Any]], align: str = "") -> list[str]:
    """A Markdown table: ``header``, its rule (``align``: one ``l`` or ``r`` per column, else
    left), then ``rows`` (their cells as ``str`` makes them)."""
    header = list(header)
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l"))
    return [md_row(*header), rule] + [md_row(*r) for r in rows]


def fmt(x: Any, d: int = 3) -> str:
    """A report's cell: ``-`` for None, yes/no for a bool, a float to ``d`` places, anything else as ``str``
    makes it."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    return "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))


def setup_of(records: list[dict], last: bool = False) -> dict:
    """A run's setup record (the first, or with ``last`` the last; ``{}`` if none)."""
    return next((r for r in (records[::-1] if last else records) if r.get("record") == "setup"), {})


def last_summary(records: list[dict]) -> dict | None:
    """The last summary record of a run's records."""
    return next((r for r in records[::-1] if r.get("record") == "summary"), None)


def run_header(title: str, setup: dict, when: str = ".", spark: str | None = None) -> list[str]:
    """A report's opening lines: its title, the command, when and where it ran (``when``
    ends that sentence), the parameters and, if ``spark`` (what follows the settings), the Spark
    settings."""
    from rhino._machine import machine_summary

    out = [f"# {title}", "", f"Command: `{setup.get('command', '')}`", "",
           f"Run at {setup.get('started')} on {machine_summary(setup.get('machine', {}))}{when}", "",
           "Parameters: " + ", ".join(f"{k}={v}" for k, v in (setup.get("parameters") or {}).items()), ""]
    if spark is not None:
        out += ["Spark settings: " + (", ".join(f"`{k}={v}`" for k, v in (setup.get("spark_conf") or {}).items())
                                      or "Spark's defaults") + spark, ""]
    return out


def checked(conv: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: ``conv(text)``, refused unless ``ok`` (``what`` says what it must be)."""

    def parse(text: str) -> Any:
        try:
            v = conv(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e) if conv not in (int, float) else
                                             f"{text!r} is not {'an integer' if conv is int else 'a number'}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {what}")
        return v

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def _parse_size(text: str) -> int:
    from rhino._sizes import parse_size

    return parse_size(text)


def _parse_sizes(text: str) -> list[int]:
    from rhino._sizes import parse_sizes

    return parse_sizes(text)


size_arg = checked(_parse_size, lambda v: True, "a size")  # 256M, 1G, ...
sizes_arg = checked(_parse_sizes, lambda v: True, "sizes")  # 1G,2G,4G
positive_int = checked(int, lambda v: v >= 1, ">= 1")
non_negative_int = checked(int, lambda v: v >= 0, ">= 0")
positive_float = checked(float, lambda v: v > 0 and not math.isinf(v), "> 0")
fraction = checked(float, lambda v: 0 <= v < 1, "in [0, 1)")


def choices(allowed: Iterable[str], what: str, aliases: dict[str, str] | None = None,
            in_order: bool = False) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of ``allowed`` names (or of ``aliases``' keys, each
    standing for its value, once); ``in_order``: returned in ``allowed``'s order."""
    allowed = list(allowed)

    def parse(text: str) -> list[str]:
        out: list[str] = []
        for x in (x.strip() for x in text.split(",") if x.strip()):
            if x not in (aliases or allowed):
                raise argparse.ArgumentTypeError(f"unknown {what} {x!r}: choose from {', '.join(aliases or allowed)}")
            if aliases is None:
                out.append(x)
            elif aliases[x] not in out:
                out.append(aliases[x])
        if not out:
            raise argparse.ArgumentTypeError(f"no {what} given")
        return [a for a in allowed if a in out] if in_order else out

    return parse
