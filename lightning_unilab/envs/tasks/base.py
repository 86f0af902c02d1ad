"""The task interface shared by C++ tasks and numpy tasks.

A task turns physics into an RL environment: it samples start states, maps actions to controls,
computes rewards, terminations and observations, and resamples commands. The C++ tasks
(cpp/src/tasks/) run fused inside the pool's worker threads; a :class:`NumpyTask` runs the same
steps in numpy, vectorized over envs, between pool calls: slower, but quick to write, and the test
reference of the C++ tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import mujoco
import numpy as np

from lightning_unilab.envs.tasks.rng import EnvRng

if TYPE_CHECKING:
    from lightning_unilab.envs.pool import BatchEnvPool
    from lightning_unilab.envs.tasks.deployment import Deployment
    from lightning_unilab.envs.tasks.evaluation import TaskEvaluation


@dataclass(frozen=True)
class TaskSpec:
    """Sizes and limits of a task (the same fields as ``omnilab::TaskSpec``)."""

    obs_size: int
    action_size: int
    frame_skip: int
    max_episode_steps: int
    action_low: np.ndarray
    action_high: np.ndarray
    critic_size: int = 0
    memory_size: int = 0
    resample_steps: int = 0
    # a substep leaving some |qvel| above it is rolled back and its episode truncated (status
    # STATUS_TOO_FAST), as after a MuJoCo warning; 0: no bound
    max_speed: float = 0.0
    # named per-step diagnostics (reward terms ...); the first reset_info_size also at reset
    info_names: tuple[str, ...] = ()
    reset_info_size: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSpec:
        fixed = {k: np.asarray(v, np.float64) if k.startswith("action_l") or
                 k.startswith("action_h") else v for k, v in d.items()}
        if "info_names" in fixed:
            fixed["info_names"] = tuple(fixed["info_names"])
        return cls(**fixed)


@dataclass
class Transition:
    """Per-env results of one step, for the envs that stepped.

    ``info``: the step's named terms (``spec.info_names``: reward terms, commands ...), one row
    per stepped env: ``{name: values}`` or a (len(ids), len(info_names)) array. They reach
    ``info`` of the env, the learner's ``step_info/<name>`` logs and the evaluation plot.
    """

    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    info: Mapping[str, np.ndarray] | np.ndarray | None = None


class NumpyTask(ABC):
    """A task written in numpy; every method works on the rows ``ids`` of all envs at once.

    ``memory`` is the (num_envs, spec.memory_size) float64 array the task keeps between steps.
    The pool holds the physics; ``outputs`` names the derived mjData arrays the task reads (they
    describe the state after the last substep's forward pass, as in C++). Named per-step terms
    (``spec.info_names``) come back in ``Transition.info`` from :meth:`evaluate`.

    A task class trains through the data module, recipes and ``evaluate`` when it is importable
    (defined at the top level of a module) and its constructor takes plain data:
    :mod:`lightning_unilab.envs.tasks.ref`.
    """

    name: str = "numpy-task"
    outputs: dict[str, Any] = {}
    # the forward stages the pool computes at the state after the substeps, which ``outputs``
    # then describe ("vel": positions and velocities of the final state); "none": those of the
    # last substep's own forward pass, as the C++ tasks read them (free)
    stage: str = "none"
    # task-level state shared by all envs (C++'s Task::shared): set in the constructor by a task
    # that keeps some, changed by :meth:`update` only, saved with the env's state
    shared: np.ndarray = np.zeros(0)

    @abstractmethod
    def model(self) -> mujoco.MjModel:
        """The model the task runs on."""

    @property
    @abstractmethod
    def spec(self) -> TaskSpec: ...

    @abstractmethod
    def reset(self, pool: BatchEnvPool, ids: np.ndarray, rng: EnvRng,
              memory: np.ndarray) -> None:
        """Write start states into the pool's state views (the rows are at model defaults)."""

    def start(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray) -> None:  # noqa: B027
        """Prime memory at a start state (forward pass done)."""

    def resample(self, ids: np.ndarray, rng: EnvRng, memory: np.ndarray) -> None:  # noqa: B027
        """New commands into memory."""

    @abstractmethod
    def act(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
            memory: np.ndarray) -> None:
        """Map finite actions (rows of ids) to pool.ctrl."""

    @abstractmethod
    def evaluate(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
                 memory: np.ndarray) -> Transition:
        """Reward and termination after the substeps."""

    @abstractmethod
    def observe(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray,
                obs: np.ndarray, critic: np.ndarray | None) -> None:
        """Write observation rows of ids into obs (and critic)."""

    def update(self, memory: np.ndarray) -> None:  # noqa: B027
        """After every step of all envs: fold what they left in memory into :attr:`shared`."""

    # the evaluator's hooks (lightning_unilab.envs.tasks.evaluation): what the evaluation switches
    # off, records, reports and plots; None: the generic ones
    evaluation: ClassVar[TaskEvaluation | None] = None

    def deployment(self) -> Deployment | None:
        """The observation layout, action mapping and control period a robot program needs
        (:mod:`lightning_unilab.envs.tasks.deployment`; the export's JSON); None: not given."""
        return None
