"""After a failover or a handover, the tasks of the instances that moved start first
(docs/design.md §5, "Host loss").

Each partition of the stateful stage prefers the host of its instance's primary
(:mod:`.locality`). Spark's task set hands a free core the pending task of that host with
the **lowest partition index** first. After a host loss, the instances it held have new
primaries on the surviving hosts, next to instances that were already there; with one core
per host, the moved instance's task then waited for a neighbour's task to finish before it
started (2-3 s of the recovered batch, issue 29: the rerun task started 3.1-4.4 s after the
kill, its state ready 0.4 s after the kill).

So in the batch in which an instance moved, its partition prefers an **executor** on its
new primary's host (Spark's ``executor_<host>_<id>`` location, ``PROCESS_LOCAL``), where
the others prefer a host (``NODE_LOCAL``). Spark offers every free core at the most local
level first, so the moved instance's task takes its host's core before a neighbour's;
once no ``PROCESS_LOCAL`` task is pending, Spark moves on to the hosts' tasks without
waiting. (Giving the neighbour no preference instead does not work: a partition without
one inherits the shuffle's reduce locality, the host its input was written on.)
From the next batch on, every instance prefers its primary's host again. Locality is a
preference only (locality.py): nothing here affects correctness.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["preferred_locations", "moved", "executors_by_host"]


def preferred_locations(order: Sequence[int], hosts: Mapping[int, Optional[str]],
                        previous: Mapping[int, Optional[str]],
                        executors: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Spark's preferred locations of each partition p (instance ``order[p]``).

    ``hosts``: each instance's primary host now; ``previous``: the hosts of the last job
    that ran (empty at the first one: nothing moved); ``executors``: the live executor ids
    of each host. An instance moved if it has a host now and had another one, or none,
    in a previous job. A moved instance whose host has no known executor keeps the host."""
    out: list[list[str]] = []
    for i in order:
        h = hosts.get(i)
        if not h:
            out.append([])
            continue
        moved = bool(previous) and previous.get(i) != h
        ids = sorted(executors.get(h, ()))
        out.append([f"executor_{h}_{ids[0]}"] if moved and ids else [h])
    return out


def moved(order: Sequence[int], hosts: Mapping[int, Optional[str]], previous: Mapping[int, Optional[str]]) -> bool:
    """Whether an instance moved since the previous job (see :func:`preferred_locations`)."""
    return bool(previous) and any(hosts.get(i) and previous.get(i) != hosts.get(i) for i in order)


def executors_by_host(sc: Any) -> dict[str, list[str]]:
    """The live executors' ids per host, from the driver's status store ({} if it cannot be
    read: the moved instances then keep a host preference)."""
    out: dict[str, list[str]] = {}
    try:
        execs = sc._jsc.sc().statusStore().executorList(True)
        for k in range(execs.size()):
            e = execs.apply(k)
            if e.id() == "driver":
                continue
            out.setdefault(str(e.hostPort()).rsplit(":", 1)[0], []).append(str(e.id()))
    except Exception:  # noqa: BLE001 - a py4j hiccup: no executor-level preference this batch
        return {}
    return out
