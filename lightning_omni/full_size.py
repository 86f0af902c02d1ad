"""A planned layout checked at full size: the real Hugging Face model, one training step per
rank role on fake tensors, against what the planner predicts for the same step.

``omni-plan`` picks a layout from a cost model. ``verify_layout`` runs the runtime's own path
instead (``fake_run.measure_rank``: meta build, ``parallelize``, the optimizer, one engine step
and the optimizer's step under ``FakeTensorMode`` over a fake process group of the layout's
world size) on a ``transformers`` LLaVA model built from the workload's shapes (a CLIP vision
tower, LLaVA's projector, Llama decoder layers; config only, no weights), in bfloat16, with
``OmniStrategy``'s arguments as ``plan.runnable.launch`` writes them for the layout.

The step is one both sides can see: each microbatch one sequence of ``seq_len`` tokens with one
image (``image_size`` pixels square, so a fixed number of features; a Hugging Face tower has
one input size) and text after it. The planner prices that same step: a mixture of one source
drawing exactly that sample, so its prediction and the measurement share their samples, their
packing and their microbatches. Every replica gets the same batch, so replica 0's ranks are
every role: one measurement per (pipeline stage, TP rank), the TP rank fixing the encoder lane.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lightning_omnilab.validate import fail, require

from .plan.costs import IMAGE, CostModel, TransformerConfig
from .plan.lssp import split_microbatch
from .plan.priced import peak_bytes
from .plan.pricing import StepPricer
from .plan.runnable import launch
from .plan.scenario import ParallelConfig, Scenario
from .plan.schedule import assign_encoder_samples
from .plan.search import search
from .plan.step_data import StepData
from .plan.workload import LengthDist, Mixture, Source
from .workload_yaml import PlanRequest

__all__ = ["RolePrediction", "best_layout", "checked_step_scenario", "parse_layout",
           "predict_roles", "runtime_cost", "verify_layout"]

IMAGE_SIZE = 336  # LLaVA-1.5's CLIP input: 24 x 24 patches of 14 px, 576 features per image
PATCH = 14
_TOKEN = re.compile(r"(VPP|TP|PP|DP|encTP)(\d+)$|enc(\d+)gpu$|stage0x([0-9.]+)$|"
                    r"\+(recompute|enc-recompute)$")


def parse_layout(text: str) -> ParallelConfig:
    """A layout as ``omni-plan`` prints it (``TP8 PP2 VPP2 DP16 +enc-recompute encTP4``)."""
    if not isinstance(text, str):
        fail("layout", "a layout string such as 'TP4 PP1 DP16 +enc-recompute encTP2'",
             type(text).__name__)
    fields: dict[str, Any] = {}
    for word in text.split():
        match = _TOKEN.match(word)
        if match is None:
            fail("layout", "words among TP<n>, PP<n>, VPP<n>, DP<n>, encTP<n>, enc<n>gpu, "
                 "stage0x<f>, +recompute, +enc-recompute", f"{word!r} in {text!r}")
        name, degree, pool, share, flag = match.groups()
        if degree is not None:
            fields[{"TP": "tp", "PP": "pp", "VPP": "vpp", "DP": "dp",
                    "encTP": "encoder_tp"}[name]] = int(degree)
        elif pool is not None:
            fields["encoder_gpus"] = int(pool)
        elif share is not None:
            fields["stage0_layer_fraction"] = float(share)
        else:
            fields["recompute" if flag == "recompute" else "encoder_recompute"] = True
    missing = [k for k in ("TP", "PP", "DP") if k.lower() not in fields]
    require(not missing, "layout", "TP, PP and DP degrees", f"{text!r} without {missing}")
    fields.setdefault("encoder_tp", fields["tp"])
    return ParallelConfig(**fields)


def best_layout(request: PlanRequest) -> ParallelConfig:
    """The Omni layout ``omni-plan`` picks: the run-level layout when the workload describes a
    run, else the best at ``mixture.timeline_ratio``."""
    if request.run is not None:
        from .plan.run import search_run

        return search_run("omni", request.run, request.cost, grid=request.grid).config
    scenario = dict(request.scenarios)[request.timeline_ratio]
    return search("omni", scenario, request.cost, grid=request.grid).best.config


def checked_step_scenario(request: PlanRequest, features: int, encoder_tokens: int
                          ) -> Scenario:
    """The workload's scenario with the checked step as its data: every sample one image of
    ``encoder_tokens`` encoder tokens (``features`` LLM tokens) and text filling ``seq_len``."""
    base = request.scenarios[0][1]
    text = base.seq_len - features
    require(text >= 1, "image_size", f"an image of fewer than seq_len={base.seq_len} "
            "features", features)
    source = Source("one image per sequence", IMAGE, 1.0, LengthDist(text, 0.0, text, text),
                    LengthDist(encoder_tokens, 0.0, encoder_tokens, encoder_tokens),
                    encoder_tokens / features)
    return replace(base, name=f"{request.name}/checked step",
                   mixture=Mixture("one image per sequence", (source,)))


def runtime_cost(cost: CostModel) -> CostModel:
    """``cost`` as OmniStrategy runs: tensor parallelism without sequence parallelism."""
    return replace(cost, sequence_parallel=False)


@dataclass(frozen=True)
class RolePrediction:
    """What the planner charges one process of replica 0 for the step."""

    peak_bytes: float
    flops: float


def predict_roles(scenario: Scenario, cost: CostModel, cfg: ParallelConfig
                  ) -> dict[tuple[int, int], RolePrediction]:
    """Per (stage, TP rank) of replica 0: the planner's peak memory (its simulated rank is a
    stage's TP group, so every TP rank of a stage gets the stage's peak) and the FLOPs its cost
    model counts for the rank: its LLM layers over ``tp``, the output projection on the last
    stage, and the encoder calls LSSP gives the rank's lane over ``encoder_tp``."""
    data = StepData(scenario, cost)
    pricer = StepPricer(data, "omni", cfg, 0)
    priced = pricer.build()
    peaks = peak_bytes(priced, data.memory_traces(priced.schedule), pricer.num_mb)
    calls, s1, s2 = data.llm_moments(pricer.replica_kind, cfg.dp, 0)
    llm, enc = scenario.llm, scenario.encoder
    lanes = cfg.tp // cfg.encoder_tp
    lane_flops = _lane_encoder_flops(pricer, cost, enc, lanes)
    out = {}
    for stage in range(cfg.pp):
        layers = pricer.layers[stage]
        flops = layers * float(_step_flops(cost, llm, s1, s2, cfg.recompute).sum()) / cfg.tp
        if stage == cfg.pp - 1 and llm.vocab:
            flops += 2.0 * float(s1.sum()) * llm.hidden * llm.vocab \
                * (1 + cost.backward_factor) / cfg.tp
        for t in range(cfg.tp):
            out[stage, t] = RolePrediction(
                peaks[stage], flops + lane_flops.get((stage, t // cfg.encoder_tp), 0.0))
    return out


def _step_flops(cost: CostModel, model: TransformerConfig, s1: np.ndarray, s2: np.ndarray,
                recompute: bool) -> np.ndarray:
    """Forward and backward FLOPs of one layer (and the recomputed forward) per call batch of
    token sum ``s1`` and squared-length sum ``s2``, as the cost model charges them."""
    linear = model.linear_flops_per_token * s1
    attention = model.attention_flops_per_token_sq * s2
    fwd = linear + attention
    bwd = linear * cost.backward_factor + attention * cost.attention_backward_factor
    return fwd + bwd + (fwd if recompute else 0.0)


def _lane_encoder_flops(pricer: StepPricer, cost: CostModel, enc: TransformerConfig,
                        lanes: int) -> dict[tuple[int, int], float]:
    """Encoder FLOPs per (stage, lane) of replica 0: the samples uniform insertion gives each
    stage (``assign_encoder_samples``, as pricing calls it), split over the stage's lanes by
    the planner's LSSP (a sequence-parallel sample shares its FLOPs over its group)."""
    data, cfg = pricer.data, pricer.cfg
    costs = [[float(data.enc_unit[i]) for i in mb] for mb in pricer.mbs]
    samples, _ = assign_encoder_samples(costs, cfg.pp, skip_stage0_drain=False)
    cap = pricer.scenario.hardware.memory_cap_bytes * pricer.scenario.lssp_memory_fraction
    heads = enc.heads // cfg.encoder_tp
    out: dict[tuple[int, int], float] = {}
    for m, mb in enumerate(pricer.mbs):
        for stage, local in enumerate(samples[m]):
            chosen = [mb[i] for i in local]
            if not chosen:
                continue
            tokens = float(data.enc_tokens[chosen].sum())
            items, _ = pricer.enc_items(chosen, cfg.encoder_tp, max(tokens / lanes, 1.0))
            split = split_microbatch(items, lanes, heads, cap, m)

            def flops(i: int) -> float:
                n = np.array([data.enc_tokens[i]])
                return enc.layers * float(_step_flops(cost, enc, n, n * n,
                                                      cfg.encoder_recompute)[0])

            for lane, ids in enumerate(split.dp_samples):
                for i in ids:
                    out[stage, lane] = out.get((stage, lane), 0.0) + flops(i) / cfg.encoder_tp
            for group in split.sp_groups:
                for lane in group.ranks:
                    out[stage, lane] = out.get((stage, lane), 0.0) \
                        + flops(group.sample_id) / cfg.encoder_tp / len(group.ranks)
    return out


def verify_layout(request: PlanRequest, layout: ParallelConfig, *,
                  image_size: int = IMAGE_SIZE, patch: int = PATCH,
                  roles: Sequence[tuple[int, int]] | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every rank role of ``layout`` (``roles``: only these (stage, TP rank)) at the
    workload's full size on fake tensors, next to the planner's prediction for the same rank.
    Returns the report ``benchmarks/omni_full_size.py`` writes (see docs/omni/full_size.md).
    Needs ``transformers`` and ``torch.distributed`` not initialized in this process."""
    from .fake_run import measure_rank

    start = time.perf_counter()
    require(isinstance(image_size, int) and isinstance(patch, int) and 0 < patch <= image_size,
            "image_size, patch", "ints with 0 < patch <= image_size", (image_size, patch))
    # the layout first (a layout refused whatever the image), then the checked step
    base = request.scenarios[0][1]
    require(layout.encoder_gpus == 0, "layout", "encoders on the LLM's ranks (Omni "
            "multiplexes them; no enc<n>gpu pool)", str(layout))
    world = layout.tp * layout.pp * layout.dp
    require(world <= base.num_gpus, "layout", f"at most cluster.gpus={base.num_gpus} "
            "GPUs", f"{layout} ({world} GPUs)")
    verdict = launch("omni", layout, base)
    require(verdict.runnable, "layout", "one OmniStrategy runs", f"{layout}: "
            + "; ".join(verdict.why_not))
    features = (image_size // patch) ** 2  # CLIP's tower adds a CLS token; LLaVA drops it
    scenario = checked_step_scenario(request, features, features + 1)
    verdict = launch("omni", layout, scenario)
    dims = _dims(verdict.strategy_kwargs, layout, scenario.hardware.gpus_per_node)
    # OmniStrategy's TP has no sequence parallelism (tp_plan refuses SequenceParallel styles)
    predicted = predict_roles(scenario, runtime_cost(request.cost), layout)
    wanted = sorted(predicted) if roles is None else [tuple(r) for r in roles]
    unknown = [r for r in wanted if r not in predicted]
    require(not unknown, "roles", f"(stage, TP rank) pairs of {layout}", unknown)
    shape = llava_shape(scenario.encoder, scenario.llm, image_size, patch)
    batch = step_batch(shape, dims.num_microbatches, scenario.seq_len)
    out = []
    for stage, tp_rank in wanted:
        rank = stage * layout.tp + tp_rank  # replica 0: plan rank = stage
        m = measure_rank(lambda: llava_module(shape), dims, rank, batch)
        lane = tp_rank // layout.encoder_tp
        require(m.role == (stage, tp_rank, 0), "rank", f"stage {stage}, TP rank {tp_rank}",
                m.role)
        p = predicted[stage, tp_rank]
        out.append({"role": {"rank": rank, "stage": stage, "tp_rank": tp_rank, "lane": lane},
                    "param_bytes": m.param_bytes, "grad_bytes": m.grad_bytes,
                    "optimizer_bytes": m.optimizer_bytes,
                    "activation_peak_bytes": m.activation_peak_bytes,
                    "measured_peak_bytes": m.measured_peak_bytes,
                    "predicted_peak_bytes": p.peak_bytes, "flops": m.flops,
                    "predicted_flops": p.flops})
        if progress is not None:
            progress(_line(out[-1], time.perf_counter() - start))
    return {"workload": request.name, "layout": str(layout), "world_size": dims.world_size,
            "budget_bytes": scenario.hardware.memory_cap_bytes, "ranks": out,
            "wall_s": time.perf_counter() - start}


def _line(rec: dict[str, Any], seconds: float) -> str:
    role = rec["role"]
    return (f"stage {role['stage']} TP rank {role['tp_rank']} lane {role['lane']}: peak "
            f"{rec['measured_peak_bytes'] / 1e9:.2f} GB measured, "
            f"{rec['predicted_peak_bytes'] / 1e9:.2f} GB predicted; "
            f"{rec['flops'] / 1e12:.1f} TFLOP counted, {rec['predicted_flops'] / 1e12:.1f} "
            f"predicted ({seconds:.0f} s)")


def _dims(kwargs: dict[str, Any], layout: ParallelConfig, gpus_per_node: int):
    """``ParallelDims`` of ``OmniStrategy(**kwargs)`` over the layout's world."""
    from .runtime.parallel_dims import KEYWORDS, ParallelDims

    field = {v: k for k, v in KEYWORDS.items()}
    dims = ParallelDims(**{field.get(k, k): v for k, v in kwargs.items()})
    return dims.for_world(layout.tp * layout.pp * layout.dp, gpus_per_node)


def llava_shape(encoder: TransformerConfig, llm: TransformerConfig, image_size: int,
                patch: int):
    """The ``LlavaShape`` of a workload's models: the encoder as a CLIP vision tower (a
    bidirectional ViT with a plain MLP), the LLM as Llama layers (causal, gated MLP)."""
    from .examples.llava_model import LlavaShape

    require(not encoder.causal and not encoder.gated_mlp, "models.encoder",
            "a ViT (bidirectional, plain MLP) to build as a CLIP tower", encoder)
    require(llm.causal and llm.gated_mlp and llm.vocab > 0, "models.llm",
            "a Llama-style LLM (causal, gated MLP, a vocabulary)", llm)
    return LlavaShape(vision="clip", text="llama", image_size=image_size, patch_size=patch,
                      vision_hidden=encoder.hidden, vision_layers=encoder.layers,
                      vision_heads=encoder.heads, vision_intermediate=encoder.ffn_hidden,
                      hidden=llm.hidden, layers=llm.layers, heads=llm.heads,
                      kv_heads=llm.num_kv_heads, intermediate=llm.ffn_hidden, vocab=llm.vocab,
                      feature_layer=-1, feature_strategy="default")


def llava_module(shape):
    """A ``LlavaCaptioner`` of ``shape`` built (on the current device) in bfloat16, its
    OmniSpec without the captioner's metrics (they read the toy data's keys; a training step
    needs only the loss)."""
    import torch

    from .examples.llava_model import LlavaCaptioner
    from .integrations.hf_llava import llava_spec

    class LlavaForCheck(LlavaCaptioner):
        def configure_omni(self):
            return llava_spec(self.model)

    module = LlavaForCheck(shape)
    module.configure_model()
    return module.to(torch.bfloat16)


def step_batch(shape, rows: int, seq_len: int) -> dict[str, Any]:
    """One replica's batch of the checked step: ``rows`` sequences of ``seq_len`` tokens, each
    an image's placeholder tokens, then text; the loss on the text."""
    import torch

    from .examples.multimodal_data import IMG, VOCAB
    from .integrations.hf_llava import PATCHES, PATCHES_LEN

    side = shape.image_size // shape.patch_size
    features = side * side
    tokens = (torch.arange(rows * seq_len) % (VOCAB - 6) + 6).reshape(rows, seq_len)
    tokens[:, :features] = IMG
    labels = tokens.clone()
    labels[:, :features] = -100
    return {"tokens": tokens, "labels": labels,
            PATCHES: torch.zeros(rows, features, 3 * shape.patch_size ** 2),
            PATCHES_LEN: torch.full((rows,), features)}
