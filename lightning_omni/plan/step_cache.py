"""What pricing caches on a ``StepData``: typed keys, typed results, one store per kind.

Every layout of a search prices the same sampled step, so per-microbatch tables, schedules,
LSSP splits and encoder assignments are computed once per distinct key and shared. A key names
everything its result depends on; two keys are equal only where the results would be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """A cache of one kind of result: ``get(key, make)`` calls ``make`` once per key."""

    def __init__(self) -> None:
        self._store: dict[K, V] = {}

    def get(self, key: K, make: Callable[[], V]) -> V:
        if key not in self._store:
            self._store[key] = make()
        return self._store[key]


class ReplicaKey(NamedTuple):
    """Which microbatches: replica ``replica`` of ``dp``, as the loader or the reordering
    (``kind``: "loader" or "omni") hands them out."""

    kind: str
    dp: int
    replica: int


class LlmTableKey(NamedTuple):
    """Per-microbatch LLM seconds (``quantity`` "fwd"/"bwd") or activation bytes ("act") of
    one virtual stage."""

    quantity: str
    replica: ReplicaKey
    layers: int
    last: bool  # the stage holds the output head
    tp: int
    recompute: bool


class ScheduleKey(NamedTuple):
    """A schedule's shape (schedules are immutable and depend only on it)."""

    builder: str  # a name of ``schedule.BUILDERS``
    pp: int
    num_microbatches: int
    vpp: int
    replica: ReplicaKey | None = None  # uniform insertion: placement follows the data
    uniform: bool = False  # uniform insertion on (off: stage 0 runs all encoder work)
    sample_exchange: bool = False


class SplitKey(NamedTuple):
    """One rank's LSSP split of one microbatch's encoder work."""

    where: str  # "pool": a disaggregated encoder pool; "stage": a pipeline rank (Omni)
    replica: ReplicaKey
    microbatch: int
    rank: int  # -1 for the pool
    pp: int  # 0 for the pool
    encoder_tp: int
    lanes: int  # LSSP lanes (data-parallel encoder replicas) of that rank or pool
    heads: int  # SP degree limit: encoder heads per TP rank (1: no sequence parallelism)
    recompute: bool
    uniform: bool


class EncoderSplit(NamedTuple):
    """The priced split: forward and backward seconds and the peak activation bytes."""

    fwd_seconds: float
    bwd_seconds: float
    peak_bytes: float


class AssignKey(NamedTuple):
    """The encoder work assignment of a replica's microbatches over ``pp`` ranks."""

    replica: ReplicaKey
    pp: int
    uniform: bool


class EncoderAssignment(NamedTuple):
    """``samples[m][r]``: microbatch-local samples rank r encodes; ``shares[m][r]`` its
    fraction of the work (``schedule.assign_encoder_samples``)."""

    samples: list[list[tuple[int, ...]]]
    shares: list[list[float]]
