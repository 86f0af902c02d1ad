"""Reference motion clips in BeyondMimic's ``.npz`` layout, validated against a MuJoCo model.

A clip file holds ``fps`` and, per frame, ``joint_pos``/``joint_vel`` (frames x joints) and the
world-frame ``body_pos_w``, ``body_quat_w`` (w, x, y, z), ``body_lin_vel_w``, ``body_ang_vel_w``
(frames x bodies x 3 or 4), as UniLab and mjlab read them. Ours also carry ``joint_names`` and
``body_names``; a file without them is read as the model's 1-DoF joints in qpos order and all its
bodies but the world in model order. Every refusal names the file and the key, because a tracking
run that trains on a wrong clip fails hours later and far from the cause.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mujoco
import numpy as np

from lightning_omnilab.durable import open_durable
from lightning_unilab.motions import quat

__all__ = ["ARRAY_KEYS", "MotionClip", "load_clip", "load_motions", "model_body_names",
           "model_joint_names", "resample_weights", "save_clip"]

# key -> (trailing shape, what the axes are); "J" joints, "B" bodies
ARRAY_KEYS: dict[str, tuple[tuple[str | int, ...], str]] = {
    "joint_pos": (("J",), "(frames, joints)"),
    "joint_vel": (("J",), "(frames, joints)"),
    "body_pos_w": (("B", 3), "(frames, bodies, 3)"),
    "body_quat_w": (("B", 4), "(frames, bodies, 4) as w, x, y, z"),
    "body_lin_vel_w": (("B", 3), "(frames, bodies, 3)"),
    "body_ang_vel_w": (("B", 3), "(frames, bodies, 3)"),
}
_QUAT_TOL = 1e-3


@dataclass(frozen=True, eq=False)
class MotionClip:
    """One reference motion; arrays are float64, read-only, joints in the model's qpos order."""

    name: str
    path: str
    fps: float
    joint_names: tuple[str, ...]
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    body_names: tuple[str, ...]
    body_pos_w: np.ndarray
    body_quat_w: np.ndarray
    body_lin_vel_w: np.ndarray
    body_ang_vel_w: np.ndarray

    def __post_init__(self) -> None:
        for key in ARRAY_KEYS:
            arr = np.array(getattr(self, key), np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)

    @property
    def num_frames(self) -> int:
        return int(self.joint_pos.shape[0])

    @property
    def duration(self) -> float:
        """Seconds from the first frame to the last."""
        return (self.num_frames - 1) / self.fps

    @property
    def times(self) -> np.ndarray:
        return np.arange(self.num_frames) / self.fps

    def body_index(self, name: str) -> int:
        if name not in self.body_names:
            raise ValueError(f"{self.path}: body_names: no body {name!r} in this clip "
                             f"(it has {', '.join(self.body_names)})")
        return self.body_names.index(name)

    def select_bodies(self, names: Sequence[str]) -> MotionClip:
        """The clip with only the bodies names, in that order (a tracking task's bodies)."""
        names = tuple(names)
        missing = [n for n in names if n not in self.body_names]
        if missing:
            raise ValueError(f"{self.path}: body_names: the clip has no body "
                             f"{', '.join(map(repr, missing))} "
                             f"(it has {', '.join(self.body_names)})")
        idx = [self.body_names.index(n) for n in names]
        return replace(self, body_names=names,
                       **{k: getattr(self, k)[:, idx] for k in ARRAY_KEYS if k.startswith("body_")})

    def resample(self, fps: float) -> MotionClip:
        """The same motion at fps over the same duration: frames at k / fps for
        k = 0..floor(duration * fps); linear in positions, velocities and angles, slerp in
        orientations."""
        fps = check_fps(fps, f"{self.path}: resample")
        if fps == self.fps:
            return self
        i0, alpha = resample_weights(self.num_frames, self.fps, fps)
        lin = {k: lerp_frames(getattr(self, k), i0, alpha)
               for k in ARRAY_KEYS if k != "body_quat_w"}
        q = self.body_quat_w
        a = alpha.reshape(-1, *([1] * (q.ndim - 2)))
        slerped = quat.slerp(q[i0], q[i0 + 1], np.broadcast_to(a, q[i0].shape[:-1]))
        return replace(self, fps=fps, body_quat_w=slerped, **lin)


def resample_weights(frames: int, fps: float, new_fps: float) -> tuple[np.ndarray, np.ndarray]:
    """For the new frames at k / new_fps over the same duration: the source frame before each
    (i0, so that i0 + 1 exists) and the fraction of the way to the next."""
    duration = (frames - 1) / fps
    count = int(np.floor(duration * new_fps + 1e-9)) + 1
    src = np.arange(count) * (fps / new_fps)
    i0 = np.clip(np.floor(src + 1e-9).astype(np.int64), 0, frames - 2)
    return i0, np.clip(src - i0, 0.0, 1.0)


def lerp_frames(x: np.ndarray, i0: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha.reshape(-1, *([1] * (x.ndim - 1)))
    return x[i0] * (1.0 - a) + x[i0 + 1] * a


def check_fps(fps: object, where: str) -> float:
    try:
        value = float(np.asarray(fps, np.float64).reshape(()))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: fps: expected one positive number, got {fps!r}") from None
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{where}: fps: expected a finite number > 0, got {value!r}")
    return value


def model_joint_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """The model's 1-DoF (hinge and slide) joints in qpos order: a clip's joint columns."""
    one_dof = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
    ids = [j for j in range(model.njnt) if int(model.jnt_type[j]) in one_dof]
    ids.sort(key=lambda j: model.jnt_qposadr[j])
    return tuple(model.joint(j).name for j in ids)


def model_body_names(model: mujoco.MjModel) -> tuple[str, ...]:
    """All the model's bodies but the world, in model order: a nameless clip's bodies."""
    return tuple(model.body(b).name for b in range(1, model.nbody))


def _names(data: dict[str, np.ndarray], key: str, count: int, known: tuple[str, ...],
           what: str, where: str) -> tuple[str, ...]:
    """The names under key, checked: count of them, no duplicate, all in the model."""
    if key not in data:
        if count != len(known):
            raise ValueError(f"{where}: {key}: absent, so the clip's {count} {what} are read as "
                             f"the model's, but the model has {len(known)}")
        return known
    arr = data[key]
    if arr.dtype.kind != "U" or arr.ndim != 1:
        raise ValueError(f"{where}: {key}: expected a 1-D array of str, got {arr.dtype} "
                         f"of shape {arr.shape}")
    names = tuple(str(n) for n in arr)
    if len(names) != count:
        raise ValueError(f"{where}: {key}: {len(names)} names for {count} {what}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{where}: {key}: duplicated {', '.join(map(repr, dup))}")
    absent = [n for n in names if n not in known]
    if absent:
        raise ValueError(f"{where}: {key}: not in the model: {', '.join(map(repr, absent))}")
    return names


# what a cut short or corrupted archive raises, at opening or at reading a member
_ARCHIVE_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def _read(path: str) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except _ARCHIVE_ERRORS as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise ValueError(f"{path}: not a readable .npz archive ({err})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: a single array, not an .npz archive of named arrays")
    data = {}
    with archive:
        for key in archive.files:
            try:
                data[key] = archive[key]
            except _ARCHIVE_ERRORS as err:  # object arrays need pickle, which we never run
                raise ValueError(f"{path}: {key}: unreadable: not a plain array without pickle, "
                                 f"or the archive is damaged ({type(err).__name__}: {err})"
                                 ) from None
    return data


def load_clip(path: str | os.PathLike[str], model: mujoco.MjModel) -> MotionClip:
    """The clip at path, validated against model, joints reordered into the model's qpos order."""
    where = str(path)
    data = _read(where)
    for key in ("fps", *ARRAY_KEYS):
        if key not in data:
            raise ValueError(f"{where}: missing key {key!r} (a BeyondMimic clip holds fps, "
                             f"{', '.join(ARRAY_KEYS)})")
    if data["fps"].size != 1 or data["fps"].dtype.kind not in "fiu":
        raise ValueError(f"{where}: fps: expected one number, got {data['fps'].dtype} of "
                         f"shape {data['fps'].shape}")
    fps = check_fps(data["fps"], where)
    arrays: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}
    for key, (tail, axes) in ARRAY_KEYS.items():
        arr = data[key]
        if arr.dtype.kind not in "fiu":
            raise ValueError(f"{where}: {key}: expected real numbers, got dtype {arr.dtype}")
        if arr.ndim != 1 + len(tail):
            raise ValueError(f"{where}: {key}: expected {axes}, got shape {arr.shape}")
        for dim, want in zip(("F", *tail), arr.shape, strict=True):
            if isinstance(dim, int):
                if dim != want:
                    raise ValueError(f"{where}: {key}: expected {axes}, got shape {arr.shape}")
            elif sizes.setdefault(dim, want) != want:
                axis = {"F": "frames", "J": "joints", "B": "bodies"}[dim]
                raise ValueError(f"{where}: {key}: expected {axes} with {sizes[dim]} {axis} "
                                 f"(as the keys before it), got shape {arr.shape}")
        arr = arr.astype(np.float64)
        bad = ~np.isfinite(arr)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{where}: {key}: {int(bad.sum())} NaN or inf values "
                             f"(the first at index {first})")
        arrays[key] = arr
    if sizes["F"] < 2:
        raise ValueError(f"{where}: joint_pos: {sizes['F']} frame(s); a clip needs at least 2")
    norms = np.linalg.norm(arrays["body_quat_w"], axis=-1)
    off = np.abs(norms - 1.0)
    if off.max() > _QUAT_TOL:
        frame, body = (int(i) for i in np.unravel_index(np.argmax(off), off.shape))
        raise ValueError(f"{where}: body_quat_w: not unit quaternions (norm "
                         f"{norms[frame, body]:.6g} at frame {frame}, body {body}; "
                         f"tolerance {_QUAT_TOL})")
    # normalized where the norm is visibly off (float32 files): a unit one is kept bit for bit
    norms = np.where(off > 1e-12, norms, 1.0)
    arrays["body_quat_w"] = arrays["body_quat_w"] / norms[..., None]
    model_joints = model_joint_names(model)
    joints = _names(data, "joint_names", sizes["J"], model_joints, "joints", where)
    bodies = _names(data, "body_names", sizes["B"], model_body_names(model), "bodies", where)
    lacking = [n for n in model_joints if n not in joints]
    if lacking:
        raise ValueError(f"{where}: joint_names: the clip lacks the model's joints "
                         f"{', '.join(map(repr, lacking))}")
    order = [joints.index(n) for n in model_joints]
    arrays["joint_pos"] = arrays["joint_pos"][:, order]
    arrays["joint_vel"] = arrays["joint_vel"][:, order]
    return MotionClip(name=Path(where).stem, path=where, fps=fps, joint_names=model_joints,
                      body_names=bodies, **arrays)


def load_motions(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 model: mujoco.MjModel) -> list[MotionClip]:
    """A motion library: one file, every *.npz of a directory (sorted), or a list of files."""
    if isinstance(paths, str | os.PathLike):
        root = Path(paths)
        if root.is_dir():
            files = sorted(root.glob("*.npz"))
            if not files:
                raise ValueError(f"{root}: a directory with no *.npz motion clip")
        else:
            files = [root]
    else:
        files = [Path(p) for p in paths]
        if not files:
            raise ValueError("load_motions: an empty list of clips")
    return [load_clip(f, model) for f in files]


def save_clip(clip: MotionClip, path: str | os.PathLike[str], compress: bool = True) -> None:
    """Write clip (with its names) to path durably: a reader never sees half a file, and a
    saved clip survives a power loss (lightning_omnilab.durable)."""
    arrays = {"fps": np.float64(clip.fps), "joint_names": np.array(clip.joint_names, np.str_),
              "body_names": np.array(clip.body_names, np.str_),
              **{k: getattr(clip, k) for k in ARRAY_KEYS}}
    with open_durable(path, digest=False) as f:  # a data file, not a checkpoint
        (np.savez_compressed if compress else np.savez)(f, **arrays)
