"""`rhino verify STORE`, run as the operator would: a real process on a real store.

Oracles: the manifests (which files each checkpoint lists, and their sizes) and
the bytes we damage ourselves; the exit status is the contract scripts rely on
(0 intact, 1 problem found, 2 bad path or selection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rhino
from tests.helpers import flip_byte

OPS = ("agg", "join")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> Path:
    """Two operators, two instances each, three incremental checkpoints per instance."""
    root = tmp_path_factory.mktemp("cli-verify")
    st = rhino.ReplicaStore(str(root / "store"))
    rng = np.random.default_rng(11)
    for op in OPS:
        for inst in (0, 1):
            with rhino.StateBackend.open(str(root / f"live-{op}-{inst}"), operator_id=op, instance=inst,
                                         partitioner=rhino.Partitioner(num_vnodes=8)) as db:
                for c in (1, 2, 3):
                    keys = np.arange((c - 1) * 1500, c * 1500, dtype=np.int64)
                    db.put_batch(keys, [rng.bytes(300) for _ in range(len(keys))], version=c)
                    db.checkpoint(st, c)
    return root / "store"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino", "verify", *args], capture_output=True, text=True,
                          timeout=120)


def unique_bytes(st: rhino.ReplicaStore, selection) -> tuple[int, int, int]:
    """(checkpoints, file references, bytes of distinct pooled files) from the manifests."""
    cps = refs = 0
    sizes: dict[str, int] = {}
    for op, inst in selection:
        for c in st.checkpoints(op, inst):
            cps += 1
            for f in st.manifest(op, inst, c).files:
                refs += 1
                sizes[f.identity] = f.size
    return cps, refs, sum(sizes.values())


def test_an_intact_store_verifies_with_exit_0(store_dir):
    p = run(str(store_dir), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    st = rhino.ReplicaStore(str(store_dir))
    cps, refs, nbytes = unique_bytes(st, st.instances())
    assert (r["ok"], r["level"], r["checkpoints"], r["files_checked"], r["bytes_checked"]) == \
        (True, "full", cps, refs, nbytes)
    assert sorted((i["operator_id"], i["instance"]) for i in r["instances"]) == sorted(st.instances())


def test_text_output_and_progress_on_stderr(store_dir):
    p = run(str(store_dir))
    assert p.returncode == 0, p.stderr
    assert "result     OK" in p.stdout
    assert "verify [" in p.stderr and "100.0%" in p.stderr  # the bar, not on stdout
    q = run(str(store_dir), "--quiet")
    assert q.returncode == 0 and q.stderr == ""


def test_one_instance_and_quick(store_dir):
    p = run(str(store_dir), "--operator", "join", "--instance", "1", "--quick", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    st = rhino.ReplicaStore(str(store_dir))
    cps, refs, _ = unique_bytes(st, [("join", 1)])
    assert r["instances"] == [{"operator_id": "join", "instance": 1}]
    assert (r["level"], r["checkpoints"], r["files_checked"], r["bytes_checked"]) == ("size", cps, refs, 0)


@pytest.mark.parametrize("args, message", [
    (["--operator", "nope"], "holds no checkpoints of nope"),
    (["--operator", "agg", "--instance", "7"], "holds no checkpoints of agg/7"),
    (["--instance", "0"], "--instance needs --operator"),
    (["--operator", "agg", "--instance", "-1"], "argument --instance: expected an integer from 0"),
])
def test_a_selection_the_store_does_not_hold_is_a_usage_error(store_dir, args, message):
    p = run(str(store_dir), *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


def test_a_path_that_is_not_a_store_is_an_error_and_is_left_alone(tmp_path):
    missing = tmp_path / "typo"
    p = run(str(missing))
    assert p.returncode == 2 and "no such file or directory" in p.stderr
    assert not missing.exists()  # not created as a new, empty store
    empty = tmp_path / "empty"
    empty.mkdir()
    p = run(str(empty))
    assert p.returncode == 2 and "is not a replica store" in p.stderr
    assert os.listdir(empty) == []


def test_damage_is_found_named_and_exits_1(tmp_path, store_dir):
    # Work on a copy: the module's store stays intact for the other tests.
    copy = tmp_path / "store"
    subprocess.run(["cp", "-a", str(store_dir), str(copy)], check=True)
    st = rhino.ReplicaStore(str(copy))
    m = st.manifest("agg", 0, 1)
    victim = max(m.files, key=lambda f: f.size)
    flip_byte(st.pool_path(victim.identity), victim.size // 2)
    listing = [(op, i, c) for op, i in st.instances() for c in st.checkpoints(op, i)
               if any(f.identity == victim.identity for f in st.manifest(op, i, c).files)]

    p = run(str(copy), "--json")
    assert p.returncode == 1, p.stderr
    r = json.loads(p.stdout)
    assert not r["ok"]
    assert sorted((x["operator_id"], x["instance"], x["checkpoint_id"]) for x in r["problems"]) == sorted(listing)
    assert all(x["file"] == victim.name and x["detail"] == "checksum mismatch" for x in r["problems"])

    t = run(str(copy), "--quiet")
    assert t.returncode == 1 and "PROBLEM(S)" in t.stdout and victim.name in t.stdout
    # A size-only check cannot see a flipped byte: that is what the full check is for.
    assert run(str(copy), "--quick", "--quiet").returncode == 0
    # The other operator is unaffected.
    assert run(str(copy), "--operator", "join", "--quiet").returncode == 0
