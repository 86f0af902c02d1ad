"""The C++ gymnasium tasks match gymnasium's own envs step for step (obs, reward, terminations).

Both start from the same state (gymnasium's reset state copied into the pool) and take the same
float64 actions; at every episode end the next gymnasium reset state is copied over again.
"""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest

from lightning_unilab.vector_env import TaskVectorEnv

TASKS = ["HalfCheetah-v5", "Ant-v5", "InvertedPendulum-v5", "Hopper-v5", "Walker2d-v5",
         "Humanoid-v5"]
STEPS = 1000


def _state(env: gym.Env) -> np.ndarray:
    u = env.unwrapped
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    row = np.empty(mujoco.mj_stateSize(u.model, spec))
    mujoco.mj_getState(u.model, u.data, row, spec)
    return row


@pytest.mark.parametrize("name", TASKS)
def test_matches_gymnasium(name: str) -> None:
    ref = gym.make(name)
    env = TaskVectorEnv(name, num_envs=1, num_threads=1)
    rng = np.random.default_rng(0)
    low, high = ref.action_space.low.astype(np.float64), ref.action_space.high.astype(np.float64)
    seed = 0
    obs_ref, _ = ref.reset(seed=seed)
    obs, _ = env.reset(initial_state=_state(ref)[None])
    np.testing.assert_allclose(obs[0], obs_ref, rtol=0, atol=1e-8)
    episodes = 0
    for t in range(STEPS):
        action = rng.uniform(low, high)
        obs_ref, r_ref, term_ref, trunc_ref, _ = ref.step(action)
        obs, r, term, trunc, info = env.step(action[None])
        done = bool(term[0] or trunc[0])
        got = info["final_obs"][0] if done else obs[0]
        np.testing.assert_allclose(got, obs_ref, rtol=0, atol=1e-8, err_msg=f"{name} step {t}")
        assert abs(r[0] - r_ref) <= 1e-8, (name, t, r[0], r_ref)
        assert bool(term[0]) == term_ref and bool(trunc[0]) == trunc_ref, (name, t)
        if done:
            episodes += 1
            seed += 1
            ref.reset(seed=seed)
            env.reset(initial_state=_state(ref)[None])
    if name in ("Hopper-v5", "Walker2d-v5", "Humanoid-v5", "InvertedPendulum-v5"):
        assert episodes > 0, "random actions should end some episodes"
