"""Liveness under load, on real processes (issue 46, item 4): a ``rhino coordinator``
process and four ``rhino worker`` processes heartbeating to it every 0.5 s, with a 2 s
heartbeat timeout.

64 clients each call ``create_operator`` at once (each call opens its instances on the
workers while it holds the coordinator's lock: slow calls that keep all 16 handler threads
busy for seconds) while one worker is SIGKILLed, so the coordinator also fails its
instances over. Heartbeats and ``status`` travel on the coordinator's liveness lane
(docs/protocol.md §8.1), never queued behind those calls: the killed worker is declared
dead, and no live one is (no false death, no false failover). The unit form, which shows
the same calls starve heartbeats without the lane, is in test_coord_transport.py."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import rhino
from rhino.coordinator.client import connect_coordinator
from rhino_testing.harness.workers import CoordinatorProcess, WorkerProcess, write_secret

CALLS = 64
HOSTS = (100, 101, 102, 103)  # 127.0.0.100..103: no other test module's workers


def test_64_slow_calls_during_a_failover_cause_no_false_death(tmp_path: Path) -> None:
    sf = write_secret(tmp_path)
    secret = sf.read_bytes().strip()
    coord = CoordinatorProcess(tmp_path, secret_file=sf, heartbeat_timeout=2.0).start()
    workers = []
    try:
        for n in HOSTS:
            workers.append(WorkerProcess(tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=sf, metrics=False,
                                         extra_args=["--coordinator", coord.address]).start())
        with connect_coordinator(coord.address, secret=secret) as cc:
            deadline = time.monotonic() + 20
            while len([w for w in cc.status()["workers"] if w.get("alive", True)]) < len(HOSTS):
                assert time.monotonic() < deadline, "workers did not register"
                time.sleep(0.2)
            # the victim holds primaries and replicas: its loss is a failover
            cc.create_operator("victim-op", parallelism=4, num_vnodes=16, replicas=1)
        victim = workers[-1]
        errors: list[str] = []
        answered: list[float] = []
        go = threading.Event()

        def slow_call(i: int) -> None:
            try:
                with connect_coordinator(coord.address, secret=secret, request_timeout=120) as c:
                    go.wait()
                    t = time.monotonic()
                    c.create_operator(f"load-{i}", parallelism=3, num_vnodes=16, replicas=1)
                    answered.append(time.monotonic() - t)
            except rhino.RhinoError as e:  # a call placed on the dead worker: refused, not hung
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=slow_call, args=(i,), daemon=True) for i in range(CALLS)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        go.set()
        time.sleep(0.3)  # the calls are in: the handler threads are busy
        victim.kill()
        with connect_coordinator(coord.address, secret=secret, request_timeout=10) as cc:
            # status is on the lane too: it answers while the calls hold the lock
            lane_waits = []
            while any(t.is_alive() for t in threads):
                s = time.monotonic()
                cc.status()
                lane_waits.append(time.monotonic() - s)
                assert time.monotonic() - t0 < 240, "the slow calls did not end"
                time.sleep(0.2)
            took = time.monotonic() - t0
            # a little longer than a heartbeat timeout more, for any late (false) death
            time.sleep(3.0)
            st = cc.status()
        db = sqlite3.connect(f"file:{coord.dir / 'coordinator.db'}?mode=ro", uri=True)
        try:
            dead = [json.loads(d) for (d,) in db.execute("SELECT detail FROM events WHERE kind='worker_dead'")]
        finally:
            db.close()
    finally:
        for w in workers:
            if w.alive():
                w.stop()
        coord.stop()
    print(f"{CALLS} create_operator calls took {took:.1f} s in all (each {min(answered):.2f}-{max(answered):.2f} s), "
          f"{len(errors)} refused; status on the lane answered in at most {max(lane_waits) * 1000:.0f} ms")
    # the calls really were slow: together they kept the coordinator busy past the timeout
    assert took > 2.0 and len(answered) + len(errors) == CALLS, (took, len(answered), errors[:3])
    assert [d["worker"] for d in dead] == [victim.id], dead
    alive = {w["id"] for w in st["workers"] if w.get("alive", True) and not w.get("dead_since")}
    assert alive == {w.id for w in workers[:-1]}, st["workers"]
    assert max(lane_waits) < 1.5, sorted(lane_waits)[-5:]
