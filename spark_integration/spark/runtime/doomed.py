"""A task of a doomed attempt ends itself, instead of holding its core for seconds.

Once the operator's epoch has moved past the one a batch attempt runs at, the driver will
refuse that attempt's commit whatever its tasks do (Rhino §4.1: an instance taken over
restarts from b-1), and the driver's batch watch cancels the attempt's Spark job
(``scheduling/host_loss.py``). Spark's cancellation does not reach a Python worker,
though: the executor only interrupts the task's JVM thread, and a monitor thread that
polls every 2 s (``PythonRunner.MonitorThread``; then ``spark.python.task.killTimeout``)
kills the worker. Meanwhile the cancelled task keeps its executor's only core, and the
next attempt's task for the instance that moved there, the one that ends the recovery,
waits for it: up to 2.2 s, 1.2 s on average, measured as up to 0.9 s of a recovery of
about 4 s (bench/results/spark_recovery.4G-2trials.md).

So each task watches the operator's epoch itself (its instance's epoch on the primary
every 50 ms, the coordinator's ``placement`` every 0.1 s) and, when it has moved past the
task's, ends its own
process, as Spark's monitor would have, but at once. The worker's connections close
with it, so the instance's primary aborts the task's session (protocol §7.2) and the next
attempt can open one. It waits ``grace_s`` (50 ms) first, and looks again as it ends: the
driver's watch cancels the job when it sees the new epoch, and a task that ends before its
cancellation arrives counts as a failed task rather than a killed one (harmless, but a crash
line in the executor's log); and a coordinator's standby that answered before it had seen
the change says the old epoch again. When a host is lost the driver cancels before it
reports the host, so the grace is spent after the cancellation, never before it: it is
kept short, since the next attempt's task for the moved instance waits for this core.

Only with the driver's watch on (``OperatorConfig.watch_hosts`` True): without it
nobody cancels the attempt, and a task waits for the failover itself.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["DoomedAttemptWatch"]


class DoomedAttemptWatch:
    """Ends this process once the operator's epoch has stayed above ``epoch`` for ``grace_s``,
    unless :meth:`stop` returned first. The epoch is the instance's on its primary
    (``local_epoch()``: the worker the task's session is on, every ``interval_s``), or the
    coordinator's (``coordinator().placement(operator_id).epoch``, every
    ``coordinator_every`` looks, or every look without ``local_epoch``). The primary's comes
    first: the coordinator's failover re-opens the instance there at the new epoch (the
    fence), and only publishes the epoch once every takeover is done; meanwhile this task's
    CPU is what the takeover's open on the same host waits for. A session fenced at its
    primary can no longer commit, so either is final. What cannot be reached ends nothing
    (the commit protocol alone keeps batches exactly-once). ``exit`` is how the process
    ends (``os._exit``; a test passes its own)."""

    def __init__(self, coordinator: Callable[[], Any], operator_id: str, epoch: int, *, what: str = "",
                 local_epoch: Optional[Callable[[], Optional[int]]] = None, interval_s: float = 0.05,
                 coordinator_every: int = 2, grace_s: float = 0.05,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.coordinator = coordinator
        self.local_epoch = local_epoch
        self.coordinator_every = max(1, int(coordinator_every))
        self._looks = 0
        self.operator_id = operator_id
        self.epoch = int(epoch)
        self.what = what or f"a task of {operator_id} at epoch {epoch}"
        self.interval_s = interval_s
        self.grace_s = grace_s
        self._exit = exit
        self._stop = threading.Event()
        # held while deciding to end the process, and by stop(): once stop() has returned,
        # the watch cannot end the process (a reused Python worker runs the next task)
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self.ended = False

    def __enter__(self) -> "DoomedAttemptWatch":
        self._thread = threading.Thread(target=self._run, name="rhino-doomed-attempt-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
        # not joined: a placement call in flight ends in its own time, and then the thread
        # sees the stop under the lock and returns without acting

    def _epoch(self) -> Optional[int]:
        self._looks += 1
        if self.local_epoch is not None:
            try:
                e = self.local_epoch()
            except Exception:  # noqa: BLE001 - a worker restarting, a dropped connection: no news
                e = None
            if e is not None and int(e) > self.epoch:
                return int(e)
            if self._looks % self.coordinator_every:
                return e
        try:
            return self.coordinator().placement(self.operator_id).epoch
        except Exception:  # noqa: BLE001 - a coordinator restarting, a dropped connection: no news
            return None

    def _run(self) -> None:
        stale_since: Optional[float] = None
        wait = self.interval_s
        while not self._stop.wait(wait):
            wait = self.interval_s
            e = self._epoch()
            if e is None or e <= self.epoch:
                stale_since = None
                continue
            now = time.monotonic()
            if stale_since is None:
                stale_since = now
            left = self.grace_s - (now - stale_since)
            if left > 0:
                wait = left  # looks again as the grace ends, not a whole interval later
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                self.ended = True
                msg = (f"rhino.spark: {self.what} is doomed (the operator moved to epoch {e}; the driver "
                       f"runs the batch again there): ending this Python worker now rather than when Spark's "
                       f"monitor kills it")
                print(msg, file=sys.stderr, flush=True)  # the executor's log, whatever logging is set up
                self._exit(1)
                return
