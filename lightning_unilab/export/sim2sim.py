"""Sim-to-sim: the exported policy in a plain MuJoCo loop against the training stack.

``compare_with_evaluation`` runs the checkpoint's evaluation rollout (``evaluate.run_episode``:
the pool, the C++ task, the torch policy) and the export's :class:`.mujoco_loop.MujocoPolicyLoop`
from the evaluation's first state under the same constant command, and reports how far their
observations and actions drift apart step by step, twice:

- ``closed_loop``: the loop acts on its own actions, as on a robot. A runtime that rounds as
  torch does (TorchScript) stays on the evaluation's trajectory to the bit; one that rounds
  otherwise (onnxruntime's float32 kernels: about 2e-7 an action) starts a drift that a
  chaotic stretch (an untrained robot's fall and impact) amplifies;
- ``driven``: the loop applies the evaluation's actions (through its own action mapping and
  substeps) while the exported policy still answers each of its observations: every step is
  compared on the evaluation's own state, so the drift cannot grow, and a wrong observation
  term, scale or default pose still shows at once (the trajectory leaves the evaluation's).
 The command is fixed on both sides by
pinning the bounds of its draw (the task's :class:`~lightning_unilab.envs.tasks.deployment.
Deployment`). The evaluation already switches the training-only parts off (randomization,
pushes, the command mix); the task's termination is switched off too (``Deployment.no_fall``),
so that an untrained policy's fall is compared step for step rather than ending the episode.

``walk`` runs the loop alone from the task's keyframe and reports the first fall under the
JSON's fall criterion: the deploy-side check of a trained walk (20 s without a fall).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_omnilab.digests import file_digest
from lightning_omnilab.validate import fail, positive_int, positive_number
from lightning_unilab.envs.tasks.deployment import task_deployment
from lightning_unilab.export.formats import Runner
from lightning_unilab.export.mujoco_loop import MujocoPolicyLoop, read_export

__all__ = ["AGREE", "compare_with_evaluation", "walk"]

AGREE = 1e-5  # actions this close count as equal (steps_within_1e-5)


def _command(description: dict[str, Any], command: Sequence[float] | None) -> list[float]:
    """The command's values, in the order of its observation term (zeros by default)."""
    terms = [t for t in description["observation"]["layout"] or [] if t["name"] == "command"]
    size = terms[0]["stop"] - terms[0]["start"] if terms else 0
    values = [0.0] * size if command is None else [float(c) for c in command]
    if len(values) != size:
        names = terms[0].get("components", size) if terms else "none"
        fail("command", f"one value per command component ({names})", list(values))
    return values


def compare_with_evaluation(export_json: str | os.PathLike, steps: int = 100,
                            command: Sequence[float] | None = None, seed: int | None = None,
                            policy: Runner | None = None) -> dict[str, Any]:
    """The export's loop against the evaluation rollout of its checkpoint for ``steps`` control
    steps from the evaluation's start state (``seed``: the recipe's by default) under the
    constant ``command``. ``policy``: run this instead of the exported file (a test's)."""
    from lightning_unilab.evaluate import checkpoint_evaluation, load_checkpoint, run_episode

    positive_int("steps", steps)
    description = read_export(export_json)
    ckpt = description["checkpoint"]
    if file_digest(ckpt["path"]) != ckpt["sha256"]:
        fail("export_json", "the checkpoint it was exported from, unchanged",
             f"{ckpt['path']}, whose SHA-256 is no longer {ckpt['sha256']}")
    values = _command(description, command)
    module, saved = load_checkpoint(ckpt["path"])
    base = checkpoint_evaluation(saved)
    deployment = task_deployment(base.task, base.task_kwargs.get("params"))
    if deployment is None:
        fail("export_json", "an export of a task that describes its deployment",
             description["task"]["name"])
    pins = {**deployment.command_params(dict(zip(deployment.command, values, strict=True))),
            **deployment.no_fall}
    run = checkpoint_evaluation(saved, params=pins, max_steps=steps, seed=seed)
    episode = run_episode(module.policy, run.task, run.task_kwargs, seed=run.seed,
                          max_steps=steps)
    loop = MujocoPolicyLoop(export_json, policy)
    report = {"task": description["task"]["name"], "format": description["format"],
              "steps": episode.length, "seed": run.seed,
              "command": dict(zip(deployment.command, values, strict=True))}
    for mode, drive in (("closed_loop", None), ("driven", episode.actions)):
        result = loop.run(episode.length, values, state=episode.states[0], drive=drive)
        actions = np.abs(result.actions.astype(np.float64) - episode.actions).max(axis=1)
        obs = np.abs(result.observations.astype(np.float64) - episode.observations).max(axis=1)
        over = np.flatnonzero(actions > AGREE)
        report[mode] = {"max_abs_action_diff": float(actions.max()),
                        "max_abs_obs_diff": float(obs.max()),
                        "steps_within_1e-5": int(over[0]) if over.size else episode.length,
                        "action_diff_per_step": actions.tolist(),
                        "fell_at_step": result.fell_at}
    return report


def walk(export_json: str | os.PathLike, seconds: float = 20.0,
         command: Sequence[float] | None = None, policy: Runner | None = None) -> dict[str, Any]:
    """The export's loop alone for ``seconds`` from the task's keyframe under the constant
    ``command``: whether (and when) the robot fell by the JSON's criterion."""
    positive_number("seconds", seconds)
    description = read_export(export_json)
    values = _command(description, command)
    loop = MujocoPolicyLoop(export_json, policy)
    steps = max(1, round(seconds / loop.control_dt))
    result = loop.run(steps, values)
    return {"task": description["task"]["name"], "seconds": steps * loop.control_dt,
            "command": values, "fell": result.fell_at is not None,
            "fell_at_s": result.fell_at_s, "fall": description["fall"],
            "min_base_height_m": float(result.base_height.min()),
            "final_base_height_m": float(result.base_height[-1])}
