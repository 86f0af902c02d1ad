"""What a clip asks of the robot, measured through the model: joint limits and speeds, how low
the feet go (penetration) and how far a standing foot slides (slip).

A tracking policy cannot follow a clip that sinks its feet into the floor or slides a loaded
foot: it learns to fall or to skate. The generator asserts these; ``info`` prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from lightning_unilab.motions.clip import MotionClip
from lightning_unilab.motions.convert import root_body_name

__all__ = ["CONTACT_HEIGHT", "FEET", "ClipReport", "clip_report", "foot_points"]

FEET = ("left_foot", "right_foot")
# a foot whose lowest point is below this height (m) in two frames in a row bears weight there
CONTACT_HEIGHT = 0.002


@dataclass(frozen=True)
class ClipReport:
    frames: int
    fps: float
    duration: float
    joints: int
    bodies: int
    max_joint_speed: float  # rad/s
    fastest_joint: str
    limit_excess: float  # rad beyond model.jnt_range, 0 when within
    # nan below when the model has none of the foot geoms or the clip lacks the root body
    lowest_foot: float  # m, the lowest point of any foot geom
    max_penetration: float  # m below the floor, 0 when none
    max_slip: float  # m a foot in contact moves between two frames, 0 when none

    def lines(self) -> list[str]:
        return [f"frames            {self.frames}",
                f"fps               {self.fps:g}",
                f"duration          {self.duration:.3f} s",
                f"joints            {self.joints}",
                f"bodies            {self.bodies}",
                f"max joint speed   {self.max_joint_speed:.3f} rad/s ({self.fastest_joint})",
                f"beyond limits     {self.limit_excess:.3g} rad",
                f"lowest foot       {_mm(self.lowest_foot)}",
                f"max penetration   {_mm(self.max_penetration)}",
                f"max stance slip   {_mm(self.max_slip, '.3f')} per frame"]


def _mm(metres: float, fmt: str = ".2f") -> str:
    if np.isnan(metres):
        return "n/a (no foot geom in the model, or no root body in the clip)"
    return f"{metres * 1e3:{fmt}} mm"


def _qpos(clip: MotionClip, model: mujoco.MjModel) -> np.ndarray:
    """(frames, nq) from the clip's root body pose and joint angles."""
    root = root_body_name(model)
    if root not in clip.body_names:
        raise ValueError(f"{clip.path}: body_names: the model's root body {root!r} is not in "
                         f"the clip, so its feet cannot be placed")
    b = clip.body_names.index(root)
    qpos = np.tile(model.qpos0, (clip.num_frames, 1))
    qpos[:, :3] = clip.body_pos_w[:, b]
    qpos[:, 3:7] = clip.body_quat_w[:, b]
    adr = [model.joint(n).qposadr[0] for n in clip.joint_names]
    qpos[:, adr] = clip.joint_pos
    return qpos


def foot_points(model: mujoco.MjModel, data: mujoco.MjData, geom: int) -> np.ndarray:
    """World points of a foot geom's sole: a box's 4 corners on its face across its thinnest
    axis that faces down (which holds its lowest corner), else its centre less its bounding
    radius (after mj_kinematics). The same corners in the same order from frame to frame while
    the foot rolls: the 4 lowest corners would swap a heel's for a toe's top corners past a few
    degrees of pitch, and slip would read a foot's length."""
    pos, rot = data.geom_xpos[geom], data.geom_xmat[geom].reshape(3, 3)
    if model.geom_type[geom] == int(mujoco.mjtGeom.mjGEOM_BOX):
        size = model.geom_size[geom]
        thin = int(np.argmin(size))
        down = -1.0 if rot[2, thin] >= 0 else 1.0  # the face whose outward normal points down
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
        signs = signs[signs[:, thin] == down]
        return pos + (signs * size) @ rot.T
    return (pos - np.array([0.0, 0.0, model.geom_rbound[geom]]))[None]


def clip_report(clip: MotionClip, model: mujoco.MjModel, feet: Sequence[str] = FEET,
                contact_height: float = CONTACT_HEIGHT) -> ClipReport:
    """The clip's demands on the model; the feet's measures need the root body in the clip."""
    speed = np.abs(clip.joint_vel).max(axis=0)
    ids = [model.joint(n).id for n in clip.joint_names]
    low, high = model.jnt_range[ids].T
    limited = model.jnt_limited[ids].astype(bool)
    excess = np.maximum(low - clip.joint_pos, clip.joint_pos - high)[:, limited]
    geoms = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f) for f in feet]
    geoms = [g for g in geoms if g >= 0]
    lowest = penetration = slip = float("nan")
    if geoms and root_body_name(model) in clip.body_names:
        data = mujoco.MjData(model)
        points = np.empty((clip.num_frames, len(geoms), 4, 3))
        for k, q in enumerate(_qpos(clip, model)):
            data.qpos[:] = q
            mujoco.mj_kinematics(model, data)
            for i, g in enumerate(geoms):
                pts = foot_points(model, data, g)
                points[k, i] = pts if len(pts) == 4 else np.repeat(pts, 4, axis=0)
        lowest = float(points[..., 2].min())
        penetration = max(0.0, -lowest)
        down = points[..., 2].min(axis=-1) < contact_height  # (frames, feet)
        both = down[1:] & down[:-1]
        moved = np.linalg.norm(np.diff(points[..., :2], axis=0), axis=-1).max(axis=-1)
        slip = float(moved[both].max()) if both.any() else 0.0
    fastest = int(np.argmax(speed))
    return ClipReport(frames=clip.num_frames, fps=clip.fps, duration=clip.duration,
                      joints=len(clip.joint_names), bodies=len(clip.body_names),
                      max_joint_speed=float(speed[fastest]),
                      fastest_joint=clip.joint_names[fastest],
                      limit_excess=float(max(excess.max(initial=0.0), 0.0)),
                      lowest_foot=lowest, max_penetration=penetration, max_slip=slip)
