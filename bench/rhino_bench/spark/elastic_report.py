"""``rhino-bench spark elastic``: the summary, the plot and the report of its records (pure: they read the
JSON lines alone, in a run or with ``--from``)."""

from __future__ import annotations

from typing import Any, Optional

from .common import median, round_floats
from ..report import fmt, md_table, pyplot, run_header, save, setup_of, write_lines

from .state_size_workload import SYSTEMS
RECOVERED_TARGET = 5     # batches after a rate step until the latency is back under the trigger interval
SPIKE_TARGET = 2.0       # a rescale's largest batch over the steady median


# --------------------------------------------------------------------------- the summary (pure)


def _data(rows: list[dict]) -> list[dict]:
    """Batches that read events (a no-data batch only moves the watermark)."""
    return sorted((r for r in rows if (r.get("events") or 0) > 0 and r.get("latency_s") is not None),
                  key=lambda r: r["batch"])


def _in_steps(rows: list[dict]) -> list[dict]:
    return [r for r in _data(rows) if r.get("phase") == "steps" and r.get("step") is not None]


def rescale_windows(rows: list[dict], reconfs: list[dict]) -> list[dict]:
    """Per planned reconfiguration, the batches it spans: from the batch after its decision
    through the batch whose barrier ran its last step (a plan that never finished: through the
    last batch that ran one of its steps). Each with its largest batch latency."""
    out = []
    lat = {r["batch"]: r["latency_s"] for r in _data(rows)}
    for c in reconfs:
        d = c.get("decided_batch")
        if d is None or c.get("plan") is None:
            continue
        done = c.get("done_batch")
        if done is None and c.get("step_batches"):
            done = max(b for b in c["step_batches"] if b is not None) if any(
                b is not None for b in c["step_batches"]) else None
        if done is None:
            continue
        bs = sorted(b for b in lat if d < b <= done)
        worst = max(bs, key=lambda b: lat[b]) if bs else None
        out.append({"plan": c.get("plan"), "action": c.get("action"), "from": c.get("from"), "to": c.get("to"),
                    "decided_batch": d, "done_batch": done, "batches": bs, "finished": c.get("done_batch") is not None,
                    "worst_batch": worst, "worst_s": lat[worst] if worst is not None else None})
    return out


def steady_median(rows: list[dict], windows: list[dict]) -> Optional[float]:
    """The median latency of the first step's batches (after the warm-up) outside any rescale."""
    busy = {b for w in windows for b in w["batches"]}
    return median([r["latency_s"] for r in _in_steps(rows) if r["step"] == 0 and r["batch"] not in busy])


def step_recovery(rows: list[dict], trigger_s: float) -> list[dict]:
    """Per rate step after the first: how many of its batches ran before the one from which
    every batch of the step is under the trigger interval."""
    steps = _in_steps(rows)
    out = []
    for k in sorted({r["step"] for r in steps}):
        bs = [r for r in steps if r["step"] == k]
        if k == 0:
            continue
        lat = [r["latency_s"] for r in bs]
        n = len(bs)
        for i in range(len(bs) - 1, -1, -1):
            if not lat[i] < trigger_s:
                break
            n = i
        out.append({"step": k, "rate_x": bs[0].get("rate_x"), "batches": len(bs), "first_batch": bs[0]["batch"],
                    "recovered_within_batches": n, "recovered": bool(bs) and n < len(bs),
                    "latency_max_s": max(lat), "parallelism_end": bs[-1].get("parallelism"),
                    "parallelism_max": max((r.get("parallelism") or 0) for r in bs)})
    return out


def _by_step(rows: list[dict]) -> list[dict]:
    steps = _in_steps(rows)
    out = []
    for k in sorted({r["step"] for r in steps}):
        bs = [r for r in steps if r["step"] == k]
        ps = [r["parallelism"] for r in bs if r.get("parallelism") is not None]
        out.append({"step": k, "rate_x": bs[0].get("rate_x"), "batches": len(bs),
                    "parallelism_end": bs[-1].get("parallelism"), "parallelism_min": min(ps) if ps else None,
                    "parallelism_max": max(ps) if ps else None,
                    "latency_median_s": median([r["latency_s"] for r in bs]),
                    "latency_max_s": max(r["latency_s"] for r in bs)})
    return out


def _follows(by_step: list[dict]) -> Optional[bool]:
    """Each change of rate moved the parallelism the same way (by the steps' last batches)."""
    verdicts = []
    for a, b in zip(by_step, by_step[1:]):
        if a["rate_x"] is None or b["rate_x"] is None or a["rate_x"] == b["rate_x"]:
            continue
        if a["parallelism_end"] is None or b["parallelism_end"] is None:
            verdicts.append(False)
            continue
        up = b["rate_x"] > a["rate_x"]
        verdicts.append(b["parallelism_end"] > a["parallelism_end"] if up
                        else b["parallelism_end"] < a["parallelism_end"])
    return all(verdicts) if verdicts else None


def summarize_system(system: str, rows: list[dict], reconfs: list[dict], trigger_s: float,
                     restart: Optional[dict] = None, failures: int = 0) -> dict:
    """The summary line of one system, from its batch and reconfiguration lines."""
    windows = rescale_windows(rows, reconfs)
    steady = steady_median(rows, windows)
    rec = step_recovery(rows, trigger_s)
    steps = _in_steps(rows)
    ps = [r["parallelism"] for r in steps if r.get("parallelism") is not None]
    by_step = _by_step(rows)
    spikes = [w["worst_s"] / steady for w in windows if w["worst_s"] is not None and steady]
    failed = sum(1 for r in rows if r.get("failed") and r.get("phase") not in ("pre_restart", "restart")) + failures
    out: dict[str, Any] = {
        "record": "summary", "system": system,
        "recovered_within_batches": max((s["recovered_within_batches"] for s in rec), default=None),
        "recovered_all_steps": all(s["recovered"] for s in rec) if rec else None,
        "rescale_spike_x": max(spikes) if spikes else None,
        "failed_batches": failed,
        "parallelism_min": min(ps) if ps else None, "parallelism_max": max(ps) if ps else None,
        "parallelism_by_step": [s["parallelism_end"] for s in by_step],
        "parallelism_follows_rate": _follows(by_step),
        "steady_median_s": steady, "trigger_interval_s": trigger_s,
        "latency_max_s": max((r["latency_s"] for r in steps), default=None),
        "batches": len(steps), "rescales": len(windows),
        "per_step": rec, "by_step": by_step,
        "per_rescale": [dict(w, spike_x=(w["worst_s"] / steady if w["worst_s"] is not None and steady else None))
                        for w in windows],
    }
    r = out["recovered_within_batches"]
    out["targets"] = {
        "recovered_within_5": None if r is None else bool(out["recovered_all_steps"] and r <= RECOVERED_TARGET),
        "parallelism_follows_rate": out["parallelism_follows_rate"],
        "no_failed_batch": failed == 0,
        "rescale_spike_at_most_2x": None if not windows else bool(spikes and len(spikes) == len(windows)
                                                                   and max(spikes) <= SPIKE_TARGET),
    }
    out["targets_met"] = all(v is True for v in out["targets"].values())
    if restart is not None:
        out["restart"] = {k: restart.get(k) for k in (
            "remedy_s", "stop_s", "restart_s", "first_batch_s", "state_load_s", "host_join_s", "executors_before",
            "executors_after", "state_partitions_before", "state_partitions_after", "latency_after_median_s",
            "kept_up_after")}
        if steady and restart.get("first_batch_s") is not None:
            out["restart"]["first_batch_x"] = restart["first_batch_s"] / steady
    return round_floats(out)


def _trigger_s(records: list[dict], system: str) -> Optional[float]:
    for r in records:
        if r.get("record") == "schedule" and r.get("system") == system and r.get("trigger_interval_s"):
            return float(r["trigger_interval_s"])
    for r in records:
        if r.get("record") == "setup":
            v = (r.get("parameters") or {}).get("trigger_interval_s")
            if v:
                return float(v)
    return None


def _last_schedule(records: list[dict], system: str) -> Optional[dict]:
    """The system's schedule as last written (Spark's remedy appends a segment)."""
    return next((r for r in reversed(records) if r.get("record") == "schedule" and r.get("system") == system), None)


def summarize(records: list[dict]) -> list[dict]:
    """One summary per system present in ``records``."""
    out = []
    for system in SYSTEMS:
        rows = [r for r in records if r.get("record") == "batch" and r.get("system") == system]
        if not rows:
            continue
        reconfs = [r for r in records if r.get("record") == "reconfiguration" and r.get("system") == system]
        restart = next((r for r in records if r.get("record") == "restart" and r.get("system") == system), None)
        failures = sum(1 for r in records if r.get("record") == "query_failed" and r.get("system") == system)
        out.append(summarize_system(system, rows, reconfs, _trigger_s(records, system) or 0.0, restart, failures))
    return out


# --------------------------------------------------------------------------- the plot


_COLORS = {"rhino": "#d04040", "spark-rocksdb": "#404040"}


def plot(records: list[dict], path: str) -> None:
    """Per system a column: the rate (planned, and what each batch read), the parallelism, the
    batch latency (the trigger interval dashed); each reconfiguration marked (its decision
    solid, the barriers of its steps dotted), Spark's restart shaded."""
    plt = pyplot()

    systems = [s for s in SYSTEMS if any(r.get("record") == "batch" and r.get("system") == s for r in records)]
    if not systems:
        return
    fig, axs = plt.subplots(3, len(systems), figsize=(7.5 * len(systems), 9), sharex="col", squeeze=False,
                            gridspec_kw={"height_ratios": [1, 0.8, 1.6]})
    for j, system in enumerate(systems):
        rows = sorted((r for r in records if r.get("record") == "batch" and r.get("system") == system),
                      key=lambda r: r["batch"])
        rows = [r for r in rows if r.get("t") is not None]
        sched = _last_schedule(records, system)
        trig = _trigger_s(records, system)
        ax_r, ax_p, ax_l = axs[0][j], axs[1][j], axs[2][j]
        color = _COLORS[system]
        # the rate: planned (the schedule's segments) and read (events over the time since the last batch)
        if sched and sched.get("segments_t"):
            segs = sched["segments_t"]
            xs, ys = [], []
            for i, (t, eps) in enumerate(segs):
                t_next = segs[i + 1][0] if i + 1 < len(segs) else (rows[-1]["t"] + rows[-1]["latency_s"]
                                                                   if rows else t)
                xs += [t, t_next]
                ys += [eps, eps]
            ax_r.plot(xs, ys, color="tab:blue", linewidth=1.5, label="arrival rate (schedule)")
        prev = None
        pts = []
        for r in rows:
            if prev is not None and r["t"] > prev["t"] and r.get("events"):
                pts.append((r["t"], r["events"] / (r["t"] - prev["t"])))
            prev = r
        if pts:
            ax_r.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, color=color, label="read per batch / interval")
        ax_r.set_ylabel("events/s")
        ax_r.set_title(f"{system}: NEXMark Q8, input rate steps" + (f", trigger {trig:g} s" if trig else ""),
                       fontsize=10)
        ax_r.legend(fontsize=7, loc="upper left")
        # the parallelism
        xs = [r["t"] for r in rows]
        ps = [r.get("parallelism") for r in rows]
        if rows:
            ax_p.step(xs + [xs[-1] + rows[-1]["latency_s"]], ps + [ps[-1]], where="post", color=color)
        ax_p.set_ylabel("parallelism" if system == "rhino" else "state partitions")
        top = max([p for p in ps if p is not None] or [1])
        ax_p.set_ylim(0, top + 1)
        # the latency: one bar per batch that read events, spanning its run; a failed one hatched
        bars = [r for r in rows if r.get("events")]
        bar_c = ["#b0b0b0" if r.get("phase") in ("warmup",) else "tab:orange"
                 if r.get("phase") in ("pre_restart", "restart") else color for r in bars]
        ax_l.bar([r["t"] for r in bars], [r["latency_s"] for r in bars],
                 width=[max(0.2, r["latency_s"]) for r in bars], align="edge", color=bar_c, edgecolor="white",
                 linewidth=0.3)
        failed = [r for r in bars if r.get("failed")]
        if failed:
            ax_l.bar([r["t"] for r in failed], [r["latency_s"] for r in failed],
                     width=[max(0.2, r["latency_s"]) for r in failed], align="edge", fill=False, hatch="xx",
                     edgecolor="black", linewidth=0.5, label="failed (run again)")
        if trig:
            ax_l.axhline(trig, color="black", linestyle="--", linewidth=1, label=f"trigger interval {trig:g} s")
        ax_l.set_ylabel("batch latency (s)")
        ax_l.set_xlabel("seconds since the query started (grey: warm-up; orange: Spark's restart phase)")
        # the reconfigurations
        for c in (r for r in records if r.get("record") == "reconfiguration" and r.get("system") == system):
            if c.get("decided_t") is not None:
                for ax in (ax_r, ax_p, ax_l):
                    ax.axvline(c["decided_t"], color="tab:purple", linewidth=1)
                ax_l.annotate(f"{c.get('action', '?')} {c.get('from')}->{c.get('to')}", (c["decided_t"], 1),
                              xycoords=("data", "axes fraction"), xytext=(2, -10), textcoords="offset points",
                              fontsize=7, color="tab:purple", rotation=90, va="top")
            for t in c.get("step_t") or []:
                if t is not None:
                    for ax in (ax_p, ax_l):
                        ax.axvline(t, color="tab:purple", linewidth=1, linestyle=":")
        rs = next((r for r in records if r.get("record") == "restart" and r.get("system") == system), None)
        if rs and rs.get("stop_t") is not None and rs.get("first_end_t") is not None:
            for ax in (ax_r, ax_p, ax_l):
                ax.axvspan(rs["stop_t"], rs["first_end_t"], color="tab:orange", alpha=0.15)
            ax_l.annotate(f"query stopped, restarted with more executors: {rs.get('remedy_s', 0):.1f} s",
                          (rs["stop_t"], 0.97), xycoords=("data", "axes fraction"), fontsize=7, va="top", ha="right")
        for st in (sched or {}).get("steps", []):
            for ax in (ax_r, ax_p, ax_l):
                ax.axvline(st["t"], color="tab:blue", linewidth=0.8, alpha=0.5)
        ax_l.legend(fontsize=7, loc="upper left")
    save(fig, path)


# --------------------------------------------------------------------------- the report


def _f(x: Any, d: int = 2) -> str:
    return fmt(x, d)


def _met(v: Optional[bool]) -> str:
    return "n/a" if v is None else ("**met**" if v else "**not met**")


def report(records: list[dict], path: str) -> None:
    setup = setup_of(records, last=True)
    summ = {s["system"]: s for s in summarize(records)}
    L = run_header("Spark elastic: NEXMark Q8 while the input rate steps, Rhino's autoscaler vs Spark's RocksDB "
                   "state store", setup, (f", load average at the start {setup.get('loadavg_1_5_15')}"
                                          if setup.get("loadavg_1_5_15") else "") + ".",
                   spark=" (besides the cluster's: one 1-core executor per host, `spark.sql.shuffle.partitions=3`; "
                   "RocksDB state store provider with its defaults).")
    L += ["Each system ran on a fresh local cluster: 3 hosts and a spare one (Rhino: joined before the query, "
         "for the autoscaler; Spark: joined for its remedy). Events arrive on a schedule; each batch reads what "
         "has arrived (a processing-time trigger), so a system that falls behind gets larger batches. Batch "
         "latency is Spark's `durationMs.triggerExecution` for both systems. Definitions: the docstring of "
         "`bench/rhino_bench/spark/elastic.py` and the `Spark elastic` section of `bench/README.md`.", ""]
    for c in (r for r in records if r.get("record") == "calibration"):
        L += [f"`--base-events auto`: one Rhino instance's true rate in the warm-up was "
              f"{_f(c.get('instance_events_per_s'), 0)} events/s ({_f(c.get('instance_records_per_s'), 0)} records/s "
              f"over busy time, {_f(c.get('events_per_record'), 1)} events per record), so 1x = "
              f"{c.get('base_load')} x that = **{c.get('base_events'):,} events per trigger interval**.", ""]
    for sc in filter(None, (_last_schedule(records, system) for system in SYSTEMS)):
        L += [f"{sc['system']}: steps " + ", ".join(f"{s['rate_x']:g}x ({s['events_per_s']:.0f} events/s) from "
                                                    f"t={s['t']:.0f} s" for s in sc.get("steps", []))
              + f"; the schedule ended at t={_f(sc.get('end_t'), 0)} s.", ""]
    L += ["## Summary", ""]
    L += md_table(["system", "recovered within (batches)", "all steps recovered", "rescale spike", "failed batches",
                   "parallelism min", "max", "by step", "follows rate", "steady median (s)", "largest batch (s)",
                   "rescales"],
                  [(s["system"], _f(s["recovered_within_batches"]), _f(s["recovered_all_steps"]),
                    "-" if s["rescale_spike_x"] is None else f"{s['rescale_spike_x']:.2f}x", s["failed_batches"],
                    _f(s["parallelism_min"]), _f(s["parallelism_max"]), s["parallelism_by_step"],
                    _f(s["parallelism_follows_rate"]), _f(s["steady_median_s"]), _f(s["latency_max_s"]),
                    s["rescales"]) for s in summ.values()], "lrlrrrrllrrr")
    L += ["", "## Targets (reported, not asserted)", ""]
    for s in summ.values():
        t = s["targets"]
        L += [f"{s['system']}:", "",
              f"- back under the trigger interval ({_f(s['trigger_interval_s'], 1)} s) within {RECOVERED_TARGET} "
              f"batches after each step: worst {_f(s['recovered_within_batches'])}"
              f"{'' if s['recovered_all_steps'] in (True, None) else ' (a step ended still over it)'}: "
              f"{_met(t['recovered_within_5'])}",
              f"- parallelism follows the rate (each step's last batch): {s['parallelism_by_step']}: "
              f"{_met(t['parallelism_follows_rate'])}",
              f"- no batch fails: {s['failed_batches']} failed: {_met(t['no_failed_batch'])}",
              f"- each rescale's largest batch <= {SPIKE_TARGET:g}x the steady median ({_f(s['steady_median_s'])} s): "
              + (", ".join(f"{w['action']} {w['from']}->{w['to']} {_f(w['spike_x'])}x (batch {w['worst_batch']})"
                           for w in s["per_rescale"]) or "no rescale")
              + f": {_met(t['rescale_spike_at_most_2x'])}", ""]
        if s.get("per_step"):
            L += md_table(["step", "rate", "batches", "recovered within", "recovered", "largest batch (s)",
                           "parallelism at its end"],
                          [(p["step"], f"{_f(p['rate_x'], 1)}x", p["batches"], p["recovered_within_batches"],
                            _f(p["recovered"]), _f(p["latency_max_s"]), _f(p["parallelism_end"]))
                           for p in s["per_step"]], "rrrrlrr") + [""]
    reconfs = [r for r in records if r.get("record") == "reconfiguration"]
    if reconfs:
        L += ["## Reconfigurations (the autoscaler's decisions and their plans)", ""]
        L += md_table(["system", "decided on batch", "t (s)", "action", "plan", "strategy",
                       "steps at the barriers of batches", "step seconds", "bytes copied", "reason"],
                      [(c["system"], _f(c.get("decided_batch")), _f(c.get("decided_t"), 1),
                        f"{c.get('action')} {c.get('from')}->{c.get('to')}", _f(c.get("plan")), _f(c.get("strategy")),
                        c.get("step_batches"), c.get("step_seconds"), _f(c.get("bytes_copied")),
                        str(c.get("reason") or c.get("error") or "")[:300]) for c in reconfs], "lrrlrlllrl") + [""]
    for rs in (r for r in records if r.get("record") == "restart"):
        L += ["## Spark's remedy: stop the query, restart it with more executors, same state partitions", "",
              f"After the steps, state {_f((rs.get('state_bytes_at_stop') or 0) / 2**20, 1)} MiB (RocksDB SST "
              f"files). The spare host joined first, while nothing arrived ({_f(rs.get('host_join_s'), 1)} s, not "
              f"counted): executors {rs.get('executors_before')} -> {rs.get('executors_after')}. Then the query was "
              f"stopped ({'caught up' if rs.get('caught_up_at_stop') else 'still behind: a batch in flight was cut'}) "
              f"and started again from its checkpoint, with events arriving at the peak rate "
              f"({_f(rs.get('rate_x'), 1)}x) from the stop request on; state partitions "
              f"{rs.get('state_partitions_before')} -> {rs.get('state_partitions_after')}.", "",
              f"- `stop_s` (query.stop()): {_f(rs.get('stop_s'))} s",
              f"- `restart_s` (start() of the new query to the end of its first batch): {_f(rs.get('restart_s'))} s; "
              f"that batch {rs.get('first_batch')}: {_f(rs.get('first_batch_s'))} s, {rs.get('first_batch_events')} "
              f"events, state load {_f(rs.get('state_load_s'))} s ({rs.get('stores_loaded_from_dfs')} stores "
              f"loaded from the checkpoint)",
              f"- **`remedy_s`** (the stop request to the end of the first batch after the restart: the query's "
              f"outage): **{_f(rs.get('remedy_s'))} s**",
              f"- then {rs.get('batches_after')} more batch(es) at the peak rate: latency median "
              f"{_f(rs.get('latency_after_median_s'))} s against the trigger interval {_f(rs.get('trigger_interval_s'), 1)} "
              f"s: {'kept up' if rs.get('kept_up_after') else 'still behind'} "
              f"({', '.join(_f(x) for x in rs.get('latencies_after_s') or [])} s)", ""]
    for system in SYSTEMS:
        rows = sorted((r for r in records if r.get("record") == "batch" and r.get("system") == system),
                      key=lambda r: r["batch"])
        if not rows:
            continue
        L += [f"## {system}: every batch", ""]
        L += md_table(["batch", "t (s)", "phase", "step", "rate", "events", "latency (s)", "oldest event age (s)",
                       "parallelism", "failed", "autoscaler"],
                      [(r["batch"], _f(r.get("t"), 1), r.get("phase"), _f(r.get("step")), _f(r.get("rate_x"), 1),
                        _f(r.get("events")), _f(r.get("latency_s")), _f(r.get("oldest_event_age_s")),
                        _f(r.get("parallelism")), "yes" if r.get("failed") else "", _decision(r)) for r in rows],
                      "rrlrrrrrrll") + [""]
    for q in (r for r in records if r.get("record") == "query_failed"):
        L += [f"**{q.get('system')}: the query failed**: {q.get('error')}", ""]
    write_lines(path, L)


def _decision(r: dict) -> str:
    d = r.get("decision") or {}
    return f"{d.get('action')} {d.get('from')}->{d.get('to')}" if d.get("action") not in (None, "hold") else \
        ("hold" if d else "")
