"""The tasks are gymnasium ids under omnilab/, reachable through gym.make_vec."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import lightning_unilab  # noqa: F401 - registers the ids
from lightning_unilab.envs import tasks
from lightning_unilab.envs.gym import PoolVectorEnv
from lightning_unilab.envs.registration import register_envs


def test_every_task_is_registered() -> None:
    ids = register_envs()  # idempotent
    assert ids == [f"omnilab/{name}" for name in tasks.task_names()]
    assert all(i in gym.registry for i in ids)


def test_make_vec_reaches_the_pool_with_a_spec() -> None:
    envs = gym.make_vec("omnilab/HalfCheetah-v5", num_envs=3, num_threads=1)
    assert isinstance(envs, PoolVectorEnv)
    assert envs.spec is not None and envs.spec.id == "omnilab/HalfCheetah-v5"
    assert envs.spec.kwargs["num_envs"] == 3
    obs, info = envs.reset(seed=0)
    assert obs.shape == (3, 17) and "x_position" in info
    short = gym.make_vec("omnilab/Hopper-v5", num_envs=2, num_threads=1,
                         autoreset="same_step", max_episode_steps=2)
    short.reset(seed=0)
    short.step(np.zeros((2, 3), np.float32))
    *_, trunc, _ = short.step(np.zeros((2, 3), np.float32))
    assert trunc.all()


def test_sync_mode_gives_gymnasiums_own_env() -> None:
    ref = gym.make_vec("omnilab/Hopper-v5", num_envs=2, vectorization_mode="sync")
    assert isinstance(ref, gym.vector.SyncVectorEnv)
    ours = gym.make_vec("omnilab/Hopper-v5", num_envs=2, num_threads=1)
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.single_action_space == ref.single_action_space


def test_unknown_kwargs_are_refused() -> None:
    with pytest.raises(TypeError, match="colour"):
        gym.make_vec("omnilab/Hopper-v5", num_envs=2, colour="red")
