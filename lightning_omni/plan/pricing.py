"""Build each system's schedule for one layout and price its actions; predict a step.

- ``megatron``: encoder on pipeline stage 0 with the LLM's TP (``encoder_first_stage``).
- ``disaggregated``: a static pool of encoder GPUs feeds stage 0 (``encoder_disaggregated``).
- ``omni``: grouped reordering across DP replicas, uniform insertion of encoder work over the
  stages, LSSP inside each stage's GPUs (``uniform_insertion`` + ``split_microbatch`` +
  ``plan_reorder``).

A simulated rank is one pipeline stage's TP group (its GPUs act in lockstep). One DP replica is
simulated: the heaviest one, since the step waits for the slowest replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .costs import BYTES_BF16, CostModel, _require
from .lssp import WorkItem, split_microbatch
from .reorder import Item, plan_reorder
from .scenario import SYSTEMS, ParallelConfig, Prediction, Scenario
from .schedule import (
    Action,
    Kind,
    Payload,
    Schedule,
    encoder_disaggregated,
    encoder_first_stage,
    uniform_insertion,
)
from .simulate import StepCosts, simulate
from .step_data import StepData


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
    collective_seconds: list[float]


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
                grad_bytes: list[float], grad_group: list[int],
                exchange_seconds: float = 0.0) -> _Priced:
        pp = self.cfg.pp
        llm_f = [self.llm_seconds_all(s, "fwd") for s in range(pp)]
        llm_b = [self.llm_seconds_all(s, "bwd") for s in range(pp)]
        act = [self.llm_activation_all(s) for s in range(pp)]
        ratio = self.bwd_ratio
        hidden_bytes = self.sc.llm.hidden * BYTES_BF16 / self.cfg.tp
        _, mb_tokens, _ = self.d.llm_moments(self.replica_kind, self.cfg.dp)
        # a data-parallel group stays inside a node only when all its replicas fit in one
        gpn = self.sc.hardware.gpus_per_node
        replica_gpus = self.cfg.tp * self.cfg.pp
        grad_seconds = [self.cost.allreduce_seconds(
            grad_bytes[r], grad_group[r], inside_node=grad_group[r] * replica_gpus <= gpn)
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
            return exchange_seconds if a.payload == Payload.SAMPLES else grad_seconds[rank]

        costs = StepCosts(compute, transfer, collective, memory, lambda r: static[r],
                          self.sc.hardware.memory_cap_bytes)
        return _Priced(sched, costs, llm_f, llm_b, act, enc_fwd, enc_mem, ratio, static,
                       [g + exchange_seconds for g in grad_seconds])

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
                               lambda: uniform_insertion(pp, self.num_mb, shares, grad_sync=True,
                                                         sample_exchange=cfg.dp > 1))
        replicas = cfg.dp * pp * lanes
        static = [self.llm_static_bytes(s) + self.enc_static_bytes(cfg.encoder_tp, replicas)
                  for s in range(pp)]

        def transfer(rank: int, a: Action) -> float:
            sender = rank if a.payload == Payload.FEATURES else a.peer
            return self._feature_seconds(rank_samples.get((sender, a.microbatch), ()),
                                         self.inside_node(rank, a.peer))

        grad = [self._llm_grad_bytes(s) + enc.total_params * BYTES_BF16 / cfg.encoder_tp
                for s in range(pp)]
        group = min(cfg.dp, self.sc.reorder_group_replicas)
        exchange = self.cost.exchange_seconds(self.d.exchange_bytes.get(cfg.dp, 0.0), group,
                                              inside_node=False)
        return self._common(sched, enc_fwd, enc_mem, static, transfer, grad, [cfg.dp] * pp,
                            exchange)


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
