"""How a task plugs into the evaluator (:mod:`lightning_unilab.evaluate`), which names no task.

A task hands the evaluator a :class:`TaskEvaluation`: a registered task through
``TaskInfo.evaluation``, a task class through its class attribute ``NumpyTask.evaluation``. It
says which parameters the evaluation switches off (training-only ones: pushes, a command mix),
which per-step series the episode records and plots, which metrics ``episode.json`` holds under
``tracking``, and the plot's panels. Series come from the task's named per-step ``info`` terms
(``info_names``: what a C++ task exports), never from slices of its observation, so that a
recipe's parameters (a tracking sigma, a weight) reach the evaluation as they reach training.

A task without one gets the base class: the base height from the physics states, and velocity
tracking from info terms named ``vx``, ``vx_command`` ... when the task reports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import mujoco

    from lightning_unilab.evaluate import Episode

__all__ = ["DEFAULT", "VELOCITY_METRICS", "Panel", "TaskEvaluation", "VelocityTracking",
           "evaluation_of", "root_height", "velocity_tracking"]

VELOCITIES = ("vx", "vy", "yaw_rate")
# what velocity_tracking reports besides per_command (the plot's title and the logs read them)
VELOCITY_METRICS = frozenset({"lin_vel_error_mps", "yaw_rate_error_radps",
                              "standing_lin_vel_error_mps", "standing_yaw_rate_error_radps",
                              "command_changes"})


@dataclass
class Panel:
    """One panel of the evaluation plot, under the reward's: per-step lines, each line's command
    (same name) dashed in its colour."""

    ylabel: str
    lines: dict[str, np.ndarray]
    commands: dict[str, np.ndarray] = field(default_factory=dict)
    title: str = ""
    legend: bool = True


class TaskEvaluation:
    """The evaluator's hooks for one task; this base class is what a task without its own gets.

    Args:
        training_only: ``{parameter: evaluation value}`` switched off for the evaluation unless
            it keeps the training's conditions (``EvaluationRollout(randomize=True)``).
    """

    #: info terms the hooks read: the evaluator refuses a task lacking them before the episode
    info_names: tuple[str, ...] = ()

    def __init__(self, training_only: Mapping[str, float] | None = None) -> None:
        self.training_only = dict(training_only or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(training_only={self.training_only})"

    def evaluation_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the training-only ones it sets put to their evaluation values. Only
        given ones: the defaults are the evaluation's, and a task class's init args stay its."""
        return {**params, **{k: v for k, v in self.training_only.items() if k in params}}

    def series(self, episode: Episode, model: mujoco.MjModel) -> dict[str, np.ndarray]:
        """Per-step series of ``episode`` (its ``terms`` and ``states`` filled in) for the plot
        and ``episode.json``: here the root body's height from the states."""
        if episode.states is None:
            return {}
        return {"base_height": root_height(model, episode.states)}

    def metrics(self, episode: Episode) -> dict[str, Any] | None:
        """``episode.json``'s ``tracking``: velocity tracking from the terms and series named
        ``vx``, ``vx_command`` ... (:func:`velocity_tracking`), None without them."""
        return velocity_tracking({**episode.terms, **episode.series}, episode.dt)

    def set_command(self, env: Any, obs: np.ndarray, command: np.ndarray) -> bool:
        """Give every env of ``env`` (a ``TaskVectorEnv``) the velocity command ``command``
        ((num_envs, 3): forward, lateral, yaw rate) now, as if the task had drawn it: in its
        memory and in ``obs``, the observation the policy acts on next. False: the task has no
        such command (here)."""
        return False

    def ghost(self, episode: Episode, env: Any) -> np.ndarray | None:
        """A reference to draw translucent in the GIF: (len(episode.states), nq) qpos rows,
        from the episode and its still open env (``TaskVectorEnv``); None: none (here)."""
        return None

    def panels(self, episode: Episode) -> list[Panel]:
        """The plot's panels under the reward's: base height, velocity against command (the
        series ``vx`` ..., else a term ``X`` beside a term ``X_command``, else ``x_velocity``),
        and the reward terms (``reward_*`` terms, ``term_*`` series)."""
        s, terms, n = episode.series, episode.terms, episode.length
        height = s.get("base_height", np.full(n, np.nan))[-n:] if n else np.zeros(0)
        out = [Panel("base height (m)", {"base height": height}, legend=False)]
        ylabel = "velocity"
        lines = {k: s[k] for k in VELOCITIES if k in s}
        commands = {k: s[f"{k}_command"] for k in lines if f"{k}_command" in s}
        if not lines:  # a task's own commands: X beside X_command
            lines = {k: v for k, v in terms.items() if f"{k}_command" in terms}
            commands = {k: terms[f"{k}_command"] for k in lines}
            ylabel = "against command" if lines else ylabel
        if not lines and "x_velocity" in terms:
            lines = {"x_velocity": terms["x_velocity"]}
        if lines:
            tracking = self.metrics(episode)
            title = ""
            if tracking is not None and VELOCITY_METRICS <= set(tracking):
                title = (f"mean tracking error: linear {tracking['lin_vel_error_mps']:.2f} m/s, "
                         f"yaw {tracking['yaw_rate_error_radps']:.2f} rad/s (standing still: "
                         f"{tracking['standing_lin_vel_error_mps']:.2f}, "
                         f"{tracking['standing_yaw_rate_error_radps']:.2f}); "
                         f"{tracking['command_changes']} command changes")
            out.append(Panel(ylabel, lines, commands, title))
        named = {k[5:]: v for k, v in s.items() if k.startswith("term_")}
        named.update({k: v for k, v in terms.items() if k.startswith("reward_")})
        if named:
            out.append(Panel("reward terms", named))
        return out


class VelocityTracking(TaskEvaluation):
    """A task following a velocity command that reports, per step in its info, its base height,
    its velocities and their commands (``info_names``; values after the step's substeps, the
    command the step followed): the series are those terms, ``tracking`` is computed from them.
    """

    info_names = ("base_height", "vx", "vx_command", "vy", "vy_command", "yaw_rate",
                  "yaw_rate_command")

    def series(self, episode: Episode, model: mujoco.MjModel) -> dict[str, np.ndarray]:
        return {k: episode.terms[k] for k in self.info_names}


DEFAULT = TaskEvaluation()


def evaluation_of(task: Any) -> TaskEvaluation:
    """The hooks of ``task`` (a task name, a NumpyTask or its class, an import path,
    ``{class_path, init_args}``): ``TaskInfo.evaluation`` or ``NumpyTask.evaluation``, else
    :data:`DEFAULT`. A task class is imported (ImportError as ``TaskRef.load`` raises it)."""
    from lightning_unilab.envs import tasks
    from lightning_unilab.envs.tasks.base import NumpyTask
    from lightning_unilab.envs.tasks.ref import task_label, task_ref

    if isinstance(task, NumpyTask):
        found = task.evaluation
    else:
        ref = task_ref(task)
        found = tasks.get(ref).evaluation if isinstance(ref, str) else ref.load().evaluation
    if found is None:
        return DEFAULT
    if not isinstance(found, TaskEvaluation):
        raise TypeError(f"task {task_label(task)}: evaluation: expected a TaskEvaluation "
                        f"(lightning_unilab.envs.tasks.evaluation), got {type(found).__name__}")
    return found


def root_height(model: mujoco.MjModel, states: np.ndarray) -> np.ndarray:
    """World z of body 1 (the root of gymnasium's and the G1 models) for each
    mjSTATE_INTEGRATION row."""
    import mujoco

    data = mujoco.MjData(model)
    out = np.empty(len(states))
    for i, row in enumerate(states):
        mujoco.mj_setState(model, data, row, mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_kinematics(model, data)
        out[i] = data.xpos[1 if model.nbody > 1 else 0, 2]
    return out


def velocity_tracking(series: Mapping[str, np.ndarray], dt: float) -> dict[str, Any] | None:
    """Mean velocity-tracking errors against the command, how many times the command changed,
    the errors under each command (which commands a policy follows and which not), and the
    errors of standing still (the reference a policy has to beat); None unless ``series`` holds
    ``vx``, ``vy``, ``yaw_rate`` and their ``_command``s."""
    s = series
    if not {*VELOCITIES, *(f"{k}_command" for k in VELOCITIES)} <= set(s):
        return None
    lin = np.hypot(s["vx"] - s["vx_command"], s["vy"] - s["vy_command"])
    yaw = np.abs(s["yaw_rate"] - s["yaw_rate_command"])
    cmd = np.stack([s["vx_command"], s["vy_command"], s["yaw_rate_command"]], 1)
    changed = np.any(np.diff(cmd, axis=0) != 0, axis=1)
    starts = [0, *(np.flatnonzero(changed) + 1).tolist()]
    per_command = [
        {"start_s": a * dt, "steps": b - a, "command": cmd[a].tolist(),
         "lin_vel_error_mps": float(lin[a:b].mean()),
         "yaw_rate_error_radps": float(yaw[a:b].mean())}
        for a, b in zip(starts, [*starts[1:], len(cmd)], strict=True)]
    # a robot that never moves scores the commands' own sizes: the errors' reference
    still_lin = np.hypot(s["vx_command"], s["vy_command"])
    still_yaw = np.abs(s["yaw_rate_command"])
    return {"lin_vel_error_mps": float(lin.mean()), "yaw_rate_error_radps": float(yaw.mean()),
            "command_changes": len(starts) - 1,
            "standing_lin_vel_error_mps": float(still_lin.mean()),
            "standing_yaw_rate_error_radps": float(still_yaw.mean()),
            "per_command": per_command}
