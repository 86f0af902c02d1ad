"""What a prediction is about and what it says: scenarios, parallel layouts, predictions."""

from __future__ import annotations

from dataclasses import dataclass, field

from .costs import Hardware, TransformerConfig, _require
from .schedule import Schedule
from .simulate import SimResult
from .workload import Mixture

SYSTEMS = ("megatron", "disaggregated", "omni")
SYSTEM_LABELS = {"megatron": "Megatron-like", "disaggregated": "Disaggregated (DistMM-like)",
                 "omni": "Omni"}
# Omni's techniques, each of which a scenario may turn off (ablations): grouped reordering
# across replicas, LSSP inside a stage's encoder lanes, uniform insertion of encoder work over
# the stages, and multiplexing (encoders colocated with the LLM instead of a separate pool).
OMNI_TECHNIQUES = ("reorder", "lssp", "uniform_insertion", "multiplexing")


@dataclass(frozen=True)
class Scenario:
    """A launch to predict: models, cluster size, batch shape and data mix (one step)."""

    name: str
    encoder: TransformerConfig
    llm: TransformerConfig
    hardware: Hardware
    num_gpus: int
    global_batch: int
    seq_len: int
    mixture: Mixture
    seed: int = 0
    reorder_group_replicas: int = 8
    lssp_memory_fraction: float = 0.2
    omni_off: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for t in self.omni_off:
            _require(t in OMNI_TECHNIQUES, "omni_off", f"names from {OMNI_TECHNIQUES}", t)
        _require(self.num_gpus >= 1, "num_gpus", ">= 1", self.num_gpus)
        _require(self.global_batch >= 1, "global_batch", ">= 1", self.global_batch)
        _require(self.seq_len >= 16, "seq_len", ">= 16", self.seq_len)
        _require(self.reorder_group_replicas >= 1, "reorder_group_replicas", ">= 1",
                 self.reorder_group_replicas)


@dataclass(frozen=True, order=True)
class ParallelConfig:
    tp: int
    pp: int
    dp: int
    recompute: bool = False
    encoder_gpus: int = 0
    encoder_tp: int = 1
    encoder_recompute: bool = False
    stage0_layer_fraction: float = 1.0
    vpp: int = 1  # model chunks per pipeline rank (Megatron's virtual pipeline stages)

    def __str__(self) -> str:
        text = f"TP{self.tp} PP{self.pp}" + (f" VPP{self.vpp}" if self.vpp > 1 else "")
        text += f" DP{self.dp}" + (" +recompute" if self.recompute else "")
        text += " +enc-recompute" if self.encoder_recompute else ""
        if self.encoder_gpus:
            text += f" enc{self.encoder_gpus}gpu"
        if self.encoder_gpus or (self.encoder_tp != self.tp):
            text += f" encTP{self.encoder_tp}"
        if self.stage0_layer_fraction != 1.0:
            text += f" stage0x{self.stage0_layer_fraction:g}"
        return text


@dataclass(frozen=True)
class Prediction:
    system: str
    scenario: str
    config: ParallelConfig
    step_seconds: float
    tokens_per_s: float
    stage_peak_memory_gb: tuple[float, ...]
    oom: bool
    busy_fraction: tuple[float, ...]
    schedule: Schedule = field(repr=False)
    sim: SimResult = field(repr=False)
    slowest_replica: int = 0
    replicas_simulated: int = 1
    replica_step_seconds: tuple[float, ...] = ()

    @property
    def stage0_memory_gb(self) -> float:
        return self.stage_peak_memory_gb[0]

    @property
    def bubble_fraction(self) -> tuple[float, ...]:
        return tuple(1.0 - b for b in self.busy_fraction)
