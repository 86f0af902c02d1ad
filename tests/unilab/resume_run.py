"""A small sync APPO run as the recipes make it, for tests/unilab/test_resume_after_kill.py.

``fit(root, updates, ...)`` trains ``updates`` updates (of 4 optimizer steps) of
g1-walk-flat as its recipe does (G1Randomization: per-env model fields drawn at every restart;
contacts solved in 3 iterations, so warm starts matter; falls, so episodes restart), collected
in the learner's process, and returns the module.

Run as a script (``python resume_run.py ROOT K``) it saves a checkpoint after every update
(``ROOT/last.ckpt``, written atomically as unilab-train writes them), appends each update's
losses to ``ROOT/losses.jsonl`` and SIGKILLs itself once update K is saved, when update K+1
starts: a killed run, with nothing flushed or closed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_omnilab.checkpoint_io import AtomicCheckpointIO
from lightning_unilab.envs.randomization import G1Randomization
from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.runtime.data import RolloutDataModule

STEPS_PER_UPDATE = 4  # epochs x minibatches: Lightning counts optimizer steps


class Losses(pl.Callback):
    """Each update's logged losses, KL and lr by update number (1, 2, ...); optionally appended
    to a file as they come, and a SIGKILL of this process once ``kill_after`` updates are
    saved."""

    def __init__(self, path: Path | None = None, kill_after: int | None = None) -> None:
        self.by_update: dict[int, dict[str, float]] = {}
        self.path, self.kill_after = path, kill_after

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        update = trainer.global_step // STEPS_PER_UPDATE
        losses = {k: float(v) for k, v in trainer.callback_metrics.items()
                  if k.startswith(("loss/", "learner/kl", "learner/lr"))}
        self.by_update[update] = losses
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"update": update, "losses": losses}) + "\n")

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        # the checkpoint of the previous update was saved at its end (ModelCheckpoint runs last)
        if self.kill_after is not None and trainer.global_step // STEPS_PER_UPDATE == \
                self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)


def fit(root: Path, updates: int, callbacks: list[pl.Callback], ckpt_path: str | None = None,
        save_every_update: bool = False) -> APPOModule:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    dm = RolloutDataModule("g1-walk-flat", num_envs=8, horizon=8, mode="sync", seed=3,
                           randomization=G1Randomization())
    module = APPOModule(actor_hidden=(16,), critic_hidden=(16,), epochs=2, minibatches=2)
    if save_every_update:
        callbacks = [*callbacks, ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0,
                                                 every_n_train_steps=STEPS_PER_UPDATE)]
    pl.Trainer(accelerator="cpu", max_steps=updates * STEPS_PER_UPDATE, logger=False,
               enable_checkpointing=save_every_update, enable_progress_bar=False,
               enable_model_summary=False, callbacks=callbacks, default_root_dir=root,
               plugins=[AtomicCheckpointIO()]).fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


if __name__ == "__main__":
    root, kill_after = Path(sys.argv[1]), int(sys.argv[2])
    fit(root, 10 * kill_after, [Losses(root / "losses.jsonl", kill_after)],
        save_every_update=True)
    sys.exit("not killed")
