"""A task of a doomed attempt ends its own Python worker (spark_integration/spark/runtime/doomed.py).

Unit tests of the watch alone, against a scripted coordinator (the placement answers are
the only input), and one in a real subprocess whose main thread is blocked, as a task's
is in a call into the worker: the process must end with status 1 soon after the epoch
moved, and only then. The whole path under Spark runs in the host-loss tests
(test_spark_host_loss.py, test_spark_exactly_once.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from placements import placement
from rhino.coordinator.types import Placement
from rhino.errors import RhinoIOError
from rhino.spark.runtime.doomed import DoomedAttemptWatch


class Placements:
    """``placement(op)`` answers the epochs in turn (the last one forever); an exception in
    the list is raised instead."""

    def __init__(self, *epochs: object) -> None:
        self.epochs = list(epochs)
        self.calls = 0

    def placement(self, op: str) -> Placement:
        assert op == "op"
        self.calls += 1
        e = self.epochs.pop(0) if len(self.epochs) > 1 else self.epochs[0]
        if isinstance(e, BaseException):
            raise e
        return placement(e)


def _watch(coord: Placements, **kw: object) -> tuple[DoomedAttemptWatch, list[int]]:
    exits: list[int] = []
    w = DoomedAttemptWatch(lambda: coord, "op", 3, exit=exits.append, interval_s=0.01, **kw)
    return w, exits


def _wait(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_a_newer_epoch_ends_the_process_after_the_grace():
    coord = Placements(3, 3, 4)
    w, exits = _watch(coord, grace_s=0.1)
    t0 = time.monotonic()
    with w:
        assert _wait(lambda: exits)
    assert exits == [1] and w.ended
    assert time.monotonic() - t0 >= 0.1  # not before the grace


def test_the_same_epoch_ends_nothing():
    coord = Placements(3)
    w, exits = _watch(coord, grace_s=0.0)
    with w:
        assert _wait(lambda: coord.calls >= 20)
    assert not exits and not w.ended


def test_a_task_that_finishes_within_the_grace_is_left_alone():
    coord = Placements(4)
    w, exits = _watch(coord, grace_s=0.5)
    with w:
        assert _wait(lambda: coord.calls >= 1)  # the new epoch seen: the grace runs
    time.sleep(0.7)  # past the grace, after stop(): a reused worker runs the next task
    assert not exits and not w.ended


def test_the_epoch_is_looked_at_again_as_the_grace_ends():
    # a long poll interval does not stretch the grace: the second look comes at its end
    coord = Placements(4)
    exits: list[int] = []
    w = DoomedAttemptWatch(lambda: coord, "op", 3, exit=exits.append, interval_s=0.05, grace_s=0.1)
    t0 = time.monotonic()
    with w:
        assert _wait(lambda: exits)
    took = time.monotonic() - t0
    # two looks, one interval in and as the grace ends (not one per interval until it passed)
    assert coord.calls == 2 and 0.15 <= took < 0.5


def test_an_epoch_seen_once_then_not_restarts_the_grace():
    # a stale answer, then the task's own epoch again (a coordinator failing over to a
    # standby that had not seen the change yet): the grace counts from scratch
    coord = Placements(4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3)
    w, exits = _watch(coord, grace_s=0.05)
    with w:
        assert _wait(lambda: coord.calls >= 20)
    assert not exits


def test_an_unreachable_coordinator_ends_nothing():
    coord = Placements(RhinoIOError("connection refused"), RuntimeError("anything"), KeyError("epoch"))
    w, exits = _watch(coord, grace_s=0.0)
    with w:
        assert _wait(lambda: coord.calls >= 10)
    assert not exits


def test_the_process_ends_while_its_main_thread_is_blocked(tmp_path):
    # the real exit (os._exit), with the main thread blocked as a task's is in a call into
    # the worker; stderr says why, for the executor's log
    code = textwrap.dedent("""
        import time
        from types import SimpleNamespace
        from rhino.spark.runtime.doomed import DoomedAttemptWatch

        class C:  # its placements: the epoch is all the watch reads
            n = 0
            def placement(self, op):
                C.n += 1
                return SimpleNamespace(epoch=7 if C.n > 3 else 5)

        with DoomedAttemptWatch(lambda: C(), "op", 5, what="the task of instance 2", interval_s=0.02, grace_s=0.1):
            time.sleep(60)
        print("not ended")
    """)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert time.monotonic() - t0 < 30
    assert "not ended" not in p.stdout
    assert "the task of instance 2 is doomed (the operator moved to epoch 7" in p.stderr


def test_the_primarys_epoch_ends_the_process_before_the_coordinator_publishes_it():
    # the failover has re-opened the instance on its primary at epoch 4 (the fence); the
    # coordinator still says 3 (the takeover is under way)
    coord = Placements(3)
    exits: list[int] = []
    w = DoomedAttemptWatch(lambda: coord, "op", 3, local_epoch=lambda: 4, exit=exits.append,
                           interval_s=0.01, grace_s=0.0)
    with w:
        assert _wait(lambda: exits)
    assert exits == [1] and coord.calls == 0


def test_the_coordinator_is_asked_every_other_look_when_the_primary_has_no_news():
    local = {"calls": 0}

    def unreachable() -> int:
        local["calls"] += 1
        raise RhinoIOError("connection refused")

    coord = Placements(3, 3, 3, 3, 5)
    exits: list[int] = []
    w = DoomedAttemptWatch(lambda: coord, "op", 3, local_epoch=unreachable, exit=exits.append,
                           interval_s=0.01, grace_s=0.0)
    with w:
        assert _wait(lambda: exits)
    assert coord.calls == 5 and local["calls"] == 10  # the coordinator's 5th answer: epoch 5
