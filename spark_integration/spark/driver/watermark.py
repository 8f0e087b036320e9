"""The operator's event-time watermarks, by Spark's rule: batch b's timers fire at the
largest event time seen through batch b-1, minus the delay (0 before any event; Spark's
``eventTimeWatermarkForEviction``), and its late rows are those at or before the watermark
batch b-1 ran with (``eventTimeWatermarkForLateEvents``): one batch behind.

The largest event time of each committed batch is kept in the query's checkpoint location
(``checkpoint_location``), so that a restarted driver runs each batch again with the
watermark it first ran with. The files go through Spark's own (Hadoop) filesystem API
(:class:`HadoopFiles`), so they live wherever Spark checkpoints: ``file://``, HDFS,
``s3a://`` or any other Hadoop filesystem (issue 45). Under the location, the operator's
files are ``rhino-<operator id>/watermark-<batch, 20 digits>.json``: each batch's file is
written once, under a temporary name renamed to its own (a rename onto a name that does not
exist, atomic where the filesystem has atomic renames), and the newest one that reads back
whole wins, so a driver killed mid-write leaves the previous batch's file in charge. The
file of before (``rhino-<operator id>-watermark.json``, beside them) is read when there is
no newer one."""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Optional

__all__ = ["Watermarks", "HadoopFiles", "LocalFiles", "operator_dir"]

# Batches kept in the file: a replay reruns at most the last batch, a few more cost nothing.
KEPT_BATCHES = 16
# Files of older batches kept besides the newest (each holds the last KEPT_BATCHES).
KEPT_FILES = 2
_FILE = re.compile(r"watermark-(\d{20})\.json")
# ``last_batch`` not given: every file is taken as it is (the unit tests' default)
ANY_BATCH: Any = object()


def operator_dir(operator_id: str) -> str:
    """The operator's directory under the checkpoint location."""
    return f"rhino-{operator_id}"


class HadoopFiles:
    """Files under a directory of any Hadoop filesystem Spark can checkpoint to, through the
    JVM of a SparkSession (``org.apache.hadoop.fs.FileSystem``, the session's Hadoop
    configuration)."""

    def __init__(self, spark: Any, location: str) -> None:
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()
        self._root = self._jvm.org.apache.hadoop.fs.Path(location)
        self._fs = self._root.getFileSystem(self._conf)

    def _path(self, rel: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, rel)

    def list(self, rel_dir: str) -> list[str]:
        """The names of the files in ``rel_dir`` (none if it does not exist)."""
        d = self._path(rel_dir)
        if not self._fs.exists(d):
            return []
        return [s.getPath().getName() for s in self._fs.listStatus(d)]

    def read(self, rel: str) -> Optional[bytes]:
        p = self._path(rel)
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def write_new(self, rel: str, data: bytes) -> None:
        """Writes ``rel``, which does not exist yet: a temporary file in the same directory,
        renamed to ``rel``."""
        p = self._path(rel)
        tmp = self._jvm.org.apache.hadoop.fs.Path(p.getParent(), f".{p.getName()}.tmp")
        self._fs.mkdirs(p.getParent())
        out = self._fs.create(tmp, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()
        if self._fs.exists(p):
            self._fs.delete(p, False)
        if not self._fs.rename(tmp, p):
            raise OSError(f"could not rename {tmp.toString()} to {p.toString()}")

    def delete(self, rel: str) -> None:
        self._fs.delete(self._path(rel), False)


class LocalFiles:
    """The same on a local directory, with no JVM (the unit tests' stand-in)."""

    def __init__(self, location: str) -> None:
        from pathlib import Path

        self._root = Path(location)

    def list(self, rel_dir: str) -> list[str]:
        d = self._root / rel_dir
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def read(self, rel: str) -> Optional[bytes]:
        p = self._root / rel
        return p.read_bytes() if p.exists() else None

    def write_new(self, rel: str, data: bytes) -> None:
        import os

        p = self._root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, p)

    def delete(self, rel: str) -> None:
        (self._root / rel).unlink(missing_ok=True)


class Watermarks:
    """The largest event time per batch, and the watermark each batch runs with.

    ``files``: where they are kept (:class:`HadoopFiles` in the checkpoint location), or
    None: in this driver's memory only (a query without event time)."""

    def __init__(self, operator_id: str, delay_ms: int, files: Optional[Any], *,
                 last_batch: Any = ANY_BATCH) -> None:
        self.delay_ms = delay_ms
        self.files = files
        self.dir = operator_dir(operator_id)
        self._legacy = f"rhino-{operator_id}-watermark.json"
        self._max_event: dict[int, Optional[int]] = self._load()
        if last_batch is not ANY_BATCH:
            self._forget_after(last_batch)

    def _forget_after(self, last_batch: Optional[int]) -> None:
        """Forgets (and deletes the files of) batches after the operator's last committed
        one (None: it has none). They are of an earlier life of the operator, one that was
        dropped (``rhino drop``) while its checkpoint location was kept: its batch numbers
        start again at 0, and a file of its old batch 50 must not be taken as the newest."""
        top = -1 if last_batch is None else int(last_batch)
        self._max_event = {b: m for b, m in self._max_event.items() if b <= top}
        if self.files is None:
            return
        for b in self._batches():
            if b > top:
                self.files.delete(f"{self.dir}/watermark-{b:020d}.json")
        if top < 0:
            self.files.delete(self._legacy)

    def _batches(self) -> list[int]:
        """The batches with a file, ascending."""
        out = []
        for name in self.files.list(self.dir):
            m = _FILE.fullmatch(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _load(self) -> dict[int, Optional[int]]:
        if self.files is None:
            return {}
        for b in reversed(self._batches()):
            got = self._parse(self.files.read(f"{self.dir}/watermark-{b:020d}.json"))
            if got is not None:
                return got
        return self._parse(self.files.read(self._legacy)) or {}

    @staticmethod
    def _parse(data: Optional[bytes]) -> Optional[dict[int, Optional[int]]]:
        if data is None:
            return None
        try:
            return {int(k): v for k, v in json.loads(data.decode()).items()}
        except (ValueError, AttributeError):
            return None  # a file cut short: the one before it is in charge

    def for_batch(self, batch: int) -> int:
        """The event-time watermark batch ``batch`` runs with (ms; 0 before any event)."""
        prev = [b for b in self._max_event if b < batch]
        if not prev:
            return 0
        m = self._max_event[max(prev)]
        return max(0, m - self.delay_ms) if m is not None else 0

    def for_late_rows(self, batch: int) -> int:
        """The watermark batch ``batch`` drops late rows by: the one batch ``batch - 1`` ran
        with (0 for the first two batches), as Spark's ``eventTimeWatermarkForLateEvents``."""
        return self.for_batch(batch - 1) if batch > 0 else 0

    def committed(self, batch: int, max_events: Iterable[Optional[int]]) -> None:
        """Records batch ``batch``'s largest event time (its tasks' ``max_event_ms``) and
        writes its file; the files of older batches but the last KEPT_FILES go."""
        mx = [m for m in max_events if m is not None]
        prev = [m for b, m in self._max_event.items() if b < batch and m is not None]
        self._max_event[batch] = max(mx + prev) if (mx or prev) else None
        if self.files is None:
            return
        keep = dict(sorted(self._max_event.items())[-KEPT_BATCHES:])
        self.files.write_new(f"{self.dir}/watermark-{batch:020d}.json", json.dumps(keep).encode())
        older = [b for b in self._batches() if b < batch]
        for b in older[:-KEPT_FILES]:
            self.files.delete(f"{self.dir}/watermark-{b:020d}.json")
