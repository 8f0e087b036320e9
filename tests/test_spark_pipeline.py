"""``rhino.spark.Pipeline``: stages inserted into and removed from a running chain (issue 47,
part 2), with real streaming queries (Spark's file source, one file per micro-batch) on a
local[2] SparkSession against a ``rhino coordinator`` and three ``rhino worker`` processes on
127.0.0.226..228, one of each for the module.

Each request is asked from a thread of its own while batch b-1 runs (inside its
``foreachBatch`` function, after the chain ran), so it takes effect at batch b. Every
stage's output of every batch is read from the executors and compared with an oracle: the
same micro-batch inputs replayed through a plain-Python model of each stage, over the
chain as it was at each batch (an inserted stage sees only batches from its cut on, from
empty state or from its initial state; a re-inserted one goes on from its state at its
removal). Nothing expected comes from Rhino.

- An operator with an initial state inserted into a running two-stage chain at batch 2,
  whose first commit of that batch is refused (as after a failover): the batch runs again,
  and its initial state and inputs count once; then the chain replays batch 2 (as after a
  lost output), and they still count once; the chain's first stage removed at batch 4.
- A stage removed with its state kept at batch 2 and inserted again at batch 4 resumes its
  state across the gap; the other stage, removed at batch 5 with ``keep_state=False``, is
  gone at the coordinator.
- Bad requests are refused at once with ``InvalidArgumentError``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, Optional

import pytest

pyspark = pytest.importorskip("pyspark")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from pyspark.sql.streaming.stateful_processor import StatefulProcessor  # noqa: E402

import rhino  # noqa: E402
from rhino.coordinator.client import connect_coordinator  # noqa: E402

from spark_fixtures import RefuseFirstCommit, local_spark, rhino_cluster  # noqa: E402

from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = (226, 227, 228)  # 127.0.0.226..228: no other test module's workers (tests/test_test_hosts.py)
SCHEMA = "k long, v long"  # every stage's input and output: stages fit anywhere in the chain
KEYS = 6
ROWS = 24  # per micro-batch


class Sum(StatefulProcessor):
    """Per key: the running sum of ``v`` (from the initial state's ``init``, if any); one
    output row per key per batch with the sum after it."""

    def init(self, handle):
        self.s = handle.getValueState("s", "s long")

    def handleInitialState(self, key, initialState, timerValues):
        self.s.update((int(initialState["init"].sum()),))

    def handleInputRows(self, key, rows, timerValues):
        s = (self.s.get() or (0,))[0]
        for pdf in rows:
            s += int(pdf["v"].sum())
        self.s.update((s,))
        yield pd.DataFrame({"k": [int(key[0])], "v": [s]})

    def close(self):
        pass


class Count(StatefulProcessor):
    """Per key: how many rows it has seen; one output row per key per batch with the count."""

    def init(self, handle):
        self.n = handle.getValueState("n", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.n.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
        self.n.update((n,))
        yield pd.DataFrame({"k": [int(key[0])], "v": [n]})

    def close(self):
        pass


# ---- the oracle: each stage in plain Python ----------------------------------------------------

def model_sum(state: dict[int, int], rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    for k, g in rows.groupby("k"):
        state[int(k)] = state.get(int(k), 0) + int(g["v"].sum())
        out.append((int(k), state[int(k)]))
    return canon(pd.DataFrame(out, columns=["k", "v"]))


def model_count(state: dict[int, int], rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    for k, g in rows.groupby("k"):
        state[int(k)] = state.get(int(k), 0) + len(g)
        out.append((int(k), state[int(k)]))
    return canon(pd.DataFrame(out, columns=["k", "v"]))


MODELS: dict[str, Callable[[dict, pd.DataFrame], pd.DataFrame]] = {"Sum": model_sum, "Count": model_count}


def oracle(inputs: list[pd.DataFrame], chains: dict[int, list[tuple[str, str]]],
           initial: Optional[dict[str, dict[int, int]]] = None) -> dict[tuple[str, int], pd.DataFrame]:
    """Each stage's output per batch: ``chains[b]`` is the chain at batch b, as (stage name,
    model) pairs; a stage's state lives from its first batch on (from ``initial[name]`` if
    given), and is kept across the batches it does not run in."""
    states: dict[str, dict[int, int]] = {}
    out: dict[tuple[str, int], pd.DataFrame] = {}
    for b, rows in enumerate(inputs):
        cur = rows
        for name, model in chains[b]:
            st = states.setdefault(name, dict((initial or {}).get(name, {})))
            cur = out[(name, b)] = MODELS[model](st, cur)
    return out


def canon(df: pd.DataFrame) -> pd.DataFrame:
    return df[["k", "v"]].astype("int64").sort_values(["k", "v"]).reset_index(drop=True)


# ---- the cluster, Spark, the inputs ------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with rhino_cluster(tmp_path_factory.mktemp("pipeline"), hosts=HOSTS) as c:
        yield c


@pytest.fixture(scope="module")
def spark():
    s = local_spark("rhino-test-pipeline", partitions=2)
    yield s
    s.stop()


def make_inputs(src, n: int, seed: int) -> list[pd.DataFrame]:
    """``n`` parquet files, one per micro-batch, in mtime order (the file source's)."""
    src.mkdir()
    rng = np.random.default_rng(seed)
    out = []
    base = time.time() - 100
    for b in range(n):
        pdf = pd.DataFrame({"k": rng.integers(0, KEYS, ROWS), "v": rng.integers(1, 10, ROWS)})
        f = src / f"part-{b:03d}.parquet"
        pdf.to_parquet(f, index=False)
        os.utime(f, (base + b, base + b))
        out.append(pdf)
    return out


def make_op(cluster, processor: Any, name: str, **kw: Any) -> Any:
    return rhino.spark.transform_with_state(processor, key="k", output_schema=SCHEMA, operator_id=name,
                                            coordinator=cluster["coordinator"],
                                            secret_file=str(cluster["secret_file"]), parallelism=2, replicas=1,
                                            locality=False, **kw)


class Run:
    """A streaming query whose ``foreachBatch`` runs ``pipe`` (twice for the batches in
    ``rerun``), reads every stage's output of the batch, and then, if ``requests`` has one
    for the next batch, asks for it from a thread of its own (the batch still running)."""

    def __init__(self, spark, pipe: Any, src, ck, requests: dict[int, Callable[[], Any]],
                 use_for_each_batch: bool = False, rerun: tuple[int, ...] = ()) -> None:
        self.pipe, self.requests = pipe, requests
        self.got: dict[tuple[str, int], pd.DataFrame] = {}
        self.chains: dict[int, list[str]] = {}
        self.asked: dict[int, Any] = {}

        def after(df_out, b: int) -> None:
            self.chains[b] = list(pipe.names)
            for op in pipe.stages:
                self.got[(op.config.name, b)] = canon(op.last_output.toPandas())
            ask = requests.get(b + 1)
            if ask is not None:
                t = threading.Thread(target=lambda: self.asked.__setitem__(b + 1, ask()), name=f"ask-{b + 1}")
                t.start()
                t.join()

        if use_for_each_batch:
            fn = pipe.for_each_batch(after)
        else:
            def fn(df, b):
                out = pipe.transform(df, b)
                if b in rerun:
                    # the chain runs the batch again, as for_each_batch does when its output
                    # was lost: every stage replays b (its sessions roll back to what b was
                    # built on), the output read is the replay's
                    out = pipe.transform(df, b)
                after(out, b)

        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
        q = (stream.writeStream.foreachBatch(fn).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
        q.awaitTermination(240)
        if q.exception() is not None:
            raise AssertionError(f"the query failed: {q.exception()}")


def check(run: Run, want: dict[tuple[str, int], pd.DataFrame]) -> None:
    assert sorted(run.got) == sorted(want), (sorted(run.got), sorted(want))
    for key in sorted(want):
        pd.testing.assert_frame_equal(run.got[key], want[key], obj=f"stage {key[0]} batch {key[1]}")


# ---- the tests ---------------------------------------------------------------------------------

def test_an_operator_inserted_with_its_initial_state_and_one_removed_equal_the_oracle(cluster, spark, tmp_path):
    """Chain sum1 -> count; at batch 2 sum2 (initial state: keys 0, 1 and 9) is inserted after
    sum1, and its first commit of batch 2 is refused (the batch runs again from empty state:
    its initial state and its rows count once); then the whole chain runs batch 2 again
    (a replay: sum2's first batch rolls back to no version); at batch 4 sum1 is removed, so
    sum2 reads the raw input. Batches 0..5."""
    from rhino.spark import Pipeline

    inputs = make_inputs(tmp_path / "src", 6, seed=47)
    init = pd.DataFrame({"k": [0, 1, 1, 9], "init": [100, 20, 30, 900]})
    sum1, count = make_op(cluster, Sum(), "p1-sum1"), make_op(cluster, Count(), "p1-count")
    sum2 = make_op(cluster, Sum(), "p1-sum2", initial_state=spark.createDataFrame(init))
    sum2.control.client = RefuseFirstCommit(sum2.coordinator(), 2)
    pipe = Pipeline([sum1, count])
    run = Run(spark, pipe, tmp_path / "src", tmp_path / "ck",
              {2: lambda: pipe.insert(sum2, after="p1-sum1"), 4: lambda: pipe.remove("p1-sum1")}, rerun=(2,))

    ins, rem = run.asked[2], run.asked[4]
    assert (ins.wait(0), rem.wait(0)) == (2, 4) and pipe.modifications == [ins, rem]
    assert run.chains == {0: ["p1-sum1", "p1-count"], 1: ["p1-sum1", "p1-count"],
                          2: ["p1-sum1", "p1-sum2", "p1-count"], 3: ["p1-sum1", "p1-sum2", "p1-count"],
                          4: ["p1-sum2", "p1-count"], 5: ["p1-sum2", "p1-count"]}
    # the inserted stage's first batch ran twice (its first commit refused), from empty state
    assert sum2.control.client.refused == 1
    assert [(r.batch, r.attempts) for r in sum2.reports][:3] == [(2, 2), (2, 1), (3, 1)]
    chains = {b: [(n, "Count" if n.endswith("count") else "Sum") for n in names]
              for b, names in run.chains.items()}
    initial = {"p1-sum2": {k: int(g["init"].sum()) for k, g in init.groupby("k")}}
    check(run, oracle(inputs, chains, initial))
    with connect_coordinator(cluster["coordinator"], secret=cluster["secret"]) as cc:
        # the removed stage's state is kept, at its last batch
        assert cc.placement("p1-sum1").last_batch == 3 and cc.placement("p1-sum2").last_batch == 5


def test_a_stage_removed_with_its_state_kept_resumes_it_and_one_dropped_is_gone(cluster, spark, tmp_path):
    """Chain sumA -> sumB through ``for_each_batch``: sumB removed at batch 2 (state kept),
    inserted again at batch 4 (the same object): it resumes its state of batch 1 across the
    gap; sumA removed at batch 5 with ``keep_state=False``: dropped at the coordinator, and
    sumB reads the raw input. Batches 0..5."""
    from rhino.spark import Pipeline

    inputs = make_inputs(tmp_path / "src", 6, seed=2047)
    sum_a, sum_b = make_op(cluster, Sum(), "p2-sumA"), make_op(cluster, Sum(), "p2-sumB")
    admin = connect_coordinator(cluster["coordinator"], secret=cluster["secret"])  # the root secret: admin
    pipe = Pipeline([sum_a, sum_b], admin=admin)
    run = Run(spark, pipe, tmp_path / "src", tmp_path / "ck",
              {2: lambda: pipe.remove("p2-sumB"), 4: lambda: pipe.insert(sum_b, after="p2-sumA"),
               5: lambda: pipe.remove("p2-sumA", keep_state=False)}, use_for_each_batch=True)

    assert [(m.kind, m.stage, m.wait(0)) for m in pipe.modifications] == [
        ("remove", "p2-sumB", 2), ("insert", "p2-sumB", 4), ("remove", "p2-sumA", 5)]
    assert run.chains == {0: ["p2-sumA", "p2-sumB"], 1: ["p2-sumA", "p2-sumB"], 2: ["p2-sumA"], 3: ["p2-sumA"],
                          4: ["p2-sumA", "p2-sumB"], 5: ["p2-sumB"]}
    check(run, oracle(inputs, {b: [(n, "Sum") for n in names] for b, names in run.chains.items()}))
    with admin:
        with pytest.raises(rhino.UnknownInstanceError):
            admin.placement("p2-sumA")
        assert "p2-sumA" not in {o["operator_id"] for o in admin.status()["operators"]}
        assert admin.placement("p2-sumB").last_batch == 5


def test_bad_requests_are_refused_at_once(cluster):
    from rhino.errors import InvalidArgumentError
    from rhino.spark import Pipeline

    a, b, c = (make_op(cluster, Sum(), f"p3-{n}") for n in "abc")
    with pytest.raises(InvalidArgumentError, match="at least one stage"):
        Pipeline([])
    with pytest.raises(InvalidArgumentError, match="two stages are named 'p3-a'"):
        Pipeline([a, make_op(cluster, Count(), "p3-a")])
    pipe = Pipeline([a, b])
    with pytest.raises(InvalidArgumentError, match="keep_state=False drops its operator .* admin role"):
        pipe.remove("p3-a", keep_state=False)
    with pytest.raises(InvalidArgumentError, match="no stage 'nope' to remove"):
        pipe.remove("nope")
    with pytest.raises(InvalidArgumentError, match="no stage 'nope' to insert 'p3-c' after"):
        pipe.insert(c, after="nope")
    with pytest.raises(InvalidArgumentError, match="a stage named 'p3-b' is already in the pipeline"):
        pipe.insert(b)
    with pytest.raises(InvalidArgumentError, match="not function"):
        pipe.insert(lambda df, b: df)
    pipe.remove("p3-a")  # checked against the chain as the requests asked leave it
    with pytest.raises(InvalidArgumentError, match="'p3-b' is the pipeline's last stage"):
        pipe.remove("p3-b")
    with pytest.raises(InvalidArgumentError, match="no stage 'p3-a' to insert 'p3-c' after"):
        pipe.insert(c, after="p3-a")
    m = pipe.insert(c)
    assert [x.describe() for x in pipe.modifications] == ["remove 'p3-a' (state kept)", "insert 'p3-c' at the front"]
    assert pipe.names == ["p3-a", "p3-b"] and not m.done()  # nothing applies before a batch
    with pytest.raises(TimeoutError, match="not applied within 0.01 s"):
        m.wait(0.01)
