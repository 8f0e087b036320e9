"""Two Rhino operators chained in one ``foreachBatch`` query, exactly-once under a host loss,
on a real 3-host Spark standalone cluster (127.0.0.64-66), parallelism 3, r=2.

Per micro-batch b: ``mid = running.transform(df, b)`` (keyed by user: each row with its
user's running total), then ``buckets.transform(mid.withColumn("bucket", ...), b)`` (keyed
by total % BUCKETS, so the rows are shuffled again: per bucket, a running count and sum of
the totals it has seen), then the sink collects the second operator's output. In each
trial one host (its Spark worker, executors and Rhino worker at once) is SIGKILLed inside
a batch, at a random moment of one step, each step in turn: while the first operator
runs, while the second runs, or just before the sink reads the output.

Recovery, as docs/spark.md describes it for ``transform``: a failover inside an operator
runs its batch again; the sink finding the second operator's output lost reruns the chain
in the foreachBatch function (as ``for_each_batch`` does for one operator); so does the
second operator finding its input (the first's output) lost, which it raises at once as
``rhino.spark.InputLostError`` (nothing committed; the first operator replays b from b-1).
The query is never restarted.

Oracles: the failure-free run equals an independent pandas computation of the two chained
aggregations over the same files, batch by batch; every killed-host trial equals the
failure-free run, batch by batch.

`RHINO_CHAIN_TRIALS` sets the number of killed-host trials (1 here; `make chaos` runs 20)."""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import pytest

pyspark = pytest.importorskip("pyspark")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark import cloudpickle  # noqa: E402
from pyspark.errors import StreamingQueryException  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino.spark  # noqa: E402
from rhino_testing.harness.spark_cluster import LocalCluster  # noqa: E402

# the processors below travel to the executors by value (the workers cannot import tests/)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TRIALS = int(os.environ.get("RHINO_CHAIN_TRIALS", "1"))
BATCHES = 8
ROWS_PER_BATCH = 3000
USERS = 300
BUCKETS = 7
SCHEMA = "user long, seq long, v long"
# the steps of a batch: the first operator runs, the second, the sink reads the output
STEPS = ("running", "buckets", "sink")
AIM = {"running": 0.6, "buckets": 0.3, "sink": 0.0}  # how far into a step a kill may land (its share)
MAX_STARTS = 1  # a killed-host trial's query is never restarted: the chain reruns in place


class RunningTotal(StatefulProcessor):
    """Keyed by user: one output row per input row, with the user's running sum of v after it
    (rows taken in seq order: the order of a key's rows within a batch is not Spark's to keep)."""

    def init(self, handle):
        self.total = handle.getValueState("total", "total long")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows)).sort_values("seq")
        base = self.total.get()[0] if self.total.exists() else 0
        totals = base + pdf["v"].to_numpy().cumsum()
        self.total.update((int(totals[-1]),))
        yield pd.DataFrame({"user": np.full(len(pdf), int(key[0])), "seq": pdf["seq"].to_numpy(), "total": totals})

    def close(self):
        pass


class BucketStats(StatefulProcessor):
    """Keyed by bucket: how many rows and what sum of totals it has seen over all batches; one
    output row per bucket per batch. A row lost or doubled upstream changes every later count."""

    def init(self, handle):
        self.stats = handle.getValueState("stats", "n long, s long")

    def handleInputRows(self, key, rows, timerValues):
        n, s = self.stats.get() if self.stats.exists() else (0, 0)
        for pdf in rows:
            n += len(pdf)
            s += int(pdf["total"].sum())
        self.stats.update((n, s))
        yield pd.DataFrame({"bucket": [int(key[0])], "n": [n], "s": [s]})

    def close(self):
        pass


def make_input(src) -> list[pd.DataFrame]:
    """BATCHES parquet files, one per micro-batch; seq numbers every row in stream order. Rows
    are shuffled within a file, so nothing depends on the order they arrive in."""
    rng = np.random.default_rng(2027)
    batches = []
    for b in range(BATCHES):
        seq = np.arange(b * ROWS_PER_BATCH, (b + 1) * ROWS_PER_BATCH)
        pdf = pd.DataFrame({"user": rng.integers(0, USERS, ROWS_PER_BATCH), "seq": seq,
                            "v": rng.integers(1, 100, ROWS_PER_BATCH)}).sample(frac=1, random_state=b)
        pdf.to_parquet(src / f"part-{b:03d}.parquet", index=False)
        batches.append(pdf)
    # Spark's file source takes files in mtime order: files written within one clock tick could
    # be taken in another order, and the batches would differ between runs
    base = time.time() - 100
    for i, f in enumerate(sorted(src.iterdir())):
        os.utime(f, (base + i, base + i))
    return batches


def oracle(batches: list[pd.DataFrame]) -> dict[int, pd.DataFrame]:
    """The two aggregations in pandas, over the whole stream at once: running totals per user in
    seq order, then per (batch, bucket) the rows and their totals, accumulated per bucket."""
    rows = pd.concat([p.assign(batch=b) for b, p in enumerate(batches)]).sort_values("seq")
    rows["total"] = rows.groupby("user")["v"].cumsum()
    rows["bucket"] = rows["total"] % BUCKETS
    agg = (rows.groupby(["batch", "bucket"]).agg(c=("total", "size"), t=("total", "sum"))
           .reset_index().sort_values(["batch", "bucket"]))
    agg["n"] = agg.groupby("bucket")["c"].cumsum()
    agg["s"] = agg.groupby("bucket")["t"].cumsum()
    return {b: canon(g[["bucket", "n", "s"]]) for b, g in agg.groupby("batch")}


def _exception_line(text: str) -> str:
    """The Python exception a failed query ends with (its 'rhino.errors.X: ...' line)."""
    lines = [ln.strip() for ln in text.splitlines() if "Error:" in ln or "Exception:" in ln]
    return (lines[-1] if lines else text.strip().splitlines()[0])[:300]


def canon(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True).astype("int64")


def output_lost(e: Exception) -> bool:
    """Blocks of a checkpointed output were lost with their executor (Spark's
    CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND): what transform() leaves to the caller, when the sink
    reads the second operator's output, or as rhino.spark.InputLostError when the second
    operator's own job reads the first's lost output."""
    if isinstance(e, rhino.spark.InputLostError):
        return True
    text = str(e)
    return "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in text or ("Checkpoint block" in text and "not found" in text)


class ChainRun:
    """One streaming query: file source -> RunningTotal -> BucketStats -> a dict sink."""

    def __init__(self, cl, spark, src, ck, name: str, on_step=None, starts: int = 1) -> None:
        common = dict(coordinator=cl.coordinator, secret_file=str(cl.secret_file), parallelism=3, replicas=2)
        self.running = rhino.spark.transform_with_state(RunningTotal(), key="user", operator_id=f"{name}-running",
                                                        output_schema="user long, seq long, total long", **common)
        self.buckets = rhino.spark.transform_with_state(BucketStats(), key="bucket", operator_id=f"{name}-buckets",
                                                        output_schema="bucket long, n long, s long", **common)
        self.outputs: dict[int, pd.DataFrame] = {}
        self.timeline: list[tuple] = []  # (batch, what, time): where a kill landed
        self.reruns: list[tuple[int, str]] = []  # whole-chain reruns after a lost output
        self.restarts: list[str] = []  # the errors the query stopped with before it was restarted
        self.on_step = on_step  # on_step(batch, step), as each step of a batch begins
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
        for start in range(1, starts + 1):
            q = (stream.writeStream.foreachBatch(self.body).option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
            try:
                if not q.awaitTermination(600):
                    raise TimeoutError(f"{name}: the query did not finish in 600 s")
                return
            except StreamingQueryException as e:
                # transform()'s other documented recovery (docs/spark.md, "One micro-batch"):
                # the query is restarted from its checkpoint, Spark replays the batch it had
                # not committed, and each operator runs it again from b-1 (starts > 1 only).
                if start == starts:
                    raise
                self.restarts.append(_exception_line(str(e)))
            finally:
                if q.isActive:
                    q.stop()

    def body(self, df, batch_id: int) -> None:
        b = int(batch_id)
        # The second operator reads the first's output, which lives in executors' block
        # managers: a host lost after the first operator committed takes part of it along,
        # and Spark cannot recompute it (its lineage ends at its checkpoint). Then the whole
        # chain runs again, as for_each_batch does for one operator: each operator rolls back
        # to b-1 and replays b.
        for attempt in range(1, 6):
            try:
                self._step(b, "running")
                mid = self.running.transform(df, b)
                self._step(b, "buckets")
                out = self.buckets.transform(mid.withColumn("bucket", F.col("total") % BUCKETS), b)
                self._step(b, "sink")
                self.outputs[b] = out.toPandas()  # idempotent by batch id
                self._step(b, "done")
                return
            except Exception as e:  # noqa: BLE001 - only a lost output is run again
                if not output_lost(e) or attempt == 5:
                    raise
                lines = str(e).splitlines()
                self.reruns.append((b, next((ln for ln in lines if "CHECKPOINT_RDD" in ln), lines[0])[:200]))

    def _step(self, b: int, step: str) -> None:
        self.timeline.append((b, step, time.time()))
        if self.on_step is not None:
            self.on_step(b, step)

    def reports(self) -> list:
        return self.running.reports + self.buckets.reports

    def close(self) -> None:
        self.running.close()
        self.buckets.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("chain-cluster")
    with LocalCluster.up(d, hosts=3, first_host=64, heartbeat_timeout=2.0) as cl:
        spark = cl.spark_session("rhino-chain-exactly-once")
        try:
            yield cl, spark
        finally:
            spark.stop()


def test_two_chained_operators_with_a_killed_host_equal_the_failure_free_run(cluster, tmp_path):
    cl, spark = cluster
    src = tmp_path / "src"
    src.mkdir()
    batches = make_input(src)

    t0 = time.time()
    ref = ChainRun(cl, spark, src, tmp_path / "ck-ref", "chain-ref")
    print(f"failure-free run: {time.time() - t0:.1f} s")
    ref.close()
    # (No kill here, but no assertion that nothing ran twice either: on a loaded machine a
    # worker can miss its heartbeats and be failed over. The oracle below is what counts.)
    print("failure-free run, batches that ran more than once:",
          [(r.batch, r.attempts, r.errors) for r in ref.reports() if r.attempts > 1], ref.reruns)
    expect = oracle(batches)
    assert sorted(ref.outputs) == list(range(BATCHES))
    for b in range(BATCHES):
        pd.testing.assert_frame_equal(canon(ref.outputs[b]), expect[b], obj=f"failure-free run, batch {b}")
    # how long each step takes, to aim a kill inside one
    step_s = {step: float(np.median([z - a for (b, s, a), (_, _, z) in zip(ref.timeline, ref.timeline[1:])
                                     if s == step and b > 0]))
              for step in STEPS}
    print("steps (median s):", step_s)

    rng = random.Random(2026)
    for trial in range(TRIALS):
        # every step in turn, each host in turn (a different host for a step the next time round)
        step = STEPS[trial % 3]
        host = 1 + (trial + trial // 3) % 3
        # Any batch, the last ones too: the batch that runs again after the kill may then be
        # the operators' last checkpoint when the host comes back, which the chain repair onto
        # the returning worker handles (it drops what that worker holds of the instance before
        # the bulk copy: tests/test_chain_repair_reexecuted.py).
        kill_at = rng.randrange(1, BATCHES)
        # Within the first part of the step: the second operator's step is worth aiming at
        # while it reads the first's output, before its stateful stage. The sink reads a few
        # rows in a fraction of a second: it is killed before it starts, in the query's own
        # thread, so that the output it reads has lost its blocks.
        delay = rng.uniform(0.0, AIM[step] * step_s[step])
        killed: dict = {}
        # set when the next step begins: the kill comes then at the latest, so that it stays
        # in this batch however fast the trial runs compared with the failure-free one
        step_over = threading.Event()

        def kill() -> None:
            step_over.wait(delay)
            killed["t"] = time.time()
            killed["pids"] = cl.kill_host(host)

        def on_step(b: int, at: str) -> None:
            if "thread" in killed:
                step_over.set()
            elif b == kill_at and at == step:
                killed["thread"] = threading.Thread(target=kill, daemon=True)
                killed["thread"].start()
                if step == "sink":
                    killed["thread"].join()

        t0 = time.time()
        run = ChainRun(cl, spark, src, tmp_path / f"ck-t{trial}", f"chain-t{trial}", on_step=on_step,
                       starts=MAX_STARTS)
        run.close()
        where = f"trial {trial}: host {host} killed {delay:.2f} s into batch {kill_at}'s {step} step"
        assert "thread" in killed, f"{where}: the kill was never started"
        killed["thread"].join(30)
        assert killed.get("pids"), f"{where}: nothing was killed"
        assert sorted(run.outputs) == list(range(BATCHES)), where
        for b in range(BATCHES):
            pd.testing.assert_frame_equal(canon(run.outputs[b]), canon(ref.outputs[b]), obj=f"{where}, batch {b}")
        # The loss was felt: the host died before the query ended, and a batch ran more than
        # once (an attempt of an operator, or the whole chain), or at a new epoch (a failover).
        assert killed["t"] < max(t for _, _, t in run.timeline), f"{where}: the kill came after the last batch"
        reps = run.reports()
        first_epoch = {op.operator_id: op.reports[0].epoch for op in (run.running, run.buckets)}
        retried = [(op.operator_id, r.batch, r.attempts, r.errors)
                   for op in (run.running, run.buckets) for r in op.reports if r.attempts > 1]
        moved = any(r.epoch > first_epoch[op.operator_id] for op in (run.running, run.buckets) for r in op.reports)
        assert retried or run.reruns or run.restarts or moved, \
            (where, [(r.batch, r.attempts, r.epoch, r.errors) for r in reps], run.timeline)
        print({"trial": trial, "host": host, "batch": kill_at, "step": step, "delay": round(delay, 2),
               "landed": _landed(run.timeline, killed["t"]), "attempts": retried, "chain_reruns": run.reruns,
               "query_restarts": run.restarts, "epoch_moved": moved, "seconds": round(time.time() - t0, 1)})
        if trial < TRIALS - 1:  # the cluster goes down after the last one
            t0 = time.time()
            cl.restart_host(host)
            cl.wait_for_executors(spark)
            print(f"host {host} back in {time.time() - t0:.1f} s")


def _landed(timeline: list[tuple], t: float) -> str:
    """The step a batch was in at time t (for the report)."""
    last = None
    for b, what, at in timeline:
        if at > t:
            break
        last = (b, what)
    return f"batch {last[0]}, step {last[1]!r}" if last else "before the first batch"
