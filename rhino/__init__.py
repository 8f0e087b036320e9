"""Rhino keeps very large keyed state of PySpark jobs ready to move.

The public API:

- :class:`Partitioner` maps keys to key groups and vnodes (XXH3, DESIGN §1).
- :class:`RoutingTable` maps vnodes to instances, versioned by an epoch.
- :class:`StateBackend` is one instance's state: RocksDB, a column family per vnode.
- :class:`ReplicaStore` holds checkpoints: a content-addressed file pool plus
  atomically committed manifests, restorable by hard links.

Errors are subclasses of :class:`RhinoError` (see :mod:`rhino.errors`).
"""

from __future__ import annotations

from . import errors
from ._core import (
    FileEntry,
    Manifest,
    Partitioner,
    ReplicaStore,
    RestoreStats,
    RoutingTable,
    StateBackend,
    VerifyProblem,
    VerifyReport,
    WriteBatch,
    __version__,
)
from .errors import (
    AlreadyExistsError,
    BusyError,
    CorruptionError,
    InvalidArgumentError,
    KeyTypeError,
    NoSpaceError,
    NotFoundError,
    PathOutsideStoreError,
    RhinoError,
    RhinoIOError,
    UnknownVnodeError,
)

__all__ = [
    "__version__",
    "Partitioner",
    "RoutingTable",
    "StateBackend",
    "WriteBatch",
    "ReplicaStore",
    "Manifest",
    "FileEntry",
    "RestoreStats",
    "VerifyReport",
    "VerifyProblem",
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
]
