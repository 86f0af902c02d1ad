"""The network that leaves training: raw observations in, the evaluation's actions out."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from lightning_unilab.learner.policy import ActorCritic

__all__ = ["DeployedActor", "evaluation_actor", "sample_observations"]


def evaluation_actor(policy: ActorCritic) -> ActorCritic:
    """The policy as the evaluation runs it (``evaluate.run_episode``): a float32 CPU copy in
    eval mode, its normalizer's float64 statistics cast too. The export starts from this copy,
    so that its reference is the evaluation's actor to the bit."""
    return copy.deepcopy(policy).cpu().float().eval()


class DeployedActor(nn.Module):
    """``[batch, obs]`` raw float32 observations -> ``[batch, action]`` deterministic actions
    (the Gaussian's mean), what the evaluation sends to the task: the observation normalizer
    (z-score and clip under the training statistics) folded in ahead of the actor MLP, so a
    robot program feeds the observation as it measures it. The critic stays behind."""

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__()
        policy = evaluation_actor(policy)
        self.normalizer: nn.Module = (policy.obs_normalizer if policy.normalize_obs
                                      else nn.Identity())
        self.actor = policy.actor

    def forward(self, obs: Tensor) -> Tensor:
        return self.actor(self.normalizer(obs))


def sample_observations(policy: ActorCritic, batch: int, seed: int = 0) -> Tensor:
    """``batch`` raw float32 observations spread over twice the policy's training statistics'
    std around their mean, so that the normalizer's clip is met too: the export's check."""
    stats = policy.obs_normalizer
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, policy.obs_size, generator=gen, dtype=torch.float64)
    return (stats.mean.double().cpu() + 2.0 * stats.var.double().cpu().sqrt() * noise).float()
