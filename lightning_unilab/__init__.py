"""MuJoCoUni + UniLab for Lightning: robot RL with MuJoCo on CPU threads.

Rooms: ``envs/`` (the pool, tasks and env adapters), ``runtime/`` (the collector process, the
shared-memory ring and the DataModule), ``learner/`` (APPO and its maths); ``train`` and
``evaluate`` are the commands (``last_checkpoint``: the callback ``train`` adds). The module
paths from before the rooms still import (:mod:`lightning_unilab._moved`).
"""

import importlib

import mujoco

from lightning_unilab import _moved

_moved.install()

try:
    from lightning_unilab import _core
except ImportError as err:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"lightning_unilab's C++ extension did not load ({err}). It links the libmujoco of the "
        f"installed mujoco package (found: mujoco {mujoco.__version__}); reinstall "
        "lightning-omnilab against mujoco==4.0.0 (`make test` sets this up)."
    ) from err


def _check_mujoco_version() -> None:
    """The extension was compiled against one MuJoCo; refuse to run against another."""
    built = _core.mujoco_build_version()
    loaded = {mujoco.mj_version(), _core.mujoco_runtime_version()}
    if loaded != {built}:
        raise ImportError(
            f"lightning_unilab was built for MuJoCo {built} but MuJoCo "
            f"{sorted(loaded)} (Python package mujoco {mujoco.__version__}) is loaded; "
            "reinstall lightning-omnilab so that both match"
        )


_check_mujoco_version()

from lightning_unilab.envs.pool import (  # noqa: E402
    STATUS_ERROR,
    STATUS_TOO_FAST,
    BatchEnvPool,
    describe_status,
)
from lightning_unilab.envs.vector_env import StepBuffers, TaskVectorEnv  # noqa: E402

__all__ = ["BatchEnvPool", "STATUS_ERROR", "STATUS_TOO_FAST", "StepBuffers", "TaskVectorEnv",
           "describe_status"]

try:  # gymnasium is optional: with it, the tasks are registered as omnilab/<name>
    from lightning_unilab.envs.registration import register_envs as _register_envs
except ImportError:  # pragma: no cover - depends on the installation
    pass
else:
    _register_envs()


def __getattr__(name: str) -> object:
    # the gymnasium adapter imports gymnasium, an optional dependency: load it on first use
    if name == "PoolVectorEnv":
        from lightning_unilab.envs.gym import PoolVectorEnv

        return PoolVectorEnv
    if f"{__name__}.{name}" in _moved.MOVED:  # an old submodule, e.g. lightning_unilab.tasks
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'lightning_unilab' has no attribute {name!r}")
