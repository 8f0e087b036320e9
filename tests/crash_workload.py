"""The crash-trial workload shared by tests/test_crash_safety.py (SIGKILL) and
tests/test_power_loss.py (SIGKILL, then the page cache lost too): a child process that
applies pseudo-random batches to real RocksDB state and checkpoints them, the parent's
copy of the same workload, and a model of the state after each batch computed in NumPy
(never by the code under test), read back through Rhino and through rocksdict.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
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


def read_log(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def kill_loop_child(script: Path, cmd: dict, cmd_file: Path, delay_s: float, ready_timeout_s: float = 30) -> None:
    """Starts the looping child (CHILD's ``loop``) and SIGKILLs it ``delay_s`` after it is READY;
    returns once it is reaped (its pid gone before the store is reopened)."""
    import signal

    cmd_file.write_text(json.dumps(cmd))
    env = {k: v for k, v in os.environ.items() if k != "RHINO_CRASH_POINT"}
    proc = subprocess.Popen([sys.executable, str(script), str(cmd_file)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = Path(cmd["log"])
    try:
        t0 = time.monotonic()
        while not any(e[0] == "READY" for e in read_log(log)):
            assert proc.poll() is None, f"child died before READY: {proc.stderr.read().decode()}"
            assert time.monotonic() - t0 < ready_timeout_s, "child never got READY"
            time.sleep(0.005)
        time.sleep(delay_s)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"child did not die by SIGKILL: {err.decode()}"
