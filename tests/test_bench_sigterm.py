"""A bench stopped by SIGTERM (`kill`, a CI timeout, a job scheduler) or Ctrl-C stops the
worker processes it started: they run in their own sessions, so nothing else
would. Real `rhino-bench overhead` / `rhino-bench replicate` processes, real
workers on 127.0.0.2 and .3, found through /proc, not through the bench."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _as_at_a_terminal() -> None:
    """The child starts with SIGINT at its default, as a command typed at a terminal does.
    A shell's background job (``make test &``, a CI harness) starts with SIGINT ignored,
    and Python, like any Unix program, then leaves Ctrl-C ignored: the bench rightly
    does not install its SIGINT handler, and the SIGINT cases below would see it go on.
    (That was why a SIGINTed bench "went on" on CI and in background runs here.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def worker_pids(work: Path) -> set[int]:
    """PIDs of live `rhino.daemon.worker` processes whose command line names `work`."""
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"rhino.daemon.worker" in argv and any(str(work).encode() in a for a in argv):
            pids.add(int(name))
    return pids


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def listening(log: Path) -> bool:
    return log.exists() and '"listening"' in log.read_text()


@pytest.mark.parametrize("bench,sig", [("overhead", signal.SIGTERM), ("replicate", signal.SIGTERM),
                                       ("overhead", signal.SIGINT)])
def test_a_stopped_bench_stops_its_workers(tmp_path: Path, bench: str, sig: signal.Signals):
    work = tmp_path / "work"
    if bench == "overhead":
        args = ["--pairs", "1", "--duration", "60", "--warmup", "0", "--checkpoint-interval", "0.3",
                "--initial-keys", "20000", "--batch-keys", "2000", "--value-size", "64", "--dir", str(work), "--json"]
        logs = [work / "w2.log", work / "w3.log"]
    else:
        args = ["--workers", "2", "--replicas", "2", "--size", "64M", "--dir", str(work), "--json"]
        logs = [work / "r2-plain" / "w2.log", work / "r2-plain" / "w3.log"]
    proc = subprocess.Popen([sys.executable, "-m", "rhino_bench", bench, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_at_a_terminal)
    frozen: list[int] = []
    try:
        wait_for(lambda: all(listening(p) for p in logs), 120, "both workers to listen")
        pids = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(worker_pids(work)), 10, "two worker PIDs")
        if bench == "replicate":
            # Freeze the chain's head, so the transfer is surely still in flight
            # when the bench is told to stop (a 64 MiB transfer is quick).
            (head,) = [p for p in pids if b"127.0.0.2:" in Path(f"/proc/{p}/cmdline").read_bytes()]
            os.kill(head, signal.SIGSTOP)
            frozen.append(head)
            time.sleep(0.5)
        assert proc.poll() is None, "the bench ended before it was signalled"
        os.kill(proc.pid, sig)
        for p in frozen:
            os.kill(p, signal.SIGCONT)
        _, err = proc.communicate(timeout=120)
    finally:
        for p in frozen:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # reaps it and closes the pipes (no ResourceWarning in a later test)
    left = worker_pids(work) & pids
    for p in left:  # do not leak them into the rest of the suite, whatever the verdict
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers still running after the bench stopped: {sorted(left)}"
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "stopping the workers" in err
    else:  # Ctrl-C: KeyboardInterrupt, reported by the CLI
        assert proc.returncode == 130, err
        assert "rhino-bench: interrupted" in err
    assert not work.exists(), "the work directory (no --keep) was left behind"


@pytest.mark.parametrize("sig, want", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "SystemExit 143")])
def test_a_signal_whose_exception_was_swallowed_still_stops_the_loops(sig: signal.Signals, want: str):
    """The handler's exception lost (here: caught on purpose, as a finalizer or a
    careless callback would) still stops the bench at its next raise_if_stopped()."""
    code = f"""
import os, signal
from rhino_bench.common import exit_on_sigterm, raise_if_stopped
exit_on_sigterm()
try:
    os.kill(os.getpid(), {int(sig)})
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary: the handler runs here
except BaseException:
    pass  # swallowed
try:
    raise_if_stopped()
    print("went on")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
except SystemExit as e:
    print("SystemExit", e.code)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=_as_at_a_terminal)
    assert r.stdout.strip() == want, r.stdout + r.stderr


def test_a_bench_test_that_times_out_stops_the_bench_with_sigterm(tmp_path):
    """The bench tests' runner (helpers.run_bench) sends SIGTERM on a timeout, so the bench
    takes its cluster down, instead of SIGKILLing the bench alone and leaving the cluster's
    daemons (their own sessions) running for the rest of the suite."""
    from helpers import run_bench

    marker = tmp_path / "unwound"
    code = ("import signal, sys, time\n"
            f"def unwind(*_):\n    open({str(marker)!r}, 'w').write('x')\n    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, unwind)\n"
            "print('started', file=sys.stderr, flush=True)\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"no result within 2 s; stopped with SIGTERM(.|\n)*started"):
        run_bench([sys.executable, "-c", code], cwd=tmp_path, timeout=2)
    assert marker.exists() and time.monotonic() - t0 < 30
