"""Grouped reordering at run time: balance encoder samples inside each locality group.

Every rank's DataLoader reads its own shard. Inside a locality group (default: the ranks of one
node) the ranks all-gather their samples' metadata, each computes the same ``plan_reorder``
assignment, the samples move with one all-to-all (uneven splits), the encoders run where the
plan put them, and the features go back to the rank that owns the sample's LLM microbatch with
the reverse all-to-all, which autograd differentiates (feature gradients flow back).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..plan.reorder import Item, ReorderPlan, plan_reorder
from .alltoall import SubgroupCache, all_to_all_rows, default_cache, group_timeout
from .failures import communicating


def locality_groups(world_size: int, ranks_per_group: int | None = None) -> tuple[int, ...]:
    """Group id of every rank: consecutive blocks of ``ranks_per_group`` ranks (default: the
    launcher's ``LOCAL_WORLD_SIZE``, i.e. one group per node; else one group for everyone)."""
    if ranks_per_group is None:
        ranks_per_group = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size)
    if ranks_per_group < 1 or world_size % ranks_per_group:
        raise ValueError(f"ranks_per_group: expected a divisor of the world size {world_size}, "
                         f"got {ranks_per_group}")
    return tuple(r // ranks_per_group for r in range(world_size))


@dataclass(frozen=True, slots=True)
class SampleMeta:
    """What a rank tells its group about one loaded sample."""

    sample_id: int
    length: int
    cost: float
    memory: float = 0.0


@dataclass(frozen=True)
class GroupPlan:
    """The reorder plan of this rank's locality group, in group-local rank indices."""

    members: tuple[int, ...]  # global ranks, ascending
    me: int                   # this rank's index in ``members``
    plan: ReorderPlan
    lengths: Mapping[int, int]
    owner: Mapping[int, int]  # sample -> group-local index of the rank that loaded it

    @property
    def mine(self) -> tuple[int, ...]:
        """Samples this rank encodes after the exchange."""
        return self.plan.assignment[self.me]

    def splits(self, forward: bool) -> tuple[list[int], list[int]]:
        """Row counts per member: inputs owner -> encoder (``forward``) or features back."""
        n = len(self.members)
        send, recv = [0] * n, [0] * n
        out_map = self.plan.sends[self.me] if forward else self.plan.recvs[self.me]
        in_map = self.plan.recvs[self.me] if forward else self.plan.sends[self.me]
        for peer, sids in out_map.items():
            send[peer] = sum(self.lengths[s] for s in sids)
        for peer, sids in in_map.items():
            recv[peer] = sum(self.lengths[s] for s in sids)
        return send, recv


class GroupedReorder:
    """Metadata all-gather, plan, sample exchange and the autograd reverse exchange."""

    def __init__(self, group_of_rank: Sequence[int] | None = None,
                 cost: Callable[[int], float] | None = None, memory_cap: float = float("inf"),
                 cache: SubgroupCache | None = None) -> None:
        world = dist.get_world_size()
        self.groups = tuple(group_of_rank) if group_of_rank is not None else \
            locality_groups(world)
        if len(self.groups) != world:
            raise ValueError(f"group_of_rank: expected one group id per rank ({world}), got "
                             f"{len(self.groups)}")
        self.cost = cost or (lambda n: float(n) * n)  # attention-dominated encoders
        self.memory_cap = memory_cap
        self.cache = cache or default_cache()
        me = dist.get_rank()
        self.members = tuple(r for r, g in enumerate(self.groups) if g == self.groups[me])
        self.me = self.members.index(me)
        self.pg = self.cache.get(self.members)
        self.bytes_sent = 0

    def plan(self, local: Sequence[SampleMeta] | Mapping[int, int]) -> GroupPlan:
        """All-gather the group's metadata and compute the shared assignment. ``local`` is
        this rank's samples, as SampleMeta or as a sample id -> length mapping."""
        if isinstance(local, Mapping):
            local = [SampleMeta(s, n, self.cost(n)) for s, n in sorted(local.items())]
        metas: list[list[SampleMeta]] = [None] * len(self.members)  # type: ignore[list-item]
        with communicating(f"reorder metadata: all_gather_object over ranks {self.members}, "
                           "waiting for every member's sample list", group_timeout(self.pg)):
            dist.all_gather_object(metas, list(local), group=self.pg)
        items = [[Item(m.sample_id, m.cost, m.memory) for m in ms] for ms in metas]
        plan = plan_reorder(items, [0] * len(self.members), self.memory_cap)
        lengths = {m.sample_id: m.length for ms in metas for m in ms}
        owner = {m.sample_id: r for r, ms in enumerate(metas) for m in ms}
        return GroupPlan(self.members, self.me, plan, lengths, owner)

    def exchange(self, gp: GroupPlan, samples: Mapping[int, torch.Tensor],
                 row_shape: Sequence[int] | None = None, dtype: torch.dtype | None = None
                 ) -> dict[int, torch.Tensor]:
        """Ship inputs (``[length, *row_shape]`` rows, same row shape and dtype everywhere) to
        the ranks that encode them; returns the rows of ``gp.mine``, in their own shape (a row
        may be ``[3, 4]`` as well as ``[in_dim]``). ``row_shape``/``dtype`` are needed on a rank
        that sends nothing (it cannot read them off a sample); given everywhere, every sample
        is checked against them."""
        rows = []
        for peer in sorted(gp.plan.sends[gp.me]):
            for s in gp.plan.sends[gp.me][peer]:
                x = samples[s]
                if x.shape[0] != gp.lengths[s]:
                    raise ValueError(f"samples[{s}]: expected {gp.lengths[s]} rows (its "
                                     f"metadata), got {x.shape[0]}")
                if row_shape is not None and tuple(x.shape[1:]) != tuple(row_shape):
                    raise ValueError(f"samples[{s}]: expected rows of shape "
                                     f"{tuple(row_shape)} (row_shape), got {tuple(x.shape[1:])}")
                rows.append(x)
        buf = torch.cat(rows) if rows else _empty(samples, row_shape, dtype, "samples")
        send, recv = gp.splits(forward=True)
        got = all_to_all_rows(buf, send, recv, self.pg, differentiable=False,
                              what=f"reorder samples over group {self.members}")
        self.bytes_sent += _bytes(send, gp.me, buf)
        received = {}
        order = [s for peer in sorted(gp.plan.recvs[gp.me]) for s in gp.plan.recvs[gp.me][peer]]
        for s, t in zip(order, got.split([gp.lengths[s] for s in order]), strict=True):
            received[s] = t
        return {s: received[s] if s in received else samples[s] for s in gp.mine}

    def return_features(self, gp: GroupPlan, features: Mapping[int, torch.Tensor],
                        hidden: Sequence[int] | None = None, dtype: torch.dtype | None = None
                        ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        """Send each encoded sample's ``[length, hidden]`` features to the rank that loaded it.

        Returns (features of the samples this rank loaded, anchor). Every feature, kept or
        moved, passes through one autograd all-to-all, so a rank's backward always joins its
        reverse; a rank that loaded nothing adds ``anchor.sum() * 0`` to its loss. ``hidden``
        and ``dtype``: the feature row shape, needed only on a rank that encoded nothing."""
        missing = [s for s in gp.mine if s not in features]
        if missing:
            raise ValueError(f"features: expected the encoded samples {list(gp.mine)}, missing "
                             f"{missing}")
        n = len(gp.members)
        by_owner: list[list[int]] = [[] for _ in range(n)]
        for s in gp.mine:
            by_owner[gp.owner[s]].append(s)
        send = [sum(gp.lengths[s] for s in sids) for sids in by_owner]
        recv = [0] * n
        came_from: list[list[int]] = [[] for _ in range(n)]
        for s, o in sorted(gp.owner.items()):
            if o == gp.me:
                src = next(r for r in range(n) if s in gp.plan.assignment[r])
                came_from[src].append(s)
        for r in range(n):
            recv[r] = sum(gp.lengths[s] for s in came_from[r])
        rows = [features[s] for sids in by_owner for s in sids]
        if rows:
            buf = torch.cat(rows)
        else:  # a leaf that wants a gradient keeps this rank in the backward all-to-all
            buf = _empty(features, hidden, dtype, "features").requires_grad_()
        got = all_to_all_rows(buf, send, recv, self.pg,
                              what=f"reorder features over group {self.members}")
        self.bytes_sent += _bytes(send, gp.me, buf)
        order = [s for r in range(n) for s in came_from[r]]
        out = dict(zip(order, got.split([gp.lengths[s] for s in order]), strict=True))
        return out, got


def _bytes(splits: Sequence[int], me: int, buf: torch.Tensor) -> int:
    row = buf[0:1].numel() * buf.element_size() if buf.shape[0] else 0
    return sum(s for d, s in enumerate(splits) if d != me) * row


def _empty(tensors: Mapping[int, torch.Tensor], row_shape, dtype, name: str) -> torch.Tensor:
    """Zero rows of the exchanged row shape, for a rank with nothing to send."""
    ref = next(iter(tensors.values()), None)
    if ref is not None:
        return ref.new_zeros((0, *ref.shape[1:]))
    if row_shape is None:
        raise ValueError(f"{name}: this rank sends nothing, so pass the row shape (and dtype) "
                         "that the other ranks send")
    return torch.zeros((0, *row_shape), dtype=dtype or torch.get_default_dtype())


def reorder_metrics(gp: GroupPlan) -> dict[str, float]:
    """Encoder load imbalance (max/mean per-rank cost) before and after, and samples moved."""
    moved = sum(len(sids) for sends in gp.plan.sends for sids in sends.values())
    return {"reorder/imbalance_before": gp.plan.imbalance_before,
            "reorder/imbalance_after": gp.plan.imbalance_after,
            "reorder/samples_moved": float(moved)}
