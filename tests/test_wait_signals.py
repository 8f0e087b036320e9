"""`ReplicationHandle.wait()` blocks in C++ with the GIL released, but it must
still let Python handle signals: Ctrl-C (KeyboardInterrupt) or a SIGTERM
handler may not have to wait for a transfer that can take minutes, or for a
peer that never answers. A real subprocess replicates to a TCP listener that
accepts and never answers (so the transfer cannot end for 60 s) and is
interrupted after it has started waiting."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import signal, socket, sys
    import numpy as np
    import rhino
    from rhino.replication import replicate

    root = sys.argv[1]
    store = rhino.ReplicaStore(root + "/store")
    with rhino.StateBackend.open(root + "/live", operator_id="op", instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=4)) as db:
        db.put_batch(np.arange(100, dtype=np.int64), [b"v" * 10] * 100)
        db.checkpoint(store, 1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel accepts; nobody ever reads or answers
    if sys.argv[2] == "term":
        def stop(signum, frame):
            raise SystemExit(143)
        signal.signal(signal.SIGTERM, stop)
    h = replicate(store, "op", 0, 1, ["127.0.0.1:%d" % silent.getsockname()[1]], chain_version=1,
                  secret=b"s", timeout=60, peer_timeout=60, heartbeat=30)
    print("waiting", flush=True)
    try:
        h.wait()
    finally:
        print("wait left", flush=True)
""")


@pytest.mark.parametrize("how", ["int", "term"])
def test_wait_is_interrupted_by_a_signal(tmp_path: Path, how: str):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting", proc.stderr.read()
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT if how == "int" else signal.SIGTERM)
        # Without the fix, wait() returns only when the 60 s transfer timeout fires.
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "wait left" in out
    if how == "int":
        assert "KeyboardInterrupt" in err and proc.returncode != 0, err
    else:
        assert proc.returncode == 143, err
    assert took < 20


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_wait_refuses_a_negative_or_nan_timeout(tmp_path: Path, bad: float):
    import numpy as np

    import rhino
    from rhino.replication import replicate

    store = rhino.ReplicaStore(str(tmp_path / "store"))
    with rhino.StateBackend.open(str(tmp_path / "live"), operator_id="op", instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=4)) as db:
        db.put_batch(np.arange(10, dtype=np.int64), [b"v"] * 10)
        db.checkpoint(store, 1)
    # Nobody listens on port 9 of 127.0.0.1 here: the transfer fails soon, but the timeout is refused first.
    h = replicate(store, "op", 0, 1, ["127.0.0.1:9"], chain_version=1, secret=b"s", timeout=5)
    with pytest.raises(rhino.InvalidArgumentError, match="timeout must be"):
        h.wait(bad)
    h.cancel()
