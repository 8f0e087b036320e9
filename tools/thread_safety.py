#!/usr/bin/env python3
"""``make thread-safety``: clang's thread-safety analysis over the C++ core.

The annotations are in ``src/cpp/include/rhino/thread_annotations.h`` (``GUARDED_BY``, ``REQUIRES``,
and the ``Mutex``/``MutexLock``/``CondVar`` types the analysis can follow). This script takes the
compile commands CMake wrote for the ``rhino_core`` library in a build directory configured with
``clang++`` and ``CMAKE_EXPORT_COMPILE_COMMANDS=ON`` (the Makefile configures
``build/thread-safety``; nothing is built there), so the include paths and defines are the real
build's, and runs each one with ``-fsyntax-only -Wthread-safety -Werror=thread-safety`` instead of
compiling it, ``-j`` at a time. The unit tests and the bindings are not part of that library and are
not checked.

First it checks that the analysis is live: a probe that touches a ``GUARDED_BY`` member without its
lock must be refused. Otherwise (the compiler is not clang, or the macros expand to nothing) a clean
run would prove nothing, and the check fails.

Usage::

    python3 tools/thread_safety.py build/thread-safety/compile_commands.json -j 2

Exit status 0 if every file passes, 1 otherwise (each failing file's diagnostics are printed).
Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
TARGET_DIR = "CMakeFiles/rhino_core.dir/"  # the object files of the core library
# Flags of a compile command that name or shape its outputs, with how many arguments follow them.
DROP = {"-c": 0, "-o": 1, "-MD": 0, "-MMD": 0, "-MT": 1, "-MQ": 1, "-MF": 1}

PROBE = """\
#include "rhino/thread_annotations.h"
struct Probe {
  rhino::Mutex mu;
  int n GUARDED_BY(mu) = 0;
  void Touch() { ++n; }  // without mu: the analysis must refuse this
};
"""


def core_commands(compile_commands: Path) -> list[tuple[str, list[str], str]]:
    """(source file, argv, directory) of each of rhino_core's compile commands."""
    out = []
    for entry in json.loads(compile_commands.read_text()):
        argv = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
        output = entry.get("output") or next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"), "")
        if TARGET_DIR not in output:
            continue
        out.append((entry["file"], argv, entry["directory"]))
    return sorted(out)


def syntax_only(argv: list[str], keep_source: bool = True) -> list[str]:
    """argv without its outputs (and without its source file unless keep_source), plus FLAGS."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        if a in DROP:
            skip = DROP[a]
            continue
        if not keep_source and a.endswith((".cc", ".cpp", ".cxx")):
            continue
        out.append(a)
    return out + FLAGS


def check_probe(argv: list[str], directory: str) -> str | None:
    """None if the analysis refuses the probe; else why the check cannot be trusted."""
    cmd = syntax_only(argv, keep_source=False) + ["-x", "c++", "-"]
    p = subprocess.run(cmd, input=PROBE, capture_output=True, text=True, cwd=directory)
    if p.returncode != 0 and "requires holding mutex 'mu'" in p.stderr:
        return None
    return (f"the thread-safety analysis is not on: a probe touching a GUARDED_BY member without its lock "
            f"was not refused for it (exit {p.returncode}) by\n  {shlex.join(cmd)}\n{p.stderr}")


def run_one(source: str, argv: list[str], directory: str) -> tuple[str, int, str, float]:
    t0 = time.monotonic()
    p = subprocess.run(syntax_only(argv), capture_output=True, text=True, cwd=directory)
    return source, p.returncode, p.stderr, time.monotonic() - t0


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("compile_commands", type=Path)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    o = ap.parse_args(args)
    commands = core_commands(o.compile_commands)
    if not commands:
        print(f"[thread-safety] no compile command of rhino_core in {o.compile_commands}", file=sys.stderr)
        return 1
    why = check_probe(commands[0][1], commands[0][2])
    if why:
        print(f"[thread-safety] {why}", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, o.jobs)) as pool:
        for source, rc, stderr, _secs in pool.map(lambda c: run_one(*c), commands):
            if stderr:
                sys.stderr.write(stderr)
            if rc != 0:
                failed.append(source)
    secs = time.monotonic() - t0
    if failed:
        print(f"[thread-safety] FAILED: {len(failed)} of {len(commands)} files ({secs:.0f} s):", file=sys.stderr)
        for f in failed:
            print(f"  {f}", file=sys.stderr)
        return 1
    print(f"[thread-safety] {len(commands)} files of rhino_core pass -Wthread-safety ({secs:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
