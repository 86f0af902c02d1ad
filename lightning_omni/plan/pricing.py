"""Build each system's schedule for one layout and price its actions; predict a step.

- ``megatron``: encoder on pipeline stage 0 with the LLM's TP (``encoder_first_stage``).
- ``disaggregated``: a static pool of encoder GPUs feeds stage 0 (``encoder_disaggregated``).
- ``omni``: grouped reordering across DP replicas, uniform insertion of encoder work over the
  stages, LSSP inside each stage's GPUs (``uniform_insertion`` with stage 0 inline, built as
  the runtime builds it, + ``split_microbatch`` + ``plan_reorder``).

A simulated rank is one pipeline stage's TP group (its GPUs act in lockstep). Every DP replica
is priced on its own microbatches; the step takes as long as the slowest replica and needs the
memory of the fullest one (``predict``).

GPU placement follows Megatron-LM's default rank order (``tp-cp-ep-dp-pp``: TP innermost, PP
outermost), for every system: stage s of replica d starts at GPU ``dp * offset(s) + d *
width(s)``, so a stage's DP group is one contiguous block and stages of one replica sit
``dp * tp`` GPUs apart (in other nodes once that reaches a node). A disaggregated encoder pool
takes the GPUs after the LLM's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import numpy as np

from lightning_omnilab.validate import positive_int

from .costs import BYTES_BF16, CostModel, _require
from .interleaved import build_interleaved, check_interleaving, interleave
from .lssp import WorkItem, split_microbatch
from .priced import PricedStep, estimate_seconds, peak_bytes
from .scenario import SYSTEMS, ParallelConfig, Prediction, Scenario
from .schedule import (
    Action,
    Kind,
    Payload,
    Schedule,
    assign_encoder_samples,
    encoder_disaggregated,
    encoder_first_stage,
    uniform_insertion,
)
from .simulate import SimResult, StepCosts, simulate
from .step_cache import (
    AssignKey,
    EncoderAssignment,
    EncoderSplit,
    LlmTableKey,
    ReplicaKey,
    ScheduleKey,
    SplitKey,
)
from .step_data import StepData


def _chunk_layers(layers: int, pp: int, vpp: int, stage0_fraction: float = 1.0) -> list[int]:
    """LLM layers of every virtual stage ``c * pp + r`` (chunk c of rank r): ``_stage_layers``
    without interleaving; with ``vpp`` chunks per rank, equal chunks (Megatron-LM requires
    the layers to divide evenly over ``pp * vpp`` virtual stages)."""
    if vpp == 1:
        return _stage_layers(layers, pp, stage0_fraction)
    _require(stage0_fraction == 1.0, "config.stage0_layer_fraction",
             f"1.0 with vpp={vpp} (interleaved chunks are equal)", stage0_fraction)
    check_interleaving(pp, pp, vpp, layers)
    return [layers // (pp * vpp)] * (pp * vpp)


def _stage_layers(layers: int, pp: int, stage0_fraction: float = 1.0) -> list[int]:
    """Even split, except that stage 0 may take a fraction of its share (Megatron's uneven
    first stage): it holds the most in-flight activations, and in Megatron-like plans the
    encoder too. The layers it gives up go to the other stages."""
    if pp == 1:
        return [layers]
    first = int(round(layers / pp * stage0_fraction))
    base, extra = divmod(layers - first, pp - 1)
    return [first] + [base + (1 if s >= pp - 1 - extra else 0) for s in range(pp - 1)]


class StepPricer:
    """Builds a system's schedule and the prices of its actions for one config and one DP
    replica (``replica`` indexes the replicas of ``StepData.replicas``)."""

    def __init__(self, data: StepData, system: str, config: ParallelConfig,
                 replica: int = 0) -> None:
        _require(system in SYSTEMS, "system", f"one of {SYSTEMS}", system)
        _require(0 <= replica < config.dp, "replica", f"in [0, dp={config.dp})", replica)
        self.data, self.system, self.cfg, self.replica = data, system, config, replica
        self.scenario, self.cost = data.scenario, data.cost
        # the Omni features switched off for an ablation (none for the other systems)
        self.omni_off = frozenset(self.scenario.omni_off) if system == "omni" else frozenset()
        self.vpp = config.vpp
        # per virtual stage (llm_* tables, LLM actions' ``stage``) and per rank (memory, grads)
        self.chunk_layers = _chunk_layers(self.scenario.llm.layers, config.pp, config.vpp,
                                          config.stage0_layer_fraction)
        self.layers = [sum(self.chunk_layers[s::config.pp]) for s in range(config.pp)]
        self.replica_kind = "omni" if system == "omni" and "reorder" not in self.omni_off \
            else "loader"
        self.mbs = data.replicas(self.replica_kind, config.dp)[replica]
        self.num_mb = len(self.mbs)
        if config.vpp > 1:
            check_interleaving(config.pp, self.num_mb, config.vpp)
        self._key = ReplicaKey(self.replica_kind, config.dp, replica)
        self._widths = [self._width(s) for s in range(config.pp)]
        self._offsets = [sum(self._widths[:s]) for s in range(config.pp)]

    # -- placement ------------------------------------------------------------------------
    def separate_encoder_stage(self) -> bool:
        """Megatron-like with an encoder-only first stage may give it its own TP
        (Megatron-LM's ``encoder_tensor_model_parallel_size`` requires the encoder on its own
        pipeline stage and at most the LLM's TP)."""
        return (self.system == "megatron" and self.cfg.pp > 1 and self.layers[0] == 0
                and self.cfg.encoder_tp != self.cfg.tp)

    def _width(self, stage: int) -> int:
        return self.cfg.encoder_tp if stage == 0 and self.separate_encoder_stage() \
            else self.cfg.tp

    def stage_width(self, stage: int) -> int:
        """GPUs of one stage of one replica."""
        return self._widths[stage]

    def llm_gpus(self) -> int:
        return self.cfg.dp * sum(self._widths)

    def stage_gpu(self, stage: int, replica: int | None = None) -> int:
        """First GPU of ``stage`` of a replica (Megatron order, see the module docstring);
        stage ``pp`` is the disaggregated encoder pool."""
        replica = self.replica if replica is None else replica
        if stage >= self.cfg.pp:
            lanes = max(1, self.cfg.encoder_gpus // self.cfg.encoder_tp)
            return self.llm_gpus() + (replica * lanes // self.cfg.dp) * self.cfg.encoder_tp
        return self.cfg.dp * self._offsets[stage] + replica * self._widths[stage]

    def inside_node(self, stage_a: int, stage_b: int) -> bool:
        g = self.scenario.hardware.gpus_per_node
        return self.stage_gpu(stage_a) // g == self.stage_gpu(stage_b) // g

    def _block_inside_node(self, first_gpu: int, gpus: int) -> bool:
        g = self.scenario.hardware.gpus_per_node
        return first_gpu // g == (first_gpu + max(gpus, 1) - 1) // g

    # -- LLM ------------------------------------------------------------------------------
    def llm_seconds_all(self, stage: int, phase: str) -> np.ndarray:
        """Seconds of every microbatch of this replica on one virtual stage (a pipeline
        stage without interleaving; vectorized, cached)."""
        last = stage == len(self.chunk_layers) - 1
        layers = self.chunk_layers[stage]
        key = LlmTableKey(phase, self._key, layers, last, self.cfg.tp, self.cfg.recompute)

        def make() -> np.ndarray:
            calls, s1, s2 = self.data.llm_moments(*self._key)
            seconds = self.cost.batch_seconds(self.scenario.llm, calls, s1, s2, layers,
                                              self.cfg.tp, phase, self.cfg.recompute)
            if last:
                seconds = seconds + np.array([self.cost.logits_seconds(
                    self.scenario.llm, float(t), self.cfg.tp, phase) for t in s1])
            return seconds

        return self.data.llm_tables.get(key, make)

    def llm_seconds(self, m: int, stage: int, phase: str) -> float:
        return float(self.llm_seconds_all(stage, phase)[m])

    def llm_activation_all(self, stage: int) -> np.ndarray:
        """Activation bytes every microbatch keeps on one virtual stage until its backward.
        Interleaving holds more of them on the first rank (``interleaved.py``: its warm-up
        runs ``2 (pp - 1) + (vpp - 1) pp`` chunks ahead, Korthikanti et al. 2022 sec. 4.2.3
        count ``1 + (pp - 1) / (pp vpp)`` stages' worth); the count comes from the schedule's
        program order, each chunk holding its own layers' bytes."""
        last = stage == len(self.chunk_layers) - 1
        layers = self.chunk_layers[stage]
        key = LlmTableKey("act", self._key, layers, last, self.cfg.tp, self.cfg.recompute)

        def make() -> np.ndarray:
            _, tokens, _ = self.data.llm_moments(*self._key)
            held = self.cost.activation_bytes(self.scenario.llm, tokens, layers,
                                              self.cfg.tp, self.cfg.recompute)
            if last:
                held = held + self.cost.logits_bytes(self.scenario.llm, tokens, self.cfg.tp)
            return np.asarray(held, dtype=np.float64)

        return self.data.llm_tables.get(key, make)

    def llm_activation_bytes(self, m: int, stage: int) -> float:
        return float(self.llm_activation_all(stage)[m])

    def llm_static_bytes(self, stage: int) -> float:
        """Weights, gradients and optimizer state of a stage, the input embedding on the
        first stage and the (untied) output head on the last (both at PP1), plus the
        recompute working set of the largest microbatch when the LLM recomputes."""
        llm = self.scenario.llm
        params = self.layers[stage] * llm.params_per_layer
        head = llm.embedding_params / 2
        if stage == 0:
            params += head
        if stage == self.cfg.pp - 1:
            params += head
        static = (self.cost.param_bytes(params, self.stage_width(stage), self.cfg.dp)
                  + self.cost.runtime_overhead_bytes)
        if self.cfg.recompute and self.layers[stage]:
            _, tokens, _ = self.data.llm_moments(*self._key)
            static += self.cost.recompute_working_bytes(llm, float(tokens.max(initial=0.0)),
                                                        self.cfg.tp)
        return static

    # -- encoder --------------------------------------------------------------------------
    def enc_items(self, indices: Sequence[int], tp: int,
                  batch_tokens: float) -> tuple[list[WorkItem], float]:
        """LSSP work items of these samples' encoder calls, and the backward / forward
        seconds ratio over them (GEMMs 2x, attention 2.5x, plus a recomputed forward)."""
        enc = self.scenario.encoder
        idx = [i for i in indices if self.data.enc_tokens[i] > 0]
        if not idx:
            return [], self.cost.backward_factor
        lens = self.data.enc_tokens[idx]
        fwd, bwd = self.cost.stack_fwd_bwd_each(enc, lens, enc.layers, tp,
                                                self.cfg.encoder_recompute, batch_tokens)
        mem = self.cost.activation_bytes(enc, lens, enc.layers, tp, self.cfg.encoder_recompute)
        a2a = self.ulysses_alltoall_seconds(lens, tp)
        items = list(map(WorkItem, idx, fwd.tolist(), mem.tolist(), a2a.tolist()))
        return items, float(bwd.sum() / fwd.sum())

    def ulysses_alltoall_seconds(self, lens: np.ndarray, tp: int) -> np.ndarray:
        """``WorkItem.alltoall_seconds``: per layer four all-to-alls (Q, K, V in, the output
        back; Jacobs et al. 2023, DeepSpeed-Ulysses) of the call's ``l x hidden / tp`` bf16
        activations, forward only (the backward's mirror is in the backward factor)."""
        enc = self.scenario.encoder
        return enc.layers * 4 * lens * enc.hidden * BYTES_BF16 / tp / \
            self.scenario.hardware.nvlink_bytes_per_s

    def enc_static_bytes(self, tp: int, replicas: int) -> float:
        return self.cost.param_bytes(self.scenario.encoder.total_params, tp, replicas)

    def enc_working_bytes(self, tp: int, indices: Sequence[int]) -> float:
        """Encoder recompute's transient working set: one layer of the largest call."""
        if not self.cfg.encoder_recompute or not len(indices):
            return 0.0
        return self.cost.recompute_working_bytes(
            self.scenario.encoder, float(self.data.enc_tokens[list(indices)].max(initial=0.0)), tp)

    # -- build ----------------------------------------------------------------------------
    def build(self) -> PricedStep:
        if self.system == "omni" and "multiplexing" in self.omni_off:
            return self._disaggregated()
        return {"megatron": self._megatron, "disaggregated": self._disaggregated,
                "omni": self._omni}[self.system]()

    def _interleaved(self, base: Schedule) -> Schedule:
        """``base`` with the config's model chunks per rank (itself when ``vpp == 1``)."""
        return interleave(base, self.cfg.vpp)

    def _grad_seconds(self, parts: Sequence[tuple[float, int, bool]]) -> float:
        """Gradient all-reduces of one rank: (bytes, group size, inside a node) each."""
        return float(sum(self.cost.allreduce_seconds(b, g, inside) for b, g, inside in parts))

    def _stage_grad(self, stage: int, extra_bytes: float = 0.0) -> tuple[float, int, bool]:
        """A stage's DP all-reduce: its weight gradients (layers, and the embedding or the
        output head on the first or last stage) over the ``dp`` replicas, one contiguous
        block of ``dp * width`` GPUs."""
        width = self.stage_width(stage)
        llm = self.scenario.llm
        params = self.layers[stage] * llm.params_per_layer
        params += llm.embedding_params / 2 * ((stage == 0) + (stage == self.cfg.pp - 1))
        nbytes = params * BYTES_BF16 / self.cfg.tp
        first = self.cfg.dp * self._offsets[stage]
        return (nbytes + extra_bytes, self.cfg.dp,
                self._block_inside_node(first, self.cfg.dp * width))

    def _common(self, sched: Schedule, enc_fwd: dict[tuple[int, int], float],
                enc_bwd: dict[tuple[int, int], float], enc_mem: dict[tuple[int, int], float],
                static: list[float], transfer_extra, grad_seconds: list[float],
                exchange_seconds: float = 0.0) -> PricedStep:
        stages = range(len(self.chunk_layers))  # virtual stages
        llm_f = [self.llm_seconds_all(s, "fwd") for s in stages]
        llm_b = [self.llm_seconds_all(s, "bwd") for s in stages]
        act = [self.llm_activation_all(s) for s in stages]
        hidden_bytes = self.scenario.llm.hidden * BYTES_BF16 / self.cfg.tp
        _, mb_tokens, _ = self.data.llm_moments(*self._key)

        def compute(rank: int, a: Action) -> float:
            if a.kind == Kind.LLM_FWD:
                return float(llm_f[a.stage][a.microbatch])
            if a.kind == Kind.LLM_BWD:
                return float(llm_b[a.stage][a.microbatch])
            if a.kind == Kind.ENC_FWD:
                return enc_fwd.get((rank, a.microbatch), 0.0)
            return enc_bwd.get((rank, a.microbatch), 0.0)

        def memory(rank: int, a: Action) -> float:
            if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD):
                b = float(act[a.stage][a.microbatch])
            else:
                b = enc_mem.get((rank, a.microbatch), 0.0)
            return b if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD) else -b

        def transfer(rank: int, a: Action) -> float:
            # interleaving: vpp times the messages, each priced like a plain pipeline's
            if a.payload in (Payload.ACTIVATION, Payload.GRADIENT):
                return self.cost.p2p_seconds(float(mb_tokens[a.microbatch]) * hidden_bytes,
                                             self.inside_node(rank, a.peer))
            return transfer_extra(rank, a)

        def collective(rank: int, a: Action) -> float:
            return exchange_seconds if a.payload == Payload.SAMPLES else grad_seconds[rank]

        costs = StepCosts(compute, transfer, collective, memory, lambda r: static[r],
                          self.scenario.hardware.memory_cap_bytes)
        return PricedStep(sched, costs, llm_f, llm_b, act, enc_fwd, enc_bwd, enc_mem, static,
                       [g + exchange_seconds for g in grad_seconds])

    def _feature_seconds(self, indices: Sequence[int], inside: bool) -> float:
        """Encoder features (or their gradients) of these samples: their LLM tokens x hidden
        bf16, split over the receiving stage's TP ranks."""
        tokens = float(self.data.enc_llm_tokens[list(indices)].sum()) if len(indices) else 0.0
        if tokens <= 0:
            return 0.0
        nbytes = tokens * self.scenario.llm.hidden * BYTES_BF16 / self.cfg.tp
        return self.cost.p2p_seconds(nbytes, inside)

    def _megatron(self) -> PricedStep:
        cfg, enc = self.cfg, self.scenario.encoder
        etp = self.stage_width(0)
        sched = self.data.schedules.get(
            ScheduleKey("encoder_first_stage", cfg.pp, self.num_mb, cfg.vpp),
            lambda: self._interleaved(encoder_first_stage(cfg.pp, self.num_mb, grad_sync=True)))
        enc_fwd, enc_bwd, enc_mem = {}, {}, {}
        for m, mb in enumerate(self.mbs):
            lens = self.data.enc_tokens[mb]
            lens = lens[lens > 0]
            enc_fwd[0, m] = self.cost.stack_seconds(enc, lens, enc.layers, etp, "fwd")
            enc_bwd[0, m] = self.cost.stack_seconds(enc, lens, enc.layers, etp, "bwd",
                                                    cfg.encoder_recompute)
            enc_mem[0, m] = float(self.cost.activation_bytes(
                enc, float(lens.sum()), enc.layers, etp, cfg.encoder_recompute))
        static = [self.llm_static_bytes(s) for s in range(cfg.pp)]
        static[0] += self.enc_static_bytes(etp, cfg.dp) + self.enc_working_bytes(
            etp, [i for mb in self.mbs for i in mb])
        grads = [self._stage_grad(s) for s in range(cfg.pp)]
        b0, g0, in0 = grads[0]
        grads[0] = (b0 + enc.total_params * BYTES_BF16 / etp, g0, in0)
        return self._common(sched, enc_fwd, enc_bwd, enc_mem, static, lambda r, a: 0.0,
                            [self._grad_seconds([g]) for g in grads])

    def _disaggregated(self) -> PricedStep:
        cfg, enc = self.cfg, self.scenario.encoder
        sched = self.data.schedules.get(
            ScheduleKey("encoder_disaggregated", cfg.pp, self.num_mb, cfg.vpp),
            lambda: encoder_disaggregated(cfg.pp, self.num_mb, grad_sync=True) if cfg.vpp == 1
            else build_interleaved("encoder_disaggregated", cfg.pp, self.num_mb, cfg.vpp,
                                   grad_sync=True))
        enc_rank = cfg.pp
        lanes_total = cfg.encoder_gpus // cfg.encoder_tp
        lanes = lanes_total / cfg.dp
        cap = self.scenario.hardware.memory_cap_bytes
        # Omni's ablation without multiplexing keeps LSSP inside the pool's lanes.
        heads = enc.heads // cfg.encoder_tp if self.system == "omni" and \
            "lssp" not in self.omni_off else 1
        enc_fwd, enc_bwd, enc_mem = {}, {}, {}
        width = max(1, int(lanes))
        scale = width / lanes
        for m, mb in enumerate(self.mbs):
            key = SplitKey("pool", self._key, m, -1, 0, cfg.encoder_tp, width, heads,
                           cfg.encoder_recompute, False)
            split = self.data.encoder_splits.get(
                key, partial(self._encoder_split, mb, width, heads, cap, m))
            enc_fwd[enc_rank, m] = split.fwd_seconds * scale
            enc_bwd[enc_rank, m] = split.bwd_seconds * scale
            enc_mem[enc_rank, m] = split.peak_bytes * scale
        static = [self.llm_static_bytes(s) for s in range(cfg.pp)]
        static.append(self.enc_static_bytes(cfg.encoder_tp, lanes_total)
                      + self.cost.runtime_overhead_bytes
                      + self.enc_working_bytes(cfg.encoder_tp, [i for mb in self.mbs
                                                               for i in mb]))

        def transfer(rank: int, a: Action) -> float:
            return self._feature_seconds(self.mbs[a.microbatch],
                                         self.inside_node(cfg.pp, 0))

        grads = [self._grad_seconds([self._stage_grad(s)]) for s in range(cfg.pp)]
        grads.append(self._grad_seconds([(
            enc.total_params * BYTES_BF16 / cfg.encoder_tp, lanes_total,
            self._block_inside_node(self.llm_gpus(), cfg.encoder_gpus))]))
        exchange = self._exchange_seconds() if self.replica_kind == "omni" else 0.0
        if exchange:
            grads = [g + exchange for g in grads]
        return self._common(sched, enc_fwd, enc_bwd, enc_mem, static, transfer, grads)

    def _encoder_split(self, samples: Sequence[int], lanes: int, heads: int, cap: float,
                       microbatch: int) -> EncoderSplit:
        """LSSP split of these samples' encoder work over ``lanes`` encoder replicas."""
        tokens = float(self.data.enc_tokens[list(samples)].sum())
        items, ratio = self.enc_items(samples, self.cfg.encoder_tp, max(tokens / lanes, 1.0))
        split = split_microbatch(items, lanes, heads, cap, microbatch)
        return EncoderSplit(split.makespan, split.makespan * ratio,
                            max(split.peak_memory_bytes, default=0.0))

    def _encoder_assignment(self, uniform: bool) -> EncoderAssignment:
        """Which samples of each microbatch every pipeline rank encodes."""
        pp = self.cfg.pp
        costs = [[float(self.data.enc_unit[i]) for i in mb] for mb in self.mbs]
        if uniform:
            # the runtime's own call (runtime.engine.build_plan): stage 0 runs its share
            # inline, so it keeps its share of the drain microbatches too
            return EncoderAssignment(*assign_encoder_samples(costs, pp, skip_stage0_drain=False))
        # ablation: stage 0 runs all of it (over its encoder lanes)
        samples = [[tuple(i for i, c in enumerate(row) if c > 0)] + [()] * (pp - 1)
                   for row in costs]
        shares = [[1.0 if any(row) else 0.0] + [0.0] * (pp - 1) for row in costs]
        return EncoderAssignment(samples, shares)

    def _exchange_seconds(self) -> float:
        """Grouped reordering's sample all-to-all inside a locality group of replicas."""
        group = min(self.cfg.dp, self.scenario.reorder_group_replicas)
        self.data.replicas("omni", self.cfg.dp)
        return self.cost.exchange_seconds(self.data.exchange_bytes.get(self.cfg.dp, 0.0), group,
                                          inside_node=False)

    def _omni(self) -> PricedStep:
        cfg, enc = self.cfg, self.scenario.encoder
        pp, lanes = cfg.pp, cfg.tp // cfg.encoder_tp
        heads = 1 if "lssp" in self.omni_off else enc.heads // cfg.encoder_tp
        uniform = "uniform_insertion" not in self.omni_off
        cap = self.scenario.hardware.memory_cap_bytes * self.scenario.lssp_memory_fraction
        enc_fwd, enc_bwd, enc_mem = {}, {}, {}
        rank_samples: dict[tuple[int, int], tuple[int, ...]] = {}
        samples, shares = self.data.encoder_assignments.get(
            AssignKey(self._key, pp, uniform), lambda: self._encoder_assignment(uniform))
        for m, mb in enumerate(self.mbs):
            for r, local in enumerate(samples[m]):
                if not local:
                    continue
                assigned = tuple(mb[i] for i in local)
                key = SplitKey("stage", self._key, m, r, pp, cfg.encoder_tp, lanes, heads,
                               cfg.encoder_recompute, uniform)
                enc_fwd[r, m], enc_bwd[r, m], enc_mem[r, m] = self.data.encoder_splits.get(
                    key, partial(self._encoder_split, assigned, lanes, heads, cap, m))
                rank_samples[r, m] = assigned
        exchange_on = cfg.dp > 1 and self.replica_kind == "omni"
        sched = self.data.schedules.get(
            ScheduleKey("uniform_insertion", pp, self.num_mb, cfg.vpp, self._key, uniform,
                        exchange_on),
            lambda: self._interleaved(uniform_insertion(
                pp, self.num_mb, shares, grad_sync=True, sample_exchange=exchange_on,
                samples=samples, inline_stage0=True)))
        replicas = cfg.dp * pp * lanes
        all_samples = [i for mb in self.mbs for i in mb]
        static = [self.llm_static_bytes(s) + self.enc_static_bytes(cfg.encoder_tp, replicas)
                  + self.enc_working_bytes(cfg.encoder_tp, all_samples) for s in range(pp)]

        def transfer(rank: int, a: Action) -> float:
            sender = rank if a.payload == Payload.FEATURES else a.peer
            return self._feature_seconds(rank_samples.get((sender, a.microbatch), ()),
                                         self.inside_node(rank, a.peer))

        # LLM gradients over the stage's DP group; encoder gradients over every encoder
        # replica holding the same TP shard: all dp * pp * lanes of them, across the cluster.
        enc_grad = (enc.total_params * BYTES_BF16 / cfg.encoder_tp, replicas,
                    self._block_inside_node(0, self.llm_gpus()))
        grads = [self._grad_seconds([self._stage_grad(s), enc_grad]) for s in range(pp)]
        exchange = self._exchange_seconds() if exchange_on else 0.0
        return self._common(sched, enc_fwd, enc_bwd, enc_mem, static, transfer, grads,
                            exchange)


class PricedReplica(NamedTuple):
    """One DP replica's prices and what the closed forms make of them."""

    replica: int
    estimate_seconds: float
    peak_bytes: list[float]  # exact, per rank
    priced: PricedStep


class SimulatedReplica(NamedTuple):
    replica: int
    priced: PricedStep
    result: SimResult


def price_replicas(system: str, data: StepData, config: ParallelConfig,
                   replicas: Sequence[int] | None = None) -> list[PricedReplica]:
    """The given (default: all) replicas, priced and estimated."""
    out = []
    for r in range(config.dp) if replicas is None else replicas:
        pricer = StepPricer(data, system, config, r)
        pr = pricer.build()
        out.append(PricedReplica(r, estimate_seconds(pr, pricer.num_mb),
                                 peak_bytes(pr, data.memory_traces(pr.schedule),
                                            pricer.num_mb), pr))
    return out


def predict(system: str, scenario: Scenario, config: ParallelConfig,
            cost: CostModel | None = None, data: StepData | None = None,
            record_timeline: bool = False, simulate_replicas: int | None = 4) -> Prediction:
    """Simulate one step of ``system`` under ``config``: every DP replica is priced; memory is
    the fullest replica's (exact: peak memory depends only on program order), time the
    slowest replica's among the ``simulate_replicas`` with the largest closed-form estimate
    (``None``: simulate all of them)."""
    cost = cost or CostModel(scenario.hardware)
    data = data or StepData(scenario, cost)
    _check_config(system, scenario, config)
    priced = price_replicas(system, data, config)
    order = sorted(priced, key=lambda x: (-x.estimate_seconds, x.replica))
    chosen = order if simulate_replicas is None else order[:max(1, simulate_replicas)]
    sims = [SimulatedReplica(x.replica, x.priced, simulate(
        x.priced.schedule, x.priced.costs, record_timeline=record_timeline)) for x in chosen]
    slowest_r, slowest_pr, slowest = max(
        sims, key=lambda x: (x.result.step_seconds, -x.replica))
    # peak memory per rank over every replica (each replica's own schedule and prices)
    peaks = [max(p.peak_bytes[rank] for p in priced)
             for rank in range(slowest_pr.schedule.num_ranks)]
    cap = scenario.hardware.memory_cap_bytes
    tokens = scenario.global_batch * scenario.seq_len
    step = slowest.step_seconds
    return Prediction(system, scenario.name, config, step, tokens / step if step else 0.0,
                      tuple(p / 1e9 for p in peaks), any(p > cap for p in peaks),
                      slowest.busy_fraction, slowest_pr.schedule, slowest, slowest_r,
                      len(sims), tuple(s.result.step_seconds for s in sorted(
                          sims, key=lambda x: x.replica)))


def _check_config(system: str, scenario: Scenario, cfg: ParallelConfig) -> None:
    _require(system in SYSTEMS, "system", f"one of {SYSTEMS}", system)
    _require(cfg.pp <= scenario.llm.layers, "config.pp", f"<= {scenario.llm.layers} layers",
             cfg.pp)
    _require(cfg.dp <= scenario.global_batch, "config.dp",
             f"<= global_batch={scenario.global_batch}", cfg.dp)
    positive_int("config.vpp", cfg.vpp)
    if cfg.vpp > 1:
        _require(scenario.global_batch % cfg.dp == 0, "config.dp",
                 f"a divisor of global_batch={scenario.global_batch} with vpp={cfg.vpp} "
                 "(every replica's microbatches a multiple of pp)", cfg.dp)
        check_interleaving(cfg.pp, scenario.global_batch // cfg.dp, cfg.vpp,
                           scenario.llm.layers)
        _require(cfg.stage0_layer_fraction == 1.0, "config.stage0_layer_fraction",
                 f"1.0 with vpp={cfg.vpp} (interleaved chunks are equal)",
                 cfg.stage0_layer_fraction)
    pool_system = system == "disaggregated" or (system == "omni"
                                                and "multiplexing" in scenario.omni_off)
    llm_gpus = cfg.tp * cfg.pp * cfg.dp
    if system == "megatron" and cfg.encoder_tp != cfg.tp and cfg.pp > 1 and \
            _stage_layers(scenario.llm.layers, cfg.pp, cfg.stage0_layer_fraction)[0] == 0:
        _require(cfg.tp % cfg.encoder_tp == 0, "config.encoder_tp",
                 f"a divisor of tp={cfg.tp}", cfg.encoder_tp)
        llm_gpus = cfg.dp * (cfg.encoder_tp + cfg.tp * (cfg.pp - 1))
    _require(llm_gpus + cfg.encoder_gpus <= scenario.num_gpus, "config",
             f"at most {scenario.num_gpus} GPUs", str(cfg))
    if pool_system:
        _require(cfg.encoder_gpus >= cfg.encoder_tp, "config.encoder_gpus",
                 f">= encoder_tp={cfg.encoder_tp} for an encoder pool", cfg.encoder_gpus)
    elif system == "omni":
        _require(cfg.tp % cfg.encoder_tp == 0, "config.encoder_tp", f"a divisor of tp={cfg.tp}",
                 cfg.encoder_tp)
