"""One step of a handover plan, decided before any worker is asked (Rhino
paper §4.1; docs/design.md §4, micro-batch form).

:func:`plan_step` is pure: from the plan, the operator, its instances, its
routing table and the live workers it decides (steps as numbered in
:mod:`.handover_manager`'s header)

- where each new instance goes: a worker that holds the origins' checkpoint b
  (vertical scaling: imports by hard links), or the worker the plan names
  (horizontal scaling: a bulk copy comes first), and its chain;
- which bulk copies of checkpoint b a target's worker needs first (step 1);
- the ``reconfigure`` operations of every instance: targets import, origins
  drop (step 3; docs/protocol.md §7.4);
- the routing table, instance rows and redo committed when every ack is in (step 4).

The Handover Manager (:mod:`.handover_manager`) applies the step on the workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from ..errors import InvalidArgumentError
from .metadata import InstanceRow, OperatorRow, PlanRow
from .placement import InstanceInfo, WorkerInfo, choose_primary, place_chains

__all__ = ["HandoverStep", "Move", "plan_step"]

Move = tuple[int, int, int]  # (vnode, origin instance, target instance)


@dataclass
class HandoverStep:
    """The decisions of one step of ``plan`` at the barrier after batch ``batch``."""

    plan: PlanRow
    batch: int  # the cut: checkpoint ``batch`` of every origin is complete on its chain
    operator: OperatorRow  # as it was before the step
    assignment: list[int]  # the routing table before the step
    moves: list[Move]  # this step's moves still to make
    rows: dict[int, InstanceRow]  # the active instances before the step
    new_rows: dict[int, InstanceRow]  # the instances the step creates
    every: dict[int, InstanceRow]  # rows and new_rows: every instance the step touches or opens
    ops: dict[int, list[dict]]  # each instance's reconfigure operations, in the order they are sent
    # (origin, target) pairs moved by the early hand-over (design §4.1): the target's worker
    # holds no replica of the origin's checkpoint b and takes the vnodes on it as a base, read
    # on these workers (the origin's primary and chain) until it lands; no bulk copy first.
    early: dict[tuple[int, int], list[str]] = field(default_factory=dict)

    @property
    def operator_id(self) -> str:
        return self.operator.operator_id

    @property
    def epoch(self) -> int:
        """Step 2: the epoch goes up, so the old owners are fenced (docs/protocol.md §7.5)."""
        return self.operator.epoch + 1

    def pairs(self) -> list[tuple[int, int]]:
        """The (origin, target) instance pairs that move vnodes."""
        return sorted({(o, t) for _, o, t in self.moves})

    def copies(self) -> list[tuple[InstanceRow, str]]:
        """Step 1: (origin, target's worker) where that worker holds no replica of
        the origin's checkpoint b (neither its primary nor in its chain)."""
        return [(self.rows[o], self.every[t].primary_worker) for o, t in self.lacking() if (o, t) not in self.early]

    def lacking(self) -> list[tuple[int, int]]:
        """The (origin, target) pairs whose target's worker holds no replica of the origin's checkpoint b."""
        out = []
        for o, t in self.pairs():
            wt = self.every[t].primary_worker
            if wt != self.rows[o].primary_worker and wt not in self.rows[o].chain:
                out.append((o, t))
        return out

    def doc(self) -> dict[str, Any]:
        """The step as recorded before it is applied: a coordinator that
        restarts in the middle of it aborts it from this (:meth:`HandoverManager.abort`)."""
        return {"plan": self.plan.id, "step": self.plan.steps_done, "epoch": self.epoch, "batch": self.batch,
                "moves": [list(m) for m in self.moves],
                "new": {str(t): _row_json(r) for t, r in self.new_rows.items()},
                "ops": {str(k): v for k, v in self.ops.items()},
                "early": [[o, t] for o, t in sorted(self.early)]}

    def new_assignment(self) -> list[int]:
        out = list(self.assignment)
        for v, _, t in self.moves:
            out[v] = t
        return out

    def committed_rows(self) -> tuple[list[InstanceRow], list[int]]:
        """Step 4: every instance's row after the step, and the instances that
        no vnode routes to any more (scaled in: retired). An origin or existing
        target keeps the step's operations as the redo of checkpoint b
        (design §4: checkpoint b predates the handover); a new instance is
        checkpointed at b with its imports instead."""
        routed = set(self.new_assignment())
        retired = [i for i in self.every if i not in routed]
        out = []
        for i, r in self.every.items():
            if i in self.ops and i not in self.new_rows:
                if r.redo_version != self.batch:
                    r = replace(r, redo_version=self.batch, redo=[])
                r = replace(r, redo=r.redo + self.ops[i])
            if i in retired:
                r = replace(r, state="retired")
            out.append(r)
        return out, retired


def plan_step(plan: PlanRow, batch: int, op: OperatorRow, rows: dict[int, InstanceRow], assignment: list[int],
              alive: set[str], workers: list[WorkerInfo],
              early_hosts: Optional[Callable[[InstanceRow], list[str]]] = None) -> HandoverStep:
    """Decides the next step of ``plan`` at the barrier after ``batch``
    (``rows``: the operator's active instances; ``alive``, ``workers``: the live workers).
    With ``early_hosts`` (the addresses of the live workers holding an origin's checkpoint),
    a target whose worker holds no replica of its origin's checkpoint takes its vnodes on
    that checkpoint as a base instead of waiting for a bulk copy (design §4.1)."""
    moves: list[Move] = [(int(v), int(o), int(t)) for v, o, t in plan.steps[plan.steps_done]]
    # Another plan or a rescale may have moved a vnode since this plan was made.
    moves = [(v, o, t) for v, o, t in moves if assignment[v] == o and o != t]
    if any(r.last_complete != batch for r in rows.values()):
        raise InvalidArgumentError(f"a handover of {op.operator_id} at the barrier after batch {batch} needs "
                                   f"checkpoint {batch} complete everywhere")
    new_rows = _place_new_instances(plan, batch, op, rows, moves, alive, workers)
    step = HandoverStep(plan=plan, batch=batch, operator=op, assignment=list(assignment), moves=moves, rows=rows,
                        new_rows=new_rows, every={**rows, **new_rows}, ops={})
    if early_hosts is not None:
        step.early = {(o, t): early_hosts(rows[o]) for o, t in step.lacking()}
        step.early = {pair: hosts for pair, hosts in step.early.items() if hosts}
    step.ops = _reconfigure_ops(op.operator_id, moves, batch, step.early)
    return step


def _place_new_instances(plan: PlanRow, batch: int, op: OperatorRow, rows: dict[int, InstanceRow],
                         moves: list[Move], alive: set[str], workers: list[WorkerInfo]) -> dict[int, InstanceRow]:
    """A primary and a chain for each target instance that does not exist yet."""
    operator_id = op.operator_id
    load: dict[str, int] = {w: 0 for w in alive}
    for r in rows.values():
        load[r.primary_worker] = load.get(r.primary_worker, 0) + 1
    new_rows: dict[int, InstanceRow] = {}
    for t in sorted({t for _, _, t in moves if t not in rows}):
        origins = {o for _, o, tt in moves if tt == t}
        holders = set(alive)
        for o in origins:
            holders &= {rows[o].primary_worker, *rows[o].chain}
        # Vertical scaling: on a worker that holds the origins' checkpoints.
        # Horizontal (no such worker): the least loaded, after a bulk copy.
        if plan.placement.get(t) in alive:
            primary = plan.placement[t]  # horizontal scaling: asked for; a bulk copy comes first
        else:
            primary = choose_primary(sorted(holders or alive), load)
        load[primary] = load.get(primary, 0) + 1
        held = {(operator_id, t): {w: sum(rows[o].bytes for o in origins if w in rows[o].chain) for w in alive}}
        chain = place_chains([InstanceInfo(key=(operator_id, t), primary=primary,
                                           bytes=sum(rows[o].bytes for o in origins))],
                             workers, op.replicas, mode=op.placement, held=held)[(operator_id, t)]
        new_rows[t] = InstanceRow(operator_id=operator_id, instance=t, primary_worker=primary, chain=chain,
                                  chain_version=1, state="active", last_complete=batch, bytes=0,
                                  redo_version=None, redo=[])
    return new_rows


def _reconfigure_ops(operator_id: str, moves: list[Move], batch: int,
                     early: dict[tuple[int, int], list[str]]) -> dict[int, list[dict]]:
    """Step 3: each target imports its vnodes from its worker's replica of the
    origin's checkpoint b, or takes them on that checkpoint as a base (an early
    pair); each origin drops the vnodes it gives away."""
    ops: dict[int, list[dict]] = {}
    for o, t in sorted({(o, t) for _, o, t in moves}):
        vn = sorted(v for v, oo, tt in moves if (oo, tt) == (o, t))
        step = {"op": "import", "from_operator": operator_id, "from_instance": o, "checkpoint": batch, "vnodes": vn}
        if (o, t) in early:
            step.update(op="import_on_base", hosts=early[(o, t)])
        ops.setdefault(t, []).append(step)
    for o in sorted({o for _, o, _ in moves}):
        ops.setdefault(o, []).append({"op": "drop", "vnodes": sorted(v for v, oo, _ in moves if oo == o)})
    return ops


def _row_json(r: InstanceRow) -> dict[str, Any]:
    return {"primary_worker": r.primary_worker, "chain": r.chain, "chain_version": r.chain_version}
