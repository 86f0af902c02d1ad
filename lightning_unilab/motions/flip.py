"""A standing back flip for the 29-DoF G1 whose flight obeys ballistics, made by keyframes.

``clips/g1_backflip.npz`` (``python -m lightning_unilab.motions make-flip OUT.npz``,
deterministic), 50 fps, from and back to the ``knees_bent`` home pose: stand (1 s), crouch with
the arms swung back, push off as the arms swing up, a full backward turn (2 pi about the pitch
axis) tucked in the air, land on both feet, absorb in a squat and stand again (1.5 s).

A keyframed clip that ignores physics teaches a tracker a flip no robot can do, so the flight is
solved, not drawn. Joint angles follow keyframes (quintic segments: angle, speed and
acceleration given at each key). On the floor both feet are planted flat, soles at z = 0, and
the root follows from the legs by forward kinematics from a planted foot. In the air nothing
acts but gravity, so:

- the centre of mass (``subtree_com`` of the root) follows the parabola of its take-off position
  and velocity: each flight frame's root position is the one that puts it there;
- the angular momentum L about the centre of mass keeps its take-off value: the root pitch p is
  integrated from pitch rate = (L - h) / I, where I is the body's pitch inertia about its
  centre of mass and h the momentum of the joints' own motion (a row of ``mj_angmomMat``), so
  the tuck spins the body up and the opening slows it. The integration uses the central
  differences a clip's velocities are taken with (``qpos_to_clip``), so the clip's own
  velocities keep L (integrated continuously, the pitch stays within 0.04 rad of it, but the
  clip's differences would read L swinging by 8 %).

Take-off: the legs' speeds are solved (with the root's) so that, on the planted feet, the
centre of mass leaves at the speed the flight time needs and with the momentum L; their
accelerations so that the floor's force is zero at the instant of take-off and the feet then
rise. Landing: the legs' pose is solved so that the root, pitched LANDING_LEAN short of the
full turn, puts the centre of mass on the parabola and both feet flat on the floor; their
speeds so that the feet touch down at rest (no impact), their accelerations so that the feet
arrive decelerating (never below the floor) and the floor's force starts from zero. L is the
one whose flight reaches the landing's pitch (a secant). The root's velocity is continuous at
take-off and touch down; accelerations step there, as the floor's force does.

The floor phases are keyframed, not dynamically solved. The keys and timings were searched
(CMA-ES over every key, the checks below as penalties) so that the floor can nearly give what
they ask (``motions.floor``: the centre of pressure near the soles, friction under 0.7, never a
pull) and the motors nearly make the torques (``motions.torque``: the worst joint within 1.7 x
its limit, the waist pitch; a flip at the G1's 50 N m waist needs a gentle tuck);
``check_flip`` keeps those bounds (``docs/unilab/motions.md`` has the numbers and what is left
outside them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from lightning_unilab.motions import quat
from lightning_unilab.motions.checks import clip_report, foot_points
from lightning_unilab.motions.clip import MotionClip, model_joint_names, save_clip
from lightning_unilab.motions.convert import clip_state, qpos_to_clip
from lightning_unilab.motions.floor import FloorDemand, floor_demand
from lightning_unilab.motions.keyframes import (
    FOOT_BODIES,
    FOOT_GEOMS,
    HOME_KEY,
    LEGS,
    TRACKED_BODIES,
)
from lightning_unilab.motions.torque import JointDemand, joint_demand

__all__ = ["FLIP_FPS", "FlipReport", "check_flip", "flip_clip", "flip_report",
           "make_flip"]

FLIP_FPS = 50.0
# timeline (s)
HOME_S = 1.0  # standing still at home
CROUCH_S = 1.438  # the bottom of the counter-movement
PUSH_S = 0.054  # before take-off, the legs' last key on the floor
TAKEOFF_S = 1.844  # the last frame on the floor
FLIGHT_FRAMES = 28  # in the air: 0.56 s at 50 fps
TUCK_IN_S = 0.365  # after take-off, the tuck is reached
TUCK_OUT_S = 0.114  # before touch down, the tuck opens
SETTLE_S = 0.866  # after the squat, the legs' key on the way up
ABSORB_S = 0.070  # after touch down, the lowest point of the squat
RISE_S = 1.489  # after touch down, home again
HOLD_S = 1.571  # then standing still
# the flight's ends
LANDING_DROP = 0.193  # m the centre of mass lands lower than it took off (flexed legs)
TAKEOFF_VX = -1.085  # m/s of the centre of mass forward at take-off: a back flip drifts back
# m the foot bodies land ahead of the centre of mass: behind it, so that it stops over them
LANDING_FOOT_X = -0.125
LANDING_LEAN = 0.905  # rad of pitch left at touch down (leaning forward; the squat ends the turn)
FOOT_LIFT_ACC = 20.0  # m/s^2 of the feet upward as they leave and as they arrive: never below 0
# what the generator guarantees (the test checks them on the shipped file)
MAX_JOINT_SPEED = 25.0  # rad/s
MAX_COM_RESIDUAL = 1e-3  # m, centre of mass off its parabola in the air
MAX_MOMENTUM_SPREAD = 0.02  # of |L|, angular momentum about the centre of mass in the air
TURN_TOLERANCE = 0.1  # rad, the root pitch's total turn against 2 pi
MAX_SOLE_HEIGHT = 0.005  # m, soles off the floor at start, take-off, touch down and end
MAX_SLIP = 0.005  # m per frame, a foot on the floor
MAX_HOME_ERROR = 0.05  # rad, the last frame against home
# what the floor must do (motions.floor): the soles' missing moment (m x weight) and friction
MAX_FLOOR_MOMENT = 0.4
MAX_FRICTION = 0.7
# what the motors must do (motions.torque): the worst joint torque over its actuator's limit
MAX_TORQUE_RATIO = 1.7
# a foot counts as off the floor above this (m): exact kinematics put a planted sole at 0
FLIGHT_CLEARANCE = 1e-4

# Keyframes of the sagittal channels, the same on both sides (the other joints stay at home):
# phase -> channel -> angle (rad) or (angle, speed rad/s). A phase's time is in _PHASES, from
# "t0" (take-off) or "t1" (touch down); "home" is the home pose. The legs at take-off and touch
# down are solved (see the module's docstring), their take-off pose below is the design's.
_PHASES: dict[str, tuple[str, float]] = {
    "stand": ("0", HOME_S), "crouch": ("0", CROUCH_S), "push": ("t0", -PUSH_S),
    "takeoff": ("t0", 0.0),
    "arms_up": ("t0", 0.183), "tucked": ("t0", TUCK_IN_S), "arms_in": ("t0", 0.401),
    "open": ("t1", -TUCK_OUT_S), "land": ("t1", 0.0), "squat": ("t1", ABSORB_S),
    "settle": ("t1", ABSORB_S + SETTLE_S),
    "home": ("t1", RISE_S)}
_LEGS = ("hip_pitch", "knee", "ankle_pitch")
_KEYS: dict[str, dict[str, float | str | tuple[float, float]]] = {
    "stand": {"hip_pitch": "home", "knee": "home", "ankle_pitch": "home",
              "shoulder_pitch": "home", "elbow": "home", "waist_pitch": "home"},
    "crouch": {"hip_pitch": -1.804, "knee": 2.009, "ankle_pitch": -0.84, "shoulder_pitch": 0.228,
               "elbow": 0.983},
    "push": {"hip_pitch": (-1.284, 7.383), "knee": (2.265, -3.354),
             "ankle_pitch": (-0.778, 0.968), "waist_pitch": -0.278},
    "takeoff": {"hip_pitch": -0.414, "knee": 1.939, "ankle_pitch": -0.867,
                "shoulder_pitch": (-1.597, -10.361), "elbow": -0.087},
    "arms_up": {"shoulder_pitch": -2.931},
    "tucked": {"hip_pitch": -2.529, "knee": 2.877, "ankle_pitch": -0.456, "waist_pitch": 0.054},
    "arms_in": {"shoulder_pitch": -0.832, "elbow": 1.951},
    "open": {"hip_pitch": -2.529, "knee": 2.877, "ankle_pitch": -0.456, "waist_pitch": 0.054,
             "shoulder_pitch": -0.832, "elbow": 1.951},
    "land": {"shoulder_pitch": -1.281, "elbow": 1.079, "waist_pitch": 0.452},
    "squat": {"hip_pitch": -2.514, "knee": 2.874, "ankle_pitch": -0.805,
              "shoulder_pitch": -1.114, "elbow": 0.953, "waist_pitch": 0.48},
    "settle": {"hip_pitch": (-2.113, 0.601), "knee": (1.278, -2.875),
               "ankle_pitch": (-0.461, 1.503)},
    "home": {"hip_pitch": "home", "knee": "home", "ankle_pitch": "home",
             "shoulder_pitch": "home", "elbow": "home", "waist_pitch": "home"},
}


@dataclass(frozen=True)
class _Knot:
    """A joint's angle, speed and acceleration at t; ``a_out`` the acceleration leaving the knot
    where it steps (take-off: the legs start to tuck as the floor lets go)."""

    t: float
    p: float
    v: float = 0.0
    a: float = 0.0
    a_out: float | None = None


def _segment(k0: _Knot, k1: _Knot, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Position, velocity and acceleration at t of the quintic through k0 and k1 (their
    positions, velocities and accelerations)."""
    T = k1.t - k0.t
    dp = k1.p - k0.p
    a0 = k0.a if k0.a_out is None else k0.a_out
    c3 = (20 * dp - (8 * k1.v + 12 * k0.v) * T - (3 * a0 - k1.a) * T**2) / (2 * T**3)
    c4 = (-30 * dp + (14 * k1.v + 16 * k0.v) * T + (3 * a0 - 2 * k1.a) * T**2) / (2 * T**4)
    c5 = (12 * dp - 6 * (k1.v + k0.v) * T + (k1.a - a0) * T**2) / (2 * T**5)
    s = t - k0.t
    p = k0.p + s * (k0.v + s * (a0 / 2 + s * (c3 + s * (c4 + s * c5))))
    v = k0.v + s * (a0 + s * (3 * c3 + s * (4 * c4 + s * 5 * c5)))
    a = a0 + s * (6 * c3 + s * (12 * c4 + s * 20 * c5))
    return p, v, a


class _Channels:
    """Every joint's knots; evaluated at any times (positions, velocities, accelerations)."""

    def __init__(self, joints: Sequence[str], home: np.ndarray) -> None:
        self.joints = tuple(joints)
        self.home = np.asarray(home, np.float64)
        self.knots: list[list[_Knot]] = [[_Knot(0.0, h)] for h in self.home]

    def add(self, joint: str, knot: _Knot) -> None:
        knots = self.knots[self.joints.index(joint)]
        if knot.t <= knots[-1].t:
            raise ValueError(f"flip: knots of {joint} out of order at {knot.t} s")
        knots.append(knot)

    def at(self, t: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times, joints) positions, velocities, accelerations; the last knot is held."""
        t = np.atleast_1d(np.asarray(t, np.float64))
        out = np.zeros((3, len(t), len(self.joints)))
        for j, knots in enumerate(self.knots):
            out[0, :, j] = knots[-1].p
            for k0, k1 in zip(knots[:-1], knots[1:], strict=True):
                inside = (t >= k0.t) & (t <= k1.t)
                if inside.any():
                    for i, x in enumerate(_segment(k0, k1, t[inside])):
                        out[i, inside, j] = x
        return out[0], out[1], out[2]


def _pitch_quat(theta: np.ndarray | float) -> np.ndarray:
    return quat.from_axis_angle(np.array([0.0, 1.0, 0.0]), theta)


def _gravity(model: mujoco.MjModel) -> np.ndarray:
    """The model's gravity, which must point down z (the flip turns about y, lands on z = 0)."""
    g = np.array(model.opt.gravity, np.float64)
    if g[2] >= 0 or np.abs(g[:2]).max() > 0:
        raise ValueError(f"model: gravity {g.tolist()} does not point down z")
    return g


class _Body:
    """The G1 in one MjData: poses, and the linear maps from qvel to the feet's twists, the
    centre of mass's velocity and the pitch angular momentum about it."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.joints = model_joint_names(model)
        self.qadr = np.array([model.joint(n).qposadr[0] for n in self.joints])
        self.dadr = np.array([model.joint(n).dofadr[0] for n in self.joints])
        self.feet = [model.body(b).id for b in FOOT_BODIES]
        self.legs = np.array([self.joints.index(n) for n in LEGS])
        self.home = model.key(HOME_KEY).qpos[self.qadr].copy()
        # the unknowns of a rate solve: root translation, root pitch (local y), the legs
        self.solved = np.concatenate([[0, 1, 2, 4], self.dadr[self.legs]])
        self._jacp = np.empty((3, model.nv))
        self._jacr = np.empty((3, model.nv))
        self._angmom = np.empty((3, model.nv))

    def pose(self, root_pos: np.ndarray, root_quat: np.ndarray, q: np.ndarray) -> None:
        d = self.data
        d.qpos[:3] = root_pos
        d.qpos[3:7] = root_quat
        d.qpos[self.qadr] = q
        mujoco.mj_kinematics(self.model, d)
        mujoco.mj_comPos(self.model, d)

    def qvel(self, qdot: np.ndarray) -> np.ndarray:
        """Joint speeds as a qvel, the root still."""
        out = np.zeros(self.model.nv)
        out[self.dadr] = qdot
        return out

    @property
    def com(self) -> np.ndarray:
        return self.data.subtree_com[1].copy()

    def rows(self) -> np.ndarray:
        """(16, nv) at the current pose: each foot's linear then angular velocity (world), the
        centre of mass's velocity, and the angular momentum about it about y."""
        m, d = self.model, self.data
        out = []
        for b in self.feet:
            mujoco.mj_jacBody(m, d, self._jacp, self._jacr, b)
            out += [self._jacp.copy(), self._jacr.copy()]
        mujoco.mj_jacSubtreeCom(m, d, self._jacp, 1)
        mujoco.mj_angmomMat(m, d, self._angmom, 1)
        return np.vstack([*out, self._jacp, self._angmom[1:2]])

    def pitch_inertia(self) -> tuple[float, np.ndarray]:
        """The body's pitch inertia about its centre of mass, and the row that maps joint speeds
        to the pitch angular momentum they make with the root's rotation held."""
        mujoco.mj_angmomMat(self.model, self.data, self._angmom, 1)
        row = self._angmom[1]
        return float(row[4]), row[self.dadr]

    def rates(self, qvel: np.ndarray, target: np.ndarray) -> np.ndarray:
        """qvel with the solved dofs set so that rows() @ qvel = target (at the current pose)."""
        rows = self.rows()
        out = qvel.copy()
        out[self.solved] = 0.0
        out[self.solved] = np.linalg.solve(rows[:, self.solved], target - rows @ out)
        return out

    def accelerations(self, qvel: np.ndarray, qacc: np.ndarray, target: np.ndarray,
                      eps: float = 1e-6) -> np.ndarray:
        """qacc with the solved dofs set so that d/dt (rows() @ qvel) = target: rows() @ qacc
        plus the rows' change along qvel (central differences)."""
        m, d = self.model, self.data
        qpos = d.qpos.copy()
        bias = np.zeros(len(target))
        for sign in (1.0, -1.0):
            d.qpos[:] = qpos
            mujoco.mj_integratePos(m, d.qpos, qvel, sign * eps)
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)
            bias += sign * (self.rows() @ qvel) / (2 * eps)
        d.qpos[:] = qpos
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        rows = self.rows()
        out = qacc.copy()
        out[self.solved] = 0.0
        out[self.solved] = np.linalg.solve(rows[:, self.solved], target - bias - rows @ out)
        return out

    def root_on_foot(self, q: np.ndarray, foot_pos: np.ndarray,
                     foot_quat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The root pose that puts the left foot body at foot_pos, foot_quat (the legs are
        mirror images, so the right foot lands on its mirror)."""
        self.pose(np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0]), q)
        body = self.feet[0]
        rq = quat.mul(foot_quat, quat.conj(self.data.xquat[body]))
        rp = foot_pos - quat.rotate(rq, self.data.xpos[body])
        self.pose(rp, rq, q)
        return rp, rq

    def land(self, q: np.ndarray, theta: float, com: np.ndarray, feet: np.ndarray,
             iters: int = 200, tol: float = 1e-12,
             damping: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
        """Root position and leg angles (q's legs replaced) that put the centre of mass at com
        and the foot bodies flat at feet (2, 3), the root pitched theta: damped Newton steps,
        at most 0.2 rad (or m) each, the legs kept within their limits."""
        m, d = self.model, self.data
        rq = _pitch_quat(theta)
        q = q.copy()
        rp = com - self.com_offset(rq, q)
        cols = np.concatenate([[0, 1, 2], self.dadr[self.legs]])
        flat = np.array([1.0, 0.0, 0.0, 0.0])
        low, high = m.jnt_range[[m.joint(self.joints[i]).id for i in self.legs]].T
        for _ in range(iters):
            self.pose(rp, rq, q)
            err = np.concatenate([
                *[np.concatenate([feet[i] - d.xpos[b], quat.log(quat.mul(flat,
                                                                         quat.conj(d.xquat[b])))])
                  for i, b in enumerate(self.feet)], com - d.subtree_com[1]])
            if np.abs(err).max() < tol:
                break
            jac = self.rows()[:15, cols]
            step = jac.T @ np.linalg.solve(jac @ jac.T + damping**2 * np.eye(15), err)
            step *= min(1.0, 0.2 / np.abs(step).max())
            rp = rp + step[:3]
            q[self.legs] = np.clip(q[self.legs] + step[3:], low, high)
        else:
            raise RuntimeError(f"flip: no landing pose reaches the floor (residual "
                               f"{np.abs(err).max():.3g})")
        if (q[self.legs] < low).any() or (q[self.legs] > high).any():
            raise RuntimeError("flip: the landing pose is beyond the legs' joint limits")
        return rp, q

    def com_offset(self, root_quat: np.ndarray, q: np.ndarray) -> np.ndarray:
        """The centre of mass with the root at the origin: the root position that puts it at
        c is c minus this (a translation moves it one for one)."""
        self.pose(np.zeros(3), root_quat, q)
        return self.com


@dataclass
class _Ends:
    """The legs (12, LEGS order) where the flight meets the floor: pose, speed, and the
    accelerations on the floor's side and on the air's side."""

    pose: np.ndarray
    speed: np.ndarray
    acc_floor: np.ndarray
    acc_air: np.ndarray


def _frames() -> tuple[int, int, int]:
    """Take-off frame, touch-down frame, frame count."""
    k0 = int(round(TAKEOFF_S * FLIP_FPS))
    k1 = k0 + FLIGHT_FRAMES
    return k0, k1, k1 + int(round((RISE_S + HOLD_S) * FLIP_FPS)) + 1


def _times() -> tuple[float, float]:
    k0, k1, _ = _frames()
    return k0 / FLIP_FPS, k1 / FLIP_FPS


def _part(joint: str) -> str:
    return joint.removeprefix("left_").removeprefix("right_").removesuffix("_joint")


def _channels(body: _Body, takeoff: _Ends, landing: _Ends) -> _Channels:
    """Every joint's keyframes, the solved legs at take-off and touch down included."""
    t0, t1 = _times()
    origin = {"0": 0.0, "t0": t0, "t1": t1}
    keys = sorted(((origin[o] + dt, phase) for phase, (o, dt) in _PHASES.items()))
    ch = _Channels(body.joints, body.home)
    legs = {body.joints[i]: k for k, i in enumerate(body.legs)}
    for j, name in enumerate(body.joints):
        for t, phase in keys:
            if name in legs and phase in ("takeoff", "land"):
                k = legs[name]
                if phase == "takeoff":
                    ch.add(name, _Knot(t, takeoff.pose[k], takeoff.speed[k],
                                       takeoff.acc_floor[k], takeoff.acc_air[k]))
                else:
                    ch.add(name, _Knot(t, landing.pose[k], landing.speed[k],
                                       landing.acc_air[k], landing.acc_floor[k]))
                continue
            value = _KEYS[phase].get(_part(name))
            if value is None:
                continue
            angle, speed = value if isinstance(value, tuple) else (value, 0.0)
            ch.add(name, _Knot(t, body.home[j] if angle == "home" else angle, speed))
    return ch


def _key_legs(body: _Body, phase: str) -> np.ndarray:
    """The leg angles (LEGS order) a phase's keys give: the take-off's design, a guess."""
    q = body.home.copy()
    for j, name in enumerate(body.joints):
        if _part(name) in _LEGS:
            q[j] = _KEYS[phase][_part(name)]
    return q[body.legs]


SUBSTEPS = 8  # Simpson steps in the first frame of the flight
_TRIES = 30  # secant steps on the momentum
_TOL = 1e-10  # rad, the pitch at touch down against the landing's


@dataclass
class _Flight:
    """The solved flip: every frame's qpos, and what the flight was made from."""

    qpos: np.ndarray  # (frames, nq)
    takeoff_frame: int
    landing_frame: int
    momentum: float  # pitch angular momentum about the centre of mass in the air (kg m^2/s)
    com0: np.ndarray  # centre of mass at take-off
    vel0: np.ndarray  # its velocity


def _pitch_rates(body: _Body, q: np.ndarray, qdot: np.ndarray, momentum: float) -> np.ndarray:
    """Pitch rates (L - h) / I of the root at joint angles q and speeds qdot (rows): I the
    body's pitch inertia about its centre of mass, h the momentum of the joints' own motion.
    About the pitch axis neither depends on the pitch itself."""
    rates = np.empty(len(q))
    level = np.array([1.0, 0.0, 0.0, 0.0])
    for i in range(len(q)):
        body.pose(np.zeros(3), level, q[i])
        inertia, row = body.pitch_inertia()
        rates[i] = (momentum - row @ qdot[i]) / inertia
    return rates


def _secant(tries: list[tuple[float, float]]) -> float:
    """The next momentum from the (momentum, lean error) tries."""
    if len(tries) == 1:
        return tries[0][0] - 1.0
    (m0, e0), (m1, e1) = tries[-2], tries[-1]
    return m1 - e1 * (m1 - m0) / (e1 - e0) if e1 != e0 else m1


@dataclass
class _Attempt:
    """One momentum's flight: the legs' ends, the pitch at every flight frame, and by how much
    the pitch at touch down misses the landing's (rad)."""

    momentum: float
    takeoff: _Ends
    landing: _Ends
    theta: np.ndarray
    miss: float


class _Solver:
    """Take-off, flight and landing of the flip for one angular momentum at a time."""

    def __init__(self, body: _Body) -> None:
        self.body = body
        self.k0, self.k1, self.frames = _frames()
        self.t0, self.t1 = _times()
        self.duration = self.t1 - self.t0
        self.g = _gravity(body.model)
        self.flat = np.array([1.0, 0.0, 0.0, 0.0])
        m = body.model
        # the feet planted flat where home puts them, soles at z = 0
        body.pose(np.zeros(3), self.flat, body.home)
        sole = -min(m.geom_pos[m.geom(g).id][2] - m.geom_size[m.geom(g).id][2]
                    for g in FOOT_GEOMS)
        self.start = np.array([[*body.data.xpos[b][:2], sole] for b in body.feet])
        self.vel0 = np.array([TAKEOFF_VX, 0.0,
                              -self.g[2] * self.duration / 2 - LANDING_DROP / self.duration])
        # d/dt of rows(): in the air the feet rise (leaving) or slow down (arriving), the
        # centre of mass falls, the momentum holds; on the floor's side of take-off and touch
        # down the feet are still and the floor's force is zero at that instant
        self.air = np.concatenate([np.tile([0.0, 0.0, FOOT_LIFT_ACC, 0.0, 0.0, 0.0], 2),
                                   self.g, [0.0]])
        self.floor = np.concatenate([np.zeros(12), self.g, [0.0]])
        self.legs = body.dadr[body.legs]
        self.com0 = np.zeros(3)
        self.theta0 = 0.0
        self.theta1 = LANDING_LEAN - 2.0 * np.pi
        self.feet = self.start.copy()

    def com(self, t: float | np.ndarray) -> np.ndarray:
        """The centre of mass's parabola in the air."""
        tau = np.asarray(t, np.float64)[..., None] - self.t0
        return self.com0 + self.vel0 * tau + 0.5 * self.g * tau**2

    def takeoff(self, momentum: float, guess: _Ends) -> _Ends:
        """The legs at take-off: on the planted feet, the centre of mass leaving at vel0 with
        the momentum; the floor lets go, the feet then rise."""
        body = self.body
        ch = _channels(body, guess, guess)
        q0, qd0, qa0 = (x[0] for x in ch.at(self.t0))
        q0[body.legs] = guess.pose
        _, rq0 = body.root_on_foot(q0, self.start[0], self.flat)
        self.com0 = body.com
        self.theta0 = float(2.0 * np.arctan2(rq0[2], rq0[0]))
        qd0[body.legs] = 0.0
        qvel = body.rates(body.qvel(qd0), np.concatenate([np.zeros(12), self.vel0,
                                                           [momentum]]))
        qacc = body.qvel(qa0)
        floor = body.accelerations(qvel, qacc, self.floor)
        air = body.accelerations(qvel, qacc, self.air)
        return _Ends(guess.pose, qvel[self.legs], floor[self.legs], air[self.legs])

    def pitch(self, ch: _Channels, momentum: float) -> np.ndarray:
        """The root pitch at every flight frame (take-off to touch down), integrated with the
        central differences a clip's velocities are taken with (np.gradient, and the
        quaternion derivative of quat.angular_velocity_body), so that the clip's own velocities
        keep the momentum: at each frame inside the flight

            sin((p[j+1] - p[j]) / 2) + sin((p[j] - p[j-1]) / 2) = dt (L - h[j]) / I[j],

        h from the joints' central differences. The first step after take-off comes from the
        continuous rates (Simpson's rule on SUBSTEPS steps)."""
        dt = 1.0 / FLIP_FPS
        q = ch.at(np.arange(self.k0, self.k1 + 1) / FLIP_FPS)[0]
        qdot = (q[2:] - q[:-2]) / (2.0 * dt)
        rates = _pitch_rates(self.body, q[1:-1], qdot, momentum)
        fine = np.linspace(self.t0, self.t0 + dt, 2 * SUBSTEPS + 1)
        qf, qdf, _ = ch.at(fine)
        first = _pitch_rates(self.body, qf, qdf, momentum)
        theta = np.empty(FLIGHT_FRAMES + 1)
        theta[0] = self.theta0
        theta[1] = self.theta0 + dt / (6.0 * SUBSTEPS) * (
            first[0] + 4.0 * first[1:-1:2].sum() + 2.0 * first[2:-1:2].sum() + first[-1])
        for j in range(1, FLIGHT_FRAMES):
            half = dt * rates[j - 1] - np.sin((theta[j] - theta[j - 1]) / 2.0)
            if abs(half) >= 1.0:
                raise RuntimeError("flip: the root turns more than 2 pi in two frames")
            theta[j + 1] = theta[j] + 2.0 * np.arcsin(half)
        return theta

    def landing(self, momentum: float, guess: _Ends) -> _Ends:
        """The legs at touch down: the root pitched LANDING_LEAN short of the turn, the centre
        of mass on the parabola, the feet flat on the floor and at rest, arriving decelerated;
        the floor then pushes. Nothing here depends on how the flight went, but its momentum."""
        body = self.body
        q1, qd1, qa1 = (x[0] for x in _channels(body, guess, guess).at(self.t1))
        q1[body.legs] = guess.pose
        com1 = self.com(self.t1)
        self.feet[:, 0] = com1[0] + LANDING_FOOT_X
        _, q1 = body.land(q1, self.theta1, com1, self.feet)
        qd1[body.legs] = 0.0
        vel1 = self.vel0 + self.g * self.duration
        qvel = body.rates(body.qvel(qd1), np.concatenate([np.zeros(12), vel1, [momentum]]))
        qacc = body.qvel(qa1)
        air = body.accelerations(qvel, qacc, self.air)
        floor = body.accelerations(qvel, qacc, self.floor)
        return _Ends(q1[body.legs], qvel[self.legs], floor[self.legs], air[self.legs])

    def attempt(self, momentum: float, takeoff: _Ends, landing: _Ends) -> _Attempt:
        """The flight of one momentum between its take-off and its landing; how far its pitch
        at touch down misses the landing's."""
        takeoff = self.takeoff(momentum, takeoff)
        landing = self.landing(momentum, landing)
        theta = self.pitch(_channels(self.body, takeoff, landing), momentum)
        return _Attempt(momentum, takeoff, landing, theta, float(theta[-1] - self.theta1))


def _solve(body: _Body) -> _Flight:
    """The momentum whose flight lands leaning LANDING_LEAN (a secant), and its frames."""
    solver = _Solver(body)
    zero = np.zeros(12)
    takeoff = _Ends(_key_legs(body, "takeoff"), zero, zero, zero)
    landing = _Ends(_key_legs(body, "squat"), zero, zero, zero)
    tries: list[tuple[float, float]] = []
    momentum = -10.0
    for _ in range(_TRIES):
        try_ = solver.attempt(momentum, takeoff, landing)
        takeoff, landing = try_.takeoff, try_.landing
        tries.append((momentum, try_.miss))
        if abs(try_.miss) < _TOL:
            break
        momentum = _secant(tries)
    else:
        raise RuntimeError("flip: no angular momentum lands the turn")
    k0, k1, frames = solver.k0, solver.k1, solver.frames
    theta, start, feet, flat = try_.theta, solver.start, solver.feet, solver.flat
    ch = _channels(body, takeoff, landing)
    times = np.arange(frames) / FLIP_FPS
    q = ch.at(times)[0]
    qpos = np.empty((frames, body.model.nq))
    for k in range(frames):
        if k <= k0 or k >= k1:
            rp, rq = body.root_on_foot(q[k], start[0] if k <= k0 else feet[0], flat)
        else:
            rq = _pitch_quat(theta[k - k0])
            rp = solver.com(times[k]) - body.com_offset(rq, q[k])
        qpos[k, :3], qpos[k, 3:7], qpos[k, body.qadr] = rp, rq, q[k]
    qpos[:, 3:7] = quat.continuous(qpos[:, 3:7])
    return _Flight(qpos, k0, k1, momentum, solver.com0, solver.vel0)


@dataclass(frozen=True)
class FlipReport:
    """A flip clip measured through the model, as a tracker would replay it: poses from the
    clip's root body and joints, velocities from its own (finite-difference) velocities."""

    frames: int
    fps: float
    takeoff_frame: int  # the last frame on the floor before the flight
    landing_frame: int  # the first frame back on it
    flight_time: float  # s
    takeoff_velocity: tuple[float, float, float]  # m/s, the centre of mass's (parabola fit)
    takeoff_com_height: float  # m
    peak_com_height: float  # m, the parabola's top
    com_residual: float  # m, the worst flight frame off the parabola
    momentum: tuple[float, float, float]  # kg m^2/s about the centre of mass, flight mean
    momentum_spread: float  # the worst flight frame's distance from the mean, over its norm
    pitch_turn: float  # rad, the root's pitch from the first frame to the last (unwrapped)
    max_pitch_rate: float  # rad/s, the root's in the air
    max_joint_speed: float  # rad/s
    fastest_joint: str
    limit_excess: float  # rad beyond jnt_range
    sole_heights: tuple[float, float, float, float]  # m, the worst corner of either sole at the
    # first frame, take-off, touch down and the last frame
    stance_drift: float  # m, the worst sole corner's move while on the floor (before take-off,
    # from touch down)
    max_slip: float  # m per frame, a foot on the floor (checks.clip_report)
    max_penetration: float  # m below the floor
    home_error: float  # rad, the last frame's joints and root orientation against home
    floor: FloorDemand  # what the floor must do on the frames a sole is down
    torque: JointDemand  # what the motors must do

    def lines(self) -> list[str]:
        vx, _, vz = self.takeoff_velocity
        return [f"flight            frames {self.takeoff_frame}-{self.landing_frame}, "
                f"{self.flight_time:.2f} s",
                f"take-off speed    {vz:.2f} m/s up, {vx:.2f} m/s forward",
                f"centre of mass    {self.takeoff_com_height:.3f} m at take-off, peak "
                f"{self.peak_com_height:.3f} m, off its parabola {self.com_residual * 1e3:.3g} mm",
                f"momentum (y)      {self.momentum[1]:.2f} kg m^2/s, spread "
                f"{self.momentum_spread * 100:.2f} %",
                f"pitch turn        {self.pitch_turn:.4f} rad, up to "
                f"{self.max_pitch_rate:.1f} rad/s in the air",
                f"max joint speed   {self.max_joint_speed:.2f} rad/s ({self.fastest_joint})",
                f"beyond limits     {self.limit_excess:.3g} rad",
                "soles             " + ", ".join(f"{h * 1e3:.3f}" for h in self.sole_heights)
                + " mm (start, take-off, touch down, end)",
                f"feet on the floor move {self.stance_drift * 1e3:.3g} mm, slip "
                f"{self.max_slip * 1e3:.3f} mm per frame",
                f"penetration       {self.max_penetration * 1e3:.3f} mm",
                f"end against home  {self.home_error:.3g} rad", *self.floor.lines(),
                *self.torque.lines()]


def _pitch(q: np.ndarray) -> np.ndarray:
    """The pitch of the root's x axis in the x-z plane, unwrapped over the frames."""
    x_axis = quat.rotate(q, np.broadcast_to([1.0, 0.0, 0.0], q.shape[:-1] + (3,)))
    return np.unwrap(np.arctan2(-x_axis[:, 2], x_axis[:, 0]))


def flip_report(clip: MotionClip, model: mujoco.MjModel) -> FlipReport:
    """The flip's ballistics, turn, feet and joints (one flight: both feet off the floor)."""
    base = clip_report(clip, model)
    qpos, qvel = clip_state(clip, model)
    data = mujoco.MjData(model)
    geoms = [model.geom(g).id for g in FOOT_GEOMS]
    frames = clip.num_frames
    com = np.empty((frames, 3))
    momentum = np.empty((frames, 3))
    corners = np.empty((frames, len(geoms), 4, 3))
    for k in range(frames):
        data.qpos[:], data.qvel[:] = qpos[k], qvel[k]
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        mujoco.mj_comVel(model, data)
        mujoco.mj_subtreeVel(model, data)
        com[k] = data.subtree_com[1]
        momentum[k] = data.subtree_angmom[1]
        for i, g in enumerate(geoms):
            corners[k, i] = foot_points(model, data, g)
    soles = corners[..., 2]
    air = np.flatnonzero((soles.min(axis=2) > FLIGHT_CLEARANCE).all(axis=1))
    if len(air) == 0 or air[-1] - air[0] + 1 != len(air) or air[0] == 0 or air[-1] == frames - 1:
        raise ValueError(f"{clip.path}: not one flight between frames on the floor (both feet "
                         f"off it in frames {air.tolist()})")
    k0, k1 = int(air[0]) - 1, int(air[-1]) + 1
    t = (np.arange(k0, k1 + 1) - k0) / clip.fps
    # the parabola under gravity through the flight's centres of mass (least squares)
    fall = np.zeros((len(t), 3))
    g = -_gravity(model)[2]
    fall[:, 2] = -0.5 * g * t**2
    basis = np.stack([np.ones_like(t), t], axis=1)
    coef, *_ = np.linalg.lstsq(basis, com[k0:k1 + 1] - fall, rcond=None)
    fit = basis @ coef + fall
    c0, v0 = coef
    rise = max(v0[2], 0.0) / g
    inside = momentum[k0 + 1:k1]
    mean = inside.mean(axis=0)
    pitch = _pitch(qpos[:, 3:7])
    key = model.key(HOME_KEY).qpos
    rel = quat.mul(quat.conj(quat.normalize(key[3:7])), qpos[-1, 3:7])
    home = max(float(np.abs(qpos[-1, 7:] - key[7:]).max()),
               float(np.linalg.norm(quat.log(rel))))
    drift = max(float(np.linalg.norm(corners[a:b] - corners[a], axis=-1).max())
                for a, b in ((0, k0 + 1), (k1, frames)))
    return FlipReport(
        frames=frames, fps=clip.fps, takeoff_frame=k0, landing_frame=k1,
        flight_time=(k1 - k0) / clip.fps, takeoff_velocity=tuple(float(v) for v in v0),
        takeoff_com_height=float(c0[2]),
        peak_com_height=float(c0[2] + v0[2] * rise - 0.5 * g * rise**2),
        com_residual=float(np.linalg.norm(com[k0:k1 + 1] - fit, axis=1).max()),
        momentum=tuple(float(v) for v in mean),
        momentum_spread=float(np.linalg.norm(inside - mean, axis=1).max()
                              / np.linalg.norm(mean)),
        pitch_turn=float(pitch[-1] - pitch[0]),
        max_pitch_rate=float(np.abs(clip.body_ang_vel_w[k0:k1 + 1,
                                                         clip.body_index("pelvis"), 1]).max()),
        max_joint_speed=base.max_joint_speed, fastest_joint=base.fastest_joint,
        limit_excess=base.limit_excess,
        sole_heights=tuple(float(np.abs(soles[k]).max()) for k in (0, k0, k1, frames - 1)),
        stance_drift=drift, max_slip=base.max_slip, max_penetration=base.max_penetration,
        home_error=home, floor=floor_demand(clip, model), torque=joint_demand(clip, model))


def check_flip(report: FlipReport, where: str = "flip") -> None:
    """Raise naming every guarantee the flip breaks (a keyframe edit that breaks one fails
    here, not hours into a tracking run)."""
    # written as "not within" so that a nan fails too
    failures = [what for what, ok in [
        (f"turns {report.pitch_turn:.4f} rad, not 2 pi",
         abs(abs(report.pitch_turn) - 2 * np.pi) <= TURN_TOLERANCE),
        (f"centre of mass {report.com_residual * 1e3:.3g} mm off its parabola",
         report.com_residual < MAX_COM_RESIDUAL),
        (f"angular momentum varies {report.momentum_spread * 100:.3g} % in the air",
         report.momentum_spread < MAX_MOMENTUM_SPREAD),
        (f"soles {max(report.sole_heights) * 1e3:.3g} mm off the floor at the start, take-off, "
         f"touch down or end", max(report.sole_heights) <= MAX_SOLE_HEIGHT),
        (f"a foot on the floor slips {report.max_slip * 1e3:.3g} mm in a frame",
         report.max_slip < MAX_SLIP),
        (f"feet on the floor move {report.stance_drift * 1e3:.3g} mm",
         report.stance_drift < MAX_SLIP),
        (f"feet {report.max_penetration * 1e3:.3g} mm into the floor",
         report.max_penetration <= MAX_SOLE_HEIGHT),
        (f"joint speed {report.max_joint_speed:.2f} rad/s ({report.fastest_joint})",
         report.max_joint_speed < MAX_JOINT_SPEED),
        (f"joints {report.limit_excess:.3g} rad beyond their limits", report.limit_excess <= 0),
        (f"ends {report.home_error:.3g} rad from home", report.home_error <= MAX_HOME_ERROR),
        (f"the soles miss {report.floor.max_moment_outside:.3f} m x weight of moment",
         report.floor.max_moment_outside <= MAX_FLOOR_MOMENT),
        (f"the floor needs friction {report.floor.max_friction:.2f}",
         report.floor.max_friction <= MAX_FRICTION),
        (f"a joint needs {report.torque.max_ratio:.2f} x its motor's torque limit",
         report.torque.max_ratio <= MAX_TORQUE_RATIO),
    ] if not ok]
    if failures:
        raise RuntimeError(f"{where}: the flip fails its checks: {'; '.join(failures)}")


def flip_clip(model: mujoco.MjModel, path: str = "g1_backflip.npz") -> MotionClip:
    """The flip (all the model's bodies, before TRACKED_BODIES are kept), checked."""
    body = _Body(model)
    flight = _solve(body)
    qpos = flight.qpos
    clip = qpos_to_clip(qpos[:, :3], qpos[:, 3:7], qpos[:, body.qadr], model, FLIP_FPS,
                        os.path.splitext(os.path.basename(path))[0], str(path))
    check_flip(flip_report(clip, model), str(path))
    return clip


def make_flip(model: mujoco.MjModel, out: str | os.PathLike[str]) -> MotionClip:
    """Generate, check and save the flip (TRACKED_BODIES only) at out."""
    clip = flip_clip(model, str(out)).select_bodies(TRACKED_BODIES)
    save_clip(clip, out)
    return clip
