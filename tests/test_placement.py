"""The Replication Manager's placement (rhino.coordinator.placement; docs/design.md §3 Phase 1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhino.coordinator.placement import (ChainRepair, InstanceInfo, WorkerInfo, choose_primary, place_chains,
                                         rebalance_chains, repair_chains)
from rhino.errors import InvalidArgumentError


def load_of(instances, chains, ids):
    load = dict.fromkeys(ids, 0)
    for inst in instances:
        for m in set(chains[inst.key]) & load.keys():
            load[m] += max(inst.bytes, 1)
    return load


@st.composite
def clusters(draw, min_workers=2, racks=True):
    """(instances, workers, r) with r < number of workers, primaries among the workers."""
    n = draw(st.integers(min_workers, 8))
    workers = [WorkerInfo(f"w{i}", draw(st.sampled_from([None, "a", "b"])) if racks else None,
                          draw(st.sampled_from([None, "z1", "z2"])) if racks else None) for i in range(n)]
    r = draw(st.integers(0, n - 1))
    sizes = draw(st.lists(st.integers(0, 1000), max_size=20))
    prim = st.sampled_from([w.id for w in workers])
    instances = [InstanceInfo(("op", i), draw(prim), b) for i, b in enumerate(sizes)]
    return instances, workers, r


def check_chains(instances, workers, r, chains):
    ids = {w.id for w in workers}
    assert set(chains) == {i.key for i in instances}
    for inst in instances:
        chain = chains[inst.key]
        assert len(chain) == r and len(set(chain)) == r
        assert inst.primary not in chain
        assert set(chain) <= ids


@pytest.mark.parametrize("mode", ["balanced", "cost"])
@settings(max_examples=60, deadline=None)
@given(c=clusters())
def test_chains_are_r_distinct_live_non_primary_workers(mode, c):
    instances, workers, r = c
    chains = place_chains(instances, workers, r, mode=mode)
    check_chains(instances, workers, r, chains)
    assert chains == place_chains(list(reversed(instances)), list(reversed(workers)), r, mode=mode)


@settings(max_examples=150, deadline=None)
@given(c=clusters(min_workers=3), data=st.data())
def test_balanced_spread_is_at_most_the_largest_instance(c, data):
    """Over the workers that are nobody's primary (any of them can take any replica), the
    replica-load spread stays within one instance, whatever the racks."""
    instances, workers, r = c
    n_primaries = data.draw(st.integers(1, len(workers) - 1))
    prim = st.sampled_from([w.id for w in workers[:n_primaries]])
    instances = [InstanceInfo(i.key, data.draw(prim), i.bytes) for i in instances]
    r = min(r, len(workers) - 1)
    chains = place_chains(instances, workers, r)
    pool = [w.id for w in workers[n_primaries:]]
    load = load_of(instances, chains, pool)
    largest = max((max(i.bytes, 1) for i in instances), default=0)
    assert max(load.values()) - min(load.values()) <= largest


def test_balanced_example_and_soft_rack_preference():
    workers = [WorkerInfo("a", rack="r1"), WorkerInfo("b", rack="r1"), WorkerInfo("c", rack="r2"),
               WorkerInfo("d", rack="r2")]
    insts = [InstanceInfo(("op", 0), "a", 100), InstanceInfo(("op", 1), "c", 100)]
    chains = place_chains(insts, workers, 1)
    # equal load (0) everywhere: each goes to the other rack, not to b (the id tie-break)
    assert chains == {("op", 0): ["c"], ("op", 1): ["a"]}
    big = [InstanceInfo(("op", i), "a", b) for i, b in enumerate([50, 40, 30, 20])]
    loads = load_of(big, place_chains(big, workers, 1), "bcd")
    assert loads == {"b": 50, "c": 50, "d": 40}  # 30+20 | 50 (off a's rack first) | 40


def test_cost_prefers_the_worker_that_already_holds_the_state():
    workers = [WorkerInfo("a"), WorkerInfo("b"), WorkerInfo("c")]
    insts = [InstanceInfo(("op", 0), "a", 1000), InstanceInfo(("op", 1), "a", 10)]
    held = {("op", 0): {"c": 1000}}
    # greedy bin packing puts the big instance on b (both empty, b < c by id): a 1000-byte copy
    assert place_chains(insts, workers, 1, held=held)[("op", 0)] == ["b"]
    assert place_chains(insts, workers, 1, mode="cost", held=held) == {("op", 0): ["c"], ("op", 1): ["b"]}


def test_cost_respects_the_rack_penalty_when_it_is_free_to():
    workers = [WorkerInfo("a", "r1"), WorkerInfo("b", "r1"), WorkerInfo("c", "r2")]
    one = [InstanceInfo(("op", 0), "a", 500)]
    assert place_chains(one, workers, 1, mode="cost") == {("op", 0): ["c"]}
    # r=2 must use b too, but the rack-distinct c still comes first
    assert place_chains(one, workers, 2, mode="cost") == {("op", 0): ["c", "b"]}
    # the penalty is (mean + 1) per shared domain: holding a bigger-than-mean state outweighs it
    two = one + [InstanceInfo(("op", 1), "c", 10)]
    assert place_chains(two, workers, 1, mode="cost", held={("op", 0): {"b": 500}}) == {("op", 0): ["b"],
                                                                                       ("op", 1): ["a"]}


def test_cost_spreads_load_and_survives_skewed_primaries():
    workers = [WorkerInfo(f"w{i}") for i in range(4)]
    insts = [InstanceInfo(("op", i), "w0", 100) for i in range(12)]
    chains = place_chains(insts, workers, 2, mode="cost")
    check_chains(insts, workers, 2, chains)
    assert load_of(insts, chains, ["w1", "w2", "w3"]) == {"w1": 800, "w2": 800, "w3": 800}


@pytest.mark.parametrize("mode", ["balanced", "cost"])
def test_place_errors(mode):
    ws = [WorkerInfo("a"), WorkerInfo("b")]
    inst = [InstanceInfo(("op", 0), "a", 1)]
    with pytest.raises(InvalidArgumentError, match="r must be >= 0"):
        place_chains(inst, ws, -1, mode=mode)
    with pytest.raises(InvalidArgumentError, match="other than its primary"):
        place_chains(inst, ws, 2, mode=mode)
    with pytest.raises(InvalidArgumentError, match="unknown placement mode"):
        place_chains(inst, ws, 1, mode="magic")
    with pytest.raises(InvalidArgumentError, match="duplicate worker"):
        place_chains(inst, ws + ws, 1, mode=mode)
    assert place_chains(inst, [WorkerInfo("b")], 1, mode=mode) == {("op", 0): ["b"]}  # primary not live


@settings(max_examples=150, deadline=None)
@given(c=clusters(min_workers=3), data=st.data())
def test_repair_chains(c, data):
    instances, workers, r = c
    chains = place_chains(instances, workers, r)
    ids = [w.id for w in workers]
    dead = set(data.draw(st.lists(st.sampled_from(ids), max_size=len(ids))))
    short = {i.key for i in instances if data.draw(st.booleans())}  # some chains lost a member earlier
    instances = [InstanceInfo(i.key, i.primary, i.bytes, tuple(chains[i.key][:-1] if i.key in short else
                                                              chains[i.key])) for i in instances]
    out = repair_chains(instances, workers, r, dead=dead)
    live = set(ids) - dead
    for inst in instances:
        if not (set(inst.chain) & dead) and len(inst.chain) >= r:
            assert inst.key not in out
            continue
        rep = out[inst.key]
        assert isinstance(rep, ChainRepair)
        survivors = [m for m in inst.chain if m not in dead]
        assert rep.removed == [m for m in inst.chain if m in dead]
        assert rep.chain == survivors + rep.added
        assert set(rep.added) <= live and inst.primary not in rep.chain
        assert len(set(rep.chain)) == len(rep.chain)
        assert len(rep.chain) == min(r, len(live - {inst.primary}))  # short only when workers run out
        assert rep.copy_from is None or (rep.copy_from not in dead
                                         and rep.copy_from in [inst.primary, *survivors])
        assert (rep.copy_from is None) == (inst.primary in dead and not survivors)


def test_repair_examples():
    ws = [WorkerInfo(w) for w in "abcd"]
    insts = [InstanceInfo(("op", 0), "a", 10, ("b", "c")), InstanceInfo(("op", 1), "b", 10, ("c", "d")),
             InstanceInfo(("op", 2), "d", 10, ("a", "b"))]
    out = repair_chains(insts, ws, 2, dead={"c"})
    assert out == {("op", 0): ChainRepair(["b", "d"], ["c"], ["d"], "a"),
                   ("op", 1): ChainRepair(["d", "a"], ["c"], ["a"], "b")}
    # the primary died too: copy from the first survivor, never pick the dead primary
    out = repair_chains(insts, ws, 2, dead={"a", "b"})
    assert out[("op", 0)] == ChainRepair(["c", "d"], ["b"], ["d"], "c")
    assert out[("op", 2)] == ChainRepair(["c"], ["a", "b"], ["c"], "d")  # degraded: only c is left
    assert repair_chains(insts, ws, 2, dead=()) == {}


@settings(max_examples=150, deadline=None)
@given(c=clusters(min_workers=2, racks=False), joined=st.integers(1, 3))
def test_rebalance_after_join(c, joined):
    instances, workers, r = c
    chains = place_chains(instances, workers, r)
    instances = [InstanceInfo(i.key, i.primary, i.bytes, tuple(chains[i.key])) for i in instances]
    grown = workers + [WorkerInfo(f"new{k}") for k in range(joined)]
    out = rebalance_chains(instances, grown, r)
    final = {i.key: out[i.key].chain if i.key in out else list(i.chain) for i in instances}
    check_chains(instances, grown, r, final)
    for inst in instances:
        if inst.key in out:
            rep = out[inst.key]
            assert rep.chain != list(inst.chain) and rep.copy_from == inst.primary
            assert set(rep.removed) == set(inst.chain) - set(rep.chain)
            assert set(rep.added) == set(rep.chain) - set(inst.chain)
    ids = [w.id for w in grown]
    load, before = load_of(instances, final, ids), load_of(instances, chains, ids)
    mean = sum(load.values()) / len(load)
    largest = max((max(i.bytes, 1) for i in instances), default=0)
    for k in range(joined):
        assert load[f"new{k}"] >= mean - largest
    assert max(load.values()) <= max(before.values())
    assert rebalance_chains([InstanceInfo(i.key, i.primary, i.bytes, tuple(final[i.key])) for i in instances],
                            grown, r) == {}  # a fixed point


def test_rebalance_example_and_top_up():
    ws = [WorkerInfo(w) for w in "abc"]
    insts = [InstanceInfo(("op", i), "a", 10, ("b", "c")) for i in range(4)]
    out = rebalance_chains(insts, ws + [WorkerInfo("d")], 2)
    # d takes one replica from b and one from c; a third would only swap the gap (20 vs 30)
    assert out == {("op", 0): ChainRepair(["c", "d"], ["b"], ["d"], "a"),
                   ("op", 1): ChainRepair(["b", "d"], ["c"], ["d"], "a")}
    short = [InstanceInfo(("op", 0), "a", 10, ("b",))]
    assert rebalance_chains(short, ws, 2) == {("op", 0): ChainRepair(["b", "c"], [], ["c"], "a")}


def test_choose_primary():
    assert choose_primary(["c", "b", "a"], {"a": 5, "b": 3, "c": 3}) == "b"
    assert choose_primary(["x", "y"], {"y": 1}) == "x"
    with pytest.raises(InvalidArgumentError):
        choose_primary([], {})
