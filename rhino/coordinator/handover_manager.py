"""The Handover Manager (Rhino paper §4.1; docs/design.md §4, micro-batch form).

A handover moves vnodes from origin instances to target instances at the
barrier after batch b, which is the cut (paper §3.4 R1: the batch boundary is
the marker, and the barrier aligns it). One step:

1. Checkpoint b of every instance is complete on its chain (the engine reported
   batch b done). A target's worker holds the origin's checkpoint b when it is
   the origin's primary or in its chain (vertical scaling, rebalance); else it
   first receives a bulk copy (horizontal scaling onto another worker).
2. The epoch goes up: every instance is re-opened at e+1, so the old owners
   are fenced (docs/protocol.md §7.5).
3. Each target imports its vnodes by hard links from its worker's replica of
   the origin's checkpoint b; each origin drops them (``reconfigure``,
   docs/protocol.md §7.4). New instances are checkpointed at b and replicated.
4. With every ack in, the new routing table is committed (one SQLite
   transaction) and batch b+1 is routed with it. If a step fails or times out
   it is undone (targets drop, origins re-import their own checkpoint b) at a
   new epoch with the old table: nothing of it is visible after an abort.

New instances go to a worker that holds the origins' checkpoints (vertical
scaling: imports by hard links, no bytes move) unless the plan names workers
for them (``on``: horizontal scaling onto a worker that joined, which first
receives a bulk copy of the origins' checkpoint b).

A plan is split into steps by a migration strategy (Megaphone: all-at-once,
fluid, batched; :mod:`.strategies`), one step per barrier, and may be
scheduled for a future batch.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Optional

from ..errors import InvalidArgumentError, RhinoError, UnknownVnodeError
from .metadata import InstanceRow, PlanRow
from .placement import InstanceInfo, choose_primary, place_chains
from .strategies import STRATEGIES, balance_moves, plan_steps, rescale_moves

if TYPE_CHECKING:
    from .coordinator import Coordinator

__all__ = ["HandoverManager"]


class HandoverManager:
    def __init__(self, coordinator: "Coordinator") -> None:
        self.c = coordinator
        self.meta = coordinator.meta

    # ---- planning -------------------------------------------------------------------------
    def _next_barrier(self, operator_id: str, after_batch: Optional[int]) -> int:
        op = self.c._operator(operator_id)
        done = -1 if op.last_batch is None else op.last_batch
        if after_batch is None:
            return max(done, 0)
        if not isinstance(after_batch, int) or after_batch < max(done, 0):
            raise InvalidArgumentError(f"after_batch must be a barrier still ahead (>= {max(done, 0)}), got {after_batch!r}")
        return after_batch

    def _insert(self, operator_id: str, kind: str, strategy: str, moves: list, after: int,
                placement: Optional[dict[int, str]] = None) -> dict:
        if strategy not in STRATEGIES:
            raise InvalidArgumentError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
        steps = [[list(m) for m in s] for s in plan_steps([tuple(m) for m in moves], strategy)] if moves else []
        now = time.time()
        with self.meta.tx() as c:
            cur = c.execute("INSERT INTO plans (operator_id, kind, strategy, steps, steps_done, after_batch, state,"
                            " created_at, updated_at, placement) VALUES (?,?,?,?,0,?,?,?,?,?)",
                            (operator_id, kind, strategy, json.dumps(steps), after,
                             "scheduled" if steps else "done", now, now, json.dumps(placement or {})))
            plan_id = cur.lastrowid
            self.meta.event(c, "plan_scheduled", plan=plan_id, operator=operator_id, plan_kind=kind, strategy=strategy,
                            moves=len(moves), steps=len(steps), after_batch=after)
        self.c.log("plan_scheduled", plan=plan_id, operator=operator_id, kind=kind, moves=len(moves), steps=len(steps))
        return {"plan": plan_id, "kind": kind, "strategy": strategy, "moves": len(moves), "steps": len(steps),
                "after_batch": after}

    def _check_on(self, on: Optional[list[str]]) -> list[str]:
        """Workers asked to host new instances (horizontal scaling): live and known."""
        if not on:
            return []
        alive = {w.id for w in self.c.alive_workers()}
        for w in on:
            if w not in alive:
                raise InvalidArgumentError(f"worker {w!r} is not a live registered worker")
        return list(on)

    def plan_handover(self, operator_id: str, vnodes: list[int], to: int, *, strategy: str,
                      after_batch: Optional[int], on: Optional[str] = None) -> dict:
        op = self.c._operator(operator_id)
        if not isinstance(to, int) or to < 0:
            raise InvalidArgumentError(f"the target instance must be an int >= 0, got {to!r}")
        if not vnodes:
            raise InvalidArgumentError("no vnodes to hand over")
        assignment = self.meta.assignment(operator_id)
        for v in vnodes:
            if not isinstance(v, int) or not 0 <= v < op.num_vnodes:
                raise UnknownVnodeError(f"vnode {v!r} is outside [0, {op.num_vnodes})")
        retired = {r.instance for r in self.meta.instances(operator_id, active_only=False) if r.state == "retired"}
        if to in retired:
            raise InvalidArgumentError(f"instance {to} of {operator_id} was retired; use a new instance number")
        moves = [(v, assignment[v], to) for v in sorted(set(vnodes)) if assignment[v] != to]
        active = {r.instance for r in self.meta.instances(operator_id)}
        placement = {to: self._check_on([on])[0]} if on and to not in active else {}
        if on and to in active:
            raise InvalidArgumentError(f"instance {to} exists; 'on' places a new instance only")
        return self._insert(operator_id, "handover", strategy, moves, self._next_barrier(operator_id, after_batch),
                            placement)

    def plan_rescale(self, operator_id: str, parallelism: int, *, strategy: str, after_batch: Optional[int],
                     on: Optional[list[str]] = None) -> dict:
        op = self.c._operator(operator_id)
        if not isinstance(parallelism, int) or not 1 <= parallelism <= op.num_vnodes:
            raise InvalidArgumentError(f"parallelism must be in [1, {op.num_vnodes}], got {parallelism!r}")
        if self.meta.plans(open_only=True):
            raise InvalidArgumentError("a plan is in flight; wait for it (rhino status) before rescaling")
        active = [r.instance for r in self.meta.instances(operator_id)]
        every = [r.instance for r in self.meta.instances(operator_id, active_only=False)]
        if parallelism >= len(active):
            fresh = list(range(max(every) + 1, max(every) + 1 + parallelism - len(active)))
            new = active + fresh
        else:
            new = active[:parallelism]  # the highest numbers leave
        moves = rescale_moves(self.meta.assignment(operator_id), active, new)
        workers = self._check_on(on)
        fresh_ids = [i for i in new if i not in active]
        placement = {i: workers[k % len(workers)] for k, i in enumerate(fresh_ids)} if workers else {}
        return self._insert(operator_id, f"rescale {len(active)}->{parallelism}", strategy, moves,
                            self._next_barrier(operator_id, after_batch), placement)

    def plan_balance(self, operator_id: str, *, strategy: str, after_batch: Optional[int]) -> Optional[dict]:
        load = self.meta.vnode_load(operator_id)
        if not load:
            return None
        active = [r.instance for r in self.meta.instances(operator_id)]
        moves = balance_moves(self.meta.assignment(operator_id), active, load)
        if not moves:
            return None
        return self._insert(operator_id, "load balance", strategy, moves, self._next_barrier(operator_id, after_batch))

    # ---- execution at a barrier ---------------------------------------------------------------
    def run_due(self, operator_id: str, barrier: int) -> None:
        """Runs one step of every plan due at the barrier after batch ``barrier``."""
        for p in self.meta.plans(open_only=True):
            if p.operator_id != operator_id or p.after_batch is None or p.after_batch > barrier:
                continue
            self.run_step(p, barrier)

    def run_step(self, p: PlanRow, b: int) -> dict:
        operator_id = p.operator_id
        op = self.c._operator(operator_id)
        rows = {r.instance: r for r in self.meta.instances(operator_id)}
        assignment = self.meta.assignment(operator_id)
        moves = [tuple(m) for m in p.steps[p.steps_done]]
        # Another plan or a rescale may have moved a vnode since this plan was made.
        moves = [(v, o, t) for v, o, t in moves if assignment[v] == o and o != t]
        t0 = time.monotonic()
        if any(r.last_complete != b for r in rows.values()):
            raise InvalidArgumentError(f"a handover of {operator_id} at the barrier after batch {b} needs checkpoint "
                                       f"{b} complete everywhere")
        alive = {w.id for w in self.c.alive_workers()}
        workers = self.c.rm.workers_info()
        new_ids = sorted({t for _, _, t in moves if t not in rows})
        load: dict[str, int] = {w: 0 for w in alive}
        for r in rows.values():
            load[r.primary_worker] = load.get(r.primary_worker, 0) + 1
        new_rows: dict[int, InstanceRow] = {}
        for t in new_ids:
            origins = {o for _, o, tt in moves if tt == t}
            holders = set(alive)
            for o in origins:
                holders &= {rows[o].primary_worker, *rows[o].chain}
            # Vertical scaling: on a worker that holds the origins' checkpoints.
            # Horizontal (no such worker): the least loaded, after a bulk copy.
            if p.placement.get(t) in alive:
                primary = p.placement[t]  # horizontal scaling: asked for; a bulk copy comes first
            else:
                primary = choose_primary(sorted(holders or alive), load)
            load[primary] = load.get(primary, 0) + 1
            held = {(operator_id, t): {w: sum(rows[o].bytes for o in origins if w in rows[o].chain) for w in alive}}
            chain = place_chains([InstanceInfo(key=(operator_id, t), primary=primary,
                                               bytes=sum(rows[o].bytes for o in origins))],
                                 workers, op.replicas, mode=op.placement, held=held)[(operator_id, t)]
            new_rows[t] = InstanceRow(operator_id=operator_id, instance=t, primary_worker=primary, chain=chain,
                                      chain_version=1, state="active", last_complete=b, bytes=0,
                                      redo_version=None, redo=[])
        every = {**rows, **new_rows}
        # Step 2 of the header: bulk copies where a target's worker lacks an origin's checkpoint b.
        copied = 0
        pairs = sorted({(o, t) for _, o, t in moves})
        for o, t in pairs:
            wt = every[t].primary_worker
            if wt == rows[o].primary_worker or wt in rows[o].chain:
                continue
            res = self.c.client(rows[o].primary_worker).replicate(
                operator_id, o, epoch=op.epoch, to=self.c.rm.addresses([wt]), chain_version=rows[o].chain_version,
                checkpoint=b, timeout=self.c.copy_timeout)
            copied += int(res["bytes_sent"])
        epoch = op.epoch + 1
        ops_of: dict[int, list[dict]] = {}
        for o, t in pairs:
            vn = sorted(v for v, oo, tt in moves if (oo, tt) == (o, t))
            ops_of.setdefault(t, []).append({"op": "import", "from_operator": operator_id, "from_instance": o,
                                             "checkpoint": b, "vnodes": vn})
        for o in sorted({o for _, o, _ in moves}):
            ops_of.setdefault(o, []).append({"op": "drop", "vnodes": sorted(v for v, oo, _ in moves if oo == o)})
        doc = {"plan": p.id, "step": p.steps_done, "epoch": epoch, "batch": b, "moves": [list(m) for m in moves],
               "new": {str(t): _row_json(r) for t, r in new_rows.items()}, "ops": {str(k): v for k, v in ops_of.items()}}
        with self.meta.tx() as c:
            self.meta.set_meta(c, f"handover:{operator_id}", json.dumps(doc))
            c.execute("UPDATE plans SET state='running', updated_at=? WHERE id=?", (time.time(), p.id))
        try:
            self._apply(operator_id, doc, every, epoch)
        except RhinoError as e:
            self.abort(operator_id, doc, f"{type(e).__name__}: {e}")
            return {"aborted": str(e)}
        # Step 4: the point of no return, in one transaction.
        new_assignment = list(assignment)
        for v, _, t in moves:
            new_assignment[v] = t
        seconds = time.monotonic() - t0
        retired = [i for i in every if i not in set(new_assignment)]
        with self.meta.tx() as c:
            self.meta.set_assignment(c, operator_id, new_assignment)
            for i, r in every.items():
                if i in ops_of and i not in new_rows:
                    if r.redo_version != b:
                        r.redo_version, r.redo = b, []
                    r.redo = r.redo + ops_of[i]
                if i in retired:
                    r.state = "retired"
                self.meta.put_instance(c, r)
            self.meta.record_epoch(c, operator_id, epoch, f"plan {p.id} step {p.steps_done + 1}/{len(p.steps)}")
            done = p.steps_done + 1
            c.execute("UPDATE plans SET steps_done=?, state=?, updated_at=?, bytes_moved=bytes_moved+?,"
                      " seconds=seconds+? WHERE id=?",
                      (done, "done" if done == len(p.steps) else "running", time.time(), copied, seconds, p.id))
            c.execute("DELETE FROM meta WHERE key=?", (f"handover:{operator_id}",))
            self.meta.event(c, "handover_step", plan=p.id, step=done, of=len(p.steps), epoch=epoch,
                            vnodes=len(moves), bytes_copied=copied, seconds=round(seconds, 3))
        for i in retired:  # scaled in: nothing routes to it any more
            try:
                self.c.client(every[i].primary_worker).close_instance(operator_id, i, epoch=epoch)
            except RhinoError as e:
                self.c.log("close_failed", operator=operator_id, instance=i, error=str(e))
        self.c.log("handover_step", plan=p.id, step=p.steps_done + 1, epoch=epoch, vnodes=len(moves),
                   bytes_copied=copied, seconds=seconds)
        return {"epoch": epoch, "vnodes": len(moves), "bytes_copied": copied, "seconds": seconds}

    def _apply(self, operator_id: str, doc: dict, every: dict[int, InstanceRow], epoch: int) -> None:
        op = self.c._operator(operator_id)
        b = doc["batch"]
        args = self.c.rm.open_args(op)
        # Step 2: every instance at e+1 (the old owners are fenced), new ones hosted.
        for i, r in sorted(every.items()):
            cl = self.c.client(r.primary_worker)
            if str(i) in doc["new"]:
                vn = sorted({v for v, _, t in doc["moves"] if t == i})
                cl.open_instance(operator_id, i, epoch=epoch, vnodes=vn, chain=self.c.rm.addresses(r.chain),
                                 chain_version=r.chain_version, **args)
            else:
                cl.open_instance(operator_id, i, epoch=epoch, chain=self.c.rm.addresses(r.chain),
                                 chain_version=r.chain_version, **args)
        # Step 3: targets import (new ones are checkpointed at b), then origins drop.
        targets = sorted({t for _, _, t in doc["moves"]})
        for i in targets + [int(k) for k in doc["ops"] if int(k) not in targets]:
            self.c.client(every[i].primary_worker).reconfigure(operator_id, i, epoch=epoch, version=b,
                                                               ops=doc["ops"][str(i)], timeout=self.c.handover_timeout)

    def abort(self, operator_id: str, doc: dict, why: str) -> None:
        """Undoes a step at a new epoch: targets drop what they imported (new
        instances are closed), origins re-import from their own checkpoint b;
        the old table stays. Best effort per worker: a dead one is failed over
        with the committed redo, which never included this step."""
        op = self.c._operator(operator_id)
        rows = {r.instance: r for r in self.meta.instances(operator_id)}
        b = doc["batch"]
        epoch = max(op.epoch, doc["epoch"]) + 1
        args = self.c.rm.open_args(op)
        failures = []
        for i, r in sorted(rows.items()):
            try:
                self.c.client(r.primary_worker).open_instance(
                    operator_id, i, epoch=epoch, chain=self.c.rm.addresses(r.chain), chain_version=r.chain_version, **args)
            except RhinoError as e:
                failures.append(f"{i}: {e}")
        for k, ops in doc["ops"].items():
            i = int(k)
            if k in doc["new"]:
                w = doc["new"][k]["primary_worker"]
                try:
                    cl = self.c.client(w)
                    cl.fence(operator_id, i, epoch=epoch)
                    cl.close_instance(operator_id, i, epoch=epoch)
                except RhinoError as e:
                    failures.append(f"{i}: {e}")
                continue
            undo = []
            for s in reversed(ops):
                if s["op"] == "import":
                    undo.append({"op": "drop", "vnodes": s["vnodes"]})
                else:
                    undo.append({"op": "import", "from_operator": operator_id, "from_instance": i,
                                 "checkpoint": b, "vnodes": s["vnodes"]})
            try:
                self.c.client(rows[i].primary_worker).reconfigure(operator_id, i, epoch=epoch, version=b, ops=undo,
                                                                  timeout=self.c.handover_timeout)
            except RhinoError as e:
                failures.append(f"{i}: {e}")
        with self.meta.tx() as c:
            self.meta.record_epoch(c, operator_id, epoch, f"plan {doc['plan']} step aborted")
            c.execute("UPDATE plans SET state='aborted', message=?, updated_at=? WHERE id=?",
                      (why, time.time(), doc["plan"]))
            c.execute("DELETE FROM meta WHERE key=?", (f"handover:{operator_id}",))
            self.meta.event(c, "handover_aborted", plan=doc["plan"], epoch=epoch, why=why, undo_failures=failures)
        self.c.log("handover_aborted", plan=doc["plan"], epoch=epoch, why=why, undo_failures=failures)

    def resume(self) -> None:
        """A step a killed coordinator left without its commit is aborted."""
        for op in self.meta.operators():
            pending = self.meta.get_meta(f"handover:{op.operator_id}")
            if pending is not None:
                self.abort(op.operator_id, json.loads(pending), "the coordinator restarted during the step")


def _row_json(r: InstanceRow) -> dict[str, Any]:
    return {"primary_worker": r.primary_worker, "chain": r.chain, "chain_version": r.chain_version}
