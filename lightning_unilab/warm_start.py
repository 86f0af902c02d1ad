"""WarmStart: a new run that starts from another run's policy, with a fresh optimizer.

A fine-tune under changed task parameters (pushes, observation noise, action delay turned on
for a policy that already walks) is a new run, not a resume: ``--ckpt_path`` restores the
optimizer, the step count and every env's state, and refuses a task whose parameters changed.
This callback loads only the policy (weights and observation normalizers) of a checkpoint
before the collector starts, so the first rollout is already collected with it.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch

from lightning_omnilab import safe_load

__all__ = ["WarmStart"]

PREFIX = "policy."


class WarmStart(pl.Callback):
    """Load ``checkpoint``'s policy into the module's at the start of ``fit``; a resumed run
    (``ckpt_path`` given) keeps the policy it resumes."""

    def __init__(self, checkpoint: str | os.PathLike[str]) -> None:
        if not isinstance(checkpoint, str | os.PathLike):
            raise TypeError(f"checkpoint: expected a path, got {checkpoint!r}")
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f"checkpoint: no file at {os.fspath(checkpoint)!r}")
        self.checkpoint = os.fspath(checkpoint)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.ckpt_path is not None:
            return
        policy = getattr(pl_module, "policy", None)
        if not isinstance(policy, torch.nn.Module):
            raise TypeError(f"WarmStart: {type(pl_module).__name__} has no policy module to load "
                            "into (an APPOModule has one once set up)")
        state = safe_load.load(self.checkpoint).get("state_dict", {})
        loaded = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
        own = policy.state_dict()
        if set(loaded) != set(own):
            raise ValueError(f"{self.checkpoint}: its policy's tensors are not this run's "
                             f"(missing {sorted(set(own) - set(loaded))[:4]}, unexpected "
                             f"{sorted(set(loaded) - set(own))[:4]})")
        for key, value in loaded.items():
            if value.shape != own[key].shape:
                raise ValueError(f"{self.checkpoint}: policy.{key}: shape {tuple(value.shape)}, "
                                 f"this run's is {tuple(own[key].shape)} (another task or "
                                 "network size)")
        policy.load_state_dict(loaded)
