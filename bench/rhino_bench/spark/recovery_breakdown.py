"""``rhino-bench spark recovery``: where one run's recovery time went, from the operator's reports
(Rhino), Spark's REST API and the executors' logs: detection, scheduling, state restore, replay."""

from __future__ import annotations

import argparse
import time
from typing import Any, Optional

from .common import spark_rest, spark_time


def _spark_state(p: Optional[dict]) -> dict:
    if not p:
        return {}
    ops = p.get("stateOperators") or []
    return ops[0] if ops else {}


def _victim_tasks(ui: str, app_id: str, nparts: int, ip: str, status: str) -> list[tuple[dict, dict]]:
    out = []
    for s in spark_rest(ui, f"applications/{app_id}/stages?status={status}"):
        if s.get("numTasks") == nparts and not (s.get("name") or "").startswith("run at"):
            tl = spark_rest(ui, f"applications/{app_id}/stages/{s['stageId']}/{s['attemptId']}/taskList?length=100")
            out += [(s, t) for t in tl if t.get("host") == ip]
    return out


def _victim_task_seconds(ui: str, app_id: str, nparts: int, ip: str) -> Optional[float]:
    """The duration of the victim host's task in the last completed stateful stage."""
    try:
        done = [(s, t) for s, t in _victim_tasks(ui, app_id, nparts, ip, "complete") if t.get("status") == "SUCCESS"]
    except Exception:
        return None
    if not done:
        return None
    s, t = max(done, key=lambda x: x[0]["stageId"])
    return (t.get("duration") or 0) / 1000.0


def _victim_task_running(ui: str, app_id: str, nparts: int, ip: str) -> Optional[float]:
    """The launch time of the victim host's running stateful task, if there is one."""
    try:
        run = [t for _, t in _victim_tasks(ui, app_id, nparts, ip, "active") if t.get("status") == "RUNNING"]
    except Exception:
        return None
    return spark_time(run[0]["launchTime"]) if run else None


def _wait_victim_task(ui: str, app_id: str, nparts: int, ip: str, *, timeout: float) -> Optional[float]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = _victim_task_running(ui, app_id, nparts, ip)
        if t is not None:
            return t
        time.sleep(0.05)
    return None


def _common_fields(system: str, size: int, run: Any, st: dict, args: argparse.Namespace) -> dict:
    k = st["kill_t"]
    after = sorted((b for b in run.batches if b["sink_end"] > k), key=lambda b: b["sink_end"])
    first = after[0]
    before = [b for b in run.batches if b["sink_end"] <= k]
    return {
        "record": "recovery", "system": system, "size_bytes": size, "state_bytes_at_kill": st["size_at_kill"],
        "recovered_batch": first["batch"],
        "recovery_s": first["sink_end"] - k, "steady_batch_s": st.get("steady_batch_s"),
        "batches_before_kill": len(before), "events_per_batch": args.events_per_batch,
        "victim_task_s": st.get("stateful_stage_s"), "kill_into_victim_task_s": st.get("kill_into_stage_s"),
        "kill_missed": st.get("missed", 0), "victim_task_running_at_kill": st.get("victim_task_running"),
        "payload_bytes": args.payload_bytes, "kill_unix": k, "killed_pids": len(st.get("pids") or []),
        "kill_listing_s": st.get("kill_listing_s"),
    }


def _rhino_breakdown(run: Any, st: dict, cl: Any, victim: Any, ui: str, app_id: str) -> dict:
    k = st["kill_t"]
    reps = run.operator.reports
    steady = [r for r in reps if r.ended <= k and r.batch > 0]
    tasks = [t for r in steady for t in r.tasks]
    locality = (sum(1 for t in tasks if t.get("host") == t.get("primary_host")) / len(tasks)) if tasks else None
    lost = sorted({t["instance"] for t in (steady[-1].tasks if steady else []) if t.get("primary_host") == victim.ip})
    rep = next(r for r in reps if r.ended > k)
    job_start = rep.ended - rep.commit_s - rep.job_s
    # the lost instance's task in the successful attempt (else the latest task of the batch)
    cand = [t for t in rep.tasks if t["instance"] in lost] or list(rep.tasks)
    task = max(cand, key=lambda t: t["start"])
    status = cl.coordinator_status()
    wid = victim.rhino_worker.id
    dead_since = next((w.get("dead_since") for w in status["workers"] if w["id"] == wid), None)
    takeovers, reopens = {}, {}
    fence = None
    for ev in status.get("events", []):
        if ev.get("kind") == "reconfigured" and ev.get("at", 0) >= k - 1 and ev.get("takeover_figures"):
            takeovers.update(ev["takeover_figures"])
            reopens.update(ev.get("reopen_figures") or {})
            fence = ev.get("fence_s", fence)
    # the coordinator's whole failover of the lost worker (declare_dead: takeovers, re-opens at
    # the new epoch, chain repair, its metadata); the next attempt begins after it (host_loss.py)
    done = next((ev for ev in status.get("events", [])
                 if ev.get("kind") == "failover_done" and ev.get("worker") == wid), {})
    failover = done.get("recovery_s")
    # its phases: the worker marked dead, then this operator's decision, durable plan, fence,
    # copies and commit (coordinator.py's _FAILOVER_PHASES)
    failover_phases = dict((done.get("phases") or {}).get(run.operator.operator_id) or {},
                           dead_tx_s=done.get("dead_tx_s"))
    figs = [takeovers[str(i)] for i in lost if str(i) in takeovers] or list(takeovers.values())
    takeover_restore = max((f.get("restore_s") or 0.0) for f in figs) if figs else None
    detection = (dead_since - k) if dead_since else None
    # who found the loss: the driver's batch watch / a task ("reported unreachable") or the heartbeat
    detected_by = next((ev.get("reason") for ev in status.get("events", [])
                        if ev.get("kind") == "worker_dead" and ev.get("worker") == wid), None)
    cancels = [w["cancelled_at"] for w in getattr(run.operator, "watch_log", [])
               if w.get("cancelled_at") and w["cancelled_at"] >= k]
    # the task of the lost instance that succeeded: it may have started before the detection
    # (a Spark task retry that found the primary dead, reported it and waited for the takeover).
    # Its start is Spark's launch of it, as for the baseline (derive_stages); the Python
    # side's start (after the executor got a Python worker for it) is rerun_python_start_s.
    python_start = task["start"] - k
    rerun_start = python_start
    rest = _spark_stages(ui, app_id, k, dead_since or k)
    part = sorted(t["instance"] for t in rep.tasks).index(task["instance"])
    launched = _launch_of(rest.get("stages_after_kill") or [], part, python_start)
    if launched is not None:
        rerun_start = launched
    if rest.get("stages_after_kill") is not None:
        rest.update(derive_stages(rest["stages_after_kill"], (dead_since or k) - k, rerun_start))
    replay = rest.get("replay_s") or 0.0
    open_s = float(task.get("open_s") or 0.0)
    restore = (takeover_restore or 0.0) + open_s
    inside = sum(float(task.get(f) or 0.0) for f in ("read_s", "open_s", "group_s", "timers_s", "fetch_s",
                                                       "process_s", "write_s", "commit_s"))
    return {
        "detection_s": detection, "detected_by": detected_by,
        "attempt_cancelled_s": (min(cancels) - k) if cancels else None,
        "watch": [dict(w, **{x: round(w[x] - k, 4) for x in ("cancelled_at", "exited_at", "failed_at") if w.get(x)},
                       reported=[dict(r, **{x: round(r[x] - k, 4) for x in ("at", "answered") if r.get(x)})
                                 for r in w.get("reported", [])])
                  for w in getattr(run.operator, "watch_log", []) if (w.get("cancelled_at") or 0) >= k - 1
                  or any(r["at"] >= k - 1 for r in w.get("reported", []))],
        "replay_s": replay,
        "scheduling_s": max(0.0, rerun_start - (detection or 0.0) - replay),
        "rerun_task_start_s": rerun_start, "rerun_python_start_s": python_start, "state_restore_s": restore,
        "rerun_task_failover_wait_s": max(0.0, (task["end"] - task["start"]) - inside),
        "job_attempt_start_s": job_start - k, "rerun_job_setup_s": rep.job_setup_s, "failed_tasks_after_kill": rest.get("failed_tasks_after_kill"),
        "spark_executor_removed_s": _executor_removed(ui, app_id, victim.ip, k),
        "stages_after_kill": rest.get("stages_after_kill"),
        "takeover_restore_s": takeover_restore, "session_open_s": open_s,
        "coordinator_failover_s": failover, "coordinator_fence_s": fence,
        "coordinator_failover_phases": failover_phases, "reopens": reopens,
        "sink_unwind_waits": [w for w in getattr(run.operator, "sink_unwind_waits", []) if w["batch"] == rep.batch],
        "rerun_fetch_s": task.get("fetch_s"), "rerun_task_s": task["end"] - task["start"],
        "rerun_batch_s": rep.ended - rep.started, "attempts": rep.attempts, "epoch_after": rep.epoch,
        "batch_errors": rep.errors[:4], "lost_instances": lost, "rerun_host": task.get("host"),
        "rerun_local": task.get("host") == task.get("primary_host"),
        "locality": locality, "steady_tasks": len(tasks),
        "steady_task_breakdown_s": _task_means(tasks),
        "takeover": {str(i): takeovers.get(str(i)) for i in lost},
    }


def _launch_of(rows: list[dict], part: int, python_start: float) -> Optional[float]:
    """Spark's launch of partition ``part``'s task that ran the rerun: the latest successful
    launch of that partition, in a stage of the Spark REST rows, at or before the Python
    side's start of it (None if the REST rows do not have it)."""
    cands = [r["launch_s"][str(part)] for r in rows if str(part) in (r.get("launch_s") or {})
             and r["launch_s"][str(part)] <= python_start + 0.001]
    return max(cands) if cands else None


def _task_means(tasks: list[dict]) -> dict:
    out = {}
    for f in ("read_s", "open_s", "group_s", "timers_s", "fetch_s", "process_s", "write_s", "commit_s",
              "replicate_s"):
        xs = [float(t.get(f) or 0.0) for t in tasks]
        out[f] = round(sum(xs) / len(xs), 4) if xs else None
    return out


def _spark_stages(ui: str, app_id: str, k: float, detected: float) -> dict:
    """From Spark's REST API: every stage attempt running at the kill or after it (with the
    launch time of its last successful task), then :func:`derive_stages`."""
    out: dict[str, Any] = {}
    try:
        stages = spark_rest(ui, f"applications/{app_id}/stages")
        recent = [s for s in stages if s.get("status") != "SKIPPED"
                  and (spark_time(s.get("completionTime")) or 1e18) >= k]
        rows = []
        for s in sorted(recent, key=lambda s: spark_time(s.get("submissionTime")) or 0):
            tl = spark_rest(ui, f"applications/{app_id}/stages/{s['stageId']}/{s['attemptId']}/taskList?length=500")
            ok = [spark_time(t["launchTime"]) for t in tl if t.get("status") == "SUCCESS"]
            rows.append({"stage": f"{s['stageId']}.{s['attemptId']}", "tasks": s.get("numTasks"),
                         "status": s.get("status"),
                         "submitted_s": round((spark_time(s.get("submissionTime")) or k) - k, 3),
                         "completed_s": round(spark_time(s["completionTime"]) - k, 3) if s.get("completionTime")
                         else None,
                         "last_success_launch_s": round(max(ok) - k, 3) if ok else None,
                         "failed_tasks": sum(1 for t in tl if t.get("status") == "FAILED"),
                         "name": (s.get("name") or "")[:40],
                         # each successful task's launch, by its partition index (JSON keys: str)
                         "launch_s": {str(t["index"]): round(spark_time(t["launchTime"]) - k, 3)
                                      for t in tl if t.get("status") == "SUCCESS" and "index" in t}})
        out["stages_after_kill"] = rows
        out.update(derive_stages(rows, detected - k))
    except Exception as e:  # the REST API is best effort
        out["rest_error"] = f"{type(e).__name__}: {e}"
    return out


def derive_stages(rows: list[dict], detection_s: float, rerun_start_s: Optional[float] = None) -> dict:
    """The stateful stage is the one with a task per shuffle partition (its retries keep its
    stage id, with fewer tasks). The rerun stateful task: in the first retry attempt of a
    stateful stage submitted after the detection, if there is one (the stage failed, e.g. a
    FetchFailed for map output on the lost host), else the last-launched successful task of
    the first stateful stage (a task-level retry). The replay: the other stages submitted
    after the detection and before that (the re-run of the lost map output)."""
    nparts = max((r["tasks"] or 0) for r in rows) if rows else 0
    sid = lambda r: r["stage"].split(".")[0]  # noqa: E731
    att = lambda r: int(r["stage"].split(".")[1])  # noqa: E731
    stateful = {sid(r) for r in rows if r["tasks"] == nparts and att(r) == 0 and not r["name"].startswith("run at")}
    for r in rows:
        r["stateful"] = sid(r) in stateful
    out: dict[str, Any] = {"failed_tasks_after_kill": sum(r.get("failed_tasks") or 0 for r in rows),
                           "resubmitted_stages": sum(1 for r in rows if att(r) > 0)}
    retry = [r for r in rows if r["stateful"] and att(r) > 0 and r["submitted_s"] >= detection_s]
    first = min((int(sid(r)) for r in rows if r["stateful"]), default=None)
    if retry:
        rr = retry[0]
        start = rr.get("last_success_launch_s")
        start = rr["submitted_s"] if start is None else start
    elif first is not None:
        rr = next(r for r in rows if r["stateful"] and int(sid(r)) == first)
        start = rr.get("last_success_launch_s")
    else:
        rr, start = None, None
    if rerun_start_s is not None:  # known from the task itself (Rhino's task meta)
        start = rerun_start_s
    if rr is not None and start is not None:
        out["rerun_task_start_s"] = start
        out["rerun_stage"] = rr["stage"]
    out["replay_s"] = sum((r["completed_s"] - r["submitted_s"]) for r in rows
                          if not r["stateful"] and r["completed_s"] is not None and r["submitted_s"] >= detection_s
                          and (start is None or r["submitted_s"] < start))
    return out


def _executor_removed(ui: str, app_id: str, ip: str, k: float) -> Optional[float]:
    """When Spark's driver removed the killed host's executor, seconds after the kill."""
    try:
        gone = [e for e in spark_rest(ui, f"applications/{app_id}/allexecutors")
                if e.get("hostPort", "").startswith(ip + ":") and e.get("removeTime")]
        return round(spark_time(gone[0]["removeTime"]) - k, 4) if gone else None
    except Exception:
        return None


def _spark_breakdown(run: Any, st: dict, ui: str, app_id: str, victim_ip: str) -> dict:
    k = st["kill_t"]
    out: dict[str, Any] = {"locality": None, "attempts": None}
    removed = None
    try:
        execs = spark_rest(ui, f"applications/{app_id}/allexecutors")
        gone = [e for e in execs if e.get("hostPort", "").startswith(victim_ip + ":") and e.get("removeTime")]
        removed = spark_time(gone[0]["removeTime"]) if gone else None
        out["detection_s"] = (removed - k) if removed else None
        out["executor_remove_reason"] = gone[0].get("removeReason") if gone else None
    except Exception as e:
        out["rest_error"] = f"{type(e).__name__}: {e}"
    out.update(_spark_stages(ui, app_id, k, removed or k))
    # the state load of the recovered batch (and any batch after the kill that loaded from DFS)
    loads = []
    for b, p in sorted(run.progress.items()):
        sb = next((x for x in run.batches if x["batch"] == b), None)
        if sb is None or sb["sink_end"] <= k:
            continue
        cm = _spark_state(p).get("customMetrics") or {}
        loads.append((b, cm))
    # The batch that pays the restore: the first after the kill whose tasks loaded a store
    # from the checkpoint location. Usually the recovered batch itself; the next one when
    # the kill landed after the victim's stateful task had ended (its stores then move at
    # the next batch's scheduling).
    paid = next(((b, cm) for b, cm in loads if (cm.get("rocksdbNumLoadedFromDfs") or 0) > 0), None)
    if paid is None and loads:
        paid = loads[0]
    first = paid[1] if paid else {}
    out["restore_batch"] = paid[0] if paid else None
    out["state_restore_s"] = (first.get("rocksdbLoadLatencyMs") or 0) / 1000.0 if loads else None
    out["state_load_from_snapshot_s"] = (first.get("rocksdbLoadFromSnapshotLatencyMs") or 0) / 1000.0 \
        if first else None
    out["stores_loaded_from_dfs"] = first.get("rocksdbNumLoadedFromDfs")
    out["restore_batch_metrics"] = {kk: first.get(kk) for kk in (
        "rocksdbLoadLatencyMs", "rocksdbLoadFromSnapshotLatencyMs", "rocksdbReplayChangeLogLatencyMs",
        "rocksdbNumLoadedFromDfs", "rocksdbSstFileSize", "rocksdbBytesCopied", "rocksdbFilesCopied")}
    sb = next((x for x in run.batches if x["sink_end"] > k), None)
    if sb is not None:
        p = run.progress.get(sb["batch"])
        out["rerun_batch_s"] = (p or {}).get("durationMs", {}).get("triggerExecution", 0) / 1000.0 if p else None
    if out.get("rerun_task_start_s") is not None:
        det = out.get("detection_s") or 0.0
        out["scheduling_s"] = max(0.0, out["rerun_task_start_s"] - det - (out.get("replay_s") or 0.0))
    else:
        out.setdefault("scheduling_s", None)
    return out


def _finish(rec: dict) -> None:
    for kk, v in list(rec.items()):
        if isinstance(v, float):
            rec[kk] = round(v, 4)
