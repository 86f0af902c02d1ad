"""Run-level prediction: a training run whose data mix moves, and one layout per system.

A user launches a run with one parallel layout (TP, PP, DP, recompute, stage split, encoder
pool) and keeps it while the mix changes from phase to phase and from step to step. So each
system picks ONE layout for the whole run, sized so that the run's worst design step fits in
memory and the phases' typical steps run fast; then many sampled steps of the run are priced
with that layout. Omni's per-step plans (grouped reordering, LSSP, insertion shares) are
recomputed from every step's own samples, as its runtime would; the baselines' plans have no
per-step part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .costs import CostModel, Hardware, TransformerConfig, _require
from .pricing import predict
from .scenario import OMNI_TECHNIQUES, ParallelConfig, Prediction, Scenario
from .search import DEFAULT_GRID, Grid, candidate_configs, screen
from .step_data import StepData
from .workload import Mixture, audio_mixture, image_text_mixture

MIXTURE_KINDS = ("image_text", "audio")


@dataclass(frozen=True)
class Phase:
    """A stretch of a run: the encoder-modality share of samples starts at ``share`` and
    ramps linearly to ``share_end`` (a curriculum; default: stays), and every step's share is
    drawn around that mean with standard deviation ``share_sd`` (clipped to [0, 1])."""

    share: float
    steps: int = 1
    share_end: float | None = None
    share_sd: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        _require(0.0 <= self.share <= 1.0, "share", "a float in [0, 1]", self.share)
        end = self.share if self.share_end is None else self.share_end
        _require(0.0 <= end <= 1.0, "share_end", "a float in [0, 1]", self.share_end)
        _require(self.steps >= 1, "steps", ">= 1", self.steps)
        _require(0.0 <= self.share_sd <= 0.5, "share_sd", "a float in [0, 0.5]", self.share_sd)

    @property
    def end(self) -> float:
        return self.share if self.share_end is None else self.share_end

    def mean_at(self, u: float) -> float:
        """Mean share at fraction ``u`` in [0, 1] of the phase."""
        return self.share + (self.end - self.share) * u


@dataclass(frozen=True)
class Run:
    """A training run: models, cluster, batch shape, and its phases of data mix."""

    name: str
    encoder: TransformerConfig
    llm: TransformerConfig
    hardware: Hardware
    num_gpus: int
    global_batch: int
    seq_len: int
    phases: tuple[Phase, ...]
    kind: str = "image_text"
    long_max: int = 0
    long_share: float = 0.02
    audio_to_text_length: float = 17.6
    seed: int = 0
    reorder_group_replicas: int = 8
    omni_off: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require(len(self.phases) >= 1, "phases", "at least one Phase", self.phases)
        _require(self.kind in MIXTURE_KINDS, "kind", f"one of {MIXTURE_KINDS}", self.kind)
        for t in self.omni_off:
            _require(t in OMNI_TECHNIQUES, "omni_off", f"names from {OMNI_TECHNIQUES}", t)

    def mixture(self, share: float) -> Mixture:
        if self.kind == "audio":
            return audio_mixture(share, self.audio_to_text_length)
        return image_text_mixture(share, long_max=self.long_max, long_share=self.long_share)

    def scenario(self, share: float, seed: int, label: str = "") -> Scenario:
        """One step of the run at this share (its samples drawn with ``seed``)."""
        return Scenario(label or f"{self.name}@{share:.3f}", self.encoder, self.llm,
                        self.hardware, self.num_gpus, self.global_batch, self.seq_len,
                        self.mixture(share), seed=seed,
                        reorder_group_replicas=self.reorder_group_replicas,
                        omni_off=self.omni_off)

    def design_shares(self) -> list[tuple[float, float]]:
        """(share, weight) of the steps a layout is chosen on: the run's worst step for
        encoder memory (the highest mean share plus two standard deviations; weight 0: it
        must fit, its speed does not count), then every phase's middle step, weighted by its
        steps."""
        worst = max(min(1.0, max(p.share, p.end) + 2 * p.share_sd) for p in self.phases)
        return [(worst, 0.0)] + [(p.mean_at(0.5), float(p.steps)) for p in self.phases]

    def typical_share(self) -> float:
        """The step-weighted mean share of the run: the grid screen's time step."""
        total = sum(p.steps for p in self.phases)
        return sum(p.mean_at(0.5) * p.steps for p in self.phases) / total

    def sample_shares(self, steps: int, seed: int) -> list[tuple[int, float]]:
        """(phase, share) of ``steps`` sampled steps: stratified over phases in proportion
        to their steps (at least one each), uniform position inside a phase, then the
        step-to-step variation."""
        _require(steps >= len(self.phases), "steps", f">= {len(self.phases)} (one per phase)",
                 steps)
        weights = np.array([p.steps for p in self.phases], dtype=np.float64)
        counts = _largest_remainder(weights / weights.sum(), steps)
        rng = np.random.default_rng([seed, 7919])
        out = []
        for i, (phase, c) in enumerate(zip(self.phases, counts, strict=True)):
            u = (np.arange(c) + rng.uniform(size=c)) / c
            noise = rng.normal(0.0, phase.share_sd, size=c) if phase.share_sd else np.zeros(c)
            for uj, nj in zip(u, noise, strict=True):
                out.append((i, float(np.clip(phase.mean_at(float(uj)) + nj, 0.0, 1.0))))
        return out


def _largest_remainder(fractions: np.ndarray, total: int) -> list[int]:
    """Integer counts >= 1 summing to ``total`` in proportion to ``fractions``."""
    k = len(fractions)
    raw = fractions * (total - k)
    counts = np.floor(raw).astype(int) + 1
    rest = total - int(counts.sum())
    for i in np.argsort(-(raw - np.floor(raw)), kind="stable")[:rest]:
        counts[i] += 1
    return [int(c) for c in counts]


@dataclass(frozen=True)
class RunSearch:
    """The layout a system launches the run with, and how it did on the design steps."""

    system: str
    config: ParallelConfig
    fits: bool
    design: tuple[Prediction, ...]
    screened: int
    checked: int
    smallest_peak_gb: float

    weights: tuple[float, ...] = ()

    @property
    def design_tokens_per_s(self) -> float:
        return _weighted_tokens_per_s(self.design, self.weights)


@dataclass(frozen=True)
class RunPrediction:
    """A run priced step by step with one layout."""

    system: str
    run: str
    config: ParallelConfig
    step_shares: tuple[float, ...]
    step_seconds: tuple[float, ...]
    step_tokens_per_s: tuple[float, ...]
    step_oom: tuple[bool, ...]
    step_peak_gb: tuple[float, ...]

    @property
    def oom_steps(self) -> int:
        return int(sum(self.step_oom))

    @property
    def oom(self) -> bool:
        """A layout that runs out of memory on any step cannot run the run."""
        return self.oom_steps > 0

    @property
    def tokens_per_s_mean(self) -> float:
        """Run throughput: all sampled steps' tokens over their summed time."""
        total = sum(self.step_seconds)
        tokens = sum(t * s for t, s in zip(self.step_tokens_per_s, self.step_seconds,
                                           strict=True))
        return tokens / total if total else 0.0

    def tokens_per_s_percentile(self, q: float) -> float:
        return float(np.percentile(self.step_tokens_per_s, q))

    @property
    def peak_gb(self) -> float:
        return max(self.step_peak_gb, default=0.0)


@dataclass(frozen=True)
class Design:
    """The steps a run's layout is chosen on: ``steps[0]`` is the worst step (memory),
    ``typical`` the step-weighted mean mix (the closed-form screen's time), and every
    phase's middle step with its weight (the final choice among the best screened)."""

    steps: tuple[StepData, ...]
    weights: tuple[float, ...]
    typical: StepData


def design_steps(run: Run, cost: CostModel) -> Design:
    """StepData of the run's design steps (``Run.design_shares``)."""
    shares = run.design_shares()
    data = tuple(StepData(run.scenario(s, run.seed, f"{run.name}/design@{s:.3f}"), cost)
                 for s, _ in shares)
    t = run.typical_share()
    typical = StepData(run.scenario(t, run.seed, f"{run.name}/typical@{t:.3f}"), cost)
    return Design(data, tuple(w for _, w in shares), typical)


def sampled_steps(run: Run, cost: CostModel, steps: int, seed: int) -> list[StepData]:
    """StepData of ``steps`` sampled steps of the run (``Run.sample_shares``)."""
    out = []
    for i, (_, share) in enumerate(run.sample_shares(steps, seed)):
        step_seed = int(np.random.default_rng([seed, i]).integers(0, 2**31 - 1))
        out.append(StepData(run.scenario(share, step_seed, f"{run.name}/step{i}@{share:.3f}"),
                            cost))
    return out


def _weighted_tokens_per_s(preds: Sequence[Prediction], weights: Sequence[float]) -> float:
    """Tokens per second over steps taken ``weights`` times each (same tokens per step)."""
    time = sum(w * p.step_seconds for p, w in zip(preds, weights, strict=True))
    if time <= 0:
        return 0.0
    tokens = sum(w * p.tokens_per_s * p.step_seconds for p, w in zip(preds, weights,
                                                                    strict=True))
    return tokens / time


def search_run(system: str, run: Run, cost: CostModel | None = None,
               design: Design | None = None, top_k: int = 3,
               encoder_pools: Sequence[int] | None = None, grid: Grid = DEFAULT_GRID,
               max_checked: int = 12) -> RunSearch:
    """One layout for the whole run. Screen the grid in closed form (memory on the worst
    step: over the cap excludes; time on the typical step), then price the most promising on
    every replica of every design step until ``top_k`` fit on all of them or ``max_checked``
    were tried, and keep the one with the best step-weighted throughput. If none fits,
    return the one with the least peak memory, with ``fits=False``."""
    cost = cost or CostModel(run.hardware)
    design = design or design_steps(run, cost)
    steps, weights = design.steps, design.weights
    cands = candidate_configs(system, steps[0].scenario, encoder_pools, grid)
    _require(bool(cands), "run", f"at least one layout for {system} on {run.num_gpus} GPUs",
             run.name)
    scored = []
    for cfg in cands:
        over, _, mem = screen(system, steps[0], cfg, memory=True)
        if over:
            scored.append((True, mem, cfg))
            continue
        _, t, _ = screen(system, design.typical, cfg, memory=False)
        scored.append((False, t, cfg))
    scored.sort(key=lambda x: (x[0], x[1], x[2]))
    checked: list[tuple[ParallelConfig, tuple[Prediction, ...]]] = []
    fitting = 0
    smallest = math.inf
    for over, value, cfg in scored[:max(top_k, max_checked)]:
        if over and math.isinf(value) and checked:
            break
        preds = tuple(predict(system, d.scenario, cfg, cost, d) for d in steps)
        smallest = min(smallest, max(max(p.stage_peak_memory_gb) for p in preds))
        checked.append((cfg, preds))
        fitting += not any(p.oom for p in preds)
        if fitting >= top_k:
            break
    ok = [(c, p) for c, p in checked if not any(x.oom for x in p)]
    if ok:
        cfg, preds = max(ok, key=lambda cp: (_weighted_tokens_per_s(cp[1], weights),
                                             _neg(cp[0])))
    else:
        cfg, preds = min(checked, key=lambda cp: (max(max(x.stage_peak_memory_gb)
                                                      for x in cp[1]), cp[0]))
    return RunSearch(system, cfg, bool(ok), preds, len(scored), len(checked), smallest,
                     tuple(weights))


def _neg(cfg: ParallelConfig) -> tuple:
    """Tie-break toward the smaller layout tuple under ``max``."""
    return tuple(-x if isinstance(x, (int, float)) else 0 for x in (
        cfg.tp, cfg.pp, cfg.dp, cfg.encoder_gpus, cfg.encoder_tp, cfg.stage0_layer_fraction))


def predict_run(system: str, config: ParallelConfig, steps: Sequence[StepData],
                cost: CostModel | None = None, run_name: str = "") -> RunPrediction:
    """Price every sampled step with the same layout (Omni's per-step plans adapt)."""
    preds = [predict(system, d.scenario, config, cost or d.cost, d) for d in steps]
    return RunPrediction(
        system, run_name, config,
        tuple(d.scenario.mixture.share(d.scenario.mixture.sources[0].modality)
              for d in steps),
        tuple(p.step_seconds for p in preds), tuple(p.tokens_per_s for p in preds),
        tuple(p.oom for p in preds), tuple(max(p.stage_peak_memory_gb) for p in preds))
