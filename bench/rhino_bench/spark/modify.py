"""``rhino-bench spark modify``: changing a running query's code at a state size (issue 47;
Bartnik et al. §6: a UDF replaced on the fly against a savepoint restart).

    rhino-bench spark modify --size 1G --json --out bench/results/spark_modify.jsonl \
        --plot bench/results/spark_modify.png --report bench/results/spark_modify.md

How it runs and what each record holds: bench/README.md, "Changing a running query's code".
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from rhino_testing.nexmark.queries import Q8NewUsers

from ..frame import BenchRun, Scenario, bench_main, spark_flags
from ..report import choices
from .common import fraction, median, positive_float, positive_int, say
from .modify_report import plot, report, summarize
from .recovery import HUGE_WINDOW_MS, _rhino_size, _sizes, _spark_size
from .recovery_report import CHANGELOG_CONF

__all__ = ["main", "Q8V2", "ROUTES"]

ROUTES = {"swap": ("rhino", None), "insert": ("rhino", None), "spark-restart-changelog": ("spark", "true"),
          "spark-restart": ("spark", "false")}
COUNT_OUTPUT = "person_id long, pairs long"


class Q8V2(Q8NewUsers):
    """The new version of Q8's processor every route deploys: the same state variables and
    output (a deploy that fixes nothing visible), so that each route's figures are its
    mechanism's alone."""

    VERSION = 2


class PairCount(StatefulProcessor):
    """The operator the ``insert`` route adds after Q8: per person, the (person, auction)
    pairs Q8 has emitted so far."""

    def init(self, handle: Any) -> None:
        self.n = handle.getValueState("pairs", "pairs long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        import pandas as pd

        n = (self.n.get() or (0,))[0] + sum(len(p) for p in rows)
        self.n.update((n,))
        yield pd.DataFrame({"person_id": [key[0]], "pairs": [n]})

    def close(self) -> None:
        pass


class Modify(Scenario):
    name = "spark modify"
    description = ("Changing a running NEXMark Q8's code at a state size: Rhino's live processor swap vs "
                   "Spark's stop and restart from the checkpoint with the new code.")
    workdir_prefix = "rhino-spark-modify-"
    spark = False  # each route's cluster has a session of its own
    summary_extras = False

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--size", type=lambda t: _sizes(t)[0], default=1 << 30,
                        help="the state size at which the code changes (default 1G)")
        ap.add_argument("--routes", type=choices(ROUTES, "route"), default=list(ROUTES),
                        help=f"comma-separated, from {', '.join(ROUTES)} (default all)")
        ap.add_argument("--events-per-batch", type=positive_int, default=100_000)
        ap.add_argument("--payload-bytes", type=positive_int, default=8192)
        ap.add_argument("--parallelism", type=positive_int, default=3)
        ap.add_argument("--replicas", type=positive_int, default=2)
        ap.add_argument("--request-at", type=fraction, default=0.5,
                        help="the request comes this share of a steady batch after a batch's end (default 0.5)")
        ap.add_argument("--after-batches", type=positive_int, default=3,
                        help="batches to complete with the new code before stopping (default 3)")
        ap.add_argument("--keep", action="store_true", help="keep each route's directory")
        ap.add_argument("--shared-cluster", action="store_true", dest="shared_cluster",
                        help="one cluster and Spark session for every route, each with its own operator and "
                             "checkpoint (a smoke run's saving; by default each route has a fresh cluster)")
        ap.add_argument("--timeout", type=positive_float, default=3600.0, help="per route, s (default 3600)")
        spark_flags(ap, first_host=76, master=None,
                    conf_help="extra Spark conf for every route's session (repeatable)")

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if CHANGELOG_CONF in args.spark_conf_dict:
            ap.error(f"--spark-conf {CHANGELOG_CONF}: each Spark route sets it; choose them with --routes")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {"size_bytes": args.size, "routes": args.routes, "events_per_batch": args.events_per_batch,
                "payload_bytes": args.payload_bytes, "window_ms": HUGE_WINDOW_MS, "parallelism": args.parallelism,
                "replicas": args.replicas, "request_at": args.request_at, "after_batches": args.after_batches,
                "hosts": 3, "first_host": args.first_host}

    def run(self, br: BenchRun) -> int:
        if not br.args.shared_cluster:
            return self._routes(br, None)
        from rhino_testing.harness.spark_cluster import LocalCluster

        with LocalCluster.up(br.base / "cluster", hosts=3, first_host=br.args.first_host,
                             heartbeat_timeout=2.0) as cl:
            spark = cl.spark_session("rhino-bench-modify", **br.spark_conf)
            try:
                return self._routes(br, (cl, spark))
            finally:
                spark.stop()

    def _routes(self, br: BenchRun, shared: Optional[tuple]) -> int:
        failed = 0
        for route in br.args.routes:
            d = br.base / route
            t0 = time.time()
            try:
                rec = run_route(route, d, br.args, br.spark_conf, shared)
                rec["wall_s"] = round(time.time() - t0, 1)
                br.emit(rec)
                say(f"{route}: request to effect {rec['request_to_effect_s']:.2f} s, spike x{rec['spike_x']:.2f}, "
                    f"{rec['batches_delayed']} batches delayed, {rec['failed_batches']} failed")
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as e:
                failed += 1
                say(f"{route} failed: {type(e).__name__}: {e}")
                br.emit({"record": "error", "route": route, "error": f"{type(e).__name__}: {e}"[:2000]})
            finally:
                if not br.args.keep:
                    shutil.rmtree(d, ignore_errors=True)
        return 1 if failed else 0


def _steady(batches: list[dict], before: float) -> float:
    """The median batch duration before ``before``, the first two (warm-up) left out."""
    ds = [b["sink_end"] - b["sink_start"] for b in batches[2:] if b["sink_end"] <= before]
    return median(ds) if ds else 1.0


def _record(route: str, size: int, t_req: float, batches: list[dict], effect_batch: int, state_bytes: int,
            steady: float, failed: int) -> dict:
    after = [b for b in batches if b["sink_end"] > t_req]
    began_after = [b["batch"] for b in batches if b["sink_start"] >= t_req]
    effect_end = next(b["sink_end"] for b in batches if b["batch"] == effect_batch and b["sink_end"] > t_req)
    return {"record": "modify", "route": route, "size_bytes": size, "state_bytes": state_bytes,
            "effect_batch": effect_batch, "request_to_effect_s": round(effect_end - t_req, 3),
            "batches_delayed": sum(1 for b in began_after if b < effect_batch),
            "spike_x": round(max(b["sink_end"] - max(b["sink_start"], t_req) for b in after) / steady, 3),
            "failed_batches": failed, "steady_batch_s": round(steady, 3),
            "batches": [[b["batch"], round(b["sink_start"] - t_req, 3), round(b["sink_end"] - t_req, 3)]
                        for b in batches]}


def run_route(route: str, workdir: Path, args: argparse.Namespace, spark_conf: dict,
              shared: Optional[tuple] = None) -> dict:
    """One route on a fresh cluster (or ``shared``'s (cluster, session)): grow the state,
    change the code, measure."""
    from rhino_testing.harness.spark_cluster import LocalCluster

    system, changelog = ROUTES[route]
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"{route}: Q8 grown to {args.size / 2**30:g} GiB of state, on hosts 127.0.0.{args.first_host}..")
    conf = {CHANGELOG_CONF: changelog} if changelog else {}
    if shared is not None:
        return _route(route, system, shared[0], shared[1], workdir, args, conf)
    with LocalCluster.up(workdir / "cluster", hosts=3, first_host=args.first_host, heartbeat_timeout=2.0) as cl:
        spark = cl.spark_session(f"rhino-bench-modify-{route}", **dict(spark_conf, **conf))
        try:
            return _route(route, system, cl, spark, workdir, args, conf)
        finally:
            try:
                spark.stop()
            except Exception:
                pass


def _route(route: str, system: str, cl: Any, spark: Any, workdir: Path, args: argparse.Namespace,
           conf: dict) -> dict:
    bytes_per_event = 0.08 * (args.payload_bytes + 250)
    max_events = int(args.size / bytes_per_event * 2.5) + (args.after_batches + 12) * args.events_per_batch
    common = dict(query="q8", checkpoint_dir=workdir / "ck", events_per_batch=args.events_per_batch,
                  max_events=max_events, source_options={"payloadBytes": args.payload_bytes},
                  params={"window_ms": HUGE_WINDOW_MS}, operator_id=f"q8-{route}", coordinator=cl.coordinator,
                  secret_file=str(cl.secret_file), parallelism=args.parallelism, replicas=args.replicas,
                  timeout_s=args.timeout, spark_conf=conf or None)
    if route == "insert":
        return _insert(spark, args, common, cl)
    if system == "rhino":
        return _swap(spark, args, common)
    return _spark_restart(route, spark, args, common)


def _grown(run: Any, size_of: Any, size: int) -> bool:
    return len(run.batches) >= 4 and size_of(run) >= size


def _swap(spark: Any, args: argparse.Namespace, common: dict) -> dict:
    from rhino_testing.nexmark.pipeline import run_pipeline

    st: dict[str, Any] = {}

    def on_batch(b: int, run: Any) -> None:
        if "thread" in st or not _grown(run, _rhino_size, args.size):
            return
        st["state_bytes"] = _rhino_size(run)
        steady = _steady(run.batches, time.time())

        def ask() -> None:  # mid-batch, from another thread, as an operator's tooling would
            time.sleep(args.request_at * steady)
            st["t_req"] = time.time()
            st["swap"] = run.operator.swap(Q8V2(window_ms=HUGE_WINDOW_MS))
            say(f"  swap asked for at state {st['state_bytes'] / 2**20:.0f} MiB")

        st["thread"] = threading.Thread(target=ask, daemon=True)
        st["thread"].start()

    def stop_when(run: Any) -> bool:
        s = st.get("swap")
        return (s is not None and s.done and s.batch is not None
                and sum(1 for b in run.batches if b["batch"] >= s.batch) >= args.after_batches)

    run = run_pipeline(spark, system="rhino", on_batch=on_batch, stop_when=stop_when, **common)
    if "swap" not in st:
        raise RuntimeError(f"the state never reached {args.size} bytes (last {_rhino_size(run)})")
    swap = st["swap"]
    effect = swap.wait(0)
    failed = [r for r in run.operator.reports if r.attempts > 1 or r.errors]
    rec = _record("swap", args.size, st["t_req"], run.batches, effect, st["state_bytes"],
                  _steady(run.batches, st["t_req"]), len(failed))
    rec["failed_attempts"] = [{"batch": r.batch, "errors": r.errors[:3]} for r in failed]
    rec["versions"] = [swap.previous_version, swap.code_version]
    run.operator.close()
    return rec


def _insert(spark: Any, args: argparse.Namespace, common: dict, cl: Any) -> dict:
    """Q8 runs in a one-stage ``rhino.spark.Pipeline``; the request inserts :class:`PairCount`
    after it (a new operator, created at the coordinator in its first batch)."""
    from rhino.spark import Pipeline, transform_with_state
    from rhino_testing.nexmark.pipeline import run_pipeline

    st: dict[str, Any] = {}

    def on_batch(b: int, run: Any) -> None:
        if "thread" in st or not _grown(run, _rhino_size, args.size):
            return
        st["state_bytes"] = _rhino_size(run)
        steady = _steady(run.batches, time.time())

        def ask() -> None:
            time.sleep(args.request_at * steady)
            op = transform_with_state(PairCount(), key="person_id", output_schema=COUNT_OUTPUT,
                                      operator_id="q8-insert-pairs", coordinator=cl.coordinator,
                                      secret_file=str(cl.secret_file), parallelism=args.parallelism,
                                      replicas=args.replicas)
            st["t_req"] = time.time()
            st["mod"] = run.chain.insert(op, after=run.operator.config.name)
            st["op"] = op
            say(f"  insertion asked for at state {st['state_bytes'] / 2**20:.0f} MiB")

        st["thread"] = threading.Thread(target=ask, daemon=True)
        st["thread"].start()

    def stop_when(run: Any) -> bool:
        m = st.get("mod")
        return (m is not None and m.done() and m.batch is not None
                and sum(1 for b in run.batches if b["batch"] >= m.batch) >= args.after_batches)

    run = run_pipeline(spark, system="rhino", on_batch=on_batch, stop_when=stop_when,
                       chain=lambda op: Pipeline([op]), **common)
    if "mod" not in st:
        raise RuntimeError(f"the state never reached {args.size} bytes (last {_rhino_size(run)})")
    effect = st["mod"].wait(0)
    failed = [r for op in (run.operator, st["op"]) for r in op.reports if r.attempts > 1 or r.errors]
    rec = _record("insert", args.size, st["t_req"], run.batches, effect, st["state_bytes"],
                  _steady(run.batches, st["t_req"]), len(failed))
    rec["failed_attempts"] = [{"batch": r.batch, "errors": r.errors[:3]} for r in failed]
    rec["inserted_batches"] = [r.batch for r in st["op"].reports]
    for op in (run.operator, st["op"]):
        op.close()
    return rec


def _spark_restart(route: str, spark: Any, args: argparse.Namespace, common: dict) -> dict:
    from rhino_testing.nexmark.pipeline import run_pipeline

    st: dict[str, Any] = {}

    def stop_when(run: Any) -> bool:
        if "t_req" in st:
            return True
        if _grown(run, _spark_size, args.size):
            st["state_bytes"] = _spark_size(run)
            steady = _steady(run.batches, time.time())
            time.sleep(args.request_at * steady)  # mid-batch, as the swap's request
            st["t_req"] = time.time()
            return True
        return False

    first = run_pipeline(spark, system="spark", stop_when=stop_when, **common)
    if "t_req" not in st:
        raise RuntimeError(f"the state never reached {args.size} bytes (last {_spark_size(first)})")
    say(f"  stopped at state {st['state_bytes'] / 2**20:.0f} MiB; restarting with the new code")
    second = run_pipeline(spark, system="spark", processor=Q8V2(window_ms=HUGE_WINDOW_MS),
                          stop_when=lambda run: len(run.batches) >= args.after_batches, **common)
    effect = min(b["batch"] for b in second.batches)
    # a batch the stop cut is replayed by the restart, with the new code: its first run's
    # sink call (if it got that far) does not count
    batches = [b for b in first.batches if b["batch"] < effect] + second.batches
    rec = _record(route, args.size, st["t_req"], batches, effect, st["state_bytes"],
                  _steady(first.batches, st["t_req"]), 0)  # a failed Spark batch fails its query: none did
    rec["failed_attempts"] = []
    return rec


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(Modify(summarize=summarize, report=report, plot=plot), argv)
