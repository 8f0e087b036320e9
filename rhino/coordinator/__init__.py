"""The coordinator: Replication Manager, Handover Manager and their metadata (docs/design.md §3-§4).

- :class:`Coordinator` runs in-process (the Spark driver hosts it on a thread);
  ``rhino coordinator`` serves it as a process (:mod:`.server`).
- :func:`connect_coordinator` reaches a coordinator process;
  :class:`LocalCoordinatorClient` has the same methods on one in this process.
"""

from .client import CoordinatorClient, LocalCoordinatorClient, connect_coordinator
from .coordinator import Coordinator

__all__ = ["Coordinator", "CoordinatorClient", "LocalCoordinatorClient", "connect_coordinator"]
