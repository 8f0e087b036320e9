"""Sessions beyond the model test's single instance: sessions of different
instances in parallel, async commits and their queryable completion, and a
worker killed inside a commit (crash points, a real SIGKILL) coming back at
the last acknowledged batch. Expected states come from dict models kept by
the test, and the replica's copy is read with rocksdict."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rhino
from rhino_testing.harness.workers import SECRET, WorkerProcess, read_rocksdb, write_secret


def kb(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path, SECRET)


def vnode_state(path: Path) -> dict[bytes, bytes]:
    return {k: v for n, cf in read_rocksdb(path).items() if n.startswith("vnode-") for k, v in cf.items()}


def test_sessions_of_different_instances_run_in_parallel(tmp_path: Path, secret_file: Path) -> None:
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        setup = rhino.connect(w.unix_socket, secret=SECRET)
        for i in range(3):
            setup.open_instance("par", i, epoch=1, num_vnodes=16)
        setup.close()
        spans: dict[int, list[tuple[float, float]]] = {i: [] for i in range(3)}
        models: dict[int, dict[bytes, bytes]] = {i: {} for i in range(3)}
        errors: list[BaseException] = []
        start = threading.Barrier(3)

        def run(i: int) -> None:
            try:
                rng = np.random.default_rng(i)
                with rhino.connect(w.unix_socket, secret=SECRET) as c:
                    start.wait()
                    for b in range(6):
                        t0 = time.monotonic()
                        with c.session("par", i, batch=b, epoch=1) as s:
                            keys = rng.choice(5000, size=2000, replace=False).astype(np.int64)
                            values = [bytes([i, b]) * 20 for _ in keys]
                            s.put_batch(keys, values)
                            assert s.get_batch(keys[:5]) == values[:5]
                            s.commit()
                        spans[i].append((t0, time.monotonic()))
                        models[i].update({kb(k): v for k, v in zip(keys, values)})
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        # Sessions of different instances were open at the same time on the one worker.
        overlaps = sum(1 for i in range(3) for j in range(i + 1, 3) for a in spans[i] for b in spans[j]
                       if a[0] < b[1] and b[0] < a[1])
        assert overlaps > 0
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            for i in range(3):
                with c.session("par", i, batch=6, epoch=1) as s:
                    assert dict(s.scan(page_size=700)) == models[i]
    finally:
        w.stop()


def test_async_commit_completes_on_the_chain(tmp_path: Path, secret_file: Path) -> None:
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    w3 = WorkerProcess(tmp_path, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("asy", 0, epoch=1, num_vnodes=8, chain=[w3.address], chain_version=1)
        model: dict[bytes, bytes] = {}
        for b in range(4):
            with c.session("asy", 0, batch=b, epoch=1) as s:
                keys = np.arange(b * 100, b * 100 + 3000, dtype=np.int64)
                s.put_batch(keys, [b"a%d" % b] * len(keys))
                r = s.commit("async")
            assert r.replication == "pending" and r.version == b
            model.update({kb(k): b"a%d" % b for k in keys})
        deadline = time.monotonic() + 30
        while c.status("asy", 0, checkpoint=3)["replication"] != "complete":
            assert time.monotonic() < deadline, c.status("asy", 0, checkpoint=3)
            time.sleep(0.05)
        st = c.status("asy", 0, checkpoint=3)
        assert st["last_complete"] == 3 and st["replications_pending"] == 0
        store = rhino.ReplicaStore(str(w3.dir))
        assert store.checkpoints("asy", 0) == [0, 1, 2, 3]  # one at a time, in order, every one
        store.restore("asy", 0, 3, str(tmp_path / "r3")).close()
        assert vnode_state(tmp_path / "r3") == model
        c.close()
    finally:
        w2.stop()
        w3.stop()


SERVICE_CRASH_POINTS = ["service.after_write", "service.after_checkpoint"]


def test_every_service_crash_point_is_covered() -> None:
    """The list above names every CrashPoint("...") of src/cpp/service/, so a new one is not missed."""
    src = Path(__file__).resolve().parent.parent / "src" / "cpp" / "service"
    if not src.is_dir():
        pytest.skip("C++ sources not present")
    found = set()
    for p in src.rglob("*.cc"):
        found |= set(re.findall(r'CrashPoint\("([^"]+)"\)', p.read_text()))
    assert found == set(SERVICE_CRASH_POINTS)


@pytest.mark.parametrize("point", SERVICE_CRASH_POINTS)
def test_worker_killed_inside_a_commit(tmp_path: Path, secret_file: Path, point: str) -> None:
    """SIGKILL inside commit(batch 1): the client gets no ack, the restarted worker
    serves version 0, and batch 1 runs again and commits, on the chain too."""
    w3 = WorkerProcess(tmp_path, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("crash", 0, epoch=1, num_vnodes=8, chain=[w3.address], chain_version=1)
        keys = np.arange(500, dtype=np.int64)
        with c.session("crash", 0, batch=0, epoch=1) as s:
            s.put_batch(keys, [b"zero"] * 500)
            s.commit()
        c.close()
        # The same worker, restarted with the crash point armed.
        w2.stop()
        w2.env = {"RHINO_CRASH_POINT": point}
        w2.start()
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        s = c.session("crash", 0, batch=1, epoch=1)
        s.put_batch(keys[:100], [b"one"] * 100)
        with pytest.raises((rhino.PeerDeadError, rhino.AbortedError, rhino.RhinoTimeoutError)):
            s.commit()
        w2.proc.wait(timeout=30)
        assert w2.proc.returncode == -9  # it really was killed there
        c.close()
        w2.env = None
        w2.start()
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        info = {i["instance"]: i for i in c.instances() if i["operator_id"] == "crash"}
        assert info[0]["version"] == (0 if point == "service.after_write" else 1)
        # The task runs batch 1 again: it sees version 0 either way.
        with c.session("crash", 0, batch=1, epoch=1) as s:
            assert s.version == 0
            assert s.get_batch(keys[:101]) == [b"zero"] * 101
            s.put_batch(keys[:100], [b"again"] * 100)
            r = s.commit()
        assert r.replication == "complete"
        model = {kb(k): (b"again" if k < 100 else b"zero") for k in keys}
        store = rhino.ReplicaStore(str(w3.dir))
        assert store.checkpoints("crash", 0)[-1] == 1
        store.restore("crash", 0, 1, str(tmp_path / "r1")).close()
        assert vnode_state(tmp_path / "r1") == model
        c.close()
    finally:
        w2.env = None
        if w2.alive():
            w2.stop()
        w3.stop()


def test_batches_larger_than_a_frame(tmp_path: Path, secret_file: Path) -> None:
    """With 64 KiB frames, a 3 MB put, get and scan each take dozens of frames;
    a get's answers split where the values stop fitting and the rest is asked
    for again. Everything reads back as written, in order."""
    frame = 64 << 10
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False,
                      extra_args=["--max-frame-bytes", str(frame)]).start()
    try:
        c = rhino.connect(w.unix_socket, secret=SECRET, max_frame_bytes=frame)
        c.open_instance("big", 0, epoch=1, num_vnodes=8)
        rng = np.random.default_rng(5)
        keys = rng.permutation(20_000).astype(np.int64)
        values = [rng.bytes(int(n)) for n in rng.integers(50, 250, size=len(keys))]
        with c.session("big", 0, batch=0, epoch=1) as s:
            s.put_batch(keys, values)
            assert s.get_batch(keys) == values  # the session's own writes, many frames each way
            s.commit()
        model = {kb(k): v for k, v in zip(keys, values)}
        with c.session("big", 0, batch=1, epoch=1) as s:
            assert s.get_batch(keys) == values
            items = list(s.scan(page_size=1 << 20))  # pages cut by the frame, not by the page size
            assert dict(items) == model and len(items) == len(model)
            with pytest.raises(rhino.InvalidArgumentError, match="does not fit in a frame"):
                s.put_batch([1], [b"x" * frame])
            # an oversized entry after many that would fill frames of their own: refused before any
            # frame is sent, so nothing of the batch is written and the session goes on in step
            fresh = np.arange(10**6, 10**6 + 30_000, dtype=np.int64)
            with pytest.raises(rhino.InvalidArgumentError, match="entry 30000 .*nothing of this batch"):
                s.put_batch(list(fresh) + [7], [b"v" * 200] * len(fresh) + [b"x" * frame])
            with pytest.raises(rhino.InvalidArgumentError, match="key 30000 .*nothing was read"):
                s.get_batch([kb(k) for k in fresh] + [b"k" * frame])
            assert s.get_batch(fresh) == [None] * len(fresh)
            s.put_batch(fresh[:5], [b"ok"] * 5)
            assert s.get_batch(fresh[:6]) == [b"ok"] * 5 + [None]
        with pytest.raises(rhino.InvalidArgumentError):
            rhino.connect(w.unix_socket, secret=SECRET, max_frame_bytes=1024)  # below every message's size
        c.close()
    finally:
        w.stop()


def test_idle_session_is_aborted(tmp_path: Path, secret_file: Path) -> None:
    """A client that keeps its connection but sends nothing (a hung task) loses its
    session after --session-idle-timeout; nothing of it is visible, and the
    instance is free for the next session."""
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file,
                      extra_args=["--session-idle-timeout", "1"]).start()
    try:
        c = rhino.connect(w.unix_socket, secret=SECRET)
        c.open_instance("idle", 0, epoch=1, num_vnodes=8)
        s = c.session("idle", 0, batch=0, epoch=1)
        s.put_batch([1], [b"never"])
        time.sleep(2.5)
        with pytest.raises(rhino.AbortedError, match="session-idle-timeout"):
            s.put_batch([2], [b"late"])
        with c.session("idle", 0, batch=0, epoch=1) as s2:  # not SessionBusyError
            assert s2.get_batch([1, 2]) == [None, None]
        assert w.metric("rhino_session_expired_total", 'operator="idle",instance="0"') == 1
        c.close()
    finally:
        w.stop()


def test_arrow_in_and_out_of_a_session(tmp_path: Path, secret_file: Path) -> None:
    """Keys and values as pyarrow arrays in, values as a pyarrow binary array out
    (null where absent), as with StateBackend."""
    pa = pytest.importorskip("pyarrow")
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        with rhino.connect(w.unix_socket, secret=SECRET) as c:
            c.open_instance("arrow", 0, epoch=1, num_vnodes=8)
            keys = pa.array([b"k%d" % i for i in range(1000)], type=pa.binary())
            values = pa.array([b"v" * (i % 17) + b"%d" % i for i in range(1000)], type=pa.large_binary())
            with c.session("arrow", 0, batch=0, epoch=1) as s:
                s.put_batch(keys, values)
                s.delete_batch(pa.array([b"k3"]))
                s.commit()
            with c.session("arrow", 0, batch=1, epoch=1) as s:
                probe = pa.array([b"k1", b"k3", b"missing", b"k999"])
                got = s.get_batch_arrow(probe)
                assert got.type == pa.binary()
                assert got.to_pylist() == [values[1].as_py(), None, None, values[999].as_py()]
                assert s.get_batch_arrow(probe, large=True).type == pa.large_binary()
                assert s.get_batch_arrow(probe).to_pylist() == s.get_batch(probe)
    finally:
        w.stop()


def test_a_session_for_an_older_batch_at_the_same_epoch_is_refused(tmp_path: Path, secret_file: Path) -> None:
    """A zombie task of a superseded attempt: after batches 0, 1 and 2 committed at epoch 1, a
    session for batch 1 at epoch 1 is refused with StaleEpochError, and nothing moves: the
    primary's state, its store and the chain member's checkpoints stay at batch 2 (read with
    rocksdict from a restore of each checkpoint). Batch 2 itself may still run again."""
    w3 = WorkerProcess(tmp_path, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("zombie", 0, epoch=1, num_vnodes=8, chain=[w3.address], chain_version=1)
        keys = np.arange(300, dtype=np.int64)
        model: dict[bytes, bytes] = {}
        for b in range(3):
            with c.session("zombie", 0, batch=b, epoch=1) as s:
                vals = [f"b{b}".encode()] * (100 * (b + 1))
                s.put_batch(keys[:100 * (b + 1)], vals)
                assert s.commit().replication == "complete"
            model.update({kb(k): v for k, v in zip(keys[:100 * (b + 1)], vals)})
        for stale in (1, 0):
            with pytest.raises(rhino.StaleEpochError, match=f"batch {stale} .* only the last committed batch"):
                c.session("zombie", 0, batch=stale, epoch=1)
        info = {i["instance"]: i for i in c.instances() if i["operator_id"] == "zombie"}
        assert info[0]["version"] == 2
        for d in (w2.dir, w3.dir):
            store = rhino.ReplicaStore(str(d))
            assert store.checkpoints("zombie", 0)[-1] == 2
            store.restore("zombie", 0, 2, str(tmp_path / f"r-{d.name}")).close()
            assert vnode_state(tmp_path / f"r-{d.name}") == model
        # the last batch runs again as before (a Spark replay): back to version 1
        with c.session("zombie", 0, batch=2, epoch=1) as s:
            assert s.rolled_back and s.version == 1
            assert s.get_batch(keys[200:201]) == [None]
            s.abort()
        c.close()
    finally:
        w2.stop()
        w3.stop()


def test_the_attempt_fence_refuses_superseded_attempts_and_committed_batches(tmp_path: Path,
                                                                             secret_file: Path) -> None:
    """The attempt fence (protocol §7.2 step 1, issue 46): batches 0, 1 and 2 committed at
    epoch 1 by attempts 10, 11 and 12 (each showing the coordinator's committed batch).
    Then:

    - a session for batch 2 from attempt 11, superseded by 12 (a zombie task: the one-batch
      rollback alone would let it roll batch 2 back), is refused with StaleAttemptError;
    - after batch 3 (attempt 13) committed and batch 4's session (attempt 14) showed
      committed = 3, a session for batch 2 is refused by the committed batch, even with a
      higher token and an older ``committed`` of its own;

    and nothing moves: the primary's version, its store and the chain member's checkpoints,
    read with rocksdict from a restore of each, equal the model. The current attempt's
    sessions, and a replay of the committed batch, still open."""
    w3 = WorkerProcess(tmp_path, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("fence", 0, epoch=1, num_vnodes=8, chain=[w3.address], chain_version=1)
        keys = np.arange(300, dtype=np.int64)
        model: dict[bytes, bytes] = {}

        def commit(b: int, attempt: int) -> None:
            committed = b - 1 if b > 0 else None
            with c.session("fence", 0, batch=b, epoch=1, attempt=attempt, committed=committed) as s:
                vals = [f"b{b}".encode()] * 100
                s.put_batch(keys[100 * (b % 3):100 * (b % 3 + 1)], vals)
                assert s.commit().replication == "complete"
            model.update({kb(k): v for k, v in zip(keys[100 * (b % 3):100 * (b % 3 + 1)], vals)})

        def unchanged(version: int) -> None:
            info = {i["instance"]: i for i in c.instances() if i["operator_id"] == "fence"}
            assert info[0]["version"] == version
            for d in (w2.dir, w3.dir):
                store = rhino.ReplicaStore(str(d))
                assert store.checkpoints("fence", 0)[-1] == version
                out = tmp_path / f"r-{d.name}-{version}"
                store.restore("fence", 0, version, str(out)).close()
                assert vnode_state(out) == model

        for b in range(3):
            commit(b, attempt=10 + b)
        with pytest.raises(rhino.StaleAttemptError, match="attempt 11 for batch 2 .* attempt 12 has begun since"):
            c.session("fence", 0, batch=2, epoch=1, attempt=11, committed=1)
        unchanged(2)
        # attempt 12 itself may run batch 2 again (a retried task): back to version 1
        with c.session("fence", 0, batch=2, epoch=1, attempt=12, committed=1) as s:
            assert s.rolled_back and s.version == 1
            s.abort()
        commit(2, attempt=12)  # as it was: the model does not change
        commit(3, attempt=13)
        with c.session("fence", 0, batch=4, epoch=1, attempt=14, committed=3) as s:
            s.abort()  # batch 4 began: the coordinator holds batch 3 committed
        for attempt in (15, None):
            kw = {"attempt": attempt, "committed": 1} if attempt else {}
            with pytest.raises(rhino.StaleAttemptError, match="batch 2 .* older than batch 3, which the coordinator"):
                c.session("fence", 0, batch=2, epoch=1, **kw)
        unchanged(3)
        # the committed batch may run again (Spark's replay after a driver restart)
        with c.session("fence", 0, batch=3, epoch=1, attempt=16, committed=3) as s:
            assert s.rolled_back and s.version == 2
            s.abort()
        with pytest.raises(rhino.InvalidArgumentError, match="attempt= token only"):
            c.session("fence", 0, batch=3, epoch=1, committed=3)
        c.close()
    finally:
        w2.stop()
        w3.stop()


def test_an_explicit_start_sees_the_committed_batch_the_fence_names(tmp_path: Path, secret_file: Path) -> None:
    """An operator started at batch b > 0, and one resumed after a gap (issue 47: a stage
    inserted into a running chain; ``begin_batch(first=True)`` at the coordinator): a fenced
    session sees the committed batch its fence names (none, or the batch before the gap),
    and a rerun of that batch rolls back to it, over the gap; an unfenced session still
    needs b-1, and a session whose fence names a batch the live state is past, other than
    its own batch, is refused. Checked against a model on the primary and the chain member,
    read with rocksdict from a restore of each checkpoint. A replay of such a batch (no
    fence) rolls back to what the batch was built on, as its commit recorded, on the
    primary and on the chain member after a takeover."""
    w3 = WorkerProcess(tmp_path, "w3", "127.0.0.3", secret_file=secret_file, metrics=False).start()
    w2 = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=secret_file, metrics=False).start()
    try:
        c = rhino.connect(w2.unix_socket, secret=SECRET)
        c.open_instance("start", 0, epoch=1, num_vnodes=8, chain=[w3.address], chain_version=1)
        keys = np.arange(300, dtype=np.int64)
        models: dict[int, dict[bytes, bytes]] = {}

        def run(b: int, attempt: int, committed, *, sees, rolled_back: bool) -> None:
            with c.session("start", 0, batch=b, epoch=1, attempt=attempt, committed=committed) as s:
                assert (s.version, s.rolled_back) == (sees, rolled_back)
                base = dict(models[sees]) if sees is not None else {}
                # the state it sees: the model of that batch, nothing of the batch run before
                assert s.get_batch(keys[:1]) == [base.get(kb(0))]
                i = b % 3
                vals = [f"b{b}".encode()] * 100
                s.put_batch(keys[100 * i:100 * (i + 1)], vals)
                assert s.commit().replication == "complete"
            base.update({kb(k): v for k, v in zip(keys[100 * i:100 * (i + 1)], vals)})
            models[b] = base

        run(5, 20, None, sees=None, rolled_back=False)  # a new operator's first batch, 5
        run(5, 21, None, sees=None, rolled_back=True)  # it runs again: back to no version
        run(6, 22, 5, sees=5, rolled_back=False)
        run(10, 23, 6, sees=6, rolled_back=False)  # resumed after a gap: sees 6
        run(10, 24, 6, sees=6, rolled_back=True)  # it runs again: back over the gap
        # a fence naming an older committed batch than one shown before goes back no further
        with c.session("start", 0, batch=10, epoch=1, attempt=25, committed=5) as s:
            assert (s.version, s.rolled_back) == (6, True)
            s.abort()
        run(10, 26, 6, sees=6, rolled_back=False)
        with pytest.raises(rhino.InvalidArgumentError, match="needs the state at version 11, but it is at version 10"):
            c.session("start", 0, batch=12, epoch=1)  # no fence: b-1, as before
        with pytest.raises(rhino.StaleEpochError, match="only the last committed batch runs again"):
            c.session("start", 0, batch=12, epoch=1, attempt=27, committed=9)
        for d in (w2.dir, w3.dir):
            store = rhino.ReplicaStore(str(d))
            assert store.checkpoints("start", 0)[-2:] == [6, 10]
            for b in (6, 10):
                out = tmp_path / f"r-{d.name}-{b}"
                store.restore("start", 0, b, str(out)).close()
                assert vnode_state(out) == models[b]
        # A replay of batch 10 (no fence: Spark's replay after a driver restart) goes back to
        # what 10 was built on, which its commit recorded with it: on the primary, and on the
        # chain member after a takeover of checkpoint 10 (the record is in the checkpoint).
        with c.session("start", 0, batch=10, epoch=1) as s:
            assert (s.version, s.rolled_back) == (6, True)
            assert s.get_batch(keys[:1]) == [models[6].get(kb(0))]
            s.abort()
        c3 = rhino.connect(w3.unix_socket, secret=SECRET)
        c.fence("start", 0, epoch=2)
        c3.takeover("start", 0, epoch=2, checkpoint=10)
        with c3.session("start", 0, batch=10, epoch=2) as s:
            assert (s.version, s.rolled_back) == (6, True)
            s.abort()
        # and a new operator's first batch replayed rolls back to no version
        c3.open_instance("first", 0, epoch=1, num_vnodes=8)
        with c3.session("first", 0, batch=7, epoch=1, attempt=30) as s:
            s.put_batch(keys[:5], [b"x"] * 5)
            s.commit()
        with c3.session("first", 0, batch=7, epoch=1) as s:
            assert (s.version, s.rolled_back) == (None, True) and s.get_batch(keys[:1]) == [None]
            s.abort()
        c3.close()
        c.close()
    finally:
        w2.stop()
        w3.stop()
