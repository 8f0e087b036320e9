"""Processes and their memory, read from /proc: the one place the benchmarks read it.

- :func:`proc_table`, :func:`descendants`, :func:`cmdline`, :func:`rss_bytes`, :func:`hwm_bytes`,
  :func:`mem_available_kb`: one reading each;
- :class:`MemorySampler`: peaks per step of the Rhino workers, Spark's JVMs and Python workers
  and this driver, and the lowest MemAvailable (``rhino-bench spark big-key``);
- :class:`RssSampler`: peaks per batch of the driver JVM, the executors' JVMs and the Python
  workers that ran in the batch (``rhino-bench spark output``).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional, Sequence

__all__ = ["proc_table", "descendants", "cmdline", "rss_bytes", "hwm_bytes", "mem_available_kb", "driver_jvm_pid",
           "MemorySampler", "RssSampler"]

_MB = 1 << 20


def proc_table() -> dict[int, tuple[int, int, str, int]]:
    """pid -> (ppid, RSS bytes, comm, CPU ticks used: utime + stime) of every process."""
    page = os.sysconf("SC_PAGE_SIZE")
    out: dict[int, tuple[int, int, str, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        lp, rp = text.find("("), text.rfind(")")
        rest = text[rp + 2:].split()
        # rest[0] is stat(5) field 3 (state): ppid is field 4, utime 14, stime 15, rss (pages) 24
        if rest[0] in ("Z", "X"):
            continue
        out[int(name)] = (int(rest[1]), int(rest[21]) * page, text[lp + 1:rp], int(rest[11]) + int(rest[12]))
    return out


def descendants(table: dict[int, tuple[int, int, str, int]], roots: Sequence[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def rss_bytes(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def hwm_bytes(pid: int) -> Optional[int]:
    """VmHWM (the process's peak RSS since it started), bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def driver_jvm_pid(spark: Any) -> Optional[int]:
    """The driver's JVM (PySpark's py4j gateway), as it tells its own pid; checked to be a
    descendant of this process (the cluster's master and workers are too, so the JVM's own
    answer decides which one)."""
    try:
        pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - not a local gateway
        return None
    return pid if pid in descendants(proc_table(), [os.getpid()]) else None


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


class RssSampler:
    """A thread that samples, every ``interval`` s, the RSS of the driver JVM, the executors'
    JVMs and the executors' Python workers (their ``python`` descendants: PySpark's daemon and
    the workers it forks); :meth:`begin` / :meth:`end` bracket one batch and return its peaks.

    A batch's figures count only the workers that ran during it (their CPU time grew, or they
    started meanwhile): an idle worker left over from another query (Spark keeps Python workers
    for reuse) is not the batch's."""

    def __init__(self, driver_pid: Optional[int], executor_pids: Sequence[int], interval: float) -> None:
        self.driver_pid = driver_pid
        self.executor_pids = list(executor_pids)
        self.interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._win: Optional[dict] = None
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> dict:
        table = proc_table()
        workers = {p: (table[p][1], table[p][3]) for p in descendants(table, self.executor_pids)
                   if table[p][2].startswith("python")}
        return {"workers": workers, "driver": table[self.driver_pid][1] if self.driver_pid in table else None,
                "executors": sum(table[p][1] for p in self.executor_pids if p in table)}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                s = self.sample()
            except Exception:  # noqa: BLE001 - a process that ended mid-read: the next sample
                continue
            with self._lock:
                if self._win is not None:
                    self._fold(self._win, s)

    @staticmethod
    def _fold(win: dict, s: dict) -> None:
        win["samples"] += 1
        w = win["w"]  # pid -> [first rss, first cpu, peak rss, last cpu]
        for pid, (rss, cpu) in s["workers"].items():
            if pid not in w:
                w[pid] = [rss, cpu if win["samples"] == 1 else None, rss, cpu]
            else:
                w[pid][2] = max(w[pid][2], rss)
                w[pid][3] = cpu
        total = sum(rss for rss, _ in s["workers"].values())
        win["worker_sum"] = max(win["worker_sum"], total)
        win["executors"] = max(win["executors"], s["executors"])
        if s["driver"] is not None:
            win["driver"] = max(win["driver"] or 0, s["driver"])

    def begin(self) -> None:
        s = self.sample()
        with self._lock:
            self._win = {"samples": 0, "w": {}, "worker_sum": 0, "executors": 0, "driver": None}
            self._fold(self._win, s)

    def end(self) -> dict:
        s = self.sample()
        with self._lock:
            win, self._win = self._win or {}, None
        if win:
            self._fold(win, s)
        w = win.get("w", {})
        # first cpu None: the worker started during the batch; else it ran if its CPU time grew
        active = {p: v for p, v in w.items() if v[1] is None or v[3] > v[1]}
        peak = max(active, key=lambda p: active[p][2], default=None)
        hwm = [h for h in (hwm_bytes(p) for p in active if p in s["workers"]) if h is not None]
        return {"driver_rss_mb": _mb(s["driver"]), "driver_rss_max_mb": _mb(win.get("driver")),
                "python_driver_rss_mb": _mb(rss_bytes(os.getpid())),
                "python_worker_peak_rss_mb": _mb(active[peak][2]) if peak is not None else None,
                "python_worker_start_rss_mb": _mb(active[peak][0]) if peak is not None else None,
                "python_worker_growth_mb": _mb(max((v[2] - v[0] for v in active.values()), default=0)),
                "python_worker_peak_sum_mb": _mb(sum(v[2] for v in active.values())),
                "python_worker_hwm_mb": _mb(max(hwm, default=0)),
                "python_workers": len(active), "python_workers_idle": len(w) - len(active),
                "executor_jvms_peak_rss_mb": _mb(win.get("executors")), "rss_samples": win.get("samples")}


def _mb(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x / _MB, 1)


def mem_available_kb() -> Optional[int]:
    """MemAvailable of /proc/meminfo, KiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class MemorySampler:
    """Samples, once a second, the resident memory of the Rhino workers (by pid), and of
    this process's descendants: Spark's JVM and its Python workers. ``take()`` returns the
    peaks since the last ``take()`` (KiB) and starts over."""

    def __init__(self, workers: dict[str, int], interval: float = 1.0) -> None:
        self.workers = dict(workers)
        self.interval = interval
        self.lock = threading.Lock()
        self.peak: dict[str, int] = {}
        self.min_available_kb: Optional[int] = None
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def start(self) -> "MemorySampler":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(timeout=5)

    def _sample(self) -> dict[str, int]:
        table = proc_table()

        def kb(pid: int) -> int:
            return table[pid][1] // 1024 if pid in table else 0

        cur = {f"rhino_worker_{wid}": kb(pid) for wid, pid in self.workers.items()}
        jvm = py_sum = py_max = 0
        for p in descendants(table, [os.getpid()]):
            cmd = cmdline(p)
            if cmd and "java" in cmd[0]:
                jvm += kb(p)
            elif "pyspark" in " ".join(cmd):
                py_sum += kb(p)
                py_max = max(py_max, kb(p))
        cur.update(spark_jvm=jvm, spark_python_sum=py_sum, spark_python_max=py_max, driver_python=kb(os.getpid()))
        return cur

    def _once(self) -> None:
        try:
            cur = self._sample()
            avail = mem_available_kb()
        except Exception:  # noqa: BLE001 - a process gone between listing and reading
            cur, avail = {}, None
        with self.lock:
            for k, v in cur.items():
                self.peak[k] = max(self.peak.get(k, 0), v)
            if avail is not None:
                self.min_available_kb = avail if self.min_available_kb is None else min(self.min_available_kb, avail)

    def _run(self) -> None:
        while not self.stop_ev.is_set():
            self._once()
            self.stop_ev.wait(self.interval)

    def take(self) -> dict[str, Any]:
        self._once()  # a step shorter than the interval gets one sample, at its end
        with self.lock:
            out: dict[str, Any] = {"peak_rss_mib": {k: round(v / 1024, 1) for k, v in sorted(self.peak.items())},
                                   "min_mem_available_mib": (round(self.min_available_kb / 1024, 1)
                                                             if self.min_available_kb is not None else None)}
            self.peak = {}
            self.min_available_kb = None
        return out


