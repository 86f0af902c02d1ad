"""Evaluation rollout at the end of training: a picture of what the policy learned.

    trainer:
      callbacks:
        - class_path: lightning_unilab.evaluate.EvaluationRollout
          init_args: {max_steps: 1000}

After ``fit`` (the collector is stopped by then, so the CPU is free) the callback runs the trained
actor deterministically for one episode of one env of the data module's task and writes, under
``<log_dir>/evaluation/``:

- ``episode.json``: return, length, whether it fell, and the per-step series that are plotted;
- ``episode.png``: reward and return, the task's named reward terms, and for locomotion the base
  height and velocity against the command over the episode (always written: no OpenGL needed);
- ``episode.gif``: the episode from MuJoCo's offscreen renderer, when an OpenGL backend exists.

Rendering needs ``MUJOCO_GL`` chosen before mujoco is imported, which the training process has
already done (usually without a headless backend), so frames are drawn in a fresh interpreter
(``python -c``) trying ``$MUJOCO_GL``, then EGL, then OSMesa; if none works the reason is
recorded in ``episode.json`` and only the plot is written.

``python -m lightning_unilab.evaluate checkpoint CKPT --out DIR`` does the same for a saved
checkpoint: the task, its ``task_kwargs`` and the recipe's evaluation settings (``task_params``,
``max_steps``, ``seed``) come from the checkpoint, so it replays the end-of-training evaluation.
``--task`` is only needed for a checkpoint that does not name its task. A task class is rebuilt
from the class path and init args the checkpoint keeps (its module must be importable here:
installed, or its directory on PYTHONPATH); ``task_params`` go over its init args.

The task owns what is recorded, reported and plotted: its :class:`~lightning_unilab.envs.tasks.
evaluation.TaskEvaluation` (``TaskInfo.evaluation``, ``NumpyTask.evaluation``) gives the
parameters the evaluation switches off, the per-step series (from the task's named info terms),
the ``tracking`` metrics and the plot's panels. Without one: the base height from the states,
the terms named ``reward_*`` in the reward-terms panel, and a term ``X`` with a term
``X_command`` beside it (a user task's commands) against its command.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_omnilab import safe_load
from lightning_omnilab.validate import fail, positive_int
from lightning_unilab.envs.randomization import build_randomization
from lightning_unilab.envs.tasks.evaluation import VELOCITY_METRICS, TaskEvaluation, evaluation_of
from lightning_unilab.envs.tasks.ref import TaskBuildError, task_label

__all__ = ["CheckpointEvaluation", "Episode", "EvaluationRollout", "TaskMismatchError",
           "checkpoint_evaluation", "evaluate_seeds", "evaluation_task_kwargs", "load_checkpoint",
           "plot_episode", "render_episode", "run_episode", "task_physics"]

_BACKENDS = ("egl", "osmesa")


class TaskMismatchError(ValueError):
    """The task asked for is not the one the policy was trained on."""


@dataclass
class Episode:
    """One evaluation episode of one env: per-step series (length T) and the physics states."""

    task: str
    rewards: np.ndarray  # [T]
    terms: dict[str, np.ndarray] = field(default_factory=dict)  # named per-step info terms
    series: dict[str, np.ndarray] = field(default_factory=dict)  # base height, velocities ...
    states: np.ndarray | None = None  # [T+1, state_size] mjSTATE_INTEGRATION rows
    terminated: bool = False
    dt: float = 0.0
    task_ref: dict[str, Any] | None = None  # a task class's {class_path, init_args} (renderer)
    # (len(states), nq) qpos of a reference drawn as a ghost in the GIF (a tracking task's clip)
    ghost: np.ndarray | None = None
    # [T, obs] float32 observations the policy saw and [T, action] actions sent to the task,
    # step by step (not written to episode.json; the export's sim-to-sim check reads them)
    observations: np.ndarray | None = None
    actions: np.ndarray | None = None
    # the task's hooks: series, metrics, plot panels (not written to episode.json)
    evaluation: TaskEvaluation = field(default_factory=TaskEvaluation, repr=False,
                                       compare=False)

    @property
    def length(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def ret(self) -> float:
        return float(self.rewards.sum())

    def tracking(self) -> dict[str, Any] | None:
        """The task's evaluation metrics (``episode.json``'s ``tracking``; its
        ``TaskEvaluation.metrics``): for velocity tracking the mean errors against the command,
        the command changes, the errors under each command and those of standing still."""
        return self.evaluation.metrics(self)

    def summary(self) -> dict[str, Any]:
        return {"task": self.task, "return": self.ret, "length": self.length,
                "duration_s": self.length * self.dt, "terminated": self.terminated,
                "tracking": self.tracking(), "rewards": self.rewards.tolist(),
                "terms": {k: v.tolist() for k, v in self.terms.items()},
                "series": {k: v.tolist() for k, v in self.series.items()}}


def run_episode(policy: torch.nn.Module, task: Any, task_kwargs: Mapping[str, Any] | None = None,
                seed: int = 0, max_steps: int | None = None,
                deterministic: bool = True) -> Episode:
    """Run ``policy`` (an ActorCritic: ``act(obs, deterministic)``) for one episode of one env.

    The episode ends at the first termination or truncation, or after ``max_steps`` steps.
    ``task`` is a task name or a task class in any form TaskVectorEnv takes; ``task_kwargs``
    are TaskVectorEnv keywords (params, randomization ...), as the data module's. The policy
    acts as the collector's actor does: a float32 CPU copy (its normalizer's float64 statistics
    cast too), so that a policy and its checkpoint give the same episode.
    """
    from lightning_unilab.envs.vector_env import TaskVectorEnv

    max_steps = positive_int("max_steps", max_steps, none_ok=True)
    kwargs = dict(task_kwargs or {})
    evaluation = evaluation_of(task)
    env = TaskVectorEnv(task, 1, 1, seed=seed, **kwargs)
    try:
        spec = env.spec
        _check_sizes(policy, task_label(task), spec.obs_size, spec.action_size)
        missing = [n for n in evaluation.info_names if n not in spec.info_names]
        if missing:
            raise ValueError(f"task {task_label(task)!r}: its evaluation reads the info terms "
                             f"{missing}, which the task does not report (spec.info_names: "
                             f"{list(spec.info_names)}); a C++ task built before it reported "
                             "them needs the extension rebuilt")
        limit = spec.max_episode_steps if spec.max_episode_steps > 0 else 1000
        steps = limit if max_steps is None else min(max_steps, limit)
        policy = copy.deepcopy(policy).cpu().float().eval()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # sampled actions, if any, repeat for a seed
            episode = _play(env, policy, seed, steps, deterministic)
        episode.evaluation = evaluation
        episode.series = evaluation.series(episode, env.model)
        episode.ghost = evaluation.ghost(episode, env)
        return episode
    finally:
        env.close()


def _play(env: Any, policy: torch.nn.Module, seed: int, steps: int,
          deterministic: bool) -> Episode:
    spec = env.spec
    obs, _ = env.reset(seed=seed)
    states = [env.pool.state[0].copy()]
    rewards, terms = [], {name: [] for name in spec.info_names}
    seen, sent = [], []
    terminated = False
    for _ in range(steps):
        seen.append(torch.as_tensor(obs, dtype=torch.float32))
        with torch.no_grad():
            action = policy.act(seen[-1], deterministic=deterministic)[0]
        sent.append(action.numpy().astype(np.float64))
        obs, reward, term, trunc, info = env.step(sent[-1])
        rewards.append(float(reward[0]))
        for name in spec.info_names:
            terms[name].append(float(info[name][0]))
        done = bool(term[0] or trunc[0])
        if done:
            terminated = bool(term[0])
            break
        states.append(env.pool.state[0].copy())
    dt = float(env.model.opt.timestep) * spec.frame_skip
    return Episode(task=env.name, rewards=np.asarray(rewards),
                   terms={k: np.asarray(v) for k, v in terms.items()},
                   states=np.stack(states), terminated=terminated, dt=dt,
                   observations=torch.cat(seen).numpy(), actions=np.concatenate(sent),
                   task_ref=env.task_ref.config() if env.task_ref else None)


def task_physics(task: Any, task_kwargs: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """The MuJoCo model an evaluation env of ``task`` runs on (model-level parameters applied)
    and its TaskSpec, from one env built and closed here."""
    from lightning_unilab.envs.vector_env import TaskVectorEnv

    env = TaskVectorEnv(task, 1, 1, **dict(task_kwargs or {}))
    try:
        return env.model, env.spec
    finally:
        env.close()


def _check_sizes(policy: torch.nn.Module, task: str, obs_size: int, action_size: int) -> None:
    """A policy of another task fails here, naming both, not later as a tensor-size error."""
    want = (getattr(policy, "obs_size", obs_size), getattr(policy, "action_size", action_size))
    if want != (obs_size, action_size):
        raise TaskMismatchError(
            f"task: the policy expects observations of size {want[0]} and actions of size "
            f"{want[1]}, but task {task!r} has {obs_size} and {action_size}; evaluate it on "
            "the task it was trained on")


def evaluation_task_kwargs(task_kwargs: Mapping[str, Any] | None, randomize: bool,
                           task_params: Mapping[str, float] | None,
                           task: Any = None) -> dict[str, Any]:
    """The training env's keywords for the evaluation env: randomization dropped and the
    task's training-only parameters (its ``TaskEvaluation.evaluation_params``, e.g. pushes and a
    command mix off) set to their evaluation values unless ``randomize``; ``task_params`` over
    the training ``params``. ``task`` (any form :func:`run_episode` takes) names whose
    training-only parameters these are; None: no task's."""
    kwargs = dict(task_kwargs or {})
    if not randomize:
        kwargs.pop("randomization", None)
        params = dict(kwargs.get("params") or {})
        if task is not None:
            evaluated = evaluation_of(task).evaluation_params(params)
            if evaluated != params:
                kwargs["params"] = evaluated
    if task_params:
        kwargs["params"] = {**dict(kwargs.get("params") or {}), **task_params}
    return kwargs


def plot_episode(episode: Episode, path: str | os.PathLike) -> Path:
    """Reward and return, then the task's panels (``TaskEvaluation.panels``: base height,
    velocity against command, named reward terms ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(1, episode.length + 1) * episode.dt
    panels = episode.evaluation.panels(episode)
    fig, axes = plt.subplots(1 + len(panels), 1, figsize=(8, 2.2 * (1 + len(panels))),
                             sharex=True)
    axes = np.atleast_1d(axes)
    ax = axes[0]
    ax.plot(t, episode.rewards, label="reward / step")
    ax2 = ax.twinx()
    ax2.plot(t, np.cumsum(episode.rewards), color="k", lw=1)
    ax.set_ylabel("reward / step")
    ax2.set_ylabel("return so far (black)")
    ax.set_title(f"{episode.task}: return {episode.ret:.1f} over {episode.length} steps "
                 f"({episode.length * episode.dt:.1f} s){', fell' if episode.terminated else ''}")
    for ax, panel in zip(axes[1:], panels, strict=True):
        for i, (key, values) in enumerate(panel.lines.items()):
            ax.plot(t[:len(values)], values, color=f"C{i}", label=key)
            command = panel.commands.get(key)
            if command is not None:
                ax.plot(t[:len(command)], command, color=f"C{i}", ls="--",
                        label=f"{key} command")
        ax.set_ylabel(panel.ylabel)
        if panel.legend:
            ax.legend(fontsize=7, ncol=3, loc="upper right")
        if panel.title:
            ax.set_title(panel.title, fontsize=8)
    axes[-1].set_xlabel("time (s)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


_RENDER = """
import json, sys, numpy as np
from lightning_unilab.envs.render import EnvRenderer, write_gif
from lightning_unilab.envs.vector_env import TaskVectorEnv
states, task, out, width, height, fps, ghost = sys.argv[1:8]
env = TaskVectorEnv(json.loads(task) if task.startswith("{") else task, 1, 1)
renderer = EnvRenderer(env.model, int(width), int(height))
frames = renderer.render(np.load(states), ghost=np.load(ghost) if ghost else None)
renderer.close(); env.close()
write_gif(frames, out, fps=float(fps))
print("OK", len(frames))
"""


def render_episode(episode: Episode, path: str | os.PathLike, max_frames: int = 100,
                   size: tuple[int, int] = (240, 180),
                   timeout: float | None = None) -> str | None:
    """Write the episode as a GIF (every k-th state, at most ``max_frames``); returns None on
    success or the reason it could not render (no OpenGL backend, or one too slow).

    ``timeout`` bounds each backend's try; by default 120 s plus 10 s a frame, because Mesa's
    software renderer draws a humanoid's frame in 1-3 s on a busy CPU, and a fixed bound
    reported a working backend as missing."""
    if episode.states is None or len(episode.states) == 0:
        return "no states recorded"
    stride = max(1, -(-len(episode.states) // max_frames))
    states = episode.states[::stride]
    if timeout is None:
        timeout = 120.0 + 10.0 * len(states)
    fps = max(1.0, 1.0 / (episode.dt * stride)) if episode.dt > 0 else 30.0
    tried = []
    task = json.dumps(episode.task_ref) if episode.task_ref else episode.task
    # a task class is imported by the renderer as by the collector: from this process's path
    pythonpath = os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p)
    backends = [os.environ["MUJOCO_GL"]] if os.environ.get("MUJOCO_GL") else []
    backends += [b for b in _BACKENDS if b not in backends]
    with tempfile.TemporaryDirectory() as tmp:
        npy = os.path.join(tmp, "states.npy")
        np.save(npy, states)
        ghost = ""
        if episode.ghost is not None:
            ghost = os.path.join(tmp, "ghost.npy")
            np.save(ghost, episode.ghost[::stride])
        for backend in backends:
            env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
            if episode.task_ref:
                env["PYTHONPATH"] = pythonpath
            try:
                run = subprocess.run(
                    [sys.executable, "-c", _RENDER, npy, task, str(path), str(size[0]),
                     str(size[1]), f"{fps:.4f}", ghost], env=env, capture_output=True, text=True,
                    timeout=timeout)
            except subprocess.TimeoutExpired:
                tried.append(f"{backend}: {len(states)} frames not drawn in {timeout:.0f} s")
                continue
            if run.returncode == 0 and run.stdout.strip().startswith("OK"):
                return None
            tail = (run.stderr.strip().splitlines() or ["?"])[-1]
            tried.append(f"{backend}: {tail[:200]}")
    return "; ".join(tried)


def evaluate_policy(policy: torch.nn.Module, task: Any, out_dir: str | os.PathLike,
                    task_kwargs: Mapping[str, Any] | None = None, seed: int = 0,
                    max_steps: int | None = None, video: bool = True, max_frames: int = 100,
                    size: tuple[int, int] = (240, 180),
                    deterministic: bool = True) -> dict[str, Any]:
    """Run one episode and write episode.json, episode.png and (with OpenGL) episode.gif;
    ``task`` as :func:`run_episode` takes it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    episode = run_episode(policy, task, task_kwargs, seed=seed, max_steps=max_steps,
                          deterministic=deterministic)
    summary = episode.summary()
    summary["deterministic"] = deterministic
    summary["plot"] = str(plot_episode(episode, out / "episode.png"))
    summary["video"] = None
    if video:
        reason = render_episode(episode, out / "episode.gif", max_frames, size)
        if reason is None:
            summary["video"] = str(out / "episode.gif")
        else:
            summary["video_skipped"] = f"no GIF rendered ({reason})"
    _write_json(out / "episode.json", summary)
    return summary


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def evaluate_seeds(policy: torch.nn.Module, task: Any, out_dir: str | os.PathLike,
                   seeds: Sequence[int], task_kwargs: Mapping[str, Any] | None = None,
                   max_steps: int | None = None, deterministic: bool = True) -> dict[str, Any]:
    """One episode per start-state seed, summed up in ``episodes.json``: how often the policy
    falls and how far its tracking errors spread, which a single episode cannot tell."""
    if not seeds:
        raise ValueError("seeds: expected at least one start-state seed, got none")
    rows = []
    for seed in seeds:
        episode = run_episode(policy, task, task_kwargs, seed=int(seed), max_steps=max_steps,
                              deterministic=deterministic)
        rows.append({"seed": int(seed), "return": episode.ret, "length": episode.length,
                     "terminated": episode.terminated, "tracking": episode.tracking()})
    summary: dict[str, Any] = {
        "task": task_label(task), "deterministic": deterministic, "episodes": len(rows),
        "terminated": sum(r["terminated"] for r in rows),
        "return_median": float(np.median([r["return"] for r in rows])),
        "length_median": float(np.median([r["length"] for r in rows]))}
    if all(r["tracking"] for r in rows):  # each float metric of the task's, spread over seeds
        for key, value in rows[0]["tracking"].items():
            if isinstance(value, float) and all(isinstance(r["tracking"].get(key), float)
                                                for r in rows):
                errors = [r["tracking"][key] for r in rows]
                summary[key] = {"median": float(np.median(errors)),
                                "max": float(np.max(errors))}
    summary["rows"] = rows
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "episodes.json", summary)
    return summary


def _last_logged_step(trainer: pl.Trainer) -> int:
    """The logger step of the last training batch, where the training curves end: Lightning
    logs batch k at step k (not at ``global_step``, which counts optimizer steps, epochs x
    minibatches per APPO update); the batch count survives a resume."""
    return max(int(trainer.fit_loop.epoch_loop.batch_progress.total.completed) - 1, 0)


class EvaluationRollout(pl.Callback):
    """After fit: one deterministic episode of the trained policy, plotted and (GL) rendered.

    Args:
        out_dir: where to write; default ``<trainer.log_dir>/evaluation``.
        max_steps: episode cap (default the task's time limit).
        seed: start-state seed of the evaluation env.
        video: try to write the GIF (needs an OpenGL backend; the plot is always written).
        max_frames: GIF frames at the most (every k-th step is drawn).
        size: the GIF's (width, height).
        randomize: keep the data module's domain randomization and the task's training-only
            parameters (its ``TaskEvaluation.training_only``: pushes, a command mix) in the
            evaluation env.
        task_params: task parameters for the evaluation env only, over the training ones, e.g.
            ``{resample_steps: 250}`` for a new command every 5 s.
    """

    def __init__(self, out_dir: str | None = None, max_steps: int | None = None, seed: int = 0,
                 video: bool = True, max_frames: int = 100, size: Sequence[int] = (240, 180),
                 randomize: bool = False,
                 task_params: Mapping[str, float] | None = None) -> None:
        max_steps = positive_int("max_steps", max_steps, none_ok=True)
        if len(size) != 2:
            raise ValueError(f"size: expected (width, height), got {size!r}")
        self.out_dir, self.max_steps, self.seed = out_dir, max_steps, seed
        self.video, self.max_frames, self.size = video, max_frames, (int(size[0]), int(size[1]))
        self.randomize = randomize
        if task_params is not None and not isinstance(task_params, Mapping):
            raise TypeError(f"task_params: expected a mapping of task parameters, got "
                            f"{type(task_params).__name__}")
        self.task_params = dict(task_params or {})
        self.summary: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The evaluation's settings, saved in checkpoints so that ``evaluate checkpoint``
        replays this evaluation (nothing is restored on resume: the recipe's settings hold)."""
        return {"max_steps": self.max_steps, "seed": self.seed, "randomize": self.randomize,
                "task_params": dict(self.task_params)}

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # under DDP trainer.log_dir is a broadcast from rank 0: every rank must ask
        log_dir = None if self.out_dir else trainer.log_dir
        if trainer.global_rank != 0:
            return
        dm = trainer.datamodule
        config = getattr(dm, "config", None)
        policy = getattr(pl_module, "policy", None)
        if config is None or policy is None:
            raise RuntimeError("EvaluationRollout: needs a RolloutDataModule (its task) and a "
                               "module with a `policy` (an ActorCritic)")
        kwargs = evaluation_task_kwargs(config.task_kwargs, self.randomize, self.task_params,
                                        task=config.task)
        out = Path(self.out_dir) if self.out_dir else Path(log_dir or
                                                           trainer.default_root_dir) / "evaluation"
        self.summary = evaluate_policy(policy, config.task, out, kwargs, self.seed,
                                       self.max_steps, self.video, self.max_frames, self.size)
        msg = (f"evaluation: return {self.summary['return']:.1f} over {self.summary['length']} "
               f"steps; plot {self.summary['plot']}")
        tracking = self.summary.get("tracking")
        velocity = bool(tracking) and VELOCITY_METRICS <= set(tracking)
        if velocity:
            msg += (f"; tracking error {tracking['lin_vel_error_mps']:.2f} m/s, "
                    f"{tracking['yaw_rate_error_radps']:.2f} rad/s over "
                    f"{tracking['command_changes']} command changes (standing still: "
                    f"{tracking['standing_lin_vel_error_mps']:.2f} m/s, "
                    f"{tracking['standing_yaw_rate_error_radps']:.2f} rad/s)")
        if self.summary["video"]:
            msg += f", video {self.summary['video']}"
        metrics = {"eval/return": self.summary["return"],
                   "eval/episode_length": float(self.summary["length"])}
        if velocity:
            metrics["eval/lin_vel_error"] = tracking["lin_vel_error_mps"]
            metrics["eval/yaw_rate_error"] = tracking["yaw_rate_error_radps"]
        step = _last_logged_step(trainer)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
            logger.finalize("success")  # fit already closed the loggers: flush these too
        print(msg, flush=True)


@dataclass
class CheckpointEvaluation:
    """What a checkpoint says about evaluating its policy: the task, the evaluation env's
    keywords and the episode (as the recipe's EvaluationRollout had them)."""

    task: str | dict[str, Any]  # a task name, or a task class's {class_path, init_args}
    task_kwargs: dict[str, Any]
    max_steps: int | None
    seed: int


def checkpoint_evaluation(checkpoint: Mapping[str, Any], task: str | None = None,
                          params: Mapping[str, float] | None = None,
                          max_steps: int | None = None,
                          seed: int | None = None,
                          randomize: bool | None = None) -> CheckpointEvaluation:
    """The task and task_kwargs the checkpoint was trained on (the RolloutDataModule's saved
    hyperparameters), with the end-of-training evaluation's settings (EvaluationRollout's
    state), so that a checkpoint is evaluated as training evaluated it. Explicit arguments win,
    except a ``task`` that disagrees with the checkpoint's, which is refused. ``randomize``:
    keep the training's randomization and training-only parameters (start noise, pushes)."""
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    saved = data.get("task")
    if saved is not None and task is not None and task_label(task) != task_label(saved):
        saved_label = task_label(saved)
        raise TaskMismatchError(f"--task: the checkpoint was trained on {saved_label!r}, got "
                                f"{task_label(task)!r}; drop --task to evaluate on "
                                f"{saved_label!r}")
    if saved is None and task is None:
        raise TaskMismatchError("--task: the checkpoint does not name its task (no "
                                "RolloutDataModule hyperparameters in it); pass --task")
    settings = (checkpoint.get("callbacks") or {}).get(EvaluationRollout.__qualname__) or {}
    kwargs = dict(data.get("task_kwargs") or {})
    if data.get("randomization") is not None:
        kwargs["randomization"] = data["randomization"]
    task_params = {**(settings.get("task_params") or {}), **(params or {})}
    chosen = saved if saved is not None else task
    if randomize is None:
        randomize = bool(settings.get("randomize", False))
    kwargs = evaluation_task_kwargs(kwargs, randomize, task_params, task=chosen)
    if "randomization" in kwargs:  # a user's randomization is kept as {class_path, init_args}
        kwargs["randomization"] = build_randomization(kwargs["randomization"])
    return CheckpointEvaluation(
        task=chosen, task_kwargs=kwargs,
        max_steps=max_steps if max_steps is not None else settings.get("max_steps"),
        seed=seed if seed is not None else int(settings.get("seed", 0)))


def load_checkpoint(path: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """A ``lightning_unilab.train`` checkpoint, weights only: its APPOModule (on the CPU) and
    the checkpoint's dict (the task and the evaluation's settings that
    :func:`checkpoint_evaluation` reads). A checkpoint naming code other than the project's
    plain types is refused (``safe_load``), and so is a file that holds no APPO policy, naming
    what it holds."""
    from lightning_unilab.learner.appo import APPOModule

    where = os.fspath(path)
    checkpoint = safe_load.load(where)
    state = checkpoint.get("state_dict") if isinstance(checkpoint, Mapping) else None
    expected = ("a lightning_unilab APPO checkpoint (as lightning_unilab.train writes: a "
                "'state_dict' with the policy's 'policy.*' weights)")
    if not isinstance(state, Mapping) or not any(str(k).startswith("policy.") for k in state):
        held = (f"keys {sorted(map(str, checkpoint))[:8]}" if isinstance(checkpoint, Mapping)
                else f"a {type(checkpoint).__name__}")
        fail("checkpoint", expected, f"{where} holding {held}")
    try:
        with safe_load.project_types():
            module = APPOModule.load_from_checkpoint(where, map_location="cpu",
                                                     weights_only=True)
    except (KeyError, TypeError, RuntimeError) as err:  # other hyperparameters or weights
        fail("checkpoint", expected, f"{where}, which APPOModule does not load: "
             f"{type(err).__name__}: {err}")
    return module, checkpoint


def _params(parser: argparse.ArgumentParser, items: Sequence[str]) -> dict[str, float]:
    params: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:  # an int stays one: a task class's init args may need it (episode_steps=5)
            params[name] = int(value) if value.strip().lstrip("+-").isdigit() else float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            parser.error(f"--param: expected NAME=NUMBER, got {item!r}")
    return params


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="cmd", required=True)
    ck = sub.add_parser("checkpoint", allow_abbrev=False,
                        help="evaluate a saved APPOModule checkpoint on the task it was trained "
                             "on, as the end-of-training evaluation did")
    ck.add_argument("ckpt")
    ck.add_argument("--task", default=None,
                    help="only for a checkpoint that does not name its task (default: the "
                         "checkpoint's task; another one is refused)")
    ck.add_argument("--out", required=True)
    ck.add_argument("--max-steps", type=int, default=None,
                    help="episode cap (default: the recipe's EvaluationRollout, else the task's "
                         "time limit)")
    ck.add_argument("--seed", type=int, default=None,
                    help="start-state seed (default: the recipe's EvaluationRollout, else 0)")
    ck.add_argument("--no-video", action="store_true")
    ck.add_argument("--episodes", type=int, default=None,
                    help="episodes on start-state seeds SEED, SEED+1, ...; more than one writes "
                         "episodes.json (falls, tracking errors per seed and their spread) "
                         "instead of the episode's plot (default 1; 50 with --robustness)")
    ck.add_argument("--robustness", action="store_true",
                    help="a velocity-command task under four conditions (nominal, a push of "
                         "--push m/s every command period, the forward command reversing by "
                         "2 x --reversal m/s every command period, both), --episodes start "
                         "seeds each: falls and tracking errors per condition in "
                         "robustness.json (lightning_unilab.robustness)")
    ck.add_argument("--push", type=float, default=0.5, help="with --robustness: m/s")
    ck.add_argument("--reversal", type=float, default=0.7,
                    help="with --robustness: the forward command's size, m/s")
    ck.add_argument("--stochastic", action="store_true",
                    help="sample the policy's actions, as in training (default: its mean)")
    ck.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a task parameter for the evaluation env over the checkpoint's, e.g. "
                         "resample_steps=250")
    args, unknown = parser.parse_known_args(argv)
    from lightning_unilab.train import did_you_mean

    if unknown:  # argparse's own message would not name the closest flag
        ck.error(did_you_mean(f"unrecognized arguments: {' '.join(unknown)}",
                              ck._option_string_actions))
    params = _params(ck, args.param)
    if args.episodes is None:
        args.episodes = 50 if args.robustness else 1
    if args.episodes < 1:
        ck.error(f"--episodes: expected a positive number of episodes, got {args.episodes}")
    try:
        module, checkpoint = load_checkpoint(args.ckpt)
    except (safe_load.UnsafeCheckpointError, safe_load.CorruptCheckpointError,
            FileNotFoundError, ValueError) as err:
        ck.error(str(err))
    try:  # a task class that does not import or build here is named, as a wrong task is
        run = checkpoint_evaluation(checkpoint, args.task, params, args.max_steps, args.seed)
        if args.robustness:
            _robustness(ck, module.policy, run, args)
            return
        if args.episodes > 1:
            summary = evaluate_seeds(module.policy, run.task, args.out,
                                     range(run.seed, run.seed + args.episodes), run.task_kwargs,
                                     run.max_steps, deterministic=not args.stochastic)
        else:
            summary = evaluate_policy(module.policy, run.task, args.out, run.task_kwargs,
                                      seed=run.seed, max_steps=run.max_steps,
                                      video=not args.no_video,
                                      deterministic=not args.stochastic)
    except (TaskMismatchError, ImportError, TaskBuildError) as e:
        ck.error(str(e))
    keys = ("return", "length", "tracking", "plot", "video") if args.episodes == 1 else \
        [k for k in summary if k != "rows"]
    print(json.dumps({k: summary[k] for k in keys}))


def _robustness(parser: argparse.ArgumentParser, policy: torch.nn.Module,
                run: CheckpointEvaluation, args: argparse.Namespace) -> None:
    """``--robustness``: every condition, the command period the evaluation's (else 5 s)."""
    from lightning_unilab.robustness import evaluate_robustness, table

    params = dict(run.task_kwargs.get("params") or {})
    period = int(params.get("resample_steps") or 250)
    try:
        summary = evaluate_robustness(policy, run.task, run.task_kwargs, episodes=args.episodes,
                                      seed=run.seed, max_steps=run.max_steps or 1000,
                                      period_steps=period, push=args.push,
                                      reversal=args.reversal)
    except ValueError as err:
        parser.error(str(err))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "robustness.json", {"checkpoint": os.fspath(args.ckpt), **summary})
    print(table(summary))
    print(f"wrote {out / 'robustness.json'}")


if __name__ == "__main__":
    _main()
