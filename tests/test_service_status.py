"""`status` while a commit holds its instance (docs/protocol.md §7.1), on a real worker
process whose commits take 4 s (the ``service.commit`` delay point, as a busy disk makes
them slow), so the commit holds the instance for as long as the test needs.

- With ``wait=False`` the answer comes at once, ``busy``, with the instance's fence
  epoch: what a doomed task polls for (rhino.spark's task watch).
- A ``status`` that waits for the instance does not hold up the worker's other instance
  requests: a failover's takeover or re-open there must not queue behind it (before,
  it ran on the admin strand, and a failover's decision waited 0.46-0.87 s behind a
  task's poll in the recovery bench, 2026-11-27)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path, SECRET)


def test_status_neither_waits_for_a_commit_nor_holds_up_other_requests(tmp_path: Path, secret_file: Path) -> None:
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False,
                       env={"RHINO_DELAY_POINT": "service.commit:4000"}).start()
    threads: list[threading.Thread] = []
    waited: dict[str, dict] = {}
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("st", 0, epoch=3, num_vnodes=8)
        st = c.status("st", 0, wait=False)
        assert st["hosted"] and not st["busy"] and st["epoch"] == 3 and st["fence_epoch"] == 3
        assert c.status("nowhere", 7) == {"checkpoints": [], "fence_epoch": 0, "hosted": False,
                                          "queued_s": pytest.approx(0, abs=5)}

        def commit() -> None:
            with rhino.connect(w2.unix_socket, secret=SECRET) as cc:
                with cc.session("st", 0, batch=0, epoch=3) as s:
                    s.put_batch(np.arange(1000, dtype=np.int64), [b"v" * 100] * 1000)
                    s.commit()

        threads.append(threading.Thread(target=commit, daemon=True))
        threads[-1].start()
        deadline = time.monotonic() + 20
        while True:  # until the commit holds the instance
            t0 = time.monotonic()
            st = c.status("st", 0, wait=False)
            took = time.monotonic() - t0
            assert took < 1.0, f"status without wait took {took:.2f} s"
            if st["busy"]:
                break
            assert time.monotonic() < deadline, "the commit never held the instance"
            time.sleep(0.01)
        assert st["hosted"] and st["fence_epoch"] == 3 and "epoch" not in st and "version" not in st

        def waiting_status() -> None:
            with rhino.connect(w2.unix_socket, secret=SECRET) as cc:
                waited["st"] = cc.status("st", 0)  # waits for the commit

        threads.append(threading.Thread(target=waiting_status, daemon=True))
        threads[-1].start()
        time.sleep(0.2)
        t0 = time.monotonic()
        opened = c.open_instance("other", 0, epoch=1, num_vnodes=8)  # an admin request
        took = time.monotonic() - t0
        assert opened["epoch"] == 1
        busy = c.status("st", 0, wait=False)["busy"]
        assert took < 1.0, f"an open waited {took:.2f} s behind a status waiting for a commit"
        assert busy and "st" not in waited, "the commit ended too early for the test to mean anything"
        for t in threads:
            t.join(timeout=60)
        # the waiting status answered once the commit was done
        assert waited["st"]["hosted"] and waited["st"]["busy"] is False and waited["st"]["version"] == 0
    finally:
        for t in threads:
            t.join(timeout=60)
        w2.stop()


def test_status_refuses_a_wait_that_is_not_a_bool(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            with pytest.raises(TypeError, match="wait must be a bool"):
                c.status("st", 0, wait=1)  # type: ignore[arg-type]
            # the worker's own check, for clients that are not this one
            with pytest.raises(rhino.InvalidArgumentError, match="'wait' has the wrong type"):
                c._call("status", "st", 0, 0, {"wait": "no"})
            assert c.status("st", 0)["hosted"] is False  # the worker goes on
    finally:
        w.stop()
