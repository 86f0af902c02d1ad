"""Reset and command events: start states and velocity commands drawn per env.

Draws come from :class:`~lightning_unilab.envs.tasks.rng.EnvRng`, the per-env streams the C++
tasks share, so an env's start state depends on the seed and its index only (never on which
other envs reset with it), and a numpy task can reproduce a C++ one draw for draw. Each
function draws a fixed count per env (the order of calls is the order of draws).
"""

from __future__ import annotations

import numpy as np

from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.envs.terms.layout import Robot

__all__ = ["apply_due_push", "quat_mul", "reset_base_pose", "reset_base_velocity",
           "reset_joints", "sample_push", "sample_velocity_command"]


def reset_joints(rng: EnvRng, ids: np.ndarray, robot: Robot, noise: float) -> np.ndarray:
    """(n, nq) qpos rows: the default pose with each joint + U(-noise, noise) (num_joints
    draws per env): varied starts near a pose the robot can hold."""
    qpos = np.broadcast_to(robot.default_qpos, (len(ids), robot.default_qpos.size)).copy()
    qpos[:, robot.joint_qpos] += rng.uniform(ids, -noise, noise, robot.num_joints)
    return qpos


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, 4): Hamilton products a b of (w, x, y, z) quaternions (rotation b, then a)."""
    aw, ax, ay, az = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    bw, bx, by, bz = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=1)


def reset_base_pose(qpos: np.ndarray, rng: EnvRng, ids: np.ndarray, robot: Robot,
                    xy: float, yaw: float) -> None:
    """Shift the base of qpos rows (n, nq) in place by U(-xy, xy) in x and y and turn it by
    U(-yaw, yaw) about the world's vertical (3 draws per env): the policy should not learn one
    heading or spot."""
    u = rng.uniform(ids, np.array([-xy, -xy, -yaw]), np.array([xy, xy, yaw]), 3)
    pos, quat = robot.base_pos, robot.base_quat
    qpos[:, pos.start:pos.start + 2] += u[:, :2]
    half = 0.5 * u[:, 2]
    turn = np.zeros((len(ids), 4))
    turn[:, 0], turn[:, 3] = np.cos(half), np.sin(half)
    qpos[:, quat] = quat_mul(turn, qpos[:, quat])


def reset_base_velocity(rng: EnvRng, ids: np.ndarray, noise: float) -> np.ndarray:
    """(n, 6): base linear and angular velocity, each U(-noise, noise) (6 draws per env), for
    the free joint's qvel columns: starts that already need balancing."""
    return rng.uniform(ids, -noise, noise, 6)


def sample_velocity_command(rng: EnvRng, ids: np.ndarray, low: np.ndarray,
                            high: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """(n, 3): commands (forward, sideways, yaw rate) drawn U(low, high) per component (3 draws
    per env), for the task's command memory columns at resample. ``keep`` (3,): each component
    stays with that probability, else it is 0 (3 more draws per env, none when every one is 1):
    MuJoCo Playground's G1 joystick zeroes most sideways and turn commands so that most walk
    straight."""
    cmd = rng.uniform(ids, np.asarray(low, np.float64), np.asarray(high, np.float64), 3)
    if keep is not None and (np.asarray(keep) < 1).any():
        cmd[rng.uniform(ids, 0.0, 1.0, 3) >= keep] = 0.0
    return cmd


def sample_push(rng: EnvRng, ids: np.ndarray, period: int, low: float,
                high: float) -> np.ndarray:
    """(n, 3): the next push of each env, (steps until it, vx, vy) (3 draws per env): at a step
    drawn uniformly in 1..period, the base's planar velocity changes by U(low, high) m/s in a
    uniformly drawn world direction. For memory columns at resample, so that a policy learns to
    recover from shoves as Playground's and legged_gym's are trained to."""
    u = rng.uniform(ids, np.array([0.0, low, -np.pi]), np.array([period, high, np.pi]), 3)
    steps = np.minimum(np.floor(u[:, 0]), period - 1) + 1.0
    return np.stack([steps, u[:, 1] * np.cos(u[:, 2]), u[:, 1] * np.sin(u[:, 2])], axis=1)


def apply_due_push(qvel: np.ndarray, push: np.ndarray, robot: Robot) -> np.ndarray:
    """Count each row's push (n, 3) of :func:`sample_push` down by one step, in place, and add
    the velocity change of those that come due now to their qvel rows (n, nv), in place;
    returns the mask of rows pushed. A push comes due once: the count then runs negative."""
    push[:, 0] -= 1.0
    due = push[:, 0] == 0.0
    lin = robot.base_lin_vel.start
    qvel[due, lin:lin + 2] += push[due, 1:3]
    return due
