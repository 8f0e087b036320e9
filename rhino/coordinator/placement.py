"""The Replication Manager's placement decisions (docs/design.md §3 Phase 1 and failure model).

Pure, deterministic functions: the RM passes what it knows (the live workers, each instance's
primary, state bytes and current chain) and applies the answer. Inputs are sorted and ties are
broken by worker id and instance key, so every RM computes the same chains from the same facts.

One load measure everywhere: a worker's *replica load* is the sum, over the instances whose chain
holds it, of ``max(bytes, 1)``, so empty instances (a fresh job) spread too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from rhino.errors import InvalidArgumentError

__all__ = ["WorkerInfo", "InstanceKey", "InstanceInfo", "ChainRepair", "MODES",
           "place_chains", "repair_chains", "rebalance_chains", "choose_primary"]

InstanceKey = tuple[str, int]  # (operator_id, instance)
MODES = ("balanced", "cost")


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker, with its failure domains (None = unknown, never counts as shared)."""
    id: str
    rack: str | None = None
    zone: str | None = None


@dataclass(frozen=True)
class InstanceInfo:
    """An operator instance: its primary worker, state bytes of its last checkpoint, its chain (head first)."""
    key: InstanceKey
    primary: str
    bytes: int = 0
    chain: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChainRepair:
    """A changed chain: who left, who joined (each needs a bulk copy), and a live holder to copy from."""
    chain: list[str]
    removed: list[str]
    added: list[str]
    copy_from: str | None


def _weight(inst: InstanceInfo) -> int:
    return max(inst.bytes, 1)


def _workers(workers: Sequence[WorkerInfo]) -> dict[str, WorkerInfo]:
    info = {w.id: w for w in workers}
    if len(info) != len(workers):
        raise InvalidArgumentError("duplicate worker ids in the worker list")
    return info


def _check(instances: Sequence[InstanceInfo], r: int) -> None:
    if r < 0:
        raise InvalidArgumentError(f"replication factor r must be >= 0, got {r}")
    if len({i.key for i in instances}) != len(instances):
        raise InvalidArgumentError("duplicate instance keys")


def _shared(w: str, others: Iterable[str], info: Mapping[str, WorkerInfo]) -> int:
    """How many racks and zones `w` shares with `others`: the soft anti-affinity score.

    A chain spread over failure domains survives a rack or zone outage (paper §4.2 fail-stop model)."""
    me, n = info.get(w), 0
    for o in others:
        x = info.get(o)
        if me is not None and x is not None and o != w:
            n += (me.rack is not None and me.rack == x.rack) + (me.zone is not None and me.zone == x.zone)
    return n


def _pick(candidates: Iterable[str], load: Mapping[str, int], avoid: list[str],
          info: Mapping[str, WorkerInfo]) -> str | None:
    """Least replica load; among equals the fewest shared racks/zones with `avoid`; then by id."""
    return min(candidates, key=lambda w: (load[w], _shared(w, avoid, info), w), default=None)


def _replica_load(instances: Iterable[InstanceInfo], ids: Iterable[str]) -> dict[str, int]:
    load = dict.fromkeys(ids, 0)
    for inst in instances:
        for m in set(inst.chain) & load.keys():
            load[m] += _weight(inst)
    return load


def place_chains(instances: Sequence[InstanceInfo], workers: Sequence[WorkerInfo], r: int, *,
                 mode: str = "balanced", held: Mapping[InstanceKey, Mapping[str, int]] | None = None,
                 ) -> dict[InstanceKey, list[str]]:
    """A chain of `r` distinct live workers, never the primary, for every instance (design §3 Phase 1).

    ``balanced`` is greedy bin packing by state bytes, largest instance first; each replica goes to
    the least-loaded eligible worker. Over the workers that are no instance's primary, the spread
    max-min of replica load stays <= the largest ``max(bytes, 1)`` (list scheduling: each instance
    adds its weight to the least-loaded of them). A primary can carry less: it never holds its
    own instances' replicas, so no placement can level it when primaries are skewed.

    ``cost`` is the PhD proposal's §3.5 placement: replica placement as an assignment problem
    solved with the Hungarian method (``linear_sum_assignment``). Each of r rounds picks the j-th
    member of every chain (one LAP cannot keep a chain's members distinct). Columns are worker
    slots, slot k costing k*mean more, so load spreads; a cell costs the bytes the worker must
    still receive (so a worker that already ``held`` the state wins), plus its load so far, plus
    (mean+1) per rack/zone shared with the primary or earlier members. A worker offers
    ceil(n/W)+1 slots per round, more only if skewed primaries make that infeasible.
    """
    info = _workers(workers)
    _check(instances, r)
    if mode not in MODES:
        raise InvalidArgumentError(f"unknown placement mode {mode!r}; expected one of {MODES}")
    for inst in instances:
        if len(info.keys() - {inst.primary}) < r:
            raise InvalidArgumentError(
                f"instance {inst.key} needs r={r} distinct workers other than its primary "
                f"{inst.primary!r}, but only {len(info.keys() - {inst.primary})} are live")
    ids = sorted(info)
    if mode == "cost":
        return _place_cost(sorted(instances, key=lambda i: i.key), ids, info, r, held or {})
    load = dict.fromkeys(ids, 0)
    out: dict[InstanceKey, list[str]] = {}
    for inst in sorted(instances, key=lambda i: (-i.bytes, i.key)):
        chain: list[str] = []
        for _ in range(r):
            best = _pick((w for w in ids if w != inst.primary and w not in chain), load,
                         [inst.primary, *chain], info)
            assert best is not None  # checked above: enough workers
            chain.append(best)
            load[best] += _weight(inst)
        out[inst.key] = chain
    return out


def _place_cost(order: list[InstanceInfo], ids: list[str], info: Mapping[str, WorkerInfo], r: int,
                held: Mapping[InstanceKey, Mapping[str, int]]) -> dict[InstanceKey, list[str]]:
    n, nw = len(order), len(ids)
    chains: list[list[str]] = [[] for _ in order]
    if n == 0 or r == 0:
        return {i.key: c for i, c in zip(order, chains)}
    mean = sum(_weight(i) for i in order) / n
    recv = np.array([[max(0, i.bytes - held.get(i.key, {}).get(w, 0)) for w in ids] for i in order], float)
    weight = np.array([_weight(i) for i in order], float)
    load = np.zeros(nw)
    for _ in range(r):
        forbid = np.array([[w == i.primary or w in c for w in ids] for i, c in zip(order, chains)])
        pen = np.array([[_shared(w, [i.primary, *c], info) for w in ids] for i, c in zip(order, chains)])
        base = recv + load[None, :] + (mean + 1) * pen
        slots = math.ceil(n / nw) + 1
        while True:
            cost = (base[:, :, None] + mean * np.arange(slots)[None, None, :]).reshape(n, nw * slots)
            bad = np.repeat(forbid, slots, axis=1)
            cost[bad] = (cost[~bad].max() + 1) * (n + 1)  # above any all-allowed assignment's total
            rows, cols = linear_sum_assignment(cost)
            if not bad[rows, cols].any() or slots >= n:
                break
            slots = min(n, 2 * slots)  # n slots each is always feasible: every row has an allowed worker
        assert not bad[rows, cols].any(), "a forbidden worker was assigned"
        for row, col in zip(rows, cols):
            chains[row].append(ids[col // slots])
            load[col // slots] += weight[row]
    return {i.key: c for i, c in zip(order, chains)}


def _repair(instances: Sequence[InstanceInfo], ids: list[str], info: Mapping[str, WorkerInfo], r: int,
            dead: Collection[str], load: dict[str, int]) -> dict[InstanceKey, ChainRepair]:
    out: dict[InstanceKey, ChainRepair] = {}
    for inst in sorted(instances, key=lambda i: (-i.bytes, i.key)):
        survivors = [m for m in inst.chain if m not in dead]
        removed = [m for m in inst.chain if m in dead]
        if not removed and len(inst.chain) >= r:
            continue
        added: list[str] = []
        while len(survivors) + len(added) < r:
            best = _pick((w for w in ids if w != inst.primary and w not in survivors and w not in added),
                         load, [inst.primary, *survivors, *added], info)
            if best is None:
                break  # degraded: the caller logs a short replica group
            added.append(best)
            load[best] += _weight(inst)
        copy_from = inst.primary if inst.primary not in dead else next(iter(survivors), None)
        out[inst.key] = ChainRepair(survivors + added, removed, added, copy_from)
    return out


def repair_chains(instances: Sequence[InstanceInfo], workers: Sequence[WorkerInfo], r: int, *,
                  dead: Collection[str]) -> dict[InstanceKey, ChainRepair]:
    """Drop dead members and refill chains to `r` (design §3 failure model: remove, replace, bulk copy).

    Only chains holding a dead worker or shorter than r are returned. Survivors keep their order
    (the head stays the head when it lives), replacements are appended, each the live non-member,
    non-primary worker with the least replica load (counted over every current chain). With too
    few live workers the chain comes back short instead of failing: a degraded group still
    protects the state. ``copy_from`` is the primary when it lives, else the first survivor (the
    primary's failover is the HM's, §4), never a dead worker; None if nobody holds the state.
    """
    info = _workers(workers)
    _check(instances, r)
    dead = set(dead)
    ids = sorted(info.keys() - dead)
    return _repair(instances, ids, info, r, dead, _replica_load(instances, ids))


def rebalance_chains(instances: Sequence[InstanceInfo], workers: Sequence[WorkerInfo], r: int
                     ) -> dict[InstanceKey, ChainRepair]:
    """Even out replica load after workers join (design §3 Phase 1, kept true as the cluster grows).

    Chains shorter than r are first topped up (a joining worker is what a degraded group waits
    for). Then, repeatedly, a replica of weight w moves from the most loaded worker to the least
    loaded one it may join (not the instance's primary, not in its chain) when their gap exceeds w:
    both land strictly between their old loads, so the max never grows, the min never falls and
    sum(load^2) strictly falls -- the loop ends. It is also capped at one move per replica.
    At the end, a fresh worker's load is at least the mean minus the largest weight it could take.
    Returns changed chains only; ``copy_from`` is the primary, the one holder certain to be live.
    """
    info = _workers(workers)
    _check(instances, r)
    ids = sorted(info)
    load = _replica_load(instances, ids)
    topped = _repair(instances, ids, info, r, (), load)
    chains = {i.key: list(topped[i.key].chain if i.key in topped else i.chain) for i in instances}
    weight = {i.key: _weight(i) for i in instances}
    primary = {i.key: i.primary for i in instances}
    holds: dict[str, set[InstanceKey]] = {w: set() for w in ids}
    for key, chain in chains.items():
        for m in set(chain) & holds.keys():
            holds[m].add(key)
    for _ in range(sum(map(len, chains.values()))):
        move = None
        for src in sorted(ids, key=lambda w: (-load[w], w)):
            for dst in sorted(ids, key=lambda w: (load[w], w)):
                gap = load[src] - load[dst]
                if gap <= 1:
                    break
                cands = [k for k in holds[src] if weight[k] < gap and primary[k] != dst and dst not in chains[k]]
                if cands:
                    move = min(cands, key=lambda k: (abs(gap - 2 * weight[k]), k)), src, dst
                    break
            if move:
                break
        if move is None:
            break
        key, src, dst = move
        chains[key][chains[key].index(src)] = dst
        holds[src].remove(key)
        holds[dst].add(key)
        load[src] -= weight[key]
        load[dst] += weight[key]
    out: dict[InstanceKey, ChainRepair] = {}
    for inst in sorted(instances, key=lambda i: i.key):
        new = chains[inst.key]
        kept = [m for m in inst.chain if m in new]
        added = [m for m in new if m not in inst.chain]
        # Moves can cancel out (a replica leaves and a later move brings it back), leaving the
        # same members in another order: that is no change, and the chain keeps its old order.
        if kept + added != list(inst.chain):
            out[inst.key] = ChainRepair(kept + added, [m for m in inst.chain if m not in new], added, inst.primary)
    return out


def choose_primary(candidates: Sequence[str], load: Mapping[str, int]) -> str:
    """The least loaded candidate, ties by id: where a new instance goes among workers already holding
    its replicas, so it restores by hard links (design §4 step 2) and load stays even. Missing load = 0."""
    if not candidates:
        raise InvalidArgumentError("choose_primary needs at least one candidate worker")
    return min(candidates, key=lambda w: (load.get(w, 0), w))
