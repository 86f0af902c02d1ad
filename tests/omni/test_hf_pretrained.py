"""Hugging Face pretrained weights in and out of OmniStrategy, per rank
(``lightning_omni.integrations.hf_pretrained``): a tiny random LLaVA written by
``save_pretrained`` is trained at PP2 with meta init, each rank reading only what it hosts, and
exported stage by stage to a directory that ``from_pretrained`` loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_models import _Record, _trainer, spawn
from torch.utils.data import DataLoader

from lightning_omni.examples.llava_data import LlavaCaptionDataset
from lightning_omni.examples.llava_model import LlavaCaptioner, LlavaShape, llava_config
from lightning_omni.integrations.hf_pretrained import (
    Entry,
    PretrainedError,
    export_checkpoint,
    from_pretrained,
    plan_files,
)
from lightning_omni.runtime.meta_init import InitRecording, RecordInit, capture_rng, materialize

transformers = pytest.importorskip("transformers")
from transformers import LlavaForConditionalGeneration  # noqa: E402

SHAPE = LlavaShape(tie_embeddings=True)  # a tied lm_head: held by the first and last stage
STEPS, BATCH, SAMPLES = 2, 8, 16
# float64 weights; transformers' RMSNorm computes in float32 whatever the dtype, so the
# pipelined loss (another order of the same sums) agrees to ~1e-7 relative, not bit for bit
LOSS_RTOL = 1e-6
READ_FRACTION_MAX = 0.7  # of the checkpoint's bytes, per rank at PP2


def _save_random(path: Path, seed: int = 0, shape: LlavaShape = SHAPE) -> Path:
    """A tiny random LLaVA as a user has it: save_pretrained, several shards and an index."""
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(llava_config(shape))
    model.save_pretrained(path, max_shard_size="150KB")
    return path


class PretrainedLlava(LlavaCaptioner):
    """LlavaCaptioner whose model comes from a save_pretrained directory, in float64."""

    def __init__(self, path: str, shape: LlavaShape = SHAPE) -> None:
        super().__init__(shape)
        self.path = path

    def configure_model(self) -> None:
        if self.model is None:
            self.model = from_pretrained(LlavaForConditionalGeneration, self.path,
                                         dtype=torch.float64)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class DirectLlava(PretrainedLlava):
    """What a new user writes first: transformers' from_pretrained in configure_model."""

    def configure_model(self) -> None:
        if self.model is None:
            self.model = LlavaForConditionalGeneration.from_pretrained(self.path)


def _data(model: LlavaCaptioner) -> LlavaCaptionDataset:
    v = model.config.vision_config
    return LlavaCaptionDataset(SAMPLES, v.image_size, v.patch_size, model.image_tokens,
                               image_fraction=0.6)


class _AtStart(_Record):
    """The hosted tensors and what was read, before the first step."""

    def on_train_start(self, trainer, module) -> None:
        hosted = trainer.strategy.engine.hosted_param_ids()
        self.start = {n: p.detach().clone() for n, p in module.named_parameters()
                      if id(p) in hosted}
        self.loads = list(trainer.strategy.pretrained_loads)


def pretrained_worker(rank: int, world: int, path: str, out: str, ckpt: str
                      ) -> dict[str, Any]:
    from lightning_omni import OmniStrategy
    from lightning_omni.integrations.hf_pretrained import save_pretrained

    res: dict[str, Any] = {}
    try:  # transformers' from_pretrained under the meta build: OmniStrategy says what to do
        _trainer(world, OmniStrategy(pipeline_parallel=2, num_microbatches=2), 1, []).fit(
            DirectLlava(path), DataLoader(_data(DirectLlava(path)), batch_size=BATCH))
    except RuntimeError as err:
        res["direct_error"] = (type(err).__name__, str(err), type(err.__cause__).__name__,
                               str(err.__cause__))
    model = PretrainedLlava(path)
    strategy = OmniStrategy(pipeline_parallel=2, num_microbatches=2)
    rec = _AtStart()
    trainer = _trainer(world, strategy, STEPS, [rec])
    trainer.fit(model, DataLoader(_data(model), batch_size=BATCH))
    res["weight_map"] = save_pretrained(trainer, out, max_shard_size="100KB")
    trainer.save_checkpoint(ckpt)  # OmniStrategy's own: one shard per stage
    hosted = strategy.engine.hosted_param_ids()
    res.update(start=rec.start, loads=[vars(r) for r in rec.loads], losses=rec.losses,
               trained={n: p.detach().clone() for n, p in model.named_parameters()
                        if id(p) in hosted},
               fraction=sum(p.numel() for p in model.parameters()))
    return res


class _ShardsAtStart(_Record):
    """Each hosted tensor's local shard before the first step, with where it sits: (dim,
    mesh rank, mesh size) of a DTensor sharded on one dimension, None for a whole tensor."""

    def on_train_start(self, trainer, module) -> None:
        from torch.distributed.tensor import DTensor, Shard

        hosted = trainer.strategy.engine.hosted_param_ids()
        self.start = {}
        for n, p in module.named_parameters():
            if id(p) not in hosted:
                continue
            where = None
            if isinstance(p, DTensor) and isinstance(p.placements[0], Shard):
                mesh = p.device_mesh
                where = (p.placements[0].dim, mesh.get_local_rank(), mesh.size())
            local = p.to_local() if isinstance(p, DTensor) else p
            self.start[n] = (local.detach().clone(), where)
        self.loads = list(trainer.strategy.pretrained_loads)


def pretrained_tp_worker(rank: int, world: int, path: str, out: str) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from lightning_omni import OmniStrategy
    from lightning_omni.integrations.hf_pretrained import save_pretrained

    model = PretrainedLlava(path)
    rec = _ShardsAtStart()
    trainer = _trainer(world, OmniStrategy(tensor_parallel=2, num_microbatches=2), 1, [rec])
    trainer.fit(model, DataLoader(_data(model), batch_size=BATCH))
    save_pretrained(trainer, out, max_shard_size="100KB")
    trained = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
               for n, p in model.named_parameters()}  # every rank, in one order
    return {"start": rec.start, "loads": [vars(r) for r in rec.loads], "losses": rec.losses,
            "trained": trained}


def test_each_tensor_parallel_rank_reads_only_its_shards(tmp_path):
    """At TP2 each rank reads the bytes of its own shards (and of the tensors TP leaves
    whole) straight into them, not the whole stage, and trains from the pretrained values."""
    path, out = _save_random(tmp_path / "pretrained"), tmp_path / "exported"
    ranks = spawn(pretrained_tp_worker, 2, str(path), str(out), timeout=240.0)
    plain = _plain(path)
    want = dict(plain.named_parameters())
    checkpoint = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    for r in ranks:
        assert set(r["start"]) == set(want)  # one stage: every tensor, in shards or whole
        sharded = 0
        for n, (value, where) in r["start"].items():
            expected = want[n]
            if where is not None:
                dim, mesh_rank, size = where
                expected = expected.chunk(size, dim)[mesh_rank]
                sharded += 1
            assert value.dtype == torch.float64 and torch.equal(value, expected), n
        assert sharded >= 10  # attention, MLP, embedding and head shards
        (load,) = r["loads"]
        assert load["checkpoint_bytes"] == checkpoint
        # half of every sharded tensor, all of the few TP keeps whole (norms, biases):
        # measured 0.515 of the checkpoint's bytes on each rank
        assert 0.45 * checkpoint < load["bytes_read"] <= 0.6 * checkpoint, load
    batch = next(iter(DataLoader(_data(plain), batch_size=BATCH)))
    with torch.no_grad():
        first = float(plain.training_step(batch, 0)["loss"])
    for r in ranks:
        assert r["losses"][0] == pytest.approx(first, rel=LOSS_RTOL, abs=0)
    # written back under TP: the shards gathered, a directory from_pretrained loads
    loaded = LlavaForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    prefix = "model."
    assert ranks[0]["trained"].keys() == want.keys()
    for n, value in ranks[0]["trained"].items():
        assert torch.equal(loaded.get_parameter(n[len(prefix):]), value), n
        assert torch.equal(ranks[1]["trained"][n], value), n
    assert not all(torch.equal(ranks[0]["trained"][n], want[n]) for n in want)  # it trained


def _plain(path: Path) -> PretrainedLlava:
    model = PretrainedLlava(str(path))
    model.configure_model()  # no meta build: transformers' from_pretrained itself
    return model


def test_trains_from_pretrained_and_exports(tmp_path):
    path = _save_random(tmp_path / "pretrained")
    out = tmp_path / "exported"
    ckpt = tmp_path / "omni.ckpt"
    ranks = spawn(pretrained_worker, 2, str(path), str(out), str(ckpt), timeout=240.0)

    kind, msg, cause, cause_msg = ranks[0]["direct_error"]
    assert kind == "MetaInitError" and cause == "RuntimeError", ranks[0]["direct_error"]
    assert "hf_pretrained.from_pretrained" in msg and "meta device" in cause_msg

    plain = _plain(path)
    want = dict(plain.named_parameters())
    checkpoint = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    seen: set[str] = set()
    for r in ranks:  # each rank: its hosted tensors are the pretrained ones before step 1
        assert r["start"] and set(r["start"]) < set(want)
        for n, value in r["start"].items():
            assert value.dtype == torch.float64 and torch.equal(value, want[n]), n
        seen |= set(r["start"])
        (load,) = r["loads"]
        assert load["checkpoint_bytes"] == checkpoint
        assert 0 < load["bytes_read"] <= READ_FRACTION_MAX * checkpoint, load
    assert seen == set(want)

    # the first step's loss: the plain module's own training_step on the same batch
    batch = next(iter(DataLoader(_data(plain), batch_size=BATCH)))
    with torch.no_grad():
        first = float(plain.training_step(batch, 0)["loss"])
    for r in ranks:
        assert r["losses"][0] == pytest.approx(first, rel=LOSS_RTOL, abs=0)

    # the export: stage by stage, loadable by from_pretrained, the trained values bit for bit
    trained = {n: v for r in ranks for n, v in r["trained"].items()}
    assert ranks[0]["weight_map"] == ranks[1]["weight_map"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == ranks[0]["weight_map"]
    assert len(set(index["weight_map"].values())) >= 2
    loaded = LlavaForConditionalGeneration.from_pretrained(out, dtype=torch.float64)
    prefix = "model."  # the LightningModule's attribute
    for n, value in trained.items():
        assert torch.equal(loaded.get_parameter(n[len(prefix):]), value), n
    assert loaded.lm_head.weight is loaded.model.language_model.embed_tokens.weight
    plain.eval()
    with torch.no_grad():
        for n, value in trained.items():  # the trained module, whole, on one process
            plain.get_parameter(n).copy_(value)
        logits = plain(batch)
        got = loaded(input_ids=batch["tokens"],
                     pixel_values=_pixels(plain, batch)).logits
    assert torch.equal(got, logits)
    # the names and files are those transformers' own save_pretrained writes
    plain.model.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    hf_index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(hf_index["weight_map"]) == set(index["weight_map"])
    assert json.loads((out / "config.json").read_text())["dtype"] == "float64"

    # the same directory from the sharded checkpoint, one stage's shard in memory at a time
    with torch.device("meta"):
        meta = LlavaForConditionalGeneration(plain.model.config)
    meta.tie_weights()
    files = export_checkpoint(ckpt, tmp_path / "from_ckpt", meta, max_shard_size="100KB",
                              weights_only=False)  # ours: it holds the module's LlavaShape
    assert files == index["weight_map"]
    for file in set(files.values()):
        assert _tensors(tmp_path / "from_ckpt" / file) == _tensors(out / file), file
    assert json.loads((tmp_path / "from_ckpt" / "config.json").read_text())["dtype"] == \
        "float64"


def _tensors(file: Path) -> dict[str, tuple]:
    from safetensors.torch import load_file

    return {k: (v.dtype, tuple(v.shape), v.numpy().tobytes()) for k, v in
            load_file(file).items()}


def _pixels(model: LlavaCaptioner, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from lightning_omni.integrations.hf_llava import pixels_from_patches

    has = batch["pixel_patches_len"] > 0
    return pixels_from_patches(batch["pixel_patches"][has], model.config.vision_config,
                               torch.float64)


# -- one process: the meta build and its per-rank load against transformers' own ------------
def _drop_keys(path: Path, keys: list[str]) -> None:
    from safetensors.torch import load_file, save_file

    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for key in keys:
        file = index["weight_map"].pop(key)
        tensors = load_file(path / file)
        tensors.pop(key)
        save_file(tensors, path / file, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


def _meta_load(path: Path, seed: int, elsewhere: list[str], **kw: Any):
    """The meta build (as OmniStrategy records it) and this 'rank's' load, hosting all but
    ``elsewhere``."""
    torch.manual_seed(seed)
    rec = InitRecording()
    capture_rng(rec, torch.device("cpu"))
    with torch.device("meta"), RecordInit(rec):
        model = from_pretrained(LlavaForConditionalGeneration, path, **kw)
    (source,) = rec.sources
    skip = [model.get_parameter(n) for n in elsewhere]
    materialize(model, rec, skip, torch.device("cpu"), filled=source.tensors())
    report = source.load({id(p) for p in skip}, torch.device("cpu"))
    return model, source, report


def test_missing_keys_get_from_pretrained_values(tmp_path):
    """Keys missing from the checkpoint are initialized by the model's init with exactly
    transformers' draws (the same generator state after), and are named; strict refuses."""
    path = _save_random(tmp_path / "p", shape=LlavaShape())
    missing = ["multi_modal_projector.linear_1.weight",
               "language_model.model.layers.1.input_layernorm.weight"]
    _drop_keys(path, missing)
    torch.manual_seed(1)
    plain = from_pretrained(LlavaForConditionalGeneration, path, dtype=torch.float64)
    after_plain = torch.rand(4)
    elsewhere = ["model.language_model.layers.0.mlp.up_proj.weight"]
    model, source, report = _meta_load(path, 1, elsewhere, dtype=torch.float64)
    assert torch.equal(torch.rand(4), after_plain)
    assert source.missing == ["model.multi_modal_projector.linear_1.weight",
                              "model.language_model.layers.1.input_layernorm.weight"]
    assert source.unexpected == []
    for name, value in plain.state_dict().items():
        got = model.state_dict()[name]
        assert (got.numel() == 0) == (name in elsewhere), name
        if got.numel():
            assert got.dtype == value.dtype and torch.equal(got, value), name
    with pytest.raises(PretrainedError, match="multi_modal_projector.linear_1.weight"):
        _meta_load(path, 1, [], strict=True)
    with pytest.raises(PretrainedError, match="missing keys"):
        from_pretrained(LlavaForConditionalGeneration, path, strict=True)


def test_dtype_auto_and_unexpected_keys(tmp_path):
    path = _save_random(tmp_path / "p")
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    from safetensors.torch import save_file

    save_file({"extra.weight": torch.ones(2)}, path / "extra.safetensors")
    index["weight_map"]["extra.weight"] = "extra.safetensors"
    index_path.write_text(json.dumps(index))
    model, source, report = _meta_load(path, 0, [])
    assert source.unexpected == ["extra.weight"]
    plain = LlavaForConditionalGeneration.from_pretrained(path)
    assert model.dtype == plain.dtype == torch.float32  # "auto": the config's dtype
    for name, value in plain.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert report.tensors == len({id(t) for t in model.state_dict(keep_vars=True).values()
                                  if t.requires_grad})


def test_refusals(tmp_path):
    with pytest.raises(PretrainedError, match="expected a local directory"):
        _meta_load(tmp_path / "nowhere", 0, [])
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(PretrainedError, match="safetensors"):
        _meta_load(tmp_path / "bin", 0, [])
    path = _save_random(tmp_path / "p")
    with pytest.raises(PretrainedError, match=r"\['device_map'\]"):
        _meta_load(path, 0, [], device_map="cpu")
    with pytest.raises(PretrainedError, match="expected a transformers PreTrainedModel"):
        from_pretrained(torch.nn.Linear, path)
    with torch.device("meta"), pytest.raises(PretrainedError, match="outside OmniStrategy"):
        from_pretrained(LlavaForConditionalGeneration, path)
    # a checkpoint of another size: the key, the model's shape and the stored one
    _save_random(tmp_path / "q", shape=LlavaShape(tie_embeddings=True, intermediate=96))
    for f in (tmp_path / "q").glob("*.safetensors"):
        f.replace(path / f.name)
    (tmp_path / "q" / "model.safetensors.index.json").replace(
        path / "model.safetensors.index.json")
    shapes = r"gate_proj.weight.*expected shape \(128, 64\).*got \(96, 64\)"
    with pytest.raises(PretrainedError, match=shapes):
        _meta_load(path, 0, [])


def test_file_plan_is_pure_and_stage_ordered():
    entries = [Entry("a", 1, 60), Entry("b", 0, 60), Entry("c", 0, 60), Entry("d", 1, 200),
               Entry("e", 0, 10)]
    files = plan_files(entries, 100)
    # writer 0 first: [b], [c, e]; writer 1: [a], [d] (alone, over the size)
    assert files == {"b": "model-00001-of-00004.safetensors",
                     "c": "model-00002-of-00004.safetensors",
                     "e": "model-00002-of-00004.safetensors",
                     "a": "model-00003-of-00004.safetensors",
                     "d": "model-00004-of-00004.safetensors"}
    assert plan_files(entries, 100) == files
