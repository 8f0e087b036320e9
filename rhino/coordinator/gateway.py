"""The coordinator's way to the workers (docs/design.md §2-§4).

The Replication and Handover Managers act on workers through their instance
requests (docs/protocol.md §7.1: ``open``, ``takeover``, ``reconfigure``,
``replicate``, ``close``). :class:`WorkerGateway` is what they are given for
that: one cached, authenticated connection per worker, which workers are
alive (from the metadata: a worker declared dead is fenced off), where each
one listens, and how long a request to one may take.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from ..client.client import Client, connect
from ..errors import NotFoundError
from .metadata import Metadata, WorkerRow
from .placement import WorkerInfo

__all__ = ["WorkerGateway", "DRAINING_KEY"]

DRAINING_KEY = "draining_workers"  # the metadata's key/value entry: a JSON list of worker ids


class WorkerGateway:
    """Clients of the workers' state service, and the live workers with their addresses.

    ``request_timeout`` bounds one request to a worker; a bulk copy
    (``replicate``) may take ``copy_timeout`` and one worker's part of a
    handover step (``reconfigure``) ``handover_timeout``. Thread-safe.
    """

    def __init__(self, meta: Metadata, *, secret: bytes | str, client_id: str, request_timeout: float,
                 copy_timeout: float, handover_timeout: float, tls: Any = None) -> None:
        self.meta = meta
        self.tls = tls  # a rhino.TLS for its connections to the workers; None: plaintext
        self.secret = secret
        self.client_id = client_id
        self.request_timeout = float(request_timeout)
        self.copy_timeout = float(copy_timeout)
        self.handover_timeout = float(handover_timeout)
        self._clients: dict[str, Client] = {}
        self._lock = threading.Lock()

    def client(self, worker: WorkerRow | str) -> Client:
        """A (cached) connection to a worker's state service over TCP."""
        w = worker if isinstance(worker, WorkerRow) else self.meta.worker(worker)
        if w is None:
            raise NotFoundError(f"unknown worker {worker!r}")
        with self._lock:
            c = self._clients.get(w.id)
            if c is not None and c.is_open and c.address == w.address:
                return c
            if c is not None:
                c.close()
            # the coordinator's own role (docs/protocol.md §2, "Roles"), not the admin's
            c = connect(w.address, secret=self.secret, client_id=self.client_id,
                        request_timeout=max(self.request_timeout, self.copy_timeout), peer_timeout=3.0, tls=self.tls,
                        role="coordinator")
            self._clients[w.id] = c
            return c

    def drop_client(self, worker_id: str) -> None:
        """Forgets a worker's connection (it re-registered, or was declared dead)."""
        with self._lock:
            c = self._clients.pop(worker_id, None)
        if c is not None:
            c.close()

    def alive_workers(self) -> list[WorkerRow]:
        return [w for w in self.meta.workers() if w.alive]

    def alive_ids(self) -> set[str]:
        return {w.id for w in self.alive_workers()}

    def workers_info(self) -> list[WorkerInfo]:
        """The live workers with their failure domains, as placement decides over them:
        without the workers being decommissioned (nothing new is placed on them)."""
        leaving = self.draining()
        return [WorkerInfo(id=w.id, rack=w.rack, zone=w.zone) for w in self.alive_workers() if w.id not in leaving]

    def draining(self) -> set[str]:
        """The workers being decommissioned (``Coordinator.decommission``)."""
        got = self.meta.get_meta(DRAINING_KEY)
        return set(json.loads(got)) if got else set()

    def addresses(self, ids: list[str]) -> list[str]:
        """The data-plane addresses of workers, in order (a chain as the workers name it)."""
        ws = {w.id: w for w in self.meta.workers()}
        return [ws[i].address for i in ids]

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
