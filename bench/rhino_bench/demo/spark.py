"""``rhino-bench demo`` (``make demo``): NEXMark Q8 on a local Spark + Rhino cluster that
changes under a running query: a host joins, the query is rescaled 3 -> 4 live, a host is
decommissioned, and a host is SIGKILLed; the output stays exactly-once.

1. Start the cluster (``rhino_testing.harness.spark_cluster``): a Spark standalone master and a
   Rhino coordinator on 127.0.0.1; on each of 127.0.0.2..4 a Spark worker and a
   Rhino worker.
2. Run Q8 (``rhino_testing.nexmark``) from ``foreachBatch`` on Rhino state (r=2), with a
   payload sized so the live state reaches about ``--state`` bytes at the kill.
3. While it runs, one after the other, each once the one before has taken effect and
   ``--gap`` batches more have committed:
   a. a host joins (``LocalCluster.add_host``: 127.0.0.5, a Spark worker, an executor of
      the running application and a Rhino worker, registered with the coordinator);
   b. the query is rescaled 3 -> 4 through the coordinator, the new instance on the new
      host, with ``--strategy``. Fluid by default (Megaphone's way to bound the spike): one
      vnode per batch barrier, so a barrier imports 1/``--vnodes`` of the state and copies
      to the new host at most one origin's checkpoint (only its new files after the
      first), however much the rescale moves in all. Batched is the same here (every move
      goes into the one new instance); all-at-once does it all in one barrier, whose copy
      grows with the whole moved state (at 256 MiB it is still small: the spike of both is
      then mostly Spark's first batch at 4 instances);
   c. host ``--decommission-host`` is decommissioned: the coordinator moves its primaries
      and replicas off it at a batch barrier, then the host is stopped (no batch fails);
   d. host ``--kill-host`` is SIGKILLed (its Spark worker, executors and Rhino worker at
      once, like a lost VM) and the query recovers.
   ``--kill-only``: only d, on the 3 hosts (the demo before hosts could join and leave).
4. Print each event's cost (time from the request to the change taking effect, the
   batches it touched against the steady median before it), the recovery breakdown,
   and check the output of the whole run against the failure-free answer computed
   independently by pandas over the same events (every closed window).
5. Write a per-batch latency timeline with every event marked (``DIR/latency.png``), the
   per-batch records (``DIR/batches.jsonl``) and the events (``DIR/events.json``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional
from ..report import size_arg
from .summary import _say, finish

__all__ = ["main"]

OPERATOR = "demo-q8"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rhino-bench demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=".demo-spark", help="work directory, removed and recreated (default: %(default)s)")
    p.add_argument("--state", type=size_arg, default=size_arg("256M"),
                   help="live Q8 state to build by the kill (default: 256M)")
    p.add_argument("--hosts", type=int, default=3, help="hosts at the start (default: %(default)s)")
    p.add_argument("--cores", type=int, default=2,
                   help="task slots of each host's Spark executor (default: %(default)s: after the kill, the two "
                        "hosts left run the four instances' tasks at once, as a real host's cores would)")
    p.add_argument("--replicas", type=int, default=2, help="replicas per instance, r (default: %(default)s)")
    p.add_argument("--kill-only", action="store_true",
                   help="no join, rescale or decommission: only the SIGKILL of a host (the older, shorter demo)")
    p.add_argument("--kill-host", type=int, default=2, help="the host to SIGKILL, 1..hosts (default: %(default)s)")
    p.add_argument("--decommission-host", type=int, default=1,
                   help="the host to decommission, 1..hosts, not --kill-host (default: %(default)s)")
    p.add_argument("--strategy", choices=("fluid", "batched", "all-at-once"), default="fluid",
                   help="migration strategy of the live rescale (default: %(default)s: one vnode per barrier)")
    p.add_argument("--vnodes", type=int, default=24,
                   help="vnodes of the operator (default: %(default)s: 8 per instance at 3, 6 at 4, so the "
                        "rescale moves 6)")
    p.add_argument("--gap", type=int, default=2,
                   help="batches committed between one event taking effect and the next (default: %(default)s)")
    p.add_argument("--events-per-batch", type=int, default=10_000, help="at least this many events per micro-batch "
                   "(default: %(default)s; more if the state needs them)")
    p.add_argument("--batches-after", type=int, default=6,
                   help="micro-batches to run after the kill, at least (default: %(default)s)")
    p.add_argument("--first-host", type=int, default=2, help="hosts are 127.0.0.N from this N (default: %(default)s)")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS on every Rhino TCP link (certificates made in DIR/cluster/certs)")
    a = p.parse_args(argv)
    if a.hosts < 2 or not 1 <= a.kill_host <= a.hosts:
        p.error("--hosts must be >= 2 and --kill-host in 1..hosts")
    if not 1 <= a.replicas < a.hosts:
        p.error("--replicas must be in 1..hosts-1 (a chain never includes its primary's host)")
    if a.state < (8 << 20) or a.events_per_batch < 1000 or a.batches_after < 2:
        p.error("--state must be >= 8M, --events-per-batch >= 1000 and --batches-after >= 2")
    if not a.kill_only:
        if not 1 <= a.decommission_host <= a.hosts or a.decommission_host == a.kill_host:
            p.error("--decommission-host must be in 1..hosts and not --kill-host")
        if a.hosts - 1 < 2 or a.replicas > a.hosts - 1:
            p.error("the elastic demo ends with hosts - 1 hosts (one joins, two leave): --hosts must be >= 3")
        if a.vnodes < a.hosts + 1 or a.gap < 1:
            p.error("--vnodes must be >= hosts + 1 and --gap >= 1")
    return a


# Q8's state is the person and auction records of the open window: 4 of every 50 events.
INTER_EVENT_DELAY_US = 200  # 5000 events per second of event time
# A key's state is one record, and a record travels in one frame (4 MiB by default). The hot
# seller of NEXMark (3/4 of the auctions for about 5000 events) collects ~225 auctions: with
# 8 KiB payloads, under 2 MiB. Larger states come from longer windows, not larger payloads.
MAX_PAYLOAD = 8192
BASE_TIME_MS = 1_600_000_000_000  # the generator's default start of event time
# The batches the elastic part takes, roughly (the window is sized on it: it closes soon
# after the kill, so the state is largest then and the output check has windows to compare).
JOIN_AT = 2  # the host joins once batches 0..JOIN_AT have committed (batch 0 warms up)
JOIN_BATCHES = 8  # a Spark worker and executor and a Rhino worker start, the executor warms: 20-30 s
DECOMMISSION_BATCHES = 2


def _steps(a: argparse.Namespace) -> int:
    """Steps of the rescale: all the vnodes of the new instance at once, or one per step
    (fluid; batched too, as every move goes into the one new instance)."""
    return 1 if a.strategy == "all-at-once" else -(-a.vnodes // (a.hosts + 1))


class _Progress:
    """Committed batches, as on_batch sees them; the script waits on it."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.committed = 0  # batches 0..committed-1 are done
        self.over = False  # the query ended

    def done(self, batch_id: int) -> None:
        with self.cv:
            self.committed = max(self.committed, batch_id + 1)
            self.cv.notify_all()

    def end(self) -> None:
        with self.cv:
            self.over = True
            self.cv.notify_all()

    def wait(self, n: int, timeout: float = 600.0) -> int:
        """Until batches 0..n-1 are committed; raises if the query ended first."""
        with self.cv:
            if not self.cv.wait_for(lambda: self.committed >= n or self.over, timeout):
                raise TimeoutError(f"batch {n - 1} did not commit in {timeout:g} s")
            if self.committed < n:
                raise RuntimeError(f"the query ended after {self.committed} batches")
            return self.committed


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(list(sys.argv[1:] if argv is None else argv))
    from rhino_testing.harness.spark_cluster import LocalCluster
    from rhino_testing.harness.warm import warm_executor
    from rhino_testing.nexmark.pipeline import run_pipeline

    elastic = not a.kill_only
    t_start = time.time()
    work = Path(a.dir).resolve()
    if work.exists():
        try:
            LocalCluster.attach(work / "cluster").down()
        except Exception:  # noqa: BLE001 - nothing of an old demo left running is fine
            pass
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # The window is sized so that its person and auction records reach --state at the kill.
    payload = MAX_PAYLOAD if a.state >= (64 << 20) else max(256, a.state // 8192)
    records = a.state // (payload + 120)
    events_needed = int(records * 50 / 4)
    window_ms = max(5000, int(events_needed * INTER_EVENT_DELAY_US / 1000) // 1000 * 1000 + 2000)
    # batches until the kill: the state grows through them (one window), then the window closes
    build_batches = (JOIN_AT + 1 + JOIN_BATCHES + _steps(a) + 1 + a.gap + DECOMMISSION_BATCHES + a.gap + 1
                     if elastic else 10)
    events_per_batch = max(a.events_per_batch, -(-events_needed // build_batches))
    build_batches = max(2, -(-events_needed // events_per_batch))
    # event time starts at a window's start, so the first window is whole: it closes right after the kill
    base_ms = BASE_TIME_MS // window_ms * window_ms
    source = {"interEventDelayUs": INTER_EVENT_DELAY_US, "payloadBytes": payload, "baseTimeMs": base_ms}
    params = {"window_ms": window_ms}
    # Kill-only: exactly build + after batches. Elastic: room for slow reconfigurations; the
    # run stops (stop_when) once --batches-after batches followed the kill and a window closed.
    total_batches = build_batches + a.batches_after + (40 if elastic else 0)
    a.events_per_batch = events_per_batch
    if elastic:
        _say(f"[demo] NEXMark Q8 (window {window_ms // 1000} s of event time), {events_per_batch:,} events per batch, "
             f"{payload:,} B payload per person/auction: the state grows to ~{a.state / 2**20:.0f} MiB over about "
             f"{build_batches} batches, while: a host joins, the query is rescaled {a.hosts}->{a.hosts + 1} "
             f"({a.strategy}), host {a.decommission_host} is decommissioned, host {a.kill_host} is SIGKILLed; "
             f"then at least {a.batches_after} batches")
    else:
        _say(f"[demo] NEXMark Q8 (window {window_ms // 1000} s of event time), {events_per_batch:,} events per "
             f"batch, {payload:,} B payload per person/auction: ~{a.state / 2**20:.0f} MiB of state after "
             f"{build_batches} batches; host {a.kill_host} is killed then, {a.batches_after} batches follow")
    t_up = time.time()
    cl = LocalCluster.up(work / "cluster", hosts=a.hosts, first_host=a.first_host, heartbeat_timeout=2.0, cores=a.cores,
                         progress=lambda s: _say(f"[cluster] {s}"), tls=a.tls)
    kill: dict[str, Any] = {}
    events: list[dict] = []  # the elastic events, in order, as they happened
    script: dict[str, Any] = {}
    prog = _Progress()
    try:
        _say(f"[demo] cluster up in {time.time() - t_up:.1f} s; starting the Spark application")
        if a.tls:
            _say(f"[demo] mutual TLS on every Rhino TCP link (certificates in {cl.state['tls_dir']}; the Spark "
                 f"tasks present their hosts' task certificates, which admit the task role only)")
        # one executor per host, and room for one more: the host that joins
        spark = cl.spark_session("rhino-demo-q8", spare_hosts=1 if elastic else 0)
        spark.sparkContext.setLogLevel("ERROR")
        victim = cl.hosts[a.kill_host - 1]
        run_ref: dict[str, Any] = {}

        def on_batch(batch_id: int, run: Any) -> None:
            run_ref["run"] = run
            reps = run.operator.reports
            r = reps[-1]
            size = sum(t.get("checkpoint_bytes", 0) for t in r.tasks)
            _say(f"[batch {batch_id:3d}] {r.seconds:5.2f} s  {r.tasks and sum(t['rows_in'] for t in r.tasks):6,} rows  "
                 f"state {size / 2**20:7.1f} MiB  {len(r.tasks)} instances on "
                 f"{len({t['host'] for t in r.tasks})} hosts  locality {r.locality:.0%}  epoch {r.epoch}"
                 + (f"  barrier {r.begin_s:.2f} s" if r.begin_s >= 0.3 else "")
                 + (f"  attempts {r.attempts}" if r.attempts > 1 else "")
                 + ("  (begun before the stop: not counted)" if "stop" in script else ""))
            prog.done(batch_id)
            if not elastic and batch_id == build_batches - 1 and not kill:
                kill["state_bytes"] = size
                threading.Thread(target=do_kill, daemon=True).start()

        def do_kill() -> None:
            time.sleep(0.3)  # into the next batch
            kill["t"] = time.time()
            kill["batch"] = prog.committed  # the batch in flight
            kill["pids"] = cl.kill_host(a.kill_host)
            _say(f"[demo] SIGKILLed host {a.kill_host} ({victim}): its Spark worker, executors and Rhino "
                 f"worker ({len(kill['pids'])} processes)")

        def state_now() -> int:
            run = run_ref.get("run")
            if run is None or not run.operator.reports:
                return 0
            return sum(t.get("checkpoint_bytes", 0) for t in run.operator.reports[-1].tasks)

        def elastic_script() -> None:
            """The four events, one after the other, while the query runs."""
            try:
                prog.wait(JOIN_AT + 1)
                # 1. a host joins
                ev = {"kind": "join", "label": "host joins", "t": time.time(), "batch": prog.committed,
                      "state_bytes": state_now()}
                events.append(ev)
                _say(f"[demo] 1/4 a host joins (batch {ev['batch']} running): a Spark worker and a Rhino worker "
                     f"on the next address")
                new = cl.add_host(progress=lambda s: _say(f"[cluster] {s}"))
                cl.wait_for_executors(spark, timeout=120)
                ev["t_registered"] = time.time()
                warm = warm_executor(spark, new.ip, lambda m: _say(f"[demo] {m}"))
                ev.update(t_done=time.time(), batch_done=prog.committed, host=new.n, ip=new.ip,
                          worker=new.rhino_worker.id, warmed=warm)
                _say(f"[demo] host {new.n} ({new.ip}) joined in {ev['t_done'] - ev['t']:.1f} s: Rhino worker "
                     f"{new.rhino_worker.id} and an executor of this application registered in "
                     f"{ev['t_registered'] - ev['t']:.1f} s, the executor's Python worker "
                     + (f"warmed in {ev['t_done'] - ev['t_registered']:.1f} s" if warm else "not warmed (see above)"))
                prog.wait(prog.committed + a.gap)
                # 2. the query is rescaled onto it, live
                with cl.coordinator_client() as cc:
                    ev = {"kind": "rescale", "label": f"rescale {a.hosts}->{a.hosts + 1}", "t": time.time(),
                          "batch": prog.committed, "strategy": a.strategy, "state_bytes": state_now()}
                    events.append(ev)
                    plan = cc.rescale(OPERATOR, a.hosts + 1, strategy=a.strategy, on=[new.rhino_worker.id])
                    ev.update(plan=plan["plan"], steps=plan["steps"], moves=plan.get("moves"), worker=new.rhino_worker.id)
                    _say(f"[demo] 2/4 rescale {a.hosts}->{a.hosts + 1} asked (batch {ev['batch']} running): plan "
                         f"{plan['plan']}, {plan.get('moves')} vnodes to a new instance on {new.rhino_worker.id}, "
                         f"{plan['steps']} step(s) ({a.strategy}), one per batch barrier")
                    seen: set = set()
                    while True:
                        st = cc.status()
                        for e in st["events"]:
                            if e.get("kind") == "handover_step" and e.get("plan") == plan["plan"] \
                                    and e.get("step") not in seen:
                                seen.add(e.get("step"))
                                _say(f"[rescale] step {e.get('step')}/{e.get('of')} at a barrier: epoch "
                                     f"{e.get('epoch')}, {e.get('vnodes')} vnode(s), "
                                     f"{(e.get('bytes_copied') or 0) / 2**20:.1f} MiB copied, "
                                     f"{e.get('seconds', 0):.2f} s")
                        if not [p for p in st["plans_in_flight"] if p["id"] == plan["plan"]]:
                            break
                        if prog.over:
                            raise RuntimeError("the query ended with the rescale still open")
                        time.sleep(0.3)
                    ev.update(t_done=time.time(), batch_done=prog.committed)
                _say(f"[demo] rescale done in {ev['t_done'] - ev['t']:.1f} s")
                prog.wait(prog.committed + a.gap)
                # 3. a host is decommissioned
                leaving = cl.host(a.decommission_host)
                ev = {"kind": "decommission", "label": f"host {a.decommission_host} decommissioned",
                      "t": time.time(), "batch": prog.committed, "host": leaving.n, "ip": leaving.ip,
                      "worker": leaving.rhino_worker.id, "state_bytes": state_now()}
                events.append(ev)
                _say(f"[demo] 3/4 decommission host {leaving.n} ({leaving.ip}) (batch {ev['batch']} running): "
                     f"its instances move off it at the next batch barrier, then it stops")
                out = cl.decommission_host(a.decommission_host, timeout=240,
                                           progress=lambda s: _say(f"[cluster] {s}"))
                ev.update(t_drained=ev["t"] + out["drain_s"], t_done=time.time(), batch_done=prog.committed,
                          drain_s=out["drain_s"])
                prog.wait(prog.committed + a.gap)
                # 4. a host is lost: once the state is at its largest (the window's last batch
                # before it closes) if the rest was quicker than planned, else now
                n = prog.wait(max(prog.committed + 1, build_batches))
                kill["state_bytes"] = state_now()
                _say(f"[demo] 4/4 SIGKILL host {a.kill_host} ({victim}) during batch {n}")
                do_kill()
                events.append({"kind": "kill", "label": f"host {a.kill_host} SIGKILLed", "t": kill["t"],
                               "batch": kill["batch"], "host": a.kill_host, "ip": victim,
                               "state_bytes": kill["state_bytes"]})
            except Exception as e:  # noqa: BLE001 - reported; the query runs on to its end
                script["error"] = f"{type(e).__name__}: {e}"
                _say(f"[demo] the elastic part stopped: {script['error']}")
            finally:
                script["over"] = time.time()

        def stop_when(run: Any) -> bool:
            t_end = kill.get("t") or script.get("over")
            if t_end is None or "over" not in script:
                return False
            after = [b for b in run.batches if b["sink_end"] > t_end]
            closed = any(len(run.outputs.get(b["batch"], ())) for b in run.batches)
            if len(after) >= a.batches_after and (closed or len(after) >= a.batches_after + 15):
                # The next batch has begun already: stopping interrupts it; it is not counted.
                script["stop"] = max(b["batch"] for b in run.batches)
                _say(f"[demo] stopping the query after batch {script['stop']} (the batch in flight is interrupted "
                     f"and not counted)")
                return True
            return False

        if elastic:
            threading.Thread(target=elastic_script, daemon=True, name="demo-script").start()
        try:
            run = run_pipeline(spark, system="rhino", query="q8", checkpoint_dir=work / "checkpoints",
                               events_per_batch=a.events_per_batch, max_events=a.events_per_batch * total_batches,
                               source_options=source, params=params, operator_id=OPERATOR,
                               coordinator=cl.coordinator, secret_file=str(cl.secret_file), parallelism=a.hosts,
                               replicas=a.replicas, on_batch=on_batch, stop_when=stop_when if elastic else None,
                               operator_options={**({"num_vnodes": a.vnodes} if elastic else {}),
                                                 **({"tls": cl.task_tls} if a.tls else {})} or None)
        finally:
            prog.end()
        status = cl.coordinator_status()
        coord_events = cl.coordinator_events()
        spark.stop()
    finally:
        cl.down(progress=lambda s: _say(f"[cluster] {s}"))

    return finish(a, run, status, coord_events, events, kill, script, work, source, params, t_start)
