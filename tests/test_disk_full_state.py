"""A full disk under a primary's live state: clear errors, nothing committed lost, writes resume.

The state and its store live on a small tmpfs, mounted in a private mount
namespace (`unshare -m` as root, `unshare -rm` otherwise), so the test fills a
real filesystem and gets real ENOSPC from the kernel. The steps run in that
namespace, in a child process, and report what they saw as JSON; the test
asserts on it. Oracles: a dict model of the committed writes, and rocksdict
(an independent RocksDB) reading the state and restored checkpoints.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    r"""
    import json, os, sys, time
    import numpy as np
    import rocksdict
    import rhino

    root = sys.argv[1]
    out = {}

    def read_vnodes(path):
        names = rocksdict.Rdict.list_cf(path)
        raw = rocksdict.Options(raw_mode=True)
        db = rocksdict.Rdict(path, options=raw, access_type=rocksdict.AccessType.read_only(),
                             column_families={n: rocksdict.Options(raw_mode=True) for n in names if n != "default"})
        try:
            seen = {}
            for n in names:
                if n.startswith("vnode-"):
                    seen.update(db.get_column_family(n).items())
            return seen
        finally:
            db.close()

    def kb(k):
        return int(k).to_bytes(8, "little", signed=True)

    store = rhino.ReplicaStore(root + "/store")
    # A small write buffer: RocksDB's own recovery waits for one memtable's worth of free space.
    db = rhino.StateBackend.open(root + "/state", partitioner=rhino.Partitioner(num_vnodes=4), operator_id="op",
                                 write_buffer_budget=8 << 20)
    model = {}
    keys = np.arange(1000, dtype=np.int64)
    db.put_batch(keys, np.full((1000, 100), 1, np.uint8), version=1)
    model.update({kb(k): bytes([1]) * 100 for k in keys})
    db.checkpoint(store, 1)
    model_cp1 = dict(model)

    # Fill the disk but for 2 MB, then write until it is full.
    st = os.statvfs(root)
    with open(root + "/ballast", "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - (2 << 20)))
    rng = np.random.default_rng(7)
    version = 2
    try:
        for _ in range(500):
            k = rng.integers(0, 1 << 40, 2000, dtype=np.int64)
            v = np.frombuffer(rng.bytes(2000 * 200), np.uint8).reshape(2000, 200)
            db.put_batch(k, v, version=version)
            model.update({kb(a): b.tobytes() for a, b in zip(k.tolist(), v)})
            version += 1
        out["put_error"] = None
    except rhino.RhinoError as e:
        out["put_error"] = [type(e).__name__, str(e)]
    out["committed_version"] = version - 1
    out["version_after_error"] = db.version
    probe = [int.from_bytes(k, "little", signed=True) for k in list(model)[::97]]
    out["reads_after_error_match"] = db.get_batch(probe) == [model[kb(k)] for k in probe]

    try:
        db.checkpoint(store, 2)
        out["checkpoint_error"] = None
    except rhino.RhinoError as e:
        out["checkpoint_error"] = [type(e).__name__, str(e)]
    out["checkpoints_while_full"] = store.checkpoints("op", 0)
    out["verify_while_full"] = store.verify(full=True).ok

    # Free the disk: writes must resume (RocksDB's recovery polls every 5 s).
    os.remove(root + "/ballast")
    errors_while_resuming = []
    t0 = time.monotonic()
    while True:
        try:
            db.put_batch([5, 6], [b"after", b"the-full-disk"], version=version)
            model[kb(5)], model[kb(6)] = b"after", b"the-full-disk"
            break
        except rhino.RhinoError as e:
            errors_while_resuming.append(type(e).__name__)
            if time.monotonic() - t0 > 60:
                break
            time.sleep(0.25)
    out["resumed_after_s"] = time.monotonic() - t0
    out["errors_while_resuming"] = sorted(set(errors_while_resuming))
    out["final_version"] = db.version
    out["expected_final_version"] = version
    db.checkpoint(store, 3)
    out["checkpoints_after"] = store.checkpoints("op", 0)
    db.close()

    out["state_matches_model"] = read_vnodes(root + "/state") == model
    for cp, expected in ((1, model_cp1), (3, model)):
        r = store.restore("op", 0, cp, root + f"/restored-{cp}")
        r.close()
        out[f"restore_{cp}_matches"] = read_vnodes(root + f"/restored-{cp}") == expected
    out["verify_after"] = store.verify(full=True).ok
    print("RESULT " + json.dumps(out))
    """
)


def _namespace_prefix() -> list[str]:
    """How to get a private mount namespace here, or skip."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = subprocess.run(prefix + ["sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || "
                                                     "mount -t tmpfs -o size=1m tmpfs /tmp"],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    pytest.skip("cannot mount a tmpfs in a private mount namespace here (needs root or user namespaces)")


def test_full_disk_under_live_state_loses_nothing_and_writes_resume(tmp_path: Path):
    prefix = _namespace_prefix()
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cmd = prefix + ["sh", "-c", f"mount -t tmpfs -o size=32m tmpfs {mnt} && exec {sys.executable} {script} {mnt}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r = json.loads(line[len("RESULT "):])

    # The disk filled: a clear NoSpaceError, and the state keeps its last committed version.
    assert r["put_error"] is not None, "the 32 MB disk never filled"
    assert r["put_error"][0] == "NoSpaceError" and "No space left" in r["put_error"][1]
    assert r["version_after_error"] == r["committed_version"] >= 1
    assert r["reads_after_error_match"]
    # A checkpoint on the full disk fails clearly, and leaves the committed one intact.
    assert r["checkpoint_error"] is not None and r["checkpoint_error"][0] in ("NoSpaceError", "BusyError")
    assert r["checkpoints_while_full"] == [1] and r["verify_while_full"]
    # Once space is free, writes resume by themselves (BusyError meanwhile, nothing else).
    assert r["final_version"] == r["expected_final_version"], r
    assert set(r["errors_while_resuming"]) <= {"BusyError"}, r["errors_while_resuming"]
    assert r["checkpoints_after"] == [1, 3] and r["verify_after"]
    # Nothing committed was lost: rocksdict sees exactly the model, live and restored.
    assert r["state_matches_model"]
    assert r["restore_1_matches"] and r["restore_3_matches"]
