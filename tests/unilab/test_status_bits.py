"""Status bits tell the truth: equal to the warnings plain MuJoCo raises for the same state.

The reference is a serial MjData with zeroed warning counters, set to the env's state row and
stepped as the pool steps it; its raised warnings are those with a nonzero counter. Poisons
include those after which MuJoCo resets the data itself (bad qpos, qvel, qacc), which zero every
counter.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from unilab_models import INTEGRATION

from lightning_unilab import BatchEnvPool, describe_status
from lightning_unilab.envs.vector_env import STATUS_BAD_ACTION, TaskVectorEnv


def serial_warnings(model: mujoco.MjModel, row: np.ndarray, nstep: int,
                    ctrl: np.ndarray | None = None) -> int:
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, row, INTEGRATION)
    if ctrl is not None:
        data.ctrl[:] = ctrl
    for _ in range(nstep):
        mujoco.mj_step(model, data)
    return sum(1 << w for w in range(len(data.warning)) if data.warning[w].number > 0)


def poison(pool: BatchEnvPool, env: int, kind: str) -> None:
    if kind == "qpos_nan":
        pool.qpos[env, 0] = np.nan
    elif kind == "qvel_huge":
        pool.qvel[env] = 1e40
    elif kind == "qacc_huge":
        pool.qfrc_applied[env] = 1e300
    elif kind == "ctrl_nan":
        pool.ctrl[env] = np.nan
    else:  # pragma: no cover
        raise ValueError(kind)


KINDS = ["qpos_nan", "qvel_huge", "qacc_huge", "ctrl_nan"]


@pytest.mark.parametrize("kind", KINDS)
def test_pool_status_equals_plain_mujoco(arm_model, kind: str) -> None:
    pool = BatchEnvPool(arm_model, 3, num_threads=1)
    pool.reset(keyframe=0)
    poison(pool, 1, kind)
    row = pool.state[1].copy()
    pool.step(nstep=5)
    expected = serial_warnings(arm_model, row, 5)
    assert expected, "the poison must make MuJoCo warn"
    assert int(pool.status[1]) == expected, (describe_status(int(pool.status[1])),
                                             describe_status(expected))
    assert not pool.status[[0, 2]].any()


@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
@pytest.mark.parametrize("kind", ["qpos_nan", "qvel_huge", "qacc_huge"])
def test_task_status_is_reported_before_the_auto_reset(kind: str, autoreset: str) -> None:
    env = TaskVectorEnv("Hopper-v5", 3, num_threads=2, autoreset=autoreset)
    env.reset(seed=0)
    poison(env.pool, 2, kind)
    row = env.pool.state[2].copy()
    actions = np.full((3, 3), 0.25)
    _, _, _, trunc, info = env.step(actions)
    expected = serial_warnings(env.model, row, env.spec.frame_skip, ctrl=actions[2])
    assert expected
    assert int(info["status"][2]) == expected, (describe_status(int(info["status"][2])),
                                                describe_status(expected))
    assert trunc[2]  # rolled back (the restored state may also be unhealthy: terminated)
    assert not info["status"][[0, 1]].any()
    if autoreset == "same_step":  # restarted: the pool's status is clear, info kept the bits
        assert env.pool.status[2] == 0
    else:  # the ending step left the bits in place until the restart
        assert int(env.pool.status[2]) == expected
        _, _, _, _, info = env.step(actions)
        assert info["status"][2] == 0 and env.pool.status[2] == 0


@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
def test_bad_action_bit_survives_the_auto_reset(autoreset: str) -> None:
    env = TaskVectorEnv("Ant-v5", 2, num_threads=1, autoreset=autoreset, nonfinite="truncate")
    env.reset(seed=0)
    actions = np.zeros((2, 8))
    actions[0, 3] = np.nan
    _, _, _, trunc, info = env.step(actions)
    assert trunc[0] and info["status"][0] == STATUS_BAD_ACTION and info["status"][1] == 0
    # a time-limit truncation carries no bits: the two causes are told apart
    limited = TaskVectorEnv("Ant-v5", 2, num_threads=1, autoreset=autoreset,
                            params={"max_episode_steps": 1})
    limited.reset(seed=0)
    _, _, _, trunc, info = limited.step(np.zeros((2, 8)))
    assert trunc.all() and not info["status"].any()
