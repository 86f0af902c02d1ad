"""The multimodal recipe: its data is what it claims, and it learns through its LightningCLI
entry point and YAMLs: in one process with plain Lightning, and on 2 processes with
OmniStrategy (pipeline 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omni_models import run_recipe

from lightning_omni.examples.multimodal_data import (
    AUD,
    AUDIO_DIM,
    IMAGE_DIM,
    IMG,
    MAX_FRAMES,
    CaptionDataset,
    MultimodalCaptionData,
    collate,
)
from lightning_omni.examples.multimodal_train import main

REPO = Path(__file__).resolve().parents[2]


def test_samples_and_batches_are_consistent():
    data = CaptionDataset(200, seed=3, mix=(1, 1, 1))
    batch = collate([data[i] for i in range(200)])
    for name, tid, dim in (("image", IMG, IMAGE_DIM), ("audio", AUD, AUDIO_DIM)):
        # one placeholder token per encoder row, and rows past the length are padding
        assert torch.equal((batch["tokens"] == tid).sum(1), batch[f"{name}_len"])
        assert batch[name].shape[2] == dim
    lengths = batch["audio_len"][batch["audio_len"] > 0]
    assert lengths.min() >= 4 and lengths.max() <= MAX_FRAMES
    assert lengths.float().median() < lengths.max() / 3  # heavy tail: most are short
    sizes = set(batch["image_len"][batch["image_len"] > 0].tolist())
    assert len(sizes) >= 4  # several resolutions
    assert (batch["labels"] != -100).sum(1).min() >= 3
    # deterministic
    again = collate([CaptionDataset(200, seed=3)[i] for i in range(200)])
    assert torch.equal(batch["tokens"], again["tokens"])


def test_stages_change_the_mix():
    dm = MultimodalCaptionData(samples_per_epoch=60, stages=[[1, 0, 0], [0, 0, 1]],
                               epochs_per_stage=1)
    counts = []
    for epoch in (0, 1, 5):
        dm.set_epoch(epoch)
        b = collate([dm.train_set[i] for i in range(60)])
        counts.append(((b["image_len"] > 0).sum().item(), (b["audio_len"] > 0).sum().item()))
    assert counts == [(60, 0), (0, 60), (0, 60)]
    with pytest.raises(ValueError, match="mix"):
        dm.train_set.set_mix([1, -1, 0])


def test_recipe_learns(tmp_path):
    args = ["--config", str(REPO / "recipes/omni/multimodal_single.yaml"),
            "--trainer.max_epochs=4", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--model.hidden=32", "--model.layers=2", "--data.samples_per_epoch=256",
            "--data.epochs_per_stage=1", "--data.val_samples=96"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: more threads only contend on a shared 2-core box
    try:
        cli = main(args, run=False)
        before = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        after = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    finally:
        torch.set_num_threads(threads)
    assert after["val/loss"] < 0.5 * before["val/loss"]
    assert after["val/caption_acc"] > before["val/caption_acc"] + 0.3
    assert after["val/caption_acc"] > 0.6
    assert list(tmp_path.rglob("events.out.tfevents.*"))  # TensorBoard got the curves


def test_recipe_learns_with_omni_strategy(tmp_path):
    """The 4-process YAML shrunk to pipeline 2 x data parallel 1 (2 processes, 16 steps): the
    LightningCLI command trains through OmniStrategy and TensorBoard shows learning."""
    ea = run_recipe("lightning_omni.examples.multimodal_train",
                    ["--config", "recipes/omni/multimodal.yaml", "--trainer.devices", "2",
                     "--trainer.strategy.init_args.data_parallel", "1",
                     "--trainer.max_epochs", "2", "--data.samples_per_epoch", "128",
                     "--data.epochs_per_stage", "1", "--model.hidden", "32",
                     "--model.layers", "2", "--trainer.enable_model_summary", "false"],
                    tmp_path)
    loss = [e.value for e in ea.Scalars("omni/loss")]
    acc = [e.value for e in ea.Scalars("train/caption_acc")]
    assert len(loss) >= 6 and len(acc) >= 6  # every log_every_n_steps=2 of 16 steps
    assert sum(loss[-3:]) / 3 < 0.7 * loss[0]
    assert sum(acc[-3:]) / 3 > sum(acc[:3]) / 3 + 0.15
    # validation runs pipelined too: one val/loss per epoch, and it falls
    val = [e.value for e in ea.Scalars("val/loss")]
    assert len(val) == 2 and val[1] < val[0]
