"""Offscreen frames of pool environments, and a GIF writer for evaluation videos.

Frames come from MuJoCo's own ``mujoco.Renderer``. On a machine without a display it needs an
offscreen OpenGL backend chosen *before* mujoco is first imported: ``MUJOCO_GL=egl`` (the
``libegl1`` and ``libgl1-mesa-dri`` system packages; Mesa renders on the CPU when there is no
GPU) or ``MUJOCO_GL=osmesa`` (``libosmesa6``). See docs/unilab/integrations.md.

    envs = PoolVectorEnv("HalfCheetah-v5", 16, render_mode="rgb_array")
    frames = []
    ...; frames.append(envs.render()[0])         # env 0's (480, 480, 3) uint8 frame
    write_gif(frames, "cheetah.gif", fps=envs.metadata["render_fps"])
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path

import mujoco
import numpy as np

from lightning_omnilab.validate import positive_int

__all__ = ["EnvRenderer", "write_gif"]

_GHOST_RGBA = np.array([0.3, 0.6, 1.0, 0.35], np.float32)  # the reference: translucent blue

_INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION


class EnvRenderer:
    """Renders chosen envs of a BatchEnvPool from their state rows.

    Each frame is the env's state row loaded into one scratch MjData of the pool's model and
    forwarded, so the pool itself is never touched. Randomized model fields (masses, sizes)
    are not applied: geometry is drawn as the base model has it.

    Args:
        model: the pool's model.
        width: frame width in pixels (default 480, as gymnasium's MuJoCo envs).
        height: frame height in pixels (default 480).
        camera: a camera name or id of the model; default: a free camera that tracks body 1
            (the root body of gymnasium's and the G1 models) from a distance set by the model's
            extent.
    """

    def __init__(self, model: mujoco.MjModel, width: int = 480, height: int = 480,
                 camera: str | int | None = None) -> None:
        for name, value in (("width", width), ("height", height)):
            positive_int(name, value)
        self.model = copy.copy(model)  # the offscreen size is set on this copy only
        self.width, self.height = width, height
        if isinstance(camera, str):
            cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if cam < 0:
                names = [model.camera(i).name for i in range(model.ncam)]
                raise ValueError(f"camera: the model has no camera {camera!r}; it has {names}")
            self.camera: int | mujoco.MjvCamera = cam
        elif camera is not None:
            if not 0 <= int(camera) < model.ncam:
                raise ValueError(f"camera: expected an id in [0, {model.ncam}), got {camera}")
            self.camera = int(camera)
        else:
            free = mujoco.MjvCamera()
            free.type = mujoco.mjtCamera.mjCAMERA_TRACKING
            free.trackbodyid = 1 if model.nbody > 1 else 0
            free.distance = 1.5 * float(model.stat.extent)
            free.elevation = -20.0
            free.azimuth = 90.0
            self.camera = free
        self._data = mujoco.MjData(model)
        self._renderer: mujoco.Renderer | None = None

    def _open(self) -> mujoco.Renderer:
        if self._renderer is None:
            # the offscreen buffer bounds the frame size: grow it as gymnasium's envs do
            self.model.vis.global_.offwidth = max(self.model.vis.global_.offwidth, self.width)
            self.model.vis.global_.offheight = max(self.model.vis.global_.offheight, self.height)
            try:
                self._renderer = mujoco.Renderer(self.model, self.height, self.width)
            except Exception as err:  # GL errors come in several types, by backend
                backend = os.environ.get("MUJOCO_GL", "unset (glfw: needs a display)")
                raise RuntimeError(
                    f"render: MuJoCo could not open an OpenGL context (MUJOCO_GL={backend}): "
                    f"{err}. On a headless machine set MUJOCO_GL=egl (system packages libegl1, "
                    "libgl1-mesa-dri) or MUJOCO_GL=osmesa (libosmesa6) before importing mujoco"
                ) from err
        return self._renderer

    def render(self, states: np.ndarray, ghost: np.ndarray | None = None) -> list[np.ndarray]:
        """One (height, width, 3) uint8 frame per mjSTATE_INTEGRATION row of states; ``ghost``
        (one qpos row per state row, a tracking task's reference) is drawn translucent over it."""
        renderer = self._open()
        rows = np.atleast_2d(states)
        if ghost is not None:
            ghost = np.atleast_2d(np.asarray(ghost, np.float64))
            if ghost.shape != (len(rows), self.model.nq):
                raise ValueError(f"ghost: expected ({len(rows)}, {self.model.nq}) qpos rows, got "
                                 f"{ghost.shape}")
            ghost_data = mujoco.MjData(self.model)
            option, perturb = mujoco.MjvOption(), mujoco.MjvPerturb()
        frames = []
        for i, row in enumerate(rows):
            mujoco.mj_setState(self.model, self._data, row, _INTEGRATION)
            mujoco.mj_forward(self.model, self._data)
            renderer.update_scene(self._data, camera=self.camera)
            if ghost is not None:
                scene = renderer.scene
                first = scene.ngeom
                ghost_data.qpos[:] = ghost[i]
                mujoco.mj_kinematics(self.model, ghost_data)
                mujoco.mjv_addGeoms(self.model, ghost_data, option, perturb,
                                    mujoco.mjtCatBit.mjCAT_DYNAMIC, scene)
                for k in range(first, scene.ngeom):
                    scene.geoms[k].rgba[:] = _GHOST_RGBA
            frames.append(renderer.render().copy())
        return frames

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def write_gif(frames: Sequence[np.ndarray], path: str | os.PathLike, fps: float = 30) -> Path:
    """Write (H, W, 3) uint8 frames as an animated GIF (Pillow, which matplotlib installs)."""
    from PIL import Image

    if not frames:
        raise ValueError("frames: expected at least one frame, got none")
    images = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
    out = Path(path)
    images[0].save(out, save_all=True, append_images=images[1:], loop=0,
                   duration=max(1, round(1000 / fps)))
    return out
