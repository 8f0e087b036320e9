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

import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rocksdict
import xxhash

import rhino

# ---------------------------------------------------------------- shared by parent and child
# The workload is a pure function of the batch number i, so the parent knows the
# exact contents of checkpoint i without asking the code under test.

COMMON = r'''
import numpy as np

OP = "crash-op"
INSTANCE = 0
N_KEYS = 30000
WIDTH = 96          # bytes per value: 30k keys x 96 B ~ 3 MB of incompressible state
M64 = (1 << 64) - 1


def _mix(x):
    """splitmix64 finalizer on a uint64 array (wraps silently: arrays, not scalars)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def values_for(keys, i):
    """The value batch i writes for each key: WIDTH pseudo-random bytes."""
    k = np.asarray(keys, dtype=np.int64).astype(np.uint64)[:, None]
    j = np.arange(WIDTH // 8, dtype=np.uint64)[None, :]
    salt = np.uint64((i * 0xD1B54A32D192ED03) & M64)
    words = _mix(k * np.uint64(0x9E3779B97F4A7C15) + j + salt)
    return np.ascontiguousarray(words.astype("<u8")).view(np.uint8).reshape(len(k), WIDTH)


def updates(i):
    """Batch i: (keys put, keys then deleted). Batch 1 loads every key."""
    if i == 1:
        return np.arange(N_KEYS, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng([12345, i])
    return (rng.choice(N_KEYS, 600, replace=False).astype(np.int64),
            rng.choice(N_KEYS, 60, replace=False).astype(np.int64))


def apply_batch(db, i):
    """Applies batch i atomically, with state version i."""
    put, dels = updates(i)
    b = db.batch()
    b.put(put, values_for(put, i))
    b.delete(dels)
    db.write(b, version=i)
'''

CHILD = COMMON + r'''
import json
import os
import shutil
import sys
import time

import rhino


def log(f, *parts):
    f.write(" ".join(str(p) for p in parts) + "\n")
    f.flush()  # SIGKILL does not lose the page cache, so a flushed line is on record


def loop(cmd, store, logf):
    cur = cmd["db"]
    db = rhino.StateBackend.open(cur, create=False)
    i = db.version + 1
    log(logf, "READY", i)
    deadline = time.monotonic() + 30  # never outlive a parent that forgot us
    while time.monotonic() < deadline:
        apply_batch(db, i)
        log(logf, "WROTE", i)
        db.checkpoint(store, i)
        log(logf, "CKPT", i)
        if i % 3 == 0:  # move onto a hard-link restore of the checkpoint just taken
            new = os.path.join(cmd["live_root"], "live-%d" % i)
            log(logf, "RESTORING", i, new)
            db.close()
            db = store.restore(OP, INSTANCE, i, new)
            log(logf, "SWITCH", i, new)
            shutil.rmtree(cur)
            cur = new
        elif i % 4 == 1:  # restore the oldest retained checkpoint somewhere else
            j = store.checkpoints(OP, INSTANCE)[0]
            scratch = os.path.join(cmd["scratch"], "s-%d" % i)
            log(logf, "SCRATCH", j, scratch)
            store.restore(OP, INSTANCE, j, scratch).close()
            log(logf, "SCRATCHED", j, scratch)
            shutil.rmtree(scratch)
        i += 1


def main():
    with open(sys.argv[1]) as f:
        cmd = json.load(f)
    logf = open(cmd["log"], "a")
    store = rhino.ReplicaStore(cmd["store"])
    if cmd["op"] == "checkpoint":
        db = rhino.StateBackend.open(cmd["db"], create=False)
        apply_batch(db, cmd["id"])
        log(logf, "WROTE", cmd["id"])
        db.checkpoint(store, cmd["id"])
        log(logf, "CKPT", cmd["id"])
    elif cmd["op"] == "restore":
        log(logf, "RESTORING", cmd["id"])
        store.restore(OP, INSTANCE, cmd["id"], cmd["target"]).close()
        log(logf, "RESTORED", cmd["id"])
    elif cmd["op"] == "loop":
        loop(cmd, store, logf)
    else:
        raise SystemExit("unknown op " + cmd["op"])


main()
'''

W: dict = {}
exec(compile(COMMON, "<crash-workload>", "exec"), W)  # the parent's copy of the workload
OP, INSTANCE, N_KEYS, WIDTH = W["OP"], W["INSTANCE"], W["N_KEYS"], W["WIDTH"]
values_for, updates, apply_batch = W["values_for"], W["updates"], W["apply_batch"]

K, V = 64, 8
PART = rhino.Partitioner(num_key_groups=K, num_vnodes=V)

CHECKPOINT_POINTS = [
    "checkpoint.after_rocksdb_checkpoint",
    "checkpoint.mid_pool",
    "checkpoint.before_manifest",
    "checkpoint.mid_manifest",
    "checkpoint.before_link_manifest",
    "checkpoint.after_commit",
]
RESTORE_POINTS = ["restore.mid_files", "restore.before_rename"]
SRC = Path(__file__).resolve().parents[1] / "src" / "cpp"


# ---------------------------------------------------------------- the model


class Model:
    """last[i][k] = the batch that last wrote key k after batches 1..i, or -1 if absent."""

    def __init__(self) -> None:
        self.last = {0: np.full(N_KEYS, -1, dtype=np.int64)}

    def last_writer(self, i: int) -> np.ndarray:
        top = max(j for j in self.last if j <= i)
        cur = self.last[top].copy()
        for j in range(top + 1, i + 1):
            put, dels = updates(j)
            cur[put] = j
            cur[dels] = -1
            self.last[j] = cur.copy()
        return cur

    def expected_values(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        last = self.last_writer(i)
        keys = np.arange(N_KEYS, dtype=np.int64)
        exp = np.zeros((N_KEYS, WIDTH), dtype=np.uint8)
        for j in np.unique(last[last >= 0]):
            sel = last == j
            exp[sel] = values_for(keys[sel], int(j))
        return last >= 0, exp

    def check_backend(self, db: rhino.StateBackend, i: int) -> None:
        """Reads all of `db` through Rhino and compares it with the state after batch i."""
        present, exp = self.expected_values(i)
        out, mask = db.get_batch_array(np.arange(N_KEYS, dtype=np.int64), WIDTH)
        assert np.array_equal(mask, present), f"key set differs from batch {i}"
        assert np.array_equal(out[mask], exp[mask]), f"values differ from batch {i}"
        assert sum(db.count(v) for v in db.vnodes) == int(present.sum())  # no stray keys
        assert db.vnodes == list(range(V))
        assert db.version == i

    def check_dir_with_rocksdict(self, path: str, i: int) -> None:
        """Reads a RocksDB directory with rocksdict (independent reader) and compares."""
        present, exp = self.expected_values(i)
        opts = rocksdict.Options(raw_mode=True)
        names = rocksdict.Rdict.list_cf(path, opts)
        assert sorted(names) == sorted(["default"] + ["vnode-%05d" % v for v in range(V)])
        db = rocksdict.Rdict(path, options=opts, access_type=rocksdict.AccessType.read_only(),
                             column_families={n: rocksdict.Options(raw_mode=True) for n in names if n != "default"})
        seen = np.zeros(N_KEYS, dtype=bool)
        try:
            version = db.get(b"rhino:version")
            assert version is not None and struct.unpack("<Q", bytes(version))[0] == i
            for n in names:
                if n == "default":
                    continue
                cf = db.get_column_family(n)
                vnode = int(n[len("vnode-"):])
                for kb, val in cf.items():
                    kb = bytes(kb)
                    k = struct.unpack("<q", kb)[0]
                    assert (xxhash.xxh3_64_intdigest(kb) >> (64 - 6)) * V // K == vnode, "key in the wrong vnode"
                    assert 0 <= k < N_KEYS and not seen[k]
                    assert bytes(val) == exp[k].tobytes(), f"value of key {k} differs from batch {i}"
                    seen[k] = True
                del cf
        finally:
            db.close()
        assert np.array_equal(seen, present), f"key set differs from batch {i}"


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


# ---------------------------------------------------------------- helpers


def run_child(tmp_path: Path, cmd: dict, crash_point: str | None, timeout: float = 60) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    if not script.exists():
        script.write_text(CHILD)
    cmd_file = tmp_path / f"cmd-{time.monotonic_ns()}.json"
    cmd_file.write_text(json.dumps(cmd))
    env = dict(os.environ)
    env.pop("RHINO_CRASH_POINT", None)
    if crash_point is not None:
        env["RHINO_CRASH_POINT"] = crash_point
    return subprocess.run([sys.executable, str(script), str(cmd_file)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def pool_files(store_dir: Path) -> set[str]:
    return set(os.listdir(store_dir / "pool"))


def referenced(store: rhino.ReplicaStore) -> set[str]:
    return {f.identity for c in store.checkpoints(OP, INSTANCE) for f in store.manifest(OP, INSTANCE, c).files}


def manifest_temporaries(store_dir: Path) -> list[str]:
    d = store_dir / "checkpoints" / OP / str(INSTANCE)
    return [n for n in os.listdir(d) if ".manifest.tmp-" in n] if d.is_dir() else []


def check_restores(store: rhino.ReplicaStore, model: Model, ids, where: Path, tag: str) -> None:
    """Every checkpoint in `ids` restores, through Rhino and (read by rocksdict) as plain files."""
    for c in ids:
        target = where / f"{tag}-restore-{c}"
        db = store.restore(OP, INSTANCE, c, str(target), verify="full")
        try:
            model.check_backend(db, c)
        finally:
            db.close()
        files = where / f"{tag}-files-{c}"
        store.restore_files(OP, INSTANCE, c, str(files))
        model.check_dir_with_rocksdict(str(files), c)
        shutil.rmtree(target)
        shutil.rmtree(files)


def make_base(tmp_path: Path) -> tuple[Path, Path]:
    """A store with checkpoints 1 and 2 of a live DB that has batches 1 and 2 applied."""
    store_dir, live = tmp_path / "store", tmp_path / "live"
    store = rhino.ReplicaStore(str(store_dir))
    db = rhino.StateBackend.open(str(live), partitioner=PART, operator_id=OP, instance=INSTANCE)
    for i in (1, 2):
        apply_batch(db, i)
        m = db.checkpoint(store, i)
        assert m.version == i
    db.close()
    return store_dir, live


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


def read_log(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


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
    env = {k: v for k, v in os.environ.items() if k != "RHINO_CRASH_POINT"}
    deadline = time.monotonic() + 60
    trials = 0
    outcomes: set[str] = set()

    while trials < 16 and (trials < 8 or time.monotonic() < deadline):
        trials += 1
        log = tmp_path / f"log-{trials}"
        cmd_file = tmp_path / f"cmd-{trials}.json"
        cmd_file.write_text(json.dumps({"op": "loop", "db": str(cur), "store": str(store_dir), "log": str(log),
                                        "live_root": str(live_root), "scratch": str(scratch)}))
        proc = subprocess.Popen([sys.executable, str(script), str(cmd_file)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            t0 = time.monotonic()
            while not any(e[0] == "READY" for e in read_log(log)):
                assert proc.poll() is None, f"child died before READY: {proc.stderr.read().decode()}"
                assert time.monotonic() - t0 < 30, "child never got READY"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 1.0))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()  # reaps it: the pid is gone before the store is reopened
        assert proc.returncode == -signal.SIGKILL, f"child did not die by SIGKILL: {err.decode()}"

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
