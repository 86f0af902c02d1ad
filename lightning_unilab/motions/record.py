"""A trained policy's episode as a motion clip: ``python -m lightning_unilab.motions record``.

A clip recorded from our own walking policy is physically consistent by construction (MuJoCo
made every frame), which no keyframed clip is; it is how a walking reference is made. The
checkpoint's policy runs as ``python -m lightning_unilab.evaluate checkpoint`` runs it (the
task, its parameters and the start-state seed from the checkpoint, deterministic actions; see
:func:`lightning_unilab.evaluate.checkpoint_evaluation`), and each step's physics state (the
``mjSTATE_INTEGRATION`` rows of :attr:`Episode.states`) becomes a frame: the root pose and the
joint angles from its qpos, through :func:`qpos_to_clip` (velocities by finite differences),
at the control rate. An episode that ended in a fall (terminated) is refused unless asked for:
a tracker taught to replay a fall learns to fall.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from lightning_unilab.motions.clip import MotionClip, model_joint_names
from lightning_unilab.motions.convert import qpos_to_clip, root_body_name

__all__ = ["Recording", "episode_qpos", "record_clip"]


@dataclass
class Recording:
    """A recorded clip and the episode it came from."""

    clip: MotionClip
    task: str
    steps: int
    ret: float
    terminated: bool


def episode_qpos(states: np.ndarray, model: mujoco.MjModel) -> np.ndarray:
    """(rows, nq) qpos of mjSTATE_INTEGRATION state rows of model, read back through
    mj_setState (the row's layout is MuJoCo's to define, not ours to slice by hand)."""
    spec = int(mujoco.mjtState.mjSTATE_INTEGRATION)
    size = mujoco.mj_stateSize(model, spec)
    states = np.asarray(states, np.float64)
    if states.ndim != 2 or states.shape[1] != size:
        raise ValueError(f"states: expected (rows, {size}) mjSTATE_INTEGRATION rows of the "
                         f"model, got shape {states.shape}")
    data = mujoco.MjData(model)
    out = np.empty((len(states), model.nq))
    for k, row in enumerate(states):
        mujoco.mj_setState(model, data, row, spec)
        out[k] = data.qpos
    return out


def record_clip(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                params: Mapping[str, float] | None = None, seconds: float | None = None,
                seed: int | None = None, allow_fall: bool = False,
                bodies: Sequence[str] | None = None) -> Recording:
    """Run the checkpoint's policy for one episode (at most ``seconds``; default the task's
    time limit, or the recipe's evaluation cap) and make its trajectory a clip named after out;
    ``bodies``: the bodies to keep (None: all of the model's). Raises ValueError on a fall
    unless allow_fall."""
    from lightning_unilab.evaluate import (
        checkpoint_evaluation,
        load_checkpoint,
        run_episode,
        task_physics,
    )

    if seconds is not None and not (np.isfinite(seconds) and seconds > 0):
        raise ValueError(f"--seconds: expected a positive duration, got {seconds!r}")
    where = os.fspath(checkpoint)
    module, saved = load_checkpoint(where)
    run = checkpoint_evaluation(saved, None, params, None, seed)
    model, spec = task_physics(run.task, run.task_kwargs)
    dt = float(model.opt.timestep) * spec.frame_skip
    steps = run.max_steps
    if seconds is not None:
        steps = max(1, int(round(seconds / dt)))
    episode = run_episode(module.policy, run.task, run.task_kwargs, seed=run.seed,
                          max_steps=steps)
    if episode.terminated and not allow_fall:
        raise ValueError(f"{where}: the episode ended in a fall at step {episode.length} "
                         f"({episode.length * dt:.2f} s, seed {run.seed}); a clip of a fall "
                         f"teaches falling (pass --allow-fall to keep it)")
    if episode.states is None or len(episode.states) < 2:
        raise ValueError(f"{where}: the episode left fewer than 2 states; a clip needs 2 frames")
    qpos = episode_qpos(episode.states, model)
    root_body_name(model)  # a floating base, or refused here with the reason
    adr = [model.joint(n).qposadr[0] for n in model_joint_names(model)]
    name = Path(out).stem if out is not None else Path(where).stem
    clip = qpos_to_clip(qpos[:, :3], qpos[:, 3:7], qpos[:, adr], model, 1.0 / dt, name,
                        os.fspath(out) if out is not None else "")
    if bodies is not None:
        clip = clip.select_bodies(bodies)
    return Recording(clip=clip, task=episode.task, steps=episode.length, ret=episode.ret,
                     terminated=episode.terminated)
