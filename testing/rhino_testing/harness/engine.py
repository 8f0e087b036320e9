"""A minimal in-process micro-batch engine over the coordinator and the workers'
state service, driven as Spark's stateful operator drives them (docs/design.md
§5), on :mod:`rhino.engine`: for every batch, ask the coordinator for the
routing table (the barrier where handovers run), route each key by its vnode
to an instance, commit one session per instance on its primary in barrier
mode, then report the batch done with its per-vnode load and epoch.

A failure is classified by the engine (:func:`rhino.engine.classify`): an
unreachable primary is reported to the coordinator and the **same batch** runs
again, as after a stale epoch (a reconfiguration); that is exactly-once by
design §5, since every instance rolls back to b-1 first. A real error
(InvalidArgument, Corruption, NoSpace ...) is raised as itself. Used by the
coordinator's model test and by the failover and handover benchmarks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from rhino import _core
from rhino.coordinator.types import Placement
from rhino.engine import Attempt, AttemptResult, BatchDriver, InstanceRun, WorkerClients, vnode_load

__all__ = ["MicroBatchEngine", "BatchResult"]


@dataclass
class BatchResult:
    batch: int
    epoch: int
    attempts: int
    seconds: float
    per_instance: dict[int, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class MicroBatchEngine:
    """Runs batches of puts and deletes of int64 keys for one operator.

    ``coord`` (the coordinator client) may be replaced between batches (a test
    reconnects to a restarted coordinator)."""

    def __init__(self, coordinator: Any, operator_id: str, *, secret: Any, max_attempts: int = 20,
                 retry_sleep: float = 0.25, request_timeout: float = 120.0, tls: Any = None) -> None:
        self.coord = coordinator
        self.op = operator_id
        self.max_attempts = max_attempts
        self.retry_sleep = retry_sleep
        self.request_timeout = request_timeout
        self._clients = WorkerClients(secret=secret, client_id="engine", request_timeout=request_timeout, tls=tls)
        self._part: Optional[_core.Partitioner] = None

    def close(self) -> None:
        self._clients.close()

    def partitioner(self, placement: Placement) -> _core.Partitioner:
        if self._part is None:
            self._part = _core.Partitioner(**placement.partitioner_args())
        return self._part

    def route(self, placement: Placement, keys: np.ndarray) -> np.ndarray:
        """The instance of each key under ``placement``'s table."""
        vn = self.partitioner(placement).vnodes(keys)
        return np.asarray(placement.assignment, dtype=np.int64)[vn]

    def run_batch(self, batch: int, puts: dict[int, bytes], deletes: Sequence[int] = (), *,
                  first: bool = False) -> BatchResult:
        """``first``: the operator is explicitly started at ``batch`` (``begin_batch(first=True)``)."""
        keys = np.fromiter(puts.keys(), dtype=np.int64, count=len(puts))
        values = [puts[int(k)] for k in keys]
        dels = np.asarray(list(deletes), dtype=np.int64)
        t0 = time.monotonic()
        driver = BatchDriver(self.coord, self.op, max_attempts=self.max_attempts, retry_sleep=self.retry_sleep,
                             name=self.op)
        done = driver.run(batch, lambda a: self._attempt(a, keys, values, dels), first=first)
        return BatchResult(batch=batch, epoch=done.result.epoch, attempts=done.attempt.number,
                           seconds=time.monotonic() - t0, per_instance=done.result.value, errors=done.errors)

    def _attempt(self, a: Attempt, keys: np.ndarray, values: list[bytes], dels: np.ndarray) -> AttemptResult:
        """One session per instance, in instance order, on the primaries of ``a``'s placement.
        An instance that fails ends the attempt (its primary reported if unreachable)."""
        placement = a.placement
        inst_of_put = self.route(placement, keys) if len(keys) else np.array([], dtype=np.int64)
        inst_of_del = self.route(placement, dels) if len(dels) else np.array([], dtype=np.int64)
        per: dict[int, dict] = {}
        for i in placement.instance_order():
            mine = inst_of_put == i

            def work(s: Any, _p: Placement, mine: np.ndarray = mine, i: int = i) -> dict:
                k = keys[mine]
                if len(k):
                    s.put_batch(k, [values[j] for j in np.flatnonzero(mine)])
                d = dels[inst_of_del == i]
                if len(d):
                    s.delete_batch(d)
                r = s.commit("barrier")
                return {"checkpoint_bytes": int(r.stats.get("checkpoint_bytes", 0)), "replicate_s": r.replicate_s,
                        "keys": int(len(k))}

            run = InstanceRun(self._clients, lambda: self.coord, self.op, i, batch=a.batch, placement=placement,
                              wait_for_failover=False, failover_wait_s=self.request_timeout)
            try:
                per[i] = run.run(work)
            finally:
                a.errors.extend(f"attempt {a.number} (instance {i} on {run.primary}): {m}"
                                for m in run.errors)
        load: dict[str, list[float]] = {}
        if len(keys):
            load = vnode_load(self.partitioner(placement).vnodes(keys), placement.num_vnodes,
                              nbytes=[len(v) + 8 for v in values])
        return AttemptResult(epoch=a.epoch, instances={str(i): p for i, p in per.items()}, load=load, value=per)
