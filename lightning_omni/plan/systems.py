"""Price one training step of each system on a scenario, and grid-search its parallel layout.

Three systems share one cost model, one workload and one memory limit:

- ``megatron``: encoder on pipeline stage 0 with the LLM's TP (``encoder_first_stage``).
- ``disaggregated``: a static pool of encoder GPUs feeds stage 0 (``encoder_disaggregated``).
- ``omni``: grouped reordering across DP replicas, uniform insertion of encoder work over the
  stages, LSSP inside each stage's GPUs (``uniform_insertion`` + ``plan_lssp`` +
  ``plan_reorder``).

A simulated rank is one pipeline stage's TP group (its GPUs act in lockstep). One DP replica is
simulated: the heaviest one, since the step waits for the slowest replica.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .costs import BYTES_BF16, CostModel, Hardware, SampleMeta, TransformerConfig, _require
from .lssp import WorkItem, split_microbatch
from .reorder import Item, plan_reorder
from .schedule import (
    COMPUTE_KINDS,
    Action,
    Kind,
    Payload,
    Schedule,
    encoder_disaggregated,
    encoder_first_stage,
    uniform_insertion,
)
from .simulate import SimResult, StepCosts, simulate
from .workload import Mixture, draw_samples, pack_sequences

SYSTEMS = ("megatron", "disaggregated", "omni")
SYSTEM_LABELS = {"megatron": "Megatron-like", "disaggregated": "Disaggregated (DistMM-like)",
                 "omni": "Omni"}


@dataclass(frozen=True)
class Scenario:
    """A launch to predict: models, cluster size, batch shape and data mix."""

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

    def __post_init__(self) -> None:
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

    def __str__(self) -> str:
        text = f"TP{self.tp} PP{self.pp} DP{self.dp}" + (" +recompute" if self.recompute else "")
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

    @property
    def stage0_memory_gb(self) -> float:
        return self.stage_peak_memory_gb[0]

    @property
    def bubble_fraction(self) -> tuple[float, ...]:
        return tuple(1.0 - b for b in self.busy_fraction)


# ---- step data -------------------------------------------------------------------------------
class StepData:
    """The sampled step of a scenario and per-sample costs, shared by every system."""

    def __init__(self, scenario: Scenario, cost: CostModel) -> None:
        self.scenario = scenario
        self.cost = cost
        target = scenario.global_batch * scenario.seq_len
        samples: list[SampleMeta] = []
        seqs: list[list[SampleMeta]] = []
        attempt = 0
        while len(seqs) < scenario.global_batch:
            samples = draw_samples(scenario.mixture, int(target * (1.1 + 0.2 * attempt)),
                                   scenario.seed, max_llm_tokens=scenario.seq_len)
            seqs = pack_sequences(samples, scenario.seq_len)
            attempt += 1
        self.sequences = seqs[: scenario.global_batch]
        self.samples = [s for seq in self.sequences for s in seq]
        self.llm_tokens = np.array([s.llm_tokens for s in self.samples], dtype=np.float64)
        self.enc_tokens = np.array([s.encoder_tokens() for s in self.samples], dtype=np.float64)
        self.enc_llm_tokens = np.array(
            [sum(g.llm_tokens for g in s.segments if g.encoder_tokens) for s in self.samples],
            dtype=np.float64)
        self.index = {s.sample_id: i for i, s in enumerate(self.samples)}
        enc, llm = scenario.encoder, scenario.llm
        nominal = 4096.0
        # Whole-model fwd+bwd seconds on one GPU: the balancing cost of a sample.
        self.enc_unit = (cost.stack_seconds_each(enc, self.enc_tokens, enc.layers,
                                                 batch_tokens=nominal)
                         + cost.stack_seconds_each(enc, self.enc_tokens, enc.layers, phase="bwd",
                                                   batch_tokens=nominal))
        self.enc_unit[self.enc_tokens == 0] = 0.0
        self.llm_unit = (cost.stack_seconds_each(llm, self.llm_tokens, llm.layers,
                                                 batch_tokens=nominal)
                         + cost.stack_seconds_each(llm, self.llm_tokens, llm.layers, phase="bwd",
                                                   batch_tokens=nominal))
        self._replicas: dict[tuple[str, int], list[list[list[int]]]] = {}
        self.arrays: dict[tuple, np.ndarray] = {}
        self.schedules: dict[tuple, Schedule] = {}
        self.traces: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.splits: dict[tuple, tuple[float, float]] = {}
        self.spreads: dict[tuple, tuple[tuple[float, ...], tuple[tuple[int, ...], ...]]] = {}

    def memory_traces(self, schedule: Schedule) -> list[tuple[np.ndarray, np.ndarray,
                                                            np.ndarray]]:
        """Per rank compute-action arrays of a schedule built through ``self.schedules``."""
        key = id(schedule)
        if key not in self.traces:
            self.traces[key] = [_memory_trace(prog) for prog in schedule.actions]
        return self.traces[key]

    @cached_property
    def total_llm_tokens(self) -> int:
        return int(self.llm_tokens.sum())

    def microbatches_per_replica(self, dp: int) -> list[int]:
        base, extra = divmod(self.scenario.global_batch, dp)
        return [base + (1 if d < extra else 0) for d in range(dp)]

    def loader_replicas(self, dp: int) -> list[list[list[int]]]:
        """What each replica's own loader yields: contiguous packed sequences (sample indices)."""
        key = ("loader", dp)
        if key not in self._replicas:
            counts = self.microbatches_per_replica(dp)
            out, start = [], 0
            for c in counts:
                out.append([[self.index[s.sample_id] for s in seq]
                            for seq in self.sequences[start:start + c]])
                start += c
            self._replicas[key] = out
        return self._replicas[key]

    def reordered_replicas(self, dp: int) -> list[list[list[int]]]:
        """Grouped reordering over replicas, then first-fit-decreasing packing per replica."""
        key = ("omni", dp)
        if key not in self._replicas:
            loader = self.loader_replicas(dp)
            counts = self.microbatches_per_replica(dp)
            seq_len = self.scenario.seq_len
            local = [[Item(i, float(self.enc_unit[i] + self.llm_unit[i]),
                           float(self.llm_tokens[i])) for seq in rep for i in seq]
                     for rep in loader]
            group = self.scenario.reorder_group_replicas
            plan = plan_reorder(local, [d // group for d in range(dp)],
                                memory_cap=max(counts) * seq_len)
            out = [_pack_ffd(list(a), self.llm_tokens, counts[d], seq_len)
                   for d, a in enumerate(plan.assignment)]
            self._replicas[key] = out
        return self._replicas[key]

    def llm_moments(self, kind: str, dp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per microbatch of the heaviest replica: samples, sum and sum of squares of their
        LLM lengths (document-masked attention is per sample)."""
        key = ("moments", kind, dp)
        if key not in self.arrays:
            mbs = self.heaviest_replica(kind, dp)
            lens = [self.llm_tokens[mb] for mb in mbs]
            self.arrays[key] = np.array([[len(x), x.sum(), (x * x).sum()] for x in lens]).T
        calls, s1, s2 = self.arrays[key]
        return calls, s1, s2

    def heaviest_replica(self, kind: str, dp: int) -> list[list[int]]:
        key = ("heaviest", kind, dp)
        if key not in self._replicas:
            reps = self.reordered_replicas(dp) if kind == "omni" else self.loader_replicas(dp)
            self._replicas[key] = [self.heaviest(reps)]
        return self._replicas[key][0]

    def heaviest(self, replicas: list[list[list[int]]]) -> list[list[int]]:
        loads = [sum(float(self.enc_unit[i] + self.llm_unit[i]) for mb in rep for i in mb)
                 for rep in replicas]
        return replicas[int(np.argmax(loads))]


def _pack_ffd(indices: list[int], tokens: np.ndarray, bins: int, capacity: int) -> list[list[int]]:
    order = sorted(indices, key=lambda i: (-tokens[i], i))
    fill = [0.0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in order:
        fits = [b for b in range(bins) if fill[b] + tokens[i] <= capacity]
        b = fits[0] if fits else min(range(bins), key=lambda x: (fill[x], x))
        out[b].append(i)
        fill[b] += tokens[i]
    return out


# ---- pricing ---------------------------------------------------------------------------------
def _stage_layers(layers: int, pp: int, stage0_fraction: float = 1.0) -> list[int]:
    """Even split, except that stage 0 may take a fraction of its share (Megatron's uneven
    first stage): it holds the most in-flight activations, and in Megatron-like plans the
    encoder too. The layers it gives up go to the other stages."""
    if pp == 1:
        return [layers]
    first = int(round(layers / pp * stage0_fraction))
    base, extra = divmod(layers - first, pp - 1)
    return [first] + [base + (1 if s >= pp - 1 - extra else 0) for s in range(pp - 1)]


@dataclass
class _Priced:
    """A schedule with its prices, plus the tables behind them (for the fast estimate)."""

    schedule: Schedule
    costs: StepCosts
    llm_fwd: list[np.ndarray]
    llm_bwd: list[np.ndarray]
    llm_act: list[np.ndarray]
    enc_fwd: dict[tuple[int, int], float]
    enc_mem: dict[tuple[int, int], float]
    enc_bwd_ratio: float
    static: list[float]
    grad_seconds: list[float]


class StepPricer:
    """Builds a system's schedule and the prices of its actions for one config."""

    def __init__(self, data: StepData, system: str, config: ParallelConfig) -> None:
        _require(system in SYSTEMS, "system", f"one of {SYSTEMS}", system)
        self.d, self.system, self.cfg = data, system, config
        self.sc, self.cost = data.scenario, data.cost
        self.layers = _stage_layers(self.sc.llm.layers, config.pp, config.stage0_layer_fraction)
        self.replica_kind = "omni" if system == "omni" else "loader"
        self.mbs = data.heaviest_replica(self.replica_kind, config.dp)
        self.num_mb = len(self.mbs)

    # -- LLM ------------------------------------------------------------------------------
    def llm_seconds_all(self, stage: int, phase: str) -> np.ndarray:
        """Seconds of every microbatch of this replica on one stage (vectorized, cached)."""
        last = stage == self.cfg.pp - 1
        key = ("llm", self.replica_kind, self.cfg.dp, self.layers[stage], last, phase,
               self.cfg.tp, self.cfg.recompute)
        cached = self.d.arrays.get(key)
        if cached is None:
            calls, s1, s2 = self.d.llm_moments(self.replica_kind, self.cfg.dp)
            cached = self.cost.batch_seconds(self.sc.llm, calls, s1, s2, self.layers[stage],
                                             self.cfg.tp, phase, self.cfg.recompute)
            if last:
                cached = cached + np.array([self.cost.logits_seconds(
                    self.sc.llm, float(t), self.cfg.tp, phase) for t in s1])
            self.d.arrays[key] = cached
        return cached

    def llm_seconds(self, m: int, stage: int, phase: str) -> float:
        return float(self.llm_seconds_all(stage, phase)[m])

    def llm_activation_all(self, stage: int) -> np.ndarray:
        last = stage == self.cfg.pp - 1
        key = ("act", self.replica_kind, self.cfg.dp, self.layers[stage], last, self.cfg.tp,
               self.cfg.recompute)
        cached = self.d.arrays.get(key)
        if cached is None:
            _, tokens, _ = self.d.llm_moments(self.replica_kind, self.cfg.dp)
            cached = self.cost.activation_bytes(self.sc.llm, tokens, self.layers[stage],
                                                self.cfg.tp, self.cfg.recompute)
            if last:
                cached = cached + self.cost.logits_bytes(self.sc.llm, tokens, self.cfg.tp)
            self.d.arrays[key] = np.asarray(cached, dtype=np.float64)
        return cached

    def llm_activation_bytes(self, m: int, stage: int) -> float:
        return float(self.llm_activation_all(stage)[m])

    def llm_static_bytes(self, stage: int) -> float:
        llm = self.sc.llm
        params = self.layers[stage] * llm.params_per_layer
        if stage == 0 or stage == self.cfg.pp - 1:
            params += llm.vocab * llm.hidden
        return (self.cost.param_bytes(params, self.cfg.tp, self.cfg.dp)
                + self.cost.runtime_overhead_bytes)

    def stage_gpu(self, stage: int) -> int:
        return stage * self.cfg.tp

    def inside_node(self, stage_a: int, stage_b: int) -> bool:
        g = self.sc.hardware.gpus_per_node
        return self.stage_gpu(stage_a) // g == self.stage_gpu(stage_b) // g

    # -- encoder --------------------------------------------------------------------------
    def enc_items(self, indices: Sequence[int], tp: int, batch_tokens: float) -> list[WorkItem]:
        enc = self.sc.encoder
        idx = [i for i in indices if self.d.enc_tokens[i] > 0]
        if not idx:
            return []
        lens = self.d.enc_tokens[idx]
        fwd = self.cost.stack_seconds_each(enc, lens, enc.layers, tp, "fwd",
                                           batch_tokens=batch_tokens)
        mem = self.cost.activation_bytes(enc, 1.0, enc.layers, tp,
                                         self.cfg.encoder_recompute) * lens
        a2a = enc.layers * 4 * lens * enc.hidden * BYTES_BF16 / tp / \
            self.sc.hardware.nvlink_bytes_per_s
        return [WorkItem(i, float(f), float(b), float(a))
                for i, f, b, a in zip(idx, fwd, mem, a2a, strict=True)]

    @property
    def bwd_ratio(self) -> float:
        return self.cost.backward_factor + (1.0 if self.cfg.encoder_recompute else 0.0)

    def enc_static_bytes(self, tp: int, replicas: int) -> float:
        return self.cost.param_bytes(self.sc.encoder.total_params, tp, replicas)

    # -- build ----------------------------------------------------------------------------
    def _schedule(self, key: tuple, make) -> Schedule:
        """Schedules are immutable and depend only on their shape: build each shape once."""
        if key not in self.d.schedules:
            self.d.schedules[key] = make()
        return self.d.schedules[key]

    def build(self) -> _Priced:
        return {"megatron": self._megatron, "disaggregated": self._disaggregated,
                "omni": self._omni}[self.system]()

    def _common(self, sched: Schedule, enc_fwd: dict[tuple[int, int], float],
                enc_mem: dict[tuple[int, int], float], static: list[float], transfer_extra,
                grad_bytes: list[float], grad_group: list[int]) -> _Priced:
        pp = self.cfg.pp
        llm_f = [self.llm_seconds_all(s, "fwd") for s in range(pp)]
        llm_b = [self.llm_seconds_all(s, "bwd") for s in range(pp)]
        act = [self.llm_activation_all(s) for s in range(pp)]
        ratio = self.bwd_ratio
        hidden_bytes = self.sc.llm.hidden * BYTES_BF16 / self.cfg.tp
        _, mb_tokens, _ = self.d.llm_moments(self.replica_kind, self.cfg.dp)
        grad_seconds = [self.cost.allreduce_seconds(grad_bytes[r], grad_group[r],
                                                    inside_node=False)
                        for r in range(len(grad_bytes))]

        def compute(rank: int, a: Action) -> float:
            if a.kind == Kind.LLM_FWD:
                return float(llm_f[a.stage][a.microbatch])
            if a.kind == Kind.LLM_BWD:
                return float(llm_b[a.stage][a.microbatch])
            t = enc_fwd.get((rank, a.microbatch), 0.0)
            return t if a.kind == Kind.ENC_FWD else t * ratio

        def memory(rank: int, a: Action) -> float:
            if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD):
                b = float(act[a.stage][a.microbatch])
            else:
                b = enc_mem.get((rank, a.microbatch), 0.0)
            return b if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD) else -b

        def transfer(rank: int, a: Action) -> float:
            if a.payload in (Payload.ACTIVATION, Payload.GRADIENT):
                return self.cost.p2p_seconds(float(mb_tokens[a.microbatch]) * hidden_bytes,
                                             self.inside_node(rank, a.peer))
            return transfer_extra(rank, a)

        def collective(rank: int, a: Action) -> float:
            return grad_seconds[rank]

        costs = StepCosts(compute, transfer, collective, memory, lambda r: static[r],
                          self.sc.hardware.memory_cap_bytes)
        return _Priced(sched, costs, llm_f, llm_b, act, enc_fwd, enc_mem, ratio, static,
                       grad_seconds)

    def _feature_seconds(self, indices: Sequence[int], inside: bool) -> float:
        tokens = float(self.d.enc_llm_tokens[list(indices)].sum()) if indices else 0.0
        return self.cost.p2p_seconds(tokens * self.sc.llm.hidden * BYTES_BF16 / self.cfg.tp,
                                     inside)

    def _llm_grad_bytes(self, stage: int) -> float:
        return self.layers[stage] * self.sc.llm.params_per_layer * BYTES_BF16 / self.cfg.tp

    def _megatron(self) -> _Priced:
        cfg, enc = self.cfg, self.sc.encoder
        sched = self._schedule(("encoder_first_stage", cfg.pp, self.num_mb),
                               lambda: encoder_first_stage(cfg.pp, self.num_mb, grad_sync=True))
        enc_fwd, enc_mem = {}, {}
        for m, mb in enumerate(self.mbs):
            lens = self.d.enc_tokens[mb]
            lens = lens[lens > 0]
            enc_fwd[0, m] = self.cost.stack_seconds(enc, lens, enc.layers, cfg.tp, "fwd")
            enc_mem[0, m] = self.cost.activation_bytes(enc, float(lens.sum()), enc.layers, cfg.tp,
                                                       cfg.encoder_recompute)
        static = [self.llm_static_bytes(s) for s in range(cfg.pp)]
        static[0] += self.enc_static_bytes(cfg.tp, cfg.dp)
        grad = [self._llm_grad_bytes(s) for s in range(cfg.pp)]
        grad[0] += enc.total_params * BYTES_BF16 / cfg.tp
        return self._common(sched, enc_fwd, enc_mem, static, lambda r, a: 0.0, grad,
                            [cfg.dp] * cfg.pp)

    def _disaggregated(self) -> _Priced:
        cfg, enc = self.cfg, self.sc.encoder
        sched = self._schedule(("encoder_disaggregated", cfg.pp, self.num_mb),
                               lambda: encoder_disaggregated(cfg.pp, self.num_mb, grad_sync=True))
        enc_rank = cfg.pp
        lanes_total = cfg.encoder_gpus // cfg.encoder_tp
        lanes = lanes_total / cfg.dp
        cap = self.sc.hardware.memory_cap_bytes
        enc_fwd, enc_mem = {}, {}
        width = max(1, int(lanes))
        scale = width / lanes
        for m, mb in enumerate(self.mbs):
            key = ("disagg", cfg.dp, m, cfg.encoder_tp, width, cfg.encoder_recompute)
            if key not in self.d.splits:
                tokens = float(self.d.enc_tokens[mb].sum())
                items = self.enc_items(mb, cfg.encoder_tp, max(tokens / width, 1.0))
                split = split_microbatch(items, width, 1, cap, m)
                self.d.splits[key] = (split.makespan, max(split.peak_memory_bytes, default=0.0))
            t, b = self.d.splits[key]
            enc_fwd[enc_rank, m] = t * scale
            enc_mem[enc_rank, m] = b * scale
        static = [self.llm_static_bytes(s) for s in range(cfg.pp)]
        static.append(self.enc_static_bytes(cfg.encoder_tp, lanes_total)
                      + self.cost.runtime_overhead_bytes)

        def transfer(rank: int, a: Action) -> float:
            return self._feature_seconds(self.mbs[a.microbatch], inside=False)

        grad = [self._llm_grad_bytes(s) for s in range(cfg.pp)]
        grad.append(enc.total_params * BYTES_BF16 / cfg.encoder_tp)
        group = [cfg.dp] * cfg.pp + [lanes_total]
        return self._common(sched, enc_fwd, enc_mem, static, transfer, grad, group)

    def _omni(self) -> _Priced:
        cfg, enc = self.cfg, self.sc.encoder
        pp, lanes = cfg.pp, cfg.tp // cfg.encoder_tp
        heads = enc.heads // cfg.encoder_tp
        cap = self.sc.hardware.memory_cap_bytes * self.sc.lssp_memory_fraction
        shares, enc_fwd, enc_mem = [], {}, {}
        rank_samples: dict[tuple[int, int], tuple[int, ...]] = {}
        for m, mb in enumerate(self.mbs):
            with_enc = [i for i in mb if self.d.enc_tokens[i] > 0]
            if not with_enc:
                shares.append([1.0 / pp] * pp)
                continue
            spread_key = ("spread", cfg.dp, pp, m)
            if spread_key not in self.d.spreads:
                # the drain's microbatches skip stage 0 (see schedule.default_shares)
                skip0 = pp > 1 and m >= self.num_mb - pp
                items = [Item(i, float(self.d.enc_unit[i])) for i in with_enc]
                local = [[], items] if skip0 else [items, []]
                local += [[] for _ in range(pp - 2)]
                groups = [1] + [0] * (pp - 1) if skip0 else [0] * pp
                spread = plan_reorder(local[:pp], groups[:pp])
                self.d.spreads[spread_key] = (spread.load_after, spread.assignment)
            load_after, assignment = self.d.spreads[spread_key]
            total = sum(load_after)
            shares.append([x / total for x in load_after])
            for r, assigned in enumerate(assignment):
                if not assigned:
                    continue
                key = ("omni", cfg.dp, pp, m, r, cfg.encoder_tp, lanes, cfg.encoder_recompute)
                if key not in self.d.splits:
                    tokens = float(self.d.enc_tokens[list(assigned)].sum())
                    items = self.enc_items(assigned, cfg.encoder_tp, max(tokens / lanes, 1.0))
                    split = split_microbatch(items, lanes, heads, cap, m)
                    self.d.splits[key] = (split.makespan, max(split.peak_memory_bytes))
                enc_fwd[r, m], enc_mem[r, m] = self.d.splits[key]
                rank_samples[r, m] = assigned
        # shares depend only on (dp, pp): every layout with them shares one schedule
        sched = self._schedule(("uniform_insertion", cfg.dp, pp),
                               lambda: uniform_insertion(pp, self.num_mb, shares, grad_sync=True))
        replicas = cfg.dp * pp * lanes
        static = [self.llm_static_bytes(s) + self.enc_static_bytes(cfg.encoder_tp, replicas)
                  for s in range(pp)]

        def transfer(rank: int, a: Action) -> float:
            sender = rank if a.payload == Payload.FEATURES else a.peer
            return self._feature_seconds(rank_samples.get((sender, a.microbatch), ()),
                                         self.inside_node(rank, a.peer))

        grad = [self._llm_grad_bytes(s) + enc.total_params * BYTES_BF16 / cfg.encoder_tp
                for s in range(pp)]
        return self._common(sched, enc_fwd, enc_mem, static, transfer, grad, [cfg.dp] * pp)


def predict(system: str, scenario: Scenario, config: ParallelConfig,
            cost: CostModel | None = None, data: StepData | None = None,
            record_timeline: bool = False) -> Prediction:
    """Simulate one step of ``system`` under ``config``."""
    cost = cost or CostModel(scenario.hardware)
    data = data or StepData(scenario, cost)
    _check_config(system, scenario, config)
    priced = StepPricer(data, system, config).build()
    sim = simulate(priced.schedule, priced.costs, record_timeline=record_timeline)
    tokens = scenario.global_batch * scenario.seq_len
    peaks = tuple(p / 1e9 for p in sim.peak_memory_bytes)
    return Prediction(system, scenario.name, config, sim.step_seconds,
                      tokens / sim.step_seconds if sim.step_seconds else 0.0, peaks,
                      any(sim.oom), sim.busy_fraction, priced.schedule, sim)


def _check_config(system: str, scenario: Scenario, cfg: ParallelConfig) -> None:
    _require(system in SYSTEMS, "system", f"one of {SYSTEMS}", system)
    llm_gpus = cfg.tp * cfg.pp * cfg.dp
    _require(llm_gpus + cfg.encoder_gpus <= scenario.num_gpus, "config",
             f"at most {scenario.num_gpus} GPUs", str(cfg))
    _require(cfg.pp <= scenario.llm.layers, "config.pp", f"<= {scenario.llm.layers} layers",
             cfg.pp)
    _require(cfg.dp <= scenario.global_batch, "config.dp",
             f"<= global_batch={scenario.global_batch}", cfg.dp)
    if system == "disaggregated":
        _require(cfg.encoder_gpus >= cfg.encoder_tp, "config.encoder_gpus",
                 f">= encoder_tp={cfg.encoder_tp} for the disaggregated system", cfg.encoder_gpus)
    if system == "omni":
        _require(cfg.tp % cfg.encoder_tp == 0, "config.encoder_tp", f"a divisor of tp={cfg.tp}",
                 cfg.encoder_tp)


# ---- grid search -----------------------------------------------------------------------------
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
        busy = enc_f.sum() * (1.0 + pr.enc_bwd_ratio) + pr.grad_seconds[rank]
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


def _memory_trace(prog: Sequence[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute actions of one program as arrays: is-LLM, microbatch, +1 forward / -1 backward."""
    rows = [(a.kind in (Kind.LLM_FWD, Kind.LLM_BWD), a.microbatch,
             1.0 if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD) else -1.0)
            for a in prog if a.kind in COMPUTE_KINDS]
    if not rows:
        return np.zeros(0, bool), np.zeros(0, int), np.zeros(0)
    arr = np.array(rows, dtype=np.float64)
    return arr[:, 0].astype(bool), arr[:, 1].astype(int), arr[:, 2]


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
