"""Reward terms of velocity-tracking locomotion, each one number per env, and their weighted sum.

Terms are unweighted (a kernel in [0, 1] or a non-negative penalty); :class:`RewardSum` applies
the weights, so that a task's weights are one table and its ``info`` reports each term's share.
Stateful terms (feet air time) update the memory columns they are given in place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["RewardSum", "action_rate", "ang_vel_xy", "base_height", "feet_air_time",
           "feet_contact_phase", "feet_slip", "feet_swing_height", "flat_orientation",
           "in_stance", "lin_vel_z", "swing_height_target", "torques", "tracking_kernel",
           "tracking_lin_vel_xy", "tracking_yaw_rate"]


def tracking_kernel(error_sq: np.ndarray, sigma: float) -> np.ndarray:
    """exp(-error_sq / sigma): 1 at perfect tracking, decaying over an error of sqrt(sigma)."""
    return np.exp(-error_sq / sigma)


def tracking_lin_vel_xy(command: np.ndarray, lin_vel: np.ndarray, sigma: float) -> np.ndarray:
    """(n,): kernel of the planar velocity error; command and lin_vel (n, >= 2), both in the
    base frame (columns 0, 1: forward, sideways)."""
    ex = command[:, 0] - lin_vel[:, 0]
    ey = command[:, 1] - lin_vel[:, 1]
    return tracking_kernel(ex * ex + ey * ey, sigma)


def tracking_yaw_rate(command_yaw: np.ndarray, yaw_rate: np.ndarray, sigma: float) -> np.ndarray:
    """(n,): kernel of the yaw-rate error (the base-frame angular velocity's z)."""
    e = command_yaw - yaw_rate
    return tracking_kernel(e * e, sigma)


def lin_vel_z(vz: np.ndarray) -> np.ndarray:
    """(n,): vz^2, the penalty on bouncing (vertical base velocity)."""
    return vz * vz


def ang_vel_xy(ang_vel: np.ndarray) -> np.ndarray:
    """(n,): wx^2 + wy^2 of the base-frame angular velocity: the penalty on rolling and
    pitching."""
    return ang_vel[:, 0] * ang_vel[:, 0] + ang_vel[:, 1] * ang_vel[:, 1]


def flat_orientation(gravity: np.ndarray) -> np.ndarray:
    """(n,): gx^2 + gy^2 of the projected gravity: zero when the base is level, sin^2 of the
    tilt otherwise."""
    return gravity[:, 0] * gravity[:, 0] + gravity[:, 1] * gravity[:, 1]


def base_height(height: np.ndarray, target: float) -> np.ndarray:
    """(n,): (height - target)^2, the penalty for crouching or rising off the nominal height."""
    d = height - target
    return d * d


def action_rate(action: np.ndarray, last_action: np.ndarray) -> np.ndarray:
    """(n,): sum of (action - last action)^2: the penalty on jerky control."""
    da = action - last_action
    return np.einsum("ij,ij->i", da, da)


def pose_deviation(joint_pos_rel: np.ndarray) -> np.ndarray:
    """(n,): sum of squared joint offsets from the default pose: keeps the posture near home
    (joint_pos_rel (n, k), e.g. :func:`joint_pos_rel`'s)."""
    return np.einsum("ij,ij->i", joint_pos_rel, joint_pos_rel)


def joint_deviation(joint_pos_rel: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(n,): sum of |joint offset| x weight (weights (n, k) or (k,), e.g. 0 to leave a joint free
    under some commands): an L1 pull toward the default pose on chosen joints."""
    return (np.abs(joint_pos_rel) * weights).sum(axis=1)


def torques(actuator_force: np.ndarray) -> np.ndarray:
    """(n,): sum of actuator_force^2, the penalty on effort."""
    return np.einsum("ij,ij->i", actuator_force, actuator_force)


def feet_air_time(contact: np.ndarray, air_time: np.ndarray, last_contact: np.ndarray,
                  dt: float, threshold: float) -> np.ndarray:
    """(n,): sum over feet touching down this step of (time in the air - threshold): rewards
    steps longer than threshold, penalizes shuffling.

    contact (n, k) bool; air_time and last_contact (n, k) are memory columns, updated in place:
    air time grows by dt per step and restarts at contact.
    """
    air_time += dt
    first = contact & (last_contact == 0)
    reward = np.where(first, air_time - threshold, 0.0).sum(axis=1)
    air_time[...] = np.where(contact, 0.0, air_time)
    last_contact[...] = contact
    return reward


def feet_slip(contact: np.ndarray, foot_lin_vel: np.ndarray) -> np.ndarray:
    """(n,): sum over feet in contact of their horizontal speed^2: a planted foot should not
    slide. contact (n, k) bool, foot_lin_vel (n, k, >= 2) in the world frame."""
    vx, vy = foot_lin_vel[..., 0], foot_lin_vel[..., 1]
    return np.where(contact, vx * vx + vy * vy, 0.0).sum(axis=1)


def in_stance(phase: np.ndarray) -> np.ndarray:
    """(n, k) bool: the first half of each gait cycle is stance, the second swing."""
    return np.mod(phase, 2 * np.pi) < np.pi


def swing_height_target(phase: np.ndarray, swing_height: float) -> np.ndarray:
    """(n, k): the foot height a gait asks for: 0 in stance, a smooth bump up to swing_height
    in swing (16 s^2 (1 - s)^2, s the swing's progress in [0, 1): no jerk at lift-off or
    touch-down)."""
    s = np.mod(phase, 2 * np.pi) / np.pi - 1.0
    bump = 16.0 * s * s * (1.0 - s) * (1.0 - s)
    return np.where(s >= 0.0, swing_height * bump, 0.0)


def feet_swing_height(foot_z: np.ndarray, phase: np.ndarray, swing_height: float,
                      sigma: float) -> np.ndarray:
    """(n,): kernel of the feet's height error against :func:`swing_height_target`: teaches
    lifting the feet to the gait clock. foot_z (n, k) (e.g. ``site_xpos[..., 2]``)."""
    err = foot_z - swing_height_target(phase, swing_height)
    return tracking_kernel((err * err).sum(axis=1), sigma)


def swing_target_bezier(phase: np.ndarray, swing_height: float) -> np.ndarray:
    """(n, k): MuJoCo Playground's G1 swing target, a foot height for every phase (no stance):
    with x = ((phase + pi) mod 2 pi) / (2 pi) in [0, 1), it rises from 0 at x = 0 to
    swing_height at x = 1/2 and falls back to 0 at x = 1, along the cubic Bezier
    a + (b - a) (u^3 + 3 u^2 (1 - u)) with u = 2x, then 2x - 1. The C++ twin is g1_walk.cc's
    SwingTarget (same operations, in the same order)."""
    phi = np.mod(phase + np.pi, 2 * np.pi) - np.pi
    x = (phi + np.pi) / (2 * np.pi)
    rising = x <= 0.5
    u = np.where(rising, 2 * x, 2 * x - 1)
    bezier = u * u * u + 3 * u * u * (1 - u)
    return np.where(rising, swing_height * bezier, swing_height - swing_height * bezier)


def feet_phase(foot_z: np.ndarray, phase: np.ndarray, swing_height: float,
               sigma: float) -> np.ndarray:
    """(n,): exp(-sum over feet (foot_z - target)^2 / sigma) against
    :func:`swing_target_bezier`: the feet lift and land to the gait clock. foot_z (n, k): each
    foot's height above the floor (0 standing)."""
    err = foot_z - swing_target_bezier(phase, swing_height)
    return tracking_kernel((err * err).sum(axis=1), sigma)


def feet_contact_phase(contact: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """(n,): the number of feet whose contact agrees with the gait clock (in contact during
    stance, in the air during swing)."""
    return (contact == in_stance(phase)).sum(axis=1).astype(np.float64)


@dataclass(frozen=True)
class RewardSum:
    """reward = max(floor, scale * sum_k weight_k * term_k) + scale * sum_a weight_a * term_a,
    k over the terms under the floor and a over ``after_floor``, with each term's share for
    ``info``.

    ``info_names`` are ``reward_<term>`` in the order of ``weights`` (and ``reward_floor``, what
    the floor added, when there is a floor), ready for ``TaskSpec(info_names=...)``: the shares
    sum to the reward, so logs and the evaluation plot show where it came from. scale is
    usually the control step (rewards per second of simulated time). ``after_floor`` holds
    penalties the floor must not cancel, as legged_gym adds its termination penalty after
    clipping: under a floor of 0 a fall would cost at most that step's positive rest.
    """

    weights: Mapping[str, float]
    scale: float = 1.0
    floor: float | None = None  # None: no floor, no reward_floor column
    after_floor: tuple[str, ...] = ()
    _names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.weights:
            raise ValueError("weights: expected at least one {term: weight}")
        for name, w in self.weights.items():
            if isinstance(w, bool) or not isinstance(w, int | float | np.integer | np.floating) \
                    or not math.isfinite(w):
                raise ValueError(f"weights[{name!r}]: expected a finite number, got {w!r}")
        if self.floor is not None and math.isnan(self.floor):
            raise ValueError("floor: expected a number or None, got NaN")
        unknown = [k for k in self.after_floor if k not in self.weights]
        if unknown:
            raise ValueError(f"after_floor: expected names among the weights {list(self.weights)}"
                             f", got {unknown}")
        object.__setattr__(self, "weights", dict(self.weights))  # later edits cannot reach it
        object.__setattr__(self, "after_floor", tuple(self.after_floor))
        names = tuple(f"reward_{k}" for k in self.weights)
        object.__setattr__(self, "_names", names + (("reward_floor",) if self.floor is not None
                                                    else ()))

    @property
    def info_names(self) -> tuple[str, ...]:
        return self._names

    def __call__(self, terms: Mapping[str, np.ndarray | float]
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(reward (n,), {info name: share}) from {term: (n,) values} (bools count 0/1)."""
        if set(terms) != set(self.weights):
            missing = [k for k in self.weights if k not in terms]
            extra = [k for k in terms if k not in self.weights]
            raise ValueError(f"reward terms: missing {missing}, unweighted {extra}; expected "
                             f"exactly {list(self.weights)}")
        weighted = [(k, w * np.asarray(terms[k])) for k, w in self.weights.items()]
        info = {f"reward_{k}": self.scale * wt for k, wt in weighted}
        under = self.scale * _sum(wt for k, wt in weighted if k not in self.after_floor)
        after = self.scale * _sum(wt for k, wt in weighted if k in self.after_floor)
        if self.floor is None:
            return under + after, info
        lifted = np.maximum(self.floor, under)
        info["reward_floor"] = lifted - under
        return lifted + after, info


def _sum(values: Iterable[np.ndarray]) -> np.ndarray | float:
    """Left-to-right sum (0.0 for none), the order the C++ tasks add in."""
    total: np.ndarray | float = 0.0
    for v in values:
        total = total + v
    return total
