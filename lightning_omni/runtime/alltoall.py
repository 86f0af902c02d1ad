"""Process subgroups made once, and an all-to-all of rows that autograd can differentiate.

Both the Ulysses attention and the sample exchange move variable-length token rows between the
ranks of a subgroup. Subgroups are cached by their rank tuple so that a step never creates one
(creating a group is a store round-trip and leaks a communicator per call).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from .failures import communicating

# timeouts of the groups this module created or was told about, for error messages
# (torch keeps a group's timeout in private state only)
_TIMEOUTS: dict[int, timedelta] = {}


def group_ranks(group: dist.ProcessGroup | None) -> tuple[int, ...]:
    """Global ranks of ``group`` (``None``: the default group), for error messages."""
    return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def group_timeout(group: dist.ProcessGroup | None) -> timedelta | None:
    """The timeout ``group`` was created with, when a ``SubgroupCache`` made or registered it."""
    return _TIMEOUTS.get(id(group)) if group is not None else None


class SubgroupCache:
    """Process groups keyed by the tuple of their global ranks, created once each.

    ``get`` uses ``use_local_synchronization=True``, so only the members of a group take part
    in creating it; members must still meet their common groups in the same order (plans
    computed identically on every rank do). ``warm`` creates a list of groups up front, which
    every rank must call with the same list.

    ``timeout``: how long a collective of a created group may wait for a stopped peer before it
    fails (``None``: torch's default for the backend, 30 minutes on gloo). A dead peer fails
    sooner: its sockets close.
    """

    def __init__(self, timeout: timedelta | None = None) -> None:
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self.created = 0
        self.timeout = timeout

    def get(self, ranks: Iterable[int]) -> dist.ProcessGroup:
        key = tuple(sorted(int(r) for r in ranks))
        if not key:
            raise ValueError("ranks: expected at least one rank, got an empty list")
        group = self._groups.get(key)
        if group is None:
            world = dist.get_world_size()
            if key == tuple(range(world)) and self.timeout is None:
                group = dist.group.WORLD  # its own timeout: the default group's
            else:
                bad = [r for r in key if not 0 <= r < world]
                if bad:
                    raise ValueError(f"ranks: expected ranks in [0, {world}), got {bad}")
                if dist.get_rank() not in key:
                    raise ValueError(f"ranks: this rank ({dist.get_rank()}) is not a member "
                                     f"of {key}; only members may ask for the group")
                with communicating(f"new_group over ranks {key} (waiting for every member "
                                   "to create it)", self.timeout):
                    group = dist.new_group(list(key), timeout=self.timeout,
                                           use_local_synchronization=True)
                if self.timeout is not None:
                    _TIMEOUTS[id(group)] = self.timeout
                self.created += 1
            self._groups[key] = group
        return group

    def add(self, ranks: Iterable[int], group: dist.ProcessGroup,
            timeout: timedelta | None = None) -> None:
        """Register a group created elsewhere (e.g. by ``dist.new_group`` on every rank);
        ``timeout``: the one it was created with (default: this cache's), for error messages."""
        self._groups[tuple(sorted(int(r) for r in ranks))] = group
        timeout = timeout if timeout is not None else self.timeout
        if timeout is not None and group is not None:
            _TIMEOUTS[id(group)] = timeout

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
                group: dist.ProcessGroup | None, what: str) -> torch.Tensor:
        ctx.in_splits, ctx.out_splits, ctx.group, ctx.what = in_splits, out_splits, group, what
        return _exchange(x, in_splits, out_splits, group, what)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        what = ctx.what if ctx.what.endswith("(backward)") else f"{ctx.what} (backward)"
        back = _AllToAllRows.apply(grad.contiguous(), ctx.out_splits, ctx.in_splits, ctx.group,
                                   what)
        return back, None, None, None, None


def _exchange(x: torch.Tensor, in_splits: list[int], out_splits: list[int],
              group: dist.ProcessGroup | None, what: str) -> torch.Tensor:
    # rows travel flat ([rows, elements]): a row may have any shape, only its size matters
    row = math.prod(x.shape[1:])
    out = x.new_empty((sum(out_splits), row))
    ranks = group_ranks(group)
    with communicating(f"{what}: all_to_all_single over ranks {ranks}, sending rows "
                       f"{in_splits} and waiting for rows {out_splits} (per member, "
                       f"{row} elements each)", group_timeout(group)):
        dist.all_to_all_single(out, x.contiguous().reshape(x.shape[0], row),
                               output_split_sizes=list(out_splits),
                               input_split_sizes=list(in_splits), group=group)
    return out.reshape(sum(out_splits), *x.shape[1:])


def all_to_all_rows(x: torch.Tensor, in_splits: Sequence[int], out_splits: Sequence[int],
                    group: dist.ProcessGroup | None = None, differentiable: bool = True,
                    what: str = "all_to_all_rows") -> torch.Tensor:
    """Send ``x[rows of split i]`` to the group's i-th rank; receive ``out_splits[j]`` rows from
    its j-th rank. Every rank must know what it receives (plans computed everywhere say so),
    and every rank's rows must have the same shape (``x.shape[1:]``).

    ``what`` names the exchange: a failure of the collective (a dead or stopped peer, a
    timeout) raises ``OmniRuntimeError`` naming it, the group's ranks and the rows waited for.
    """
    n = dist.get_world_size(group)
    in_splits, out_splits = [int(s) for s in in_splits], [int(s) for s in out_splits]
    if len(in_splits) != n or len(out_splits) != n:
        raise ValueError(f"in_splits/out_splits: expected {n} entries (the group size), got "
                         f"{len(in_splits)} and {len(out_splits)}")
    if sum(in_splits) != x.shape[0]:
        raise ValueError(f"in_splits: expected them to sum to the {x.shape[0]} rows of x, got "
                         f"{sum(in_splits)}")
    if differentiable and x.requires_grad:
        return _AllToAllRows.apply(x, in_splits, out_splits, group, what)
    return _exchange(x, in_splits, out_splits, group, what)
