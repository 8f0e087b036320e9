"""Routing of keys to key groups and vnodes (docs/design.md §1, issue 2 "Routing").

Every Python entry point of Partitioner, and the StateBackend's own routing,
must agree with an independent oracle: the ``xxhash`` package's XXH3-64,
kg = h >> (64 - log2 K), vnode = kg * V // K; int64 keys hashed as their 8
little-endian bytes and str keys as UTF-8.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import scipy.stats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rhino
from helpers import key_bytes, oracle_hash, oracle_key_group, oracle_vnode

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
SEEDS = st.integers(min_value=0, max_value=2**64 - 1)
KEYS = st.one_of(INT64, st.binary(max_size=64), st.text(max_size=32))


@st.composite
def partitioners(draw):
    """(K, V, seed) with K a power of two in [1, 2^30] and V in [1, K]."""
    bits = draw(st.integers(min_value=0, max_value=30))
    k = 1 << bits
    v = draw(st.integers(min_value=1, max_value=min(k, 1 << 16)))
    return k, v, draw(SEEDS)


def _check_scalar(p: rhino.Partitioner, key, oracle_key, k: int, v: int, seed: int) -> None:
    assert p.hash(key) == oracle_hash(oracle_key, seed)
    assert p.key_group(key) == oracle_key_group(oracle_key, k, seed)
    assert p.vnode(key) == oracle_vnode(oracle_key, k, v, seed)


# ---------------------------------------------------------------- agreement with the oracle


@settings(max_examples=300, deadline=None)
@given(params=partitioners(), key=INT64)
def test_int_key_entry_points_agree_with_oracle(params, key):
    k, v, seed = params
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    le = key.to_bytes(8, "little", signed=True)
    # Scalar forms: a Python int, a NumPy int64 scalar, and the key's 8 LE bytes are one key.
    for form in (key, np.int64(key), le, bytearray(le), memoryview(le)):
        _check_scalar(p, form, key, k, v, seed)
    kg, vn = oracle_key_group(key, k, seed), oracle_vnode(key, k, v, seed)
    # Vectorized forms: int64 array, list of ints, object array, list of bytes.
    for many in (np.array([key], dtype=np.int64), [key], np.array([key], dtype=object), [le]):
        kgs, vns = p.key_groups(many), p.vnodes(many)
        assert kgs.dtype == np.int32 and vns.dtype == np.int32
        assert kgs.tolist() == [kg] and vns.tolist() == [vn]


@settings(max_examples=200, deadline=None)
@given(params=partitioners(), key=st.one_of(st.binary(max_size=200), st.text(max_size=64)))
def test_bytes_and_str_key_entry_points_agree_with_oracle(params, key):
    k, v, seed = params
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    _check_scalar(p, key, key, k, v, seed)
    if isinstance(key, str):  # a str key is its UTF-8 bytes
        _check_scalar(p, key.encode("utf-8"), key, k, v, seed)
    assert p.key_groups([key]).tolist() == [oracle_key_group(key, k, seed)]
    assert p.vnodes(np.array([key], dtype=object)).tolist() == [oracle_vnode(key, k, v, seed)]


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32])
def test_numpy_integer_scalars_hash_as_int64(dtype):
    p = rhino.Partitioner(num_key_groups=1 << 12, num_vnodes=64, seed=3)
    for x in (0, 1, 7, 100, np.iinfo(dtype).max, np.iinfo(dtype).min):
        _check_scalar(p, dtype(x), int(x), 1 << 12, 64, 3)


@settings(max_examples=100, deadline=None)
@given(params=partitioners(), keys=st.lists(INT64, max_size=300))
def test_vectorized_int64_forms_agree(params, keys):
    k, v, seed = params
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    want_kg = [oracle_key_group(x, k, seed) for x in keys]
    want_vn = [kg * v // k for kg in want_kg]
    forms = [
        np.array(keys, dtype=np.int64),
        keys,
        tuple(keys),
        np.array(keys, dtype=object),
        [key_bytes(x) for x in keys],
    ]
    for form in forms:
        kgs, vns = p.key_groups(form), p.vnodes(form)
        assert kgs.dtype == np.int32 and vns.dtype == np.int32 and kgs.ndim == 1
        assert kgs.tolist() == want_kg
        assert vns.tolist() == want_vn
    # Scalar calls agree with the vectorized ones.
    assert [p.vnode(x) for x in keys] == want_vn


@settings(max_examples=100, deadline=None)
@given(params=partitioners(), keys=st.lists(KEYS, max_size=100))
def test_vectorized_mixed_sequences_agree(params, keys):
    k, v, seed = params
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    assert p.key_groups(keys).tolist() == [oracle_key_group(x, k, seed) for x in keys]
    objects = np.empty(len(keys), dtype=object)
    objects[:] = keys
    assert p.vnodes(objects).tolist() == [oracle_vnode(x, k, v, seed) for x in keys]


def test_non_contiguous_and_large_int64_arrays():
    p = rhino.Partitioner(num_key_groups=1 << 15, num_vnodes=256, seed=11)
    rng = np.random.default_rng(0)
    keys = rng.integers(-(2**63), 2**63 - 1, size=200_000, dtype=np.int64, endpoint=True)
    kgs, vns = p.key_groups(keys), p.vnodes(keys)
    sample = rng.choice(len(keys), size=3000, replace=False)
    for i in sample:
        x = int(keys[i])
        assert kgs[i] == oracle_key_group(x, 1 << 15, 11)
        assert vns[i] == oracle_vnode(x, 1 << 15, 256, 11)
    # A strided view gives the same answers as a contiguous copy.
    view = keys[::3]
    assert not view.flags["C_CONTIGUOUS"]
    assert np.array_equal(p.vnodes(view), vns[::3])
    assert np.array_equal(p.key_groups(view), kgs[::3])
    assert np.array_equal(p.vnodes(keys[:0]), np.zeros(0, dtype=np.int32))


def test_int64_extremes_and_known_forms():
    k, v, seed = 1 << 15, 256, 0
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    extremes = [0, 1, -1, 2**63 - 1, -(2**63), 2**32, -(2**32)]
    assert p.vnodes(np.array(extremes, dtype=np.int64)).tolist() == [oracle_vnode(x, k, v, seed) for x in extremes]
    for x in extremes:
        _check_scalar(p, x, x, k, v, seed)
    # Empty keys are keys too.
    _check_scalar(p, b"", b"", k, v, seed)
    _check_scalar(p, "", b"", k, v, seed)
    _check_scalar(p, "日本語キー", "日本語キー", k, v, seed)


# ---------------------------------------------------------------- determinism


@settings(max_examples=100, deadline=None)
@given(params=partitioners(), keys=st.lists(KEYS, min_size=1, max_size=50))
def test_deterministic_across_calls_and_instances(params, keys):
    k, v, seed = params
    a = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    b = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    first = [(a.hash(x), a.key_group(x), a.vnode(x)) for x in keys]
    assert first == [(a.hash(x), a.key_group(x), a.vnode(x)) for x in keys]
    assert first == [(b.hash(x), b.key_group(x), b.vnode(x)) for x in keys]
    assert a.vnodes(keys).tolist() == b.vnodes(keys).tolist() == [f[2] for f in first]


_SUBPROCESS = r"""
import json, sys
import numpy as np
import rhino
spec = json.loads(sys.stdin.read())
out = []
for k, v, seed in spec["params"]:
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    ints = np.array(spec["ints"], dtype=np.int64)
    out.append({
        "hash_int": [p.hash(int(x)) for x in ints],
        "hash_str": [p.hash(s) for s in spec["strs"]],
        "kg_int": p.key_groups(ints).tolist(),
        "vn_int": p.vnodes(ints).tolist(),
        "vn_str": p.vnodes(spec["strs"]).tolist(),
    })
print(json.dumps(out))
"""


def test_deterministic_across_processes():
    """A fresh interpreter (fresh hash state, fresh address space) routes every key the same way."""
    rng = np.random.default_rng(42)
    spec = {
        "params": [[1 << 15, 256, 0], [1 << 12, 100, 7], [1, 1, 2**64 - 1], [1 << 30, 1 << 16, 123456789]],
        "ints": rng.integers(-(2**63), 2**63 - 1, size=500, dtype=np.int64).tolist() + [0, -1, 2**63 - 1],
        "strs": [f"user-{i}" for i in range(200)] + ["", "ключ", "🦏"],
    }
    res = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    theirs = json.loads(res.stdout)
    for (k, v, seed), got in zip(spec["params"], theirs):
        p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
        ints = np.array(spec["ints"], dtype=np.int64)
        assert got["hash_int"] == [p.hash(int(x)) for x in ints]
        assert got["hash_str"] == [p.hash(s) for s in spec["strs"]]
        assert got["kg_int"] == p.key_groups(ints).tolist()
        assert got["vn_int"] == p.vnodes(ints).tolist()
        assert got["vn_str"] == p.vnodes(spec["strs"]).tolist()
        # ... and both processes agree with the oracle.
        assert got["hash_int"] == [oracle_hash(int(x), seed) for x in ints]
        assert got["vn_str"] == [oracle_vnode(s, k, v, seed) for s in spec["strs"]]


def test_seed_changes_the_mapping():
    keys = np.arange(10_000, dtype=np.int64)
    a = rhino.Partitioner(num_key_groups=1 << 15, num_vnodes=256, seed=0).key_groups(keys)
    b = rhino.Partitioner(num_key_groups=1 << 15, num_vnodes=256, seed=1).key_groups(keys)
    # Independent uniform mappings over 2^15 groups agree on ~1/2^15 of keys.
    assert np.mean(a == b) < 0.01


# ---------------------------------------------------------------- the StateBackend routes the same way


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    params=st.tuples(st.integers(min_value=3, max_value=10), st.integers(min_value=1, max_value=8), SEEDS),
    keys=st.lists(KEYS, min_size=1, max_size=60, unique_by=key_bytes),
)
def test_state_backend_stores_each_key_in_the_oracle_vnode(params, keys):
    bits, v, seed = params
    k = 1 << bits
    v = min(v, k)
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    with tempfile.TemporaryDirectory() as d:
        with rhino.StateBackend.open(f"{d}/db", partitioner=p) as db:
            half = len(keys) // 2
            for x in keys[:half]:  # single-key path
                db.put(x, b"v:" + key_bytes(x))
            db.put_batch(keys[half:], [b"v:" + key_bytes(x) for x in keys[half:]])  # batch path
            placed = {}
            for vn in range(v):
                for kb, val in db.scan(vn):
                    assert kb not in placed, "a key is stored in two vnodes"
                    placed[kb] = vn
                    assert val == b"v:" + kb
            assert placed == {key_bytes(x): oracle_vnode(x, k, v, seed) for x in keys}
            assert sum(db.count(vn) for vn in range(v)) == len(keys)


def test_state_backend_routing_of_int64_batches(tmp_path):
    """A NumPy int64 batch lands key by key in the oracle's vnode (8 little-endian bytes per key)."""
    k, v, seed = 1 << 10, 16, 99
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v, seed=seed)
    keys = np.random.default_rng(5).integers(-(2**40), 2**40, size=3000, dtype=np.int64)
    keys = np.unique(keys)
    with rhino.StateBackend.open(str(tmp_path / "db"), partitioner=p) as db:
        db.put_batch(keys, np.zeros((len(keys), 4), dtype=np.uint8))
        want: dict[int, set[bytes]] = {}
        for x in keys.tolist():
            want.setdefault(oracle_vnode(x, k, v, seed), set()).add(key_bytes(x))
        for vn in range(v):
            assert {kb for kb, _ in db.scan(vn)} == want.get(vn, set())


# ---------------------------------------------------------------- uniformity


@pytest.mark.parametrize(("bits", "seed"), [(12, 0), (15, 0), (15, 0xDEADBEEF)])
def test_sequential_int64_keys_are_uniform_over_key_groups(bits, seed):
    k = 1 << bits
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=min(k, 256), seed=seed)
    keys = np.arange(2_000_000, dtype=np.int64)
    counts = np.bincount(p.key_groups(keys), minlength=k)
    assert counts.size == k and counts.sum() == keys.size
    assert scipy.stats.chisquare(counts).pvalue > 1e-4


def test_string_keys_are_uniform_over_key_groups():
    k = 1 << 12
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=256)
    keys = [f"user-{i}" for i in range(400_000)]
    counts = np.bincount(p.key_groups(keys), minlength=k)
    assert scipy.stats.chisquare(counts).pvalue > 1e-4


def test_vnodes_are_uniform_when_v_divides_k():
    k, v = 1 << 15, 256
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v)
    counts = np.bincount(p.vnodes(np.arange(1_000_000, dtype=np.int64)), minlength=v)
    assert counts.size == v
    assert scipy.stats.chisquare(counts).pvalue > 1e-4


def test_uniformity_check_rejects_skewed_mappings():
    """The chi-square check above can fail: skewed mappings of the same keys are rejected."""
    k = 1 << 12
    keys = np.arange(2_000_000, dtype=np.int64)
    # A broken mapping that only ever uses 7 key groups.
    broken = np.bincount((keys % 7) * (k // 7), minlength=k)
    assert scipy.stats.chisquare(broken).pvalue < 1e-4
    # A subtler one: the real mapping, except that every 7th key goes to the lower half.
    real = rhino.Partitioner(num_key_groups=k, num_vnodes=256).key_groups(keys).astype(np.int64)
    skewed = np.where(keys % 7 == 0, real // 2, real)
    assert scipy.stats.chisquare(np.bincount(skewed, minlength=k)).pvalue < 1e-4


# ---------------------------------------------------------------- key-group ranges


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(min_value=0, max_value=12), data=st.data())
def test_key_group_ranges_partition_all_key_groups(bits, data):
    k = 1 << bits
    v = data.draw(st.integers(min_value=1, max_value=k))
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v)
    expect_first = 0
    for vn in range(v):
        first, last = p.key_group_range(vn)
        assert first == expect_first, "ranges must be contiguous"
        assert last > first, "every vnode covers at least one key group (V <= K)"
        for kg in range(first, last):
            assert p.vnode_of_key_group(kg) == vn == kg * v // k
        expect_first = last
    assert expect_first == k


@pytest.mark.parametrize(("k", "v"), [(1 << 30, 1 << 16), (1 << 30, 3), (1 << 15, 256), (1 << 15, 1000)])
def test_key_group_range_boundaries_at_large_k(k, v):
    p = rhino.Partitioner(num_key_groups=k, num_vnodes=v)
    prev_last = 0
    for vn in list(range(min(v, 50))) + list(range(max(0, v - 50), v)):
        first, last = p.key_group_range(vn)
        if vn > 0:
            assert p.key_group_range(vn - 1)[1] == first
        assert p.vnode_of_key_group(first) == vn == first * v // k
        assert p.vnode_of_key_group(last - 1) == vn == (last - 1) * v // k
        if first > 0:
            assert p.vnode_of_key_group(first - 1) == vn - 1
        prev_last = last
    assert prev_last == k
    assert p.key_group_range(0)[0] == 0


def test_key_group_range_and_vnode_of_key_group_reject_out_of_range():
    p = rhino.Partitioner(num_key_groups=64, num_vnodes=8)
    with pytest.raises(rhino.UnknownVnodeError):
        p.key_group_range(8)
    with pytest.raises(rhino.InvalidArgumentError):
        p.vnode_of_key_group(64)


def test_partitioner_properties_and_defaults():
    p = rhino.Partitioner()
    assert (p.num_key_groups, p.num_vnodes, p.seed) == (1 << 15, 256, 0)
    q = rhino.Partitioner(num_key_groups=1 << 10, num_vnodes=10, seed=5)
    assert (q.num_key_groups, q.num_vnodes, q.seed) == (1 << 10, 10, 5)
    # K = 1: every key is in key group 0 and vnode 0.
    one = rhino.Partitioner(num_key_groups=1, num_vnodes=1)
    assert one.key_groups(np.arange(100, dtype=np.int64)).tolist() == [0] * 100
    assert one.vnode(b"anything") == 0
