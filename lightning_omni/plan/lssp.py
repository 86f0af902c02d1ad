"""LSSP: long-short sequence parallelism for the encoder work of one group of GPUs.

Inside a microbatch, samples whose cost exceeds the balanced per-rank load (or whose memory
exceeds the cap) are long: each runs Ulysses-style sequence parallel over the smallest
power-of-two degree that divides the head count and meets both limits. Short samples run data
parallel, placed longest-first on the least-loaded rank after the SP work. The SP phase and
the DP phase alternate order between microbatches, so the group changes mode once per
microbatch boundary, never per sample, and weights stay where they are (no resharding).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_omnilab.validate import positive_int

from .costs import _require

SP = "sp"
DP = "dp"


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One encoder call as the planners see it: seconds and activation bytes on one GPU, and
    the seconds one Ulysses all-to-all round of all its layers' activations would take."""

    sample_id: int
    seconds: float
    memory_bytes: float
    alltoall_seconds: float = 0.0

    def sp_seconds(self, degree: int) -> float:
        """Per-rank time at SP degree ``degree``: 1/k of the work plus the all-to-alls."""
        if degree == 1:
            return self.seconds
        return self.seconds / degree + self.alltoall_seconds * (degree - 1) / degree**2


@dataclass(frozen=True, slots=True)
class SpGroup:
    sample_id: int
    ranks: tuple[int, ...]
    seconds: float
    fits_memory: bool


@dataclass(frozen=True)
class MicrobatchSplit:
    """The LSSP plan of one microbatch on one group of ``group_size`` GPUs."""

    microbatch: int
    phase_order: tuple[str, ...]
    sp_groups: tuple[SpGroup, ...]
    dp_samples: tuple[tuple[int, ...], ...]
    rank_finish_seconds: tuple[float, ...]
    peak_memory_bytes: tuple[float, ...]

    @property
    def makespan(self) -> float:
        return max(self.rank_finish_seconds, default=0.0)


@dataclass(frozen=True)
class RankView:
    """What one rank executes: per microbatch its DP samples and the SP groups it joins."""

    rank: int
    dp_samples: tuple[tuple[int, ...], ...]
    sp_groups: tuple[tuple[SpGroup, ...], ...]
    phase_order: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class LsspPlan:
    group_size: int
    microbatches: tuple[MicrobatchSplit, ...]

    def for_rank(self, rank: int) -> RankView:
        _require(0 <= rank < self.group_size, "rank", f"in [0, {self.group_size})", rank)
        return RankView(
            rank,
            tuple(mb.dp_samples[rank] for mb in self.microbatches),
            tuple(tuple(g for g in mb.sp_groups if rank in g.ranks) for mb in self.microbatches),
            tuple(mb.phase_order for mb in self.microbatches),
        )

    @property
    def mode_switches(self) -> int:
        """Number of SP<->DP changes across the whole step, counting inside and between
        microbatches."""
        phases = [p for mb in self.microbatches for p in mb.phase_order]
        return sum(1 for a, b in zip(phases, phases[1:], strict=False) if a != b)


def sp_degrees(group_size: int, heads: int) -> list[int]:
    """Admissible SP degrees: powers of two that divide the head count and fit the group."""
    out, k = [], 1
    while k <= group_size:
        if heads % k == 0:
            out.append(k)
        k *= 2
    return out


def choose_degree(item: WorkItem, target_seconds: float, memory_cap: float,
                  degrees: Sequence[int]) -> tuple[int, bool]:
    """Smallest degree meeting the load target and the memory cap; else the largest (or the
    smallest that fits memory), with a flag saying whether memory fits."""
    for k in degrees:
        if item.sp_seconds(k) <= target_seconds and item.memory_bytes / k <= memory_cap:
            return k, True
    for k in degrees:
        if item.memory_bytes / k <= memory_cap:
            fast = min((d for d in degrees if d >= k), key=item.sp_seconds)
            return fast, True
    return degrees[-1], False


def split_microbatch(items: Sequence[WorkItem], group_size: int, heads: int,
                     memory_cap: float, microbatch: int = 0) -> MicrobatchSplit:
    """LSSP plan of one microbatch (see the module docstring for the rules)."""
    positive_int("group_size", group_size)
    _require(heads >= 1, "heads", ">= 1", heads)
    _require(memory_cap > 0, "memory_cap", "> 0", memory_cap)
    degrees = sp_degrees(group_size, heads)
    total = sum(it.seconds for it in items)
    balanced = total / group_size
    ordered = sorted(items, key=lambda it: (-it.seconds, it.sample_id))
    longs = [it for it in ordered
             if group_size > 1 and (it.seconds > balanced or it.memory_bytes > memory_cap)]
    long_ids = {it.sample_id for it in longs}
    shorts = [it for it in ordered if it.sample_id not in long_ids]

    sp_load = [0.0] * group_size
    sp_mem = [0.0] * group_size
    groups: list[SpGroup] = []
    for it in longs:
        k, fits = choose_degree(it, balanced, memory_cap, degrees)
        if k == 1:  # nothing to split over: it runs data parallel like a short sample
            shorts.append(it)
            continue
        blocks = [tuple(range(b, b + k)) for b in range(0, group_size - k + 1, k)]
        block = min(blocks, key=lambda blk: (max(sp_load[r] for r in blk), blk[0]))
        t = it.sp_seconds(k)
        for r in block:
            sp_load[r] += t
            sp_mem[r] = max(sp_mem[r], it.memory_bytes / k)
        groups.append(SpGroup(it.sample_id, block, t, fits))

    shorts.sort(key=lambda it: (-it.seconds, it.sample_id))
    heap = [(sp_load[r], r) for r in range(group_size)]
    heapq.heapify(heap)
    dp_samples: list[list[int]] = [[] for _ in range(group_size)]
    dp_load = [0.0] * group_size
    dp_mem = [0.0] * group_size
    for it in shorts:
        _, r = heapq.heappop(heap)
        dp_samples[r].append(it.sample_id)
        dp_load[r] += it.seconds
        dp_mem[r] += it.memory_bytes
        heapq.heappush(heap, (sp_load[r] + dp_load[r], r))

    phases = (SP, DP) if microbatch % 2 == 0 else (DP, SP)
    phases = tuple(p for p in phases if (p == SP and groups) or (p == DP and shorts))
    finish = _finish_times(phases, groups, dp_load, group_size)
    # Activations of every sample stay alive until the microbatch's backward.
    mem_of = {it.sample_id: it.memory_bytes for it in items}
    peak = tuple(dp_mem[r] + sum(mem_of[g.sample_id] / len(g.ranks) for g in groups
                                 if r in g.ranks) for r in range(group_size))
    return MicrobatchSplit(microbatch, phases, tuple(groups), tuple(tuple(d) for d in dp_samples),
                           finish, peak)


def _finish_times(phases: Sequence[str], groups: Sequence[SpGroup], dp_load: Sequence[float],
                  group_size: int) -> tuple[float, ...]:
    """SP jobs start when all their members are free; DP work runs rank-locally."""
    avail = [0.0] * group_size
    for phase in phases:
        if phase == DP:
            avail = [a + d for a, d in zip(avail, dp_load, strict=True)]
        else:
            for g in groups:
                start = max(avail[r] for r in g.ranks)
                for r in g.ranks:
                    avail[r] = start + g.seconds
    return tuple(avail)


def plan_lssp(microbatches: Sequence[Sequence[WorkItem]], group_size: int, heads: int,
              memory_cap: float) -> LsspPlan:
    """LSSP plan for every microbatch of a step on one group of GPUs."""
    splits = tuple(split_microbatch(items, group_size, heads, memory_cap, m)
                   for m, items in enumerate(microbatches))
    return LsspPlan(group_size, splits)
