"""An in-process stand-in for RolloutDataModule: the same batches, collected in the loader.

It lets the learner's tests run APPOModule through a real Trainer without the collector
process and ring: each batch is collected with the latest published weights when Lightning
asks for it (Lightning fetches one batch ahead, so slots arrive with a policy lag of 1).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_unilab.policy import ActorCritic
from lightning_unilab.rollout import RolloutSpec, RolloutState, as_tensors, collect
from lightning_unilab.vector_env import TaskVectorEnv


class _Rollouts(IterableDataset):
    def __init__(self, dm: InProcessRollouts) -> None:
        self.dm = dm

    def __iter__(self) -> Iterator[dict[str, Any]]:
        dm = self.dm
        for _ in range(dm.max_slots):
            if dm.actor is None:
                dm.publish_policy(dm.trainer.lightning_module.policy, count=False)
            arrays = dm.spec.allocate()  # fresh arrays: the prefetched batch must not alias
            dm.state.policy_version = dm.version
            collect(dm.env, dm.actor, arrays, dm.state)
            yield as_tensors(arrays)


class InProcessRollouts(pl.LightningDataModule):
    def __init__(self, task: str = "InvertedPendulum-v5", num_envs: int = 32, horizon: int = 32,
                 seed: int = 0, max_slots: int = 10**9) -> None:
        super().__init__()
        self.task = task
        self.env = TaskVectorEnv(task, num_envs, num_threads=1, seed=seed)
        self.spec = RolloutSpec.from_env(self.env, horizon)
        self.env_spec = self.spec
        self.state = RolloutState.start(self.env, seed=seed)
        self.max_slots = max_slots
        self.actor: ActorCritic | None = None
        self.version = 0
        self.published = 0

    def publish_policy(self, policy: ActorCritic, count: bool = True) -> int:
        self.actor = copy.deepcopy(policy).to("cpu", torch.float32).eval()
        if count:
            self.version += 1
            self.published += 1
        return self.version

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Rollouts(self), batch_size=None)


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
