"""The local multi-host cluster harness, `python -m rhino_testing.harness.spark_cluster`, end to end through its
command line: `up --hosts 3` starts a Spark master, a Rhino coordinator, and per host
(127.0.0.40-42) a Spark worker and a Rhino worker; a real SparkSession runs on it with an
executor per host; `kill-host 2` leaves nothing of that host alive and the coordinator
declares its Rhino worker dead; `restart-host 2` brings it back; `down` leaves no process
of the cluster (checked in /proc, executors included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from rhino_testing.harness.spark_cluster import LocalCluster  # noqa: E402
from rhino.spark.scheduling import task_location, with_preferred_locations  # noqa: E402

FIRST = 40  # 127.0.0.40..42: apart from the other Spark tests' hosts, should they run at the same time
HOSTS = [f"127.0.0.{FIRST + i}" for i in range(3)]
IDS = [f"w{FIRST + i}" for i in range(3)]


def cli(*args: object, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rhino_testing.harness.spark_cluster", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie is not: it has ended, its parent just has
    not collected its status yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except FileNotFoundError:
        return False
    return text[text.rindex(")") + 2] not in "ZX"


def session_members(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    text = f.read()
            except FileNotFoundError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] not in "ZX":
                out.append(int(name))
    return out


def executors_of(worker_urls: set[str]) -> list[int]:
    """Running CoarseGrainedExecutorBackend processes started by one of these Spark workers."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any("CoarseGrainedExecutorBackend" in a for a in args) and worker_urls & set(args) and alive(int(name)):
            out.append(int(name))
    return out


def host_pids(state: dict, n: int) -> set[int]:
    """Every running process of host n: its Spark worker's session (the worker, executors,
    PySpark's Python workers) and its Rhino worker's."""
    h = state["hosts"][n - 1]
    return set(session_members(h["spark_worker"]["pid"])) | set(session_members(h["rhino_worker"]["pid"]))


def wait_until(cond, timeout: float, what: str, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(step)


def test_up_kill_host_restart_down_through_the_cli(tmp_path: Path) -> None:
    d = tmp_path / "cluster"
    spark = None
    try:
        t0 = time.monotonic()
        r = cli("up", "--hosts", 3, "--dir", d, "--first-host", FIRST)
        up_s = time.monotonic() - t0
        assert r.returncode == 0, r.stdout + r.stderr
        assert "cluster up" in r.stdout
        print(f"\n`up --hosts 3`: {up_s:.1f} s")
        state = json.loads((d / "cluster.json").read_text())
        assert [h["ip"] for h in state["hosts"]] == HOSTS
        daemons = [state["master"]["pid"], state["coordinator"]["pid"]] + \
            [h[k]["pid"] for h in state["hosts"] for k in ("spark_worker", "rhino_worker")]
        assert len(set(daemons)) == 8 and all(alive(p) for p in daemons)
        # each daemon leads its own session: it outlives the `up` command that started it
        assert all(session_members(p) for p in daemons)

        cl = LocalCluster.attach(d)
        assert cl.hosts == HOSTS and cl.coordinator == state["coordinator"]["address"]
        assert [w.id for w in cl.rhino_workers] == IDS
        assert {w["id"]: w["state"] for w in cl.coordinator_status()["workers"]} == dict.fromkeys(IDS, "alive")
        assert {w["host"] for w in cl.master_status()["workers"] if w["state"] == "ALIVE"} == set(HOSTS)

        # a second `up` in the same directory refuses, and says why
        r = cli("up", "--hosts", 3, "--dir", d, "--first-host", FIRST)
        assert r.returncode == 1 and "holds a running cluster" in r.stderr

        spark = cl.spark_session("test-spark-cluster")
        assert set(cl.executor_hosts(spark)) == set(HOSTS)
        sc = spark.sparkContext
        assert sc.parallelize(range(1000), 6).map(lambda x: x * x).sum() == sum(x * x for x in range(1000))

        # A task pinned to each host sees that host's address and that host's Rhino worker.
        def probe(it):
            loc = task_location()
            return [(loc.partition, loc.host, os.environ.get("RHINO_WORKER_ID"),
                     os.environ.get("RHINO_WORKER_SOCKET"), os.environ.get("RHINO_COORDINATOR"))]

        seen = with_preferred_locations(sc.parallelize(range(3), 3), HOSTS).mapPartitions(probe).collect()
        assert [(p, h, w) for p, h, w, _, _ in seen] == [(i, HOSTS[i], IDS[i]) for i in range(3)]
        assert all(Path(s).is_socket() and c == cl.coordinator for *_, s, c in seen)
        execs = {n: cl.executor_pids(n) for n in (1, 2, 3)}
        assert all(execs.values()), execs
        urls = {h["spark_worker"]["url"] for h in state["hosts"]}
        assert set(executors_of(urls)) == {p for v in execs.values() for p in v}

        # ---- kill-host 2: a lost VM ---------------------------------------------------------
        victims = host_pids(state, 2)
        h2 = state["hosts"][1]
        assert {h2["spark_worker"]["pid"], h2["rhino_worker"]["pid"], *execs[2]} <= victims
        r = cli("kill-host", 2, "--dir", d)
        assert r.returncode == 0, r.stdout + r.stderr
        # SIGKILL is done when the command returns: nothing of host 2 is left, at once
        assert [p for p in victims if alive(p)] == []
        assert executors_of({h2["spark_worker"]["url"]}) == []
        # the other hosts are untouched
        assert all(alive(p) for n in (1, 3) for p in (state["hosts"][n - 1]["spark_worker"]["pid"],
                                                          state["hosts"][n - 1]["rhino_worker"]["pid"], *execs[n]))
        assert json.loads((d / "cluster.json").read_text())["hosts"][1]["state"] == "killed"
        t_kill = time.monotonic()
        wait_until(lambda: {w["id"]: w["state"] for w in cl.coordinator_status()["workers"]}.get(IDS[1]) == "dead",
                   15, f"the coordinator declares {IDS[1]} dead")
        print(f"coordinator declared {IDS[1]} dead {time.monotonic() - t_kill:.1f} s after kill-host "
              f"(heartbeat timeout {state['heartbeat_timeout']} s)")
        wait_until(lambda: HOSTS[1] not in cl.executor_hosts(spark), 30, "the driver drops host 2's executor")
        # the job goes on with the two hosts left
        assert sc.parallelize(range(100), 4).sum() == 4950
        r = cli("kill-host", 9, "--dir", d)
        assert r.returncode == 1 and "out of range" in r.stderr and "1..3" in r.stderr

        # ---- restart-host 2: the same Rhino worker (id, address) comes back; a new Spark worker
        t0 = time.monotonic()
        r = cli("restart-host", 2, "--dir", d)
        assert r.returncode == 0, r.stdout + r.stderr
        print(f"restart-host: {time.monotonic() - t0:.1f} s")
        state = json.loads((d / "cluster.json").read_text())
        assert state["hosts"][1]["rhino_worker"]["address"] == h2["rhino_worker"]["address"]
        assert {w["id"]: w["state"] for w in cl.coordinator_status()["workers"]} == dict.fromkeys(IDS, "alive")
        # the running application gets an executor on the new worker
        LocalCluster.attach(d).wait_for_executors(spark, timeout=60)
    finally:
        if spark is not None:
            spark.stop()
        if (d / "cluster.json").exists():
            state = json.loads((d / "cluster.json").read_text())
            everything = {p for rec in [state["master"], state["coordinator"]] +
                          [h[k] for h in state["hosts"] for k in ("spark_worker", "rhino_worker")]
                          if rec.get("pid") for p in session_members(rec["pid"]) + [rec["pid"]]}
            urls = {h["spark_worker"]["url"] for h in state["hosts"] if h["spark_worker"].get("url")}
            everything |= set(executors_of(urls))
            t0 = time.monotonic()
            r = cli("down", "--dir", d)
            print(f"`down`: {time.monotonic() - t0:.1f} s")
            try:
                assert r.returncode == 0, r.stdout + r.stderr
                assert [p for p in everything if alive(p)] == []
                assert executors_of(urls) == []
                assert LocalCluster.attach(d).running_pids() == []
                r = cli("down", "--dir", d)  # idempotent
                assert r.returncode == 0 and "nothing running" in r.stdout
            finally:
                LocalCluster.attach(d).down()  # whatever happened above, leave nothing behind


def test_cli_errors_are_clear(tmp_path: Path) -> None:
    r = cli("status", "--dir", tmp_path / "none")
    assert r.returncode == 1 and "no cluster" in r.stderr and "up --dir" in r.stderr
    r = cli("up", "--hosts", 0, "--dir", tmp_path / "c")
    assert r.returncode == 1 and "at least 1" in r.stderr
    r = cli("up", "--hosts", 3, "--first-host", 253, "--dir", tmp_path / "c")
    assert r.returncode == 1 and "out of range" in r.stderr
    r = cli("up", "--hosts", 3, "--replicas", 3, "--dir", tmp_path / "c")
    assert r.returncode == 1 and "hosts - 1 = 2" in r.stderr
