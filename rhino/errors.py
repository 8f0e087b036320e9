"""Rhino's exceptions.

Every C++ ``Status`` code maps to exactly one class here, and every class
here to a code: the list, with each code's class, is
``src/cpp/include/rhino/status_codes.h`` (``rhino._core.status_codes()``), and
``tests/test_status_codes.py`` holds this module to it. Each class also
inherits the builtin exception a Python user would catch for that situation,
so ``except KeyError`` or ``except OSError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "RhinoError",
    "NotFoundError",
    "CorruptionError",
    "InvalidArgumentError",
    "RhinoIOError",
    "AlreadyExistsError",
    "UnknownVnodeError",
    "KeyTypeError",
    "PathOutsideStoreError",
    "NoSpaceError",
    "BusyError",
    "RhinoTimeoutError",
    "PeerDeadError",
    "AbortedError",
    "StaleChainVersionError",
    "AuthFailedError",
    "TLSError",
    "UnknownInstanceError",
    "SessionBusyError",
    "OperatorRunningError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "StaleAttemptError",
    "StaleEpochError",
]


class RhinoError(Exception):
    """Base class of every error Rhino raises."""


class NotFoundError(RhinoError, FileNotFoundError):
    """A checkpoint, state directory or export that does not exist."""


class CorruptionError(RhinoError, OSError):
    """Data failed a check: a checksum mismatch, a truncated or malformed file."""


class InvalidArgumentError(RhinoError, ValueError):
    """A parameter is out of its domain, e.g. K not a power of two."""


class RhinoIOError(RhinoError, OSError):
    """The operating system refused an operation."""


class NoSpaceError(RhinoIOError):
    """The disk is full (ENOSPC, EDQUOT or EFBIG). Nothing committed is lost."""


class AlreadyExistsError(RhinoError, FileExistsError):
    """A target that must not exist does (a restore directory, a committed checkpoint)."""


class UnknownVnodeError(RhinoError, KeyError):
    """A vnode outside [0, V), or one this instance does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class KeyTypeError(RhinoError, TypeError):
    """A key of an unsupported type: keys are int64 arrays, or bytes, str or int."""


class PathOutsideStoreError(RhinoError, ValueError):
    """A name that would resolve outside the store directory (e.g. contains '..')."""


class BusyError(RhinoError, RuntimeError):
    """A resource is busy: locked by another process (e.g. a RocksDB directory
    already open), or a state recovering from a write error (retry shortly)."""


class RhinoTimeoutError(RhinoError, TimeoutError):
    """A deadline passed, e.g. a replica chain did not acknowledge a checkpoint in time."""


class PeerDeadError(RhinoError, ConnectionError):
    """A peer closed its connection or stopped answering heartbeats (protocol §6)."""


class AbortedError(RhinoError, ConnectionAbortedError):
    """A replication stream was aborted: by a peer, a cancel, or a worker shutting down."""


class StaleChainVersionError(RhinoError, RuntimeError):
    """A message of an older replica chain version was fenced off (protocol §5)."""


class AuthFailedError(RhinoError, PermissionError):
    """A peer does not know the shared secret (protocol §2)."""


class TLSError(AuthFailedError):
    """A TLS handshake failed: the peer's certificate does not chain to our CA, has
    expired, or does not name the host dialled; or the peer does not speak TLS (a
    plaintext peer on a TLS listener, or the reverse). The message names which."""


class UnknownInstanceError(RhinoError, LookupError):
    """The worker does not host that (operator, instance): it was never opened
    there, it was closed, or it moved to another worker (protocol §7)."""


class SessionBusyError(BusyError):
    """The instance already has an open session: one batch at a time (protocol §7.2)."""


class OperatorRunningError(BusyError):
    """A query runs the operator, so it is not dropped: a batch of it is in flight, or
    its driver or tasks called the coordinator recently (``rhino drop``, docs/protocol.md §8.2)."""


class ResourceExhaustedError(RhinoError, RuntimeError):
    """A bound on what a peer may make a worker or the coordinator hold was hit, e.g.
    a listener's connection limits (``max_connections``,
    ``max_unauthenticated_connections``, ``max_connections_per_peer``,
    ``max_unauthenticated_per_peer``: docs/protocol.md §2, "Connection limits"). The
    message names the bound; the server serves on."""


class PermissionDeniedError(RhinoError, PermissionError):
    """The role the caller proved in the handshake may not make this request: a task
    credential asking to fence an instance, a task of one namespace opening a session
    on another's operator, a worker registering as another worker's id
    (docs/protocol.md §2, "Roles"). The message names the request and the role; the
    server logs the refusal and serves on."""


class StaleEpochError(RhinoError, RuntimeError):
    """A request of an older configuration epoch: the instance has moved on, ask
    the coordinator for the current placement (fencing, protocol §7.5)."""


class StaleAttemptError(StaleEpochError):
    """A session of stale work (protocol §7.2 step 1): of an attempt that a later one of
    the coordinator's ``begin_batch`` has superseded, or of a batch older than the one the
    coordinator committed last. A zombie task's; the current attempt runs on."""

