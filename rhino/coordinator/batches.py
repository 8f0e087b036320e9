"""What the coordinator knows of each operator's micro-batches (docs/design.md §4-§5).

- **In flight:** a batch begun (``begin_batch``) and not yet committed. A decommission
  moves such an operator off at its next barrier, any other at once; a query with a
  batch in flight runs its operator, so the operator cannot be dropped.
- **Activity:** when an operator's driver or tasks last called the coordinator. A
  restarted coordinator counts every operator as active at its start.
- **Attempt tokens** (the attempt fence, docs/protocol.md §7.2), issued at each begin.
- **Batch times:** the time a batch was first begun, kept so that a batch that runs
  again sees the same time (TTL and processing-time timers, design §5).

The in-flight and activity figures live in memory, since this process started: they
describe running queries, which a restart interrupts anyway. Tokens and batch times are
in the metadata, so they hold across restarts.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from .metadata import Metadata
from .types import BatchTime

__all__ = ["BatchLedger", "DROP_IDLE_S", "IN_FLIGHT_S"]

# drop_operator: a query runs an operator its driver or tasks called within this many
# seconds (the default of idle_s), or that has a batch in flight begun within IN_FLIGHT_S
DROP_IDLE_S = 60.0
IN_FLIGHT_S = 3600.0

_BATCH_TIMES_KEPT = 1024  # batch times kept besides the latest (checkpoints kept are far fewer)
_BATCH_TIME_KEY = "batch_time:"  # + operator id: the metadata's entry of its batch times (a BatchTime's JSON)
_ATTEMPT_KEY = "attempt_token"  # the last attempt token begin_batch issued (docs/protocol.md §7.2)


class BatchLedger:
    """Batches in flight, operators' activity, attempt tokens and batch times. The
    methods that write the metadata REQUIRE the coordinator's lock."""

    def __init__(self, meta: Metadata) -> None:
        self.meta = meta
        self._started = time.monotonic()
        self._in_flight: dict[str, int] = {}  # operator -> the batch begun and not yet committed
        self._in_flight_at: dict[str, float] = {}  # operator -> monotonic time its batch in flight began
        self._active: dict[str, float] = {}  # operator -> monotonic time of its driver's or tasks' last call
        # operators whose replicas move onto a worker that joined, at their next barrier
        self.rebalance_at_barrier: set[str] = set()

    # ---- batches in flight ------------------------------------------------------------------
    def begun(self, operator_id: str, batch: int) -> None:
        self._in_flight[operator_id] = batch
        self._in_flight_at[operator_id] = time.monotonic()

    def committed(self, operator_id: str) -> None:
        self._in_flight.pop(operator_id, None)
        self._in_flight_at.pop(operator_id, None)

    def in_flight(self, operator_id: str) -> bool:
        return operator_id in self._in_flight

    def in_flight_batch(self, operator_id: str) -> Optional[int]:
        """The batch of the operator begun and not yet committed, if any."""
        return self._in_flight.get(operator_id)

    def forget(self, operator_id: str) -> None:
        """The operator is dropped."""
        for d in (self._in_flight, self._in_flight_at, self._active):
            d.pop(operator_id, None)
        self.rebalance_at_barrier.discard(operator_id)

    # ---- activity ---------------------------------------------------------------------------
    def touch(self, operator_id: Any) -> None:
        """The operator's driver or tasks called (create_operator, begin_batch, commit_batch,
        placement, state_schema, set_state_schema, report_unreachable)."""
        if isinstance(operator_id, str):
            self._active[operator_id] = time.monotonic()

    def running(self, operator_id: str, idle_s: float) -> Optional[str]:
        """Why a query runs the operator (None: it does not). It runs while a batch of it
        is in flight (begun and not committed, for at most IN_FLIGHT_S: a driver that died
        mid-batch does not hold it forever), or while its driver or tasks called the
        coordinator in the last ``idle_s`` seconds (a restarted coordinator counts each
        operator as called at its start)."""
        now = time.monotonic()
        if operator_id in self._in_flight and now - self._in_flight_at.get(operator_id, now) < IN_FLIGHT_S:
            return (f"its batch {self._in_flight[operator_id]} is in flight (begun "
                    f"{now - self._in_flight_at[operator_id]:.1f} s ago, not committed)")
        last = self._active.get(operator_id, self._started)
        if now - last < idle_s:
            who = "its driver or tasks called the coordinator" if operator_id in self._active else \
                "the coordinator started"
            return f"{who} {now - last:.1f} s ago (less than idle_s={idle_s:g} s)"
        return None

    def record_commit(self, operator_id: str, batch: int, instances: dict, load: dict) -> None:
        """Batch ``batch`` is complete on every chain, in one transaction: it is each
        instance's last complete checkpoint (with its size, ``instances[i]
        ["checkpoint_bytes"]``), a redo log two batches old is dropped, and the batch's
        per-vnode ``load`` (``[ops, bytes]``) is added for the Handover Manager. REQUIRES: lock."""
        stats = {int(k): v for k, v in instances.items()}
        self.committed(operator_id)
        with self.meta.tx() as c:
            self.meta.set_last_batch(c, operator_id, batch)
            for r in self.meta.instances(operator_id):
                r.last_complete = batch
                if r.instance in stats and "checkpoint_bytes" in stats[r.instance]:
                    r.bytes = int(stats[r.instance]["checkpoint_bytes"])
                if r.redo_version is not None and batch >= r.redo_version + 2:
                    r.redo_version, r.redo = None, []
                self.meta.put_instance(c, r)
            for v, (ops, nbytes) in load.items():
                self.meta.add_vnode_load(c, operator_id, int(v), float(ops), float(nbytes), batch)

    # ---- attempt tokens and batch times (in the metadata) --------------------------------------
    def attempt_token(self) -> int:
        """A new attempt token (the attempt fence, docs/protocol.md §7.2): above every token
        issued before, by this coordinator or an earlier one on the same metadata, and at
        least the clock in µs, so that a coordinator rebuilt from the workers (``--rebuild``:
        the metadata is new) still issues tokens above the workers' highest. REQUIRES: lock."""
        got = self.meta.get_meta(_ATTEMPT_KEY)
        token = max(int(got) + 1 if got else 1, int(time.time() * 1_000_000))
        with self.meta.tx() as c:
            self.meta.set_meta(c, _ATTEMPT_KEY, str(token))
        return token

    def batch_time(self, operator_id: str, batch: int, proposed_ms: int) -> int:
        """The batch's time: the one stored for ``batch``, else ``proposed_ms`` (raised to
        the previous batch's time, so batch time never goes back), stored. REQUIRES: lock."""
        key = _BATCH_TIME_KEY + operator_id
        got = self.meta.get_meta(key)
        doc = json.loads(got) if got else None
        if doc is not None and doc["batch"] == batch:
            return int(doc["time_ms"])
        t = max(int(proposed_ms), int(doc["time_ms"]) if doc is not None else proposed_ms)
        # the times of the latest batches too: a state reader filters expired TTL entries of
        # an older checkpoint with its batch's time
        recent = dict((doc or {}).get("recent") or {})
        if doc is not None:
            recent[str(doc["batch"])] = int(doc["time_ms"])
        recent = dict(sorted(recent.items(), key=lambda kv: int(kv[0]))[-_BATCH_TIMES_KEPT:])
        with self.meta.tx() as c:
            self.meta.set_meta(c, key, json.dumps({"batch": batch, "time_ms": t, "recent": recent}))
        return t

    def stored_batch_time(self, operator_id: str) -> Optional[BatchTime]:
        """The latest batch's time and the recent ones, as a placement carries them."""
        got = self.meta.get_meta(_BATCH_TIME_KEY + operator_id)
        return BatchTime.from_wire(json.loads(got)) if got else None
