"""Tensor parallelism inside each pipeline stage, where it meets the PP x DP runtime.

Which DTensor styles go on which submodules is the spec's TP plan, applied by
``runtime/tensor_parallel.py`` (torch's ``parallelize_module`` over a ``DeviceMesh``). This file
builds the meshes from the layout, applies the plan to the parts this rank hosts, keeps tied
weights tied, and gives the rest of the runtime the local-shard views it works on: gradient
collectives and the clip norm see each process's local shard, checkpoints see full tensors.

Meshes: the processes of one plan rank form its TP group (``Layout``, TP innermost). The LLM
parts are sharded over the whole group. The encoders are sharded over the whole group
(``encoder_tp == tp``) or over lanes of ``encoder_tp`` consecutive TP ranks, each lane encoding
its own share of the samples (``encoder_lanes``; ``encoder_tp == 1``: plain encoders, one lane
per TP rank).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from ..spec import OmniSpec
from .encoder_lanes import EncoderLanes
from .hosting import all_modules, all_parameters, stage_modules
from .layout import Layout


@dataclass(frozen=True)
class StageTP:
    """This process's TP meshes (``encoder_mesh`` None: encoders plain, unsharded) and its
    encoder lane (None: one lane, the whole TP group). The degrees are ``ParallelDims``'
    ``tp`` and ``encoder_tp``."""

    mesh: DeviceMesh
    encoder_mesh: DeviceMesh | None
    lanes: EncoderLanes | None = None


def make_meshes(layout: Layout, encoder_tp: int, device: torch.device,
                timeout: timedelta | None = None) -> StageTP:
    """The LLM mesh (this plan rank's TP group), the encoders' mesh (the same one, this
    process's lane of ``encoder_tp`` ranks, or None: plain encoders) and the lane peers'
    group. ``encoder_tp`` divides ``layout.tp`` (``ParallelDims`` checked it). Every process
    builds the meshes of every plan rank (DeviceMesh creates all slices' groups
    collectively, in one order)."""
    tp = layout.tp
    ranks = torch.arange(layout.global_world_size).view(layout.world_size, tp)
    mesh = DeviceMesh(device.type, ranks, mesh_dim_names=("plan", "tp"))["tp"]
    if encoder_tp == tp:
        return StageTP(mesh, mesh)
    count = tp // encoder_tp
    if encoder_tp == 1:
        enc_mesh, peers = None, mesh
    else:
        split = ranks.view(layout.world_size, count, encoder_tp)
        grid = DeviceMesh(device.type, split, mesh_dim_names=("plan", "lane", "enc"))
        enc_mesh, peers = grid["enc"], grid["lane"]
    lanes = EncoderLanes(count, layout.tp_rank // encoder_tp, peers.get_group(), timeout)
    return StageTP(mesh, enc_mesh, lanes)


def hosted_parts(layout: Layout, owns_encoders: bool) -> list[str]:
    """The part names (``tensor_parallel.parallelize_parts``) this rank runs."""
    # one slice per model chunk (an interleaved pipeline hosts several runs of blocks)
    parts = [f"blocks[{lo}:{hi}]" for lo, hi in layout.chunk_bounds(layout.stage)]
    if layout.is_first:
        parts.insert(0, "embedding")
    if layout.is_last:
        parts.append("head")
    if owns_encoders:
        parts.append("encoders")
    return parts


def apply_tensor_parallel(spec: OmniSpec, layout: Layout, owns_encoders: bool,
                          tp: StageTP) -> None:
    """Shard the parts this rank hosts in place (every process of the plan rank in the same
    order). A weight tied between a hosted and a non-hosted part (embedding and head on
    different stages) stays one parameter (``parallelize_parts`` re-ties it), so every rank
    agrees on the model's parameter list: hosting, optimizer state order, checkpoints."""
    from .tensor_parallel import parallelize_parts  # the spec's plan (DTensor styles)

    count = len(all_parameters(spec))
    parallelize_parts(spec, hosted_parts(layout, owns_encoders), tp.mesh, tp.encoder_mesh)
    if len(all_parameters(spec)) != count:
        raise ValueError(f"tp_plan: sharding split a tied parameter on rank "
                         f"{layout.global_rank} ({count} parameters before, "
                         f"{len(all_parameters(spec))} after)")
    hosted = {id(m) for m in stage_modules(spec, layout, layout.stage, owns_encoders)}
    ours = {id(q) for m in all_modules(spec) if id(m) in hosted for q in m.parameters()}
    for part in all_modules(spec):
        stray = [n for n, p in part.named_parameters()
                 if isinstance(p, DTensor) and id(p) not in ours]
        if stray:
            raise ValueError(f"tp_plan: {stray} of {type(part).__name__} were sharded on rank "
                             f"{layout.global_rank}, which does not host that part")


def shard_cuts(spec: OmniSpec, layout: Layout, owns_encoders: bool, tp: StageTP
               ) -> dict[int, Callable[[Tensor], Tensor]]:
    """For a meta build (``meta_init.materialize(shards=...)``): each parameter the plan
    shards on this rank (by ``id``) -> the cut of its whole value to this process's DTensor
    shard, placed as ``apply_tensor_parallel`` places it (which then keeps it as it is). Each
    process cuts its own shard, with no message: every rank replays rank 0's build."""
    from .tensor_parallel import planned_placements

    placed = planned_placements(spec, hosted_parts(layout, owns_encoders), tp.mesh,
                                tp.encoder_mesh)
    return {key: partial(distribute_tensor, device_mesh=mesh, placements=placements,
                         src_data_rank=None)
            for key, (_, mesh, placements) in placed.items()}


def sharded_grad(param: Tensor) -> Tensor | None:
    """``param``'s gradient placed like ``param`` (DTensor's backward may leave it otherwise:
    a vocabulary-parallel embedding's weight gradient comes back replicated), so that its
    local shard lines up with the parameter's for the optimizer, the gradient collectives and
    the norm. A replicated gradient is cut locally; a partial one is reduce-scattered (every
    process of the mesh in the same order)."""
    grad = param.grad
    if not isinstance(grad, DTensor) or tuple(grad.placements) == tuple(param.placements):
        return grad
    return grad.redistribute(param.device_mesh, param.placements)


def counted_in_norm(param: Tensor, layout: Layout) -> bool:
    """Whether this process adds ``param``'s local gradient to a global norm, so that every
    element enters once over the TP group: every shard of a sharded parameter, a replicated
    DTensor's or a plain parameter's gradient (equal on every TP rank) on TP rank 0 only; an
    encoder lane's parameters (a mesh smaller than the TP group: every lane holds the same
    ones) in the first lane only."""
    if not isinstance(param, DTensor):
        return layout.tp_rank == 0
    mesh = param.device_mesh
    if layout.tp_rank >= mesh.size():  # not the first lane
        return False
    return all(mesh.get_local_rank(d) == 0 for d, pl in enumerate(param.placements)
               if not pl.is_shard())


# -- checkpoints: full tensors on disk, each process's shard in memory ------------------------
def full(value: Any) -> Any:
    """``value`` with every DTensor gathered whole (every process of its mesh takes part, in
    the same order: nested dicts and lists are walked in their order)."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, Mapping):
        return type(value)((k, full(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(full(v) for v in value)
    return value


def reshard(value: Tensor, like_this: Tensor) -> Tensor:
    """A full tensor read from a checkpoint as ``like_this``'s DTensor (this process's shard
    cut locally: every process read the whole tensor, no message)."""
    if not isinstance(like_this, DTensor) or isinstance(value, DTensor):
        return value
    if tuple(value.shape) != tuple(like_this.shape):
        raise ValueError(f"checkpoint: expected a tensor of shape {tuple(like_this.shape)}, "
                         f"got {tuple(value.shape)}")
    return distribute_tensor(value.to(like_this.dtype), like_this.device_mesh,
                             like_this.placements, src_data_rank=None)


def _params_by_index(state: dict[str, Any], optimizer: torch.optim.Optimizer
                     ) -> dict[Any, Tensor]:
    """Each saved parameter index -> its parameter (matched by position in the param groups;
    a ``LocalShardZero``'s local shard -> its DTensor parameter)."""
    owner = optimizer.shard_of() if hasattr(optimizer, "shard_of") else {}
    params: dict[Any, Tensor] = {}
    for saved, group in zip(state["param_groups"], optimizer.param_groups, strict=True):
        for key, p in zip(saved["params"], group["params"], strict=True):
            params[key] = owner.get(id(p), p)
    return params


def _per_param(state: dict[str, Any], params: dict[Any, Tensor], fn) -> dict[str, Any]:
    return {**state, "state": {key: {name: fn(v, params.get(key)) for name, v in entry.items()}
                               for key, entry in state["state"].items()}}


def full_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer
                         ) -> dict[str, Any]:
    """An optimizer ``state_dict`` with whole tensors: DTensor states gathered, and a
    ``LocalShardZero``'s local-shard states (its parameters' shapes) gathered by their
    parameter's placements. Every TP rank of the stage calls it, in the same order."""
    def whole(v: Any, p: Tensor | None) -> Any:
        if isinstance(v, DTensor):
            return v.full_tensor()
        if isinstance(p, DTensor) and isinstance(v, Tensor) and v.dim() and \
                tuple(v.shape) == tuple(p.to_local().shape):
            return DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape,
                                      stride=p.stride()).full_tensor()
        return v

    return _per_param(state, _params_by_index(state, optimizer), whole)


def reshard_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer
                            ) -> dict[str, Any]:
    """An optimizer ``state_dict`` with full tensors, its per-parameter tensors (those of
    the parameter's shape) cut like the parameters they belong to: DTensors, or local shards
    for a ``LocalShardZero``."""
    shards = hasattr(optimizer, "shard_of")

    def cut(v: Any, p: Tensor | None) -> Any:
        if not (isinstance(p, DTensor) and isinstance(v, Tensor) and not isinstance(v, DTensor)
                and tuple(v.shape) == tuple(p.shape)):
            return v
        d = reshard(v, p)
        return d.to_local() if shards else d

    return _per_param(state, _params_by_index(state, optimizer), cut)
