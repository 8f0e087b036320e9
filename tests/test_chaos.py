"""Chaos: SIGKILL a random chain member at a random point of a transfer.

Four worker processes (127.0.0.2-.5) form a chain of three plus a spare. In
each trial the primary takes a new checkpoint and replicates it; one random
chain member is killed either by a timer at a random instant, or by a crash
point it reaches (RHINO_CRASH_POINT: mid-chunk, before/after its commit, in
the middle of writing its manifest). After every trial:

- no complete checkpoint is lost or corrupted (every member that acked one
  still holds it and it verifies byte for byte);
- no partial checkpoint is visible: a member holds the trial's checkpoint only
  if it verifies and every member after it in the chain holds it too;
- the killed worker, restarted, has a store that verifies clean, no staging;
- the checkpoint completes on a repaired chain (victim replaced by the spare,
  chain version + 1); the restarted victim becomes the spare.

`make test` runs 50 trials; `make chaos` runs 500 (RHINO_CHAOS_TRIALS). The same
trials run with mutual TLS on every link (docs/protocol.md §2, "TLS"): 5 in
`make test`, 100 in `make chaos` (RHINO_CHAOS_TLS_TRIALS); and with each worker's
store on a filesystem that loses unsynced writes when the victim's machine loses
power (tests/test_power_loss.py says how): 10 in `make test`, 100 in `make chaos`
(RHINO_CHAOS_POWER_LOSS_TRIALS).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from typing import Optional

import numpy as np
import pytest

import rhino

from rhino_testing.harness.workers import SECRET, WorkerProcess, write_secret

OP = "chaos"
TRIALS = int(os.environ.get("RHINO_CHAOS_TRIALS", "50"))
TLS_TRIALS = int(os.environ.get("RHINO_CHAOS_TLS_TRIALS", "5"))
POWER_LOSS_TRIALS = int(os.environ.get("RHINO_CHAOS_POWER_LOSS_TRIALS", "10"))
SEED = int(os.environ.get("RHINO_CHAOS_SEED", str(random.randrange(1 << 30))))
CRASH_POINTS = [
    "replica.after_chunk_write",
    "replica.before_file_fsync",  # in the background thread that makes received files durable
    "replica.before_commit",
    "replica.after_commit",
    "checkpoint.before_manifest",
    "checkpoint.mid_manifest",
    "checkpoint.before_link_manifest",
]
KEEP = 3  # checkpoints retained per store


def _verify_checkpoint(store: rhino.ReplicaStore, cid: int) -> None:
    m = store.manifest(OP, 0, cid)
    for f in m.files:
        with open(store.pool_path(f.identity), "rb") as fh:
            import xxhash

            assert xxhash.xxh3_128(fh.read()).hexdigest() == f.checksum, f"{store.path}: {f.name} corrupted"


def test_chaos_kill_random_member_at_random_point(tmp_path):
    _chaos(tmp_path, TRIALS, tls=None)


def test_chaos_with_tls(tmp_path):
    pytest.importorskip("cryptography")
    from rhino.tls.certs import init

    init(tmp_path / "certs", ["127.0.0.1"] + [f"127.0.0.{n}" for n in (2, 3, 4, 5)])
    _chaos(tmp_path, TLS_TRIALS, tls=rhino.TLS(f"{tmp_path}/certs/{{host}}.pem", f"{tmp_path}/certs/{{host}}.key",
                                               f"{tmp_path}/certs/ca.pem"))


def test_chaos_with_power_loss(tmp_path):
    """The same trials, each worker's store on its own power-loss filesystem
    (rhino_testing.harness.power_loss_fs): the killed member's machine also loses every
    write it had not fsynced before it restarts. A checkpoint it acked must survive."""
    from rhino_testing.harness.power_loss_fs import PowerLossMount, available

    if available() and os.environ.get("CI") != "true":
        pytest.skip(f"the power-loss filesystem cannot run here: {available()}")
    with contextlib.ExitStack() as stack:
        machines = {f"w{n}": stack.enter_context(PowerLossMount(tmp_path / f"backing-w{n}", tmp_path / f"host-w{n}"))
                    for n in (2, 3, 4, 5)}
        _chaos(tmp_path, POWER_LOSS_TRIALS, tls=None, machines=machines)
        assert sum(m.crashes for m in machines.values()) == POWER_LOSS_TRIALS


def _chaos(tmp_path, trials: int, tls, machines: Optional[dict] = None) -> None:
    """The trials of the module docstring; with ``tls`` ({host} in its paths) on every link;
    with ``machines`` (worker id -> PowerLossMount), each worker's store on its mount, and
    the victim's machine loses power before it restarts."""
    from rhino.tls.config import for_host

    def tls_args(host: str) -> list[str]:
        t = for_host(tls, host)
        return [] if t is None else ["--tls-cert", t.cert, "--tls-key", t.key, "--tls-ca", t.ca]

    client_tls = for_host(tls, "127.0.0.1")
    TRIALS = trials  # noqa: N806 - the module's name for it, per run
    rng = random.Random(SEED)
    secret_file = write_secret(tmp_path)
    workers = [WorkerProcess(machines[f"w{n}"].mountpoint if machines else tmp_path, f"w{n}", f"127.0.0.{n}", secret_file=secret_file, metrics=False,
                             peer_timeout_ms=1000, heartbeat_ms=200, extra_args=tls_args(f"127.0.0.{n}")).start()
               for n in (2, 3, 4, 5)]
    chain, spare = workers[:3], workers[3]
    store = rhino.ReplicaStore(str(tmp_path / "primary"))
    db = rhino.StateBackend.open(str(tmp_path / "live"), operator_id=OP, instance=0,
                                 partitioner=rhino.Partitioner(num_vnodes=4))
    nprng = np.random.default_rng(SEED)
    version = 0
    complete: dict[int, set[str]] = {}  # checkpoint -> ids of workers that hold it complete
    outcomes = {"killed_before_ack": 0, "completed_anyway": 0}
    durations: list[float] = []
    try:
        for trial in range(1, TRIALS + 1):
            ctx = f"seed={SEED} trial={trial}"
            keys = nprng.integers(0, 20_000, size=2000)
            db.put_batch(keys.astype(np.int64), [nprng.bytes(300) for _ in range(len(keys))], version=trial)
            db.flush()
            db.checkpoint(store, trial)
            version += 1
            victim = rng.choice(chain)
            point = rng.choice(CRASH_POINTS) if rng.random() < 0.35 else None
            if trial == 1:  # at least one kill inside a transfer, however few the trials
                point = "replica.after_chunk_write"
            if point is not None:  # re-arm the victim: it kills itself when it gets there
                victim.kill()
                victim.env = {"RHINO_CRASH_POINT": point}
                victim.start()
                victim.env = None
            timer = None
            if point is None:
                timer = threading.Timer(rng.uniform(0.0, 0.25), victim.kill)
            h = rhino.replicate(store, OP, 0, trial, [w.address for w in chain], chain_version=version,
                                secret=SECRET, chunk_bytes=32 << 10, window=2, timeout=20.0, peer_timeout=1.0,
                                tls=client_tls)
            if timer is not None:
                timer.start()
            t0 = time.monotonic()
            try:
                h.wait()
                ok = True
                durations.append(time.monotonic() - t0)
            except rhino.RhinoError:
                ok = False
            if timer is not None:
                timer.join()
            if victim.alive():  # the kill came after the transfer, or the point was not reached
                victim.kill()
            if ok:
                outcomes["completed_anyway"] += 1
            else:
                outcomes["killed_before_ack"] += 1

            if machines:  # the victim's machine loses what it had not fsynced
                machines[victim.id].power_loss()
            # The victim restarts: its store verifies clean and it keeps no staging.
            victim.start()
            report = rhino.ReplicaStore(str(victim.dir)).verify(full=True)
            assert report.ok, f"{ctx}: {victim.id} after restart: {report.problems}"
            assert os.listdir(victim.dir / "tmp") == [], ctx

            # No partial checkpoint is visible; what a member holds, its successors hold.
            holds = []
            for w in chain:
                s = rhino.ReplicaStore(str(w.dir))
                if trial in s.checkpoints(OP, 0):
                    _verify_checkpoint(s, trial)
                    holds.append(True)
                else:
                    holds.append(False)
            for i in range(len(chain)):
                if holds[i]:
                    assert all(holds[i:]), f"{ctx}: {chain[i].id} holds {trial} but a successor does not: {holds}"
            if ok:
                assert all(holds), f"{ctx}: acked but not held everywhere: {holds}"
                complete[trial] = {w.id for w in chain}
            else:
                # Complete it on a repaired chain: the spare replaces the victim.
                repaired = [spare if w is victim else w for w in chain]
                version += 1
                rhino.replicate(store, OP, 0, trial, [w.address for w in repaired], chain_version=version,
                                secret=SECRET, chunk_bytes=32 << 10, window=2, timeout=20.0, tls=client_tls).wait()
                for w in repaired:
                    assert trial in rhino.ReplicaStore(str(w.dir)).checkpoints(OP, 0), ctx
                complete[trial] = {w.id for w in repaired}
                chain, spare = repaired, victim

            # No complete checkpoint is ever lost or corrupted (sizes every trial,
            # every byte every 10th trial and on the restarted victim above).
            by_id = {w.id: w for w in workers}
            for cid in sorted(complete)[-KEEP:]:
                for wid in complete[cid]:
                    s = rhino.ReplicaStore(str(by_id[wid].dir))
                    assert cid in s.checkpoints(OP, 0), f"{ctx}: {wid} lost complete checkpoint {cid}"
            for w in workers:
                report = rhino.ReplicaStore(str(w.dir)).verify(full=trial % 10 == 0)
                assert report.ok, f"{ctx}: {w.id}: {report.problems}"

            # Bound the disk: keep the last few checkpoints everywhere, collect garbage.
            if trial % 10 == 0:
                store.retain(OP, 0, KEEP)
                store.gc()
                for w in workers:
                    s = rhino.ReplicaStore(str(w.dir))
                    s.retain(OP, 0, KEEP)
                    s.gc()
                complete = {c: ws for c, ws in complete.items() if c > trial - KEEP}
        med = sorted(durations)[len(durations) // 2] if durations else 0
        print(f"chaos seed={SEED} trials={TRIALS} tls={tls is not None} {outcomes} median transfer {med:.3f}s")
        # The kills must really land inside transfers, not only after them.
        assert outcomes["killed_before_ack"] >= TRIALS // 5, outcomes
    finally:
        db.close()
        for w in workers:
            if w.alive():
                w.kill()


def test_every_replica_crash_point_is_used():
    """CRASH_POINTS must name every CrashPoint("...") of the data plane, so a new one is not missed."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "src" / "cpp" / "replication"
    if not src.is_dir():
        pytest.skip("C++ sources not present")
    found = set()
    for p in src.rglob("*.cc"):
        found |= set(re.findall(r'CrashPoint\("([^"]+)"\)', p.read_text()))
    assert found and found <= set(CRASH_POINTS)
