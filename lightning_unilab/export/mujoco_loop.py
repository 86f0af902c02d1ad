"""An exported policy in a plain MuJoCo loop, as a robot program would run it.

Only ``mujoco``, ``numpy``, the exported file (onnxruntime, or torch for TorchScript) and the
export's JSON: no pool, no Lightning, no task classes. The loop loads the scene the JSON names
(``physics``), builds each observation term of the JSON's layout from ``MjData`` with its own
code below (a robot's program would read its IMU and encoders there), runs the policy, sets
the position targets the JSON's action section gives and steps MuJoCo ``control.substeps``
times per control period. :mod:`.sim2sim` holds its actions against the training stack's
evaluation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from lightning_unilab.export.formats import Runner, load_runner

__all__ = ["LoopResult", "MujocoPolicyLoop", "read_export"]

DOWN = np.array([0.0, 0.0, -1.0])


def read_export(path: str | os.PathLike) -> dict[str, Any]:
    """The export's JSON, with the model file's path resolved beside it (``model_path``)."""
    where = Path(path)
    description = json.loads(where.read_text())
    description["model_path"] = os.fspath(where.parent / description["model"])
    return description


@dataclass
class LoopResult:
    """One run of the loop: per control step the observation the policy saw and the action it
    gave, the base height after the step, and the first step after which the task's fall
    criterion (the JSON's ``fall``) held (None: no fall)."""

    observations: np.ndarray  # [T, obs] float32
    actions: np.ndarray  # [T, action] float32
    base_height: np.ndarray  # [T]
    fell_at: int | None
    control_dt: float

    @property
    def fell_at_s(self) -> float | None:
        return None if self.fell_at is None else (self.fell_at + 1) * self.control_dt


class MujocoPolicyLoop:
    """The policy of the export described by ``export_json`` on the scene it names.

    Args:
        export_json: the JSON ``python -m lightning_unilab.export checkpoint`` wrote.
        policy: ``obs -> actions`` on float32 ``[1, obs]``; default: the exported file beside
            the JSON, run by its format's runtime.
    """

    def __init__(self, export_json: str | os.PathLike, policy: Runner | None = None) -> None:
        d = read_export(export_json)
        physics, action = d["physics"], d["action"]
        layout = d["observation"]["layout"]
        if layout is None or physics["scene_xml"] is None or action["joint_names"] is None:
            raise ValueError(f"export_json: expected an export whose task describes its "
                             f"observation layout, scene and joints, got {os.fspath(export_json)} "
                             f"of task {d['task']['name']!r}, which does not")
        self.model = mujoco.MjModel.from_xml_path(physics["scene_xml"])
        self.model.opt.timestep = physics["timestep"]
        self.model.opt.disableflags = physics["disableflags"]
        # the solver the policy trained with (an export without them: the scene's own)
        if "integrator" in physics:
            self.model.opt.integrator = physics["integrator"]
            self.model.opt.iterations = physics["iterations"]
        self.data = mujoco.MjData(self.model)
        self.keyframe = physics["keyframe"]
        self.substeps = int(d["control"]["substeps"])
        self.control_dt = float(d["control"]["period_s"])
        self.scale = np.asarray(action["scale"], np.float64)
        self.default = np.asarray(action["default_joint_pos"], np.float64)
        self.fall = d["fall"] or {}
        m = self.model
        joints = [m.joint(name).id for name in action["joint_names"]]
        self.qpos_adr = m.jnt_qposadr[joints]
        self.dof_adr = m.jnt_dofadr[joints]
        # each joint's actuator: ctrl is written in action order through this map
        by_joint = {int(m.actuator_trnid[a, 0]): a for a in range(m.nu)}
        self.actuators = np.array([by_joint[j] for j in joints])
        free = [j for j in range(m.njnt) if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        self.base_adr = int(m.jnt_qposadr[free[0]])
        self.terms = [(t["start"], t["stop"], self._reader(t)) for t in layout]
        self.command_size = sum(t["stop"] - t["start"] for t in layout if t["name"] == "command")
        self.obs_size = int(d["observation"]["size"])
        self.policy = policy or load_runner(d["format"], d["model_path"])
        self.command = np.zeros(0)
        self.reset()

    # ------------------------------------------------------------------ observation terms

    def _reader(self, term: dict[str, Any]) -> Callable[[], np.ndarray]:
        """The function computing ``term`` from the current MjData and the loop's state."""
        m, d, name = self.model, self.data, term["name"]
        if "sensor" in term:
            sensor = m.sensor(term["sensor"])
            adr, dim = int(sensor.adr[0]), int(sensor.dim[0])
            return lambda: d.sensordata[adr:adr + dim]
        if name == "projected_gravity":
            quat = int(m.jnt_qposadr[m.joint(term["joint"]).id]) + 3
            return lambda: self._down_in_frame(d.qpos[quat:quat + 4])
        if name == "joint_pos":
            return lambda: d.qpos[self.qpos_adr] - self.default
        if name == "joint_vel":
            return lambda: d.qvel[self.dof_adr]
        if name == "last_action":
            return lambda: self.last_action
        if name == "command":
            return lambda: self.command
        if name == "gait_clock":
            frequency = float(term["frequency_hz"])

            def clock() -> np.ndarray:
                phase = 2 * math.pi * frequency * self.control_dt * self.steps
                return np.array([math.cos(phase), math.sin(phase)])

            return clock
        raise ValueError(f"observation term {name!r}: this loop builds sensor terms, "
                         "projected_gravity, joint_pos, joint_vel, last_action, command and "
                         "gait_clock; teach it this one")

    @staticmethod
    def _down_in_frame(quat: np.ndarray) -> np.ndarray:
        inverse = np.empty(4)
        mujoco.mju_negQuat(inverse, quat)
        out = np.empty(3)
        mujoco.mju_rotVecQuat(out, DOWN, inverse)
        return out

    def observe(self) -> np.ndarray:
        """The observation now, float64 ``[obs]``, term by term at the JSON's slices."""
        obs = np.empty(self.obs_size)
        for start, stop, read in self.terms:
            obs[start:stop] = read()
        return obs

    # ------------------------------------------------------------------ stepping

    def reset(self, state: np.ndarray | None = None) -> None:
        """Start at ``state`` (an ``mjSTATE_INTEGRATION`` row), else at the JSON's keyframe
        (else the model's defaults); the clock and the last action start at 0."""
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        if state is not None:
            mujoco.mj_setState(m, d, np.asarray(state, np.float64),
                               mujoco.mjtState.mjSTATE_INTEGRATION)
        elif self.keyframe is not None:
            mujoco.mj_resetDataKeyframe(m, d, m.key(self.keyframe).id)
        mujoco.mj_forward(m, d)
        self.steps = 0
        self.last_action = np.zeros(len(self.scale))

    def step(self, drive: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One control period: observe, act, hold the targets for the substeps. Returns the
        float32 observation and the policy's action. ``drive``: apply this action instead of
        the policy's (a check that keeps the loop on another run's trajectory)."""
        obs = self.observe().astype(np.float32)
        action = self.policy(obs[None])[0]
        applied = np.asarray(action if drive is None else drive, np.float64)
        self.data.ctrl[self.actuators] = self.default + self.scale * applied
        for _ in range(self.substeps):
            mujoco.mj_step(self.model, self.data)
        self.last_action = applied
        self.steps += 1
        return obs, action

    def fallen(self) -> bool:
        """The JSON's fall criterion on the current state (the task's termination)."""
        q = self.data.qpos
        if not (np.isfinite(q).all() and np.isfinite(self.data.qvel).all()):
            return True
        low = self.fall.get("min_base_height")
        tilt = self.fall.get("max_tilt_deg")
        if low is not None and q[self.base_adr + 2] < low:
            return True
        down = self._down_in_frame(q[self.base_adr + 3:self.base_adr + 7])
        return tilt is not None and -down[2] < math.cos(tilt * math.pi / 180.0)

    def run(self, steps: int, command: Sequence[float] = (), state: np.ndarray | None = None,
            drive: np.ndarray | None = None) -> LoopResult:
        """``steps`` control periods from ``state`` (default: the keyframe) under a constant
        ``command`` (the command term's components, in order); the loop keeps going after a
        fall, which it records. ``drive`` ([steps, action]): the actions applied, in place of
        the policy's own (which are still computed and returned)."""
        command = np.asarray(command, np.float64).ravel()
        if len(command) != self.command_size:
            raise ValueError(f"command: expected {self.command_size} values (the observation's "
                             f"command term), got {command.tolist()}")
        self.reset(state)
        self.command = command
        seen, sent, height, fell = [], [], [], None
        for k in range(steps):
            obs, action = self.step(None if drive is None else drive[k])
            seen.append(obs)
            sent.append(action)
            height.append(float(self.data.qpos[self.base_adr + 2]))
            if fell is None and self.fallen():
                fell = k
        return LoopResult(np.stack(seen), np.stack(sent), np.asarray(height), fell,
                          self.control_dt)
