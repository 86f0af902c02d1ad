"""ModelCheckpoint(train_time_interval) under manual optimization: refused where Lightning
ignores it, and the claim that it ignores it checked against the installed Lightning."""

from __future__ import annotations

from datetime import timedelta

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_unilab.last_checkpoint import TIME_INTERVAL_IGNORED
from lightning_unilab.learner.appo import APPOModule


class _ManualModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.layer(batch).pow(2).mean())
        opt.step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, **kwargs) -> pl.Trainer:
    ckpt = ModelCheckpoint(dirpath=tmp_path, filename="{step}", save_top_k=-1,
                           train_time_interval=timedelta(microseconds=1))
    return pl.Trainer(accelerator="cpu", callbacks=[ckpt], logger=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_the_installed_lightning_saves_on_time_as_the_flag_says(tmp_path):
    """Saves after most of 6 steps where Lightning honours the interval, none mid-run where
    TIME_INTERVAL_IGNORED says it does not (the epoch, 100 batches long, never ends)."""
    trainer = _trainer(tmp_path, max_steps=6)
    trainer.fit(_ManualModule(), DataLoader(torch.randn(100, 2), batch_size=1))
    saved = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    if TIME_INTERVAL_IGNORED:
        assert len(saved) <= 1, saved  # at most the end of training's
    else:
        assert len(saved) >= 3, saved


@pytest.mark.skipif(not TIME_INTERVAL_IGNORED,
                    reason="this Lightning saves on train_time_interval under manual optimization")
def test_appo_refuses_a_time_interval_checkpoint_that_would_never_save(tmp_path):
    module = APPOModule(actor_hidden=(4,), critic_hidden=(4,), obs_size=3, action_size=1)
    module.trainer = _trainer(tmp_path)
    with pytest.raises(ValueError, match=r"train_time_interval=.*every_n_train_steps"):
        module.setup("fit")


def test_appo_accepts_step_interval_checkpoints(tmp_path):
    module = APPOModule(actor_hidden=(4,), critic_hidden=(4,), obs_size=3, action_size=1)
    module.trainer = pl.Trainer(accelerator="cpu", logger=False,
                                callbacks=[ModelCheckpoint(dirpath=tmp_path,
                                                           every_n_train_steps=10)])
    module.setup("fit")
    assert module.policy is not None
