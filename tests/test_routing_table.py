"""The epoch-versioned routing table: vnode -> instance (docs/design.md §1, issue 2 "Routing").

The initial table comes from a consistent-hash ring, so adding one instance to
p moves at most 1.5 * V / (p + 1) vnodes, all of them to the new instance.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rhino


def _loads(assignment: np.ndarray, num_instances: int) -> np.ndarray:
    return np.bincount(assignment, minlength=num_instances)


def _check_growth(v: int, p: int, before: np.ndarray, after: np.ndarray) -> None:
    """Table for p instances -> table for p + 1 instances."""
    moved = before != after
    n_moved = int(moved.sum())
    assert n_moved <= 1.5 * v / (p + 1), f"V={v}: adding instance {p} moved {n_moved} vnodes"
    # Consistent hashing: a vnode that moves goes to the new instance; none shuffle between old ones.
    assert np.all(after[moved] == p)
    assert not np.any(before == p), "the new instance cannot own anything before it exists"
    # The new instance gets its fair share (that is what 'about V/(p+1)' means).
    assert n_moved >= v // (p + 1)


def _check_balanced(assignment: np.ndarray, v: int, p: int) -> None:
    assert assignment.shape == (v,) and assignment.dtype == np.int32
    assert assignment.min() >= 0 and assignment.max() < p
    loads = _loads(assignment, p)
    assert loads.sum() == v
    assert loads.max() - loads.min() <= 1
    assert loads.min() >= 1


def _sample_ps(v: int) -> list[int]:
    top = v // 4
    if v <= 256:
        return list(range(1, top + 1))
    # V = 1024: every p up to 64, then a spread sample up to V/4 (each table costs O(p V log V)).
    return sorted(set(range(1, 65)) | set(range(65, top + 1, 9)) | {top - 1, top})


@pytest.mark.parametrize("v", [64, 256, 1024])
def test_adding_one_instance_moves_few_vnodes(v):
    ps = _sample_ps(v)
    for p in ps:
        before = rhino.RoutingTable.from_ring(v, p).assignment
        after = rhino.RoutingTable.from_ring(v, p + 1).assignment
        _check_balanced(before, v, p)
        _check_balanced(after, v, p + 1)
        _check_growth(v, p, before, after)


@settings(max_examples=150, deadline=None)
@given(
    v=st.integers(min_value=2, max_value=600),
    data=st.data(),
    tokens=st.integers(min_value=1, max_value=300),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_ring_property_over_seeds_and_tokens(v, data, tokens, seed):
    p = data.draw(st.integers(min_value=1, max_value=v - 1), label="p")
    before = rhino.RoutingTable.from_ring(v, p, tokens_per_instance=tokens, seed=seed).assignment
    after = rhino.RoutingTable.from_ring(v, p + 1, tokens_per_instance=tokens, seed=seed).assignment
    _check_balanced(before, v, p)
    _check_balanced(after, v, p + 1)
    _check_growth(v, p, before, after)


@settings(max_examples=30, deadline=None)
@given(
    v=st.integers(min_value=8, max_value=300),
    tokens=st.integers(min_value=1, max_value=128),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_growing_one_instance_at_a_time_is_a_chain_of_small_moves(v, tokens, seed):
    """From 1 to V/2 instances: the total moved is the sum of the fair shares, never a reshuffle."""
    prev = rhino.RoutingTable.from_ring(v, 1, tokens_per_instance=tokens, seed=seed).assignment
    assert np.all(prev == 0)
    for p in range(1, v // 2):
        nxt = rhino.RoutingTable.from_ring(v, p + 1, tokens_per_instance=tokens, seed=seed).assignment
        _check_growth(v, p, prev, nxt)
        prev = nxt


def test_ring_depends_on_seed_but_not_on_call():
    a = rhino.RoutingTable.from_ring(256, 10, seed=1).assignment
    b = rhino.RoutingTable.from_ring(256, 10, seed=1).assignment
    c = rhino.RoutingTable.from_ring(256, 10, seed=2).assignment
    assert np.array_equal(a, b)
    # Same balance, different placement: the ring, not a fixed formula, picks the vnodes.
    assert not np.array_equal(a, c)
    assert np.array_equal(np.sort(_loads(a, 10)), np.sort(_loads(c, 10)))


def test_ring_is_deterministic_across_processes():
    cases = [(64, 5, 64, 0), (256, 17, 32, 7), (1024, 100, 8, 2**63 + 5)]
    code = (
        "import json, rhino\n"
        f"cases = {cases!r}\n"
        "print(json.dumps([rhino.RoutingTable.from_ring(v, p, tokens_per_instance=t, seed=s).assignment.tolist()"
        " for v, p, t, s in cases]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    theirs = json.loads(res.stdout)
    for (v, p, t, s), got in zip(cases, theirs):
        assert got == rhino.RoutingTable.from_ring(v, p, tokens_per_instance=t, seed=s).assignment.tolist()


def test_from_ring_metadata():
    t = rhino.RoutingTable.from_ring(128, 6, epoch=41)
    assert (t.num_vnodes, t.num_instances, t.epoch) == (128, 6, 41)
    assert rhino.RoutingTable.from_ring(128, 6).epoch == 0
    # One instance holds everything; V instances hold one vnode each.
    assert np.all(rhino.RoutingTable.from_ring(32, 1).assignment == 0)
    assert sorted(rhino.RoutingTable.from_ring(32, 32).assignment.tolist()) == list(range(32))


# ---------------------------------------------------------------- lookups


@settings(max_examples=50, deadline=None)
@given(v=st.integers(min_value=1, max_value=500), data=st.data())
def test_instances_of_agrees_with_instance_of_and_vnodes_of(v, data):
    p = data.draw(st.integers(min_value=1, max_value=v))
    t = rhino.RoutingTable.from_ring(v, p, seed=data.draw(st.integers(min_value=0, max_value=2**32)))
    queries = data.draw(st.lists(st.integers(min_value=0, max_value=v - 1), max_size=200))
    scalar = [t.instance_of(x) for x in queries]
    for form in (np.array(queries, dtype=np.int64), np.array(queries, dtype=np.int32), queries):
        got = t.instances_of(form)
        assert got.dtype == np.int32
        assert got.tolist() == scalar
    everything = t.instances_of(np.arange(v))
    assert np.array_equal(everything, t.assignment)
    for i in range(p):
        assert t.vnodes_of(i) == [x for x in range(v) if t.instance_of(x) == i]
    assert t.vnodes_of(p) == []


@pytest.mark.parametrize("bad", [[16], [-1], [0, 1, 16], [2**32 + 3], [2**31], [-(2**31) - 1]])
def test_instances_of_rejects_out_of_range_vnodes(bad):
    t = rhino.RoutingTable.from_ring(16, 3)
    with pytest.raises(rhino.UnknownVnodeError) as e:
        t.instances_of(np.array(bad, dtype=np.int64))
    assert isinstance(e.value, KeyError) and isinstance(e.value, rhino.RhinoError)
    with pytest.raises(rhino.UnknownVnodeError):
        t.instances_of(bad)


def test_instances_of_rejects_non_integer_vnodes():
    t = rhino.RoutingTable.from_ring(16, 3)
    with pytest.raises(rhino.InvalidArgumentError):  # 3.9 must not be truncated to vnode 3
        t.instances_of(np.array([3.9]))
    with pytest.raises(rhino.InvalidArgumentError):
        t.instances_of(np.zeros((2, 2), dtype=np.int64))


def test_instance_of_rejects_out_of_range_vnodes():
    t = rhino.RoutingTable.from_ring(16, 3)
    for bad in (16, -1, 10**6):
        with pytest.raises(rhino.UnknownVnodeError):
            t.instance_of(bad)


@pytest.mark.parametrize(
    ("v", "p", "tokens"),
    [(4, 5, 64), (1, 2, 64), (0, 1, 64), (16, 0, 64), (16, 2, 0)],
)
def test_from_ring_rejects_bad_arguments(v, p, tokens):
    with pytest.raises(rhino.InvalidArgumentError) as e:
        rhino.RoutingTable.from_ring(v, p, tokens_per_instance=tokens)
    assert isinstance(e.value, ValueError)


# ---------------------------------------------------------------- reassign (the routing side of a handover)


@settings(max_examples=100, deadline=None)
@given(v=st.integers(min_value=2, max_value=300), data=st.data())
def test_reassign_moves_exactly_the_listed_vnodes(v, data):
    p = data.draw(st.integers(min_value=1, max_value=v))
    t = rhino.RoutingTable.from_ring(v, p, epoch=data.draw(st.integers(min_value=0, max_value=1000)))
    before = t.assignment.copy()
    moved = data.draw(st.lists(st.integers(min_value=0, max_value=v - 1), max_size=v, unique=True))
    target = data.draw(st.integers(min_value=0, max_value=p))  # p == a new instance
    u = t.reassign(moved, target)
    assert u.epoch == t.epoch + 1
    assert u.num_instances == max(p, target + 1)
    after = u.assignment
    mask = np.zeros(v, dtype=bool)
    mask[moved] = True
    assert np.all(after[mask] == target)
    assert np.array_equal(after[~mask], before[~mask])
    # The original table is immutable.
    assert np.array_equal(t.assignment, before)
    assert u.instances_of(np.arange(v)).tolist() == after.tolist()


def test_reassign_chain_bumps_epoch_each_time():
    t = rhino.RoutingTable.from_ring(64, 4, epoch=10)
    u = t.reassign([0], 1).reassign([1, 2], 2).reassign([], 0)
    assert u.epoch == 13
    assert u.instance_of(0) == 1 and u.instance_of(1) == 2 and u.instance_of(2) == 2


def test_reassign_rejects_bad_targets_and_vnodes():
    t = rhino.RoutingTable.from_ring(16, 3, epoch=5)
    before = t.assignment.copy()
    with pytest.raises(rhino.InvalidArgumentError):
        t.reassign([0], 4)  # neither an existing instance nor the next new one
    with pytest.raises(rhino.InvalidArgumentError):
        t.reassign([0], -1)
    with pytest.raises(rhino.UnknownVnodeError):
        t.reassign([0, 16], 1)
    assert np.array_equal(t.assignment, before) and t.epoch == 5


def test_explicit_assignment_table():
    t = rhino.RoutingTable(np.array([0, 1, 1, 0, 2], dtype=np.int32), 3, epoch=2)
    assert (t.num_vnodes, t.num_instances, t.epoch) == (5, 3, 2)
    assert t.instances_of([4, 3, 2]).tolist() == [2, 0, 1]
    assert t.vnodes_of(1) == [1, 2]
    with pytest.raises(rhino.InvalidArgumentError):
        rhino.RoutingTable(np.array([0, 3]), 3)
    with pytest.raises(rhino.InvalidArgumentError):
        rhino.RoutingTable(np.array([0, -1]), 3)
    with pytest.raises(rhino.InvalidArgumentError):
        rhino.RoutingTable(np.array([], dtype=np.int32), 3)
