"""Chain replication of checkpoints, from Python (docs/protocol.md §4).

A thin layer over :mod:`rhino._core`: :func:`replicate` starts streaming one
checkpoint of an instance, from the primary's replica store, down a chain of
workers, and returns a :class:`ReplicationHandle` at once (the transfer runs on
C++ threads, without the GIL). :func:`query_store` asks a worker which
checkpoints of an instance it holds. Restoring from a replica is a local,
hard-link operation: ``rhino.ReplicaStore(replica_dir).restore(...)``.

Errors are :class:`rhino.RhinoError` subclasses: ``AuthFailedError`` (wrong
secret), ``StaleChainVersionError`` (a newer chain exists),
``RhinoTimeoutError`` (no ack within the timeout), ``PeerDeadError``,
``NoSpaceError`` (a replica's disk is full), ``AbortedError``...
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional

from . import _core
from ._core import ReplicationHandle, ReplicaStore
from ._secret import call_hiding_secret
from .credential import credential_args, parse_credential
from .tls.config import TLS, tls_kwargs

__all__ = ["replicate", "query_store", "ReplicationHandle", "read_secret_file", "parse_address"]


def read_secret_file(path: str | os.PathLike[str]) -> Any:
    """The cluster's root secret in `path`, without surrounding whitespace (a trailing
    newline from an editor is not part of the secret), or the :class:`rhino.Credential`
    of a credential file (``rhino credential``), which every ``secret=`` takes too."""
    with open(path, "rb") as f:
        secret = f.read().strip()
    if not secret:
        raise ValueError(f"secret file {path} is empty")
    try:
        cred = parse_credential(secret)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return secret if cred is None else cred


def parse_address(address: str) -> tuple[str, int]:
    """'127.0.0.2:7000' -> ('127.0.0.2', 7000); '[::1]:7000' -> ('::1', 7000)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def replicate(
    store: ReplicaStore | str | os.PathLike[str],
    operator_id: str,
    instance: int,
    checkpoint_id: int,
    chain: Sequence[str],
    *,
    chain_version: int,
    secret: bytes | str,
    chunk_bytes: int = 1 << 20,
    window: int = 16,
    timeout: float = 30.0,
    heartbeat: float = 0.5,
    peer_timeout: float = 3.0,
    client_id: str = "primary",
    tls: Optional[TLS] = None,
    role: str = "admin",
    scope: str = "",
) -> ReplicationHandle:
    """Starts replicating checkpoint `checkpoint_id` of (operator_id, instance),
    committed in `store`, down `chain` (["host:port", ...], head first).

    The checkpoint is complete once ``handle.wait()`` returns a result: every
    member has committed it (Rhino §4.2.2). ``wait`` raises the mapped error if
    the chain failed; retry on a repaired chain with a higher `chain_version`.
    ``wait`` releases the GIL but still runs Python's signal handlers every
    100 ms, so Ctrl-C (KeyboardInterrupt) or a SIGTERM handler interrupts
    the wait, not the transfer (drop or cancel the handle to stop it).
    Memory per stream is bounded by ``window x chunk_bytes`` at every member.
    Keep the handle until the transfer is done: dropping the last reference to
    it cancels the transfer down the chain (nothing is committed then).
    ``tls`` (a :class:`rhino.TLS`): mutual TLS to the chain's head, whose
    certificate must name the address dialled.
    """
    path = store.path if isinstance(store, ReplicaStore) else os.fspath(store)
    if isinstance(chain, (str, bytes)):
        raise TypeError("chain must be a list of 'host:port' strings, head first, not a single string")
    return call_hiding_secret(
        _core.replicate,
        path,
        operator_id,
        instance,
        checkpoint_id,
        list(chain),
        chain_version=chain_version,
        **credential_args(secret, role, scope),
        chunk_bytes=chunk_bytes,
        window=window,
        timeout_ms=max(1, int(timeout * 1000)),
        heartbeat_ms=max(1, int(heartbeat * 1000)),
        peer_timeout_ms=max(1, int(peer_timeout * 1000)),
        client_id=client_id,
        **tls_kwargs(tls),
    )


def query_store(
    address: str, *, secret: Any, operator_id: str, instance: int, timeout: float = 5.0,
    tls: Optional[TLS] = None, role: str = "admin", scope: str = "",
) -> list[int]:
    """Checkpoint ids of an instance committed in the store of the worker at `address`.
    ``secret``: the root secret (proving ``role``) or a :class:`rhino.Credential`."""
    return call_hiding_secret(
        _core.query_store,
        address,
        **credential_args(secret, role, scope),
        operator_id=operator_id,
        instance=instance,
        timeout_ms=max(1, int(timeout * 1000)),
        **tls_kwargs(tls),
    )
