"""LastCheckpointAtEnd: ``last.ckpt`` holds the policy that training ended with.

Lightning's ``ModelCheckpoint(save_last=True, every_n_train_steps=K)`` writes ``last`` only with
its periodic saves, and at the end of training only if it never wrote one. An RL run's epoch
never ends (the rollout stream is endless), so a run stopped by ``max_time`` or ``max_steps``
left ``last.ckpt`` up to K optimizer steps behind the policy that the end-of-training
evaluation ran: evaluating or resuming it gave an older policy than the run reported. This
callback writes ``last`` once more when training ends, through the trainer (so through its
checkpoint plugin: atomic, with a digest), where the newest save is older than the run.

``refuse_ignored_time_interval``: Lightning 2.6's ``ModelCheckpoint`` saves a manually optimized
module (APPO's) on ``every_n_train_steps`` only, so ``train_time_interval`` alone never saves
during the run (Lightning-AI/pytorch-lightning#21699); a run meant to leave a checkpoint every
half hour would leave none until it ended.
"""

from __future__ import annotations

import os

import lightning
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_omnilab.checkpoint_io import AtomicCheckpointIO

__all__ = ["LastCheckpointAtEnd", "TIME_INTERVAL_IGNORED", "refuse_ignored_time_interval"]

# the Lightning releases whose ModelCheckpoint skips train_time_interval under manual optimization
# (tests/unilab/test_time_interval_checkpoints.py checks this against the installed one)
TIME_INTERVAL_IGNORED = tuple(int(p) for p in lightning.__version__.split(".")[:2]) >= (2, 6)


def refuse_ignored_time_interval(trainer: pl.Trainer, module: pl.LightningModule) -> None:
    """Raise where a ``ModelCheckpoint(train_time_interval=...)`` would never save mid-run."""
    if module.automatic_optimization or not TIME_INTERVAL_IGNORED:
        return
    for ckpt in trainer.checkpoint_callbacks:
        interval = getattr(ckpt, "_train_time_interval", None)
        if isinstance(ckpt, ModelCheckpoint) and interval is not None:
            raise ValueError(
                f"ModelCheckpoint(train_time_interval={interval}): Lightning "
                f"{lightning.__version__} never saves on a time interval under manual "
                f"optimization ({type(module).__name__}'s), so this run would leave no "
                "checkpoint until it ended (Lightning-AI/pytorch-lightning#21699); use "
                "every_n_train_steps instead")


class LastCheckpointAtEnd(pl.Callback):
    """At the end of training, every ``ModelCheckpoint(save_last=True)``'s ``last`` file is
    rewritten from the final state if its newest save was made at an earlier step."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for ckpt in trainer.checkpoint_callbacks:
            if not isinstance(ckpt, ModelCheckpoint) or not ckpt.save_last:
                continue
            saved_at = getattr(ckpt, "_last_global_step_saved", None)
            if saved_at == trainer.global_step or ckpt.dirpath is None:
                continue
            metrics = {**trainer.callback_metrics,
                       "epoch": torch.tensor(trainer.current_epoch),
                       "step": torch.tensor(trainer.global_step)}
            path = ckpt.format_checkpoint_name(metrics, ckpt.CHECKPOINT_NAME_LAST)
            # save_last="link": replace the link, not the periodic checkpoint it points to.
            # AtomicCheckpointIO's rename does that in one step; another plugin may write
            # through the link, so the link goes first
            durable = isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
            if trainer.is_global_zero and os.path.islink(path) and not durable:
                os.remove(path)
            trainer.save_checkpoint(path, weights_only=ckpt.save_weights_only)
            ckpt.last_model_path = path
