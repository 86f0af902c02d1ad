"""Observation terms: what a locomotion policy sees, for the rows of many envs at once.

Inputs are (n, ...) rows gathered once per step from the pool's views (``pool.qpos[ids]``,
``pool.outputs["cvel"][ids]`` ...), so that the same functions also run over
``mujoco.batch.Batch`` arrays. Quaternions are MuJoCo's (w, x, y, z).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.envs.terms.layout import Robot

__all__ = ["base_ang_vel_local", "base_lin_vel_local", "body_lin_vel_world", "gait_clock",
           "gait_phase", "joint_pos_rel", "joint_vel", "observation_noise", "projected_gravity",
           "quat_rotate_inverse"]


def projected_gravity(quat: np.ndarray) -> np.ndarray:
    """(n, 3): the world's down direction (0, 0, -1) in the frame of orientation quat (n, 4).

    Why: it tells the policy which way is up without a yaw it cannot observe; its xy part is
    the flat-orientation penalty and its z part the tilt termination. Written as the third
    row of the rotation matrix, as MuJoCo's mju_quat2Mat (and the C++ tasks) compute it.
    """
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    return np.stack([-2 * (x * z - w * y), -2 * (y * z + w * x),
                     -(w * w - x * x - y * y + z * z)], axis=1)


def quat_rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """(n, 3): world-frame vectors vec (n, 3) expressed in the frames of quat (n, 4): R^T v."""
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    v0, v1, v2 = vec[:, 0], vec[:, 1], vec[:, 2]
    ww, xx, yy, zz = w * w, x * x, y * y, z * z
    return np.stack([
        (ww + xx - yy - zz) * v0 + 2 * (x * y + w * z) * v1 + 2 * (x * z - w * y) * v2,
        2 * (x * y - w * z) * v0 + (ww - xx + yy - zz) * v1 + 2 * (y * z + w * x) * v2,
        2 * (x * z + w * y) * v0 + 2 * (y * z - w * x) * v1 + (ww - xx - yy + zz) * v2,
    ], axis=1)


def base_lin_vel_local(qpos: np.ndarray, qvel: np.ndarray, robot: Robot) -> np.ndarray:
    """(n, 3): the base's linear velocity in its own frame (the free joint's qvel is in the
    world frame), the quantity a velocity command is tracked against."""
    return quat_rotate_inverse(qpos[:, robot.base_quat], qvel[:, robot.base_lin_vel])


def base_ang_vel_local(qvel: np.ndarray, robot: Robot) -> np.ndarray:
    """(n, 3): the base's angular velocity in its own frame (as a gyro reads it); a free
    joint's angular qvel already is, so this is a column selection."""
    return qvel[:, robot.base_ang_vel]


def joint_pos_rel(qpos: np.ndarray, robot: Robot) -> np.ndarray:
    """(n, num_joints): joint positions minus the default pose, so that standing reads zero."""
    return qpos[:, robot.joint_qpos] - robot.default_joint_pos


def joint_vel(qvel: np.ndarray, robot: Robot) -> np.ndarray:
    """(n, num_joints): joint velocities (relative to the default pose, which is at rest)."""
    return qvel[:, robot.joint_dof]


def body_lin_vel_world(cvel: np.ndarray, xpos: np.ndarray, root_com: np.ndarray) -> np.ndarray:
    """(n, k, 3): world-frame linear velocity of k bodies' frame origins (e.g. feet, for slip)
    from the pool outputs ``cvel`` (n, k, 6) and ``xpos`` (n, k, 3) of those bodies and
    ``subtree_com`` (n, 1, 3) of their root body (where MuJoCo expresses ``cvel``): no velocity
    sensor needed. As ``mj_objectVelocity`` with mjOBJ_XBODY; pass ``xipos`` for the centre of
    mass (mjOBJ_BODY)."""
    return cvel[..., 3:] - np.cross(xpos - root_com, cvel[..., :3])


def gait_phase(step: np.ndarray, dt: float, frequency: float,
               offsets: Sequence[float] | np.ndarray = (0.0,)) -> np.ndarray:
    """(n, k): gait phases 2 pi f t + offset in radians (not wrapped), t = step * dt, one column
    per offset (e.g. (0, pi) for two feet in alternation): the clock a periodic gait keeps
    time by, from the per-env step count kept in memory."""
    phase = 2 * np.pi * frequency * dt * np.asarray(step, np.float64)
    return phase[:, None] + np.asarray(offsets, np.float64)[None, :]


def gait_clock(phase: np.ndarray) -> np.ndarray:
    """(n, 2k): cos then sin of the k phases: a continuous clock input (no jump at 2 pi)."""
    return np.concatenate([np.cos(phase), np.sin(phase)], axis=1)


def observation_noise(obs: np.ndarray, keys: np.ndarray, steps: np.ndarray,
                      scale: np.ndarray) -> np.ndarray:
    """(n, k): observations obs (n, k) plus U(-scale, scale) per column, scale (k,); columns
    of scale 0 are returned unchanged, bit for bit.

    Why: a policy trained on exact observations trusts them more than a robot's sensors
    deserve (legged_gym's, MuJoCo Playground's and Isaac Lab's velocity tasks all add such
    noise). Row i's draws are the stream ``Rng::ForEnv(keys[i], steps[i])``, one per column
    in order, noised or not: a key drawn once per episode (kept in memory) and the step count
    give each observation fresh noise without a draw at observe time, as the C++ tasks' const
    Observe needs.
    """
    u = EnvRng.for_envs(keys, steps).uniform(np.arange(len(obs)), -1.0, 1.0, obs.shape[1])
    out = obs.copy()
    noised = np.flatnonzero(scale)
    out[:, noised] += u[:, noised] * scale[noised]
    return out
