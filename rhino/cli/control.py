"""``rhino status``, ``rhino handover``, ``rhino rebalance``, ``rhino rescale``,
``rhino cancel-plan``, ``rhino decommission``, ``rhino autoscale`` and ``rhino drop``: an
operator's view of a running coordinator, the reconfigurations it can ask for, and the
end of an operator's life.

Each talks to a ``rhino coordinator`` (``--coordinator HOST:PORT``, or the
environment variable ``RHINO_COORDINATOR``) with the cluster's secret
(``--secret-file``, or ``RHINO_SECRET_FILE``). Handovers, rescales and load
rebalancing are *plans*: they run at the next batch barrier of the job (or
``--after-batch``), one step per barrier. Plans are per operator: an operator
has at most one open plan, and ``rhino status`` shows it under the operator.
``rhino cancel-plan`` ends one between two of its steps (one left waiting by
a stopped query, say).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional

from .._argtypes import uint64

__all__ = ["main_status", "main_handover", "main_rebalance", "main_rescale", "main_cancel_plan", "main_decommission",
           "main_autoscale", "main_drop", "format_status", "format_autoscale"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", default=os.environ.get("RHINO_COORDINATOR"), metavar="HOST:PORT",
                   help="the coordinator (default: $RHINO_COORDINATOR)")
    p.add_argument("--secret-file", default=os.environ.get("RHINO_SECRET_FILE"),
                   help="the cluster's shared secret (default: $RHINO_SECRET_FILE)")
    for name, what in (("cert", "this host's certificate"), ("key", "its private key"),
                       ("ca", "the CA certificate")):
        env = f"RHINO_TLS_{name.upper()}"
        p.add_argument(f"--tls-{name}", default=os.environ.get(env), metavar="PEM",
                       help=f"a TLS cluster: {what} (default: ${env}; all three or none)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _client(args: argparse.Namespace) -> Any:
    from ..coordinator.client import connect_coordinator
    from ..replication import read_secret_file

    if not args.coordinator:
        raise SystemExit("rhino: error: no coordinator: pass --coordinator HOST:PORT or set RHINO_COORDINATOR")
    if not args.secret_file:
        raise SystemExit("rhino: error: no secret: pass --secret-file FILE or set RHINO_SECRET_FILE")
    from ..tls.config import TLS

    return connect_coordinator(args.coordinator, secret=read_secret_file(args.secret_file), client_id="rhino-cli",
                               tls=TLS.from_args(args.tls_cert, args.tls_key, args.tls_ca))


def _vnodes(text: str) -> list[int]:
    """'0-7,12,14' -> [0..7, 12, 14]"""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.extend(range(int(lo), int(hi) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected vnodes like '0-7,12', got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("no vnodes given")
    return out


def _run(parser: argparse.ArgumentParser, argv: Optional[list[str]], fn: Any) -> int:
    from ..errors import RhinoError

    args = parser.parse_args(argv)
    try:
        with _client(args) as c:
            out = fn(c, args)
    except RhinoError as e:
        print(f"rhino: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(out if isinstance(out, str) else _plain(out))
    return 0


def _plain(d: Any) -> str:
    return "\n".join(f"{k}: {v}" for k, v in d.items()) if isinstance(d, dict) else str(d)


def format_status(s: dict) -> str:
    lines = ["WORKERS"]
    for w in s["workers"]:
        age = "-" if w["heartbeat_age_s"] is None else f"{w['heartbeat_age_s']:.1f}s ago"
        where = " ".join(x for x in (w.get("rack"), w.get("zone")) if x)
        lines.append(f"  {w['id']:<10} {w['state']:<6} {w['address']:<22} heartbeat {age:<10} {where}")
        d = w.get("decommission")
        if d:
            lines.append("             decommissioned: " + ("drained, stop it" if d["drained"] else
                                                           "draining, held by " + ", ".join(d["operators"])))
    for o in s["operators"]:
        lines.append(f"OPERATOR {o['operator_id']}  epoch {o['epoch']}  last batch {o['last_batch']}  "
                     f"r={o['replicas']}  vnodes {o['num_vnodes']}")
        lines.append(f"  {'inst':>4} {'primary':<10} {'chain':<24} {'ver':>3} {'ckpt':>6} {'vnodes':>6} {'bytes':>12}  lag")
        for i in o["instances"]:
            lag = ",".join(f"{k}:{'?' if v is None else v}" for k, v in (i["replica_lag"] or {}).items())
            lines.append(f"  {i['instance']:>4} {i['primary']:<10} {','.join(i['chain']):<24} {i['chain_version']:>3} "
                         f"{str(i['last_complete']):>6} {i['vnodes']:>6} {i['bytes']:>12}  {lag}")
        code = o.get("code")
        if code:  # None: no rhino.spark driver recorded its code (or a coordinator of before)
            lines.append(f"  code: {code['version']} ({code['processor']}) from batch {code['from_batch']}"
                         + (f", {code['versions']} versions" if code.get("versions", 1) > 1 else ""))
        if o.get("swap_request"):
            lines.append(f"  swap request {o['swap_request']['id']}: {o['swap_request']['code']}, waiting for a "
                         "batch barrier")
        plans = o.get("plans")
        if plans is not None:  # a coordinator of before per-operator plans has no such field
            if not plans:
                lines.append("  open plan: none")
            for p in plans:
                lines.append(f"  open plan {_plan_line(p)}  (cancel: rhino cancel-plan {o['operator_id']} "
                             f"--plan {p['id']})")
        if o.get("autoscale"):  # None: never turned on (or a coordinator of before the autoscaler)
            lines.extend("  " + x for x in format_autoscale(o["autoscale"]).splitlines())
    # Each operator's open plan is shown above, under the operator: here only which are open,
    # unless the coordinator gave no per-operator plans (one of before they were per operator).
    lines.append("PLANS IN FLIGHT: " + (", ".join(f"{p['operator_id']} #{p['id']}" for p in s["plans_in_flight"])
                                        or "none"))
    if not all("plans" in o for o in s["operators"]):
        for p in s["plans_in_flight"]:
            lines.append(f"  {p['operator_id']}: " + _plan_line(p))
    lines.append("RECENT EVENTS")
    for e in s["events"][-10:]:
        detail = {k: v for k, v in e.items() if k not in ("at", "kind")}
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(e['at']))} {e['kind']} {json.dumps(detail)}")
    return "\n".join(lines)


def format_autoscale(a: dict, decisions: int = 5) -> str:
    """An operator's autoscaling as ``status`` answers it: on or off, its settings, the last
    decision (a hold too) and the last rescale decisions, each with its reason."""
    s = a.get("settings") or {}
    lines = [f"autoscale: {'on' if a.get('enabled') else 'off'}, parallelism {s.get('min_parallelism')}.."
             f"{s.get('max_parallelism')}, utilization {s.get('utilization')}, cooldown {s.get('cooldown_batches')} "
             f"batches, strategy {s.get('strategy')}, {s.get('cores_per_worker')} core(s) per worker, scale in with "
             f"a {s.get('scale_in_margin')} margin after {s.get('scale_in_reports')} reports"]
    last = a.get("last")
    if last:
        lines.append(f"  last: batch {last.get('batch')} {last.get('action')}: "
                     f"{last.get('error') or last.get('reason')}")
    for d in (a.get("decisions") or [])[-decisions:]:
        when = time.strftime("%H:%M:%S", time.localtime(d["at"])) if d.get("at") else "?"
        plan = f" (plan #{d['plan']})" if d.get("plan") is not None else f" (not planned: {d.get('error')})"
        lines.append(f"  decision: batch {d.get('batch')} at {when}: {d.get('from')} -> {d.get('to')}{plan}: "
                     f"{d.get('reason')}")
    return "\n".join(lines)


def _plan_line(p: dict) -> str:
    age = "" if p.get("age_s") is None else f", age {_seconds(p['age_s'])}"
    idle = "" if p.get("idle_s") is None or p["state"] != "running" else f", last step {_seconds(p['idle_s'])} ago"
    msg = f" {p['message']}" if p.get("message") else ""
    return (f"#{p['id']} {p['kind']} ({p['strategy']}) {p['state']}, step {p['steps_done']}/{p['steps']}, "
            f"after batch {p['after_batch']}{age}{idle}{msg}")


def _seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}min"
    return f"{s / 3600:.1f}h"


def main_status(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rhino status", description="Workers, instances, chains, replica lag, "
                                "epochs and plans in flight, as the coordinator sees them.")
    _common(p)
    return _run(p, argv, lambda c, a: c.status() if a.json else format_status(c.status()))


def main_handover(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rhino handover", description="Move vnodes to an instance (a new instance "
                                "number creates one) at the next batch barrier.")
    _common(p)
    p.add_argument("--operator", required=True)
    p.add_argument("--vnodes", required=True, type=_vnodes, help="e.g. 0-7,12")
    p.add_argument("--to", required=True, type=int, help="the target instance")
    p.add_argument("--strategy", default="all-at-once", choices=["all-at-once", "fluid", "batched"])
    p.add_argument("--after-batch", type=int, default=None, help="run at the barrier after this batch")
    p.add_argument("--on", default=None, metavar="WORKER",
                   help="a new target instance goes to this worker (horizontal scaling: a bulk copy first)")
    return _run(p, argv, lambda c, a: c.handover(a.operator, a.vnodes, a.to, strategy=a.strategy,
                                                 after_batch=a.after_batch, on=a.on))


def main_rebalance(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rhino rebalance", description="Rebalance replicas over the live workers "
                                "(now), and vnodes over instances by measured load (a plan).")
    _common(p)
    p.add_argument("--operator", default=None)
    p.add_argument("--replicas-only", action="store_true")
    p.add_argument("--load-only", action="store_true")
    p.add_argument("--strategy", default="batched", choices=["all-at-once", "fluid", "batched"])
    p.add_argument("--after-batch", type=int, default=None)
    return _run(p, argv, lambda c, a: c.rebalance(a.operator, replicas=not a.load_only, load=not a.replicas_only,
                                                  strategy=a.strategy, after_batch=a.after_batch))


def main_rescale(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rhino rescale", description="Change an operator's parallelism by vnode "
                                "handovers (no state is reloaded).")
    _common(p)
    p.add_argument("operator", metavar="OPERATOR")
    p.add_argument("parallelism", metavar="N", type=int)
    p.add_argument("--strategy", default="all-at-once", choices=["all-at-once", "fluid", "batched"])
    p.add_argument("--after-batch", type=int, default=None)
    p.add_argument("--on", default=None, metavar="W1,W2",
                   help="new instances go to these workers, round robin (horizontal scaling); default: workers "
                        "that hold the origins' replicas")
    return _run(p, argv, lambda c, a: c.rescale(a.operator, a.parallelism, strategy=a.strategy,
                                                after_batch=a.after_batch, on=a.on.split(",") if a.on else None))


def main_cancel_plan(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="rhino cancel-plan",
        description="Cancel an operator's open plan (a handover, rescale or load rebalance), e.g. one left "
                    "waiting by a stopped query. A plan is cancelled between two of its steps: the steps done "
                    "stay done (every vnode keeps exactly one owner), the steps not run are dropped, and no "
                    "worker is asked anything. `rhino status` lists the open plans.")
    _common(p)
    p.add_argument("operator", metavar="OPERATOR")
    p.add_argument("--plan", type=uint64, default=None, metavar="ID",
                   help="the plan's id (rhino status); default: the operator's open plan")
    return _run(p, argv, lambda c, a: c.cancel_plan(a.operator, a.plan))


def main_drop(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="rhino drop",
        description="Drop an operator and its state: every live worker removes each of its instances' live "
                    "state, checkpoints, standby directory and fences, then the coordinator removes its "
                    "metadata. Refused (OperatorRunningError) while a query runs it: a batch of it in flight, "
                    "or a call of its driver or tasks in the last --idle-for seconds. Stop the query first.")
    _common(p)
    p.add_argument("operator", metavar="OPERATOR", help="the operator's name (in --namespace)")
    p.add_argument("--namespace", default=None, metavar="NS",
                   help="the operator's namespace (a job's id; default: the default namespace)")
    p.add_argument("--idle-for", type=float, default=60.0, metavar="SECONDS", dest="idle_for",
                   help="how long the operator must have been idle (default %(default)g)")

    def drop(c: Any, a: argparse.Namespace) -> Any:
        from ..coordinator.naming import operator_id

        out = c.drop_operator(operator_id(a.operator, a.namespace), idle_s=a.idle_for)
        if a.json:
            return out
        lines = [f"dropped operator {out['operator_id']}: instances {out['instances']} on "
                 f"{len(out['workers'])} workers ({', '.join(sorted(out['workers'])) or 'none'})"]
        if out["not_reached"]:
            lines.append(f"not reached (dead, their copies stay): {', '.join(out['not_reached'])}")
        return "\n".join(lines)

    return _run(p, argv, drop)


def main_decommission(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="rhino decommission",
        description="Move everything off a worker before taking its machine away: nothing new is placed on it, "
                    "and each operator moves off it at its next batch barrier (its primaries taken over by chain "
                    "members by hard links, its chains repaired from the primaries), so no batch fails. Then stop "
                    "the worker. A worker that registers again is placed on again.")
    _common(p)
    p.add_argument("worker", metavar="WORKER", help="the worker's id (rhino status)")
    p.add_argument("--force", action="store_true",
                   help="move every operator now, not at its next barrier (a batch in flight runs again)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="poll until the worker is drained, for at most this long (exit 3 if it is not)")
    args = p.parse_args(argv)
    from ..errors import RhinoError

    try:
        with _client(args) as c:
            out = c.decommission(args.worker, force=args.force)
            deadline = time.monotonic() + args.wait
            while not out["drained"] and time.monotonic() < deadline:
                time.sleep(0.5)
                out = c.decommission(args.worker, force=args.force)
    except RhinoError as e:
        print(f"rhino: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
    elif out["drained"]:
        print(f"worker {out['worker']} is drained: nothing is placed on it; stop it now")
    else:
        print(f"worker {out['worker']} is draining: still held by {', '.join(out['operators'])}"
              + (f" (waiting for the next batch barrier of {', '.join(out['waiting_for_barrier'])}; "
                 "--force moves them now)" if out["waiting_for_barrier"] else ""))
    return 0 if out["drained"] or args.wait <= 0 else 3


def main_autoscale(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="rhino autoscale",
        description="Turn an operator's autoscaler on (or off with --off). After each committed batch the "
                    "coordinator sizes the operator from the batch's report, after DS2: target parallelism = "
                    "ceil(input rate / (each instance's true processing rate x utilization)), within --min, --max "
                    "and the cores available (live workers x --cores-per-worker); it scales out at once, in only "
                    "with a margin for several reports, and waits --cooldown batches after each rescale. A rescale "
                    "is a plan, run at the operator's next batch barriers. `rhino status` shows every decision and "
                    "its reason. Settings left out keep the coordinator's defaults.")
    _common(p)
    p.add_argument("operator", metavar="OPERATOR")
    p.add_argument("--min", type=int, dest="min_parallelism", metavar="N", help="the smallest parallelism")
    p.add_argument("--max", type=int, dest="max_parallelism", metavar="N", help="the largest parallelism")
    p.add_argument("--off", action="store_true", help="turn it off (the settings and decisions are kept)")
    p.add_argument("--utilization", type=float, default=None, metavar="U",
                   help="target busy fraction of an instance, in (0, 1] (default 0.7: 30%% headroom)")
    p.add_argument("--cooldown", type=int, default=None, dest="cooldown_batches", metavar="N",
                   help="batches without a decision after a rescale ended (default 3)")
    p.add_argument("--strategy", default=None, choices=["all-at-once", "fluid", "batched"],
                   help="the rescales' migration strategy (default all-at-once: one barrier, by hard links; batched or fluid spread it over barriers)")
    p.add_argument("--cores-per-worker", type=int, default=None, metavar="N",
                   help="instances one worker's host can run at once (default 1)")
    p.add_argument("--scale-in-margin", type=float, default=None, metavar="F",
                   help="scale in only if the input rate x (1 + F) still fits fewer instances (default 0.2)")
    p.add_argument("--scale-in-reports", type=int, default=None, metavar="K",
                   help="consecutive reports that must want a scale-in (default 3)")
    args = p.parse_args(argv)
    if not args.off and (args.min_parallelism is None or args.max_parallelism is None):
        p.error("--min N and --max N are needed to turn autoscaling on")
    keys = ("utilization", "cooldown_batches", "strategy", "cores_per_worker", "scale_in_margin", "scale_in_reports")
    settings = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}

    def ask(c: Any, a: argparse.Namespace) -> Any:
        out = c.autoscale(a.operator, enabled=not a.off, min_parallelism=a.min_parallelism,
                          max_parallelism=a.max_parallelism, **settings)
        return out if a.json else f"{a.operator}: " + format_autoscale(out)

    return _run(p, argv, ask)
