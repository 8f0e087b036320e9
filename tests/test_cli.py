"""The `rhino` command line, run as a real subprocess (`python -m rhino.cli`).

Counts are checked against what the test itself wrote and against the
independent oracles in tests/helpers.py (xxhash, os.listdir / os.stat), never
against numbers taken from Rhino's own output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import rhino
from helpers import oracle_vnode

K, V, SEED = 1 << 10, 8, 3
N_KEYS = 2_000
CONTRACT = ("size_bytes", "files", "hardlink_restore_s", "copy_restore_s", "cp_al_s")


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def run_bench(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rhino-bench ...` (bench/rhino_bench), the repository's benchmark command."""
    return subprocess.run([sys.executable, "-m", "rhino_bench", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def written(tmp_path: Path):
    """A live state (V=8) and a store with two checkpoints, and what was written."""
    p = rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=SEED)
    keys = np.arange(N_KEYS, dtype=np.int64) * 7919 - 1_000_003
    values = [b"v%06d" % i for i in range(N_KEYS)]
    live, store_dir = tmp_path / "live", tmp_path / "store"
    db = rhino.StateBackend.open(str(live), partitioner=p, operator_id="cli-op", instance=3)
    db.put_batch(keys[:1500], values[:1500], version=10)
    store = rhino.ReplicaStore(str(store_dir))
    db.checkpoint(store, 1, epoch=4)
    db.put_batch(keys[1500:], values[1500:], version=11)
    db.checkpoint(store, 2, epoch=4)
    db.close()
    per_vnode = Counter(oracle_vnode(int(k), K, V, SEED) for k in keys)
    return {"tmp": tmp_path, "live": live, "store": store_dir, "store_obj": store, "per_vnode": per_vnode}


def test_version_names_package_core_and_rocksdb():
    r = run_cli("version")
    assert r.returncode == 0, r.stderr
    assert f"rhino {rhino.__version__}" in r.stdout
    core_line = next(line for line in r.stdout.splitlines() if line.startswith("_core "))
    assert os.path.isfile(core_line.split(" ", 1)[1])
    rocks_line = next(line for line in r.stdout.splitlines() if line.startswith("rocksdb "))
    assert re.match(r"rocksdb \d+\.\d+\.\d+, ", rocks_line), rocks_line


def test_built_against_the_release_rocksdb():
    """`make setup` links the release RocksDB built by tools/build_rocksdb.sh;
    a silent fallback to Debian's assertion-enabled librocksdb would slow
    everything and turn failed assertions into aborts."""
    from rhino import _core

    if os.environ.get("RHINO_ALLOW_SYSTEM_ROCKSDB"):
        pytest.skip("RHINO_ALLOW_SYSTEM_ROCKSDB is set")
    assert _core.ROCKSDB_BUILD.startswith("release build"), _core.ROCKSDB_BUILD
    with open("/proc/self/maps") as f:
        loaded = set(re.findall(r"/\S*librocksdb\S*", f.read()))
    assert loaded and all(os.path.basename(p).startswith("librocksdb-rhino.so") for p in loaded), loaded


def test_rocksdb_uses_the_cpus_crc32c_instructions():
    """RocksDB's PORTABLE build compiles CRC32C (every WAL record, every block
    of the default checksum type) table-driven; tools/build_rocksdb.sh
    compiles it with the SSE4.2 path, chosen at run time. The CPU's own flags
    are the oracle."""
    from rhino import _core

    if os.environ.get("RHINO_ALLOW_SYSTEM_ROCKSDB"):
        pytest.skip("RHINO_ALLOW_SYSTEM_ROCKSDB is set")
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    if "sse4_2" not in flags:
        pytest.skip("this CPU has no SSE4.2")
    assert _core.ROCKSDB_CRC32C.startswith("Supported on x86"), _core.ROCKSDB_CRC32C


def test_python_dash_m_rhino_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "rhino", "version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("rhino ")


def test_inspect_state_exact_counts_match_what_was_written(written):
    r = run_cli("inspect", str(written["live"]), "--json", "--exact")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["kind"] == "state" and rep["store"] is None
    s = rep["state"]
    assert (s["operator_id"], s["instance"]) == ("cli-op", 3)
    assert s["partitioner"] == {"num_key_groups": K, "num_vnodes": V, "seed": SEED}
    assert (s["version"], s["last_checkpoint"]) == (11, 2)
    assert s["keys"] == N_KEYS and s["vnodes_held"] == V
    assert {row["vnode"]: row["keys"] for row in s["vnodes"]} == {v: written["per_vnode"][v] for v in range(V)}
    files = os.listdir(written["live"])
    assert s["files"] == len(files)
    assert s["disk_bytes"] == sum(os.stat(written["live"] / f).st_size for f in files)


def test_inspect_state_estimates_without_exact(written):
    r = run_cli("inspect", str(written["live"]), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["state"]
    assert s["keys"] is None and s["counts"] == "estimate"
    # No overwrites or deletes were written, so RocksDB's estimate is exact here.
    assert s["estimated_keys"] == N_KEYS


def test_inspect_store_lists_checkpoints_and_pool(written):
    r = run_cli("inspect", str(written["store"]), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["kind"] == "store"
    st = rep["store"]
    [inst] = st["instances"]
    assert (inst["operator_id"], inst["instance"]) == ("cli-op", 3)
    c1, c2 = inst["checkpoints"]
    assert (c1["checkpoint_id"], c1["parent_id"], c1["version"], c1["epoch"]) == (1, None, 10, 4)
    assert (c2["checkpoint_id"], c2["parent_id"], c2["version"], c2["epoch"]) == (2, 1, 11, 4)
    # Files and bytes against a restored directory, listed by the OS.
    target = written["tmp"] / "restored"
    written["store_obj"].restore_files("cli-op", 3, 2, str(target), mode="copy")
    names = os.listdir(target)
    assert c2["files"] == len(names)
    assert c2["total_bytes"] == sum(os.stat(target / n).st_size for n in names)
    assert 0 < c2["delta_files"] < c2["files"] and 0 < c2["delta_bytes"] < c2["total_bytes"]
    pool = os.listdir(written["store"] / "pool")
    assert st["pool"]["files"] == len(pool)
    assert st["pool"]["bytes"] == sum(os.stat(written["store"] / "pool" / n).st_size for n in pool)
    assert st["pool"]["unreferenced_files"] == 0


def test_inspect_human_readable_and_live_plus_store_dir(written):
    # A directory holding live/ and store/, as `rhino-bench demo --data-plane` leaves it.
    r = run_cli("inspect", str(written["tmp"]))
    assert r.returncode == 0, r.stderr
    assert "Live state" in r.stdout and "Replica store" in r.stdout
    assert "cli-op / instance 3: 2 checkpoint(s)" in r.stdout


def test_inspect_works_while_another_process_has_the_state_open(written):
    db = rhino.StateBackend.open(str(written["live"]))  # read-write, held open by this process
    try:
        r = run_cli("inspect", str(written["live"]), "--json", "--exact")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["state"]["keys"] == N_KEYS
    finally:
        db.close()


@pytest.mark.parametrize("args", [("inspect", "/nonexistent/rhino-state"), ("inspect", "{tmp}")])
def test_inspect_bad_path_is_a_clear_error(tmp_path, args):
    args = tuple(a.format(tmp=tmp_path) for a in args)
    r = run_cli(*args)
    assert r.returncode == 2
    assert r.stderr.startswith("rhino: error: ") and "Traceback" not in r.stderr
    assert args[1] in r.stderr
    assert r.stdout == ""


def test_bad_size_is_a_usage_error():
    r = run_bench("restore", "--sizes", "12Q")
    assert r.returncode == 2 and "invalid size '12Q'" in r.stderr and "Traceback" not in r.stderr


MAX_CHUNK = rhino._core.MAX_FRAME_BYTES - 16  # docs/protocol.md: chunk_bytes is in [1, max_frame_bytes - 16]


@pytest.mark.parametrize("args,message", [
    (["--size", "2X"], "invalid size '2X'"),
    (["--replicas", "1,x"], "expected chain lengths like 1,2"),
    (["--replicas", "0"], "every chain length must be at least 1"),
    (["--replicas", "3", "--workers", "2"], "a chain cannot be longer than --workers (2)"),
    (["--window", "0"], "must be positive"),
    (["--chunk", "99999999"], f"--chunk 99999999: at most {MAX_CHUNK} bytes"),
])
def test_bench_replicate_bad_arguments_are_usage_errors(tmp_path, args, message):
    r = run_bench("replicate", *args, "--dir", "w", cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "w").exists()  # refused before anything was started or written


@pytest.mark.parametrize("args,message", [
    (["--instances", "0"], "--instances must be >= 1"),
    (["--num-vnodes", "3"], "--num-vnodes from --instances to 32768"),
    (["--num-vnodes", "40000"], "--num-vnodes from --instances to 32768"),
    (["--window", "0"], "--window >= 1"),
    (["--chunk", "0"], f"--chunk must be 1..{MAX_CHUNK} bytes"),
    (["--settle-max", "-1"], "--settle-max and --keep-checkpoints must be >= 0"),
    (["--replication-timeout", "0"], "--replication-timeout > 0"),
    (["--update-fraction", "1"], "--update-fraction must be in [0, 1)"),
])
def test_bench_overhead_bad_arguments_are_usage_errors(tmp_path, args, message):
    r = run_bench("overhead", *args, "--dir", "w", cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("compaction", ["level", "universal"])
def test_bench_restore_prints_one_json_object_per_size(tmp_path, compaction):
    r = run_bench("restore", "--sizes", "1M,2M", "--json", "--dir", str(tmp_path / "b"),
                "--repeats", "1", "--no-drop-caches", "--out", str(tmp_path / "out.jsonl"),
                "--compaction", compaction)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    objs = [json.loads(line) for line in lines]
    assert [o["size_bytes"] for o in objs] == [1 << 20, 2 << 20]
    for o in objs:
        for field in CONTRACT:
            assert isinstance(o[field], (int, float)) and o[field] > 0, (field, o[field])
        assert o["linked_files"] + o["copied_files"] == o["files"] and o["linked_files"] > 0
        assert o["files_after_load"] > 0 and o["hardlink_restore_after_load_s"] > 0
        assert o["settled"] is True and o["settle_s"] >= 0
        assert o["compaction"] == compaction
        assert o["bytes"] >= o["size_bytes"]  # random values do not compress
        assert isinstance(o["machine"], dict) and o["machine"]["cpu_cores"] >= 1
    assert "building" in r.stderr  # the progress bar goes to stderr
    assert (tmp_path / "out.jsonl").read_text().splitlines() == lines
    assert not (tmp_path / "b").exists()  # cleaned up without --keep


def test_bench_replicate_prints_its_contract_and_judges_against_the_fastest_probe(tmp_path):
    r = run_bench("replicate", "--workers", "2", "--replicas", "1,2", "--size", "4M", "--json",
                "--dir", str(tmp_path / "b"), timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["replicas"] for row in rows] == [1, 2]
    probes = [x for row in rows for side in ("before", "after") for x in row["disk_probes_mb_s"][side]]
    kinds = rows[0]["disk_probes_mb_s"]["kinds"]  # plain, early writeback, and direct where O_DIRECT works
    assert kinds[:2] == ["plain", "early writeback"] and len(kinds) in (2, 3)
    assert len(probes) == 2 * 2 * len(kinds) and all(x > 0 for x in probes)
    for row in rows:
        for field in ("bytes", "seconds", "throughput_mb_s", "disk_limit_mb_s", "loopback_limit_mb_s",
                      "max_rss_growth_mb", "credit_window_mb"):
            assert isinstance(row[field], (int, float)) and row[field] >= 0, (field, row[field])
        assert row["bytes_sent"] == row["bytes"]  # fresh stores: every file crosses the socket
        assert row["disk_limit_mb_s"] == pytest.approx(max(probes), abs=0.1)
        limit = min(row["disk_limit_mb_s"], row["loopback_limit_mb_s"])
        # fraction_of_limit is rounded to 3 places: a tiny run's 0.0217 is written as 0.022.
        assert row["fraction_of_limit"] == pytest.approx(row["throughput_mb_s"] / limit, rel=0.01, abs=5e-4)


def test_demo_runs_and_verifies(tmp_path, read_rocksdb):
    r = run_bench("demo", "--data-plane", "--size", "8M", "--dir", "tmp", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified           yes" in r.stdout
    assert (tmp_path / "tmp" / "store" / "pool").is_dir()
    # The data-plane half: real workers, a SIGKILL, a repaired chain, a restore from a replica's store.
    assert "different files: the bytes crossed a socket" in r.stdout
    assert "killed: exit status -9" in r.stdout
    assert "w4 now holds checkpoints [2]" in r.stdout
    assert "restore from the replica:" in r.stdout and "-> OK" in r.stdout.split("restore from the replica:")[1]
    # Independent of the demo's own checks: rocksdict reads the state restored from the replica, and the
    # primary's checkpoint restored by copy, and finds them equal.
    import rhino

    tail = rhino.ReplicaStore(str(tmp_path / "tmp" / "workers" / "w3"))
    assert tail.checkpoints("demo", 0) == [1, 2] and tail.verify(full=True).ok
    from_replica = read_rocksdb(tmp_path / "tmp" / "restored-from-replica")
    assert sum(len(kv) for kv in from_replica.values()) > 0
    assert from_replica == read_rocksdb(tmp_path / "tmp" / "restored-by-copy")
    # The commands the demo suggests at its end work as printed (paths made absolute here).
    suggested = [line.split(":  ", 1)[1] for line in r.stdout.splitlines()
                 if line.startswith(("Check a replica's store:", "Take a checkpoint out of it:"))]
    assert len(suggested) == 2
    for cmd in suggested:
        args = cmd.split()[1:]  # drop "rhino"
        args = [str(tmp_path / a) if a.startswith("tmp/") else a for a in args]
        done = run_cli(*args, "--quiet", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert read_rocksdb(tmp_path / "tmp" / "ckpt-from-w3") == from_replica  # the newest checkpoint, as the replica holds it
