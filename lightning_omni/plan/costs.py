"""Cost and memory model shared by every planner and by the simulator.

Costs are analytic (FLOPs of a transformer layer, ``a*l + b*l^2`` per sample, divided by an
efficiency curve) until a measured profile is loaded; then the fitted per-layer curve replaces the
analytic one for that model and phase. Everything here is plain data and pure arithmetic so that
every rank computes identical numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lightning_omnilab.validate import positive_int
from lightning_omnilab.validate import require as _require  # the plan modules' general check

BYTES_BF16 = 2
TEXT = "text"
IMAGE = "image"
AUDIO = "audio"
MODALITIES = (TEXT, IMAGE, AUDIO)


@dataclass(frozen=True, slots=True)
class Segment:
    """One modality span of a sample: encoder input length and the LLM tokens it becomes."""

    modality: str
    encoder_tokens: int
    llm_tokens: int

    def __post_init__(self) -> None:
        _require(self.modality in MODALITIES, "modality", f"one of {MODALITIES}", self.modality)
        _require(self.encoder_tokens >= 0, "encoder_tokens", ">= 0", self.encoder_tokens)
        _require(self.llm_tokens >= 0, "llm_tokens", ">= 0", self.llm_tokens)
        if self.modality == TEXT:
            _require(self.encoder_tokens == 0, "encoder_tokens", "0 for text", self.encoder_tokens)


@dataclass(frozen=True, slots=True)
class SampleMeta:
    """What a loader knows about a sample before loading its pixels: enough to plan on."""

    sample_id: int
    segments: tuple[Segment, ...]

    @property
    def llm_tokens(self) -> int:
        return sum(s.llm_tokens for s in self.segments)

    def encoder_tokens(self, modality: str | None = None) -> int:
        return sum(
            s.encoder_tokens for s in self.segments if modality is None or s.modality == modality
        )

    def encoder_lengths(self, modality: str) -> tuple[int, ...]:
        """Lengths of each encoder call (one per segment) for one modality."""
        return tuple(
            s.encoder_tokens for s in self.segments if s.modality == modality and s.encoder_tokens
        )


@dataclass(frozen=True, slots=True)
class TransformerConfig:
    """Shape of a transformer stack; enough for FLOPs, parameters and activation bytes."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    kv_heads: int = 0
    vocab: int = 0
    gated_mlp: bool = False
    causal: bool = True

    def __post_init__(self) -> None:
        for attr in ("layers", "hidden", "heads", "ffn_hidden"):
            positive_int(attr, getattr(self, attr))
        _require(self.hidden % self.heads == 0, "hidden", f"divisible by heads={self.heads}",
                 self.hidden)

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def params_per_layer(self) -> int:
        head_dim = self.hidden // self.heads
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.num_kv_heads * head_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn_hidden
        return attn + mlp

    @property
    def embedding_params(self) -> int:
        return 2 * self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params

    @property
    def linear_flops_per_token(self) -> float:
        """The ``a`` of ``a*l + b*l^2``: forward FLOPs per token per layer from the GEMMs."""
        return 2.0 * self.params_per_layer

    @property
    def attention_flops_per_token_sq(self) -> float:
        """The ``b`` of ``a*l + b*l^2``: QK^T and AV (2*l*l*hidden FLOPs each), halved when
        causal (a causal kernel skips the masked half)."""
        return (2.0 if self.causal else 4.0) * self.hidden

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * (self.hidden // self.heads)

    @property
    def activation_bytes_per_token_layer(self) -> float:
        """Bytes one layer keeps for backward per token, bf16, flash attention (no l^2 term).

        Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
        Models", sec. 4.1) count 34*h for a GPT layer: attention 11h (QKV input 2h, Q and K
        4h, V 2h, output-projection input 2h, dropout mask h), MLP 19h (2h input, 8h GeLU
        input, 8h second-GEMM input, h mask), layer norms 4h. Written for any width: K and V
        are ``kv_dim`` wide (GQA), the MLP keeps 2*ffn bytes per stored tensor and a gated MLP
        stores one more (gate and up both feed the product)."""
        return self.saved_bytes_per_token_layer(BYTES_BF16, 1.0)

    def saved_bytes_per_token_layer(self, value_bytes: float, mask_bytes: float) -> float:
        """``activation_bytes_per_token_layer`` for activations of ``value_bytes`` each (2:
        bf16, 4: float32) and dropout masks of ``mask_bytes`` per element (0: no dropout)."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn_hidden
        attention = h + h + kv + kv + h  # QKV input, Q, K, V, output-projection input
        mlp = h + (3 if self.gated_mlp else 2) * f  # input, GeLU input, second-GEMM input
        norms = 2 * h
        return float(value_bytes * (attention + mlp + norms) + mask_bytes * 2 * h)

    def replicated_bytes_per_token_layer(self, value_bytes: float, mask_bytes: float) -> float:
        """The part of ``saved_bytes_per_token_layer`` that tensor parallelism without
        sequence parallelism keeps whole on every TP rank (Korthikanti et al. 2022, sec. 4.2.2:
        the 10*h of 34*h): the two norms' inputs, the QKV and first MLP GEMMs' inputs and the
        two dropout masks. The rest (Q, K, V, the output projection's input, the MLP's ffn-wide
        tensors) is split over TP either way."""
        h = self.hidden
        return float(value_bytes * (2 * h + h + h) + mask_bytes * 2 * h)


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator type and its interconnect; bandwidths are per GPU, one direction."""

    name: str
    peak_flops: float
    hbm_bytes: float
    nvlink_bytes_per_s: float
    ib_bytes_per_s: float
    gpus_per_node: int = 8
    max_efficiency: float = 0.6
    half_efficiency_tokens: float = 384.0
    nvlink_latency_s: float = 2e-6
    ib_latency_s: float = 10e-6
    usable_memory_fraction: float = 0.92

    @property
    def memory_cap_bytes(self) -> float:
        return self.hbm_bytes * self.usable_memory_fraction

    def efficiency(self, tokens: np.ndarray | float) -> np.ndarray | float:
        """Saturating GEMM efficiency: short calls leave the GPU underused."""
        tokens = np.asarray(tokens, dtype=np.float64)
        return self.max_efficiency * tokens / (tokens + self.half_efficiency_tokens)


@dataclass(frozen=True, slots=True)
class FittedCurve:
    """Measured seconds per layer for one call of ``l`` tokens: ``c + a*l + b*l^2``."""

    a: float
    b: float
    c: float = 0.0

    def seconds(self, lengths: np.ndarray) -> np.ndarray:
        lengths = np.asarray(lengths, dtype=np.float64)
        return self.c + self.a * lengths + self.b * lengths * lengths


def fit_curve(lengths: Sequence[float], seconds: Sequence[float]) -> FittedCurve:
    """Least-squares fit of ``c + a*l + b*l^2`` to measured (length, seconds) pairs."""
    x = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    _require(x.ndim == 1 and x.size >= 3, "lengths", "a 1-D sequence of >= 3 values", x.shape)
    _require(y.shape == x.shape, "seconds", f"shape {x.shape} like lengths", y.shape)
    _require(bool(np.all(x > 0)), "lengths", "all > 0", x.min())
    design = np.stack([x, x * x, np.ones_like(x)], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(design, y, rcond=None)
    return FittedCurve(a=float(a), b=float(b), c=float(c))


def load_profile(path: str | Path) -> dict[tuple[str, str], FittedCurve]:
    """Fit curves from a JSON profile of per-action timings.

    Format: ``{"records": [{"model": str, "phase": "fwd"|"bwd", "tokens": int,
    "seconds": float}, ...]}`` where seconds is the time of one layer on one call of ``tokens``.
    """
    data = json.loads(Path(path).read_text())
    _require(isinstance(data, dict) and "records" in data, "profile", "an object with 'records'",
             type(data).__name__)
    grouped: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for i, rec in enumerate(data["records"]):
        for key in ("model", "phase", "tokens", "seconds"):
            _require(key in rec, f"records[{i}]", f"a '{key}' field", sorted(rec))
        _require(rec["phase"] in ("fwd", "bwd"), f"records[{i}].phase", "'fwd' or 'bwd'",
                 rec["phase"])
        grouped.setdefault((rec["model"], rec["phase"]), []).append(
            (float(rec["tokens"]), float(rec["seconds"])))
    return {key: fit_curve([p[0] for p in pts], [p[1] for p in pts])
            for key, pts in grouped.items()}


@dataclass(frozen=True)
class CostModel:
    """Seconds and bytes of layers, calls and messages on one hardware type."""

    hardware: Hardware
    fitted: Mapping[tuple[str, str], FittedCurve] = field(default_factory=dict)
    # Backward over forward FLOPs. GEMMs: 2x (input and weight gradients; Narayanan et al.
    # 2021, sec. 5.1). Attention core: 2.5x (five l^2 GEMMs against the forward's two;
    # Dao 2023, FlashAttention-2, sec. 4.1 counts backward FLOPs as 2.5x forward).
    backward_factor: float = 2.0
    attention_backward_factor: float = 2.5
    optimizer_bytes_per_param: float = 12.0
    weight_grad_bytes_per_param: float = 6.0
    runtime_overhead_bytes: float = 3e9
    # stored activations: bf16 values and one-byte dropout masks (a float32 run without
    # dropout: 4.0 and 0.0)
    activation_value_bytes: float = BYTES_BF16
    dropout_mask_bytes: float = 1.0
    # Megatron-LM's sequence parallelism with TP: every stored activation split over TP.
    # False: plain TP (OmniStrategy's, which refuses SequenceParallel styles), whose norms
    # and GEMM inputs are whole on every TP rank (``replicated_bytes_per_token_layer``).
    sequence_parallel: bool = True

    # ---- compute -------------------------------------------------------------------------
    def layer_seconds_each(self, model: TransformerConfig, lengths: Iterable[int] | np.ndarray,
                           tp: int = 1, phase: str = "fwd",
                           batch_tokens: float | None = None) -> np.ndarray:
        """Seconds of one layer for each call of the given lengths.

        ``batch_tokens`` is the token count of the batch the calls run in together: GEMM
        efficiency follows it (default: each call alone).
        """
        _require(phase in ("fwd", "bwd"), "phase", "'fwd' or 'bwd'", phase)
        _require(tp >= 1, "tp", ">= 1", tp)
        lens = _as_lengths(lengths)
        curve = self.fitted.get((model.name, phase))
        if curve is not None:
            return curve.seconds(lens) / tp
        flops = self._flops(model, lens, lens * lens, phase)
        tokens = lens if batch_tokens is None else np.full_like(lens, float(batch_tokens))
        # Each GPU of a TP group sees the full token count but 1/tp of every GEMM's width.
        eff = self.hardware.efficiency(np.maximum(tokens, 1.0) / max(1.0, np.sqrt(tp)))
        return flops / (tp * self.hardware.peak_flops * eff)

    def _flops(self, model: TransformerConfig, s1: np.ndarray, s2: np.ndarray,
               phase: str) -> np.ndarray:
        """FLOPs of one layer for token sum ``s1`` and squared-length sum ``s2``."""
        linear = model.linear_flops_per_token * s1
        attention = model.attention_flops_per_token_sq * s2
        if phase == "bwd":
            return linear * self.backward_factor + attention * self.attention_backward_factor
        return linear + attention

    def tp_comm_seconds(self, model: TransformerConfig, tokens: np.ndarray | float, tp: int,
                        allreduces: int) -> np.ndarray | float:
        """``allreduces`` ring all-reduces of a layer's ``tokens x hidden`` bf16 activations
        over the TP group (NVLink): Megatron's TP needs two per layer per forward (after the
        attention and the MLP block) and two per backward; a recomputed forward repeats its
        two (Shoeybi et al. 2019, fig. 4). With sequence parallelism they become all-gather +
        reduce-scatter pairs of the same volume (Korthikanti et al. 2022)."""
        if tp <= 1:
            return 0.0 * np.asarray(tokens, dtype=np.float64)
        nbytes = np.asarray(tokens, dtype=np.float64) * model.hidden * BYTES_BF16
        return allreduces * self.allreduce_seconds(nbytes, tp, inside_node=True)

    def stack_fwd_bwd_each(self, model: TransformerConfig, lens: np.ndarray, layers: int,
                           tp: int, recompute: bool, batch_tokens: float
                           ) -> tuple[np.ndarray, np.ndarray]:
        """``stack_seconds_each`` forward and backward of calls that share one batch, in one
        pass (the planners' hot path; same numbers)."""
        if self.fitted.get((model.name, "fwd")) or self.fitted.get((model.name, "bwd")):
            return (self.stack_seconds_each(model, lens, layers, tp, "fwd", False,
                                            batch_tokens),
                    self.stack_seconds_each(model, lens, layers, tp, "bwd", recompute,
                                            batch_tokens))
        hw = self.hardware
        linear = model.linear_flops_per_token * lens
        attention = model.attention_flops_per_token_sq * lens * lens
        eff = float(hw.efficiency(max(float(batch_tokens), 1.0) / max(1.0, np.sqrt(tp))))
        rate = tp * hw.peak_flops * eff
        fwd = (linear + attention) / rate
        bwd = (linear * self.backward_factor + attention * self.attention_backward_factor) / rate
        rounds_f, rounds_b = 2, 2
        if recompute:
            bwd = bwd + fwd
            rounds_b = 4
        if tp > 1:
            per_round = 2 * (tp - 1) / tp * lens * model.hidden * BYTES_BF16 \
                / hw.nvlink_bytes_per_s + 2 * (tp - 1) * hw.nvlink_latency_s * np.minimum(
                    lens / max(float(batch_tokens), 1.0), 1.0)
            fwd = fwd + rounds_f * per_round
            bwd = bwd + rounds_b * per_round
        return layers * fwd, layers * bwd

    def layer_seconds(self, model: TransformerConfig, lengths: Iterable[int] | np.ndarray,
                      tp: int = 1, phase: str = "fwd") -> float:
        """One layer over calls run one at a time (summed)."""
        return float(self.layer_seconds_each(model, lengths, tp, phase).sum())

    def stack_seconds_each(self, model: TransformerConfig, lengths: Iterable[int] | np.ndarray,
                           layers: int, tp: int = 1, phase: str = "fwd",
                           recompute: bool = False,
                           batch_tokens: float | None = None) -> np.ndarray:
        """``layers`` layers per call, with the TP all-reduces and the backward's recompute.

        Calls run together in a batch of ``batch_tokens``: each call carries its token share
        of the batch's all-reduce latency (alone, a call pays all of it)."""
        lens = _as_lengths(lengths)
        _require(layers >= 0, "layers", ">= 0", layers)
        seconds = self.layer_seconds_each(model, lens, tp, phase, batch_tokens)
        rounds = 2
        if phase == "bwd" and recompute:
            seconds = seconds + self.layer_seconds_each(model, lens, tp, "fwd", batch_tokens)
            rounds = 4
        if tp > 1:
            hw = self.hardware
            latency = rounds * 2 * (tp - 1) * hw.nvlink_latency_s
            share = 1.0 if batch_tokens is None else lens / max(float(batch_tokens), 1.0)
            seconds = seconds + rounds * 2 * (tp - 1) / tp * lens * model.hidden * BYTES_BF16 \
                / hw.nvlink_bytes_per_s + latency * np.minimum(share, 1.0)
        return layers * seconds

    def stack_seconds(self, model: TransformerConfig, lengths: Iterable[int] | np.ndarray,
                      layers: int, tp: int = 1, phase: str = "fwd",
                      recompute: bool = False) -> float:
        """The calls run as one batch: efficiency of the whole batch, one latency per layer."""
        lens = _as_lengths(lengths)
        return float(self.batch_seconds(model, np.array([lens.size]), np.array([lens.sum()]),
                                        np.array([(lens * lens).sum()]), layers, tp, phase,
                                        recompute)[0])

    def batch_seconds(self, model: TransformerConfig, calls: np.ndarray, sum_len: np.ndarray,
                      sum_len_sq: np.ndarray, layers: int, tp: int = 1, phase: str = "fwd",
                      recompute: bool = False) -> np.ndarray:
        """``stack_seconds`` of many batches at once, from each batch's moments: number of
        calls, sum of lengths and sum of squared lengths (that is all the cost depends on)."""
        _require(phase in ("fwd", "bwd"), "phase", "'fwd' or 'bwd'", phase)
        _require(tp >= 1, "tp", ">= 1", tp)
        _require(layers >= 0, "layers", ">= 0", layers)
        calls = np.asarray(calls, dtype=np.float64)
        s1 = np.asarray(sum_len, dtype=np.float64)
        s2 = np.asarray(sum_len_sq, dtype=np.float64)

        def one_pass(ph: str) -> np.ndarray:
            curve = self.fitted.get((model.name, ph))
            if curve is not None:
                return (curve.c * calls + curve.a * s1 + curve.b * s2) / tp
            flops = self._flops(model, s1, s2, ph)
            eff = self.hardware.efficiency(np.maximum(s1, 1.0) / max(1.0, np.sqrt(tp)))
            return flops / (tp * self.hardware.peak_flops * eff)

        seconds = one_pass(phase)
        rounds = 2
        if phase == "bwd" and recompute:
            seconds = seconds + one_pass("fwd")
            rounds = 4
        seconds = seconds + self.tp_comm_seconds(model, s1, tp, rounds)
        return np.where(calls > 0, layers * seconds, 0.0)

    def logits_seconds(self, model: TransformerConfig, tokens: float, tp: int,
                       phase: str = "fwd") -> float:
        """Output projection and loss of the last stage."""
        if model.vocab == 0 or tokens <= 0:
            return 0.0
        flops = 2.0 * tokens * model.hidden * model.vocab
        if phase == "bwd":
            flops *= self.backward_factor
        return float(flops / (tp * self.hardware.peak_flops * self.hardware.efficiency(tokens)))

    # ---- communication -------------------------------------------------------------------
    def p2p_seconds(self, nbytes: float, inside_node: bool) -> float:
        hw = self.hardware
        if inside_node:
            return hw.nvlink_latency_s + nbytes / hw.nvlink_bytes_per_s
        return hw.ib_latency_s + nbytes / hw.ib_bytes_per_s

    def allreduce_seconds(self, nbytes: float | np.ndarray, group: int,
                          inside_node: bool) -> float | np.ndarray:
        """Ring all-reduce under the alpha-beta model."""
        if group <= 1:
            return 0.0 * nbytes
        hw = self.hardware
        alpha = hw.nvlink_latency_s if inside_node else hw.ib_latency_s
        bw = hw.nvlink_bytes_per_s if inside_node else hw.ib_bytes_per_s
        return 2 * (group - 1) * alpha + 2 * (group - 1) / group * nbytes / bw

    def alltoall_seconds(self, nbytes_per_rank: float, group: int, inside_node: bool) -> float:
        """Each rank sends (group-1)/group of its bytes to the others."""
        if group <= 1:
            return 0.0
        hw = self.hardware
        alpha = hw.nvlink_latency_s if inside_node else hw.ib_latency_s
        bw = hw.nvlink_bytes_per_s if inside_node else hw.ib_bytes_per_s
        return (group - 1) * alpha + (group - 1) / group * nbytes_per_rank / bw

    def exchange_seconds(self, nbytes: float, group: int, inside_node: bool) -> float:
        """An uneven all-to-all in which this rank moves ``nbytes`` (the larger of what it
        sends and receives): one latency per peer plus the bytes over its link."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        hw = self.hardware
        alpha = hw.nvlink_latency_s if inside_node else hw.ib_latency_s
        bw = hw.nvlink_bytes_per_s if inside_node else hw.ib_bytes_per_s
        return float((group - 1) * alpha + nbytes / bw)

    # ---- memory --------------------------------------------------------------------------
    def param_bytes(self, params: float, tp: int, dp_shards: int) -> float:
        """bf16 weights + fp32 grads locally; fp32 Adam states sharded over DP (ZeRO-1)."""
        local = params / tp
        return local * (self.weight_grad_bytes_per_param
                        + self.optimizer_bytes_per_param / max(1, dp_shards))

    def activation_bytes(self, model: TransformerConfig, tokens: float | np.ndarray,
                         layers: int, tp: int, recompute: bool) -> float | np.ndarray:
        """Activations a microbatch keeps for backward, split over TP: with sequence
        parallelism every term divides by t (Korthikanti et al. 2022); without it
        (``sequence_parallel=False``) the replicated part stays whole. Full recompute keeps
        only each layer's input (h values per token: 2*h bytes in bf16; whole on every TP rank
        without sequence parallelism); the one layer being recomputed at a time is a transient
        working set: ``recompute_working_bytes``, counted once per rank, not per microbatch in
        flight. Values and masks are ``activation_value_bytes`` and ``dropout_mask_bytes``
        each."""
        if recompute:
            value = self.activation_value_bytes * model.hidden
            whole, split = (0.0, value) if self.sequence_parallel else (value, 0.0)
        else:
            whole, split = self._layer_bytes(model)
        return tokens * layers * whole + tokens * layers * split / tp

    def recompute_working_bytes(self, model: TransformerConfig, tokens: float, tp: int) -> float:
        """One layer's full activations for ``tokens``: what recomputation rebuilds at a time."""
        whole, split = self._layer_bytes(model)
        return tokens * whole + tokens * split / tp

    def _layer_bytes(self, model: TransformerConfig) -> tuple[float, float]:
        """One layer's saved bytes per token: (kept whole on every TP rank, split over TP)."""
        vb, mb = self.activation_value_bytes, self.dropout_mask_bytes
        full = model.saved_bytes_per_token_layer(vb, mb)
        if self.sequence_parallel:
            return 0.0, full
        whole = model.replicated_bytes_per_token_layer(vb, mb)
        return whole, full - whole

    def logits_bytes(self, model: TransformerConfig, tokens: float, tp: int) -> float:
        return tokens * model.vocab * 4.0 / tp


def _as_lengths(lengths: Iterable[int] | np.ndarray) -> np.ndarray:
    lens = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths),
                      dtype=np.float64)
    _require(lens.ndim == 1, "lengths", "a 1-D sequence of token counts", lens.shape)
    _require(bool(np.all(lens >= 0)), "lengths", "all >= 0", lens.min() if lens.size else None)
    return lens


# ---- presets (shapes from the public model cards; see docs/omni/planning.md) ---------------
VIT_1B = TransformerConfig("ViT-1B", layers=40, hidden=1408, heads=16, ffn_hidden=6144,
                           causal=False)
VIT_2_4B = TransformerConfig("ViT-2.4B", layers=48, hidden=2048, heads=16, ffn_hidden=8192,
                             causal=False)
VIT_10B = TransformerConfig("ViT-10B", layers=48, hidden=4096, heads=32, ffn_hidden=16384,
                            causal=False)
AUDIO_ENCODER = TransformerConfig("Audio-0.6B", layers=32, hidden=1280, heads=20,
                                  ffn_hidden=5120, causal=False)
LLAMA_12B = TransformerConfig("LLaMA-12B", layers=40, hidden=5120, heads=40, ffn_hidden=12288,
                              vocab=32000, gated_mlp=True)
LLAMA_70B = TransformerConfig("LLaMA-70B", layers=80, hidden=8192, heads=64, ffn_hidden=28672,
                              kv_heads=8, vocab=32000, gated_mlp=True)
GPT_175B = TransformerConfig("GPT-175B", layers=96, hidden=12288, heads=96, ffn_hidden=49152,
                             vocab=50257)

H100_80G = Hardware("H100-SXM-80G", peak_flops=989e12, hbm_bytes=80e9,
                    nvlink_bytes_per_s=450e9, ib_bytes_per_s=50e9)
H800_80G = Hardware("H800-80G", peak_flops=989e12, hbm_bytes=80e9,
                    nvlink_bytes_per_s=200e9, ib_bytes_per_s=50e9)
A100_80G = Hardware("A100-SXM-80G", peak_flops=312e12, hbm_bytes=80e9,
                    nvlink_bytes_per_s=300e9, ib_bytes_per_s=25e9)

MODELS: dict[str, TransformerConfig] = {
    m.name: m for m in (VIT_1B, VIT_2_4B, VIT_10B, AUDIO_ENCODER, LLAMA_12B, LLAMA_70B, GPT_175B)
}
HARDWARE: dict[str, Hardware] = {h.name: h for h in (H100_80G, H800_80G, A100_80G)}


def model_preset(name: str) -> TransformerConfig:
    _require(name in MODELS, "model", f"one of {sorted(MODELS)}", name)
    return MODELS[name]


def hardware_preset(name: str) -> Hardware:
    _require(name in HARDWARE, "hardware", f"one of {sorted(HARDWARE)}", name)
    return HARDWARE[name]
