"""Placements for the tests' stand-in coordinators: a
:class:`~rhino.coordinator.Placement` with what a test names, the rest empty (no
vnodes, no batch time), as a coordinator client's ``placement`` returns it."""

from __future__ import annotations

from typing import Optional

from rhino.coordinator.types import InstancePlacement, Placement


def instance(primary: str = "w1", *, address: Optional[str] = None, host: Optional[str] = None,
             chain: tuple[str, ...] = (), chain_addresses: tuple[str, ...] = ()) -> InstancePlacement:
    return InstancePlacement(primary=primary, address=address, unix_socket=None, host=host, chain=chain,
                             chain_addresses=chain_addresses, chain_version=1, last_complete=None, bytes=0)


def placement(epoch: int = 1, *, instances: Optional[dict[int, InstancePlacement]] = None,
              assignment: tuple[int, ...] = (), last_batch: Optional[int] = None,
              operator_id: str = "op") -> Placement:
    return Placement(operator_id=operator_id, epoch=epoch, num_vnodes=len(assignment), num_key_groups=64, seed=0,
                     replicas=0, last_batch=last_batch, assignment=tuple(assignment),
                     instances=dict(instances or {}), batch_time=None)
