"""A local multi-host cluster of real ``rhino worker`` processes (docs/design.md §6), for the
tests, the benchmarks (``rhino-bench replicate``, ``rhino-bench overhead``) and the
demo:

- :class:`WorkerProcess`: one ``python -m rhino.daemon.worker`` on its own loopback
  address 127.0.0.N with its own store directory, started in its own session and
  stopped (SIGTERM) or killed (SIGKILL) by PID; :func:`start_workers` starts several;
- :func:`write_secret` / :func:`new_secret`: the cluster's shared-secret file;
- :func:`rss_kb`, :func:`cpu_seconds`, ...: what the benchmarks read from /proc;
- :func:`read_rocksdb`: a RocksDB directory read by rocksdict, a reader that shares
  no code with Rhino (rocksdict is imported when it is called, so this module does
  not need it).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["SECRET", "WorkerProcess", "start_workers", "new_secret", "write_secret", "read_rocksdb",
           "rss_kb", "cpu_seconds", "thread_cpu_seconds", "system_cpu_seconds", "thread_schedstat",
           "pressure_seconds"]

SECRET = b"rhino-test-secret-0123456789"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- the shared secret --------------------------------------------------------------


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
    path = Path(root) / "secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT
    return path


# ---- worker processes -----------------------------------------------------------------


def read_log_events(path: Path, offset: int = 0) -> list[dict]:
    """The JSON records (one per line) of a daemon's log file from byte `offset` on."""
    out = []
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            for line in f.read().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


class WorkerProcess:
    """One ``python -m rhino.daemon.worker`` process: id `worker_id`, listening on `host`
    (127.0.0.N), store in root/`worker_id`, log in root/`worker_id`.log (JSON lines).

    The data-plane port is chosen by the kernel unless `port` is given, and read back
    from the log's ``listening`` event; a restart (``start()`` again) reuses it, so a
    chain's address stays valid. `metrics` also serves ``/metrics`` on `host` (any port).
    `heartbeat_ms`, `peer_timeout_ms` and `max_window` are passed on when given; None
    keeps the daemon's defaults. Construct, then :meth:`start`.
    """

    def __init__(self, root: Path, worker_id: str, host: str, *, secret_file: Path, port: int = 0,
                 metrics: bool = True, max_window: Optional[int] = None, heartbeat_ms: Optional[int] = None,
                 peer_timeout_ms: Optional[int] = None, env: Optional[dict[str, str]] = None,
                 preexec_fn: Optional[Callable[[], Any]] = None, extra_args: Optional[list[str]] = None) -> None:
        root = Path(root)
        self.id = worker_id
        self.host = host
        self.dir = root / worker_id
        self.log_path = root / f"{worker_id}.log"
        self.secret_file = Path(secret_file)
        self.requested_port = port
        self.metrics_enabled = metrics
        self.max_window = max_window
        self.heartbeat_ms = heartbeat_ms
        self.peer_timeout_ms = peer_timeout_ms
        self.env = env
        self.preexec_fn = preexec_fn
        self.extra_args = list(extra_args or [])
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.metrics_port = 0
        # The state service's Unix socket: in root if the path fits a sockaddr_un
        # (107 bytes), else in a short directory of its own under /tmp.
        sock = (root / f"{worker_id}.sock").resolve()
        if len(os.fsencode(str(sock))) > 100:
            sock = Path(tempfile.mkdtemp(prefix="rhino-sock-")) / f"{worker_id}.sock"
        self.unix_socket = sock
        self.state_dir = self.dir / "state"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "rhino.daemon.worker", "--id", self.id, "--dir", str(self.dir),
               "--listen", f"{self.host}:{port}", "--secret-file", str(self.secret_file),
               "--unix-socket", str(self.unix_socket)]
        for flag, value in (("--max-window", self.max_window), ("--heartbeat-ms", self.heartbeat_ms),
                            ("--peer-timeout-ms", self.peer_timeout_ms)):
            if value is not None:
                cmd += [flag, str(value)]
        if self.metrics_enabled:
            cmd += ["--metrics-listen", f"{self.host}:0"]
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0) -> "WorkerProcess":
        """Starts the process and waits for its ``listening`` event. A worker that exits or does
        not listen in time is stopped, and RuntimeError raised. A worker whose start is interrupted
        (Ctrl-C, a signal) is stopped too before the exception goes on: it is in nobody's list yet."""
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        port = self.port or self.requested_port  # a restart keeps its port
        self.metrics_port = 0
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(port), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                         preexec_fn=self.preexec_fn)
        finally:
            log.close()
        try:
            problem = self._await_listening(offset, timeout)
        except BaseException:
            self.stop()
            raise
        if problem:
            self.stop()
            raise RuntimeError(f"worker {self.id} {problem}; its log: {self.log_path.read_text()[-2000:]}")
        return self

    def _await_listening(self, offset: int, timeout: float) -> Optional[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.events(offset):
                if rec.get("worker") != self.id:
                    continue
                if rec.get("event") == "metrics_listening":
                    self.metrics_port = rec["port"]
                if rec.get("event") == "listening":
                    self.port = rec["port"]
                    return None
            if self.proc.poll() is not None:
                return f"exited with {self.proc.returncode}"
            time.sleep(0.02)
        return f"did not start in {timeout:g} s"

    def events(self, offset: int = 0) -> list[dict]:
        """The JSON log records of the worker's log file from byte `offset` on."""
        return read_log_events(self.log_path, offset)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` (SIGKILL: a crash) and waits for the process to end."""
        if self.alive():
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (the clean shutdown) and wait; SIGKILL if it does not exit in `timeout`.
        Returns the exit code (0 for a clean shutdown, negative for a signal)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def metrics_text(self) -> str:
        """The ``/metrics`` page (Prometheus text format); needs `metrics`."""
        with urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of the Prometheus endpoint, e.g. metric("rhino_worker_auth_failures_total"),
        metric("rhino_worker_checkpoints_total", 'state="complete"'): the sample of that name whose
        labels are exactly `labels` plus this worker's ``worker`` label, in any order."""
        from prometheus_client.parser import text_string_to_metric_families

        want = {"worker": self.id, **dict(re.findall(r'(\w+)="([^"]*)"', labels))}
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and sample.labels == want:
                    return float(sample.value)
        raise KeyError(f"{name} {want}")


class CoordinatorProcess:
    """One ``python -m rhino.coordinator.server`` process on `host`, metadata in
    root/coordinator, log in root/coordinator.log. The port is fixed at the
    first start (a free one unless given) and kept by a restart, so the workers'
    ``--coordinator`` address stays valid."""

    def __init__(self, root: Path, *, secret_file: Path, host: str = "127.0.0.1", port: int = 0,
                 heartbeat_timeout: float = 1.0, extra_args: Optional[list[str]] = None) -> None:
        self.root = Path(root)
        self.dir = self.root / "coordinator"
        self.log_path = self.root / "coordinator.log"
        self.secret_file = Path(secret_file)
        self.host = host
        self.port = port or _free_port(host)
        self.heartbeat_timeout = heartbeat_timeout
        self.extra_args = list(extra_args or [])
        self.proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "rhino.coordinator.server", "--listen", self.address, "--dir", str(self.dir),
                "--secret-file", str(self.secret_file), "--heartbeat-timeout", str(self.heartbeat_timeout)] + \
            self.extra_args

    def start(self, timeout: float = 30.0) -> "CoordinatorProcess":
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(r.get("event") == "listening" for r in self.events(offset)):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the coordinator did not start; its log: {self.log_path.read_text()[-2000:]}")

    def events(self, offset: int = 0) -> list[dict]:
        """The JSON log records of the coordinator's log file from byte `offset` on."""
        return read_log_events(self.log_path, offset)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_workers(root: Path, numbers: list[int], secret_file: Path, max_window: int,
                  extra_args: Optional[list[str]] = None) -> list[WorkerProcess]:
    """Workers w`n` on 127.0.0.`n` for every n in `numbers`, without metrics, with the daemon's
    timeouts; all stopped again if one fails to start."""
    workers: list[WorkerProcess] = []
    try:
        for n in numbers:
            workers.append(WorkerProcess(root, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False,
                                         max_window=max_window, extra_args=extra_args).start())
    except BaseException:
        for w in workers:
            w.stop()
        raise
    return workers


# ---- an independent RocksDB reader ---------------------------------------------------------


def read_rocksdb(path: str | Path) -> dict[str, dict[bytes, bytes]]:
    """{column family: {key: value}} of a RocksDB directory, read by rocksdict
    (its own RocksDB build, read-only): a reader that shares no code with Rhino.
    Close the Rhino handle first, or read a directory nobody writes to."""
    import rocksdict  # the test and bench extras; not a dependency of the package

    path = str(path)
    names = rocksdict.Rdict.list_cf(path)
    db = rocksdict.Rdict(
        path,
        options=rocksdict.Options(raw_mode=True),
        column_families={n: rocksdict.Options(raw_mode=True) for n in names if n != "default"},
        access_type=rocksdict.AccessType.read_only(),
    )
    try:
        out = {"default": dict(db.items())}
        for n in names:
            if n != "default":
                cf = db.get_column_family(n)
                out[n] = dict(cf.items())
                del cf
        return out
    finally:
        db.close()


# ---- /proc readings ---------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """Resident memory of a process, in KiB."""
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
