"""A failover's re-open of an instance that a commit holds (docs/protocol.md §7.1 open),
on a real worker process whose commits take 3 s (the ``service.commit`` delay point, as a
busy disk makes them slow).

The re-open raises the fence and answers at once, ``deferred``, instead of waiting for the
commit: in the recovery bench a survivor's re-open waited 0.39 s for the cancelled
attempt's commit, and the failover (so the rerun) waited for it (2026-11-27). What must
still hold:

- the commit that was under way is refused (it was fenced before its last check), and
  nothing of it is written;
- whatever takes the instance next sees the new epoch: a session at the old epoch is
  refused, one at the new epoch runs and commits;
- the placement is durable at once: a worker SIGKILLed before anything took the instance
  again hosts it at the new epoch after its restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

DELAY_MS = 3000


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path, SECRET)


def _commit_in_thread(address: str, op: str, batch: int, epoch: int, box: dict) -> threading.Thread:
    """A session's commit in a thread of its own (it holds the instance for DELAY_MS);
    its outcome goes to ``box``."""

    def run() -> None:
        try:
            with rhino.connect(address, secret=SECRET) as cc:
                with cc.session(op, 0, batch=batch, epoch=epoch) as s:
                    s.put_batch(np.arange(100, dtype=np.int64), [b"v" * 10] * 100)
                    box["committed"] = s.commit()
        except rhino.RhinoError as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _until_busy(c: rhino.Client, op: str) -> None:
    deadline = time.monotonic() + 20
    while not c.status(op, 0, wait=False)["busy"]:
        assert time.monotonic() < deadline, "the commit never held the instance"
        time.sleep(0.01)


def test_reopen_of_a_busy_instance_answers_at_once_and_fences(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False,
                      env={"RHINO_DELAY_POINT": f"service.commit:{DELAY_MS}"}).start()
    box: dict = {}
    t = None
    try:
        c = rhino.connect(w.unix_socket, secret=SECRET)
        c.open_instance("re", 0, epoch=1, num_vnodes=8)
        t = _commit_in_thread(w.unix_socket, "re", 0, 1, box)
        _until_busy(c, "re")
        t0 = time.monotonic()
        info = c.open_instance("re", 0, epoch=2, num_vnodes=8)
        took = time.monotonic() - t0
        assert took < 1.0, f"the re-open waited {took:.2f} s for the commit"
        assert info["deferred"] is True and info["epoch"] == 2 and info["reopen"]["deferred"] is True
        assert c.status("re", 0, wait=False)["busy"], "the commit ended too early for the test to mean anything"
        t.join(timeout=60)
        # the commit under way was fenced: refused, nothing written
        assert "committed" not in box and isinstance(box.get("error"), rhino.StaleEpochError), box
        st = c.status("re", 0)
        assert st["epoch"] == 2 and st["version"] is None and st["fence_epoch"] == 2
        with pytest.raises(rhino.StaleEpochError):
            c.session("re", 0, batch=0, epoch=1).__enter__()
        box.clear()
        t = _commit_in_thread(w.unix_socket, "re", 0, 2, box)
        t.join(timeout=60)
        assert "error" not in box, box
        assert c.status("re", 0)["version"] == 0
        # an idle instance is re-opened in place, not deferred
        info = c.open_instance("re", 0, epoch=3, num_vnodes=8)
        assert info["deferred"] is False if "deferred" in info else info["reopen"]["deferred"] is False
        assert info["epoch"] == 3
    finally:
        if t is not None:
            t.join(timeout=60)
        w.stop()


def test_a_deferred_placement_survives_a_kill(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False,
                      env={"RHINO_DELAY_POINT": f"service.commit:{DELAY_MS}"}).start()
    box: dict = {}
    try:
        c = rhino.connect(w.unix_socket, secret=SECRET)
        c.open_instance("dur", 0, epoch=1, num_vnodes=8)
        _commit_in_thread(w.unix_socket, "dur", 0, 1, box)
        _until_busy(c, "dur")
        info = c.open_instance("dur", 0, epoch=4, num_vnodes=8, chain=["127.0.0.9:1"], chain_version=7)
        assert info["deferred"] is True
        w.kill()  # before the commit let go of the instance: nothing applied the placement
        c.close()
        w.env = {}
        w.start()
        with rhino.connect(w.unix_socket, secret=SECRET) as c2:
            st = c2.status("dur", 0)
            assert st["hosted"] and st["epoch"] == 4 and st["chain_version"] == 7
            assert st["chain"] == ["127.0.0.9:1"]
            with pytest.raises(rhino.StaleEpochError):
                c2.session("dur", 0, batch=0, epoch=1).__enter__()
    finally:
        w.stop()
