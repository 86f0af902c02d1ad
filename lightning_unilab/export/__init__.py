"""A trained policy out of Lightning: ``python -m lightning_unilab.export``.

- :mod:`.checkpoint`: a training checkpoint's actor as ONNX or TorchScript (observation
  normalizer inside, deterministic action out), checked against the evaluation's actor, with
  the JSON a robot program needs (observation layout, action scaling, default pose, joints,
  control period, task, digests);
- :mod:`.mujoco_loop`: that file and JSON in a plain MuJoCo loop, as a robot program runs them;
- :mod:`.sim2sim`: the loop against the training stack's evaluation, and a fall check.

docs/unilab/export.md has the commands, the JSON by example and the measured numbers.
"""

from lightning_unilab.export.checkpoint import Export, export_checkpoint
from lightning_unilab.export.formats import FORMATS, load_runner
from lightning_unilab.export.mujoco_loop import LoopResult, MujocoPolicyLoop, read_export
from lightning_unilab.export.sim2sim import compare_with_evaluation, walk

__all__ = ["FORMATS", "Export", "LoopResult", "MujocoPolicyLoop", "compare_with_evaluation",
           "export_checkpoint", "load_runner", "read_export", "walk"]
