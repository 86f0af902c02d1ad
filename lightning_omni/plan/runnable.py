"""From a predicted layout to a launch: which layouts OmniStrategy runs, and its arguments.

The planner prices a wider space than the runtime executes (tensor parallelism, a separate
encoder pool), because the baselines it compares against use them. This file is the one place
that says which planned layouts the runtime can run and
why the others cannot, so that ``omni-plan`` marks its predictions and can search only the
launchable ones (``--runnable-only``: ``runnable_grid`` filters the search's candidates by
``launch``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .pricing import _stage_layers
from .scenario import ParallelConfig, Scenario
from .search import Grid

# Planner system -> OmniStrategy schedule. "disaggregated" (a separate pool of encoder GPUs)
# has none: OmniStrategy colocates the encoders with the LLM on every rank.
SCHEDULE_OF_SYSTEM = {"megatron": "encoder_first_stage", "omni": "uniform_insertion"}


@dataclass(frozen=True)
class Launch:
    """Whether OmniStrategy runs a planned layout, why not, and its arguments if it does."""

    runnable: bool
    why_not: tuple[str, ...]
    strategy_kwargs: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"runnable": self.runnable, "why_not": list(self.why_not),
                "strategy_kwargs": self.strategy_kwargs}


def _pooled(system: str, scenario: Scenario) -> bool:
    return system == "disaggregated" or (system == "omni"
                                         and "multiplexing" in scenario.omni_off)


def launch(system: str, cfg: ParallelConfig, scenario: Scenario) -> Launch:
    """The verdict on one layout of ``system`` for ``scenario`` (see ``Launch``)."""
    why: list[str] = []
    if _pooled(system, scenario):
        why.append("a separate encoder pool: OmniStrategy runs the encoders on the LLM's ranks")
    why += _tensor_parallel_refusals(system, cfg, scenario)
    if cfg.vpp > 1:
        why += _interleaving_limits(cfg, scenario)
    stage_layers = _stage_layers(scenario.llm.layers, cfg.pp, cfg.stage0_layer_fraction)
    if min(stage_layers) < 1:
        why.append("a stage without LLM layers: every stage hosts at least one block")
    if scenario.global_batch % cfg.dp:
        why.append("a DP degree that does not divide global_batch: every replica runs the same "
                   "number of microbatches")
    if why:
        return Launch(False, tuple(why), {})
    off = set(scenario.omni_off) if system == "omni" else set()
    schedule = SCHEDULE_OF_SYSTEM[system]
    if "uniform_insertion" in off:
        schedule = "encoder_first_stage"
    kwargs: dict[str, Any] = {
        "pipeline_parallel": cfg.pp,
        "data_parallel": cfg.dp,
        "schedule": schedule,
        # the planner's microbatch is one packed sequence of seq_len tokens
        "num_microbatches": scenario.global_batch // cfg.dp,
        "lssp": system == "omni" and "lssp" not in off,
        "reorder": system == "omni" and "reorder" not in off,
        # the planner's memory model shards optimizer state over DP (costs.param_bytes)
        "zero_stage": 1 if cfg.dp > 1 else 0,
    }
    if cfg.stage0_layer_fraction != 1.0:
        kwargs["stage_blocks"] = stage_layers
    # the planner's full recompute: every LLM block / encoder layer keeps only its input
    if cfg.recompute:
        kwargs["recompute"] = True
    if cfg.encoder_recompute:
        kwargs["encoder_recompute"] = True
    if cfg.vpp > 1:
        kwargs["virtual_pipeline_parallel"] = cfg.vpp
    if cfg.tp > 1:
        kwargs["tensor_parallel"] = cfg.tp
        kwargs["encoder_tensor_parallel"] = cfg.encoder_tp
    return Launch(True, (), kwargs)


def _interleaving_limits(cfg: ParallelConfig, scenario: Scenario) -> list[str]:
    """Why OmniStrategy cannot run this interleaved (VPP) layout (empty: it can; the
    planner's own rules, ``pricing._check_config``, already demand both)."""
    why = []
    if scenario.llm.layers < cfg.pp * cfg.vpp:
        why.append("a virtual stage without LLM layers: every model chunk hosts at least one "
                   "block")
    if scenario.global_batch % cfg.dp == 0 and (scenario.global_batch // cfg.dp) % cfg.pp:
        why.append("an interleaved pipeline (VPP) whose microbatches per replica are no "
                   "multiple of pp (Megatron-LM's interleaved 1F1B runs them in groups of pp)")
    return why


def _tensor_parallel_refusals(system: str, cfg: ParallelConfig, scenario: Scenario
                              ) -> list[str]:
    """Why OmniStrategy cannot run this layout's tensor parallelism as the plan prices it:
    the runtime shards the encoders over the whole TP group or runs ``tp // encoder_tp``
    encoder lanes in it (``runtime/encoder_lanes.py``), LSSP and grouped reordering either
    way."""
    tp, etp = cfg.tp, cfg.encoder_tp
    if etp > tp:
        return [f"tensor parallelism: encoder TP {etp} above the LLM's TP {tp}; OmniStrategy "
                "shards the encoders over the LLM's TP group at most"]
    if tp % etp:
        return [f"tensor parallelism: encoder TP {etp} does not divide the LLM's TP {tp}; "
                "OmniStrategy runs tp // encoder_tp encoder lanes per TP group"]
    return []


def runnable_systems(systems: tuple[str, ...] | list[str], scenario: Scenario) -> list[str]:
    """The systems of which some layout can run (not a separate encoder pool)."""
    return [s for s in systems if not _pooled(s, scenario)]


def runs(system: str, cfg: ParallelConfig, scenario: Scenario) -> bool:
    """Whether OmniStrategy runs this layout: ``launch``'s verdict, as a grid filter."""
    return launch(system, cfg, scenario).runnable


def runnable_grid(grid: Grid) -> Grid:
    """``grid`` searching exactly the layouts ``launch`` accepts: every candidate it
    enumerates is kept only if ``launch(...).runnable`` (``Grid.admits``), so TP layouts stay
    where the runtime runs them (encoder TP = TP; for Omni, only with LSSP and grouped
    reordering ablated) and recompute and model chunks per rank stay choices. The grid's own
    rules (LLM layers on every stage, equal replicas) prune before pricing. Raises if no
    layout can be left (no TP choice, or only stage-0 fractions of 0)."""
    narrowed = replace(grid, stage0_fractions=tuple(f for f in grid.stage0_fractions if f > 0),
                       min_stage_layers=1, equal_replicas=True, admits=runs)
    if not narrowed.tp or not narrowed.stage0_fractions:
        raise ValueError(f"grid: expected a TP degree and a stage-0 fraction > 0 among the "
                         f"choices for --runnable-only, got tp={list(grid.tp)}, "
                         f"stage0_fractions={list(grid.stage0_fractions)}")
    return narrowed
