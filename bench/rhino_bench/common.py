"""What the benchmark drivers that run worker processes share (`rhino-bench replicate`,
`rhino-bench overhead`)."""

from __future__ import annotations

import signal
import sys

__all__ = ["exit_on_sigterm", "raise_if_stopped", "max_chunk_bytes"]

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
