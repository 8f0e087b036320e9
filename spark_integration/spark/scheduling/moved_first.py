"""After a failover or a handover, the tasks of the instances that moved start first
(docs/design.md §5, "Host loss").

Each partition of the stateful stage prefers the host of its instance's primary
(:mod:`.locality`). Spark's task set hands a free core the pending task of that host with
the **lowest partition index** first. After a host loss, the instances it held have new
primaries on the surviving hosts, next to instances that were already there; with one core
per host, the moved instance's task then waited for a neighbour's task to finish before it
started (2-3 s of the recovered batch, issue 29: the rerun task started 3.1-4.4 s after the
kill, its state ready 0.4 s after the kill).

So for the batch in which an instance moved, an instance that stayed on a host which now
also holds a moved one is given no preference: Spark's ``NODE_LOCAL`` round then launches
the moved instance's task on that host at once, and the stayer runs on the next free core
of any host (its session goes over TCP if that is not its primary's host: one batch, a
little slower, never wrong). From the next batch on, every instance prefers its primary's
host again. Locality is a preference only (locality.py): nothing here affects correctness.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

__all__ = ["preferred_hosts"]


def preferred_hosts(order: Sequence[int], hosts: Mapping[int, Optional[str]],
                    previous: Mapping[int, Optional[str]]) -> list[list[str]]:
    """The preferred hosts of each partition p (instance ``order[p]``).

    ``hosts``: each instance's primary host now; ``previous``: the hosts of the last job
    that ran (empty at the first one: nothing moved). An instance moved if it has a host
    now and had another one, or none, in a previous job that did run."""
    moved_to = {hosts[i] for i in order if previous and hosts.get(i) and previous.get(i) != hosts.get(i)}
    out: list[list[str]] = []
    for i in order:
        h = hosts.get(i)
        stayed = not previous or previous.get(i) == h
        out.append([] if not h or (stayed and h in moved_to) else [h])
    return out
