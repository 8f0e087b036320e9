"""A task's connections, kept per Python worker process: Spark reuses the process across
tasks, and its clients with it (design §8). One set of worker clients per cluster secret
and TLS files, one coordinator client per address, and the doomed-attempt watch's own
clients, with a short timeout: a worker's instance requests run one at a time, and a look
at the epoch must not wait behind a bulk copy (``runtime/doomed.py``)."""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Optional

from rhino.engine import WorkerClients, primary_address
from rhino.tls.config import for_host

from ..driver.attempt import AttemptSpec
from ..driver.config import OperatorConfig

__all__ = ["this_host", "clients", "coordinator", "primary_epoch"]

_CLIENTS: dict[tuple, WorkerClients] = {}  # by the cluster's secret and TLS files
_COORDS: dict[tuple, Any] = {}  # by the coordinator's address and TLS files
# the doomed-attempt watch's own connections (a short timeout: a worker's instance requests
# run one at a time, and a look at the epoch must not wait behind a bulk copy)
_WATCH_CLIENTS: dict[tuple, WorkerClients] = {}
WATCH_REQUEST_TIMEOUT_S = 1.0


def this_host() -> str:
    """The host this task runs on: the executor's SPARK_LOCAL_IP (set per host, design §8),
    else the address of the host name."""
    ip = os.environ.get("SPARK_LOCAL_IP")
    if ip:
        return ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _tls_key(cfg: OperatorConfig) -> tuple:
    return tuple(sorted(cfg.tls.as_dict().items())) if cfg.tls else ()


def clients(cfg: OperatorConfig) -> WorkerClients:
    key = (cfg.secret, _tls_key(cfg))
    c = _CLIENTS.get(key)
    if c is None:
        c = WorkerClients(secret=cfg.secret, client_id=f"spark-task-{os.getpid()}",
                          request_timeout=cfg.request_timeout, tls=for_host(cfg.tls, this_host()))
        _CLIENTS[key] = c
    return c


def primary_epoch(cfg: OperatorConfig, spec: AttemptSpec, instance: int, host: str) -> Optional[Callable[[], Optional[int]]]:
    """The instance's epoch on its primary, as the placement the task runs with names it
    (None: not hosted there), for the doomed-attempt watch; None if the placement lacks it."""
    info = spec.placement.instances.get(instance)
    if info is None or not info.address:
        return None
    address, _ = primary_address(info, host)
    key = (cfg.secret, _tls_key(cfg))

    def epoch() -> Optional[int]:
        clients = _WATCH_CLIENTS.get(key)
        if clients is None:
            clients = _WATCH_CLIENTS[key] = WorkerClients(
                secret=cfg.secret, client_id=f"spark-task-watch-{os.getpid()}",
                request_timeout=WATCH_REQUEST_TIMEOUT_S, tls=for_host(cfg.tls, this_host()))
        st = clients.get(address).status(cfg.operator_id, instance, wait=False)
        if not st.get("hosted"):
            return None
        # the fence, raised before the instance takes a new epoch, is answered even while
        # the instance is busy in a commit (then "epoch" is left out: protocol.md §7.1)
        e = st.get("fence_epoch", st.get("epoch"))
        return int(e) if e is not None else None

    return epoch


def coordinator(cfg: OperatorConfig) -> Any:
    key = (cfg.coordinator, _tls_key(cfg))
    c = _COORDS.get(key)
    if c is None:
        from rhino.coordinator.client import connect_coordinator

        c = connect_coordinator(cfg.coordinator, secret=cfg.secret, tls=for_host(cfg.tls, this_host()))
        _COORDS[key] = c
    return c
