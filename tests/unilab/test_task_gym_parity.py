"""The C++ gymnasium tasks match gymnasium's own envs step for step (obs, reward, terminations).

Both start from the same state (gymnasium's reset state copied into the pool) and take the same
actions; at every episode end the next gymnasium reset state is copied over again. float64
actions run 1000 steps; float32 actions (what policies produce, and whose control cost gymnasium
computes in float32) 300. The named info terms (reward terms, positions, velocities) agree too.
"""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest

from lightning_unilab.envs.vector_env import TaskVectorEnv

TASKS = ["HalfCheetah-v5", "Ant-v5", "InvertedPendulum-v5", "Hopper-v5", "Walker2d-v5",
         "Humanoid-v5"]
STEPS = 1000


def _state(env: gym.Env) -> np.ndarray:
    u = env.unwrapped
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    row = np.empty(mujoco.mj_stateSize(u.model, spec))
    mujoco.mj_getState(u.model, u.data, row, spec)
    return row


def _check_info(name: str, t: int, info: dict, ref_info: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        np.testing.assert_allclose(info[key][0], ref_info[key], rtol=0, atol=1e-8,
                                   err_msg=f"{name} step {t} info[{key!r}]")
    missing = set(ref_info) - set(keys) - {"tendon_length", "tendon_velocity"}
    assert not missing, f"{name}: gymnasium reports {missing} that the task does not"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", TASKS)
def test_matches_gymnasium(name: str, dtype: type) -> None:
    ref = gym.make(name)
    env = TaskVectorEnv(name, num_envs=1, num_threads=1)
    rng = np.random.default_rng(0)
    low, high = ref.action_space.low.astype(np.float64), ref.action_space.high.astype(np.float64)
    seed = 0
    obs_ref, info_ref = ref.reset(seed=seed)
    obs, info = env.reset(initial_state=_state(ref)[None])
    np.testing.assert_allclose(obs[0], obs_ref, rtol=0, atol=1e-8)
    keys = env.spec.info_names
    _check_info(name, -1, info, info_ref, keys[: env.spec.reset_info_size])
    episodes = 0
    for t in range(STEPS if dtype == np.float64 else 300):
        action = rng.uniform(low, high).astype(dtype)
        obs_ref, r_ref, term_ref, trunc_ref, info_ref = ref.step(action)
        obs, r, term, trunc, info = env.step(action[None])
        done = bool(term[0] or trunc[0])
        got = info["final_obs"][0] if done else obs[0]
        np.testing.assert_allclose(got, obs_ref, rtol=0, atol=1e-8, err_msg=f"{name} step {t}")
        assert abs(r[0] - r_ref) <= 1e-8, (name, t, r[0], r_ref)
        assert bool(term[0]) == term_ref and bool(trunc[0]) == trunc_ref, (name, t)
        _check_info(name, t, info, info_ref, keys)
        if "reward_ctrl" in keys:  # the float32 control cost is rounded as gymnasium's, exactly
            assert info["reward_ctrl"][0] == info_ref["reward_ctrl"], (name, t)
        if done:
            episodes += 1
            seed += 1
            ref.reset(seed=seed)
            env.reset(initial_state=_state(ref)[None])
    if name in ("Hopper-v5", "Walker2d-v5", "Humanoid-v5", "InvertedPendulum-v5"):
        assert episodes > 0, "random actions should end some episodes"
