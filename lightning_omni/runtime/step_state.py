"""What ``StageExecutor`` keeps during one step, declared in one place and fresh every step.

Each field lives from the action that fills it to the action that takes it (a microbatch's
forward to its backward, a message's post to its completion); a step that ends with anything
left in ``outbox`` or ``inbox`` did not follow its plan (``StageExecutor.run`` refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from torch import Tensor

from ..plan.lssp_schedule import GroupedPlan
from ..plan.schedule import Action

MessageKey = tuple[str, int, int, int]  # ``plan.schedule.message_key``: payload, mb, src, dst
ChunkKey = tuple[int, int]  # (microbatch, model chunk): one LLM chunk's work on a microbatch


class StepMode(str, Enum):  # noqa: UP042 - requires-python allows 3.10 (no StrEnum)
    """What a step computes: gradients (train), the loss only (eval), the head's output."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "predict"


class Posted(NamedTuple):
    """A posted ``isend``/``irecv``: its work handle, its buffer, the action it serves."""

    work: Any  # torch.distributed.Work (no public type to name before the call returns)
    buffer: Tensor
    action: Action


@dataclass
class StepState:
    """Per-step tensors and messages of one rank, keyed by microbatch unless said otherwise."""

    mode: StepMode = StepMode.TRAIN
    microbatches: list[dict[str, Tensor]] = field(default_factory=list)
    grouped: GroupedPlan | None = None  # the plan's encoder group work (LSSP / reordering)
    outbox: dict[MessageKey, Tensor] = field(default_factory=dict)  # taken, not yet posted
    inbox: dict[MessageKey, Posted] = field(default_factory=dict)  # posted, not yet received
    pending: dict[MessageKey, Posted] = field(default_factory=dict)  # sends awaiting a WAIT
    outputs: list[Tensor] = field(default_factory=list)  # PREDICT: the head's output
    metric_sums: dict[str, list[Tensor]] = field(default_factory=dict)  # name -> [sum, n]
    bytes_sent: int = 0  # encoder group exchanges
    rows_encoded: int = 0  # encoder input rows this process encoded
    enc_out: dict[int, Tensor] = field(default_factory=dict)  # own encoder output (graph)
    enc_parts: dict[int, list[tuple[Tensor, Tensor]]] = field(default_factory=dict)
    local_feat: dict[int, Tensor] = field(default_factory=dict)  # stage 0: leaf of own output
    # stage 0: every source's features of a microbatch, (samples, rows) in arrival order
    feat_in: dict[int, list[tuple[tuple[int, ...], Tensor]]] = field(default_factory=dict)
    remote_feat: dict[tuple[int, int], Tensor] = field(default_factory=dict)  # (mb, src)
    feat_grad: dict[int, Tensor] = field(default_factory=dict)  # received feature gradients
    # LLM chunks, by (microbatch, chunk): an interleaved rank runs several per microbatch
    stage_in: dict[ChunkKey, Tensor] = field(default_factory=dict)  # received activation (leaf)
    act_in: dict[ChunkKey, Tensor] = field(default_factory=dict)  # ... until its forward takes it
    stage_out: dict[ChunkKey, Tensor] = field(default_factory=dict)  # output (last stage: loss)
    grad_in: dict[ChunkKey, Tensor] = field(default_factory=dict)  # received output gradient
