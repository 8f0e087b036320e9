"""The Handover Manager's vnode moves and migration strategies (docs/design.md §4).

Pure, deterministic functions over a routing table given as ``assignment[v]`` = the instance that
owns vnode v. They say *which* vnodes move (rescaling, load balancing) and *in what steps*
(Megaphone's strategies); each step is one handover, one epoch (Rhino paper §4.1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from rhino.errors import InvalidArgumentError

__all__ = ["Move", "STRATEGIES", "plan_steps", "rescale_moves", "balance_moves", "apply_moves"]

Move = tuple[int, int, int]  # (vnode, origin instance, target instance)
STRATEGIES = ("all-at-once", "fluid", "batched")


def plan_steps(moves: Sequence[Move], strategy: str) -> list[list[Move]]:
    """Split a migration into steps, each awaited before the next (Megaphone §3.3).

    * ``all-at-once``: one step, the partial pause-and-restart of existing systems (§2.1, §3.3).
    * ``fluid``: one vnode per step, by origin then vnode: each step moves as little as possible.
    * ``batched``: each step a matching of origins x targets (Megaphone §4.4: "bipartite matching to
      group migrations that do not interfere"), so no instance sends or receives two vnodes at once.
      Every step covers every origin and target of maximum remaining degree (a maximum-weight
      matching weighted for it; one exists by König's edge-colouring theorem), so the step count
      equals the lower bound, the maximum degree; it then takes as many moves as it can.
    No moves gives no steps.
    """
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"unknown migration strategy {strategy!r}; expected one of {STRATEGIES}")
    moves = [(int(v), int(o), int(t)) for v, o, t in moves]
    if len({v for v, _, _ in moves}) != len(moves):
        raise InvalidArgumentError("a vnode is moved twice in one migration")
    if any(o == t for _, o, t in moves):
        raise InvalidArgumentError("a move's origin equals its target")
    if not moves:
        return []
    if strategy == "all-at-once":
        return [sorted(moves, key=lambda m: (m[1], m[0]))]
    if strategy == "fluid":
        return [[m] for m in sorted(moves, key=lambda m: (m[1], m[0]))]
    remaining = sorted(moves, key=lambda m: (m[1], m[2], m[0]))
    steps: list[list[Move]] = []
    while remaining:
        out_deg = Counter(o for _, o, _ in remaining)
        in_deg = Counter(t for _, _, t in remaining)
        origins, targets = sorted(out_deg), sorted(in_deg)
        delta = max(*out_deg.values(), *in_deg.values())
        m = len(remaining)
        # Priorities, each dominating the next: cover every max-degree node, take many moves,
        # prefer busy nodes. Scales: degrees sum <= 2m < c; any matching's c-terms < big.
        c = 2 * m + 1
        big = (m + 1) * (c + 2 * m + 1)
        first: dict[tuple[int, int], Move] = {}
        for mv in remaining:
            first.setdefault((mv[1], mv[2]), mv)
        w = np.zeros((len(origins), len(targets)))
        for i, o in enumerate(origins):
            for j, t in enumerate(targets):
                if (o, t) in first:
                    w[i, j] = (c + out_deg[o] + in_deg[t] + big * (out_deg[o] == delta)
                               + big * (in_deg[t] == delta))
        rows, cols = linear_sum_assignment(w, maximize=True)
        step = sorted((first[origins[i], targets[j]] for i, j in zip(rows, cols) if w[i, j] > 0),
                      key=lambda mv: (mv[1], mv[0]))
        taken = set(step)
        remaining = [mv for mv in remaining if mv not in taken]
        steps.append(step)
    return steps


def _counts(assignment: Sequence[int], instances: Sequence[int], what: str) -> Counter[int]:
    if len(set(instances)) != len(instances):
        raise InvalidArgumentError(f"duplicate {what} instances")
    stray = set(assignment) - set(instances)
    if stray:
        raise InvalidArgumentError(f"vnodes owned by instances {sorted(stray)} not among the {what} instances")
    return Counter(assignment)


def rescale_moves(assignment: Sequence[int], old_instances: Sequence[int], new_instances: Sequence[int]
                  ) -> list[Move]:
    """The fewest moves that rebalance V vnodes over `new_instances` (design §4, vertical/horizontal scaling).

    Each new instance ends with floor(V/p) or ceil(V/p) vnodes. The V mod p ceilings go to the
    staying instances that hold most now (ties by instance), which maximises the vnodes that stay,
    sum(min(count, quota)); leaving instances give everything away, staying ones only their
    excess (their highest vnodes), and the freed vnodes fill the deficits in vnode and instance
    order. So the number of moves is V minus that maximum: no plan moves fewer (the V mod p ceilings
    are the only choice). Sorted by vnode.
    """
    count = _counts(assignment, old_instances, "old")
    if len(set(new_instances)) != len(new_instances):
        raise InvalidArgumentError("duplicate new instances")
    if not assignment:
        return []
    if not new_instances:
        raise InvalidArgumentError("cannot place vnodes on zero instances")
    p, v_total = len(new_instances), len(assignment)
    ranked = sorted(new_instances, key=lambda i: (-count[i], i))
    quota = {i: v_total // p + (k < v_total % p) for k, i in enumerate(ranked)}
    freed: list[tuple[int, int]] = []  # (vnode, origin)
    for inst in sorted(count):
        owned = [v for v, o in enumerate(assignment) if o == inst]
        keep = quota.get(inst, 0)
        freed += [(v, inst) for v in owned[keep:]]
    freed.sort()
    moves: list[Move] = []
    for inst in sorted(new_instances):
        need = quota[inst] - min(count[inst], quota[inst])
        moves += [(v, o, inst) for v, o in freed[:need]]
        freed = freed[need:]
    assert not freed
    return sorted(moves)


def balance_moves(assignment: Sequence[int], instances: Sequence[int], load: Mapping[int, float], *,
                  max_moves: int | None = None, tolerance: float = 0.05) -> list[Move]:
    """Moves that even out measured load (design §4 "load balancing, driven by measured per-vnode load").

    Greedy: take the hottest instance and the coldest (ties by instance); move the hot vnode that
    minimises the larger of their two new loads, provided that is below the hot load (so the max
    never grows and sum(load^2) strictly falls: no configuration repeats, the loop ends). Stop when
    no such move exists, when (max-min)/mean <= tolerance, or after `max_moves` steps. An instance
    is never emptied. The result is net, one move per vnode that changed owner (a vnode that came
    back home is dropped), so it feeds straight into :func:`plan_steps`. Missing load = 0.
    """
    count = _counts(assignment, instances, "given")
    if max_moves is not None and max_moves < 0:
        raise InvalidArgumentError(f"max_moves must be >= 0, got {max_moves}")
    if any(x < 0 for x in load.values()):
        raise InvalidArgumentError("vnode loads must be >= 0")
    owner = list(assignment)
    inst_load = {i: 0.0 for i in instances}
    for v, o in enumerate(owner):
        inst_load[o] += load.get(v, 0)
    steps = 0
    while instances and (max_moves is None or steps < max_moves):
        hot = min(instances, key=lambda i: (-inst_load[i], i))
        cold = min(instances, key=lambda i: (inst_load[i], i))
        mean = sum(inst_load.values()) / len(instances)
        if mean <= 0 or (inst_load[hot] - inst_load[cold]) / mean <= tolerance or count[hot] <= 1:
            break
        best = min(((max(inst_load[hot] - load.get(v, 0), inst_load[cold] + load.get(v, 0)), v)
                    for v, o in enumerate(owner) if o == hot and load.get(v, 0) > 0), default=None)
        if best is None or best[0] >= inst_load[hot]:
            break
        v = best[1]
        owner[v] = cold
        count[hot] -= 1
        count[cold] += 1
        inst_load[hot] -= load.get(v, 0)
        inst_load[cold] += load.get(v, 0)
        steps += 1
    return [(v, a, b) for v, (a, b) in enumerate(zip(assignment, owner)) if a != b]


def apply_moves(assignment: Sequence[int], moves: Sequence[Move]) -> list[int]:
    """The routing table after `moves`, applied in order; each origin must own its vnode then."""
    out = list(assignment)
    for v, o, t in moves:
        if not 0 <= v < len(out):
            raise InvalidArgumentError(f"vnode {v} out of range 0..{len(out) - 1}")
        if out[v] != o:
            raise InvalidArgumentError(f"move {(v, o, t)}: vnode {v} is owned by {out[v]}, not {o}")
        out[v] = t
    return out
