"""``rhino-bench spark glue``: the per-key cost of rhino.spark's task around the processor,
at up to a million keys per batch (issue 45, "Glue").

    rhino-bench spark glue --keys 1000000 --batches 3 --mode both --json \
        --out bench/results/spark_glue_1m.jsonl --report bench/results/spark_glue_1m.md

How it runs and what each record holds: bench/README.md, "The task's per-key cost".
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import socket
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, start_rhino
from ..report import md_table, write_lines
from .common import host_number, loadavg, median, positive_int, round_floats, say

__all__ = ["main", "CountPerKey", "floor_per_key"]

INPUT_COLUMNS = ("k", "v")  # both long
OUTPUT_COLUMNS = ("k", "n")  # both long


def _schema(names: Sequence[str]) -> Any:
    """A StructType of long columns (fromDDL would need a SparkContext; none runs here)."""
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField(n, LongType()) for n in names])
TARGET_US_PER_KEY = 2.0  # the bound on the framework's time per key
# the processor alone is timed on at most this many keys, and scaled (its cost per key does not
# grow with the batch: each key's rows and output are its own)
PROCESSOR_SAMPLE_KEYS = 100_000

try:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - the CLI checks for PySpark before importing this module
    _Base = object  # type: ignore[assignment,misc]


class CountPerKey(_Base):  # type: ignore[misc,valid-type]
    """Per key, its rows counted in a ValueState (``"n long"``); one output row ``(k, n)``: a
    DataFrame in pandas mode, a ``Row`` in row mode."""

    def __init__(self, mode: str = "pandas") -> None:
        self.mode = mode
        self.count: Any = None

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        got = self.count.get()
        n = int(got[0]) if got is not None else 0
        if self.mode == "pandas":
            import pandas as pd

            for pdf in rows:
                n += len(pdf)
            self.count.update((n,))
            yield pd.DataFrame({"k": [int(key[0])], "n": [n]})
        else:
            from pyspark.sql import Row

            for _ in rows:
                n += 1
            self.count.update((n,))
            yield Row(k=int(key[0]), n=n)

    def close(self) -> None:
        pass


class NullPerKey(_Base):  # type: ignore[misc,valid-type]
    """Takes each key's rows and does nothing: what is left is the framework's per-key loop."""

    def __init__(self, mode: str = "pandas") -> None:
        self.mode = mode

    def init(self, handle: Any) -> None:
        handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        for _ in rows:
            pass
        return iter(())

    def close(self) -> None:
        pass


class StatePerKey(CountPerKey):
    """CountPerKey without its output: the per-key loop and the state reads and writes."""

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        got = self.count.get()
        n = int(got[0]) if got is not None else 0
        for _ in rows:
            n += 1
        self.count.update((n,))
        return iter(())


PROCESSORS = {"count": CountPerKey, "null": NullPerKey, "state": StatePerKey}


class _DictValue:
    """A ValueState of a dict, for timing the processor's own code alone."""

    def __init__(self) -> None:
        self.d: dict = {}
        self.key: Any = None

    def get(self) -> Any:
        return self.d.get(self.key)

    def update(self, v: Any) -> None:
        self.d[self.key] = v


def processor_alone(mode: str, keys: int, rows_per_key: int, kind: str = "count") -> float:
    """The processor's own CPU time over ``keys`` keys, its rows built beforehand and its
    ValueState a dict: what the processor costs with no framework around it (s)."""
    import numpy as np
    import pandas as pd
    from pyspark.sql import Row

    proc = PROCESSORS[kind](mode)
    proc.count = _DictValue()
    if mode == "pandas":
        pdf = pd.DataFrame({"k": np.repeat(np.arange(keys, dtype=np.int64), rows_per_key),
                            "v": np.arange(keys * rows_per_key, dtype=np.int64)})
        inputs = [[pdf.iloc[i * rows_per_key:(i + 1) * rows_per_key]] for i in range(keys)]
    else:
        inputs = [[Row(k=i, v=j) for j in range(rows_per_key)] for i in range(keys)]
    t = time.thread_time()
    for i in range(keys):
        proc.count.key = i
        for _ in proc.handleInputRows((i,), iter(inputs[i]), None) or ():
            pass
    return time.thread_time() - t


def floor_per_key(keys: int, rows_per_key: int = 1) -> dict:
    """The least, per key, any task that hands each key's rows to a Python ``handleInputRows``
    as a pandas DataFrame and takes one DataFrame back must spend: a slice of the batch's
    frame per key, one generator per key, one small output frame per key. Measured here on
    ``keys`` keys, each on its own (µs per key)."""
    import numpy as np
    import pandas as pd

    n = keys * rows_per_key
    pdf = pd.DataFrame({"k": np.repeat(np.arange(keys, dtype=np.int64), rows_per_key),
                        "v": np.arange(n, dtype=np.int64)})
    bounds = [(i * rows_per_key, (i + 1) * rows_per_key) for i in range(keys)]

    def per_key(fn) -> float:
        t = time.thread_time()
        fn()
        return (time.thread_time() - t) / keys * 1e6

    def slices() -> None:
        for a, b in bounds:
            pdf.iloc[a:b]

    def gens() -> None:
        def g(x):
            yield x
        for a, _ in bounds:
            for _ in g(a):
                pass

    def outputs() -> None:
        for a, _ in bounds:
            pd.DataFrame({"k": [a], "n": [1]})

    def rows() -> None:
        from pyspark.sql import Row
        ks = pdf["k"].tolist()
        vs = pdf["v"].tolist()
        for k, v in zip(ks, vs):
            Row(k=k, v=v)

    return {"pandas_slice_us": per_key(slices), "generator_us": per_key(gens),
            "output_frame_us": per_key(outputs), "row_object_us": per_key(rows)}


# ---- the run --------------------------------------------------------------------------------------


def _input(keys: int, rows_per_key: int, batch: int, chunk_rows: int = 10_000) -> list:
    """The batch's rows, sorted by key (a Spark task's partition is), in Arrow record batches."""
    import numpy as np
    import pyarrow as pa

    n = keys * rows_per_key
    k = np.repeat(np.arange(keys, dtype=np.int64), rows_per_key)
    v = np.arange(n, dtype=np.int64) + batch * n
    t = pa.table({"k": k, "v": v})
    return t.to_batches(max_chunksize=chunk_rows)


class _Meta:
    def __init__(self) -> None:
        self.rows: list = []

    def add(self, rows: list) -> None:
        self.rows.extend(rows)


def _run_batch(cfg: Any, control: Any, kind: str, b: int, keys: int, rows_per_key: int,
               profile: bool = False) -> dict:
    from rhino.spark.driver.attempt import AttemptSpec
    from rhino.spark.runtime.task import _run_instance

    cc = control.coordinator()
    pl = cc.begin_batch(cfg.operator_id, b, batch_time_ms=int(time.time() * 1000))
    meta = _Meta()
    spec = AttemptSpec(batch=b, attempt=1, epoch=pl.epoch, watermark_ms=0, timezone="UTC", placement=pl,
                       batch_time_ms=pl.batch_time_ms, state_doc=control.state_doc,
                       input_schema_json=_schema(INPUT_COLUMNS).json(), instances=(0,), meta=meta)
    batches = _input(keys, rows_per_key, b)
    prof = cProfile.Profile() if profile else None
    w0, c0 = time.perf_counter(), time.thread_time()
    if prof is not None:
        prof.enable()
    out_rows = sum(rb.num_rows for rb in _run_instance(cfg, spec, 0, 0, socket.gethostname(), time.time(),
                                                       iter(batches)))
    if prof is not None:
        prof.disable()
    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    cc.commit_batch(cfg.operator_id, b, epoch=pl.epoch)
    task = meta.rows[-1]
    want = keys if kind == "count" else 0
    assert out_rows == want, f"batch {b}: {out_rows} output rows for {keys} keys"
    sample = min(keys, PROCESSOR_SAMPLE_KEYS)
    own = processor_alone(cfg.mode, sample, rows_per_key, kind) * keys / sample
    rec = {"record": "batch", "batch": b, "keys": keys, "rows": keys * rows_per_key, "mode": cfg.mode,
           "processor": kind,
           "task_wall_s": wall, "task_cpu_s": cpu, "processor_cpu_s": own,
           "framework_wall_us_per_key": (wall - own) / keys * 1e6,
           "framework_cpu_us_per_key": (cpu - own) / keys * 1e6,
           "phases_s": {k: task[k] for k in ("open_s", "read_s", "group_s", "fetch_s", "process_s", "write_s",
                                             "commit_s")},
           "round_trips": task["round_trips"], "puts": task["puts"]}
    if prof is not None:
        rec["profile_top"] = _top(prof, 25)
    return rec


def _top(prof: cProfile.Profile, n: int) -> list[dict]:
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (path, line, fn), (cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}({fn})", "calls": nc, "own_s": tt, "cum_s": ct})
    rows.sort(key=lambda r: -r["own_s"])
    return rows[:n]


def run_mode(mode: str, kind: str, args: argparse.Namespace, coord_address: str, secret_file: Path,
             emit: Any) -> None:
    from rhino.spark.driver.config import OperatorConfig
    from rhino.spark.driver.control import Control

    proc = PROCESSORS[kind](mode)
    cfg = OperatorConfig.of(proc, key="k", output_schema=_schema(OUTPUT_COLUMNS), operator_id=f"glue-{mode}-{kind}",
                            coordinator=coord_address, secret_file=str(secret_file), parallelism=1, replicas=0,
                            num_vnodes=args.vnodes, mode=mode, watch_hosts=False, task_window_rows=args.window_rows)
    control = Control(cfg)
    control.ensure_created(_schema(INPUT_COLUMNS))
    for b in range(args.batches + (1 if args.profile else 0)):
        profiled = args.profile and b == args.batches
        say(f"glue {mode}, {kind}: batch {b}{' (profiled)' if profiled else ''}, {args.keys:,} keys")
        rec = _run_batch(cfg, control, kind, b, args.keys, args.rows_per_key, profile=profiled)
        rec.update(command=args.command, params=args.params, profiled=profiled, loadavg=loadavg())
        emit.emit(round_floats(rec))
        say(f"  task {rec['task_wall_s']:.2f} s wall, {rec['task_cpu_s']:.2f} s CPU; processor "
            f"{rec['processor_cpu_s']:.2f} s CPU; framework {rec['framework_cpu_us_per_key']:.2f} us/key CPU, "
            f"{rec['framework_wall_us_per_key']:.2f} us/key wall")


def report(records: list[dict], path: str) -> None:
    floor = next((r for r in records if r.get("record") == "floor"), None)
    records = [r for r in records if r.get("record") == "batch"]
    if not records or floor is None:
        return
    params = records[0]["params"]
    lines = ["# rhino.spark glue at a million keys per batch", "",
             f"Command: `{records[0]['command']}`", "",
             f"Parameters: {params}. 1-min load average during the run: "
             f"{min(r['loadavg'][0] for r in records):.1f}-{max(r['loadavg'][0] for r in records):.1f}.", "",
             "Each batch runs the task code a Spark executor runs (`runtime/task.py`), in this process, "
             "against a real `rhino worker` and `rhino coordinator` (r = 0: the commit is the worker's "
             "checkpoint only). The processor, `CountPerKey`, reads a ValueState, counts its key's rows, "
             "writes it back and emits one row; `null` takes each key's rows and does nothing else (what is left is "
             "the framework's per-key loop); `state` keeps the count without emitting. The processor's own CPU "
             "is that processor run alone on the same keys (rows built beforehand, a dict for its state; on at most "
             f"{PROCESSOR_SAMPLE_KEYS:,} keys, scaled). Framework per key = (task - processor's own time) / keys; "
             "the worker's share is in the wall time only. The first batch writes every key new; later "
             "batches read and update them.", "",
             ""]
    cols = ("task_wall_s", "task_cpu_s", "processor_cpu_s", "framework_cpu_us_per_key", "framework_wall_us_per_key")
    lines += md_table(["mode", "processor", "batch", "keys", "task wall (s)", "task CPU (s)", "processor CPU (s)",
                       "framework CPU (us/key)", "framework wall (us/key)", "group", "fetch", "process", "write",
                       "commit"],
                      [[r["mode"], r["processor"], r["batch"], f"{r['keys']:,}", *(f"{r[c]:.2f}" for c in cols),
                        *(f"{r['phases_s'][p]:.2f}" for p in ("group_s", "fetch_s", "process_s", "write_s", "commit_s"))]
                       for r in records if not r.get("profiled")], "ll" + "r" * 12)
    lines += ["", "## The floor", "",
              "What pandas and Python cost per key, measured in this run on their own (thread CPU, "
              f"{params['keys']:,} keys):", ""]
    floor = {k: v for k, v in floor.items() if k not in ("record", "command", "params")}
    for k, v in floor.items():
        lines.append(f"- `{k}`: {v:.2f} us")
    pandas_floor = floor["pandas_slice_us"] + floor["generator_us"] + floor["output_frame_us"]
    lines += ["", f"A pandas-mode framework hands each key a DataFrame and takes one back: at least "
              f"{floor['pandas_slice_us']:.2f} + {floor['generator_us']:.2f} + {floor['output_frame_us']:.2f} = "
              f"{pandas_floor:.2f} us per key in pandas and Python alone (the output frame is built by the "
              f"processor, so it counts as the processor's here). The target of {TARGET_US_PER_KEY:g} us per key "
              f"for everything but the processor is below the cost of one pandas slice per key.", ""]
    for r in records:
        if r.get("profiled") and r.get("profile_top"):
            lines += [f"## Profile ({r['mode']} mode, {r['processor']}, batch {r['batch']}, {r['keys']:,} keys; "
                      "cProfile: inflates Python-heavy code)", ""]
            lines += md_table(["function", "calls", "own (s)", "cumulative (s)"],
                              [(f"`{e['function']}`", f"{e['calls']:,}", f"{e['own_s']:.3f}", f"{e['cum_s']:.3f}")
                               for e in r["profile_top"]], "lrrr") + [""]
    write_lines(path, lines)


class Glue(Scenario):
    name = "spark glue"
    summary_on_failure = False
    description = __doc__.split("\n\n")[0]
    workdir_prefix = "glue-"

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--keys", type=positive_int, default=1_000_000)
        ap.add_argument("--rows-per-key", type=positive_int, default=1)
        ap.add_argument("--batches", type=positive_int, default=3)
        ap.add_argument("--mode", choices=("pandas", "rows", "both"), default="both")
        ap.add_argument("--processors", default="count",
                        help="comma-separated: count (the processor), null (rows taken, nothing else: the per-key "
                             "loop), state (the loop and the ValueState, no output)")
        ap.add_argument("--vnodes", type=positive_int, default=64)
        ap.add_argument("--window-rows", type=positive_int, default=100_000, help="task_window_rows")
        ap.add_argument("--profile", action="store_true", help="one more batch per mode under cProfile")
        ap.add_argument("--first-host", type=host_number, default=80, help="the worker on 127.0.0.N")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {k: v for k, v in vars(args).items() if k not in ("json", "out", "report", "dir", "from_file",
                                                                 "spark_conf_dict")}

    def run(self, br: BenchRun) -> None:
        args = br.args
        args.command, args.params = br.command, br.parameters
        modes = ("pandas", "rows") if args.mode == "both" else (args.mode,)
        cluster = start_rhino(br.base, br.stack, workers=1, first_host=args.first_host, heartbeat_timeout=30.0,
                              metrics=False)
        for mode in modes:
            for kind in args.processors.split(","):
                run_mode(mode, kind, args, cluster.coordinator, cluster.secret_file, br.em)
        say("the floor: pandas and Python per key, on their own")
        floor = floor_per_key(min(args.keys, 200_000), args.rows_per_key)
        br.emit(round_floats({"record": "floor", "command": args.command, "params": args.params, **floor}))


def summarize(records: list[dict]) -> dict:
    """The summary: the framework's median CPU per key of each mode, over the batches after the first."""
    bs = [r for r in records if r.get("record") == "batch"]
    steady = [r for r in bs if r["batch"] > 0 and not r.get("profiled")]
    modes = dict.fromkeys(r["mode"] for r in bs)
    return round_floats({"record": "summary", "command": bs[0]["command"] if bs else None,
                         "params": bs[0]["params"] if bs else None,
                         "framework_cpu_us_per_key": {m: median([r["framework_cpu_us_per_key"] for r in steady
                                                                 if r["mode"] == m]) for m in modes},
                         "target_us_per_key": TARGET_US_PER_KEY})


def main(argv: Optional[list[str]] = None) -> int:
    return bench_main(Glue(summarize=summarize, report=report), argv)
