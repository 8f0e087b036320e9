"""The ``/metrics`` endpoint of ``rhino worker`` (``--metrics-listen``): the C++
worker's metrics snapshot (``Worker.metrics()``) in the Prometheus text format,
plus chunk throughput over the last few seconds."""

from __future__ import annotations

import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import _core

__all__ = ["ThroughputSampler", "prometheus_text", "metrics_server"]


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


def _esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(worker_id: str, m: dict[str, Any], rates: tuple[float, float] = (0.0, 0.0)) -> str:
    """The Prometheus text exposition (format 0.0.4) of a metrics snapshot."""
    w = f'worker="{_esc(worker_id)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = w + ("," + labels if labels else "")
            out.append(f"{name}{{{lab}}} {value}")

    metric("rhino_worker_bytes_received_total", "counter", "Chunk bytes received from predecessors.",
           [("", m["bytes_received"])])
    metric("rhino_worker_bytes_sent_total", "counter", "Chunk bytes sent to successors.", [("", m["bytes_sent"])])
    metric("rhino_worker_bytes_written_total", "counter", "Chunk bytes written to staging files.",
           [("", m["bytes_written"])])
    metric("rhino_worker_network_bytes_total", "counter", "Frame bytes on the wire, headers included.",
           [('direction="in"', m["net_bytes_in"]), ('direction="out"', m["net_bytes_out"])])
    metric("rhino_worker_throughput_bytes_per_second", "gauge",
           "Chunk throughput over the last few seconds.",
           [('direction="in"', round(rates[0], 1)), ('direction="out"', round(rates[1], 1))])
    metric("rhino_worker_active_streams", "gauge", "Replication streams under way.", [("", m["active_streams"])])
    metric("rhino_worker_in_flight_credits", "gauge",
           "Chunk buffers held right now (credits lent and not yet returned), all streams.",
           [("", m["in_flight_credits"])])
    metric("rhino_worker_streams_opened_total", "counter", "Replication streams opened.", [("", m["streams_opened"])])
    metric("rhino_worker_checkpoints_total", "counter", "Checkpoint streams by final state on this worker.",
           [('state="complete"', m["checkpoints_complete"]), ('state="aborted"', m["checkpoints_aborted"])])
    metric("rhino_worker_auth_failures_total", "counter", "Failed authentications (protocol §2).",
           [("", m["auth_failures"])])
    metric("rhino_worker_rejected_frames_total", "counter", "Invalid frames and messages rejected (protocol §1).",
           [("", m["rejected_frames"])])
    metric("rhino_worker_stale_rejections_total", "counter", "Streams or frames fenced off as stale (protocol §5).",
           [("", m["stale_rejections"])])
    metric("rhino_worker_peers_dead_total", "counter", "Peers declared dead by timeout (protocol §6).",
           [("", m["peers_dead"])])
    metric("rhino_worker_open_connections", "gauge", "Open data-plane connections.", [("", m["open_connections"])])
    metric("rhino_worker_buffer_pool_cached_bytes", "gauge",
           "Free chunk buffers kept for reuse (at most 32 MiB).", [("", m["buffer_pool_cached_bytes"])])
    inst = m.get("instances", [])

    def per_instance(key: str) -> list[tuple[str, float]]:
        rows = []
        for i in inst:
            v = i[key]
            if v is None:
                continue
            rows.append((f'operator="{_esc(i["operator_id"])}",instance="{i["instance"]}"', v))
        return rows

    metric("rhino_replica_last_committed_checkpoint", "gauge",
           "Newest checkpoint of an instance committed here by replication.", per_instance("last_committed"))
    metric("rhino_replica_last_opened_checkpoint", "gauge",
           "Newest checkpoint of an instance a stream was opened for.", per_instance("last_opened"))
    lag = []
    for i in inst:
        committed = i["last_committed"] if i["last_committed"] is not None else 0
        lag.append((f'operator="{_esc(i["operator_id"])}",instance="{i["instance"]}"',
                     max(0, i["last_opened"] - committed)))
    metric("rhino_replica_lag_checkpoints", "gauge",
           "Replica lag of an instance: newest opened minus newest committed checkpoint id.", lag)
    metric("rhino_replica_chain_version", "gauge", "Newest chain version seen for an instance (protocol §5).",
           per_instance("chain_version"))
    return "\n".join(out) + "\n"


def metrics_server(host: str, port: int, render: Any) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not worth a log line
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
