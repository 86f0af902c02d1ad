"""Batched unit-quaternion maths in MuJoCo's order (w, x, y, z) over any leading dimensions.

mujoco's mju_* helpers take one quaternion per call; clips hold thousands, so these work on whole
arrays at once.
"""

from __future__ import annotations

import numpy as np


def normalize(q: np.ndarray) -> np.ndarray:
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def conj(q: np.ndarray) -> np.ndarray:
    return q * np.array([1.0, -1.0, -1.0, -1.0])


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b (b applied first when rotating a vector)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)


def from_axis_angle(axis: np.ndarray, angle: np.ndarray | float) -> np.ndarray:
    """Rotation by angle (rad) about axis (normalized here)."""
    axis = np.asarray(axis, np.float64)
    axis = axis / np.linalg.norm(axis, axis=-1, keepdims=True)
    half = 0.5 * np.asarray(angle, np.float64)[..., None]
    return np.concatenate([np.cos(half), np.sin(half) * axis], axis=-1)


def rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v rotated by q."""
    qv = np.concatenate([np.zeros(v.shape[:-1] + (1,)), v], axis=-1)
    return mul(mul(q, qv), conj(q))[..., 1:]


def continuous(q: np.ndarray) -> np.ndarray:
    """q along axis 0 (frames) with signs flipped so that neighbours lie in one hemisphere:
    q and -q are the same rotation, but a finite difference across a flip is not."""
    q = np.array(q, np.float64, copy=True)
    for k in range(1, len(q)):
        flip = np.sum(q[k] * q[k - 1], axis=-1) < 0
        q[k][flip] *= -1.0
    return q


def slerp(q0: np.ndarray, q1: np.ndarray, t: np.ndarray | float) -> np.ndarray:
    """Spherical interpolation on the shortest arc; t broadcasts against q0[..., 0]."""
    t = np.asarray(t, np.float64)[..., None]
    dot = np.sum(q0 * q1, axis=-1, keepdims=True)
    q1 = np.where(dot < 0, -q1, q1)
    dot = np.abs(dot)
    # the angle from atan2 of the sine and cosine parts: acos(dot) loses digits near dot = 1
    sin = np.linalg.norm(q1 - dot * q0, axis=-1, keepdims=True)
    theta = np.arctan2(sin, dot)
    small = theta < 1e-9
    safe = np.where(small, 1.0, np.sin(theta))
    w0 = np.where(small, 1.0 - t, np.sin((1.0 - t) * theta) / safe)
    w1 = np.where(small, t, np.sin(t * theta) / safe)
    return normalize(w0 * q0 + w1 * q1)


def log(q: np.ndarray) -> np.ndarray:
    """Rotation vector (axis * angle, angle in [0, pi]) of q."""
    q = np.where(q[..., :1] < 0, -q, q)
    vec = q[..., 1:]
    sin = np.linalg.norm(vec, axis=-1, keepdims=True)
    angle = 2.0 * np.arctan2(sin, q[..., :1])
    scale = np.where(sin < 1e-12, 2.0, angle / np.where(sin < 1e-12, 1.0, sin))
    return vec * scale


def angular_velocity_body(q: np.ndarray, dt: float) -> np.ndarray:
    """Body-frame angular velocity of the frames q (axis 0) from the quaternion derivative,
    omega = 2 vec(conj(q) * dq/dt), dq/dt by np.gradient (central inside, one-sided at the ends)."""
    q = continuous(q)
    dq = np.gradient(q, dt, axis=0)
    return 2.0 * mul(conj(q), dq)[..., 1:]
