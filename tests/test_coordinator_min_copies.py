"""``min_copies`` (issue 46, item 5; rhino/coordinator/copies.py): the live copies of each
instance's state a batch needs, on real ``rhino worker`` processes and an in-process
coordinator.

Three workers and replicas = 2 give every instance three copies. One worker is SIGKILLed
and declared dead: with no spare, the chains stay one copy short. Then:

- by default the batch runs with two copies, and ``begin_batch``'s answer and the
  coordinator's events name each short instance and its copies;
- ``min_copies_strict`` with a 1 s wait: the batch is refused with
  ``ResourceExhaustedError`` after the wait, and nothing is committed;
- strict with a long wait, while a fourth worker registers: the batch waits for the
  repair, then begins with three copies; the new member holds the last complete
  checkpoint of every instance, read from its own store with rocksdict, equal to the
  model (not the coordinator's word for it).
"""

from __future__ import annotations

import threading
import time

import pytest

import rhino
import test_coordinator
from rhino.errors import InvalidArgumentError, ResourceExhaustedError
from test_coordinator import OP, V, Job, make

cluster = test_coordinator.cluster  # the fixture: four workers w2..w5 on 127.0.0.2-5


def _events(coord, kind: str) -> list[dict]:
    return [e for e in coord.status().get("events", []) if e.get("kind") == kind]


def test_min_copies_above_what_replicas_give_is_refused_and_creates_nothing(cluster) -> None:
    tmp, ws = cluster
    coord, cc = make(tmp, ws[:3])
    with pytest.raises(InvalidArgumentError, match="replicas=2 each instance has at most 3 copies"):
        cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2, min_copies=4)
    assert coord.meta.operator(OP) is None
    with pytest.raises(InvalidArgumentError, match="min_copies"):
        cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2, min_copies=0)


def test_a_batch_short_of_copies_runs_and_says_so_or_waits_for_a_repair(cluster, read_rocksdb) -> None:
    tmp, ws = cluster
    spare = ws[3]
    coord, cc = make(tmp, ws[:3])  # the fourth registers later
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2, min_copies=3)
    job = Job(cc, seed=46)
    job.run(2)
    assert cc.begin_batch(OP, 2).short_of_copies == ()  # three copies each

    victim = ws[2]
    victim.kill()
    cc.declare_dead(victim.id, "test: SIGKILL")
    for info in cc.placement(OP).instances.values():
        assert victim.id not in (info.primary, *info.chain) and len(info.chain) == 1  # no spare: one short

    # by default: the batch runs, and says which instances are short
    pl = cc.begin_batch(OP, 2)
    assert sorted((s.instance, s.copies, s.min_copies) for s in pl.short_of_copies) == \
        [(i, 2, 3) for i in sorted(pl.instances)]
    job.run(1)  # batch 2 commits with two copies
    assert cc.placement(OP).last_batch == 2
    ev = _events(coord, "batch_short_of_copies")
    assert ev and ev[-1]["batch"] == 2 and {x["instance"] for x in ev[-1]["instances"]} == set(pl.instances)

    # strict, with a short wait: refused by name, nothing committed
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2, min_copies_strict=True, min_copies_wait_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ResourceExhaustedError, match=r"needs 3 live copies .* instance \d+ has 2"):
        cc.begin_batch(OP, 3)
    assert time.monotonic() - t0 >= 1.0
    assert cc.placement(OP).last_batch == 2
    assert _events(coord, "batch_refused_short_of_copies")

    # strict, while a worker joins: the batch waits for the repair, then begins with every copy
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=2, min_copies_wait_s=60.0)

    def join() -> None:
        time.sleep(1.0)
        cc.register(spare.id, spare.address, unix_socket=str(spare.unix_socket), incarnation="test")

    joiner = threading.Thread(target=join)
    joiner.start()
    t0 = time.monotonic()
    pl = cc.begin_batch(OP, 3)
    waited = time.monotonic() - t0
    joiner.join()
    assert pl.short_of_copies == () and waited >= 1.0
    for info in pl.instances.values():
        assert spare.id in (info.primary, *info.chain) and len(info.chain) == 2, info
    # the new member holds batch 2's checkpoint of every instance; together they are the model
    store = rhino.ReplicaStore(str(spare.dir))
    held: dict[bytes, bytes] = {}
    for i in pl.instances:
        assert store.checkpoints(OP, i)[-1] == 2
        target = tmp / f"read-{i}"
        store.restore(OP, i, 2, str(target)).close()
        for n, cf in read_rocksdb(target).items():
            if n.startswith("vnode-"):
                held.update(cf)
    assert held == {k.to_bytes(8, "little", signed=True): v for k, v in job.model.items()}
    job.run(1)
    assert cc.placement(OP).last_batch == 3
    assert job.state() == job.model
