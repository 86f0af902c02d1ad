"""What a program on the robot needs, besides the policy network, to run a policy of a task.

A trained actor maps an observation vector to an action vector; a deploy program (on a robot,
or a plain MuJoCo loop checking the export) has to build that vector from its own sensors in the
task's order and turn the actions into joint targets as the task does. The task knows both, so
it hands them out as plain data (:meth:`NumpyTask.deployment`, which a C++ task's numpy twin
implements): ``python -m lightning_unilab.export`` writes them into the JSON beside the exported
network. A task without one exports its network with the layout left out (``null``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Deployment", "ObservationTerm", "task_deployment"]


@dataclass(frozen=True)
class ObservationTerm:
    """``size`` consecutive entries of the observation, named ``name``; ``meaning`` says in words
    what a deploy program computes there, ``source`` the names and constants it computes them
    from (a sensor's name, a clock's frequency ...), as plain JSON data."""

    name: str
    size: int
    meaning: str
    source: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Deployment:
    """A task's interface to a robot program, in the task's own units and order.

    ``ctrl[i] = default_joint_pos[i] + action_scale[i] * action[i]`` for the actuator of joint
    ``joint_names[i]``, held for ``control_dt`` seconds (``substeps`` physics steps).
    ``command``: the command components the observation carries, each with the task parameters
    that bound its draw (pinning both to one value fixes the command). ``fall``: the task's own
    fall criterion as its parameters; ``no_fall``: the values of those parameters that switch
    the termination off (a check that compares past a fall).
    """

    observation: tuple[ObservationTerm, ...]
    joint_names: tuple[str, ...]
    action_scale: np.ndarray
    default_joint_pos: np.ndarray
    control_dt: float
    substeps: int
    keyframe: str | None = None  # the model's keyframe a deploy starts from, if any
    command: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    fall: Mapping[str, float] = field(default_factory=dict)
    no_fall: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        for name in ("action_scale", "default_joint_pos"):
            value = np.asarray(getattr(self, name), np.float64)
            if value.shape != (n,):
                raise ValueError(f"{name}: expected one value per joint ({n}), got shape "
                                 f"{value.shape}")
            object.__setattr__(self, name, value)

    @property
    def obs_size(self) -> int:
        return sum(t.size for t in self.observation)

    def layout(self) -> list[dict[str, Any]]:
        """Every observation term with its slice ``[start, stop)``, in order, as JSON data."""
        rows, start = [], 0
        for term in self.observation:
            rows.append({"name": term.name, "start": start, "stop": start + term.size,
                         "meaning": term.meaning, **dict(term.source)})
            start += term.size
        return rows

    def command_params(self, command: Mapping[str, float]) -> dict[str, float]:
        """Task parameters that fix the command at ``command`` ({component: value}; each
        component of :attr:`command`), both bounds of its draw at the value."""
        unknown = set(command) - set(self.command)
        missing = set(self.command) - set(command)
        if unknown or missing:
            raise ValueError(f"command: expected a value for each of {list(self.command)}, got "
                             f"{dict(command)}")
        return {bound: float(command[name]) for name, bounds in self.command.items()
                for bound in bounds}


def task_deployment(task: Any, params: Mapping[str, float] | None = None) -> Deployment | None:
    """The :class:`Deployment` of ``task`` (a registered name, whose numpy twin answers, or a
    task class in any form ``TaskVectorEnv`` takes) under ``params``; None when the task gives
    none."""
    from lightning_unilab.envs import tasks
    from lightning_unilab.envs.tasks.base import NumpyTask
    from lightning_unilab.envs.tasks.ref import task_ref

    params = dict(params or {})
    if isinstance(task, NumpyTask):
        built = task
    else:
        ref = task_ref(task)
        if isinstance(ref, str):
            twin = tasks.get(ref).numpy_task
            if twin is None:
                return None
            built = twin(**params)
        else:
            built = (ref.with_args(params) if params else ref).build()
    return built.deployment()
