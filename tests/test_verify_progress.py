"""`ReplicaStore.verify(full=True)`: each pooled file is read once however many
checkpoints share it, a progress callback reports as it goes, and an exception
from the callback stops it. The oracle is the manifests themselves (which
checkpoint lists which identity, and each file's size), read through the API,
plus an independent XXH3-128 of the pooled bytes by the `xxhash` package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xxhash

import rhino
from tests.helpers import flip_byte

OP = "verify"


@pytest.fixture
def store(tmp_path: Path) -> rhino.ReplicaStore:
    """Three incremental checkpoints of one instance: later ones share most files with earlier ones."""
    st = rhino.ReplicaStore(str(tmp_path / "store"))
    rng = np.random.default_rng(3)
    with rhino.StateBackend.open(str(tmp_path / "live"), operator_id=OP, instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=16)) as db:
        for c in (1, 2, 3):
            keys = np.arange((c - 1) * 2000, c * 2000, dtype=np.int64)
            db.put_batch(keys, [rng.bytes(200) for _ in range(len(keys))], version=c)
            db.checkpoint(st, c)
    return st


def references(st: rhino.ReplicaStore) -> dict[str, list[tuple[int, str, int, str]]]:
    """identity -> [(checkpoint id, file name, size, checksum)] over every committed checkpoint."""
    out: dict[str, list] = {}
    for c in st.checkpoints(OP, 0):
        for f in st.manifest(OP, 0, c).files:
            out.setdefault(f.identity, []).append((c, f.name, f.size, f.checksum))
    return out


def test_each_pooled_file_is_read_once(store):
    refs = references(store)
    shared = [i for i, r in refs.items() if len(r) > 1]
    assert shared, "the fixture should share files between checkpoints"
    report = store.verify(full=True)
    assert report.ok and report.checkpoints == 3
    assert report.files_checked == sum(len(r) for r in refs.values())
    assert report.bytes_checked == sum(r[0][2] for r in refs.values())  # unique bytes, not per reference
    # The bytes really are what the manifests say: an independent hash of every pooled file.
    for identity, r in refs.items():
        data = Path(store.pool_path(identity)).read_bytes()
        assert len(data) == r[0][2]
        assert all(xxhash.xxh3_128_hexdigest(data) == checksum for _, _, _, checksum in r)


def test_a_damaged_shared_file_is_reported_for_every_checkpoint_that_lists_it(store):
    refs = references(store)
    identity, r = max(refs.items(), key=lambda kv: (len(kv[1]), kv[1][0][2]))
    assert len(r) == 3  # a file of checkpoint 1 that checkpoints 2 and 3 still list
    flip_byte(store.pool_path(identity), r[0][2] // 2)
    report = store.verify(full=True)
    bad = sorted((p.checkpoint_id, p.file, p.detail) for p in report.problems)
    assert bad == sorted((c, name, "checksum mismatch") for c, name, _, _ in r)
    assert report.bytes_checked == sum(x[0][2] for x in refs.values())  # still read once


def test_progress_reports_as_it_goes_and_ends_with_the_totals(store):
    calls: list[tuple[int, int]] = []
    report = store.verify(full=True, progress=lambda files, nbytes: calls.append((files, nbytes)))
    assert len(calls) >= 2
    assert calls[0][0] == 1  # after the first file
    assert calls == sorted(calls)  # never goes backwards
    assert calls[-1] == (report.files_checked, report.bytes_checked)


def test_an_exception_from_progress_stops_the_verify(store):
    seen: list[int] = []

    def stop(files: int, nbytes: int) -> None:
        seen.append(files)
        raise KeyboardInterrupt  # what Ctrl-C in a progress bar looks like

    with pytest.raises(KeyboardInterrupt):
        store.verify(full=True, progress=stop)
    total = sum(len(r) for r in references(store).values())
    assert seen == [1] and total > 1  # stopped after the first file, not at the end
    assert store.verify(full=True).ok  # nothing was left half-done


def test_progress_must_be_callable(store):
    with pytest.raises(TypeError, match="progress must be callable"):
        store.verify(progress=42)
