"""The joint torques a clip asks of the motors, against each actuator's force limit.

A clip can be kinematically clean (no penetration, no slip, joints in range) and ask the floor
only for what it can give, yet need a joint torque no motor makes: a tracker then lags there
however long it trains. Inverse dynamics (MuJoCo's ``mj_inverse``, contacts off) gives the
generalized force of every frame; on the floor, the part the floating base cannot make itself
is carried by the soles' corners (the least-norm forces that make the base's wrench), and what
is left on each actuated joint is the motor's torque. In the air the base's wrench is the
clip's own error and nothing carries it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from lightning_unilab.motions.checks import FEET, foot_points
from lightning_unilab.motions.clip import MotionClip
from lightning_unilab.motions.convert import clip_state
from lightning_unilab.motions.floor import ON_FLOOR

__all__ = ["JointDemand", "joint_demand"]


@dataclass(frozen=True)
class JointDemand:
    """Per clip frame (the first and last are nan: central differences) and actuator."""

    names: tuple[str, ...]  # the actuated joints, in actuator order
    torque: np.ndarray  # (frames, actuators) N m the motor must give
    limit: np.ndarray  # (actuators,) N m the motor can give (the joint's actuator force range)

    @property
    def ratio(self) -> np.ndarray:
        """(frames, actuators) |torque| over the limit: above 1 no motor of the model makes it."""
        return np.abs(self.torque) / self.limit

    @property
    def max_ratio(self) -> float:
        return float(np.nanmax(self.ratio, initial=0.0))

    def frames_over(self) -> np.ndarray:
        """(actuators,) how many frames each joint needs more than its limit."""
        return (np.nan_to_num(self.ratio) > 1.0).sum(axis=0)

    def lines(self, top: int = 3) -> list[str]:
        worst = np.nanmax(self.ratio, axis=0, initial=0.0)
        over = self.frames_over()
        out = [f"joint torque      {self.max_ratio:.2f} x the motor's limit at worst, "
               f"{int((over > 0).sum())} of {len(self.names)} joints over it"]
        for i in np.argsort(-worst)[:top]:
            if over[i]:
                frame = int(np.nanargmax(self.ratio[:, i]))
                out.append(f"  {self.names[i]:<28} {worst[i]:.2f} x {self.limit[i]:.0f} N m "
                           f"(frame {frame}), {int(over[i])} frames over")
        return out


def actuator_limits(model: mujoco.MjModel) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """Joint names, dof addresses and torque limits of the model's joint actuators: the
    actuator's own force range where it has one, else its joint's actuator force range."""
    names, dofs, limits = [], [], []
    for a in range(model.nu):
        if model.actuator_trntype[a] != mujoco.mjtTrn.mjTRN_JOINT:
            continue
        j = int(model.actuator_trnid[a, 0])
        gear = abs(float(model.actuator_gear[a, 0])) or 1.0
        if model.actuator_forcelimited[a]:
            limit = gear * float(np.abs(model.actuator_forcerange[a]).max())
        elif model.jnt_actfrclimited[j]:
            limit = float(np.abs(model.jnt_actfrcrange[j]).max())
        else:
            limit = np.inf
        names.append(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j))
        dofs.append(int(model.jnt_dofadr[j]))
        limits.append(limit)
    if not names:
        raise ValueError("model: no actuator drives a joint, so no motor torque to measure")
    return tuple(names), np.array(dofs), np.array(limits)


def joint_demand(clip: MotionClip, model: mujoco.MjModel,
                 feet: Sequence[str] = FEET) -> JointDemand:
    """Inverse dynamics of the clip (velocities its own, accelerations their central
    differences), the base's wrench carried by the sole corners on the floor."""
    qpos, qvel = clip_state(clip, model)
    qacc = np.full_like(qvel, np.nan)
    qacc[1:-1] = (qvel[2:] - qvel[:-2]) * (clip.fps / 2.0)
    geoms = [g for g in (mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f) for f in feet)
             if g >= 0]
    names, dofs, limits = actuator_limits(model)
    n = clip.num_frames
    torque = np.full((n, len(names)), np.nan)
    data = mujoco.MjData(model)
    jac = np.zeros((3, model.nv))
    flags = model.opt.disableflags
    model.opt.disableflags = flags | int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    try:
        for k in range(1, n - 1):
            data.qpos[:], data.qvel[:], data.qacc[:] = qpos[k], qvel[k], qacc[k]
            mujoco.mj_inverse(model, data)
            force = data.qfrc_inverse.copy()
            rows = []
            for g in geoms:
                for p in foot_points(model, data, g):
                    if p[2] < ON_FLOOR:
                        mujoco.mj_jac(model, data, jac, None, p, int(model.geom_bodyid[g]))
                        rows.append(jac.copy())
            if rows:  # corner forces f with J_base^T f = the base's wrench, least norm
                J = np.concatenate(rows)
                f = np.linalg.lstsq(J[:, :6].T, force[:6], rcond=None)[0]
                force -= J.T @ f
            torque[k] = force[dofs]
    finally:
        model.opt.disableflags = flags
    return JointDemand(names, torque, limits)
