"""Tensor-parallel plans (``OmniSpec.tp_plan``, ``runtime.tensor_parallel``): each part under
its plan on 2 gloo ranks computes what the plain part computes (outputs and gradients, float64),
a tied embedding/head stays one Parameter, the loss on vocabulary shards equals the plain loss;
plans that do not fit are refused at validation or setup."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from omni_models import VOCAB, ToyData, accuracy_terms, loss_terms, make_model, spawn
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_omni import OmniSpec
from lightning_omni.examples.multimodal_model import (
    Embedding,
    GptBlock,
    Head,
    MultimodalCaptioner,
    caption_loss,
)
from lightning_omni.runtime import tensor_parallel as tp
from lightning_omni.spec import OmniSpecError, scatter_features, valid_rows

RTOL, ATOL = 1e-7, 1e-12  # the equivalence tests' float64 tolerances
HF_TOL = 1e-6  # transformers' RMSNorm computes in float32 (see test_hf_llava)
# bf16: TP sums the row-parallel products in another order (two partial sums, then one
# all-reduce) than the plain matmul, and bf16 rounds each (2**-8 relative); measured worst
# 2.8e-2 of a tensor's scale (an encoder's qkv bias gradient); a missing or doubled
# reduction is off by the whole value
BF16_TOL = 5e-2
HF_CONFIGS = {"siglip-llama-tied": dict(vision="siglip", text="llama", tie_embeddings=True),
              "clip-qwen2": dict(vision="clip", text="qwen2", feature_strategy="default",
                                 feature_layer=-2, image_size=36)}


def _toy_batch(dtype: torch.dtype, n: int = 8) -> dict[str, Tensor]:
    return next(iter(DataLoader(ToyData(n, dtype=dtype), batch_size=n)))


def _forward(spec: OmniSpec, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The spec's parts in data order (as the runtime runs them), each part's output kept
    (whole: vocabulary-sharded logits gathered)."""
    outs: dict[str, Tensor] = {}
    tokens = batch[spec.tokens]
    h = outs["embedding"] = spec.embedding(tokens)
    for m in spec.modalities:
        n = batch[m.lengths]
        has = (n > 0).nonzero().squeeze(1)
        f = m.encoder(batch[m.inputs][has], n[has])
        outs[m.name] = f
        h = scatter_features(h, tokens, m.token_id, valid_rows(f, n[has]))
    for i, block in enumerate(spec.blocks):
        h = outs[f"blocks[{i}]"] = block(h)
    logits = spec.head(h)
    outs["head"] = tp.full_logits(logits)
    return logits, outs


def _grads(module: nn.Module) -> dict[str, Tensor]:
    return {n: tp.full_logits(p.grad).clone() for n, p in module.named_parameters()
            if p.grad is not None}


def _plain_and_tp(ref: nn.Module, model: nn.Module, batch: dict[str, Tensor], loss_fn,
                  parts_of, mesh, encoder_mesh) -> dict[str, Any]:
    """Forward, loss and backward of the plain module and of its copy under TP."""
    spec_ref, spec = ref.configure_omni(), model.configure_omni()
    logits, outs_ref = _forward(spec_ref, batch)
    total, count = loss_fn(logits, batch)
    (total / count).backward()
    ref_logits = logits.detach()
    tp.parallelize_parts(spec, parts_of(spec), mesh, encoder_mesh)
    logits, outs = _forward(spec, batch)
    got_total, got_count = tp.parallel_loss(spec)(logits, batch)
    assert type(got_total) is Tensor and type(got_count) is Tensor  # plain, for the runtime
    (got_total / got_count).backward()  # outside loss_parallel, as a pipeline's later action
    # loss_context: the loss and its backward inside it, for the logits' gradient
    leaf_ref = ref_logits.requires_grad_()
    want_total, _ = loss_fn(leaf_ref, batch)
    want_total.backward()
    leaf = logits.detach().requires_grad_()
    with tp.loss_context(spec):
        ctx_total, _ = loss_fn(leaf, batch)
        ctx_total.backward()
    return {"ref": {"outs": outs_ref, "loss": (total.detach(), count), "grads": _grads(ref),
                    "logits_grad": leaf_ref.grad},
            "got": {"outs": outs, "loss": (got_total.detach(), got_count),
                    "grads": _grads(model), "logits_grad": tp.full_logits(leaf.grad),
                    "ctx_loss": tp.local(ctx_total).detach()},
            "spec": spec}


def _toy_case(mesh, dtype: torch.dtype, encoder_mesh, **kw: Any) -> dict[str, Any]:
    model = make_model(0, dtype=dtype, **kw)
    ref = copy.deepcopy(model)
    model.configure_omni().validate(1)
    res = _plain_and_tp(ref, model, _toy_batch(dtype), loss_terms,
                        lambda s: ["embedding", "blocks[0:2]", "blocks[2]", "blocks[3]", "head",
                                   "encoders"], mesh, encoder_mesh)
    spec = res.pop("spec")
    from torch.distributed.tensor import DTensor

    logits, _ = _forward(spec, _toy_batch(dtype))
    with torch.no_grad():
        res["ref"]["acc"] = accuracy_terms(res["ref"]["outs"]["head"], _toy_batch(dtype))
        res["got"]["acc"] = accuracy_terms(tp.full_logits(logits), _toy_batch(dtype))
    res["tied"] = spec.embedding.tok.weight is spec.head.out.weight
    # the runtime's probe runs the parallelized parts (and the loss on vocabulary shards)
    res["probe"] = spec.check_shapes(_toy_batch(dtype)).logits_shape
    res["sharded"] = {n: isinstance(p, DTensor) for n, p in model.named_parameters()}
    # local / like: the local shard shares the DTensor's storage (the runtime's all-reduces)
    g = spec.blocks[0].qkv.weight.grad
    before = tp.local(g).clone()
    tp.local(g).mul_(2)
    res["local_in_place"] = torch.equal(tp.local(g), 2 * before)
    back = tp.like(tp.local(g), g)
    res["like"] = (back.placements == g.placements and back.shape == g.shape
                   and torch.equal(back.full_tensor(), g.full_tensor()))
    return res


def _hf_case(mesh, kw: dict[str, Any]) -> dict[str, Any]:
    from lightning_omni.examples.llava_data import LlavaCaptionDataset
    from lightning_omni.examples.llava_model import LlavaCaptioner, LlavaShape
    from lightning_omni.integrations.hf_llava import causal_lm_loss

    torch.manual_seed(0)
    model = LlavaCaptioner(LlavaShape(**kw))
    model.configure_model()
    model.model.to(torch.float64)
    ref = copy.deepcopy(model)
    v = model.config.vision_config
    data = LlavaCaptionDataset(8, v.image_size, v.patch_size, model.image_tokens,
                               image_fraction=0.6)
    batch = next(iter(DataLoader(data, batch_size=8)))
    res = _plain_and_tp(ref, model, batch, causal_lm_loss,
                        lambda s: ["embedding", "blocks", "head", "encoders"], mesh, mesh)
    spec = res.pop("spec")
    res["tied"] = spec.embedding.weight is spec.head.lm_head.weight
    return res


def _refusals(mesh) -> dict[str, Any]:
    """Setup errors that need a mesh, by case: the messages; encoder lanes; a partial call."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import PrepareModuleOutput

    def spec(hidden=16, heads=2, vocab=24, plan=None):
        torch.manual_seed(0)
        return OmniSpec(modalities=[], embedding=Embedding(hidden, vocab=vocab, seq_len=8),
                        blocks=[GptBlock(hidden, heads, 2)], head=Head(hidden, vocab=vocab),
                        loss=caption_loss, tp_plan=plan or tp.gpt_tp_plan())

    out = {}
    cases = {
        "heads": (spec(hidden=12, heads=3), ["blocks"], None),
        "vocab": (spec(vocab=25), ["embedding"], None),
        "part": (spec(), ["blocks[1]"], None),
        "mesh": (spec(), ["head"], "not a mesh"),
    }
    for name, (s, parts, m) in cases.items():
        try:
            tp.parallelize_parts(s, parts, mesh if m is None else m)
            out[name] = "no error"
        except OmniSpecError as err:
            out[name] = str(err)
    plan = tp.gpt_tp_plan()
    plan["blocks"][""] = PrepareModuleOutput(output_layouts=Replicate(),  # leaves a DTensor
                                             desired_output_layouts=Replicate(),
                                             use_local_output=False)
    s = spec(plan=plan)
    tp.parallelize_parts(s, ["blocks"], mesh)
    try:
        s.blocks[0](torch.randn(2, 8, 16))
        out["output"] = "no error"
    except OmniSpecError as err:
        out["output"] = str(err)
    out["lanes"] = [tp.encoder_submesh(mesh, 1).size(), tp.encoder_submesh(mesh, 2).size()]
    # a first pipeline stage: only the embedding hosted, the tie kept in the spec's head too
    from torch.distributed.tensor import DTensor

    s = make_model(0, tie=True).configure_omni()
    tp.parallelize_parts(s, ["embedding", "blocks[0]"], mesh)
    weight = s.embedding.tok.weight
    out["stage0_tie"] = isinstance(weight, DTensor) and s.head.out.weight is weight
    out["stage0_head_bias_plain"] = not isinstance(s.head.out.bias, DTensor)
    return out


def tp_worker(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    return {
        # tied head, TokenEncoders under the TP mesh (encoder_tp = tp)
        "toy-tied-token": _toy_case(mesh, torch.float64, mesh, tie=True, encoder="token"),
        # untied; encoder lanes of one rank (encoder_tp 1): the planned encoders stay plain
        "toy-replicated-encoder": _toy_case(mesh, torch.float64, tp.encoder_submesh(mesh, 1),
                                            encoder="token"),
        "toy-bf16": _toy_case(mesh, torch.bfloat16, mesh, tie=True, encoder="token"),
        **{f"hf-{name}": _hf_case(mesh, kw) for name, kw in HF_CONFIGS.items()},
        "refusals": _refusals(mesh),
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    pytest.importorskip("transformers")
    return spawn(tp_worker, 2, timeout=240.0)


def _close(got: Tensor, want: Tensor, what: str, dtype_tol: float | None) -> None:
    if dtype_tol is None:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")
    else:  # relative to the tensor's scale
        scale = float(want.detach().abs().max()) if want.numel() else 0.0
        torch.testing.assert_close(got, want, rtol=0, atol=dtype_tol * max(scale, 1e-12),
                                   msg=lambda m: f"{what}: {m}")


def _check_case(r: dict[str, Any], tol: float | None) -> None:
    ref, got = r["ref"], r["got"]
    assert set(got["outs"]) == set(ref["outs"])
    for part, want in ref["outs"].items():
        _close(got["outs"][part], want, f"output of {part}", tol)
    assert set(got["grads"]) == set(ref["grads"]), "parameters (a tie broken?) or gradients"
    for name, want in ref["grads"].items():
        _close(got["grads"][name], want, f"gradient of {name}", tol)
    for i in range(2):
        _close(got["loss"][i].double(), ref["loss"][i].double(), "loss (sum, count)", tol)
    _close(got["ctx_loss"].double(), ref["loss"][0].double(), "loss under loss_context", tol)
    _close(got["logits_grad"], ref["logits_grad"], "logits gradient under loss_context", tol)


@pytest.mark.parametrize("case", ["toy-tied-token", "toy-replicated-encoder"])
def test_toy_parts_under_tp_match_the_plain_parts(ranks, case):
    for r in ranks:
        res = r[case]
        _check_case(res, None)
        assert [int(x) for x in res["got"]["acc"]] == [int(x) for x in res["ref"]["acc"]]
        assert res["local_in_place"] and res["like"]
        assert res["probe"] == (VOCAB,)  # the whole vocabulary
        sharded = res["sharded"]
        assert sharded["blocks.0.qkv.weight"] and sharded["head.out.bias"]
        assert not sharded["blocks.0.ln1.weight"] and not sharded["embed.pos"]
        tied = case == "toy-tied-token"  # its encoders also run TP (encoder_tp = tp)
        assert sharded["image_encoder.blocks.0.qkv.weight"] == tied
        assert res["tied"] == tied  # (the untied toy has two weights)


def test_toy_bf16_under_tp_is_close(ranks):
    for r in ranks:
        _check_case(r["toy-bf16"], BF16_TOL)


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_hf_llava_parts_under_tp_match(ranks, name):
    for r in ranks:
        res = r[f"hf-{name}"]
        _check_case(res, HF_TOL)
        assert res["tied"] == HF_CONFIGS[name].get("tie_embeddings", False)


def test_setup_refusals(ranks):
    errors = ranks[0]["refusals"]
    assert "heads=3 divisible by the TP degree 2" in errors["heads"]
    assert "sharded dimension 0 (size 25) divisible by the TP degree 2" in errors["vocab"]
    assert "'blocks[i]'" in errors["part"] and "'blocks[1]'" in errors["part"]
    assert "mesh: expected a 1-D DeviceMesh" in errors["mesh"]
    assert "blocks[0]: under its tp_plan it returned a DTensor" in errors["output"]
    assert errors["lanes"] == [1, 2]
    assert errors["stage0_tie"] and errors["stage0_head_bias_plain"]


# -- validation without processes ----------------------------------------------------------------
def _spec(**plan_edits: Any) -> OmniSpec:
    spec = make_model(0, tie=True, encoder="token").configure_omni()
    plan = {k: dict(v) for k, v in spec.tp_plan.items()}
    for key, value in plan_edits.items():
        plan[key] = value
    return OmniSpec(**{**spec.__dict__, "tp_plan": plan})


def test_example_plans_validate():
    make_model(0, tie=True, encoder="token").configure_omni().validate(2)
    make_model(0).configure_omni().validate(2)
    MultimodalCaptioner().configure_omni().validate(2)


def test_bad_plans_are_refused():
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    cases = [
        (dict(video={"x": ColwiseParallel()}), r"tp_plan: expected keys among \['embedding', "
         r"'blocks', 'head', 'image', 'audio'\]"),
        (dict(blocks={"qkvv": ColwiseParallel()}), r"nothing matches 'qkvv' under 'the part' "
         r"\(children there: \['ln1', 'ln2', 'mlp', 'out', 'qkv'\]\)"),
        (dict(image={"blocks.*.attn": ColwiseParallel()}), r"nothing matches 'attn' under "
         r"'blocks.\*'"),
        (dict(blocks={"qkv": "colwise"}), r"tp_plan\['blocks'\]\['qkv'\]: expected a torch."
         r"distributed.tensor.parallel ParallelStyle, got 'str'"),
        (dict(blocks={"ln1": ColwiseParallel()}), r"an nn.Linear or nn.Embedding for "
         r"ColwiseParallel, got 'LayerNorm'"),
        (dict(blocks={"ln1": SequenceParallel()}), "SequenceParallel"),
        (dict(embedding={"tok": RowwiseParallel()}), r"RowwiseParallel\(input_layouts="
         r"Replicate\(\)\) on an nn.Embedding"),
        (dict(blocks={"mlp.0": ColwiseParallel(), "ml*.0": RowwiseParallel()}),
         r"modules under one style only \(blocks\[0\].mlp.0 is also under 'mlp.0'\)"),
        # the tied weight: vocabulary rows in the head, hidden columns in the embedding
        (dict(embedding={"tok": ColwiseParallel()}), r"is the same Parameter as "
         r"embedding.tok.weight \(tied\) but its style shards it as S\(0\), the other as "
         r"S\(1\)"),
        (dict(embedding={}), r"head.out.weight is the same Parameter as embedding.tok.weight|"
         r"embedding.tok.weight is the same Parameter as head.out.weight"),
    ]
    for edits, match in cases:
        with pytest.raises(OmniSpecError, match=match):
            _spec(**edits).validate(1)
    with pytest.raises(OmniSpecError, match="tp_plan: expected a mapping part"):
        OmniSpec(**{**_spec().__dict__, "tp_plan": [1]}).validate(1)


def test_llava_plan_refuses_untranslated_styles():
    from types import SimpleNamespace

    from lightning_omni.integrations.hf_llava import llava_tp_plan

    text = SimpleNamespace(base_model_tp_plan={"layers.*.mlp.experts": "local_colwise"})
    config = SimpleNamespace(text_config=text,
                             vision_config=SimpleNamespace(model_type="siglip_vision_model"))
    with pytest.raises(OmniSpecError, match=r"base_model_tp_plan\['layers.\*.mlp.experts'\]: "
                       r"expected a decoder-layer entry .* got 'local_colwise'"):
        llava_tp_plan(config, nn.Module())


def test_block_part_names():
    from lightning_omni.runtime.tensor_parallel import _block_indices

    assert list(_block_indices("blocks", 4)) == [0, 1, 2, 3]
    assert list(_block_indices("blocks[2]", 4)) == [2]
    assert list(_block_indices("blocks[1:3]", 4)) == [1, 2]
    assert list(_block_indices("blocks[2:2]", 4)) == []  # a stage without blocks
    for bad in ("blocks[4]", "blocks[3:5]", "blocks[a]", "blocks[-1]", "blocks1"):
        with pytest.raises(OmniSpecError, match=r"'blocks\[i:j\]' \(0 <= i <= j <= 4\)"):
            _block_indices(bad, 4)
