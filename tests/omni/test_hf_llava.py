"""The Hugging Face LLaVA adapter: its parts compute what ``LlavaForConditionalGeneration``
computes, and OmniStrategy trains such a model (built on the meta device) exactly as the plain
module does, in float64."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_models import _Record, _trainer, run_recipe, spawn
from torch.utils.data import DataLoader, DistributedSampler

from lightning_omni.examples.llava_data import LlavaCaptionDataset
from lightning_omni.examples.llava_model import LlavaCaptioner, LlavaShape
from lightning_omni.integrations.hf_llava import (
    causal_lm_loss,
    patchify,
    unpatchify,
)
from lightning_omni.spec import OmniSpecError, scatter_features, valid_rows

pytest.importorskip("transformers")

# three tower/decoder/feature choices: SigLIP (no CLS) into Llama; CLIP with LLaVA-1.5's
# "default" (CLS dropped) from the second-to-last layer into Qwen2, at a size that is not a
# multiple of the patch (as SigLIP's 384 px with patch 14); CLIP with its CLS kept from two
# layers concatenated
CONFIGS = {
    "siglip-llama": dict(vision="siglip", text="llama"),
    "clip-qwen2": dict(vision="clip", text="qwen2", feature_strategy="default",
                       feature_layer=-2, image_size=36),
    "clip-full-2layers": dict(vision="clip", text="llama", feature_layer=[-2, -1]),
}
STEPS, BATCH, SAMPLES = 4, 8, 32
# transformers' RMSNorm computes in float32 whatever the model's dtype, so a float64 run agrees
# with another order of the same sums to ~1e-7 of each gradient's scale, not to float64's
# 1e-15; a wrong gradient is off by far more
LOSS_RTOL, GRAD_SCALE_TOL = 1e-6, 1e-6


class Float64Llava(LlavaCaptioner):
    def configure_model(self) -> None:
        super().configure_model()
        self.model.to(torch.float64)

    def configure_optimizers(self):
        # SGD: Adam would turn the float32 noise of gradients that are exactly zero in exact
        # arithmetic (a key projection's bias under softmax) into full-size steps
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _model(seed: int, **kw: Any) -> Float64Llava:
    torch.manual_seed(seed)
    return Float64Llava(LlavaShape(**kw))


def _data(model: LlavaCaptioner, n: int = SAMPLES) -> LlavaCaptionDataset:
    v = model.config.vision_config
    return LlavaCaptionDataset(n, v.image_size, v.patch_size, model.image_tokens,
                               image_fraction=0.6)


def _batch(model: LlavaCaptioner, n: int = 8) -> dict[str, torch.Tensor]:
    return next(iter(DataLoader(_data(model, n), batch_size=n)))


def test_patches_round_trip():
    pixels = torch.randn(2, 3, 16, 16)
    patches = patchify(pixels, 4)
    assert patches.shape == (2, 16, 48)
    # row-major patches, each channel-major: patch (row 1, col 2) of image 0
    torch.testing.assert_close(patches[0, 1 * 4 + 2], pixels[0, :, 4:8, 8:12].reshape(-1))
    torch.testing.assert_close(unpatchify(patches, 3, 4), pixels, rtol=0, atol=0)
    with pytest.raises(OmniSpecError, match="divisible by the patch size 5"):
        patchify(pixels, 5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parts_compute_the_hf_forward(name):
    model = _model(0, **CONFIGS[name])
    model.configure_model()
    batch = _batch(model)
    assert 0 < int((batch["pixel_patches_len"] > 0).sum()) < 8  # with and without images
    spec = model.configure_omni()
    spec.validate(pipeline_parallel=2)
    spec.check_batch(batch)
    with torch.no_grad():
        want = model(batch)  # LlavaForConditionalGeneration.forward
        h = spec.embedding(batch["tokens"])
        (image,) = spec.modalities
        n = batch[image.lengths]
        has = (n > 0).nonzero().squeeze(1)
        rows = valid_rows(image.encoder(batch[image.inputs][has], n[has]), n[has])
        h = scatter_features(h, batch["tokens"], image.token_id, rows)
        for block in spec.blocks:
            h = block(h)
        got = spec.head(h)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the loss is transformers' own (shifted labels, mean over labelled positions)
    from transformers.loss.loss_utils import ForCausalLMLoss

    total, count = causal_lm_loss(want.float(), batch)
    torch.testing.assert_close(total / count, ForCausalLMLoss(want.float(), batch["labels"],
                                                              want.shape[-1]))


def test_wrong_model_and_batch_are_refused():
    from lightning_omni.integrations.hf_llava import llava_spec

    with pytest.raises(OmniSpecError, match="expected a transformers LlavaForConditionalGen"):
        llava_spec(torch.nn.Linear(2, 2))
    model = _model(0)
    model.configure_model()
    batch = _batch(model)
    batch["pixel_patches_len"][batch["pixel_patches_len"] > 0] -= 1
    with pytest.raises(OmniSpecError, match="placeholder tokens"):
        model.configure_omni().check_batch(batch)
    with pytest.raises(ValueError, match="vision: expected one of"):
        LlavaCaptioner(LlavaShape(vision="vit"))


def _reference(kw: dict[str, Any]) -> dict[str, Any]:
    """The plain module on one process, its own training_step on the global batches."""
    model = _model(0, **kw)
    model.configure_model()
    opt = model.configure_optimizers()
    batches = list(DataLoader(_data(model), batch_size=BATCH))
    losses, grads0 = [], {}
    for i in range(STEPS):
        opt.zero_grad()
        loss = model.training_step(batches[i % len(batches)], i)["loss"]
        loss.backward()
        if i == 0:
            grads0 = {n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None}
        losses.append(float(loss))
        opt.step()
    return {"losses": losses, "grads0": grads0,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def llava_worker(rank: int, world: int, runs: list[tuple[int, int, dict]]) -> list[dict]:
    from lightning_omni import OmniStrategy

    out = []
    for pp, dp, kw in runs:
        model = _model(0, **kw)  # built in fit, on the meta device, from this seed
        strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp, num_microbatches=2)
        data = _data(model)
        sampler = DistributedSampler(data, num_replicas=dp, rank=rank // pp, shuffle=False)
        rec = _Record()
        _trainer(world, strategy, STEPS, [rec]).fit(
            model, DataLoader(data, batch_size=BATCH // dp, sampler=sampler))
        hosted = strategy.engine.hosted_param_ids()
        full = sum(p.numel() for p in _built(kw).parameters())
        out.append({"losses": rec.losses, "grads0": rec.grads0,
                    "params": {n: p.detach().clone() for n, p in model.named_parameters()
                               if id(p) in hosted},
                    "param_fraction": sum(p.numel() for p in model.parameters()) / full})
    return out


def _built(kw: dict[str, Any]) -> LlavaCaptioner:
    model = LlavaCaptioner(LlavaShape(**kw))
    model.configure_model()
    return model


# pipeline 2: the decoder layers cut between two ranks, a tied lm_head shared by the first and
# last stage; data parallel 2: CLIP's last layer and post-norm get no gradient (features come
# from the second-to-last layer), which must stay "no gradient" on every replica
RUNS = [(2, 1, dict(CONFIGS["siglip-llama"], tie_embeddings=True)),
        (1, 2, CONFIGS["clip-qwen2"])]


def test_omni_strategy_matches_the_plain_module():
    ranks = spawn(llava_worker, 2, RUNS, timeout=240.0)
    for i, (pp, dp, kw) in enumerate(RUNS):
        ref = _reference(kw)
        names = set(ref["params"])
        unused = names - set(ref["grads0"])
        if dp == 2:
            assert unused, "the check needs parameters without a gradient"
        seen = set()
        for r in (rank[i] for rank in ranks):
            torch.testing.assert_close(torch.tensor(r["losses"], dtype=torch.float64),
                                       torch.tensor(ref["losses"], dtype=torch.float64),
                                       rtol=LOSS_RTOL, atol=0)
            assert not unused & set(r["grads0"]), "a parameter no one used got a gradient"
            for kind, got, want in (("grad", r["grads0"], ref["grads0"]),
                                    ("param", r["params"], ref["params"])):
                for n, value in got.items():
                    scale = float(want[n].abs().max())
                    torch.testing.assert_close(value, want[n], rtol=0,
                                               atol=GRAD_SCALE_TOL * max(scale, 1e-12),
                                               msg=lambda m, n=n, k=kind: f"{k} {n}: {m}")
            seen |= set(r["params"])
            if pp == 2:  # each rank built (on the meta device) and holds only its part
                assert 0 < r["param_fraction"] < 0.8
        assert seen == names



REPO = Path(__file__).resolve().parents[2]


def test_tiny_recipe_learns_through_its_cli(tmp_path):
    """recipes/omni/llava_tiny.yaml as a user runs it (2 processes, pipeline 2, the model built
    on the meta device), shortened: validation loss falls."""
    ea = run_recipe("lightning_omni.examples.llava_train",
                    ["--config", "recipes/omni/llava_tiny.yaml", "--trainer.max_epochs", "2",
                     "--data.samples_per_epoch", "160"], tmp_path)
    val = [e.value for e in ea.Scalars("val/loss")]
    assert len(val) == 2 and val[1] < 0.8 * val[0], val


def test_gpu_recipe_is_the_planned_launch(tmp_path):
    """The GPU recipe's layout is what ``omni-plan --runnable-only`` launches for its workload
    (at the recipe's image share), and its config resolves with the data linked to the tower
    (729 tokens per 384 px SigLIP image); the 7B model itself is only built in fit."""
    import json

    import yaml

    from lightning_omni.cli import main as omni_plan
    from lightning_omni.examples.llava_train import main

    recipe = REPO / "recipes/omni/llava_siglip_qwen2_7b.yaml"
    cfg = yaml.safe_load(recipe.read_text())
    assert omni_plan([str(REPO / "recipes/omni_plan/llava_siglip_qwen2_7b.yaml"),
                      "--runnable-only", "--no-plots", "--out-dir", str(tmp_path)]) in (0, None)
    rows = json.loads((tmp_path / "summary.json").read_text())["omni"]
    (row,) = [r for r in rows if r["image_ratio"] == cfg["data"]["image_fraction"]]
    assert row["launch"]["runnable"]
    assert cfg["trainer"]["strategy"]["init_args"] == row["launch"]["strategy_kwargs"]
    init = cfg["trainer"]["strategy"]["init_args"]
    assert init["pipeline_parallel"] * init["data_parallel"] == cfg["trainer"]["devices"]
    # parsed and instantiated as a user's command would, on this CPU and one process
    cli = main(["--config", str(recipe), "--trainer.accelerator", "cpu", "--trainer.devices",
                "1", "--trainer.strategy.init_args.data_parallel", "1",
                "--trainer.logger", "false"], run=False)
    assert cli.model.image_tokens == cli.datamodule.train_set.image_tokens == 729
    assert cli.model.model is None  # built in configure_model, on the meta device under Omni
