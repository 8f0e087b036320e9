"""Rhino keeps very large keyed state of PySpark jobs ready to move.

The public API:

- :class:`Partitioner` maps keys to key groups and vnodes (XXH3, docs/design.md §1);
  :func:`routed_key` builds a key that lives in the vnode of its routing part
  (docs/protocol.md §7.8), :func:`split_routed_key` takes one apart.
- :class:`RoutingTable` maps vnodes to instances, versioned by an epoch.
- :class:`StateBackend` is one instance's state: RocksDB, a column family per vnode.
- :class:`ReplicaStore` holds checkpoints: a content-addressed file pool plus
  atomically committed manifests, restorable by hard links.
- :class:`Worker` is one host's runtime: replica store plus data-plane server;
  :func:`replicate` streams a checkpoint down a chain of workers and
  :func:`query_store` asks a worker what it holds (docs/protocol.md).
- :func:`connect` reaches a worker's state service: sessions read and write
  the instances it hosts, one micro-batch at a time (:mod:`rhino.client`).
- :func:`operator_id` names an operator within a namespace (a job's id).

Errors are subclasses of :class:`RhinoError` (see :mod:`rhino.errors`).
"""

from __future__ import annotations

from . import errors
from ._core import (
    FileEntry,
    Manifest,
    Partitioner,
    ReplicaStore,
    ReplicationHandle,
    RestoreStats,
    RoutingTable,
    StateBackend,
    VerifyProblem,
    VerifyReport,
    WriteBatch,
    __version__,
    routed_key,
    routed_keys,
    split_routed_key,
)
from ._secret import Worker
from .errors import (
    AbortedError,
    AlreadyExistsError,
    AuthFailedError,
    BusyError,
    CorruptionError,
    InvalidArgumentError,
    KeyTypeError,
    NoSpaceError,
    NotFoundError,
    PathOutsideStoreError,
    PeerDeadError,
    RhinoError,
    RhinoIOError,
    RhinoTimeoutError,
    StaleChainVersionError,
    UnknownVnodeError,
    UnknownInstanceError,
    SessionBusyError,
    OperatorRunningError,
    ResourceExhaustedError,
    PermissionDeniedError,
    TLSError,
    StaleEpochError,
    StaleAttemptError,
)
from .replication import query_store, replicate
from .client import Client, Session, connect
from .credential import Credential
from .tls.config import TLS
from .coordinator.naming import operator_id

__all__ = [
    "__version__",
    "Partitioner",
    "routed_key",
    "routed_keys",
    "split_routed_key",
    "RoutingTable",
    "StateBackend",
    "WriteBatch",
    "ReplicaStore",
    "Manifest",
    "FileEntry",
    "RestoreStats",
    "VerifyReport",
    "VerifyProblem",
    "Worker",
    "ReplicationHandle",
    "replicate",
    "query_store",
    "connect",
    "Credential",
    "operator_id",
    "TLS",
    "Client",
    "Session",
    "errors",
    "RhinoError",
    "NotFoundError",
    "CorruptionError",
    "InvalidArgumentError",
    "RhinoIOError",
    "NoSpaceError",
    "AlreadyExistsError",
    "UnknownVnodeError",
    "KeyTypeError",
    "PathOutsideStoreError",
    "BusyError",
    "RhinoTimeoutError",
    "PeerDeadError",
    "AbortedError",
    "StaleChainVersionError",
    "AuthFailedError",
    "UnknownInstanceError",
    "SessionBusyError",
    "OperatorRunningError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "TLSError",
    "StaleEpochError",
    "StaleAttemptError",
]
