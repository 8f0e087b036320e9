"""Seeded random reconfigurations of a running ``rhino.spark`` query (issue 29, Must show):
on a real local standalone cluster (``LocalCluster``, 127.0.0.120.., SIGKILL for real), while
a file-fed query runs batches, one trial applies, in a random order and with random
parameters:

- rescale up and down, each with a random strategy (all-at-once, fluid, batched);
- a handover of random vnodes to another instance, and a load rebalance;
- a host joining (``add_host``), a host decommissioned (``decommission_host``: everything
  moved off at batch barriers, then the host stopped), and a host SIGKILLed (``kill_host``:
  its instances fail over; the batch in flight runs again).

After each one: on the live workers' own listings, every instance is hosted exactly once,
by its primary, at the operator's epoch, and each vnode has exactly one owner (the
coordinator's table). At the end: every batch's output equals pandas over the same files
(exactly-once). A decommission fails no batch: no batch that began while it drained ran
twice.

``make test`` runs one trial (every kind of step once, in a seeded random order);
``make chaos`` runs ``RHINO_ELASTIC_TRIALS=20`` (random steps). Its own module: the
cluster's SparkSession must be the only one in the process.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

pyspark = pytest.importorskip("pyspark")
from pyspark import cloudpickle  # noqa: E402

import rhino  # noqa: E402
import rhino.spark  # noqa: E402

import test_spark_live_reconfigure as live  # noqa: E402
from test_spark_live_reconfigure import FedStream, RunningCount, assert_outputs_equal_oracle, make_frames  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules["test_spark_live_reconfigure"])

TRIALS = int(os.environ.get("RHINO_ELASTIC_TRIALS", "1"))
FIRST_HOST = 120  # 127.0.0.120..: no other test module's hosts
V = 16
KINDS = ["rescale-up", "rescale-down", "handover", "rebalance", "add-host", "decommission", "kill"]
STRATEGIES = ["all-at-once", "fluid", "batched"]


def check_owners(cl, cc, op_id: str) -> dict:
    """On the live workers' own listings: each active instance hosted once, by its primary,
    at the operator's epoch; each vnode one owner, the coordinator's table."""
    pl = cc.placement(op_id)
    hosted: dict[int, list] = {}
    secret = cl.secret_file.read_bytes().strip()
    for h in cl.state["hosts"]:
        if h["state"] != "up":
            continue
        with rhino.connect(h["rhino_worker"]["address"], secret=secret) as c:
            for x in c.instances():
                if x["operator_id"] == op_id:
                    hosted.setdefault(int(x["instance"]), []).append(
                        (h["rhino_worker"]["id"], int(x["epoch"]), sorted(x["vnodes"])))
    assert set(hosted) == set(pl.instances), (hosted, pl.instances)
    owners: list[list[int]] = [[] for _ in pl.assignment]
    for i, hs in hosted.items():
        assert len(hs) == 1, f"instance {i} hosted by {hs}"
        wid, epoch, vnodes = hs[0]
        assert wid == pl.instances[i].primary and epoch == pl.epoch, (i, hs, pl.epoch)
        for v in vnodes:
            owners[v].append(i)
    assert all(len(o) == 1 for o in owners), f"owners per vnode: {owners}"
    assert tuple(o[0] for o in owners) == pl.assignment
    return pl


def steps_for(rng: random.Random, trial: int) -> list[str]:
    if TRIALS == 1 or trial == 0:
        kinds = list(KINDS)  # every kind once, in a random order
        rng.shuffle(kinds)
        return kinds
    return [rng.choice(KINDS) for _ in range(6)]


@pytest.mark.parametrize("trial", range(TRIALS))
def test_random_reconfigurations_of_a_running_query_stay_exactly_once(tmp_path, trial):
    from rhino_testing.harness.spark_cluster import LocalCluster

    rng = random.Random(1000 + trial)
    kinds = steps_for(rng, trial)
    frames = make_frames(80, seed=trial)
    log: list[str] = []
    with LocalCluster.up(tmp_path / "cluster", hosts=3, first_host=FIRST_HOST, heartbeat_timeout=2.0) as cl:
        spark = cl.spark_session(f"rhino-elastic-{trial}", spare_hosts=2)
        try:
            op = rhino.spark.transform_with_state(RunningCount(), key="k", output_schema="k long, n long, s long",
                                                  operator_id="elastic", coordinator=cl.coordinator,
                                                  secret_file=str(cl.secret_file), parallelism=3, replicas=1,
                                                  num_vnodes=V)
            fs = FedStream(spark, op, tmp_path / "stream", frames).start()
            streams = [fs]
            with cl.coordinator_client() as cc:
                live.wait_until(lambda: fs.committed() >= 2, streams, "the first batches")
                drains: list[tuple[int, int]] = []
                for kind in kinds:
                    up = [h["n"] for h in cl.state["hosts"] if h["state"] == "up"]
                    pl = cc.placement("elastic")
                    p = len(pl.instances)
                    before = fs.committed()
                    if kind == "rescale-up" or (kind == "rescale-down" and p <= 2):
                        to, how = p + rng.choice([1, 2]), rng.choice(STRATEGIES)
                        plan = cc.rescale("elastic", to, strategy=how)
                    elif kind == "rescale-down":
                        to, how = max(2, p - rng.choice([1, 2])), rng.choice(STRATEGIES)
                        plan = cc.rescale("elastic", to, strategy=how)
                    elif kind == "handover":
                        src = rng.choice(sorted(set(pl.assignment)))
                        mine = [v for v, i in enumerate(pl.assignment) if i == src]
                        dst = rng.choice([i for i in pl.instances if i != src])
                        how = rng.choice(STRATEGIES)
                        plan = cc.handover("elastic", rng.sample(mine, min(len(mine), rng.choice([1, 2, 3]))), dst,
                                           strategy=how)
                    elif kind == "rebalance":
                        plans = cc.rebalance("elastic").get("plans") or []
                        plan = plans[0] if plans else None
                        how = "batched"
                    else:
                        plan = None
                    if kind.startswith(("rescale", "handover", "rebalance")):
                        log.append(f"{kind} {how} -> plan {plan and plan.get('plan')}")
                        if plan:
                            live.wait_until(live.plan_gone(cc, "elastic", plan["plan"]), streams,
                                            f"{kind} plan {plan['plan']}", timeout=180)
                    elif kind == "add-host":
                        if len(up) >= 5:
                            log.append("add-host skipped (5 hosts up)")
                            continue
                        h = cl.add_host()
                        log.append(f"add-host {h.n} ({h.rhino_worker.id})")
                    elif kind == "decommission":
                        if len(up) <= 2:
                            log.append("decommission skipped (2 hosts up)")
                            continue
                        n = rng.choice(up)
                        start = fs.committed()
                        out = _in_background(lambda: cl.decommission_host(n, timeout=180), streams)
                        # the batch in flight when the drain returned ends before the next step (a kill
                        # would run it again), so a second attempt of a batch in the window can only be
                        # the decommission's
                        end = fs.committed()
                        live.wait_until(lambda: fs.committed() >= end + 1, streams, "the batch after the decommission")
                        drains.append((start, end))
                        log.append(f"decommission host {n}: drained in {out['drain_s']:.1f} s")
                    elif kind == "kill":
                        if len(up) <= 2:
                            log.append("kill skipped (2 hosts up)")
                            continue
                        n = rng.choice(up)
                        cl.kill_host(n)
                        log.append(f"kill host {n}")
                        live.wait_until(lambda: fs.committed() >= before + 2, streams, "batches after the kill",
                                        timeout=180)
                    live.wait_until(lambda: fs.committed() >= before + 1, streams, f"a batch after {kind}")
                    check_owners(cl, cc, "elastic")
                fs.finish(streams)
        finally:
            spark.stop()
    print("\n".join(log))
    assert_outputs_equal_oracle(fs.got, frames[:fs.written])
    for start, end in drains:
        ran_twice = [r.batch for r in op.reports if start <= r.batch <= end and r.attempts > 1]
        assert not ran_twice, f"batches run again during a decommission: {ran_twice} ({log})"


def _in_background(fn, streams):
    """Runs ``fn`` in a thread while the streams are fed (a decommission waits for barriers,
    which need batches, which need input)."""
    import threading

    box: dict = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["err"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    live.wait_until(lambda: not t.is_alive(), streams, "the decommission", timeout=240)
    if "err" in box:
        raise box["err"]
    return box["out"]
