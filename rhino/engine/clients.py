"""The clients of one process to the workers: one connection per worker address,
kept across batches (a Spark task's Python worker keeps them across tasks), and
dropped when the worker behind it is found unreachable."""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

from ..client.client import Client, connect
from ..coordinator.types import InstancePlacement
from ..errors import RhinoError

__all__ = ["WorkerClients", "primary_address"]


class WorkerClients:
    """A client cache: one open :class:`~rhino.client.Client` per worker address. Thread-safe
    (a task's doomed-attempt watch asks its primary for the instance's epoch while the task
    works): two threads never each connect one, which would leave a session on a client the
    cache no longer holds."""

    def __init__(self, *, secret: Any, client_id: str, request_timeout: float = 120.0, tls: Any = None,
                 role: str = "admin") -> None:
        self._secret = secret  # the root secret, proving `role`, or a rhino.Credential (a task's)
        self._role = role
        self._tls = tls  # a rhino.TLS for TCP connections; None: plaintext
        self.client_id = client_id
        self.request_timeout = request_timeout
        self._clients: dict[str, Client] = {}
        self._lock = threading.Lock()

    def get(self, address: str) -> Client:
        """The open client of ``address`` (a Unix socket path or ``host:port``), connected
        on first use or again after its connection closed."""
        with self._lock:
            c = self._clients.get(address)
            if c is None or not c.is_open:
                c = connect(address, secret=self._secret, client_id=self.client_id,
                            request_timeout=self.request_timeout, tls=self._tls, role=self._role)
                self._clients[address] = c
            return c

    def drop(self, address: Optional[str]) -> None:
        """Closes and forgets the client of ``address`` (its worker was found unreachable)."""
        with self._lock:
            c = self._clients.pop(address, None) if address else None
        if c is not None:
            try:
                c.close()
            except RhinoError:
                pass

    def close(self) -> None:
        for address in list(self._clients):
            self.drop(address)


def primary_address(info: InstancePlacement, host: Optional[str] = None) -> tuple[str, bool]:
    """The address to reach an instance's primary at (``info`` is the instance's entry of
    the placement), and whether it is local: its Unix socket when the primary runs on
    ``host`` (this task's host) and the socket is there, else its TCP ``address``."""
    sock = info.unix_socket
    if host is not None and sock and info.host == host and os.path.exists(sock):
        return sock, True
    return info.address, False
