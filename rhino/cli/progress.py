"""A small progress bar on stderr, with no dependency.

On a terminal it redraws one line (at most ten times a second). When stderr is
not a terminal (a log file, ``make`` under CI) it prints a plain line every
10 %, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .._sizes import format_bytes

__all__ = ["Progress"]


class Progress:
    """Progress of a job measured in bytes: ``with Progress("build", total) as p: p.advance(n)``."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, enabled: bool = True,
                 width: int = 30) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._last_decile = -1

    def __enter__(self) -> "Progress":
        self._draw(force=True)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abandon()  # interrupted or failed: the bar must not claim 100%

    def advance(self, n: int) -> None:
        self.done = min(self.done + int(n), self.total)
        self._draw()

    def finish(self) -> None:
        if not self.enabled:
            return
        self.done = self.total
        self._draw(force=True)
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
        self.enabled = False

    def abandon(self) -> None:
        """Stops drawing where the job stopped (an error, Ctrl-C), ending the terminal's line."""
        if not self.enabled:
            return
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
        self.enabled = False

    def _line(self) -> str:
        frac = self.done / self.total
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (f"{self.label} [{bar}] {frac * 100:5.1f}%  {format_bytes(self.done)} / {format_bytes(self.total)}"
                f"  {format_bytes(rate)}/s  {elapsed:5.1f}s")

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._tty:
            if force or now - self._last_draw >= 0.1:
                self.stream.write("\r" + self._line())
                self.stream.flush()
                self._last_draw = now
            return
        decile = int(10 * self.done / self.total)
        if force and self.done < self.total and self._last_decile >= 0:
            return
        if decile != self._last_decile:
            self.stream.write(self._line() + "\n")
            self.stream.flush()
            self._last_decile = decile
