"""``rhino-bench failover``: the coordinator and how a worker's death is detected: a ``rhino coordinator``
process the workers heartbeat to, a coordinator served from this process, or one told at once."""

from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path
from typing import Any, Optional

from rhino_testing.harness.workers import SECRET, WorkerProcess


OPERATOR = "fo"


class BenchError(RuntimeError):
    """The benchmark could not measure what it set out to (a premature failover, a wrong state)."""


# ---- the coordinator and how a death is detected -------------------------------------------------
#
# Three ways, one interface: worker_args() (what A, B, C are started with), join(workers), arm() (right
# before the kill: the heartbeat timeout under test comes into force), failover(worker, ...) (waits for
# the coordinator to have failed the instance over; returns when A was declared dead and the takeover's
# figures), close().
#
# "process" (the default) is the deployment: a `rhino coordinator` process with the timeout on its
# command line from the start. "heartbeat" serves the coordinator from this process and arms its timeout
# only after the fill; it was written when a worker's heartbeats stopped while one of its instances
# committed a large batch (the throughput sampler's Worker.metrics() kept the GIL while it waited for the
# instance's mutex, which a commit holds through its write and checkpoint: 5.8 s for a 512 MiB batch
# here), so a 1 s timeout declared the primary dead in the middle of the fill. Fixed in 5231c24 (the
# binding releases the GIL); the mode stays for a build without the fix.


def _wait_failover(client: Any, worker: WorkerProcess, timeout: float) -> dict:
    """Polls the coordinator's status until it has declared `worker` dead and finished the failover;
    returns its dead_since and the takeover's figures (from its 'reconfigured' event)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = client.status()
        w = next(x for x in st["workers"] if x["id"] == worker.id)
        done = [e for e in st["events"] if e["kind"] == "failover_done" and e.get("worker") == worker.id]
        if w["state"] == "dead" and done:
            rec = [e for e in st["events"] if e["kind"] == "reconfigured" and e.get("operator") == OPERATOR
                   and e["at"] >= w["dead_since"]]
            if not rec or "takeover_figures" not in rec[-1]:
                raise BenchError("the coordinator's 'reconfigured' event carries no takeover figures "
                                 "(rhino.coordinator.replication_manager records them as takeover_figures)")
            return {"dead_since": w["dead_since"], "takeover": rec[-1]["takeover_figures"]["0"],
                    "recovery_s": done[-1].get("recovery_s"), "detected": True}
        time.sleep(0.05)
    raise BenchError(f"the coordinator did not fail {worker.id} over within {timeout:.0f} s of the kill")


class InProcessControl:
    """``--detection none``: an in-process Coordinator, ``declare_dead`` called right after the kill."""

    mode = "none"

    def __init__(self, root: Path, secret_file: Path, args: argparse.Namespace) -> None:
        from rhino.coordinator.client import LocalCoordinatorClient
        from rhino.coordinator.coordinator import Coordinator

        self.coord = Coordinator(str(root / "coordinator"), secret=SECRET, heartbeat_timeout=3600.0,
                                 copy_timeout=3600.0, request_timeout=600.0)
        self.client = LocalCoordinatorClient(self.coord)

    def worker_args(self) -> list[str]:
        return []

    def join(self, workers: list[WorkerProcess]) -> None:
        for w in workers:
            self.client.register(w.id, w.address, unix_socket=str(w.unix_socket), incarnation="bench")

    def arm(self) -> None:
        pass

    def failover(self, worker: WorkerProcess, kill_unix: float, timeout: float) -> dict:
        out = self.coord.declare_dead(worker.id, "bench: SIGKILL")
        row = self.coord.meta.worker(worker.id)
        tk = out["operators"][OPERATOR]["takeovers"]["0"]
        return {"dead_since": row.dead_since, "takeover": tk,
                "recovery_s": out.get("recovery_s", out.get("scheduling_s")), "detected": False}

    def close(self) -> None:
        self.coord.close()


class ServedControl:
    """``--detection heartbeat``: the Coordinator served from this process over the coordinator
    protocol (``rhino.coordinator.server.CoordinatorServer``, what ``rhino coordinator`` runs), with A,
    B and C started with ``--coordinator`` and heartbeating to it. Its timeout is an hour while the
    state is built and becomes ``--heartbeat-timeout`` right before the kill (see above why)."""

    mode = "heartbeat"

    def __init__(self, root: Path, secret_file: Path, args: argparse.Namespace) -> None:
        from rhino.coordinator.client import LocalCoordinatorClient
        from rhino.coordinator.coordinator import Coordinator
        from rhino.coordinator.server import CoordinatorServer

        self.args = args
        self.coord = Coordinator(str(root / "coordinator"), secret=SECRET, heartbeat_timeout=3600.0,
                                 copy_timeout=3600.0, request_timeout=600.0)
        self.server = CoordinatorServer(self.coord, "127.0.0.1", 0, secret=SECRET)
        self.address = self.server.address
        self.client = LocalCoordinatorClient(self.coord)

    def worker_args(self) -> list[str]:
        return ["--coordinator", self.address, "--coordinator-heartbeat", str(self.args.heartbeat_interval)]

    def join(self, workers: list[WorkerProcess]) -> None:
        _wait_registered(self.client, workers)

    def arm(self) -> None:
        # The workers are idle now (no commit holds an instance): a heartbeat every interval.
        _wait_heartbeats(self.client, self.args.heartbeat_interval, self.args.heartbeat_timeout)
        self.coord.heartbeat_timeout = float(self.args.heartbeat_timeout)

    def failover(self, worker: WorkerProcess, kill_unix: float, timeout: float) -> dict:
        return _wait_failover(self.client, worker, timeout)

    def close(self) -> None:
        self.server.close()
        self.coord.close()


class ProcessControl:
    """``--detection process``: a ``rhino coordinator`` process with ``--heartbeat-timeout`` from the
    start; the workers heartbeat to it (``rhino worker --coordinator``)."""

    mode = "process"

    def __init__(self, root: Path, secret_file: Path, args: argparse.Namespace) -> None:
        from rhino.coordinator.client import connect_coordinator
        from rhino_testing.harness.workers import CoordinatorProcess

        self.args = args
        self.client: Any = None
        self.proc = CoordinatorProcess(root, secret_file=secret_file, heartbeat_timeout=args.heartbeat_timeout,
                                       extra_args=["--request-timeout", "600", "--copy-timeout", "3600"])
        try:
            self.proc.start()
        except RuntimeError as e:
            raise BenchError(str(e)) from None
        self.address = self.proc.address
        self.client = connect_coordinator(self.address, secret=SECRET, client_id="bench", request_timeout=3600.0)

    def worker_args(self) -> list[str]:
        return ["--coordinator", self.address, "--coordinator-heartbeat", str(self.args.heartbeat_interval)]

    def join(self, workers: list[WorkerProcess]) -> None:
        _wait_registered(self.client, workers)

    def arm(self) -> None:
        _wait_heartbeats(self.client, self.args.heartbeat_interval, self.args.heartbeat_timeout)

    def failover(self, worker: WorkerProcess, kill_unix: float, timeout: float) -> dict:
        return _wait_failover(self.client, worker, timeout)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.proc.stop()


def _wait_registered(client: Any, workers: list[WorkerProcess]) -> None:
    want = {w.id for w in workers}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = {w["id"] for w in client.status()["workers"] if w["state"] == "alive"}
        if want <= alive:
            return
        time.sleep(0.05)
    raise BenchError(f"workers {sorted(want)} did not all register with the coordinator in 30 s")


def _wait_heartbeats(client: Any, interval: float, timeout: float) -> None:
    """Until every live worker's last heartbeat is younger than two intervals (at most 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ages = [w["heartbeat_age_s"] for w in client.status()["workers"] if w["state"] == "alive"]
        if ages and all(a is not None and a < min(2 * interval, timeout) for a in ages):
            return
        time.sleep(0.05)


CONTROLS = {"heartbeat": ServedControl, "process": ProcessControl, "none": InProcessControl}


def heartbeat_available() -> Optional[str]:
    """None when `rhino coordinator` and `rhino worker --coordinator` can run here, else why not."""
    from rhino import _core

    if not hasattr(_core, "CoordServer") or not hasattr(_core.StateClient, "coord"):
        return ("the compiled core has no coordinator transport (_core.CoordServer, StateClient.coord): "
                "rebuild the extension (make setup) once it is merged")
    try:
        importlib.import_module("rhino.coordinator.server")
    except ImportError as e:
        return f"rhino.coordinator.server is missing ({e})"
    return None
