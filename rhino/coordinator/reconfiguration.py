"""A reconfiguration the Replication Manager decided and has not yet committed: its
journal entry (the coordinator's crash safety, replication_manager.py).

It is decided, written to the metadata, carried out with idempotent requests, then
committed with the instances' new rows in one transaction. A coordinator killed in
between finds it at its restart and decides it again (``resume``); one that failed is
retried by the failure detector (liveness.py). It lives in the metadata as JSON
(``pending:<operator>``), converted only here, at that edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ReconfigStep", "Reconfiguration"]


@dataclass
class ReconfigStep:
    """What happens to one instance: its ``primary`` (a ``takeover`` by a chain member
    when the old one is lost or leaving) and its ``chain`` at ``chain_version``, with the
    members ``added`` by a repair (a bulk copy from the primary). ``lost``: no live worker
    holds its last complete checkpoint; it is left as it is."""

    instance: int
    old_primary: str
    primary: Optional[str] = None
    chain: list[str] = field(default_factory=list)
    chain_version: int = 0
    takeover: bool = False
    lost: bool = False
    added: list[str] = field(default_factory=list)
    copy_from: Optional[str] = None

    def to_doc(self) -> dict:
        return {"instance": self.instance, "old_primary": self.old_primary, "primary": self.primary,
                "chain": list(self.chain), "chain_version": self.chain_version, "takeover": self.takeover,
                "lost": self.lost, "added": list(self.added), "copy_from": self.copy_from}

    @classmethod
    def from_doc(cls, d: dict) -> "ReconfigStep":
        # A journal written before every field was kept leaves the absent ones out.
        return cls(instance=int(d["instance"]), old_primary=d.get("old_primary") or "", primary=d.get("primary"),
                   chain=list(d.get("chain") or []), chain_version=int(d.get("chain_version") or 0),
                   takeover=bool(d.get("takeover")), lost=bool(d.get("lost")), added=list(d.get("added") or []),
                   copy_from=d.get("copy_from"))


@dataclass
class Reconfiguration:
    """An operator moved to ``epoch`` for ``reason``: one step per instance, and the
    workers it moves off because they are ``leaving`` (a decommission)."""

    epoch: int
    reason: str
    steps: list[ReconfigStep]
    leaving: list[str] = field(default_factory=list)

    def to_doc(self) -> dict:
        return {"epoch": self.epoch, "reason": self.reason, "steps": [s.to_doc() for s in self.steps],
                "leaving": sorted(self.leaving)}

    @classmethod
    def from_doc(cls, d: Any) -> "Reconfiguration":
        return cls(epoch=int(d["epoch"]), reason=str(d.get("reason", "reconfiguration")),
                   steps=[ReconfigStep.from_doc(s) for s in d.get("steps") or []],
                   leaving=list(d.get("leaving") or []))
