"""``rhino-bench spark throughput``: steady-state events/s and per-batch latency of
NEXMark Q8 on one 3-host :class:`~rhino_testing.harness.spark_cluster.LocalCluster`, for three
configurations in the same run: Rhino with r=0, Rhino with r=2, and Spark's own
``transformWithStateInPandas`` with the RocksDB state store provider.

    rhino-bench spark throughput --json --out bench/results/spark_throughput.jsonl \
        --plot bench/results/spark_throughput.png --report bench/results/spark_throughput.md

How it runs and what each record holds: bench/README.md, "Spark throughput".
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, spark_flags
from ..report import choices, fmt, md_table, pyplot, run_header, save, setup_of, write_lines
from .common import mean as _mean, median, non_negative_int, percentile, positive_float, positive_int, round_floats, say

__all__ = ["main", "CONFIGS", "R2_VS_SPARK_TARGET", "R2_COST_TARGET"]

R2_VS_SPARK_TARGET = 1.0
R2_COST_TARGET = 0.10
LOCALITY_TARGET = 0.95
CONFIGS = {"rhino-r0": ("rhino", 0), "rhino-r2": ("rhino", 2), "spark-rocksdb": ("spark", None),
           "spark-rocksdb-changelog": ("spark", None)}
# Spark's baselines: its RocksDB state store with Spark's default (a snapshot uploaded at every
# commit) and with changelog checkpointing, its recommended production setting (a per-batch change
# log, a snapshot every few batches). Each ratio is reported against the less favourable of them.
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
SPARK_BASELINES = {"spark-rocksdb": "false", "spark-rocksdb-changelog": "true"}
_TASK_FIELDS = ("read_s", "open_s", "group_s", "timers_s", "fetch_s", "process_s", "write_s", "commit_s",
                "replicate_s")


class Throughput(Scenario):
    name = "spark throughput"
    description = ("Steady-state throughput and per-batch latency of NEXMark Q8: Rhino r=0, Rhino r=2 and Spark's "
                   "transformWithStateInPandas with RocksDB, on one local 3-host cluster.")
    workdir_prefix = "rhino-spark-throughput-"
    summary_on_failure = False

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--configs", type=choices(CONFIGS, "configuration"), default=list(CONFIGS),
                        help=f"comma-separated, from {', '.join(CONFIGS)} (default all)")
        ap.add_argument("--events-per-batch", type=positive_int, default=50_000)
        ap.add_argument("--batches", type=positive_int, default=10, help="measured batches per run (default 10)")
        ap.add_argument("--warmup", type=non_negative_int, default=2, help="discarded batches per run (default 2)")
        ap.add_argument("--rounds", type=positive_int, default=1, help="repeat the configurations (default 1)")
        ap.add_argument("--window-ms", type=positive_int, default=10_000, help="Q8 window (default 10000)")
        ap.add_argument("--payload-bytes", type=positive_int, default=None,
                        help="Person and Auction payload bytes (default: the generator's, the paper's record sizes)")
        ap.add_argument("--parallelism", type=positive_int, default=3, help="Rhino instances (default 3)")
        spark_flags(ap, first_host=64, master=None)
        ap.add_argument("--timeout", type=positive_float, default=1800.0, help="per run, s (default 1800)")

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if CHANGELOG_CONF in args.spark_conf_dict:
            ap.error(f"--spark-conf {CHANGELOG_CONF}: each Spark configuration sets it (spark-rocksdb: false, "
                     "spark-rocksdb-changelog: true); choose them with --configs")
        if args.first_host + 2 > 254:
            ap.error("--first-host: the cluster's 3 hosts must fit 127.0.0.2..254")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {"configs": args.configs, "events_per_batch": args.events_per_batch, "batches": args.batches,
                "warmup": args.warmup, "rounds": args.rounds, "window_ms": args.window_ms,
                "source_options": _source(args), "parallelism": args.parallelism, "hosts": 3,
                "first_host": args.first_host}

    def run(self, br: BenchRun) -> None:
        from rhino_testing.harness.spark_cluster import LocalCluster

        args = br.args
        parts: dict[str, list[dict]] = {c: [] for c in args.configs}
        say(f"starting a 3-host cluster at 127.0.0.{args.first_host}")
        cl = br.stack.enter_context(LocalCluster.up(br.base / "cluster", hosts=3, first_host=args.first_host))
        spark = cl.spark_session("rhino-bench-throughput", **br.spark_conf)
        br.stack.callback(lambda: _quietly(spark.stop))
        for rnd in range(args.rounds):
            for config in args.configs:
                parts[config].append(_one(br, cl, spark, rnd, config))
        for config in args.configs:
            if parts[config]:
                br.emit(_summarize_config(config, parts[config]))


def _source(args: argparse.Namespace) -> dict:
    return {"payloadBytes": args.payload_bytes} if args.payload_bytes else {}


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:
        pass


def _one(br: BenchRun, cl: Any, spark: Any, rnd: int, config: str) -> dict:
    """One configuration's query, its batches measured."""
    from rhino_testing.nexmark.pipeline import run_pipeline

    args = br.args
    n = args.warmup + args.batches
    system, r = CONFIGS[config]
    say(f"round {rnd + 1}/{args.rounds}: {config}, {n} batches of {args.events_per_batch} events")
    ck = br.base / f"{config}-{rnd}"
    if config in SPARK_BASELINES:  # a session conf: each new query's state store reads it
        spark.conf.set(CHANGELOG_CONF, SPARK_BASELINES[config])
    run = run_pipeline(spark, system=system, query="q8", checkpoint_dir=ck, events_per_batch=args.events_per_batch,
                       max_events=n * args.events_per_batch, source_options=_source(args),
                       params={"window_ms": args.window_ms}, operator_id=f"q8-tp-{config}-{rnd}",
                       coordinator=cl.coordinator, secret_file=str(cl.secret_file), parallelism=args.parallelism,
                       replicas=r if r is not None else 2, timeout_s=args.timeout)
    m = _measure(run, config, args.warmup)
    if run.operator is not None:
        run.operator.close()
    say(f"  {config}: {m['events'] / m['seconds']:.0f} events/s over {m['batches']} batches"
        if m["seconds"] else f"  {config}: no steady batches")
    shutil.rmtree(ck, ignore_errors=True)
    return m


def _measure(run: Any, config: str, warmup: int) -> dict:
    batches = sorted(run.batches, key=lambda b: b["batch"])
    steady = [b for b in batches if b["batch"] >= warmup and (b.get("rows_in") or 0) > 0 and b.get("trigger_ms")]
    secs = [b["trigger_ms"] / 1000.0 for b in steady]
    events = sum(b["rows_in"] for b in steady)
    out: dict[str, Any] = {"batches": len(steady), "events": events, "seconds": sum(secs), "latencies_s": secs,
                           "output_rows": int(sum(len(f) for f in run.outputs.values()))}
    if run.operator is not None:
        ids = {b["batch"] for b in steady}
        reps = [r for r in run.operator.reports if r.batch in ids]
        tasks = [t for r in reps for t in r.tasks]
        out["locality"] = (sum(1 for t in tasks if t.get("host") == t.get("primary_host")) / len(tasks)
                           if tasks else None)
        out["tasks"] = len(tasks)
        out["attempts_max"] = max((r.attempts for r in reps), default=None)
        out["driver_breakdown_s"] = {f: sum(getattr(r, f) for r in reps) / len(reps) if reps else None
                                     for f in ("begin_s", "job_s", "commit_s")}
        out["task_breakdown_s"] = {f: (sum(float(t.get(f) or 0.0) for t in tasks) / len(tasks) if tasks else None)
                                   for f in _TASK_FIELDS}
        # the slowest task per batch: what the batch waits for
        slow = [max(r.tasks, key=lambda t: t["end"] - t["start"]) for r in reps if r.tasks]
        out["critical_task_breakdown_s"] = {f: (sum(float(t.get(f) or 0.0) for t in slow) / len(slow)
                                                if slow else None) for f in _TASK_FIELDS}
        out["checkpoint_bytes_last"] = sum(int(t.get("checkpoint_bytes") or 0) for t in reps[-1].tasks) \
            if reps else None
    else:
        ops = [((run.progress.get(b["batch"]) or {}).get("stateOperators") or [{}])[0] for b in steady]
        cm = [o.get("customMetrics") or {} for o in ops]
        if cm:
            out["rocksdb_commit_file_sync_ms_mean"] = sum(c.get("rocksdbCommitFileSyncLatencyMs") or 0
                                                          for c in cm) / len(cm)
            out["state_bytes_last"] = cm[-1].get("rocksdbSstFileSize")
    return out


def _summarize_config(config: str, parts: list[dict]) -> dict:
    secs = [x for p in parts for x in p["latencies_s"]]
    events = sum(p["events"] for p in parts)
    total = sum(p["seconds"] for p in parts)
    rec: dict[str, Any] = {
        "record": "throughput", "config": config, "system": CONFIGS[config][0] if CONFIGS[config][0] == "rhino"
        else "spark-rocksdb", "replicas": CONFIGS[config][1], "rounds": len(parts), "batches": len(secs),
        "changelog_checkpointing": SPARK_BASELINES[config] == "true" if config in SPARK_BASELINES else None,
        "events": events, "events_per_s": events / total if total else None,
        "latency_median_s": median(secs), "latency_p95_s": percentile(secs, 95),
        "events_per_s_by_round": [p["events"] / p["seconds"] if p["seconds"] else None for p in parts],
        "output_rows": parts[0].get("output_rows"),
    }
    if "locality" in parts[0]:
        locs = [p["locality"] for p in parts if p.get("locality") is not None]
        rec["locality"] = min(locs) if locs else None
        rec["attempts_max"] = max((p.get("attempts_max") or 1) for p in parts)
        for key in ("driver_breakdown_s", "task_breakdown_s", "critical_task_breakdown_s"):
            rec[key] = {f: _mean([p[key][f] for p in parts]) for f in parts[0][key]}
    else:
        rec["locality"] = None
        rec["rocksdb_commit_file_sync_ms_mean"] = _mean([p.get("rocksdb_commit_file_sync_ms_mean") for p in parts])
    return round_floats(rec)


def baseline(records: list[dict]) -> Optional[dict]:
    """The Spark baseline that is least favourable to Rhino: the fastest of those that ran."""
    sp = [r for r in records if r.get("record") == "throughput" and r["config"] in SPARK_BASELINES
          and r.get("events_per_s")]
    return max(sp, key=lambda r: r["events_per_s"]) if sp else None


def summarize(records: list[dict]) -> dict:
    by = {r["config"]: r for r in records if r.get("record") == "throughput"}
    out: dict[str, Any] = {"record": "summary"}
    r0, r2, sp = by.get("rhino-r0"), by.get("rhino-r2"), baseline(records)
    if r2 and sp and sp.get("events_per_s"):
        out["spark_baseline"] = sp["config"]
        out["r2_vs_spark"] = round(r2["events_per_s"] / sp["events_per_s"], 3)
        out["r2_vs_spark_latency_median"] = round(sp["latency_median_s"] / r2["latency_median_s"], 3)
        out["r2_vs_spark_target_met"] = out["r2_vs_spark"] >= R2_VS_SPARK_TARGET
        out["r2_vs_spark_by_baseline"] = {c: round(r2["events_per_s"] / by[c]["events_per_s"], 3)
                                          for c in SPARK_BASELINES if by.get(c) and by[c].get("events_per_s")}
    if r2 and r0 and r0.get("events_per_s"):
        out["r2_cost_vs_r0"] = round(1 - r2["events_per_s"] / r0["events_per_s"], 4)
        out["r2_cost_target_met"] = out["r2_cost_vs_r0"] <= R2_COST_TARGET
        tb0, tb2 = r0.get("critical_task_breakdown_s") or {}, r2.get("critical_task_breakdown_s") or {}
        out["r2_minus_r0_critical_task_s"] = {f: round((tb2.get(f) or 0) - (tb0.get(f) or 0), 4) for f in tb2}
    locs = [r["locality"] for r in (r0, r2) if r and r.get("locality") is not None]
    if locs:
        out["locality_min"] = min(locs)
        out["locality_target_met"] = min(locs) >= LOCALITY_TARGET
    return out


def plot(records: list[dict], path: str) -> None:
    plt = pyplot()

    rr = [r for r in records if r.get("record") == "throughput"]
    if not rr:
        return
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.8))
    names = [r["config"] for r in rr]
    colors = ["#e08080" if r["config"] == "rhino-r0" else "#d04040" if r["config"] == "rhino-r2" else "#404040"
              for r in rr]
    base = baseline(records)
    ax = axs[0]
    ax.bar(names, [r["events_per_s"] or 0 for r in rr], color=colors)
    for i, r in enumerate(rr):
        lab = f"{r['events_per_s']:.0f}"
        if base and base.get("events_per_s"):
            lab += f"\n{r['events_per_s'] / base['events_per_s']:.2f}x {base['config']}"
        ax.text(i, r["events_per_s"] or 0, lab, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("events/s (steady state)")
    ax.set_title("Q8 throughput")
    ax = axs[1]
    x = range(len(rr))
    ax.bar([i - 0.2 for i in x], [r["latency_median_s"] or 0 for r in rr], width=0.4, color=colors, label="median")
    ax.bar([i + 0.2 for i in x], [r["latency_p95_s"] or 0 for r in rr], width=0.4, color=colors, alpha=0.5,
           hatch="//", label="p95")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("seconds per micro-batch")
    ax.set_title("Per-batch latency (median, p95)")
    ax.legend(fontsize=8)
    ax = axs[2]
    rh = [r for r in rr if r.get("critical_task_breakdown_s")]
    fields = [f for f in ("read_s", "open_s", "group_s", "timers_s", "fetch_s", "process_s", "write_s", "commit_s")]
    cmap = plt.get_cmap("tab10")
    for j, r in enumerate(rh):
        bottom = 0.0
        for i, f in enumerate(fields):
            v = r["critical_task_breakdown_s"].get(f) or 0.0
            ax.bar(j, v, bottom=bottom, color=cmap(i), label=f if j == 0 else None)
            bottom += v
        rep = r["critical_task_breakdown_s"].get("replicate_s") or 0.0
        ax.text(j, bottom, f"replicate {rep:.3f}\n(inside commit)", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rh)), [r["config"] for r in rh])
    ax.set_ylabel("seconds (slowest task of a batch, mean)")
    ax.set_title("Rhino task breakdown")
    ax.legend(fontsize=7)
    save(fig, path)


def report(records: list[dict], path: str) -> None:
    rr = [r for r in records if r.get("record") == "throughput"]
    summ = summarize(records)
    L = run_header("Spark throughput: NEXMark Q8, Rhino r=0 / r=2 vs Spark's RocksDB state store", setup_of(records),
                   spark=" (besides the cluster's: one 1-core executor per host, "
                   "`spark.sql.shuffle.partitions=3`; RocksDB state store provider, `spark-rocksdb` with Spark's default "
                   f"`{CHANGELOG_CONF}=false` (a snapshot uploaded at every commit), `spark-rocksdb-changelog` with it "
                   "`true`, Spark's recommended production setting).")
    f, base = fmt, baseline(records)
    vs = lambda r: r["events_per_s"] / base["events_per_s"] if base and base.get("events_per_s") else None  # noqa: E731
    L += [f"\"vs Spark\" is against `{base['config'] if base else '-'}`, the faster Spark baseline of this run "
          "(the less favourable ratio for Rhino).", ""]
    L += md_table(["config", "events/s", "vs Spark", "batch latency median (s)", "p95 (s)", "batches", "locality",
                   "output rows"], [(r["config"], f(r["events_per_s"], 0), f(vs(r), 2), f(r["latency_median_s"]),
                                     f(r["latency_p95_s"]), r["batches"], f(r.get("locality")), r.get("output_rows"))
                                    for r in rr], "lrrrrrrr")
    rh = [r for r in rr if r.get("task_breakdown_s")]
    if rh:
        fields = list(rh[0]["critical_task_breakdown_s"])
        L += ["", "Rhino, the slowest task of each batch (mean seconds; `replicate_s` is inside `commit_s`) and the "
              "driver's per-batch parts:", ""]
        L += md_table(["config", *fields, "driver begin", "driver job", "driver commit"],
                      [[r["config"], *(f(r["critical_task_breakdown_s"][x]) for x in fields),
                        *(f(r["driver_breakdown_s"][k]) for k in ("begin_s", "job_s", "commit_s"))] for r in rh],
                      "l" + "r" * (len(fields) + 3))
    L += ["", "Targets (ratios against the same run):", ""]
    if "r2_vs_spark" in summ:
        L.append(f"- Rhino r=2 at least as fast as Spark's own operator: {summ['r2_vs_spark']}x events/s "
                 f"(median latency {summ['r2_vs_spark_latency_median']}x lower): "
                 f"**{'met' if summ['r2_vs_spark_target_met'] else 'not met'}**.")
    if "r2_cost_vs_r0" in summ:
        L.append(f"- r=2 costs at most {R2_COST_TARGET:.0%} against r=0: {summ['r2_cost_vs_r0']:.1%}: "
                 f"**{'met' if summ['r2_cost_target_met'] else 'not met'}**; the slowest task's parts, r=2 minus "
                 f"r=0 (s): " + ", ".join(f"{k} {v:+.3f}" for k, v in summ["r2_minus_r0_critical_task_s"].items()))
    if "locality_target_met" in summ:
        L.append(f"- Locality >= {LOCALITY_TARGET:.0%}: min {summ['locality_min']:.1%}: "
                 f"**{'met' if summ['locality_target_met'] else 'not met'}**.")
    write_lines(path, L)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(Throughput(summarize=summarize, report=report, plot=plot), argv)
