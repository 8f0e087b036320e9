"""Progress bars on stderr for jobs measured in bytes, drawn by tqdm.

On a terminal a bar redraws one line (at most ten times a second). When the
stream is not a terminal (a log file, ``make`` under CI) it prints a plain
line every 10 % instead, so logs stay readable. A job that stops early (an
error, Ctrl-C) abandons its bar where it stopped: it never claims 100 %.

The line reads ``verify [#########.....] 64.0%  1.2 GiB / 1.9 GiB  310 MiB/s  3.9s``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from tqdm import tqdm

from .._sizes import format_bytes

__all__ = ["Progress"]

_BAR_FORMAT = "{desc} [{bar:30}] {percentage:5.1f}%  {done_bytes} / {total_bytes}  {average_rate}/s  {elapsed_s:5.1f}s"


class _Bar(tqdm):
    """tqdm with byte sizes as ``format_bytes`` writes them, and plain lines every 10 % off a terminal."""

    monitor_interval = 0  # no tqdm monitor thread: a bar is only drawn from the job's own updates

    def __init__(self, *args: Any, tty: bool, **kwargs: Any) -> None:
        self._tty = tty
        self._last_decile = -1
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        d = super().format_dict
        elapsed = d["elapsed"] or 0.0
        d.update(done_bytes=format_bytes(d["n"]), total_bytes=format_bytes(d["total"] or 0),
                 average_rate=format_bytes(d["n"] / elapsed if elapsed > 0 else 0.0))
        return d

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if self._tty:
            return super().display(msg, pos)
        if msg is not None:  # tqdm clearing its line: a log has nothing to clear
            return False
        decile = int(10 * self.n / self.total)
        if decile != self._last_decile:
            self._last_decile = decile
            self.fp.write(self.__str__() + "\n")
            self.fp.flush()
        return True


def _columns(stream: TextIO) -> int:
    """The terminal's width, for tqdm to cut the line to; unlimited when unknown (a log, a 0x0 pty)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    return columns if columns > 0 else 1 << 16


class Progress:
    """Progress of a job measured in bytes: ``with Progress("build", total) as p: p.advance(n)``.

    Leaving the ``with`` block normally finishes the bar at 100 %; leaving it by an
    exception abandons it where the job stopped. ``enabled=False`` draws nothing.
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._bar: _Bar | None = None

    def _start(self) -> None:
        if self._bar is not None or not self.enabled:
            return
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar = _Bar(total=self.total, desc=self.label, file=self.stream, bar_format=_BAR_FORMAT, ascii=".#",
                         smoothing=0,  # the rate is the average since the start
                         # Off a terminal every update goes to display(), which prints at each new 10 %,
                         # and the line is never cleared.
                         mininterval=0.1 if tty else 0, miniters=None if tty else 1, leave=tty,
                         ncols=_columns(self.stream) if tty else 1 << 16, dynamic_ncols=False, tty=tty)

    def __enter__(self) -> "Progress":
        self._start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abandon()  # interrupted or failed: the bar must not claim 100%

    def advance(self, n: int) -> None:
        n = min(int(n), self.total - self.done)
        if n <= 0:
            return
        self.done += n
        self._start()
        if self._bar is not None:
            self._bar.update(n)

    def finish(self) -> None:
        """Draws 100 % and ends the bar."""
        if not self.enabled:
            return
        self._start()
        self.done = self.total
        self._bar.update(self.total - self._bar.n)
        self._close()

    def abandon(self) -> None:
        """Stops drawing where the job stopped (an error, Ctrl-C), ending the terminal's line."""
        if self.enabled:
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self.enabled = False
