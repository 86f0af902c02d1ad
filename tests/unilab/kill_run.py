"""A small APPO run for tests/unilab/test_resume_after_kill_modes.py: InvertedPendulum-v5, 4 envs x
8 steps, networks of 8 units, one optimizer step per update, a checkpoint after every update
(``ROOT/last.ckpt``, written atomically as unilab-train writes them).

``fit(root, mode, max_steps, ckpt_path, tag)`` runs it in this process: ``mode`` "async" (a
collector process, a 4-slot ring) or "ddp" (2 gloo CPU learners, sync mode, each collecting in
its own process). Every rank appends a line per update to ``ROOT/<tag>_rank<r>.jsonl`` (step,
losses, the batch's stats and the bytes of its observations as a hex digest), and saves its
weights and optimizer state as the fit starts (``<tag>_start_rank<r>.pt``, after a resume has
restored them; also its policy, pickled) and its first batch (``<tag>_batch_rank<r>.pt``).

Run as a script (``python kill_run.py ROOT MODE MAX_STEPS TAG [CKPT]``) it is the run a test
SIGKILLs; under DDP Lightning starts rank 1 by running this script again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_omnilab.checkpoint_io import AtomicCheckpointIO
from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.runtime.data import RolloutDataModule

NUM_ENVS, HORIZON, NUM_SLOTS = 4, 8, 4
STATS = ("seq", "env_steps", "episodes_total", "policy_version")


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()[:16]


class Record(pl.Callback):
    """Each update's losses and batch stats, flushed as they come (the run may be killed)."""

    def __init__(self, root: Path, tag: str) -> None:
        self.root, self.tag = root, tag
        self.first = True

    def _path(self, trainer: pl.Trainer, what: str) -> Path:
        return self.root / f"{self.tag}{what}_rank{trainer.global_rank}"

    def on_train_start(self, trainer, module) -> None:
        optimizer = trainer.optimizers[0]
        torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                    "policy": copy.deepcopy(module.policy), "global_step": trainer.global_step},
                   f"{self._path(trainer, '_start')}.pt")

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.stats = {k: int(batch["stats"][k]) for k in STATS}
        self.stats["lag"] = module.policy_version - self.stats["policy_version"]
        self.stats["obs"] = digest(batch["obs"])
        if self.first:
            self.first = False
            torch.save({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)},
                       f"{self._path(trainer, '_batch')}.pt")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        losses = {k: float(v) for k, v in trainer.callback_metrics.items()
                  if k.startswith(("loss/", "learner/kl"))}
        line = {"step": trainer.global_step, "losses": losses, **self.stats}
        with open(f"{self._path(trainer, '')}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


def fit(root: Path, mode: str, max_steps: int, tag: str, ckpt_path: str | None = None) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    ddp = mode == "ddp"
    dm = RolloutDataModule("InvertedPendulum-v5", num_envs=NUM_ENVS, horizon=HORIZON,
                           mode="sync" if ddp else "async", num_slots=NUM_SLOTS,
                           collector_threads=1, seed=3)
    module = APPOModule(actor_hidden=(8,), critic_hidden=(8,), epochs=1, minibatches=1)
    save = ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0, every_n_train_steps=1)
    pl.Trainer(accelerator="cpu", devices=2 if ddp else 1, strategy="ddp" if ddp else "auto",
               max_steps=max_steps, logger=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[Record(root, tag), save],
               default_root_dir=root, plugins=[AtomicCheckpointIO()],
               ).fit(module, datamodule=dm, ckpt_path=ckpt_path)


if __name__ == "__main__":
    fit(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4],
        sys.argv[5] if len(sys.argv) > 5 else None)
