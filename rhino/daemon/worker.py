"""``rhino worker``: the per-host daemon (docs/design.md §2).

It hosts the C++ runtime (:class:`rhino._core.Worker`): the replica store, the
data-plane server that takes part in replica chains, and the state service,
which keeps the live state of the instances whose primary is on this host
open across micro-batches and serves it to the host's tasks in sessions, over
a Unix domain socket, and to other hosts over the same TCP listener
(docs/protocol.md §7). This module is only its shell:

- command-line options;
- structured logging, one JSON object per line on stderr;
- a Prometheus ``/metrics`` endpoint (``--metrics-listen``; :mod:`rhino.daemon.metrics`);
- clean shutdown on SIGTERM / SIGINT: streams under way are aborted (their
  staging removed), connections closed, then the process exits 0.

On start the replica store is opened, which removes the staging a killed
predecessor left behind, and verified at size level (O(files)); problems are
logged. A restart after SIGKILL therefore serves a store that verifies clean.

Run it as ``rhino worker``, ``rhino-worker`` or ``python -m rhino.daemon.worker``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any, NamedTuple, Optional

from .. import _core
from .._argtypes import uint32
from .._secret import Worker
from ..replication import parse_address, read_secret_file
from ..tls.config import TLS
from .metrics import ThroughputSampler, metrics_server, worker_registry

__all__ = ["main", "build_parser", "JsonLogger", "DEFAULT_NICE", "DEFAULT_SCHED"]

# The daemon's default --nice: 0 keeps the priority it was started with. On a
# host that also runs executors, --nice 10 makes replication yield the CPU to
# them (weight 110 against 1024 in the kernel's nice-to-weight table). The
# overhead benchmark (bench/README.md) did not show that it lowers the
# primary's write rate drop, so it is not the default.
DEFAULT_NICE = 0

# The daemon's default --sched: Linux's SCHED_BATCH for every thread. It keeps
# the daemon's CPU share (its weight is that of its nice value, as under the
# normal policy), but a batch thread that wakes up never preempts the thread
# running on that CPU; it waits for the running thread's slice to end or for
# a CPU to go idle (sched(7)). Replication is throughput work that no one
# waits on interactively, and its threads wake up for every chunk, so under
# the normal policy they kept preempting the executors' threads on a busy
# host. In eight alternating runs of the overhead benchmark (bench/README.md)
# the primary's write rate dropped 5.8-14.2% with r=2 under batch against
# 15.8-24.6% under normal, with the same replication lag. "normal" restores
# the normal policy.
DEFAULT_SCHED = "batch"
_SCHED_POLICIES = {"batch": "SCHED_BATCH", "normal": "SCHED_OTHER"}


class JsonLogger:
    """Structured logs: one JSON object per line (``--log-format json``) or
    ``key=value`` text. Thread-safe."""

    def __init__(self, worker_id: str, fmt: str = "json", stream: Any = None) -> None:
        self.worker_id = worker_id
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()

    def log(self, level: str, event: str, **fields: Any) -> None:
        rec = {"ts": round(time.time(), 3), "level": level, "worker": self.worker_id, "event": event, **fields}
        if self.fmt == "json":
            line = json.dumps(rec, default=str, separators=(",", ":"))
        else:
            line = " ".join(f"{k}={v}" for k, v in rec.items())
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def info(self, event: str, **fields: Any) -> None:
        self.log("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self.log("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self.log("error", event, **fields)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhino worker", description="Run one host's Rhino worker daemon.")
    p.add_argument("--id", required=True, help="worker id, e.g. w2")
    p.add_argument("--dir", required=True, help="replica store directory (created if missing)")
    p.add_argument("--listen", required=True, help="HOST:PORT to serve the data plane on (PORT 0: any free port)")
    p.add_argument("--secret-file", required=True, help="file holding the cluster's shared secret")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="this host's certificate: mutual TLS 1.3 on every TCP link (with --tls-key, --tls-ca)")
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's private key")
    p.add_argument("--tls-ca", default=None, metavar="PEM", help="the CA certificate peers' certificates chain to")
    p.add_argument("--state-dir", default=None,
                   help="where the live state of the instances this worker hosts lives (default: DIR/state; it "
                        "must be on the store's filesystem, so that a takeover or a rollback restores by hard links)")
    p.add_argument("--unix-socket", default=None,
                   help="Unix domain socket for clients on this host, created owner-only (default: DIR/worker.sock; "
                        "'none' for no socket); clients still need the shared secret")
    p.add_argument("--service-threads", type=uint32, default=4,
                   help="threads of the state service: sessions of different instances run in parallel "
                        "(default: %(default)s)")
    p.add_argument("--max-session-bytes", type=_size, default="1G",
                   help="uncommitted keys and values one session may hold (default: 1G)")
    p.add_argument("--max-instances", type=uint32, default=_core.MAX_INSTANCES,
                   help="instances this worker hosts at once (each a RocksDB open); an open or takeover of one "
                        "more is refused with ResourceExhausted (default: %(default)s; 0: no bound)")
    p.add_argument("--max-checkpoint-readers", type=uint32, default=_core.MAX_CHECKPOINT_READERS,
                   help="checkpoint readers open at once (each a hard-link restore and a RocksDB open); one more "
                        "is refused with ResourceExhausted (default: %(default)s; 0: no bound)")
    p.add_argument("--base-copy-rate", type=_size_or_zero, default="256M",
                   help="bytes per second, at most, that the early hand-over's background copy reads of a base "
                        "(docs/design.md section 4.1; default: 256M; 0: no bound)")
    p.add_argument("--session-idle-timeout", type=float, default=600.0,
                   help="abort a session with no request for this many seconds: a task that hangs with its "
                        "connection alive would hold its instance otherwise (default: %(default)s; 0: never)")
    p.add_argument("--replication-timeout", type=float, default=60.0,
                   help="seconds a commit's checkpoint may take to reach the end of its chain (default: %(default)s)")
    p.add_argument("--keep-checkpoints", type=uint32, default=3,
                   help="checkpoints kept per instance in the replica store (more for an instance hosted here "
                        "until its last complete checkpoint); the files only older ones reference are freed. "
                        "At least 2: a re-executed batch rolls back one checkpoint (default: %(default)s; "
                        "0: keep every checkpoint, and the store grows without bound)")
    p.add_argument("--retention-interval", type=float, default=10.0,
                   help="seconds between retention passes (default: %(default)s)")
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="register with this coordinator and send it heartbeats (rhino coordinator --listen)")
    p.add_argument("--coordinator-heartbeat", type=float, default=0.5,
                   help="seconds between heartbeats to the coordinator (default: %(default)s)")
    p.add_argument("--rack", default=None, help="this host's rack, for replica placement")
    p.add_argument("--zone", default=None, help="this host's zone, for replica placement")
    p.add_argument("--metrics-listen", default=None, help="HOST:PORT for the Prometheus /metrics endpoint")
    p.add_argument("--log-format", choices=["json", "text"], default="json")
    p.add_argument("--io-threads", type=uint32, default=1,
                   help="threads for socket I/O (default: %(default)s, which keeps up with several GB/s)")
    p.add_argument("--disk-threads", type=uint32, default=2,
                   help="threads for stream work: file writes, fsyncs, commits (default: %(default)s)")
    p.add_argument("--heartbeat-ms", type=uint32, default=500)
    p.add_argument("--peer-timeout-ms", type=uint32, default=3000)
    p.add_argument("--max-window", type=uint32, default=64, help="most credits granted per stream")
    p.add_argument("--max-frame-bytes", type=uint32, default=_core.MAX_FRAME_BYTES)
    p.add_argument("--max-connections", type=uint32, default=_core.MAX_CONNECTIONS,
                   help="connections each listener (TCP, Unix socket) holds at once; more are refused with "
                        "ResourceExhausted (default: %(default)s; 0: no bound)")
    p.add_argument("--max-unauthenticated-connections", type=uint32, default=_core.MAX_UNAUTHENTICATED_CONNECTIONS,
                   help="handshakes in progress per listener; more are refused (default: %(default)s; 0: no bound)")
    p.add_argument("--max-connections-per-peer", type=uint32, default=_core.MAX_CONNECTIONS_PER_PEER,
                   help="connections per peer IP address on the TCP listener; more are refused "
                        "(default: %(default)s; 0: no bound)")
    p.add_argument("--max-unauthenticated-per-peer", type=uint32, default=_core.MAX_UNAUTHENTICATED_PER_PEER,
                   help="handshakes in progress per peer IP address on the TCP listener; more are refused "
                        "(default: %(default)s; 0: no bound)")
    p.add_argument("--max-streams-per-connection", type=uint32, default=_core.MAX_STREAMS_PER_CONNECTION,
                   help="streams (sessions, replication streams, readers) a peer holds open on one connection; "
                        "one more is refused with ResourceExhausted (default: %(default)s; 0: no bound)")
    p.add_argument("--max-outbound-bytes", type=_size_or_zero, default=_core.MAX_OUTBOUND_BYTES,
                   help="bytes of answers queued for one peer on one connection; over it the worker stops reading "
                        "that peer until half is sent, so a peer that does not read cannot make it buffer without "
                        "bound (e.g. 64M; default: %(default)s; 0: no bound)")
    p.add_argument("--stream-idle-timeout-ms", type=uint32, default=60000,
                   help="abort a stream that sees no frame from either neighbour for this long (0: never)")
    p.add_argument("--nice", type=int, default=DEFAULT_NICE, choices=range(0, 20), metavar="0..19",
                   help="lower the daemon's CPU priority to this nice value (thread and autogroup nice), so "
                        "that replication yields the CPU to executors on the same host (default: %(default)s, "
                        "the priority it was started with)")
    p.add_argument("--sched", choices=sorted(_SCHED_POLICIES), default=DEFAULT_SCHED,
                   help="Linux scheduling policy of the daemon's threads: 'batch' (SCHED_BATCH) keeps its CPU share "
                        "but its wake-ups never preempt a running thread, such as an executor's; 'normal' "
                        "(SCHED_OTHER) lets them (default: %(default)s)")
    return p


def _size(text: str) -> int:
    from .._sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _size_or_zero(text: str) -> int:
    """A size (`_size`), or 0 where 0 means "no bound"."""
    return 0 if text.strip() == "0" else _size(text)


def service_paths(args: argparse.Namespace) -> tuple[str, str]:
    """The state directory and the Unix socket path ('' for none) the options name."""
    state_dir = args.state_dir or os.path.join(args.dir, "state")
    sock = args.unix_socket if args.unix_socket is not None else os.path.join(args.dir, "worker.sock")
    if sock.lower() == "none":
        sock = ""
    if sock and len(os.fsencode(os.path.abspath(sock))) > 107:  # sockaddr_un holds 107 bytes and a NUL
        raise ValueError(f"Unix socket path {os.path.abspath(sock)!r} is longer than 107 bytes: "
                         "pass a shorter --unix-socket, or --unix-socket none")
    return state_dir, os.path.abspath(sock) if sock else ""


def set_sched_policy(name: str) -> dict[str, Any]:
    """Sets this thread's scheduling policy before any other thread starts, so every thread inherits it.
    SCHED_BATCH and SCHED_OTHER need no privilege. Returns what was applied, for the log; where the
    platform lacks the call (not Linux), nothing is changed and the log says why."""
    policy = getattr(os, _SCHED_POLICIES[name], None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return {"sched": None, "sched_error": f"{_SCHED_POLICIES[name]} is not available on this platform"}
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError as e:
        return {"sched": None, "sched_error": str(e)}
    return {"sched": name}


def lower_priority(nice: int) -> dict[str, Any]:
    """Lowers this process's CPU priority to `nice` before any thread starts, so every thread inherits it.

    Linux's autogroup scheduling (on by default) first shares the CPU between sessions, and a daemon is its
    own session, so a thread's nice value only ranks it against the daemon's own threads; the session's
    autogroup nice is what ranks the daemon against the executors. Both are set. Raising one's own nice needs
    no privilege. Returns what was applied, for the log.
    """
    applied: dict[str, Any] = {"nice": None, "autogroup_nice": None}
    if nice <= 0:
        return applied
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
        applied["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    except OSError as e:
        applied["nice_error"] = str(e)
    try:
        with open("/proc/self/autogroup", "r+") as f:
            f.write(str(nice))
        applied["autogroup_nice"] = nice
    except OSError as e:  # no CONFIG_SCHED_AUTOGROUP, or a kernel that refuses: thread nice is what counts
        applied["autogroup_error"] = str(e)
    return applied


class _Configuration(NamedTuple):
    """What the options name, read and checked before anything starts."""

    host: str
    port: int
    metrics_address: tuple[str, int] | None
    secret: bytes
    secret_mode: int  # the secret file's permission bits
    state_dir: str
    unix_socket: str  # '' for none
    tls: Optional[TLS]  # None: plaintext


def _read_configuration(args: argparse.Namespace) -> _Configuration:
    """Reads the secret and checks the options; raises OSError or ValueError naming the bad one."""
    host, port = parse_address(args.listen)
    metrics_address = parse_address(args.metrics_listen) if args.metrics_listen else None
    secret = read_secret_file(args.secret_file)
    mode = os.stat(args.secret_file).st_mode & 0o777
    state_dir, unix_socket = service_paths(args)
    if not (0 <= args.session_idle_timeout <= 86400):
        raise ValueError(f"--session-idle-timeout must be in [0, 86400] seconds, got {args.session_idle_timeout}")
    if args.keep_checkpoints == 1:
        raise ValueError("--keep-checkpoints must be 0 (keep all) or at least 2: a re-executed batch b "
                         "rolls back to checkpoint b-1")
    if not (0 < args.retention_interval <= 3600):
        raise ValueError(f"--retention-interval must be in (0, 3600] seconds, got {args.retention_interval}")
    if args.coordinator is not None:
        parse_address(args.coordinator)
    if not (0 < args.coordinator_heartbeat <= 60):
        raise ValueError(f"--coordinator-heartbeat must be in (0, 60] seconds, got {args.coordinator_heartbeat}")
    if not (args.replication_timeout > 0) or args.replication_timeout > 86400:
        raise ValueError(f"--replication-timeout must be in (0, 86400] seconds, got {args.replication_timeout}")
    tls = TLS.from_args(args.tls_cert, args.tls_key, args.tls_ca)
    return _Configuration(host, port, metrics_address, secret, mode, state_dir, unix_socket, tls)


def _stop_on_signals(log: JsonLogger) -> threading.Event:
    """An event that SIGTERM and SIGINT set (logged); the main loop ends when it is set."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _new_worker(args: argparse.Namespace, config: _Configuration) -> Worker:
    return Worker(
        id=args.id,
        store_dir=args.dir,
        listen_host=config.host,
        listen_port=config.port,
        secret=config.secret,
        io_threads=args.io_threads,
        disk_threads=args.disk_threads,
        heartbeat_ms=args.heartbeat_ms,
        peer_timeout_ms=args.peer_timeout_ms,
        max_frame_bytes=args.max_frame_bytes,
        max_connections=args.max_connections,
        max_unauthenticated_connections=args.max_unauthenticated_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        max_unauthenticated_per_peer=args.max_unauthenticated_per_peer,
        max_streams_per_connection=args.max_streams_per_connection,
        max_outbound_bytes=args.max_outbound_bytes,
        max_window=args.max_window,
        stream_idle_timeout_ms=args.stream_idle_timeout_ms,
        state_dir=config.state_dir,
        unix_socket=config.unix_socket,
        service_threads=args.service_threads,
        max_session_bytes=args.max_session_bytes,
        max_instances=args.max_instances,
        max_checkpoint_readers=args.max_checkpoint_readers,
        base_copy_bytes_per_s=args.base_copy_rate,
        replicate_timeout_ms=int(args.replication_timeout * 1000),
        session_idle_timeout_ms=int(args.session_idle_timeout * 1000),
        keep_checkpoints=args.keep_checkpoints,
        retention_interval_ms=max(1, int(args.retention_interval * 1000)),
        tls=config.tls,
    )


def _log_store_check(log: JsonLogger, store_dir: str) -> None:
    """The size-level verification of the store just opened (O(files)): problems are logged, not fatal."""
    from .._core import ReplicaStore

    report = ReplicaStore(store_dir).verify(full=False)
    if report.ok:
        log.info("store_verified", dir=store_dir, checkpoints=report.checkpoints, files=report.files_checked)
    else:
        log.warning("store_problems", dir=store_dir, problems=[repr(p) for p in report.problems])


def _serve_metrics(log: JsonLogger, worker_id: str, worker: Worker, sampler: ThroughputSampler,
                   address: tuple[str, int]) -> Any:
    """The Prometheus /metrics endpoint, served from a daemon thread; returns the HTTP server."""
    mh, mp = address
    http = metrics_server(mh, mp, worker_registry(worker_id, worker.metrics, sampler.rates))
    threading.Thread(target=http.serve_forever, name="rhino-metrics", daemon=True).start()
    log.info("metrics_listening", host=mh, port=http.server_address[1])
    return http


def _register(args: argparse.Namespace, config: _Configuration, worker: Worker, log: JsonLogger) -> Any:
    """Registers with --coordinator and sends it heartbeats from now on; returns the running Registration."""
    from .registration import Registration

    return Registration(args.coordinator, worker_id=args.id, address=f"{config.host}:{worker.port}",
                        unix_socket=config.unix_socket or None, secret=config.secret, rack=args.rack,
                        zone=args.zone, interval=args.coordinator_heartbeat, bind_host=config.host,
                        log=lambda level, event, **f: log.log(level, event, **f), tls=config.tls).start()


def _watch_retention(worker: Worker, stop: threading.Event, log: JsonLogger) -> None:
    """Until `stop` is set, every 5 s: logs each new retention failure."""
    retention_errors = 0
    while not stop.wait(5.0):
        m = worker.metrics()
        if m["retention_errors"] > retention_errors:  # the store keeps everything meanwhile: nothing is lost
            retention_errors = m["retention_errors"]
            log.warning("retention_failed", error=m["retention_last_error"], failures=retention_errors)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = JsonLogger(args.id, args.log_format)
    try:
        config = _read_configuration(args)
    except (OSError, ValueError) as e:
        log.error("bad_configuration", error=str(e))
        return 2
    if config.secret_mode & 0o077:  # anyone who reads it can join the cluster and fence its chains
        log.warning("secret_file_readable_by_others", path=args.secret_file, mode=oct(config.secret_mode),
                    advice=f"chmod 600 {args.secret_file}")

    stop = _stop_on_signals(log)
    # Both before _core.Worker starts its threads, which inherit them.
    log.info("priority", **lower_priority(args.nice), **set_sched_policy(args.sched))

    worker = _new_worker(args, config)
    try:
        worker.start()  # opens the store: stale staging of a killed predecessor goes
    except Exception as e:  # noqa: BLE001 - any start failure ends the daemon, logged
        log.error("start_failed", error=str(e), error_type=type(e).__name__)
        return 1
    _log_store_check(log, args.dir)

    sampler = ThroughputSampler(worker)
    sampler.start()
    http = None
    if config.metrics_address is not None:
        http = _serve_metrics(log, args.id, worker, sampler, config.metrics_address)
    hosted = worker.metrics()["hosted"]
    if hosted:  # re-hosted after a restart, each at the newest checkpoint of the store
        log.info("instances_hosted", instances=[{"operator_id": h["operator_id"], "instance": h["instance"],
                                                 "epoch": h["epoch"], "version": h["version"]} for h in hosted])
    log.info("listening", host=config.host, port=worker.port, dir=args.dir, state_dir=config.state_dir,
             unix_socket=config.unix_socket or None, pid=os.getpid())
    registration = _register(args, config, worker, log) if args.coordinator is not None else None

    _watch_retention(worker, stop, log)

    log.info("stopping")
    if registration is not None:
        registration.stop()
    worker.stop()
    worker.join()
    sampler.stop()
    if http is not None:
        http.shutdown()
        http.server_close()
    m = worker.metrics()
    log.info("stopped", checkpoints_complete=m["checkpoints_complete"], checkpoints_aborted=m["checkpoints_aborted"],
             bytes_received=m["bytes_received"], checkpoints_retired=m["checkpoints_retired"],
             gc_bytes_removed=m["gc_bytes_removed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
