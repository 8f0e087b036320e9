"""A description of the machine a measurement ran on (CPU, cores, RAM, kernel,
filesystem, library versions), stored next to every benchmark figure.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Any

__all__ = ["describe_machine", "loaded_library", "filesystem_of", "machine_summary"]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def loaded_library(name: str) -> str | None:
    """Path of the first shared object in this process whose file name contains `name`."""
    for line in _read("/proc/self/maps").splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and name in os.path.basename(parts[5]):
            return parts[5].strip()
    return None


def filesystem_of(path: str) -> dict[str, str]:
    """The mount that holds `path`: {'mount', 'device', 'fstype'} (longest matching mount point)."""
    target = os.path.realpath(path)
    while not os.path.exists(target) and target != "/":
        target = os.path.dirname(target)
    best: dict[str, str] = {}
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best.get("mount", "")):
            best = {"mount": mount, "device": device, "fstype": fstype}
    return best


def _cpu_model() -> str:
    m = re.search(r"^model name\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.MULTILINE)
    return m.group(1).strip() if m else (platform.processor() or "unknown")


def _mem_total_bytes() -> int:
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read("/proc/meminfo"), re.MULTILINE)
    return int(m.group(1)) * 1024 if m else 0


_SPARK_JVM_ENV = ("SPARK_DAEMON_JAVA_OPTS", "PYSPARK_SUBMIT_ARGS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")


def describe_machine(path: str = ".") -> dict[str, Any]:
    """CPU model, cores, RAM, kernel, the filesystem of `path`, Python and RocksDB."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 0
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    try:
        import rhino

        from rhino import _core

        rhino_version = rhino.__version__
        rocksdb = f"{_core.ROCKSDB_VERSION}, {_core.ROCKSDB_BUILD}, crc32c: {_core.ROCKSDB_CRC32C}"
    except ImportError:  # pragma: no cover - only without a built extension
        rhino_version = rocksdb = "not importable"
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count() or 0,
        "cpu_cores_usable": affinity,
        "ram_bytes": _mem_total_bytes(),
        "kernel": platform.release(),
        "os": _os_name(),
        "filesystem": filesystem_of(path),
        "python": platform.python_version(),
        "rhino": rhino_version,
        "rocksdb": rocksdb,
        "loadavg_1_5_15": load,
        "hostname": platform.node(),
        # JVM settings from the environment change Spark's speed (the test suite sets them:
        # tests/conftest.py), so a result records them when they are set
        "spark_jvm_env": {k: os.environ[k] for k in _SPARK_JVM_ENV if os.environ.get(k)},
    }


def _os_name() -> str:
    m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', _read("/etc/os-release"), re.MULTILINE)
    return m.group(1) if m else sys.platform


def machine_summary(m: dict[str, Any]) -> str:
    """One line: 'AMD EPYC, 2 cores, 23.4 GiB RAM, Linux 6.1, ext4 (/dev/vda)'."""
    fs = m.get("filesystem") or {}
    ram = m.get("ram_bytes", 0) / (1 << 30)
    return (f"{m.get('cpu_model', '?')}, {m.get('cpu_cores', '?')} cores, {ram:.1f} GiB RAM, "
            f"{m.get('os', '?')}, kernel {m.get('kernel', '?')}, "
            f"{fs.get('fstype', '?')} on {fs.get('device', '?')}, Python {m.get('python', '?')}, "
            f"load avg {m.get('loadavg_1_5_15', '?')}")
