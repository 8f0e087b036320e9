"""The autoscaler in a real coordinator (docs/design.md §4, "The autoscaler"): an in-process
``Coordinator`` against real ``rhino worker`` processes (tests/test_coordinator.py's
fixture), batches run by the test harness's engine on the workers, each commit carrying
a report of a synthetic rate. A rate above what the instances can take plans a rescale,
which runs at the next ``begin_batch``; ``status`` shows it; the settings and the
policy's state survive a coordinator restart; a low rate scales in after the cooldown
and the hysteresis. Bad reports never block a commit; bad settings and unknown operators
are clear errors. Also ``rhino autoscale`` and ``rhino status`` against a ``rhino
coordinator`` process, and the driver's report from the instances' commit stats.

Expected parallelisms are DS2's formula computed here, in exact arithmetic.
"""

from __future__ import annotations

import json
import math
import threading
from fractions import Fraction
from typing import Any

import pytest

import rhino
import test_coordinator as tc
from placements import placement
from rhino.coordinator.types import CommitAnswer
from rhino.engine import AttemptResult, BatchDriver
from rhino_testing.harness.engine import MicroBatchEngine
from rhino_testing.harness.workers import SECRET
from test_coordinator_cli import rhino_cli

cluster = tc.cluster  # four workers on 127.0.0.2-5
OP = "auto"
V = 16
TRUE_RATE = 100  # rec/s per instance, what every synthetic report says
U = Fraction(7, 10)


def ds2(input_rate: float, cores: int, lo: int, hi: int) -> int:
    """ceil(input rate / (true rate x utilization)), clamped to [lo, min(hi, cores)]."""
    t = max(1, math.ceil(Fraction(input_rate) / (TRUE_RATE * U)))
    return min(max(t, lo), max(lo, min(hi, cores)))


class Reporting:
    """A coordinator client whose ``commit_batch`` carries a report saying the batch's
    records arrived at ``rate`` rec/s (batches begin one second apart) and each instance
    works at TRUE_RATE; ``bad`` replaces the next report. The answers are kept."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.rate, self.bad, self.answers = inner, 100, None, []

    def commit_batch(self, op: str, b: int, **kw: Any) -> Any:
        order = self.inner.placement(op).instance_order()
        n = len(order)
        total = int(self.rate)  # one second of input
        per = {str(i): total // n + (k < total % n) for k, i in enumerate(order)}
        rep = {"batch_s": 0.4, "records": total, "records_by_instance": per,
               "busy_s": {i: r / TRUE_RATE for i, r in per.items()}, "began_unix": 1_000_000.0 + b}
        if self.bad is not None:
            rep, self.bad = self.bad, None
        out = self.inner.commit_batch(op, b, report=rep, **kw)
        self.answers.append(out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def start(tmp, ws):
    coord, cc = tc.make(tmp, ws)
    rc = Reporting(cc)
    return coord, cc, rc, MicroBatchEngine(rc, OP, secret=SECRET, retry_sleep=0.05)


def run(engine: MicroBatchEngine, model: dict, b: int) -> int:
    puts = {k: f"{b}:{k}".encode() for k in range(b * 7 % 50, b * 7 % 50 + 30)}
    engine.run_batch(b, puts)
    model.update(puts)
    return b + 1


def state(cc) -> dict[int, bytes]:
    pl = cc.placement(OP)
    out: dict[int, bytes] = {}
    for i, info in pl.instances.items():
        with rhino.connect(info.address, secret=SECRET) as c:
            with c.session(OP, i, batch=(pl.last_batch or 0) + 1, epoch=pl.epoch) as s:
                out.update({int.from_bytes(k, "little", signed=True): v for k, v in s.scan(page_size=500)})
                s.abort()
    return out


def test_autoscale_plans_applies_shows_and_survives_a_restart(cluster) -> None:
    tmp, ws = cluster
    coord, cc, rc, engine = start(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    a = cc.autoscale(OP, min_parallelism=1, max_parallelism=4, cooldown_batches=1, strategy="all-at-once",
                     scale_in_reports=2)
    assert a["enabled"] and a["settings"]["utilization"] == 0.7 and a["decisions"] == []
    assert a["settings"]["cores_per_worker"] == 1
    model: dict[int, bytes] = {}
    b = run(engine, model, 0)  # the first report: no input rate yet
    assert rc.answers[-1].autoscale["action"] == "hold"
    assert "previous batch" in rc.answers[-1].autoscale["reason"]

    rc.rate = 250  # needs ceil(250 / 70) = 4
    b = run(engine, model, b)
    want = ds2(250, cores=4, lo=1, hi=4)
    d = rc.answers[-1].autoscale
    assert (d["action"], d["from"], d["to"]) == ("scale_out", 2, want) and d["plan"] is not None
    assert d["numbers"]["input_rate"] == 250 and d["numbers"]["per_instance_rate"] == TRUE_RATE
    assert len(cc.placement(OP).instances) == 2  # planned, not yet run
    st = next(o for o in cc.status()["operators"] if o["operator_id"] == OP)
    assert st["plans"][0]["id"] == d["plan"] and st["plans"][0]["strategy"] == "all-at-once"
    assert st["autoscale"]["decisions"][-1]["to"] == want and "scale_out 2 -> 4" in st["autoscale"]["decisions"][-1][
        "reason"]
    assert any(e["kind"] == "autoscale_decision" for e in cc.status()["events"])

    b = run(engine, model, b)  # the plan's step runs at this batch's begin_batch
    assert len(cc.placement(OP).instances) == want
    assert coord.meta.plan(d["plan"]).state == "done"
    assert rc.answers[-1].autoscale["action"] == "hold"  # the cooldown (1 batch)
    assert "cooldown" in rc.answers[-1].autoscale["reason"]
    assert state(cc) == model

    # a restarted coordinator goes on with the settings, the decisions and the policy's state
    coord.close()
    coord, cc, rc, engine = start(tmp, ws)
    st = next(o for o in cc.status()["operators"] if o["operator_id"] == OP)["autoscale"]
    assert st["enabled"] and st["settings"]["max_parallelism"] == 4 and st["decisions"][-1]["plan"] == d["plan"]
    rc.rate = 60  # needs 1; with the 0.2 margin ceil(72/70) = 2 < 4: two reports, then in to 2
    b = run(engine, model, b)
    first = rc.answers[-1].autoscale
    assert first["action"] == "hold" and "1 of 2" in first["reason"]  # the previous batch's begin was kept
    b = run(engine, model, b)
    d2 = rc.answers[-1].autoscale
    expect_in = max(1, math.ceil(Fraction(60) * Fraction(6, 5) / (TRUE_RATE * U)))
    assert (d2["action"], d2["from"], d2["to"]) == ("scale_in", 4, expect_in)
    b = run(engine, model, b)
    assert len(cc.placement(OP).instances) == expect_in
    assert state(cc) == model
    text = rhino_status_text(coord)
    assert "autoscale: on, parallelism 1..4" in text and "4 -> 2" in text and "2 -> 4" in text
    coord.close()


def rhino_status_text(coord) -> str:
    from rhino.cli.control import format_status

    return format_status(coord.status())


def test_bad_reports_never_block_a_commit_and_bad_settings_are_refused(cluster) -> None:
    tmp, ws = cluster
    coord, cc, rc, engine = start(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    model: dict[int, bytes] = {}
    b = run(engine, model, 0)
    assert rc.answers[-1].autoscale is None and rc.answers[-1].report_error is None  # off: the report is unused
    for bad, why in [({"records": 5}, "missing"), ({**dict.fromkeys(("batch_s", "records", "busy_s",
                                                                   "records_by_instance", "began_unix"), "x")},
                                                    "must be"), ([1, 2], "JSON object")]:
        rc.bad = bad
        b = run(engine, model, b)
        assert rc.answers[-1].last_batch == b - 1
        assert rc.answers[-1].report_error.startswith("InvalidArgumentError") and why in \
            rc.answers[-1].report_error
    # with autoscaling on, a bad report still commits and decides nothing
    cc.autoscale(OP, min_parallelism=1, max_parallelism=3)
    rc.bad = {"records": -1}
    b = run(engine, model, b)
    assert rc.answers[-1].report_error is not None and rc.answers[-1].autoscale is None
    assert state(cc) == model
    with pytest.raises(rhino.UnknownInstanceError):
        cc.autoscale("nope", min_parallelism=1, max_parallelism=2)
    with pytest.raises(rhino.UnknownInstanceError):
        cc.commit_batch("nope", 0, report={"records": 1})
    for kw, why in [(dict(min_parallelism=3, max_parallelism=2), "above"),
                    (dict(min_parallelism=1, max_parallelism=V + 1), "vnodes"),
                    (dict(min_parallelism=1, max_parallelism=2, utilization=2.0), "utilization"),
                    (dict(min_parallelism=1, max_parallelism=2, strategy="teleport"), "strategy"),
                    (dict(min_parallelism=1, max_parallelism=2, bogus=1), "bogus"),
                    (dict(), "min_parallelism and max_parallelism")]:
        with pytest.raises(rhino.InvalidArgumentError, match=why):
            cc.autoscale(OP, **kw)
    # off keeps the settings; the reports are then unused
    off = cc.autoscale(OP, enabled=False)
    assert off["enabled"] is False and off["settings"]["max_parallelism"] == 3
    rc.rate = 10_000
    b = run(engine, model, b)
    assert rc.answers[-1].autoscale is None and not cc.status()["plans_in_flight"]
    coord.close()


def test_a_plan_open_holds_the_autoscaler_and_status_is_served_meanwhile(cluster) -> None:
    """A person's plan is open: the autoscaler decides nothing until it ended; the commit path
    (which plans under the coordinator's one lock) never blocks another thread's calls."""
    tmp, ws = cluster
    coord, cc, rc, engine = start(tmp, ws)
    cc.create_operator(OP, parallelism=2, num_vnodes=V, replicas=1)
    cc.autoscale(OP, min_parallelism=1, max_parallelism=4, cooldown_batches=0)
    model: dict[int, bytes] = {}
    b = run(engine, model, 0)
    plan = cc.rescale(OP, 3, strategy="fluid")  # several barriers long
    stop = threading.Event()
    seen: list[int] = []

    def poll() -> None:  # calls that take the coordinator's lock, between and during the commits
        while not stop.is_set():
            seen.append(cc.autoscale(OP, min_parallelism=1, max_parallelism=4, cooldown_batches=0)["enabled"])

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    rc.rate = 1000
    for _ in range(3):
        b = run(engine, model, b)
        assert rc.answers[-1].autoscale["action"] == "hold"
        assert "plan of this operator is open" in rc.answers[-1].autoscale["reason"]
    stop.set()
    t.join(timeout=10)
    assert not t.is_alive() and seen
    cc.cancel_plan(OP, plan["plan"])
    b = run(engine, model, b)  # the plan ended: no cooldown (0): scale out to the cap
    d = rc.answers[-1].autoscale
    n = len(cc.placement(OP).instances)
    assert (d["action"], d["from"], d["to"]) == ("scale_out", n, ds2(1000, cores=4, lo=1, hi=4))
    assert state(cc) == model
    coord.close()


def test_the_driver_reports_records_and_busy_time_from_commit_stats() -> None:
    """BatchDriver's commit carries the report built from the instances' commit stats
    (rhino/engine/report.py), and none when they hold no record counts."""
    calls: list[dict] = []

    class C:
        def begin_batch(self, op, batch):
            return placement(1)

        def commit_batch(self, op, batch, **kw):
            calls.append(kw)
            return CommitAnswer(operator_id=op, last_batch=batch)

    stats = {"0": {"checkpoint_bytes": 1, "rows_in": 40, "read_s": 0.1, "process_s": 0.3, "commit_s": 5.0},
             "1": {"checkpoint_bytes": 1, "records": 60, "busy_s": 0.2}}
    BatchDriver(C(), "op").run(0, lambda a: AttemptResult(epoch=1, instances=stats))
    rep = calls[-1]["report"]
    assert rep["records"] == 100 and rep["records_by_instance"] == {"0": 40, "1": 60}
    assert rep["busy_s"]["0"] == pytest.approx(0.4) and rep["busy_s"]["1"] == 0.2  # commit_s is not busy time
    assert 0 <= rep["batch_s"] < 5 and rep["began_unix"] > 1e9
    BatchDriver(C(), "op").run(1, lambda a: AttemptResult(epoch=1, instances={"0": {"checkpoint_bytes": 1}}))
    assert "report" not in calls[-1]


def test_rhino_autoscale_cli(tmp_path) -> None:
    import time

    from rhino.coordinator.client import connect_coordinator
    from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret

    sf = write_secret(tmp_path, SECRET)
    co = CoordinatorProcess(tmp_path, secret_file=sf, heartbeat_timeout=2.0).start()
    ws = [WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                        extra_args=["--coordinator", co.address]).start() for n in (2, 3)]
    cc = connect_coordinator(co.address, secret=SECRET)
    env = {"RHINO_COORDINATOR": co.address, "RHINO_SECRET_FILE": str(sf)}
    try:
        deadline = time.monotonic() + 20
        while sum(w["state"] == "alive" for w in cc.status()["workers"]) < 2:
            assert time.monotonic() < deadline, "workers did not register"
            time.sleep(0.1)
        cc.create_operator("q", parallelism=1, num_vnodes=8, replicas=1)
        p = rhino_cli("autoscale", "q", "--min", "1", "--max", "2", "--cores-per-worker", "1", "--json", env=env)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["settings"]["max_parallelism"] == 2
        p = rhino_cli("autoscale", "q", "--min", "1", "--max", "2", "--utilization", "0.5", env=env)
        assert p.returncode == 0 and "q: autoscale: on, parallelism 1..2, utilization 0.5" in p.stdout, p.stdout
        # over the wire: a commit with a report, decided on (the first: no input rate yet)
        engine = MicroBatchEngine(Reporting(cc), "q", secret=SECRET)
        engine.run_batch(0, {1: b"x"})
        p = rhino_cli("status", env=env)
        assert "autoscale: on" in p.stdout and "last: batch 0 hold" in p.stdout, p.stdout
        p = rhino_cli("autoscale", "q", "--off", env=env)
        assert p.returncode == 0 and "autoscale: off" in p.stdout
        p = rhino_cli("autoscale", "q", env=env)
        assert p.returncode == 2 and "--min N and --max N" in p.stderr
        p = rhino_cli("autoscale", "nope", "--min", "1", "--max", "2", env=env)
        assert p.returncode == 1 and "UnknownInstanceError" in p.stderr
        p = rhino_cli("autoscale", "q", "--min", "3", "--max", "2", env=env)
        assert p.returncode == 1 and "InvalidArgumentError" in p.stderr and "above" in p.stderr
    finally:
        cc.close()
        for w in ws:
            w.stop()
        co.stop()


def test_the_driver_commits_without_reports_to_a_coordinator_that_takes_none() -> None:
    """A coordinator of before the autoscaler refuses the unknown argument (the whole call):
    the driver commits again without it, and sends no more reports."""
    calls: list[dict] = []

    class Old:
        def begin_batch(self, op, batch):
            return placement(1)

        def commit_batch(self, op, batch, *, instances=None, load=None, epoch=None, **kw):
            calls.append(kw)
            if kw:
                raise rhino.InvalidArgumentError(f"commit_batch: unexpected keyword argument {next(iter(kw))!r}")
            return CommitAnswer(operator_id=op, last_batch=batch)

    d = BatchDriver(Old(), "op")
    stats = {"0": {"records": 5, "busy_s": 0.1}}
    for b in (0, 1):
        assert d.run(b, lambda a: AttemptResult(epoch=1, instances=stats)).attempt.number == 1
    assert calls == [{"report": calls[0]["report"]}, {}, {}]
