"""``rhino-bench demo``: what it prints and writes once the query has stopped: each event's cost,
the recovery from the host loss, the output checked against pandas, and the latency timeline."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Optional

from ..report import pyplot, save


def _say(msg: str) -> None:
    print(msg, flush=True)


def finish(a: argparse.Namespace, run: Any, status: dict, coord_events: list[dict], events: list[dict], kill: dict,
           script: dict, work: Path, source: dict, params: dict, t_start: float) -> int:
    """Prints and writes the outcome of the run; the demo's exit code."""
    elastic = not a.kill_only
    op = run.operator
    # the batches that committed (a batch in flight when the run stopped did not)
    committed = sorted({b["batch"] for b in run.batches if b["batch"] <= script.get("stop", b["batch"])})
    last = committed[-1] if committed else -1
    by_batch = {r.batch: r for r in op.reports}  # the last report of each batch
    reports = [by_batch[b] for b in committed if b in by_batch]
    ok = committed == list(range(last + 1)) and len(reports) == len(committed)
    if not ok:
        _say(f"[demo] the committed batches are not 0..{last}: {committed}")

    if elastic:
        _say("")
        _say("Events while the query ran")
        for i, ev in enumerate(events):
            until = events[i + 1]["t"] if i + 1 < len(events) else float("inf")
            ok = _summarise(i + 1, ev, reports, coord_events, a, until) and ok
        if script.get("error"):
            _say(f"  the elastic part stopped early: {script['error']}")
            ok = False
        if len(events) < 4:
            ok = False

    if "t" not in kill:
        _say("[demo] the host was never killed (the run ended first)")
        return 1
    _recovery(a, kill, status, coord_events, reports, elastic)
    same, n_got, checked = _output_check(a, run, committed, last, reports, source, params, elastic)
    ok = checked and ok
    with open(work / "batches.jsonl", "w") as f:
        for r in reports:
            f.write(json.dumps({"batch": r.batch, "started": r.started, "ended": r.ended, "seconds": r.seconds,
                                "begin_s": r.begin_s, "attempts": r.attempts, "epoch": r.epoch,
                                "locality": r.locality, "errors": r.errors, "tasks": r.tasks}, default=str) + "\n")
    marks = events if elastic else [{"kind": "kill", "label": f"host {a.kill_host} SIGKILLed", "t": kill["t"]}]
    (work / "events.json").write_text(json.dumps(marks, indent=1, default=str) + "\n")
    png = work / "latency.png"
    at_barrier = {r["batch"] for r in _reconfigurations(coord_events, reports, 0.0, float("inf"))}
    _plot(reports, marks, png, a, at_barrier)
    _say(f"Per-batch latency timeline: {png}; per batch: {work / 'batches.jsonl'}; events: {work / 'events.json'}")
    if elastic:
        _final_summary(events, same, n_got, last, time.time() - t_start, ok)
    else:
        _say(f"[demo] {'done' if ok else 'FAILED'} in {time.time() - t_start:.0f} s")
    return 0 if ok else 1


def _recovery(a: argparse.Namespace, kill: dict, status: dict, coord_events: list[dict], reports: list,
              elastic: bool) -> None:
    """Prints the recovery from the host loss: detection, the takeovers' restores, the batch in flight."""
    import numpy as np

    tk = kill["t"]
    dead = [w for w in status["workers"] if w.get("dead_since")]
    detect = min((w["dead_since"] - tk for w in dead if w["dead_since"] >= tk - 1), default=None)
    takeovers = [e for e in coord_events if e.get("kind") == "reconfigured" and e.get("takeover_figures")
                 and e["at"] >= tk - 1]
    restore = [f.get("restore_s") for e in takeovers for f in e["takeover_figures"].values()
               if f.get("restore_s") is not None]
    after = [r for r in reports if r.ended > tk]
    first = after[0] if after else None
    before = [r.seconds for r in reports[1:] if r.ended < tk]
    steady = before[-max(3, a.gap):] if elastic else before
    _say("")
    _say("Recovery from the host loss" + (" (4/4)" if elastic else ""))
    width = next((len(r.tasks) for r in reversed(reports) if r.ended < tk), a.hosts)
    _say(f"  state at the kill           {kill['state_bytes'] / 2**20:8.1f} MiB over {width} instances, "
         f"r={a.replicas}")
    if detect is not None:
        _say(f"  detection                   {detect:8.2f} s   (the coordinator declared the Rhino worker dead)")
    if restore:
        _say(f"  takeover restore            {max(restore) * 1000:8.1f} ms  (hard links on a chain member, per instance: "
             + ", ".join(f"{x * 1000:.1f}" for x in restore) + " ms)")
    if first is not None:
        _say(f"  batch {first.batch} (in flight)        {first.seconds:8.2f} s   {first.attempts} attempt(s)"
             + (f"; {first.errors[0][:110]}" if first.errors else ""))
        _say(f"  recovery                    {first.ended - tk:8.2f} s   (from the kill to the first batch completed after it)")
        for t in first.tasks:
            _say(f"    instance {t['instance']}: ran on {t['host']} (Spark attempt {t['attempt']}), primary {t['primary']} "
                 f"at epoch {t['epoch']}, started {t['start'] - tk:+.2f} s after the kill, took {t['end'] - t['start']:.2f} s"
                 + (", rolled back to b-1" if t.get("rolled_back") else "")
                 + (f"; retried after: {t['errors'][0][:120]}" if t.get("errors") else ""))
    if steady:
        _say(f"  steady batches before       {float(np.median(steady)):8.2f} s   median"
             + (f" of the {len(steady)} before the kill" if elastic else ""))
    post = [r.locality for r in after[1:]]
    if post:
        _say(f"  locality after recovery     {float(np.mean(post)):8.0%}   (tasks on their primary's host)")


def _output_check(a: argparse.Namespace, run: Any, committed: list[int], last: int, reports: list, source: dict,
                  params: dict, elastic: bool) -> tuple[bool, int, bool]:
    """Q8's results of the closed windows against pandas over the same events: (identical, how
    many results, nothing else wrong)."""
    from rhino_testing.nexmark import oracle
    from rhino_testing.nexmark.generator import generate
    from rhino_testing.nexmark.source import config_from_options

    ok = True
    # batch b read events [b * n, (b + 1) * n): the oracle reads the same ones
    n_events = a.events_per_batch * (last + 1)
    end = _end_offset(run.progress.get(last))  # where Spark's last committed batch ended in the stream
    if end is not None and end != n_events:
        _say(f"[demo] Spark's batches 0..{last} ended at event {end:,}, not {n_events:,}")
        ok = False
    events_df = generate(0, n_events, config=config_from_options(source)).to_pandas()
    wm = reports[-1].watermark_ms
    want = oracle.closed("q8", oracle.compute("q8", events_df, **params), wm, **params)
    outs = [run.outputs[b] for b in committed if b in run.outputs and len(run.outputs[b])]
    import pandas as pd

    got = oracle.closed("q8", pd.concat(outs, ignore_index=True) if outs else pd.DataFrame(columns=want.columns),
                        wm, **params)
    cols = list(want.columns)
    same = (len(got) == len(want) and got.sort_values(cols).reset_index(drop=True)
            .equals(want.sort_values(cols).reset_index(drop=True).astype(got.dtypes.to_dict())))
    _say("")
    _say(f"Output check: {len(got):,} Q8 results of the closed windows, batches 0..{last} ({n_events:,} events, "
         f"{'every event above' if elastic else 'the whole run'}), vs the failure-free answer (pandas over the "
         f"same events): {'IDENTICAL' if same else 'DIFFERENT'}")
    if len(want) == 0:
        _say("  (no window closed during the run: nothing to compare; run more batches with --batches-after)")
        same = False
    ok = ok and same
    return same, len(got), ok


def _end_offset(progress: Optional[dict]) -> Optional[int]:
    """The end offset (events) of a batch's source, from its progress report; None if absent."""
    from rhino_testing.nexmark.source import OFFSET_KEY

    try:
        v = progress["sources"][0]["endOffset"]
        v = json.loads(v) if isinstance(v, str) else v
        return int(v[OFFSET_KEY])
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def _batch_at(reports: list, t: float) -> Optional[Any]:
    """The batch running (or starting: its barrier) at time t."""
    for r in reports:
        if r.started <= t <= r.ended:
            return r
    return next((r for r in reports if r.started >= t), None)


def _reconfigurations(coord_events: list[dict], reports: list, t0: float, t1: float) -> list[dict]:
    """The coordinator's reconfigurations (a new epoch: a plan's step, a replica moved, a
    decommission's moves, a takeover) logged in [t0, t1), each with the batch at whose
    barrier it ran."""
    out = []
    for e in coord_events:
        if e.get("kind") in ("reconfigured", "handover_step") and t0 <= e["at"] < t1:
            r = _batch_at(reports, e["at"])
            reason = e.get("reason") or (f"plan {e.get('plan')} step {e.get('step')}/{e.get('of')}"
                                         if e.get("kind") == "handover_step" else "?")
            out.append({"at": e["at"], "epoch": e.get("epoch"), "reason": reason, "batch": r.batch if r else None})
    return out


def _summarise(i: int, ev: dict, reports: list, coord_events: list[dict], a: argparse.Namespace,
               until: float) -> bool:
    """Prints one event's cost; records it in ``ev`` (``effect_s``, ``worst_x``, ...). False if
    a batch it touched failed (ran again), the kill's batch excepted."""
    import numpy as np

    t0 = ev["t"]
    before = [r for r in reports if r.batch >= 1 and r.ended <= t0][-max(3, a.gap):]
    median = float(np.median([r.seconds for r in before])) if before else float("nan")
    t1 = ev.get("t_done", t0)
    if ev["kind"] == "kill":
        touched = [r for r in reports if r.ended > t0][:1]
    else:
        # the batches that ran between the request and the change taking effect, and the next
        touched = [r for r in reports if r.ended > t0 and r.started <= t1]
        touched += [r for r in reports if r.started > t1][:1]
    worst = max(touched, key=lambda r: r.seconds, default=None)
    failed = [r.batch for r in touched if r.attempts > 1]
    worst_x = worst.seconds / median if worst and median == median and median > 0 else None
    ev.update(steady_median_s=median, batches=[r.batch for r in touched],
              worst_batch=worst.batch if worst else None, worst_s=worst.seconds if worst else None,
              worst_x=worst_x, failed_batches=failed)
    x = f"{worst_x:.1f}x" if worst_x is not None else "?"
    span = (f"batches {touched[0].batch}..{touched[-1].batch}" if len(touched) > 1
            else f"batch {touched[0].batch}" if touched else "no batch")
    worst_txt = (f"largest: batch {worst.batch}, {worst.seconds:.2f} s = {x} the steady {median:.2f} s"
                 if worst else "no batch ran")

    def tasks_from(r: Any) -> Optional[float]:  # when its stateful tasks started, into the batch
        return min((t["start"] for t in r.tasks), default=r.started) - r.started if r.tasks else None

    why = ""
    if worst is not None and before and ev["kind"] != "kill":
        lead = tasks_from(worst) or 0.0
        steady_lead = float(np.median([tasks_from(r) or 0.0 for r in before]))
        longest = max((t["end"] - t["start"] for t in worst.tasks), default=0.0)
        steady_longest = float(np.median([max((t["end"] - t["start"] for t in r.tasks), default=0.0)
                                          for r in before]))
        ev["worst_breakdown"] = {"barrier_s": worst.begin_s, "tasks_start_s": lead, "steady_tasks_start_s": steady_lead,
                                 "longest_task_s": longest, "steady_longest_task_s": steady_longest}
        why = (f"\n       in it: the barrier {worst.begin_s:.2f} s; the stateful tasks started at {lead:.2f} s "
               f"(steady {steady_lead:.2f} s); the longest took {longest:.2f} s (steady {steady_longest:.2f} s)")
    recs = _reconfigurations(coord_events, reports, t0, until)
    ev["reconfigurations"] = recs
    state = f"{ev.get('state_bytes', 0) / 2**20:.0f} MiB of state"
    w = "       "
    if ev["kind"] == "join":
        ev["effect_s"] = t1 - t0
        ev["effect"] = f"{t1 - t0:.1f} s to ready"
        _say(f"  {i}. host {ev.get('host')} ({ev.get('ip')}) joined: ready {t1 - t0:.1f} s after add_host (its Spark "
             f"executor and Rhino worker {ev.get('worker')} registered in {ev.get('t_registered', t1) - t0:.1f} s, "
             f"then the executor warmed)\n{w}{span} ran meanwhile; {worst_txt}{why}"
             + "".join(f"\n{w}the coordinator put it in a replica chain ({r['reason']}, epoch {r['epoch']}) at "
                       f"the barrier of batch {r['batch']}" for r in recs if "replica" in str(r["reason"])))
    elif ev["kind"] == "rescale":
        steps = [e for e in coord_events if e.get("kind") == "handover_step" and e.get("plan") == ev.get("plan")]
        at = []
        for e in steps:
            r = _batch_at(reports, e["at"])
            at.append(r.batch if r else None)
        four = next((r for r in reports if r.started >= t0 and len(r.tasks) == a.hosts + 1), None)
        copied = sum(int(e.get("bytes_copied") or 0) for e in steps)
        secs = [float(e.get("seconds") or 0) for e in steps]
        ev.update(step_batches=at, step_seconds=secs, bytes_copied=copied,
                  first_batch_at_new_parallelism=four.batch if four else None, effect_s=t1 - t0,
                  effect=f"{t1 - t0:.1f} s, {len(steps)} step(s)")
        _say(f"  {i}. rescale {a.hosts}->{a.hosts + 1} ({ev.get('strategy')}): {t1 - t0:.1f} s from the request to its "
             f"last step; {a.hosts + 1} instances from batch {four.batch if four else '?'}\n"
             f"{w}{len(steps)} step(s) moving {ev.get('moves')} vnodes onto {ev.get('worker') or 'the new host'}, at "
             f"the barriers of batches {', '.join(str(b) for b in at)}, "
             f"{min(secs, default=0):.2f}-{max(secs, default=0):.2f} s each; {copied / 2**20:.0f} MiB copied to the "
             f"new host; {state} at the request\n{w}{span}: {worst_txt}{why}")
    elif ev["kind"] == "decommission":
        moves = [r for r in recs if "decommission" in str(r["reason"])]
        where = ("; ".join(f"moved off it at epoch {r['epoch']}, at the barrier of batch {r['batch']} ({r['reason']})"
                           for r in moves) or "nothing to move")
        ev.update(effect_s=ev.get("drain_s", 0.0), effect=f"{ev.get('drain_s', 0):.1f} s to drained")
        _say(f"  {i}. host {ev.get('host')} ({ev.get('ip')}) decommissioned: drained {ev.get('drain_s', 0):.1f} s "
             f"after the request, stopped at {t1 - t0:.1f} s; {state}\n{w}{where}\n{w}{span}: {worst_txt}; "
             f"{'no batch failed' if not failed else f'batches run again: {failed}'}{why}")
    elif ev["kind"] == "kill":
        r = touched[0] if touched else None
        if r is not None:
            ev.update(effect_s=r.ended - t0, effect=f"{r.ended - t0:.1f} s to recovered")
        _say(f"  {i}. host {ev.get('host')} ({ev.get('ip')}) SIGKILLed during batch {ev.get('batch')}; {state}\n{w}"
             + (f"batch {r.batch}: {r.seconds:.2f} s = {x} the steady {median:.2f} s, {r.attempts} attempt(s); "
                f"recovered {r.ended - t0:.2f} s after the kill (below)" if r else "no batch completed after it"))
        failed = []  # a batch run again is the recovery itself
    return not failed


def _final_summary(events: list[dict], same: bool, n_results: int, last: int, took: float, ok: bool) -> None:
    _say("")
    _say(f"Summary ({took:.0f} s in all; steady = the median of the 3 batches before each event)")
    _say(f"  {'event':<26} {'took effect':<22} {'largest batch':<24} failed batches")
    for ev in events:
        worst = (f"{ev['worst_x']:.1f}x steady (batch {ev['worst_batch']})" if ev.get("worst_x") is not None
                 else "-")
        failed = ev.get("failed_batches") or []
        if ev["kind"] == "kill":
            fails = f"none (batch {ev.get('worst_batch')} ran again: the recovery)"
        else:
            fails = ", ".join(map(str, failed)) if failed else "none"
        _say(f"  {ev['label']:<26} {ev.get('effect', '-'):<22} {worst:<24} {fails}")
    _say(f"  {'output vs pandas':<26} {('IDENTICAL' if same else 'DIFFERENT') + f' ({n_results:,} results, batches 0..{last})'}")
    _say(f"  {'result':<26} {'OK' if ok else 'FAILED'}")


def _plot(reports: list, marks: list[dict], png: Path, a: argparse.Namespace, at_barrier: set) -> None:
    plt = pyplot()

    t0 = reports[0].started
    fig, ax = plt.subplots(figsize=(11, 4.5))
    # one bar per batch, spanning its run in time, as high as its latency
    xs = [r.started - t0 for r in reports]
    ys = [r.seconds for r in reports]
    colors = ["tab:red" if r.attempts > 1 else "tab:orange" if r.batch in at_barrier else "tab:blue" for r in reports]
    ax.bar(xs, ys, width=[max(0.2, y) for y in ys], align="edge", color=colors, edgecolor="white")
    top = max(ys) if ys else 1.0
    rest = max(ys[1:], default=top)
    if top > 1.5 * rest:  # batch 0 starts the Python workers and the operator: off the scale
        top = 1.3 * rest
        ax.annotate(f"batch 0\n(start-up)\n{ys[0]:.1f} s", (xs[0], top * 0.5), xytext=(3, 0),
                    textcoords="offset points", fontsize=8, va="center", color="white")
    style = {"join": ("tab:green", "-"), "rescale": ("tab:purple", "-"), "decommission": ("tab:brown", "-"),
             "kill": ("black", "--")}
    for k, ev in enumerate(marks):
        color, ls = style.get(ev["kind"], ("gray", ":"))
        x = ev["t"] - t0
        ax.axvline(x, color=color, linestyle=ls, linewidth=1.2)
        done = ev.get("t_done")
        if done is not None and done > ev["t"]:
            ax.axvspan(x, done - t0, color=color, alpha=0.12)
        ax.annotate(ev["label"], (x, top * (1.12 - 0.1 * k)), xytext=(4, 0), textcoords="offset points",
                    color=color, fontsize=9)
    ax.set_ylim(0, top * 1.2)
    ax.set_xlabel("time since the first batch (s)")
    ax.set_ylabel("batch latency (s)")
    if len(marks) > 1:
        ax2 = ax.twinx()
        ends = xs + [xs[-1] + ys[-1]]
        inst = [len(r.tasks) for r in reports]
        hosts = [len({t["host"] for t in r.tasks}) for r in reports]
        ax2.step(ends, inst + inst[-1:], where="post", color="tab:gray", linewidth=1.2, label="instances")
        ax2.step(ends, hosts + hosts[-1:], where="post", color="tab:gray", linewidth=1.2, linestyle=":",
                 label="hosts they ran on")
        ax2.set_ylabel("instances, hosts (grey)")
        ax2.set_ylim(0, max(inst + hosts) + 1.5)
        ax2.legend(loc="upper right", fontsize=8, framealpha=0.8)
    ax.set_title(f"NEXMark Q8 on rhino.spark, r={a.replicas}: per-batch latency "
                 f"(orange: a reconfiguration at its barrier; red: run again; shaded: request to effect)", fontsize=10)
    save(fig, png)
