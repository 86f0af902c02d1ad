"""The parallel layout of an Omni run, described once (as torchtitan's ``ParallelDims``).

``ParallelDims`` holds every degree and option that decides how a run is split and stepped:
pipeline, data, tensor and encoder-tensor parallel degrees, model chunks, microbatches,
schedule, LSSP and grouped reordering, ZeRO stage, recomputation. It is validated once, when it
is made, and is plain, hashable data: a module keeps the engine that split it under it, and
``str`` prints it in the planner's notation (``TP2 PP2 DP2 encTP1 ...``). The runtime reads
everything from it: each process's ``Layout``, the encoder group options.

Its fields use the internal vocabulary (``pp``, ``dp``, ``tp``, ``encoder_tp``, ``vpp``;
docs/architecture.md); its errors name ``OmniStrategy``'s keyword of each field
(``pipeline_parallel``, ``encoder_tensor_parallel``, ...), the names users write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from lightning_omnilab.validate import (
    ArgumentTypeError,
    boolean,
    fail,
    is_int,
    number,
    one_of,
    positive_int,
    positive_number,
    require,
)

from ..plan.interleaved import check_interleaving
from ..plan.lssp_schedule import GroupOptions
from ..plan.scenario import ParallelConfig
from ..plan.schedule import SCHEDULES
from .layout import Layout, check_world, make_layout
from .ulysses import BACKENDS

# OmniStrategy's keyword for each field whose internal name differs
KEYWORDS = {"pp": "pipeline_parallel", "dp": "data_parallel", "tp": "tensor_parallel",
            "encoder_tp": "encoder_tensor_parallel", "vpp": "virtual_pipeline_parallel"}


@dataclass(frozen=True)
class ParallelDims:
    """How a run is split over its processes and how each step runs.

    ``dp=None`` fills the world (``for_world``); ``encoder_tp=None`` is ``tp``;
    ``num_microbatches=None`` is ``2 * pp``; ``locality_groups=None`` is one group per node
    (``for_world``). See ``OmniStrategy`` for each option."""

    pp: int = 1
    dp: int | None = None
    tp: int = 1
    encoder_tp: int | None = None
    vpp: int = 1
    num_microbatches: int | None = None
    schedule: str = "uniform_insertion"
    stage_blocks: tuple[int, ...] | None = None
    lssp: bool = False
    reorder: bool = False
    locality_groups: tuple[int, ...] | None = None
    lssp_max_rows: float | None = None
    encoder_cost: tuple[float, float] = (1.0, 0.0)
    ulysses_backend: str = "auto"
    zero_stage: int = 0
    recompute: bool = False
    encoder_recompute: bool = False

    def __post_init__(self) -> None:
        k = KEYWORDS
        pp = positive_int(k["pp"], self.pp)
        tp = positive_int(k["tp"], self.tp)
        encoder_tp = positive_int(k["encoder_tp"], self.encoder_tp, none_ok=True)
        dp = positive_int(k["dp"], self.dp, none_ok=True)
        one_of("schedule", self.schedule, SCHEDULES)
        micro = positive_int("num_microbatches", self.num_microbatches, none_ok=True)
        max_rows = positive_number("lssp_max_rows", self.lssp_max_rows, none_ok=True)
        cost = _encoder_cost(self.encoder_cost)
        one_of("ulysses_backend", self.ulysses_backend, BACKENDS)
        one_of("zero_stage", self.zero_stage, (0, 1), expected="0 (replicated optimizer "
               "state) or 1 (sharded over each stage's data-parallel group)")
        for name in ("lssp", "reorder", "recompute", "encoder_recompute"):
            boolean(name, getattr(self, name))
        vpp = positive_int(k["vpp"], self.vpp)
        micro = micro or 2 * pp
        check_interleaving(pp, micro, vpp, names=(k["pp"], "num_microbatches", k["vpp"]))
        check_encoder_tp(tp, encoder_tp)
        fixed: dict[str, Any] = {
            "pp": pp, "dp": dp, "tp": tp, "vpp": vpp, "num_microbatches": micro,
            "encoder_tp": tp if encoder_tp is None else encoder_tp,
            "lssp_max_rows": max_rows, "encoder_cost": cost,
            "stage_blocks": _ints("stage_blocks", self.stage_blocks),
            "locality_groups": _ints("locality_groups", self.locality_groups)}
        for name, value in fixed.items():  # normalized: equal layouts hash alike
            object.__setattr__(self, name, value)

    # -- the world ------------------------------------------------------------------------------
    def for_world(self, world: int, processes_per_node: int) -> ParallelDims:
        """These dims for ``world`` processes: ``dp`` filled in, ``pp * dp * tp`` checked
        against it; with LSSP or grouped reordering, the locality groups (default: one per
        node of ``processes_per_node``) checked to give one id per process and to keep each
        TP group in one group."""
        dp = self.dp or max(1, world // (self.pp * self.tp))
        check_world(world, self.pp, dp, self.tp, " (devices * num_nodes)")
        locality = self.locality_groups
        if self.lssp or self.reorder:
            if locality is None:
                locality = tuple(r // processes_per_node for r in range(world))
            require(len(locality) == world, "locality_groups",
                    f"one group id per rank ({world})", len(locality))
            tp = self.tp
            if any(len(set(locality[r:r + tp])) > 1 for r in range(0, world, tp)):
                fail("locality_groups", f"the {tp} ranks of each tensor-parallel group in one "
                     "locality group", list(locality))
        return replace(self, dp=dp, locality_groups=locality)

    @property
    def world_size(self) -> int:
        """Processes of the run (``for_world`` fixes ``dp``)."""
        return self.pp * self._dp() * self.tp

    def layout(self, rank: int, block_costs: Sequence[float]) -> Layout:
        """Where process ``rank`` sits, the blocks cut into ``pp * vpp`` (virtual) stages by
        ``block_costs`` (or ``stage_blocks``)."""
        return make_layout(self.world_size, rank, self.pp, self._dp(), block_costs,
                           self.stage_blocks, vpp=self.vpp, tp=self.tp)

    def group_options(self, heads: tuple[int, ...]) -> GroupOptions | None:
        """The encoder group options of LSSP / grouped reordering (None: both off, per-replica
        encoder plans). ``heads``: each modality's splittable heads per encoder TP rank. The
        plan's ranks are one per TP group, so its locality is each TP group's."""
        if not (self.lssp or self.reorder):
            return None
        locality = self.locality_groups
        require(locality is not None, "locality_groups", "set by for_world", locality)
        cap = self.lssp_max_rows if self.lssp_max_rows is not None else math.inf
        return GroupOptions(self.lssp, self.reorder, tuple(locality[::self.tp]), heads,
                            self.encoder_cost[0], self.encoder_cost[1], float(cap))

    def _dp(self) -> int:
        require(self.dp is not None, KEYWORDS["dp"], "a degree (ParallelDims.for_world "
                "fills it from the world size)", self.dp)
        return self.dp

    # -- printing ---------------------------------------------------------------------------
    def planner_config(self) -> ParallelConfig:
        """The same degrees as ``omni-plan`` writes them (``plan.scenario.ParallelConfig``)."""
        return ParallelConfig(self.tp, self.pp, self.dp or 0, self.recompute,
                              encoder_tp=self.encoder_tp,
                              encoder_recompute=self.encoder_recompute, vpp=self.vpp)

    def __str__(self) -> str:
        text = str(self.planner_config())
        if self.dp is None:
            text = text.replace(" DP0", " DP(fills the world)")
        else:
            text += f" (world size {self.world_size})"
        text += f"; schedule {self.schedule!r}, {self.num_microbatches} microbatches per replica"
        if self.stage_blocks is not None:
            text += f", stage_blocks {list(self.stage_blocks)}"
        text += f"; lssp={self.lssp}, reorder={self.reorder}"
        if self.lssp or self.reorder:
            a, b = self.encoder_cost
            text += (f" (locality_groups {self.locality_groups}, encoder cost {a:g}*L + "
                     f"{b:g}*L^2, lssp_max_rows {self.lssp_max_rows}, ulysses_backend "
                     f"{self.ulysses_backend!r})")
        return text + f", zero_stage={self.zero_stage}"


def check_encoder_tp(tp: int, encoder_tp: int | None) -> None:
    """The encoders' TP degree divides the LLM's: a TP group splits into whole lanes."""
    if encoder_tp is not None and tp % encoder_tp:
        fail(KEYWORDS["encoder_tp"], f"a divisor of {KEYWORDS['tp']}={tp} (the encoders run "
             f"in {KEYWORDS['tp']} // {KEYWORDS['encoder_tp']} lanes)", encoder_tp)


def check_microbatches(samples: int, num_microbatches: int, source: str = "") -> None:
    """A replica's batch of ``samples`` splits into ``num_microbatches`` equal microbatches."""
    if samples % num_microbatches:
        raise ValueError(f"batch: {samples} samples per data-parallel replica{source} cannot be "
                         f"split into num_microbatches={num_microbatches} equal microbatches; "
                         f"use a batch size divisible by {num_microbatches}")


def _encoder_cost(value: Any) -> tuple[float, float]:
    """``(a, b)``: two finite numbers >= 0, not both 0 (a list from a config file too)."""
    expected = "a pair (a, b) of finite numbers >= 0, not both 0"
    try:
        pair = list(value) if not isinstance(value, str | bytes | dict) else None
    except TypeError:
        pair = None
    if pair is None or len(pair) != 2:
        fail("encoder_cost", expected, value, ArgumentTypeError)
    try:
        cost = (number("encoder_cost", pair[0], low=0), number("encoder_cost", pair[1], low=0))
    except ArgumentTypeError:
        fail("encoder_cost", expected, value, ArgumentTypeError)
    except ValueError:
        fail("encoder_cost", expected, value)
    if sum(cost) <= 0:
        fail("encoder_cost", expected, value)
    return cost


def _ints(name: str, values: Sequence[int] | None) -> tuple[int, ...] | None:
    """A list of ints (a config file's list too) as a tuple, or None."""
    if values is None:
        return None
    try:
        items = list(values) if not isinstance(values, str | bytes | dict) else None
    except TypeError:
        items = None
    if items is None or not all(is_int(v) for v in items):
        fail(name, "a list of ints or None", values, ArgumentTypeError)
    return tuple(int(v) for v in items)


__all__ = ["KEYWORDS", "ParallelDims", "check_encoder_tp", "check_microbatches"]
