"""A trained policy out of Lightning: ``python -m lightning_unilab.export``.

- :mod:`.checkpoint`: a training checkpoint's actor as ONNX or TorchScript (observation
  normalizer inside, deterministic action out), checked against the evaluation's actor, with
  the JSON a robot program needs (observation layout, action scaling, default pose, joints,
  control period, task, digests);
- :mod:`.mujoco_loop`: that file and JSON in a plain MuJoCo loop, as a robot program runs them;
- :mod:`.sim2sim`: the loop against the training stack's evaluation, and a fall check.

Names are imported on first use, so that ``lightning_unilab.export.mujoco_loop`` runs an ONNX
file with mujoco, numpy and onnxruntime alone (no torch, no Lightning), as on a robot.
docs/unilab/export.md has the commands, the JSON by example and the measured numbers.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"Export": "checkpoint", "export_checkpoint": "checkpoint", "FORMATS": "formats",
          "load_runner": "formats", "LoopResult": "mujoco_loop", "MujocoPolicyLoop": "mujoco_loop",
          "read_export": "mujoco_loop", "compare_with_evaluation": "sim2sim", "walk": "sim2sim"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
