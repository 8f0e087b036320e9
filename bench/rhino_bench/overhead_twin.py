"""``rhino-bench overhead``: the writer (the synthetic workload and the twin primaries it writes to, one
replicating and one not) and the /proc readings a phase is judged by (CPU time, settling)."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import rhino
from rhino_testing.harness.workers import (SECRET, cpu_seconds, pressure_seconds, system_cpu_seconds,
                                           thread_cpu_seconds, thread_schedstat)
from rhino_testing.workload import keys_for, random_values

from .common import raise_if_stopped


OPERATOR = "bench"
INSTANCE = 0


class Workload:
    """A seeded stream of (keys, values) batches for one instance: updates of
    keys written before (uniform) and new keys, all in the held vnodes. Two
    objects with the same arguments produce the same stream."""

    def __init__(self, seed: int, partitioner: rhino.Partitioner, vnodes: list[int], value_size: int,
                 batch_keys: int, update_fraction: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.partitioner = partitioner
        self.held = np.zeros(partitioner.num_vnodes, dtype=bool)
        self.held[vnodes] = True
        self.share = len(vnodes) / partitioner.num_vnodes
        self.value_size = value_size
        self.batch_keys = batch_keys
        self.n_update = int(round(batch_keys * update_fraction))
        self.next_index = 0  # candidate index for the next new key
        self.keys = np.empty(1 << 20, dtype=np.int64)  # every key written so far
        self.n = 0

    def new_keys(self, k: int) -> np.ndarray:
        """The next `k` distinct keys that route to a held vnode (none written before)."""
        out = np.empty(k, dtype=np.int64)
        got = 0
        while got < k:
            need = k - got
            cand = keys_for(self.next_index, int(need / self.share * 1.25) + 64)
            idx = np.flatnonzero(self.held[self.partitioner.vnodes(cand)])[:need]
            out[got:got + len(idx)] = cand[idx]
            got += len(idx)
            self.next_index += int(idx[-1]) + 1 if len(idx) == need else len(cand)
        if self.n + k > len(self.keys):
            self.keys = np.resize(self.keys, max(2 * len(self.keys), self.n + k))
        self.keys[self.n:self.n + k] = out
        self.n += k
        return out

    def initial_batches(self, total: int):
        for first in range(0, total, self.batch_keys):
            n = min(self.batch_keys, total - first)
            yield self.new_keys(n), random_values(self.rng, n, self.value_size)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        upd = self.keys[self.rng.integers(0, self.n, self.n_update)]
        keys = np.concatenate([upd, self.new_keys(self.batch_keys - self.n_update)])
        return keys, random_values(self.rng, len(keys), self.value_size)


class Twin:
    """One primary instance: live state, local store, workload, checkpoint and
    replication bookkeeping."""

    def __init__(self, name: str, root: Path, args: argparse.Namespace, partitioner: rhino.Partitioner,
                 vnodes: list[int]) -> None:
        self.name = name
        self.db = rhino.StateBackend.open(str(root / name / "db"), partitioner=partitioner, operator_id=OPERATOR,
                                          instance=INSTANCE, vnodes=vnodes,
                                          write_buffer_budget=args.write_buffer_budget,
                                          compaction=args.compaction, flush_threads=args.flush_threads)
        self.store = rhino.ReplicaStore(str(root / name / "store"))
        self.workload = Workload(args.seed, partitioner, vnodes, args.value_size, args.batch_keys,
                                 args.update_fraction)
        self.args = args
        self.chain: list[str] = []
        self.ckpt_id = 0
        self.ckpt_time: dict[int, float] = {}
        # replication state (r2 twin only)
        self.handle: Any = None
        self.handle_id = 0
        self.last_started = 0
        self.bytes_done = 0  # bytes sent by finished replications
        self.completed: list[dict] = []  # one per finished replication
        self.failures: list[str] = []
        self.skipped_since = 0  # checkpoints not sent on their own before the one in flight
        self.handle_started = 0.0

    # ---- checkpoints ----
    def checkpoint(self) -> dict:
        self.ckpt_id += 1
        t0 = time.perf_counter()
        m = self.db.checkpoint(self.store, self.ckpt_id)
        t1 = time.perf_counter()
        self.ckpt_time[self.ckpt_id] = t1
        pruned = self.retain()
        return {"id": self.ckpt_id, "total_bytes": m.total_bytes, "delta_bytes": m.delta_bytes,
                "delta_files": m.delta_files, "files": len(m.files), "checkpoint_s": t1 - t0,
                "retain_gc_s": time.perf_counter() - t1, "pruned": pruned}

    def retain(self) -> bool:
        """Keeps the newest --keep-checkpoints checkpoints and frees the rest, unless that
        would drop the one being replicated (then it waits for a later checkpoint)."""
        keep = self.args.keep_checkpoints
        if keep <= 0:
            return False
        if self.handle is not None and self.handle_id <= self.ckpt_id - keep:
            return False
        if self.store.retain(OPERATOR, INSTANCE, keep):
            self.store.gc()
            return True
        return False

    # ---- replication: at most one in flight; coalesce the rest ----
    def sent_bytes(self) -> int:
        return self.bytes_done + (self.handle.progress()["bytes_sent"] if self.handle is not None else 0)

    def poll(self) -> None:
        if self.handle is not None and self.handle.done:
            self._finish()
        if self.handle is None and self.ckpt_id > self.last_started:
            self.handle = rhino.replicate(self.store, OPERATOR, INSTANCE, self.ckpt_id, self.chain, chain_version=1,
                                          secret=SECRET, chunk_bytes=self.args.chunk, window=self.args.window,
                                          timeout=self.args.replication_timeout)
            self.handle_id = self.ckpt_id
            self.handle_started = time.perf_counter()
            self.skipped_since = self.ckpt_id - self.last_started - 1
            self.last_started = self.ckpt_id

    def _finish(self) -> None:
        now = time.perf_counter()
        rec: dict[str, Any] = {"id": self.handle_id, "finished": now, "lag_s": now - self.ckpt_time[self.handle_id],
                               "coalesced": self.skipped_since}
        try:
            res = self.handle.wait(0)
            rec.update(ok=True, bytes_sent=res["bytes_sent"], files_sent=res["files_sent"], seconds=res["seconds"])
            # from the checkpoint to the chain's ack (not to when the write loop noticed it)
            rec["lag_s"] = self.handle_started + res["seconds"] - self.ckpt_time[self.handle_id]
            rec["finished"] = min(now, self.handle_started + res["seconds"])
            self.bytes_done += res["bytes_sent"]
        except rhino.RhinoError as e:
            sent = self.handle.progress()["bytes_sent"]
            rec.update(ok=False, error=f"{type(e).__name__}: {e}", bytes_sent=sent)
            self.bytes_done += sent
            self.failures.append(rec["error"])
        self.completed.append(rec)
        self.handle = None

    def drain(self) -> float:
        """Waits for the replication in flight, if any; returns the seconds waited."""
        t0 = time.perf_counter()
        if self.handle is not None:
            try:
                self.handle.wait(self.args.replication_timeout + 5)
            except rhino.RhinoError:
                pass  # recorded by _finish
            self._finish()
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.db.close()


def _cpu_snapshot(workers: list) -> dict:
    """CPU seconds so far: this process, the write loop's thread (the caller), the RocksDB threads, each
    worker process, the machine, and pressure-stall totals."""
    me = threading.get_native_id()
    threads = thread_cpu_seconds("self")
    rocks = sum(s for comm, s in threads.values() if comm.startswith("rocksdb"))
    sched = thread_schedstat("self")
    main_sched = sched.get(me, ("", 0.0, 0.0))
    return {"process": cpu_seconds("self"), "main": threads.get(me, ("", 0.0))[1], "rocksdb": rocks,
            "main_run": main_sched[1], "main_wait": main_sched[2],
            "rocksdb_wait": sum(w for comm, _, w in sched.values() if comm.startswith("rocksdb")),
            "workers": {w.id: cpu_seconds(w.pid) for w in workers}, "system": system_cpu_seconds(),
            "pressure": pressure_seconds()}


def _cpu_delta(a: dict, b: dict, seconds: float) -> dict:
    proc = b["process"] - a["process"]
    main = b["main"] - a["main"]
    rocks = b["rocksdb"] - a["rocksdb"]
    sys_a, sys_b = a["system"], b["system"]
    d = {k: sys_b[k] - sys_a[k] for k in sys_b}
    total = sum(d.values())
    out = {
        "primary_cpu_s": round(proc, 2),
        "primary_main_thread_cpu_s": round(main, 2),
        "primary_rocksdb_threads_cpu_s": round(rocks, 2),
        # replication sender threads, and threads that came and went (they are in the process total only)
        "primary_other_threads_cpu_s": round(proc - main - rocks, 2),
        "workers_cpu_s": {w: round(b["workers"][w] - a["workers"][w], 2) for w in b["workers"]},
        "machine_cpu_capacity_s": round(total, 2),
        "machine_busy_s": round(total - d["idle"] - d["iowait"], 2),
        "machine_idle_s": round(d["idle"], 2),
        "machine_iowait_s": round(d["iowait"], 2),
        "machine_steal_s": round(d["steal"], 2),
        "window_s": round(seconds, 3),
        # The write loop's thread, from schedstat: on a CPU, runnable but waiting for one (CPU contention),
        # and the rest of the window, asleep (I/O, RocksDB write stalls, waiting for a flush).
        "primary_main_thread_on_cpu_s": round(b["main_run"] - a["main_run"], 2),
        "primary_main_thread_runqueue_wait_s": round(b["main_wait"] - a["main_wait"], 2),
        "primary_main_thread_asleep_s": round(seconds - (b["main_run"] - a["main_run"])
                                              - (b["main_wait"] - a["main_wait"]), 2),
        "primary_rocksdb_threads_runqueue_wait_s": round(b["rocksdb_wait"] - a["rocksdb_wait"], 2),
        # PSI: seconds in which some (or all) runnable tasks were stalled on CPU or I/O
        "pressure_s": {k: round(b["pressure"][k] - a["pressure"][k], 2) for k in b["pressure"]},
    }
    known = proc + sum(out["workers_cpu_s"].values())
    # kernel threads (writeback, softirqs), other tenants, this benchmark's own sampling
    out["others_cpu_s"] = round(out["machine_busy_s"] - known, 2)
    return out


def _schedstat(path: str) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for a CPU) from a thread's schedstat file."""
    with open(path, "rb") as f:
        run_ns, wait_ns, _ = f.read().split()
    return int(run_ns), int(wait_ns)


def settle(workers: list, cap_s: float, quiet_cores: float = 0.1, step_s: float = 0.5) -> float:
    """Waits until the RocksDB background threads of this process (flushes, compactions of both twins) and the
    workers are quiet (together under `quiet_cores` over `step_s`), at most `cap_s`; returns the seconds waited.
    So that no phase pays for the background work another phase left behind."""
    def busy() -> float:
        rocks = sum(s for comm, s in thread_cpu_seconds("self").values() if comm.startswith("rocksdb"))
        return rocks + sum(cpu_seconds(w.pid) for w in workers)

    t0 = time.perf_counter()
    prev = busy()
    while time.perf_counter() - t0 < cap_s:
        raise_if_stopped()
        time.sleep(step_s)
        cur = busy()
        if cur - prev < quiet_cores * step_s:
            break
        prev = cur
    return time.perf_counter() - t0
