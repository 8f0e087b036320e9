"""``rhino coordinator --rebuild``: the metadata directory is lost; rebuild it
from what the workers host and hold (docs/design.md §7: "the workers' stores
hold enough to rebuild it").

- Each registered worker lists the instances it hosts (their epoch, vnodes,
  partitioner, chain and chain version: its ``instance.json``).
- An instance hosted on several workers (a stale host that came back) belongs
  to the one with the highest (epoch, chain version).
- Its last complete checkpoint is the newest one held by its primary **and**
  every chain member (each worker's own store says what it holds).
- The routing table is the union of the primaries' vnodes; a vnode claimed
  twice or by no one is an error, reported, never guessed.
- The operator's epoch is one above the highest seen, and every instance is
  re-opened at it, so anything that acted on the lost metadata is fenced.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import CorruptionError, RhinoError
from .metadata import InstanceRow, OperatorRow

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["rebuild_from_workers"]


def rebuild_from_workers(coord: "Coordinator") -> dict[str, Any]:
    with coord.lock:
        workers = coord.workers.alive_workers()
        by_address = {w.address: w.id for w in workers}
        hosted: dict[tuple[str, int], list[tuple[str, dict]]] = {}
        for w in workers:
            try:
                for h in coord.workers.client(w).instances():
                    hosted.setdefault((h["operator_id"], int(h["instance"])), []).append((w.id, h))
            except RhinoError as e:
                coord.log("rebuild_worker_unreachable", worker=w.id, error=str(e))
        ops: dict[str, dict[str, Any]] = {}
        rows: list[InstanceRow] = []
        for (op, i), hosts in sorted(hosted.items()):
            wid, h = max(hosts, key=lambda x: (x[1]["epoch"], x[1]["chain_version"]))
            chain = []
            for a in h["chain"]:
                if a not in by_address:
                    raise CorruptionError(f"{op}/{i}: chain member {a} has not registered; cannot rebuild")
                chain.append(by_address[a])
            common = None
            for member in [wid, *chain]:
                ids = set(coord.workers.client(member).status(op, i)["checkpoints"])
                common = ids if common is None else common & ids
            last = max(common) if common else None
            rows.append(InstanceRow(operator_id=op, instance=i, primary_worker=wid, chain=chain,
                                    chain_version=int(h["chain_version"]), state="active", last_complete=last,
                                    bytes=0, redo_version=None, redo=[]))
            o = ops.setdefault(op, {"num_vnodes": h["num_vnodes"], "num_key_groups": h["num_key_groups"],
                                    "seed": h["seed"], "epoch": 0, "replicas": 0, "owner": {}, "last": []})
            o["epoch"] = max(o["epoch"], int(h["epoch"]))
            o["replicas"] = max(o["replicas"], len(chain))
            o["last"].append(last)
            for v in h["vnodes"]:
                if v in o["owner"]:
                    raise CorruptionError(f"{op}: vnode {v} is held by instances {o['owner'][v]} and {i}")
                o["owner"][v] = i
        summary: dict[str, Any] = {"operators": {}}
        for op, o in ops.items():
            missing = [v for v in range(o["num_vnodes"]) if v not in o["owner"]]
            if missing:
                raise CorruptionError(f"{op}: no live instance holds vnodes {missing[:10]}"
                                      f"{'...' if len(missing) > 10 else ''}; cannot rebuild its routing table")
            lasts = [x for x in o["last"] if x is not None]
            last_batch = min(lasts) if lasts and len(lasts) == len(o["last"]) else None
            epoch = o["epoch"] + 1
            mine = [r for r in rows if r.operator_id == op]
            for r in mine:
                r.last_complete = last_batch
            with coord.meta.tx() as c:
                coord.meta.put_operator(c, OperatorRow(
                    operator_id=op, num_vnodes=o["num_vnodes"], num_key_groups=o["num_key_groups"], seed=o["seed"],
                    replicas=o["replicas"], placement="balanced", epoch=epoch, last_batch=last_batch,
                    created_at=time.time()))
                coord.meta.set_assignment(c, op, [o["owner"][v] for v in range(o["num_vnodes"])])
                for r in mine:
                    coord.meta.put_instance(c, r)
                coord.meta.record_epoch(c, op, epoch, "rebuilt from the workers")
                coord.meta.event(c, "rebuilt", operator=op, instances=len(mine), last_batch=last_batch, epoch=epoch)
            for r in mine:  # fence everything at the new epoch
                coord.workers.client(r.primary_worker).open_instance(
                    op, r.instance, epoch=epoch, chain=coord.workers.addresses(r.chain), chain_version=r.chain_version,
                    num_vnodes=o["num_vnodes"], num_key_groups=o["num_key_groups"], seed=o["seed"])
            summary["operators"][op] = {"instances": len(mine), "epoch": epoch, "last_batch": last_batch}
        coord.rebuilding = False
        return summary
