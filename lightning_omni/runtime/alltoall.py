"""Process subgroups made once, and an all-to-all of rows that autograd can differentiate.

Both the Ulysses attention and the sample exchange move variable-length token rows between the
ranks of a subgroup. Subgroups are cached by their rank tuple so that a step never creates one
(creating a group is a store round-trip and leaks a communicator per call).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist


class SubgroupCache:
    """Process groups keyed by the tuple of their global ranks, created once each.

    ``get`` uses ``use_local_synchronization=True``, so only the members of a group take part
    in creating it; members must still meet their common groups in the same order (plans
    computed identically on every rank do). ``warm`` creates a list of groups up front, which
    every rank must call with the same list.
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self.created = 0

    def get(self, ranks: Iterable[int]) -> dist.ProcessGroup:
        key = tuple(sorted(int(r) for r in ranks))
        if not key:
            raise ValueError("ranks: expected at least one rank, got an empty list")
        group = self._groups.get(key)
        if group is None:
            world = dist.get_world_size()
            if key == tuple(range(world)):
                group = dist.group.WORLD
            else:
                bad = [r for r in key if not 0 <= r < world]
                if bad:
                    raise ValueError(f"ranks: expected ranks in [0, {world}), got {bad}")
                if dist.get_rank() not in key:
                    raise ValueError(f"ranks: this rank ({dist.get_rank()}) is not a member "
                                     f"of {key}; only members may ask for the group")
                group = dist.new_group(list(key), use_local_synchronization=True)
                self.created += 1
            self._groups[key] = group
        return group

    def add(self, ranks: Iterable[int], group: dist.ProcessGroup) -> None:
        """Register a group created elsewhere (e.g. by ``dist.new_group`` on every rank)."""
        self._groups[tuple(sorted(int(r) for r in ranks))] = group

    def warm(self, groups: Iterable[Sequence[int]]) -> None:
        """Create the groups this rank belongs to, in the given order (same list everywhere)."""
        me = dist.get_rank()
        for ranks in groups:
            if me in ranks:
                self.get(ranks)

    def __len__(self) -> int:
        return len(self._groups)


_DEFAULT_CACHE: SubgroupCache | None = None


def default_cache() -> SubgroupCache:
    """One cache per process (groups belong to the process's default process group)."""
    global _DEFAULT_CACHE
    if _DEFAULT_CACHE is None:
        _DEFAULT_CACHE = SubgroupCache()
    return _DEFAULT_CACHE


def reset_default_cache() -> None:
    """Forget the cached groups (call before ``destroy_process_group``)."""
    global _DEFAULT_CACHE
    _DEFAULT_CACHE = None


class _AllToAllRows(torch.autograd.Function):
    """Rows of ``x`` split by ``in_splits`` go to the group's ranks in order; the backward is the
    same exchange with the splits swapped. Written here because the autograd collectives in
    ``torch.distributed.nn`` are deprecated and their replacement in
    ``torch.distributed._functional_collectives`` is private."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, in_splits: list[int], out_splits: list[int],
                group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.in_splits, ctx.out_splits, ctx.group = in_splits, out_splits, group
        return _exchange(x, in_splits, out_splits, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        back = _AllToAllRows.apply(grad.contiguous(), ctx.out_splits, ctx.in_splits, ctx.group)
        return back, None, None, None


def _exchange(x: torch.Tensor, in_splits: list[int], out_splits: list[int],
              group: dist.ProcessGroup | None) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(out_splits),
                           input_split_sizes=list(in_splits), group=group)
    return out


def all_to_all_rows(x: torch.Tensor, in_splits: Sequence[int], out_splits: Sequence[int],
                    group: dist.ProcessGroup | None = None, differentiable: bool = True
                    ) -> torch.Tensor:
    """Send ``x[rows of split i]`` to the group's i-th rank; receive ``out_splits[j]`` rows from
    its j-th rank. Every rank must know what it receives (plans computed everywhere say so)."""
    n = dist.get_world_size(group)
    in_splits, out_splits = [int(s) for s in in_splits], [int(s) for s in out_splits]
    if len(in_splits) != n or len(out_splits) != n:
        raise ValueError(f"in_splits/out_splits: expected {n} entries (the group size), got "
                         f"{len(in_splits)} and {len(out_splits)}")
    if sum(in_splits) != x.shape[0]:
        raise ValueError(f"in_splits: expected them to sum to the {x.shape[0]} rows of x, got "
                         f"{sum(in_splits)}")
    if differentiable and x.requires_grad:
        return _AllToAllRows.apply(x, in_splits, out_splits, group)
    return _exchange(x, in_splits, out_splits, group)
