"""One entry from a spec and its ``ParallelDims`` to this process's finished engine.

As torchtitan's ``parallelize_llama`` applies every parallelism to a plain model from outside,
``parallelize`` takes the user's parts as they are and, collectively on every process, in one
order:

1. shards the parts this rank hosts by the spec's TP plan (``tp_stage``: the LLM over the TP
   group, the encoders over their lane), when ``tp > 1``;
2. derives which ranks hold each parameter (``hosting``);
3. creates every process group the plans use: each stage's data-parallel group, the encoder
   holders, every set of ranks sharing a parameter, and with LSSP / grouped reordering every
   locality group and its sequence-parallel blocks;
4. hands all of it to a new ``OmniEngine``, which builds its executor with it at the first
   batch (the executor also needs that batch's shapes).

Nothing is set on the engine or the executor afterwards: what they run with is fixed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ..plan.lssp_schedule import GroupOptions, locality_subgroups, sp_subgroups
from ..spec import OmniSpec
from .alltoall import SubgroupCache
from .engine import OmniEngine
from .hosting import Hosting, encoder_stages, param_hosting
from .layout import Layout
from .parallel_dims import ParallelDims
from .splittable import splittable_heads
from .tp_stage import StageTP, apply_tensor_parallel, make_meshes


@dataclass(frozen=True)
class Parallelized:
    """What ``parallelize`` built for this process, read by the engine and its executor.

    ``groups``: process groups keyed by plan ranks (None for one rank); ``encoder_groups``:
    the LSSP / reordering groups keyed by processes (None: per-replica encoder plans);
    ``tp``: this process's TP meshes and encoder lane (None without tensor parallelism);
    ``elsewhere``: shapes of the parameters a meta build never allocated here (by id)."""

    dims: ParallelDims
    layout: Layout
    hosting: Hosting
    encoder_ranks: tuple[int, ...]
    groups: Mapping[tuple[int, ...], object]
    group_options: GroupOptions | None
    encoder_groups: SubgroupCache | None
    tp: StageTP | None
    elsewhere: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def owns_encoders(self) -> bool:
        return self.layout.rank in self.encoder_ranks


def parallelize(spec: OmniSpec, dims: ParallelDims, layout: Layout, device: torch.device,
                timeout: timedelta,
                elsewhere: Mapping[int, tuple[int, ...]] | None = None,
                tp: StageTP | None = None) -> OmniEngine:
    """This process's engine for ``spec`` under ``dims`` (``dims.for_world`` done), at
    ``layout`` (``dims.layout``; a meta build fixes it while the shapes are whole).
    Collective. Every process must hold rank 0's values by now (``sync_parameters``).
    ``tp``: the TP meshes when a meta build made them already (to cut its shards)."""
    options = group_options(spec, dims)
    encoder_ranks = encoder_plan_ranks(dims, layout)
    if dims.tp > 1:  # no mesh at TP 1: a process is its own TP group
        tp = tp or make_meshes(layout, dims.encoder_tp, device, timeout)
        apply_tensor_parallel(spec, layout, layout.rank in encoder_ranks, tp)
    else:
        tp = None
    hosting = param_hosting(spec, layout, dims.schedule)
    groups = _process_groups(layout, encoder_ranks, hosting, timeout)
    encoder_groups = (_encoder_groups(layout, options, groups, timeout)
                      if options is not None else None)
    built = Parallelized(dims, layout, hosting, encoder_ranks, groups, options, encoder_groups,
                         tp, dict(elsewhere or {}))
    return OmniEngine(spec, built, device, timeout)


def encoder_plan_ranks(dims: ParallelDims, layout: Layout) -> tuple[int, ...]:
    """The plan ranks that run the encoders (their stages on every replica)."""
    return tuple(sorted(d * layout.pp + s for d in range(layout.dp)
                        for s in encoder_stages(dims.schedule, layout.pp)))


def group_options(spec: OmniSpec, dims: ParallelDims) -> GroupOptions | None:
    """``dims.group_options`` with the heads LSSP may split in each modality's encoder (per
    encoder TP rank; 0: an encoder whose samples always run whole, see ``splittable``)."""
    heads = []
    for m in spec.modalities:
        try:
            heads.append(splittable_heads(m.encoder, dims.encoder_tp) if dims.lssp else 0)
        except ValueError as err:
            raise ValueError(f"modalities[{m.name}].encoder: {err}") from err
    return dims.group_options(tuple(heads))


def _new_group(layout: Layout, ranks: tuple[int, ...], timeout: timedelta) -> object:
    """The process group of plan ranks ``ranks`` at this process's TP rank (None for one
    rank). Every process creates the group of every TP rank, in the same order."""
    if len(ranks) <= 1:
        return None
    mine = None
    for t in range(layout.tp):
        processes = layout.tp_slice(ranks, t)
        if len(processes) == layout.global_world_size:
            return dist.group.WORLD
        group = dist.new_group(list(processes), timeout=timeout)
        if t == layout.tp_rank:
            mine = group
    return mine


def _process_groups(layout: Layout, encoder_ranks: tuple[int, ...], hosting: Hosting,
                    timeout: timedelta) -> dict[tuple[int, ...], object]:
    """Process groups (keyed by plan ranks) for the plan's collectives and for every set of
    ranks holding the same parameters, created in the same order on every process."""
    every = tuple(range(layout.world_size))
    groups: dict[tuple[int, ...], object] = {every: _new_group(layout, every, timeout)}
    wanted = [layout.stage_group(s) for s in range(layout.pp)]
    for ranks in [*wanted, encoder_ranks, *hosting.groups()]:
        if ranks not in groups:
            groups[ranks] = _new_group(layout, ranks, timeout)
    return groups


def _encoder_groups(layout: Layout, options: GroupOptions,
                    groups: dict[tuple[int, ...], object], timeout: timedelta) -> SubgroupCache:
    """Every process group an encoder group action may use (its locality group and the SP
    blocks inside it), created once, in the same order on every process; added to
    ``groups`` too (by plan ranks)."""
    cache = SubgroupCache(timeout=timeout)
    for s in range(layout.pp):
        for members in locality_subgroups(layout.stage_group(s), options.locality):
            for ranks in [members, *sp_subgroups(members, options.heads)]:
                if ranks not in groups:
                    groups[ranks] = _new_group(layout, ranks, timeout)
                g = groups[ranks]
                if layout.rank in ranks and g is not None:  # keyed by process ranks
                    cache.add(layout.tp_slice(ranks, layout.tp_rank), g)
    return cache


__all__ = ["Parallelized", "encoder_plan_ranks", "group_options", "parallelize"]
