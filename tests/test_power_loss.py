"""Crash safety under power loss (issue 46, item 6).

A SIGKILL keeps the page cache: what the killed process wrote without fsync is still
read back, so a crash test with SIGKILL alone cannot find a missing fsync. These trials
run the crash-safety workload of tests/test_crash_safety.py on a filesystem that loses
every write not fsynced when its "machine" loses power
(``rhino_testing.harness.power_loss_fs``: FUSE over a backing directory, the daemon plays
the page cache and is SIGKILLed with it). After every kill the machine loses power, and
then, against the NumPy model (read back through Rhino and through rocksdict):

- every checkpoint whose ``checkpoint()`` returned is visible, verifies, and restores
  with exactly its contents; one that never committed is never visible;
- the live DB reopens at a batch the model knows (RocksDB's WAL tail may be lost: the
  live DB is not the durable copy, its checkpoints are), or refuses to open by name;
- the store's GC and a retried checkpoint go on as after a plain SIGKILL.

The layer also undoes every namespace change (create, mkdir, link, rename, unlink)
whose directory was not fsynced. First, the layer's own behaviour, so that a trial that
passes is known to have run on a layer that loses; last, three workers, each on its own
"machine", losing power around commits and a takeover.

``RHINO_POWER_LOSS_TRIALS`` sets the random-time trials (6 in ``make test``, more in
``make chaos``); ``RHINO_CRASH_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path

import pytest

import rhino
from crash_workload import (CHILD, INSTANCE, OP, PART, Model, apply_batch, check_restores, kill_loop_child,
                            make_base, pool_files, read_log, referenced, run_child)
from rhino_testing.harness.power_loss_fs import PowerLossMount, available
from test_service_takeover import OP as SVC_OP
from test_service_takeover import kb as _kb
from test_service_takeover import run_batch as _run_batch  # a batch committed on the chain; the model follows
from test_service_takeover import state_through as _state

CHECKPOINT_POINTS = ["checkpoint.after_rocksdb_checkpoint", "checkpoint.before_manifest",
                     "checkpoint.before_link_manifest", "checkpoint.after_commit"]

why_not = available()
if why_not and os.environ.get("CI") != "true":
    pytest.skip(f"the power-loss filesystem cannot run here: {why_not}", allow_module_level=True)


@pytest.fixture
def machine(tmp_path):
    """A power-loss mount at tmp_path/mnt over tmp_path/backing; unmounted at the end."""
    with PowerLossMount(tmp_path / "backing", tmp_path / "mnt") as m:
        yield m


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


# ---------------------------------------------------------------- the layer itself


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_the_layer_loses_exactly_the_data_not_fsynced(machine):
    mnt = machine.mountpoint
    (mnt / "never").write_bytes(b"lost")
    fd = os.open(mnt / "synced", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"kept")
    os.fsync(fd)
    os.write(fd, b"-lost")
    os.close(fd)
    os.link(mnt / "synced", mnt / "linked")  # a hard link shares the buffered data
    fd = os.open(mnt / "shrunk", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"0123456789")
    os.fsync(fd)
    os.ftruncate(fd, 3)  # a truncation not synced is undone too
    os.close(fd)
    _fsync_dir(mnt)  # the entries are durable; of the data, only what was fsynced
    assert (mnt / "linked").read_bytes() == b"kept-lost"
    assert os.stat(mnt / "linked").st_ino == os.stat(mnt / "synced").st_ino
    assert os.stat(mnt / "linked").st_nlink == 2
    assert (mnt / "shrunk").read_bytes() == b"012"

    machine.power_loss()

    assert (mnt / "never").read_bytes() == b""
    assert (mnt / "synced").read_bytes() == b"kept"
    assert (mnt / "linked").read_bytes() == b"kept"
    assert (mnt / "shrunk").read_bytes() == b"0123456789"
    # fdatasync counts as a sync, and a file synced after a power loss stays
    fd = os.open(mnt / "never", os.O_WRONLY)
    os.write(fd, b"now")
    os.fdatasync(fd)
    os.close(fd)
    machine.power_loss()
    assert (mnt / "never").read_bytes() == b"now"
    assert machine.crashes == 2


def test_the_layer_undoes_the_namespace_changes_whose_directory_was_not_fsynced(machine):
    mnt = machine.mountpoint
    (mnt / "d").mkdir()
    for name in ("old", "gone", "target"):
        fd = os.open(mnt / "d" / name, os.O_CREAT | os.O_WRONLY, 0o600)
        os.write(fd, name.encode())
        os.fsync(fd)
        os.close(fd)
    _fsync_dir(mnt / "d")
    _fsync_dir(mnt)
    # not durable: a new file, an unlink, a rename over another file, a new directory with a
    # synced file in it, and a hard link
    fd = os.open(mnt / "d" / "new", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"new")
    os.fsync(fd)  # its data, but not its entry
    os.close(fd)
    os.unlink(mnt / "d" / "gone")
    os.rename(mnt / "d" / "old", mnt / "d" / "target")
    (mnt / "e").mkdir()
    (mnt / "e" / "f").write_bytes(b"f")
    _fsync_dir(mnt / "e")  # e's entry in the root is still not durable
    os.link(mnt / "d" / "target", mnt / "link")
    assert os.stat(mnt / "d" / "target").st_nlink == 2
    assert sorted(os.listdir(mnt / "d")) == ["new", "target"]

    machine.power_loss()

    assert sorted(os.listdir(mnt)) == ["d"]
    assert sorted(os.listdir(mnt / "d")) == ["gone", "old", "target"]
    assert [(mnt / "d" / n).read_bytes() for n in ("gone", "old", "target")] == [b"gone", b"old", b"target"]
    assert os.stat(mnt / "d" / "target").st_nlink == 1
    # and once the directory is fsynced, the same changes stay
    os.rename(mnt / "d" / "old", mnt / "d" / "target")
    os.unlink(mnt / "d" / "gone")
    _fsync_dir(mnt / "d")
    machine.power_loss()
    assert sorted(os.listdir(mnt / "d")) == ["target"] and (mnt / "d" / "target").read_bytes() == b"old"


def test_rocksdb_without_a_synced_wal_loses_its_tail_on_the_layer(machine):
    """The layer is seen to lose data a RocksDB user did not sync (so the trials below can fail):
    batch 2, written to the WAL without sync, is gone after the power loss; batch 1, in a
    checkpoint (flushed and synced), is not."""
    store_dir, live = machine.mountpoint / "store", machine.mountpoint / "live"
    store = rhino.ReplicaStore(str(store_dir))
    db = rhino.StateBackend.open(str(live), partitioner=PART, operator_id=OP, instance=INSTANCE)
    apply_batch(db, 1)
    db.checkpoint(store, 1)
    apply_batch(db, 2)
    assert db.version == 2
    db.close()  # a clean close flushes nothing to disk that was not synced
    machine.power_loss()
    db = rhino.StateBackend.open(str(live), partitioner=PART, create=False)
    try:
        assert db.version == 1
    finally:
        db.close()


def test_on_a_disk_that_ignores_fsync_the_trials_checks_fail(tmp_path, model):
    """The checks below can fail: on a layer whose fsync keeps nothing (a lying disk), a
    power loss takes committed checkpoints with it, and the store says so by name (missing,
    failing verification, or refusing to restore), never by restoring other contents."""
    with PowerLossMount(tmp_path / "backing", tmp_path / "mnt", honour_fsync=False) as liar:
        store_dir, _ = make_base(liar.mountpoint)
        liar.power_loss()
        caught = []
        try:
            store = rhino.ReplicaStore(str(store_dir))
            if store.checkpoints(OP, INSTANCE) != [1, 2]:
                caught.append(f"visible {store.checkpoints(OP, INSTANCE)}")
            report = store.verify(full=True)
            if not report.ok:
                caught.append(f"verify: {report.problems[:2]}")
            for c in store.checkpoints(OP, INSTANCE):
                try:
                    db = store.restore(OP, INSTANCE, c, str(liar.mountpoint / f"r{c}"), verify="full")
                except rhino.RhinoError as e:
                    caught.append(f"restore {c}: {type(e).__name__}")
                    continue
                model.check_backend(db, c)  # a restore that succeeds must have the right contents
                db.close()
        except rhino.RhinoError as e:
            caught.append(f"{type(e).__name__}: {e}")
        assert caught, "committed checkpoints survived a disk that kept nothing: the layer did not lose"


# ---------------------------------------------------------------- crash points, then power loss


def _open_live_or_refuse(live: Path, allowed: set[int], model: Model, ctx: str = ""):
    """The live DB after a power loss: open at a version in ``allowed`` whose contents equal the
    model's, or a named refusal. Returns the open DB or None."""
    try:
        db = rhino.StateBackend.open(str(live), partitioner=PART, create=False)
    except rhino.RhinoError as e:  # a clear refusal to start is allowed; silent loss is not
        assert str(e), "a refusal must say why"
        return None
    assert db.version in allowed, (db.version, sorted(allowed), ctx)
    model.check_backend(db, db.version)
    return db


@pytest.mark.parametrize("point", CHECKPOINT_POINTS)
def test_power_loss_during_checkpoint(tmp_path, machine, model, point):
    store_dir, live = make_base(machine.mountpoint)
    work = tmp_path / "work"
    work.mkdir()
    r = run_child(work, {"op": "checkpoint", "db": str(live), "store": str(store_dir), "id": 3,
                         "log": str(work / "log")}, crash_point=point)
    assert r.returncode == -signal.SIGKILL, f"crash point {point} not reached: rc={r.returncode}\n{r.stderr}"
    machine.power_loss()

    store = rhino.ReplicaStore(str(store_dir))
    committed = point == "checkpoint.after_commit"
    assert store.checkpoints(OP, INSTANCE) == ([1, 2, 3] if committed else [1, 2])
    report = store.verify(full=True)
    assert report.ok, report.problems
    check_restores(store, model, store.checkpoints(OP, INSTANCE), tmp_path, "after-power-loss")
    store.gc()
    assert pool_files(store_dir) == referenced(store)
    assert store.verify(full=True).ok

    # The live DB: batch 3 was written to its WAL unsynced; the RocksDB checkpoint of 3
    # flushed and synced it. Either version, equal to the model's, or a named refusal.
    db = _open_live_or_refuse(live, {2, 3}, model)
    if db is not None:
        db.close()

    # A re-executed batch 3 (docs/design.md §5) restores the last committed checkpoint and
    # checkpoints 3 again: refused by name iff 3 had committed.
    retry = store.restore(OP, INSTANCE, 2, str(machine.mountpoint / "retry"))
    apply_batch(retry, 3)
    if committed:
        with pytest.raises(rhino.AlreadyExistsError):
            retry.checkpoint(store, 3)
    else:
        retry.checkpoint(store, 3)
    retry.close()
    machine.power_loss()  # and the retry's checkpoint, returned, survives the next one
    store = rhino.ReplicaStore(str(store_dir))
    assert store.checkpoints(OP, INSTANCE) == [1, 2, 3]
    check_restores(store, model, [3], tmp_path, "retried")


# ---------------------------------------------------------------- random-time kills, then power loss


def test_power_loss_at_random_times(tmp_path, machine, model):
    """The looping child of test_crash_safety (update, checkpoint, restore-and-switch or a
    scratch restore) SIGKILLed at a random instant, then the power lost; every invariant
    checked; the next child starts on what the power loss left."""
    rng = random.Random(int(os.environ.get("RHINO_CRASH_SEED", "20261207")))
    trials_wanted = int(os.environ.get("RHINO_POWER_LOSS_TRIALS", "6"))
    mnt = machine.mountpoint
    store_dir, live_root, scratch = mnt / "store", mnt / "lives", mnt / "scratch"
    live_root.mkdir()
    scratch.mkdir()
    cur = live_root / "live-0"
    store = rhino.ReplicaStore(str(store_dir))
    db = rhino.StateBackend.open(str(cur), partitioner=PART, operator_id=OP, instance=INSTANCE)
    apply_batch(db, 1)
    db.checkpoint(store, 1)
    db.close()
    visible = {1}  # checkpoints known committed (after our own retention)
    version = 1  # the live DB's version before each trial
    logs = tmp_path / "logs"  # off the layer: what the child was told is the record
    logs.mkdir()
    script = logs / "child.py"
    script.write_text(CHILD)
    outcomes: set[str] = set()

    for trial in range(1, trials_wanted + 1):
        log = logs / f"log-{trial}"
        kill_loop_child(script, {"op": "loop", "db": str(cur), "store": str(store_dir), "log": str(log),
                                 "live_root": str(live_root), "scratch": str(scratch)},
                        logs / f"cmd-{trial}.json", rng.uniform(0.0, 2.0), ready_timeout_s=60)
        machine.power_loss()

        entries = read_log(log)
        assert entries[0] == ["READY", str(version + 1)]
        wrote = [int(e[1]) for e in entries if e[0] == "WROTE"]
        ckpts = [int(e[1]) for e in entries if e[0] == "CKPT"]
        outcomes.add(entries[-1][0])

        # 1. Every checkpoint that returned is visible; at most the one in flight besides.
        store = rhino.ReplicaStore(str(store_dir))
        in_flight = {wrote[-1]} if wrote and (not ckpts or ckpts[-1] != wrote[-1]) else set()
        now = set(store.checkpoints(OP, INSTANCE))
        assert visible | set(ckpts) <= now <= visible | set(ckpts) | in_flight, (sorted(now), entries[-3:])
        report = store.verify(full=True)
        assert report.ok, report.problems
        check = {max(now), rng.choice(sorted(now))}
        for c in sorted(check):
            db = store.restore(OP, INSTANCE, c, str(mnt / f"check-{trial}-{c}"), verify="full")
            model.check_backend(db, c)
            db.close()
            shutil.rmtree(mnt / f"check-{trial}-{c}")
        files = tmp_path / f"files-{trial}"
        store.restore_files(OP, INSTANCE, max(now), str(files))
        model.check_dir_with_rocksdict(str(files), max(now))
        shutil.rmtree(files)

        # 2. The live DB: the one switched to last (a restore whose SWITCH was logged), at a
        # batch the model knows, no later than the last written. It may be behind its newest
        # checkpoint: a checkpoint with a small WAL copies the WAL into the store, synced, and
        # leaves the live one unsynced (checkpoint_wal_bytes). Then, or if it refuses to open,
        # it is rebuilt from the newest checkpoint, as a worker's HostedInstance::Recover does.
        switches = [e for e in entries if e[0] == "SWITCH"]
        if switches:
            cur = Path(switches[-1][2])
        top = wrote[-1] if wrote else version
        db = _open_live_or_refuse(cur, set(range(1, top + 2)), model,
                                  f"trial {trial}: {entries[-4:]}, checkpoints {sorted(now)}")
        if db is None or db.version < max(now):
            outcomes.add("live DB refused" if db is None else "live DB behind its checkpoint")
            if db is not None:
                db.close()
            cur = live_root / f"rebuilt-{trial}"
            db = store.restore(OP, INSTANCE, max(now), str(cur))
            model.check_backend(db, max(now))
        version = db.version
        db.close()

        # 3. Retention and GC keep what the retained checkpoints reference.
        removed = store.retain(OP, INSTANCE, 4)
        store.gc()
        visible = set(store.checkpoints(OP, INSTANCE))
        assert visible == now - set(removed)
        assert pool_files(store_dir) == referenced(store)
        assert store.verify(full=True).ok
        for n in os.listdir(live_root):
            if live_root / n != cur:
                shutil.rmtree(live_root / n)
        for n in os.listdir(scratch):
            shutil.rmtree(scratch / n)

    assert machine.crashes == trials_wanted
    assert outcomes & {"WROTE", "RESTORING", "SCRATCH", "CKPT", "SWITCH", "SCRATCHED"}, outcomes


# ---------------------------------------------------------------- workers: commits, takeover


HOSTS = (240, 241, 242)  # 127.0.0.N of the workers below (tests/test_test_hosts.py)


@pytest.fixture
def hosts(tmp_path):
    """Three workers, each on its own machine: its store on its own power-loss mount."""
    import contextlib

    from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

    secret_file = write_secret(tmp_path, SECRET)
    with contextlib.ExitStack() as stack:
        machines = [stack.enter_context(PowerLossMount(tmp_path / f"backing-{n}", tmp_path / f"host-{n}"))
                    for n in HOSTS]
        workers = [WorkerProcess(m.mountpoint, f"w{n}", f"127.0.0.{n}", secret_file=secret_file,
                                 metrics=False).start() for m, n in zip(machines, HOSTS)]
        try:
            yield list(zip(workers, machines))
        finally:
            for w in workers:
                w.kill()


def test_committed_batches_survive_every_machine_losing_power(hosts):
    """Batches committed on a chain of three (r = 2); then every machine loses power at once.
    After the restart the primary serves the last committed batch with the model's state,
    and a replica takes the instance over from its own copy with the same state."""
    import numpy as np

    from rhino_testing.harness.workers import SECRET

    (a, ma), (b, mb), (c, mc) = hosts
    rng = np.random.default_rng(46)
    model: dict = {}
    e = 2
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    ca.open_instance(SVC_OP, 0, epoch=e, num_vnodes=16, chain=[b.address, c.address], chain_version=1)
    for batch in range(5):  # batch 0 is large enough to flush SSTs; the others ride in the WAL
        _run_batch(ca, batch, e, model, rng, value_bytes=4096 if batch == 0 else 40)
    ca.close()
    for w, m in hosts:
        w.kill()
        m.power_loss()
    for w, _ in hosts:
        w.start()

    ca = rhino.connect(a.unix_socket, secret=SECRET)
    info = {i["instance"]: i for i in ca.instances() if i["operator_id"] == SVC_OP}
    assert info[0]["version"] == 4, info
    assert _state(ca, 5, e) == model
    for w in (b, c):
        store = rhino.ReplicaStore(str(w.dir))
        assert store.checkpoints(SVC_OP, 0)[-1] == 4
        assert store.verify(full=True).ok
    ca.fence(SVC_OP, 0, epoch=e + 1)
    ca.close()
    cb = rhino.connect(b.unix_socket, secret=SECRET)
    taken = cb.takeover(SVC_OP, 0, epoch=e + 1, chain=[c.address], chain_version=2)
    assert taken["checkpoint"] == 4 and taken["version"] == 4
    assert _state(cb, 5, e + 1) == model
    _run_batch(cb, 5, e + 1, model, rng)
    assert _state(cb, 6, e + 1) == model
    cb.close()


@pytest.mark.parametrize("point", ["service.after_write", "service.after_checkpoint"])
def test_a_primary_killed_inside_a_commit_then_without_power(hosts, point):
    """SIGKILL inside commit(batch 1), then the primary's machine loses power: the restarted
    worker serves version 0 or 1 with that version's state (never a mix), batch 1 runs
    again and commits, and the replicas end with the model's state."""
    import numpy as np

    from rhino_testing.harness.workers import SECRET

    (a, ma), (b, _), (c, _) = hosts
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    ca.open_instance(SVC_OP, 0, epoch=1, num_vnodes=8, chain=[b.address, c.address], chain_version=1)
    keys = np.arange(500, dtype=np.int64)
    with ca.session(SVC_OP, 0, batch=0, epoch=1) as s:
        s.put_batch(keys, [b"zero"] * 500)
        s.commit()
    ca.close()
    a.stop()
    a.env = {"RHINO_CRASH_POINT": point}
    a.start()
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    s = ca.session(SVC_OP, 0, batch=1, epoch=1)
    s.put_batch(keys[:100], [b"one"] * 100)
    with pytest.raises((rhino.PeerDeadError, rhino.AbortedError, rhino.RhinoTimeoutError)):
        s.commit()
    a.proc.wait(timeout=30)
    assert a.proc.returncode == -9
    ca.close()
    ma.power_loss()
    a.env = None
    a.start()
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    info = {i["instance"]: i for i in ca.instances() if i["operator_id"] == SVC_OP}
    assert info[0]["version"] in (0, 1), info
    with ca.session(SVC_OP, 0, batch=1, epoch=1) as s:
        assert s.version == 0  # batch 1 runs again on the state of batch 0, whatever was left
        assert s.get_batch(keys[:101]) == [b"zero"] * 101
        s.put_batch(keys[:100], [b"again"] * 100)
        assert s.commit().replication == "complete"
    ca.close()
    model = {_kb(k): (b"again" if k < 100 else b"zero") for k in keys}
    from rhino_testing.harness.workers import read_rocksdb

    for w in (b, c):
        store = rhino.ReplicaStore(str(w.dir))
        assert store.checkpoints(SVC_OP, 0)[-1] == 1
        target = w.dir.parent / f"read-{w.id}"
        store.restore(SVC_OP, 0, 1, str(target)).close()
        got = {k: v for n, cf in read_rocksdb(target).items() if n.startswith("vnode-") for k, v in cf.items()}
        assert got == model


def test_a_takeover_then_the_new_primary_loses_power(hosts):
    """B takes the instance over (its directory built and opened without fsyncs, made durable
    afterwards: protocol.md §7.1), runs one batch, and loses power right away. Restarted, B
    serves the last committed batch with the model's state, rebuilt from its store if the
    live directory did not survive, and goes on."""
    import numpy as np

    from rhino_testing.harness.workers import SECRET

    (a, _), (b, mb), (c, _) = hosts
    rng = np.random.default_rng(48)
    model: dict = {}
    e = 5
    ca = rhino.connect(a.unix_socket, secret=SECRET)
    ca.open_instance(SVC_OP, 0, epoch=e, num_vnodes=16, chain=[b.address, c.address], chain_version=1)
    for batch in range(3):
        _run_batch(ca, batch, e, model, rng, value_bytes=4096 if batch == 0 else 40)
    ca.close()
    a.kill()
    cb = rhino.connect(b.unix_socket, secret=SECRET)
    taken = cb.takeover(SVC_OP, 0, epoch=e + 1, chain=[c.address], chain_version=2)
    assert taken["checkpoint"] == 2
    _run_batch(cb, 3, e + 1, model, rng)
    cb.close()
    b.kill()
    mb.power_loss()
    b.start()
    cb = rhino.connect(b.unix_socket, secret=SECRET)
    info = {i["instance"]: i for i in cb.instances() if i["operator_id"] == SVC_OP}
    assert info[0]["version"] == 3 and info[0]["epoch"] == e + 1, info
    assert _state(cb, 4, e + 1) == model
    _run_batch(cb, 4, e + 1, model, rng)
    assert _state(cb, 5, e + 1) == model
    cb.close()
