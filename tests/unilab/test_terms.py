"""The reusable terms (lightning_unilab.envs.terms) equal a plain per-env MuJoCo computation.

Envs of a small quadruped are put into varied random states (tilted, some feet, the torso or
nothing on the floor, moving); each term is computed once, vectorized over the rows of a subset
of them gathered from a BatchEnvPool, and again env by env from an MjData of the same state
through MuJoCo's own quantities (xmat, mj_objectVelocity, the contact list ...). A planted bug
(a quaternion read in the wrong convention, a rotation the wrong way round) fails the same
comparison. A task written with the terms then runs in a TaskVectorEnv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np
import pytest

from lightning_unilab.envs import terms
from lightning_unilab.envs.pool import BatchEnvPool
from lightning_unilab.envs.tasks import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.envs.vector_env import TaskVectorEnv

ATOL = 1e-12


def _leg(name: str, x: float, y: float) -> str:
    return f"""
      <body name="{name}_thigh" pos="{x} {y} 0">
        <joint name="{name}_hip" axis="0 1 0" range="-1.2 1.2"/>
        <geom name="{name}_thigh" type="capsule" fromto="0 0 0 0 0 -0.18" size="0.025"
              mass="0.5"/>
        <body name="{name}_foot" pos="0 0 -0.18">
          <joint name="{name}_knee" axis="0 1 0" range="-2.4 0"/>
          <geom name="{name}_foot" type="capsule" fromto="0 0 0 0 0 -0.17" size="0.02"
                mass="0.2"/>
          <site name="{name}_toe" pos="0 0 -0.19"/>
        </body>
      </body>"""


LEGS = ("fl", "fr", "hl", "hr")
QUADRUPED_XML = f"""
<mujoco model="quadruped">
  <option timestep="0.005"/>
  <default>
    <joint damping="0.5" armature="0.01"/>
    <geom friction="0.8 0.02 0.01"/>
    <position kp="30" ctrlrange="-2.4 2.4"/>
  </default>
  <worldbody>
    <geom name="floor" type="plane" size="10 10 0.1"/>
    <body name="torso" pos="0 0 0.4">
      <freejoint name="root"/>
      <geom name="torso" type="box" size="0.25 0.12 0.05" mass="6"/>
      <site name="imu" pos="0.05 0.02 0.03"/>
      {"".join(_leg(n, 0.22 * sx, 0.13 * sy)
               for n, sx, sy in zip(LEGS, (1, 1, -1, -1), (1, -1, 1, -1), strict=True))}
    </body>
  </worldbody>
  <actuator>
    {"".join(f'<position joint="{n}_{j}"/>' for n in LEGS for j in ("hip", "knee"))}
  </actuator>
  <sensor>
    {"".join(f'<contact name="{n}_foot_floor" geom1="{n}_foot" geom2="floor" num="1" '
             'data="found"/>' for n in LEGS)}
    <contact name="torso_floor" body1="torso" geom2="floor" num="1" data="found"/>
    {"".join(f'<contact name="{n}_thigh_floor" geom1="{n}_thigh" geom2="floor" num="1" '
             'data="found"/>' for n in LEGS)}
    <gyro name="gyro" site="imu"/>
  </sensor>
  <keyframe>
    <key name="stand" qpos="0 0 0.3 1 0 0 0 {" ".join(["0.5 -1.0"] * 4)}"
         ctrl="{" ".join(["0.5 -1.0"] * 4)}"/>
  </keyframe>
</mujoco>
"""
FEET = [f"{n}_foot" for n in LEGS]
TOES = [f"{n}_toe" for n in LEGS]
FOOT_SENSORS = [f"{n}_foot_floor" for n in LEGS]
FALL_SENSORS = ["torso_floor"] + [f"{n}_thigh_floor" for n in LEGS]
OUTPUTS = {"sensordata": None, "xpos": FEET, "cvel": FEET, "subtree_com": ["torso"],
           "site_xpos": TOES, "actuator_force": None}
NUM_ENVS = 10
IDS = np.array([0, 2, 3, 4, 6, 7, 8, 9])  # the rows the terms see: not all, not in a block


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_string(QUADRUPED_XML)


def _id(m: mujoco.MjModel, kind: mujoco.mjtObj, name: str) -> int:
    i = mujoco.mj_name2id(m, kind, name)
    assert i >= 0, name
    return i


def random_states(m: mujoco.MjModel, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tilted up to 70 degrees (one env nearly upside down), heights from lying to standing,
    joints anywhere in range, moving."""
    rng = np.random.default_rng(seed)
    qpos = np.tile(m.key_qpos[0], (n, 1))
    qpos[:, :2] = rng.uniform(-1, 1, (n, 2))
    qpos[:, 2] = rng.uniform(0.05, 0.45, n)
    axis = rng.normal(size=(n, 3))
    axis /= np.linalg.norm(axis, axis=1, keepdims=True)
    angle = rng.uniform(0.2, 1.2, n)
    angle[-4] = 2.9
    qpos[:, 3] = np.cos(angle / 2)
    qpos[:, 4:7] = np.sin(angle / 2)[:, None] * axis
    low, high = m.jnt_range[1:, 0], m.jnt_range[1:, 1]
    qpos[:, 7:] = rng.uniform(low, high, (n, m.nq - 7))
    qvel = rng.normal(0.0, 1.5, (n, m.nv))
    return qpos, qvel


@dataclass
class Snapshot:
    """One state per env: in a pool (forwarded) and in an MjData each (mj_forward)."""

    pool: BatchEnvPool
    datas: list[mujoco.MjData]
    qpos: np.ndarray  # rows of IDS, gathered as a task gathers them
    qvel: np.ndarray
    sensordata: np.ndarray

    def out(self, name: str) -> np.ndarray:
        return self.pool.outputs[name][IDS]

    def each(self):
        """(row, MjData) of each env in IDS."""
        return ((r, self.datas[i]) for r, i in enumerate(IDS))


@pytest.fixture(scope="module")
def snap(model: mujoco.MjModel) -> Snapshot:
    qpos, qvel = random_states(model, NUM_ENVS, seed=0)
    pool = BatchEnvPool(model, NUM_ENVS, 1, outputs=OUTPUTS, stage="acc")
    pool.qpos[:] = qpos
    pool.qvel[:] = qvel
    pool.forward(None, "acc")
    datas = []
    for i in range(NUM_ENVS):
        d = mujoco.MjData(model)
        d.qpos[:], d.qvel[:] = qpos[i], qvel[i]
        mujoco.mj_forward(model, d)
        datas.append(d)
    return Snapshot(pool, datas, pool.qpos[IDS], pool.qvel[IDS],
                    pool.outputs["sensordata"][IDS, :, 0])


def _touching(m: mujoco.MjModel, d: mujoco.MjData, bodies: list[int]) -> bool:
    """A plain walk over MuJoCo's contact list: any contact between these bodies and the
    floor."""
    floor = _id(m, mujoco.mjtObj.mjOBJ_GEOM, "floor")
    for c in d.contact[: d.ncon]:
        other = c.geom2 if c.geom1 == floor else c.geom1 if c.geom2 == floor else -1
        if other >= 0 and m.geom_bodyid[other] in bodies:
            return True
    return False


def _rot(d: mujoco.MjData, body: int) -> np.ndarray:
    return d.xmat[body].reshape(3, 3)


def _local_vel(m: mujoco.MjModel, d: mujoco.MjData, body: int, local: bool) -> np.ndarray:
    """(angular, linear) velocity of the body frame's origin (mjOBJ_XBODY: mjOBJ_BODY would
    give the velocity at the body's centre of mass, xipos)."""
    res = np.zeros(6)
    mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_XBODY, body, res, int(local))
    return res


# ---------------------------------------------------------------- the test states themselves


def test_states_are_varied_enough_to_catch_mistakes(model, snap) -> None:
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    tilt = [math.degrees(math.acos(_rot(d, torso)[2, 2])) for _, d in snap.each()]
    assert min(tilt) > 5 and max(tilt) > 150 and sum(t > 40 for t in tilt) >= 2, tilt
    feet = [[_touching(model, d, [_id(model, mujoco.mjtObj.mjOBJ_BODY, f)]) for f in FEET]
            for _, d in snap.each()]
    flat = sum(feet, [])
    assert any(flat) and not all(flat)
    down = [_touching(model, d, [torso]) for _, d in snap.each()]
    assert any(down) and not all(down)


# ---------------------------------------------------------------- observations


def test_projected_gravity(model, snap) -> None:
    robot = terms.Robot.from_model(model, "stand")
    got = terms.projected_gravity(snap.qpos[:, robot.base_quat])
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    for r, d in snap.each():
        want = _rot(d, torso).T @ np.array([0.0, 0.0, -1.0])
        np.testing.assert_allclose(got[r], want, rtol=0, atol=ATOL)
    # the same quantity through the general rotation
    down = np.broadcast_to([0.0, 0.0, -1.0], got.shape)
    np.testing.assert_allclose(terms.quat_rotate_inverse(snap.qpos[:, 3:7], down), got,
                               rtol=0, atol=ATOL)


def _max_error(got: np.ndarray, snap: Snapshot, want) -> float:
    return max(float(np.abs(got[r] - want(d)).max()) for r, d in snap.each())


def test_planted_quaternion_bugs_fail_the_gravity_comparison(model, snap) -> None:
    """The comparison above is not vacuous: quaternions read as (x, y, z, w), or the rotation
    applied the wrong way round (body to world), miss by far more than its tolerance."""
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")

    def want(d: mujoco.MjData) -> np.ndarray:
        return _rot(d, torso).T @ np.array([0.0, 0.0, -1.0])

    quat = snap.qpos[:, 3:7]
    assert _max_error(terms.projected_gravity(quat), snap, want) < ATOL
    xyzw = terms.projected_gravity(np.roll(quat, -1, axis=1))
    assert _max_error(xyzw, snap, want) > 0.1
    conjugate = quat * np.array([1.0, -1.0, -1.0, -1.0])
    assert _max_error(terms.projected_gravity(conjugate), snap, want) > 0.1


def test_base_velocities_in_the_base_frame(model, snap) -> None:
    robot = terms.Robot.from_model(model)
    lin = terms.base_lin_vel_local(snap.qpos, snap.qvel, robot)
    ang = terms.base_ang_vel_local(snap.qvel, robot)
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    for r, d in snap.each():
        v = _local_vel(model, d, torso, local=True)
        np.testing.assert_allclose(lin[r], v[3:], rtol=0, atol=ATOL)
        np.testing.assert_allclose(ang[r], v[:3], rtol=0, atol=ATOL)
    # world-frame velocity would not pass: the states rotate it
    assert np.abs(snap.qvel[:, :3] - lin).max() > 0.1


def test_joint_positions_and_velocities_relative_to_the_default_pose(model, snap) -> None:
    robot = terms.Robot.from_model(model, "stand")
    pos = terms.joint_pos_rel(snap.qpos, robot)
    vel = terms.joint_vel(snap.qvel, robot)
    assert pos.shape == vel.shape == (len(IDS), 8)
    key = model.key_qpos[_id(model, mujoco.mjtObj.mjOBJ_KEY, "stand")]
    for r, d in snap.each():
        k = 0
        for j in range(model.njnt):
            if model.jnt_type[j] != mujoco.mjtJoint.mjJNT_HINGE:
                continue
            q, v = model.jnt_qposadr[j], model.jnt_dofadr[j]
            assert pos[r, k] == d.qpos[q] - key[q] and vel[r, k] == d.qvel[v]
            k += 1


def test_feet_velocities_from_pool_outputs(model, snap) -> None:
    got = terms.body_lin_vel_world(snap.out("cvel"), snap.out("xpos"), snap.out("subtree_com"))
    assert got.shape == (len(IDS), 4, 3)
    for r, d in snap.each():
        for k, foot in enumerate(FEET):
            want = _local_vel(model, d, _id(model, mujoco.mjtObj.mjOBJ_BODY, foot), False)[3:]
            np.testing.assert_allclose(got[r, k], want, rtol=0, atol=ATOL)


def test_gait_clock(snap) -> None:
    step = np.array([0, 1, 7, 33, 100, 101, 250, 999], np.float64)
    phase = terms.gait_phase(step, 0.02, 1.25, offsets=(0.0, math.pi))
    clock = terms.gait_clock(phase)
    assert clock.shape == (len(step), 4)
    for r, s in enumerate(step):
        for k, offset in enumerate((0.0, math.pi)):
            p = 2 * math.pi * 1.25 * 0.02 * s + offset
            assert abs(clock[r, k] - math.cos(p)) < ATOL
            assert abs(clock[r, 2 + k] - math.sin(p)) < ATOL


# ---------------------------------------------------------------- rewards


def test_tracking_and_penalties(model, snap) -> None:
    robot = terms.Robot.from_model(model, "stand")
    rng = np.random.default_rng(1)
    action, last = rng.uniform(-1, 1, (2, len(IDS), model.nu))
    lin = terms.base_lin_vel_local(snap.qpos, snap.qvel, robot)
    ang = terms.base_ang_vel_local(snap.qvel, robot)
    # commands near the actual velocities, so that the kernels are not all ~0
    command = np.concatenate([lin[:, :2], ang[:, 2:]], axis=1) + rng.normal(0, 0.4, (len(IDS), 3))
    g = terms.projected_gravity(snap.qpos[:, robot.base_quat])
    got = {
        "lin": terms.tracking_lin_vel_xy(command, lin, 0.25),
        "yaw": terms.tracking_yaw_rate(command[:, 2], ang[:, 2], 0.25),
        "vz": terms.lin_vel_z(snap.qvel[:, 2]),
        "wxy": terms.ang_vel_xy(ang),
        "orient": terms.flat_orientation(g),
        "height": terms.base_height(snap.qpos[:, 2], 0.3),
        "rate": terms.action_rate(action, last),
        "torque": terms.torques(snap.out("actuator_force")[:, :, 0]),
    }
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    for r, d in snap.each():
        v = _local_vel(model, d, torso, local=True)
        up = _rot(d, torso)[2]  # the world z axis in body coordinates
        want = {
            "lin": math.exp(-((command[r, 0] - v[3]) ** 2 + (command[r, 1] - v[4]) ** 2) / 0.25),
            "yaw": math.exp(-((command[r, 2] - v[2]) ** 2) / 0.25),
            "vz": d.qvel[2] ** 2,
            "wxy": v[0] ** 2 + v[1] ** 2,
            "orient": up[0] ** 2 + up[1] ** 2,
            "height": (d.xpos[torso, 2] - 0.3) ** 2,
            "rate": sum((action[r, i] - last[r, i]) ** 2 for i in range(model.nu)),
            "torque": sum(f * f for f in d.actuator_force),
        }
        for name in want:
            assert abs(got[name][r] - want[name]) < ATOL, (name, r)
    assert np.ptp(got["lin"]) > 0.1 and np.ptp(got["orient"]) > 0.1  # varied, not saturated


def test_swing_height_and_contact_phase(model, snap) -> None:
    step = np.arange(len(IDS)) * 7.0
    phase = terms.gait_phase(step, 0.02, 1.25, offsets=(0.0, math.pi, math.pi, 0.0))
    foot_z = snap.out("site_xpos")[:, :, 2]
    contact = terms.contact_found(snap.sensordata,
                                  terms.sensor_columns(model, FOOT_SENSORS))
    swing = terms.feet_swing_height(foot_z, phase, 0.08, 0.01)
    agree = terms.feet_contact_phase(contact, phase)
    for r, d in snap.each():
        err, matches = 0.0, 0
        for k, (toe, foot) in enumerate(zip(TOES, FEET, strict=True)):
            u = (phase[r, k] / (2 * math.pi)) % 1.0  # fraction of the cycle
            s = 2 * u - 1  # swing progress in the second half
            target = 0.08 * 16 * s**2 * (1 - s) ** 2 if u >= 0.5 else 0.0
            err += (d.site_xpos[_id(model, mujoco.mjtObj.mjOBJ_SITE, toe)][2] - target) ** 2
            touching = _touching(model, d, [_id(model, mujoco.mjtObj.mjOBJ_BODY, foot)])
            matches += touching == (u < 0.5)
        assert abs(swing[r] - math.exp(-err / 0.01)) < ATOL
        assert agree[r] == matches
    targets = terms.swing_height_target(phase, 0.08)
    assert targets.min() == 0.0 and 0.04 < targets.max() <= 0.08


def test_swing_target_bezier_closed_form() -> None:
    """Playground's G1 swing target at known points of the cycle x = (phi + pi) / (2 pi): 0 at
    x = 0 and 1, h at 1/2, h/2 at 1/4 and 3/4 (u = 1/2), and u^3 + 3u^2(1 - u) in between."""
    h = 0.08
    x = np.array([0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0])
    phi = 2 * math.pi * x - math.pi
    bez = {0.25: 0.25**3 + 3 * 0.25**2 * 0.75, 0.75: 0.75**3 + 3 * 0.75**2 * 0.25}  # u = 1/4, 3/4
    want = np.array([0.0, h * bez[0.25], h / 2, h, h / 2, h - h * bez[0.75], 0.0])
    # the phase may run on unwrapped (the clock's 2 pi f t), or be negative: same targets
    for turns in (0, 3, -2):
        got = terms.swing_target_bezier((phi + 2 * math.pi * turns)[None, :], h)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=f"{turns} turns")
    # the term: 1 on target, exp(-sum err^2 / sigma) off it
    feet = np.array([[0.0, math.pi]])  # left at x = 1/2 (top), right at x = 0 (ground)
    assert terms.feet_phase(np.array([[h, 0.0]]), feet, h, 0.01)[0] == 1.0
    np.testing.assert_allclose(terms.feet_phase(np.array([[0.0, 0.0]]), feet, h, 0.01),
                               [math.exp(-h * h / 0.01)], rtol=1e-15)


def test_feet_air_time_and_slip_over_steps(model) -> None:
    """Stateful: a dropped quadruped kicked by random controls lands, lifts and lands feet; the
    air-time reward (kept in memory rows, as a task keeps it) and the slip penalty equal a
    per-env, per-foot loop over MjData stepped in lockstep."""
    n, frame_skip = 6, 4
    dt = frame_skip * model.opt.timestep
    ids = np.array([0, 1, 3, 5])
    qpos, _ = random_states(model, n, seed=2)
    qpos[:, 2] = 0.45
    qpos[:, 3:7] = [1.0, 0.0, 0.0, 0.0]
    pool = BatchEnvPool(model, n, 1, outputs=OUTPUTS, stage="acc")
    pool.qpos[:] = qpos
    pool.forward(None, "acc")
    datas = []
    for i in range(n):
        d = mujoco.MjData(model)
        d.qpos[:] = qpos[i]
        datas.append(d)
    layout = terms.MemoryLayout(air_time=4, last_contact=4)
    memory = np.zeros((n, layout.size))
    columns = terms.sensor_columns(model, FOOT_SENSORS)
    feet = [_id(model, mujoco.mjtObj.mjOBJ_BODY, f) for f in FEET]
    ref_air = {i: [0.0] * 4 for i in ids}
    ref_last = {i: [False] * 4 for i in ids}
    rng = np.random.default_rng(3)
    touchdowns = positive = lifts = 0
    for _ in range(80):
        ctrl = rng.uniform(-1.5, 1.5, (n, model.nu))
        pool.ctrl[:] = ctrl
        pool.step(None, nstep=frame_skip)
        mem = memory[ids]
        contact = terms.contact_found(pool.outputs["sensordata"][ids, :, 0], columns)
        air = terms.feet_air_time(contact, mem[:, layout["air_time"]],
                                  mem[:, layout["last_contact"]], dt, 0.1)
        slip = terms.feet_slip(contact, terms.body_lin_vel_world(
            pool.outputs["cvel"][ids], pool.outputs["xpos"][ids],
            pool.outputs["subtree_com"][ids]))
        memory[ids] = mem
        for r, i in enumerate(ids):
            d = datas[i]
            d.ctrl[:] = ctrl[i]
            for _ in range(frame_skip):
                mujoco.mj_step(model, d)
            mujoco.mj_forward(model, d)
            np.testing.assert_array_equal(pool.qpos[i], d.qpos)
            want_air = want_slip = 0.0
            for k, foot in enumerate(feet):
                touching = _touching(model, d, [foot])
                assert contact[r, k] == touching
                ref_air[i][k] += dt
                if touching and not ref_last[i][k]:
                    want_air += ref_air[i][k] - 0.1
                    touchdowns += 1
                    positive += ref_air[i][k] > 0.1
                lifts += ref_last[i][k] and not touching
                if touching:
                    ref_air[i][k] = 0.0
                    v = _local_vel(model, d, foot, local=False)
                    want_slip += v[3] ** 2 + v[4] ** 2
                ref_last[i][k] = touching
            assert abs(air[r] - want_air) < ATOL
            assert abs(slip[r] - want_slip) < ATOL
            np.testing.assert_allclose(memory[i, layout["air_time"]], ref_air[i], rtol=0,
                                       atol=ATOL)
    assert touchdowns > 8 and positive > 0 and lifts > 0, (touchdowns, positive, lifts)
    untouched = np.setdiff1d(np.arange(n), ids)
    assert (memory[untouched] == 0).all()


def test_reward_sum_weights_terms_into_info_shares() -> None:
    rsum = terms.RewardSum({"lin": 1.0, "rate": -0.01, "fall": -1.0}, scale=0.02, floor=0.0)
    assert rsum.info_names == ("reward_lin", "reward_rate", "reward_fall", "reward_floor")
    lin = np.array([0.9, 0.1, 0.5])
    rate = np.array([1.0, 20.0, 3.0])
    fall = np.array([False, True, False])
    reward, info = rsum({"lin": lin, "rate": rate, "fall": fall})
    for r in range(3):
        raw = 0.02 * (lin[r] - 0.01 * rate[r] - float(fall[r]))
        assert reward[r] == max(0.0, raw)
        assert abs(info["reward_lin"][r] - 0.02 * lin[r]) < ATOL
        assert abs(sum(info[k][r] for k in rsum.info_names) - reward[r]) < ATOL
    assert info["reward_floor"][1] > 0 and info["reward_floor"][0] == 0
    no_floor = terms.RewardSum({"lin": 1.0})
    assert no_floor.info_names == ("reward_lin",)
    # a penalty after the floor is paid in full: 0.02 x (0.1 - 0.2 - 1) floors to 0 under it
    after = terms.RewardSum({"lin": 1.0, "rate": -0.01, "fall": -1.0}, scale=0.02, floor=0.0,
                            after_floor=("fall",))
    reward, info = after({"lin": lin, "rate": rate, "fall": fall})
    for r in range(3):
        under = 0.02 * (lin[r] - 0.01 * rate[r])
        assert abs(reward[r] - (max(0.0, under) - 0.02 * float(fall[r]))) < ATOL
        assert abs(sum(info[k][r] for k in after.info_names) - reward[r]) < ATOL
    assert abs(reward[1] + 0.02) < ATOL and info["reward_floor"][1] > 0
    with pytest.raises(ValueError, match=r"after_floor: expected names among the weights"):
        terms.RewardSum({"lin": 1.0}, floor=0.0, after_floor=("fall",))
    with pytest.raises(ValueError, match=r"missing \['rate'\], unweighted \['rte'\]"):
        rsum({"lin": lin, "rte": rate, "fall": fall})
    with pytest.raises(ValueError, match="weights\\['x'\\]"):
        terms.RewardSum({"x": float("nan")})


# ---------------------------------------------------------------- terminations


def test_contacts_and_fall_terminations(model, snap) -> None:
    robot = terms.Robot.from_model(model)
    feet = terms.contact_found(snap.sensordata, terms.sensor_columns(model, FOOT_SENSORS))
    fallen_on = terms.body_contact(snap.sensordata, terms.sensor_columns(model, FALL_SENSORS))
    g = terms.projected_gravity(snap.qpos[:, robot.base_quat])
    low = terms.base_too_low(snap.qpos[:, 2], 0.2)
    tilt = terms.tilted(g, math.radians(45))
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    thighs = [_id(model, mujoco.mjtObj.mjOBJ_BODY, f"{n}_thigh") for n in LEGS]
    for r, d in snap.each():
        for k, foot in enumerate(FEET):
            assert feet[r, k] == _touching(model, d, [_id(model, mujoco.mjtObj.mjOBJ_BODY, foot)])
        assert fallen_on[r] == _touching(model, d, [torso, *thighs])
        assert low[r] == (d.xpos[torso, 2] < 0.2)
        assert tilt[r] == (math.degrees(math.acos(_rot(d, torso)[2, 2])) > 45)
    assert 0 < tilt.sum() < len(IDS) and 0 < low.sum() < len(IDS)
    bad = snap.qvel.copy()
    bad[2, 5] = np.nan
    np.testing.assert_array_equal(terms.nonfinite(snap.qpos, bad),
                                  np.arange(len(IDS)) == 2)


# ---------------------------------------------------------------- reset events


def test_reset_events_draw_per_env(model) -> None:
    """Vectorized over some envs equals each env drawn alone (its own stream), and the pose
    lands where MuJoCo says: joints at default + noise, base shifted and turned about z."""
    robot = terms.Robot.from_model(model, "stand")
    ids = np.array([1, 4, 6])
    rng = EnvRng(NUM_ENVS, seed=3)
    qpos = terms.reset_joints(rng, ids, robot, 0.1)
    terms.reset_base_pose(qpos, rng, ids, robot, xy=0.5, yaw=math.pi)
    vel = terms.reset_base_velocity(rng, ids, 0.2)
    cmd = terms.sample_velocity_command(rng, ids, [-1, -0.5, -1], [1, 0.5, 1])
    key = model.key_qpos[0]
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    home = mujoco.MjData(model)
    home.qpos[:] = key
    mujoco.mj_forward(model, home)
    yaws = []
    for r, i in enumerate(ids):
        alone = EnvRng(NUM_ENVS, seed=3)
        joints = alone.uniform(np.array([i]), -0.1, 0.1, 8)[0]
        x, y, yaw = alone.uniform(np.array([i]), [-0.5, -0.5, -math.pi],
                                  [0.5, 0.5, math.pi], 3)[0]
        np.testing.assert_array_equal(vel[r], alone.uniform(np.array([i]), -0.2, 0.2, 6)[0])
        np.testing.assert_array_equal(
            cmd[r], alone.uniform(np.array([i]), [-1, -0.5, -1], [1, 0.5, 1], 3)[0])
        d = mujoco.MjData(model)
        d.qpos[:] = qpos[r]
        mujoco.mj_forward(model, d)
        for k, j in enumerate(range(1, model.njnt)):
            a = model.jnt_qposadr[j]
            assert d.qpos[a] == key[a] + joints[k]
        np.testing.assert_allclose(d.xpos[torso], home.xpos[torso] + [x, y, 0], rtol=0,
                                   atol=ATOL)
        turn = np.array([[math.cos(yaw), -math.sin(yaw), 0], [math.sin(yaw), math.cos(yaw), 0],
                         [0, 0, 1]])
        np.testing.assert_allclose(_rot(d, torso), turn @ _rot(home, torso), rtol=0, atol=ATOL)
        assert abs(np.linalg.norm(qpos[r, 3:7]) - 1) < ATOL
        yaws.append(yaw)
    assert max(abs(y) for y in yaws) > 0.5


def test_pushes_draw_per_env_and_move_the_base_in_the_world_frame(model, snap) -> None:
    """sample_push draws (when, how hard, which way) from each env's own stream; the push, once
    due, changes the torso's world-frame velocity (mj_objectVelocity) by exactly that planar
    vector, turned or tilted as the torso may be, and nothing else; it comes due once."""
    robot = terms.Robot.from_model(model, "stand")
    rng = EnvRng(NUM_ENVS, seed=5)
    push = terms.sample_push(rng, IDS, period=4, low=0.2, high=1.0)
    for r, i in enumerate(IDS):
        when, size, angle = EnvRng(NUM_ENVS, seed=5).uniform(
            np.array([i]), [0.0, 0.2, -math.pi], [4, 1.0, math.pi], 3)[0]
        assert push[r, 0] == math.floor(when) + 1 and 1 <= push[r, 0] <= 4
        np.testing.assert_allclose(push[r, 1:], size * np.array([math.cos(angle),
                                                                  math.sin(angle)]), atol=ATOL)
    assert len(set(push[:, 0])) > 1
    torso = _id(model, mujoco.mjtObj.mjOBJ_BODY, "torso")
    qvel, left = snap.qvel.copy(), push.copy()
    seen = np.zeros(len(IDS), int)
    for _ in range(6):
        before = qvel.copy()
        due = terms.apply_due_push(qvel, left, robot)
        seen += due
        np.testing.assert_array_equal(qvel[~due], before[~due])
        for r in np.flatnonzero(due):
            d = mujoco.MjData(model)
            d.qpos[:], d.qvel[:] = snap.qpos[r], before[r]
            mujoco.mj_forward(model, d)
            v0 = _local_vel(model, d, torso, local=False)
            d.qvel[:] = qvel[r]
            mujoco.mj_forward(model, d)
            v1 = _local_vel(model, d, torso, local=False)
            np.testing.assert_allclose(v1 - v0, [0, 0, 0, *push[r, 1:], 0], atol=1e-9)
    np.testing.assert_array_equal(seen, 1)  # every push came due, exactly once


# ---------------------------------------------------------------- lookups


def test_robot_and_layout_lookups(model) -> None:
    robot = terms.Robot.from_model(model, "stand")
    assert robot.joint_qpos == slice(7, 15) and robot.joint_dof == slice(6, 14)
    assert robot.num_joints == 8 and robot.base_quat == slice(3, 7)
    np.testing.assert_array_equal(robot.default_joint_pos, [0.5, -1.0] * 4)
    picked = terms.Robot.from_model(model, joints=["hr_knee", "fl_hip"])
    np.testing.assert_array_equal(picked.joint_qpos, [14, 7])
    with pytest.raises(ValueError, match="no keyframe named 'stnd'.*'stand'"):
        terms.Robot.from_model(model, "stnd")
    with pytest.raises(ValueError, match="no free joint"):
        terms.Robot.from_model(mujoco.MjModel.from_xml_string(
            "<mujoco><worldbody><body><joint/><geom size='.1'/></body></worldbody></mujoco>"))
    with pytest.raises(ValueError, match="expected one"):
        terms.sensor_columns(model, ["gyro"])
    layout = terms.MemoryLayout(last_action=8, command=3, step=1)
    assert layout.size == 12 and layout["command"] == slice(8, 11)
    with pytest.raises(KeyError, match="'cmd'"):
        layout["cmd"]


# ---------------------------------------------------------------- a task from terms


class QuadrupedWalk(NumpyTask):
    """Velocity tracking for the test quadruped, written with the terms (as in the docs)."""

    name = "quadruped-walk"
    outputs = {"sensordata": None, "cvel": FEET, "xpos": FEET, "subtree_com": ["torso"]}

    def __init__(self) -> None:
        self.mem = terms.MemoryLayout(last_action=8, command=3, air_time=4, last_contact=4,
                                      step=1)
        self.rewards = terms.RewardSum(
            {"tracking_lin_vel": 1.0, "tracking_ang_vel": 0.5, "orientation": -1.0,
             "action_rate": -0.01, "feet_air_time": 1.0, "feet_slip": -0.1,
             "termination": -1.0},
            scale=0.02, floor=0.0)

    def model(self) -> mujoco.MjModel:
        m = mujoco.MjModel.from_xml_string(QUADRUPED_XML)
        self.robot = terms.Robot.from_model(m, "stand")
        self.feet = terms.sensor_columns(m, FOOT_SENSORS)
        self.falls = terms.sensor_columns(m, FALL_SENSORS)
        return m

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(obs_size=3 + 3 + 8 + 8 + 8 + 3 + 2, action_size=8, frame_skip=4,
                        max_episode_steps=200, memory_size=self.mem.size,
                        info_names=self.rewards.info_names,
                        action_low=-np.ones(8), action_high=np.ones(8))

    def reset(self, pool, ids, rng, memory) -> None:
        qpos = terms.reset_joints(rng, ids, self.robot, 0.1)
        terms.reset_base_pose(qpos, rng, ids, self.robot, xy=0.0, yaw=math.pi)
        pool.qpos[ids] = qpos

    def start(self, pool, ids, memory) -> None:
        memory[ids] = 0.0

    def resample(self, ids, rng, memory) -> None:
        memory[ids, self.mem["command"]] = terms.sample_velocity_command(
            rng, ids, [-0.5, -0.2, -0.5], [0.5, 0.2, 0.5])

    def act(self, pool, ids, actions, memory) -> None:
        pool.ctrl[ids] = self.robot.default_joint_pos + 0.5 * actions

    def evaluate(self, pool, ids, actions, memory) -> Transition:
        qpos, qvel, mem, m = pool.qpos[ids], pool.qvel[ids], memory[ids], self.mem
        sensors = pool.outputs["sensordata"][ids, :, 0]
        g = terms.projected_gravity(qpos[:, self.robot.base_quat])
        lin = terms.base_lin_vel_local(qpos, qvel, self.robot)
        cmd = mem[:, m["command"]]
        contact = terms.contact_found(sensors, self.feet)
        feet_vel = terms.body_lin_vel_world(pool.outputs["cvel"][ids], pool.outputs["xpos"][ids],
                                            pool.outputs["subtree_com"][ids])
        fallen = (terms.body_contact(sensors, self.falls) | terms.tilted(g, math.radians(60))
                  | terms.nonfinite(qpos, qvel))
        reward, info = self.rewards({
            "tracking_lin_vel": terms.tracking_lin_vel_xy(cmd, lin, 0.25),
            "tracking_ang_vel": terms.tracking_yaw_rate(cmd[:, 2], qvel[:, 5], 0.25),
            "orientation": terms.flat_orientation(g),
            "action_rate": terms.action_rate(actions, mem[:, m["last_action"]]),
            "feet_air_time": terms.feet_air_time(contact, mem[:, m["air_time"]],
                                                 mem[:, m["last_contact"]], 0.02, 0.1),
            "feet_slip": terms.feet_slip(contact, feet_vel),
            "termination": fallen,
        })
        mem[:, m["last_action"]] = actions
        mem[:, m["step"]] += 1
        memory[ids] = mem
        return Transition(reward=reward, terminated=fallen, info=info)

    def observe(self, pool, ids, memory, obs, critic) -> None:
        qpos, qvel, mem, m = pool.qpos[ids], pool.qvel[ids], memory[ids], self.mem
        phase = terms.gait_phase(mem[:, m.column("step")], 0.02, 1.5)
        obs[ids] = np.concatenate([
            terms.base_ang_vel_local(qvel, self.robot),
            terms.projected_gravity(qpos[:, self.robot.base_quat]),
            terms.joint_pos_rel(qpos, self.robot), terms.joint_vel(qvel, self.robot),
            mem[:, m["last_action"]], mem[:, m["command"]], terms.gait_clock(phase)], axis=1)


def test_a_task_written_with_terms_runs() -> None:
    env = TaskVectorEnv(QuadrupedWalk(), 8, num_threads=1, seed=0)
    obs, _ = env.reset(seed=1)
    assert obs.shape == (8, 35) and np.isfinite(obs).all()
    rng = np.random.default_rng(0)
    touchdowns = 0
    for t in range(61):
        if t == 60:  # turn env 2 upside down: the next step ends its episode as a fall
            env.pool.qpos[2, 3:7] = [0.0, 1.0, 0.0, 0.0]
        obs, reward, term, _, info = env.step(rng.uniform(-1, 1, (8, 8)))
        total = sum(info[name] for name in env.spec.info_names)
        np.testing.assert_allclose(total, reward, rtol=0, atol=ATOL)
        assert np.isfinite(obs).all() and (reward >= 0).all()
        touchdowns += int((info["reward_feet_air_time"] != 0).sum())
    assert term[2] and info["reward_termination"][2] == -0.02 and info["episode_length"][2] == 61
    assert touchdowns > 0  # feet air time is being kept in memory
