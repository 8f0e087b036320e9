"""`restore(progress=fn)` and `restore_files(progress=fn)`: a restore reports each
stage (check, then place) from its first file to its last, and an exception
from the callback stops it with nothing left behind. The oracle is the
checkpoint's manifest (its files and their sizes), read through the API."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import rhino

OP = "progress"


@pytest.fixture
def store(tmp_path: Path) -> rhino.ReplicaStore:
    st = rhino.ReplicaStore(str(tmp_path / "store"))
    rng = np.random.default_rng(5)
    with rhino.StateBackend.open(str(tmp_path / "live"), operator_id=OP, instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=16)) as db:
        for c in (1, 2):
            keys = np.arange((c - 1) * 3000, c * 3000, dtype=np.int64)
            db.put_batch(keys, [rng.bytes(400) for _ in range(len(keys))], version=c)
            db.checkpoint(st, c)
    return st


def all_keys_present(db: rhino.StateBackend) -> bool:
    got = db.get_batch(np.arange(6000, dtype=np.int64))
    return all(v is not None and len(v) == 400 for v in got)


def check_calls(calls: list[tuple], manifest: rhino.Manifest) -> None:
    n, nbytes = len(manifest.files), sum(f.size for f in manifest.files)
    assert [c[0] for c in calls] == sorted((c[0] for c in calls), key=["check", "place"].index)
    for stage in ("check", "place"):
        mine = [c[1:] for c in calls if c[0] == stage]
        assert mine, f"no {stage} report"
        assert mine[0][0] == 1 and mine[-1] == (n, n, nbytes, nbytes)  # first file, and the end
        assert all(total == n and btotal == nbytes for _, total, _, btotal in mine)
        assert mine == sorted(mine)  # never goes backwards
        # bytes_done is the sizes of the first files_done files, in manifest order
        prefix = np.cumsum([0] + [f.size for f in manifest.files])
        assert all(done_b == prefix[done] for done, _, done_b, _ in mine)


@pytest.mark.parametrize("mode, verify", [("link", "size"), ("copy", "full")])
def test_restore_files_reports_both_stages(store, tmp_path, mode, verify):
    calls: list[tuple] = []
    stats = store.restore_files(OP, 0, 2, str(tmp_path / "t"), mode=mode, verify=verify,
                                progress=lambda *a: calls.append(a))
    m = store.manifest(OP, 0, 2)
    check_calls(calls, m)
    assert stats.files == len(m.files) and stats.total_bytes == sum(f.size for f in m.files)


def test_restore_reports_and_opens(store, tmp_path):
    calls: list[tuple] = []
    with store.restore(OP, 0, 2, str(tmp_path / "t"), progress=lambda *a: calls.append(a)) as db:
        assert all_keys_present(db)
    check_calls(calls, store.manifest(OP, 0, 2))


@pytest.mark.parametrize("stage", ["check", "place"])
def test_an_exception_from_progress_stops_the_restore_and_leaves_nothing(store, tmp_path, stage):
    target = tmp_path / "restored"

    def stop(st, done, total, *_):
        if st == stage:
            raise ValueError(f"stop in {st} at {done}/{total}")

    with pytest.raises(ValueError, match=f"stop in {stage} at 1/"):
        store.restore_files(OP, 0, 2, str(target), mode="copy", progress=stop)
    assert not target.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith("restored")] == []  # no staging left
    with store.restore(OP, 0, 2, str(target)) as db:  # and the checkpoint is intact
        assert all_keys_present(db)


def test_a_non_callable_progress_is_refused_before_anything_is_written(store, tmp_path):
    with pytest.raises(TypeError, match="progress must be callable"):
        store.restore_files(OP, 0, 1, str(tmp_path / "t"), progress="yes")
    with pytest.raises(TypeError, match="progress must be callable"):
        store.restore(OP, 0, 1, str(tmp_path / "t"), progress=3)
    assert not (tmp_path / "t").exists()
