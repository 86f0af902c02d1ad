"""PoolVectorEnv behaves as a gymnasium vector env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils import env_checker
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import (
    ClipAction,
    NormalizeObservation,
    NormalizeReward,
    RecordEpisodeStatistics,
    TransformObservation,
    TransformReward,
)

from lightning_unilab import describe_status
from lightning_unilab.envs.gym import PoolVectorEnv


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
    envs = PoolVectorEnv("InvertedPendulum-v5", 8, num_threads=1, autoreset=mode,
                         record_episode_statistics=True)
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


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_cleanrl_wrapper_stack_runs_unchanged(mode: str) -> None:
    """CleanRL's ppo_continuous_action stack, in its order. gymnasium's observation wrappers
    accept only NEXT_STEP envs, so SAME_STEP runs the rest of the stack."""
    envs = PoolVectorEnv("InvertedPendulum-v5", 8, num_threads=1, autoreset=mode)
    ref = PoolVectorEnv("InvertedPendulum-v5", 8, num_threads=1, autoreset=mode,
                        record_episode_statistics=True)
    envs = RecordEpisodeStatistics(envs)
    envs = ClipAction(envs)
    if mode == "next_step":
        envs = NormalizeObservation(envs)
        envs = TransformObservation(envs, lambda obs: np.clip(obs, -10, 10))
    envs = NormalizeReward(envs, gamma=0.99)
    envs = TransformReward(envs, lambda r: np.clip(r, -10, 10))
    envs.reset(seed=3)
    ref.reset(seed=3)
    rng = np.random.default_rng(0)
    lengths, ref_lengths = [], []
    for _ in range(120):
        actions = rng.uniform(-5, 5, (8, 1)).astype(np.float32)  # ClipAction's job
        obs, reward, term, trunc, info = envs.step(actions)
        *_, ref_info = ref.step(np.clip(actions, -3, 3))
        assert np.isfinite(obs).all() and np.isfinite(reward).all()
        if "_episode" in info:
            mask = info["_episode"]
            lengths += info["episode"]["l"][mask].tolist()
            ref_lengths += ref_info["episode"]["l"][ref_info["_episode"]].tolist()
            assert np.isfinite(info["episode"]["r"][mask]).all()
    assert lengths and lengths == ref_lengths  # the wrapper counts what the C++ side counts


def test_returned_arrays_are_fresh_unless_opted_out() -> None:
    envs = PoolVectorEnv("Hopper-v5", 2, num_threads=1)
    obs0, _ = envs.reset(seed=0)
    kept = obs0.copy()
    obs1, reward1, *_ = envs.step(np.zeros((2, 3), np.float32))
    kept1, kept_reward = obs1.copy(), reward1.copy()
    envs.step(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(obs0, kept)
    np.testing.assert_array_equal(obs1, kept1)
    np.testing.assert_array_equal(reward1, kept_reward)
    fast = PoolVectorEnv("Hopper-v5", 2, num_threads=1, copy=False)
    fast.reset(seed=0)
    a, *_ = fast.step(np.zeros((2, 3), np.float32))
    b, *_ = fast.step(np.zeros((2, 3), np.float32))
    assert a is b  # the documented zero-copy opt-in


def test_gymnasium_checkers() -> None:
    """gymnasium's env checks that apply to a vector env (its step-determinism check needs a
    single env's Python-bool truncation; the same property is asserted below)."""
    for mode in ("next_step", "same_step"):
        envs = PoolVectorEnv("Hopper-v5", 1, num_threads=1, autoreset=mode)
        env_checker.check_reset_seed_determinism(envs)
        env_checker.check_reset_options(envs)
        env_checker.check_reset_return_type(envs)
        env_checker.check_reset_return_info_deprecation(envs)
        env_checker.check_seed_deprecation(envs)
        env_checker.check_returned_data_not_reused(envs)
        envs.action_space.seed(5)
        action = envs.action_space.sample()
        envs.reset(seed=123)
        first = envs.step(action)
        state = envs.np_random.bit_generator.state
        envs.reset(seed=123)
        second = envs.step(action)
        assert envs.np_random.bit_generator.state == state
        for a, b in zip(first[:4], second[:4], strict=True):
            np.testing.assert_array_equal(a, b)
        assert env_checker.data_equivalence(first[4], second[4], exact=True)


def test_seeds_lists_and_bad_seeds() -> None:
    envs = PoolVectorEnv("Hopper-v5", 4, num_threads=1)
    a, _ = envs.reset(seed=[0, 1, 2, 3])
    b, _ = envs.reset(seed=[0, 1, 2, 3])
    np.testing.assert_array_equal(a, b)
    c, _ = envs.reset(seed=[0, 1, 2, 9])
    np.testing.assert_array_equal(a[:3], c[:3])  # each env's stream comes from its own seed
    assert not np.array_equal(a[3], c[3])
    draw = envs.np_random.random()
    envs.reset(seed=[0, 1, 2, 3])
    assert envs.np_random.random() == draw
    state = envs.pool.state.copy()
    with pytest.raises(ValueError, match=r"seed: expected an int >= 0, got -1"):
        envs.reset(seed=-1)
    with pytest.raises(ValueError, match="seed: expected one int or 4 ints"):
        envs.reset(seed=[1, 2])
    with pytest.raises(TypeError, match=r"seed\[1\]"):
        envs.reset(seed=[1, "x", 3, 4])
    np.testing.assert_array_equal(envs.pool.state, state)  # nothing was reset or re-seeded
    with pytest.raises(ValueError, match="options: unknown key"):
        envs.reset(options={"mask": None})


def test_start_states_through_options() -> None:
    envs = PoolVectorEnv("Hopper-v5", 3, num_threads=1)
    envs.reset(seed=0)
    for _ in range(4):
        envs.step(np.full((3, 3), 0.3, np.float32))
    row = envs.pool.state[0].copy()
    obs_row = envs.step(np.zeros((3, 3), np.float32))[0][0]
    mask = np.array([False, True, True])
    obs, info = envs.reset(options={"reset_mask": mask,
                                    "initial_state": np.stack([row, row])})
    np.testing.assert_array_equal(envs.pool.state[1], row)
    np.testing.assert_array_equal(obs[1], obs[2])
    assert info["_x_position"].tolist() == mask.tolist()
    assert not np.array_equal(obs[1], obs_row)


def test_info_terms_and_final_info() -> None:
    envs = PoolVectorEnv("HalfCheetah-v5", 2, num_threads=1, autoreset="same_step",
                         max_episode_steps=3)
    _, info = envs.reset(seed=0)
    assert set(info) == {"x_position", "_x_position"}  # gymnasium's reset info
    for _ in range(3):
        _, reward, _, trunc, info = envs.step(np.full((2, 6), 0.5, np.float32))
        np.testing.assert_allclose(reward, info["reward_forward"] + info["reward_ctrl"],
                                   rtol=0, atol=1e-12)
        assert info["_x_velocity"].all() and (info["status"] == 0).all()
    assert trunc.all() and info["_final_info"].all()
    final = info["final_info"]
    np.testing.assert_array_equal(final["x_position"], info["x_position"])
    assert final["_x_position"].all() and info["final_obs"].shape == (2, 17)
    assert describe_status(0) == []


def test_closed_env_and_bad_arguments() -> None:
    envs = PoolVectorEnv("Hopper-v5", 2, num_threads=1)
    envs.reset(seed=0)
    envs.close()
    with pytest.raises(RuntimeError, match="closed"):
        envs.step(np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="closed"):
        envs.reset()
    envs.close()  # twice is harmless
    with pytest.raises(ValueError, match="render_mode"):
        PoolVectorEnv("Hopper-v5", 2, render_mode="human")
    with pytest.raises(TypeError, match=r"params\['ctrl_cost_weight'\]: expected a number"):
        PoolVectorEnv("Hopper-v5", 2, params={"ctrl_cost_weight": "high"})
    with pytest.raises(ValueError, match="num_envs"):
        PoolVectorEnv("Hopper-v5", True)
    # found by the fuzz door: the pool's "ids", truthy stand-ins, a size checked only when drawn
    with pytest.raises(IndexError, match=r"^render_envs: ids: expected env ids in \[0, 2\)"):
        PoolVectorEnv("Hopper-v5", 2, render_envs=[5])
    with pytest.raises(TypeError, match="copy: expected True or False"):
        PoolVectorEnv("Hopper-v5", 2, copy="no")
    with pytest.raises(TypeError, match="record_episode_statistics: expected True or False"):
        PoolVectorEnv("Hopper-v5", 2, record_episode_statistics=1)
    with pytest.raises(ValueError, match="render_size"):
        PoolVectorEnv("Hopper-v5", 2, render_size=(0, 480))
