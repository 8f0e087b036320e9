"""The frame a benchmark driver runs in: what every ``rhino-bench`` driver used to write out
for itself, written once.

A driver declares a :class:`Scenario` (its own flags, its parameters, its measurement, its
summary, its report and plot) and :func:`bench_main` does the rest, the same way for all:

- the common flags: ``--json`` (the JSON lines on stdout too), ``--out FILE`` (appended to
  FILE), ``--report FILE`` (Markdown), ``--plot FILE`` (PNG, if the scenario draws one),
  ``--from JSONL`` (run nothing: the report, the plot and the summary of the last run recorded
  in JSONL) and ``--dir DIR`` (the work directory; by default a new one under /tmp, removed at
  the end); :func:`spark_flags` adds ``--master``, ``--first-host`` and ``--spark-conf``;
- the setup record, the first JSON line of a run: ``command``, ``started``, ``machine``,
  ``spark_conf``, ``parameters`` and ``source`` (the code the run imports: :func:`source_state`);
- SIGTERM and SIGHUP unwinding through the clean-up, like Ctrl-C;
- the summary record, the last JSON line: the scenario's figures and checks, with
  ``elapsed_s``, ``source_changed_during_run`` (:func:`changed_since`) and ``loadavg_1_5_15``;
- the report and the plot, written from the run's records whether it finished or not, and
  written again from a JSONL file alone by ``--from``.

And what the Spark drivers start: :func:`start_rhino` (a coordinator and workers, registered)
and :func:`spark_session` (a local SparkSession whose stop is on the run's exit stack).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .spark.common import (Emitter, host_number, install_signal_handlers, loadavg, parse_conf, say,
                           stdout_for_json_only)

__all__ = ["Scenario", "BenchRun", "bench_main", "parser", "spark_flags", "RhinoCluster", "start_rhino", "spark_session",
           "source_state", "changed_since", "source_line", "last_run"]


class Scenario:
    """One benchmark, as :func:`bench_main` runs it. Subclasses set the class attributes and
    override :meth:`run` and, as they need, the other hooks; the functions that read a run's
    records (its summary, report and plot) are given to the constructor."""

    name = ""  # the subcommand after "rhino-bench", e.g. "spark big-key"
    description = ""
    workdir_prefix = "rhino-bench-"
    spark = True  # Spark's JVM writes to fd 1: keep stdout for the JSON lines (stdout_for_json_only)
    summary_on_failure = True  # the summary line also when the run raised
    summary_extras = True  # elapsed_s, source_changed_during_run and loadavg_1_5_15 in the summary line
    setup_late = False  # the run emits the setup record itself (``run.emit(run.setup)``), once it knows more

    def __init__(self, *, summarize: Optional[Callable[[list[dict]], Any]] = None,
                 report: Optional[Callable[[list[dict], str], None]] = None,
                 plot: Optional[Callable[[list[dict], str], None]] = None) -> None:
        """``summarize(records)``: the summary record(s) of a run's records (else the scenario's
        :meth:`summary`, and ``--from`` prints the recorded one); ``report(records, path)``: the
        Markdown report; ``plot(records, path)``: the PNG (and with it a ``--plot`` flag)."""
        self._summarize, self._report, self._plot = summarize, report, plot

    @property
    def has_plot(self) -> bool:
        return self._plot is not None

    def flags(self, ap: argparse.ArgumentParser) -> None:
        """The scenario's own flags."""

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        """Refuses bad combinations of flags with ``ap.error`` (exit 2), before a run starts."""

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        """The setup record's ``parameters``."""
        return {"run_id": run_id}

    def setup_extra(self, args: argparse.Namespace) -> dict:
        """More fields of the setup record."""
        return {}

    def run(self, run: "BenchRun") -> Optional[int]:
        """The measurement: emits its records through ``run.emit``; may return an exit code."""
        raise NotImplementedError

    def summary(self, run: "BenchRun", failed: bool) -> Optional[dict] | list[dict]:
        """The summary record (``record: summary``; or several) of a run that ended (``failed``: it raised)."""
        return self._summarize(run.records) if self._summarize is not None else None

    def exit_code(self, run: "BenchRun", summary: Optional[dict] | list[dict], rc: Optional[int]) -> int:
        return rc or 0

    def replay_records(self, records: list[dict], args: argparse.Namespace) -> list[dict]:
        """The records ``--from`` reports on, from all of a JSONL file's: by default its last run."""
        return last_run(records)

    def replay_summary(self, records: list[dict]) -> dict | list[dict]:
        """What ``--from`` prints (a JSON line each): the summary of the records, else the recorded one."""
        if self._summarize is not None:
            return self._summarize(records)
        return next((r for r in records[::-1] if r.get("record") == "summary"), {"record": "summary",
                                                                                   "missing": True})

    def report(self, records: list[dict], path: str) -> None:
        """Writes the Markdown report of one run's records (its setup record first)."""
        if self._report is not None:
            self._report(records, path)

    def plot(self, records: list[dict], path: str) -> None:
        """Draws the PNG of one run's records."""
        if self._plot is not None:
            self._plot(records, path)


@dataclass
class BenchRun:
    """One run of a scenario: its flags, work directory, JSON lines and exit stack (what the run
    started stops there, in reverse order, before the summary)."""

    args: argparse.Namespace
    argv: list[str]
    base: Path
    em: Emitter
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the run's, while it runs
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S"))
    setup: dict = field(default_factory=dict)
    t_start: float = field(default_factory=time.monotonic)
    t_wall: float = field(default_factory=time.time)
    spark_conf: dict = field(default_factory=dict)

    @property
    def records(self) -> list[dict]:
        return self.em.records

    @property
    def command(self) -> str:
        return self.setup.get("command", "")

    @property
    def parameters(self) -> dict:
        return self.setup.get("parameters", {})

    def emit(self, rec: dict) -> dict:
        self.em.emit(rec)
        return rec

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start


def spark_flags(ap: argparse.ArgumentParser, *, first_host: int, master: Optional[str] = "local[2]",
                conf_help: str = "extra Spark conf (repeatable); default: Spark's defaults") -> None:
    """``--master`` (unless ``master`` is None), ``--first-host`` and ``--spark-conf``."""
    if master is not None:
        ap.add_argument("--master", default=master, help=f"Spark master (default {master})")
    ap.add_argument("--first-host", type=host_number, default=first_host,
                    help=f"Rhino workers (hosts) on 127.0.0.N.. (default {first_host})")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help=conf_help)


def parser(sc: Scenario) -> argparse.ArgumentParser:
    """The scenario's flags: the common ones, then its own."""
    ap = argparse.ArgumentParser(prog=f"rhino-bench {sc.name}", description=sc.description)
    ap.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    ap.add_argument("--out", help="append the JSON lines to this file")
    ap.add_argument("--report", help="write a Markdown report here")
    if sc.has_plot:
        ap.add_argument("--plot", help="write a PNG here")
    ap.add_argument("--from", dest="from_file", metavar="JSONL",
                    help="run nothing: write --report" + ("/--plot" if sc.has_plot else "")
                         + " (and print the summary) from the last run recorded in this file")
    ap.add_argument("--dir", default=None, help="work directory (default: a new one under /tmp, removed at the end)")
    sc.flags(ap)
    return ap


def last_run(records: list[dict]) -> list[dict]:
    """The records of the last run in a JSONL file's records: from its last setup record on."""
    starts = [i for i, r in enumerate(records) if r.get("record") == "setup"]
    return records[starts[-1]:] if starts else []


def _replay(sc: Scenario, args: argparse.Namespace) -> int:
    try:
        recs = [json.loads(x) for x in Path(args.from_file).read_text().splitlines() if x.strip()]
    except (OSError, ValueError) as e:
        print(f"rhino-bench {sc.name}: --from {args.from_file}: {e}", file=sys.stderr)
        return 2
    run = sc.replay_records(recs, args)
    if not any(r.get("record") == "setup" for r in run):
        which = f" of run {args.run_id}" if getattr(args, "run_id", None) else ""
        print(f"rhino-bench {sc.name}: --from {args.from_file}: no setup record{which}", file=sys.stderr)
        return 2
    if getattr(args, "plot", None):
        sc.plot(run, args.plot)
    if args.report:
        sc.report(run, args.report)
    summ = sc.replay_summary(run)
    for s in summ if isinstance(summ, list) else [summ]:
        print(json.dumps(s))
    return 0


def _guarded(what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the JSON lines are out already
        say(f"{what} failed: {e}")


def bench_main(sc: Scenario, argv: Optional[Sequence[str]] = None) -> int:
    """Parses the flags, then either replays ``--from`` or runs the scenario in the frame."""
    ap = parser(sc)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    spark_conf: dict = {}
    if hasattr(args, "spark_conf"):
        try:
            spark_conf = parse_conf(args.spark_conf)
        except argparse.ArgumentTypeError as e:
            ap.error(str(e))
    args.spark_conf_dict = spark_conf
    if args.from_file:  # runs nothing: the flags of a run are not checked
        return _replay(sc, args)
    sc.check(ap, args)
    install_signal_handlers()
    from rhino._machine import describe_machine

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix=sc.workdir_prefix))
    base.mkdir(parents=True, exist_ok=True)
    run = BenchRun(args=args, argv=argv, base=base, em=Emitter(args.json, args.out), spark_conf=spark_conf)
    run.setup = {"record": "setup", "command": f"rhino-bench {sc.name} " + " ".join(argv),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "machine": describe_machine(str(base)), "spark_conf": spark_conf,
                 "parameters": sc.parameters(args, run.run_id), "source": source_state(), **sc.setup_extra(args)}
    if not sc.setup_late:
        run.emit(run.setup)
    return _run_in_frame(sc, run)


def _run_in_frame(sc: Scenario, run: BenchRun) -> int:
    rc: Optional[int] = None
    failed = True
    summ: Optional[dict] | list[dict] = None
    try:
        with contextlib.ExitStack() as inner:
            run.stack = inner
            if sc.spark:
                inner.enter_context(stdout_for_json_only())
            rc = sc.run(run)
        failed = False
    finally:
        if not failed or sc.summary_on_failure:
            summ = sc.summary(run, failed)
            for s in summ if isinstance(summ, list) else [summ] if summ is not None else []:
                if sc.summary_extras:
                    s.setdefault("elapsed_s", round(run.elapsed(), 1))
                    s["source_changed_during_run"] = changed_since(run.setup["source"]["repo"], run.t_wall)
                    s["loadavg_1_5_15"] = loadavg()
                run.emit(s)
        if getattr(run.args, "plot", None):
            _guarded("plot", lambda: sc.plot(run.records, run.args.plot))
        if run.args.report:
            _guarded("report", lambda: sc.report(run.records, run.args.report))
        if not run.args.dir and not getattr(run.args, "keep", False):
            shutil.rmtree(run.base, ignore_errors=True)
    return sc.exit_code(run, summ, rc)


# ---- what the Spark drivers start -------------------------------------------------------------


@dataclass
class RhinoCluster:
    """A coordinator and its registered workers (processes of :mod:`rhino_testing.harness.workers`)."""

    root: Path
    coordinator: str  # its address
    secret_file: Path
    workers: list
    coordinator_process: Any


def start_rhino(root: Path, stack: contextlib.ExitStack, *, workers: int, first_host: int,
                heartbeat_timeout: float = 5.0, metrics: bool = True, register_timeout: float = 30.0) -> RhinoCluster:
    """Starts a ``rhino coordinator`` and ``workers`` ``rhino worker`` processes on
    127.0.0.``first_host``.., waits until all have registered, and puts their stops on ``stack``."""
    from rhino.coordinator.client import connect_coordinator

    from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret

    root.mkdir(parents=True, exist_ok=True)
    sf = write_secret(root)
    coord = CoordinatorProcess(root, secret_file=sf, heartbeat_timeout=heartbeat_timeout)
    coord.start()
    stack.callback(coord.stop)
    procs = []
    for i in range(workers):
        w = WorkerProcess(root, f"w{i}", f"127.0.0.{first_host + i}", secret_file=sf, metrics=metrics,
                          extra_args=["--coordinator", coord.address])
        w.start()
        stack.callback(w.stop)
        procs.append(w)
    deadline = time.monotonic() + register_timeout
    with connect_coordinator(coord.address, secret=sf.read_bytes().strip()) as cc:
        while len([w for w in cc.status()["workers"] if w.get("alive", True)]) < len(procs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Rhino workers did not register with the coordinator in "
                                   f"{register_timeout:g} s")
            time.sleep(0.2)
    return RhinoCluster(root=root, coordinator=coord.address, secret_file=sf, workers=procs,
                        coordinator_process=coord)


def spark_session(stack: contextlib.ExitStack, base: Path, *, app: str, master: str, partitions: int,
                  conf: Optional[dict] = None) -> Any:
    """A local SparkSession (no UI, UTC, shuffle partitions = ``partitions``, its local dir under
    ``base``; ``conf`` on top), logging errors only; its stop goes on ``stack``."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    local_dir = base / "spark-local"
    local_dir.mkdir(parents=True, exist_ok=True)
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", str(partitions))
         .config("spark.sql.session.timeZone", "UTC").config("spark.local.dir", str(local_dir)))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    stack.callback(spark.stop)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---- the code a run imports -------------------------------------------------------------------


def source_state() -> dict:
    """The code this run imports: the repository of the ``rhino`` package, its commit, and the
    files that differ from it (an editable install runs the working tree as it is)."""
    import rhino

    repo = Path(rhino.__file__).resolve().parents[1]
    out: dict[str, Any] = {"repo": str(repo)}
    try:
        git = ["git", "-C", str(repo)]
        out["commit"] = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                                       check=True).stdout.strip()
        st = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                            text=True, check=True).stdout
        out["modified"] = sorted(line[3:] for line in st.splitlines() if line.strip())
        diff = subprocess.run(git + ["diff", "HEAD"], capture_output=True, check=True).stdout
        out["diff_sha256"] = hashlib.sha256(diff).hexdigest()[:16] if diff else None
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def changed_since(repo: str, t0: float) -> list[str]:
    """Python files of the library (rhino/, spark_integration/) modified after ``t0``: code that
    changed under a running benchmark (its Spark workers may have imported either version)."""
    from rhino import _core

    out = []
    files = [p for sub in ("rhino", "spark_integration") for p in Path(repo, sub).rglob("*.py")]
    for p in files + [Path(_core.__file__)]:  # and the extension (a rebuild replaces it)
        try:
            if p.stat().st_mtime > t0:
                out.append(str(p.relative_to(repo)) if p.is_relative_to(repo) else str(p))
        except OSError:
            continue
    return sorted(out)


def source_line(src: dict, summ: Optional[dict]) -> str:
    """The report's line on the code that ran (a setup record's ``source``, the summary's
    ``source_changed_during_run``)."""
    line = f"Code: commit {str(src.get('commit', '?'))[:12]} of {src.get('repo', '?')}"
    mod = [m for m in src.get("modified", []) if m.startswith(("rhino/", "spark_integration/", "src/"))]
    line += (f", with uncommitted changes to {', '.join(mod)} (diff sha256 {src.get('diff_sha256')})" if mod
             else " (no uncommitted change to the library)")
    changed = (summ or {}).get("source_changed_during_run")
    if changed:
        line += f". Changed while the run ran: {', '.join(changed)}"
    elif summ is not None and "source_changed_during_run" in summ:
        line += "; nothing of the library changed while the run ran"
    return line + "."
