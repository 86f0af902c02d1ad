"""TaskVectorEnv: auto-reset, caller buffers, seeding, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_unilab.envs import tasks
from lightning_unilab.envs.vector_env import STATUS_BAD_ACTION, StepBuffers, TaskVectorEnv


def _run(env: TaskVectorEnv, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    spec = env.spec
    out = []
    for _ in range(steps):
        obs, reward, *_ = env.step(rng.uniform(spec.action_low, spec.action_high,
                                               (env.num_envs, spec.action_size)))
        out.append(np.concatenate([obs.ravel(), reward]))
    return out


def test_same_results_for_any_thread_count() -> None:
    a = TaskVectorEnv("Hopper-v5", 8, num_threads=1)
    b = TaskVectorEnv("Hopper-v5", 8, num_threads=2)
    np.testing.assert_array_equal(a.reset(seed=5)[0], b.reset(seed=5)[0])
    for x, y in zip(_run(a, 40), _run(b, 40), strict=True):
        np.testing.assert_array_equal(x, y)
    # a different seed gives different starts; the same seed the same
    c = TaskVectorEnv("Hopper-v5", 8, num_threads=1)
    assert not np.array_equal(c.reset(seed=6)[0], a.reset(seed=5)[0])
    np.testing.assert_array_equal(c.reset(seed=5)[0], a.reset(seed=5)[0])


def test_next_step_autoreset_and_episode_stats() -> None:
    env = TaskVectorEnv("InvertedPendulum-v5", 4, num_threads=1, autoreset="next_step")
    env.reset(seed=0)
    push = np.full((4, 1), 3.0)
    ended = None
    for t in range(200):
        obs, reward, term, trunc, info = env.step(push)
        if term.any():
            ended = np.flatnonzero(term)
            assert (info["episode_length"][ended] == t + 1).all()
            assert (info["episode_return"][ended] == t).all()  # reward 1 until the last step
            assert (np.abs(obs[ended, 1]) > 0.2).all()  # the last obs, not a reset one
            break
    assert ended is not None
    obs, reward, term, trunc, _ = env.step(push)
    assert (reward[ended] == 0).all() and not term[ended].any() and not trunc[ended].any()
    assert (np.abs(obs[ended, 1]) <= 0.01 + 1e-12).all()  # a fresh start state


def test_truncation_at_time_limit() -> None:
    env = TaskVectorEnv("HalfCheetah-v5", 2, num_threads=1, params={"max_episode_steps": 5})
    env.reset(seed=0)
    for _ in range(5):
        _, _, term, trunc, info = env.step(np.zeros((2, 6)))
    assert trunc.all() and not term.any() and (info["episode_length"] == 5).all()
    np.testing.assert_array_equal(info["final_obs"].shape, (2, 17))


def test_caller_buffers_are_written_in_place() -> None:
    env = TaskVectorEnv("Ant-v5", 3, num_threads=1)
    out = StepBuffers.allocate(3, env.spec)
    obs, _ = env.reset(seed=0, out=out)
    assert obs is out.obs
    result = env.step(np.zeros((3, 8)), out=out)
    assert result[0] is out.obs and result[1] is out.reward
    assert np.abs(out.obs).sum() > 0
    bad = StepBuffers.allocate(3, env.spec)
    bad.reward = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="out.reward"):
        env.step(np.zeros((3, 8)), out=bad)


def test_bad_actions_raise_clearly() -> None:
    env = TaskVectorEnv("Ant-v5", 3, num_threads=1)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(3, 8\)"):
        env.step(np.zeros((3, 7)))
    with pytest.raises(TypeError, match="floating"):
        env.step(np.zeros((3, 8), np.int64))
    before = env.pool.state.copy()
    acts = np.zeros((3, 8))
    acts[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"env\(s\) \[1\]"):
        env.step(acts)
    np.testing.assert_array_equal(env.pool.state, before)  # nothing stepped


def test_nonfinite_actions_truncate_only_their_env() -> None:
    env = TaskVectorEnv("Ant-v5", 3, num_threads=2, nonfinite="truncate")
    ref = TaskVectorEnv("Ant-v5", 3, num_threads=1)
    env.reset(seed=0)
    ref.reset(seed=0)
    acts = np.random.default_rng(0).uniform(-1, 1, (3, 8))
    bad = acts.copy()
    bad[1] = np.inf
    obs, reward, term, trunc, info = env.step(bad)
    obs_ref, reward_ref, *_ = ref.step(acts)
    assert trunc[1] and not term[1] and reward[1] == 0
    assert env.pool.status[1] == 0  # restarted (same-step), status cleared with the episode
    np.testing.assert_array_equal(obs[[0, 2]], obs_ref[[0, 2]])
    np.testing.assert_array_equal(reward[[0, 2]], reward_ref[[0, 2]])
    assert np.isfinite(obs).all() and np.isfinite(info["final_obs"][1]).all()
    nxt = TaskVectorEnv("Ant-v5", 2, num_threads=1, nonfinite="truncate", autoreset="next_step")
    nxt.reset(seed=0)
    _, _, _, trunc, _ = nxt.step(np.array([[np.nan] * 8, [0.0] * 8]))
    assert trunc[0] and nxt.pool.status[0] & STATUS_BAD_ACTION


def test_unknown_names_and_params() -> None:
    with pytest.raises(ValueError, match="did you mean 'Hopper-v5'"):
        TaskVectorEnv("Hoper-v5", 2)
    with pytest.raises(ValueError, match="g1-walk-flat"):
        tasks.get("g1-walk")
    with pytest.raises(ValueError, match="ctrl_cost_weight"):
        TaskVectorEnv("Ant-v5", 2, params={"ctrl_cost_weigth": 0.1})
    with pytest.raises(ValueError, match="autoreset"):
        TaskVectorEnv("Ant-v5", 2, autoreset="later")


def test_reset_subset_keeps_others() -> None:
    env = TaskVectorEnv("Walker2d-v5", 4, num_threads=1)
    env.reset(seed=0)
    _run(env, 3)
    state = env.pool.state.copy()
    env.reset(ids=[1, 3])
    np.testing.assert_array_equal(env.pool.state[[0, 2]], state[[0, 2]])
    assert (env.pool.time[[1, 3]] == 0).all()
