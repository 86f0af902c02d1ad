"""Grouped reordering: balance samples across ranks inside each network-locality group.

Every rank loads its own samples (decentralized loaders), the ranks of a group all-gather the
metadata, and each computes the same assignment: longest-first onto the least-loaded rank with
room under the memory cap, then pairwise swaps/moves between the most and least loaded ranks.
Swaps are bounded by an iteration count, never by wall time, so the plan does not depend on
machine speed. The output also lists what each rank sends to and receives from whom (the
all-to-all).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .costs import _require


@dataclass(frozen=True, slots=True)
class Item:
    """A sample as the balancer sees it: cost in seconds (encoder + LLM) and memory units."""

    sample_id: int
    cost: float
    memory: float = 0.0


@dataclass(frozen=True)
class ReorderPlan:
    assignment: tuple[tuple[int, ...], ...]
    sends: tuple[Mapping[int, tuple[int, ...]], ...]
    recvs: tuple[Mapping[int, tuple[int, ...]], ...]
    load_before: tuple[float, ...]
    load_after: tuple[float, ...]
    memory_after: tuple[float, ...]
    over_memory: tuple[bool, ...]

    @property
    def imbalance_before(self) -> float:
        return imbalance(self.load_before)

    @property
    def imbalance_after(self) -> float:
        return imbalance(self.load_after)


def imbalance(loads: Sequence[float]) -> float:
    """max / mean, 1.0 when perfectly balanced."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else 1.0


def plan_reorder(local_items: Sequence[Sequence[Item]], groups: Sequence[int],
                 memory_cap: float = float("inf"), max_swap_rounds: int = 256) -> ReorderPlan:
    """Balanced assignment of every rank's samples inside its locality group.

    ``local_items[r]`` is what rank r loaded; ``groups[r]`` its locality group id. Samples never
    leave their group.
    """
    n = len(local_items)
    _require(len(groups) == n, "groups", f"one group id per rank ({n})", len(groups))
    _require(max_swap_rounds >= 0, "max_swap_rounds", ">= 0", max_swap_rounds)
    _require(memory_cap > 0, "memory_cap", "> 0", memory_cap)
    owner: dict[int, int] = {}
    by_id: dict[int, Item] = {}
    for r, items in enumerate(local_items):
        for it in items:
            _require(it.sample_id not in owner, "local_items", "unique sample ids",
                     it.sample_id)
            owner[it.sample_id] = r
            by_id[it.sample_id] = it
    members: dict[int, list[int]] = {}
    for r, g in enumerate(groups):
        members.setdefault(g, []).append(r)

    assignment: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    mem = [0.0] * n
    for g in sorted(members):
        ranks = members[g]
        pool = sorted((it for r in ranks for it in local_items[r]),
                      key=lambda it: (-it.cost, it.sample_id))
        _longest_first(pool, ranks, memory_cap, assignment, load, mem)
        _pairwise_swaps(ranks, by_id, memory_cap, max_swap_rounds, assignment, load, mem)
        _keep_original_if_better(ranks, local_items, memory_cap, assignment, load, mem)

    sends: list[dict[int, list[int]]] = [{} for _ in range(n)]
    recvs: list[dict[int, list[int]]] = [{} for _ in range(n)]
    for dst in range(n):
        assignment[dst].sort()
        for sid in assignment[dst]:
            src = owner[sid]
            if src != dst:
                sends[src].setdefault(dst, []).append(sid)
                recvs[dst].setdefault(src, []).append(sid)
    before = tuple(sum(it.cost for it in items) for items in local_items)
    return ReorderPlan(
        assignment=tuple(tuple(a) for a in assignment),
        sends=tuple({k: tuple(v) for k, v in sorted(s.items())} for s in sends),
        recvs=tuple({k: tuple(v) for k, v in sorted(s.items())} for s in recvs),
        load_before=before,
        load_after=tuple(load),
        memory_after=tuple(mem),
        over_memory=tuple(m > memory_cap for m in mem),
    )


def _longest_first(pool: Sequence[Item], ranks: Sequence[int], cap: float,
                   assignment: list[list[int]], load: list[float], mem: list[float]) -> None:
    heap = [(0.0, r) for r in ranks]
    heapq.heapify(heap)
    for it in pool:
        skipped = []
        chosen = None
        while heap:
            entry = heapq.heappop(heap)
            if mem[entry[1]] + it.memory <= cap:
                chosen = entry
                break
            skipped.append(entry)
        if chosen is None:  # nobody has room: the least-full rank takes it and is flagged
            r = min(ranks, key=lambda x: (mem[x], x))
            skipped = [e for e in skipped if e[1] != r]
        else:
            r = chosen[1]
        assignment[r].append(it.sample_id)
        load[r] += it.cost
        mem[r] += it.memory
        for e in skipped:
            heapq.heappush(heap, e)
        heapq.heappush(heap, (load[r], r))


def _pairwise_swaps(ranks: Sequence[int], by_id: Mapping[int, Item], cap: float, rounds: int,
                    assignment: list[list[int]], load: list[float], mem: list[float]) -> None:
    """Move or swap one sample between the most and the least loaded rank per round, taking
    the exchange that brings the pair closest to even (ties: smallest sample ids); stop when
    nothing improves. Bounded by ``rounds``, never by time."""
    if len(ranks) < 2:
        return
    for _ in range(rounds):
        hi = max(ranks, key=lambda r: (load[r], -r))
        lo = min(ranks, key=lambda r: (load[r], r))
        gap = load[hi] - load[lo]
        if gap <= 0 or not assignment[hi]:
            return
        hi_ids = np.array(assignment[hi], dtype=np.int64)
        lo_ids = np.array([-1] + assignment[lo], dtype=np.int64)
        hi_cost = np.array([by_id[s].cost for s in assignment[hi]])
        hi_mem = np.array([by_id[s].memory for s in assignment[hi]])
        lo_cost = np.array([0.0] + [by_id[s].cost for s in assignment[lo]])
        lo_mem = np.array([0.0] + [by_id[s].memory for s in assignment[lo]])
        delta = hi_cost[:, None] - lo_cost[None, :]
        dmem = hi_mem[:, None] - lo_mem[None, :]
        ok = (delta > 0) & (delta < gap) & (mem[lo] + dmem <= cap) & (mem[hi] - dmem <= cap)
        if not ok.any():
            return
        pair_max = np.where(ok, np.maximum(load[hi] - delta, load[lo] + delta), np.inf)
        best = pair_max.min()
        cand = np.argwhere(pair_max == best)
        # deterministic tie-break on (sample id moving out, sample id moving in)
        i, j = min(cand, key=lambda ij: (hi_ids[ij[0]], lo_ids[ij[1]]))
        sid_hi, sid_lo = int(hi_ids[i]), int(lo_ids[j])
        _move(sid_hi, hi, lo, by_id, assignment, load, mem)
        if sid_lo >= 0:
            _move(sid_lo, lo, hi, by_id, assignment, load, mem)


def _keep_original_if_better(ranks: Sequence[int], local_items: Sequence[Sequence[Item]],
                             cap: float, assignment: list[list[int]], load: list[float],
                             mem: list[float]) -> None:
    """Never plan worse than not moving at all (which also moves no bytes)."""
    orig_load = {r: sum(it.cost for it in local_items[r]) for r in ranks}
    orig_mem = {r: sum(it.memory for it in local_items[r]) for r in ranks}
    orig_fits = all(orig_mem[r] <= cap for r in ranks)
    planned_fits = all(mem[r] <= cap for r in ranks)
    if max(orig_load.values()) <= max(load[r] for r in ranks) and (orig_fits or not
                                                                   planned_fits):
        for r in ranks:
            assignment[r] = [it.sample_id for it in local_items[r]]
            load[r], mem[r] = orig_load[r], orig_mem[r]


def _move(sid: int, src: int, dst: int, by_id: Mapping[int, Item],
          assignment: list[list[int]], load: list[float], mem: list[float]) -> None:
    it = by_id[sid]
    assignment[src].remove(sid)
    assignment[dst].append(sid)
    load[src] -= it.cost
    load[dst] += it.cost
    mem[src] -= it.memory
    mem[dst] += it.memory
