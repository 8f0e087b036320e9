"""The autoscaler's policy (rhino/coordinator/autoscaler.py), pure: fed synthetic reports of
known rates, its target follows DS2's ceil(input rate / (true rate x utilization)), clamped
to [min, max] and the cores; cooldown and hysteresis hold. Expected values come from the
formula computed here in exact arithmetic (fractions), and from a small model of the policy
written from its description (docs/design.md §4, "The autoscaler"), not from the code.
Also the report's validation and the engine's report builder (rhino/engine/report.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings as hsettings, strategies as st

from rhino.coordinator.autoscaler import AutoscaleSettings, Autoscaler, validate_report
from rhino.engine.report import batch_report
from rhino.errors import InvalidArgumentError


def report(b: int, per_instance: dict[int, tuple[int, float]], *, interval: float = 1.0, t0: float = 1000.0) -> dict:
    """Batch b's report: per instance (records, busy seconds); batches begin every ``interval`` s."""
    return {"batch_s": 0.5, "records": sum(r for r, _ in per_instance.values()),
            "busy_s": {str(i): s for i, (_, s) in per_instance.items()},
            "records_by_instance": {str(i): r for i, (r, _) in per_instance.items()},
            "began_unix": t0 + b * interval}


def even(p: int, input_rate: float, true_rate: float, interval: float = 1.0) -> dict[int, tuple[int, float]]:
    """p instances sharing input_rate x interval records, each working at true_rate rec/s."""
    n = int(round(input_rate * interval))
    per = [n // p + (k < n % p) for k in range(p)]
    return {k: (r, r / true_rate) for k, r in enumerate(per)}


def ds2(input_rate: Fraction, true_rate: Fraction, u: Fraction) -> int:
    """DS2's optimal parallelism with headroom, exactly."""
    return max(1, math.ceil(input_rate / (true_rate * u)))


def feed(a: Autoscaler, b: int, per, *, p: int, plan_open=False, workers=8, interval=1.0):
    return a.observe(validate_report(report(b, per, interval=interval)), batch=b, parallelism=p,
                     plan_open=plan_open, workers_available=workers)


def S(**kw) -> AutoscaleSettings:
    base = dict(enabled=True, min_parallelism=1, max_parallelism=16, utilization=0.7, cooldown_batches=2,
                strategy="batched", cores_per_worker=2, scale_in_margin=0.2, scale_in_reports=3)
    return AutoscaleSettings(**dict(base, **kw)).check(256)


@pytest.mark.parametrize("rate", [150, 500, 700, 1000, 1337, 2100])
def test_the_target_is_ds2s_formula(rate):
    a = Autoscaler(S(cooldown_batches=0, max_parallelism=64))
    feed(a, 0, even(2, rate, 100.0), p=2, workers=32)  # the first report: no input rate yet
    d = feed(a, 1, even(2, rate, 100.0), p=2, workers=32)
    expect = ds2(Fraction(rate), Fraction(100), Fraction(7, 10))
    assert d.numbers["target"] == expect
    if expect > 2:
        assert (d.action, d.to) == ("scale_out", expect)
        assert f"2 -> {expect}" in d.reason and f"input {rate:g} rec/s" in d.reason
    else:
        assert d.action == "hold"


def test_the_first_report_and_a_missing_one_give_no_input_rate():
    a = Autoscaler(S(cooldown_batches=0))
    d = feed(a, 0, even(2, 1000, 100.0), p=2)
    assert d.action == "hold" and "previous batch" in d.reason
    d = feed(a, 2, even(2, 1000, 100.0), p=2)  # batch 1's report never came
    assert d.action == "hold" and "previous batch" in d.reason
    d = feed(a, 3, even(2, 1000, 100.0), p=2)
    assert d.action == "scale_out" and d.to == ds2(Fraction(1000), Fraction(100), Fraction(7, 10))


def test_per_instance_rate_is_the_mean_of_true_rates_and_idle_instances_are_left_out():
    a = Autoscaler(S(cooldown_batches=0, max_parallelism=64))
    # instance 0 at 100 rec/s, instance 1 at 300 rec/s, instance 2 idle (no records)
    per = {0: (400, 4.0), 1: (600, 2.0), 2: (0, 0.25)}
    feed(a, 0, per, p=3)
    d = feed(a, 1, per, p=3, workers=32)
    mean = (Fraction(400, 4) + Fraction(600, 2)) / 2
    assert d.numbers["per_instance_rate"] == pytest.approx(float(mean))
    assert d.numbers["target"] == ds2(Fraction(1000), mean, Fraction(7, 10))


def test_clamps_max_cores_and_min():
    a = Autoscaler(S(cooldown_batches=0, max_parallelism=5))
    feed(a, 0, even(2, 5000, 100.0), p=2)
    d = feed(a, 1, even(2, 5000, 100.0), p=2, workers=8)  # needs 72
    assert (d.action, d.to) == ("scale_out", 5) and "clamped" in d.reason
    a = Autoscaler(S(cooldown_batches=0, max_parallelism=16, cores_per_worker=2))
    feed(a, 0, even(2, 5000, 100.0), p=2)
    d = feed(a, 1, even(2, 5000, 100.0), p=2, workers=3)  # 3 workers x 2 cores
    assert (d.action, d.to) == ("scale_out", 6)
    a = Autoscaler(S(cooldown_batches=0, min_parallelism=3))
    feed(a, 0, even(1, 10, 100.0), p=1)
    d = feed(a, 1, even(1, 10, 100.0), p=1)  # needs 1, the floor is 3
    assert (d.action, d.to) == ("scale_out", 3) and "min parallelism" in d.reason
    # the floor wins over the cores (a person asked for it)
    a = Autoscaler(S(cooldown_batches=0, min_parallelism=4, cores_per_worker=1))
    feed(a, 0, even(4, 10, 100.0), p=4)
    assert feed(a, 1, even(4, 10, 100.0), p=4, workers=2).action == "hold"


def test_cooldown_after_a_rescale_and_no_decision_while_a_plan_is_open():
    a = Autoscaler(S(cooldown_batches=2))
    feed(a, 0, even(2, 1000, 100.0), p=2)
    d = feed(a, 1, even(2, 1000, 100.0), p=2)
    assert d.action == "scale_out" and d.to == 15
    # the plan runs over two barriers: open while batches 2 and 3 commit
    assert "plan of this operator is open" in feed(a, 2, even(2, 9000, 100.0), p=2, plan_open=True).reason
    assert feed(a, 3, even(8, 9000, 100.0), p=8, plan_open=True).action == "hold"
    # ended before batch 4: batches 4 and 5 are the cooldown, whatever the rate says
    for b in (4, 5):
        d = feed(a, b, even(15, 9000, 100.0), p=15)
        assert d.action == "hold" and "cooldown" in d.reason
    d = feed(a, 6, even(15, 9000, 100.0), p=15)
    assert (d.action, d.to) == ("scale_out", 16)  # needs 129: clamped to the max


def test_scale_in_needs_the_margin_and_k_consecutive_reports():
    a = Autoscaler(S(cooldown_batches=0, scale_in_reports=3, scale_in_margin=0.2))
    feed(a, 0, even(10, 600, 100.0), p=10)
    # 600 rec/s at 100 rec/s, u=0.7: target 9; with the margin 720/70 -> 11 >= 10: hold
    d = feed(a, 1, even(10, 600, 100.0), p=10)
    assert d.action == "hold" and d.numbers["target"] == 9 and "margin" in d.reason
    # 300 rec/s: target 5, with the margin ceil(360/70) = 6 < 10, three times in a row
    holds = [feed(a, b, even(10, 300, 100.0), p=10) for b in (2, 3)]
    assert [h.action for h in holds] == ["hold", "hold"] and "2 of 3" in holds[1].reason
    d = feed(a, 4, even(10, 300, 100.0), p=10)
    assert (d.action, d.to) == ("scale_in", ds2(Fraction(360), Fraction(100), Fraction(7, 10)))
    # one report in between that needs the current parallelism resets the count
    a = Autoscaler(S(cooldown_batches=0, scale_in_reports=2))
    feed(a, 0, even(10, 300, 100.0), p=10)
    assert feed(a, 1, even(10, 300, 100.0), p=10).action == "hold"
    assert feed(a, 2, even(10, 650, 100.0), p=10).action == "hold"
    assert feed(a, 3, even(10, 300, 100.0), p=10).action == "hold"
    assert feed(a, 4, even(10, 300, 100.0), p=10).action == "scale_in"


def test_scale_in_goes_to_the_largest_of_the_k_targets():
    a = Autoscaler(S(cooldown_batches=0, scale_in_reports=3, scale_in_margin=0.0))
    feed(a, 0, even(10, 100, 100.0), p=10)
    rates = [100, 300, 200]
    ds = [feed(a, b, even(10, r, 100.0), p=10) for b, r in enumerate(rates, start=1)]
    assert ds[-1].action == "scale_in"
    assert ds[-1].to == max(ds2(Fraction(r), Fraction(100), Fraction(7, 10)) for r in rates)


def test_state_survives_a_round_trip_through_json():
    import json

    a = Autoscaler(S(cooldown_batches=0, scale_in_reports=2))
    feed(a, 0, even(10, 300, 100.0), p=10)
    feed(a, 1, even(10, 300, 100.0), p=10)
    b = Autoscaler(a.settings, json.loads(json.dumps(a.to_doc())))
    assert feed(b, 2, even(10, 300, 100.0), p=10).action == "scale_in"


# ---- a model-based check --------------------------------------------------------------------
class Model:
    """The policy as docs/design.md §4 describes it, in exact arithmetic."""

    def __init__(self, s: AutoscaleSettings) -> None:
        self.s = s
        self.last_began = None  # (batch, began)
        self.p = None
        self.cool = 0
        self.below: list[int] = []

    def step(self, b, began, rates, records, p, plan_open, workers):
        s = self.s
        prev = self.last_began[1] if self.last_began and self.last_began[0] == b - 1 else None
        self.last_began = (b, began)
        if self.p is not None and p != self.p:
            self.cool = s.cooldown_batches
            self.below = []
        if self.p is None:
            self.below = []
        self.p = p
        if plan_open:
            self.cool, self.below = s.cooldown_batches, []
            return ("hold", p)
        if self.cool:
            self.cool -= 1
            return ("hold", p)
        if not rates or prev is None or began <= prev:
            self.below = []
            return ("hold", p)
        u = Fraction(s.utilization)
        mu = sum(rates) / len(rates)
        lam = Fraction(records) / (Fraction(began) - Fraction(prev))
        hi = max(s.min_parallelism, min(s.max_parallelism, workers * s.cores_per_worker))
        clamp = lambda x: min(max(x, s.min_parallelism), hi)  # noqa: E731
        t = clamp(ds2(lam, mu, u))
        if t > p:
            self.below, self.cool = [], s.cooldown_batches
            return ("scale_out", t)
        if t == p:
            self.below = []
            return ("hold", p)
        m = clamp(ds2(lam * (1 + Fraction(s.scale_in_margin)), mu, u))
        if m >= p:
            self.below = []
            return ("hold", p)
        self.below = (self.below + [m])[-s.scale_in_reports:]
        if len(self.below) < s.scale_in_reports:
            return ("hold", p)
        to, self.below, self.cool = min(max(self.below), hi), [], s.cooldown_batches
        return ("scale_in", to)


step = st.tuples(st.integers(1, 40) .map(lambda x: x * 50),  # input rate, rec/s
                 st.sampled_from([50, 80, 100, 125, 200, 400]),  # true rate per instance
                 st.sampled_from([0.5, 1.0, 2.0]),  # seconds between batch begins
                 st.integers(1, 6),  # workers available
                 st.integers(0, 5).map(lambda x: x == 0))  # a report lost


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=5, max_size=40),
       mn=st.integers(1, 3), span=st.integers(0, 12), cooldown=st.integers(0, 3), k=st.integers(1, 3),
       u=st.sampled_from([0.5, 0.7, 0.8, 1.0]), margin=st.sampled_from([0.0, 0.2, 0.5]),
       cores=st.integers(1, 3), plan_len=st.integers(0, 3))
def test_the_policy_follows_its_model(steps, mn, span, cooldown, k, u, margin, cores, plan_len):
    """A query under a changing rate: each rescale the policy asks for is a plan open for
    ``plan_len`` more batches, then the parallelism changes. Every decision equals the
    model's, and the invariants hold: rescales only within the clamps, a scale-out only
    above the current parallelism, no decision while a plan is open or in the cooldown."""
    s = S(min_parallelism=mn, max_parallelism=mn + span, cooldown_batches=cooldown, scale_in_reports=k,
          utilization=u, scale_in_margin=margin, cores_per_worker=cores)
    a, m = Autoscaler(s), Model(s)
    p, began, pending, last_change = mn, 1000.0, None, None
    for b, (rate, mu, dt, workers, lost) in enumerate(steps):
        began += dt
        if pending is not None and pending[0] <= b:  # the plan's last step ran at this barrier
            p, pending, last_change = pending[1], None, b
        plan_open = pending is not None
        per = even(p, rate, mu, dt)
        if lost:
            continue
        rep = validate_report(report(0, per, interval=0, t0=began))
        rates = [Fraction(r) / Fraction(rep.busy_s[i]) for i, r in rep.records_by_instance.items() if r > 0]
        records = sum(r for r, _ in per.values())
        if rates:  # skip the (measure-zero) cases where float rounding sits on an integer boundary
            lam = Fraction(records) / Fraction(dt)
            for f in (1, 1 + Fraction(margin)):
                x = lam * f / (sum(rates) / len(rates) * Fraction(u))
                assume(x == math.floor(x) or abs(float(x) - round(float(x))) > 1e-6)
        got = a.observe(rep, batch=b, parallelism=p, plan_open=plan_open, workers_available=workers)
        want = m.step(b, began, rates, records, p, plan_open, workers)
        assert (got.action, got.to) == want, (b, got.reason)
        if got.rescale:
            hi = max(mn, min(mn + span, workers * cores))
            assert mn <= got.to <= hi and got.to != p
            assert not plan_open
            assert last_change is None or b - last_change >= cooldown
            if got.action == "scale_out":
                assert got.numbers["target"] > p or p < mn
            pending = (b + 1 + plan_len, got.to)


# ---- reports -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, why", [
    ([], "JSON object"),
    ({"records": 1}, "missing"),
    (dict(report(0, {0: (5, 1.0)}), extra=1), "unknown extra"),
    (dict(report(0, {0: (5, 1.0)}), records=-1), "records must be an int"),
    (dict(report(0, {0: (5, 1.0)}), records=True), "records must be an int"),
    (dict(report(0, {0: (5, 1.0)}), batch_s=float("nan")), "batch_s"),
    (dict(report(0, {0: (5, 1.0)}), began_unix="now"), "began_unix"),
    (dict(report(0, {0: (5, 1.0)}), busy_s=[1.0]), "busy_s must map"),
    (dict(report(0, {0: (5, 1.0)}), busy_s={"x": 1.0}), "not an instance number"),
    (dict(report(0, {0: (5, 1.0)}), busy_s={"0": -1.0}), r"busy_s\[0\]"),
    (dict(report(0, {0: (5, 1.0)}), records_by_instance={"0": 1.5}), r"records_by_instance\[0\]"),
    (dict(report(0, {0: (5, 1.0)}), records=6), "sums to 5"),
])
def test_bad_reports_are_clear_invalid_argument_errors(bad, why):
    with pytest.raises(InvalidArgumentError, match=why):
        validate_report(bad)


def test_the_engine_builds_the_report_from_commit_stats():
    # a rhino.spark task's stats row: rows_in and its phases (report.py says which count)
    spark = {"checkpoint_bytes": 10, "rows_in": 300, "open_s": 0.5, "read_s": 0.1, "group_s": 0.2, "fetch_s": 0.05,
             "process_s": 1.0, "write_s": 0.15, "timers_s": 0.0, "commit_s": 2.0}
    own = {"checkpoint_bytes": 1, "records": 50, "busy_s": 0.25}
    r = batch_report({"0": spark, "3": own, "4": {"checkpoint_bytes": 7}}, began_unix=100.0, ended_unix=102.5)
    assert r["records"] == 350 and r["records_by_instance"] == {"0": 300, "3": 50}
    assert r["busy_s"] == {"0": pytest.approx(0.1 + 0.2 + 0.05 + 1.0 + 0.15), "3": 0.25}
    assert r["batch_s"] == 2.5 and r["began_unix"] == 100.0
    validate_report(r)
    assert batch_report({"0": {"checkpoint_bytes": 1}}, began_unix=0, ended_unix=1) is None
    assert batch_report({}, began_unix=0, ended_unix=1) is None


def test_settings_are_checked():
    for kw, why in [(dict(min_parallelism=0), "min_parallelism"), (dict(min_parallelism=5, max_parallelism=4),
                    "above"), (dict(max_parallelism=300), "vnodes"), (dict(utilization=0), "utilization"),
                    (dict(utilization=1.5), "utilization"), (dict(strategy="teleport"), "strategy"),
                    (dict(cores_per_worker=0), "cores_per_worker"), (dict(cooldown_batches=-1), "cooldown"),
                    (dict(scale_in_reports=0), "scale_in_reports"), (dict(scale_in_margin=-0.1), "margin"),
                    (dict(enabled="yes"), "enabled")]:
        with pytest.raises(InvalidArgumentError, match=why):
            S(**kw)
