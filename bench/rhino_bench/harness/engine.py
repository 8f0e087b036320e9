"""A minimal micro-batch engine over the coordinator and the workers' state
service, driven as Spark's stateful operator will drive them (docs/design.md
§5): for every batch, ask the coordinator for the routing table (the barrier
where handovers run), route each key by its vnode to an instance, commit one
session per instance on its primary in barrier mode, then report the batch
done with its per-vnode load.

A failure (a dead primary, a stale epoch after a reconfiguration, a lost
connection) aborts the attempt; the engine reports an unreachable primary to
the coordinator and runs the **same batch again**, which is exactly-once by
design §5: every instance rolls back to b-1 first. Used by the coordinator's
model test and by the failover and handover benchmarks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from rhino import _core
from rhino.client.client import Client, connect
from rhino.errors import (InvalidArgumentError, PeerDeadError, RhinoError, RhinoIOError, RhinoTimeoutError,
                      StaleEpochError, UnknownInstanceError)

__all__ = ["MicroBatchEngine", "BatchResult"]

_UNREACHABLE = (PeerDeadError, RhinoIOError, RhinoTimeoutError, ConnectionError)


@dataclass
class BatchResult:
    batch: int
    epoch: int
    attempts: int
    seconds: float
    per_instance: dict[int, dict] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class MicroBatchEngine:
    """Runs batches of puts and deletes of int64 keys for one operator."""

    def __init__(self, coordinator: Any, operator_id: str, *, secret: Any, max_attempts: int = 20,
                 retry_sleep: float = 0.25, request_timeout: float = 120.0) -> None:
        self.coord = coordinator
        self.op = operator_id
        self.secret = secret
        self.max_attempts = max_attempts
        self.retry_sleep = retry_sleep
        self.request_timeout = request_timeout
        self._clients: dict[str, Client] = {}
        self._part: Optional[_core.Partitioner] = None

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def _client(self, address: str) -> Client:
        c = self._clients.get(address)
        if c is None or not c.is_open:
            c = connect(address, secret=self.secret, client_id="engine", request_timeout=self.request_timeout)
            self._clients[address] = c
        return c

    def _drop(self, address: Optional[str]) -> None:
        c = self._clients.pop(address, None) if address else None
        if c is not None:
            c.close()

    def partitioner(self, placement: dict) -> _core.Partitioner:
        if self._part is None:
            self._part = _core.Partitioner(num_key_groups=placement["num_key_groups"],
                                           num_vnodes=placement["num_vnodes"], seed=placement["seed"])
        return self._part

    def route(self, placement: dict, keys: np.ndarray) -> np.ndarray:
        """The instance of each key under ``placement``'s table."""
        vn = self.partitioner(placement).vnodes(keys)
        return np.asarray(placement["assignment"], dtype=np.int64)[vn]

    def run_batch(self, batch: int, puts: dict[int, bytes], deletes: Sequence[int] = ()) -> BatchResult:
        keys = np.fromiter(puts.keys(), dtype=np.int64, count=len(puts))
        values = [puts[int(k)] for k in keys]
        dels = np.asarray(list(deletes), dtype=np.int64)
        t0 = time.monotonic()
        errors: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            placement = self.coord.begin_batch(self.op, batch)
            epoch = placement["epoch"]
            part = self.partitioner(placement)
            inst_of_put = self.route(placement, keys) if len(keys) else np.array([], dtype=np.int64)
            inst_of_del = self.route(placement, dels) if len(dels) else np.array([], dtype=np.int64)
            vn_of_put = part.vnodes(keys) if len(keys) else np.array([], dtype=np.int32)
            per: dict[int, dict] = {}
            current: Optional[tuple[int, str]] = None
            try:
                for name, info in sorted(placement["instances"].items(), key=lambda kv: int(kv[0])):
                    i = int(name)
                    current = (i, info["primary"])
                    if info["address"] is None:
                        raise UnknownInstanceError(f"instance {i} has no primary")
                    cl = self._client(info["address"])
                    mine = inst_of_put == i
                    k = keys[mine]
                    with cl.session(self.op, i, batch=batch, epoch=epoch) as s:
                        if len(k):
                            s.put_batch(k, [values[j] for j in np.flatnonzero(mine)])
                        d = dels[inst_of_del == i]
                        if len(d):
                            s.delete_batch(d)
                        r = s.commit("barrier")
                    per[i] = {"checkpoint_bytes": int(r.stats.get("checkpoint_bytes", 0)),
                              "replicate_s": r.replicate_s, "keys": int(len(k))}
                current = None
            except InvalidArgumentError:
                raise
            except RhinoError as e:
                where = f" (instance {current[0]} on {current[1]})" if current else ""
                errors.append(f"attempt {attempt}{where}: {type(e).__name__}: {e}")
                if current is not None and isinstance(e, _UNREACHABLE):
                    self._drop(placement["instances"][str(current[0])]["address"])
                    try:
                        self.coord.report_unreachable(self.op, current[0], current[1])
                    except RhinoError as e2:
                        errors.append(f"report_unreachable: {e2}")
                time.sleep(self.retry_sleep)
                continue
            load: dict[str, list[float]] = {}
            if len(keys):
                vs, counts = np.unique(vn_of_put, return_counts=True)
                sizes = np.bincount(vn_of_put, weights=[len(v) + 8 for v in values],
                                    minlength=placement["num_vnodes"])
                load = {str(int(v)): [float(c), float(sizes[v])] for v, c in zip(vs, counts)}
            try:
                self.coord.commit_batch(self.op, batch, instances={str(i): p for i, p in per.items()}, load=load,
                                        epoch=epoch)
            except StaleEpochError as e:
                # A reconfiguration during the batch (a failover may have restored an
                # instance to b-1 after it committed b): run the whole batch again.
                errors.append(f"attempt {attempt}: commit_batch: {e}")
                continue
            return BatchResult(batch=batch, epoch=epoch, attempts=attempt, seconds=time.monotonic() - t0,
                               per_instance=per, errors=errors)
        raise RhinoError(f"batch {batch} of {self.op} failed {self.max_attempts} times: " + " | ".join(errors[-3:]))
