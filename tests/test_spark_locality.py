"""Placement-aware scheduling (rhino.spark.scheduling) on a real 3-host standalone cluster
(127.0.0.44-46, one core each, rhino_testing.harness.spark_cluster): partitions pinned to hosts run there,
seen from inside the task (SPARK_LOCAL_IP) and from the driver's REST API, for a plain RDD,
for a Python-pipelined parent, and for a mapPartitions over the wrapper; the jar is found or
compiled (and a missing javac says how to get one); a bad host list fails in Python, clearly."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from rhino_testing.harness.spark_cluster import LocalCluster  # noqa: E402
from rhino.spark.scheduling import (JAVA_CLASS, job_task_locations, locality_report,  # noqa: E402
                                    spark_conf_for_locality, task_location, with_preferred_locations)
from rhino.spark.scheduling import jar as jarmod  # noqa: E402

FIRST = 44


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("locality-cluster")
    with LocalCluster.up(d, hosts=3, first_host=FIRST) as cl:
        spark = cl.spark_session("test-spark-locality")
        try:
            # Warm up: every executor forks its Python worker daemon once (a second or more on a
            # busy machine); after that, tasks take milliseconds, well inside spark.locality.wait.
            pinned = with_preferred_locations(spark.sparkContext.parallelize(range(3), 3), cl.hosts)
            pinned.map(lambda x: x).collect()
            yield cl, spark
        finally:
            spark.stop()


def _make_probe():
    # Nested, so that cloudpickle ships it by value: executors cannot import this test module.
    def probe(it):
        list(it)
        loc = task_location()
        return [(loc.partition, loc.host)]
    return probe


_probe = _make_probe()


@pytest.mark.parametrize("pattern", [[2, 0, 1, 1, 2, 0], [0, 0, 0, 0, 2, 2]], ids=["spread", "skewed"])
def test_map_partitions_over_the_wrapper_runs_on_the_pinned_hosts(cluster, pattern) -> None:
    """`skewed` leaves host 2 idle and queues four tasks on host 1: only the preference puts them there."""
    cl, spark = cluster
    sc = spark.sparkContext
    want = [cl.hosts[i] for i in pattern]
    pinned = with_preferred_locations(sc.parallelize(range(60), 6), want)
    group = f"probe-{'-'.join(map(str, pattern))}"
    sc.setJobGroup(group, "locality probe")
    try:
        seen = pinned.mapPartitions(_probe).collect()
    finally:
        sc.setJobGroup("", "")
    # inside each task, SPARK_LOCAL_IP is the host its partition was pinned to
    assert seen == [(i, want[i]) for i in range(6)]
    rep = locality_report(want, seen)
    assert rep.all_local and rep.tasks == 6, str(rep)
    # the driver's own record agrees, and Spark counts every task as node-local
    (stage,) = job_task_locations(sc, group).values()
    rep = locality_report(want, stage)
    assert rep.all_local and rep.levels == {"NODE_LOCAL": 6}, str(rep)
    assert {t.executor for t in stage} <= {str(e) for e in range(100)}


def test_plain_rdd_and_a_pipelined_parent(cluster) -> None:
    cl, spark = cluster
    sc = spark.sparkContext
    want = [cl.hosts[i] for i in [1, 2, 0, 2, 1, 0]]
    # The wrapper itself (no Python stage after it): same partitions, same records.
    plain = with_preferred_locations(sc.parallelize(range(60), 6), want)
    expect = sc.parallelize(range(60), 6).glom().collect()
    sc.setJobGroup("plain", "wrapper only")
    assert plain.glom().collect() == expect
    assert plain.getNumPartitions() == 6
    (stage,) = job_task_locations(sc, "plain").values()
    assert locality_report(want, stage).all_local, str(locality_report(want, stage))
    # A Python-pipelined parent (map before the wrapper) and a keyed RDD: the wrapper takes any
    # PySpark RDD and keeps its deserializer.
    parent = sc.parallelize(range(60), 6).map(lambda x: (x % 7, str(x)))
    pinned = with_preferred_locations(parent, want)
    expect = parent.collect()
    sc.setJobGroup("pipelined", "map before the wrapper")
    try:
        assert pinned.collect() == expect
        assert pinned.mapPartitions(_probe).collect() == [(i, want[i]) for i in range(6)]
        assert dict(pinned.reduceByKey(lambda a, b: a).mapValues(len).collect()).keys() == set(range(7))
    finally:
        sc.setJobGroup("", "")
    # the JVM side holds exactly the hosts given, in partition order
    jrdd = pinned._jrdd.rdd()
    assert jrdd.getClass().getName() == JAVA_CLASS
    assert [list(jrdd.preferredHosts(i)) for i in range(6)] == [[h] for h in want]
    # several hosts per partition, and None for "anywhere"
    multi = with_preferred_locations(sc.parallelize(range(3), 3), [[cl.hosts[0], cl.hosts[1]], None, cl.hosts[2]])
    j = multi._jrdd.rdd()
    assert [list(j.preferredHosts(i)) for i in range(3)] == [[cl.hosts[0], cl.hosts[1]], [], [cl.hosts[2]]]
    assert sorted(multi.collect()) == [0, 1, 2]


def test_a_bad_host_list_is_a_clear_python_error(cluster) -> None:
    cl, spark = cluster
    rdd = spark.sparkContext.parallelize(range(10), 4)
    with pytest.raises(ValueError, match=r"4 partitions but 3 host lists"):
        with_preferred_locations(rdd, cl.hosts)
    with pytest.raises(ValueError, match=r"4 partitions but 5 host lists"):
        with_preferred_locations(rdd, cl.hosts + cl.hosts[:2])
    with pytest.raises(TypeError, match=r"partition 1: hosts must be non-empty strings"):
        with_preferred_locations(rdd, [cl.hosts[0], [2], None, None])
    with pytest.raises(TypeError, match=r"partition 0: an empty host name"):
        with_preferred_locations(rdd, ["", None, None, None])


def test_the_jar_is_found_or_compiled(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RHINO_SPARK_JAR", raising=False)
    monkeypatch.setenv("RHINO_CACHE", str(tmp_path / "cache"))
    jar = jarmod.jar_path()  # compiled with javac into the (empty) cache
    assert jar.parent == tmp_path / "cache" / "spark" and jar.name.startswith("rhino-spark-locality-")
    with zipfile.ZipFile(jar) as z:
        assert {"io/rhino/spark/PreferredLocationsRDD.class", "io/rhino/spark/KeyRouter.class"} <= set(z.namelist())
    mtime = jar.stat().st_mtime_ns
    assert jarmod.jar_path() == jar and jar.stat().st_mtime_ns == mtime  # found, not rebuilt
    assert spark_conf_for_locality() == {"spark.jars": str(jar)}
    # the Java source ships inside the package (so a wheel can compile it too)
    assert [p.name for p in jarmod.java_sources()] == ["KeyRouter.java", "PreferredLocationsRDD.java"]
    import rhino.spark

    assert jarmod.java_sources()[0].is_relative_to(Path(rhino.spark.__file__).resolve().parent / "scheduling")
    # $RHINO_SPARK_JAR wins; a wrong one is an error, not a silent fallback
    monkeypatch.setenv("RHINO_SPARK_JAR", str(jar))
    assert jarmod.jar_path() == jar
    monkeypatch.setenv("RHINO_SPARK_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(FileNotFoundError, match="RHINO_SPARK_JAR"):
        jarmod.jar_path()
    monkeypatch.delenv("RHINO_SPARK_JAR")
    # no javac (a JRE only) and nothing built yet: the error says what to install
    monkeypatch.setenv("RHINO_CACHE", str(tmp_path / "cache2"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(RuntimeError, match="apt-get install openjdk-17-jdk-headless"):
        jarmod.jar_path()
    with pytest.raises(FileNotFoundError):
        jarmod.jar_path(build=False)
    assert not os.path.exists(tmp_path / "cache2" / "spark" / jar.name)
