"""``rhino-bench takeover-open``: a takeover's restore (build + RocksDB open) with and
without fsyncs, on a quiet disk and under a write load like a running job's.

    rhino-bench takeover-open --size 1.5G --repeat 5 --json --out bench/results/takeover_open.jsonl \
        --report bench/results/takeover_open.md

How it runs and what each record holds: bench/README.md, "A takeover's open".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

import rhino
from rhino._sizes import format_bytes

from .frame import BenchRun, Scenario, bench_main
from .report import md_table, run_header, setup_of, size_arg, write_lines
from .restore import drop_caches
from rhino_testing.workload import build_state

OP = "takeover"


def build(root: Path, size: int, vnodes: int) -> int:
    """The checkpointed state; returns the checkpoint to restore."""
    db = rhino.StateBackend.open(str(root / "db"), partitioner=rhino.Partitioner(num_vnodes=vnodes),
                                 operator_id=OP, instance=1)
    store = rhino.ReplicaStore(str(root / "store"))
    build_state(db, size, value_size=8192, version=1, label="building the state")
    db.checkpoint(store, 1)
    for i in range(3):  # small batches: their checkpoints copy the WAL (state_checkpoint.cc)
        ks = np.arange(10 ** 9 + i * 100, 10 ** 9 + (i + 1) * 100, dtype=np.int64)
        db.put_batch(ks, [b"x" * 800] * 100, version=2 + i)
        db.checkpoint(store, 2 + i)
    db.close()
    return 4


@contextlib.contextmanager
def fsync_writers(root: Path, n: int) -> Iterator[None]:
    """``n`` threads writing 8 MiB chunks, each followed by fdatasync, until the block ends."""
    stop = threading.Event()

    def write(k: int) -> None:
        chunk, i = os.urandom(8 << 20), 0
        while not stop.is_set():
            with open(root / f"load-{k}-{i % 2}", "wb") as f:
                for _ in range(64):  # 512 MiB per file, then the other one
                    if stop.is_set():
                        break
                    f.write(chunk)
                    f.flush()
                    os.fdatasync(f.fileno())
            i += 1

    threads = [threading.Thread(target=write, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    time.sleep(3)  # let the journal fill up
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()
        for p in root.glob("load-*"):
            p.unlink()


@contextlib.contextmanager
def cpu_busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU, each in its own session, until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]
    time.sleep(1)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


LOADS = ("quiet", "fsync-writers", "cpu-busy")

# mode -> (sync, the restoring thread's policy, latency_critical)
MODES = {"synced": (True, "normal", False), "unsynced": (False, "normal", False),
         "batch": (False, "batch", False), "batch-critical": (False, "batch", True)}


def restore_once(store: rhino.ReplicaStore, cid: int, target: Path, mode: str, cold: bool = False) -> dict:
    sync, policy, critical = MODES[mode]
    shutil.rmtree(target, ignore_errors=True)
    if cold:
        drop_caches()
    before = os.sched_getscheduler(0)
    if policy == "batch":
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # this thread, as a worker daemon's
    try:
        t0 = time.perf_counter()
        db = store.restore(OP, 1, cid, str(target), sync=sync, latency_critical=critical)
        total = time.perf_counter() - t0
    finally:
        os.sched_setscheduler(0, before, os.sched_param(0))
    st = db.restore_stats
    db.close()
    shutil.rmtree(target, ignore_errors=True)
    return {"restore_s": total, "build_s": st.build_seconds, "open_s": st.open_seconds,
            "open_cpu_s": st.open_cpu_seconds, "open_wait_s": st.open_wait_seconds,
            "files": st.files, "linked_files": st.linked_files, "copied_files": st.copied_files}


def _load(name: str, root: Path, a: argparse.Namespace) -> Any:
    if name == "fsync-writers":
        return fsync_writers(root, a.writers)
    return cpu_busy(a.busy) if name == "cpu-busy" else contextlib.nullcontext()


class TakeoverOpen(Scenario):
    name = "takeover-open"
    description = __doc__.split("\n\n")[0]
    workdir_prefix = "rhino-bench-takeover-open-"
    spark = False

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--size", type=size_arg, default="1.5G",
                        help="state size (default 1.5G: one Q8 instance at 4 GiB, r=2)")
        ap.add_argument("--vnodes", type=int, default=21, help="vnodes of the instance (Q8 at p=3: 64/3)")
        ap.add_argument("--repeat", type=int, default=5)
        ap.add_argument("--writers", type=int, default=2)
        ap.add_argument("--busy", type=int, default=4, help="spinning processes of the cpu-busy load (default 4)")
        ap.add_argument("--loads", default="quiet,fsync-writers,cpu-busy")
        ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
        ap.add_argument("--cold", action="store_true",
                        help="drop the page cache before each restore (root): the checkpoint's files read from disk, "
                             "as when the host's memory went to other work since they were written")

    def check(self, ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
        unknown = [m for m in a.modes.split(",") if m not in MODES] + [x for x in a.loads.split(",") if x not in LOADS]
        if unknown:
            ap.error(f"unknown mode or load: {', '.join(unknown)} (modes: {', '.join(MODES)}; loads: "
                     f"{', '.join(LOADS)})")

    def parameters(self, a: argparse.Namespace, run_id: str) -> dict:
        return {"size": format_bytes(a.size), "vnodes": a.vnodes, "repeat": a.repeat, "writers": a.writers,
                "busy": a.busy, "loads": a.loads, "modes": a.modes, "cold": a.cold}

    def run(self, br: BenchRun) -> None:
        a, root = br.args, br.base
        cid = build(root, a.size, a.vnodes)
        store = rhino.ReplicaStore(str(root / "store"))
        for load in a.loads.split(","):
            with _load(load, root, a):
                for r in range(a.repeat):
                    for mode in a.modes.split(","):  # interleaved: every mode sees the same load
                        row = br.emit(dict(restore_once(store, cid, root / "target", mode, a.cold), load=load,
                                           cold=a.cold, mode=mode, trial=r, size_bytes=a.size, vnodes=a.vnodes,
                                           command=br.command))
                        print(f"{load:14s} {mode:14s} trial {r}: restore {row['restore_s']*1000:7.1f} ms "
                              f"(build {row['build_s']*1000:6.1f}, open {row['open_s']*1000:6.1f}: CPU "
                              f"{row['open_cpu_s']*1000:5.1f}, run-queue wait {row['open_wait_s']*1000:6.1f})",
                              file=sys.stderr)


def report(rows: list[dict], path: str) -> None:
    import pandas as pd

    df = pd.DataFrame([r for r in rows if "restore_s" in r])
    lines = run_header("A takeover's restore (build + RocksDB open), with and without fsyncs", setup_of(rows))
    lines += ["Medians (ms) of the repeats. `synced`: every fsync of the build and the open, as a takeover did "
              "before issue 29; `unsynced`: none, as a takeover does since. Both keep the restored WAL in the "
              "memtables (`avoid_flush_during_recovery`). `batch`: unsynced from a SCHED_BATCH thread, as a worker's "
              "takeover ran before 2026-11-27; `batch-critical`: the same with `latency_critical=True`, as it runs "
              "now. Open CPU and run-queue wait are the opening thread's own:", ""]
    cols = ["restore_s", "build_s", "open_s", "open_cpu_s", "open_wait_s"]
    g = df.groupby(["load", "mode"], sort=False) if len(df) else []
    lines += md_table(["load", "mode", "restore", "build", "open", "open CPU", "open run-queue wait",
                       "raw restore (ms)"],
                      [[*k, *(f"{x * 1000:.1f}" for x in d[cols].median()),
                        ", ".join(f"{x * 1000:.0f}" for x in d["restore_s"])] for k, d in g], "llrrrrrl")
    write_lines(path, lines)


def main(argv: Optional[list[str]] = None) -> int:
    return bench_main(TakeoverOpen(report=report), argv)
