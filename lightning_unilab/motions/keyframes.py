"""A keyframed whole-body dance for the 29-DoF G1, with its feet planted by inverse kinematics.

No human motion data can be downloaded here, so the project makes its own reference clip:
``clips/g1_dance.npz`` (``python -m lightning_unilab.motions make-dance OUT.npz``, deterministic).
It lasts 10 s at 50 fps (501 frames) from and back to the ``knees_bent`` home pose:

- 0.4-3.0 s: the right arm rises sideways and waves (elbow), then the left; the pelvis sways;
- 3.0-5.2 s: arms out, torso twists (waist yaw +-0.6 rad, pelvis yaw +-0.12) over two squats
  (pelvis 9 cm down);
- 5.2-7.3 s: a forward bend (waist and pelvis pitch) and side bends with weight shifts (pelvis
  7 cm over each foot);
- 7.3-9.5 s: two small steps forward (10 cm): weight onto the left foot, the right foot lifts
  4 cm and lands 10 cm ahead, weight across, the left foot follows; arms swing against the legs.

Upper body and pelvis follow keyframes, each channel eased between its keys by minimum-jerk
(quintic) segments, so velocities and accelerations are continuous and nothing overshoots a
key (joint limits hold between keys). The legs are solved per frame by damped least squares
(mj_jacBody) so that each foot sits flat on the floor, its sole at z = 0, where it was planted;
a stepping foot rises, moves and lands flat. The clip keeps the 14 bodies a BeyondMimic-style
tracker follows (``TRACKED_BODIES``; the root, the anchor ``torso_link``, the limbs' links),
which keeps the file under 1 MB at float64.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import mujoco
import numpy as np

from lightning_unilab.motions import quat
from lightning_unilab.motions.checks import clip_report
from lightning_unilab.motions.clip import MotionClip, model_joint_names, save_clip
from lightning_unilab.motions.convert import qpos_to_clip

__all__ = ["DANCE_FPS", "TRACKED_BODIES", "dance_clip", "make_dance"]

DANCE_FPS = 50.0
DANCE_SECONDS = 10.0
TRACKED_BODIES = ("pelvis", "left_hip_roll_link", "left_knee_link", "left_ankle_roll_link",
                  "right_hip_roll_link", "right_knee_link", "right_ankle_roll_link", "torso_link",
                  "left_shoulder_roll_link", "left_elbow_link", "left_wrist_yaw_link",
                  "right_shoulder_roll_link", "right_elbow_link", "right_wrist_yaw_link")
HOME_KEY = "knees_bent"
FOOT_BODIES = ("left_ankle_roll_link", "right_ankle_roll_link")
FOOT_GEOMS = ("left_foot", "right_foot")
LEGS = tuple(f"{side}_{part}_joint" for side in ("left", "right")
             for part in ("hip_pitch", "hip_roll", "hip_yaw", "knee", "ankle_pitch", "ankle_roll"))
# what the generator guarantees (and tests/unilab/test_motions.py checks on the shipped file)
MAX_PENETRATION = 0.005  # m
MAX_JOINT_SPEED = 10.0  # rad/s
MAX_SLIP = 0.005  # m per frame

# Keyframes: time (s) -> channel values. Pelvis channels: x, y (m, world), dz (m from the
# standing height), roll, pitch, yaw (rad); the others are joint angles (rad) by joint name
# without "_joint"; None is the channel's home value. A channel starts at its home value at
# t = 0, eases to each of its keys in turn and holds the last.
_ARMS_HOME: dict[str, float | None] = {
    f"{side}_{part}": None for side in ("left", "right")
    for part in ("shoulder_pitch", "shoulder_roll", "shoulder_yaw", "elbow", "wrist_roll")}
_ARMS_OUT: dict[str, float | None] = {
    "left_shoulder_pitch": 0.0, "left_shoulder_roll": 1.2, "left_elbow": 0.3,
    "right_shoulder_pitch": 0.0, "right_shoulder_roll": -1.2, "right_elbow": 0.3}


Keys = list[tuple[float, dict[str, float | None]]]


def _wave(side: str, t0: float, period: float, count: int) -> Keys:
    """An arm raised sideways whose elbow swings the hand count times, from t0."""
    sign = 1.0 if side == "left" else -1.0
    up = {f"{side}_shoulder_roll": sign * 1.35, f"{side}_shoulder_pitch": -0.3,
          f"{side}_shoulder_yaw": 0.0}
    keys: Keys = [(t0, {**up, f"{side}_elbow": 0.5})]
    for i in range(count):
        t = t0 + period * (i + 0.5)
        keys += [(t, {f"{side}_elbow": 1.2, f"{side}_wrist_roll": sign * 0.3}),
                 (t + period / 2, {f"{side}_elbow": 0.5, f"{side}_wrist_roll": -sign * 0.3})]
    return keys


def _keyframes() -> Keys:
    keys: Keys = [(0.4, {**_ARMS_HOME, "y": 0.0, "roll": 0.0})]  # still until 0.4 s
    # arm waves, the pelvis swaying under them
    keys += _wave("right", 0.9, 0.4, 3)
    keys += [(2.6, {k: v for k, v in _ARMS_HOME.items() if k.startswith("right")})]
    keys += _wave("left", 1.6, 0.4, 3)  # the left arm goes from its wave to arms out
    keys += [(0.9, {"y": 0.03, "roll": 0.03}), (1.5, {"y": -0.03, "roll": -0.03}),
             (2.1, {"y": 0.03, "roll": 0.03}), (2.8, {"y": 0.0, "roll": 0.0})]
    # arms out; twists over two squats
    keys += [(3.2, {**_ARMS_OUT, "left_wrist_roll": 0.0, "waist_yaw": 0.0, "yaw": 0.0,
                    "dz": 0.0}),
             (3.7, {"waist_yaw": 0.6, "yaw": 0.12, "dz": -0.09}),
             (4.2, {"waist_yaw": -0.6, "yaw": -0.12, "dz": 0.0}),
             (4.7, {"waist_yaw": 0.6, "yaw": 0.12, "dz": -0.09}),
             (5.2, {"waist_yaw": 0.0, "yaw": 0.0, "dz": 0.0, **_ARMS_HOME})]
    # a forward bend, then side bends with the weight over each foot
    keys += [(5.2, {"waist_pitch": None, "pitch": 0.0, "x": 0.0}),
             (5.7, {"waist_pitch": 0.35, "pitch": 0.12, "x": -0.03,
                    "left_shoulder_pitch": -0.4, "right_shoulder_pitch": -0.4}),
             (6.1, {"waist_pitch": None, "pitch": 0.0, "x": 0.0, **_ARMS_HOME}),
             (6.1, {"waist_roll": 0.0, "y": 0.0}),
             (6.5, {"waist_roll": -0.25, "y": 0.07, "right_shoulder_roll": -0.9}),
             (6.9, {"waist_roll": 0.25, "y": -0.07, "right_shoulder_roll": None,
                    "left_shoulder_roll": 0.9}),
             (7.3, {"waist_roll": 0.0, "y": 0.0, "left_shoulder_roll": None})]
    # two steps: the right foot, then the left (see _STEPS); the pelvis carries the weight
    keys += [(7.6, {"y": 0.085, "x": 0.0}),
             (8.2, {"y": 0.085, "x": 0.0}),
             (8.5, {"y": -0.085, "x": 0.1}),
             (9.1, {"y": -0.085, "x": 0.1}),
             (9.5, {"y": 0.0, "x": 0.1}),
             (7.6, {"left_shoulder_pitch": None, "right_shoulder_pitch": None}),
             (8.0, {"left_shoulder_pitch": -0.3, "right_shoulder_pitch": 0.6}),
             (8.8, {"left_shoulder_pitch": 0.6, "right_shoulder_pitch": -0.3}),
             (9.5, {"left_shoulder_pitch": None, "right_shoulder_pitch": None})]
    return keys


@dataclass(frozen=True)
class _Step:
    foot: int  # 0 left, 1 right
    start: float
    end: float
    dx: float
    dy: float
    height: float


_STEPS = (_Step(1, 7.65, 8.15, 0.10, 0.0, 0.04), _Step(0, 8.55, 9.05, 0.10, 0.0, 0.04))


def _ease(s: np.ndarray) -> np.ndarray:
    """Minimum-jerk 0 -> 1 over s in [0, 1] (zero velocity and acceleration at both ends)."""
    s = np.clip(s, 0.0, 1.0)
    return s**3 * (10.0 - 15.0 * s + 6.0 * s**2)


def _track(times: np.ndarray, keys: list[tuple[float, float]], home: float) -> np.ndarray:
    """One channel at times: from home at 0, eased from key to key, the last held."""
    out = np.full(len(times), home)
    if not keys:
        return out
    pts = [(0.0, home)] + sorted(keys, key=lambda k: k[0])
    for (t0, v0), (t1, v1) in zip(pts[:-1], pts[1:], strict=True):
        inside = (times >= t0) & (times <= t1)
        if t1 > t0:
            out[inside] = v0 + (v1 - v0) * _ease((times[inside] - t0) / (t1 - t0))
    out[times > pts[-1][0]] = pts[-1][1]
    return out


def _channels(times: np.ndarray, home: dict[str, float]) -> dict[str, np.ndarray]:
    per: dict[str, dict[float, float]] = {}
    for t, values in _keyframes():
        for name, value in values.items():
            if name not in home:
                raise KeyError(f"keyframe at {t} s: unknown channel {name!r}")
            v = home[name] if value is None else value
            if per.setdefault(name, {}).setdefault(t, v) != v:
                raise ValueError(f"keyframe at {t} s: two values for {name!r}")
    return {name: _track(times, list(per.get(name, {}).items()), h) for name, h in home.items()}


def _foot_targets(times: np.ndarray, start: np.ndarray) -> np.ndarray:
    """(frames, 2 feet, 3) positions of the foot bodies: planted, or stepping (rise, move in
    the middle of the step, land), from the start positions."""
    pos = np.repeat(start[None], len(times), axis=0)
    for step in _STEPS:
        s = (times - step.start) / (step.end - step.start)
        move = _ease((s - 0.2) / 0.6)
        lift = _ease(s / 0.3) - _ease((s - 0.7) / 0.3)
        pos[:, step.foot, 0] += step.dx * move
        pos[:, step.foot, 1] += step.dy * move
        pos[:, step.foot, 2] += step.height * lift
    return pos


def _solve_legs(model: mujoco.MjModel, data: mujoco.MjData, feet: np.ndarray,
                targets: np.ndarray, leg_q: list[np.ndarray], leg_v: list[np.ndarray],
                iters: int = 100, damping: float = 1e-4, tol: float = 1e-11) -> float:
    """Moves each leg's joints in data.qpos (root and upper body held) until its foot body
    reaches its target position, flat (identity orientation); returns the worst residual."""
    jacp = np.empty((3, model.nv))
    jacr = np.empty((3, model.nv))
    low, high = model.jnt_range[[model.joint(n).id for n in LEGS]].T.reshape(2, 2, 6)
    flat = np.array([1.0, 0.0, 0.0, 0.0])
    worst = np.inf
    for _ in range(iters):
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        worst = 0.0
        for leg, body in enumerate(feet):
            err = np.concatenate([targets[leg] - data.xpos[body],
                                  quat.log(quat.mul(flat, quat.conj(data.xquat[body])))])
            worst = max(worst, float(np.abs(err).max()))
            mujoco.mj_jacBody(model, data, jacp, jacr, body)
            jac = np.vstack([jacp, jacr])[:, leg_v[leg]]
            step = jac.T @ np.linalg.solve(jac @ jac.T + damping**2 * np.eye(6), err)
            data.qpos[leg_q[leg]] = np.clip(data.qpos[leg_q[leg]] + step, low[leg], high[leg])
        if worst < tol:
            break
    return worst


def dance_clip(model: mujoco.MjModel, path: str = "g1_dance.npz") -> MotionClip:
    """The dance (all the model's bodies, before TRACKED_BODIES are kept), checked."""
    times = np.arange(int(round(DANCE_SECONDS * DANCE_FPS)) + 1) / DANCE_FPS
    key = model.key(HOME_KEY).qpos
    joints = model_joint_names(model)
    data = mujoco.MjData(model)
    data.qpos[:] = key
    mujoco.mj_kinematics(model, data)
    feet = [model.body(b).id for b in FOOT_BODIES]
    sole = [model.geom_pos[model.geom(g).id][2] - model.geom_size[model.geom(g).id][2]
            for g in FOOT_GEOMS]
    # feet flat where the home pose puts them, soles on the floor; the pelvis as high above
    start = np.array([[*data.xpos[b][:2], -z] for b, z in zip(feet, sole, strict=True)])
    standing = key[2] + float(np.mean(start[:, 2] - data.xpos[feet][:, 2]))
    home = {"x": 0.0, "y": 0.0, "dz": 0.0, "roll": 0.0, "pitch": 0.0, "yaw": 0.0}
    home |= {n.removesuffix("_joint"): key[model.joint(n).qposadr[0]] for n in joints
             if n not in LEGS}
    ch = _channels(times, home)
    root_pos = np.stack([ch["x"], ch["y"], standing + ch["dz"]], axis=1)
    ez = np.array([0.0, 0.0, 1.0])
    root_quat = quat.mul(quat.mul(quat.from_axis_angle(ez, ch["yaw"]),
                                  quat.from_axis_angle(np.array([0.0, 1.0, 0.0]), ch["pitch"])),
                         quat.from_axis_angle(np.array([1.0, 0.0, 0.0]), ch["roll"]))
    targets = _foot_targets(times, start)
    leg_q = [np.array([model.joint(n).qposadr[0] for n in LEGS[i:i + 6]]) for i in (0, 6)]
    leg_v = [np.array([model.joint(n).dofadr[0] for n in LEGS[i:i + 6]]) for i in (0, 6)]
    upper = [(model.joint(n).qposadr[0], ch[n.removesuffix("_joint")]) for n in joints
             if n not in LEGS]
    qpos = np.empty((len(times), model.nq))
    for k in range(len(times)):
        data.qpos[:3] = root_pos[k]
        data.qpos[3:7] = root_quat[k]
        for adr, values in upper:
            data.qpos[adr] = values[k]
        residual = _solve_legs(model, data, feet, targets[k], leg_q, leg_v)
        if residual > 1e-6:
            raise RuntimeError(f"dance: the feet cannot reach their targets at t = {times[k]:.2f} "
                               f"s (residual {residual:.3g}); the keyframes ask too much")
        qpos[k] = data.qpos
    adr = [model.joint(n).qposadr[0] for n in joints]
    clip = qpos_to_clip(qpos[:, :3], qpos[:, 3:7], qpos[:, adr], model, DANCE_FPS,
                        os.path.splitext(os.path.basename(path))[0], str(path))
    _check(clip, model)
    return clip


def _check(clip: MotionClip, model: mujoco.MjModel) -> None:
    """The guarantees a tracking task relies on; a keyframe edit that breaks one fails here."""
    r = clip_report(clip, model)
    # written as "not within" so that a nan (an unmeasured foot) fails too
    failures = [what for what, ok in [
        (f"feet {r.max_penetration * 1e3:.2f} mm into the floor",
         r.max_penetration <= MAX_PENETRATION),
        (f"joint speed {r.max_joint_speed:.2f} rad/s ({r.fastest_joint})",
         r.max_joint_speed < MAX_JOINT_SPEED),
        (f"joints {r.limit_excess:.3g} rad beyond their limits", r.limit_excess <= 0),
        (f"a standing foot slips {r.max_slip * 1e3:.2f} mm in a frame", r.max_slip < MAX_SLIP),
    ] if not ok]
    if failures:
        raise RuntimeError(f"{clip.path}: the dance fails its checks: {'; '.join(failures)}")


def make_dance(model: mujoco.MjModel, out: str | os.PathLike[str]) -> MotionClip:
    """Generate, check and save the dance (TRACKED_BODIES only) at out."""
    clip = dance_clip(model, str(out)).select_bodies(TRACKED_BODIES)
    save_clip(clip, out)
    return clip
