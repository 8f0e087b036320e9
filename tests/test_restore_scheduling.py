"""A latency-critical restore runs under the normal scheduling policy (src/cpp/util/sched.h).

A worker daemon's threads are SCHED_BATCH (rhino/daemon/worker.py, --sched): their wake-ups
never preempt a running executor thread. A takeover's or a rollback's restore is what the
recovered batch waits on, so it runs under SCHED_OTHER and then gives the thread its policy
back. The policy is read from inside the restore, by its progress callback, which runs on the
restoring thread; its open's own CPU and run-queue figures come from /proc/thread-self/schedstat.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import rhino

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling policies")

OP = "op"


def _checkpointed(tmp_path: Path, store: rhino.ReplicaStore) -> None:
    db = rhino.StateBackend.open(str(tmp_path / "live"), partitioner=rhino.Partitioner(num_vnodes=8),
                                 operator_id=OP, instance=0, checkpoint_wal_bytes=0)
    keys = np.arange(5000, dtype=np.int64)
    db.put_batch(keys, [b"v" * 100] * len(keys))
    db.checkpoint(store, 1)
    db.close()


def _restore_under_batch(store: rhino.ReplicaStore, target: Path, critical: bool) -> tuple[set[int], int, object]:
    """Restores from this thread switched to SCHED_BATCH; returns the policies seen during the
    restore, the thread's policy after it, and the restore's stats."""
    seen: set[int] = set()
    before = os.sched_getscheduler(0)
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # 0: this thread (Linux)
    try:
        db = store.restore(OP, 0, 1, str(target), sync=False, latency_critical=critical,
                           progress=lambda *_: seen.add(os.sched_getscheduler(0)))
        after = os.sched_getscheduler(0)
    finally:
        os.sched_setscheduler(0, before, os.sched_param(0))
    stats = db.restore_stats
    db.close()
    return seen, after, stats


def test_a_latency_critical_restore_runs_under_the_normal_policy_and_gives_the_policy_back(tmp_path, store):
    _checkpointed(tmp_path, store)
    seen, after, stats = _restore_under_batch(store, tmp_path / "critical", critical=True)
    assert seen == {os.SCHED_OTHER}
    assert after == os.SCHED_BATCH
    # the open's own figures: some CPU, and CPU plus run-queue wait within its wall time
    assert stats.open_cpu_seconds > 0 and stats.open_wait_seconds >= 0
    assert stats.open_cpu_seconds + stats.open_wait_seconds <= stats.open_seconds + 0.002


def test_a_background_restore_keeps_the_callers_policy(tmp_path, store):
    _checkpointed(tmp_path, store)
    seen, after, _ = _restore_under_batch(store, tmp_path / "background", critical=False)
    assert seen == {os.SCHED_BATCH}
    assert after == os.SCHED_BATCH


def _may_lower_nice() -> bool:
    """Whether this process may lower a thread's nice value (root, CAP_SYS_NICE, RLIMIT_NICE)."""
    tid = threading.get_native_id()
    now = os.getpriority(os.PRIO_PROCESS, tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, now - 1)
    except PermissionError:
        return False
    os.setpriority(os.PRIO_PROCESS, tid, now)
    return True


def test_a_latency_critical_restore_runs_at_a_lower_nice_value_where_allowed(tmp_path, store):
    _checkpointed(tmp_path, store)
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    seen: set[int] = set()
    for critical in (True, False):
        seen.clear()
        db = store.restore(OP, 0, 1, str(tmp_path / f"nice-{critical}"), sync=False, latency_critical=critical,
                           progress=lambda *_: seen.add(os.getpriority(os.PRIO_PROCESS, tid)))
        db.close()
        assert os.getpriority(os.PRIO_PROCESS, tid) == before  # given back
        if critical and _may_lower_nice():
            assert seen == {max(-20, before - 10)}
        else:  # a background restore, or no privilege: the thread's own nice value
            assert seen == {before}
