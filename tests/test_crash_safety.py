"""Crash safety with real SIGKILL (issue 2, "Must show: crash safety").

A child process (``sys.executable`` running a small script written to
``tmp_path``) checkpoints or restores real RocksDB state and is killed with a
real SIGKILL, either by the C++ core itself at a named crash point
(``RHINO_CRASH_POINT=<name>``, see src/cpp/util/crash_point.h) or by the parent
at a random instant. After every kill the parent checks, against a model
computed independently in NumPy (and read back both through Rhino and through
``rocksdict``), that:

- opening the store removes the dead child's staging;
- the visible checkpoints are the old ones, plus the new one only if the kill
  came after its commit; a checkpoint that never committed is never visible;
- ``verify(full=True)`` passes and every visible checkpoint restores with
  exactly its contents;
- ``gc()`` removes the orphaned pool files and nothing a checkpoint references;
- a restore target is either absent or complete;
- the killed child's live DB reopens (WAL recovery) with everything written
  before the kill, and checkpointing goes on (next id; or the same id again
  after the re-execution path of docs/design.md §5, restore + re-apply).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

import rhino

from crash_workload import (CHILD, INSTANCE, OP, PART, SRC, Model, apply_batch, check_restores, kill_loop_child,
                            make_base, manifest_temporaries, pool_files, read_log, referenced, run_child)

CHECKPOINT_POINTS = [
    "checkpoint.after_rocksdb_checkpoint",
    "checkpoint.mid_pool",
    "checkpoint.before_manifest",
    "checkpoint.mid_manifest",
    "checkpoint.before_link_manifest",
    "checkpoint.after_commit",
]
RESTORE_POINTS = ["restore.mid_files", "restore.before_rename"]


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


# ---------------------------------------------------------------- the crash points


def test_every_crash_point_is_covered():
    """The lists below must name every local CrashPoint("...") in the core, so a new one is not missed.

    The data plane's points (src/cpp/replication/) are covered by test_chaos.py, the state
    service's (src/cpp/service/) by test_service_sessions.py."""
    if not SRC.is_dir():
        pytest.skip("C++ sources not present")
    found = set()
    for p in SRC.rglob("*.cc"):
        if "replication" not in p.parts and "service" not in p.parts:
            found |= set(re.findall(r'CrashPoint\("([^"]+)"\)', p.read_text()))
    assert found == set(CHECKPOINT_POINTS) | set(RESTORE_POINTS)


@pytest.mark.parametrize("point", CHECKPOINT_POINTS)
def test_sigkill_during_checkpoint(tmp_path, model, point):
    store_dir, live = make_base(tmp_path)
    pool_before = pool_files(store_dir)

    r = run_child(tmp_path, {"op": "checkpoint", "db": str(live), "store": str(store_dir), "id": 3,
                             "log": str(tmp_path / "log")}, crash_point=point)
    assert r.returncode == -signal.SIGKILL, f"crash point {point} not reached: rc={r.returncode}\n{r.stderr}"
    assert (tmp_path / "log").read_text().split() == ["WROTE", "3"]  # killed inside checkpoint 3

    # The dead child's staging is still there, and opening the store removes it.
    assert [n for n in os.listdir(store_dir / "tmp") if n.startswith("ckpt-")], "no staging left behind?"
    tmps = manifest_temporaries(store_dir)
    assert bool(tmps) == (point in ("checkpoint.mid_manifest", "checkpoint.before_link_manifest"))
    store = rhino.ReplicaStore(str(store_dir))
    assert os.listdir(store_dir / "tmp") == []

    # Visibility: the new checkpoint only once committed.
    committed = point == "checkpoint.after_commit"
    old = [1, 2]
    assert store.checkpoints(OP, INSTANCE) == (old + [3] if committed else old)
    if not committed:
        with pytest.raises(rhino.NotFoundError):
            store.manifest(OP, INSTANCE, 3)
        with pytest.raises(rhino.NotFoundError):
            store.restore(OP, INSTANCE, 3, str(tmp_path / "never"))
        assert not (tmp_path / "never").exists()
    report = store.verify(full=True)
    assert report.ok, report.problems
    assert report.checkpoints == len(store.checkpoints(OP, INSTANCE))

    # GC removes exactly the orphans: files pooled by the killed checkpoint that no manifest names.
    refs = referenced(store)
    orphans = pool_files(store_dir) - refs
    assert refs <= pool_files(store_dir)
    if point == "checkpoint.after_rocksdb_checkpoint":
        assert pool_files(store_dir) == pool_before  # nothing pooled yet
    if point in ("checkpoint.before_manifest", "checkpoint.mid_manifest", "checkpoint.before_link_manifest"):
        assert orphans, "batch 3's new SST should be pooled but unreferenced"
    if committed:
        assert not orphans
    g = store.gc()
    assert g["files_removed"] == len(orphans)
    assert pool_files(store_dir) == refs
    assert manifest_temporaries(store_dir) == []
    report = store.verify(full=True)
    assert report.ok, report.problems
    check_restores(store, model, store.checkpoints(OP, INSTANCE), tmp_path, "after-gc")

    # The live DB reopens (WAL recovery) with batch 3, which was written before the checkpoint began.
    db = rhino.StateBackend.open(str(live), partitioner=PART, create=False)
    model.check_backend(db, 3)
    assert db.last_checkpoint in (2, 3)  # 3 was recorded in the DB before the kill; never committed unless after_commit

    # Retry of the same id, the way a re-executed batch does it (docs/design.md §5): restore the last
    # committed checkpoint, re-apply batch 3, checkpoint 3. It succeeds iff 3 was not committed.
    retry = store.restore(OP, INSTANCE, 2, str(tmp_path / "retry"))
    apply_batch(retry, 3)
    if committed:
        with pytest.raises(rhino.AlreadyExistsError):
            retry.checkpoint(store, 3)
    else:
        m3 = retry.checkpoint(store, 3)
        assert m3.parent_id == 2 and m3.version == 3
    retry.close()

    # The killed live DB goes on with the next id; an uncommitted 3 never became visible on its own.
    m4 = db.checkpoint(store, 4)
    assert m4.version == 3
    # Even when the kill lost the DB's last checkpoint, 4 is incremental against a committed one:
    # its delta is exactly the files that checkpoint lacks. (Not necessarily smaller than the
    # whole: the reopened DB replays batches 2-3 from the WAL into new L0 files, which can
    # start a compaction that rewrites everything before checkpoint 4 is taken.)
    assert m4.parent_id in (2, 3)
    parent = {f.identity for f in store.manifest(OP, INSTANCE, m4.parent_id).files}
    assert all((f.identity in parent) != f.in_delta for f in m4.files)
    db.close()
    assert store.checkpoints(OP, INSTANCE) == [1, 2, 3, 4]
    store.gc()
    report = store.verify(full=True)
    assert report.ok, report.problems
    for c, batch in ((3, 3), (4, 3)):
        db = store.restore(OP, INSTANCE, c, str(tmp_path / f"final-{c}"))
        model.check_backend(db, batch)
        db.close()


@pytest.mark.parametrize("point", RESTORE_POINTS)
def test_sigkill_during_restore(tmp_path, model, point):
    store_dir, live = make_base(tmp_path)
    pool_before = pool_files(store_dir)
    target = tmp_path / "restored"

    r = run_child(tmp_path, {"op": "restore", "store": str(store_dir), "id": 2, "target": str(target),
                             "log": str(tmp_path / "log")}, crash_point=point)
    assert r.returncode == -signal.SIGKILL, f"crash point {point} not reached: rc={r.returncode}\n{r.stderr}"
    assert (tmp_path / "log").read_text().split() == ["RESTORING", "2"]

    # Both points are before the rename: the target must not exist, only the dead child's staging.
    assert not target.exists()
    stale = [n for n in os.listdir(tmp_path) if n.startswith("restored.rhino-restore-")]
    assert len(stale) == 1
    n_manifest = len(rhino.ReplicaStore(str(store_dir)).manifest(OP, INSTANCE, 2).files)
    staged = os.listdir(tmp_path / stale[0])
    if point == "restore.mid_files":
        assert 0 < len(staged) < n_manifest
    else:
        assert len(staged) == n_manifest

    # The store is untouched: same checkpoints, intact, nothing to collect.
    store = rhino.ReplicaStore(str(store_dir))
    assert store.checkpoints(OP, INSTANCE) == [1, 2]
    assert store.verify(full=True).ok
    assert store.gc()["files_removed"] == 0
    assert pool_files(store_dir) == pool_before

    # A retry into the same target succeeds, is complete, and removes the dead child's staging.
    db = store.restore(OP, INSTANCE, 2, str(target))
    model.check_backend(db, 2)
    db.close()
    assert [n for n in os.listdir(tmp_path) if ".rhino-restore-" in n] == []
    check_restores(store, model, [1, 2], tmp_path, "after")

    # The live DB was never involved.
    db = rhino.StateBackend.open(str(live), create=False)
    model.check_backend(db, 2)
    db.close()


# ---------------------------------------------------------------- random-time kills


def test_sigkill_at_random_times(tmp_path, model):
    """A child loops update -> checkpoint -> (restore and switch | scratch restore) on ~3 MB of
    state; the parent SIGKILLs it after a random delay, checks every invariant, and starts the
    next child on the same live DB and store."""
    rng = random.Random(int(os.environ.get("RHINO_CRASH_SEED", "20240611")))  # override to explore
    store_dir, live_root, scratch = tmp_path / "store", tmp_path / "lives", tmp_path / "scratch"
    live_root.mkdir()
    scratch.mkdir()
    cur = live_root / "live-0"
    store = rhino.ReplicaStore(str(store_dir))
    db = rhino.StateBackend.open(str(cur), partitioner=PART, operator_id=OP, instance=INSTANCE)
    apply_batch(db, 1)
    db.checkpoint(store, 1)
    db.close()
    visible = {1}  # the committed checkpoints we know of (after our own retention)
    version = 1  # the live DB's version before each trial
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    deadline = time.monotonic() + 60
    trials = 0
    outcomes: set[str] = set()

    while trials < 16 and (trials < 8 or time.monotonic() < deadline):
        trials += 1
        log = tmp_path / f"log-{trials}"
        kill_loop_child(script, {"op": "loop", "db": str(cur), "store": str(store_dir), "log": str(log),
                                 "live_root": str(live_root), "scratch": str(scratch)},
                        tmp_path / f"cmd-{trials}.json", rng.uniform(0.0, 1.0))

        entries = read_log(log)
        assert entries[0] == ["READY", str(version + 1)]
        wrote = [int(e[1]) for e in entries if e[0] == "WROTE"]
        ckpts = [int(e[1]) for e in entries if e[0] == "CKPT"]
        last = entries[-1]
        outcomes.add(last[0])

        # 1. Visible checkpoints: all logged ones; at most one more, the one in flight.
        store = rhino.ReplicaStore(str(store_dir))
        assert os.listdir(store_dir / "tmp") == [], "stale staging survived reopening the store"
        in_flight = {wrote[-1]} if wrote and (not ckpts or ckpts[-1] != wrote[-1]) else set()
        now = set(store.checkpoints(OP, INSTANCE))
        assert visible | set(ckpts) <= now <= visible | set(ckpts) | in_flight, (sorted(now), entries[-3:])
        if in_flight & now:
            outcomes.add("in-flight checkpoint committed")
        report = store.verify(full=True)
        assert report.ok, report.problems

        # 2. The newest checkpoint (rocksdict too) and one random earlier one restore exactly.
        check = {max(now), rng.choice(sorted(now))} | (in_flight & now)
        for c in sorted(check):
            db = store.restore(OP, INSTANCE, c, str(tmp_path / f"check-{trials}-{c}"), verify="full")
            model.check_backend(db, c)
            db.close()
        files = tmp_path / f"files-{trials}"
        store.restore_files(OP, INSTANCE, max(now), str(files))
        model.check_dir_with_rocksdict(str(files), max(now))

        # 3. An interrupted restore left its target absent or complete.
        for e in entries:
            if e[0] in ("RESTORING", "SCRATCH") and [("SWITCH" if e[0] == "RESTORING" else "SCRATCHED")] + e[1:] not in entries:
                target = Path(e[2])
                if target.exists():
                    db = rhino.StateBackend.open(str(target), create=False)
                    model.check_backend(db, int(e[1]))
                    db.close()
                    outcomes.add(e[0] + "-complete")
                    shutil.rmtree(target)
        switches = [e for e in entries if e[0] == "SWITCH"]
        if switches:
            cur = Path(switches[-1][2])

        # 4. The live DB reopens (WAL recovery) at the last batch written, or the one in flight.
        db = rhino.StateBackend.open(str(cur), partitioner=PART, create=False)
        top = wrote[-1] if wrote else version
        assert db.version in (top, top + 1), (db.version, top)
        model.check_backend(db, db.version)
        version = db.version
        db.close()

        # 5. Retention + GC never touch what the retained checkpoints reference.
        removed = store.retain(OP, INSTANCE, 4)
        store.gc()
        visible = set(store.checkpoints(OP, INSTANCE))
        assert visible == now - set(removed) and len(visible) == min(4, len(now))
        assert pool_files(store_dir) == referenced(store)
        report = store.verify(full=True)
        assert report.ok, report.problems
        db = store.restore(OP, INSTANCE, max(visible), str(tmp_path / f"post-gc-{trials}"))
        model.check_backend(db, max(visible))
        db.close()

        # Clean up what the killed child (and this check) left around, so disk use stays bounded.
        for n in os.listdir(live_root):
            if live_root / n != cur:
                shutil.rmtree(live_root / n)
        for n in os.listdir(scratch):
            shutil.rmtree(scratch / n)
        for p in tmp_path.iterdir():
            if p.is_dir() and p.name.startswith(("check-", "files-", "post-gc-")):
                shutil.rmtree(p)

    assert trials >= 8
    # At least one kill landed inside a checkpoint or a restore, not only between them.
    assert outcomes & {"WROTE", "RESTORING", "SCRATCH"}, outcomes
