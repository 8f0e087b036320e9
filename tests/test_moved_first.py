"""The moved instances' tasks start first (spark_integration/spark/scheduling/moved_first.py).

A model of Spark's choice stands in for the task scheduler: a free core of host h takes
the pending task of lowest index that prefers h, else the lowest pending task with no
preference (TaskSetManager.dequeueTask, NODE_LOCAL then NO_PREF). The real scheduler is
exercised by the recovery benchmark and the host-loss tests."""

from __future__ import annotations

from rhino.spark.scheduling.moved_first import preferred_hosts


def first_wave(prefs: list[list[str]], hosts_with_a_core: list[str]) -> set[int]:
    pending = list(range(len(prefs)))
    started: set[int] = set()
    free = list(hosts_with_a_core)
    for h in list(free):  # NODE_LOCAL round
        local = [p for p in pending if h in prefs[p]]
        if local:
            started.add(local[0])
            pending.remove(local[0])
            free.remove(h)
    for h in list(free):  # NO_PREF round
        nopref = [p for p in pending if not prefs[p]]
        if nopref:
            started.add(nopref[0])
            pending.remove(nopref[0])
    return started


def test_after_a_host_loss_the_moved_instance_runs_in_the_first_wave() -> None:
    order = [0, 1, 2]
    before = {0: "h80", 1: "h81", 2: "h82"}
    after = {0: "h80", 1: "h80", 2: "h82"}  # h81 lost: instance 1 taken over on h80
    naive = [[after[i]] for i in order]
    assert 1 not in first_wave(naive, ["h80", "h82"])  # the problem: instance 0 goes first on h80
    prefs = preferred_hosts(order, after, before)
    assert prefs == [[], ["h80"], ["h82"]]
    assert first_wave(prefs, ["h80", "h82"]) == {1, 2}


def test_nothing_moved_keeps_every_preference() -> None:
    hosts = {0: "a", 1: "b", 2: "a"}
    assert preferred_hosts([0, 1, 2], hosts, hosts) == [["a"], ["b"], ["a"]]
    assert preferred_hosts([0, 1, 2], hosts, {}) == [["a"], ["b"], ["a"]]  # the first job


def test_a_new_instance_counts_as_moved_and_a_missing_host_has_no_preference() -> None:
    before = {0: "a", 1: "b"}
    after = {0: "a", 1: "b", 2: "a", 3: None}  # a rescale added 2 and 3
    assert preferred_hosts([0, 1, 2, 3], after, before) == [[], ["b"], ["a"], []]
