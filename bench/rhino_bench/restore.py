"""`rhino-bench restore`: hard-link restore against copy restore and `cp -al`.

How it runs and what each record holds: bench/README.md, "Restore sweep".
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional, TextIO

from rhino import Partitioner, ReplicaStore, StateBackend
from rhino._machine import describe_machine
from rhino._sizes import format_bytes
from rhino.errors import NoSpaceError
from rhino_testing.workload import build_state

__all__ = ["drop_caches", "measure_size", "run"]

OPERATOR = "bench"
DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_caches() -> bool:
    """`sync; echo 3 > /proc/sys/vm/drop_caches` if we may; True if it was done."""
    if not os.access(DROP_CACHES, os.W_OK):
        return False
    try:
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _rm(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def _cp_al(src: str, dst: str) -> None:
    subprocess.run(["cp", "-al", src, dst], check=True)


def measure_size(size_bytes: int, *, base_dir: str, value_size: int = 1024, repeats: int = 5,
                 compaction: str = "level", keep: bool = False, use_drop_caches: bool = True,
                 progress: bool = True,
                 settle_timeout: float = 1800.0, log: TextIO = sys.stderr) -> dict[str, Any]:
    """Builds, checkpoints and restores one state of about `size_bytes`; returns its figures."""
    def say(msg: str) -> None:
        print(msg, file=log, flush=True)

    work = os.path.join(base_dir, f"state-{size_bytes}")
    _rm(work)
    os.makedirs(work)
    free = shutil.disk_usage(work).free
    need = int(3 * size_bytes) + (256 << 20)
    if free < need:
        raise NoSpaceError(f"{format_bytes(free)} free under {base_dir}, a {format_bytes(size_bytes)} run needs "
                           f"about {format_bytes(need)} (state, compaction output, copy restore); choose another --dir")
    live, store_dir = os.path.join(work, "live"), os.path.join(work, "store")
    try:
        dropped: list[bool] = []

        def cold() -> None:
            if use_drop_caches:
                dropped.append(drop_caches())

        def link_restores(checkpoint_id: int, label: str, with_open: bool) -> tuple[list[float], list[float], Any]:
            link_runs, open_runs, stats = [], [], None
            for r in range(repeats):
                target = os.path.join(work, f"link-{checkpoint_id}-{r}")
                cold()
                t, stats = _timed(lambda: store.restore_files(OPERATOR, 0, checkpoint_id, target, mode="link"))
                link_runs.append(t)
                if with_open:
                    t, opened = _timed(lambda: StateBackend.open(target, create=False, compaction=compaction))
                    open_runs.append(t)
                    opened.close()
                _rm(target)
            say(f"  hard-link restore of checkpoint {checkpoint_id} ({label}): median "
                f"{statistics.median(link_runs) * 1e3:.1f} ms ({stats.linked_files} linked, {stats.copied_files} copied)"
                + (f"; open {statistics.median(open_runs):.3f} s" if with_open else ""))
            return link_runs, open_runs, stats

        # 1. Build the state and checkpoint it right away.
        db = StateBackend.open(live, partitioner=Partitioner(), operator_id=OPERATOR, instance=0,
                               compaction=compaction)
        built = build_state(db, size_bytes, value_size=value_size, progress=progress,
                            label=f"building {format_bytes(size_bytes)} state")
        store = ReplicaStore(store_dir)
        loaded_checkpoint_s, loaded = _timed(lambda: db.checkpoint(store, 1))
        db.close()  # no compaction competes with the timed restores; it resumes on reopening
        say(f"  checkpoint 1 (right after the load): {len(loaded.files)} files, "
            f"{format_bytes(loaded.total_bytes)} in {loaded_checkpoint_s:.2f} s")

        # 2. Hard-link restore of that checkpoint.
        loaded_runs, _, _ = link_restores(1, "right after the load", with_open=False)

        # 3. Let flushes and compactions drain, then checkpoint the settled state.
        say("  waiting for compactions to drain ...")
        db = StateBackend.open(live, create=False, compaction=compaction)
        settle_s, settled = _timed(lambda: db.wait_for_compactions(settle_timeout))
        if not settled:
            say(f"  WARNING: compactions still pending after {settle_timeout:.0f} s; checkpointing anyway")
        checkpoint_s, manifest = _timed(lambda: db.checkpoint(store, 2))
        db.close()
        say(f"  checkpoint 2 (settled after {settle_s:.1f} s): {len(manifest.files)} files, "
            f"{format_bytes(manifest.total_bytes)} in {checkpoint_s:.2f} s")
        store.retain(OPERATOR, 0, keep_last=1)  # checkpoint 1's merged-away files leave the pool
        store.gc()

        # 4. Hard-link restore (+ opening RocksDB on the result).
        link_runs, open_runs, link_stats = link_restores(2, "settled", with_open=True)

        # 5. cp -al of a directory holding the same files (a pristine hard-link restore).
        src = os.path.join(work, "link-src")
        store.restore_files(OPERATOR, 0, 2, src, mode="link")
        cp_runs = []
        for r in range(repeats):
            dst = os.path.join(work, f"cp-al-{r}")
            cold()
            subprocess.run(["cp", "--version"], check=True, stdout=subprocess.DEVNULL)  # cp itself warm
            t, _ = _timed(lambda: _cp_al(src, dst))
            cp_runs.append(t)
            _rm(dst)
        _rm(src)
        say(f"  cp -al: median {statistics.median(cp_runs) * 1e3:.1f} ms")

        # 6. Copy restore: every byte.
        copy_runs, copy_stats = [], None
        for r in range(repeats):
            target = os.path.join(work, f"copy-{r}")
            cold()
            t, copy_stats = _timed(lambda: store.restore_files(OPERATOR, 0, 2, target, mode="copy"))
            copy_runs.append(t)
            _rm(target)
        say(f"  copy restore: median {statistics.median(copy_runs):.2f} s")
    finally:
        if not keep:
            _rm(work)

    return {
        "size_bytes": size_bytes,
        "bytes": manifest.total_bytes,
        "files": len(manifest.files),
        "keys": built.keys,
        "value_size": value_size,
        "compaction": compaction,
        "vnodes": len(manifest.vnodes),
        "hardlink_restore_s": statistics.median(link_runs),
        "copy_restore_s": statistics.median(copy_runs),
        "cp_al_s": statistics.median(cp_runs),
        "open_s": statistics.median(open_runs),
        "hardlink_restore_runs": link_runs,
        "copy_restore_runs": copy_runs,
        "cp_al_runs": cp_runs,
        "open_runs": open_runs,
        "linked_files": link_stats.linked_files,
        "copied_files": link_stats.copied_files,
        "copied_bytes": link_stats.copied_bytes,
        "fell_back_to_copy": link_stats.fell_back_to_copy,
        "copy_restore_copied_files": copy_stats.copied_files,
        "files_after_load": len(loaded.files),
        "bytes_after_load": loaded.total_bytes,
        "hardlink_restore_after_load_s": statistics.median(loaded_runs),
        "hardlink_restore_after_load_runs": loaded_runs,
        "checkpoint_after_load_s": loaded_checkpoint_s,
        "settle_s": settle_s,
        "settled": settled,
        "build_state_s": built.seconds,
        "checkpoint_s": checkpoint_s,
        "repeats": repeats,
        "dropped_caches": bool(dropped) and all(dropped),
    }


def run(sizes: list[int], *, base_dir: str, value_size: int = 1024, repeats: int = 5, compaction: str = "level",
        keep: bool = False,
        use_drop_caches: bool = True, json_lines: bool = False, out_file: Optional[str] = None,
        command: str = "", stdout: TextIO = sys.stdout, log: TextIO = sys.stderr) -> list[dict[str, Any]]:
    """Measures every size in turn; prints one JSON line (or one summary line) per size as it finishes."""
    os.makedirs(base_dir, exist_ok=True)
    run_id = _dt.datetime.now().strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    results = []
    for size in sizes:
        print(f"[{format_bytes(size)}] building, checkpointing and restoring (x{repeats})", file=log, flush=True)
        figures = measure_size(size, base_dir=base_dir, value_size=value_size, repeats=repeats,
                               compaction=compaction, keep=keep,
                               use_drop_caches=use_drop_caches, log=log)
        figures.update({
            "run_id": run_id,
            "timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
            "command": command,
            "machine": describe_machine(base_dir),
        })
        line = json.dumps(figures, sort_keys=False)
        if json_lines:
            print(line, file=stdout, flush=True)
        else:
            print(_summary(figures), file=stdout, flush=True)
        if out_file:
            os.makedirs(os.path.dirname(os.path.abspath(out_file)), exist_ok=True)
            with open(out_file, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        results.append(figures)
    if not keep:
        try:
            os.rmdir(base_dir)  # only if empty: never remove what we did not create
        except OSError:
            pass
    return results


def _summary(f: dict[str, Any]) -> str:
    hl, cp, al = f["hardlink_restore_s"], f["copy_restore_s"], f["cp_al_s"]
    return (f"{format_bytes(f['size_bytes']):>9}: right after the load {f['files_after_load']} files, "
            f"hard-link restore {f['hardlink_restore_after_load_s'] * 1e3:.1f} ms; settled "
            f"{f['files']} files, {format_bytes(f['bytes'])}; "
            f"hard-link restore {hl * 1e3:.1f} ms, copy restore {cp:.2f} s ({cp / hl:.0f}x slower), "
            f"cp -al {al * 1e3:.1f} ms (hard-link/cp -al = {hl / al:.2f}), open {f['open_s']:.3f} s"
            f"{'' if f['dropped_caches'] else '  [page cache not dropped]'}")


def _parser() -> Any:
    import argparse

    from .report import positive_int, sizes_arg

    p = argparse.ArgumentParser(
        prog="rhino-bench restore",
        description="For each size: build a state and checkpoint it right away, and time hard-link restores of "
                    "that checkpoint; then let compactions drain, checkpoint again, and time hard-link restore, "
                    "copy restore and `cp -al` of the same files, all in the same run. Prints one JSON object "
                    "per size with --json.")
    p.add_argument("--sizes", type=sizes_arg, required=True, metavar="LIST",
                   help="comma-separated state sizes, e.g. 256M,1G,4G (K/M/G/T are powers of 1024)")
    p.add_argument("--json", action="store_true", help="one JSON object per line and per size on stdout")
    p.add_argument("--dir", default=".bench-restore", help="work directory (default: %(default)s)")
    p.add_argument("--out", metavar="FILE", help="also append the JSON lines to FILE")
    p.add_argument("--value-size", type=positive_int, default=1024, help="bytes per value (default: %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed runs per measurement; the median is reported (default: %(default)s)")
    p.add_argument("--compaction", choices=["level", "universal"], default="level",
                   help="compaction style of the state's vnodes (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the state, store and restored directories")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="do not drop the page cache before timed runs (it is dropped when we may)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    command = "rhino-bench restore " + " ".join(shlex.quote(a) for a in argv)
    try:
        run(args.sizes, base_dir=args.dir, value_size=args.value_size, repeats=args.repeats,
            compaction=args.compaction, keep=args.keep, use_drop_caches=not args.no_drop_caches,
            json_lines=args.json, out_file=args.out, command=command)
    except OSError as e:  # a full disk or a permission problem: one line, no traceback
        print(f"rhino-bench restore: error: {e}", file=sys.stderr)
        return 2
    return 0
