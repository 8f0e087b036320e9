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

Plans are per operator. An operator has at most one open plan (scheduled or
running): a handover, rescale or load rebalance of an operator with one is
refused, with the open plan's id, kind and state and how to cancel it, while
any other operator plans freely. Its steps run at its own operator's barriers
only, so a plan that waits (its query stopped) holds up nobody else's; it can
be cancelled (:meth:`HandoverManager.cancel_plan`, ``rhino cancel-plan``).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..errors import BusyError, InvalidArgumentError, RhinoError, UnknownVnodeError
from .gateway import WorkerGateway
from .handover_step import HandoverStep, plan_step
from .metadata import InstanceRow, Metadata, PlanRow
from .strategies import STRATEGIES, balance_moves, plan_steps, rescale_moves

__all__ = ["HandoverManager", "describe_plan"]


class HandoverManager:
    """Plans handovers into ``meta`` and runs their steps on the workers
    through ``workers``; every decision is logged to ``log``. The caller holds
    the coordinator's lock around each call."""

    def __init__(self, meta: Metadata, workers: WorkerGateway, log: Callable[..., None], *,
                 early: bool = False) -> None:
        self.meta = meta
        self.workers = workers
        self.log = log
        # A target on a worker with no replica of its origin's checkpoint takes the vnodes on it
        # as a base (the early hand-over, design §4.1) instead of waiting for a bulk copy.
        self.early = early

    # ---- planning -------------------------------------------------------------------------
    def open_plan(self, operator_id: str) -> Optional[PlanRow]:
        """The operator's open plan (scheduled or running), if any; the oldest
        if a database of an older coordinator holds several."""
        plans = self.meta.plans(operator_id, open_only=True)
        return plans[0] if plans else None

    def refuse_if_open(self, operator_id: str, asked: str) -> None:
        """One open plan per operator: InvalidArgumentError naming the open one
        and how to end it, when ``operator_id`` has one (``asked``: what was asked for)."""
        p = self.open_plan(operator_id)
        if p is not None:
            raise InvalidArgumentError(
                f"cannot plan a {asked} of {operator_id}: it has an open plan, {describe_plan(p)}; an operator has "
                f"one open plan at a time: wait for it to finish at its barriers (rhino status), or cancel it "
                f"(rhino cancel-plan {operator_id} --plan {p.id})")

    def _next_barrier(self, operator_id: str, after_batch: Optional[int]) -> int:
        op = self.meta.require_operator(operator_id)
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
        with self.meta.tx() as c:
            plan_id = self.meta.insert_plan(c, operator_id, kind, strategy, steps, after, placement or {})
            self.meta.event(c, "plan_scheduled", plan=plan_id, operator=operator_id, plan_kind=kind, strategy=strategy,
                            moves=len(moves), steps=len(steps), after_batch=after)
        self.log("plan_scheduled", plan=plan_id, operator=operator_id, kind=kind, moves=len(moves), steps=len(steps))
        return {"plan": plan_id, "kind": kind, "strategy": strategy, "moves": len(moves), "steps": len(steps),
                "after_batch": after}

    def _check_on(self, on: Optional[list[str]]) -> list[str]:
        """Workers asked to host new instances (horizontal scaling): live and known."""
        if not on:
            return []
        alive = self.workers.alive_ids()
        leaving = self.workers.draining()
        for w in on:
            if w not in alive:
                raise InvalidArgumentError(f"worker {w!r} is not a live registered worker")
            if w in leaving:
                raise InvalidArgumentError(f"worker {w!r} is being decommissioned: nothing new is placed on it")
        return list(on)

    def plan_handover(self, operator_id: str, vnodes: list[int], to: int, *, strategy: str,
                      after_batch: Optional[int], on: Optional[str] = None) -> dict:
        op = self.meta.require_operator(operator_id)
        self.refuse_if_open(operator_id, "handover")
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
        op = self.meta.require_operator(operator_id)
        if not isinstance(parallelism, int) or not 1 <= parallelism <= op.num_vnodes:
            raise InvalidArgumentError(f"parallelism must be in [1, {op.num_vnodes}], got {parallelism!r}")
        self.refuse_if_open(operator_id, "rescale")
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

    def plan_balance_all(self, operator_id: Optional[str], *, strategy: str,
                         after_batch: Optional[int]) -> tuple[list, list]:
        """Load plans for ``operator_id``, or for every operator (None): ``(plans,
        skipped)``, where an operator with an open plan is skipped with that plan named."""
        ops = [operator_id] if operator_id else [o.operator_id for o in self.meta.operators()]
        plans, skipped = [], []
        for o in ops:
            busy = self.open_plan(o)
            if busy is not None:
                skipped.append({"operator_id": o, "open_plan": busy.id,
                                "why": f"it has an open plan, {describe_plan(busy)}"})
                continue
            p = self.plan_balance(o, strategy=strategy, after_batch=after_batch)
            if p is not None:
                plans.append(p)
        return plans, skipped

    def plan_balance(self, operator_id: str, *, strategy: str, after_batch: Optional[int]) -> Optional[dict]:
        """A load-balancing plan of ``operator_id`` from its measured per-vnode
        load; None when there is no load measured or nothing to move."""
        self.meta.require_operator(operator_id)
        self.refuse_if_open(operator_id, "load rebalance")
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
        """Runs the next step of the operator's open plan if it is due at the
        barrier after batch ``barrier`` (other operators' plans wait for their
        own barriers)."""
        for p in self.meta.plans(operator_id, open_only=True):
            if p.after_batch is None or p.after_batch > barrier:
                continue
            self.run_step(p, barrier)

    def run_step(self, p: PlanRow, b: int) -> dict:
        """Runs the next step of plan ``p`` at the barrier after batch ``b``:
        decides it (:func:`.handover_step.plan_step`), copies, records it,
        applies it on the workers, then commits it, or aborts it on a failure."""
        t0 = time.monotonic()
        step = self._plan_step(p, b)
        copied = self._copy_checkpoints(step)
        doc = step.doc()
        with self.meta.tx() as c:
            self.meta.set_handover_in_flight(c, step.operator_id, doc)
            self.meta.start_plan_step(c, p.id)
        try:
            self._apply(step.operator_id, doc, step.every, step.epoch)
        except RhinoError as e:
            self.abort(step.operator_id, doc, f"{type(e).__name__}: {e}")
            return {"aborted": str(e)}
        seconds = time.monotonic() - t0
        retired = self._commit(step, copied, seconds)
        self._close_retired(step, retired)
        early = sum(1 for _, o, t in step.moves if (o, t) in step.early)
        self.log("handover_step", plan=p.id, step=p.steps_done + 1, epoch=step.epoch, vnodes=len(step.moves),
                 early_vnodes=early, bytes_copied=copied, seconds=seconds)
        return {"epoch": step.epoch, "vnodes": len(step.moves), "early_vnodes": early, "bytes_copied": copied,
                "seconds": seconds}

    def _plan_step(self, p: PlanRow, b: int) -> HandoverStep:
        op = self.meta.require_operator(p.operator_id)
        rows = {r.instance: r for r in self.meta.instances(p.operator_id)}
        alive = self.workers.alive_ids()

        def early_hosts(origin: InstanceRow) -> list[str]:
            """The live workers that hold the origin's checkpoint b: its primary, then its chain."""
            return self.workers.addresses([w for w in (origin.primary_worker, *origin.chain) if w in alive])

        return plan_step(p, b, op, rows, self.meta.assignment(p.operator_id), alive=alive,
                         workers=self.workers.workers_info(), early_hosts=early_hosts if self.early else None)

    def _copy_checkpoints(self, step: HandoverStep) -> int:
        """Step 1 of the header: bulk copies where a target's worker lacks an
        origin's checkpoint b. Returns the bytes sent."""
        copied = 0
        for origin, worker in step.copies():
            res = self.workers.client(origin.primary_worker).replicate(
                step.operator_id, origin.instance, epoch=step.operator.epoch, to=self.workers.addresses([worker]),
                chain_version=origin.chain_version, checkpoint=step.batch, timeout=self.workers.copy_timeout)
            copied += int(res["bytes_sent"])
        return copied

    def _commit(self, step: HandoverStep, copied: int, seconds: float) -> list[int]:
        """Step 4: the point of no return, in one transaction. Returns the retired instances."""
        p = step.plan
        rows, retired = step.committed_rows()
        done = p.steps_done + 1
        with self.meta.tx() as c:
            self.meta.set_assignment(c, step.operator_id, step.new_assignment())
            for r in rows:
                self.meta.put_instance(c, r)
            self.meta.record_epoch(c, step.operator_id, step.epoch, f"plan {p.id} step {done}/{len(p.steps)}")
            self.meta.finish_plan_step(c, p.id, done, last=done == len(p.steps), bytes_moved=copied, seconds=seconds)
            self.meta.clear_handover_in_flight(c, step.operator_id)
            self.meta.event(c, "handover_step", plan=p.id, step=done, of=len(p.steps), epoch=step.epoch,
                            vnodes=len(step.moves), bytes_copied=copied, seconds=round(seconds, 3))
        return retired

    def _close_retired(self, step: HandoverStep, retired: list[int]) -> None:
        for i in retired:  # scaled in: nothing routes to it any more
            try:
                self.workers.client(step.every[i].primary_worker).close_instance(step.operator_id, i,
                                                                                 epoch=step.epoch)
            except RhinoError as e:
                self.log("close_failed", operator=step.operator_id, instance=i, error=str(e))

    def _apply(self, operator_id: str, doc: dict, every: dict[int, InstanceRow], epoch: int) -> None:
        op = self.meta.require_operator(operator_id)
        b = doc["batch"]
        args = op.partitioner_args()
        # Step 2: every instance at e+1 (the old owners are fenced), new ones hosted.
        for i, r in sorted(every.items()):
            cl = self.workers.client(r.primary_worker)
            if str(i) in doc["new"]:
                vn = sorted({v for v, _, t in doc["moves"] if t == i})
                cl.open_instance(operator_id, i, epoch=epoch, vnodes=vn, chain=self.workers.addresses(r.chain),
                                 chain_version=r.chain_version, **args)
            else:
                cl.open_instance(operator_id, i, epoch=epoch, chain=self.workers.addresses(r.chain),
                                 chain_version=r.chain_version, **args)
        # Step 3: targets import (new ones are checkpointed at b), then origins drop.
        targets = sorted({t for _, _, t in doc["moves"]})
        for i in targets + [int(k) for k in doc["ops"] if int(k) not in targets]:
            self.workers.client(every[i].primary_worker).reconfigure(
                operator_id, i, epoch=epoch, version=b, ops=doc["ops"][str(i)], timeout=self.workers.handover_timeout)

    def abort(self, operator_id: str, doc: dict, why: str) -> None:
        """Undoes a step at a new epoch: targets drop what they imported (new
        instances are closed), origins re-import from their own checkpoint b;
        the old table stays. Best effort per worker: a dead one is failed over
        with the committed redo, which never included this step."""
        op = self.meta.require_operator(operator_id)
        rows = {r.instance: r for r in self.meta.instances(operator_id)}
        b = doc["batch"]
        epoch = max(op.epoch, doc["epoch"]) + 1
        args = op.partitioner_args()
        failures = []
        for i, r in sorted(rows.items()):
            try:
                self.workers.client(r.primary_worker).open_instance(
                    operator_id, i, epoch=epoch, chain=self.workers.addresses(r.chain), chain_version=r.chain_version,
                    **args)
            except RhinoError as e:
                failures.append(f"{i}: {e}")
        for k, ops in doc["ops"].items():
            i = int(k)
            try:
                if k in doc["new"]:
                    cl = self.workers.client(doc["new"][k]["primary_worker"])
                    cl.fence(operator_id, i, epoch=epoch)
                    cl.close_instance(operator_id, i, epoch=epoch)
                else:
                    self.workers.client(rows[i].primary_worker).reconfigure(
                        operator_id, i, epoch=epoch, version=b, ops=_undo(operator_id, i, b, ops),
                        timeout=self.workers.handover_timeout)
            except RhinoError as e:
                failures.append(f"{i}: {e}")
        with self.meta.tx() as c:
            self.meta.record_epoch(c, operator_id, epoch, f"plan {doc['plan']} step aborted")
            self.meta.abort_plan(c, doc["plan"], why)
            self.meta.clear_handover_in_flight(c, operator_id)
            self.meta.event(c, "handover_aborted", plan=doc["plan"], epoch=epoch, why=why, undo_failures=failures)
        self.log("handover_aborted", plan=doc["plan"], epoch=epoch, why=why, undo_failures=failures)

    # ---- cancelling ---------------------------------------------------------------------------
    def cancel_plan(self, operator_id: str, plan_id: Optional[int] = None) -> dict:
        """Cancels an open plan of ``operator_id``: ``plan_id``, or the
        operator's open plan when None.

        A plan is cancelled between two of its steps, never inside one. A step
        runs from the begin of a batch to its commit (or its abort) under the
        coordinator's lock, and so does this method: a cancel asked while a
        step runs waits for it and comes after it. After each committed step
        the routing table, the instance rows, the redo and the workers agree
        (each vnode has one owner, hosted at the operator's epoch), so a cancel
        asks no worker anything and changes no epoch: the steps done stay done
        (with their redo, which a re-executed batch still needs), the steps
        not run are dropped, and the plan ends ``cancelled``. A scheduled plan
        (no step run yet) leaves nothing behind. A rescale cancelled half way
        leaves a parallelism between the old and the new one: a new instance
        made by a done step stays; an instance is retired only when a step
        left it no vnode. Plan again to go on.

        A step a failure left half done (recorded as under way, with no commit
        nor abort: an unexpected exception in the coordinator) is first undone
        exactly as a restarted coordinator undoes it (:meth:`abort`), then the
        plan is cancelled.

        Errors: UnknownInstanceError for an unknown operator;
        InvalidArgumentError for an operator without an open plan, a plan id
        that is not an int, an unknown plan, a plan of another operator, or a
        plan no longer open (done, aborted, cancelled)."""
        self.meta.require_operator(operator_id)
        p = self._plan_to_cancel(operator_id, plan_id)
        doc = self.meta.handover_in_flight(operator_id)
        undone = ""
        if doc is not None:
            if doc.get("plan") != p.id:  # another plan's step: not ours to undo (never expected)
                raise BusyError(f"a step of plan #{doc.get('plan')} of {operator_id} is recorded as under way; "
                                "retry once it has ended (a restarted coordinator undoes it)")
            self.abort(operator_id, doc, "cancelled (rhino cancel-plan) while this step was left half done")
            undone = f"; its step {int(doc.get('step', p.steps_done)) + 1}, left half done, was undone first"
        steps = len(p.steps)
        dropped = sum(len(s) for s in p.steps[p.steps_done:])
        why = (f"cancelled after step {p.steps_done}/{steps} (was {p.state}): {steps - p.steps_done} step(s), "
               f"{dropped} vnode move(s) dropped{undone}")
        op = self.meta.require_operator(operator_id)
        with self.meta.tx() as c:
            self.meta.cancel_plan(c, p.id, why)
            self.meta.event(c, "plan_cancelled", plan=p.id, operator=operator_id, plan_kind=p.kind,
                            was=p.state, steps_done=p.steps_done, steps=steps, moves_dropped=dropped,
                            epoch=op.epoch, undone_step=bool(undone))
        self.log("plan_cancelled", plan=p.id, operator=operator_id, was=p.state, steps_done=p.steps_done, steps=steps)
        return {"plan": p.id, "operator_id": operator_id, "kind": p.kind, "strategy": p.strategy,
                "state": "cancelled", "was": p.state, "steps_done": p.steps_done, "steps": steps,
                "moves_dropped": dropped, "epoch": op.epoch, "message": why}

    def _plan_to_cancel(self, operator_id: str, plan_id: Optional[int]) -> PlanRow:
        """The open plan ``cancel_plan`` ends, or a clear InvalidArgumentError."""
        if plan_id is None:
            plans = self.meta.plans(operator_id, open_only=True)
            if not plans:
                raise InvalidArgumentError(f"operator {operator_id} has no open plan: nothing to cancel "
                                           "(rhino status lists the open plans)")
            if len(plans) > 1:
                raise InvalidArgumentError(f"operator {operator_id} has {len(plans)} open plans "
                                           f"({', '.join(f'#{x.id}' for x in plans)}): name one (--plan ID)")
            return plans[0]
        if isinstance(plan_id, bool) or not isinstance(plan_id, int) or not 0 <= plan_id < 1 << 63:
            raise InvalidArgumentError(f"plan must be a plan id (an int >= 0), got {plan_id!r}")
        p = self.meta.plan(plan_id)
        if p is None:
            raise InvalidArgumentError(f"no plan #{plan_id} (rhino status lists the open plans)")
        if p.operator_id != operator_id:
            raise InvalidArgumentError(f"plan #{plan_id} is a plan of operator {p.operator_id}, not of {operator_id}")
        if not p.open:
            raise InvalidArgumentError(f"plan #{plan_id} of {operator_id} is {p.state} ({p.message or 'no message'}):"
                                       " only an open plan (scheduled or running) can be cancelled")
        return p

    def resume(self) -> None:
        """A step a killed coordinator left without its commit is aborted."""
        for op in self.meta.operators():
            doc = self.meta.handover_in_flight(op.operator_id)
            if doc is not None:
                self.abort(op.operator_id, doc, "the coordinator restarted during the step")


def describe_plan(p: PlanRow) -> str:
    """One line naming a plan: id, kind, strategy, state, steps done, its barrier."""
    return (f"#{p.id} {p.kind} ({p.strategy}), {p.state}, step {p.steps_done}/{len(p.steps)}, "
            f"due at the barrier after batch {p.after_batch}")


def _undo(operator_id: str, instance: int, b: int, ops: list[dict]) -> list[dict]:
    """The reconfigure operations that undo ``ops`` on an existing instance:
    in reverse order, an import becomes a drop and a drop a re-import from
    the instance's own checkpoint b."""
    undo = []
    for s in reversed(ops):
        if s["op"] in ("import", "import_on_base"):
            undo.append({"op": "drop", "vnodes": s["vnodes"]})
        else:
            undo.append({"op": "import", "from_operator": operator_id, "from_instance": instance,
                         "checkpoint": b, "vnodes": s["vnodes"]})
    return undo
