"""A local multi-host cluster of real `rhino worker` processes (DESIGN §6):
each on its own loopback address 127.0.0.N, with its own store, started with
setsid and stopped or killed by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import rocksdict

SECRET = b"rhino-test-secret-0123456789"


class WorkerProc:
    def __init__(self, root: Path, worker_id: str, host: str, *, secret_file: Path, port: int = 0,
                 metrics: bool = True, env: dict | None = None, preexec_fn=None,
                 peer_timeout_ms: int = 1500, heartbeat_ms: int = 250, extra_args: list[str] | None = None) -> None:
        self.id = worker_id
        self.host = host
        self.dir = root / worker_id
        self.log_path = root / f"{worker_id}.log"
        self.secret_file = secret_file
        self.requested_port = port
        self.metrics_enabled = metrics
        self.env = env
        self.preexec_fn = preexec_fn
        self.peer_timeout_ms = peer_timeout_ms
        self.heartbeat_ms = heartbeat_ms
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.metrics_port = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> WorkerProc:
        # Restart on the same port if we had one, so a chain's address stays valid.
        port = self.port or self.requested_port
        cmd = [sys.executable, "-m", "rhino.worker", "--id", self.id, "--dir", str(self.dir),
               "--listen", f"{self.host}:{port}", "--secret-file", str(self.secret_file),
               "--peer-timeout-ms", str(self.peer_timeout_ms), "--heartbeat-ms", str(self.heartbeat_ms)]
        if self.metrics_enabled:
            cmd += ["--metrics-listen", f"{self.host}:0"]
        cmd += self.extra_args
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True, preexec_fn=self.preexec_fn)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.events(offset):
                if rec.get("event") == "metrics_listening":
                    self.metrics_port = rec["port"]
                if rec.get("event") == "listening":
                    self.port = rec["port"]
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.id} exited with {self.proc.returncode}: {self.log_path.read_text()}")
            time.sleep(0.02)
        raise RuntimeError(f"worker {self.id} did not start: {self.log_path.read_text()}")

    def events(self, offset: int = 0) -> list[dict]:
        out = []
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                for line in f.read().splitlines():
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        except FileNotFoundError:
            pass
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait: the clean shutdown path. Returns the exit code."""
        if not self.alive():
            return self.proc.returncode if self.proc else 0
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of the Prometheus endpoint, e.g. metric("rhino_worker_auth_failures_total")."""
        prefix = f'{name}{{worker="{self.id}"' + ("," + labels if labels else "") + "}"
        for line in self.metrics_text().splitlines():
            if line.startswith(prefix + " "):
                return float(line.split()[-1])
        raise KeyError(prefix)


def write_secret(root: Path, secret: bytes = SECRET) -> Path:
    p = root / "secret"
    p.write_bytes(secret + b"\n")
    os.chmod(p, 0o600)
    return p


def read_rocksdb(path: str | Path) -> dict[str, dict[bytes, bytes]]:
    """{column family: {key: value}} of a RocksDB directory, read by rocksdict
    (its own RocksDB build, read-only): a reader that shares no code with Rhino."""
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
