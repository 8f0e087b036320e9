"""``rhino-bench demo`` (``make demo``): NEXMark Q8 on a local 3-host Spark + Rhino
cluster with r=2, a host SIGKILLed mid-run, and the query going on.

1. Start the cluster (``rhino_bench.harness.spark_cluster``): a Spark standalone master and a
   Rhino coordinator on 127.0.0.1; on each of 127.0.0.2..4 a Spark worker and a
   Rhino worker.
2. Run Q8 (``rhino_bench.nexmark``) from ``foreachBatch`` on Rhino state, with a
   payload sized so the live state reaches ``--state`` bytes.
3. When the state has reached its size, SIGKILL host ``--kill-host`` (its Spark
   worker, executors and Rhino worker at once, like a lost VM).
4. Print the recovery breakdown (detection, takeover by hard links, the batch
   run again) and check the output against the failure-free answer computed
   independently by pandas over the same events (every closed window).
5. Write a per-batch latency timeline with the failure marked
   (``DIR/latency.png``) and the per-batch records (``DIR/batches.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["main"]


def _size(text: str) -> int:
    from rhino._sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _say(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rhino-bench demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=".demo-spark", help="work directory, removed and recreated (default: %(default)s)")
    p.add_argument("--state", type=_size, default=_size("256M"),
                   help="live Q8 state to build before the kill (default: 256M)")
    p.add_argument("--hosts", type=int, default=3, help="hosts (default: %(default)s)")
    p.add_argument("--replicas", type=int, default=2, help="replicas per instance, r (default: %(default)s)")
    p.add_argument("--kill-host", type=int, default=2, help="the host to SIGKILL, 1..hosts (default: %(default)s)")
    p.add_argument("--events-per-batch", type=int, default=10_000, help="events per micro-batch (default: %(default)s)")
    p.add_argument("--batches-after", type=int, default=8,
                   help="micro-batches to run after the kill (default: %(default)s)")
    p.add_argument("--first-host", type=int, default=2, help="hosts are 127.0.0.N from this N (default: %(default)s)")
    a = p.parse_args(argv)
    if a.hosts < 2 or not 1 <= a.kill_host <= a.hosts:
        p.error("--hosts must be >= 2 and --kill-host in 1..hosts")
    if not 1 <= a.replicas < a.hosts:
        p.error("--replicas must be in 1..hosts-1 (a chain never includes its primary's host)")
    if a.state < (8 << 20) or a.events_per_batch < 1000 or a.batches_after < 2:
        p.error("--state must be >= 8M, --events-per-batch >= 1000 and --batches-after >= 2")
    return a


# Q8's state is the person and auction records of the open window: 4 of every 50 events.
INTER_EVENT_DELAY_US = 200  # 5000 events per second of event time
# A key's state is one record, and a record travels in one frame (4 MiB by default). The hot
# seller of NEXMark (3/4 of the auctions for about 5000 events) collects ~225 auctions: with
# 8 KiB payloads, under 2 MiB. Larger states come from longer windows, not larger payloads.
MAX_PAYLOAD = 8192


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(list(sys.argv[1:] if argv is None else argv))
    import numpy as np

    from ..harness.spark_cluster import LocalCluster
    from ..nexmark import oracle
    from ..nexmark.generator import generate
    from ..nexmark.pipeline import run_pipeline
    from ..nexmark.source import config_from_options

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
    events_per_batch = max(a.events_per_batch, -(-events_needed // 10))
    source = {"interEventDelayUs": INTER_EVENT_DELAY_US, "payloadBytes": payload}
    params = {"window_ms": window_ms}
    build_batches = max(2, -(-events_needed // events_per_batch))
    total_batches = build_batches + a.batches_after
    a.events_per_batch = events_per_batch
    _say(f"[demo] NEXMark Q8 (window {window_ms // 1000} s of event time), {a.events_per_batch:,} events per batch, "
         f"{payload:,} B payload per person/auction: ~{a.state / 2**20:.0f} MiB of state after {build_batches} "
         f"batches; host {a.kill_host} is killed then, {a.batches_after} batches follow")
    t_up = time.time()
    cl = LocalCluster.up(work / "cluster", hosts=a.hosts, first_host=a.first_host, heartbeat_timeout=2.0,
                         progress=lambda s: _say(f"[cluster] {s}"))
    kill: dict[str, Any] = {}
    try:
        _say(f"[demo] cluster up in {time.time() - t_up:.1f} s; starting the Spark application")
        spark = cl.spark_session("rhino-demo-q8")
        spark.sparkContext.setLogLevel("ERROR")
        victim = cl.hosts[a.kill_host - 1]

        def on_batch(batch_id: int, run: Any) -> None:
            reps = run.operator.reports
            r = reps[-1]
            size = sum(t.get("checkpoint_bytes", 0) for t in r.tasks)
            _say(f"[batch {batch_id:3d}] {r.seconds:5.2f} s  {r.tasks and sum(t['rows_in'] for t in r.tasks):6,} rows  "
                 f"state {size / 2**20:7.1f} MiB  locality {r.locality:.0%}  epoch {r.epoch}"
                 + (f"  attempts {r.attempts}" if r.attempts > 1 else ""))
            if batch_id == build_batches - 1 and not kill:
                kill["state_bytes"] = size

                def do_kill() -> None:
                    time.sleep(0.3)  # into the next batch
                    kill["t"] = time.time()
                    kill["pids"] = cl.kill_host(a.kill_host)
                    _say(f"[demo] SIGKILLed host {a.kill_host} ({victim}): its Spark worker, executors and Rhino "
                         f"worker ({len(kill['pids'])} processes)")

                threading.Thread(target=do_kill, daemon=True).start()

        run = run_pipeline(spark, system="rhino", query="q8", checkpoint_dir=work / "checkpoints",
                           events_per_batch=a.events_per_batch, max_events=a.events_per_batch * total_batches,
                           source_options=source, params=params, operator_id="demo-q8",
                           coordinator=cl.coordinator, secret_file=str(cl.secret_file), parallelism=a.hosts,
                           replicas=a.replicas, on_batch=on_batch)
        op = run.operator
        reports = op.reports
        status = cl.coordinator_status()
        spark.stop()
    finally:
        cl.down(progress=lambda s: _say(f"[cluster] {s}"))

    # ---- the recovery breakdown ---------------------------------------------------------------
    ok = True
    if "t" not in kill:
        _say("[demo] the host was never killed (the run ended first)")
        return 1
    tk = kill["t"]
    dead = [w for w in status["workers"] if w.get("dead_since")]
    detect = min((w["dead_since"] - tk for w in dead if w["dead_since"] >= tk - 1), default=None)
    takeovers = [e for e in status["events"] if e.get("kind") == "reconfigured" and e.get("takeover_figures")
                 and e["at"] >= tk - 1]
    restore = [f.get("restore_s") for e in takeovers for f in e["takeover_figures"].values()
               if f.get("restore_s") is not None]
    after = [r for r in reports if r.ended > tk]
    first = after[0] if after else None
    steady = [r.seconds for r in reports[1:] if r.ended < tk]
    _say("")
    _say("Recovery from the host loss")
    _say(f"  state at the kill           {kill['state_bytes'] / 2**20:8.1f} MiB over {a.hosts} instances, r={a.replicas}")
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
        _say(f"  steady batches before       {float(np.median(steady)):8.2f} s   median")
    post = [r.locality for r in after[1:]]
    if post:
        _say(f"  locality after recovery     {float(np.mean(post)):8.0%}   (tasks on their primary's host)")

    # ---- the output check ---------------------------------------------------------------------
    events = generate(0, a.events_per_batch * total_batches, config=config_from_options(source)).to_pandas()
    wm = reports[-1].watermark_ms
    want = oracle.closed("q8", oracle.compute("q8", events, **params), wm, **params)
    got = oracle.closed("q8", run.output(), wm, **params)
    cols = list(want.columns)
    same = (len(got) == len(want) and got.sort_values(cols).reset_index(drop=True)
            .equals(want.sort_values(cols).reset_index(drop=True).astype(got.dtypes.to_dict())))
    _say("")
    _say(f"Output check: {len(got):,} Q8 results of the closed windows vs the failure-free answer (pandas over the "
         f"same events): {'IDENTICAL' if same else 'DIFFERENT'}")
    if len(want) == 0:
        _say("  (no window closed during the run: nothing to compare; run more batches with --batches-after)")
        same = False
    ok = ok and same

    # ---- the timeline -------------------------------------------------------------------------
    with open(work / "batches.jsonl", "w") as f:
        for r in reports:
            f.write(json.dumps({"batch": r.batch, "started": r.started, "ended": r.ended, "seconds": r.seconds,
                                "attempts": r.attempts, "epoch": r.epoch, "locality": r.locality,
                                "errors": r.errors, "tasks": r.tasks}, default=str) + "\n")
    png = work / "latency.png"
    _plot(reports, tk, png, a)
    _say(f"Per-batch latency timeline: {png}")
    return 0 if ok else 1


def _plot(reports: list, tk: float, png: Path, a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = reports[0].started
    fig, ax = plt.subplots(figsize=(9, 4))
    # one bar per batch, spanning its run in time, as high as its latency
    xs = [r.started - t0 for r in reports]
    ys = [r.seconds for r in reports]
    colors = ["tab:red" if r.attempts > 1 else "tab:blue" for r in reports]
    ax.bar(xs, ys, width=[max(0.2, y) for y in ys], align="edge", color=colors, edgecolor="white")
    ax.axvline(tk - t0, color="black", linestyle="--")
    ax.annotate(f"host {a.kill_host} SIGKILLed", (tk - t0, max(ys) * 0.9), xytext=(5, 0), textcoords="offset points")
    ax.set_xlabel("time since the first batch (s)")
    ax.set_ylabel("batch latency (s)")
    ax.set_title(f"NEXMark Q8 on rhino.spark, {a.hosts} hosts, r={a.replicas}: per-batch latency (red: run again)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
