"""Where things are: a robot's base and joints in qpos/qvel, sensors in sensordata, a task's
per-env memory columns.

Names are looked up once, when a task is built; the terms then index arrays with the resulting
slices (views) or index arrays, never a name per step.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

__all__ = ["MemoryLayout", "Robot", "sensor_columns", "sensor_slice"]

Index = slice | np.ndarray


def _as_index(idx: Sequence[int]) -> Index:
    """A slice where the indices are contiguous and ascending (a view, no copy), else an array."""
    arr = np.asarray(idx, np.int64)
    if arr.size and (arr.size == 1 or (np.diff(arr) == 1).all()):
        return slice(int(arr[0]), int(arr[-1]) + 1)
    return arr


def _names(model: mujoco.MjModel, objtype: mujoco.mjtObj, count: int) -> list[str]:
    return [mujoco.mj_id2name(model, objtype, i) or "" for i in range(count)]


def _lookup(model: mujoco.MjModel, objtype: mujoco.mjtObj, count: int, name: str,
            what: str) -> int:
    i = mujoco.mj_name2id(model, objtype, name)
    if i < 0:
        close = difflib.get_close_matches(name, _names(model, objtype, count), n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"the model has no {what} named {name!r}{hint}")
    return i


@dataclass(frozen=True, eq=False)
class Robot:
    """A floating-base robot's place in the state rows, and the pose its joints are measured from.

    ``base_qpos`` / ``base_dof`` are the free joint's addresses: qpos holds position (3) and
    quaternion (w, x, y, z), qvel the world-frame linear velocity (3) and the body-frame angular
    velocity (3). ``joint_qpos`` / ``joint_dof`` select the actuated joints (slices when
    contiguous, as in most robots, so selecting them copies nothing beyond the row gather).
    """

    base_qpos: int
    base_dof: int
    joint_qpos: Index
    joint_dof: Index
    default_qpos: np.ndarray  # (nq,): the keyframe (or qpos0); the default joint pose lives here

    @classmethod
    def from_model(cls, model: mujoco.MjModel, keyframe: str | int | None = None,
                   base_joint: str | None = None,
                   joints: Sequence[str] | None = None) -> Robot:
        """Resolve by name: the free joint (default: the first), the joints (default: every
        hinge and slide joint, in model order) and the default pose (a keyframe, else qpos0)."""
        free = int(mujoco.mjtJoint.mjJNT_FREE)
        if base_joint is None:
            frees = np.flatnonzero(model.jnt_type == free)
            if not frees.size:
                raise ValueError("the model has no free joint: a Robot needs a floating base")
            base = int(frees[0])
        else:
            base = _lookup(model, mujoco.mjtObj.mjOBJ_JOINT, model.njnt, base_joint, "joint")
            if model.jnt_type[base] != free:
                raise ValueError(f"base_joint: {base_joint!r} is not a free joint")
        if joints is None:
            scalar = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
            ids = [j for j in range(model.njnt) if int(model.jnt_type[j]) in scalar]
        else:
            ids = [_lookup(model, mujoco.mjtObj.mjOBJ_JOINT, model.njnt, n, "joint")
                   for n in joints]
            ball = int(mujoco.mjtJoint.mjJNT_BALL)
            bad = [n for n, j in zip(joints, ids, strict=True)
                   if int(model.jnt_type[j]) in (free, ball)]
            if bad:
                raise ValueError(f"joints: {bad} are not hinge or slide joints")
        if keyframe is None:
            default = model.qpos0.copy()
        else:
            key = (keyframe if isinstance(keyframe, int) else
                   _lookup(model, mujoco.mjtObj.mjOBJ_KEY, model.nkey, keyframe, "keyframe"))
            if not 0 <= key < model.nkey:
                raise ValueError(f"keyframe: expected an index in [0, {model.nkey}), got {key}")
            default = model.key_qpos[key].copy()
        default.flags.writeable = False
        return cls(base_qpos=int(model.jnt_qposadr[base]), base_dof=int(model.jnt_dofadr[base]),
                   joint_qpos=_as_index([int(model.jnt_qposadr[j]) for j in ids]),
                   joint_dof=_as_index([int(model.jnt_dofadr[j]) for j in ids]),
                   default_qpos=default)

    @property
    def num_joints(self) -> int:
        return len(self.default_joint_pos)

    @property
    def default_joint_pos(self) -> np.ndarray:
        """(num_joints,) joint positions of the default pose."""
        return self.default_qpos[self.joint_qpos]

    @property
    def base_pos(self) -> slice:
        """qpos columns of the base position (x, y, z)."""
        return slice(self.base_qpos, self.base_qpos + 3)

    @property
    def base_quat(self) -> slice:
        """qpos columns of the base orientation (w, x, y, z)."""
        return slice(self.base_qpos + 3, self.base_qpos + 7)

    @property
    def base_lin_vel(self) -> slice:
        """qvel columns of the base linear velocity (world frame)."""
        return slice(self.base_dof, self.base_dof + 3)

    @property
    def base_ang_vel(self) -> slice:
        """qvel columns of the base angular velocity (body frame)."""
        return slice(self.base_dof + 3, self.base_dof + 6)


def sensor_slice(model: mujoco.MjModel, name: str) -> slice:
    """The sensordata columns of the sensor name."""
    i = _lookup(model, mujoco.mjtObj.mjOBJ_SENSOR, model.nsensor, name, "sensor")
    start = int(model.sensor_adr[i])
    return slice(start, start + int(model.sensor_dim[i]))


def sensor_columns(model: mujoco.MjModel, names: Sequence[str]) -> np.ndarray:
    """The sensordata column of each one-value sensor in names (e.g. contact sensors with
    ``num="1" data="found"``), as an index array: ``sensordata[:, columns]`` is (n, len(names))."""
    cols = []
    for name in names:
        s = sensor_slice(model, name)
        if s.stop - s.start != 1:
            raise ValueError(f"sensor {name!r} has {s.stop - s.start} values; expected one "
                             "(a contact sensor with num=\"1\" data=\"found\")")
        cols.append(s.start)
    return np.asarray(cols, np.int64)


class MemoryLayout:
    """Named column slices of a task's per-env memory; ``size`` is ``spec.memory_size``.

    ``MemoryLayout(last_action=29, command=3, air_time=2)["command"]`` is ``slice(29, 32)``:
    terms read and write ``memory[:, layout[name]]``, a view of the task's memory rows.
    """

    def __init__(self, **sizes: int) -> None:
        self._slices: dict[str, slice] = {}
        start = 0
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
                raise ValueError(f"{name}: expected a positive int of columns, got {size!r}")
            self._slices[name] = slice(start, start + int(size))
            start += int(size)
        self.size = start

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._slices)

    def __getitem__(self, name: str) -> slice:
        try:
            return self._slices[name]
        except KeyError:
            raise KeyError(f"memory has no columns named {name!r}; it has "
                           f"{list(self._slices)}") from None

    def column(self, name: str) -> int:
        """The one column of a one-wide entry (a step count): ``memory[:, column]`` is (n,)."""
        s = self[name]
        if s.stop - s.start != 1:
            raise ValueError(f"memory entry {name!r} has {s.stop - s.start} columns, not one")
        return s.start

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={s.stop - s.start}" for k, s in self._slices.items())
        return f"MemoryLayout({parts})"
