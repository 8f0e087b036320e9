"""The opt-in autoscaler's policy (docs/design.md §4, "The autoscaler"): rate-based, after
DS2 (Kalavri et al., "Three steps is all you need: fast, accurate, automatic scaling
decisions for distributed streaming dataflows", OSDI 2018).

Pure: no I/O, no clock, no coordinator. The coordinator feeds it one report per
committed batch of an operator (:func:`validate_report` checks one) with what it
knows then (the operator's parallelism, whether a plan of it is open, the cores
available), and plans the rescale it asks for. Its state is a plain dict
(:meth:`Autoscaler.to_doc`), kept in the coordinator's metadata, so a restarted
coordinator goes on where the last one stopped.

The model (DS2 §3), for one stateful operator of a micro-batch query:

- **True processing rate of an instance** = the records it processed in the batch /
  its *useful* (busy) time: the seconds it spent working on them, not waiting (DS2 §3:
  "useful time" excludes the time an operator waits for input or for output buffers).
  Observed rates (records / wall time) would say how fast it *was* made to go; the true
  rate says how fast it *can* go, so one measurement suffices to size the operator
  (DS2's point against trial-and-error policies).
- **Per-instance rate** = the mean of the instances' true rates (DS2 §3 divides the
  operator's aggregated true rate by its parallelism; it assumes no skew, as we do).
- **Input rate** = the batch's records / the seconds since the previous batch began. For
  a rate-limited source (Spark's rate source, a Kafka topic read at its arrival rate)
  that is the rate records arrive at, whatever the batches cost.
- **Target parallelism** = ceil(input rate / (per-instance rate x utilization)): DS2's
  optimal parallelism (§3) with headroom: ``utilization`` < 1 keeps each instance busy
  that fraction of the time at most, which absorbs the per-batch fixed costs (opening
  sessions, the barrier commit) and noise.
- Clamped to [min, max] and to the cores available (live workers that are not being
  decommissioned x cores per worker): one instance per core. ``min`` always wins: a
  person asked for that floor.

The policy around it (DS2 §4, the scaling manager: decisions at policy intervals, a
warm-up after each rescale, an "activation time" before acting):

- **Cooldown.** No decision while a plan of the operator is open (its measurements mix
  two parallelisms, and an operator has one open plan at a time, design §4), nor for
  ``cooldown_batches`` reports after one ended or the parallelism changed (DS2's
  warm-up: caches, compactions and JIT settle after a reconfiguration).
- **Hysteresis.** Out at once, in slowly. Scale out as soon as the target exceeds the
  current parallelism: a lagging operator builds a backlog every batch. Scale in only
  when the parallelism needed for the input rate raised by ``scale_in_margin`` is below
  the current one, for ``scale_in_reports`` consecutive reports (DS2's activation time);
  then to the largest of those targets (within the cores available now), so after a
  scale-in each instance still has that margin before the scale-out threshold. Without the margin, a rate sitting at a
  threshold would scale out and in at every other report.

Every decision carries its reason: the numbers it was taken on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..errors import InvalidArgumentError
from .strategies import STRATEGIES

__all__ = ["AutoscaleSettings", "Autoscaler", "Decision", "Report", "validate_report", "target_parallelism",
           "DEFAULT_STRATEGY"]

# The default migration strategy of the autoscaler's rescales: all-at-once. Megaphone
# (§3.3) spreads a migration over barriers because there each step copies state; here a
# step imports the moved vnodes by hard links from a checkpoint the target already holds
# (vertical scaling), so one step is cheap, and the handover benchmark measured its spike
# the smallest (2.0x the steady median, against 3.2x fluid and 3.5x batched: bench/results/
# handover.md). It also ends the rescale in one barrier, where batched takes about V/p'
# barriers (16 for 64 vnodes going 3 -> 4), during which the new instances are short of
# the work the autoscaler sized them for. ``strategy="batched"`` or ``"fluid"`` spread it.
DEFAULT_STRATEGY = "all-at-once"

# ceil() of a ratio computed in floating point: 7.000000000000001 must be 7, not 8.
_EPS = 1e-9
DECISIONS_KEPT = 20  # rescale decisions kept for ``rhino status``


def target_parallelism(input_rate: float, per_instance_rate: float, utilization: float) -> int:
    """DS2's optimal parallelism with headroom: ceil(input_rate / (per_instance_rate x
    utilization)), at least 1."""
    return max(1, math.ceil(input_rate / (per_instance_rate * utilization) - _EPS))


@dataclass(frozen=True)
class AutoscaleSettings:
    """An operator's autoscaling settings (``Coordinator.autoscale``)."""

    enabled: bool
    min_parallelism: int
    max_parallelism: int
    utilization: float = 0.7
    cooldown_batches: int = 3
    strategy: str = DEFAULT_STRATEGY
    cores_per_worker: int = 1
    scale_in_margin: float = 0.2
    scale_in_reports: int = 3

    def check(self, num_vnodes: int) -> "AutoscaleSettings":
        """Itself, or InvalidArgumentError naming the first bad setting."""
        def pos_int(name: str, v: Any, lo: int) -> None:
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidArgumentError(f"autoscale: {name} must be an int >= {lo}, got {v!r}")

        if not isinstance(self.enabled, bool):
            raise InvalidArgumentError(f"autoscale: enabled must be true or false, got {self.enabled!r}")
        pos_int("min_parallelism", self.min_parallelism, 1)
        pos_int("max_parallelism", self.max_parallelism, 1)
        if self.min_parallelism > self.max_parallelism:
            raise InvalidArgumentError(f"autoscale: min_parallelism {self.min_parallelism} is above "
                                       f"max_parallelism {self.max_parallelism}")
        if self.max_parallelism > num_vnodes:
            raise InvalidArgumentError(f"autoscale: max_parallelism {self.max_parallelism} is above the "
                                       f"operator's {num_vnodes} vnodes (an instance owns at least one)")
        if not _number(self.utilization) or not 0 < self.utilization <= 1:
            raise InvalidArgumentError(f"autoscale: utilization must be in (0, 1], got {self.utilization!r}")
        pos_int("cooldown_batches", self.cooldown_batches, 0)
        if self.strategy not in STRATEGIES:
            raise InvalidArgumentError(f"autoscale: unknown strategy {self.strategy!r}; use one of "
                                       f"{', '.join(STRATEGIES)}")
        pos_int("cores_per_worker", self.cores_per_worker, 1)
        if not _number(self.scale_in_margin) or not 0 <= self.scale_in_margin <= 10:
            raise InvalidArgumentError(f"autoscale: scale_in_margin must be in [0, 10], got {self.scale_in_margin!r}")
        pos_int("scale_in_reports", self.scale_in_reports, 1)
        return self


@dataclass(frozen=True)
class Report:
    """One committed batch's report (:func:`validate_report`)."""

    batch_s: float
    records: int
    busy_s: dict[int, float]
    records_by_instance: dict[int, int]
    began_unix: float


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_report(report: Any) -> Report:
    """A per-batch report as ``commit_batch`` takes it, checked: ``{"batch_s": wall seconds,
    "records": n, "busy_s": {instance: seconds}, "records_by_instance": {instance: n},
    "began_unix": t}``; instances as ints or their decimal strings (JSON keys). Raises
    InvalidArgumentError saying what is wrong."""
    if not isinstance(report, dict):
        raise InvalidArgumentError(f"report must be a JSON object, got {type(report).__name__}")
    need = {"batch_s", "records", "busy_s", "records_by_instance", "began_unix"}
    missing, extra = need - set(report), set(report) - need
    if missing or extra:
        raise InvalidArgumentError("report: " + "; ".join(
            x for x in (f"missing {', '.join(sorted(missing))}" if missing else "",
                        f"unknown {', '.join(sorted(map(str, extra)))}" if extra else "") if x))
    for k in ("batch_s", "began_unix"):
        if not _number(report[k]) or report[k] < 0:
            raise InvalidArgumentError(f"report: {k} must be a finite number >= 0, got {report[k]!r}")
    records = report["records"]
    if isinstance(records, bool) or not isinstance(records, int) or records < 0:
        raise InvalidArgumentError(f"report: records must be an int >= 0, got {records!r}")

    def per_instance(name: str, is_ok: Any, what: str) -> dict[int, Any]:
        d = report[name]
        if not isinstance(d, dict):
            raise InvalidArgumentError(f"report: {name} must map an instance to {what}, got {d!r}")
        out = {}
        for k, v in d.items():
            try:
                i = int(k)
            except (TypeError, ValueError):
                i = -1
            if isinstance(k, bool) or i < 0 or str(i) != str(k).strip():
                raise InvalidArgumentError(f"report: {name}: {k!r} is not an instance number")
            if not is_ok(v):
                raise InvalidArgumentError(f"report: {name}[{k}] must be {what}, got {v!r}")
            out[i] = v
        return out

    busy = per_instance("busy_s", lambda v: _number(v) and v >= 0, "seconds (a finite number >= 0)")
    by_inst = per_instance("records_by_instance",
                           lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an int >= 0")
    if by_inst and sum(by_inst.values()) != records:
        raise InvalidArgumentError(f"report: records is {records}, but records_by_instance sums to "
                                   f"{sum(by_inst.values())}")
    return Report(batch_s=float(report["batch_s"]), records=records, busy_s={i: float(v) for i, v in busy.items()},
                  records_by_instance=by_inst, began_unix=float(report["began_unix"]))


@dataclass
class Decision:
    """What the policy decided on one report: ``action`` is ``scale_out``, ``scale_in`` or
    ``hold``; ``to`` the parallelism asked for (= ``from_`` when holding); ``reason`` says
    why, with the numbers, which are also in ``numbers``."""

    batch: int
    at: float  # when it was decided: the caller's ``now``, else the batch's end by the report
    action: str
    from_: int
    to: int
    reason: str
    numbers: dict = field(default_factory=dict)

    @property
    def rescale(self) -> bool:
        return self.action != "hold"

    def doc(self) -> dict:
        d = asdict(self)
        d["from"] = d.pop("from_")
        return d


@dataclass
class _State:
    prev_batch: Optional[int] = None  # the batch of the last report, and when it began
    prev_began: Optional[float] = None
    parallelism: Optional[int] = None  # the parallelism the last report ran at
    cooldown_left: int = 0  # reports still to wait before a decision
    below: list = field(default_factory=list)  # consecutive scale-in targets (with the margin)


class Autoscaler:
    """The policy of one operator: :meth:`observe` one report per committed batch."""

    def __init__(self, settings: AutoscaleSettings, state: Optional[dict] = None) -> None:
        self.settings = settings
        self.state = _State(**(state or {}))

    def to_doc(self) -> dict:
        """The state, as JSON: :class:`Autoscaler` (settings, this) goes on from it."""
        return asdict(self.state)

    def observe(self, report: Report, *, batch: int, parallelism: int, plan_open: bool,
                workers_available: int, now: Optional[float] = None) -> Decision:
        """The decision on ``report`` of ``batch``, committed at ``parallelism`` (the active
        instances) with ``plan_open`` (a plan of the operator is scheduled or running) and
        ``workers_available`` live workers not being decommissioned; ``now`` stamps it."""
        s, st = self.settings, self.state
        at = report.began_unix + report.batch_s if now is None else float(now)
        # The input rate needs the previous batch's begin: records of b arrived since then.
        prev = st.prev_began if st.prev_batch == batch - 1 else None
        st.prev_batch, st.prev_began = batch, report.began_unix
        if st.parallelism != parallelism:  # a rescale took effect (ours or a person's), or the first report
            if st.parallelism is not None:
                st.cooldown_left = s.cooldown_batches
            st.parallelism, st.below = parallelism, []
        n = self._numbers(report, prev, parallelism, workers_available)

        def hold(why: str) -> Decision:
            return Decision(batch, at, "hold", parallelism, parallelism, why, n)

        if plan_open:
            # measurements of an operator being reconfigured mix two parallelisms
            st.cooldown_left, st.below = s.cooldown_batches, []
            return hold("a plan of this operator is open: no decision until it ends, then a cooldown of "
                        f"{s.cooldown_batches} batches{_measured(n)}")
        if st.cooldown_left > 0:
            st.cooldown_left -= 1
            return hold(f"cooldown after a rescale: batch {s.cooldown_batches - st.cooldown_left} of "
                        f"{s.cooldown_batches} without a decision{_measured(n)}")
        if "per_instance_rate" not in n:
            st.below = []
            return hold("no instance reported both records and busy time: no true processing rate (DS2 §3)")
        if "input_rate" not in n:
            st.below = []
            return hold("no report of the previous batch: the input rate needs its begin time"
                        + (" (or the clock went back)" if prev is not None else "") + _measured(n))
        target, bounded = n["target"], n["bounded"]
        if bounded > parallelism:
            st.below = []
            return self._decide(at, batch, "scale_out", parallelism, bounded, n,
                                f"needs {target}{_clamp_note(n)}{_measured(n)}")
        if bounded == parallelism:
            st.below = []
            return hold(f"at target {target}{_clamp_note(n)}{_measured(n)}")
        m = n["target_with_margin_bounded"]
        if m >= parallelism:
            st.below = []
            return hold(f"target {target} is below {parallelism}, but with a {s.scale_in_margin:g} margin it needs "
                        f"{n['target_with_margin']}{_measured(n)}")
        st.below.append(m)
        st.below = st.below[-s.scale_in_reports:]
        if len(st.below) < s.scale_in_reports:
            return hold(f"scale-in to {m} wanted by {len(st.below)} of {s.scale_in_reports} consecutive reports"
                        f"{_measured(n)}")
        to = min(max(st.below), n["upper"])  # the most conservative of them, within today's cores
        st.below = []
        return self._decide(at, batch, "scale_in", parallelism, to, n,
                            f"{s.scale_in_reports} consecutive reports need at most {to} with a {s.scale_in_margin:g} "
                            f"margin (now target {target}){_measured(n)}")

    def _decide(self, at: float, batch: int, action: str, frm: int, to: int, n: dict, why: str) -> Decision:
        # the plan starts at the next barrier; no decision until it ended and a cooldown passed
        self.state.cooldown_left = self.settings.cooldown_batches
        return Decision(batch, at, action, frm, to, f"{action} {frm} -> {to}: {why}", n)

    def _numbers(self, report: Report, prev: Optional[float], parallelism: int, workers: int) -> dict:
        """What a decision is taken on, rounded for reading (the decision uses the exact values)."""
        s = self.settings
        n: dict[str, Any] = {"records": report.records, "batch_s": round(report.batch_s, 4),
                             "parallelism": parallelism, "cores": workers * s.cores_per_worker,
                             "max_parallelism": s.max_parallelism,
                             "utilization": s.utilization}
        # DS2 §3: true rate = records processed / useful time, per instance; instances that
        # processed nothing (or report no busy time) tell nothing about the rate.
        rates = [report.records_by_instance[i] / report.busy_s[i] for i in sorted(report.records_by_instance)
                 if report.records_by_instance[i] > 0 and report.busy_s.get(i, 0.0) > 0]
        if not rates:
            return n
        rate = sum(rates) / len(rates)
        n["per_instance_rate"] = round(rate, 3)
        n["instances_measured"] = len(rates)
        if prev is None or report.began_unix <= prev:
            return n
        interval = report.began_unix - prev
        input_rate = report.records / interval
        upper = max(s.min_parallelism, min(s.max_parallelism, workers * s.cores_per_worker))
        target = target_parallelism(input_rate, rate, s.utilization)
        with_margin = target_parallelism(input_rate * (1 + s.scale_in_margin), rate, s.utilization)
        n.update(interval_s=round(interval, 4), input_rate=round(input_rate, 3), target=target,
                 bounded=min(max(target, s.min_parallelism), upper), upper=upper, target_with_margin=with_margin,
                 target_with_margin_bounded=min(max(with_margin, s.min_parallelism), upper))
        return n


def _measured(n: dict) -> str:
    if "input_rate" in n:
        return (f" (input {n['input_rate']:g} rec/s over {n['interval_s']:g} s; true rate {n['per_instance_rate']:g} "
                f"rec/s per instance over {n['instances_measured']}; utilization {n['utilization']:g})")
    if "per_instance_rate" in n:
        return f" (true rate {n['per_instance_rate']:g} rec/s per instance)"
    return ""


def _clamp_note(n: dict) -> str:
    if n["bounded"] == n["target"]:
        return ""
    if n["target"] > n["bounded"]:
        return f", clamped to {n['bounded']} (max_parallelism {n['max_parallelism']}, {n['cores']} cores available)"
    return f", raised to the min parallelism {n['bounded']}"
