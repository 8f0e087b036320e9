"""``rhino-bench spark initial-state``: loading a large initial state (``--keys``, 10M by
default) into a new stateful query, Rhino's ``transform_with_state(initial_state=...)``
against Spark's own ``transformWithStateInPandas(initialState=...)`` with the RocksDB
state store provider, in the same run, with the same processor object.

    rhino-bench spark initial-state --keys 10M --json --out bench/results/initial_state.jsonl \
        --report bench/results/initial_state.md

How it runs and what each record holds: bench/README.md, "Initial state at scale".
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ..frame import BenchRun, Scenario, bench_main, spark_session, start_rhino
from ..report import last_summary, md_table, setup_of, write_lines
from .common import ROCKSDB_PROVIDER, positive_int, say

__all__ = ["main"]

OUT = "k long, v long, why string"


def _processor() -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class LoadProcessor(StatefulProcessor):
        """The initial state's ``init`` into a ValueState; input rows emit the key's value."""

        def init(self, handle):
            self.v = handle.getValueState("v", "v long")

        def handleInitialState(self, key, initialState, timerValues):
            self.v.update((int(initialState["init"].iat[0]),))

        def handleInputRows(self, key, rows, timerValues):
            for _ in rows:
                pass
            got = self.v.get()
            yield pd.DataFrame({"k": [key[0]], "v": [got[0] if got else -1], "why": ["probe"]})

        def close(self):
            pass

    return LoadProcessor()


def parse_count(text: str) -> int:
    t = text.strip().lower().replace("_", "")
    mult = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write a count such as 10M, 500k or 20000") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return n


def init_value(k: Any) -> Any:
    """The initial value of key k (the oracle: a formula, not the stored table)."""
    return (k * 2654435761) % 1_000_003


def write_initial(directory: Path, keys: int, files: int = 8) -> None:
    """``keys`` rows (k = 0..keys-1, init = init_value(k)) in ``files`` Parquet files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    step = -(-keys // files)
    for i, lo in enumerate(range(0, keys, step)):
        k = np.arange(lo, min(keys, lo + step), dtype=np.int64)
        pq.write_table(pa.table({"k": k, "init": init_value(k)}), directory / f"part-{i:03d}.parquet")


def write_input(directory: Path, keys: int, probe: int, seed: int) -> Any:
    """Batch 0: ``probe`` new keys (not in the initial state); batch 1: ``probe`` sampled keys
    of the initial state. Returns batch 1's keys."""
    import numpy as np
    import pandas as pd

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(keys, size=min(probe, keys), replace=False)).astype(np.int64)
    base = time.time() - 100
    for i, k in enumerate([np.arange(keys, keys + probe, dtype=np.int64), sample]):
        f = directory / f"part-{i:03d}.parquet"
        pd.DataFrame({"k": k}).to_parquet(f)
        os.utime(f, (base + i, base + i))  # the file source takes files in mtime order
    return sample


def run_system(spark: Any, system: str, *, init_dir: Path, input_dir: Path, work: Path, cluster: Optional[dict],
               partitions: int, replicas: int, timeout_s: float, operator_id: str) -> dict:
    """One query on one system: batch 0 loads the initial state, batch 1 probes it."""
    init = spark.read.parquet(str(init_dir))
    stream = spark.readStream.schema("k long").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    outputs: list[Any] = []
    sink = lambda df, b: outputs.append(df.toPandas().assign(batch=b))  # noqa: E731
    op = None
    t0 = time.time()
    if system == "spark":
        q = (stream.groupBy("k").transformWithStateInPandas(_processor(), outputStructType=OUT,
                                                            outputMode="Update", timeMode="None",
                                                            initialState=init.groupBy("k"))
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "ck")).trigger(availableNow=True)
             .start())
    else:
        from rhino.spark import transform_with_state

        assert cluster is not None
        op = transform_with_state(_processor(), key="k", output_schema=OUT, operator_id=operator_id,
                                  coordinator=cluster.coordinator, secret_file=str(cluster.secret_file),
                                  parallelism=partitions, replicas=replicas, locality=False, initial_state=init)
        q = (stream.writeStream.foreachBatch(op.for_each_batch(sink)).option("checkpointLocation", str(work / "ck"))
             .trigger(availableNow=True).start())
    if not q.awaitTermination(timeout_s):
        q.stop()
        raise RuntimeError(f"{system}: the query did not finish in {timeout_s:.0f} s")
    if q.exception() is not None:
        raise RuntimeError(f"{system}: the query failed: {q.exception()}")
    prog = sorted((p for p in q.recentProgress if p.get("batchId") is not None), key=lambda p: p["batchId"])
    b0 = next(p for p in prog if p["batchId"] == 0)
    load_s = b0["durationMs"]["triggerExecution"] / 1000
    out = {"load_s": load_s, "wall_s": None, "outputs": outputs, "op": op}
    ends = [p["timestamp"] for p in prog if p["batchId"] == 0]
    if ends:
        import pandas as pd

        out["wall_s"] = round(pd.Timestamp(ends[0]).timestamp() + load_s - t0, 3)
    return out


def measurement(system: str, res: dict, *, keys: int, sample: Any, replicas: int, command: str,
                parameters: dict) -> dict:
    import pandas as pd

    outs = [o for o in res["outputs"] if len(o)]
    df = pd.concat(outs, ignore_index=True) if outs else pd.DataFrame(columns=["k", "v", "batch"])
    probe = df[df["batch"] == 1].sort_values("k")
    want = init_value(sample)
    values_ok = (len(probe) == len(sample) and probe["k"].tolist() == sample.tolist()
                 and probe["v"].astype("int64").tolist() == want.tolist())
    new_ok = bool((df[df["batch"] == 0]["v"] == -1).all())  # batch 0's keys had no initial state
    rec = {"record": "measurement", "system": "rhino" if system == "rhino" else "spark-rocksdb", "keys": keys,
           "load_s": round(res["load_s"], 3), "keys_per_s": round(keys / res["load_s"]) if res["load_s"] else None,
           "wall_s": res["wall_s"], "values_ok": bool(values_ok and new_ok), "probed": int(len(sample)),
           "command": command, "parameters": parameters}
    op = res.get("op")
    if op is not None and op.reports:
        r0 = op.reports[0]
        slow = max(r0.tasks, key=lambda t: t.get("process_s", 0) + t.get("write_s", 0))
        rec.update(replicas=replicas, attempts=r0.attempts, job_s=round(r0.job_s, 3),
                   task_process_s=round(slow.get("process_s", 0), 3), task_write_s=round(slow.get("write_s", 0), 3),
                   task_commit_s=round(slow.get("commit_s", 0), 3),
                   checkpoint_bytes=sum(int(t.get("checkpoint_bytes", 0)) for t in r0.tasks))
    return rec


def report(records: list[dict], path: str) -> None:
    ms = {r["system"]: r for r in records if r.get("record") == "measurement"}
    el = (last_summary(records) or {}).get("elapsed_s")
    lines = ["# Initial state at scale: Rhino against Spark's own operator", "",
             f"Command: `{setup_of(records).get('command', '')}`", "",
             f"Total run time: {'-' if el is None else f'{el:.0f}'} s.", ""]
    lines += md_table(["system", "keys", "batch 0 (load) s", "keys/s", "values checked"],
                      [(name, f"{r['keys']:,}", f"{r['load_s']:.1f}", f"{r['keys_per_s']:,}",
                        f"{'ok' if r['values_ok'] else 'WRONG'} ({r['probed']} keys)") for name, r in ms.items()])
    if "rhino" in ms and "spark-rocksdb" in ms:
        ratio = ms["spark-rocksdb"]["load_s"] / ms["rhino"]["load_s"]
        lines += ["", f"Rhino loads {ratio:.2f}x as fast as Spark's own (Spark's batch 0 time / Rhino's)."]
    r = ms.get("rhino")
    if r and "task_process_s" in r:
        lines += ["", f"Rhino's slowest task: process {r['task_process_s']} s (handleInitialState and state "
                      f"updates), write {r['task_write_s']} s, commit {r['task_commit_s']} s "
                      f"(r={r.get('replicas')}); checkpoint {r['checkpoint_bytes'] / 2**20:.0f} MiB over "
                      "the instances."]
    write_lines(path, lines)


def summarize(records: list[dict]) -> dict:
    ms = [r for r in records if r.get("record") == "measurement"]
    return {"record": "summary", "systems": [r["system"] for r in ms],
            "values_ok": bool(ms) and all(r["values_ok"] for r in ms)}


class InitialState(Scenario):
    name = "spark initial-state"
    description = __doc__.split("\n\n")[0]
    workdir_prefix = "rhino-initial-state-"

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--keys", type=parse_count, default=10_000_000, help="keys in the initial state (default 10M)")
        ap.add_argument("--probe-keys", type=positive_int, default=2000, help="rows of each input batch (default 2000)")
        ap.add_argument("--systems", default="spark,rhino", help="spark,rhino (default: both, Spark first)")
        ap.add_argument("--partitions", type=positive_int, default=3, help="shuffle partitions = Rhino instances")
        ap.add_argument("--replicas", type=int, default=2, help="Rhino's replicas per instance (default 2)")
        ap.add_argument("--first-host", type=int, default=70, help="Rhino workers on 127.0.0.N.. (default 70)")
        ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per query (default 7200)")
        ap.add_argument("--seed", type=int, default=7)

    def check(self, ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        if not args.systems or any(s not in ("spark", "rhino") for s in args.systems):
            ap.error("--systems: choose from spark, rhino")
        if args.replicas < 0 or args.first_host + args.replicas > 254:
            ap.error("--replicas must be >= 0 and the workers must fit 127.0.0.2..254")

    def parameters(self, args: argparse.Namespace, run_id: str) -> dict:
        return {"keys": args.keys, "probe_keys": args.probe_keys, "systems": args.systems,
                "partitions": args.partitions, "replicas": args.replicas, "seed": args.seed}

    def run(self, br: BenchRun) -> None:
        args, base = br.args, br.base
        say(f"writing the initial state: {args.keys:,} keys")
        write_initial(base / "initial", args.keys)
        sample = write_input(base / "input", args.keys, args.probe_keys, args.seed)
        cluster = None
        if "rhino" in args.systems:
            cluster = start_rhino(base / "rhino", br.stack, workers=args.replicas + 1, first_host=args.first_host,
                                  metrics=False)
        spark = spark_session(br.stack, base, app="rhino-bench-initial-state", master="local[2]",
                              partitions=args.partitions,
                              conf={"spark.driver.memory": "4g",
                                    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER})
        for system in args.systems:
            say(f"{system}: loading {args.keys:,} keys as initial state")
            work = base / f"work-{system}"
            res = run_system(spark, system, init_dir=base / "initial", input_dir=base / "input", work=work,
                             cluster=cluster, partitions=args.partitions, replicas=args.replicas,
                             timeout_s=args.timeout, operator_id=f"init-{int(time.time())}")
            rec = br.emit(measurement(system, res, keys=args.keys, sample=sample, replicas=args.replicas,
                                      command=br.command, parameters=br.parameters))
            say(f"  {system}: batch 0 {rec['load_s']:.1f} s ({rec['keys_per_s']:,} keys/s), values "
                f"{'ok' if rec['values_ok'] else 'WRONG'}")
            shutil.rmtree(work, ignore_errors=True)

    def exit_code(self, br: BenchRun, summary: Optional[dict], rc: Optional[int]) -> int:
        return 0 if summary and summary["values_ok"] else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_main(InitialState(summarize=summarize, report=report), argv)
