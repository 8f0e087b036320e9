"""A checkpoint's delta does not grow with the number of batches a worker has
run: it holds the batch's new SST files and the RocksDB MANIFEST, which a
checkpoint copies whole; RocksDB starts a new MANIFEST past
``max_manifest_file_size`` (state_backend.cc), so the copy stays small.

With RocksDB's default (1 GiB) the delta of this workload grew ~5 KiB per batch
(1.5 MiB by batch 300), every batch's replication with it. Real worker process;
the oracle is the delta's size in the commit stats against the first batches'.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

import rhino
from rhino_bench.harness.workers import SECRET, WorkerProcess, write_secret


def test_checkpoint_deltas_stay_flat_over_many_batches(tmp_path: Path) -> None:
    sf = write_secret(tmp_path, SECRET)
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=sf, metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("flat", 0, epoch=1, num_vnodes=32)
            keys = np.random.default_rng(0).integers(0, 1 << 40, 100)  # ~every vnode, every batch
            deltas = []
            for b in range(160):
                with c.session("flat", 0, batch=b, epoch=1) as s:
                    s.put_batch(keys, [b"x" * 100] * len(keys))
                    deltas.append(int(s.commit().stats["delta_bytes"]))
        first, last = statistics.median(deltas[2:12]), statistics.median(deltas[-10:])
        assert last < 1.5 * first, f"the delta grew from {first} to {last} bytes over {len(deltas)} batches"
    finally:
        w.stop()
