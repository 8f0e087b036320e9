"""What an operator is: the arguments of :func:`rhino.spark.transform_with_state`,
validated once, frozen, and shipped to the executors with each attempt (design §5).

Everything that describes the operator and does not change from batch to batch lives
here; what changes per attempt (batch, epoch, watermark, placement) is an
:class:`~rhino.spark.driver.attempt.AttemptSpec`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from rhino.errors import InvalidArgumentError
from rhino.tls.config import TLS

__all__ = ["OperatorConfig", "parse_delay_ms", "PREFETCH_ENTRIES"]

# Per collection and key, what a window's prefetch reads; more is read on demand (state/store.py).
PREFETCH_ENTRIES = 64

_DELAY = re.compile(r"^\s*(\d+)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?)\s*$", re.I)
_UNIT_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
            "m": 60_000, "min": 60_000, "minute": 60_000, "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000,
            "hours": 3_600_000}
_TIME_MODES = ("none", "eventtime", "processingtime")


def parse_delay_ms(delay: Any) -> int:
    """'10 seconds' / '500 ms' / an int of ms -> ms."""
    if isinstance(delay, (int, float)) and not isinstance(delay, bool):
        if delay < 0:
            raise InvalidArgumentError(f"watermark delay must be >= 0, not {delay}")
        return int(delay)
    m = _DELAY.match(str(delay))
    if not m:
        raise InvalidArgumentError(f"watermark delay {delay!r}: write it as '<n> ms|seconds|minutes|hours'")
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower()]


def _positive_int(name: str, v: Any, hi: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (hi is not None and v > hi):
        bound = f"an int in 1..{hi}" if hi is not None else "a positive int"
        raise InvalidArgumentError(f"{name} must be {bound}, not {v!r}")
    return v


@dataclass(frozen=True, eq=False)
class OperatorConfig:
    """One operator's settings (see :func:`rhino.spark.transform_with_state` for each)."""

    processor: Any
    key_columns: tuple[str, ...]
    output_schema: Any  # a pyspark StructType
    operator_id: str  # the id at the coordinator and the workers: rhino.operator_id(name, namespace)
    coordinator: str  # the coordinator's "host:port"
    # The job's task credential (rhino.Credential, role task, scoped to the namespace): what the
    # driver and every task prove, never the cluster's root secret (docs/spark.md, "Credentials")
    secret: Any
    tls: Optional[TLS] = None  # its paths may hold {host}: each process's own host (runtime/task.py)
    parallelism: int = 2
    replicas: int = 2
    num_vnodes: int = 64
    time_mode: str = "none"  # "none" | "eventtime" | "processingtime"
    event_time: Optional[str] = None
    delay_ms: int = 0
    mode: str = "pandas"  # "pandas" | "rows"
    checkpoint_location: Optional[str] = None
    locality: bool = True
    max_batch_attempts: int = 5
    placement: str = "balanced"
    request_timeout: float = 120.0
    failover_wait_s: float = 60.0
    watch_hosts: bool = True
    task_window_rows: int = 100_000
    # None: 2 while the application has at least two executors, else 1 (driver/routing.py)
    input_copies: Optional[int] = None
    # the live copies of each instance's state a batch needs, and whether it waits for
    # them (rhino/coordinator/copies.py); None: the coordinator's setting (1 at first)
    min_copies: Optional[int] = None
    min_copies_strict: Optional[bool] = None
    min_copies_wait_s: Optional[float] = None
    name: str = ""  # the operator's name in its namespace (operator_id= as given)
    # the processor's code version (driver/code_version.py): code_version= as given, else
    # its fingerprint; recorded at the coordinator with the batch it runs from (issue 47)
    code_version: str = ""
    # a swap's per-key migration (driver/swap.py): migrate(key, old, processor) once per key with
    # state, in batch migrate_batch, reading the variables of migrate_from (the state schema
    # document's "vars" before the swap)
    migrate: Any = None
    migrate_batch: Optional[int] = None
    migrate_from: Optional[dict] = None
    namespace: Optional[str] = None  # None: the default namespace

    def __repr__(self) -> str:  # never the secret
        return f"OperatorConfig({self.operator_id!r}, parallelism={self.parallelism}, replicas={self.replicas})"

    @property
    def keys(self) -> list[str]:
        """The key columns as a list (pandas reads a tuple as one column name)."""
        return list(self.key_columns)

    @classmethod
    def of(cls, processor: Any, *, key: str | Sequence[str], output_schema: Any, operator_id: str,
           coordinator: str, secret: Any = None, secret_file: Optional[str] = None, time_mode: str = "None",
           watermark_delay: Any = 0, num_vnodes: Optional[int] = None, checkpoint_location: Optional[str] = None,
           parallelism: int = 2, replicas: int = 2, **kw: Any) -> "OperatorConfig":
        """The config of :func:`~rhino.spark.transform_with_state`'s arguments, or
        InvalidArgumentError naming the first bad one."""
        from pyspark.sql.types import StructType

        from rhino.replication import read_secret_file

        if not operator_id or not isinstance(operator_id, str):
            raise InvalidArgumentError("operator_id must be a non-empty string")
        from rhino.coordinator.naming import operator_id as make_id

        namespace = kw.pop("namespace", None)
        name, operator_id = operator_id, make_id(operator_id, namespace)
        if kw.get("mode", "pandas") not in ("pandas", "rows"):
            raise InvalidArgumentError(f"mode must be 'pandas' (transformWithStateInPandas) or 'rows' "
                                       f"(transformWithState), not {kw['mode']!r}")
        tm = str(time_mode).lower()
        if tm not in _TIME_MODES:
            raise InvalidArgumentError(f"time_mode must be 'None', 'EventTime' or 'ProcessingTime', not {time_mode!r}")
        if tm == "eventtime" and not kw.get("event_time"):
            raise InvalidArgumentError("time_mode='EventTime' needs event_time=<the event-time column>")
        if tm == "eventtime" and not checkpoint_location:
            raise InvalidArgumentError("time_mode='EventTime' needs checkpoint_location=<the query's Spark "
                                       "checkpoint location>: the operator's watermark is kept there (through "
                                       "Spark's Hadoop filesystem), so that a restarted driver runs each batch "
                                       "with the watermark it first ran with")
        _positive_int("task_window_rows", kw.get("task_window_rows", 100_000))
        if kw.get("input_copies") is not None:
            _positive_int("input_copies", kw["input_copies"], hi=3)
        if int(parallelism) < 1 or int(replicas) < 0:
            raise InvalidArgumentError("parallelism must be >= 1 and replicas >= 0")
        if kw.get("min_copies") is not None:
            _positive_int("min_copies", kw["min_copies"], hi=int(replicas) + 1)
        if secret is None and secret_file is None:
            raise InvalidArgumentError("pass secret= or secret_file= (the job's task credential, or the cluster's "
                                       "shared secret to derive it from)")
        if secret is None:
            secret = read_secret_file(Path(secret_file))
        credential = _task_credential(secret, namespace)
        tls = kw.get("tls")
        if tls is not None and not isinstance(tls, TLS):
            raise InvalidArgumentError(f"tls must be a rhino.TLS or None, not {type(tls).__name__}")
        keys = (key,) if isinstance(key, str) else tuple(key)
        if not keys:
            raise InvalidArgumentError("key must name at least one column")
        schema = StructType.fromDDL(output_schema) if isinstance(output_schema, str) else output_schema
        kw["code_version"] = checked_code_version(processor, kw.get("code_version"))
        return cls(processor=processor, key_columns=keys, output_schema=schema, operator_id=operator_id,
                   name=name, namespace=namespace,
                   coordinator=coordinator, secret=credential, time_mode=tm,
                   delay_ms=parse_delay_ms(watermark_delay), parallelism=int(parallelism), replicas=int(replicas),
                   num_vnodes=int(num_vnodes) if num_vnodes else max(64, 16 * int(parallelism)),
                   checkpoint_location=str(checkpoint_location) if checkpoint_location else None,
                   **{k: v for k, v in kw.items()})


def checked_code_version(processor: Any, given: Any) -> str:
    """``given`` (a name of 1-128 printable characters), else the processor's fingerprint."""
    from .code_version import code_version_of

    if given is None:
        return code_version_of(processor)
    if not isinstance(given, str) or not 0 < len(given) <= 128 or not given.isprintable():
        raise InvalidArgumentError(f"code_version must be a name of 1-128 printable characters, not {given!r}")
    return given


def _task_credential(secret: Any, namespace: Optional[str]) -> Any:
    """What the driver and its tasks prove (docs/protocol.md §2, "Roles"): a task credential
    of the operator's namespace. From the cluster's root secret it is derived here, so that
    no task ever holds the root; a credential given as is must be that one."""
    from rhino.credential import Credential

    want = namespace or ""
    if not isinstance(secret, Credential):
        return Credential.task(secret, want)
    if secret.role != "task" or secret.scope != want:
        where = f"namespace {want!r}" if want else "the default namespace"
        raise InvalidArgumentError(
            f"{secret!r} is not the task credential of {where}: every task is handed this credential, so it must "
            f"be that job's task credential (rhino credential task{' --namespace ' + want if want else ''}) or the "
            "cluster's shared secret, from which the driver derives it")
    return secret
