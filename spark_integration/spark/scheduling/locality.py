"""Placement-aware scheduling from PySpark (docs/design.md §2, §8).

:func:`with_preferred_locations` pins partition i of an RDD to the hosts given for it,
through the JVM helper ``io.rhino.spark.PreferredLocationsRDD`` (built by
:mod:`rhino.spark.scheduling.jar`, loaded with ``spark.jars``: see
:func:`spark_conf_for_locality`). Spark's delay scheduling then runs the task on such a
host while one has a free core within ``spark.locality.wait`` (3 s by default); it is a
preference, not a guarantee, so Rhino never needs locality for correctness, only for speed.

Measuring it: :func:`task_location` runs inside a task and tells where it is;
:func:`job_task_locations` reads where every task of a job group ran from the driver's
REST API (host, executor, Spark's locality level), without touching the job's code;
:func:`locality_report` compares either with the hosts asked for.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from .jar import jar_path

__all__ = ["JAVA_CLASS", "with_preferred_locations", "spark_conf_for_locality", "task_location", "TaskLocation",
           "job_task_locations", "locality_report", "LocalityReport"]

JAVA_CLASS = "io.rhino.spark.PreferredLocationsRDD"

Hosts = Union[None, str, Sequence[str]]


def spark_conf_for_locality() -> dict[str, str]:
    """The conf entries a SparkSession needs before it starts for :func:`with_preferred_locations`:
    ``spark.jars`` = the helper's jar (driver and executors). Merge it with any ``spark.jars``
    of your own (comma-separated)."""
    return {"spark.jars": str(jar_path())}


def _normalize(hosts_per_partition: Iterable[Hosts], n: int) -> list[list[str]]:
    out: list[list[str]] = []
    for i, h in enumerate(hosts_per_partition):
        if h is None:
            out.append([])
        elif isinstance(h, str):
            out.append([h])
        else:
            hs = list(h)
            if not all(isinstance(x, str) and x for x in hs):
                raise TypeError(f"with_preferred_locations: partition {i}: hosts must be non-empty strings, got {h!r}")
            out.append(hs)
        if isinstance(h, str) and not h:
            raise TypeError(f"with_preferred_locations: partition {i}: an empty host name")
    if len(out) != n:
        raise ValueError(f"with_preferred_locations: the RDD has {n} partitions but {len(out)} host lists were "
                         f"given; give exactly one per partition (a host, a list of hosts, or None for no preference)")
    return out


def _class_loadable(jvm: Any) -> bool:
    # Not `jvm.io.rhino...`: py4j answers an unknown class with a JavaPackage, not an error.
    # py4j loads classes through the thread's context class loader, so ask that one.
    try:
        jvm.java.lang.Class.forName(JAVA_CLASS, True, jvm.java.lang.Thread.currentThread().getContextClassLoader())
        return True
    except Exception:  # py4j.protocol.Py4JJavaError: ClassNotFoundException
        return False


_loaded_into: set[str] = set()  # application ids


def _ensure_class(sc: Any) -> None:
    """Makes the helper class loadable in the driver and the executors. The usual way is
    ``spark.jars`` (spark_conf_for_locality) when the session starts. But PySpark starts
    its JVM once per Python process, with the jars of the *first* session: a later
    session (another test, another cluster) in the same process has spark.jars on its
    executors but not in the driver. Then the jar is added to the driver's context class
    loader (Spark's MutableURLClassLoader, whose addURL is public) and, with addJar, to the
    executors, which fetch it with their next task."""
    jvm = sc._jvm
    if _class_loadable(jvm):
        return
    jar = str(jar_path())
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        loader.addURL(jvm.java.io.File(jar).toURI().toURL())
    except Exception as e:
        raise RuntimeError(f"{JAVA_CLASS} is not on the driver's classpath and the driver's class loader "
                           f"({loader.getClass().getName()}) takes no jar at run time: start the SparkSession "
                           f"with rhino.spark.scheduling.spark_conf_for_locality() (spark.jars = {jar})") from e
    if sc.applicationId not in _loaded_into:
        sc._jsc.sc().addJar(jar)
        _loaded_into.add(sc.applicationId)
    if not _class_loadable(jvm):
        raise RuntimeError(f"{JAVA_CLASS} cannot be loaded from {jar}: start the SparkSession with "
                           f"rhino.spark.scheduling.spark_conf_for_locality() (spark.jars)")


def with_preferred_locations(rdd: Any, hosts_per_partition: Iterable[Hosts]) -> Any:
    """The same RDD (same partitions, same records, same deserializer) with partition i
    preferring ``hosts_per_partition[i]``: a host name (as Spark knows the executors'
    hosts, e.g. "127.0.0.2"), a list of them, or None for no preference. Narrow
    transformations on the result (map, mapPartitions, ...) keep the preference.

    Start the session with :func:`spark_conf_for_locality` (``spark.jars``); a session
    without it gets the jar at run time where Spark allows (see `_ensure_class`), else
    RuntimeError says what to do."""
    from pyspark.core.rdd import RDD
    from py4j.java_collections import ListConverter

    hosts = _normalize(hosts_per_partition, rdd.getNumPartitions())
    sc = rdd.ctx
    jvm = sc._jvm
    _ensure_class(sc)
    client = sc._gateway._gateway_client
    conv = ListConverter()
    jhosts = conv.convert([conv.convert(h, client) for h in hosts], client)
    jwrapped = jvm.io.rhino.spark.PreferredLocationsRDD(rdd._jrdd.rdd(), jhosts)
    return RDD(jwrapped.toJavaRDD(), sc, rdd._jrdd_deserializer)


# ---- measuring locality ------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskLocation:
    """Where one task ran."""
    partition: int
    host: Optional[str]          # the executor's host (SPARK_LOCAL_IP on a loopback cluster)
    executor: Optional[str] = None
    locality: Optional[str] = None  # Spark's level: PROCESS_LOCAL, NODE_LOCAL, ..., ANY
    stage: Optional[int] = None
    attempt: int = 0


def task_location() -> TaskLocation:
    """Called inside a task: its partition and the host it runs on. The host is
    ``SPARK_LOCAL_IP`` (each standalone worker of a loopback cluster has its own, and its
    executors inherit it), else the hostname. E.g.
    ``rdd.mapPartitions(lambda it: [task_location()])``."""
    import socket

    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("task_location() runs inside a Spark task")
    host = os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()
    # The executor's id is not visible to the Python worker; job_task_locations has it.
    return TaskLocation(partition=tc.partitionId(), host=host, stage=tc.stageId(),
                        attempt=tc.attemptNumber())


def job_task_locations(sc: Any, job_group: str, *, timeout: float = 30.0) -> dict[int, list[TaskLocation]]:
    """{stage id: the successful tasks of that stage} for the jobs of `job_group`
    (``sc.setJobGroup(job_group, ...)`` before the action), read from the driver's REST API
    (``spark.ui.enabled`` must be true, the default). The UI learns of tasks through the
    listener bus, a little after the action returns: this waits (up to `timeout`) until
    every stage lists all its tasks."""
    ui = sc.uiWebUrl
    if not ui:
        raise RuntimeError("job_task_locations needs the Spark UI (spark.ui.enabled=true)")
    tracker = sc.statusTracker()
    app = sc.applicationId
    stages: list[int] = []
    for jid in sorted(tracker.getJobIdsForGroup(job_group)):
        info = tracker.getJobInfo(jid)
        if info is not None:
            stages.extend(info.stageIds)
    if not stages:
        raise LookupError(f"no job of group {job_group!r} is known to the driver")
    out: dict[int, list[TaskLocation]] = {}
    deadline = time.monotonic() + timeout
    for sid in sorted(set(stages)):
        while True:
            tasks, expected = _stage_tasks(ui, app, sid)
            if expected is not None and len(tasks) >= expected:
                break
            if expected == 0 or time.monotonic() > deadline:
                break  # a skipped stage (its shuffle output reused) never runs a task
            time.sleep(0.2)
        out[sid] = tasks
    return {s: t for s, t in out.items() if t}


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _stage_tasks(ui: str, app: str, stage: int) -> tuple[list[TaskLocation], Optional[int]]:
    try:
        attempts = _get_json(f"{ui}/api/v1/applications/{app}/stages/{stage}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return [], None  # not known to the UI yet
        raise
    done: dict[int, TaskLocation] = {}
    expected: Optional[int] = None
    for att in attempts:
        if att.get("status") == "SKIPPED":
            return [], 0
        expected = att.get("numTasks", expected)
        tl = _get_json(f"{ui}/api/v1/applications/{app}/stages/{stage}/{att['attemptId']}/taskList"
                       f"?length=1000000")
        for t in tl:
            if t.get("status") != "SUCCESS":
                continue
            part = t.get("partitionId", t.get("index"))
            done[part] = TaskLocation(partition=part, host=t.get("host"), executor=t.get("executorId"),
                                      locality=t.get("taskLocality"), stage=stage, attempt=t.get("attempt", 0))
    return sorted(done.values(), key=lambda x: x.partition), expected


@dataclass
class LocalityReport:
    """How many tasks ran on a host they preferred."""
    tasks: int
    local: int
    misplaced: list[tuple[int, list[str], Optional[str]]] = field(default_factory=list)  # (partition, wanted, ran on)
    levels: Counter = field(default_factory=Counter)  # Spark's locality levels, if known
    unpinned: int = 0  # tasks with no preference (not counted in `tasks`)

    @property
    def fraction(self) -> float:
        return self.local / self.tasks if self.tasks else 1.0

    @property
    def all_local(self) -> bool:
        return self.local == self.tasks

    def __str__(self) -> str:
        s = f"{self.local}/{self.tasks} tasks on a preferred host ({self.fraction:.0%})"
        if self.levels:
            s += " levels " + ", ".join(f"{k}={v}" for k, v in sorted(self.levels.items()))
        if self.misplaced:
            s += "; misplaced: " + ", ".join(f"p{p} wanted {'|'.join(w)} ran on {h}" for p, w, h in self.misplaced[:10])
        return s


def locality_report(preferred: Sequence[Hosts],
                    observed: Union[Iterable[TaskLocation], Mapping[int, Optional[str]],
                                    Iterable[tuple[int, Optional[str]]]]) -> LocalityReport:
    """Compares where tasks ran with where they were asked to run. `preferred[i]` is
    partition i's host(s) as given to :func:`with_preferred_locations`; `observed` is
    TaskLocations (from :func:`task_location` or one stage of :func:`job_task_locations`),
    {partition: host}, or (partition, host) pairs. A partition seen twice (a retried task)
    counts once, with its last location."""
    where: dict[int, Optional[str]] = {}
    levels: Counter = Counter()
    items = observed.items() if isinstance(observed, Mapping) else observed
    for o in items:
        if isinstance(o, TaskLocation):
            where[o.partition] = o.host
            if o.locality:
                levels[o.locality] += 1
        else:
            p, h = o
            where[int(p)] = h
    rep = LocalityReport(tasks=0, local=0, levels=levels)
    for p in sorted(where):
        if p >= len(preferred):
            raise ValueError(f"locality_report: task of partition {p}, but only {len(preferred)} partitions have "
                             f"preferences")
        want = preferred[p]
        want = [] if want is None else [want] if isinstance(want, str) else list(want)
        if not want:
            rep.unpinned += 1
            continue
        rep.tasks += 1
        if where[p] in want:
            rep.local += 1
        else:
            rep.misplaced.append((p, want, where[p]))
    return rep
