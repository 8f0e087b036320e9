"""`rhino worker` with a bad configuration: a clear log line or usage error and a
non-zero exit, before the store is touched, and never the shared secret in
what it prints (a pybind TypeError used to echo every argument of the call)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SECRET = b"do-not-print-me-4711"


def run_worker(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    cmd = [sys.executable, "-m", "rhino.daemon.worker", "--id", "wbad", "--dir", str(tmp_path / "store"),
           "--listen", "127.0.0.2:0", "--secret-file", str(secret), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, status, message", [
    (["--heartbeat-ms", "-1"], 2, "argument --heartbeat-ms: expected an integer from 0 to 4294967295"),
    (["--stream-idle-timeout-ms", "-5"], 2, "argument --stream-idle-timeout-ms: expected an integer from 0"),
    (["--max-window", "x"], 2, "argument --max-window: expected a non-negative integer"),
    (["--io-threads", "99999999999"], 2, "argument --io-threads: expected an integer from 0 to 4294967295"),
    (["--metrics-listen", "127.0.0.2:99999"], 2, "address '127.0.0.2:99999' is not HOST:PORT"),
    (["--heartbeat-ms", "0"], 1, "heartbeat_ms must be >= 1"),
    (["--peer-timeout-ms", "500", "--heartbeat-ms", "500"], 1, "peer_timeout_ms (500) must exceed heartbeat_ms (500)"),
    (["--max-frame-bytes", "10"], 1, "max_frame_bytes must be in [65536, 268435456], got 10"),
    (["--max-frame-bytes", "999999999"], 1, "max_frame_bytes must be in [65536, 268435456]"),
    (["--max-window", "0"], 1, "max_window must be >= 1"),
    (["--io-threads", "0"], 1, "thread counts must be >= 1"),
    (["--service-threads", "0"], 1, "thread counts must be >= 1"),
    (["--unix-socket", "/tmp/" + "x" * 120 + ".sock"], 2, "longer than 107 bytes"),
    (["--session-idle-timeout", "-1"], 2, "--session-idle-timeout must be in [0, 86400] seconds"),
    (["--replication-timeout", "0"], 2, "--replication-timeout must be in (0, 86400] seconds"),
    (["--max-session-bytes", "lots"], 2, "argument --max-session-bytes"),
])
def test_bad_configuration_is_refused_clearly(tmp_path, args, status, message):
    p = run_worker(tmp_path, *args)
    out = p.stdout + p.stderr
    assert p.returncode == status and message in out, out
    assert "Traceback" not in out and SECRET.decode() not in out
    assert not (tmp_path / "store").exists()  # refused before the store was created


def test_an_empty_secret_file_is_refused(tmp_path):
    (tmp_path / "empty").write_bytes(b" \n")
    p = subprocess.run([sys.executable, "-m", "rhino.daemon.worker", "--id", "w", "--dir", str(tmp_path / "store"),
                        "--listen", "127.0.0.2:0", "--secret-file", str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "is empty" in p.stdout + p.stderr


def test_no_unix_socket(tmp_path):
    """--unix-socket none: no socket file, and the state service still serves over TCP."""
    import rhino
    from rhino_testing.harness.workers import SECRET as CLUSTER_SECRET, WorkerProcess, write_secret

    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=write_secret(tmp_path, CLUSTER_SECRET),
                      metrics=False, extra_args=["--unix-socket", "none"]).start()
    try:
        listening = [e for e in w.events() if e["event"] == "listening"][-1]
        assert listening["unix_socket"] is None and not w.unix_socket.exists()
        with rhino.connect(w.address, secret=CLUSTER_SECRET) as c:
            c.open_instance("tcp-only", 0, epoch=1, num_vnodes=4)
            with c.session("tcp-only", 0, batch=0, epoch=1) as s:
                s.put_batch([1], [b"one"])
                s.commit()
    finally:
        w.stop()
