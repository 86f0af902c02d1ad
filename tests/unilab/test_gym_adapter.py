"""PoolVectorEnv behaves as a gymnasium vector env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from lightning_unilab.gym import PoolVectorEnv


def test_spaces_and_metadata() -> None:
    envs = PoolVectorEnv("HalfCheetah-v5", 4, num_threads=1)
    ref = gym.make("HalfCheetah-v5")
    assert envs.single_observation_space.shape == ref.observation_space.shape
    assert envs.single_action_space == ref.action_space
    assert envs.action_space.shape == (4, 6)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs, _ = envs.reset(seed=0)
    assert envs.observation_space.contains(obs)
    envs.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_generic_loop(mode: AutoresetMode) -> None:
    """The loop every gymnasium vector-env user writes, with episodes ending on the way."""
    envs = PoolVectorEnv("InvertedPendulum-v5", 8, num_threads=1, autoreset=mode)
    obs, _ = envs.reset(seed=1)
    envs.action_space.seed(0)
    finished = 0
    last_done = np.zeros(8, bool)
    for _ in range(60):
        obs, reward, term, trunc, info = envs.step(envs.action_space.sample())
        assert obs.shape == (8, 4) and reward.dtype == np.float64
        if mode == AutoresetMode.NEXT_STEP:
            # the step after an episode ends restarts it: reward 0, not done
            assert (reward[last_done] == 0).all() and not (term | trunc)[last_done].any()
        if "_episode" in info:
            mask = info["_episode"]
            finished += int(mask.sum())
            assert (info["episode"]["l"][mask] > 0).all()
            if mode == AutoresetMode.SAME_STEP:
                assert info["_final_obs"][mask].all()
                assert (np.abs(info["final_obs"][mask][:, 1]) > 0.2).any()
        last_done = term | trunc
    assert finished > 0


def test_reset_mask_and_errors() -> None:
    envs = PoolVectorEnv("Hopper-v5", 3, num_threads=1)
    obs, _ = envs.reset(seed=0)
    before = obs.copy()
    for _ in range(5):
        envs.step(np.zeros((3, 3), np.float32))
    moved = envs.env.buffers.obs.copy()
    obs, _ = envs.reset(options={"reset_mask": np.array([False, True, False])})
    np.testing.assert_array_equal(obs[0], moved[0])
    assert not np.allclose(obs[1], moved[1])
    assert before.shape == obs.shape
    with pytest.raises(ValueError, match="reset_mask"):
        envs.reset(options={"reset_mask": np.array([1, 0, 1])})
    with pytest.raises(ValueError, match="autoreset"):
        PoolVectorEnv("Hopper-v5", 2, autoreset="disabled")
