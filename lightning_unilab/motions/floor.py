"""What the floor must do for a clip to happen: the contact force and centre of pressure that
inverse dynamics implies at each frame, against the soles on the floor.

Kinematics alone (no penetration, no slip) let a clip ask for a push the feet cannot give: a
centre of pressure outside the soles, a horizontal force beyond friction, or a floor that pulls.
A tracker meets those frames as torques it has no way to make and learns to fall there. The
whole body's motion fixes the one wrench the floor must supply (MuJoCo's ``mj_inverse`` on the
floating base, contacts off); its force line meets the floor at the centre of pressure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from lightning_unilab.motions.checks import FEET, foot_points
from lightning_unilab.motions.clip import MotionClip
from lightning_unilab.motions.convert import clip_state
from lightning_unilab.motions.quat import rotate

__all__ = ["LOADED", "ON_FLOOR", "FloorDemand", "floor_demand", "outside_hull"]

ON_FLOOR = 0.01  # m: a sole corner this low bounds the support polygon
LOADED = 0.25  # of the weight: frames with less normal force are the ends of a flight, skipped


@dataclass(frozen=True)
class FloorDemand:
    """Per clip frame (the first and last are nan: central differences), the floor's part."""

    normal: np.ndarray  # (frames,) vertical force over the weight; negative: the floor pulls
    cop: np.ndarray  # (frames, 2) centre of pressure on z = 0 (nan where normal <= 0)
    cop_outside: np.ndarray  # (frames,) m outside the soles' convex hull (nan: no sole down)
    friction: np.ndarray  # (frames,) horizontal over vertical force
    on_floor: np.ndarray  # (frames,) bool: some sole corner within ON_FLOOR of the floor

    def loaded(self) -> np.ndarray:
        """Frames on the floor carrying at least LOADED of the weight."""
        return self.on_floor & (np.nan_to_num(self.normal) >= LOADED)

    @property
    def max_cop_outside(self) -> float:
        """m, the worst loaded frame's centre of pressure outside the soles."""
        return float(self.cop_outside[self.loaded()].max(initial=0.0))

    @property
    def max_moment_outside(self) -> float:
        """m x weight: the worst loaded frame's moment about the soles' edge that they cannot
        make (pressure outside times normal force): small where the floor barely presses."""
        return float((self.cop_outside * self.normal)[self.loaded()].max(initial=0.0))

    @property
    def max_friction(self) -> float:
        """The friction coefficient the worst loaded frame needs."""
        return float(self.friction[self.loaded()].max(initial=0.0))

    @property
    def max_pull(self) -> float:
        """Of the weight: the floor pulling a sole down, 0 when it never does."""
        return float(max(0.0, -np.nanmin(self.normal[self.on_floor], initial=0.0)))

    def lines(self) -> list[str]:
        loaded = self.loaded()
        worst = int(np.nanargmax(np.where(loaded, self.cop_outside, np.nan))) if loaded.any() \
            else -1
        return [f"floor pressure    {self.max_cop_outside * 1e3:.0f} mm outside the soles at "
                f"worst (frame {worst}), {int((self.cop_outside[loaded] > 0).sum())} of "
                f"{int(loaded.sum())} loaded frames outside; moment short "
                f"{self.max_moment_outside:.3f} m x weight",
                f"floor friction    {self.max_friction:.2f} needed at worst; pull "
                f"{self.max_pull:.2f} of the weight"]


def outside_hull(point: np.ndarray, points: np.ndarray) -> float:
    """Distance (m) of a 2-D point outside the convex hull of points (k, 2); 0 inside."""
    hull = _hull(points)
    if len(hull) == 1:
        return float(np.linalg.norm(point - hull[0]))
    edges = np.roll(hull, -1, axis=0) - hull
    rel = point - hull
    cross = edges[:, 0] * rel[:, 1] - edges[:, 1] * rel[:, 0]
    if len(hull) > 2 and (cross >= 0).all():
        return 0.0
    t = np.clip((rel * edges).sum(1) / np.maximum((edges**2).sum(1), 1e-300), 0.0, 1.0)
    return float(np.linalg.norm(rel - t[:, None] * edges, axis=1).min())


def _hull(points: np.ndarray) -> np.ndarray:
    """Counter-clockwise convex hull (Andrew's monotone chain)."""
    pts = np.unique(np.round(points, 12), axis=0)
    if len(pts) < 3:
        return pts

    def turn(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    def half(seq: np.ndarray) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for p in seq:
            while len(out) >= 2 and turn(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out

    lower, upper = half(pts), half(pts[::-1])
    return np.array(lower[:-1] + upper[:-1])


def floor_demand(clip: MotionClip, model: mujoco.MjModel,
                 feet: Sequence[str] = FEET) -> FloorDemand:
    """Inverse dynamics of the clip's root and joints, velocities the clip's own, accelerations
    their central differences."""
    qpos, qvel = clip_state(clip, model)
    qacc = np.full_like(qvel, np.nan)
    qacc[1:-1] = (qvel[2:] - qvel[:-2]) * (clip.fps / 2.0)
    geoms = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f) for f in feet]
    geoms = [g for g in geoms if g >= 0]
    if not geoms:
        raise ValueError(f"model: none of the foot geoms {list(feet)} exists")
    root = int(model.jnt_bodyid[0])
    weight = float(model.body_subtreemass[root] * np.linalg.norm(model.opt.gravity))
    n = clip.num_frames
    normal, friction, outside = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    cop = np.full((n, 2), np.nan)
    on_floor = np.zeros(n, bool)
    data = mujoco.MjData(model)
    flags = model.opt.disableflags
    model.opt.disableflags = flags | int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    try:
        for k in range(1, n - 1):
            data.qpos[:], data.qvel[:], data.qacc[:] = qpos[k], qvel[k], qacc[k]
            mujoco.mj_inverse(model, data)
            force = data.qfrc_inverse[:3]
            # the free joint's torque is in the root's frame, about its origin r
            moment = rotate(data.xquat[root], data.qfrc_inverse[3:6])
            r = data.xpos[root]
            normal[k] = force[2] / weight
            friction[k] = np.hypot(force[0], force[1]) / max(force[2], 1e-9 * weight)
            # the force f through p on z = 0: (p - r) x f = moment
            if force[2] > 0:
                cop[k] = (r[0] - (moment[1] + r[2] * force[0]) / force[2],
                          r[1] + (moment[0] - r[2] * force[1]) / force[2])
            soles = np.concatenate([foot_points(model, data, g) for g in geoms])
            down = soles[soles[:, 2] < ON_FLOOR, :2]
            on_floor[k] = len(down) > 0
            if on_floor[k] and force[2] > 0:
                outside[k] = outside_hull(cop[k], down)
    finally:
        model.opt.disableflags = flags
    return FloorDemand(normal, cop, outside, friction, on_floor)
