"""Grid search of parallel layouts: the same grid and memory limit for every system.

Candidates whose weights alone do not fit are dropped, the rest are ranked by a closed-form
estimate (exact program-order peak memory; busiest rank's work plus a warm-up term) on the
replicas most likely to be slowest or fullest, and the most promising are priced on every
replica and simulated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_omnilab.validate import is_int

from .costs import CostModel, _require
from .priced import PricedStep, estimate_seconds, peak_bytes
from .pricing import StepPricer, _stage_layers, predict
from .scenario import SYSTEMS, ParallelConfig, Prediction, Scenario
from .step_data import StepData


@dataclass(frozen=True)
class Grid:
    """The layout dimensions a search may choose from."""

    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16)
    recompute: tuple[tuple[bool, bool], ...] = ((False, False), (False, True), (True, True))
    stage0_fractions: tuple[float, ...] = (1.0, 0.5, 0.0)  # of an even LLM layer split
    # model chunks per pipeline rank (interleaved 1F1B); used where the layout allows it:
    # pp > 1, an even split, layers divisible by pp * vpp, each replica's microbatches a
    # multiple of pp (Megatron-LM's rule)
    vpp: tuple[int, ...] = (1, 2)
    # what a runtime may demand of a layout (``runnable.runnable_grid``): LLM layers on every
    # stage, and a DP degree that divides the global batch (equal microbatches per replica)
    min_stage_layers: int = 0
    equal_replicas: bool = False
    # the last word of a runtime on each enumerated layout, (system, layout, scenario) -> keep
    # it (``runnable.runnable_grid`` passes ``launch(...).runnable``); None keeps every layout
    admits: Callable[[str, ParallelConfig, Scenario], bool] | None = None


DEFAULT_GRID = Grid()
# A conventionally configured pipeline: no uneven first stage, all-or-nothing recompute
# (interleaving, a standard Megatron-LM option, kept).
CONVENTIONAL_PIPELINE_GRID = Grid(pp=(2, 4, 8, 16), recompute=((False, False), (True, True)),
                                  stage0_fractions=(1.0,))


def vpp_choices(scenario: Scenario, pp: int, dp: int, cut: float, grid: Grid) -> list[int]:
    """The grid's model-chunk counts this layout allows (see ``Grid.vpp``)."""
    out = []
    for v in grid.vpp:
        _require(is_int(v, minimum=1), "grid.vpp", "ints >= 1", grid.vpp)
        if v == 1:
            out.append(1)
        elif pp > 1 and cut == 1.0 and scenario.llm.layers % (pp * v) == 0 \
                and scenario.global_batch % dp == 0 and (scenario.global_batch // dp) % pp == 0:
            out.append(v)
    return out


def encoder_pool_choices(num_gpus: int) -> list[int]:
    """Encoder pool sizes the disaggregated system may take (1/16 .. 1/2 of the GPUs)."""
    step = max(1, num_gpus // 16)
    return sorted({max(1, round(num_gpus * f / step) * step) for f in
                   (1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2)})


def candidate_configs(system: str, scenario: Scenario,
                      encoder_pools: Sequence[int] | None = None,
                      grid: Grid = DEFAULT_GRID) -> list[ParallelConfig]:
    """Every layout the grid search may pick for ``system`` (same grid for all systems where
    the system has the dimension). ``encoder_pools`` restricts the encoder pool sizes of a
    system with a pool (disaggregated; Omni without multiplexing); ``grid.admits`` drops the
    layouts a runtime refuses."""
    _require(system in SYSTEMS, "system", f"one of {SYSTEMS}", system)
    n = scenario.num_gpus
    out = []
    pooled = system == "disaggregated" or (system == "omni"
                                           and "multiplexing" in scenario.omni_off)
    enc_pools = [0]
    if pooled:
        enc_pools = list(encoder_pools) if encoder_pools else encoder_pool_choices(n)
        for pool in enc_pools:
            _require(1 <= pool < n, "encoder_pools", f"sizes in [1, {n})", pool)
    # Megatron-style TP splits attention heads: a TP degree must divide the model's heads
    llm_tps = [t for t in grid.tp if scenario.llm.heads % t == 0]
    enc_tps = [t for t in grid.tp if scenario.encoder.heads % t == 0]
    for pool in enc_pools:
        llm_gpus = n - pool
        for tp in llm_tps:
            for pp in grid.pp:
                if llm_gpus % (tp * pp) or pp > scenario.llm.layers:
                    continue
                dp = llm_gpus // (tp * pp)
                if dp < 1 or dp > scenario.global_batch or \
                        grid.equal_replicas and scenario.global_batch % dp:
                    continue
                for (recompute, enc_recompute), cut in itertools.product(
                        grid.recompute, grid.stage0_fractions if pp > 1 else (1.0,)):
                    if min(_stage_layers(scenario.llm.layers, pp, cut)) < grid.min_stage_layers:
                        continue
                    for v in vpp_choices(scenario, pp, dp, cut, grid):
                        if pooled:
                            for etp in enc_tps:
                                if etp <= pool and pool % etp == 0:
                                    out.append(ParallelConfig(tp, pp, dp, recompute, pool, etp,
                                                              enc_recompute, cut, v))
                        elif system == "megatron":
                            if tp in enc_tps:
                                out.append(ParallelConfig(tp, pp, dp, recompute, 0, tp,
                                                          enc_recompute, cut, v))
                        else:
                            for etp in enc_tps:
                                if tp % etp == 0:
                                    out.append(ParallelConfig(tp, pp, dp, recompute, 0, etp,
                                                              enc_recompute, cut, v))
            if system == "megatron":
                out += _separate_encoder_stage(scenario, grid, tp, n, enc_tps)
    if grid.admits is not None:
        out = [c for c in out if grid.admits(system, c, scenario)]
    return out


def _separate_encoder_stage(scenario: Scenario, grid: Grid, tp: int, n: int,
                            enc_tps: Sequence[int]) -> list[ParallelConfig]:
    """Megatron-like layouts whose first stage runs only the encoder, at a smaller TP than
    the LLM's (Megatron-LM ``encoder_tensor_model_parallel_size``): a replica then takes
    ``encoder_tp + tp * (pp - 1)`` GPUs; GPUs left over idle."""
    out = []
    if 0.0 not in grid.stage0_fractions or grid.min_stage_layers > 0:
        return out
    for pp in grid.pp:
        if pp < 2 or pp > scenario.llm.layers:
            continue
        for etp in enc_tps:
            if etp >= tp or tp % etp:
                continue
            dp = min(n // (etp + tp * (pp - 1)), scenario.global_batch)
            if dp < 1:
                continue
            for recompute, enc_recompute in grid.recompute:
                out.append(ParallelConfig(tp, pp, dp, recompute, 0, etp, enc_recompute, 0.0))
    return out


@dataclass(frozen=True)
class SearchResult:
    best: Prediction
    evaluated: tuple[Prediction, ...]
    screened: int


def static_memory_fits(pricer: StepPricer) -> bool:
    """Weights, gradients and optimizer state alone fit: a cheap first filter of the grid."""
    cfg, cap = pricer.cfg, pricer.scenario.hardware.memory_cap_bytes
    stage0 = pricer.llm_static_bytes(0)
    pooled = pricer.system == "disaggregated" or "multiplexing" in pricer.omni_off
    if pooled:
        pool = (pricer.enc_static_bytes(cfg.encoder_tp, cfg.encoder_gpus // cfg.encoder_tp)
                + pricer.cost.runtime_overhead_bytes)
        if pool > cap:
            return False
    elif pricer.system == "megatron":
        stage0 += pricer.enc_static_bytes(pricer.stage_width(0), cfg.dp)
    else:
        stage0 += pricer.enc_static_bytes(cfg.encoder_tp, cfg.dp * cfg.pp
                                          * (cfg.tp // cfg.encoder_tp))
    return stage0 <= cap and pricer.llm_static_bytes(cfg.pp - 1) <= cap


def rank_peaks(pricer: StepPricer, pr: PricedStep | None = None) -> list[float]:
    """Exact peak bytes of every rank of one replica (``priced.peak_bytes``)."""
    pr = pr or pricer.build()
    return peak_bytes(pr, pricer.data.memory_traces(pr.schedule), pricer.num_mb)


def estimate(pricer: StepPricer) -> tuple[float, float]:
    """(step seconds, worst peak bytes) of one replica without the event simulation.

    Peak memory is exact: it depends only on each rank's program order. Time is the busiest
    rank's work plus a pipeline warm-up term; it only ranks candidates (and replicas) before
    simulating the most promising ones, with the same formula for every system.
    """
    pr = pricer.build()
    return estimate_priced(pricer, pr), max(rank_peaks(pricer, pr))


def estimate_priced(pricer: StepPricer, pr: PricedStep) -> float:
    """The time part of ``estimate`` for an already built replica."""
    return estimate_seconds(pr, pricer.num_mb)


def screen(system: str, data: StepData, cfg: ParallelConfig,
           memory: bool = True) -> tuple[bool, float, float]:
    """(over the cap, estimated seconds, peak bytes) of a layout on one step, from the
    replicas ``StepData.screen_replicas`` picks (heaviest work; with ``memory`` also the one
    with the most encoder tokens)."""
    cap = data.scenario.hardware.memory_cap_bytes
    probe = StepPricer(data, system, cfg)
    if not static_memory_fits(probe):
        return True, math.inf, math.inf
    heavy, full = data.screen_replicas(probe.replica_kind, cfg.dp)
    ests = [estimate(StepPricer(data, system, cfg, r))
            for r in ((heavy, full) if memory and full != heavy else (heavy,))]
    t, mem = max(e[0] for e in ests), max(e[1] for e in ests)
    return mem > cap, t, mem


def search(system: str, scenario: Scenario, cost: CostModel | None = None,
           data: StepData | None = None, top_k: int = 4,
           encoder_pools: Sequence[int] | None = None,
           grid: Grid = DEFAULT_GRID, max_checked: int = 16) -> SearchResult:
    """Grid search on one step: screen all candidates in closed form, then price the most
    promising on every replica (``predict``) until ``top_k`` fit or ``max_checked`` were
    tried; return the fastest that fits (or, if none does, the one with the least memory)."""
    cost = cost or CostModel(scenario.hardware)
    data = data or StepData(scenario, cost)
    scored = []
    for cfg in candidate_configs(system, scenario, encoder_pools, grid):
        over, t, mem = screen(system, data, cfg)
        scored.append((over, t if not over else mem, cfg))
    _require(bool(scored), "scenario", f"at least one layout for {system}", scenario.name)
    scored.sort(key=lambda x: (x[0], x[1], x[2]))
    preds = []
    for _, _, cfg in scored[:max(top_k, max_checked)]:
        preds.append(predict(system, scenario, cfg, cost, data))
        if sum(not p.oom for p in preds) >= top_k or len(preds) >= top_k and preds[-1].oom \
                and scored[len(preds) - 1][0]:
            break
    ok = [p for p in preds if not p.oom]
    best = (min(ok, key=lambda p: (p.step_seconds, p.config)) if ok
            else min(preds, key=lambda p: (max(p.stage_peak_memory_gb), p.config)))
    return SearchResult(best, tuple(preds), len(scored))


def speedup(omni: Prediction, baselines: Sequence[Prediction]) -> float:
    """Omni over the best baseline that fits in memory (inf if none fits)."""
    fitting = [b.tokens_per_s for b in baselines if not b.oom]
    return omni.tokens_per_s / max(fitting) if fitting else math.inf
