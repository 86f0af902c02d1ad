"""Retargeted joint trajectories (Unitree's LAFAN1 csv layout) to clips, by forward kinematics.

A csv row is one frame, no header: the root position (3), the root orientation (4, x y z w by
default) and the model's 1-DoF joint angles in qpos order. Bodies' poses come from mj_kinematics;
velocities from finite differences of the positions (np.gradient), turned into every body's
world-frame velocity by mj_objectVelocity, so a clip's velocities agree with its poses.
"""

from __future__ import annotations

import os
from pathlib import Path

import mujoco
import numpy as np

from lightning_omnilab.durable import open_durable
from lightning_unilab.motions import quat
from lightning_unilab.motions.clip import (
    MotionClip,
    check_fps,
    lerp_frames,
    model_body_names,
    model_joint_names,
    resample_weights,
)

__all__ = ["QUAT_ORDERS", "clip_state", "clip_to_csv", "csv_to_clip", "qpos_to_clip",
           "root_body_name"]

QUAT_ORDERS = ("xyzw", "wxyz")
# columns of a wxyz quaternion, for each file order
_TO_WXYZ = {"xyzw": [3, 0, 1, 2], "wxyz": [0, 1, 2, 3]}
_FROM_WXYZ = {"xyzw": [1, 2, 3, 0], "wxyz": [0, 1, 2, 3]}


def _check_order(quat_order: str) -> str:
    if quat_order not in QUAT_ORDERS:
        raise ValueError(f"quat_order: expected one of {', '.join(QUAT_ORDERS)}, "
                         f"got {quat_order!r}")
    return quat_order


def root_body_name(model: mujoco.MjModel) -> str:
    """The body of the model's free joint, which must be joint 0 at qpos 0 (a floating base)."""
    free = int(mujoco.mjtJoint.mjJNT_FREE)
    if model.njnt == 0 or int(model.jnt_type[0]) != free or model.jnt_qposadr[0] != 0:
        raise ValueError("model: expected a floating base (a free joint first, at qpos[0:7])")
    return model.body(int(model.jnt_bodyid[0])).name


def qpos_to_clip(root_pos: np.ndarray, root_quat: np.ndarray, joint_pos: np.ndarray,
                 model: mujoco.MjModel, fps: float, name: str = "motion",
                 path: str = "") -> MotionClip:
    """The clip of frames (root_pos (F, 3), root_quat (F, 4) wxyz, joint_pos (F, J) in the
    model's qpos order) at fps, with all the model's bodies but the world."""
    root_body_name(model)
    joints = model_joint_names(model)
    frames = len(joint_pos)
    dt = 1.0 / fps
    root_quat = quat.normalize(np.asarray(root_quat, np.float64))
    joint_vel = np.gradient(joint_pos, dt, axis=0)
    lin_vel = np.gradient(root_pos, dt, axis=0)
    ang_vel_local = quat.angular_velocity_body(root_quat, dt)  # the free joint's qvel[3:6]
    qadr = np.array([model.joint(n).qposadr[0] for n in joints], np.int64)
    dadr = np.array([model.joint(n).dofadr[0] for n in joints], np.int64)
    nb = model.nbody - 1
    pos = np.empty((frames, nb, 3))
    rot = np.empty((frames, nb, 4))
    vel6 = np.empty((frames, nb, 6))
    data = mujoco.MjData(model)
    res = np.empty(6)
    for k in range(frames):
        data.qpos[:3] = root_pos[k]
        data.qpos[3:7] = root_quat[k]
        data.qpos[qadr] = joint_pos[k]
        data.qvel[:3] = lin_vel[k]
        data.qvel[3:6] = ang_vel_local[k]
        data.qvel[dadr] = joint_vel[k]
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        mujoco.mj_comVel(model, data)
        pos[k] = data.xpos[1:]
        rot[k] = data.xquat[1:]
        for b in range(1, model.nbody):
            # XBODY: at the body's frame origin, the point body_pos_w holds (mjOBJ_BODY would
            # give its centre of mass's velocity, which is not the derivative of body_pos_w)
            mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_XBODY, b, res, 0)
            vel6[k, b - 1] = res
    return MotionClip(name=name, path=path, fps=fps, joint_names=joints,
                      joint_pos=joint_pos, joint_vel=joint_vel,
                      body_names=model_body_names(model), body_pos_w=pos, body_quat_w=rot,
                      body_lin_vel_w=vel6[..., 3:], body_ang_vel_w=vel6[..., :3])


def clip_state(clip: MotionClip, model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray]:
    """(frames, nq) qpos and (frames, nv) qvel of a clip holding the model's root body: its pose
    and velocity, and the joints' angles and speeds."""
    root = model.body(int(model.jnt_bodyid[0])).name
    b = clip.body_index(root)
    qpos = np.tile(model.qpos0, (clip.num_frames, 1))
    qvel = np.zeros((clip.num_frames, model.nv))
    qpos[:, :3] = clip.body_pos_w[:, b]
    qpos[:, 3:7] = clip.body_quat_w[:, b]
    qvel[:, :3] = clip.body_lin_vel_w[:, b]
    # the free joint's angular velocity is in the body's frame
    qvel[:, 3:6] = quat.rotate(quat.conj(clip.body_quat_w[:, b]), clip.body_ang_vel_w[:, b])
    for i, name in enumerate(clip.joint_names):
        joint = model.joint(name)
        qpos[:, joint.qposadr[0]] = clip.joint_pos[:, i]
        qvel[:, joint.dofadr[0]] = clip.joint_vel[:, i]
    return qpos, qvel


def csv_to_clip(csv_path: str | os.PathLike[str], model: mujoco.MjModel, fps: float,
                out_fps: float | None = None, quat_order: str = "xyzw") -> MotionClip:
    """The clip of the csv at csv_path (recorded at fps), resampled to out_fps first if given."""
    where = str(csv_path)
    quat_order = _check_order(quat_order)
    fps = check_fps(fps, where)
    joints = model_joint_names(model)
    root_body_name(model)
    try:
        rows = np.loadtxt(where, delimiter=",", ndmin=2, dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{where}: not a csv of numbers ({err})") from None
    want = 7 + len(joints)
    if rows.shape[1] != want:
        raise ValueError(f"{where}: {rows.shape[1]} columns; expected {want}: root position (3), "
                         f"root quaternion (4, {quat_order}), {len(joints)} joint angles")
    if len(rows) < 2:
        raise ValueError(f"{where}: {len(rows)} row(s); a clip needs at least 2 frames")
    if not np.isfinite(rows).all():
        row = int(np.argwhere(~np.isfinite(rows))[0, 0])
        raise ValueError(f"{where}: NaN or inf values (the first in row {row + 1})")
    root_pos, joint_pos = rows[:, :3], rows[:, 7:]
    root_quat = rows[:, 3:7][:, _TO_WXYZ[quat_order]]
    norms = np.linalg.norm(root_quat, axis=1)
    if np.abs(norms - 1.0).max() > 1e-3:
        row = int(np.argmax(np.abs(norms - 1.0)))
        raise ValueError(f"{where}: root quaternion of row {row + 1} has norm {norms[row]:.6g}; "
                         f"is the quaternion order {quat_order!r} right?")
    root_quat = quat.continuous(quat.normalize(root_quat))
    if out_fps is not None:
        out_fps = check_fps(out_fps, f"{where}: out_fps")
        i0, alpha = resample_weights(len(rows), fps, out_fps)
        root_pos, joint_pos = lerp_frames(root_pos, i0, alpha), lerp_frames(joint_pos, i0, alpha)
        root_quat = quat.slerp(root_quat[i0], root_quat[i0 + 1], alpha)
        fps = out_fps
    return qpos_to_clip(root_pos, root_quat, joint_pos, model, fps, Path(where).stem, where)


def clip_to_csv(clip: MotionClip, csv_path: str | os.PathLike[str], quat_order: str = "xyzw",
                root_body: str | None = None) -> None:
    """Write clip as a csv of root pose and joint angles (in the clip's joint order), every
    digit kept; root_body is the floating base (default: the clip's first body, the model's
    root in a clip in model order)."""
    quat_order = _check_order(quat_order)
    b = clip.body_index(root_body or clip.body_names[0])
    rows = np.concatenate([clip.body_pos_w[:, b], clip.body_quat_w[:, b][:, _FROM_WXYZ[quat_order]],
                           clip.joint_pos], axis=1)
    with open_durable(csv_path, "w", digest=False) as f:
        np.savetxt(f, rows, fmt="%.17g", delimiter=",")
