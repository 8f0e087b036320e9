"""`rhino-bench spark state-size`: a tiny run of both systems (N = 1k and 2k, 2 measured
batches, the 2k key filled over 2 batches), checking the JSON lines' fields, that stdout holds
nothing else, and that both systems' outputs agree; the plan, the byte counter and the
summary on their own; the argument errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_bench

pyspark = pytest.importorskip("pyspark")

from rhino_bench.spark import state_size  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_bench([sys.executable, "-m", "rhino_bench", "spark", "state-size", *args], cwd=REPO, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--entries", "lots"], "expected a count"),
    (["--entries", "0"], "must be >= 1"),
    (["--kinds", "set"], "unknown kind"),
    (["--systems", "flink"], "unknown system"),
    (["--batches", "0"], "must be >= 1"),
    (["--spark-conf", "novalue"], "KEY=VALUE"),
])
def test_bad_arguments_exit_2(args, message):
    p = _bench(*args, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_parse_entries():
    assert state_size.parse_entries("1k,100k,1M") == [1_000, 100_000, 1_000_000]
    assert state_size.parse_entries("2000,1k") == [1_000, 2_000]


def test_plan_fills_in_chunks_then_touches_the_big_key_once_per_batch():
    plan = state_size.plan_batches(2_500, fill_chunk=1_000, warmup=1, batches=3, small_keys=4)
    phases = [b.phase for b in plan]
    assert phases == ["fill"] * 3 + ["warmup"] + ["measure"] * 3 + ["check"]
    assert [b.index for b in plan] == list(range(len(plan)))
    fills = [b.rows for b in plan if b.phase == "fill"]
    assert [r[0][2:] for r in fills] == [(0, 1_000), (1_000, 2_000), (2_000, 2_500)]
    for b in plan:
        if b.phase in ("warmup", "measure"):
            big = [r for r in b.rows if r[0] == state_size.BIG_KEY]
            assert len(big) == 1 and big[0][1] == state_size.OP_TOUCH and 0 <= big[0][2] < 2_500
            assert sorted(r[0] for r in b.rows) == list(range(5))
    assert sorted(r[0] for r in plan[-1].rows) == list(range(5))
    # the same plan for the same N and seed: both systems read the same files
    assert [b.rows for b in plan] == [b.rows for b in state_size.plan_batches(
        2_500, fill_chunk=1_000, warmup=1, batches=3, small_keys=4)]


def test_dir_bytes_counts_new_files_growth_and_hard_links_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100)
    d = state_size.DirBytes([tmp_path])
    (tmp_path / "b").write_bytes(b"y" * 50)
    os.link(tmp_path / "b", tmp_path / "b2")
    with open(tmp_path / "a", "ab") as f:
        f.write(b"z" * 10)
    assert d.step() == (60, 160)
    (tmp_path / "a").unlink()
    assert d.step() == (0, 50)


def test_summary_judges_the_targets():
    def m(system, kind, n, s, digest="d"):
        return {"record": "measurement", "system": system, "kind": kind, "entries": n, "batch_s": s,
                "output_digest": digest}

    recs = [m("rhino", "map", 1_000, 1.0), m("rhino", "map", 1_000_000, 1.5), m("spark-rocksdb", "map", 1_000, 0.9),
            m("spark-rocksdb", "map", 1_000_000, 3.0), m("rhino", "list", 1_000, 1.0),
            m("rhino", "list", 1_000_000, 2.5, "x"), m("spark-rocksdb", "list", 1_000_000, 3.0)]
    s = state_size.summarize(recs)
    assert s["flatness"]["map"]["met"] and s["flatness"]["map"]["ratio"] == 1.5
    assert not s["flatness"]["list"]["met"]
    assert not s["rhino_vs_spark"]["map/1000"]["met"] and s["rhino_vs_spark"]["map/1000000"]["met"]
    assert s["rhino_vs_spark"]["list/1000000"]["met"]
    assert s["outputs_agree"] == {"map/1000": True, "map/1000000": True, "list/1000000": False}
    assert s["all_targets_met"] is False


def test_tiny_run_both_systems_agree(tmp_path):
    out = tmp_path / "ss.jsonl"
    p = _bench("--entries", "1k,2k", "--batches", "2", "--warmup", "1", "--fill-chunk", "1000", "--small-keys",
               "5", "--replicas", "1", "--first-host", "110", "--no-warmup-run", "--json", "--out", str(out), "--dir",
               str(tmp_path / "w"), "--report", str(tmp_path / "ss.md"), "--plot", str(tmp_path / "ss.png"))
    assert p.returncode == 0, p.stderr[-4000:]
    lines = [x for x in p.stdout.splitlines() if x.strip()]
    recs = [json.loads(x) for x in lines]  # nothing but JSON on stdout (Spark's chatter goes to stderr)
    assert recs == [json.loads(x) for x in out.read_text().splitlines()]
    assert recs[0]["record"] == "setup" and recs[-1]["record"] == "summary"
    ms = [r for r in recs if r["record"] == "measurement"]
    assert sorted((r["system"], r["kind"], r["entries"]) for r in ms) == sorted(
        (s, k, n) for s in ("rhino", "spark-rocksdb") for k in ("map", "list") for n in (1_000, 2_000))
    for r in ms:
        assert r["measured_batches"] == 2 and len(r["batch_s_all"]) == 2 and r["missing_batches"] == []
        assert r["batch_s"] > 0 and r["fill_s"] > 0
        assert r["fill_batches"] == r["entries"] // 1_000
        assert isinstance(r["bytes_written"], (int, float)) and r["bytes_written"] > 0, r
        assert r["bytes_written_source"]
        assert "state-size" in r["command"] and r["parameters"]["batches"] == 2
        # the check batch read the whole big key: N map entries, N + 3 list elements (3 appends)
        assert r["check_entries"] == r["entries"] + (3 if r["kind"] == "list" else 0), r
        assert r["output_rows"] == r["fill_batches"] + 3 * 6 + 6
    for r in ms:
        if r["system"] == "rhino":
            assert r["replicated_bytes"] > 0 and r["disk_write_bytes"] > 0 and r["attempts_max"] == 1
    summ = recs[-1]
    assert summ["outputs_agree"] == {f"{k}/{n}": True for k in ("map", "list") for n in (1_000, 2_000)}
    assert set(summ["flatness"]) == {"map", "list"} and len(summ["rhino_vs_spark"]) == 4
    assert (tmp_path / "ss.md").read_text().startswith("# Large per-key state")
    assert (tmp_path / "ss.png").stat().st_size > 1000
