"""g1-motion-tracking in numpy: the twin and test reference of cpp/src/tasks/g1_tracking.cc, and
the layout of the clip library the C++ task reads (:func:`library_arrays`).

The G1 imitates reference clips (:mod:`lightning_unilab.motions`) with BeyondMimic's terms: exp
kernels of the anchor body's (torso) global position and orientation and of the tracked bodies'
positions, orientations and velocities, the reference re-anchored to the robot in the plane and
heading; action rate and soft joint limits; terminations when the anchor's height or gravity
direction, or an end effector's height, leaves the reference. Starts are reference frames with
pose and velocity noise, sampled failure-weighted over bins of each clip (task-level state in
:attr:`shared`). Every term is in docs/unilab/tracking.md; change both files together.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from lightning_unilab import _core
from lightning_unilab.envs.tasks.base import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.evaluation import Panel, TaskEvaluation
from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.motions.quat import conj as quat_conj
from lightning_unilab.motions.quat import mul as quat_mul

if TYPE_CHECKING:
    from lightning_unilab.envs.pool import BatchEnvPool

NAME = "g1-motion-tracking"
JOINTS = 29
ROOT = "pelvis"
# BeyondMimic's (and UniLab's) tracked bodies of the G1, its anchor and end effectors
TRACKED_BODIES = ("pelvis", "left_hip_roll_link", "left_knee_link", "left_ankle_roll_link",
                  "right_hip_roll_link", "right_knee_link", "right_ankle_roll_link", "torso_link",
                  "left_shoulder_roll_link", "left_elbow_link", "left_wrist_yaw_link",
                  "right_shoulder_roll_link", "right_elbow_link", "right_wrist_yaw_link")
ANCHOR = "torso_link"
END_EFFECTORS = ("left_ankle_roll_link", "right_ankle_roll_link", "left_wrist_yaw_link",
                 "right_wrist_yaw_link")
DEFAULT_MOTIONS = "g1_dance"
TASK_DATA_KEYS = ("motions", "bodies", "anchor", "end_effectors")
# memory layout, as in C++
FRAME, CLIP, CLIP_END, EVENT, LAST_ACTION = 0, 1, 2, 3, 4
MEMORY = LAST_ACTION + JOINTS
ACTOR_OBS = JOINTS * 2 + 6 + 3 + JOINTS * 3  # 154
INFO_NAMES = ("frame", "clip", "body_pos_error", "anchor_pos_error", "anchor_ori_error",
              "joint_error", "reward_anchor_pos", "reward_anchor_ori", "reward_body_pos",
              "reward_body_ori", "reward_body_lin_vel", "reward_body_ang_vel",
              "reward_action_rate", "reward_joint_limit", "reward_termination", "anchor_height",
              "ref_anchor_height")
STEP_RATIO_TOLERANCE = 1e-4


def motion_paths(motions: str | os.PathLike | Sequence[str | os.PathLike] | None) -> list[str]:
    """Clip files of ``motions``: a shipped clip's name (``g1_dance``, see
    ``lightning_unilab/motions/clips/``), a file, a directory of .npz files, or a list of them."""
    from lightning_unilab.motions import CLIPS

    items = [DEFAULT_MOTIONS] if motions is None else (
        [motions] if isinstance(motions, str | os.PathLike) else list(motions))
    if not items:
        raise ValueError("task_data['motions']: expected at least one clip, got none")
    out = []
    for item in items:
        shipped = CLIPS / f"{item}.npz"
        if isinstance(item, str) and os.sep not in item and not item.endswith(".npz") \
                and shipped.is_file():
            out.append(str(shipped))
        else:
            out.append(os.fspath(item))
    return out


def _given(task_data: Mapping[str, Any], key: str, default: Any) -> Any:
    """task_data[key] unless absent or None (an empty list is a choice: no end effectors)."""
    value = task_data.get(key)
    return default if value is None else value


def library_arrays(model: mujoco.MjModel, params: Mapping[str, float],
                   task_data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The clip library as the C++ task reads it: every clip resampled to the control rate and
    concatenated; the root (pelvis) for the start states; the tracked bodies in order."""
    from lightning_unilab.motions import load_motions

    unknown = set(task_data) - set(TASK_DATA_KEYS)
    if unknown:
        raise ValueError(f"task_data: {NAME} has no entry {sorted(unknown)}; it takes "
                         f"{list(TASK_DATA_KEYS)}")
    values = {**_core.task_defaults(NAME), **params}
    fps = 1.0 / values["ctrl_dt"]
    bodies = tuple(_given(task_data, "bodies", TRACKED_BODIES))
    anchor = _given(task_data, "anchor", ANCHOR)
    effectors = tuple(_given(task_data, "end_effectors", END_EFFECTORS))
    for key, names in (("anchor", (anchor,)), ("end_effectors", effectors)):
        missing = [n for n in names if n not in bodies]
        if missing:
            raise ValueError(f"task_data[{key!r}]: {missing} not among the tracked bodies "
                             f"{list(bodies)}")
    ids = []
    for name in bodies:
        i = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
        if i < 1:
            raise ValueError(f"task_data['bodies']: the model has no body {name!r}")
        ids.append(i)
    clips = [c.resample(fps) for c in load_motions(motion_paths(task_data.get("motions")), model)]
    roots = [c.select_bodies([ROOT]) for c in clips]
    tracked = [c.select_bodies(bodies) for c in clips]

    def cat(items: list, field: str) -> np.ndarray:
        return np.concatenate([getattr(c, field) for c in items])

    return {"clip_frames": np.array([c.num_frames for c in clips], np.float64),
            "body_ids": np.array(ids, np.float64),
            "anchor": np.array([bodies.index(anchor)], np.float64),
            "end_effectors": np.array([bodies.index(e) for e in effectors], np.float64),
            "joint_pos": cat(clips, "joint_pos"), "joint_vel": cat(clips, "joint_vel"),
            "root_pos": cat(roots, "body_pos_w")[:, 0],
            "root_quat": cat(roots, "body_quat_w")[:, 0],
            "root_lin_vel": cat(roots, "body_lin_vel_w")[:, 0],
            "root_ang_vel": cat(roots, "body_ang_vel_w")[:, 0],
            "body_pos": cat(tracked, "body_pos_w"), "body_quat": cat(tracked, "body_quat_w"),
            "body_lin_vel": cat(tracked, "body_lin_vel_w"),
            "body_ang_vel": cat(tracked, "body_ang_vel_w")}


# ---------------------------------------------------------------- evaluation

# the evaluation: the reference itself, from a chosen frame (0 unless given), to the clip's end
EVALUATION_PARAMS = {"reset_pos_noise": 0.0, "reset_tilt_noise": 0.0, "reset_yaw_noise": 0.0,
                     "reset_lin_vel_noise": 0.0, "reset_ang_vel_noise": 0.0,
                     "reset_joint_noise": 0.0, "adaptive_sampling": 0.0,
                     "episode_length_s": 3600.0}
UPRIGHT_COS = math.cos(math.radians(30.0))  # landed: the torso within 30 degrees of upright


def pitch_rotation(quats: np.ndarray) -> np.ndarray:
    """The body's turn about its start's lateral axis, unwrapped (rad, + forward): the angle of
    its forward axis in the vertical plane of the start's heading; a flip turns it by 2 pi."""
    mats = quat_to_mat(quats)
    forward = mats[:, :, 0]
    heading = forward[0, :2] / max(float(np.linalg.norm(forward[0, :2])), 1e-12)
    along = forward[:, 0] * heading[0] + forward[:, 1] * heading[1]
    angle = np.unwrap(np.arctan2(-forward[:, 2], along))
    return angle - angle[0]


class MotionTrackingEvaluation(TaskEvaluation):
    """The tracking task's evaluation: the start noise and adaptive sampling off, the episode to
    the clip's end; per-clip errors (``tracking``), the reference drawn as a ghost."""

    info_names = ("frame", "clip", "body_pos_error", "anchor_pos_error", "anchor_ori_error",
                  "joint_error", "anchor_height", "ref_anchor_height")

    def evaluation_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**params, **EVALUATION_PARAMS, "start_frame": params.get("start_frame", 0.0)}

    def series(self, episode: Any, model: mujoco.MjModel) -> dict[str, np.ndarray]:
        return {k: episode.terms[k] for k in self.info_names}

    def metrics(self, episode: Any) -> dict[str, Any] | None:
        t = episode.terms
        if not len(episode.rewards):
            return None
        quats = episode.states[:, 4:8]  # mjSTATE_INTEGRATION: time, then qpos (pelvis quat)
        upright = quat_to_mat(quats[-1:])[0, 2, 2] >= UPRIGHT_COS
        return {"clip": int(t["clip"][0]), "start_frame": int(t["frame"][0]) - 1,
                "end_frame": int(t["frame"][-1]), "steps": episode.length,
                "fell": bool(episode.terminated),
                "body_pos_error_m": float(np.mean(t["body_pos_error"])),
                "anchor_pos_error_m": float(np.mean(t["anchor_pos_error"])),
                "anchor_ori_error_rad": float(np.mean(t["anchor_ori_error"])),
                "joint_error_rad": float(np.mean(t["joint_error"])),
                "rotation_rad": float(pitch_rotation(quats)[-1]),
                "landed": bool(not episode.terminated and upright)}

    def panels(self, episode: Any) -> list[Panel]:
        s = episode.series
        m = self.metrics(episode) or {}
        title = (f"clip {m.get('clip')}: body position error {m.get('body_pos_error_m', 0):.3f} m,"
                 f" anchor orientation {m.get('anchor_ori_error_rad', 0):.3f} rad, joints "
                 f"{m.get('joint_error_rad', 0):.3f} rad; fell: {m.get('fell')}")
        return [Panel("anchor height (m)", {"anchor_height": s["anchor_height"]},
                      {"anchor_height": s["ref_anchor_height"]}, title),
                Panel("tracking error", {k: s[k] for k in (
                    "body_pos_error", "anchor_pos_error", "anchor_ori_error", "joint_error")}),
                Panel("reward terms", {k: v for k, v in episode.terms.items()
                                       if k.startswith("reward_")})]

    def ghost(self, episode: Any, env: Any) -> np.ndarray | None:
        task = getattr(env, "_numpy", None)
        if isinstance(task, G1MotionTracking):
            params, data = task.params, task.task_data
        else:
            params, data = {**_core.task_defaults(NAME), **env.params}, env.task_data or {}
        arrays = library_arrays(env.model, params, data)
        frames = np.r_[episode.terms["frame"][:1] - 1, episode.terms["frame"]].astype(int)
        frames = frames[:len(episode.states)]
        return np.concatenate([arrays["root_pos"][frames], arrays["root_quat"][frames],
                               arrays["joint_pos"][frames]], 1)


EVALUATION = MotionTrackingEvaluation()


# ---------------------------------------------------------------- quaternions (w, x, y, z), (n, 4)
# (products and conjugates: lightning_unilab.motions.quat's, as the clips are made with them)

def quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v rotated by q (broadcast over leading axes)."""
    w = q[..., 0:1]
    xyz = q[..., 1:]
    t = 2 * np.cross(xyz, v)
    return v + w * t + np.cross(xyz, t)


def quat_rotate_inv(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    return quat_rotate(quat_conj(q), v)


def quat_angle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rotation angle between a and b."""
    r = quat_mul(quat_conj(a), b)
    return 2 * np.arctan2(np.linalg.norm(r[..., 1:], axis=-1), np.abs(r[..., 0]))


def yaw_quat(q: np.ndarray) -> np.ndarray:
    yaw = np.arctan2(2 * (q[..., 0] * q[..., 3] + q[..., 1] * q[..., 2]),
                     1 - 2 * (q[..., 2] ** 2 + q[..., 3] ** 2))
    z = np.zeros_like(yaw)
    return np.stack([np.cos(0.5 * yaw), z, z, np.sin(0.5 * yaw)], axis=-1)


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = np.moveaxis(q, -1, 0)
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1)], -2)


def rot6(q: np.ndarray) -> np.ndarray:
    """The first two columns of q's rotation matrix, row by row."""
    return quat_to_mat(q)[..., :2].reshape(*q.shape[:-1], 6)


def quat_from_euler(roll: np.ndarray, pitch: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    cr, sr = np.cos(0.5 * roll), np.sin(0.5 * roll)
    cp, sp = np.cos(0.5 * pitch), np.sin(0.5 * pitch)
    cy, sy = np.cos(0.5 * yaw), np.sin(0.5 * yaw)
    return np.stack([cy * cp * cr + sy * sp * sr, cy * cp * sr - sy * sp * cr,
                     cy * sp * cr + sy * cp * sr, sy * cp * cr - cy * sp * sr], axis=-1)


# ---------------------------------------------------------------- the task

class G1MotionTracking(NumpyTask):
    """Motion tracking with the 29-DoF G1; see the module doc. ``task_data`` as the C++ task's
    (``motions``, ``bodies``, ``anchor``, ``end_effectors``); ``params`` over C++'s defaults."""

    name = NAME
    stage = "vel"  # body poses and velocities of the state after the substeps, as C++
    evaluation = EVALUATION

    def __init__(self, task_data: Mapping[str, Any] | None = None, **params: float) -> None:
        defaults = _core.task_defaults(NAME)
        unknown = set(params) - set(defaults)
        if unknown:
            raise ValueError(f"{NAME} has no parameter(s) {sorted(unknown)}; it has: "
                             f"{sorted(defaults)}")
        self.params = {**defaults, **params}
        self.task_data = dict(task_data or {})
        self._model: mujoco.MjModel | None = None
        bodies = tuple(_given(self.task_data, "bodies", TRACKED_BODIES))
        self.outputs = {"xpos": list(bodies), "xquat": list(bodies), "cvel": list(bodies),
                        "subtree_com": [ROOT]}
        self.model()

    def model(self) -> mujoco.MjModel:
        if self._model is None:
            from lightning_unilab.envs import tasks

            info = tasks.get(NAME)
            m = info.load_model(self.params)
            self._setup(m, library_arrays(m, self.params, self.task_data))
            self._model = m
        return self._model

    def _setup(self, m: mujoco.MjModel, arrays: dict[str, np.ndarray]) -> None:
        p = self.params
        ratio = p["ctrl_dt"] / p["timestep"]
        self.frame_skip = round(ratio)
        if self.frame_skip < 1 or abs(ratio - self.frame_skip) > STEP_RATIO_TOLERANCE:
            raise ValueError(f"{NAME}: ctrl_dt / timestep must be a whole number of substeps")
        self.dt = self.frame_skip * p["timestep"]
        self.max_episode_steps = round(p["episode_length_s"] / self.dt)
        self.clip_frames = arrays["clip_frames"].astype(int)
        self.clip_start = np.concatenate([[0], np.cumsum(self.clip_frames)[:-1]]).astype(int)
        self.frames = int(self.clip_frames.sum())
        self.body_ids = arrays["body_ids"].astype(int)
        nb = len(self.body_ids)
        self.anchor = int(arrays["anchor"][0])
        self.end_effectors = arrays["end_effectors"].astype(int)
        f = self.frames
        self.joint_pos = arrays["joint_pos"].reshape(f, JOINTS)
        self.joint_vel = arrays["joint_vel"].reshape(f, JOINTS)
        self.root_pos = arrays["root_pos"].reshape(f, 3)
        self.root_quat = arrays["root_quat"].reshape(f, 4)
        self.root_lin_vel = arrays["root_lin_vel"].reshape(f, 3)
        self.root_ang_vel = arrays["root_ang_vel"].reshape(f, 3)
        self.body_pos = arrays["body_pos"].reshape(f, nb, 3)
        self.body_quat = arrays["body_quat"].reshape(f, nb, 4)
        self.body_lin_vel = arrays["body_lin_vel"].reshape(f, nb, 3)
        self.body_ang_vel = arrays["body_ang_vel"].reshape(f, nb, 3)
        jnt = m.actuator_trnid[:, 0]
        lo, hi = m.jnt_range[jnt, 0], m.jnt_range[jnt, 1]
        mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
        self.range = np.stack([lo, hi], 1)
        self.soft = np.stack([mid - p["soft_limit_factor"] * half,
                              mid + p["soft_limit_factor"] * half], 1)
        key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "knees_bent")
        self.home = (m.key_qpos[key] if key >= 0 else m.qpos0).copy()
        self.inv_var = 1.0 / np.array([p[k] for k in (
            "std_anchor_pos", "std_anchor_ori", "std_body_pos", "std_body_ori",
            "std_body_lin_vel", "std_body_ang_vel")]) ** 2
        self.w = np.array([p[k] for k in (
            "w_anchor_pos", "w_anchor_ori", "w_body_pos", "w_body_ori", "w_body_lin_vel",
            "w_body_ang_vel", "w_action_rate", "w_joint_limit", "w_termination")])
        self._bins(max(1, round(p["bin_s"] / self.dt)))

    def _bins(self, bin_frames: int) -> None:
        self.bin_frames = bin_frames
        starts, counts, has_next, first, nbins = [], [], [], [], []
        for s, n in zip(self.clip_start, self.clip_frames, strict=True):
            k_n = math.ceil((n - 1) / bin_frames)
            first.append(len(starts))
            nbins.append(k_n)
            for k in range(k_n):
                starts.append(s + k * bin_frames)
                counts.append(min(bin_frames, n - 1 - k * bin_frames))
                has_next.append(k + 1 < k_n)
        self.bin_start, self.bin_count = np.array(starts), np.array(counts)
        self.bin_has_next = np.array(has_next)
        self.clip_first_bin, self.clip_bins = np.array(first), np.array(nbins)
        self.nbins = len(starts)
        self.shared = np.zeros(2 * self.nbins)
        self._distribution()

    def _distribution(self) -> None:
        fail = self.shared[:self.nbins]
        nxt = np.where(self.bin_has_next, np.r_[fail[1:], 0.0], 0.0)
        weight = fail + self.params["adaptive_lambda"] * nxt
        total = weight.sum()
        u = self.params["adaptive_uniform"]
        if self.params["adaptive_sampling"] and total > 0:
            p = (1 - u) * weight / total + u / self.nbins
        else:
            p = np.full(self.nbins, 1.0 / self.nbins)
        self.shared[self.nbins:] = np.cumsum(p)

    def clip_of(self, frame: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.clip_start, frame, side="right") - 1

    def bin_of(self, frame: np.ndarray) -> np.ndarray:
        c = self.clip_of(frame)
        k = np.minimum((frame - self.clip_start[c]) // self.bin_frames, self.clip_bins[c] - 1)
        return self.clip_first_bin[c] + k

    @property
    def spec(self) -> TaskSpec:
        nb = len(self.body_ids)
        return TaskSpec(obs_size=ACTOR_OBS, critic_size=ACTOR_OBS + 6 + 9 * nb,
                        action_size=JOINTS, frame_skip=self.frame_skip,
                        max_episode_steps=self.max_episode_steps, memory_size=MEMORY,
                        max_speed=self.params["max_speed"],
                        action_low=-np.ones(JOINTS), action_high=np.ones(JOINTS),
                        info_names=INFO_NAMES)  # C++ also writes the first 6 at reset

    # ------------------------------------------------------------------ steps

    def reset(self, pool: BatchEnvPool, ids: np.ndarray, rng: EnvRng,
              memory: np.ndarray) -> None:
        p = self.params
        n = len(ids)
        if p["start_frame"] >= 0:
            frame = np.full(n, int(p["start_frame"]))
        else:
            u = rng.uniform(ids, 0.0, 1.0, 2)
            cdf = self.shared[self.nbins:]
            b = np.minimum((u[:, :1] >= cdf[None, :]).sum(1), self.nbins - 1)
            frame = self.bin_start[b] + np.minimum((u[:, 1] * self.bin_count[b]).astype(int),
                                                   self.bin_count[b] - 1)
        clip = self.clip_of(frame)
        memory[ids, FRAME] = frame
        memory[ids, CLIP] = clip
        memory[ids, CLIP_END] = self.clip_start[clip] + self.clip_frames[clip] - 1
        pos, tilt, yaw = p["reset_pos_noise"], p["reset_tilt_noise"], p["reset_yaw_noise"]
        noise = rng.uniform(ids, np.array([-pos, -pos, -tilt, -tilt, -yaw]),
                            np.array([pos, pos, tilt, tilt, yaw]), 5)
        lv, av = p["reset_lin_vel_noise"], p["reset_ang_vel_noise"]
        vel = rng.uniform(ids, np.array([-lv] * 3 + [-av] * 3), np.array([lv] * 3 + [av] * 3), 6)
        jn = p["reset_joint_noise"]
        joints = self.joint_pos[frame] + rng.uniform(ids, -jn, jn, JOINTS)
        qpos = np.empty((n, 7 + JOINTS))
        qpos[:, :3] = self.root_pos[frame]
        qpos[:, :2] += noise[:, :2]
        qpos[:, 3:7] = quat_mul(quat_from_euler(noise[:, 2], noise[:, 3], noise[:, 4]),
                                self.root_quat[frame])
        qpos[:, 7:] = np.clip(joints, self.range[:, 0], self.range[:, 1])
        qvel = np.empty((n, 6 + JOINTS))
        qvel[:, :3] = self.root_lin_vel[frame] + vel[:, :3]
        qvel[:, 3:6] = quat_rotate_inv(qpos[:, 3:7], self.root_ang_vel[frame] + vel[:, 3:])
        qvel[:, 6:] = self.joint_vel[frame]
        pool.qpos[ids] = qpos
        pool.qvel[ids] = qvel

    def start(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray) -> None:
        memory[ids, LAST_ACTION:] = 0.0

    def _next(self, memory: np.ndarray) -> np.ndarray:
        return np.minimum(memory[:, FRAME] + 1, memory[:, CLIP_END]).astype(int)

    def act(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
            memory: np.ndarray) -> None:
        nxt = self._next(memory[ids])
        base = self.joint_pos[nxt] if self.params["residual_actions"] else self.home[7:]
        pool.ctrl[ids] = base + self.params["action_scale"] * actions

    def _bodies(self, pool: BatchEnvPool, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """(n, B, 3) positions, (n, B, 4) orientations, (n, B, 3) linear and angular velocities
        (world frame, at the body frames' origins: mj_objectVelocity's for mjOBJ_XBODY, as
        the clips' velocities are the derivatives of their body positions)."""
        out = pool.outputs
        xpos, xquat = out["xpos"][ids], out["xquat"][ids]
        cvel = out["cvel"][ids]
        com = out["subtree_com"][ids]  # (n, 1, 3): the root's subtree, every body's rootid
        ang = cvel[..., :3]
        lin = cvel[..., 3:] - np.cross(xpos - com, ang)
        return xpos, xquat, lin, ang

    def compare(self, xpos: np.ndarray, xquat: np.ndarray, lin: np.ndarray, ang: np.ndarray,
                frame: np.ndarray) -> dict[str, np.ndarray]:
        """The tracking errors of n robots at reference frames ``frame`` (C++'s Compare)."""
        a = self.anchor
        anchor_pos, anchor_quat = xpos[:, a], xquat[:, a]
        ref_pos, ref_quat = self.body_pos[frame], self.body_quat[frame]
        ref_anchor_pos, ref_anchor_quat = ref_pos[:, a], ref_quat[:, a]
        angle = quat_angle(ref_anchor_quat, anchor_quat)
        gravity = np.abs(quat_to_mat(ref_anchor_quat)[:, 2, 2] - quat_to_mat(anchor_quat)[:, 2, 2])
        yaw = yaw_quat(quat_mul(anchor_quat, quat_conj(ref_anchor_quat)))[:, None, :]
        shift = np.stack([anchor_pos[:, 0], anchor_pos[:, 1], ref_anchor_pos[:, 2]], 1)
        rel = shift[:, None, :] + quat_rotate(np.broadcast_to(yaw, ref_quat.shape),
                                              ref_pos - ref_anchor_pos[:, None, :])
        dist2 = ((rel - xpos) ** 2).sum(-1)
        body_angle = quat_angle(quat_mul(np.broadcast_to(yaw, ref_quat.shape), ref_quat), xquat)
        ee = self.end_effectors
        return {"anchor_pos": ((ref_anchor_pos - anchor_pos) ** 2).sum(-1),
                "anchor_ori": angle ** 2, "anchor_height": anchor_pos[:, 2],
                "ref_anchor_height": ref_anchor_pos[:, 2], "anchor_gravity_error": gravity,
                "body_pos": dist2.mean(1), "body_pos_error": np.sqrt(dist2).mean(1),
                "body_ori": (body_angle ** 2).mean(1),
                "body_lin_vel": ((self.body_lin_vel[frame] - lin) ** 2).sum(-1).mean(1),
                "body_ang_vel": ((self.body_ang_vel[frame] - ang) ** 2).sum(-1).mean(1),
                "end_effector_height_error":
                    np.abs(rel[:, ee, 2] - xpos[:, ee, 2]).max(1) if len(ee) else
                    np.zeros(len(frame))}

    def errors(self, qpos: np.ndarray, memory: np.ndarray, c: dict[str, np.ndarray]
               ) -> np.ndarray:
        frame = memory[:, FRAME].astype(int)
        joint = np.abs(qpos[:, 7:] - self.joint_pos[frame]).sum(1) / JOINTS
        return np.stack([frame, memory[:, CLIP], c["body_pos_error"], np.sqrt(c["anchor_pos"]),
                         np.sqrt(c["anchor_ori"]), joint], 1)

    def evaluate(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
                 memory: np.ndarray) -> Transition:
        p = self.params
        mem = memory[ids]
        mem[:, FRAME] += 1
        frame = mem[:, FRAME].astype(int)
        c = self.compare(*self._bodies(pool, ids), frame)
        qpos, qvel = pool.qpos[ids], pool.qvel[ids]
        rate = ((actions - mem[:, LAST_ACTION:]) ** 2).sum(1)
        q = qpos[:, 7:]
        limit = (np.maximum(0, self.soft[:, 0] - q) + np.maximum(0, q - self.soft[:, 1])).sum(1)
        finite = np.isfinite(qpos).all(1) & np.isfinite(qvel).all(1)
        failed = (~finite | (np.abs(c["anchor_height"] - c["ref_anchor_height"])
                             > p["max_anchor_height_error"])
                  | (c["anchor_gravity_error"] > p["max_anchor_gravity_error"])
                  | (c["end_effector_height_error"] > p["max_end_effector_height_error"]))
        kernels = np.exp(-np.stack([c["anchor_pos"], c["anchor_ori"], c["body_pos"],
                                    c["body_ori"], c["body_lin_vel"], c["body_ang_vel"]], 1)
                         * self.inv_var)
        terms = np.concatenate([kernels, rate[:, None], limit[:, None],
                                failed[:, None].astype(float)], 1)
        shares = self.dt * self.w * terms
        reward = np.zeros(len(ids))
        for k in range(shares.shape[1]):  # summed in C++'s order
            reward = reward + shares[:, k]
        truncated = frame >= mem[:, CLIP_END]
        mem[failed, EVENT] = 1 + self.bin_of(frame[failed])
        info = np.concatenate([self.errors(qpos, mem, c), shares,
                               c["anchor_height"][:, None], c["ref_anchor_height"][:, None]], 1)
        mem[:, LAST_ACTION:] = actions
        memory[ids] = mem
        return Transition(reward=reward, terminated=failed, truncated=truncated, info=info)

    def observe(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray,
                obs: np.ndarray, critic: np.ndarray | None) -> None:
        mem = memory[ids]
        nxt = self._next(mem)
        xpos, xquat, _, _ = self._bodies(pool, ids)
        qpos, qvel = pool.qpos[ids], pool.qvel[ids]
        a = self.anchor
        anchor_pos, anchor_quat = xpos[:, a], xquat[:, a]
        rel = quat_mul(quat_conj(anchor_quat), self.body_quat[nxt, a])
        o = np.concatenate([self.joint_pos[nxt] - self.home[7:], self.joint_vel[nxt], rot6(rel),
                            qvel[:, 3:6], qpos[:, 7:] - self.home[7:], qvel[:, 6:],
                            mem[:, LAST_ACTION:]], 1)
        obs[ids] = o
        if critic is None:
            return
        q = np.broadcast_to(anchor_quat[:, None, :], xquat.shape)
        bodies_pos = quat_rotate_inv(q, xpos - anchor_pos[:, None, :])
        bodies_ori = rot6(quat_mul(quat_conj(q), xquat))
        critic[ids] = np.concatenate([
            o, quat_rotate_inv(anchor_quat, self.body_pos[nxt, a] - anchor_pos),
            quat_rotate_inv(qpos[:, 3:7], qvel[:, :3]),
            np.concatenate([bodies_pos, bodies_ori], -1).reshape(len(ids), -1)], 1)

    def update(self, memory: np.ndarray) -> None:
        events = memory[:, EVENT]
        hit = events > 0
        counts = np.bincount(events[hit].astype(int) - 1, minlength=self.nbins)
        memory[hit, EVENT] = 0
        alpha = self.params["adaptive_alpha"]
        if not hit.any() and alpha == 0:
            return
        fail = self.shared[:self.nbins]
        fail[:] = (1 - alpha) * fail + alpha * counts
        if self.params["adaptive_sampling"]:
            self._distribution()

