"""The workers' liveness: heartbeats and the failure detector (docs/design.md §3,
docs/protocol.md §8.1).

A worker heartbeats over its connection to the coordinator. One that has been silent
for ``heartbeat_timeout`` is declared dead (the coordinator's ``declare_dead``: fenced,
its primaries failed over, its chains repaired). The detector runs on a thread of its
own and takes the coordinator's lock only to decide, so heartbeats (served on the
liveness lane, without that lock) keep coming while a long decision runs.

The same thread also retries reconfigurations left pending (one operator's failed while
a worker's loss was handled: replication_manager.py), at most once per heartbeat timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

from ..errors import StaleEpochError, UnknownInstanceError
from .metadata import Metadata
from .replication_manager import ReplicationManager

__all__ = ["FailureDetector"]


class FailureDetector:
    """When each worker was last heard from, and the thread that acts on silence.

    ``declare_dead(worker_id, reason)`` is called under ``lock``; ``rm()`` gives the
    Replication Manager that retries pending reconfigurations (a callable: the
    coordinator's may be replaced after construction, as a test's stub)."""

    def __init__(self, meta: Metadata, *, timeout: float, lock: Any, log: Callable[..., None],
                 declare_dead: Callable[[str, str], Any], rm: Callable[[], ReplicationManager]) -> None:
        self.meta = meta
        self.timeout = float(timeout)
        self._lock = lock
        self._log = log
        self._declare_dead = declare_dead
        self._rm = rm
        self._seen: dict[str, float] = {}  # worker id -> monotonic time of its last heartbeat
        self._pending_retry_at = 0.0  # monotonic time the pending reconfigurations were last retried
        self.paused = False  # --rebuild: nobody is declared dead until the metadata is rebuilt
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, interval: float, alive: Iterable[str], grace: float) -> None:
        """Starts the thread. The workers ``alive`` (known from the metadata) count as heard
        from ``grace`` seconds from now: a restarted coordinator gives them time to notice
        the lost connection and reconnect before it counts heartbeats again, so a restart
        does not fail healthy workers over."""
        now = time.monotonic() + grace
        for wid in alive:
            self._seen[wid] = now
        self._thread = threading.Thread(target=self._run, args=(interval,), name="rhino-failure-detector",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- what the coordinator tells it ------------------------------------------------------
    def heard(self, worker_id: str) -> None:
        """The worker registered, or a long call on its behalf ended (it could not heartbeat
        meanwhile)."""
        self._seen[worker_id] = time.monotonic()

    def forget(self, worker_id: str) -> None:
        """The worker is dead: nothing more to watch."""
        self._seen.pop(worker_id, None)

    def age(self, worker_id: str, now: float) -> float | None:
        """Seconds since the worker was last heard from (None: not watched)."""
        seen = self._seen.get(worker_id)
        return None if seen is None else now - seen

    def heartbeat(self, worker_id: str, incarnation: str) -> dict:
        """A worker's heartbeat. The late messages of a worker declared dead (or of an older
        incarnation) are refused: it must register again."""
        w = self.meta.worker(worker_id)
        if w is None:
            raise UnknownInstanceError(f"worker {worker_id} is not registered here: register first")
        if not w.alive:
            raise StaleEpochError(f"worker {worker_id} was declared dead at {w.dead_since}: register again")
        if w.incarnation != incarnation:
            raise StaleEpochError(f"worker {worker_id}: heartbeat of incarnation {incarnation}, "
                                  f"registered as {w.incarnation}: register again")
        self.heard(worker_id)
        return {"ok": True}

    # ---- the thread -------------------------------------------------------------------------
    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if self.paused:
                continue
            now = time.monotonic()
            late = [wid for wid, t in list(self._seen.items()) if now - t > self.timeout]
            for wid in late:
                try:
                    with self._lock:
                        # Checked again under the lock: a long decision may have held it
                        # while this worker's heartbeats kept coming.
                        age = self.age(wid, time.monotonic())
                        if age is None or age <= self.timeout:
                            continue
                        self._declare_dead(wid, f"no heartbeat for {age:.1f} s")
                except Exception as e:  # never let the detector die
                    self._log("failover_failed", worker=wid, error=f"{type(e).__name__}: {e}")
            self.retry_pending(now)

    def retry_pending(self, now: float) -> None:
        """Each reconfiguration left pending is decided again, under a newer epoch, at most
        once per heartbeat timeout: until then that operator's tasks are refused."""
        if now - self._pending_retry_at < self.timeout:
            return
        self._pending_retry_at = now
        try:
            pending = [op.operator_id for op in self.meta.operators()
                       if self.meta.pending_reconfiguration(op.operator_id) is not None]
            for operator_id in pending:
                with self._lock:
                    doc = self.meta.pending_reconfiguration(operator_id)
                    if doc is not None:  # else carried out meanwhile
                        self._rm().retry_pending(operator_id, doc)
        except Exception as e:  # never let the detector die
            self._log("pending_reconfiguration_retry_failed", error=f"{type(e).__name__}: {e}")
