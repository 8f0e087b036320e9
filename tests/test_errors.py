"""Bad input (issue 2 Build 7): each case raises its documented class from rhino.errors,
which also inherits the builtin a Python user would catch, and nothing is written or lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash

import rhino
from helpers import flip_byte, held_keys, key_bytes, tree_snapshot, truncate_file

OP = "op"
K, V = 1 << 8, 8
EVEN = [0, 2, 4, 6]  # the vnodes the instance under test holds


def _raises(cls: type[rhino.RhinoError], builtin: type[BaseException], fn, *args, **kwargs):
    with pytest.raises(cls) as e:
        fn(*args, **kwargs)
    assert isinstance(e.value, rhino.RhinoError)
    assert isinstance(e.value, builtin), f"{cls.__name__} must also be a {builtin.__name__}"
    assert str(e.value), "errors carry a message"
    return e.value


@pytest.fixture
def partitioner() -> rhino.Partitioner:
    return rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=1)


@pytest.fixture
def state(tmp_path, partitioner):
    """(db, model): an instance holding the even vnodes, with some data."""
    # Flushed at every checkpoint: the damage tests below pick its SST files.
    db = rhino.StateBackend.open(str(tmp_path / "state"), partitioner=partitioner, vnodes=EVEN, checkpoint_wal_bytes=0)
    keys = held_keys(partitioner, EVEN, 300)
    values = [b"v%d" % k for k in keys]
    db.put_batch(np.array(keys, dtype=np.int64), values)
    model = {key_bytes(k): v for k, v in zip(keys, values)}
    yield db, model
    db.close()


def _contents(db) -> dict[bytes, bytes]:
    out = {}
    for v in db.vnodes:
        out.update(db.scan(v))
    return out


def _new_held_key(p, start=10**6) -> int:
    return held_keys(p, EVEN, 1, start=start)[0]


def _unheld_key(p) -> int:
    return held_keys(p, [1, 3, 5, 7], 1)[0]


# ---------------------------------------------------------------- wrong key dtype


BAD_KEYS = {
    "float64 array": np.array([1.0, 2.0]),
    "2-D int64 array": np.zeros((2, 2), dtype=np.int64),
    "int32 array": np.array([1, 2], dtype=np.int32),
    "uint64 array": np.array([1, 2], dtype=np.uint64),
    "list with a float": [1, 2.5],
    "list with None": [b"a", None],
    "list with a bool": [1, True],
    "single bytes": b"abc",
    "single str": "abc",
    "int out of int64": [2**63],
    "a dict": {1: 2},
}


@pytest.mark.parametrize("name", sorted(BAD_KEYS))
def test_wrong_key_types_in_batches(state, partitioner, name):
    db, model = state
    bad = BAD_KEYS[name]
    n = len(bad) if hasattr(bad, "__len__") else 1
    values = [b"x"] * n
    _raises(rhino.KeyTypeError, TypeError, db.put_batch, bad, values)
    _raises(rhino.KeyTypeError, TypeError, db.delete_batch, bad)
    _raises(rhino.KeyTypeError, TypeError, db.get_batch, bad)
    _raises(rhino.KeyTypeError, TypeError, db.get_batch_array, bad, 1)
    batch = db.batch()
    _raises(rhino.KeyTypeError, TypeError, batch.put, bad, values)
    _raises(rhino.KeyTypeError, TypeError, batch.delete, bad)
    assert len(batch) == 0
    _raises(rhino.KeyTypeError, TypeError, partitioner.vnodes, bad)
    _raises(rhino.KeyTypeError, TypeError, partitioner.key_groups, bad)
    assert _contents(db) == model, "nothing was written or lost"


def test_a_bad_key_at_the_end_of_a_batch_writes_nothing(state, partitioner):
    db, model = state
    fresh = held_keys(partitioner, EVEN, 3, start=10**6)
    old = next(iter(model))
    _raises(rhino.KeyTypeError, TypeError, db.put_batch, fresh + [old, 1.5], [b"new"] * 5)
    _raises(rhino.KeyTypeError, TypeError, db.delete_batch, [old, None])
    assert db.get_batch(fresh) == [None, None, None]
    assert _contents(db) == model


@pytest.mark.parametrize("bad", [1.5, None, True, 2**63, -(2**63) - 1, [1], np.array([1], dtype=np.int64), 3 + 0j])
def test_wrong_single_key_types(state, partitioner, bad):
    db, model = state
    _raises(rhino.KeyTypeError, TypeError, db.put, bad, b"x")
    _raises(rhino.KeyTypeError, TypeError, db.get, bad)
    _raises(rhino.KeyTypeError, TypeError, db.delete, bad)
    _raises(rhino.KeyTypeError, TypeError, partitioner.vnode, bad)
    _raises(rhino.KeyTypeError, TypeError, partitioner.hash, bad)
    assert _contents(db) == model


# ---------------------------------------------------------------- unknown vnode


def test_keys_of_vnodes_not_held(state, partitioner):
    db, model = state
    bad = _unheld_key(partitioner)
    assert partitioner.vnode(bad) not in EVEN
    _raises(rhino.UnknownVnodeError, KeyError, db.put, bad, b"x")
    _raises(rhino.UnknownVnodeError, KeyError, db.get, bad)
    _raises(rhino.UnknownVnodeError, KeyError, db.delete, bad)
    _raises(rhino.UnknownVnodeError, KeyError, db.get_batch, [bad])
    # One bad key in a batch: nothing of the batch is written, not even the good keys before it.
    good_new = held_keys(partitioner, EVEN, 5, start=10**6)
    existing = next(iter(model))
    keys = np.array(good_new + [int.from_bytes(existing, "little", signed=True), bad], dtype=np.int64)
    _raises(rhino.UnknownVnodeError, KeyError, db.put_batch, keys, [b"overwrite"] * len(keys))
    _raises(rhino.UnknownVnodeError, KeyError, db.delete_batch, keys)
    batch = db.batch()
    _raises(rhino.UnknownVnodeError, KeyError, batch.put, keys, [b"overwrite"] * len(keys))
    assert len(batch) == 0
    assert db.get_batch(good_new) == [None] * 5
    assert _contents(db) == model


def test_vnode_arguments_not_held(state, tmp_path):
    db, model = state
    for v in (1, 999999, 2**32, 2**32 + 2):  # 2^32 + 2 must not wrap around to vnode 2
        _raises(rhino.UnknownVnodeError, KeyError, db.scan, v)
        _raises(rhino.UnknownVnodeError, KeyError, db.count, v)
    _raises(rhino.UnknownVnodeError, KeyError, db.scan, -1)
    export = tmp_path / "export"
    _raises(rhino.UnknownVnodeError, KeyError, db.export_vnodes, [0, 1], str(export))
    _raises(rhino.UnknownVnodeError, KeyError, db.export_vnodes, [999999], str(export))
    assert not export.exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith("export")], "no staging left behind"
    _raises(rhino.UnknownVnodeError, KeyError, db.drop_vnodes, [0, 1])  # 0 is held, 1 is not: drop neither
    _raises(rhino.UnknownVnodeError, KeyError, db.drop_vnodes, [-3])
    assert db.vnodes == EVEN
    assert _contents(db) == model


def test_open_with_vnodes_outside_the_partitioner(tmp_path, partitioner):
    for bad in ([V], [0, V + 5], [-1], [2**32 + 1]):  # 2^32 + 1 must not become vnode 1
        target = tmp_path / f"s{abs(bad[-1])}"
        _raises(rhino.UnknownVnodeError, KeyError, rhino.StateBackend.open, str(target), partitioner=partitioner,
                vnodes=bad)


def test_import_of_a_vnode_already_held_and_a_missing_export(tmp_path, partitioner):
    a = rhino.StateBackend.open(str(tmp_path / "a"), partitioner=partitioner, vnodes=[0, 1])
    b = rhino.StateBackend.open(str(tmp_path / "b"), partitioner=partitioner, vnodes=[1, 2])
    a.put(held_keys(partitioner, [1], 1)[0], b"from-a")
    a.export_vnodes([1], str(tmp_path / "exp"))
    _raises(rhino.AlreadyExistsError, FileExistsError, b.import_vnodes, str(tmp_path / "exp"))
    assert (tmp_path / "exp").exists(), "a refused import leaves the export for another try"
    assert b.count(1) == 0
    _raises(rhino.NotFoundError, FileNotFoundError, b.import_vnodes, str(tmp_path / "nothing-here"))
    _raises(rhino.AlreadyExistsError, FileExistsError, a.export_vnodes, [0], str(tmp_path / "exp"))
    a.close()
    b.close()


# ---------------------------------------------------------------- bad K / V


@pytest.mark.parametrize(
    ("k", "v"),
    [(3, 1), (0, 1), (1000, 8), (1 << 31, 1), (2**32, 1), (-4, 1), (16, 17), (16, 0), (1, 2), (16, -1)],
)
def test_bad_partitioner_parameters(tmp_path, k, v):
    _raises(rhino.InvalidArgumentError, ValueError, rhino.Partitioner, num_key_groups=k, num_vnodes=v)


def test_reopening_with_another_partitioner(tmp_path, state):
    db, model = state
    db.close()
    other = rhino.Partitioner(num_key_groups=K, num_vnodes=V, seed=2)
    _raises(rhino.InvalidArgumentError, ValueError, rhino.StateBackend.open, str(tmp_path / "state"),
            partitioner=other)
    again = rhino.StateBackend.open(str(tmp_path / "state"))
    assert _contents(again) == model
    again.close()


# ---------------------------------------------------------------- restoring missing / corrupt / truncated checkpoints


@pytest.fixture
def checkpointed(tmp_path, state, store):
    """A store with checkpoint 1 of the state; the state is closed (pooled files share its inodes)."""
    db, model = state
    m = db.checkpoint(store, 1)
    db.close()
    assert store.verify(full=True).ok
    return store, m, model


def _manifest_file(store, op=OP, inst=0, cid=1) -> Path:
    return Path(store.path) / "checkpoints" / op / str(inst) / f"{cid:020d}.manifest"


def test_restore_missing_checkpoint(tmp_path, checkpointed):
    store, _m, _model = checkpointed
    target = tmp_path / "r"
    _raises(rhino.NotFoundError, FileNotFoundError, store.restore, OP, 0, 2, str(target))
    _raises(rhino.NotFoundError, FileNotFoundError, store.restore, OP, 1, 1, str(target))
    _raises(rhino.NotFoundError, FileNotFoundError, store.restore, "other-op", 0, 1, str(target))
    _raises(rhino.NotFoundError, FileNotFoundError, store.restore_files, OP, 0, 2, str(target))
    _raises(rhino.NotFoundError, FileNotFoundError, store.manifest, OP, 0, 2)
    assert not target.exists()
    assert store.verify(full=True).ok


def test_open_missing_state_without_create(tmp_path):
    _raises(rhino.NotFoundError, FileNotFoundError, rhino.StateBackend.open, str(tmp_path / "none"), create=False)
    assert not (tmp_path / "none" / "CURRENT").exists()


@pytest.mark.parametrize("how", ["edit", "truncate", "trailer", "empty", "other-checkpoint", "missing-field"])
def test_corrupt_manifest(tmp_path, checkpointed, how):
    store, _m, _model = checkpointed
    path = _manifest_file(store)
    data = bytearray(path.read_bytes())
    os.chmod(path, 0o644)
    if how == "edit":  # change one byte of the JSON body: a digit of the first file's size
        i = data.index(b'"size":') + len(b'"size":')
        data[i] = ord("9") if data[i] != ord("9") else ord("8")
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "trailer":
        data[-3] = ord("0") if data[-3] != ord("0") else ord("1")
    elif how == "empty":
        data = bytearray()
    else:  # a well-formed trailer over JSON that is not this checkpoint's manifest
        doc = _json_of(path)
        if how == "other-checkpoint":
            doc["checkpoint_id"] = 7
        else:
            del doc["files"][0]["identity"]
        path.unlink()
        _write_manifest(path, doc)
        data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data))
    pool_before = sorted(os.listdir(Path(store.path) / "pool"))
    target = tmp_path / "r"
    _raises(rhino.CorruptionError, OSError, store.restore, OP, 0, 1, str(target))
    _raises(rhino.CorruptionError, OSError, store.restore_files, OP, 0, 1, str(target))
    _raises(rhino.CorruptionError, OSError, store.manifest, OP, 0, 1)
    assert not target.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith("r")] == [], "no staging left behind"
    report = store.verify(full=False)
    assert [(p.checkpoint_id, p.file) for p in report.problems] == [(1, "")]
    # GC never deletes on uncertainty: an unreadable manifest stops it.
    _raises(rhino.CorruptionError, OSError, store.gc)
    assert sorted(os.listdir(Path(store.path) / "pool")) == pool_before


def test_truncated_pool_file_fails_restore(tmp_path, checkpointed):
    store, m, _model = checkpointed
    victim = max((f for f in m.files if f.name.endswith(".sst")), key=lambda f: f.size)
    truncate_file(store.pool_path(victim.identity), 1)
    target = tmp_path / "r"
    e = _raises(rhino.CorruptionError, OSError, store.restore, OP, 0, 1, str(target))  # default verify="size"
    assert victim.name in str(e)
    _raises(rhino.CorruptionError, OSError, store.restore_files, OP, 0, 1, str(target))
    assert not target.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith("r")] == []


def test_bit_flipped_pool_file_fails_full_verify_restore(tmp_path, checkpointed):
    store, m, _model = checkpointed
    victim = max((f for f in m.files if f.name.endswith(".sst")), key=lambda f: f.size)
    flip_byte(store.pool_path(victim.identity), victim.size // 3)
    target = tmp_path / "r"
    e = _raises(rhino.CorruptionError, OSError, store.restore, OP, 0, 1, str(target), verify="full")
    assert victim.name in str(e)
    _raises(rhino.CorruptionError, OSError, store.restore_files, OP, 0, 1, str(target), verify="full")
    assert not target.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith("r")] == []


def test_corrupt_sst_that_rocksdb_rejects_leaves_no_target(tmp_path, checkpointed):
    """verify="size" cannot see a flipped byte, but if RocksDB then refuses to open the DB,
    the restore still fails cleanly: CorruptionError and no target directory."""
    store, m, _model = checkpointed
    victim = max((f for f in m.files if f.name.endswith(".sst")), key=lambda f: f.size)
    flip_byte(store.pool_path(victim.identity), victim.size - 1)  # the table's magic number
    target = tmp_path / "r"
    _raises(rhino.CorruptionError, OSError, store.restore, OP, 0, 1, str(target))
    assert not target.exists()


# ---------------------------------------------------------------- target already exists


def test_restore_target_already_exists(tmp_path, checkpointed):
    store, _m, _model = checkpointed
    target = tmp_path / "occupied"
    target.mkdir()
    (target / "precious.txt").write_bytes(b"do not touch")
    (target / "sub").mkdir()
    (target / "sub" / "CURRENT").write_bytes(b"MANIFEST-000001\n")
    before = tree_snapshot(target)
    _raises(rhino.AlreadyExistsError, FileExistsError, store.restore, OP, 0, 1, str(target))
    _raises(rhino.AlreadyExistsError, FileExistsError, store.restore_files, OP, 0, 1, str(target), mode="copy")
    file_target = tmp_path / "a-file"
    file_target.write_bytes(b"x")
    _raises(rhino.AlreadyExistsError, FileExistsError, store.restore, OP, 0, 1, str(file_target))
    assert tree_snapshot(target) == before
    assert file_target.read_bytes() == b"x"
    assert store.verify(full=True).ok


# ---------------------------------------------------------------- paths outside the store


def _write_manifest(path: Path, doc: dict) -> None:
    """A manifest with a valid checksum trailer: JSON line + "xxh3:<16 hex of XXH3_64(JSON)>"."""
    body = json.dumps(doc, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body + b"\nxxh3:" + f"{xxhash.xxh3_64_intdigest(body):016x}".encode() + b"\n")


def _json_of(path: Path) -> dict:
    return json.loads(path.read_bytes().split(b"\n", 1)[0])


@pytest.mark.parametrize("op", ["../evil", "..", ".hidden", "a/b", "", "/etc", "x" * 129])
def test_operator_ids_that_escape_the_store(tmp_path, checkpointed, op):
    store, _m, _model = checkpointed
    outside_before = sorted(os.listdir(tmp_path))
    target = tmp_path / "r"
    _raises(rhino.PathOutsideStoreError, ValueError, store.restore, op, 0, 1, str(target))
    _raises(rhino.PathOutsideStoreError, ValueError, store.restore_files, op, 0, 1, str(target))
    _raises(rhino.PathOutsideStoreError, ValueError, store.manifest, op, 0, 1)
    _raises(rhino.PathOutsideStoreError, ValueError, store.checkpoints, op, 0)
    _raises(rhino.PathOutsideStoreError, ValueError, store.retain, op, 0, 0)
    if op:  # operator_id="" means "every instance"
        _raises(rhino.PathOutsideStoreError, ValueError, store.verify, operator_id=op)
    assert sorted(os.listdir(tmp_path)) == outside_before
    assert store.checkpoints(OP, 0) == [1]


def test_state_with_an_escaping_operator_id_is_refused(tmp_path, partitioner):
    e = _raises(rhino.RhinoError, ValueError, rhino.StateBackend.open, str(tmp_path / "s"), partitioner=partitioner,
                operator_id="../evil")
    assert isinstance(e, (rhino.InvalidArgumentError, rhino.PathOutsideStoreError))
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("identity", ["../../etc/passwd", "../pool", "", "0" * 32, "0" * 32 + "-", "G" * 32 + "-1",
                                      "0" * 32 + "-1/../../x"])
def test_pool_path_rejects_non_identities(store, identity):
    _raises(rhino.PathOutsideStoreError, ValueError, store.pool_path, identity)


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "../escape.sst"), ("name", "sub/escape.sst"), ("name", ".."), ("identity", "../../../escape")],
)
def test_manifest_naming_a_path_outside_the_store(tmp_path, checkpointed, field, value):
    store, m, _model = checkpointed
    doc = _json_of(_manifest_file(store))
    doc["checkpoint_id"] = 2
    doc["files"][0][field] = value
    _write_manifest(_manifest_file(store, cid=2), doc)
    assert store.checkpoints(OP, 0) == [1, 2]
    everything_before = tree_snapshot(tmp_path)
    target = tmp_path / "restores" / "r"
    for fn in (store.restore, store.restore_files):
        for verify in ("size", "full"):
            _raises(rhino.PathOutsideStoreError, ValueError, fn, OP, 0, 2, str(target), verify=verify)
    assert not (tmp_path / "restores").exists()
    assert not (tmp_path / "escape.sst").exists()
    after = tree_snapshot(tmp_path)
    assert after == everything_before, "nothing was written anywhere"
    # verify reports the bad entry instead of following it; the good checkpoint still restores.
    report = store.verify(full=True)
    assert [(p.checkpoint_id, p.file) for p in report.problems] == [(2, doc["files"][0]["name"])]
    store.restore_files(OP, 0, 1, str(tmp_path / "good"))


# ---------------------------------------------------------------- checkpoint ids


def test_checkpoint_ids_must_increase(tmp_path, state, store):
    db, model = state
    db.checkpoint(store, 5)
    manifest_bytes = _manifest_file(store, cid=5).read_bytes()
    for bad in (5, 4, 0):
        _raises(rhino.InvalidArgumentError, ValueError, db.checkpoint, store, bad)
    assert db.last_checkpoint == 5
    assert store.checkpoints(OP, 0) == [5]
    assert _manifest_file(store, cid=5).read_bytes() == manifest_bytes
    assert store.verify(full=True).ok
    assert db.checkpoint(store, 6).parent_id == 5
    assert _contents(db) == model


def test_committing_an_existing_checkpoint_id(tmp_path, state, store, partitioner):
    db, model = state
    db.checkpoint(store, 1)
    manifest_bytes = _manifest_file(store, cid=1).read_bytes()
    # A second state claiming the same operator instance tries to commit checkpoint 1 again.
    other = rhino.StateBackend.open(str(tmp_path / "other"), partitioner=partitioner, vnodes=EVEN)
    other.put(_new_held_key(partitioner), b"other")
    _raises(rhino.AlreadyExistsError, FileExistsError, other.checkpoint, store, 1)
    assert other.last_checkpoint is None, "the failed checkpoint left no trace in the state"
    assert _manifest_file(store, cid=1).read_bytes() == manifest_bytes
    assert store.checkpoints(OP, 0) == [1]
    assert not os.listdir(Path(store.path) / "tmp"), "staging was cleaned up"
    assert store.verify(full=True).ok
    other.close()
    db.close()
    store.restore_files(OP, 0, 1, str(tmp_path / "r"))
    restored = rhino.StateBackend.open(str(tmp_path / "r"))
    assert _contents(restored) == model
    restored.close()


# ---------------------------------------------------------------- closed backend and bad options


def test_using_a_closed_backend(tmp_path, state, store, partitioner):
    db, _model = state
    batch = db.batch()
    key = _new_held_key(partitioner)
    db.close()
    assert db.closed
    calls = [
        (db.get, (key,)),
        (db.put, (key, b"x")),
        (db.delete, (key,)),
        (db.put_batch, ([key], [b"x"])),
        (db.delete_batch, ([key],)),
        (db.get_batch, ([key],)),
        (db.scan, (0,)),
        (db.count, (0,)),
        (db.checkpoint, (store, 1)),
        (db.export_vnodes, ([0], str(tmp_path / "exp"))),
        (db.import_vnodes, (str(tmp_path / "exp"),)),
        (db.drop_vnodes, ([0],)),
        (db.flush, ()),
        (db.stats, ()),
        (db.batch, ()),
        (batch.put, ([key], [b"x"])),
        (lambda: db.vnodes, ()),
        (lambda: db.path, ()),
    ]
    for fn, args in calls:
        _raises(rhino.InvalidArgumentError, ValueError, fn, *args)
    db.close()  # closing twice is harmless
    assert store.checkpoints(OP, 0) == []
    assert not (tmp_path / "exp").exists()
    reopened = rhino.StateBackend.open(str(tmp_path / "state"))
    assert reopened.get(key) is None
    reopened.close()


def test_context_manager_closes(tmp_path, partitioner):
    with rhino.StateBackend.open(str(tmp_path / "s"), partitioner=partitioner) as db:
        db.put(1, b"x")
    _raises(rhino.InvalidArgumentError, ValueError, db.get, 1)


def test_bad_restore_options(tmp_path, checkpointed):
    store, _m, _model = checkpointed
    target = tmp_path / "r"
    _raises(rhino.InvalidArgumentError, ValueError, store.restore, OP, 0, 1, str(target), mode="symlink")
    _raises(rhino.InvalidArgumentError, ValueError, store.restore, OP, 0, 1, str(target), verify="none")
    assert not target.exists()


def test_mismatched_keys_and_values(state, partitioner):
    db, model = state
    keys = held_keys(partitioner, EVEN, 3, start=10**6)
    _raises(rhino.InvalidArgumentError, ValueError, db.put_batch, keys, [b"a", b"b"])
    _raises(rhino.InvalidArgumentError, ValueError, db.put_batch, keys, [b"a", 1, b"c"])
    _raises(rhino.InvalidArgumentError, ValueError, db.put_batch, keys, b"abc")
    assert db.get_batch(keys) == [None] * 3
    assert _contents(db) == model
