"""The test modules that start a cluster of "hosts" on 127.0.0.N each use their own range of
N, so that two of them can run at once (``make test`` runs two pytest-xdist workers): a
Spark standalone cluster or a set of workers binds its hosts' addresses, and two clusters on
the same addresses would meet in each other's locality and host-loss decisions."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SPAN = 4  # hosts a cluster may take from its first: 3, and one that joins
FIRST = re.compile(r"first_host=(\d+)|\"--first-host\", \"(\d+)\"|FIRST(?:_HOST)? = (\d+)")
HOSTS = re.compile(r"^HOSTS = \(([\d, ]+)\)", re.M)


def _ranges() -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for p in sorted(TESTS.glob("test_*.py")):
        text = p.read_text()
        used: set[int] = set()
        for m in FIRST.finditer(text):
            n = int(next(g for g in m.groups() if g))
            if n > 4:  # 2 (the default) and below: the shared small clusters of rhino_cluster()
                used |= set(range(n, n + SPAN))
        for m in HOSTS.finditer(text):
            used |= {int(x) for x in m.group(1).replace(" ", "").split(",") if x}
        if used:
            out[p.name] = used
    return out


def test_cluster_modules_use_distinct_hosts():
    ranges = _ranges()
    assert len(ranges) >= 10, ranges  # the patterns found the modules at all
    names = sorted(ranges)
    clashes = [(a, b, sorted(ranges[a] & ranges[b])) for i, a in enumerate(names) for b in names[i + 1:]
               if ranges[a] & ranges[b]]
    assert not clashes, f"two test modules share 127.0.0.N hosts: {clashes}"
