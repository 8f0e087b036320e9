"""A query restarts with its own code after it was reconfigured (issue 45, item 1).

A real streaming query (Spark's file source over JSON files, one file per micro-batch
with ``maxFilesPerTrigger=1``) runs in a driver *subprocess*: a script written here whose
code says ``parallelism=2``, against a ``rhino coordinator`` process and three ``rhino
worker`` processes. After two batches the operator goes to 3 instances while the query
runs, in one of three ways:

- ``rescale``: the coordinator client's ``rescale``, as ``rhino rescale`` does;
- ``autoscale``: the coordinator's autoscaler, turned on with at least 3 instances, scales
  the operator out on the batches' own reports;
- ``coordinator``: ``rescale``, and then the coordinator is SIGKILLed with the driver and
  started again on its metadata before the driver restarts.

Once a batch ran at 3, the driver is SIGKILLed (its whole process group: the JVM too).
The same script is started again from the same Spark checkpoint: it adopts the
coordinator's parallelism 3 (its report and its log say so) and consumes the rest of the
input.

The sink writes each batch's output to its own file, replaced atomically (idempotent by
batch id, as ``foreachBatch`` sinks must be): the whole output, every file read back
with no deduplication, must equal pandas' running counts over all the input files, each
row exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from rhino.coordinator.client import connect_coordinator  # noqa: E402

from spark_fixtures import rhino_cluster  # noqa: E402

HOSTS = (141, 142, 143)  # 127.0.0.141..143: no other test module's workers
OP = "restart"
MAX_FILES = 9  # input files, one micro-batch each: 2 at parallelism 2, then until one ran at 3, 2 after the restart
ROWS = 30  # rows per file
TESTS = Path(__file__).resolve().parent

DRIVER = textwrap.dedent('''
    """The query under test: its code says parallelism=2, whatever the coordinator says."""
    import json, logging, os, sys, time
    from pathlib import Path

    sys.path.insert(0, sys.argv[4])  # tests/, for spark_fixtures
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    import rhino.spark
    from spark_fixtures import local_spark

    coordinator, secret_file, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    logging.basicConfig(level=logging.WARNING, format="%%(levelname)s %%(name)s %%(message)s")


    class RunningCount(StatefulProcessor):
        def init(self, handle):
            self.st = handle.getValueState("st", "n long, s long")

        def handleInputRows(self, key, rows, timerValues):
            n, s = self.st.get() or (0, 0)
            for pdf in rows:
                n += len(pdf)
                s += int(pdf["v"].sum())
            self.st.update((n, s))
            yield pd.DataFrame({"k": [int(key[0])], "n": [n], "s": [s]})

        def close(self):
            pass


    def sink(df, b):  # idempotent by batch id: the batch's file, replaced atomically
        pdf = df.toPandas()
        tmp = root / "out" / f".batch-{b:05d}.tmp"
        pdf.to_json(tmp, orient="records", lines=True)
        os.replace(tmp, root / "out" / f"batch-{b:05d}.json")


    spark = local_spark("rhino-restart")
    op = rhino.spark.transform_with_state(RunningCount(), key="k", output_schema="k long, n long, s long",
                                          operator_id="%(op)s", coordinator=coordinator, secret_file=secret_file,
                                          parallelism=2, replicas=1, locality=False)
    each = op.for_each_batch(sink)


    def run(df, b):
        each(df, b)
        r = op.reports[-1]
        with open(root / "reports.jsonl", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "batch": r.batch, "parallelism": r.parallelism,
                                "initial_parallelism": r.initial_parallelism}) + "\\n")


    q = (spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).json(str(root / "in"))
         .writeStream.foreachBatch(run).option("checkpointLocation", str(root / "ck"))
         .trigger(processingTime="100 milliseconds").start())
    while not (root / "stop").exists():
        if q.exception() is not None:
            raise SystemExit(f"the query failed: {q.exception()}")
        time.sleep(0.1)
    q.stop()
    spark.stop()
''') % {"op": OP}


def frames() -> list[pd.DataFrame]:
    rng = np.random.default_rng(45)
    return [pd.DataFrame({"k": rng.integers(0, 10, ROWS), "v": rng.integers(0, 100, ROWS)})
            for _ in range(MAX_FILES)]


def oracle(fs: list[pd.DataFrame]) -> pd.DataFrame:
    """pandas, over all the files in order: per file, each of its keys with its running
    count and sum after it."""
    tot: dict[int, tuple[int, int]] = {}
    rows = []
    for pdf in fs:
        for k, g in pdf.groupby("k"):
            n, s = tot.get(int(k), (0, 0))
            tot[int(k)] = (n + len(g), s + int(g["v"].sum()))
            rows.append((int(k), *tot[int(k)]))
    return canon(pd.DataFrame(rows, columns=["k", "n", "s"]))


def canon(df: pd.DataFrame) -> pd.DataFrame:
    return df[["k", "n", "s"]].astype("int64").sort_values(["k", "n", "s"]).reset_index(drop=True)


class Driver:
    """The driver script as a process of its own group (its JVM included)."""

    def __init__(self, root: Path, cluster: dict, name: str) -> None:
        self.log = open(root / f"{name}.log", "w")
        self.path = root / f"{name}.log"
        self.p = subprocess.Popen([sys.executable, str(root / "driver.py"), cluster["coordinator"],
                                   str(cluster["secret_file"]), str(root), str(TESTS)],
                                  stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(10)
        self.log.close()

    def text(self) -> str:
        return self.path.read_text()


def reports(root: Path) -> list[dict]:
    f = root / "reports.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def write_file(root: Path, i: int, pdf: pd.DataFrame, base: float) -> None:
    """Input file i, with mtime base+i (the file source takes files in mtime order), renamed in."""
    tmp = root / f".in-{i:03d}.tmp"
    pdf.to_json(tmp, orient="records", lines=True)
    os.utime(tmp, (base + i, base + i))
    os.replace(tmp, root / "in" / f"part-{i:03d}.json")


def wait_for(cond, driver: Driver, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert driver.p.poll() is None, f"the driver exited ({driver.p.returncode}) waiting for {what}:\n" \
                                        f"{driver.text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{driver.text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["rescale", "autoscale", "coordinator"])
def test_a_query_reconfigured_live_then_killed_restarts_with_its_own_code(tmp_path, how):
    root = tmp_path
    (root / "in").mkdir()
    (root / "out").mkdir()
    (root / "driver.py").write_text(DRIVER)
    (root / "cluster").mkdir()
    fs = frames()
    base = time.time() - 10_000
    with rhino_cluster(root / "cluster", hosts=HOSTS) as cluster, \
            connect_coordinator(cluster["coordinator"], secret=cluster["secret"]) as cc:
        for i in range(2):
            write_file(root, i, fs[i], base)
        first = Driver(root, cluster, "driver-1")
        written = 2
        try:
            wait_for(lambda: {r["batch"] for r in reports(root)} >= {0, 1}, first, "batches 0 and 1")
            assert {r["parallelism"] for r in reports(root)} == {2}
            if how == "autoscale":
                # at least 3: the reports of two consecutive batches give it an input rate
                cc.autoscale(OP, enabled=True, min_parallelism=3, max_parallelism=3, cooldown_batches=0)
            else:
                cc.rescale(OP, 3)  # live: its step runs at the next batch's barrier
            while not any(r["parallelism"] == 3 for r in reports(root)):
                assert written < MAX_FILES - 2, f"no batch ran at 3 after {written} files: {reports(root)}"
                write_file(root, written, fs[written], base)
                written += 1
                wait_for(lambda: len(reports(root)) >= written, first, f"batch {written - 1}")
        finally:
            first.kill()  # SIGKILL, the JVM with it
        if how == "coordinator":
            cluster["coordinator_process"].kill()
            cluster["coordinator_process"].start()
        assert len(cc.placement(OP).instances) == 3
        seen = len(reports(root))

        total = written + 2
        for i in range(written, total):
            write_file(root, i, fs[i], base)
        second = Driver(root, cluster, "driver-2")
        try:
            wait_for(lambda: len(list((root / "out").glob("batch-*.json"))) >= total, second, "the rest of the input")
            (root / "stop").touch()
            try:
                second.p.wait(30)
            except subprocess.TimeoutExpired:
                pass  # killed below
        finally:
            second.kill()
        log = second.text()
        db = sqlite3.connect(f"file:{cluster['root'] / 'coordinator' / 'coordinator.db'}?mode=ro", uri=True)
        try:
            adopted = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind='operator_adopted'")]
            scaled = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind='autoscale_decision'")]
        finally:
            db.close()

    # the restarted driver adopted the coordinator's parallelism, and said so
    again = reports(root)[seen:]
    assert again and all((r["parallelism"], r["initial_parallelism"]) == (3, 2) for r in again), again
    assert adopted == [{"operator": OP, "asked_parallelism": 2, "parallelism": 3}], adopted
    assert "WARNING rhino.spark" in log and "runs at the coordinator's parallelism 3, not the code's 2" in log, log[-3000:]
    if how == "autoscale":  # the autoscaler's own decision did it
        assert any(d.get("action") == "scale_out" and d.get("to") == 3 for d in scaled), scaled
    # the whole output, read back as written: every row exactly once, as pandas computes it
    files = sorted((root / "out").glob("batch-*.json"))
    assert [int(f.stem.split("-")[1]) for f in files] == list(range(total))
    got = pd.concat([pd.read_json(f, orient="records", lines=True) for f in files], ignore_index=True)
    pd.testing.assert_frame_equal(canon(got), oracle(fs[:total]))
