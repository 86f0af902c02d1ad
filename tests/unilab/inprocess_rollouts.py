"""In-process rollout batches for the learner's tests: APPOModule through a real Trainer on
fixed slots, without the collector process and ring."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.rollout import RolloutSpec, RolloutState, as_tensors, collect


class FixedBatches(pl.LightningDataModule):
    """Yields the given batches once each, in order; counts publications."""

    def __init__(self, batches: list[dict[str, Any]], env_spec: Any) -> None:
        super().__init__()
        self.batches = batches
        self.env_spec = env_spec
        self.published: list[int] = []

    def publish_policy(self, policy: ActorCritic) -> int:
        self.published.append(len(self.published) + 1)
        return self.published[-1]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None)


def one_rollout(policy: ActorCritic, task: str = "InvertedPendulum-v5", num_envs: int = 16,
                horizon: int = 16, seed: int = 0, policy_version: int = 0) -> dict[str, Any]:
    """One batch collected in this process with ``policy`` (tensors own their memory)."""
    env = TaskVectorEnv(task, num_envs, num_threads=1, seed=seed)
    spec = RolloutSpec.from_env(env, horizon)
    state = RolloutState.start(env, seed=seed)
    state.policy_version = policy_version
    arrays = spec.allocate()
    collect(env, policy, arrays, state)
    env.close()
    return as_tensors(arrays)
