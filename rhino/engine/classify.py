"""The engine's one classification of errors: what a failure in a batch means.

Every place that runs a micro-batch (the driver, a task, the test harness, the
benchmarks) decides with :func:`classify` what to do about an exception, and
the driver reads a failed Spark job's error text with :func:`classify_failure`,
which finds the task's exception class by name and classifies that same class.
The table is in the package docstring (``rhino/engine/__init__.py``).
"""

from __future__ import annotations

import builtins
import enum
import re
from typing import Optional

from .. import errors as _errors
from ..errors import (AbortedError, NoSpaceError, PeerDeadError, ResourceExhaustedError, RhinoIOError,
                      RhinoTimeoutError, SessionBusyError, StaleAttemptError, StaleChainVersionError,
                      StaleEpochError, UnknownInstanceError)

__all__ = ["Action", "classify", "classify_name", "classify_failure", "classify_job_failure", "failure_class_name",
           "first_error_line", "checkpoint_blocks_lost"]


class Action(enum.Enum):
    """What an error in a batch calls for."""

    #: The placement the attempt ran under is out of date (fenced): run the batch again
    #: under the coordinator's current placement (design §5).
    RERUN = "rerun"
    #: The instance is busy for a moment (a session of a cancelled attempt is still open):
    #: the same instance again shortly.
    RETRY = "retry"
    #: The worker is unreachable: report it to the coordinator and wait for the failover
    #: (a newer epoch), then run again there.
    FAILOVER = "failover"
    #: A real error: it propagates as itself; running the batch again would not help.
    RAISE = "raise"


# Order matters: the first class an exception is an instance of decides. NoSpaceError comes
# before RhinoIOError (its base): a full disk is a real error, not a lost worker.
_TABLE: tuple[tuple[type, Action], ...] = (
    # stale work (docs/protocol.md §7.2, the attempt fence): a later attempt has begun, so
    # this one's driver has moved on (or another driver runs the operator): nothing to wait
    # for, nothing a rerun of this attempt would fix. Before StaleEpochError, its base.
    (StaleAttemptError, Action.RAISE),
    (StaleEpochError, Action.RERUN),
    (StaleChainVersionError, Action.RERUN),
    (UnknownInstanceError, Action.RERUN),
    (SessionBusyError, Action.RETRY),
    # a listener over one of its connection limits (docs/protocol.md §2): the same worker again
    # shortly, with the busy backoff, as the burst of connections drains
    (ResourceExhaustedError, Action.RETRY),
    (NoSpaceError, Action.RAISE),
    (PeerDeadError, Action.FAILOVER),
    (AbortedError, Action.FAILOVER),
    (RhinoTimeoutError, Action.FAILOVER),
    (RhinoIOError, Action.FAILOVER),
    # plain socket errors: ConnectionRefused/Reset/Aborted, BrokenPipe, socket.timeout
    (ConnectionError, Action.FAILOVER),
    (TimeoutError, Action.FAILOVER),
)


def classify(exc: BaseException | type) -> Action:
    """The action an exception (or exception class) calls for; anything not in the
    table (CorruptionError, AuthFailedError, NotFoundError, the processor's own
    exceptions, a plain OSError ...) is :attr:`Action.RAISE`."""
    cls = exc if isinstance(exc, type) else type(exc)
    for base, action in _TABLE:
        if issubclass(cls, base):
            return action
    return Action.RAISE


def classify_name(name: str) -> Optional[Action]:
    """The action of an exception class known by name: a class of :mod:`rhino.errors`
    or a builtin exception (``"rhino.errors.PeerDeadError"``, ``"ConnectionResetError"``).
    None for a name that is neither."""
    short = name.rsplit(".", 1)[-1]
    cls = getattr(_errors, short, None) if name.startswith("rhino.") or "." not in name else None
    if cls is None and "." not in name:
        cls = getattr(builtins, short, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return classify(cls)
    return None


# The exception line that ends a Python traceback: "rhino.errors.CorruptionError: ...",
# "ValueError: ...", "KeyboardInterrupt"; frames ("  File ...") are indented.
_EXC_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::\s|:$|$)")
_TRACEBACK = "Traceback (most recent call last):"
# Failures with no Python traceback that are not worth a rerun either: a feature Spark
# refuses, a job cancelled by someone else than the engine (a query stopped), a stopped context.
_NOT_A_RERUN = re.compile(r"UnsupportedFeatureError|Job \d+ cancelled|SparkContext was shut down")


def failure_class_name(text: str) -> Optional[str]:
    """The class name of the Python exception a failed Spark job's error text ends with:
    the exception line of its last traceback (the one the task raised), or None when
    the text has no Python traceback (a lost executor, a crashed Python worker)."""
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    for line in text[at + len(_TRACEBACK):].splitlines():
        if not line.strip() or line[0] in " \t":
            continue
        m = _EXC_LINE.match(line)
        return m.group(1) if m else None
    return None


def classify_failure(text: str) -> Action:
    """What a failed Spark job calls for, from its error text (the driver's side of
    :func:`classify`): the task's exception, found by class name, is classified as
    itself; a Python exception that is neither Rhino's nor a builtin (the processor's
    own, a library's) is :attr:`Action.RAISE`; a failure of Spark's own machinery
    with no Python traceback (an executor lost with its host, a killed Python worker,
    a failed shuffle fetch) is :attr:`Action.RERUN`, unless the job was cancelled or
    Spark stopped (an attempt the engine's batch watch cancels is known to the
    driver, which reruns it without asking)."""
    name = failure_class_name(text)
    if name is not None:
        action = classify_name(name)
        return Action.RAISE if action is None else action
    if _NOT_A_RERUN.search(text):
        return Action.RAISE
    return Action.RERUN


def classify_job_failure(exc: BaseException) -> Action:
    """What a failed Spark action calls for: a failure Spark reports (a py4j or PySpark
    exception: the task's exception travels as text) by the class named in its text
    (:func:`classify_failure`), any other exception (the driver's own) by its class."""
    if any(c.__module__.split(".")[0] in ("py4j", "pyspark") for c in type(exc).__mro__):
        return classify_failure(str(exc))
    return classify(exc)


def first_error_line(text: str) -> str:
    """The most telling line of a Spark job failure: the Python exception, if there is one."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("rhino.errors.", "pyspark.", "Caused by")) or "Error:" in ln:
            return ln[:400]
    return lines[0][:400] if lines else ""


def checkpoint_blocks_lost(text: str) -> bool:
    """True if a job failed because blocks of a locally checkpointed DataFrame were lost
    with their executor (Spark's ``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``): its lineage ends
    at the checkpoint, so Spark cannot compute them again."""
    return "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in text or ("Checkpoint block" in text and "not found" in text)
