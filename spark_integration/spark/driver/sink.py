"""Running an attempt's Spark action, and the user's sink, so that a cancelled attempt
never holds up its rerun and the sink is never called twice at once.

With a batch watch (``scheduling/host_loss.py``), the action runs in a thread that
inherits the streaming query's Spark local properties and adds the job tag the watch
cancels by; the caller stops waiting once the watch has ``settled`` (the attempt is
cancelled and the coordinator has failed the lost host over). The cancelled job's error
would still have to come back: PySpark converts it with a py4j round trip per exception
class it checks, which took 0.5 s on a loaded 2-core host (the recovery bench's
``watch`` timeline, 2026-11-27)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from rhino.engine import first_error_line
from rhino.errors import RhinoError

from ..errors import output_lost

__all__ = ["SinkRunner", "unpersist_checkpoint", "materialize", "sink_with_reruns"]

log = logging.getLogger("rhino.spark")

Sink = Callable[[Any, int], None]


def materialize(result: Any) -> Any:
    """The stateful stage's output, materialized once on the executors (memory, spilling
    to disk): its lineage ends here, so nothing downstream can run the stateful tasks again."""
    return result.localCheckpoint(eager=True)


def unpersist_checkpoint(out: Any, operator_id: str) -> None:
    """Frees the blocks of a DataFrame made by :func:`materialize`."""
    try:
        # SparkContext.unpersistRDD drops the blocks as RDD.unpersist does, without its
        # warning that a locally checkpointed RDD cannot be recomputed (we know).
        rdd = out._jdf.queryExecution().logical().rdd()
        out.sparkSession.sparkContext._jsc.sc().unpersistRDD(rdd.id(), False)
    except Exception as e:  # noqa: BLE001 - a cleanup: Spark's ContextCleaner frees it later anyway
        log.debug("rhino.spark %s: releasing a materialized output: %s", operator_id, e)


def sink_with_reruns(transform: Callable[[Any, int], Any], sink: Optional[Sink], df: Any, batch_id: int, *,
                     attempts: int, what: str, reruns: Optional[list] = None) -> None:
    """A materialized sink's batch (``op.for_each_batch(sink, materialize=True)``, a
    ``Pipeline``'s): ``transform(df, batch_id)`` gives the output (materialized, committed),
    then the sink runs; if it fails because an executor holding part of that output was
    lost, the batch runs again (rolled back to b-1 first) and the sink is called again, up
    to ``attempts`` times. Each rerun is logged for ``what`` and added to ``reruns``."""
    for n in range(1, attempts + 1):
        out = transform(df, batch_id)
        if sink is None:
            return
        try:
            sink(out, batch_id)
            return
        except Exception as e:  # noqa: BLE001 - only a lost output is handled
            if not output_lost(e) or n == attempts:
                raise
            log.warning("rhino.spark %s batch %d: part of the output was lost with an executor while "
                        "the sink ran (%s); the batch runs again", what, batch_id, first_error_line(str(e)))
            if reruns is not None:
                reruns.append({"batch": batch_id, "attempt": n, "error": first_error_line(str(e))})


class SinkRunner:
    """An operator's Spark actions: :meth:`act` for one action, :meth:`run` for the fused sink."""

    def __init__(self, operator_id: str) -> None:
        self.operator_id = operator_id
        # a sink call an attempt gave up on while its cancelled job unwinds
        self.unwinding: Optional[threading.Thread] = None
        # how long a rerun waited for it before calling the sink again
        self.unwind_waits: list[dict] = []

    def run(self, sc: Any, sink: Sink, result: Any, b: int, attempt: int, complete: Callable[[], bool],
            watch: Optional[Any]) -> None:
        """The fused form: the sink's own jobs run the stateful tasks (``result`` is the
        stateful stage's lazy output). If the sink did not run every instance's task to its
        end (``complete()`` is False: it read only part of the output), one more job
        completes them, its output dropped."""

        def sink_jobs() -> None:
            sink(result, b)
            if not complete():
                result.write.format("noop").mode("overwrite").save()

        if watch is None:
            sink_jobs()  # the user's code, in this thread
            return
        earlier = self.unwinding
        if earlier is None or not earlier.is_alive():
            self.act(sc, sink_jobs, watch, user_code=True)
            return
        # An earlier attempt's sink call, given up when its watch settled, is still unwinding
        # its cancelled job. The sink is never called twice at once (a file sink's abort
        # deletes the _temporary directory the next call writes into), but the rerun's
        # stateful tasks need not wait for that: they run now, materialized on the executors
        # as transform's are, and the sink gets their output once the earlier call has
        # returned. The batch still commits after the sink returned, at the epoch every task
        # ran at.
        out = self.act(sc, lambda: materialize(result), watch)
        t = time.time()
        earlier.join()
        self.unwind_waits.append({"batch": b, "attempt": attempt, "waited_s": round(time.time() - t, 4)})
        self.unwinding = None

        def sink_then_release() -> None:
            try:
                sink(out, b)
            finally:  # in the sink's thread: a given-up call still frees its input when it returns
                unpersist_checkpoint(out, self.operator_id)

        try:
            self.act(sc, sink_then_release, watch, user_code=True)
        except Exception as e:
            if output_lost(e):  # our own output, not an upstream operator's: run the batch again
                from rhino.engine import RerunBatch, first_error_line

                raise RerunBatch(f"output lost while the sink ran: {first_error_line(str(e))}") from None
            raise

    def act(self, sc: Any, action: Callable[[], Any], watch: Optional[Any], user_code: bool = False) -> Any:
        """Runs the attempt's Spark action and returns its result (module docstring).

        The job tag is a property of the thread's jobs: this thread has nothing to take back,
        no py4j call to make, when it gives up. The abandoned thread ends when the job's
        error arrives; nothing reads its result. With ``user_code`` (the action calls the
        user's sink), it is kept (:attr:`unwinding`): the sink is not called again before it
        has returned."""
        if watch is None:
            return action()
        if watch.cancelled:
            # cancelled while the attempt was still being planned (its input shuffled, in
            # AQE's planning): its job would run only into StaleEpochError, on the cores the
            # next attempt needs
            raise RhinoError(f"operator {self.operator_id}: the attempt was cancelled (a lost host, a new epoch) "
                             "before its Spark job was submitted")
        from pyspark import SparkContext
        from pyspark.util import InheritableThread

        # InheritableThread copies the active context's properties (none without one: a test)
        thread = InheritableThread if SparkContext._active_spark_context is not None else threading.Thread
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                sc.addJobTag(watch.tag)
                try:
                    box["value"] = action()
                finally:
                    sc.removeJobTag(watch.tag)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

        th = thread(target=run, name=f"rhino-action-{self.operator_id}", daemon=True)
        th.start()
        while not done.wait(0.01):
            if watch.settled.is_set():
                if user_code:
                    self.unwinding = th
                raise RhinoError(f"operator {self.operator_id}: the attempt was cancelled (a lost host, a new "
                                 "epoch) and the coordinator has acted: not waiting for its Spark job to unwind")
        if "error" in box:
            raise box["error"]
        return box["value"]
