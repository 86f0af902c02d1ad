"""Task registry: names -> (model, C++ task and/or numpy task).

C++ tasks are registered in cpp/src/tasks/ and listed by ``_core.task_names()``; this module knows
where their models live (gymnasium's package, the G1 assets package) and which numpy task, if
any, mirrors them.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from lightning_unilab import _core
from lightning_unilab.envs.assets import g1_flat_scene
from lightning_unilab.envs.tasks.base import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.evaluation import TaskEvaluation
from lightning_unilab.envs.tasks.g1_tracking import EVALUATION as G1_TRACKING_EVALUATION
from lightning_unilab.envs.tasks.g1_walk import EVALUATION as G1_WALK_EVALUATION
from lightning_unilab.envs.tasks.rng import EnvRng

__all__ = ["EnvRng", "ModelParam", "NumpyTask", "TaskInfo", "TaskSpec", "Transition", "get",
           "load_model", "model_param_fields", "pin_model_params", "set_timestep", "task_names"]


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


def set_timestep(model: mujoco.MjModel, timestep: float) -> None:
    """A task's ``timestep`` parameter: the physics step, model.opt.timestep."""
    if not (math.isfinite(timestep) and timestep > 0):
        raise ValueError(f"timestep: expected a positive number of seconds, got {timestep!r}")
    model.opt.timestep = timestep


@dataclass(frozen=True)
class ModelParam:
    """A task parameter that lives in the model: the model field it sets (which a per-env
    randomization must then leave alone) and how it sets it (validating the value)."""

    field: str
    apply: Callable[[mujoco.MjModel, float], None]


TIMESTEP = ModelParam("opt.timestep", set_timestep)


def set_eulerdamp(model: mujoco.MjModel, eulerdamp: float) -> None:
    """A task's ``eulerdamp`` parameter (0 or 1): the Euler integrator's implicit joint damping,
    model.opt.disableflags's mjDSBL_EULERDAMP bit cleared (1) or set (0)."""
    if eulerdamp not in (0, 1):
        raise ValueError(f"eulerdamp: expected 0 or 1, got {eulerdamp!r}")
    bit = int(mujoco.mjtDisableBit.mjDSBL_EULERDAMP)
    flags = int(model.opt.disableflags)
    model.opt.disableflags = flags & ~bit if eulerdamp else flags | bit


EULERDAMP = ModelParam("opt.disableflags", set_eulerdamp)

INTEGRATORS = {0: "Euler", 1: "RK4", 2: "implicit", 3: "implicitfast"}  # mjtIntegrator


def set_integrator(model: mujoco.MjModel, integrator: float) -> None:
    """A task's ``integrator`` parameter: model.opt.integrator, an mjtIntegrator value."""
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator: expected one of {INTEGRATORS} (mjtIntegrator), got "
                         f"{integrator!r}")
    model.opt.integrator = int(integrator)


def set_solver_iterations(model: mujoco.MjModel, iterations: float) -> None:
    """A task's ``solver_iterations`` parameter: model.opt.iterations, the constraint solver's
    iteration cap."""
    if not (isinstance(iterations, (int, float)) and float(iterations).is_integer()
            and 1 <= iterations <= 1000):
        raise ValueError(f"solver_iterations: expected a whole number in [1, 1000], got "
                         f"{iterations!r}")
    model.opt.iterations = int(iterations)


INTEGRATOR = ModelParam("opt.integrator", set_integrator)
SOLVER_ITERATIONS = ModelParam("opt.iterations", set_solver_iterations)
G1_MODEL_PARAMS = {"timestep": TIMESTEP, "eulerdamp": EULERDAMP, "integrator": INTEGRATOR,
                   "solver_iterations": SOLVER_ITERATIONS}


@dataclass(frozen=True)
class TaskInfo:
    """A registered task: its model's XML, its numpy twin (if any), and its model-level
    parameters.

    ``model_params``: task parameters that live in the model, not in the task: {name:
    ModelParam}. A C++ task gets a const mjModel, so :meth:`load_model` applies them (the given
    value, else the C++ table's default) before the pool is built, and the task checks that the
    model carries them (g1-walk-flat's ``timestep``: model.opt.timestep).

    ``evaluation``: the evaluator's hooks for the task (:mod:`.evaluation`: parameters switched
    off, series, metrics, plot panels); None: the generic ones.

    ``numpy_task``: the twin's factory, taking the C++ task's parameters (``G1WalkFlat(**params)``:
    the export asks it for the task's :class:`~.deployment.Deployment`).
    """

    name: str
    xml: Callable[[], Path]
    numpy_task: Callable[..., NumpyTask] | None = None
    model_params: Mapping[str, ModelParam] = field(default_factory=dict)
    evaluation: TaskEvaluation | None = None
    # the C++ task's arrays from the env's task_data (g1-motion-tracking's clip library):
    # (model, params, task_data) -> {name: array}; None: the task reads none
    arrays: Callable[[mujoco.MjModel, Mapping[str, float], Mapping[str, Any]],
                     dict[str, np.ndarray]] | None = None

    def task_arrays(self, model: mujoco.MjModel, params: Mapping[str, float],
                    task_data: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
        """The arrays the C++ task reads, flattened; task_data refused for a task without."""
        if self.arrays is None:
            if task_data:
                raise ValueError(f"task_data: task {self.name!r} takes none, got "
                                 f"{sorted(task_data)}")
            return {}
        if task_data is not None and not isinstance(task_data, Mapping):
            raise TypeError(f"task_data: expected a mapping, got {type(task_data).__name__}")
        arrays = self.arrays(model, params, dict(task_data or {}))
        return {k: np.ascontiguousarray(v, np.float64).ravel() for k, v in arrays.items()}

    def load_model(self, params: Mapping[str, float] | None = None) -> mujoco.MjModel:
        """The task's model with its model-level parameters applied (params over the defaults;
        the other entries of params are the task's and ignored here)."""
        model = compile_without_settotalmass(self.xml())
        if self.model_params:
            values = {**_core.task_defaults(self.name), **(params or {})}
            for key, param in self.model_params.items():
                param.apply(model, float(values[key]))
        return model


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


def _g1_tracking_numpy(**params: float) -> NumpyTask:
    from lightning_unilab.envs.tasks.g1_tracking import G1MotionTracking

    return G1MotionTracking(**params)


def _g1_tracking_arrays(model: mujoco.MjModel, params: Mapping[str, float],
                        task_data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    from lightning_unilab.envs.tasks.g1_tracking import library_arrays

    return library_arrays(model, params, task_data)


def _g1_numpy(**params: float) -> NumpyTask:
    from lightning_unilab.envs.tasks.g1_walk import G1WalkFlat

    return G1WalkFlat(**params)


_TASKS: dict[str, TaskInfo] = {
    "HalfCheetah-v5": TaskInfo("HalfCheetah-v5", lambda: gym_xml("half_cheetah.xml")),
    "Ant-v5": TaskInfo("Ant-v5", lambda: gym_xml("ant.xml")),
    "Hopper-v5": TaskInfo("Hopper-v5", lambda: gym_xml("hopper.xml")),
    "Walker2d-v5": TaskInfo("Walker2d-v5", lambda: gym_xml("walker2d_v5.xml")),
    "Humanoid-v5": TaskInfo("Humanoid-v5", lambda: gym_xml("humanoid.xml")),
    "InvertedPendulum-v5": TaskInfo("InvertedPendulum-v5",
                                    lambda: gym_xml("inverted_pendulum.xml")),
    "g1-walk-flat": TaskInfo("g1-walk-flat", g1_xml, _g1_numpy,
                             model_params=G1_MODEL_PARAMS, evaluation=G1_WALK_EVALUATION),
    "g1-motion-tracking": TaskInfo("g1-motion-tracking", g1_xml, _g1_tracking_numpy,
                                   model_params=G1_MODEL_PARAMS,
                                   arrays=_g1_tracking_arrays,
                                   evaluation=G1_TRACKING_EVALUATION),
}


def model_param_fields(name: str) -> dict[str, str]:
    """{model field: task parameter} of the registered task called name ({} if none or not
    registered): fields that a per-env randomization may not change under the task."""
    info = _TASKS.get(name)
    return {p.field: key for key, p in info.model_params.items()} if info else {}


def task_names() -> list[str]:
    """Every task name that ``get`` accepts."""
    return sorted(_TASKS)


def pin_model_params(task: Any, task_kwargs: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``task_kwargs`` with a registered task's model-level parameters (g1-walk-flat's timestep,
    eulerdamp, integrator, solver_iterations) made explicit at today's defaults where not given:
    saved in a checkpoint, they name the physics it trained on, whatever the defaults become
    later. Other tasks: unchanged."""
    info = _TASKS.get(task) if isinstance(task, str) else None
    if info is None or not info.model_params:
        return None if task_kwargs is None else dict(task_kwargs)
    kwargs = dict(task_kwargs or {})
    params = dict(kwargs.get("params") or {})
    defaults = _core.task_defaults(task)
    for key in info.model_params:
        params.setdefault(key, defaults[key])
    kwargs["params"] = params
    return kwargs


def get(name: str) -> TaskInfo:
    """The task called name; an unknown name raises ValueError listing the close matches."""
    if name not in _TASKS:
        close = difflib.get_close_matches(str(name), list(_TASKS), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown task {name!r}{hint} (known: {', '.join(task_names())})")
    return _TASKS[name]


def load_model(name: str, params: Mapping[str, float] | None = None) -> mujoco.MjModel:
    """The model of the task called name, its model-level params applied (TaskInfo)."""
    return get(name).load_model(params)


def cpp_task_names() -> list[str]:
    return list(_core.task_names())
