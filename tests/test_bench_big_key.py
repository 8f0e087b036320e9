"""`rhino-bench spark big-key`: a tiny run (--size 8M in 2 MiB batches, 1 KiB values) on real
workers, a real coordinator and local Spark, checking the JSON lines' fields, that stdout holds
nothing else, and that every check passed (the reads equal the model, the handover moved the
key's vnode); the fill plan and the model on their own; the argument errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from helpers import run_bench

pyspark = pytest.importorskip("pyspark")

from rhino_bench.spark import big_key  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_bench([sys.executable, "-m", "rhino_bench", "spark", "big-key", *args], cwd=REPO, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--size", "lots"], "invalid size"),
    (["--value-bytes", "0"], "invalid size"),
    (["--batch-bytes", "1K", "--value-bytes", "2K"], "at most --batch-bytes"),
    (["--batch-bytes", "2G"], "uncommitted writes"),
    (["--partitions", "1"], "at least 2"),
    (["--spark-conf", "novalue"], "KEY=VALUE"),
])
def test_bad_arguments_exit_2(args, message):
    p = _bench(*args, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_fill_plan_covers_the_size_in_batches_of_at_most_batch_bytes():
    plan = big_key.plan_fill(10 << 20, 1024, 4 << 20)
    assert plan == [(0, 4096), (4096, 4096), (8192, 2048)]
    assert big_key.plan_fill(1 << 30, 1024, 128 << 20) == [(i * 131072, 131072) for i in range(8)]
    assert big_key.plan_fill(100, 1024, 4096) == [(0, 1)]  # at least one record


def test_model_sums_what_was_written_and_refuses_overlaps():
    m = big_key.Model(16)
    m.fill(3, 0, 4)
    m.fill(3, 4, 2)
    want = {"entries": 6, "rid_sum": 15, "seq_sum": 15, "payload_bytes": 96,
            "crc_sum": sum(zlib.crc32(big_key.payload(3, j, 16)) for j in range(6))}
    assert m.expected(3) == want and m.next_rid(3) == 6 and m.keys() == [3]
    assert m.expected(9)["entries"] == 0
    with pytest.raises(ValueError, match="overlap"):
        m.fill(3, 5, 2)
    assert big_key.payload(3, 1, 16) != big_key.payload(3, 2, 16) and len(big_key.payload(0, 0, 1024)) == 1024


def test_tiny_run_passes_every_check(tmp_path):
    out = tmp_path / "bk.jsonl"
    p = _bench("--size", "8M", "--batch-bytes", "2M", "--value-bytes", "1K", "--small-keys", "3",
               "--post-handover-entries", "100", "--first-host", "116", "--json", "--out", str(out),
               "--dir", str(tmp_path / "w"), "--report", str(tmp_path / "bk.md"))
    assert p.returncode == 0, p.stderr[-6000:]
    recs = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]  # nothing but JSON on stdout
    assert recs == [json.loads(x) for x in out.read_text().splitlines()]
    assert recs[0]["record"] == "setup" and recs[-1]["record"] == "summary"
    steps = {r["step"]: r for r in recs if r["record"] == "step"}
    assert list(steps) == list(big_key.STEPS)
    for r in steps.values():
        assert r["ok"] and "error" not in r, r
        assert "big-key" in r["command"] and r["parameters"]["size"] == 8 << 20
        assert r["seconds"] > 0 and r["rhino_dir_bytes"] > 8 << 20
        assert any(k.startswith("rhino_worker_") and v > 0 for k, v in r["peak_rss_mib"].items())
    n = 8192
    fill = steps["fill"]
    assert fill["records"] == n and fill["payload_bytes"] == 8 << 20 and len(fill["batches"]) == 4
    assert all(b["attempts"] == 1 and b["records"] == 2048 for b in fill["batches"])
    assert fill["logical_bytes"] > 8 << 20  # keys and values, all keys
    rp, rs = steps["read_processor"], steps["read_state_reader"]
    assert rp["big_key"] == rp["expected_big_key"] and rp["big_key"]["entries"] == n
    assert rp["big_key"]["payload_bytes"] == 8 << 20
    assert rp["instances_streaming"] == [rp["expected_instance"]] and rp["big_key_task"]["large_reads"] >= 1
    assert rs["big_key"] == rp["big_key"] and rs["big_key_partitions"] == [rp["expected_instance"]]
    h = steps["handover"]
    assert h["origin"] == rp["expected_instance"] and h["target"] != h["origin"]
    assert h["placement_before"]["vnode_instance"] == h["origin"]
    assert h["placement_after"]["vnode_instance"] == h["target"] and h["epoch_after"] > h["epoch_before"]
    assert h["handover_step_event"]["kind"] == "handover_step" and h["handover_step_s"] > 0
    assert h["bytes_copied"] == 0 and h["target_in_origin_chain"]  # r=2 on 3 workers: hard links
    for s in ("read_processor_after_handover", "read_state_reader_after_handover"):
        r = steps[s]
        assert r["big_key"] == r["expected_big_key"] and r["big_key"]["entries"] == n + 100
        assert r["expected_instance"] == h["target"]
    assert steps["read_processor_after_handover"]["instances_streaming"] == [h["target"]]
    assert steps["read_state_reader_after_handover"]["big_key_partitions"] == [h["target"]]
    summ = recs[-1]
    assert summ["all_passed"] and summ["failed_step"] is None and all(summ["checks"].values())
    assert len(summ["checks"]) >= 15 and summ["handover_step_s"] == h["handover_step_s"]
    md = (tmp_path / "bk.md").read_text()
    assert md.startswith("# One key with a large MapState") and "All checks passed." in md
    # --from rewrites the report from the JSON lines alone
    p = _bench("--from", str(out), "--report", str(tmp_path / "again.md"), timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["all_passed"]
    assert (tmp_path / "again.md").read_text().split("\n")[4:] == md.split("\n")[4:]
