"""Encoder lanes: a TP group of ``tp`` processes running its encoders at a lower TP degree.

With ``encoder_tensor_parallel = e < tp`` a TP group holds ``tp // e`` lanes of ``e``
processes each (consecutive TP ranks). Each lane holds the encoders sharded ``e`` ways and
encodes its own share of the samples this plan rank encodes, as the planner prices it
(``plan.pricing``: ``lanes = tp // encoder_tp``). The LLM needs every feature on every TP
rank, so the lanes' outputs are summed over the *lane peers* (the processes at the same
position of every lane), each lane contributing zeros for the rows it did not encode.

Autograd: the LLM's input gradient is the same on every TP rank (DTensor all-reduces a
column-parallel layer's input gradient), so the backward of that sum is the identity: each lane
back-propagates its own rows. Encoder gradients then hold each lane's samples only; the runtime
sums them over the lane peers after the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from .failures import communicating


@dataclass(frozen=True)
class EncoderLanes:
    """This process's lane: ``index`` of ``count`` lanes, and the process group of its lane
    peers (one process per lane, same position in each)."""

    count: int
    index: int
    group: object
    timeout: timedelta | None = None


def assign_to_lanes(costs: Sequence[float], lanes: int,
                    preloaded: Sequence[float] = ()) -> list[int]:
    """The lane of each item: the costliest first, each onto the least-loaded lane (the lowest
    index on ties), so that every process computes the same assignment from the same costs.
    ``preloaded``: work the lanes already carry (e.g. lane 0's sequence-parallel pieces)."""
    if lanes < 1:
        raise ValueError(f"lanes: expected at least 1, got {lanes}")
    load = [float(x) for x in preloaded] + [0.0] * (lanes - len(preloaded))
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-float(costs[i]), i)):
        lane = min(range(lanes), key=lambda j: (load[j], j))
        out[i] = lane
        load[lane] += float(costs[i])
    return out


class _SumOverLanes(torch.autograd.Function):
    """Forward: the sum over the lane peers. Backward: the identity (the incoming gradient
    is the same on every lane, see the module docstring)."""

    @staticmethod
    def forward(ctx, t: Tensor, lanes: EncoderLanes) -> Tensor:
        out = t.detach().clone().contiguous()
        with communicating(f"all-reduce of encoder lane features ({out.shape[0]} rows)",
                           lanes.timeout):
            dist.all_reduce(out, group=lanes.group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def gather_lanes(t: Tensor, lanes: EncoderLanes | None) -> Tensor:
    """Every lane's rows of ``t`` (zeros where a lane did not encode) on every lane."""
    if lanes is None or lanes.count == 1:
        return t
    return _SumOverLanes.apply(t, lanes)


def scatter_rows(rows: int, width: int, parts: Sequence[tuple[Tensor, Tensor]],
                 like: Tensor) -> Tensor:
    """A ``[rows, width]`` tensor of zeros with each ``(index, values)`` part's rows put at
    ``index`` (differentiable in the values)."""
    out = like.new_zeros(rows, width)
    for index, values in parts:
        if index.numel():
            out = out.index_copy(0, index.to(out.device), values.to(out.dtype))
    return out
