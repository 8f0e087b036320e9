"""What the benchmark drivers that run worker processes share: stopping on SIGTERM, their
output flags and JSON lines."""

from __future__ import annotations

import signal
import sys
from typing import Any

from .spark.common import Emitter

__all__ = ["exit_on_sigterm", "raise_if_stopped", "max_chunk_bytes", "io_flags", "JsonLines"]

_stop_signal: int | None = None


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit(143) in the main thread, so a bench stopped
    by `kill`, a CI timeout or a job scheduler unwinds through its `finally`
    blocks and stops its worker processes (they run in their own sessions and
    would otherwise outlive it). Further SIGTERMs are ignored while it unwinds,
    so a second `kill` cannot cut the clean-up short; SIGKILL still can."""

    def _unwind(signum: int, _frame: object) -> None:
        global _stop_signal
        _stop_signal = signum
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"rhino-bench: signal {signum} received, stopping the workers", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    def _interrupt(signum: int, frame: object) -> None:
        global _stop_signal
        _stop_signal = signum
        signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt

    signal.signal(signal.SIGTERM, _unwind)
    # Ctrl-C keeps Python's KeyboardInterrupt, remembered too (raise_if_stopped).
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


def raise_if_stopped() -> None:
    """Raises SystemExit again if a SIGTERM was received (KeyboardInterrupt for
    SIGINT). The handler's own exception can be lost: Python runs a handler at
    whatever bytecode the main thread is at, and an exception raised inside a
    finalizer or a callback whose caller swallows errors is dropped, so the long
    loops check this flag as well. (A bench started with SIGINT ignored, as a
    shell's background job is, keeps ignoring Ctrl-C: the Unix convention,
    which Python follows; that, not a lost exception, was why a SIGINTed bench
    went on in background test runs.)"""
    if _stop_signal == signal.SIGINT:
        raise KeyboardInterrupt
    if _stop_signal is not None:
        raise SystemExit(128 + _stop_signal)


def max_chunk_bytes() -> int:
    """The largest replication chunk: a chunk and its 16-byte header fit in one frame."""
    from rhino import _core

    return int(_core.MAX_FRAME_BYTES) - 16


_IO_HELP = {"keep": "keep the work directories", "json": "one JSON object per line on stdout",
            "out": "also append the JSON lines to this file", "plot": "write a chart here (PNG)",
            "report": "write a Markdown report here", "quiet": "no progress on stderr"}


def io_flags(p: Any, *, dir: str, dir_help: str = "work directory (default: %(default)s)",
             flags: tuple = ("keep", "json", "out", "plot", "report", "quiet"), **helps: str) -> None:
    """The output flags the drivers that do not run in :mod:`.frame` share: ``--dir`` and
    ``flags`` of --keep, --json, --out, --plot, --report, --quiet (``helps``: their help, by name)."""
    p.add_argument("--dir", default=dir, help=dir_help)
    for name in flags:
        kw = {"action": "store_true"} if name in ("keep", "json", "quiet") else {"default": None}
        p.add_argument(f"--{name}", help=helps.get(name, _IO_HELP[name]), **kw)


class JsonLines(Emitter):
    """A run's records (``rows``), as :class:`~.spark.common.Emitter` writes them, with ``--json``
    and ``--out`` from ``args``; without ``--json``, ``echo(row)``'s text on stderr, if given.
    ``say`` prints progress on stderr unless ``--quiet``."""

    def __init__(self, args: Any, echo: Any = None) -> None:
        super().__init__(args.json, args.out)
        self.rows, self.args, self.echo = self.records, args, echo

    def emit(self, row: dict) -> None:
        super().emit(row)
        if not self.args.json and self.echo is not None:
            print(self.echo(row), file=sys.stderr, flush=True)

    def say(self, msg: str) -> None:
        if not getattr(self.args, "quiet", False):
            print(msg, file=sys.stderr, flush=True)

    def __enter__(self) -> "JsonLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
