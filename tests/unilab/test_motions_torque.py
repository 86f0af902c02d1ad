"""The motors' part of a clip (joint_demand) against closed forms on a one-arm body: an arm held
out on the floor needs m g l at its shoulder, swung at a constant angular acceleration it needs
I alpha besides, in free fall it needs nothing; the limit is read from the model; and the shipped
clips are measured."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from lightning_unilab.motions.convert import qpos_to_clip
from lightning_unilab.motions.torque import actuator_limits, joint_demand

ARM_MASS, ARM_LEN, TIP_RADIUS, LIMIT = 2.0, 0.6, 0.01, 30.0
G = 9.81
# a 20 kg box on the floor, its sole 0.1 m under its centre; an arm (a point mass at its tip, on a
# massless rod) on a hinge about y at the box's top, level with the box's centre when at 0
ONE_ARM = f"""
<mujoco>
  <option gravity="0 0 -{G}"/>
  <worldbody>
    <body name="base" pos="0 0 0.1">
      <freejoint/>
      <geom name="sole" type="box" size="0.3 0.2 0.1" mass="20"/>
      <body name="arm" pos="0 0 0.1">
        <joint name="shoulder" type="hinge" axis="0 1 0" actuatorfrcrange="-{LIMIT} {LIMIT}"
               actuatorfrclimited="true"/>
        <geom type="sphere" size="{TIP_RADIUS}" pos="{ARM_LEN} 0 0" mass="{ARM_MASS}"/>
        <geom type="capsule" size="0.001" fromto="0 0 0 {ARM_LEN} 0 0" mass="1e-9"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="shoulder"/></actuator>
</mujoco>
"""


BODY_MASS, BODY_OFFSET = 10.0, 0.08
# a body on one foot: the free root is a 10 kg box whose centre sits 8 cm ahead of the ankle
# hinge 0.5 m below it; the foot's sole is on the floor
ON_A_FOOT = f"""
<mujoco>
  <option gravity="0 0 -{G}"/>
  <worldbody>
    <body name="base" pos="0 0 0.54">
      <freejoint/>
      <geom type="box" size="0.05 0.05 0.05" pos="{BODY_OFFSET} 0 0" mass="{BODY_MASS}"/>
      <body name="foot" pos="0 0 -0.5">
        <joint name="ankle" type="hinge" axis="0 1 0" actuatorfrcrange="-{LIMIT} {LIMIT}"
               actuatorfrclimited="true"/>
        <geom name="sole" type="box" size="0.15 0.1 0.02" pos="0 0 -0.02" mass="1"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="ankle"/></actuator>
</mujoco>
"""


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(ONE_ARM)


def _clip(model: mujoco.MjModel, z: np.ndarray, angle: np.ndarray, fps: float = 50.0):
    frames = len(angle)
    root = np.zeros((frames, 3))
    root[:, 2] = z
    quat = np.tile([1.0, 0.0, 0.0, 0.0], (frames, 1))
    return qpos_to_clip(root, quat, angle[:, None], model, fps)


def test_the_limit_is_the_joints_actuator_force_range(model: mujoco.MjModel) -> None:
    names, dofs, limits = actuator_limits(model)
    assert names == ("shoulder",) and list(dofs) == [6] and list(limits) == [LIMIT]


@pytest.mark.parametrize("angle", [0.0, 0.7, -0.4])
def test_an_arm_held_out_on_the_floor_needs_m_g_l(model: mujoco.MjModel, angle: float) -> None:
    clip = _clip(model, np.full(6, 0.1), np.full(6, angle))
    demand = joint_demand(clip, model, feet=("sole",))
    # turning about +y takes the tip from +x toward -z, so the weight at x = l cos(a) turns it
    # by +m g l cos(a): the motor holds it with the opposite torque
    expected = -ARM_MASS * G * ARM_LEN * np.cos(angle)
    np.testing.assert_allclose(demand.torque[1:-1, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(demand.ratio[1:-1, 0], abs(expected) / LIMIT, rtol=1e-6)
    assert np.isnan(demand.torque[[0, -1]]).all()


def test_a_swing_adds_i_alpha(model: mujoco.MjModel) -> None:
    alpha, fps = 3.0, 200.0
    t = np.arange(9) / fps
    angle = 0.5 * alpha * t**2  # from rest, level
    demand = joint_demand(_clip(model, np.full(len(t), 0.1), angle, fps), model, feet=("sole",))
    for k in range(2, len(t) - 2):  # the clip's velocities are np.gradient's: exact inside
        a = angle[k]
        # I alpha = motor + m g l cos(a), I = m l^2 + 2/5 m r^2 (the tip, a sphere of radius r);
        # the centripetal force passes through the hinge, so the speed enters no torque
        inertia = ARM_MASS * ARM_LEN**2 + 0.4 * ARM_MASS * TIP_RADIUS**2
        expected = inertia * alpha - ARM_MASS * G * ARM_LEN * np.cos(a)
        assert demand.torque[k, 0] == pytest.approx(expected, rel=1e-6)


def test_a_body_on_a_foot_loads_the_ankle_with_its_weight() -> None:
    """The floor carries the body through the foot: the ankle holds the body's weight at its
    offset (without the sole's force the ankle would hold only the foot)."""
    model = mujoco.MjModel.from_xml_string(ON_A_FOOT)
    demand = joint_demand(_clip(model, np.full(5, 0.54), np.zeros(5)), model, feet=("sole",))
    # the base's weight at +x turns it about +y by -(-m g d): the foot, pressed on the floor,
    # pushes back through the hinge, so the motor gives m g d on the foot (minus on the base)
    np.testing.assert_allclose(demand.torque[1:-1, 0], BODY_MASS * G * BODY_OFFSET, rtol=1e-6)


def test_free_fall_asks_nothing_of_the_motor(model: mujoco.MjModel) -> None:
    t = np.arange(8) / 50.0
    z = 2.0 - 0.5 * G * t**2  # high above the floor: no sole down
    demand = joint_demand(_clip(model, z, np.full(len(t), 0.3)), model, feet=("sole",))
    np.testing.assert_allclose(demand.torque[2:-2, 0], 0.0, atol=1e-6)


def test_the_shipped_dance_stays_near_every_motors_limit() -> None:
    """The dance is tracked (docs/unilab/tracking.md): on the floor the split of the weight
    between the feet is the least-norm one, not the tracker's, so a few frames may read a little
    over a limit; a regression of the clip or of the measure reads far over it."""
    from lightning_unilab.envs.tasks import load_model
    from lightning_unilab.motions import CLIPS, load_clip

    g1 = load_model("g1-motion-tracking")
    dance = load_clip(CLIPS / "g1_dance.npz", g1)
    demand = joint_demand(dance, g1)
    assert 0.5 < demand.max_ratio < 1.2
    assert demand.frames_over().max() <= 5
