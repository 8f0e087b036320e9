"""Arrow binary arrays in and out of the state backend (bindings/arrow_buffers.cc).

Oracles: a Python dict model of what was put, and rocksdict (an independent
RocksDB) reading the state directory after close. Bad Arrow input must raise
InvalidArgumentError and write nothing.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rhino

V = 16


def _open(path) -> rhino.StateBackend:
    return rhino.StateBackend.open(str(path), partitioner=rhino.Partitioner(num_vnodes=V))


def _key_bytes(k: int) -> bytes:
    return int(k).to_bytes(8, "little", signed=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    items=st.dictionaries(st.integers(-(2**63), 2**63 - 1), st.binary(max_size=300), max_size=200),
    absent=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30),
    as_string=st.booleans(),
    large=st.sampled_from([None, False, True]),
    slice_start=st.integers(0, 3),
)
def test_put_and_get_arrow_match_a_dict_model(tmp_path_factory, items, absent, as_string, large, slice_start):
    db = _open(tmp_path_factory.mktemp("arrow") / "state")
    keys = np.array(list(items), dtype=np.int64)
    values = list(items.values())
    # A sliced array (non-zero offset into its buffers) must be read from its offset.
    padding = [b"pad"] * slice_start
    if as_string:
        values = [v.decode("latin-1").encode("utf-8") for v in values]  # valid UTF-8 bytes
        arr = pa.array([v.decode("utf-8") for v in padding + values], type=pa.string()).slice(slice_start)
    else:
        arr = pa.array(padding + values, type=pa.binary()).slice(slice_start)
    model = dict(zip(keys.tolist(), values))
    db.put_batch(keys, arr)

    lookup = list(model) + [k for k in absent if k not in model]
    got = db.get_batch_arrow(np.array(lookup, dtype=np.int64), large=large)
    got.validate(full=True)
    assert got.type == (pa.large_binary() if large else pa.binary())
    assert got.to_pylist() == [model.get(k) for k in lookup]
    assert got.null_count == sum(k not in model for k in lookup)
    # Same answer as the list-of-bytes path.
    assert got.to_pylist() == db.get_batch(lookup)
    db.close()


def test_arrow_put_is_what_an_independent_reader_sees(tmp_path, read_rocksdb):
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, 2000, dtype=np.int64))
    values = [rng.bytes(int(n)) for n in rng.integers(0, 200, len(keys))]
    db = _open(tmp_path / "state")
    db.put_batch(keys, pa.array(values, type=pa.large_binary()))
    db.close()
    cfs = read_rocksdb(tmp_path / "state")
    seen = {k: v for name, cf in cfs.items() if name.startswith("vnode-") for k, v in cf.items()}
    assert seen == {_key_bytes(k): v for k, v in zip(keys.tolist(), values)}


def test_write_batch_takes_arrow_values(tmp_path):
    db = _open(tmp_path / "state")
    b = db.batch()
    b.put([1, 2], pa.array([b"one", b"two"]))
    db.write(b, version=3)
    assert db.get_batch_arrow([1, 2, 3]).to_pylist() == [b"one", b"two", None]
    assert db.version == 3


def test_get_batch_arrow_of_nothing(tmp_path):
    db = _open(tmp_path / "state")
    empty = db.get_batch_arrow(np.array([], dtype=np.int64))
    assert len(empty) == 0 and empty.type == pa.binary()
    assert db.get_batch_arrow([42]).to_pylist() == [None]


def _malformed_offsets() -> pa.Array:
    # An offset running past the 4-byte data buffer (pyarrow checks only the
    # last offset when it builds the array, not the ones in between).
    offsets = np.array([0, 100, 3], dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), 2, [None, pa.py_buffer(offsets), pa.py_buffer(b"abcd")])


def _decreasing_offsets() -> pa.Array:
    offsets = np.array([0, 3, 1], dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), 2, [None, pa.py_buffer(offsets), pa.py_buffer(b"abcd")])


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: pa.array([b"a", None]), "nulls"),
        (lambda: pa.array([1, 2]), "must be binary"),
        (lambda: pa.chunked_array([[b"a"], [b"b"]]), "ChunkedArray"),
        (lambda: pa.array([b"a", b"b", b"c"]), "3 values"),
        (_malformed_offsets, "bad offsets"),
        (_decreasing_offsets, "bad offsets"),
    ],
)
def test_bad_arrow_values_raise_and_write_nothing(tmp_path, bad, message):
    db = _open(tmp_path / "state")
    db.put_batch([1, 2], [b"kept-1", b"kept-2"])
    with pytest.raises(rhino.InvalidArgumentError, match=message):
        db.put_batch([1, 2], bad())
    assert db.get_batch([1, 2]) == [b"kept-1", b"kept-2"]


def test_without_pyarrow_the_error_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "import rhino\n"
        f"db = rhino.StateBackend.open({str(tmp_path / 'state')!r}, partitioner=rhino.Partitioner(num_vnodes=4))\n"
        "db.put_batch([1], [b'x'])\n"
        "try:\n"
        "    db.get_batch_arrow([1])\n"
        "except rhino.InvalidArgumentError as e:\n"
        "    print('raised:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "rhino-state[arrow]" in out.stdout


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ints=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=100, unique=True),
    names=st.lists(st.binary(min_size=1, max_size=40), max_size=50, unique=True),
    slice_start=st.integers(0, 3),
)
def test_arrow_keys_are_the_same_keys_as_numpy_and_bytes(tmp_path_factory, ints, names, slice_start):
    part = rhino.Partitioner(num_vnodes=V)
    db = rhino.StateBackend.open(str(tmp_path_factory.mktemp("arrow-keys") / "state"), partitioner=part)
    pad_ints, pad_names = [0] * slice_start, [b"pad"] * slice_start
    int_keys = pa.array(pad_ints + ints, type=pa.int64()).slice(slice_start)
    name_keys = pa.array(pad_names + names, type=pa.binary()).slice(slice_start)
    # Routing: an Arrow int64 key is the NumPy int64 key, an Arrow binary key the bytes key.
    assert np.array_equal(part.vnodes(int_keys), part.vnodes(np.array(ints, dtype=np.int64)))
    if names:
        assert np.array_equal(part.vnodes(name_keys), part.vnodes(names))
    db.put_batch(int_keys, [b"i%d" % i for i in range(len(ints))])
    db.put_batch(name_keys, [b"n%d" % i for i in range(len(names))])
    assert db.get_batch(np.array(ints, dtype=np.int64)) == [b"i%d" % i for i in range(len(ints))]
    assert db.get_batch(names) == [b"n%d" % i for i in range(len(names))]
    assert db.get_batch_arrow(int_keys).to_pylist() == [b"i%d" % i for i in range(len(ints))]
    db.close()


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda: pa.array([1, None], type=pa.int64()), "nulls"),
        (lambda: pa.array([1, 2], type=pa.int32()), "must be int64"),
        (lambda: pa.array([b"a", None]), "nulls"),
        (lambda: pa.chunked_array([[1], [2]]), "ChunkedArray"),
    ],
)
def test_bad_arrow_keys_raise_key_type_error_and_write_nothing(tmp_path, bad, message):
    db = _open(tmp_path / "state")
    db.put_batch([1, 2], [b"kept-1", b"kept-2"])
    with pytest.raises(rhino.KeyTypeError, match=message):
        db.put_batch(bad(), [b"x", b"y"])
    with pytest.raises(rhino.KeyTypeError, match=message):
        db.get_batch_arrow(bad())
    assert db.get_batch([1, 2]) == [b"kept-1", b"kept-2"]
