"""A checkpoint's delta does not grow with the number of batches a worker has
run. It holds the write-ahead log since the last flush (bounded by
``checkpoint_wal_bytes``, 256 KiB by default), or, once that is larger, the
flush's new SST files; and the RocksDB MANIFEST, which a checkpoint copies
whole. RocksDB starts a new MANIFEST past ``max_manifest_file_size``
(state/rocksdb_options.cc), so that copy stays small.

With RocksDB's default (1 GiB) the MANIFEST of this workload grew ~5 KiB per
flush (1.5 MiB by batch 300 when every checkpoint flushed), every batch's
replication with it. Real worker process; the oracle is the delta's size in the
commit stats: each batch adds ~14 KiB of WAL, so the deltas rise and fall in a
saw-tooth, and its teeth must not grow.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret


def test_checkpoint_deltas_stay_flat_over_many_batches(tmp_path: Path) -> None:
    sf = write_secret(tmp_path, SECRET)
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=sf, metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("flat", 0, epoch=1, num_vnodes=32)
            keys = np.random.default_rng(0).integers(0, 1 << 40, 100)  # ~every vnode, every batch
            deltas = []
            for b in range(240):
                with c.session("flat", 0, batch=b, epoch=1) as s:
                    s.put_batch(keys, [b"x" * 100] * len(keys))
                    deltas.append(int(s.commit().stats["delta_bytes"]))
        # A tooth is ~19 batches (256 KiB / ~14 KiB); each third holds several.
        thirds = [max(deltas[i : i + 80]) for i in (0, 80, 160)]
        assert max(deltas) < (256 << 10) + (256 << 10), f"a delta of {max(deltas)} bytes: the WAL bound did not hold"
        assert thirds[2] < 1.25 * thirds[0], f"the largest delta grew from {thirds[0]} to {thirds[2]} bytes"
        assert statistics.median(deltas) < 192 << 10, "the deltas are not the saw-tooth of a bounded WAL"
    finally:
        w.stop()
