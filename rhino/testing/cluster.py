"""Helpers shared by the benchmarks and the demo that run real worker processes
(`rhino bench replicate`, `rhino bench overhead`, `rhino demo`): starting and stopping
`rhino.worker` daemons on 127.0.0.N, and reading a process's RSS and CPU time
from /proc.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

SECRET = b"bench-secret"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit(143) in the main thread, so a bench stopped
    by `kill`, a CI timeout or a job scheduler unwinds through its `finally`
    blocks and stops its worker processes (they run in their own sessions and
    would otherwise outlive it). Further SIGTERMs are ignored while it unwinds,
    so a second `kill` cannot cut the clean-up short; SIGKILL still can."""

    def _unwind(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"rhino bench: signal {signum} received, stopping the workers", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _unwind)


def max_chunk_bytes() -> int:
    """The largest replication chunk: a chunk and its 16-byte header fit in one frame."""
    from . import _core

    return int(_core.MAX_FRAME_BYTES) - 16


def new_secret() -> bytes:
    """A random shared secret as text (64 hex digits): what `openssl rand -hex 32` gives an operator.
    Raw random bytes would not do: `read_secret_file`, which the workers use, strips surrounding
    whitespace, so a random secret that began or ended with such a byte (about 1 in 20) would
    differ between the file's readers and a caller that kept the raw bytes."""
    return secrets.token_hex(32).encode()


def write_secret(root: Path, secret: bytes = SECRET) -> Path:
    """Writes `secret` to root/secret, readable by its owner only from the start (mode 0600)."""
    if secret != secret.strip() or not secret:
        raise ValueError("a secret file's secret must be non-empty, with no surrounding whitespace "
                         "(read_secret_file strips it)")
    path = root / "secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return path


class Worker:
    """One `python -m rhino.worker` process on 127.0.0.`n`, store in root/w`n`,
    log in root/w`n`.log (JSON lines); the port is chosen by the kernel and
    read back from the log's `listening` event."""

    def __init__(self, root: Path, n: int, secret_file: Path, max_window: int, extra_args: list[str] | None = None,
                 timeout: float = 30.0) -> None:
        self.id = f"w{n}"
        self.dir = root / self.id
        self.host = f"127.0.0.{n}"
        self.log_path = root / f"{self.id}.log"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rhino.worker", "--id", self.id, "--dir", str(self.dir), "--listen",
             f"{self.host}:0", "--secret-file", str(secret_file), "--max-window", str(max_window),
             *(extra_args or [])],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.port = 0
        try:
            self._await_listening(timeout)
        except BaseException:  # a signal or Ctrl-C while it starts: it is not in any list yet
            self.stop()
            raise
        if not self.port:
            self.stop()
            raise RuntimeError(f"worker {self.id} did not start; its log: {self.log_path.read_text()[-2000:]}")

    def _await_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.port and time.monotonic() < deadline:
            for line in self.log_path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "listening" and rec.get("worker") == self.id:
                    self.port = rec["port"]
            if not self.port and self.proc.poll() is not None:
                break
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (the clean shutdown), then SIGKILL if it does not exit in time."""
        if self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_workers(root: Path, numbers: list[int], secret_file: Path, max_window: int,
                  extra_args: list[str] | None = None) -> list[Worker]:
    """Workers on 127.0.0.n for every n in `numbers`; all stopped again if one fails to start."""
    workers: list[Worker] = []
    try:
        for n in numbers:
            workers.append(Worker(root, n, secret_file, max_window, extra_args))
    except BaseException:
        for w in workers:
            w.stop()
        raise
    return workers


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _stat_fields(path: str) -> tuple[str, list[str]]:
    """(comm, fields after comm) of a /proc/.../stat file; comm may hold spaces and parentheses."""
    with open(path) as f:
        text = f.read()
    lpar, rpar = text.index("("), text.rindex(")")
    return text[lpar + 1:rpar], text[rpar + 2:].split()


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time of a whole process (every thread, including threads that have exited)."""
    _, fields = _stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime: fields 14, 15 of stat(5)


def thread_cpu_seconds(pid: int | str = "self") -> dict[int, tuple[str, float]]:
    """{tid: (thread name, user + system CPU seconds)} for the threads alive now."""
    out: dict[int, tuple[str, float]] = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            comm, fields = _stat_fields(f"{base}/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # the thread ended while we listed
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    return out


def system_cpu_seconds() -> dict[str, float]:
    """Machine-wide CPU seconds since boot from /proc/stat, summed over all CPUs, by state."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    vals = {n: int(v) / _CLK_TCK for n, v in zip(names, parts[1:9])}
    return vals


def thread_schedstat(pid: int | str = "self") -> dict[int, tuple[str, float, float]]:
    """{tid: (thread name, seconds on a CPU, seconds runnable but waiting for a CPU)}
    from /proc/<pid>/task/<tid>/schedstat, for the threads alive now."""
    out: dict[int, tuple[str, float, float]] = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = f.read().split()
            with open(f"{base}/{tid}/comm") as f:
                comm = f.read().strip()
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        out[int(tid)] = (comm, int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out


def pressure_seconds() -> dict[str, float]:
    """Cumulative pressure-stall time (PSI) in seconds: cpu_some, io_some, io_full; {} without PSI."""
    out: dict[str, float] = {}
    for res in ("cpu", "io"):
        try:
            with open(f"/proc/pressure/{res}") as f:
                for line in f:
                    kind, *fields = line.split()
                    total = dict(x.split("=") for x in fields)["total"]
                    out[f"{res}_{kind}"] = int(total) / 1e6
        except OSError:
            pass
    return out
