"""A filesystem that loses every write not yet fsynced when its "machine" loses power.

Crash tests with SIGKILL alone cannot find a missing fsync: the killed process's writes
are in the kernel's page cache, and the kernel survives. A power loss takes the page
cache with it. This is a FUSE passthrough filesystem over a backing directory whose
daemon plays the page cache (issue 46, item 6):

- **File data** written through the mount stays in the daemon's memory until the file is
  fsynced (``fsync`` or ``fdatasync``); only then does it reach the backing file, which
  is fsynced too. Reads see the buffered data, as they would see the page cache.
- **A power loss** is the daemon SIGKILLed (with every process that used the mount) and
  a new daemon mounted over the same backing directory: the buffered data is gone, and
  each file holds what its last fsync wrote (a file never fsynced holds nothing).
- **The namespace** (create, mkdir, link, rename, unlink, rmdir) is applied to the
  backing directory at once, so that processes see it, and journaled (in
  ``BACKING.journal``, beside the backing directory, with an unlinked or replaced file
  kept in ``BACKING.trash``) until the directory it changed is fsynced: a rename needs
  both directories. At the next mount every change not yet made durable is undone,
  newest first. This is POSIX's rule, stricter than ext4 in its default mode (whose
  journal often carries a new entry along with a file's fsync) and what XFS, btrfs and
  ext4 without a journal may do: a new file whose directory was never fsynced is gone.
- Truncation and extension are data: a ``truncate`` not followed by an fsync is undone
  by the power loss.

Buffered data is kept per inode (hard links share it; Rhino restores by hard-linking),
as the whole file from the first unsynced write on, with the lowest offset written since
the last fsync: an fsync writes back only from there. Everything runs under one lock;
this is a test layer, sized for crash trials of a few MB, not a fast filesystem.

Run as a program (the daemon, in the foreground)::

    python -m rhino_testing.harness.power_loss_fs BACKING MOUNTPOINT

or from a test through :class:`PowerLossMount`, whose ``power_loss()`` does the above.
Needs ``/dev/fuse``, libfuse 3 (Debian's ``fuse3``) and ``mfusepy``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["PowerLossMount", "available"]


def available() -> Optional[str]:
    """None if this machine can mount the layer, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401
    except Exception as e:  # OSError when libfuse itself is missing
        return f"mfusepy cannot load libfuse: {e}"
    return None


# ---- the daemon --------------------------------------------------------------------------

@dataclass
class _Unsynced:
    """A file's contents as the processes see them, since its first write after a sync."""
    data: bytearray
    low: int  # the lowest offset written (or truncated to) since the last fsync


class _Namespace:
    """The namespace changes not yet durable, and how to undo them (module docstring).

    Each change is journaled before it is applied, so that a daemon killed between the two
    leaves an entry whose undo finds nothing to undo. An entry names the directories (by
    inode: a directory renamed later is still the one to fsync) that must be fsynced for it
    to be durable; ``synced`` crosses a directory off every entry so far."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.journal_path = root.rstrip("/") + ".journal"
        self.trash = root.rstrip("/") + ".trash"
        os.makedirs(self.trash, exist_ok=True)
        self.pending: list[dict] = []
        self.trash_links: dict[int, int] = {}  # inode -> links to it kept in the trash
        self.seq = 0
        self.recover()
        self.journal = open(self.journal_path, "a")

    def _p(self, rel: str) -> str:
        return os.path.join(self.root, rel.lstrip("/"))

    def dir_ino(self, rel: str) -> int:
        return os.lstat(self._p(os.path.dirname("/" + rel.lstrip("/")))).st_ino

    # -- while mounted
    def log(self, entry: dict) -> dict:
        self.seq += 1
        entry["seq"] = self.seq
        self.journal.write(json.dumps(entry) + "\n")
        self.journal.flush()  # the real machine does not lose power: the page cache keeps it
        entry["dirs"] = set(entry["dirs"])
        self.pending.append(entry)
        return entry

    def cancel(self, entry: dict) -> None:
        """The change was refused (EEXIST, ENOTEMPTY...): there is nothing to undo."""
        self.journal.write(json.dumps({"op": "cancel", "seq": entry["seq"]}) + "\n")
        self.journal.flush()
        self.pending = [e for e in self.pending if e is not entry]

    def to_trash(self, rel: str, entry: dict) -> None:
        ino = os.lstat(self._p(rel)).st_ino
        os.rename(self._p(rel), os.path.join(self.trash, entry["trash"]))
        self.trash_links[ino] = self.trash_links.get(ino, 0) + 1

    def synced(self, dir_ino: int) -> None:
        self.journal.write(json.dumps({"op": "sync", "dir": dir_ino}) + "\n")
        self.journal.flush()
        still = []
        for e in self.pending:
            e["dirs"].discard(dir_ino)
            if e["dirs"]:
                still.append(e)
            elif e.get("trash"):
                self._drop_trash(e["trash"])  # the removal is durable: the file may go
        self.pending = still
        if not self.pending:  # nothing to undo: the journal starts over
            self.journal.seek(0)
            self.journal.truncate()

    def _drop_trash(self, name: str) -> None:
        t = os.path.join(self.trash, name)
        try:
            ino = os.lstat(t).st_ino
        except FileNotFoundError:
            return
        shutil.rmtree(t) if os.path.isdir(t) and not os.path.islink(t) else os.unlink(t)
        n = self.trash_links.get(ino, 1) - 1
        if n:
            self.trash_links[ino] = n
        else:
            self.trash_links.pop(ino, None)

    # -- at mount: the power loss
    def recover(self) -> None:
        entries: list[dict] = []
        if os.path.exists(self.journal_path):
            with open(self.journal_path) as f:
                for line in f:
                    if not line.endswith("\n"):
                        break  # the daemon died writing it: the change was never applied
                    e = json.loads(line)
                    if e["op"] == "sync":
                        for p in entries:
                            p["dirs"].discard(e["dir"])
                    elif e["op"] == "cancel":
                        entries = [p for p in entries if p["seq"] != e["seq"]]
                    else:
                        e["dirs"] = set(e["dirs"])
                        entries.append(e)
        for e in reversed([e for e in entries if e["dirs"]]):
            self._undo(e)
        for name in os.listdir(self.trash):  # removals that were durable, or never undone
            t = os.path.join(self.trash, name)
            shutil.rmtree(t) if os.path.isdir(t) and not os.path.islink(t) else os.unlink(t)
        with open(self.journal_path, "w"):
            pass

    def _undo(self, e: dict) -> None:
        """Undoes one change, on the namespace as it was right after it (every later change is
        undone first). A change inside a directory whose removal was durable has no place to
        go back to: it stays undone with the directory."""
        op, p = e["op"], self._p(e.get("path", ""))
        if op == "rename":
            if not os.path.isdir(os.path.dirname(self._p(e["old"]))):
                return
        elif not os.path.isdir(os.path.dirname(p)):
            return
        trash = os.path.join(self.trash, e["trash"]) if e.get("trash") else None
        if op in ("create", "link"):
            if os.path.lexists(p):
                os.unlink(p)
        elif op == "mkdir":
            if os.path.isdir(p):
                shutil.rmtree(p)  # its entry is lost: what is under it with it
        elif op == "rmdir":
            if not os.path.lexists(p):
                os.mkdir(p, e.get("mode", 0o755))
        elif op == "unlink":
            if trash and os.path.lexists(trash) and not os.path.lexists(p):
                os.rename(trash, p)
        elif op == "rename":
            old, new = self._p(e["old"]), self._p(e["new"])
            if os.path.lexists(new) and not os.path.lexists(old):
                os.rename(new, old)
            if trash and os.path.lexists(trash) and not os.path.lexists(new):
                os.rename(trash, new)


def _make_operations(root: str, honour_fsync: bool = True) -> Any:
    import mfusepy
    from mfusepy import FuseOSError, Operations

    class PowerLossFS(Operations):
        use_ns = True

        def __init__(self) -> None:
            self.root = root
            self.mutex = threading.RLock()
            self.unsynced: dict[int, _Unsynced] = {}  # backing inode -> buffered contents
            self.handles: dict[int, tuple[int, int]] = {}  # fh -> (backing fd, inode)
            self.open_count: dict[int, int] = {}  # inode -> open handles
            self.orphans: set[int] = set()  # unlinked inodes still open: dropped at last release
            self.next_fh = 1
            self.ns = _Namespace(root)  # undoes what the last power loss took, before anything is served

        # -- helpers
        def _p(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _load(self, ino: int, fd: int) -> _Unsynced:
            u = self.unsynced.get(ino)
            if u is None:
                size = os.fstat(fd).st_size
                data = bytearray(os.pread(fd, size, 0)) if size else bytearray()
                u = self.unsynced[ino] = _Unsynced(data, len(data))
            return u

        def _forget_if_last_link(self, backing: str) -> None:
            try:
                st = os.lstat(backing)
            except FileNotFoundError:
                return
            if st.st_nlink - self.ns.trash_links.get(st.st_ino, 0) <= 1:
                if self.open_count.get(st.st_ino):
                    self.orphans.add(st.st_ino)
                else:
                    self.unsynced.pop(st.st_ino, None)

        def _open(self, path: str, flags: int) -> int:
            fd = os.open(self._p(path), os.O_RDWR if os.path.isfile(self._p(path)) else os.O_RDONLY)
            ino = os.fstat(fd).st_ino
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = (fd, ino)
            self.open_count[ino] = self.open_count.get(ino, 0) + 1
            return fh

        def _sync(self, ino: int, fd: int) -> None:
            u = self.unsynced.pop(ino, None)
            if u is not None:
                os.pwrite(fd, bytes(u.data[u.low:]), u.low)
                os.ftruncate(fd, len(u.data))
            os.fsync(fd)

        # -- attributes and the namespace: applied at once
        def getattr(self, path: str, fh: Optional[int] = None) -> dict[str, Any]:
            with self.mutex:
                try:
                    st = os.lstat(self._p(path))
                except OSError as e:
                    raise FuseOSError(e.errno)
                d = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                  "st_ino", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
                d["st_atime"], d["st_mtime"], d["st_ctime"] = d.pop("st_atime_ns"), d.pop("st_mtime_ns"), d.pop(
                    "st_ctime_ns")
                d["st_nlink"] -= self.ns.trash_links.get(st.st_ino, 0)  # links kept only to undo an unlink
                u = self.unsynced.get(st.st_ino)
                if u is not None:
                    d["st_size"] = len(u.data)
                d["st_blocks"] = (d["st_size"] + 511) // 512
                return d

        def readdir(self, path: str, fh: int):
            # With use_ino every entry needs its inode number: readdir(3) skips entries with 0.
            out = []
            with os.scandir(self._p(path)) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    out.append((e.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
            me = os.lstat(self._p(path))
            return [(".", {"st_mode": me.st_mode, "st_ino": me.st_ino}, 0), ("..", {"st_mode": me.st_mode}, 0)] + out

        def _change(self, entry: dict, apply: Callable[[], Any]) -> Any:
            """Journals a namespace change, then makes it; a change refused is cancelled."""
            e = self.ns.log(entry)
            try:
                return apply()
            except BaseException:
                self.ns.cancel(e)
                raise

        def _created(self, path: str, apply: Callable[[], Any]) -> Any:
            """A new entry at ``path`` (a file, link, socket or symlink)."""
            return self._change({"op": "create", "path": path, "dirs": [self.ns.dir_ino(path)]}, apply)

        def mkdir(self, path: str, mode: int) -> int:
            with self.mutex:
                self._change({"op": "mkdir", "path": path, "dirs": [self.ns.dir_ino(path)]},
                             lambda: os.mkdir(self._p(path), mode))
            return 0

        def mknod(self, path: str, mode: int, dev: int) -> int:
            with self.mutex:
                self._created(path, lambda: os.mknod(self._p(path), mode, dev))  # a worker's Unix socket
            return 0

        def rmdir(self, path: str) -> int:
            with self.mutex:
                st = os.lstat(self._p(path))
                if os.listdir(self._p(path)):
                    raise FuseOSError(errno.ENOTEMPTY)
                self._change({"op": "rmdir", "path": path, "mode": st.st_mode & 0o7777,
                              "dirs": [self.ns.dir_ino(path)]}, lambda: os.rmdir(self._p(path)))
            return 0

        def unlink(self, path: str) -> int:
            with self.mutex:
                self._forget_if_last_link(self._p(path))
                entry = {"op": "unlink", "path": path, "trash": f"t{self.ns.seq + 1}", "dirs": [self.ns.dir_ino(path)]}
                self._change(entry, lambda: self.ns.to_trash(path, entry))  # kept until durable (_Namespace)
            return 0

        def rename(self, old: str, new: str) -> int:
            with self.mutex:
                po, pn = self._p(old), self._p(new)
                src = os.lstat(po)
                replaced = os.path.lexists(pn)
                if replaced:  # rename(2)'s refusals, before the replaced entry goes to the trash
                    dst = os.lstat(pn)
                    if stat.S_ISDIR(dst.st_mode) and not stat.S_ISDIR(src.st_mode):
                        raise FuseOSError(errno.EISDIR)
                    if stat.S_ISDIR(src.st_mode) and not stat.S_ISDIR(dst.st_mode):
                        raise FuseOSError(errno.ENOTDIR)
                    if stat.S_ISDIR(dst.st_mode) and os.listdir(pn):
                        raise FuseOSError(errno.ENOTEMPTY)
                    if dst.st_ino == src.st_ino:
                        return 0  # two links to one file: rename(2) does nothing
                    if not stat.S_ISDIR(dst.st_mode):
                        self._forget_if_last_link(pn)
                entry = {"op": "rename", "old": old, "new": new, "trash": f"t{self.ns.seq + 1}" if replaced else None,
                         "dirs": sorted({self.ns.dir_ino(old), self.ns.dir_ino(new)})}

                def apply() -> None:
                    if replaced:
                        self.ns.to_trash(new, entry)
                    try:
                        os.rename(po, pn)
                    except OSError:
                        if replaced:  # put the replaced entry back before the change is cancelled
                            os.rename(os.path.join(self.ns.trash, entry["trash"]), pn)
                            self.ns.trash_links[dst.st_ino] -= 1
                        raise
                self._change(entry, apply)
            return 0

        def link(self, target: str, source: str) -> int:
            with self.mutex:
                self._created(target, lambda: os.link(self._p(source), self._p(target)))
            return 0

        def symlink(self, target: str, source: str) -> int:
            with self.mutex:
                self._created(target, lambda: os.symlink(source, self._p(target)))
            return 0

        def readlink(self, path: str) -> str:
            return os.readlink(self._p(path))

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._p(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._p(path), uid, gid)
            return 0

        def utimens(self, path: str, times: Optional[tuple[int, int]] = None) -> int:
            os.utime(self._p(path), ns=times) if times else os.utime(self._p(path))
            return 0

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._p(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self._p(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                 "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        # -- file data: buffered until fsync
        def create(self, path: str, mode: int, fi: Any = None) -> int:
            with self.mutex:
                fd = self._created(path, lambda: os.open(self._p(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode))
                os.close(fd)
                fh = self._open(path, os.O_RDWR)
                self.unsynced.pop(self.handles[fh][1], None)  # a new inode: nothing of an old one's
                return fh

        def open(self, path: str, flags: int) -> int:
            with self.mutex:
                return self._open(path, flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            with self.mutex:
                fd, ino = self.handles[fh]
                u = self.unsynced.get(ino)
                if u is not None:
                    return bytes(u.data[offset:offset + size])
                return os.pread(fd, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self.mutex:
                fd, ino = self.handles[fh]
                u = self._load(ino, fd)
                if offset > len(u.data):
                    u.data.extend(b"\0" * (offset - len(u.data)))
                u.data[offset:offset + len(data)] = data
                u.low = min(u.low, offset)
                return len(data)

        def truncate(self, path: str, length: int, fh: Optional[int] = None) -> int:
            with self.mutex:
                if fh is not None and fh in self.handles:
                    fd, ino = self.handles[fh]
                    own = False
                else:
                    fd, own = os.open(self._p(path), os.O_RDWR), True
                    ino = os.fstat(fd).st_ino
                try:
                    u = self._load(ino, fd)
                    if length < len(u.data):
                        del u.data[length:]
                    else:
                        u.data.extend(b"\0" * (length - len(u.data)))
                    u.low = min(u.low, length)
                finally:
                    if own:
                        os.close(fd)
            return 0

        def fallocate(self, path: str, mode: int, offset: int, length: int, fh: int) -> int:
            raise FuseOSError(errno.EOPNOTSUPP)  # preallocation is advice; callers go on without it

        def flush(self, path: str, fh: int) -> int:
            return 0  # close() is no sync point: the data stays buffered

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            if not honour_fsync:
                return 0  # a disk that lies (PowerLossMount(honour_fsync=False)): nothing is ever durable
            with self.mutex:
                fd, ino = self.handles[fh]
                self._sync(ino, fd)
            return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            if not honour_fsync:
                return 0
            with self.mutex:
                self.ns.synced(os.lstat(self._p(path)).st_ino)  # its entries are durable from here
            return 0

        def opendir(self, path: str) -> int:
            return 0

        def releasedir(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            with self.mutex:
                fd, ino = self.handles.pop(fh)
                os.close(fd)
                n = self.open_count.get(ino, 1) - 1
                if n:
                    self.open_count[ino] = n
                else:
                    self.open_count.pop(ino, None)
                    if ino in self.orphans:
                        self.orphans.discard(ino)
                        self.unsynced.pop(ino, None)
            return 0

    return PowerLossFS(), mfusepy


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    liar = "--ignore-fsync" in args
    args = [a for a in args if a != "--ignore-fsync"]
    if len(args) != 2:
        print("usage: python -m rhino_testing.harness.power_loss_fs [--ignore-fsync] BACKING MOUNTPOINT",
              file=sys.stderr)
        return 2
    ops, mfusepy = _make_operations(os.path.abspath(args[0]), honour_fsync=not liar)
    # use_ino: the backing inode numbers show through, so hard links look like hard links;
    # no kernel writeback cache (the default): every write reaches the daemon.
    mfusepy.FUSE(ops, args[1], foreground=True, nothreads=False, use_ino=True, fsname="rhino-power-loss")
    return 0


# ---- from a test -------------------------------------------------------------------------

class PowerLossMount:
    """A mounted layer over ``backing`` at ``mountpoint``; ``power_loss()`` crashes it.

    Processes that use the mount must be killed before ``power_loss()`` (a machine that
    loses power takes them along); their pids or process groups are the caller's."""

    def __init__(self, backing: Path, mountpoint: Path, log: Optional[Path] = None, *,
                 honour_fsync: bool = True) -> None:
        self.backing, self.mountpoint = Path(backing), Path(mountpoint)
        self.honour_fsync = honour_fsync  # False: a disk that acknowledges fsync and keeps nothing
        self.log = Path(log) if log else self.backing.parent / f"{self.mountpoint.name}.fuse.log"
        self.proc: Optional[subprocess.Popen] = None
        self.crashes = 0

    def __enter__(self) -> "PowerLossMount":
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.mount()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unmount()

    def mount(self, timeout: float = 20.0) -> None:
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen([sys.executable, "-m", "rhino_testing.harness.power_loss_fs"]
                                         + ([] if self.honour_fsync else ["--ignore-fsync"])
                                         + [str(self.backing), str(self.mountpoint)],
                                         stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the power-loss filesystem exited ({self.proc.returncode}) before mounting "
                                   f"{self.mountpoint}: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.mountpoint} was not mounted within {timeout} s")
            time.sleep(0.02)

    def _detach(self) -> None:
        # lazy: a mount whose daemon is gone still has to leave the namespace
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        deadline = time.monotonic() + 10
        while os.path.ismount(self.mountpoint) and time.monotonic() < deadline:
            time.sleep(0.02)

    def power_loss(self) -> None:
        """Every write not fsynced is lost: the daemon dies with them, and a new one mounts."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._detach()
        self.crashes += 1
        self.mount()

    def unmount(self) -> None:
        if self.proc is None:
            return
        subprocess.run(["umount", str(self.mountpoint)], capture_output=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._detach()
        self.proc = None


if __name__ == "__main__":
    sys.exit(main())
