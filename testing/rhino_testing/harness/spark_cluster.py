"""A local multi-host Spark + Rhino cluster on loopback addresses (docs/design.md §6, §8):
what the Spark tests, the benchmarks and the demo run on.

One machine, several "hosts": every address in 127.0.0.0/8 is loopback on Linux, so host k
gets its own address and its own processes, and host-level locality and kills are real.

- 127.0.0.1: a Spark standalone master and a ``rhino coordinator`` (the driver connects
  from here too);
- host n = 127.0.0.(first_host + n - 1), n = 1..N (first_host 2 by default): one Spark
  standalone worker (``--host`` that address, its own work and local dirs) and one
  ``rhino worker`` (id ``w<last octet>``, listening on that address, its own store,
  a Unix socket, registered with the coordinator).

Every daemon runs in its own session (``setsid``), stdin /dev/null, logging into the
cluster directory, so it outlives the command that started it; everything about it (PID,
start time, ports, addresses) is in ``DIR/cluster.json``, and it is stopped by PID. Spark
executors and their Python workers are descendants of their Spark worker and stay in its
session (PySpark's daemon only changes its process group), so stopping or killing "a Spark
worker" means every process of that session. A PID is only signalled while its start time
still matches the recorded one, so a stale cluster.json never hits a reused PID.

Executors inherit their Spark worker's environment, so a task knows its host's Rhino
worker without any lookup: ``RHINO_WORKER_ID``, ``RHINO_WORKER_ADDRESS``,
``RHINO_WORKER_SOCKET`` (the Unix socket), ``RHINO_HOST``, ``RHINO_COORDINATOR`` and
``RHINO_SECRET_FILE``, besides ``SPARK_LOCAL_IP``.

Command line (``rhino-bench cluster``)::

    up --hosts 3 [--dir DIR] [--first-host 2] [--cores 1] [--memory 2g] [--replicas 2]
       [--heartbeat-timeout 2]
    status [--dir DIR] [--json]
    kill-host N [--dir DIR]      # SIGKILL host N's Spark worker, executors and Rhino worker at once
    restart-host N [--dir DIR]
    add-host [--dir DIR]         # a new host joins: a Spark worker and a Rhino worker
    decommission-host N [--dir DIR] [--force]   # everything moved off at batch barriers, then stopped
    down [--dir DIR]

Python::

    with LocalCluster.up(tmp_path, hosts=3) as cluster:
        spark = SparkSession.builder.config(map=cluster.spark_conf()).getOrCreate()
        cluster.wait_for_executors(spark)
        ...
        cluster.kill_host(2)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

__all__ = ["LocalCluster", "HostInfo", "RhinoWorkerInfo", "ClusterError", "DEFAULT_DIR", "main"]

DEFAULT_DIR = Path(".rhino-cluster")
STATE_FILE = "cluster.json"
MASTER_IP = "127.0.0.1"

Progress = Optional[Callable[[str], None]]


class ClusterError(RuntimeError):
    """A cluster that cannot start, or an operation on one that is not there."""


# ---- processes, by PID and /proc ---------------------------------------------------------------


def _stat(pid: int) -> Optional[tuple[str, int, int, int]]:
    """(state, process group, session, start time in clock ticks) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # comm may hold spaces and parentheses
    # fields[0] is stat(5) field 3 (state): pgrp is field 5, session 6, starttime 22
    return fields[0], int(fields[2]), int(fields[3]), int(fields[19])


def _start_time(pid: int) -> Optional[int]:
    st = _stat(pid)
    return None if st is None else st[3]


def _running(pid: int, start: Optional[int]) -> bool:
    """The process `pid` exists, is not a zombie, and (if `start` is known) is the one that
    started at `start` (not a later process that reuses the PID)."""
    st = _stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start is None or st[3] == start


def _session_members(sid: int, since: Optional[int]) -> list[int]:
    """Running processes of session `sid` that started no earlier than `since` (the leader's
    start time: a descendant cannot be older than it)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[0] in ("Z", "X") or st[2] != sid:
            continue
        if since is not None and st[3] < since:
            continue
        out.append(int(name))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _session_pids(rec: dict) -> list[int]:
    """The running processes of a recorded daemon's session (the daemon and its descendants),
    or [] if the daemon's session leader is gone and no member is left."""
    pid, start = rec.get("pid"), rec.get("start")
    if not pid:
        return []
    st = _stat(pid)
    if st is not None and start is not None and st[3] != start:
        return []  # the PID now names another process: our session ended long ago
    return _session_members(pid, start)


def _reap(children: dict[int, subprocess.Popen]) -> None:
    """Collects the exit status of our own children that ended, so that they leave /proc."""
    for pid, p in list(children.items()):
        if p.poll() is not None:
            children.pop(pid, None)


def _terminate(records: list[dict], *, timeout: float, children: dict[int, subprocess.Popen],
               sig: int = signal.SIGTERM) -> list[int]:
    """Sends `sig` to every process of every recorded daemon's session, waits up to `timeout`
    for them to end, then SIGKILLs what is left (again until none is). Returns the PIDs
    that had to be SIGKILLed."""
    deadline = time.monotonic() + timeout
    signalled: set[int] = set()
    while True:
        _reap(children)
        live = sorted({p for r in records for p in _session_pids(r)})
        if not live:
            return []
        fresh = [p for p in live if p not in signalled]  # a process forked after the first round
        _signal(fresh, sig)
        signalled.update(fresh)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    killed: list[int] = []
    for _ in range(200):  # up to ~10 s: SIGKILL is not refused, only slow to take effect
        _reap(children)
        live = sorted({p for r in records for p in _session_pids(r)})
        if not live:
            break
        _signal(live, signal.SIGKILL)
        killed.extend(p for p in live if p not in killed)
        time.sleep(0.05)
    _reap(children)
    return killed


def _check_port(host: str, port: int, what: str) -> None:
    if port == 0:
        return
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ClusterError(f"{what}: port {port} on {host} is in use ({e.strerror}); pass another or 0 "
                               f"(any free port)") from None


def _check_address(ip: str) -> None:
    """Every 127.0.0.0/8 address is loopback on Linux, but a sandbox may allow 127.0.0.1 only."""
    with socket.socket() as s:
        try:
            s.bind((ip, 0))
        except OSError as e:
            raise ClusterError(f"cannot bind to {ip} ({e.strerror}): the cluster needs loopback addresses "
                               f"127.0.0.2 and up (Linux routes all of 127.0.0.0/8 to lo)") from None


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _wait_log(path: Path, offset: int, patterns: dict[str, str], *, what: str, proc: Optional[subprocess.Popen],
              pid: Optional[int] = None, timeout: float) -> dict[str, re.Match]:
    """Waits until every regex of `patterns` has matched a line of the log written after
    `offset`; ClusterError if the process exits or `timeout` passes first."""
    found: dict[str, re.Match] = {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            text = ""
        for key, rx in patterns.items():
            if key not in found:
                m = re.search(rx, text)
                if m:
                    found[key] = m
        if len(found) == len(patterns):
            return found
        exited = proc.poll() is not None if proc is not None else (pid is not None and not _running(pid, None))
        if exited:
            code = f" with code {proc.returncode}" if proc is not None else ""
            raise ClusterError(f"{what} exited{code} before it was ready; its log ({path}):\n{_tail(path)}")
        if time.monotonic() > deadline:
            missing = [patterns[k] for k in patterns if k not in found]
            raise ClusterError(f"{what} was not ready in {timeout:g} s (no log line matching {missing}); "
                               f"its log ({path}):\n{_tail(path)}")
        time.sleep(0.1)


def _spark_home() -> Path:
    try:
        import pyspark
    except ImportError as e:
        raise ClusterError("the cluster needs PySpark: pip install 'rhino-state[spark]'") from e
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise ClusterError(f"no bin/spark-class in {home}: is this the pip PySpark?")
    return home


def _java_check() -> None:
    import shutil

    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        raise ClusterError("no java on PATH and no JAVA_HOME: Spark needs Java 17 "
                           "(apt-get install openjdk-17-jdk-headless)")


# ---- the cluster -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RhinoWorkerInfo:
    """One host's ``rhino worker``."""
    id: str
    address: str            # host:port of its data plane and state service
    host: str
    unix_socket: str        # for clients on the same host
    pid: int
    metrics_port: int = 0


@dataclass(frozen=True)
class HostInfo:
    """Host `n` (1-based) of the cluster."""
    n: int
    ip: str
    state: str              # "up", "killed" or "down"
    spark_worker_pid: Optional[int]
    rhino_worker: RhinoWorkerInfo


class LocalCluster:
    """A cluster described by ``DIR/cluster.json``; made by :meth:`up` (starts it) or
    :meth:`attach` (one that is running, e.g. started by the command line). A context
    manager: leaving the ``with`` block takes it :meth:`down`. Hosts are numbered 1..N:
    host n is ``hosts[n - 1]``."""

    def __init__(self, directory: Union[str, Path], state: dict) -> None:
        self.dir = Path(directory).resolve()
        self._state = state
        self._lock = threading.RLock()
        # Daemons this process started: their Popen objects, to reap them (a child that
        # ends stays a zombie in /proc until its parent collects its status).
        self._children: dict[int, subprocess.Popen] = {}

    # ---- starting ----------------------------------------------------------------------------
    @classmethod
    def up(cls, directory: Union[str, Path] = DEFAULT_DIR, hosts: int = 3, *, first_host: int = 2, cores: int = 1,
           memory: str = "2g", executor_memory: str = "1g", daemon_memory: str = "512m",
           heartbeat_timeout: float = 2.0, replicas: Optional[int] = None, master_port: int = 0,
           coordinator_port: int = 0, timeout: float = 120.0, progress: Progress = None,
           tls: bool = False) -> "LocalCluster":
        """Starts a cluster of `hosts` hosts in `directory` (created; it must not hold a running
        cluster) and waits until it is ready: the Spark workers registered with the master and
        the Rhino workers with the coordinator. On any failure everything started is stopped
        and ClusterError raised.

        `cores` and `memory` are what each Spark worker offers; `executor_memory` what
        :meth:`spark_conf` asks per executor (it must fit `memory`); `daemon_memory` the heap
        of the master and worker JVMs. `heartbeat_timeout`: the coordinator declares a Rhino
        worker dead after that many seconds without a heartbeat. `replicas`: recorded as the
        cluster's default replication factor for operators (other workers per instance), at
        most hosts - 1. Ports are any free ones unless given. `tls`: every TCP link of Rhino
        runs mutual TLS, with a CA and per-host certificates made in `directory`/certs
        (`rhino certs init`); :attr:`tls` is what a client or a rhino.spark operator passes."""
        if hosts < 1:
            raise ClusterError(f"--hosts must be at least 1, got {hosts}")
        if first_host < 2 or first_host + hosts - 1 > 254:
            raise ClusterError(f"hosts 127.0.0.{first_host}..127.0.0.{first_host + hosts - 1} are out of range: "
                               f"the first host must be >= 2 (127.0.0.1 is the master's) and the last <= 254")
        if replicas is not None and not 0 <= replicas <= hosts - 1:
            raise ClusterError(f"--replicas {replicas}: an instance's replicas live on other hosts, so at most "
                               f"hosts - 1 = {hosts - 1}")
        if cores < 1:
            raise ClusterError(f"--cores must be at least 1, got {cores}")
        directory = Path(directory).resolve()
        existing = directory / STATE_FILE
        if existing.exists():
            old = cls.attach(directory)
            if old.running_pids():
                raise ClusterError(f"{directory} holds a running cluster: `rhino-bench cluster down "
                                   f"--dir {directory}` first")
            old._wipe()
        _java_check()
        spark_home = _spark_home()
        ips = [f"127.0.0.{first_host + i}" for i in range(hosts)]
        for ip in [MASTER_IP] + ips:
            _check_address(ip)
        _check_port(MASTER_IP, master_port, "the Spark master")
        _check_port(MASTER_IP, coordinator_port, "the coordinator")
        directory.mkdir(parents=True, exist_ok=True)

        from .workers import new_secret, write_secret

        secret_file = write_secret(directory, new_secret())
        tls_dir = None
        if tls:
            from rhino.spark.runtime.task import this_host
            from rhino.tls.certs import init as certs_init

            # the master's host (the coordinator's), every host's, and this process's own (a
            # driver here presents the certificate of the host it resolves to)
            tls_dir = directory / "certs"
            certs_init(tls_dir, sorted({MASTER_IP, this_host(), *ips}), force=True)
        state = {
            "version": 1, "dir": str(directory), "created": time.time(), "status": "starting",
            "python": sys.executable, "spark_home": str(spark_home), "secret_file": str(secret_file),
            "first_host": first_host, "n_hosts": hosts, "cores": cores, "memory": memory,
            "executor_memory": executor_memory, "daemon_memory": daemon_memory, "replicas": replicas,
            "heartbeat_timeout": heartbeat_timeout, "tls_dir": None if tls_dir is None else str(tls_dir),
            "master": {}, "coordinator": {},
            "hosts": [{"n": i + 1, "ip": ip, "state": "starting", "spark_worker": {},
                       "rhino_worker": {"id": f"w{first_host + i}"}} for i, ip in enumerate(ips)],
        }
        cluster = cls(directory, state)
        try:
            cluster._save()
            cluster._start_all(master_port, coordinator_port, timeout, progress or (lambda s: None))
        except BaseException:
            cluster.down(progress=progress)
            raise
        return cluster

    @classmethod
    def attach(cls, directory: Union[str, Path] = DEFAULT_DIR) -> "LocalCluster":
        """The cluster recorded in ``directory/cluster.json``."""
        path = Path(directory) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {Path(directory).resolve()} (no {STATE_FILE}): "
                               f"`rhino-bench cluster up --dir {directory}` starts one") from None
        return cls(directory, state)

    def _wipe(self) -> None:
        """Removes the stores, metadata and Spark dirs this (stopped) cluster recorded, so that a
        new cluster in the same directory starts empty rather than with the old coordinator's
        operators and the old workers' state. Only recorded paths inside the directory; logs stay."""
        import shutil

        st = self._state
        paths = [st.get("coordinator", {}).get("dir")]
        for h in st.get("hosts", []):
            paths += [h["rhino_worker"].get("dir"), h["spark_worker"].get("work_dir"),
                      h["spark_worker"].get("local_dir")]
        for p in paths:
            if p and Path(p).resolve().is_relative_to(self.dir) and Path(p).resolve() != self.dir:
                shutil.rmtree(p, ignore_errors=True)

    def _save(self) -> None:
        """cluster.json, replaced atomically: a `down` from another shell never reads half of it.
        Written after every process start, so a crashed `up` can still be taken down."""
        with self._lock:
            tmp = self.dir / (STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(self._state, indent=2))
            os.replace(tmp, self.dir / STATE_FILE)

    def _spawn(self, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as f:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                                 cwd=str(self.dir), start_new_session=True)
        self._children[p.pid] = p
        return p

    def _record(self, rec: dict, pid: int, **more: Any) -> None:
        with self._lock:
            rec.update(pid=pid, start=_start_time(pid), **more)
            self._save()

    def _spark_env(self, ip: str) -> dict[str, str]:
        env = dict(os.environ)
        home = self._state["spark_home"]
        env.update(SPARK_HOME=home, SPARK_LOCAL_IP=ip, SPARK_DAEMON_MEMORY=self._state["daemon_memory"],
                   PYSPARK_PYTHON=self._state["python"], SPARK_LOG_DIR=str(self.dir), SPARK_NO_DAEMONIZE="1")
        # Our own conf dir, empty: a spark-defaults.conf / spark-env.sh of the user's must not
        # change ports or hosts under the harness.
        env["SPARK_CONF_DIR"] = str(self._conf_dir())
        return env

    def _conf_dir(self) -> Path:
        d = self.dir / "spark-conf"
        d.mkdir(exist_ok=True)
        return d

    def _start_all(self, master_port: int, coordinator_port: int, timeout: float, say: Callable[[str], None]) -> None:
        t0 = time.monotonic()
        st = self._state
        # 1. The Spark master (a JVM: seconds), started first, waited for last.
        master_log = self.dir / "spark-master.log"
        env = self._spark_env(MASTER_IP)
        # No REST submission server: it wants the fixed port 6066 and would clash between clusters.
        env["SPARK_MASTER_OPTS"] = (env.get("SPARK_MASTER_OPTS", "") + " -Dspark.master.rest.enabled=false").strip()
        offset = _log_size(master_log)
        p = self._spawn([str(Path(st["spark_home"]) / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
                         "--host", MASTER_IP, "--port", str(master_port), "--webui-port", "0"], env, master_log)
        self._record(st["master"], p.pid, log=str(master_log), host=MASTER_IP)
        say(f"spark master: starting (pid {p.pid}, log {master_log})")

        # 2. The coordinator, then the Rhino workers (they register with it).
        from .workers import CoordinatorProcess

        coord = CoordinatorProcess(self.dir, secret_file=Path(st["secret_file"]), host=MASTER_IP,
                                   port=coordinator_port, heartbeat_timeout=st["heartbeat_timeout"],
                                   extra_args=self._tls_args(MASTER_IP))
        try:
            coord.start(timeout=timeout)
        except RuntimeError as e:
            raise ClusterError(str(e)) from None
        except BaseException:
            coord.stop()  # interrupted (Ctrl-C) while it started: not recorded yet
            raise
        self._children[coord.proc.pid] = coord.proc
        self._record(st["coordinator"], coord.proc.pid, log=str(coord.log_path), address=coord.address,
                     dir=str(coord.dir))
        say(f"rhino coordinator: up at {coord.address} (pid {coord.proc.pid}, heartbeat timeout "
            f"{st['heartbeat_timeout']:g} s)")
        self._start_rhino_workers([h["n"] for h in st["hosts"]], timeout, say)

        m = _wait_log(master_log, offset, {"url": r"Starting Spark master at (spark://\S+)",
                                           "ui": r"Successfully started service 'MasterUI' on port (\d+)",
                                           "alive": r"New state: ALIVE"},
                      what="the Spark master", proc=p, timeout=timeout)
        self._record(st["master"], p.pid, url=m["url"].group(1), webui=f"http://{MASTER_IP}:{m['ui'].group(1)}")
        say(f"spark master: up at {st['master']['url']}, web UI {st['master']['webui']}")

        # 3. The Spark workers (JVMs), all launched, then waited for.
        self._start_spark_workers([h["n"] for h in st["hosts"]], timeout, say)
        self._await_registered([h["n"] for h in st["hosts"]], timeout)
        for h in st["hosts"]:
            h["state"] = "up"
        st["status"] = "up"
        self._save()
        say(f"cluster up in {time.monotonic() - t0:.1f} s: {len(st['hosts'])} hosts "
            f"{st['hosts'][0]['ip']}..{st['hosts'][-1]['ip']}, master {st['master']['url']}, coordinator "
            f"{st['coordinator']['address']}; state in {self.dir / STATE_FILE}")

    def _start_rhino_workers(self, numbers: list[int], timeout: float, say: Callable[[str], None]) -> None:
        """Starts the Rhino workers of hosts `numbers` in parallel (each ~1 s of Python start-up).
        A restarted worker keeps its id, port, store and socket: the coordinator and the chains
        know it by them."""
        from .workers import WorkerProcess

        st = self._state
        errors: list[BaseException] = []
        started: list[tuple[int, Any]] = []

        # The threads only start processes; recording happens here, in the caller's thread,
        # which may hold self._lock (restart_host does).
        def one(n: int) -> None:
            h = st["hosts"][n - 1]
            rw = h["rhino_worker"]
            wp = WorkerProcess(self.dir, rw["id"], h["ip"], secret_file=Path(st["secret_file"]),
                               port=rw.get("port", 0), metrics=True,
                               extra_args=["--coordinator", st["coordinator"]["address"]] + self._tls_args(h["ip"]))
            if rw.get("unix_socket"):
                wp.unix_socket = Path(rw["unix_socket"])
            try:
                wp.start(timeout=timeout)
                started.append((n, wp))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in numbers]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        finally:
            # Interrupted (Ctrl-C): let the starts finish (each within `timeout`), so that what
            # they started is recorded below and the caller's down() stops it.
            for t in threads:
                t.join()
        for n, wp in sorted(started, key=lambda x: x[0]):
            h = st["hosts"][n - 1]
            self._children[wp.proc.pid] = wp.proc
            self._record(h["rhino_worker"], wp.proc.pid, log=str(wp.log_path), address=wp.address, port=wp.port,
                         dir=str(wp.dir), unix_socket=str(wp.unix_socket), metrics_port=wp.metrics_port,
                         host=h["ip"])
            say(f"host {n} ({h['ip']}): rhino worker {h['rhino_worker']['id']} listening at {wp.address} "
                f"(pid {wp.proc.pid})")
        if errors:
            raise ClusterError(f"a rhino worker did not start: {errors[0]}")

    def _start_spark_workers(self, numbers: list[int], timeout: float, say: Callable[[str], None]) -> None:
        st = self._state
        pending = []
        for n in numbers:
            h = st["hosts"][n - 1]
            ip, rw = h["ip"], h["rhino_worker"]
            hostdir = self.dir / f"host-{ip.rsplit('.', 1)[1]}"
            work, local = hostdir / "spark-work", hostdir / "spark-local"
            work.mkdir(parents=True, exist_ok=True)
            local.mkdir(parents=True, exist_ok=True)
            env = self._spark_env(ip)
            # Executors inherit this environment: a task finds its host's Rhino worker here.
            env.update(SPARK_LOCAL_DIRS=str(local), RHINO_HOST=ip, RHINO_WORKER_ID=rw["id"],
                       RHINO_WORKER_ADDRESS=rw["address"], RHINO_WORKER_SOCKET=rw["unix_socket"],
                       RHINO_COORDINATOR=st["coordinator"]["address"], RHINO_SECRET_FILE=st["secret_file"])
            log = self.dir / f"spark-worker-{ip.rsplit('.', 1)[1]}.log"
            offset = _log_size(log)
            p = self._spawn([str(Path(st["spark_home"]) / "bin" / "spark-class"),
                             "org.apache.spark.deploy.worker.Worker", "--host", ip, "--port", "0",
                             "--webui-port", "0", "--cores", str(st["cores"]), "--memory", st["memory"],
                             "--work-dir", str(work), st["master"]["url"]], env, log)
            self._record(h["spark_worker"], p.pid, log=str(log), work_dir=str(work), local_dir=str(local))
            say(f"host {n} ({ip}): spark worker starting (pid {p.pid})")
            pending.append((n, p, log, offset))
        for n, p, log, offset in pending:
            h = st["hosts"][n - 1]
            m = _wait_log(log, offset, {"port": r"Successfully started service 'sparkWorker' on port (\d+)",
                                        "ui": r"Successfully started service 'WorkerUI' on port (\d+)",
                                        "registered": r"Successfully registered with master"},
                          what=f"the Spark worker of host {n} ({h['ip']})", proc=p, timeout=timeout)
            port = int(m["port"].group(1))
            self._record(h["spark_worker"], p.pid, port=port, url=f"spark://Worker@{h['ip']}:{port}",
                         webui=f"http://{h['ip']}:{m['ui'].group(1)}")
            say(f"host {n} ({h['ip']}): spark worker registered with the master ({h['spark_worker']['url']})")

    def _await_registered(self, numbers: list[int], timeout: float) -> None:
        """Until the coordinator lists the Rhino workers of `numbers` as alive (with their
        current incarnation, at their recorded address)."""
        want = {self._state["hosts"][n - 1]["rhino_worker"]["id"]: self._state["hosts"][n - 1]["rhino_worker"]["address"]
                for n in numbers}
        deadline = time.monotonic() + timeout
        seen: dict = {}
        while True:
            try:
                seen = {w["id"]: w for w in self.coordinator_status()["workers"]}
            except Exception:  # the coordinator is busy starting
                seen = {}
            if all(i in seen and seen[i]["state"] == "alive" and seen[i]["address"] == a for i, a in want.items()):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"rhino workers not registered with the coordinator in {timeout:g} s: want "
                                   f"{want}, the coordinator has {[(w['id'], w['state']) for w in seen.values()]}")
            time.sleep(0.1)

    # ---- what the tests and the benchmarks read ----------------------------------------------
    @property
    def state(self) -> dict:
        """A copy of what cluster.json records."""
        return json.loads(json.dumps(self._state))

    @property
    def master_url(self) -> str:
        return self._state["master"]["url"]

    @property
    def master_webui(self) -> str:
        return self._state["master"]["webui"]

    @property
    def hosts(self) -> list[str]:
        """The hosts' addresses; host n is ``hosts[n - 1]``."""
        return [h["ip"] for h in self._state["hosts"]]

    @property
    def coordinator(self) -> str:
        """The coordinator's ``host:port``."""
        return self._state["coordinator"]["address"]

    @property
    def secret_file(self) -> Path:
        return Path(self._state["secret_file"])

    @property
    def tls(self) -> Any:
        """The cluster's ``rhino.TLS`` for its hosts' infrastructure and admin (``{host}`` in its
        paths: each process's own host; roles admin, coordinator, worker), or None when it runs
        plaintext. Pass it to ``rhino.connect`` and ``connect_coordinator`` as the admin; a
        ``rhino.spark`` operator gets :attr:`task_tls`."""
        return self._tls_of("")

    @property
    def task_tls(self) -> Any:
        """The hosts' task certificates (``{host}-task.pem``, role task only), or None when the
        cluster runs plaintext: what a ``rhino.spark`` operator's ``tls=`` is given, so that its
        driver and tasks prove the task role and no other (docs/protocol.md §2, "TLS")."""
        return self._tls_of("-task")

    def _tls_of(self, suffix: str) -> Any:
        d = self._state.get("tls_dir")
        if not d:
            return None
        from rhino.tls.config import TLS

        return TLS(f"{d}/{{host}}{suffix}.pem", f"{d}/{{host}}{suffix}.key", f"{d}/ca.pem")

    def _tls_args(self, host: str) -> list[str]:
        d = self._state.get("tls_dir")
        if not d:
            return []
        return ["--tls-cert", f"{d}/{host}.pem", "--tls-key", f"{d}/{host}.key", "--tls-ca", f"{d}/ca.pem"]

    @property
    def replicas(self) -> Optional[int]:
        """The replication factor given to ``up`` (None: the coordinator's default)."""
        return self._state.get("replicas")

    @property
    def rhino_workers(self) -> list[RhinoWorkerInfo]:
        """Per host, in host order."""
        return [self.host(h["n"]).rhino_worker for h in self._state["hosts"]]

    def host(self, n: Union[int, str]) -> HostInfo:
        h = self._host_rec(n)
        rw = h["rhino_worker"]
        return HostInfo(n=h["n"], ip=h["ip"], state=h["state"], spark_worker_pid=h["spark_worker"].get("pid"),
                        rhino_worker=RhinoWorkerInfo(id=rw["id"], address=rw.get("address", ""), host=h["ip"],
                                                     unix_socket=rw.get("unix_socket", ""), pid=rw.get("pid", 0),
                                                     metrics_port=rw.get("metrics_port", 0)))

    def _host_rec(self, n: Union[int, str]) -> dict:
        hosts = self._state["hosts"]
        if isinstance(n, str) and not n.isdigit():
            for h in hosts:
                if h["ip"] == n or h["rhino_worker"]["id"] == n:
                    return h
            raise ClusterError(f"no host {n!r} in this cluster: its hosts are {', '.join(self.hosts)}")
        n = int(n)
        if not 1 <= n <= len(hosts):
            raise ClusterError(f"host number {n} is out of range: this cluster has hosts 1..{len(hosts)} "
                               f"({hosts[0]['ip']}..{hosts[-1]['ip']})")
        return hosts[n - 1]

    def spark_conf(self, spare_hosts: int = 0, **overrides: Any) -> dict[str, str]:
        """Conf entries for ``SparkSession.builder.config(map=...)``: the master, the locality
        helper's jar, the driver on 127.0.0.1, the venv's Python on both sides (this also sets
        ``$PYSPARK_PYTHON`` in this process if it is unset: see below), and executors
        that fit the hosts (one per host, `cores` cores, `executor_memory`). Anything can be
        overridden, with Spark's key names: ``spark_conf(**{"spark.locality.wait": "10s"})``;
        ``spark.network.timeout`` and ``spark.locality.wait`` are Spark's defaults unless so."""
        from rhino.spark.scheduling.jar import jar_path

        st = self._state
        py = st["python"]
        # PySpark's driver takes the Python of its tasks from $PYSPARK_PYTHON when the
        # SparkContext starts (else "python3" on PATH, which may lack rhino and pandas);
        # spark.pyspark.python only counts under spark-submit. So set it here, unless the
        # caller chose one.
        os.environ.setdefault("PYSPARK_PYTHON", py)
        conf = {
            "spark.master": self.master_url,
            "spark.jars": str(jar_path()),
            "spark.driver.host": MASTER_IP,
            "spark.driver.bindAddress": MASTER_IP,
            "spark.pyspark.python": py,
            "spark.pyspark.driver.python": py,
            "spark.executorEnv.PYSPARK_PYTHON": py,
            "spark.executor.memory": st["executor_memory"],
            "spark.executor.cores": str(st["cores"]),
            # one executor per host; `spare_hosts` more for hosts that join later (add_host)
            "spark.cores.max": str(st["cores"] * (len(st["hosts"]) + spare_hosts)),
            # Small batches of small tasks: Spark's 200 shuffle partitions would be 200 tasks on 3 cores.
            "spark.sql.shuffle.partitions": str(max(2, len(st["hosts"]) * st["cores"])),
            "spark.ui.showConsoleProgress": "false",
            # A task of a cancelled attempt (rhino.spark's batch watch cancels an attempt whose
            # epoch passed) holds its core until its Python worker is gone: Spark waits this
            # long (2 s by default) before killing a Python worker that has not stopped.
            "spark.python.task.killTimeout": "200ms",
            # Explicit, because PySpark's SparkSession.Builder keeps options in a class-level dict:
            # an earlier builder's spark.ui.enabled=false in the same process would otherwise
            # leak into this session (locality is read from the UI's REST API).
            "spark.ui.enabled": "true",
        }
        for k, v in overrides.items():
            if v is None:
                conf.pop(k, None)
            else:
                conf[k] = str(v)
        return conf

    def spark_session(self, app_name: str = "rhino", *, wait_executors: bool = True, timeout: float = 90.0,
                      **conf: Any) -> Any:
        """A SparkSession on this cluster (:meth:`spark_conf` plus `conf`), after all its
        executors registered (one per live host) when `wait_executors`."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        active = SparkContext._active_spark_context
        if active is not None and active.master != self.master_url:
            # getOrCreate() would hand back that one, with none of this cluster's conf.
            raise ClusterError(f"a SparkContext on {active.master} is running in this process: stop it first "
                               f"(spark.stop()); one process has one SparkContext")
        spark = SparkSession.builder.appName(app_name).config(map=self.spark_conf(**conf)).getOrCreate()
        if wait_executors:
            try:
                self.wait_for_executors(spark, timeout=timeout)
            except BaseException:
                spark.stop()
                raise
        return spark

    def executor_hosts(self, spark_or_sc: Any) -> dict[str, int]:
        """{host: executors} the driver knows now, without the driver itself."""
        sc = getattr(spark_or_sc, "sparkContext", spark_or_sc)
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        out: dict[str, int] = {}
        for info in infos:
            host = info.host()
            if host in self.hosts:
                out[host] = out.get(host, 0) + 1
        return out

    def wait_for_executors(self, spark_or_sc: Any, hosts: Optional[Iterable[str]] = None,
                           timeout: float = 90.0) -> dict[str, int]:
        """Waits until an executor is registered on each of `hosts` (default: every host that is
        up): before that, a task pinned to a host without one runs elsewhere once
        ``spark.locality.wait`` passes."""
        want = set(hosts) if hosts is not None else {h["ip"] for h in self._state["hosts"] if h["state"] == "up"}
        deadline = time.monotonic() + timeout
        while True:
            have = self.executor_hosts(spark_or_sc)
            if want <= set(have):
                return have
            if time.monotonic() > deadline:
                raise ClusterError(f"executors on {sorted(want - set(have))} did not register in {timeout:g} s "
                                   f"(have {have}); see the Spark worker logs in {self.dir}")
            time.sleep(0.2)

    def coordinator_client(self) -> Any:
        """A :class:`rhino.coordinator.client.CoordinatorClient` (close it, or use ``with``)."""
        from rhino.coordinator.client import connect_coordinator
        from rhino.replication import read_secret_file

        from rhino.spark.runtime.task import this_host
        from rhino.tls.config import for_host

        return connect_coordinator(self.coordinator, secret=read_secret_file(str(self.secret_file)),
                                   client_id="rhino-spark-cluster", tls=for_host(self.tls, this_host()))

    def coordinator_status(self) -> dict:
        with self.coordinator_client() as c:
            return c.status()

    def coordinator_events(self) -> list[dict]:
        """Every event of the coordinator's log, oldest first, read only from its database
        (``status`` shows the last 20 only); ``status``'s if the database is not found."""
        import sqlite3

        d = self.state.get("coordinator", {}).get("dir")
        dbs = sorted(Path(d).rglob("coordinator.db")) if d else []
        if not dbs:
            return self.coordinator_status()["events"]
        db = sqlite3.connect(f"file:{dbs[0]}?mode=ro", uri=True)
        try:
            rows = db.execute("SELECT at, kind, detail FROM events ORDER BY id").fetchall()
        finally:
            db.close()
        return [{"at": at, "kind": kind, **json.loads(detail)} for at, kind, detail in rows]

    def master_status(self) -> dict:
        """The master's ``/json/`` page: workers (with state), cores, applications."""
        with urllib.request.urlopen(f"{self.master_webui}/json/", timeout=5) as r:
            return json.loads(r.read())

    def executor_pids(self, n: Optional[Union[int, str]] = None) -> list[int]:
        """Running ``CoarseGrainedExecutorBackend`` processes of host `n` (all hosts if None):
        those in its Spark worker's session, or naming its worker URL on their command line
        (an executor that outlived a restart of its worker)."""
        recs = [self._host_rec(n)] if n is not None else self._state["hosts"]
        out = set()
        for h in recs:
            sw = h["spark_worker"]
            urls = set(sw.get("urls", [])) | ({sw["url"]} if sw.get("url") else set())
            for pid in _session_pids(sw):
                if any("CoarseGrainedExecutorBackend" in a for a in _cmdline(pid)):
                    out.add(pid)
            if urls:
                for name in os.listdir("/proc"):
                    if name.isdigit():
                        cmd = _cmdline(int(name))
                        if any("CoarseGrainedExecutorBackend" in a for a in cmd) and urls & set(cmd) \
                                and _running(int(name), None):
                            out.add(int(name))
        return sorted(out)

    def _records(self, host: Optional[dict] = None) -> list[dict]:
        if host is not None:
            return [host["spark_worker"], host["rhino_worker"]]
        st = self._state
        return [st["master"], st["coordinator"]] + [r for h in st["hosts"] for r in (h["spark_worker"], h["rhino_worker"])]

    def running_pids(self) -> list[int]:
        """Every running process of the cluster: the daemons and their descendants (executors,
        PySpark's Python workers)."""
        return sorted({p for r in self._records() for p in _session_pids(r)} | set(self.executor_pids()))

    def status(self) -> dict:
        """What is up: per daemon its PID and whether it runs; the master's and the
        coordinator's views when they answer."""
        st = self._state

        def proc(rec: dict) -> dict:
            return {"pid": rec.get("pid"), "running": bool(rec.get("pid")) and _running(rec["pid"], rec.get("start"))}

        out: dict[str, Any] = {"dir": str(self.dir), "status": st.get("status"),
                               "master": {**proc(st["master"]), "url": st["master"].get("url"),
                                          "webui": st["master"].get("webui")},
                               "coordinator": {**proc(st["coordinator"]), "address": st["coordinator"].get("address")},
                               "hosts": []}
        for h in st["hosts"]:
            out["hosts"].append({"n": h["n"], "ip": h["ip"], "state": h["state"],
                                 "spark_worker": proc(h["spark_worker"]),
                                 "rhino_worker": {**proc(h["rhino_worker"]), "id": h["rhino_worker"]["id"],
                                                  "address": h["rhino_worker"].get("address")},
                                 "executors": self.executor_pids(h["n"])})
        try:
            ms = self.master_status()
            out["spark"] = {"alive_workers": [f"{w['host']}:{w['port']}" for w in ms.get("workers", [])
                                              if w.get("state") == "ALIVE"],
                            "applications": [a.get("name") for a in ms.get("activeapps", [])]}
        except Exception as e:
            out["spark"] = {"error": str(e)}
        try:
            cs = self.coordinator_status()
            out["rhino"] = {"workers": {w["id"]: w["state"] for w in cs["workers"]},
                            "operators": [o["operator_id"] for o in cs["operators"]]}
        except Exception as e:
            out["rhino"] = {"error": str(e)}
        return out

    # ---- failures and shutdown ---------------------------------------------------------------
    def kill_host(self, n: Union[int, str]) -> list[int]:
        """SIGKILLs host `n`'s Spark worker, its executors (and their Python workers) and its
        Rhino worker, all in one sweep, like a VM that is lost: no process gets to shut down
        cleanly or hear about the others first. Returns the PIDs killed. Recorded in
        cluster.json (the host's state "killed", ``killed_at``: the time of the first signal,
        after the process listing)."""
        with self._lock:
            h = self._host_rec(n)
            recs = self._records(h)
            targets = sorted({p for r in recs for p in _session_pids(r)} | set(self.executor_pids(h["n"])))
            # the moment of the loss: the first signal, after the /proc scans above
            killed_at = time.time()
            _signal(targets, signal.SIGKILL)
            # Whatever forked between the listing and the signals: again until nothing is left.
            _terminate(recs, timeout=0, children=self._children, sig=signal.SIGKILL)
            left = [p for p in self.executor_pids(h["n"])]
            _signal(left, signal.SIGKILL)
            h["state"] = "killed"
            h["killed_at"] = killed_at
            h["killed_pids"] = targets
            self._save()
            return targets

    def killed_at(self, n: Union[int, str]) -> Optional[float]:
        """When :meth:`kill_host` sent host `n` its first SIGKILL (None: not killed)."""
        with self._lock:
            return self._host_rec(n).get("killed_at")

    def restart_host(self, n: Union[int, str], *, timeout: float = 120.0, progress: Progress = None) -> HostInfo:
        """Brings host `n` back after :meth:`kill_host`: its Rhino worker (same id, address,
        store and socket: it comes back as the same worker, with a new incarnation) and its
        Spark worker (a new one on the same address; a running application gets an executor
        on it again). Waits for both to register."""
        say = progress or (lambda s: None)
        with self._lock:
            h = self._host_rec(n)
            if any(_session_pids(r) for r in self._records(h)):
                raise ClusterError(f"host {h['n']} ({h['ip']}) still has running processes: kill_host it first")
            sw = h["spark_worker"]
            if sw.get("url"):
                sw.setdefault("urls", []).append(sw["url"])  # to find executors of the old worker, if any
            self._start_rhino_workers([h["n"]], timeout, say)
            self._start_spark_workers([h["n"]], timeout, say)
            self._await_registered([h["n"]], timeout)
            h["state"] = "up"
            h.pop("killed_at", None)
            self._save()
            return self.host(h["n"])

    def add_host(self, *, timeout: float = 120.0, progress: Progress = None) -> HostInfo:
        """A new host joins: the next address after the last host's, with a Spark worker (a
        running application gets an executor on it if its ``spark.cores.max`` allows: see
        :meth:`spark_conf`'s ``spare_hosts``) and a Rhino worker registered with the
        coordinator, which places nothing on it until asked (a rescale ``on`` it, a
        rebalance) or until a chain needs a member. Waits for both to register."""
        say = progress or (lambda s: None)
        with self._lock:
            st = self._state
            n = len(st["hosts"]) + 1
            octet = st["first_host"] + n - 1
            if octet > 254:
                raise ClusterError(f"no address left for host {n}: 127.0.0.{octet} is out of range")
            ip = f"127.0.0.{octet}"
            _check_address(ip)
            if st.get("tls_dir") and not Path(st["tls_dir"], f"{ip}.pem").exists():
                from rhino.tls.certs import init as certs_init

                certs_init(st["tls_dir"], [ip])  # its certificate, signed by the cluster's CA
            st["hosts"].append({"n": n, "ip": ip, "state": "starting", "spark_worker": {},
                                "rhino_worker": {"id": f"w{octet}"}})
            st["n_hosts"] = n
            self._save()
            say(f"host {n} ({ip}): joining")
            self._start_rhino_workers([n], timeout, say)
            self._start_spark_workers([n], timeout, say)
            self._await_registered([n], timeout)
            st["hosts"][n - 1]["state"] = "up"
            self._save()
            return self.host(n)

    def decommission_host(self, n: Union[int, str], *, timeout: float = 300.0, force: bool = False,
                          progress: Progress = None) -> dict:
        """Takes host `n` away without losing a batch: the coordinator's ``decommission`` of its
        Rhino worker (nothing new placed on it; every operator moves its primaries and
        replicas off it at its next batch barrier: running queries must run batches, or pass
        `force`), polled until drained, then the host's processes are stopped (SIGTERM: its
        Spark worker with its executors, and its Rhino worker). Returns the coordinator's
        last answer, with ``drain_s``. Raises ClusterError if it is not drained in `timeout`
        (the host is left running)."""
        say = progress or (lambda s: None)
        with self._lock:
            h = self._host_rec(n)
            wid = h["rhino_worker"]["id"]
            t0 = time.monotonic()
            with self.coordinator_client() as cc:
                out = cc.decommission(wid, force=force)
                say(f"host {h['n']} ({h['ip']}): decommissioning {wid}; held by {out['operators'] or 'nothing'}")
                while not out["drained"]:
                    if time.monotonic() - t0 > timeout:
                        raise ClusterError(f"host {h['n']} ({h['ip']}): {wid} not drained in {timeout:g} s: still "
                                           f"held by {out['operators']} (waiting for the batch barrier of "
                                           f"{out['waiting_for_barrier']}; force=True moves them now)")
                    time.sleep(0.2)
                    out = cc.decommission(wid, force=force)
            out["drain_s"] = time.monotonic() - t0
            say(f"host {h['n']} ({h['ip']}): {wid} drained in {out['drain_s']:.1f} s; stopping the host")
            _terminate(self._records(h), timeout=15.0, children=self._children)
            left = self.executor_pids(h["n"])
            if left:
                _signal(left, signal.SIGKILL)
            h["state"] = "decommissioned"
            h["decommissioned_at"] = time.time()
            self._save()
            return out

    def down(self, *, timeout: float = 15.0, progress: Progress = None) -> list[int]:
        """Stops every process of the cluster: SIGTERM to each daemon's whole session
        (executors and Python workers included), SIGKILL to what is left after `timeout`.
        Idempotent: a cluster that is down, half started or partly killed is fine. Returns
        the PIDs that needed SIGKILL."""
        say = progress or (lambda s: None)
        with self._lock:
            t0 = time.monotonic()
            # Also every daemon this process started, recorded or not (an interrupted start).
            recs = self._records() + [{"pid": pid, "start": _start_time(pid)} for pid in self._children]
            live = self.running_pids()
            if live:
                say(f"stopping {len(live)} processes (SIGTERM, SIGKILL after {timeout:g} s)")
            killed = _terminate(recs, timeout=timeout, children=self._children)
            # Executors that left the sessions (none should): by their worker URL.
            stray = self.executor_pids()
            if stray:
                _signal(stray, signal.SIGKILL)
                killed += stray
            for p in list(self._children.values()):
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self._children.clear()
            for h in self._state["hosts"]:
                h["state"] = "down"
            self._state["status"] = "down"
            if self.dir.exists():
                self._save()
            if live:
                say(f"cluster down in {time.monotonic() - t0:.1f} s" + (f" ({len(killed)} needed SIGKILL)"
                                                                          if killed else ""))
            left = self.running_pids()
            if left:
                raise ClusterError(f"processes of the cluster still running after down: {left}")
            return killed

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()


# ---- command line ------------------------------------------------------------------------------


def _print_status(s: dict) -> None:
    def mark(p: dict) -> str:
        return f"pid {p['pid']} " + ("running" if p["running"] else "NOT running") if p.get("pid") else "not started"

    print(f"cluster {s['dir']}: {s['status']}")
    print(f"  spark master   {s['master'].get('url')}  web UI {s['master'].get('webui')}  ({mark(s['master'])})")
    print(f"  coordinator    {s['coordinator'].get('address')}  ({mark(s['coordinator'])})")
    for h in s["hosts"]:
        print(f"  host {h['n']} {h['ip']:<12} {h['state']:<8} spark worker ({mark(h['spark_worker'])}), "
              f"rhino worker {h['rhino_worker']['id']} at {h['rhino_worker']['address']} "
              f"({mark(h['rhino_worker'])}), executors {h['executors'] or 'none'}")
    sp = s.get("spark", {})
    if "error" in sp:
        print(f"  spark: master does not answer ({sp['error']})")
    else:
        print(f"  spark: alive workers {sp['alive_workers']}, applications {sp['applications']}")
    rh = s.get("rhino", {})
    if "error" in rh:
        print(f"  rhino: coordinator does not answer ({rh['error']})")
    else:
        print(f"  rhino: workers {rh['workers']}, operators {rh['operators']}")


def main(argv: Optional[list[str]] = None) -> int:
    from rhino.errors import RhinoError

    p = argparse.ArgumentParser(prog="rhino-bench cluster",
                                description="A local multi-host Spark standalone + Rhino cluster on loopback "
                                            "addresses (127.0.0.1: master and coordinator; 127.0.0.2..: hosts).")
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_dir(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help=f"the cluster's directory: logs, stores, cluster.json (default: {DEFAULT_DIR})")
        return sp

    up = with_dir(sub.add_parser("up", help="start a cluster and wait until it is ready"))
    up.add_argument("--hosts", type=int, default=3, help="hosts (default: 3)")
    up.add_argument("--first-host", type=int, default=2,
                    help="last octet of host 1's address (default: 2, i.e. 127.0.0.2); another cluster at the "
                         "same time can take e.g. 10")
    up.add_argument("--cores", type=int, default=1, help="cores each Spark worker offers (default: 1)")
    up.add_argument("--memory", default="2g", help="memory each Spark worker offers (default: 2g)")
    up.add_argument("--executor-memory", default="1g", help="what spark_conf() asks per executor (default: 1g)")
    up.add_argument("--replicas", type=int, default=None,
                    help="the cluster's default replication factor for operators (other workers per instance)")
    up.add_argument("--heartbeat-timeout", type=float, default=2.0,
                    help="seconds without a heartbeat before the coordinator declares a Rhino worker dead "
                         "(default: 2)")
    up.add_argument("--master-port", type=int, default=0, help="the Spark master's port (default: any free)")
    up.add_argument("--coordinator-port", type=int, default=0, help="the coordinator's port (default: any free)")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (default: 120)")
    up.add_argument("--tls", action="store_true",
                    help="mutual TLS on every Rhino TCP link: a CA and per-host certificates are made in DIR/certs "
                         "(H.pem for the host's Rhino processes and the CLI, H-task.pem for its Spark tasks)")
    with_dir(sub.add_parser("down", help="stop every process of the cluster"))
    stp = with_dir(sub.add_parser("status", help="what is up"))
    stp.add_argument("--json", action="store_true")
    kh = with_dir(sub.add_parser("kill-host", help="SIGKILL host N's Spark worker, executors and Rhino worker"))
    kh.add_argument("n", help="host number (1..N) or its address")
    rh = with_dir(sub.add_parser("restart-host", help="bring a killed host back"))
    rh.add_argument("n", help="host number (1..N) or its address")
    with_dir(sub.add_parser("add-host", help="a new host joins (a Spark worker and a Rhino worker)"))
    dh = with_dir(sub.add_parser("decommission-host", help="move everything off host N at batch barriers, "
                                 "then stop it"))
    dh.add_argument("n", help="host number (1..N) or its address")
    dh.add_argument("--force", action="store_true", help="move every operator now, not at its next barrier")
    dh.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the drain (default: 300)")
    args = p.parse_args(argv)

    def say(s: str) -> None:
        print(s, flush=True)

    try:
        if args.cmd == "up":
            LocalCluster.up(args.dir, args.hosts, first_host=args.first_host, cores=args.cores, memory=args.memory,
                            executor_memory=args.executor_memory, heartbeat_timeout=args.heartbeat_timeout,
                            replicas=args.replicas, master_port=args.master_port,
                            coordinator_port=args.coordinator_port, timeout=args.timeout, progress=say,
                            tls=args.tls)
        elif args.cmd == "down":
            c = LocalCluster.attach(args.dir)
            if not c.running_pids():
                c.down()
                say(f"cluster {c.dir}: nothing running")
            else:
                c.down(progress=say)
        elif args.cmd == "status":
            s = LocalCluster.attach(args.dir).status()
            if args.json:
                print(json.dumps(s, indent=2))
            else:
                _print_status(s)
        elif args.cmd == "kill-host":
            c = LocalCluster.attach(args.dir)
            h = c.host(args.n)
            pids = c.kill_host(args.n)
            say(f"host {h.n} ({h.ip}): SIGKILLed {len(pids)} processes {pids}")
        elif args.cmd == "restart-host":
            c = LocalCluster.attach(args.dir)
            h = c.restart_host(args.n, progress=say)
            say(f"host {h.n} ({h.ip}): back up")
        elif args.cmd == "add-host":
            h = LocalCluster.attach(args.dir).add_host(progress=say)
            say(f"host {h.n} ({h.ip}): up")
        elif args.cmd == "decommission-host":
            LocalCluster.attach(args.dir).decommission_host(args.n, timeout=args.timeout, force=args.force,
                                                            progress=say)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RhinoError as e:  # the coordinator refused (e.g. a decommission of an unknown or dead worker)
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
