"""`rhino-bench demo`: the demonstration of the core and the data plane (`make demo`).

It builds a few hundred MB of keyed state, checkpoints it into a replica
store, takes an incremental checkpoint after a small update, restores that
checkpoint by hard links and by copy, and verifies both restored states.
Then it starts three `rhino worker` processes on 127.0.0.2, .3 and .4,
replicates both checkpoints down a chain of two of them (only the delta
crosses for the second), kills the chain's head with SIGKILL, repairs the
chain with the third, and restores
the newest checkpoint on the tail's host from the tail's own store by hard
links, verified like the local restores. Each step prints one line saying
what it does, then its figures.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

import numpy as np

from rhino import Partitioner, ReplicaStore, StateBackend, __version__
from rhino._machine import describe_machine, machine_summary
from rhino._sizes import format_bytes
from rhino_testing.workload import build_state, keys_for, random_values
from rhino.replication import read_secret_file, replicate
from rhino_testing.harness.workers import WorkerProcess, new_secret, start_workers, write_secret

__all__ = ["run_demo"]

OPERATOR = "demo"
INSTANCE = 0
VALUE_SIZE = 1024
SAMPLE = 10_000
STEPS = 8


class _Out:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def step(self, n: int, total: int, text: str) -> None:
        print(f"\n[{n}/{total}] {text}", file=self.stream, flush=True)

    def fact(self, text: str) -> None:
        print(f"      {text}", file=self.stream, flush=True)

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)


def _count_keys(db) -> int:
    return sum(db.count(v) for v in db.vnodes)


def run_demo(directory: str, size_bytes: int, *, progress: bool = True, stdout: TextIO = sys.stdout) -> int:
    """Runs the demonstration in `directory` (removed and recreated); returns 0 if every check passed."""
    out = _Out(stdout)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    live = os.path.join(directory, "live")
    store_dir = os.path.join(directory, "store")
    link_dir = os.path.join(directory, "restored-by-link")
    copy_dir = os.path.join(directory, "restored-by-copy")
    steps = STEPS

    out.line(f"Rhino {__version__} demo: keyed state in vnodes, incremental checkpoints into a replica store,")
    out.line("restore by hard links, whose cost grows with the number of files, not bytes, and chain replication")
    out.line("of the checkpoints to worker processes on 127.0.0.2-4, from which a new owner restores the same way.")
    out.line(f"  directory  {os.path.abspath(directory)} (removed and recreated on every run)")
    out.line(f"  machine    {machine_summary(describe_machine(directory))}")

    # 1. Build the live state.
    partitioner = Partitioner()
    n_keys = max(1, size_bytes // VALUE_SIZE)
    out.step(1, steps, f"Build live state: {format_bytes(n_keys * VALUE_SIZE)} of random {VALUE_SIZE}-byte values "
                       f"under {n_keys:,} int64 keys, routed by key group to {partitioner.num_vnodes} vnodes "
                       f"(one RocksDB column family each).")
    stride = max(1, n_keys // SAMPLE)
    expected: dict[int, bytes] = {}  # key -> value, for a sample of the keys

    def remember(first: int, keys: np.ndarray, values: np.ndarray) -> None:
        start = (-first) % stride
        for i in range(start, len(keys), stride):
            expected[int(keys[i])] = values[i].tobytes()

    db = StateBackend.open(live, partitioner=partitioner, operator_id=OPERATOR, instance=INSTANCE)
    built = build_state(db, n_keys * VALUE_SIZE, value_size=VALUE_SIZE, version=1, progress=progress,
                        on_batch=remember)
    out.fact(f"{built.keys:,} keys, {format_bytes(built.bytes_written)} written through put_batch in "
             f"{built.seconds:.1f} s ({format_bytes(built.bytes_written / built.seconds)}/s); state version 1")

    # 2. First checkpoint.
    store = ReplicaStore(store_dir)
    out.step(2, steps, "Checkpoint 1: a RocksDB checkpoint (hard links), its files pooled by content identity, "
                       "then its manifest committed atomically.")
    t0 = time.perf_counter()
    m1 = db.checkpoint(store, 1)
    ckpt1_s = time.perf_counter() - t0
    out.fact(f"{len(m1.files)} files, {format_bytes(m1.total_bytes)}, in {ckpt1_s:.2f} s")

    # 3. A small update and an incremental checkpoint.
    n_upd = max(1, n_keys // 100)
    out.step(3, steps, f"Update 1% of the keys ({n_upd:,}) as state version 2, then checkpoint 2: incremental, "
                       "only files new since checkpoint 1 enter the pool.")
    gen = np.random.default_rng(2)
    upd_keys = keys_for(0, n_keys)[np.sort(gen.choice(n_keys, size=n_upd, replace=False))]
    upd_values = random_values(gen, n_upd, VALUE_SIZE)
    db.put_batch(upd_keys, upd_values, version=2)
    for k, v in zip(upd_keys.tolist(), upd_values):
        expected[k] = v.tobytes()
    t0 = time.perf_counter()
    m2 = db.checkpoint(store, 2)
    ckpt2_s = time.perf_counter() - t0
    share = m2.delta_bytes / m2.total_bytes if m2.total_bytes else 0.0
    out.fact(f"delta: {m2.delta_files} new files, {format_bytes(m2.delta_bytes)} = {share:.1%} of the "
             f"{format_bytes(m2.total_bytes)} checkpoint ({len(m2.files)} files), in {ckpt2_s:.2f} s; "
             f"parent = checkpoint {m2.parent_id}")
    db.close()

    # 4. Restore by hard links.
    out.step(4, steps, "Restore checkpoint 2 by hard links: pooled SST files are linked, only the small mutable "
                       "RocksDB files (MANIFEST, OPTIONS, CURRENT) are copied; then open it.")
    by_link = store.restore(OPERATOR, INSTANCE, 2, link_dir, mode="link")
    ls = by_link.restore_stats
    out.fact(f"{ls.files} files ({ls.linked_files} linked, {ls.copied_files} copied, "
             f"{format_bytes(ls.copied_bytes)} copied) in {ls.build_seconds * 1e3:.1f} ms; "
             f"opening RocksDB on it: {ls.open_seconds:.2f} s")
    sst = next((f for f in m2.files if f.name.endswith(".sst")), None)
    if sst is not None:
        a = os.stat(os.path.join(link_dir, sst.name))
        b = os.stat(store.pool_path(sst.identity))
        same = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        out.fact(f"{sst.name} in the restored directory {'is' if same else 'is NOT'} the pooled file: "
                 f"inode {a.st_ino}, {a.st_nlink} links")

    # 5. Restore by copy.
    out.step(5, steps, "Restore checkpoint 2 by copy, for comparison: every byte is copied, as when state is "
                       "fetched from a remote store.")
    by_copy = store.restore(OPERATOR, INSTANCE, 2, copy_dir, mode="copy")
    cs = by_copy.restore_stats
    speedup = cs.build_seconds / ls.build_seconds if ls.build_seconds > 0 else float("inf")
    out.fact(f"{cs.files} files ({cs.linked_files} linked, {cs.copied_files} copied, "
             f"{format_bytes(cs.copied_bytes)} copied) in {cs.build_seconds:.2f} s; opening: {cs.open_seconds:.2f} s")
    out.fact(f"hard-link restore was {speedup:.0f}x faster than copy restore "
             f"({ls.build_seconds * 1e3:.1f} ms vs {cs.build_seconds * 1e3:.0f} ms)")

    # 6. Verify.
    out.step(6, steps, "Verify both restored states against what we wrote, and re-hash every pooled file.")
    check_keys = np.fromiter(expected.keys(), dtype=np.int64, count=len(expected))
    want = [expected[int(k)] for k in check_keys]
    ok = True
    for name, restored in (("hard-link restore", by_link), ("copy restore", by_copy)):
        got = restored.get_batch(check_keys)
        matches = sum(1 for g, w in zip(got, want) if g == w)
        count = _count_keys(restored)
        good = matches == len(want) and count == n_keys and restored.version == 2
        ok &= good
        out.fact(f"{name}: {matches:,}/{len(want):,} sampled keys match (incl. the {n_upd:,} updated), "
                 f"{count:,} keys by scanning every vnode (expected {n_keys:,}), version {restored.version} "
                 f"-> {'OK' if good else 'MISMATCH'}")
        restored.close()
    ok &= _report_verify(out, "store.verify(full=True)", store)

    # 7-8. Replicate to worker processes, lose a host, restore from a replica.
    rep = _replicate_and_fail_over(out, directory, store, m1, m2, check_keys, want, n_keys, n_upd)
    ok &= rep.ok

    out.line("\nSummary")
    rows = [
        ("state", f"{format_bytes(n_keys * VALUE_SIZE)} in {n_keys:,} keys, {partitioner.num_vnodes} vnodes"),
        ("checkpoint 1", f"{len(m1.files)} files, {format_bytes(m1.total_bytes)}, {ckpt1_s:.2f} s"),
        ("checkpoint 2", f"delta {m2.delta_files} files, {format_bytes(m2.delta_bytes)} of "
                         f"{format_bytes(m2.total_bytes)} ({share:.1%})"),
        ("hard-link restore", f"{ls.build_seconds * 1e3:.1f} ms for {ls.files} files ({ls.linked_files} linked)"),
        ("copy restore", f"{cs.build_seconds * 1e3:.0f} ms for {cs.files} files"),
        ("speed-up", f"{speedup:.0f}x"),
        ("replication, r=2", rep.summary),
        ("replica restore", rep.restore_summary),
        ("verified", "yes" if ok else "NO"),
    ]
    for k, v in rows:
        out.line(f"  {k:<18} {v}")
    w3 = os.path.join(directory, "workers", "w3")
    out.line(f"\nLook inside:  rhino inspect {directory}    rhino inspect {w3}")
    out.line(f"Check a replica's store:  rhino verify {w3}")
    out.line(f"Take a checkpoint out of it:  rhino restore {w3} {os.path.join(directory, 'ckpt-from-w3')} "
             f"--operator {OPERATOR} --instance {INSTANCE}")
    return 0 if ok else 1


def _report_verify(out: _Out, what: str, store: ReplicaStore) -> bool:
    report = store.verify(full=True)
    out.fact(f"{what}: {'OK' if report.ok else 'PROBLEMS: ' + repr(report.problems[:3])} "
             f"({report.checkpoints} checkpoint{'s' if report.checkpoints != 1 else ''}, {report.files_checked} files, "
             f"{format_bytes(report.bytes_checked)} re-hashed)")
    return report.ok


class _Replicated:
    ok = False
    summary = "not run"
    restore_summary = "not run"


def _replicate_and_fail_over(out: _Out, directory: str, store: ReplicaStore, m1, m2, check_keys: np.ndarray,
                             want: list, n_keys: int, n_upd: int) -> _Replicated:
    rep = _Replicated()
    root = Path(directory) / "workers"
    root.mkdir()
    secret_file = write_secret(root, new_secret())
    secret = read_secret_file(secret_file)  # as the workers read it
    out.step(7, STEPS, "Start three `rhino worker` processes on 127.0.0.2, .3 and .4, and replicate checkpoints 1 "
                   "and 2 down the chain 127.0.0.2 -> 127.0.0.3 (r=2): a member is asked first and receives "
                   "only the files it lacks; a checkpoint is complete when every member has committed it.")
    try:
        workers: list[WorkerProcess] = start_workers(root, [2, 3, 4], secret_file, max_window=16)
    except RuntimeError as e:  # e.g. a worker could not bind 127.0.0.N: say so, no traceback
        out.fact(f"FAILED to start the workers: {e}")
        return rep
    try:
        head, tail, spare = workers
        chain = [head.address, tail.address]
        out.fact("workers: " + ", ".join(f"{w.id} at {w.address} (pid {w.pid})" for w in workers))
        sent = []
        for m in (m1, m2):
            h = replicate(store, OPERATOR, INSTANCE, m.checkpoint_id, chain, chain_version=1, secret=secret,
                          timeout=300)
            res = h.wait(timeout=600)
            if res is None:
                raise RuntimeError(f"replication of checkpoint {m.checkpoint_id} did not finish in 600 s")
            sent.append(res)
            rate = res["bytes_sent"] / res["seconds"] if res["seconds"] > 0 else float("inf")
            out.fact(f"checkpoint {m.checkpoint_id}: {res['files_sent']} files, {format_bytes(res['bytes_sent'])} "
                     f"sent in {res['seconds']:.2f} s ({format_bytes(rate)}/s), committed on both members")
        r1, r2 = sent
        out.fact(f"checkpoint 2 sent {format_bytes(r2['bytes_sent'])} for its {format_bytes(m2.delta_bytes)} "
                 f"delta: the {len(m2.files) - r2['files_sent']} files the members held since checkpoint 1 "
                 f"did not cross again")
        tail_store = ReplicaStore(str(tail.dir))
        sst = next((f for f in m2.files if f.name.endswith(".sst")), None)
        if sst is not None:
            a = os.stat(tail_store.pool_path(sst.identity))
            b = os.stat(store.pool_path(sst.identity))
            out.fact(f"{sst.name} on {tail.host}: inode {a.st_ino}, the primary's: inode {b.st_ino} "
                     f"({'different files: the bytes crossed a socket' if a.st_ino != b.st_ino else 'SAME FILE'})")
        rep.summary = (f"checkpoint 1 {format_bytes(r1['bytes_sent'])} in {r1['seconds']:.2f} s, "
                       f"checkpoint 2 {format_bytes(r2['bytes_sent'])} (the delta)")

        out.step(8, STEPS, f"Lose a host: SIGKILL the chain's head ({head.host}), and repair the chain with the spare "
                       f"({spare.host}). Then, on the tail's host ({tail.host}), restore checkpoint 2 from its own "
                       "replica store by hard links, as a new owner of the instance would, and verify it like the "
                       "local restores.")
        os.kill(head.pid, signal.SIGKILL)
        head.proc.wait()
        out.fact(f"{head.id} (pid {head.pid}) killed: exit status {head.proc.returncode}")
        ok = _report_verify(out, f"{head.id}'s store after SIGKILL, verify(full=True)", ReplicaStore(str(head.dir)))
        # Back to r=2 on a repaired chain, under a new chain version (Rhino §4.2): the surviving member
        # holds every file already, so only the spare receives any.
        h = replicate(store, OPERATOR, INSTANCE, 2, [tail.address, spare.address], chain_version=2, secret=secret,
                      timeout=300)
        res = h.wait(timeout=600)
        if res is None:
            raise RuntimeError("replication to the repaired chain did not finish in 600 s")
        spare_store = ReplicaStore(str(spare.dir))
        held = spare_store.checkpoints(OPERATOR, INSTANCE)
        out.fact(f"chain repaired as {tail.host} -> {spare.host} (chain version 2): the primary sent "
                 f"{format_bytes(res['bytes_sent'])} ({tail.id} held every file), {tail.id} forwarded checkpoint 2 "
                 f"from its own pool; {spare.id} now holds checkpoints {held}")
        ok &= held == [2]
        ok &= _report_verify(out, f"{spare.id}'s store, verify(full=True)", spare_store)
        restored_dir = os.path.join(directory, "restored-from-replica")
        db = tail_store.restore(OPERATOR, INSTANCE, 2, restored_dir, mode="link")
        st = db.restore_stats
        out.fact(f"{st.files} files ({st.linked_files} linked, {st.copied_files} copied) from {tail.id}'s store "
                 f"in {st.build_seconds * 1e3:.1f} ms; opening: {st.open_seconds:.2f} s")
        got = db.get_batch(check_keys)
        matches = sum(1 for g, w in zip(got, want) if g == w)
        count = _count_keys(db)
        good = matches == len(want) and count == n_keys and db.version == 2
        db.close()
        out.fact(f"restore from the replica: {matches:,}/{len(want):,} sampled keys match (incl. the {n_upd:,} "
                 f"updated), {count:,} keys by scanning every vnode (expected {n_keys:,}) -> "
                 f"{'OK' if good else 'MISMATCH'}")
        ok &= good
        ok &= _report_verify(out, f"{tail.id}'s store, verify(full=True)", tail_store)
        rep.restore_summary = f"{st.build_seconds * 1e3:.1f} ms for {st.files} files, from {tail.host}'s store"
        rep.ok = ok
    finally:
        for w in workers:
            w.stop()
    return rep
