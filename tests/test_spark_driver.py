"""The driver's stages (``rhino.spark.driver``), one at a time, with no Spark running:
the operator's config and its checks, the watermark rule and its file, the report ring,
the action runner that abandons a cancelled attempt, and the failure helpers. The whole
pipeline runs against real Spark in test_spark_operator.py and the other test_spark_*."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from rhino.engine import Action, checkpoint_blocks_lost, classify_job_failure, first_error_line
from rhino.errors import InvalidArgumentError, RhinoError, StaleEpochError
from rhino.spark.driver.config import OperatorConfig, parse_delay_ms
from rhino.spark.driver.report import BatchReport, ReportRing
from rhino.spark.driver.sink import SinkRunner
from rhino.spark.driver.watermark import KEPT_BATCHES, KEPT_FILES, LocalFiles, Watermarks
from rhino.spark.errors import InputLostError, output_lost

SCHEMA = object()  # any non-string schema passes through unparsed (a DDL string needs a JVM)


class _Processor:
    """A processor as the config sees one: an object with attributes (its code version is a
    fingerprint of its class and of them: driver/code_version.py), never called here."""


def config(**kw):
    base = dict(key="k", output_schema=SCHEMA, operator_id="op", coordinator="127.0.0.1:1", secret=b"s" * 32)
    base.update(kw)
    return OperatorConfig.of(_Processor(), **base)


# ---- OperatorConfig -------------------------------------------------------------------------

def test_the_config_is_frozen_normalized_and_never_shows_its_secret():
    c = config(key=["a", "b"], time_mode="EventTime", event_time="ts", watermark_delay="10 seconds", parallelism=3,
               checkpoint_location="file:///tmp/ck")
    assert c.key_columns == ("a", "b") and c.keys == ["a", "b"] and c.keys is not c.keys  # a fresh list each time
    assert (c.time_mode, c.delay_ms, c.num_vnodes) == ("eventtime", 10_000, 64)
    assert config(parallelism=8).num_vnodes == 128  # 16 per instance, at least 64
    with pytest.raises(AttributeError):
        c.parallelism = 4  # type: ignore[misc]
    assert "sss" not in repr(c) and "op" in repr(c)


@pytest.mark.parametrize("kw, match", [
    (dict(operator_id=""), "operator_id"),
    (dict(mode="arrow"), "mode must be"),
    (dict(time_mode="wall"), "time_mode must be"),
    (dict(time_mode="EventTime"), "needs event_time"),
    (dict(time_mode="EventTime", event_time="ts"), "needs checkpoint_location"),
    (dict(namespace="a.b"), "namespace"),
    (dict(operator_id="a..b"), "must not contain '..'"),
    (dict(task_window_rows=0), "task_window_rows"),
    (dict(task_window_rows=True), "task_window_rows"),
    (dict(input_copies=4), "input_copies must be an int in 1..3"),
    (dict(input_copies=0), "input_copies must be an int in 1..3"),
    (dict(parallelism=0), "parallelism"),
    (dict(replicas=-1), "replicas"),
    (dict(secret=None), "secret= or secret_file="),
    (dict(tls={"cert": "x"}), "rhino.TLS"),
    (dict(key=[]), "at least one column"),
    (dict(watermark_delay="soon"), "watermark delay"),
    (dict(watermark_delay=-1), "watermark delay"),
])
def test_a_bad_argument_is_refused_by_name(kw, match):
    with pytest.raises(InvalidArgumentError, match=match):
        config(**kw)


def test_input_copies_default_to_two_wherever_a_copy_has_somewhere_to_go():
    """The default (None) keeps two copies of a batch's input while the application has
    two executors or more (issue 45: the default recovers as the benchmark does), one
    otherwise; an explicit count is kept as given."""
    from rhino.spark.driver.routing import auto_input_copies

    assert config().input_copies is None and config(input_copies=1).input_copies == 1

    class Tracker:
        def __init__(self, n):
            self.n = n

        def getExecutorInfos(self):
            if self.n is None:
                raise RuntimeError("SparkContext is stopping")
            return [object()] * self.n  # the driver, then each executor

    class SC:
        def __init__(self, n):
            tracker = Tracker(n)
            self._jsc = type("J", (), {"sc": lambda _self: type("S", (), {"statusTracker": lambda _s: tracker})()})()

    assert [auto_input_copies(SC(n)) for n in (1, 2, 3, 9)] == [1, 1, 2, 2]
    assert auto_input_copies(SC(None)) == 1  # nothing known: no copy rather than a failed batch


def test_the_secret_can_come_from_a_file(tmp_path):
    from rhino.credential import Credential, write_credential_file

    f = tmp_path / "secret"
    f.write_bytes(b"x" * 32 + b"\n")
    assert config(secret=None, secret_file=str(f)).secret == Credential.task(b"x" * 32)
    cred = tmp_path / "job.credential"
    write_credential_file(cred, Credential.task(b"x" * 32, "jobA"))
    assert config(secret=None, secret_file=str(cred), namespace="jobA").secret == Credential.task(b"x" * 32, "jobA")


def test_tasks_get_the_jobs_task_credential_never_the_root():
    """Issue 46: what the executors receive (the pickled config) holds the task key of the
    operator's namespace only; the root secret never leaves the driver."""
    import pickle

    from rhino.credential import Credential

    root = b"R" * 32
    c = config(secret=root, namespace="jobA")
    assert c.secret == Credential.task(root, "jobA") and c.operator_id == "jobA..op"
    shipped = pickle.dumps(c)
    assert root not in shipped and c.secret.key in shipped
    assert config(secret=root).secret == Credential.task(root)  # the default namespace: scope ""
    with pytest.raises(InvalidArgumentError, match="not the task credential of namespace 'jobA'"):
        config(secret=Credential.task(root, "jobB"), namespace="jobA")
    with pytest.raises(InvalidArgumentError, match="task credential"):
        config(secret=Credential.derive(root, "admin"))  # an admin key would be shipped to every task


def test_delays_parse_as_spark_writes_them():
    assert [parse_delay_ms(d) for d in ("500 ms", "10 seconds", "2 min", "1 hour", 250)] == [
        500, 10_000, 120_000, 3_600_000, 250]


# ---- the watermark --------------------------------------------------------------------------

def test_the_watermark_is_the_max_event_time_through_the_previous_batch_minus_the_delay(tmp_path):
    w = Watermarks("op", 1000, LocalFiles(str(tmp_path)))
    assert w.for_batch(0) == 0  # before any event
    w.committed(0, [5000, None, 7000])
    assert w.for_batch(1) == 6000
    w.committed(1, [3000])  # an older event does not move it back
    assert w.for_batch(2) == 6000
    w.committed(2, [None])  # a batch with no events keeps it
    assert w.for_batch(3) == 6000 and w.for_batch(1) == 6000 and w.for_batch(0) == 0
    # a restarted driver reads the same watermarks back, for a replay of batch 2 too
    again = Watermarks("op", 1000, LocalFiles(str(tmp_path)))
    assert [again.for_batch(b) for b in range(4)] == [0, 6000, 6000, 6000]
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_watermark_files_keep_only_the_last_batches(tmp_path):
    w = Watermarks("op", 0, LocalFiles(str(tmp_path)))
    for b in range(KEPT_BATCHES + 10):
        w.committed(b, [b * 10])
    files = sorted(p.name for p in (tmp_path / "rhino-op").iterdir())
    last = KEPT_BATCHES + 9
    assert files == [f"watermark-{b:020d}.json" for b in range(last - KEPT_FILES, last + 1)]
    kept = json.loads((tmp_path / "rhino-op" / files[-1]).read_text())
    assert sorted(int(b) for b in kept) == list(range(10, KEPT_BATCHES + 10))
    assert Watermarks("op", 0, LocalFiles(str(tmp_path))).for_batch(KEPT_BATCHES + 10) == last * 10


def test_a_watermark_file_cut_short_leaves_the_one_before_in_charge(tmp_path):
    w = Watermarks("op", 0, LocalFiles(str(tmp_path)))
    w.committed(0, [100])
    w.committed(1, [200])
    (tmp_path / "rhino-op" / f"watermark-{1:020d}.json").write_text('{"0": 10')  # a driver killed mid-write
    assert Watermarks("op", 0, LocalFiles(str(tmp_path))).for_batch(1) == 100


def test_the_watermark_file_of_before_is_read_when_there_is_no_newer_one(tmp_path):
    (tmp_path / "rhino-op-watermark.json").write_text(json.dumps({"3": 5000}))
    assert Watermarks("op", 1000, LocalFiles(str(tmp_path))).for_batch(4) == 4000


def test_files_of_batches_after_the_operators_last_are_of_a_dropped_life_and_go(tmp_path):
    """An operator dropped (rhino drop) and started over with the same checkpoint location:
    its old life's files (batches 0..5) must not be taken as the newest in the new one."""
    old = Watermarks("op", 0, LocalFiles(str(tmp_path)))
    for b in range(6):
        old.committed(b, [1000 * (b + 1)])
    (tmp_path / "rhino-op-watermark.json").write_text(json.dumps({"9": 99000}))  # and the file of before
    fresh = Watermarks("op", 0, LocalFiles(str(tmp_path)), last_batch=None)  # the new life: no batch yet
    assert fresh.for_batch(0) == 0 and fresh.for_batch(3) == 0
    assert not list((tmp_path / "rhino-op").iterdir()) and not (tmp_path / "rhino-op-watermark.json").exists()
    fresh.committed(0, [50])
    fresh.committed(1, [70])
    # a restart after the new life's batch 1 (the old life's files of 4 and 5 are gone)
    again = Watermarks("op", 0, LocalFiles(str(tmp_path)), last_batch=1)
    assert [again.for_batch(b) for b in range(3)] == [0, 50, 70]
    # and an operator committed through batch 3 forgets a file of batch 5 (its entries too)
    for b in range(6):
        old.committed(b, [1000 * (b + 1)])
    cut = Watermarks("op", 0, LocalFiles(str(tmp_path)), last_batch=3)
    assert cut.for_batch(4) == 4000 and cut.for_batch(6) == 4000
    assert max(int(p.name[10:30]) for p in (tmp_path / "rhino-op").iterdir()) == 3


def test_without_a_checkpoint_location_the_watermark_lives_in_memory(tmp_path):
    w = Watermarks("op", 0, None)
    w.committed(0, [42])
    assert w.files is None and w.for_batch(1) == 42


# ---- reports --------------------------------------------------------------------------------

def report(b: int) -> BatchReport:
    return BatchReport(batch=b, epoch=1, attempts=1, watermark_ms=0, rows_out=b, started=0.0, ended=1.0,
                       begin_s=0.0, job_s=0.0, commit_s=0.0)


def test_the_report_ring_is_bounded_and_logs_every_report_in_full(caplog):
    ring = ReportRing("op", kept=3)
    with caplog.at_level(logging.INFO, logger="rhino.spark.reports"):
        for b in range(5):
            ring.append(report(b))
    assert [r.batch for r in ring] == [2, 3, 4] and ring[0].batch == 2 and ring[-1].batch == 4
    assert [r.batch for r in ring[1:]] == [3, 4]
    logged = [json.loads(r.getMessage()) for r in caplog.records]
    assert [(d["operator"], d["batch"], d["rows_out"]) for d in logged] == [("op", b, b) for b in range(5)]


def test_a_driver_adopts_the_coordinators_parallelism_and_says_so(caplog):
    """Issue 45: the config's parallelism is the initial one; the coordinator's current
    instance count is what the driver runs at, in a warning and in each report."""
    from types import SimpleNamespace

    from rhino.spark.driver.control import Control

    class Coordinator:  # an operator rescaled 2 -> 3 since (instance 2 retired, 3 new)
        def create_operator(self, operator_id, **kw):
            self.asked = kw
            return SimpleNamespace(instances={0: None, 1: None, 3: None}, last_batch=None)

    ctl = Control(config(parallelism=2))
    ctl.client = Coordinator()
    ctl._register = lambda c, b, start: {"variables": {}}  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="rhino.spark"):
        assert ctl.ensure_created(None) == {"variables": {}}
    assert ctl.parallelism == 3 and ctl.client.asked["parallelism"] == 2
    assert "runs at the coordinator's parallelism 3, not the code's 2" in caplog.text
    r = report(0)
    assert r.parallelism is None and not r.parallelism_adopted
    r.parallelism, r.initial_parallelism = 3, 2
    assert r.parallelism_adopted
    same = Control(config(parallelism=3))
    same.client, same._register = Coordinator(), lambda c, b, start: {}  # type: ignore[method-assign]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rhino.spark"):
        same.ensure_created(None)
    assert same.parallelism == 3 and not caplog.records


# ---- the action runner ----------------------------------------------------------------------

class Watch:
    tag = "rhino-op-7-1"

    def __init__(self) -> None:
        self.settled = threading.Event()
        self.cancelled = False


class Context:  # the job tags of the thread that runs the action
    def __init__(self) -> None:
        self.tags: dict[str, set] = {}

    def addJobTag(self, tag: str) -> None:
        self.tags.setdefault(threading.current_thread().name, set()).add(tag)

    def removeJobTag(self, tag: str) -> None:
        self.tags[threading.current_thread().name].discard(tag)


def test_an_action_runs_under_the_watch_tag_and_its_error_comes_back_as_itself():
    runner, sc, seen = SinkRunner("op"), Context(), []
    assert runner.act(sc, lambda: 42, None) == 42 and not sc.tags  # no watch: no thread, no tag
    assert runner.act(sc, lambda: seen.append({k: set(v) for k, v in sc.tags.items()}) or 43, Watch()) == 43
    # the action ran in its own thread, under the watch's tag, taken back after
    assert seen == [{"rhino-action-op": {"rhino-op-7-1"}}] and sc.tags == {"rhino-action-op": set()}
    with pytest.raises(ValueError, match="bad"):
        runner.act(sc, lambda: (_ for _ in ()).throw(ValueError("bad")), Watch())


def test_an_action_is_abandoned_once_the_watch_settles_and_a_sink_call_is_kept():
    runner, sc = SinkRunner("op"), Context()
    release, w = threading.Event(), Watch()
    threading.Timer(0.1, w.settled.set).start()
    t0 = time.monotonic()
    with pytest.raises(RhinoError, match="not waiting for its Spark job"):
        runner.act(sc, lambda: release.wait(10), w)  # a cancelled job whose error is slow to come back
    assert time.monotonic() - t0 < 2.0
    assert runner.unwinding is None  # no user code in it: nothing to wait for
    release.set()
    # an abandoned sink call is kept: the rerun does not call the sink before it has returned
    unwound, w = threading.Event(), Watch()
    threading.Timer(0.1, w.settled.set).start()
    with pytest.raises(RhinoError, match="not waiting for its Spark job"):
        runner.act(sc, lambda: unwound.wait(10), w, user_code=True)
    assert runner.unwinding is not None and runner.unwinding.is_alive()
    unwound.set()
    runner.unwinding.join(5)
    assert not runner.unwinding.is_alive()


def test_the_unwatched_fused_sink_completes_the_tasks_it_did_not_read():
    class Result:  # the stateful stage's lazy output
        def __init__(self) -> None:
            self.completed = 0
            self.write = self

        def format(self, f):
            assert f == "noop"
            return self

        def mode(self, m):
            return self

        def save(self):
            self.completed += 1

    calls: list = []
    for complete, extra_jobs in ((True, 0), (False, 1)):
        r = Result()
        SinkRunner("op").run(None, lambda df, b: calls.append(b), r, 7, 1, lambda: complete, None)
        assert r.completed == extra_jobs
    assert calls == [7, 7]


# ---- failures -------------------------------------------------------------------------------

TRACEBACK = ("Job aborted due to stage failure: Task 0 failed 4 times\nTraceback (most recent call last):\n"
             "  File \"task.py\", line 1, in run_partition\nrhino.errors.StaleEpochError: epoch 3 < 4\n")


def test_failure_helpers_read_spark_s_error_text():
    class Py4JJavaError(Exception):  # a py4j error: classified by the text it carries
        pass

    Py4JJavaError.__module__ = "py4j.protocol"
    assert classify_job_failure(Py4JJavaError(TRACEBACK)) is Action.RERUN
    assert classify_job_failure(Py4JJavaError("Job 3 cancelled because SparkContext was shut down")) is Action.RAISE
    # the driver's own exception: by its class, whatever its text says
    assert classify_job_failure(ValueError(TRACEBACK)) is Action.RAISE
    assert classify_job_failure(StaleEpochError("x")) is Action.RERUN
    assert first_error_line(TRACEBACK) == "rhino.errors.StaleEpochError: epoch 3 < 4"
    assert checkpoint_blocks_lost("[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_7_1 not found!")
    assert not checkpoint_blocks_lost(TRACEBACK)
    assert output_lost(InputLostError("upstream")) and not output_lost(ValueError("x"))


def test_a_first_batch_that_does_not_follow_the_operators_is_refused_naming_rhino_drop():
    """Issue 45: a fresh Spark checkpoint (batch 0) on an operator with state through batch 5
    is refused before anything runs; the next batch and a replay of the last one are not."""
    from rhino.spark.driver.batch import check_start
    from rhino.spark.errors import FreshCheckpointError

    c = config(operator_id="counts", namespace="jobA")
    assert c.operator_id == "jobA..counts" and (c.name, c.namespace) == ("counts", "jobA")
    for last, b in ((None, 0), (5, 5), (5, 6)):
        check_start(c, last, b)
    with pytest.raises(FreshCheckpointError, match=r"state through batch 5, but this query starts at batch 0.*"
                                                   r"rhino drop counts --namespace jobA"):
        check_start(c, 5, 0)
    with pytest.raises(InvalidArgumentError, match="ahead of the operator's state"):
        check_start(c, 5, 9)
    with pytest.raises(InvalidArgumentError, match="no committed batch, but this query starts at batch 3"):
        check_start(config(), None, 3)


def test_only_an_explicit_start_may_begin_after_a_gap_or_at_b_above_0():
    """Issue 47: an operator explicitly started at b (a stage inserted into a running
    Pipeline: ``start_at``) may begin there with no committed batch, or after a gap; not at
    a batch its state is past, and no other batch than the one it was started at."""
    from rhino.spark.driver.batch import check_start
    from rhino.spark.errors import FreshCheckpointError

    c = config(operator_id="sums")
    for last, b in ((None, 3), (1, 4), (1, 2), (4, 4)):
        check_start(c, last, b, start=b)
    for last, b, start, msg in ((None, 3, None, "no committed batch, but this query starts at batch 3"),
                                (1, 4, None, "state through batch 1, but this query starts at batch 4"),
                                (1, 4, 5, "state through batch 1, but this query starts at batch 4"),
                                (6, 4, 4, "state through batch 6, but this query starts at batch 4")):
        with pytest.raises(FreshCheckpointError, match=msg) as e:
            check_start(c, last, b, start=start)
        if b > (last or 0):
            assert f"explicitly started at batch {b}" in str(e.value) and "Pipeline" in str(e.value)
