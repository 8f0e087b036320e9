"""TTL state leaves the checkpoints by compaction, with no scan (issue 27's TTL
must-show): a processor writes TTL'd values under a manual batch clock, the
clock passes their expiry, each instance is compacted, and the next checkpoint
read by rocksdict (an independent RocksDB reader, over the checkpoint's
directory rebuilt from its manifest) holds no expired entry and fewer bytes.

Real Spark (local[2]), real ``rhino worker`` processes and a real coordinator.
That the processor stops seeing expired state at the same batches as Spark's
own operator is ``test_spark_ttl.py``'s.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys

import pytest

pyspark = pytest.importorskip("pyspark")
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino  # noqa: E402
from spark_fixtures import local_spark, rhino_cluster  # noqa: E402
from test_state_codec import INDEPENDENT_DECODER  # noqa: E402
from test_ttl_compaction import checkpoint_dir, stored  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TTL_MS = 10_000
T0 = 1_000_000


class ExpiringBlob(StatefulProcessor):
    """Per key a 200-byte string in a ValueState with a TTL; emits whether the key had one."""

    def init(self, handle):
        self.blob = handle.getValueState("blob", "s string", ttlDurationMs=TTL_MS)
        self.plain = handle.getValueState("plain", "n long")

    def handleInputRows(self, key, rows, timerValues):
        had = self.blob.exists()
        self.blob.update(("x" * 200,))
        self.plain.update((1,))
        yield pd.DataFrame({"k": [key[0]], "had": [had]})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("ttlcompact"), heartbeat_timeout=5.0) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-ttl-compaction", partitions=2)
    yield s
    s.stop()


def test_expired_entries_leave_the_checkpoint_after_a_compaction(cluster, spark, tmp_path):
    from rhino.spark import transform_with_state

    now = [T0]
    op = transform_with_state(ExpiringBlob(), key="k", output_schema="k long, had boolean", operator_id="expiring",
                              coordinator=cluster["coordinator"], secret=cluster["secret"], parallelism=2,
                              replicas=1, locality=False, time_mode="ProcessingTime", clock=lambda: now[0])

    def batch(b, keys):
        out = op.process_batch(spark.createDataFrame(pd.DataFrame({"k": keys})), b).to_pandas()
        return dict(zip(out.k, out.had))

    n = 3000
    assert not any(batch(0, list(range(n))).values())
    now[0] = T0 + TTL_MS // 2
    assert batch(1, [0, 1]) == {0: True, 1: True}  # alive: rewritten, expiry moves to T0 + 15 s
    now[0] = T0 + TTL_MS + 1  # keys 2.. expired (T0 + 10 s), keys 0 and 1 not yet
    assert batch(2, [2, n]) == {2: False, n: False}
    before = {int(t["instance"]): t["checkpoint_bytes"] for t in op.reports[-1].tasks}
    placement = op.coordinator().placement("expiring")
    for i, info in placement.instances.items():
        with rhino.connect(info.address, secret=cluster["secret"]) as c:
            got = c.compact("expiring", i, epoch=placement.epoch)
            assert got["ttl_clock"] == T0 + TTL_MS + 1, got
    now[0] += 1000
    batch(3, [n + 1])  # checkpoint 3 holds the compacted files
    after = {int(t["instance"]): t["checkpoint_bytes"] for t in op.reports[-1].tasks}
    blob_head = b"v" + struct.pack(">H", op.state_doc["vars"]["blob"]["id"])
    plain_head = b"v" + struct.pack(">H", op.state_doc["vars"]["plain"]["id"])
    live_blobs = plain_values = 0
    raw: dict[str, list[bytes]] = {"blob": [], "plain": []}
    for i, info in placement.instances.items():
        w = next(w for w in cluster["workers"] if w.id == info.primary)
        entries, _ = stored(checkpoint_dir(w.dir, "expiring", i, 3, tmp_path / f"ck3-{i}"))
        for k, v in entries.items():
            head = rhino.split_routed_key(k)[0]
            if head == blob_head:
                expiry = struct.unpack(">q", v[:8])[0]
                assert expiry > T0 + TTL_MS + 1, f"an expired entry (expiry {expiry}) is still in checkpoint 3"
                live_blobs += 1
                raw["blob"].append(v[8:])
            elif head == plain_head:
                plain_values += 1
                raw["plain"].append(v)
        assert after[int(i)] < before[int(i)], f"instance {i}: checkpoint bytes {before[int(i)]} -> {after[int(i)]}"
    assert live_blobs == 5  # keys 0 and 1 (rewritten at T0 + 5 s), 2 and n (T0 + 10 s), n + 1 (T0 + 11 s)
    assert plain_values == n + 2
    # the stored values, as a batch wrote them, read by a decoder that imports only pyarrow
    # (no pickle, pandas, numpy, rhino or pyspark), written from the format's description
    got = independent_decode([{"fields": [{"name": "s", "type": "string"}], "version": 1, "blobs": raw["blob"]},
                              {"fields": [{"name": "n", "type": "long"}], "version": 1, "blobs": raw["plain"]}])
    assert got[0] == {"s": ["x" * 200] * 5} and got[1] == {"n": [1] * (n + 2)}


def independent_decode(requests: list[dict]) -> list[dict]:
    import pyarrow as pa

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    lines = "".join(json.dumps({**r, "blobs": [b.hex() for b in r["blobs"]]}) + "\n" for r in requests)
    p = subprocess.run([sys.executable, "-I", "-c", INDEPENDENT_DECODER], input=lines, capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    out = []
    for line in p.stdout.splitlines():
        answer = json.loads(line)
        assert answer["loaded"] == []
        out.append(pa.ipc.open_stream(base64.b64decode(answer["ipc"])).read_all().to_pydict())
    return out
