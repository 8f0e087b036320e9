"""The ``/metrics`` endpoint of ``rhino worker`` (``--metrics-listen``), served by
``prometheus_client``.

:class:`WorkerCollector` turns the C++ worker's metrics snapshot
(``Worker.metrics()``, taken at each scrape) and the chunk throughput over the
last few seconds (:class:`ThroughputSampler`) into Prometheus metric families.
Every sample carries a ``worker`` label; per-instance samples also carry
``operator`` and ``instance``. :func:`metrics_server` serves a registry holding
only that collector at ``/metrics`` (any other path: 404).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import urlparse

from prometheus_client.exposition import MetricsHandler, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .. import _core

__all__ = ["ThroughputSampler", "WorkerCollector", "worker_registry", "prometheus_text", "metrics_server"]


class ThroughputSampler:
    """Bytes written per second over a sliding window, sampled once a second."""

    def __init__(self, worker: _core.Worker, window_s: float = 5.0) -> None:
        self._worker = worker
        self._samples: deque[tuple[float, int, int]] = deque()
        self._window = window_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rhino-throughput", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            m = self._worker.metrics()
            now = time.monotonic()
            with self._lock:
                self._samples.append((now, m["bytes_received"], m["bytes_sent"]))
                while len(self._samples) > 2 and now - self._samples[0][0] > self._window:
                    self._samples.popleft()
            self._stop.wait(1.0)

    def rates(self) -> tuple[float, float]:
        """(received, sent) bytes per second over the window."""
        with self._lock:
            if len(self._samples) < 2:
                return 0.0, 0.0
            (t0, r0, s0), (t1, r1, s1) = self._samples[0], self._samples[-1]
        dt = max(t1 - t0, 1e-9)
        return (r1 - r0) / dt, (s1 - s0) / dt


# (name, help, snapshot key) of the worker-wide counters and gauges with no label but `worker`.
_COUNTERS = [
    ("rhino_worker_bytes_received_total", "Chunk bytes received from predecessors.", "bytes_received"),
    ("rhino_worker_bytes_sent_total", "Chunk bytes sent to successors.", "bytes_sent"),
    ("rhino_worker_bytes_written_total", "Chunk bytes written to staging files.", "bytes_written"),
    ("rhino_worker_streams_opened_total", "Replication streams opened.", "streams_opened"),
    ("rhino_worker_auth_failures_total", "Failed authentications (protocol §2).", "auth_failures"),
    ("rhino_worker_tls_failures_total", "Failed TLS handshakes: refused certificates, plaintext peers (protocol §2).",
     "tls_failures"),
    ("rhino_worker_rejected_frames_total", "Invalid frames and messages rejected (protocol §1).", "rejected_frames"),
    ("rhino_worker_stale_rejections_total", "Streams or frames fenced off as stale (protocol §5).",
     "stale_rejections"),
    ("rhino_worker_peers_dead_total", "Peers declared dead by timeout (protocol §6).", "peers_dead"),
    ("rhino_worker_reads_paused_total", "Times a connection stopped reading a peer that let more than "
     "--max-outbound-bytes of answers queue up (protocol §2).", "reads_paused"),
    ("rhino_worker_checkpoints_retired_total", "Old checkpoints dropped from the replica store by retention.",
     "checkpoints_retired"),
    ("rhino_worker_gc_bytes_removed_total", "Bytes of pooled files no kept checkpoint references, freed.",
     "gc_bytes_removed"),
    ("rhino_worker_retention_errors_total", "Retention passes that failed (the worker logs the error).",
     "retention_errors"),
    ("rhino_worker_gc_deferred_total", "Retention passes whose garbage collection found the replica store busy "
     "(a restore or a stream opening holding its lock) and waited for the next pass.", "gc_deferred"),
]
_GAUGES = [
    ("rhino_worker_active_streams", "Replication streams under way.", "active_streams"),
    ("rhino_worker_in_flight_credits", "Chunk buffers held right now (credits lent and not yet returned), all streams.",
     "in_flight_credits"),
    ("rhino_worker_open_connections", "Open data-plane connections.", "open_connections"),
    ("rhino_worker_outbound_bytes", "Bytes of frames queued for writing to peers, all connections.",
     "outbound_bytes"),
    ("rhino_worker_buffer_pool_cached_bytes", "Free chunk buffers kept for reuse (at most 32 MiB).",
     "buffer_pool_cached_bytes"),
    ("rhino_worker_pool_bytes", "Bytes in the replica store's pool, as the last garbage collection left it.",
     "pool_bytes"),
    ("rhino_worker_pool_files", "Files in the replica store's pool, as the last garbage collection left it.",
     "pool_files"),
    ("rhino_worker_gc_pins", "Pins (replication streams under way) the last garbage collection honoured.", "gc_pins"),
]
# (name, help, instance key) of the per-instance gauges; an instance whose value is None has no sample.
_INSTANCE_GAUGES = [
    ("rhino_replica_last_committed_checkpoint", "Newest checkpoint of an instance committed here by replication.",
     "last_committed"),
    ("rhino_replica_last_opened_checkpoint", "Newest checkpoint of an instance a stream was opened for.",
     "last_opened"),
    ("rhino_replica_chain_version", "Newest chain version seen for an instance (protocol §5).", "chain_version"),
]


class WorkerCollector(Collector):
    """The metric families of one worker, from `snapshot()` (``Worker.metrics()``) and `rates()`
    (received, sent bytes per second), both called at every scrape."""

    def __init__(self, worker_id: str, snapshot: Callable[[], dict[str, Any]],
                 rates: Optional[Callable[[], tuple[float, float]]] = None) -> None:
        self.worker_id = worker_id
        self._snapshot = snapshot
        self._rates = rates if rates is not None else (lambda: (0.0, 0.0))

    def collect(self) -> Iterator[Metric]:
        m = self._snapshot()
        rates = self._rates()
        w = self.worker_id
        for name, help_, key in _COUNTERS:
            c = CounterMetricFamily(name, help_, labels=["worker"])
            c.add_metric([w], m[key])
            yield c
        net = CounterMetricFamily("rhino_worker_network_bytes_total", "Frame bytes on the wire, headers included.",
                                  labels=["worker", "direction"])
        net.add_metric([w, "in"], m["net_bytes_in"])
        net.add_metric([w, "out"], m["net_bytes_out"])
        yield net
        tput = GaugeMetricFamily("rhino_worker_throughput_bytes_per_second",
                                 "Chunk throughput over the last few seconds.", labels=["worker", "direction"])
        tput.add_metric([w, "in"], round(rates[0], 1))
        tput.add_metric([w, "out"], round(rates[1], 1))
        yield tput
        cps = CounterMetricFamily("rhino_worker_checkpoints_total", "Checkpoint streams by final state on this worker.",
                                  labels=["worker", "state"])
        cps.add_metric([w, "complete"], m["checkpoints_complete"])
        cps.add_metric([w, "aborted"], m["checkpoints_aborted"])
        yield cps
        for name, help_, key in _GAUGES:
            g = GaugeMetricFamily(name, help_, labels=["worker"])
            g.add_metric([w], m[key])
            yield g

        instances = m.get("instances", [])
        labels = ["worker", "operator", "instance"]
        for name, help_, key in _INSTANCE_GAUGES:
            g = GaugeMetricFamily(name, help_, labels=labels)
            for i in instances:
                if i[key] is not None:
                    g.add_metric([w, i["operator_id"], str(i["instance"])], i[key])
            yield g
        lag = GaugeMetricFamily("rhino_replica_lag_checkpoints",
                                "Replica lag of an instance: newest opened minus newest committed checkpoint id.",
                                labels=labels)
        for i in instances:
            committed = i["last_committed"] if i["last_committed"] is not None else 0
            lag.add_metric([w, i["operator_id"], str(i["instance"])], max(0, i["last_opened"] - committed))
        yield lag
        yield from _hosted_families(w, m.get("hosted", []))


# The state service, per hosted instance (docs/protocol.md §7.7).
_HOSTED_COUNTERS = [
    ("rhino_session_opened_total", "Sessions opened on a hosted instance.", "sessions_opened"),
    ("rhino_session_aborted_total", "Sessions that ended without a commit (abort, dead client, lost connection).",
     "sessions_aborted"),
    ("rhino_session_expired_total", "Sessions the worker aborted after --session-idle-timeout without a request.",
     "sessions_expired"),
    ("rhino_session_commits_total", "Commits of a hosted instance (written and checkpointed).", "commits"),
    ("rhino_session_commit_failures_total", "Commits that failed (nothing of them stays visible).", "commit_failures"),
    ("rhino_instance_rollbacks_total", "Rollbacks of a hosted instance to checkpoint b-1 (batch b ran again).",
     "rollbacks"),
    ("rhino_session_keys_written_total", "Puts and deletes committed.", "keys_written"),
    ("rhino_session_bytes_written_total", "Key and value bytes committed.", "bytes_written"),
    ("rhino_instance_replicated_bytes_total", "Checkpoint bytes a hosted instance sent down its chain.",
     "bytes_replicated"),
]
_HOSTED_GAUGES = [
    ("rhino_instance_epoch", "Configuration epoch a hosted instance is served under.", "epoch"),
    ("rhino_instance_version", "State version (last committed batch) of a hosted instance.", "version"),
    ("rhino_instance_last_complete_checkpoint", "Newest checkpoint the whole chain holds.", "last_complete"),
    ("rhino_instance_replications_pending", "Committed checkpoints not yet acknowledged by the chain.",
     "replications_pending"),
    ("rhino_instance_session_open", "1 while a session is open on the instance.", "session_open"),
    ("rhino_instance_vnodes", "Vnodes the instance holds.", "vnodes"),
]


def _hosted_families(w: str, hosted: list[dict[str, Any]]) -> Iterator[Metric]:
    labels = ["worker", "operator", "instance"]
    for name, help_, key in _HOSTED_COUNTERS:
        c = CounterMetricFamily(name, help_, labels=labels)
        for h in hosted:
            c.add_metric([w, h["operator_id"], str(h["instance"])], h[key])
        yield c
    for name, help_, key in _HOSTED_GAUGES:
        g = GaugeMetricFamily(name, help_, labels=labels)
        for h in hosted:
            if h[key] is not None:
                g.add_metric([w, h["operator_id"], str(h["instance"])], float(h[key]))
        yield g
    # The commit latency, split into its three parts (sums of seconds; divide by
    # rhino_session_commits_total for the mean of each).
    lat = CounterMetricFamily("rhino_session_commit_seconds_total",
                              "Commit time of a hosted instance, by part: write, checkpoint, replication.",
                              labels=labels + ["part"])
    for h in hosted:
        for part in ("write", "checkpoint", "replicate"):
            lat.add_metric([w, h["operator_id"], str(h["instance"]), part], h[f"{part}_seconds"])
    yield lat


def worker_registry(worker_id: str, snapshot: Callable[[], dict[str, Any]],
                    rates: Optional[Callable[[], tuple[float, float]]] = None) -> CollectorRegistry:
    """A registry holding only the worker's collector (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker_id, snapshot, rates))
    return registry


def prometheus_text(worker_id: str, m: dict[str, Any], rates: tuple[float, float] = (0.0, 0.0)) -> str:
    """The Prometheus text exposition (format 0.0.4) of a metrics snapshot."""
    return generate_latest(worker_registry(worker_id, lambda: m, lambda: rates)).decode()


def metrics_server(host: str, port: int, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """An HTTP server (not started: call ``serve_forever``) for `registry` at ``/metrics``."""

    class Handler(MetricsHandler.factory(registry)):  # type: ignore[misc]
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if urlparse(self.path).path != "/metrics":
                self.send_error(404)
                return
            super().do_GET()

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
