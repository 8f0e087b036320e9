"""The micro-batch engine: the one implementation of how a batch runs against
the coordinator and the workers' state service (docs/design.md §5,
docs/protocol.md §7-§8). Used by ``rhino.spark`` (the driver in ``operator.py``,
the tasks in ``runtime/task.py``), by the test harness's in-process engine and
by the benchmarks.

Per batch b:

1. the driver calls ``begin_batch(b)`` (:meth:`BatchDriver.begin`): the barrier
   where due handovers run; it returns the placement (routing table, primaries,
   epoch E);
2. each instance runs in one session on its primary at E
   (:class:`InstanceRun`, clients from :class:`WorkerClients`), sees exactly
   b-1, and commits b in barrier mode; it reports its per-vnode load
   (:func:`vnode_load`);
3. the driver reports the batch done with the epoch the instances committed at
   (:meth:`BatchDriver.commit`), with the batch's report for the autoscaler
   (:func:`batch_report`: records and busy time per instance, from their commit
   stats); the coordinator refuses it if the operator
   moved to a new epoch meanwhile, and the whole batch runs again
   (:meth:`BatchDriver.run`): every instance rolls back to b-1 first, so state
   and output are those of one run.

Errors are classified once (:func:`classify`; the driver reads a failed Spark
job's text with :func:`classify_failure`, which finds the task's exception
class by name and classifies it the same way). The first row an exception is
an instance of decides:

==========================  ============  ==========================================
exception                   action        what happens
==========================  ============  ==========================================
StaleEpochError             RERUN         the batch runs again under the current
StaleChainVersionError                    placement (a task with
UnknownInstanceError                      ``wait_for_failover`` first waits for the
                                          newer epoch itself)
SessionBusyError            RETRY         the same instance again shortly (a
                                          cancelled attempt's session is closing)
NoSpaceError                RAISE         a full disk: propagates as itself, though
                                          it is a RhinoIOError
PeerDeadError, AbortedError FAILOVER      the worker is unreachable: report it to
RhinoTimeoutError                         the coordinator (which fails it over if
RhinoIOError                              it cannot reach it either), wait for the
ConnectionError, TimeoutError             newer epoch, run again there
(plain socket errors)
anything else               RAISE         propagates as itself: CorruptionError,
                                          AuthFailedError, NotFoundError,
                                          InvalidArgumentError, BusyError, a
                                          plain OSError, the processor's own
==========================  ============  ==========================================

A failed Spark job whose text has no Python traceback (an executor lost with
its host, a killed Python worker, a failed shuffle fetch) is RERUN, unless the
job was cancelled by someone else or Spark stopped (RAISE).
"""

from __future__ import annotations

from .classify import (Action, checkpoint_blocks_lost, classify, classify_failure, classify_job_failure, classify_name,
                       failure_class_name, first_error_line)
from .clients import WorkerClients, primary_address
from .driver import Attempt, AttemptResult, BatchDriver, BatchOutcome, RerunBatch
from .instance import InstanceRun
from .load import vnode_load
from .report import BUSY_FIELDS, batch_report

__all__ = [
    "Action",
    "classify",
    "classify_name",
    "classify_failure",
    "classify_job_failure",
    "failure_class_name",
    "first_error_line",
    "checkpoint_blocks_lost",
    "WorkerClients",
    "primary_address",
    "BatchDriver",
    "Attempt",
    "AttemptResult",
    "BatchOutcome",
    "RerunBatch",
    "InstanceRun",
    "vnode_load",
    "batch_report",
    "BUSY_FIELDS",
]
