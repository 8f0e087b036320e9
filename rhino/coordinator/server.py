"""``rhino coordinator``: the coordinator as a process (docs/design.md §2-§4).

It serves :class:`~rhino.coordinator.Coordinator`'s methods over the framed,
HMAC-authenticated protocol of the workers (docs/protocol.md §8), keeps its
metadata in ``--dir`` (SQLite), and logs one JSON object per line on stderr.
A killed coordinator restarted on the same ``--dir`` resumes where it stopped.

``--rebuild``: the directory was lost. The coordinator starts empty, waits for
``--expect-workers`` workers to register (they keep heartbeating to this
address and register again when told they are unknown), then rebuilds the
placement and the last complete checkpoints from what the workers host and
hold (:mod:`.rebuild`), and serves.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Optional

from .. import _core
from .._argtypes import uint32
from .._secret import secret_bytes
from ..errors import InvalidArgumentError, PermissionDeniedError
from ..replication import parse_address, read_secret_file
from ..tls.config import TLS, tls_kwargs
from .api import LANE_METHODS, authorize

__all__ = ["CoordinatorServer", "main", "build_parser"]

LANE_THREADS = 2  # the liveness lane's threads: a status call never holds up a heartbeat


class CoordinatorServer:
    """A Coordinator served on ``host:port`` (port 0: any free port)."""

    def __init__(self, coordinator: Any, host: str, port: int, *, secret: Any, threads: int = 16,
                 tls: Any = None, max_connections: int = _core.MAX_CONNECTIONS,
                 max_unauthenticated_connections: int = _core.MAX_UNAUTHENTICATED_CONNECTIONS,
                 max_connections_per_peer: int = _core.MAX_CONNECTIONS_PER_PEER,
                 max_unauthenticated_per_peer: int = _core.MAX_UNAUTHENTICATED_PER_PEER) -> None:
        self.coordinator = coordinator
        self._refused = 0
        self._last_refusal_log = -1.0

        def handler(method: str, args_json: str, caller: tuple) -> tuple[int, str, str]:
            try:
                args = json.loads(args_json) if args_json else {}
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(f"{method}: the arguments are not JSON: {e}") from None
            role, scope, peer_id, address = caller
            try:
                authorize(method, args, role, scope, f"{peer_id.decode(errors='replace')} at {address}")
            except PermissionDeniedError as e:
                self._log_refusal(str(e))
                raise
            return 0, "", json.dumps(coordinator.handle(method, args), separators=(",", ":"))

        # Handlers may block (a handover step, a bulk copy, a failover calling
        # workers) while heartbeats must still be answered: heartbeats and
        # status have a lane of their own (api.LANE_METHODS), so that no number
        # of slow calls queues them. A heartbeat that waited behind a failover
        # made live workers look dead, and failed them over too.
        self._server = _core.CoordServer(host, port, secret_bytes(secret), handler, server_id="coordinator",
                                         threads=threads, lane_methods=LANE_METHODS, lane_threads=LANE_THREADS,
                                         max_connections=max_connections,
                                         max_unauthenticated_connections=max_unauthenticated_connections,
                                         max_connections_per_peer=max_connections_per_peer,
                                         max_unauthenticated_per_peer=max_unauthenticated_per_peer,
                                         with_caller=True, **tls_kwargs(tls))

    def _log_refusal(self, message: str) -> None:
        """A refused request's log line (docs/protocol.md §2, "Roles"), at most one a second."""
        now = time.monotonic()
        self._refused += 1
        if now - self._last_refusal_log >= 1.0:
            self._last_refusal_log = now
            log = getattr(self.coordinator, "log", None)
            if callable(log):
                log("permission_denied", message=message, refused_so_far=self._refused)
            else:
                print(f"rhino coordinator: permission denied: {message} ({self._refused} refused so far)",
                      file=sys.stderr, flush=True)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def address(self) -> str:
        return self._server.address

    def close(self) -> None:
        self._server.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhino coordinator",
                                description="The Replication and Handover Managers, as a process.")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to serve on (default: %(default)s; port 0: any)")
    p.add_argument("--dir", required=True, help="metadata directory (SQLite), e.g. next to Spark's checkpoints")
    p.add_argument("--secret-file", required=True, help="file holding the cluster's shared secret")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="this host's certificate: mutual TLS 1.3 with every client and worker (with --tls-key, "
                        "--tls-ca)")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's private key")
    p.add_argument("--tls-ca", default=None, metavar="PEM", help="the CA certificate peers' certificates chain to")
    p.add_argument("--heartbeat-timeout", type=float, default=3.0,
                   help="declare a worker dead after this many seconds without a heartbeat (default: %(default)s)")
    p.add_argument("--request-timeout", type=float, default=60.0,
                   help="seconds one request to a worker may take (default: %(default)s)")
    p.add_argument("--copy-timeout", type=float, default=600.0,
                   help="seconds a bulk copy to a new chain member may take (default: %(default)s)")
    p.add_argument("--handover-timeout", type=float, default=120.0,
                   help="seconds a handover step at one worker may take before the step aborts (default: %(default)s)")
    p.add_argument("--handover", choices=["copy-first", "early"], default="copy-first",
                   help="a vnode move whose target's worker holds no replica of the origin's checkpoint: "
                        "copy it there first, or take the vnodes on it as a base, read through until it lands "
                        "(the early hand-over, docs/design.md section 4.1; default: %(default)s)")
    p.add_argument("--threads", type=int, default=16, help="request handler threads (default: %(default)s)")
    p.add_argument("--max-connections", type=uint32, default=_core.MAX_CONNECTIONS,
                   help="connections held at once; more are refused with ResourceExhausted (docs/protocol.md §2; "
                        "default: %(default)s; 0: no bound)")
    p.add_argument("--max-unauthenticated-connections", type=uint32, default=_core.MAX_UNAUTHENTICATED_CONNECTIONS,
                   help="handshakes in progress at once; more are refused (default: %(default)s; 0: no bound)")
    p.add_argument("--max-connections-per-peer", type=uint32, default=_core.MAX_CONNECTIONS_PER_PEER,
                   help="connections per peer IP address; more are refused (default: %(default)s; 0: no bound)")
    p.add_argument("--max-unauthenticated-per-peer", type=uint32, default=_core.MAX_UNAUTHENTICATED_PER_PEER,
                   help="handshakes in progress per peer IP address; more are refused (default: %(default)s; "
                        "0: no bound)")
    p.add_argument("--rebuild", action="store_true",
                   help="the metadata is lost: rebuild it from the workers' stores (needs --expect-workers)")
    p.add_argument("--expect-workers", type=int, default=0, help="with --rebuild: workers to wait for")
    p.add_argument("--rebuild-wait", type=float, default=60.0,
                   help="with --rebuild: seconds to wait for them (default: %(default)s)")
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    from ..daemon.worker import JsonLogger
    from .coordinator import Coordinator
    from .rebuild import rebuild_from_workers

    args = build_parser().parse_args(argv)
    log = JsonLogger("coordinator", args.log_format)
    try:
        host, port = parse_address(args.listen)
        secret = read_secret_file(args.secret_file)
        tls = TLS.from_args(args.tls_cert, args.tls_key, args.tls_ca)
        for name in ("heartbeat_timeout", "request_timeout", "copy_timeout", "handover_timeout"):
            if not getattr(args, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if args.threads < 4:
            raise ValueError("--threads must be at least 4")
        if args.rebuild and args.expect_workers < 1:
            raise ValueError("--rebuild needs --expect-workers N (how many workers hold the state)")
        if args.rebuild and os.path.exists(os.path.join(args.dir, "coordinator.db")):
            raise ValueError(f"--rebuild: {args.dir} already holds metadata; move it away first")
    except (OSError, ValueError) as e:
        log.error("bad_configuration", error=str(e))
        return 2

    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    coord = Coordinator(args.dir, secret=secret, heartbeat_timeout=args.heartbeat_timeout, handover=args.handover,
                        request_timeout=args.request_timeout, copy_timeout=args.copy_timeout,
                        handover_timeout=args.handover_timeout, log=log.info,
                        rebuilding=args.rebuild, tls=tls)
    try:
        server = CoordinatorServer(coord, host, port, secret=secret, threads=args.threads, tls=tls,
                                   max_connections=args.max_connections,
                                   max_unauthenticated_connections=args.max_unauthenticated_connections,
                                   max_connections_per_peer=args.max_connections_per_peer,
                                   max_unauthenticated_per_peer=args.max_unauthenticated_per_peer)
    except Exception as e:  # noqa: BLE001 - a bind failure ends the process, logged
        log.error("start_failed", error=str(e), error_type=type(e).__name__)
        coord.close()
        return 1
    log.info("listening", host=host, port=server.port, dir=args.dir, pid=os.getpid(),
             heartbeat_timeout=args.heartbeat_timeout)
    if args.rebuild:
        deadline = time.monotonic() + args.rebuild_wait
        while (len(coord.workers.alive_workers()) < args.expect_workers and time.monotonic() < deadline
               and not stop.is_set()):
            time.sleep(0.1)
        workers = coord.workers.alive_workers()
        if len(workers) < args.expect_workers:
            log.warning("rebuild_short_of_workers", registered=len(workers), expected=args.expect_workers)
        summary = rebuild_from_workers(coord)
        log.info("rebuilt", **summary)
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    server.close()
    coord.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
