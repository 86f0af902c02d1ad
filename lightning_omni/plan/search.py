"""Grid search of parallel layouts: the same grid and memory limit for every system.

Candidates whose weights alone do not fit are dropped, the rest are ranked by a closed-form
estimate (exact program-order peak memory; busiest rank's work plus a warm-up term) and the
most promising are simulated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .costs import CostModel, _require
from .pricing import StepPricer, predict
from .scenario import SYSTEMS, ParallelConfig, Prediction, Scenario
from .step_data import StepData


@dataclass(frozen=True)
class Grid:
    """The layout dimensions a search may choose from."""

    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16)
    recompute: tuple[tuple[bool, bool], ...] = ((False, False), (False, True), (True, True))
    stage0_fractions: tuple[float, ...] = (1.0, 0.5, 0.0)  # of an even LLM layer split


DEFAULT_GRID = Grid()
# A conventionally configured pipeline: no uneven first stage, all-or-nothing recompute.
CONVENTIONAL_PIPELINE_GRID = Grid(pp=(2, 4, 8, 16), recompute=((False, False), (True, True)),
                                  stage0_fractions=(1.0,))


def encoder_pool_choices(num_gpus: int) -> list[int]:
    """Encoder pool sizes the disaggregated system may take (1/16 .. 1/2 of the GPUs)."""
    step = max(1, num_gpus // 16)
    return sorted({max(1, round(num_gpus * f / step) * step) for f in
                   (1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2)})


def candidate_configs(system: str, scenario: Scenario,
                      encoder_pools: Sequence[int] | None = None,
                      grid: Grid = DEFAULT_GRID) -> list[ParallelConfig]:
    """Every layout the grid search may pick for ``system`` (same grid for all systems where
    the system has the dimension). ``encoder_pools`` restricts the disaggregated pool sizes."""
    _require(system in SYSTEMS, "system", f"one of {SYSTEMS}", system)
    n = scenario.num_gpus
    out = []
    enc_pools = [0]
    if system == "disaggregated":
        enc_pools = list(encoder_pools) if encoder_pools else encoder_pool_choices(n)
        for pool in enc_pools:
            _require(1 <= pool < n, "encoder_pools", f"sizes in [1, {n})", pool)
    for pool in enc_pools:
        llm_gpus = n - pool
        for tp in grid.tp:
            for pp in grid.pp:
                if llm_gpus % (tp * pp) or pp > scenario.llm.layers:
                    continue
                dp = llm_gpus // (tp * pp)
                if dp < 1 or dp > scenario.global_batch:
                    continue
                for (recompute, enc_recompute), cut in itertools.product(
                        grid.recompute, grid.stage0_fractions if pp > 1 else (1.0,)):
                    if system == "megatron":
                        out.append(ParallelConfig(tp, pp, dp, recompute, 0, tp, enc_recompute,
                                                  cut))
                    elif system == "disaggregated":
                        for etp in grid.tp:
                            if etp <= pool and pool % etp == 0:
                                out.append(ParallelConfig(tp, pp, dp, recompute, pool, etp,
                                                          enc_recompute, cut))
                    else:
                        for etp in grid.tp:
                            if tp % etp == 0:
                                out.append(ParallelConfig(tp, pp, dp, recompute, 0, etp,
                                                          enc_recompute, cut))
    return out


@dataclass(frozen=True)
class SearchResult:
    best: Prediction
    evaluated: tuple[Prediction, ...]
    screened: int


def static_memory_fits(pricer: StepPricer) -> bool:
    """Weights, gradients and optimizer state alone fit: a cheap first filter of the grid."""
    cfg, cap = pricer.cfg, pricer.sc.hardware.memory_cap_bytes
    stage0 = pricer.llm_static_bytes(0)
    if pricer.system == "megatron":
        stage0 += pricer.enc_static_bytes(cfg.tp, cfg.dp)
    elif pricer.system == "omni":
        stage0 += pricer.enc_static_bytes(cfg.encoder_tp, cfg.dp * cfg.pp
                                          * (cfg.tp // cfg.encoder_tp))
    else:
        pool = (pricer.enc_static_bytes(cfg.encoder_tp, cfg.encoder_gpus // cfg.encoder_tp)
                + pricer.cost.runtime_overhead_bytes)
        if pool > cap:
            return False
    return stage0 <= cap and pricer.llm_static_bytes(cfg.pp - 1) <= cap


def estimate(pricer: StepPricer) -> tuple[float, float]:
    """(step seconds, worst peak bytes) without the event simulation.

    Peak memory is exact: it depends only on each rank's program order. Time is the busiest
    rank's work plus a pipeline warm-up term; it only ranks candidates before simulating the
    most promising ones, with the same formula for every system.
    """
    pr = pricer.build()
    sched = pr.schedule
    traces = pricer.d.memory_traces(sched)
    n = pricer.num_mb
    enc_f_all: dict[int, np.ndarray] = {}
    enc_b_all: dict[int, np.ndarray] = {}
    for (r, m), t in pr.enc_fwd.items():
        enc_f_all.setdefault(r, np.zeros(n))[m] = t
    for (r, m), b in pr.enc_mem.items():
        enc_b_all.setdefault(r, np.zeros(n))[m] = b
    zeros = np.zeros(n)
    work, peak = [], []
    for rank in range(sched.num_ranks):
        stage = sched.stage_of(rank)
        enc_f = enc_f_all.get(rank, zeros)
        enc_b = enc_b_all.get(rank, zeros)
        busy = enc_f.sum() * (1.0 + pr.enc_bwd_ratio) + pr.collective_seconds[rank]
        if stage >= 0:
            busy += pr.llm_fwd[stage].sum() + pr.llm_bwd[stage].sum()
        work.append(float(busy))
        is_llm, mbs, signs = traces[rank]
        if mbs.size:
            act = pr.llm_act[stage] if stage >= 0 else np.zeros(n)
            deltas = np.where(is_llm, act[mbs], enc_b[mbs]) * signs
            peak.append(pr.static[rank] + max(0.0, float(np.cumsum(deltas).max())))
        else:
            peak.append(pr.static[rank])
    slowest = max(work)
    warm = (sched.num_stages - 1) * slowest / max(n, 1)
    return slowest + warm, max(peak)


def search(system: str, scenario: Scenario, cost: CostModel | None = None,
           data: StepData | None = None, top_k: int = 4,
           encoder_pools: Sequence[int] | None = None,
           grid: Grid = DEFAULT_GRID) -> SearchResult:
    """Grid search: screen all candidates in closed form, simulate the ``top_k`` that fit in
    memory (or, if none fits, the ``top_k`` smallest), return the fastest non-OOM one."""
    cost = cost or CostModel(scenario.hardware)
    data = data or StepData(scenario, cost)
    cap = scenario.hardware.memory_cap_bytes
    scored = []
    for cfg in candidate_configs(system, scenario, encoder_pools, grid):
        pricer = StepPricer(data, system, cfg)
        if not static_memory_fits(pricer):
            scored.append((True, math.inf, cfg))
            continue
        est_t, est_mem = estimate(pricer)
        scored.append((est_mem > cap, est_t if est_mem <= cap else est_mem, cfg))
    _require(bool(scored), "scenario", f"at least one layout for {system}", scenario.name)
    scored.sort(key=lambda x: (x[0], x[1], x[2]))
    chosen = [cfg for _, _, cfg in scored[:top_k]]
    preds = [predict(system, scenario, cfg, cost, data) for cfg in chosen]
    ok = [p for p in preds if not p.oom]
    pool = ok or preds
    best = (min(pool, key=lambda p: (p.step_seconds, p.config)) if ok
            else min(pool, key=lambda p: (max(p.stage_peak_memory_gb), p.config)))
    return SearchResult(best, tuple(preds), len(scored))


def speedup(omni: Prediction, baselines: Sequence[Prediction]) -> float:
    """Omni over the best baseline that fits in memory (inf if none fits)."""
    fitting = [b.tokens_per_s for b in baselines if not b.oom]
    return omni.tokens_per_s / max(fitting) if fitting else math.inf
