"""``rhino-bench takeover-open``: a takeover's restore (build + RocksDB open) with and
without fsyncs, on a quiet disk and under a write load like a running job's.

    rhino-bench takeover-open --size 1.5G --repeat 5 --json --out bench/results/takeover_open.jsonl \
        --report bench/results/takeover_open.md

How it runs and what each record holds: bench/README.md, "A takeover's open".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

import rhino
from rhino._machine import describe_machine
from rhino._sizes import format_bytes, parse_size

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


class FsyncWriters:
    """Threads writing 8 MiB chunks, each followed by fdatasync, until stopped."""

    def __init__(self, root: Path, n: int) -> None:
        self.root, self.n = root, n
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(n)]
        self.bytes = 0

    def _run(self, k: int) -> None:
        chunk = os.urandom(8 << 20)
        i = 0
        while not self.stop.is_set():
            path = self.root / f"load-{k}-{i % 2}"
            with open(path, "wb") as f:
                for _ in range(64):  # 512 MiB per file, then the other one
                    if self.stop.is_set():
                        break
                    f.write(chunk)
                    f.flush()
                    os.fdatasync(f.fileno())
                    self.bytes += len(chunk)
            i += 1

    def __enter__(self) -> "FsyncWriters":
        for t in self.threads:
            t.start()
        time.sleep(3)  # let the journal fill up
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        for p in self.root.glob("load-*"):
            p.unlink()


class CpuBusy:
    """``n`` processes spinning on the CPU, each in its own session, until stopped."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "CpuBusy":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                      for _ in range(self.n)]
        time.sleep(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
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
        return FsyncWriters(root, a.writers)
    if name == "cpu-busy":
        return CpuBusy(a.busy)
    return _Null()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="rhino-bench takeover-open", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1.5G", help="state size (default 1.5G: one Q8 instance at 4 GiB, r=2)")
    ap.add_argument("--vnodes", type=int, default=21, help="vnodes of the instance (Q8 at p=3: 64/3)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--busy", type=int, default=4, help="spinning processes of the cpu-busy load (default 4)")
    ap.add_argument("--loads", default="quiet,fsync-writers,cpu-busy")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before each restore (root): the checkpoint's files read from disk, "
                         "as when the host's memory went to other work since they were written")
    ap.add_argument("--dir", default="/tmp/rhino-bench-takeover-open")
    ap.add_argument("--json", action="store_true", help="one JSON line per restore on stdout")
    ap.add_argument("--out", help="also append the JSON lines to this file")
    ap.add_argument("--report", help="write a Markdown report here")
    a = ap.parse_args(argv)
    size = parse_size(a.size)
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES] + [x for x in a.loads.split(",") if x not in LOADS]
    if unknown:
        ap.error(f"unknown mode or load: {', '.join(unknown)} (modes: {', '.join(MODES)}; loads: {', '.join(LOADS)})")
    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    cmd = "rhino-bench takeover-open " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        cid = build(root, size, a.vnodes)
        store = rhino.ReplicaStore(str(root / "store"))
        rows = []
        for load in a.loads.split(","):
            with _load(load, root, a):
                for r in range(a.repeat):
                    for mode in modes:  # interleaved: every mode sees the same load
                        row = dict(restore_once(store, cid, root / "target", mode, a.cold), load=load, cold=a.cold,
                                   mode=mode, trial=r, size_bytes=size, vnodes=a.vnodes)
                        rows.append(row)
                        print(f"{load:14s} {mode:14s} trial {r}: restore {row['restore_s']*1000:7.1f} ms "
                              f"(build {row['build_s']*1000:6.1f}, open {row['open_s']*1000:6.1f}: CPU "
                              f"{row['open_cpu_s']*1000:5.1f}, run-queue wait {row['open_wait_s']*1000:6.1f})",
                              file=sys.stderr)
                        if a.json:
                            print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                for row in rows:
                    f.write(json.dumps(dict(row, command=cmd)) + "\n")
        if a.report:
            Path(a.report).write_text(report(rows, cmd, a, size))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def report(rows: list[dict], cmd: str, a: argparse.Namespace, size: int) -> str:
    med = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    lines = ["# A takeover's restore (build + RocksDB open), with and without fsyncs", "",
             f"Command: `{cmd}`", "", f"Run at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} on "
             + ", ".join(f"{k} {v}" for k, v in describe_machine().items()) + ".", "",
             f"Parameters: size={format_bytes(size)}, vnodes={a.vnodes}, repeat={a.repeat}, writers={a.writers}, "
             f"busy={a.busy}, loads={a.loads}, modes={a.modes}, cold={a.cold}. See the docstring of "
             "`bench/rhino_bench/takeover_open.py`.", "",
             "Medians (ms) of the repeats. `synced`: every fsync of the build and the open, as a takeover did before "
             "issue 29; `unsynced`: none, as a takeover does since. Both keep the restored WAL in the memtables "
             "(`avoid_flush_during_recovery`). `batch`: unsynced from a SCHED_BATCH thread, as a worker's takeover "
             "ran before 2026-11-27; `batch-critical`: the same with `latency_critical=True`, as it runs now. "
             "Open CPU and run-queue wait are the opening thread's own:", "",
             "| load | mode | restore | build | open | open CPU | open run-queue wait | raw restore (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for load in a.loads.split(","):
        for mode in a.modes.split(","):
            rs = [r for r in rows if r["load"] == load and r["mode"] == mode]
            if rs:
                lines.append(f"| {load} | {mode} | {med([r['restore_s'] for r in rs]):.1f} | "
                             f"{med([r['build_s'] for r in rs]):.1f} | {med([r['open_s'] for r in rs]):.1f} | "
                             f"{med([r['open_cpu_s'] for r in rs]):.1f} | {med([r['open_wait_s'] for r in rs]):.1f} | "
                             + ", ".join(f"{r['restore_s']*1000:.0f}" for r in rs) + " |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
