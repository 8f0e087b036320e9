"""Host loss as Spark's driver sees it, passed on to the coordinator (docs/design.md §5).

While a batch's Spark job runs, a :class:`BatchWatch` thread in the driver does two things:

1. **Detection.** Spark's driver learns that an executor is gone within a fraction of a
   second (its RPC connection closes). When every executor of a host has gone, the watch
   reports each Rhino worker of that host to the coordinator (``report_unreachable``); the
   coordinator declares a worker dead only if it cannot reach it either, and then fails its
   instances over at once. Without this, the loss waits for the coordinator's heartbeat
   timeout (2 s by default), or for a task that happens to touch the dead worker. An
   executor lost on its own (an OOM, dynamic allocation) changes nothing: its host's Rhino
   worker still answers.
2. **Cancelling a doomed attempt.** Once the operator's epoch has moved past the one the
   job runs at, ``commit_batch`` will refuse the batch whatever the job does (Rhino §4.1:
   an instance taken over restarts from its last complete checkpoint, b-1), so the watch
   cancels the job's tag and the driver starts the next attempt right away, pinned to the
   new primaries. When the lost host holds a primary of the attempt, the watch cancels
   before it reports the host, so that Spark unwinds the job while the coordinator fails
   the instances over. Otherwise the attempt would run on: its retried task on the lost host's
   partition waits out ``spark.locality.wait`` for a host that is gone, then for the
   failover, before the batch can run again. Once the attempt is cancelled and the
   coordinator has answered every report (or the new epoch was seen), the watch is
   ``settled``: the driver begins the next attempt without waiting for the cancelled job's
   error to come back through py4j. Spark cancels only the jobs that run when it is asked,
   so the watch cancels the tag again every ``recancel_s`` until the attempt ends: a job the
   attempt submits after the first cancellation (the sink's next action, or its first one
   when the host was lost while the batch's input was still being shuffled) is cancelled
   too, not left to run its tasks into ``StaleEpochError`` until Spark's task-failure count
   aborts it ("failed 4 times", issue 45), on the cores the next attempt's tasks need.

The watch only reads Spark's status tracker and the coordinator's placement; the commit
protocol alone keeps batches exactly-once, with the watch or without it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from rhino.coordinator.types import Placement
from rhino.errors import RhinoError

__all__ = ["BatchWatch", "executor_hosts", "worker_hosts"]

log = logging.getLogger("rhino.spark")


def executor_hosts(sc: Any) -> Optional[set[str]]:
    """The hosts that have a live executor (or the driver, which the tracker lists too), as
    the driver's status tracker sees them; None if it cannot be read. A Rhino worker on the
    driver's own host is therefore never reported from here: the heartbeat finds it."""
    try:
        return {str(i.host()) for i in sc._jsc.sc().statusTracker().getExecutorInfos()}
    except Exception:  # a stopping SparkContext, a py4j hiccup: no information this round
        return None


def worker_hosts(placement: Placement) -> dict[str, str]:
    """Rhino worker id -> its host, for every primary and chain member of a placement."""
    out: dict[str, str] = {}
    for info in placement.instances.values():
        if info.host:
            out[info.primary] = info.host
        for wid, addr in zip(info.chain, info.chain_addresses):
            host = urlsplit("//" + addr).hostname if addr else None
            if host:
                out.setdefault(wid, host)
    return out


class BatchWatch:
    """Watches one attempt of one batch; see the module's docstring.

    ``known_hosts`` is the set of executor hosts seen last (kept by the operator across
    batches, so that a host lost between two batches is reported at the next one); the
    watch updates it in place. ``cancel`` cancels the attempt's Spark job."""

    def __init__(self, *, operator_id: str, epoch: int, placement: Placement, coordinator: Any,
                 hosts: Callable[[], Optional[set[str]]], cancel: Callable[[], None], known_hosts: set[str],
                 tag: str = "", interval_s: float = 0.05, epoch_interval_s: float = 0.1,
                 recancel_s: float = 0.25) -> None:
        self.operator_id = operator_id
        self.tag = tag  # the Spark job tag of the attempt (what ``cancel`` cancels)
        self.epoch = int(epoch)
        self.placement = placement
        self.coordinator = coordinator
        self.hosts = hosts
        self.cancel = cancel
        self.known_hosts = known_hosts
        self.interval_s = interval_s
        self.epoch_interval_s = epoch_interval_s
        self.recancel_s = recancel_s
        self.cancelled_at: Optional[float] = None
        self.cancels = 0  # calls of ``cancel``: the first, then one per recancel_s while the attempt lasts
        self._last_cancel = 0.0
        self.exited_at: Optional[float] = None
        # set once the attempt is cancelled and the coordinator has acted on it (the lost
        # workers reported and answered, or the new epoch seen): the driver may begin the next
        # attempt without waiting for this one's Spark job to unwind (driver/sink.py, SinkRunner.act)
        self.settled = threading.Event()
        self.new_epoch: Optional[int] = None
        self.reported: list[dict] = []  # {"host", "worker", "at", "declared_dead"}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None

    def __enter__(self) -> "BatchWatch":
        self._thread = threading.Thread(target=self._run, name=f"rhino-watch-{self.operator_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.exited_at = time.time()  # the attempt's job returned or failed
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def summary(self) -> dict:
        return {"reported": list(self.reported), "cancelled_at": self.cancelled_at, "exited_at": self.exited_at,
                "new_epoch": self.new_epoch, "cancels": self.cancels,
                "errors": self.errors[-3:]}

    # ---- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        next_epoch_check = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                self._check_hosts()
                if not self.cancelled and now >= next_epoch_check:
                    next_epoch_check = now + self.epoch_interval_s
                    self._check_epoch(self.coordinator.placement(self.operator_id))
                elif self.cancelled and now - self._last_cancel >= self.recancel_s:
                    self._cancel()  # a job submitted since the last cancellation (module docstring)
            except RhinoError as e:  # the coordinator restarting...: the commit protocol still holds
                self.errors.append(f"{type(e).__name__}: {e}")
            except Exception as e:  # never let the watch take the driver down
                self.errors.append(f"{type(e).__name__}: {e}")
                log.warning("rhino.spark %s: batch watch: %s", self.operator_id, e)
            self._stop.wait(self.interval_s)

    def _check_hosts(self) -> None:
        now = self.hosts()
        if now is None:
            return
        lost = self.known_hosts - now
        self.known_hosts.clear()
        self.known_hosts.update(now)
        if not lost:
            return
        wh = worker_hosts(self.placement)
        anchor = min(self.placement.instances)
        primaries = {info.host for info in self.placement.instances.values()}
        if not self.cancelled and lost & primaries:
            # A primary of this attempt is on the lost host: its commit will be refused once
            # the coordinator fails it over, so the job is cancelled now, and Spark unwinds it
            # while the coordinator takes the instances over (report_unreachable below), not
            # after. The next attempt cannot begin before that report returned: the attempt
            # leaves this watch (__exit__ joins this thread) before it begins the next one.
            # If the Rhino worker answers after all (only its executors were lost), the
            # attempt was cancelled for nothing and runs again at the same epoch.
            self.cancelled_at = time.time()
            log.warning("rhino.spark %s: Spark lost every executor of %s, which holds a primary: cancelling the "
                        "attempt", self.operator_id, ", ".join(sorted(lost & primaries)))
            self._cancel()
        for host in sorted(lost):
            for wid in sorted(w for w, h in wh.items() if h == host):
                t = time.time()
                log.warning("rhino.spark %s: Spark lost every executor of %s; reporting Rhino worker %s",
                            self.operator_id, host, wid)
                p = self.coordinator.report_unreachable(self.operator_id, anchor, wid)
                # answered: the coordinator's failover is done (the next attempt waits for it)
                self.reported.append({"host": host, "worker": wid, "at": t, "answered": time.time(),
                                      "epoch_after": p.epoch})
                self._check_epoch(p, settle=False)
        if self.cancelled:
            self.settled.set()  # every lost worker reported and answered

    def _cancel(self) -> None:
        self._last_cancel = time.monotonic()
        self.cancels += 1
        self.cancel()

    def _check_epoch(self, placement: Placement, settle: bool = True) -> None:
        """Cancels the attempt once the operator's epoch has moved past its own; ``settle``:
        the move is the coordinator's last word on it (not one of several reports of a lost
        host, whose others are still to be sent)."""
        e = placement.epoch
        if e > self.epoch:
            self.new_epoch = e
        if e > self.epoch and not self.cancelled:
            self.cancelled_at = time.time()
            log.warning("rhino.spark %s: epoch %d -> %d during the batch: cancelling the attempt",
                        self.operator_id, self.epoch, e)
            self._cancel()
            if settle:
                self.settled.set()
