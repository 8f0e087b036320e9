"""Unit tests of the micro-batch engine (rhino.engine): its classification table,
the driver's reading of a failed Spark job's text, the per-vnode load, the batch
loop (against a recording stand-in for the coordinator: a unit test of one
component), and the instance run's unreachable-primary path against a real
worker and a real closed port."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import numpy as np
import pytest

import rhino
from placements import instance, placement
from rhino import errors as E
from rhino.coordinator.types import BatchTime, CommitAnswer, Placement
from rhino.engine import (Action, AttemptResult, BatchDriver, InstanceRun, RerunBatch, WorkerClients, classify,
                          classify_failure, classify_name, failure_class_name, vnode_load)

TABLE = [
    (E.StaleEpochError, Action.RERUN),
    (E.StaleChainVersionError, Action.RERUN),
    (E.UnknownInstanceError, Action.RERUN),
    (E.SessionBusyError, Action.RETRY),
    (E.PeerDeadError, Action.FAILOVER),
    (E.AbortedError, Action.FAILOVER),
    (E.RhinoTimeoutError, Action.FAILOVER),
    (E.RhinoIOError, Action.FAILOVER),
    (ConnectionResetError, Action.FAILOVER),
    (ConnectionRefusedError, Action.FAILOVER),
    (BrokenPipeError, Action.FAILOVER),
    (socket.timeout, Action.FAILOVER),
    # real errors: each of these is an OSError, once taken for an unreachable worker
    (E.NoSpaceError, Action.RAISE),
    (E.CorruptionError, Action.RAISE),
    (E.AuthFailedError, Action.RAISE),
    (E.NotFoundError, Action.RAISE),
    (E.AlreadyExistsError, Action.RAISE),
    (E.InvalidArgumentError, Action.RAISE),
    (E.BusyError, Action.RAISE),
    (E.ResourceExhaustedError, Action.RETRY),
    (E.UnknownVnodeError, Action.RAISE),
    (E.KeyTypeError, Action.RAISE),
    (E.PathOutsideStoreError, Action.RAISE),
    (E.RhinoError, Action.RAISE),
    (OSError, Action.RAISE),
    (FileNotFoundError, Action.RAISE),
    (PermissionError, Action.RAISE),
    (ValueError, Action.RAISE),
]


@pytest.mark.parametrize("cls,action", TABLE, ids=[c.__name__ for c, _ in TABLE])
def test_the_classification_table(cls, action):
    assert classify(cls) is action
    assert classify(cls("x")) is action
    assert classify_name(cls.__name__) is action
    if cls.__module__ == "rhino.errors":
        assert classify_name(f"rhino.errors.{cls.__name__}") is action


def test_every_rhino_error_is_classified_and_the_os_errors_among_them_are_raised():
    for name in E.__all__:
        cls = getattr(E, name)
        assert classify_name(f"rhino.errors.{name}") is classify(cls)
        if issubclass(cls, OSError) and not issubclass(cls, (ConnectionError, TimeoutError)) \
                and cls is not E.RhinoIOError:
            assert classify(cls) is Action.RAISE, name


def test_names_that_are_neither_rhino_nor_builtin_are_unknown():
    assert classify_name("pyarrow.lib.ArrowInvalid") is None
    assert classify_name("rhino.spark.Something") is None
    assert classify_name("NoSuchError") is None
    assert classify_name("mypackage.ValueError") is None


def _spark_text(*tracebacks: str) -> str:
    """The shape of the error text Spark raises on the driver for a failed Python task."""
    py = "\n\nDuring handling of the above exception, another exception occurred:\n\n".join(
        "Traceback (most recent call last):\n  File \"/x/task.py\", line 1, in run_partition\n"
        "    out = run()\n          ^^^^^\n" + tb for tb in tracebacks)
    return ("An error occurred while calling o123.collectAsArrowToPython.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 5.0 failed 1 "
            "times, most recent failure: Lost task 0.0 in stage 5.0 (TID 9) (192.0.2.2 executor driver): "
            "org.apache.spark.api.python.PythonException: " + py + "\n SQLSTATE: 38000\n"
            "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x.scala:1)\n"
            "Caused by: java.io.IOException: Connection reset\n\tat x.y(z.java:1)\n")


@pytest.mark.parametrize("last,action", [
    ("rhino.errors.CorruptionError: checkpoint 0: manifest trailer checksum mismatch", Action.RAISE),
    ("rhino.errors.AuthFailedError: authentication failed", Action.RAISE),
    ("rhino.errors.NoSpaceError: IO error: No space left on device", Action.RAISE),
    ("rhino.errors.NotFoundError: batch 3 of op/0 needs checkpoint 2", Action.RAISE),
    ("ValueError: the processor's output lacks columns ['x']", Action.RAISE),
    ("pyarrow.lib.ArrowInvalid: bad", Action.RAISE),
    ("rhino.errors.StaleEpochError: epoch 3 < 4", Action.RERUN),
    ("rhino.errors.SessionBusyError: op/0 already has an open session", Action.RETRY),
    ("rhino.errors.PeerDeadError: cannot connect to 127.0.0.3:4000", Action.FAILOVER),
    ("rhino.errors.RhinoTimeoutError: no new placement after 60 s", Action.FAILOVER),
    ("ConnectionResetError: [Errno 104] Connection reset by peer", Action.FAILOVER),
])
def test_a_failed_jobs_text_is_classified_by_the_tasks_exception(last, action):
    text = _spark_text(last)
    assert failure_class_name(text) == last.split(":")[0]
    assert classify_failure(text) is action


def test_the_last_exception_of_a_chained_traceback_decides():
    # "executor driver" and "Lost task" are in every task failure: they are not a lost executor
    text = _spark_text("rhino.errors.PeerDeadError: connection closed", "ValueError: boom\nwith a second line")
    assert failure_class_name(text) == "ValueError"
    assert classify_failure(text) is Action.RAISE
    text = _spark_text("ValueError: boom", "rhino.errors.StaleEpochError: fenced")
    assert classify_failure(text) is Action.RERUN


def test_a_failure_without_a_python_traceback_is_spark_machinery_and_runs_again():
    text = ("Job aborted due to stage failure: Task 1 in stage 3.0 failed 4 times, most recent failure: Lost task "
            "1.3 in stage 3.0 (TID 17) (10.0.0.3 executor 2): ExecutorLostFailure (executor 2 exited caused by one "
            "of the running tasks) Reason: Remote RPC client disassociated.")
    assert failure_class_name(text) is None
    assert classify_failure(text) is Action.RERUN
    assert classify_failure("org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)") \
        is Action.RERUN
    assert classify_failure("UnsupportedFeatureError: ...") is Action.RAISE
    assert classify_failure("org.apache.spark.SparkException: Job 7 cancelled part of cancelled job group q") \
        is Action.RAISE
    assert classify_failure("Job 7 cancelled because SparkContext was shut down") is Action.RAISE


def test_vnode_load():
    assert vnode_load([], 8) == {}
    assert vnode_load([3, 1, 3, 3], 8) == {"1": [1.0, 0.0], "3": [3.0, 0.0]}
    assert vnode_load(np.array([3, 1, 3]), 8, ops=[2, 5, 1], nbytes=[10, 20, 30]) == \
        {"1": [5.0, 20.0], "3": [3.0, 40.0]}


class RecordingCoordinator:
    """Answers begin_batch and commit_batch as the coordinator does, and records them;
    ``stale`` commits are refused with StaleEpochError first."""

    def __init__(self, stale: int = 0, last_batch=None) -> None:
        self.calls: list[tuple] = []
        self.stale = stale
        self.epoch = 1
        self.last_batch = last_batch

    def placement(self, op):
        return placement(self.epoch, last_batch=self.last_batch)

    def begin_batch(self, op, batch):
        self.calls.append(("begin", batch))
        if self.last_batch is not None and batch <= self.last_batch:
            raise E.InvalidArgumentError(f"the next batch is {self.last_batch + 1}")
        return self.placement(op)

    def commit_batch(self, op, batch, *, instances=None, load=None, epoch=None):
        self.calls.append(("commit", batch, epoch))
        if self.stale:
            self.stale -= 1
            self.epoch += 1
            raise E.StaleEpochError("moved on")
        self.last_batch = batch
        return CommitAnswer(operator_id=op, last_batch=batch)


def test_the_driver_reruns_a_stale_commit_with_the_new_epoch():
    c = RecordingCoordinator(stale=1)
    done = BatchDriver(c, "op", retry_sleep=0).run(0, lambda a: AttemptResult(epoch=a.epoch, value=a.number))
    assert c.calls == [("begin", 0), ("commit", 0, 1), ("begin", 0), ("commit", 0, 2)]
    assert done.attempt.number == 2 and done.result.value == 2 and "StaleEpochError" in done.errors[0]


def test_the_driver_raises_a_real_error_at_once_and_reruns_the_others():
    c = RecordingCoordinator()
    seen = []

    def attempt(a):
        seen.append(a.number)
        raise [E.PeerDeadError("gone"), RerunBatch("cancelled", sleep=False), E.CorruptionError("bad")][a.number - 1]

    with pytest.raises(E.CorruptionError):
        BatchDriver(c, "op", retry_sleep=0).run(0, attempt)
    assert seen == [1, 2, 3] and not [x for x in c.calls if x[0] == "commit"]
    with pytest.raises(E.RhinoError, match="batch 0 failed 2 times"):
        BatchDriver(c, "op", retry_sleep=0, max_attempts=2).run(0, lambda a: (_ for _ in ()).throw(
            E.StaleEpochError("x")))


def test_a_replay_of_the_last_batch_runs_without_a_commit():
    c = RecordingCoordinator(last_batch=4)
    with pytest.raises(E.InvalidArgumentError):
        BatchDriver(c, "op", retry_sleep=0).run(4, lambda a: AttemptResult(epoch=a.epoch))
    done = BatchDriver(c, "op", retry_sleep=0, replay=True).run(4, lambda a: AttemptResult(epoch=a.epoch))
    assert done.attempt.replay and not [x for x in c.calls if x[0] == "commit"]


def test_a_replay_runs_at_the_time_its_batch_was_first_given():
    """Batch 5 was begun (its time stored) before the driver died; Spark replays 4, whose
    time the coordinator keeps among its recent ones: the replay's placement carries it."""

    class Timed(RecordingCoordinator):
        def placement(self, op):
            return replace(super().placement(op), batch_time=BatchTime(batch=5, time_ms=9000, recent={4: 7000}))

        def begin_batch(self, op, batch, *, batch_time_ms=None):
            return super().begin_batch(op, batch)

    done = BatchDriver(Timed(last_batch=4), "op", retry_sleep=0, replay=True, clock=lambda: 1).run(
        4, lambda a: AttemptResult(epoch=a.epoch))
    assert done.attempt.replay and done.attempt.placement.batch_time_ms == 7000


class Reports:
    def __init__(self) -> None:
        self.reported: list[tuple] = []

    def report_unreachable(self, op, instance, worker):
        self.reported.append((op, instance, worker))

    def placement(self, op):
        raise E.PeerDeadError("the coordinator is away too")


def _closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def _placement(address: str) -> Placement:
    return placement(3, assignment=(0,), instances={0: instance("w9", address=address)})


def test_an_unreachable_primary_is_reported_and_raised_without_the_failover_wait():
    coord = Reports()
    run = InstanceRun(WorkerClients(secret=b"s" * 32, client_id="t"), lambda: coord, "op", 0, batch=1,
                      placement=_placement(_closed_port()), wait_for_failover=False)
    with pytest.raises(E.PeerDeadError):
        run.run(lambda s, p: None)
    assert coord.reported == [("op", 0, "w9")] and "PeerDeadError at 127.0.0.1:" in run.errors[0]


def test_an_unreachable_primary_with_no_failover_times_out():
    coord = Reports()
    run = InstanceRun(WorkerClients(secret=b"s" * 32, client_id="t"), lambda: coord, "op", 0, batch=1,
                      placement=_placement(_closed_port()), failover_wait_s=0.5, grace_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(E.RhinoTimeoutError, match="no new placement"):
        run.run(lambda s, p: None)
    assert time.monotonic() - t0 < 10 and len(coord.reported) >= 2


def test_a_real_error_inside_the_session_is_raised_as_itself_and_not_reported(tmp_path):
    from rhino_testing.harness.workers import WorkerProcess, write_secret

    sf = write_secret(tmp_path)
    w = WorkerProcess(tmp_path, "w2", "127.0.0.2", secret_file=sf, metrics=False).start()
    try:
        secret = sf.read_bytes().strip()
        with rhino.connect(w.address, secret=secret) as admin:
            admin.open_instance("op", 0, epoch=3, num_vnodes=4)
        coord = Reports()
        clients = WorkerClients(secret=secret, client_id="t")
        for exc in (E.CorruptionError("bad block"), E.NoSpaceError("disk full"), E.AuthFailedError("no"),
                    E.NotFoundError("gone")):
            run = InstanceRun(clients, lambda: coord, "op", 0, batch=0, placement=_placement(w.address))

            def work(s, p, exc=exc):
                raise exc

            with pytest.raises(type(exc)):
                run.run(work)
            assert coord.reported == [] and run.errors == []
        # and the session ran: a commit at the placement's epoch
        run = InstanceRun(clients, lambda: coord, "op", 0, batch=0, placement=_placement(w.address))
        res = run.run(lambda s, p: (s.put_batch([1], [b"v"]), s.commit("barrier"))[1])
        assert res.version == 0 and run.epoch == 3 and not run.local
        clients.close()
    finally:
        w.stop()
