"""The Handover Manager's vnode moves and migration strategies (rhino.coordinator.strategies; design §4),
and the planning of one handover step (rhino.coordinator.handover_step)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhino.coordinator.handover_step import plan_step
from rhino.coordinator.metadata import InstanceRow, OperatorRow, PlanRow
from rhino.coordinator.placement import WorkerInfo
from rhino.coordinator.strategies import (STRATEGIES, apply_moves, balance_moves, plan_steps, rescale_moves)
from rhino.errors import InvalidArgumentError


@st.composite
def move_sets(draw):
    """Moves of distinct vnodes between up to 6 instances, origin != target."""
    p = draw(st.integers(2, 6))
    pairs = st.tuples(st.integers(0, p - 1), st.integers(0, p - 1)).filter(lambda t: t[0] != t[1])
    return [(v, o, t) for v, (o, t) in enumerate(draw(st.lists(pairs, max_size=40)))]


def max_degree(moves):
    return max([*Counter(o for _, o, _ in moves).values(), *Counter(t for _, _, t in moves).values()], default=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=100, deadline=None)
@given(moves=move_sets())
def test_every_move_in_exactly_one_step(strategy, moves):
    steps = plan_steps(moves, strategy)
    flat = [m for step in steps for m in step]
    assert sorted(flat) == sorted(moves) and all(steps)
    assert steps == plan_steps(list(reversed(moves)), strategy)  # deterministic, order-free
    if strategy == "all-at-once":
        assert len(steps) == (1 if moves else 0)
    if strategy == "fluid":
        assert all(len(s) == 1 for s in steps)
        assert flat == sorted(moves, key=lambda m: (m[1], m[0]))
    if strategy == "batched":
        for step in steps:  # a matching: one vnode out of each origin, one into each target
            assert len({o for _, o, _ in step}) == len(step) == len({t for _, _, t in step})
        assert len(steps) == max_degree(moves) <= len(moves)


def test_batched_complete_bipartite_multigraph():
    # 3 origins x 3 targets, 2 vnodes per pair: degree 6, 18 moves
    moves = [(v, o, t) for v, (o, t, _) in enumerate(itertools.product([0, 1, 2], [3, 4, 5], range(2)))]
    steps = plan_steps(moves, "batched")
    assert len(steps) == 6 and all(len(s) == 3 for s in steps)


def test_batched_covers_max_degree_nodes_first():
    # A->X, A->Y, B->X, C->Y (A=0, B=1, C=2, X=3, Y=4): the maximum matching {B->X, C->Y} would leave
    # A's two moves for two more steps; covering the degree-2 nodes A, X, Y every step needs 2
    moves = [(0, 0, 3), (1, 0, 4), (2, 1, 3), (3, 2, 4)]
    assert len(plan_steps(moves, "batched")) == 2
    assert plan_steps([(0, 0, 1), (1, 0, 2), (2, 0, 3)], "batched") == [[(0, 0, 1)], [(1, 0, 2)], [(2, 0, 3)]]


def test_plan_errors():
    with pytest.raises(InvalidArgumentError, match="all-at-once"):
        plan_steps([], "gradual")
    with pytest.raises(InvalidArgumentError, match="twice"):
        plan_steps([(1, 0, 1), (1, 1, 2)], "fluid")
    with pytest.raises(InvalidArgumentError, match="origin equals"):
        plan_steps([(1, 2, 2)], "batched")
    assert plan_steps([], "batched") == []


def min_moves(assignment, new):
    """V minus the most vnodes that can stay, trying every choice of which instances get ceil(V/p)."""
    v, p, count = len(assignment), len(new), Counter(assignment)
    best = max(sum(min(count[i], v // p + (i in big)) for i in new)
               for big in itertools.combinations(new, v % p))
    return v - best


@pytest.mark.parametrize("v,old,new", [(64, range(3), range(4)), (64, range(4), range(2)), (64, [0], range(8)),
                                       (64, range(8), [0]), (64, range(4), [2, 3, 7, 9]), (10, range(3), range(7))])
def test_rescale_examples(v, old, new):
    old, new = list(old), list(new)
    assignment = [old[i * len(old) // v] for i in range(v)]  # contiguous, balanced ranges
    moves = rescale_moves(assignment, old, new)
    after = apply_moves(assignment, moves)
    counts = Counter(after)
    assert set(counts) <= set(new) and all(counts[i] in (v // len(new), -(-v // len(new))) for i in new)
    assert len(moves) == min_moves(assignment, new)
    assert len({m[0] for m in moves}) == len(moves) and all(o != t for _, o, t in moves)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_rescale_property(data):
    old = sorted(data.draw(st.sets(st.integers(0, 9), min_size=1, max_size=6)))
    new = sorted(data.draw(st.sets(st.integers(0, 9), min_size=1, max_size=6)))
    assignment = data.draw(st.lists(st.sampled_from(old), max_size=48))
    moves = rescale_moves(assignment, old, new)
    after = apply_moves(assignment, moves)
    counts = Counter(after)
    v, p = len(assignment), len(new)
    assert set(counts) <= set(new) and all(counts[i] in (v // p, -(-v // p)) for i in new)
    assert not set(after) & (set(old) - set(new))  # leaving instances own nothing
    assert len(moves) == min_moves(assignment, new)
    assert moves == sorted(moves) and len({m[0] for m in moves}) == len(moves)
    for step in plan_steps(moves, "batched"):
        assert len({o for _, o, _ in step}) == len(step)


def test_rescale_errors():
    with pytest.raises(InvalidArgumentError, match="not among"):
        rescale_moves([0, 5], [0, 1], [0])
    with pytest.raises(InvalidArgumentError, match="zero instances"):
        rescale_moves([0, 1], [0, 1], [])
    assert rescale_moves([], [0], []) == []


def spread(assignment, instances, load):
    per = {i: 0.0 for i in instances}
    for v, o in enumerate(assignment):
        per[o] += load.get(v, 0)
    return per


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_balance_never_raises_the_max_nor_empties(data):
    p = data.draw(st.integers(1, 5))
    assignment = data.draw(st.lists(st.integers(0, p - 1), max_size=40))
    load = {v: data.draw(st.floats(0, 100)) for v in range(len(assignment)) if data.draw(st.booleans())}
    max_moves = data.draw(st.one_of(st.none(), st.integers(0, 10)))
    moves = balance_moves(assignment, list(range(p)), load, max_moves=max_moves)
    after = apply_moves(assignment, moves)
    before_l, after_l = spread(assignment, range(p), load), spread(after, range(p), load)
    assert max(after_l.values()) <= max(before_l.values()) + 1e-9
    assert all(Counter(after)[i] >= 1 for i in set(assignment))
    assert len({m[0] for m in moves}) == len(moves) and all(o != t for _, o, t in moves)
    assert max_moves is None or len(moves) <= max_moves
    plan_steps(moves, "batched")  # composes


def test_balance_skewed_becomes_even():
    assignment = [i % 4 for i in range(32)]
    load = {v: (10.0 if assignment[v] == 0 else 1.0) for v in range(32)}  # instance 0 is 10x hot
    before = spread(assignment, range(4), load)
    moves = balance_moves(assignment, range(4), load)
    after = spread(apply_moves(assignment, moves), range(4), load)
    assert max(after.values()) - min(after.values()) < (max(before.values()) - min(before.values())) / 2
    assert max(after.values()) < max(before.values())
    assert balance_moves(assignment, range(4), load) == moves  # deterministic
    assert len(balance_moves(assignment, range(4), load, max_moves=2)) == 2


def test_balance_uniform_or_tolerable_gives_no_moves():
    assignment = [i % 4 for i in range(32)]
    assert balance_moves(assignment, range(4), {v: 3.0 for v in range(32)}) == []
    assert balance_moves(assignment, range(4), {}) == []
    near = {v: 1.0 + 0.01 * (assignment[v] == 0) for v in range(32)}  # 1% skew, within 5%
    assert balance_moves(assignment, range(4), near) == []
    assert balance_moves([0, 1], [0, 1], {0: 100.0}) == []  # moving its only vnode would empty 0


def test_apply_moves():
    assert apply_moves([0, 0, 1], [(1, 0, 2), (1, 2, 1)]) == [0, 1, 1]
    with pytest.raises(InvalidArgumentError, match="owned by 0, not 1"):
        apply_moves([0, 0], [(1, 1, 0)])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        apply_moves([0], [(3, 0, 1)])


# ---- one handover step, planned before any worker is asked ----------------------------------

def _op(epoch: int = 4) -> OperatorRow:
    return OperatorRow(operator_id="op", num_vnodes=8, num_key_groups=64, seed=0, replicas=1, placement="balanced",
                       epoch=epoch, last_batch=7, created_at=0.0)


def _row(i: int, primary: str, chain: list[str], **kw) -> InstanceRow:
    fields = {"last_complete": 7, "redo_version": None, "redo": [], **kw}
    return InstanceRow(operator_id="op", instance=i, primary_worker=primary, chain=chain, chain_version=1,
                       state="active", bytes=100, **fields)


def _plan(steps, placement=None) -> PlanRow:
    return PlanRow(id=3, operator_id="op", kind="handover", strategy="all-at-once", steps=steps, steps_done=0,
                   after_batch=7, state="scheduled", created_at=0.0, updated_at=0.0, message="", bytes_moved=0,
                   seconds=0.0, placement=placement or {})


WORKERS = [WorkerInfo("wa"), WorkerInfo("wb"), WorkerInfo("wc")]


def test_step_vertical_scaling_imports_where_the_checkpoint_is():
    rows = {0: _row(0, "wa", ["wb"]), 1: _row(1, "wc", ["wa"])}
    assignment = [0, 0, 0, 0, 1, 1, 1, 1]
    # Vnode 4 is no longer 0's (another plan moved it): its move is dropped.
    step = plan_step(_plan([[[0, 0, 2], [1, 0, 2], [4, 0, 2]]]), 7, _op(), rows, assignment,
                     alive={"wa", "wb", "wc"}, workers=WORKERS)
    assert step.moves == [(0, 0, 2), (1, 0, 2)] and step.epoch == 5
    assert step.new_rows[2].primary_worker in {"wa", "wb"} and step.new_rows[2].last_complete == 7
    assert step.copies() == []  # its worker holds 0's checkpoint 7: hard links, no bytes move
    assert step.ops == {2: [{"op": "import", "from_operator": "op", "from_instance": 0, "checkpoint": 7,
                             "vnodes": [0, 1]}],
                        0: [{"op": "drop", "vnodes": [0, 1]}]}
    assert step.new_assignment() == [2, 2, 0, 0, 1, 1, 1, 1]
    doc = step.doc()
    assert doc["plan"] == 3 and doc["step"] == 0 and doc["epoch"] == 5 and doc["batch"] == 7
    assert list(doc["ops"]) == ["2", "0"] and list(doc["new"]) == ["2"]
    committed, retired = step.committed_rows()
    by = {r.instance: r for r in committed}
    assert retired == [] and by[0].redo_version == 7 and by[0].redo == doc["ops"]["0"]
    assert by[2].redo == [] and rows[0].redo == []  # the rows it was given are left as they were


def test_step_horizontal_scaling_copies_first_and_retires_the_emptied():
    rows = {0: _row(0, "wa", ["wb"]), 1: _row(1, "wb", ["wa"], redo_version=7, redo=[{"op": "drop", "vnodes": [9]}])}
    assignment = [0, 0, 1, 1, 1, 1, 1, 1]
    step = plan_step(_plan([[[0, 0, 2], [1, 0, 2]]], placement={2: "wc"}), 7, _op(), rows, assignment,
                     alive={"wa", "wb", "wc"}, workers=WORKERS)
    assert step.new_rows[2].primary_worker == "wc"  # asked for
    assert step.copies() == [(rows[0], "wc")]  # wc holds no replica of 0: a bulk copy first
    committed, retired = step.committed_rows()
    assert retired == [0] and {r.instance: r.state for r in committed} == {0: "retired", 1: "active", 2: "active"}


def test_step_needs_checkpoint_b_everywhere():
    rows = {0: _row(0, "wa", ["wb"]), 1: _row(1, "wb", ["wa"], last_complete=6)}
    with pytest.raises(InvalidArgumentError, match="checkpoint 7 complete everywhere"):
        plan_step(_plan([[[0, 0, 1]]]), 7, _op(), rows, [0, 1], alive={"wa", "wb"}, workers=WORKERS[:2])
