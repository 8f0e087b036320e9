"""A client of the coordinator: what workers, tasks and the CLI use to reach it.

Two forms with the same methods: :func:`connect_coordinator` reaches a
``rhino coordinator`` process over the framed, authenticated protocol
(docs/protocol.md §8), and :class:`LocalCoordinatorClient` calls a
:class:`~rhino.coordinator.Coordinator` in the same process (the Spark driver
hosts it on a thread).

This is where answers are parsed: the methods return what :data:`.api.METHODS`
says (a :class:`~.types.Placement`, a :class:`~.types.CommitAnswer`, else the JSON
object as is); ``call`` is the raw request, its answer the JSON as sent.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Optional

from .. import _core
from .._secret import call_hiding_secret
from ..credential import credential_args
from ..errors import InvalidArgumentError, PeerDeadError
from ..tls.config import tls_kwargs
from .api import METHODS
from .types import CommitAnswer, Placement

__all__ = ["CoordinatorClient", "LocalCoordinatorClient", "connect_coordinator"]


class _Methods:
    """The coordinator's methods (docs/protocol.md §8.2), over ``call``."""

    def call(self, method: str, **args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def _ask(self, method: str, **args: Any) -> Any:
        """``call``, its answer parsed as the method's (api.py)."""
        return METHODS[method].parse(self.call(method, **args))

    def register(self, worker_id: str, address: str, **kw: Any) -> dict:
        return self._ask("register", worker_id=worker_id, address=address, **kw)

    def heartbeat(self, worker_id: str, incarnation: str) -> dict:
        return self._ask("heartbeat", worker_id=worker_id, incarnation=incarnation)

    def create_operator(self, operator_id: str, **kw: Any) -> Placement:
        return self._ask("create_operator", operator_id=operator_id, **kw)

    def placement(self, operator_id: str) -> Placement:
        return self._ask("placement", operator_id=operator_id)

    def begin_batch(self, operator_id: str, batch: int, *, batch_time_ms: Optional[int] = None,
                    first: bool = False) -> Placement:
        """``first``: an explicit start of the operator at ``batch`` (``Coordinator.begin_batch``);
        sent only when true, so a coordinator of before it is still answered."""
        args: dict[str, Any] = {} if batch_time_ms is None else {"batch_time_ms": int(batch_time_ms)}
        if first:
            args["first"] = True
        return self._ask("begin_batch", operator_id=operator_id, batch=batch, **args)

    def state_schema(self, operator_id: str) -> dict:
        return self._ask("state_schema", operator_id=operator_id)

    def set_state_schema(self, operator_id: str, doc: dict, revision: int) -> dict:
        return self._ask("set_state_schema", operator_id=operator_id, doc=doc, revision=revision)

    def commit_batch(self, operator_id: str, batch: int, *, instances: Optional[dict] = None,
                     load: Optional[dict] = None, epoch: Optional[int] = None,
                     report: Optional[dict] = None) -> CommitAnswer:
        """``report``: the batch's measurements for the autoscaler (``Coordinator.commit_batch``);
        sent only when given, so a coordinator of before the autoscaler is still answered."""
        extra = {} if report is None else {"report": report}
        return self._ask("commit_batch", operator_id=operator_id, batch=batch, instances=instances or {},
                         load=load or {}, epoch=epoch, **extra)

    def report_unreachable(self, operator_id: str, instance: int, worker_id: Optional[str] = None) -> Placement:
        return self._ask("report_unreachable", operator_id=operator_id, instance=instance, worker_id=worker_id)

    def handover(self, operator_id: str, vnodes: list[int], to: int, *, strategy: str = "all-at-once",
                 after_batch: Optional[int] = None, on: Optional[str] = None) -> dict:
        return self._ask("handover", operator_id=operator_id, vnodes=list(vnodes), to=to, strategy=strategy,
                         after_batch=after_batch, on=on)

    def rescale(self, operator_id: str, parallelism: int, *, strategy: str = "all-at-once",
                after_batch: Optional[int] = None, on: Optional[list[str]] = None) -> dict:
        return self._ask("rescale", operator_id=operator_id, parallelism=parallelism, strategy=strategy,
                         after_batch=after_batch, on=list(on) if on else None)

    def rebalance(self, operator_id: Optional[str] = None, *, replicas: bool = True, load: bool = True,
                  strategy: str = "batched", after_batch: Optional[int] = None) -> dict:
        return self._ask("rebalance", operator_id=operator_id, replicas=replicas, load=load, strategy=strategy,
                         after_batch=after_batch)

    def cancel_plan(self, operator_id: str, plan_id: Optional[int] = None) -> dict:
        """Cancels the operator's open plan (``plan_id``: that one) between two
        of its steps: the steps done stay done, the rest are dropped. Answers
        the cancelled plan (``state``: ``cancelled``, ``was``, ``steps_done``,
        ``steps``, ``moves_dropped``)."""
        return self._ask("cancel_plan", operator_id=operator_id, plan_id=plan_id)

    def decommission(self, worker_id: str, *, force: bool = False) -> dict:
        """Moves everything off a live worker before it is taken away: nothing new is placed
        on it, and each operator moves off it at its next batch barrier (at once if it has
        no batch in flight, or with ``force``). Answers ``drained`` (nothing holds the
        worker any more: stop it), ``operators`` (those that still do) and
        ``waiting_for_barrier``. Call it again to poll (docs/design.md §3)."""
        return self._ask("decommission", worker_id=worker_id, force=bool(force))

    def autoscale(self, operator_id: str, *, enabled: bool = True, min_parallelism: Optional[int] = None,
                  max_parallelism: Optional[int] = None, **settings: Any) -> dict:
        """Turns the operator's autoscaler on (or off: ``enabled=False``); ``settings``:
        ``utilization``, ``cooldown_batches``, ``strategy``, ``cores_per_worker``,
        ``scale_in_margin``, ``scale_in_reports`` (``Coordinator.autoscale``). Answers the
        operator's autoscaling as ``status`` shows it."""
        return self._ask("autoscale", operator_id=operator_id, enabled=enabled,
                         min_parallelism=min_parallelism, max_parallelism=max_parallelism, **settings)

    def drop_operator(self, operator_id: str, *, idle_s: float = 60.0) -> dict:
        """Drops the operator (an id: :func:`rhino.operator_id` makes one from a name and a
        namespace): its state leaves every live worker, then its metadata the coordinator.
        Refused with :class:`rhino.OperatorRunningError` while a query runs it (a batch in
        flight, or a call of its driver or tasks in the last ``idle_s`` seconds; default
        60). Answers ``operator_id``, ``workers`` (what each dropped) and ``not_reached``."""
        return self._ask("drop_operator", operator_id=operator_id, idle_s=idle_s)

    def status(self) -> dict:
        return self._ask("status")

    def declare_dead(self, worker_id: str, reason: str = "declared dead by an operator") -> dict:
        return self._ask("declare_dead", worker_id=worker_id, reason=reason)


class CoordinatorClient(_Methods):
    """One authenticated connection to a ``rhino coordinator``. Thread-safe.
    A lost connection is re-established once per call (the coordinator may
    have restarted)."""

    def __init__(self, address: str, *, secret: Any, client_id: str = "client", request_timeout: float = 300.0,
                 peer_timeout: float = 3.0, bind_host: str = "", tls: Any = None, role: str = "admin",
                 scope: str = "") -> None:
        if not isinstance(address, str) or ":" not in address:
            raise InvalidArgumentError(f"the coordinator's address must be 'host:port', got {address!r}")
        self.address = address
        # the role proved (docs/protocol.md §2, "Roles"): a Credential's, else `role` from the root
        self._opts = dict(credential_args(secret, role, scope), client_id=client_id, peer_timeout_ms=int(peer_timeout * 1000),
                          request_timeout_ms=int(request_timeout * 1000), local_bind_host=bind_host,
                          max_frame_bytes=int(_core.MAX_FRAME_BYTES), **tls_kwargs(tls))
        self._lock = threading.Lock()
        self._h: Any = None
        self._connect()

    def _connect(self) -> Any:
        h = call_hiding_secret(_core.StateClient.connect, self.address, **self._opts)
        with self._lock:
            old, self._h = self._h, h
        if old is not None:
            old.close()
        return h

    def call(self, method: str, **args: Any) -> Any:
        payload = json.dumps(args, separators=(",", ":"))
        with self._lock:
            h = self._h
        if h is None or not h.is_open:
            h = self._connect()
        try:
            return json.loads(h.coord(method, payload))
        except PeerDeadError:
            h = self._connect()  # once: a restarted coordinator
            return json.loads(h.coord(method, payload))

    def close(self) -> None:
        with self._lock:
            h, self._h = self._h, None
        if h is not None:
            h.close()

    def __enter__(self) -> "CoordinatorClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalCoordinatorClient(_Methods):
    """The same methods on a Coordinator in this process; arguments and answers
    go through JSON as on the wire, so both forms behave alike."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    def call(self, method: str, **args: Any) -> Any:
        return json.loads(json.dumps(self.coordinator.handle(method, json.loads(json.dumps(args)))))

    def close(self) -> None:
        pass


def connect_coordinator(address: str, *, secret: Any, **kw: Any) -> CoordinatorClient:
    """Connects to a ``rhino coordinator`` at ``host:port``."""
    return CoordinatorClient(address, secret=secret, **kw)
