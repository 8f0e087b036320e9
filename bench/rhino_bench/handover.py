"""`rhino-bench handover`: the writer's batch latency while vnodes move, per
migration strategy (Megaphone's measure: the maximum latency during a
migration against the steady state; Rhino paper §4.1, docs/design.md §4).

    rhino-bench handover --json --repeat 2 --out bench/results/handover.jsonl         --plot bench/results/handover.png --report bench/results/handover.md

How it runs and what each record holds: bench/README.md, "Handover".
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from rhino._machine import describe_machine
from rhino._sizes import format_bytes
from rhino.coordinator.client import LocalCoordinatorClient
from rhino.coordinator.coordinator import Coordinator
from rhino.coordinator.strategies import STRATEGIES
from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret
from rhino_testing.harness.engine import MicroBatchEngine

from .common import JsonLines, exit_on_sigterm, io_flags
from .handover_report import plot, report
from .report import choices, size_arg

__all__ = ["run", "main", "CorrectnessError"]

OPERATOR = "ho"
HOSTS = (2, 3, 4, 5)


class CorrectnessError(AssertionError):
    """The state read back after a handover differs from what the writer wrote."""


# ---- the writer's model ------------------------------------------------------------------


class Model:
    """What the writer wrote: key k of 0..n-1 holds values[k] (fixed-width rows)."""

    def __init__(self, n: int, value_bytes: int) -> None:
        self.values = np.zeros((n, value_bytes), dtype=np.uint8)
        self.written = np.zeros(n, dtype=bool)

    def puts(self, keys: np.ndarray, values: np.ndarray) -> dict[int, bytes]:
        """Records the batch and returns it as the engine takes it (the last write of a key wins)."""
        self.values[keys] = values
        self.written[keys] = True
        return {int(k): bytes(values[j]) for j, k in enumerate(keys.tolist())}


def _random_values(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, width), dtype=np.uint8)


# ---- one run ----------------------------------------------------------------------------------


def _network_bytes(workers: list[WorkerProcess]) -> int:
    """Chunk bytes every worker has received from a predecessor (replication and bulk copies)."""
    total = 0
    for w in workers:
        try:
            total += int(w.metric("rhino_worker_bytes_received_total"))
        except (OSError, KeyError):
            pass
    return total


def _verify(coord_client: LocalCoordinatorClient, engine: MicroBatchEngine, model: Model) -> dict:
    """Reads every instance's state through a session (a scan) and compares it with the model."""
    from rhino.client.client import connect

    placement = coord_client.placement(OPERATOR)
    nxt = placement.last_batch + 1
    seen = np.zeros(len(model.written), dtype=np.int64)
    problems: list[str] = []
    per_instance: dict[str, int] = {}
    for i in placement.instance_order():
        keys: list[int] = []
        with connect(placement.instances[i].address, secret=SECRET, client_id="bench-verify") as cl:
            with cl.session(OPERATOR, i, batch=nxt, epoch=placement.epoch) as s:
                for k, v in s.scan(page_size=8192):
                    key = int.from_bytes(k, "little", signed=True)
                    if not 0 <= key < len(seen):
                        problems.append(f"instance {i}: unknown key {key}")
                        continue
                    seen[key] += 1
                    keys.append(key)
                    if not model.written[key]:
                        problems.append(f"instance {i}: key {key} was never written")
                    elif v != model.values[key].tobytes():
                        problems.append(f"instance {i}: key {key} holds another value than the last written")
                    if len(problems) > 20:
                        break
                s.abort()
        per_instance[str(i)] = len(keys)
        if keys:
            owners = engine.route(placement, np.asarray(keys, dtype=np.int64))
            wrong = int(np.count_nonzero(owners != i))
            if wrong:
                problems.append(f"instance {i} holds {wrong} keys the routing table gives to another instance")
    missing = int(np.count_nonzero(model.written & (seen == 0)))
    dup = int(np.count_nonzero(seen > 1))
    if missing:
        problems.append(f"{missing} written keys are on no instance")
    if dup:
        problems.append(f"{dup} keys are on more than one instance")
    return {"ok": not problems, "keys_checked": int(np.count_nonzero(model.written)),
            "keys_per_instance": per_instance, "problems": problems[:20]}


def run_one(strategy: str, rep: int, args: argparse.Namespace, say: Callable[[str], None]) -> dict:
    root = Path(args.dir) / f"{strategy}-{rep}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    secret_file = write_secret(root, SECRET)
    workers: list[WorkerProcess] = []
    coord: Optional[Coordinator] = None
    engine: Optional[MicroBatchEngine] = None
    rng = np.random.default_rng(args.seed + rep)
    n_keys = max(1, args.state // args.value_bytes)
    model = Model(n_keys, args.value_bytes)
    try:
        for n in HOSTS:
            workers.append(WorkerProcess(root, f"w{n}", f"127.0.0.{n}", secret_file=secret_file,
                                         metrics=True).start())
        coord = Coordinator(str(root / "coordinator"), secret=SECRET, heartbeat_timeout=3600.0)
        cl = LocalCoordinatorClient(coord)
        for w in workers:
            cl.register(w.id, w.address, unix_socket=str(w.unix_socket), incarnation="bench")
        cl.create_operator(OPERATOR, parallelism=args.parallelism, num_vnodes=args.num_vnodes, replicas=args.replicas)
        engine = MicroBatchEngine(cl, OPERATOR, secret=SECRET, request_timeout=600.0)

        # ---- fill (not timed) ----
        batch = 0
        per_fill = max(1, args.fill_batch_bytes // args.value_bytes)
        t_fill = time.monotonic()
        from rhino.cli.progress import Progress

        with Progress(f"{strategy} #{rep}: filling", n_keys * args.value_bytes, enabled=not args.quiet) as bar:
            for first in range(0, n_keys, per_fill):
                keys = np.arange(first, min(n_keys, first + per_fill), dtype=np.int64)
                engine.run_batch(batch, model.puts(keys, _random_values(rng, len(keys), args.value_bytes)))
                batch += 1
                bar.advance(len(keys) * args.value_bytes)
        fill_s = time.monotonic() - t_fill
        # Let the fill's write-back and compactions drain before the steady state is measured.
        os.sync()
        time.sleep(args.quiesce)
        placement = cl.placement(OPERATOR)
        state_bytes = sum(x.bytes for x in placement.instances.values())

        timeline: list[dict] = []

        def one_batch(phase: str) -> dict:
            nonlocal batch
            keys = rng.choice(n_keys, size=min(args.batch_keys, n_keys), replace=False).astype(np.int64)
            puts = model.puts(keys, _random_values(rng, len(keys), args.value_bytes))
            done_before = {p.id: p.steps_done for p in coord.meta.plans()}
            net0 = _network_bytes(workers)
            t_wall = time.time()
            res = engine.run_batch(batch, puts)
            net1 = _network_bytes(workers)
            steps = sum(p.steps_done - done_before.get(p.id, 0) for p in coord.meta.plans())
            row = {"batch": batch, "phase": phase, "start_unix": round(t_wall, 6), "seconds": round(res.seconds, 6),
                   "steps_run": steps, "epoch": res.epoch, "attempts": res.attempts, "net_bytes": net1 - net0}
            if res.errors:
                row["errors"] = res.errors[-3:]
            timeline.append(row)
            batch += 1
            return row

        for _ in range(args.warmup_batches):
            one_batch("warmup")
        for _ in range(args.steady_batches):
            one_batch("steady")
        steady = [r["seconds"] for r in timeline if r["phase"] == "steady"]
        origin_vnodes = [v for v, i in enumerate(placement.assignment) if i == 0]
        moving = origin_vnodes[: len(origin_vnodes) // 2]
        target = max(placement.instances) + 1
        plan = cl.handover(OPERATOR, moving, target, strategy=strategy)
        say(f"{strategy} #{rep}: plan {plan['plan']}: {len(moving)} vnodes of instance 0 -> new instance {target}, "
            f"{plan['steps']} steps")
        t_plan = time.time()
        guard = plan["steps"] + 50
        while cl.status()["plans_in_flight"]:
            one_batch("migration")
            guard -= 1
            if guard < 0:
                raise RuntimeError(f"plan {plan['plan']} still in flight after {plan['steps'] + 50} batches")
        for _ in range(args.after_batches):
            one_batch("after")
        row_plan = next(p for p in coord.meta.plans() if p.id == plan["plan"])
        if row_plan.state != "done":
            raise RuntimeError(f"plan {plan['plan']} ended {row_plan.state}: {row_plan.message}")
        events = [e for e in coord.meta.events(100000)
                  if e["kind"] == "handover_step" and e.get("plan") == plan["plan"]]
        first_start = events[0]["at"] - events[0]["seconds"]
        last_end = events[-1]["at"]
        step_batches = [r for r in timeline if r["steps_run"] > 0]
        in_window = [r for r in timeline
                     if step_batches and step_batches[0]["batch"] <= r["batch"] <= step_batches[-1]["batch"]]
        after = [r for r in timeline if r["phase"] == "after"]
        final = cl.placement(OPERATOR)
        new = final.instances[target]
        origin = placement.instances[0]
        if new.primary == origin.primary:
            placed = "origin's primary (its own store holds checkpoint b): imports by hard links"
        elif new.primary in origin.chain:
            placed = "a member of the origin's chain (holds checkpoint b): imports by hard links"
        else:
            placed = "a worker without the origin's checkpoint: bulk copy first"
        steady_med = statistics.median(steady)
        max_during = max(r["seconds"] for r in in_window)
        steady_net = statistics.median([r["net_bytes"] for r in timeline if r["phase"] == "steady"])
        verify = _verify(cl, engine, model)
        out = {
            "record": "run", "strategy": strategy, "rep": rep, "state_bytes_target": args.state,
            "state_bytes": state_bytes, "keys": n_keys, "value_bytes": args.value_bytes, "batch_keys": args.batch_keys,
            "fill_s": round(fill_s, 3), "plan": plan["plan"], "vnodes_moved": len(moving),
            "origin_vnodes": len(origin_vnodes), "target_instance": target, "steps": len(events),
            "migration_s": round(last_end - first_start, 4),
            "steps_s": round(sum(e["seconds"] for e in events), 4),
            "step_s": [e["seconds"] for e in events],
            "bytes_moved": int(row_plan.bytes_moved),
            "origin_primary": origin.primary, "origin_chain": list(origin.chain),
            "target_primary": new.primary, "target_chain": list(new.chain), "placement": placed,
            "vertical": row_plan.bytes_moved == 0 and (new.primary == origin.primary or new.primary in origin.chain),
            "steady_median_s": round(steady_med, 5), "steady_max_s": round(max(steady), 5),
            "max_during_s": round(max_during, 5), "ratio_max_to_steady": round(max_during / steady_med, 3),
            "ratio_max_to_steady_max": round(max_during / max(steady), 3),
            "p90_steady_s": round(float(np.percentile(steady, 90)), 5),
            "mean_during_s": round(statistics.mean(r["seconds"] for r in in_window), 5),
            "batches_during": len(in_window),
            "max_after_s": round(max(r["seconds"] for r in after), 5) if after else None,
            "steady_net_bytes_per_batch": int(steady_net),
            "net_bytes_during": int(sum(r["net_bytes"] for r in in_window)),
            "plan_scheduled_unix": round(t_plan, 6), "migration_start_unix": round(first_start, 6),
            "migration_end_unix": round(last_end, 6),
            "correct": verify["ok"], "verify": verify, "timeline": timeline,
        }
        return out
    finally:
        if engine is not None:
            engine.close()
        if coord is not None:
            coord.close()
        for w in workers:
            w.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def summarize(runs: list[dict]) -> list[dict]:
    out = []
    for s in STRATEGIES:
        rs = [r for r in runs if r["strategy"] == s]
        if not rs:
            continue
        out.append({
            "record": "summary", "strategy": s, "runs": len(rs),
            "migration_s": round(statistics.median([r["migration_s"] for r in rs]), 4),
            "steps_s": round(statistics.median([r["steps_s"] for r in rs]), 4),
            "steps": rs[0]["steps"], "bytes_moved": int(statistics.median([r["bytes_moved"] for r in rs])),
            "steady_median_s": round(statistics.median([r["steady_median_s"] for r in rs]), 5),
            "max_during_s": round(statistics.median([r["max_during_s"] for r in rs]), 5),
            "ratio_max_to_steady": round(statistics.median([r["ratio_max_to_steady"] for r in rs]), 3),
            "ratio_runs": [r["ratio_max_to_steady"] for r in rs],
            "ratio_max_to_steady_max": round(statistics.median([r["ratio_max_to_steady_max"] for r in rs]), 3),
            "step_s_median": round(statistics.median([x for r in rs for x in r["step_s"]]), 4),
            "step_s_max": round(max(x for r in rs for x in r["step_s"]), 4),
            "net_bytes_during": int(statistics.median([r["net_bytes_during"] for r in rs])),
            "steady_net_bytes_per_batch": int(statistics.median([r["steady_net_bytes_per_batch"] for r in rs])),
            "batches_during": int(statistics.median([r["batches_during"] for r in rs])),
            "steady_max_s": round(statistics.median([r["steady_max_s"] for r in rs]), 5),
            "placements": sorted({r["placement"] for r in rs}), "vertical": all(r["vertical"] for r in rs),
            "correct": all(r["correct"] for r in rs),
        })
    return out


def run(args: argparse.Namespace, emit: Callable[[dict], None], say: Callable[[str], None]) -> list[dict]:
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    need = 6 * args.state + (512 << 20)
    if free < need:
        raise SystemExit(f"rhino-bench handover: {format_bytes(free)} free under {args.dir}, a run needs about "
                         f"{format_bytes(need)}")
    emit({"record": "setup", "command": args.command, "strategies": args.strategies, "repeat": args.repeat,
          "state_bytes": args.state, "value_bytes": args.value_bytes, "batch_keys": args.batch_keys,
          "fill_batch_bytes": args.fill_batch_bytes, "steady_batches": args.steady_batches,
          "warmup_batches": args.warmup_batches, "after_batches": args.after_batches, "quiesce_s": args.quiesce,
          "parallelism": args.parallelism, "num_vnodes": args.num_vnodes, "replicas": args.replicas,
          "workers": [f"127.0.0.{n}" for n in HOSTS], "seed": args.seed,
          "machine": describe_machine(args.dir), "unix": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    runs = []
    for rep in range(args.repeat):
        order = args.strategies[rep % len(args.strategies):] + args.strategies[: rep % len(args.strategies)]
        for s in order:
            r = run_one(s, rep, args, say)
            runs.append(r)
            emit(r)
            say(f"{s} #{rep}: migration {r['migration_s']:.2f} s in {r['steps']} steps, steady median "
                f"{r['steady_median_s'] * 1e3:.0f} ms, max during {r['max_during_s'] * 1e3:.0f} ms "
                f"({r['ratio_max_to_steady']:.2f}x), bytes copied {r['bytes_moved']}, "
                f"{'correct' if r['correct'] else 'WRONG: ' + '; '.join(r['verify']['problems'][:3])}")
    summary = summarize(runs)
    for s in summary:
        emit(s)
    if not args.keep:
        try:
            os.rmdir(args.dir)  # only if empty: each run removed its own directories
        except OSError:
            pass
    return runs + summary


# ---- the command ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhino-bench handover",
                                description="The writer's batch latency while half of an instance's vnodes move to a "
                                            "new instance, per migration strategy (Megaphone's measure).")
    p.add_argument("--strategies", type=choices(STRATEGIES, "strategy"), default=list(STRATEGIES),
                   help=f"comma-separated (default: {','.join(STRATEGIES)})")
    p.add_argument("--state", type=size_arg, default=size_arg("256M"), help="state size to fill (default: 256M)")
    p.add_argument("--value-bytes", type=int, default=1024, help="bytes per value (default: %(default)s)")
    p.add_argument("--batch-keys", type=int, default=4096, help="puts per timed batch (default: %(default)s)")
    p.add_argument("--fill-batch-bytes", type=size_arg, default=size_arg("64M"),
                   help="bytes per batch while filling (default: 64M)")
    p.add_argument("--warmup-batches", type=int, default=5, help="untimed batches after the fill (default: 5)")
    p.add_argument("--quiesce", type=float, default=3.0,
                   help="seconds to wait after the fill (and a sync) before the warm-up (default: %(default)s)")
    p.add_argument("--steady-batches", type=int, default=12,
                   help="batches of the steady state (default: 12, three of this state's 4-checkpoint compaction "
                        "cycles)")
    p.add_argument("--after-batches", type=int, default=3, help="batches after the plan is done (default: 3)")
    p.add_argument("--repeat", type=int, default=2, help="runs per strategy, interleaved (default: 2)")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--num-vnodes", type=int, default=64)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    io_flags(p, dir=".bench-handover", plot="write the latency timelines here (PNG)",
             report="write a Markdown summary here")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    args = p.parse_args(argv)
    args.command = "rhino-bench handover " + " ".join(argv)
    for name in ("value_bytes", "batch_keys", "steady_batches", "repeat", "parallelism", "num_vnodes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.quiesce < 0:
        p.error("--quiesce must be at least 0")
    for name in ("warmup_batches", "after_batches", "replicas"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be at least 0")
    if args.replicas + 1 > len(HOSTS):
        p.error(f"--replicas must be at most {len(HOSTS) - 1} ({len(HOSTS)} workers)")
    exit_on_sigterm()
    with JsonLines(args) as lines:
        run(args, lines.emit, lines.say)
    rows = lines.rows
    if args.plot:
        plot(rows, args.plot)
    if args.report:
        report(rows, args.report)
    bad = [r for r in rows if r.get("record") == "run" and not r["correct"]]
    if bad:
        for r in bad:
            print(f"rhino-bench handover: {r['strategy']} run {r['rep']}: the state read back differs from what "
                  f"was written: {'; '.join(r['verify']['problems'])}", file=sys.stderr)
        return 1
    return 0
