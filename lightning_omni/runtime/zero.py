"""ZeRO-1 for OmniStrategy: each stage's optimizer state sharded over its data-parallel group.

torch's ``ZeroRedundancyOptimizer`` rather than DeepSpeed's ZeRO: it wraps whatever optimizer
the module's ``configure_optimizers`` returns (class, hyperparameters and param groups kept),
takes one process group (the stage's data-parallel ranks), and leaves the gradients to us; our
step has already put every held parameter's full gradient in place (summed over the stage's
replicas and over the holders of shared parameters), so ZeRO-1 is only the optimizer step: each
rank updates the parameters it owns and broadcasts them to the group. DeepSpeed's engine wants
to own the model, the backward and the gradient reduction, which our pipelined step does.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

with warnings.catch_warnings():  # torch.distributed.optim scripts its functional optimizers
    warnings.filterwarnings("ignore", r"`torch\.jit\.(script|interface)` is deprecated",
                            DeprecationWarning)
    from torch.distributed.optim import ZeroRedundancyOptimizer


class LocalShardZero(ZeroRedundancyOptimizer):
    """ZeRO-1 under tensor parallelism: ``ZeroRedundancyOptimizer`` over each DTensor
    parameter's local shard (a plain tensor sharing the DTensor's storage), since it flattens,
    partitions and broadcasts plain tensors. Every replica at the same TP rank holds the same
    shard, so the stage's data-parallel group at this TP rank shards its optimizer state as
    without TP. ``step`` first hands each shard its parameter's local gradient (after the
    closure, so after clipping); the update lands in the DTensor's storage."""

    def __init__(self, groups: list[dict], shards: list[tuple[Tensor, Tensor]],
                 **kwargs) -> None:
        self.shards = shards  # (DTensor parameter, its local shard) pairs
        super().__init__(groups, **kwargs)

    def pull_grads(self) -> None:
        """Each shard's gradient: its parameter's local gradient (sharing its storage, so that
        clipping either one clips both)."""
        for param, shard in self.shards:
            shard.grad = None if param.grad is None else param.grad.to_local()

    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.pull_grads()
        super().step(**kwargs)
        return loss

    def shard_of(self) -> dict[int, Tensor]:
        """Local shard (by id) -> its DTensor parameter."""
        return {id(shard): param for param, shard in self.shards}


def shard_optimizer(optimizer: Optimizer, held: Sequence[Tensor], group: object
                    ) -> ZeroRedundancyOptimizer:
    """``optimizer`` over this rank's held parameters, its state sharded over ``group``.
    Param groups keep their hyperparameters (including an LR scheduler's ``initial_lr``);
    groups with no held parameter are dropped. DTensor parameters (tensor parallelism) enter
    as their local shards (``LocalShardZero``)."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer
    from torch.distributed.tensor import DTensor

    mine = {id(p) for p in held}
    shards = {id(p): p.to_local().detach().requires_grad_(p.requires_grad)
              for p in held if isinstance(p, DTensor)}
    groups = []
    for g in optimizer.param_groups:
        params = [shards.get(id(p), p) for p in g["params"] if id(p) in mine]
        if params:
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
    if not groups:
        raise ValueError(f"optimizer: expected it to hold this stage's parameters, got a "
                         f"{type(optimizer).__name__} over none of them")
    if any(optimizer.state.values()):
        raise ValueError(f"optimizer: expected a fresh {type(optimizer).__name__} (no state "
                         "yet) to shard with zero_stage=1, got one that has already stepped")
    kwargs = {"optimizer_class": type(optimizer), "process_group": group,
              **_constructor_defaults(optimizer)}
    if shards:
        pairs = [(p, shards[id(p)]) for p in held if id(p) in shards]
        return LocalShardZero(groups, pairs, **kwargs)
    return ZeroRedundancyOptimizer(groups, **kwargs)


def _constructor_defaults(optimizer: Optimizer) -> dict:
    """The optimizer's defaults its class accepts again (AdamW keeps Adam's
    ``decoupled_weight_decay`` in its defaults but takes no such argument)."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def state_bytes(optimizer: Optimizer) -> int:
    """Bytes of optimizer state this rank holds: its shard under ZeRO-1, and of a DTensor
    state (tensor parallelism) its local shard, not the whole tensor it stands for."""
    local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(local_bytes(v) for s in local.state.values() for v in s.values()
               if isinstance(v, Tensor))


def local_bytes(t: Tensor) -> int:
    """Bytes a tensor takes on this rank (a DTensor: its local shard)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()
