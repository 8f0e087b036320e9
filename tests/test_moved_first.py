"""The moved instances' tasks start first (spark_integration/spark/scheduling/moved_first.py).

A model of Spark's choice stands in for the task scheduler (TaskSetManager.dequeueTask,
one round per locality level, most local first): a free core of executor e on host h takes
the pending task of lowest index that prefers e (PROCESS_LOCAL), then in the next round
one that prefers h (NODE_LOCAL), then one with no preference. A partition without a
preference inherits the shuffle's reduce locality (the host its input was written on),
which the model plays with ``inherited``. The real scheduler is exercised by the recovery
benchmark and the host-loss tests."""

from __future__ import annotations

from rhino.spark.scheduling.moved_first import moved, preferred_locations


def _host(loc: str) -> str:
    return loc.split("_")[1] if loc.startswith("executor_") else loc


def first_wave(prefs: list[list[str]], executors: dict[str, str], inherited: str = "") -> set[int]:
    """executors: executor id -> its host, one free core each."""
    prefs = [p or ([inherited] if inherited else []) for p in prefs]
    pending = list(range(len(prefs)))
    free = dict(executors)
    started: set[int] = set()
    rounds = [lambda p, e, h: f"executor_{h}_{e}" in p,
              lambda p, e, h: h in [_host(x) for x in p],
              lambda p, e, h: not p]
    for fits in rounds:
        for e, h in list(free.items()):
            ok = [t for t in pending if fits(prefs[t], e, h)]
            if ok:
                started.add(ok[0])
                pending.remove(ok[0])
                del free[e]
    return started


EXECS = {"h80": ["0"], "h82": ["2"]}


def test_after_a_host_loss_the_moved_instance_runs_in_the_first_wave() -> None:
    order = [0, 1, 2]
    before = {0: "h80", 1: "h81", 2: "h82"}
    after = {0: "h80", 1: "h80", 2: "h82"}  # h81 lost: instance 1 taken over on h80
    cores = {"0": "h80", "2": "h82"}
    naive = [[after[i]] for i in order]
    assert 1 not in first_wave(naive, cores)  # the problem: instance 0 goes first on h80
    # no preference for the neighbour does not help when the input was written on h80
    assert 1 not in first_wave([[], ["h80"], ["h82"]], cores, inherited="h80")
    prefs = preferred_locations(order, after, before, EXECS)
    assert prefs == [["h80"], ["executor_h80_0"], ["h82"]]
    assert first_wave(prefs, cores) == {1, 2}
    assert moved(order, after, before)


def test_nothing_moved_keeps_every_host_preference() -> None:
    hosts = {0: "a", 1: "b", 2: "a"}
    assert preferred_locations([0, 1, 2], hosts, hosts, EXECS) == [["a"], ["b"], ["a"]]
    assert preferred_locations([0, 1, 2], hosts, {}, EXECS) == [["a"], ["b"], ["a"]]  # the first job
    assert not moved([0, 1, 2], hosts, hosts) and not moved([0, 1, 2], hosts, {})


def test_a_new_instance_counts_as_moved_and_unknown_executors_fall_back_to_the_host() -> None:
    before = {0: "h80", 1: "h82"}
    after = {0: "h80", 1: "h82", 2: "h80", 3: None, 4: "h99"}  # a rescale added 2, 3 and 4
    assert preferred_locations([0, 1, 2, 3, 4], after, before, EXECS) == [
        ["h80"], ["h82"], ["executor_h80_0"], [], ["h99"]]
