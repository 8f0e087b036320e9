"""``rhino-bench spark big-key``: one grouping key whose MapState holds ``--size`` (1 GiB)
of entries, written, read back through the processor and through the state reader, and
moved by a handover (issue 27: "a key with 1 GiB of MapState is written, read back
through the processor and through the state reader, and moved by a handover").

    rhino-bench spark big-key --json --out bench/results/big_key.jsonl \
        --report bench/results/big_key.md

How it runs and what each record holds: bench/README.md, "One key with 1 GiB of MapState".
"""

from __future__ import annotations

import argparse
import signal
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, spark_flags, spark_session, start_rhino
from ..procmem import MemorySampler
from ..report import size_arg
from .big_key_report import report, summarize
from .big_key_run import Run
from .common import non_negative_int, positive_float, positive_int, say
from .big_key_workload import (ENTRY_OVERHEAD_EST, Model, OUTPUT_SCHEMA, RecordStoreProcessor, SESSION_LIMIT, STEPS,
                               payload, plan_fill)


__all__ = ["main", "RecordStoreProcessor", "Model", "payload", "plan_fill", "BigKey", "STEPS"]

# ---- setup --------------------------------------------------------------------------------------


class BigKey(Scenario):
    name = "spark big-key"
    description = ("One key whose MapState holds --size of entries: written, read back through the processor "
                   "and through the rhino-state reader, and moved by a handover; each checked against a model "
                   "of what was written.")
    workdir_prefix = "rhino-big-key-"

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--size", type=size_arg, default=1 << 30, help="payload bytes in the big key's map (default 1G)")
        ap.add_argument("--value-bytes", type=size_arg, default=1024, help="payload bytes per map entry (default 1024)")
        ap.add_argument("--batch-bytes", type=size_arg, default=128 << 20,
                        help="payload bytes of the big key written per fill batch, at most (default 128M; a worker "
                             "session holds at most 1 GiB of uncommitted writes)")
        ap.add_argument("--small-keys", type=non_negative_int, default=4,
                        help="other keys, filled alongside (default 4)")
        ap.add_argument("--small-entries", type=non_negative_int, default=4,
                        help="records each small key gets per fill batch and in the handover's batch (default 4)")
        ap.add_argument("--post-handover-entries", type=non_negative_int, default=1024,
                        help="records added to the big key by the batch that runs the handover (default 1024)")
        ap.add_argument("--partitions", type=positive_int, default=3,
                        help="instances (one rhino worker each; default 3)")
        ap.add_argument("--replicas", type=non_negative_int, default=2, help="Rhino's r (default 2)")
        spark_flags(ap, first_host=76)
        ap.add_argument("--request-timeout", type=positive_float, default=120.0,
                        help="the operator's per-request timeout to the workers, s (transform_with_state's "
                             "request_timeout; default 120)")
        ap.add_argument("--timeout", type=positive_float, default=7200.0,
                        help="the whole run, s: then it stops where it is and says so (default 7200)")

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.value_bytes > args.batch_bytes:
            ap.error("--value-bytes must be at most --batch-bytes")
        if args.value_bytes > args.size:
            ap.error("--value-bytes must be at most --size")
        per = args.batch_bytes // args.value_bytes
        est = per * (args.value_bytes + ENTRY_OVERHEAD_EST) + args.small_keys * args.small_entries * (
            args.value_bytes + ENTRY_OVERHEAD_EST)
        if est > SESSION_LIMIT:
            ap.error(f"--batch-bytes {args.batch_bytes}: a fill batch would hold about {est} bytes of keys and "
                     f"values, more than a worker session's {SESSION_LIMIT} bytes of uncommitted writes")
        if args.partitions < 2:
            ap.error("--partitions must be at least 2 (the handover moves the key to another instance)")
        if args.first_host + args.partitions - 1 > 254:
            ap.error("--first-host: the workers must fit 127.0.0.2..254")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        plan = plan_fill(args.size, args.value_bytes, args.batch_bytes)
        return {"size": args.size, "value_bytes": args.value_bytes, "batch_bytes": args.batch_bytes,
                "records": sum(n for _, n in plan), "fill_batches": len(plan), "small_keys": args.small_keys,
                "small_entries": args.small_entries, "post_handover_entries": args.post_handover_entries,
                "partitions": args.partitions, "replicas": args.replicas, "master": args.master,
                "request_timeout": args.request_timeout, "operator_id": f"big-key-{run_id}", "run_id": run_id}

    def run(self, br: BenchRun) -> None:
        args, stack = br.args, br.stack
        self.run_state: Optional[Run] = None

        def _alarm(_signum: int, _frame: Any) -> None:
            raise _RunTimeout(f"the run took longer than --timeout {args.timeout:g} s")

        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(int(args.timeout))
        stack.callback(signal.alarm, 0)
        say(f"starting a coordinator, {args.partitions} Rhino workers at 127.0.0.{args.first_host}.. and Spark "
            f"({args.master}) in {br.base}")
        cluster = start_rhino(br.base / "rhino", stack, workers=args.partitions, first_host=args.first_host)
        spark = spark_session(stack, br.base, app="rhino-bench-big-key", master=args.master,
                              partitions=args.partitions, conf=br.spark_conf)
        sampler = MemorySampler({w.id: w.pid for w in cluster.workers}).start()
        stack.callback(sampler.stop)
        run = self.run_state = Run(args=args, spark=spark, cluster=cluster, em=br.em, command=br.command,
                                   parameters=br.parameters, sampler=sampler, model=Model(args.value_bytes))
        from rhino.spark import transform_with_state

        run.op = transform_with_state(RecordStoreProcessor(args.value_bytes), key="k", output_schema=OUTPUT_SCHEMA,
                                      operator_id=br.parameters["operator_id"], coordinator=cluster.coordinator,
                                      secret_file=str(cluster.secret_file), parallelism=args.partitions,
                                      replicas=args.replicas, locality=False, request_timeout=args.request_timeout)
        stack.callback(run.op.close)
        sampler.take()  # the start-up's peaks are not a step's
        try:
            _steps(run)
        except _RunTimeout as e:
            say(f"TIMEOUT: {e}")
            run.failed = run.failed or "timeout"
            run.checks["finished within --timeout"] = False

    def summary(self, br: BenchRun, failed: bool) -> dict:
        run = getattr(self, "run_state", None)
        checks = run.checks if run is not None else {}
        stopped = run.failed if run is not None else "setup"
        summ = summarize(br.records, br.elapsed(), checks, stopped)
        say(f"done in {br.elapsed() / 60:.1f} min: "
            f"{'all checks passed' if summ['all_passed'] else 'NOT all checks passed'}"
            + (f" (stopped at {stopped})" if stopped else ""))
        return summ

    def exit_code(self, br: BenchRun, summary: Optional[dict], rc: Optional[int]) -> int:
        return 0 if summary and summary["all_passed"] else 1


def _steps(run: "Run") -> None:
    """The steps in order; a failed step ends the run (later steps need it)."""
    run.fill()
    if run.failed is None:
        origin = run.placement_instance()
        run.read_processor("read_processor", origin)
    if run.failed is None:
        run.read_state_reader("read_state_reader", origin)
    if run.failed is None:
        _h, target = run.handover()
        if run.failed is None and target is not None:
            run.read_processor("read_processor_after_handover", target)
            if run.failed is None:
                run.read_state_reader("read_state_reader_after_handover", target)


# ---- the command ---------------------------------------------------------------------------------


class _RunTimeout(Exception):
    pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(BigKey(report=report), argv)
