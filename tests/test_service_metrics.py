"""Per-instance figures of the state service on a live worker's Prometheus
endpoint (docs/protocol.md §7.6): sessions, commits, the commit latency split
into write, checkpoint and replication, bytes, epoch and version. The oracle
is what the test itself did: how many sessions it opened, committed and
aborted, and how many keys and bytes it wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret


def test_hosted_instance_metrics(tmp_path: Path) -> None:
    secret_file = write_secret(tmp_path, SECRET)
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file).start()
    w3 = WorkerProcess(tmp_path, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("agg", 4, epoch=7, num_vnodes=8, chain=[w3.address], chain_version=1)
        keys = np.arange(50, dtype=np.int64)
        for b in range(3):
            with c.session("agg", 4, batch=b, epoch=7) as s:
                s.put_batch(keys, [b"x" * 10] * 50)
                s.commit()
        with c.session("agg", 4, batch=3, epoch=7) as s:
            s.put_batch(keys, [b"y"] * 50)  # aborted on leaving the block
        with c.session("agg", 4, batch=2, epoch=7):  # batch 2 again: a rollback to 1
            pass
        c.close()
        labels = 'operator="agg",instance="4"'
        m = lambda name, extra="": w2.metric(name, labels + extra)  # noqa: E731
        assert m("rhino_session_opened_total") == 5
        assert m("rhino_session_aborted_total") == 2
        assert m("rhino_session_commits_total") == 3
        assert m("rhino_session_commit_failures_total") == 0
        assert m("rhino_instance_rollbacks_total") == 1
        assert m("rhino_session_keys_written_total") == 150
        assert m("rhino_session_bytes_written_total") == 3 * 50 * (8 + 10)
        assert m("rhino_instance_epoch") == 7
        assert m("rhino_instance_version") == 1  # rolled back to 1 by the re-run of batch 2
        assert m("rhino_instance_vnodes") == 8
        assert m("rhino_instance_session_open") == 0
        assert m("rhino_instance_replicated_bytes_total") > 0
        for part in ("write", "checkpoint", "replicate"):
            assert m("rhino_session_commit_seconds_total", f',part="{part}"') > 0
    finally:
        w2.stop()
        w3.stop()


def test_inspect_lists_hosted_instances(tmp_path: Path) -> None:
    """`rhino inspect WORKER_DIR` shows the instances the worker hosts, from their instance.json."""
    import json
    import subprocess
    import sys

    secret_file = write_secret(tmp_path, SECRET)
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("q5", 0, epoch=3, num_vnodes=8, chain=["127.0.0.9:7000"], chain_version=2)
            c.open_instance("q5", 1, epoch=3, num_vnodes=8, vnodes=[1, 2])
            c.close_instance("q5", 1, epoch=3)
        out = subprocess.run([sys.executable, "-m", "rhino", "inspect", str(w.dir), "--json"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        hosted = json.loads(out.stdout)["hosted"]
        assert [(h["operator_id"], h["instance"], h["epoch"], h["vnodes"], h["chain"], h["hosted"]) for h in hosted] \
            == [("q5", 0, 3, 8, ["127.0.0.9:7000"], True), ("q5", 1, 3, 2, [], False)]
        text = subprocess.run([sys.executable, "-m", "rhino", "inspect", str(w.dir)], capture_output=True, text=True,
                              timeout=60).stdout
        assert "hosted instances" in text and "127.0.0.9:7000" in text and "closed" in text
    finally:
        w.stop()
