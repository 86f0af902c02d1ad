"""A training checkpoint's actor as a deployable file, checked, with the JSON a robot needs.

The checkpoint is read as ``evaluate checkpoint`` reads it (:func:`~lightning_unilab.evaluate.
load_checkpoint`, :func:`~lightning_unilab.evaluate.checkpoint_evaluation`: the task, its
parameters with the training-only ones off), the actor is exported (:class:`.actor.
DeployedActor`: normalizer folded in, the Gaussian's mean out), the file is loaded back by its
own runtime and its actions held against the evaluation's actor on a batch of observations
(refused above ``tolerance``), and only then written, durably, with the JSON beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_omnilab import durable
from lightning_omnilab.digests import file_digest
from lightning_omnilab.validate import fail, one_of, positive_int, positive_number
from lightning_unilab.envs import tasks
from lightning_unilab.envs.tasks.deployment import Deployment, task_deployment
from lightning_unilab.envs.tasks.ref import task_label, task_ref
from lightning_unilab.export.actor import DeployedActor, evaluation_actor, sample_observations
from lightning_unilab.export.formats import (
    FORMATS,
    INPUT,
    OUTPUT,
    load_runner,
    runtime_name,
    serialize,
)

__all__ = ["Export", "export_checkpoint", "writable_directory"]

STEM = "policy"  # policy.onnx + policy.onnx.json, policy.pt + policy.pt.json
TO_CTRL = "ctrl[i] = default_joint_pos[i] + scale[i] * action[i]"


@dataclass
class Export:
    """Where the export went and what its JSON says."""

    model: Path
    json: Path
    description: dict[str, Any]


def writable_directory(name: str, path: str | os.PathLike) -> Path:
    """``path`` as a directory this process can write files in (made if missing), else
    ValueError naming ``name``, what was expected and the system's reason."""
    where = Path(path)
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as err:
        fail(name, "a directory this process can create and write files in",
             f"{os.fspath(where)} ({err.strerror or err})")
    return where


def export_checkpoint(checkpoint: str | os.PathLike, fmt: str = "onnx",
                      out: str | os.PathLike | None = None, *, tolerance: float = 1e-5,
                      batch: int = 256) -> Export:
    """Export the actor of ``checkpoint`` as ``fmt`` (``onnx`` or ``torchscript``) into ``out``
    (default: ``export/`` beside the checkpoint), after checking that the written file's
    actions on ``batch`` observations are within ``tolerance`` of the evaluation's actor."""
    from lightning_unilab.evaluate import (
        _check_sizes,
        checkpoint_evaluation,
        load_checkpoint,
        task_physics,
    )

    start, cpu = time.perf_counter(), time.process_time()
    one_of("format", fmt, tuple(FORMATS))
    positive_number("tolerance", tolerance)
    positive_int("batch", batch)
    where = Path(checkpoint)
    out_dir = writable_directory("out", where.parent / "export" if out is None else out)
    module, saved = load_checkpoint(where)
    run = checkpoint_evaluation(saved)
    params = dict(run.task_kwargs.get("params") or {})
    model, spec = task_physics(run.task, run.task_kwargs)
    _check_sizes(module.policy, task_label(run.task), spec.obs_size, spec.action_size)
    deployment = task_deployment(run.task, params)

    reference = evaluation_actor(module.policy)
    actor = DeployedActor(module.policy)
    obs = sample_observations(reference, batch)
    with torch.no_grad():
        want = reference.act(obs, deterministic=True)[0].numpy()
        in_torch = actor(obs).numpy()
    data = serialize(actor, fmt, obs)
    got = load_runner(fmt, data)(obs.numpy())
    diff = float(np.abs(got.astype(np.float64) - want).max())
    if not diff <= tolerance:  # NaN fails too
        fail("tolerance", f"the {fmt} file's actions within {tolerance:g} of the evaluation's "
             f"actor on {batch} observations", f"a max abs diff of {diff:.3g}")

    model_path = out_dir / f"{STEM}{FORMATS[fmt]}"
    durable.write_bytes(model_path, data)
    description = {
        "format": fmt,
        "model": model_path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "input": {"name": INPUT, "dtype": "float32", "shape": ["batch", spec.obs_size],
                  "raw": "as measured: the observation normalizer is inside the model"},
        "output": {"name": OUTPUT, "dtype": "float32", "shape": ["batch", spec.action_size],
                   "meaning": "the policy's deterministic action (its Gaussian's mean), "
                              "unclipped, as the evaluation sends it to the task"},
        "checkpoint": {"path": os.fspath(where.resolve()), "sha256": file_digest(where),
                       "global_step": saved.get("global_step")},
        "task": _task(run.task, params, saved),
        "control": {"period_s": float(model.opt.timestep) * spec.frame_skip,
                    "substeps": spec.frame_skip, "timestep_s": float(model.opt.timestep)},
        "physics": _physics(run.task, model, deployment),
        "observation": {"size": spec.obs_size, "dtype": "float32",
                        "layout": deployment.layout() if deployment else None},
        "action": _action(model, spec.action_size, deployment),
        "fall": dict(deployment.fall) if deployment else None,
        "verification": {"observations": batch, "max_abs_diff": diff,
                         "torch_module_max_abs_diff": float(np.abs(in_torch - want).max()),
                         "tolerance": tolerance, "runtime": runtime_name(fmt),
                         "reference": "ActorCritic.act(obs, deterministic=True) on the "
                                      "evaluation's float32 copy of the policy"},
        "exported_with": {"torch": torch.__version__},
    }
    # wall time, and the CPU time of this process (which a busy machine does not inflate)
    description["export_seconds"] = round(time.perf_counter() - start, 3)
    description["export_cpu_seconds"] = round(time.process_time() - cpu, 3)
    json_path = out_dir / f"{model_path.name}.json"
    durable.write_bytes(json_path, json.dumps(description, indent=1) + "\n")
    return Export(model=model_path, json=json_path, description=description)


def _task(task: Any, params: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """The task and every parameter it ran under in the evaluation (defaults filled in), and
    the parameters training gave it (the checkpoint's data module)."""
    from lightning_unilab import _core

    data = saved.get("datamodule_hyper_parameters") or {}
    training = dict((data.get("task_kwargs") or {}).get("params") or {})
    if isinstance(task, str):
        full = {**_core.task_defaults(task), **params}
    else:
        full = {**dict(task_ref(task).init_args), **params}
    return {"name": task_label(task), "ref": task if isinstance(task, dict) else None,
            "params": full, "training_params": training}


def _physics(task: Any, model: Any, deployment: Deployment | None) -> dict[str, Any]:
    """What a plain MuJoCo loop loads and sets to run the task's physics."""
    xml = tasks.get(task).xml() if isinstance(task, str) else None
    return {"scene_xml": os.fspath(xml) if xml is not None else None,
            "timestep": float(model.opt.timestep),
            "disableflags": int(model.opt.disableflags),
            "integrator": int(model.opt.integrator), "iterations": int(model.opt.iterations),
            "keyframe": deployment.keyframe if deployment else None}


def _action(model: Any, size: int, deployment: Deployment | None) -> dict[str, Any]:
    if deployment is None:
        return {"size": size, "joint_names": None, "scale": None, "default_joint_pos": None,
                "to_ctrl": None, "clip": None}
    limited = model.actuator_ctrllimited.astype(bool)
    return {"size": size, "joint_names": list(deployment.joint_names),
            "scale": deployment.action_scale.tolist(),
            "default_joint_pos": deployment.default_joint_pos.tolist(),
            "to_ctrl": TO_CTRL, "clip": None,
            "ctrl_range": [r.tolist() if on else None
                           for r, on in zip(model.actuator_ctrlrange, limited, strict=True)]}
