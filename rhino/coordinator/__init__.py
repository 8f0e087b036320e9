"""The coordinator: Replication Manager, Handover Manager and their metadata (docs/design.md §3-§4).

- :class:`Coordinator` runs in-process (the Spark driver hosts it on a thread);
  ``rhino coordinator`` serves it as a process (:mod:`.server`).
- :func:`connect_coordinator` reaches a coordinator process;
  :class:`LocalCoordinatorClient` has the same methods on one in this process.
- Their methods are declared once in :mod:`.api`; what they answer is typed in
  :mod:`.types` (:class:`Placement`, :class:`InstancePlacement`, :class:`CommitAnswer`).
"""

from typing import Any

from .client import CoordinatorClient, LocalCoordinatorClient, connect_coordinator
from .types import BatchTime, CommitAnswer, InstancePlacement, Placement

__all__ = ["Coordinator", "CoordinatorClient", "LocalCoordinatorClient", "connect_coordinator",
           "Placement", "InstancePlacement", "BatchTime", "CommitAnswer"]


def __getattr__(name: str) -> Any:
    # Imported when first named: a Spark task unpickles placements (.types) and reaches the
    # coordinator (.client) without loading the coordinator's own dependencies (SciPy's
    # assignment solver, SQLite), which took 0.9 s in a fresh Python worker.
    if name == "Coordinator":
        from .coordinator import Coordinator

        return Coordinator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
