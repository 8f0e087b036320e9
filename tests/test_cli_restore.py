"""`rhino restore STORE TARGET`, run as a process: the directory it builds holds
exactly the checkpoint's state. The oracle is a dict model of what was written
up to each checkpoint, routed to vnodes by the test's own hash, and the restored
directory is read by rocksdict, which shares no code with Rhino."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rhino
from helpers import expected_column_families, flip_byte, key_bytes, same_inode

OP, V = "agg", 16


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store with checkpoints 1 and 2 of agg/3, and the model of the state at each."""
    root = tmp_path_factory.mktemp("cli-restore")
    p = rhino.Partitioner(num_vnodes=V)
    st = rhino.ReplicaStore(str(root / "store"))
    rng = np.random.default_rng(17)
    models: dict[int, dict[bytes, bytes]] = {}
    model: dict[bytes, bytes] = {}
    with rhino.StateBackend.open(str(root / "live"), operator_id=OP, instance=3, partitioner=p) as db:
        for c, keys in ((1, np.arange(0, 3000)), (2, np.arange(2000, 4000))):  # 2 overwrites 2000..2999
            values = [rng.bytes(int(n)) for n in rng.integers(1, 500, len(keys))]
            db.put_batch(keys.astype(np.int64), values, version=c)
            model.update({key_bytes(int(k)): v for k, v in zip(keys, values)})
            models[c] = dict(model)
            db.checkpoint(st, c)
    return root, p, models


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino", "restore", *args], capture_output=True, text=True,
                          timeout=120)


def assert_holds(read_rocksdb, target: Path, model, p) -> None:
    contents = read_rocksdb(target)
    want = expected_column_families(model, p, range(V))
    assert {n: contents[n] for n in want} == want
    assert sum(len(kv) for n, kv in contents.items() if n != "default") == len(model)


def test_the_newest_checkpoint_by_hard_links(built, tmp_path, read_rocksdb):
    root, p, models = built
    target = tmp_path / "r"
    out = run(str(root / "store"), str(target), "--operator", OP, "--instance", "3", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    m = rhino.ReplicaStore(str(root / "store")).manifest(OP, 3, 2)
    assert (r["checkpoint_id"], r["mode"], r["files"]) == (2, "link", len(m.files))
    assert r["total_bytes"] == sum(f.size for f in m.files)
    ssts = [f for f in m.files if f.name.endswith(".sst")]
    assert ssts and all(same_inode(target / f.name, rhino.ReplicaStore(str(root / "store")).pool_path(f.identity))
                        for f in ssts)
    assert_holds(read_rocksdb, target, models[2], p)


def test_an_older_checkpoint_by_copy_with_full_verify(built, tmp_path, read_rocksdb):
    root, p, models = built
    target = tmp_path / "c"
    out = run(str(root / "store"), str(target), "--operator", OP, "--instance", "3", "--checkpoint", "1",
              "--copy", "--full-verify")
    assert out.returncode == 0, out.stderr
    assert "restored   checkpoint 1 of agg/3" in out.stdout and "0 hard-linked" in out.stdout
    assert "verify [" in out.stderr and "copy [" in out.stderr  # both bars, on stderr
    assert_holds(read_rocksdb, target, models[1], p)
    assert models[1] != models[2]  # so the checkpoint chosen matters


@pytest.mark.parametrize("args, message", [
    (["--operator", "nope", "--instance", "3"], "holds no checkpoints of nope/3"),
    (["--operator", OP, "--instance", "3", "--checkpoint", "7"], "holds no checkpoint 7 of agg/3 (it holds: 1, 2)"),
])
def test_what_the_store_does_not_hold_is_an_error(built, tmp_path, args, message):
    root, _, _ = built
    out = run(str(root / "store"), str(tmp_path / "t"), *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "t").exists()


def test_an_existing_target_is_never_overwritten(built, tmp_path):
    root, _, _ = built
    target = tmp_path / "t"
    target.mkdir()
    (target / "mine").write_text("keep me")
    out = run(str(root / "store"), str(target), "--operator", OP, "--instance", "3")
    assert out.returncode == 2 and "already exists" in out.stderr
    assert os.listdir(target) == ["mine"] and (target / "mine").read_text() == "keep me"


def test_a_damaged_file_stops_a_full_verify_restore(built, tmp_path):
    root, _, _ = built
    copy = tmp_path / "store"
    subprocess.run(["cp", "-a", str(root / "store"), str(copy)], check=True)
    st = rhino.ReplicaStore(str(copy))
    victim = max(st.manifest(OP, 3, 2).files, key=lambda f: f.size)
    flip_byte(st.pool_path(victim.identity), victim.size // 3)
    target = tmp_path / "t"
    out = run(str(copy), str(target), "--operator", OP, "--instance", "3", "--full-verify", "--quiet")
    assert out.returncode == 2 and "fails its checksum" in out.stderr and victim.name in out.stderr
    assert not target.exists()


@pytest.mark.parametrize("args, message", [
    (["--instance", "-1"], "argument --instance: expected an integer from 0 to 4294967295"),
    (["--instance", "4294967296"], "argument --instance: expected an integer from 0 to 4294967295"),
    (["--instance", "x"], "argument --instance: expected a non-negative integer"),
    (["--instance", "3", "--checkpoint", "-2"], "argument --checkpoint: expected an integer from 0"),
])
def test_bad_numbers_are_usage_errors(built, tmp_path, args, message):
    root, _, _ = built
    out = run(str(root / "store"), str(tmp_path / "t"), "--operator", OP, *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_an_empty_target_is_refused(built):
    root, _, _ = built
    out = run(str(root / "store"), "", "--operator", OP, "--instance", "3")
    assert out.returncode == 2 and "the restore target is empty" in out.stderr


def test_a_stopped_restore_does_not_draw_a_full_bar(built, tmp_path):
    root, _, _ = built
    copy = tmp_path / "store"
    subprocess.run(["cp", "-a", str(root / "store"), str(copy)], check=True)
    st = rhino.ReplicaStore(str(copy))
    files = st.manifest(OP, 3, 2).files
    victim = max(files[1:], key=lambda f: f.size)  # not the first file: the bar has started by then
    flip_byte(st.pool_path(victim.identity), victim.size // 3)
    out = run(str(copy), str(tmp_path / "t"), "--operator", OP, "--instance", "3", "--full-verify")
    assert out.returncode == 2 and "fails its checksum" in out.stderr
    assert "verify [" in out.stderr and "100.0%" not in out.stderr
