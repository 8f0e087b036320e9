"""The worker's /metrics endpoint (rhino.daemon.metrics, prometheus_client): every
field of a C++ metrics snapshot becomes the sample it names, with the worker's
label, and the endpoint serves it at /metrics only. The oracle is the snapshot
itself, read back through prometheus_client's own parser; the live endpoint of
real workers is checked by test_replication.py."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rhino.daemon.metrics import metrics_server, prometheus_text, worker_registry

SNAPSHOT = dict(bytes_received=10, bytes_sent=20, bytes_written=30, net_bytes_in=40, net_bytes_out=50,
                active_streams=1, in_flight_credits=4, streams_opened=7, checkpoints_complete=3,
                checkpoints_aborted=1, auth_failures=6, tls_failures=14, rejected_frames=2, stale_rejections=5, peers_dead=8,
                open_connections=3, buffer_pool_cached_bytes=1 << 20, checkpoints_retired=11,
                gc_bytes_removed=12, retention_errors=13, retention_last_error="", gc_deferred=15, pool_files=16,
                pool_bytes=17, gc_pins=18, reads_paused=19, outbound_bytes=20,
                instances=[dict(operator_id='q8"join', instance=0, last_committed=None, last_opened=2, chain_version=3),
                           dict(operator_id="agg", instance=5, last_committed=4, last_opened=4, chain_version=1)])


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def key(name: str, **labels: str) -> tuple[str, tuple]:
    return name, tuple(sorted({"worker": "w2", **labels}.items()))


def test_every_snapshot_field_is_a_sample_with_the_worker_label():
    got = samples(prometheus_text("w2", SNAPSHOT, (1234.56, 7.0)))
    want = {
        key("rhino_worker_bytes_received_total"): 10, key("rhino_worker_bytes_sent_total"): 20,
        key("rhino_worker_bytes_written_total"): 30,
        key("rhino_worker_network_bytes_total", direction="in"): 40,
        key("rhino_worker_network_bytes_total", direction="out"): 50,
        key("rhino_worker_throughput_bytes_per_second", direction="in"): 1234.6,
        key("rhino_worker_throughput_bytes_per_second", direction="out"): 7.0,
        key("rhino_worker_active_streams"): 1, key("rhino_worker_in_flight_credits"): 4,
        key("rhino_worker_streams_opened_total"): 7,
        key("rhino_worker_checkpoints_total", state="complete"): 3,
        key("rhino_worker_checkpoints_total", state="aborted"): 1,
        key("rhino_worker_auth_failures_total"): 6, key("rhino_worker_tls_failures_total"): 14,
        key("rhino_worker_rejected_frames_total"): 2,
        key("rhino_worker_stale_rejections_total"): 5, key("rhino_worker_peers_dead_total"): 8,
        key("rhino_worker_open_connections"): 3, key("rhino_worker_buffer_pool_cached_bytes"): 1 << 20,
        key("rhino_worker_reads_paused_total"): 19, key("rhino_worker_outbound_bytes"): 20,
        key("rhino_worker_checkpoints_retired_total"): 11, key("rhino_worker_gc_bytes_removed_total"): 12,
        key("rhino_worker_retention_errors_total"): 13, key("rhino_worker_gc_deferred_total"): 15,
        key("rhino_worker_pool_files"): 16, key("rhino_worker_pool_bytes"): 17, key("rhino_worker_gc_pins"): 18,
        # An instance with nothing committed has no committed sample, and its lag counts from 0.
        key("rhino_replica_last_committed_checkpoint", operator="agg", instance="5"): 4,
        key("rhino_replica_last_opened_checkpoint", operator='q8"join', instance="0"): 2,
        key("rhino_replica_last_opened_checkpoint", operator="agg", instance="5"): 4,
        key("rhino_replica_chain_version", operator='q8"join', instance="0"): 3,
        key("rhino_replica_chain_version", operator="agg", instance="5"): 1,
        key("rhino_replica_lag_checkpoints", operator='q8"join', instance="0"): 2,
        key("rhino_replica_lag_checkpoints", operator="agg", instance="5"): 0,
    }
    assert got == want


def test_counters_and_gauges_are_typed():
    types = {f.name: f.type for f in text_string_to_metric_families(prometheus_text("w2", SNAPSHOT))}
    assert types["rhino_worker_bytes_received"] == "counter"  # the parser drops a counter's _total
    assert types["rhino_worker_checkpoints"] == "counter"
    assert types["rhino_worker_in_flight_credits"] == "gauge"
    assert types["rhino_replica_lag_checkpoints"] == "gauge"


def test_the_endpoint_serves_a_fresh_snapshot_at_metrics_only():
    snapshot = dict(SNAPSHOT)
    server = metrics_server("127.0.0.1", 0, worker_registry("w2", lambda: snapshot, lambda: (0.0, 0.0)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            assert samples(r.read().decode())[key("rhino_worker_bytes_sent_total")] == 20
        snapshot["bytes_sent"] = 99  # every scrape takes a new snapshot
        with urllib.request.urlopen(url + "/metrics?x=1", timeout=5) as r:
            assert samples(r.read().decode())[key("rhino_worker_bytes_sent_total")] == 99
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/other", timeout=5)
        assert e.value.code == 404
        e.value.close()
    finally:
        server.shutdown()
        server.server_close()
