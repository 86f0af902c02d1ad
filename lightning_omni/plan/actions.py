"""The plan IR's vocabulary: what an action does, what a message carries, one rank's step.

Kept apart from the schedule builders so that the execution rules (``execution``), the
builders (``schedule``) and the simulator (``simulate``) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):  # noqa: UP042 - requires-python allows 3.10 (no StrEnum)
    """What an action does."""

    def __str__(self) -> str:
        return self.value

    LLM_FWD = "llm_fwd"
    LLM_BWD = "llm_bwd"
    ENC_FWD = "enc_fwd"
    ENC_BWD = "enc_bwd"
    SEND = "send"
    RECV = "recv"
    ALLREDUCE = "allreduce"
    ALLTOALL = "alltoall"
    WAIT = "wait"  # completion of this rank's earlier SEND with the same message key


COMPUTE_KINDS = frozenset({Kind.LLM_FWD, Kind.LLM_BWD, Kind.ENC_FWD, Kind.ENC_BWD})
COLLECTIVE_KINDS = frozenset({Kind.ALLREDUCE, Kind.ALLTOALL})


class Payload(str, Enum):  # noqa: UP042
    """What a message carries; each payload is its own FIFO channel."""

    def __str__(self) -> str:
        return self.value

    ACTIVATION = "act"          # stage s -> s+1, forward
    GRADIENT = "grad"           # stage s+1 -> s, backward
    FEATURES = "feat"           # encoder rank -> stage 0
    FEATURE_GRAD = "feat_grad"  # stage 0 -> encoder rank
    WEIGHT_GRADS = "weight_grads"  # LLM stage gradients (all of a rank's, when unsplit)
    ENCODER_GRADS = "encoder_grads"  # encoder replicas' gradients, summed over ``group``
    SAMPLES = "samples"         # grouped reordering's sample exchange
    SP_ATTENTION = "sp_attn"    # Ulysses all-to-alls of one LSSP sample in its SP group


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one rank. ``share`` is the fraction of a microbatch's encoder work (for
    pricing); ``samples`` says which of the microbatch's samples that work covers (empty: not
    specified, as in shape-only plans). ``group`` lists the global ranks of a collective (empty:
    unspecified), ``counts`` what an ALLTOALL sends to each of them."""

    kind: Kind
    microbatch: int = -1
    stage: int = -1
    peer: int = -1
    payload: Payload | None = None
    share: float = 1.0
    samples: tuple[int, ...] = ()
    group: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    # Interleaved pipelines (``interleaved.py``): the model-chunk channel of an ACTIVATION or
    # GRADIENT message (0 otherwise). One microbatch crosses the same pair of ranks once per
    # chunk, so each chunk is its own FIFO channel.
    chunk: int = 0

    def __str__(self) -> str:
        if self.kind in (Kind.SEND, Kind.RECV, Kind.WAIT):
            chunk = f",chunk={self.chunk}" if self.chunk else ""
            return f"{self.kind}({self.payload},mb={self.microbatch},peer={self.peer}{chunk})"
        if self.kind in (Kind.ENC_FWD, Kind.ENC_BWD):
            return f"{self.kind}(mb={self.microbatch},share={self.share:.3g})"
        return f"{self.kind}(mb={self.microbatch},stage={self.stage})"


def message_key(rank: int, action: Action) -> tuple[str, int, int, int]:
    """(payload, microbatch, src, dst): what pairs a send with its receive (and its WAIT)."""
    channel = str(action.payload) if not action.chunk else f"{action.payload}@{action.chunk}"
    if action.kind in (Kind.SEND, Kind.WAIT):
        return (channel, action.microbatch, rank, action.peer)
    if action.kind == Kind.RECV:
        return (channel, action.microbatch, action.peer, rank)
    raise ValueError(f"action: expected a SEND, RECV or WAIT, got {action}")
