"""Reference motions for tracking tasks: BeyondMimic-format clips, their loader and converter,
and clips the project makes itself (no human motion data can be downloaded here).

``python -m lightning_unilab.motions --help`` lists the commands (csv2npz, npz2csv, info,
make-dance, make-flip, record); docs/unilab/motions.md describes the format and the shipped
clips. ``floor_demand`` and ``joint_demand`` tell what a clip asks of the floor and the motors.
"""

from __future__ import annotations

from pathlib import Path

from lightning_unilab.motions.clip import (
    MotionClip,
    load_clip,
    load_motions,
    model_body_names,
    model_joint_names,
    save_clip,
)
from lightning_unilab.motions.convert import clip_to_csv, csv_to_clip, qpos_to_clip
from lightning_unilab.motions.floor import FloorDemand, floor_demand
from lightning_unilab.motions.torque import JointDemand, joint_demand

__all__ = ["CLIPS", "FloorDemand", "JointDemand", "MotionClip", "clip_to_csv", "csv_to_clip",
           "floor_demand", "joint_demand", "load_clip", "load_motions", "model_body_names",
           "model_joint_names", "qpos_to_clip", "save_clip"]

# the clips shipped with the package
CLIPS = Path(__file__).parent / "clips"
