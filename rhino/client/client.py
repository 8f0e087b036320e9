"""`rhino.connect` and the Client: one authenticated connection to a worker."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional, Sequence

from .. import _core
from .._secret import call_hiding_secret
from ..credential import credential_args
from ..errors import InvalidArgumentError
from ..tls.config import TLS, tls_kwargs
from .reader import CheckpointReader
from .session import Session

__all__ = ["connect", "Client"]


def connect(address: str | os.PathLike, *, secret: Any, client_id: str = "client",
            request_timeout: float = 120.0, peer_timeout: float = 3.0,
            bind_host: str = "", max_frame_bytes: Optional[int] = None, tls: Optional[TLS] = None,
            role: str = "admin", scope: str = "") -> "Client":
    """Connects to a worker's state service.

    ``address`` is a Unix socket path (a worker on this host: ``rhino worker
    --unix-socket``) or ``"host:port"`` (a worker elsewhere, its ``--listen``).
    ``secret`` is the cluster's shared secret (bytes or str), from which the
    key of ``role`` with ``scope`` is derived (admin by default), or a
    :class:`rhino.Credential` (a Spark job's task credential), whose role is
    proved instead (docs/protocol.md §2, "Roles"); a wrong one raises
    :class:`rhino.AuthFailedError`, a request the role may not make
    :class:`rhino.PermissionDeniedError`. ``request_timeout`` bounds one
    request, a barrier commit included; ``bind_host`` sets the TCP client's
    own address (e.g. this host's 127.0.0.N). ``max_frame_bytes`` must not
    exceed the worker's ``--max-frame-bytes`` (default: the same default):
    batches are split into frames of that size. ``tls`` (a :class:`rhino.TLS`)
    runs a TCP connection over mutual TLS: the worker's certificate must name
    the host dialled, and ours must chain to its CA, or
    :class:`rhino.TLSError` says which side refused what. A Unix socket ignores it.
    """
    address = os.fspath(address)
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError("address must be a Unix socket path or 'host:port'")
    if request_timeout <= 0 or peer_timeout <= 0:
        raise InvalidArgumentError("timeouts must be positive")
    handle = call_hiding_secret(
        _core.StateClient.connect, address, client_id=client_id, **credential_args(secret, role, scope),
        peer_timeout_ms=int(peer_timeout * 1000), request_timeout_ms=int(request_timeout * 1000),
        local_bind_host=bind_host, **tls_kwargs(tls),
        max_frame_bytes=int(max_frame_bytes if max_frame_bytes is not None else _core.MAX_FRAME_BYTES))
    return Client(handle)


def _json(args: dict) -> str:
    return json.dumps(args, separators=(",", ":"))


class Client:
    """A connection to one worker. Thread-safe; close() (or ``with``) ends it."""

    def __init__(self, handle: "_core.StateClient") -> None:
        self._h = handle

    # ---- sessions ----------------------------------------------------------
    def session(self, operator_id: str, instance: int, *, batch: int, epoch: int,
                attempt: Optional[int] = None, committed: Optional[int] = None) -> Session:
        """Opens the session of micro-batch ``batch`` on an instance the worker hosts.

        The session sees exactly the state at version ``batch - 1``; if the
        worker's state is ahead (the batch runs again), the worker first rolls
        it back by a hard-link restore (``Session.rolled_back``). Raises
        :class:`rhino.SessionBusyError` if the instance has an open session,
        :class:`rhino.StaleEpochError` for an old ``epoch``, and
        :class:`rhino.UnknownInstanceError` if the worker does not host it.

        ``attempt`` and ``committed`` are the attempt fence (docs/protocol.md §7.2): the
        token the coordinator's ``begin_batch`` gave this attempt (``Placement.attempt``)
        and the operator's last committed batch then (``Placement.last_batch``). The
        worker refuses a session of a superseded attempt, or of a batch older than the
        committed one, with :class:`rhino.StaleAttemptError`.
        """
        _check_uint("batch", batch)
        _check_uint("epoch", epoch)
        _check_uint("instance", instance)
        if attempt is not None:
            _check_uint("attempt", attempt)
        if committed is not None:
            if attempt is None:
                raise InvalidArgumentError("committed= is sent with an attempt= token only")
            _check_uint("committed", committed)
        h, version, rolled_back = self._h.open_session(operator_id, instance, batch, epoch, attempt, committed)
        return Session(h, operator_id=operator_id, instance=instance, batch=batch, epoch=epoch,
                       version=version, rolled_back=rolled_back)

    def read_checkpoint(self, operator_id: str, instance: int, checkpoint: Optional[int] = None
                        ) -> CheckpointReader:
        """Reads committed checkpoint ``checkpoint`` (None: the newest) of an
        instance from this worker's **own** replica store: a primary's or a
        replica's, with no query running. The worker restores it by hard links
        into a directory of its own, which goes when the reader is closed.
        Several readers may be open at once, also while the instance has a
        session. Raises :class:`rhino.NotFoundError` if the store does not hold
        the checkpoint, :class:`rhino.CorruptionError` if it is damaged."""
        _check_uint("instance", instance)
        if checkpoint is not None:
            _check_uint("checkpoint", checkpoint)
        h, cid, vnodes = self._h.read_checkpoint(operator_id, instance, checkpoint)
        return CheckpointReader(h, operator_id=operator_id, instance=instance, checkpoint=cid, vnodes=vnodes)

    # ---- instances (what the coordinator will call) ----------------------------
    def open_instance(self, operator_id: str, instance: int, *, epoch: int, num_vnodes: int = 256,
                      num_key_groups: int = 1 << 15, seed: int = 0, vnodes: Optional[Iterable[int]] = None,
                      chain: Sequence[str] = (), chain_version: int = 0) -> dict:
        """Hosts an instance on the worker under ``epoch`` (created empty if new,
        else opened as it was): it stays open across batches. ``vnodes`` are
        the vnodes it holds (all when None); ``chain`` the replica chain each
        commit's checkpoint goes down (``"host:port"`` of each member)."""
        args = {"num_vnodes": num_vnodes, "num_key_groups": num_key_groups, "seed": seed,
                "chain": list(chain), "chain_version": chain_version}
        if vnodes is not None:
            args["vnodes"] = [int(v) for v in vnodes]
        return self._call("open", operator_id, instance, epoch, args)

    def close_instance(self, operator_id: str, instance: int, *, epoch: int) -> None:
        """Stops hosting the instance; its files stay, and open_instance opens them again."""
        self._call("close", operator_id, instance, epoch, {})

    def takeover(self, operator_id: str, instance: int, *, epoch: int, checkpoint: Optional[int] = None,
                 chain: Sequence[str] = (), chain_version: int = 0, redo_version: Optional[int] = None,
                 redo: Sequence[dict] = ()) -> dict:
        """Starts hosting the instance from checkpoint ``checkpoint`` (default:
        the newest) of the worker's **own** replica store, by hard links, under
        the new ``epoch`` (failover). Returns its info, with ``restore_s``.

        ``redo`` (with ``redo_version``) are the reconfiguration steps of a
        handover the old primary applied on top of checkpoint ``redo_version``
        (see :meth:`reconfigure`): they run again here if that is the
        checkpoint taken over."""
        args: dict = {"checkpoint": checkpoint, "chain": list(chain), "chain_version": chain_version}
        if redo_version is not None:
            args["redo_version"] = redo_version
            args["redo"] = list(redo)
        return self._call("takeover", operator_id, instance, epoch, args)

    def reconfigure(self, operator_id: str, instance: int, *, epoch: int, version: int,
                    ops: Sequence[dict], timeout: float = 120.0) -> dict:
        """A handover's step at a hosted instance, at the barrier after batch
        ``version`` (docs/design.md §4 step 4). ``ops`` run in order:
        ``{"op": "drop", "vnodes": [...]}`` or ``{"op": "import", "vnodes": [...],
        "from_operator": ..., "from_instance": ..., "checkpoint": ...}`` (by hard
        links from this worker's replica store; an import replaces the vnode's
        state here). The worker keeps them as the redo of checkpoint
        ``version`` until a later checkpoint is complete. A new instance (no
        version yet) is instead checkpointed as ``version`` and replicated
        before this returns."""
        return self._call("reconfigure", operator_id, instance, epoch,
                          {"version": version, "ops": list(ops), "timeout_s": timeout})

    def replicate(self, operator_id: str, instance: int, *, epoch: int, to: Sequence[str], chain_version: int,
                  checkpoint: Optional[int] = None, timeout: float = 600.0) -> dict:
        """Sends checkpoint ``checkpoint`` (default: the newest) of this
        worker's store to the workers ``to`` (``"host:port"``), each receiving
        every file it lacks: the bulk copy of a chain repair or a scale-out.
        Returns ``checkpoint``, ``bytes_sent`` and ``seconds``."""
        return self._call("replicate", operator_id, instance, epoch,
                          {"to": list(to), "chain_version": chain_version, "checkpoint": checkpoint,
                           "timeout_s": timeout})

    def compact(self, operator_id: str, instance: int, *, epoch: int) -> dict:
        """Compacts every vnode of a hosted instance fully, between batches (refused
        with :class:`rhino.SessionBusyError` while a session is open), which drops
        the TTL entries its clock has expired (docs/protocol.md §7.8). Returns
        ``bytes_before`` and ``bytes_after`` (live SST bytes of its vnodes),
        ``ttl_clock`` and ``seconds``."""
        return self._call("compact", operator_id, instance, epoch, {})

    def drop(self, operator_id: str, instance: int, *, epoch: int) -> dict:
        """Removes every trace of the instance from this worker: its live state (closed
        first if hosted here), its replica-store checkpoints, its standby directory and
        its epoch and chain-version fences; the pooled files no other checkpoint uses
        are garbage-collected at once if the store is not busy (docs/protocol.md §7.1
        drop). Refused with :class:`rhino.SessionBusyError` while a session is open and
        :class:`rhino.StaleEpochError` below the instance's epoch. Returns ``hosted``,
        ``checkpoints_removed`` and ``gc``. The coordinator's ``drop_operator`` sends it."""
        return self._call("drop", operator_id, instance, epoch, {})

    def fence(self, operator_id: str, instance: int, *, epoch: int) -> None:
        """Raises the instance's epoch on this worker: requests of older epochs are refused from now on."""
        self._call("fence", operator_id, instance, epoch, {})

    def discard_after(self, operator_id: str, instance: int, *, epoch: int, after: Optional[int]) -> list[int]:
        """Drops this worker's replica-store checkpoints of the instance newer
        than ``after`` (every one when None), newest first; returns the ids
        removed. Their files stay in the pool until its garbage collection.
        It raises the worker's epoch of the instance to ``epoch`` (an older one
        is refused with :class:`rhino.StaleEpochError`), and is refused with
        :class:`rhino.InvalidArgumentError` where the instance is hosted: a
        worker's own history is dropped only by its rollbacks and takeovers
        (docs/protocol.md §7.1, §7.3)."""
        if after is not None:
            _check_uint("after", after)
        return self._call("discard_after", operator_id, instance, epoch, {"after": after})["removed"]

    def import_vnodes(self, operator_id: str, instance: int, *, epoch: int, from_operator: str,
                      from_instance: int, checkpoint: int, vnodes: Iterable[int]) -> list[int]:
        """Imports ``vnodes`` into a hosted instance from checkpoint ``checkpoint``
        of another instance, held in this worker's replica store (by hard links)."""
        out = self._call("import", operator_id, instance, epoch,
                         {"from_operator": from_operator, "from_instance": from_instance,
                          "checkpoint": checkpoint, "vnodes": [int(v) for v in vnodes]})
        return out["imported"]

    def move_vnodes(self, operator_id: str, instance: int, *, epoch: int, to_operator: str, to_instance: int,
                    to_epoch: int, vnodes: Iterable[int]) -> list[int]:
        """Moves ``vnodes`` between two instances this worker hosts (export, import, drop)."""
        out = self._call("move_vnodes", operator_id, instance, epoch,
                         {"to_operator": to_operator, "to_instance": to_instance, "to_epoch": to_epoch,
                          "vnodes": [int(v) for v in vnodes]})
        return out["moved"]

    def instances(self) -> list[dict]:
        """What the worker hosts: one dict per instance (epoch, version, vnodes, chain, ...)."""
        return self._call("list", "", 0, 0, {})["instances"]

    def status(self, operator_id: str, instance: int, *, checkpoint: Optional[int] = None,
               wait: bool = True) -> dict:
        """One instance as this worker sees it: its checkpoints here, ``fence_epoch``
        (the highest epoch seen for it here), and if it is hosted here its epoch,
        version and, for ``checkpoint``, that checkpoint's replication ("complete",
        "pending", "failed" or "unknown"). With ``wait`` False it never waits for
        the instance: while a commit holds it, the answer has ``busy`` True and no
        hosted fields."""
        if not isinstance(wait, bool):
            raise TypeError(f"wait must be a bool, got {type(wait).__name__}")
        return self._call("status", operator_id, instance, 0, {"checkpoint": checkpoint, "wait": wait})

    def _call(self, action: str, operator_id: str, instance: int, epoch: int, args: dict) -> dict:
        _check_uint("instance", instance)
        _check_uint("epoch", epoch)
        return json.loads(self._h.instance(action, operator_id, instance, epoch, _json(args)))

    # ---- lifetime -------------------------------------------------------------
    @property
    def address(self) -> str:
        return self._h.address

    @property
    def is_unix(self) -> bool:
        """True over a Unix domain socket (a client on the worker's host)."""
        return self._h.is_unix

    @property
    def is_open(self) -> bool:
        return self._h.is_open

    def close(self) -> None:
        """Closes the connection; a session still open on it is aborted by the worker."""
        self._h.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<rhino.Client {'unix' if self._h.is_unix else 'tcp'}:{self._h.address}>"


def _check_uint(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or value >= 1 << 64:
        raise InvalidArgumentError(f"{name} must be in [0, 2**64), got {value}")
