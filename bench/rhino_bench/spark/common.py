"""``rhino-bench spark recovery|throughput``: NEXMark Q8 on Rhino against Spark's own
``transformWithStateInPandas`` with the RocksDB state store, on a local 3-host
Spark standalone + Rhino cluster (:class:`rhino_testing.harness.spark_cluster.LocalCluster`).

This module holds what both benchmarks share: progress lines on stderr, JSON lines
on stdout (and appended to ``--out``), SIGTERM unwinding, the Spark REST API, and
small statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional, Sequence

from ..report import fraction, non_negative_int, positive_float, positive_int  # noqa: F401 - the drivers import them here

__all__ = ["Emitter", "say", "install_signal_handlers", "spark_rest", "mean", "median", "percentile", "parse_conf",
           "positive_int", "positive_float", "non_negative_int", "fraction", "host_number"]


ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def say(msg: str) -> None:
    """A progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Emitter:
    """One JSON object per line: on stdout with ``--json``, appended to ``--out`` always."""

    def __init__(self, json_stdout: bool, out: Optional[str]) -> None:
        self.json_stdout = json_stdout
        self.out = Path(out) if out else None
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = []

    def emit(self, rec: dict) -> None:
        self.records.append(rec)
        line = json.dumps(rec, default=_json_default, sort_keys=False)
        if self.json_stdout:
            print(line, flush=True)
        if self.out is not None:
            with self.out.open("a") as f:
                f.write(line + "\n")


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return str(x)


def install_signal_handlers() -> None:
    """SIGTERM (and SIGHUP) unwind like Ctrl-C: through the ``finally`` blocks that
    stop the query, the SparkSession and the cluster's processes. Further signals
    are ignored while it unwinds, so a second one cannot cut the clean-up short."""

    def _unwind(signum: int, _frame: Any) -> None:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        say(f"signal {signum} received: stopping the query and the cluster")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _unwind)
    signal.signal(signal.SIGHUP, _unwind)


def spark_rest(ui_url: str, path: str, timeout: float = 10.0) -> Any:
    """GET ``{ui_url}/api/v1/{path}`` (Spark's monitoring REST API) as JSON."""
    with urllib.request.urlopen(f"{ui_url.rstrip('/')}/api/v1/{path.lstrip('/')}", timeout=timeout) as r:
        return json.loads(r.read().decode())


def spark_time(s: Optional[str]) -> Optional[float]:
    """Spark's REST timestamps ('2026-11-24T18:23:52.123GMT') -> epoch seconds."""
    if not s:
        return None
    import calendar

    base, _, rest = s.partition(".")
    ms = int(rest[:3]) if rest[:3].isdigit() else 0
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + ms / 1000.0


def mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    """The mean of the figures that are not None; None if none is."""
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def median(xs: Sequence[float]) -> Optional[float]:
    return percentile(xs, 50)


def percentile(xs: Sequence[float], p: float) -> Optional[float]:
    """Linear-interpolated percentile (numpy's default), None for no data."""
    import numpy as np

    v = [float(x) for x in xs if x is not None]
    return float(np.percentile(v, p)) if v else None


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> dict; argparse error on a malformed item."""
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise argparse.ArgumentTypeError(f"--spark-conf {it!r}: expected KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def host_number(text: str) -> int:
    """A first host number for 127.0.0.N (the tests use 30 and 40-46)."""
    v = positive_int(text)
    if not 2 <= v <= 250:
        raise argparse.ArgumentTypeError(f"{text!r}: the first host must be in 2..250 (127.0.0.N)")
    return v


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (a run's records say how busy the machine was)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def round_floats(x: Any) -> Any:
    """``x`` with every float in it (in dicts and lists too) rounded to 4 places, for JSON lines."""
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: round_floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [round_floats(v) for v in x]
    return x


@contextlib.contextmanager
def stdout_for_json_only() -> Any:
    """Spark's JVM, a child of this process, and its Python workers write to file descriptor 1
    (Spark's TransformWithStateInPandas worker prints its progress there): meanwhile fd 1 is
    stderr, and ``sys.stdout`` (the JSON lines) the real stdout."""
    sys.stdout.flush()
    real = os.dup(1)
    saved = sys.stdout
    os.dup2(2, 1)
    sys.stdout = os.fdopen(os.dup(real), "w", buffering=1)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout.close()
        sys.stdout = saved
        os.dup2(real, 1)
        os.close(real)

