"""A worker's registration with the coordinator, and its heartbeats
(``rhino worker --coordinator HOST:PORT``; docs/protocol.md §8.2).

A thread registers the worker (its id, data-plane address, Unix socket, rack
and zone, and an incarnation: a fresh id per process) and then sends a
heartbeat every ``interval`` seconds. When the coordinator refuses a
heartbeat (the worker was declared dead, or the coordinator lost track of it
after a ``--rebuild``), it registers again; when the coordinator cannot be
reached, it retries with a growing pause and logs once per outage, never
stopping the worker: the data plane and the state service go on serving.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable, Optional

from ..errors import RhinoError, StaleEpochError, UnknownInstanceError

__all__ = ["Registration"]


class Registration:
    def __init__(self, coordinator: str, *, worker_id: str, address: str, unix_socket: Optional[str], secret: Any,
                 rack: Optional[str] = None, zone: Optional[str] = None, interval: float = 0.5,
                 bind_host: str = "", log: Callable[..., None] = lambda *a, **k: None, tls: Any = None) -> None:
        self.coordinator = coordinator
        self.worker_id = worker_id
        self.address = address
        self.unix_socket = unix_socket
        self.secret = secret
        self.rack, self.zone = rack, zone
        self.interval = interval
        self.bind_host = bind_host
        self.tls = tls
        self.incarnation = uuid.uuid4().hex
        self._log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rhino-registration", daemon=True)

    def start(self) -> "Registration":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from ..coordinator.client import CoordinatorClient

        client: Optional[CoordinatorClient] = None
        registered = False
        pause = self.interval
        down = False
        while not self._stop.is_set():
            try:
                if client is None:
                    client = CoordinatorClient(self.coordinator, secret=self.secret, client_id=self.worker_id,
                                               request_timeout=600.0, bind_host=self.bind_host, tls=self.tls,
                                               role="worker", scope=self.worker_id)
                if not registered:
                    client.register(self.worker_id, self.address, unix_socket=self.unix_socket, rack=self.rack,
                                    zone=self.zone, incarnation=self.incarnation)
                    registered = True
                    self._log("info", "registered", coordinator=self.coordinator, incarnation=self.incarnation)
                client.heartbeat(self.worker_id, self.incarnation)
                if down:
                    self._log("info", "coordinator_reachable", coordinator=self.coordinator)
                down, pause = False, self.interval
            except (StaleEpochError, UnknownInstanceError) as e:
                self._log("warning", "registration_refused", coordinator=self.coordinator, error=str(e))
                registered = False
                continue
            except RhinoError as e:
                if not down:
                    self._log("warning", "coordinator_unreachable", coordinator=self.coordinator, error=str(e))
                down = True
                if client is not None:
                    client.close()
                client = None
                registered = False  # a restarted coordinator may not know this incarnation
                pause = min(pause * 2, 1.0)  # within the coordinator's restart grace (5 s)
            self._stop.wait(pause)
        if client is not None:
            client.close()
