"""Task registry: names -> (model, C++ task and/or numpy task).

C++ tasks are registered in cpp/src/tasks/ and listed by ``_core.task_names()``; this module knows
where their models live (gymnasium's package, the G1 assets package) and which numpy task, if
any, mirrors them.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mujoco

from lightning_unilab import _core
from lightning_unilab.envs.assets import g1_flat_scene
from lightning_unilab.envs.tasks.base import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.rng import EnvRng

__all__ = ["EnvRng", "NumpyTask", "TaskInfo", "TaskSpec", "Transition", "get", "load_model",
           "task_names"]


def _package_dir(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"this task needs the {package!r} package ({hint})")
    return Path(next(iter(spec.submodule_search_locations)))


def gym_xml(name: str) -> Path:
    """Path of a MuJoCo XML shipped inside gymnasium."""
    root = _package_dir("gymnasium", "pip install 'gymnasium[mujoco]'")
    return root / "envs/mujoco/assets" / name


def g1_xml() -> Path:
    """The 29-DoF Unitree G1 feet-only flat scene from the assets extra."""
    return g1_flat_scene()


@dataclass(frozen=True)
class TaskInfo:
    name: str
    xml: Callable[[], Path]
    numpy_task: Callable[[], NumpyTask] | None = None

    def load_model(self) -> mujoco.MjModel:
        return compile_without_settotalmass(self.xml())


def compile_without_settotalmass(path: Path) -> mujoco.MjModel:
    """The model at path, compiled as MuJoCo would, minus MuJoCo's deprecation warning.

    gymnasium's half_cheetah.xml still sets ``<compiler settotalmass>``, which MuJoCo 4 compiles
    with a printed warning on every load (in every collector process). Doing what the warning
    advises, mj_setTotalmass then mj_setConst on the compiled model, gives bit-identical arrays
    (checked by test_tasks_compile_quietly_and_identically).
    """
    spec = mujoco.MjSpec.from_file(str(path))
    total = spec.compiler.settotalmass
    if total <= 0:  # not set (the default is -1): the plain load, as before
        return mujoco.MjModel.from_xml_path(str(path))
    spec.compiler.settotalmass = -1
    model = spec.compile()
    mujoco.mj_setTotalmass(model, total)
    mujoco.mj_setConst(model, mujoco.MjData(model))
    return model


def _g1_numpy() -> NumpyTask:
    from lightning_unilab.envs.tasks.g1_walk import G1WalkFlat

    return G1WalkFlat()


_TASKS: dict[str, TaskInfo] = {
    "HalfCheetah-v5": TaskInfo("HalfCheetah-v5", lambda: gym_xml("half_cheetah.xml")),
    "Ant-v5": TaskInfo("Ant-v5", lambda: gym_xml("ant.xml")),
    "Hopper-v5": TaskInfo("Hopper-v5", lambda: gym_xml("hopper.xml")),
    "Walker2d-v5": TaskInfo("Walker2d-v5", lambda: gym_xml("walker2d_v5.xml")),
    "Humanoid-v5": TaskInfo("Humanoid-v5", lambda: gym_xml("humanoid.xml")),
    "InvertedPendulum-v5": TaskInfo("InvertedPendulum-v5",
                                    lambda: gym_xml("inverted_pendulum.xml")),
    "g1-walk-flat": TaskInfo("g1-walk-flat", g1_xml, _g1_numpy),
}


def task_names() -> list[str]:
    """Every task name that ``get`` accepts."""
    return sorted(_TASKS)


def get(name: str) -> TaskInfo:
    """The task called name; an unknown name raises ValueError listing the close matches."""
    if name not in _TASKS:
        close = difflib.get_close_matches(str(name), list(_TASKS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown task {name!r}{hint} (known: {', '.join(task_names())})")
    return _TASKS[name]


def load_model(name: str) -> mujoco.MjModel:
    return get(name).load_model()


def cpp_task_names() -> list[str]:
    return list(_core.task_names())
