"""g1-walk-flat in numpy: the twin and test reference of cpp/src/tasks/g1_walk.cc.

Every term is documented in docs/unilab/tasks.md; change both files together. The parameters'
defaults are C++'s alone (:class:`G1Params` reads them through ``_core.task_defaults``). The
array-level functions (:meth:`G1WalkFlat.rewards`, :meth:`G1WalkFlat.observe_arrays`) take plain
(n, ...) arrays, so that the same task also runs over ``mujoco.batch.Batch``
(benchmarks/task_bench.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import mujoco
import numpy as np

from lightning_unilab import _core
from lightning_unilab.envs.tasks.base import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.rng import EnvRng

if TYPE_CHECKING:
    from lightning_unilab.envs.pool import BatchEnvPool

JOINTS = 29
LAST_ACTION = slice(0, JOINTS)
COMMAND = slice(JOINTS, JOINTS + 3)
AIR_TIME = slice(JOINTS + 3, JOINTS + 5)
LAST_CONTACT = slice(JOINTS + 5, JOINTS + 7)
STEP = JOINTS + 7
MEMORY = JOINTS + 8
OBS = 3 + 3 + 3 * JOINTS + 3 + 2  # 98
CRITIC = OBS + 3 + 1 + 2 + 2  # 106


@dataclass(frozen=True)
class G1Params:
    """The C++ task's parameters (same names). Their defaults live in one table in
    cpp/src/tasks/g1_walk.cc; :meth:`with_defaults` fills them in from there, so that the twin
    cannot drift from the task it mirrors."""

    ctrl_dt: float
    episode_length_s: float
    resample_steps: float
    action_scale: float
    reset_joint_noise: float
    reset_base_vel_noise: float
    command_vx_min: float
    command_vx_max: float
    command_vy_min: float
    command_vy_max: float
    command_yaw_min: float
    command_yaw_max: float
    gait_frequency: float
    min_base_height: float
    max_tilt_deg: float
    tracking_sigma: float
    air_time_threshold: float
    w_tracking_lin_vel: float
    w_tracking_ang_vel: float
    w_lin_vel_z: float
    w_ang_vel_xy: float
    w_orientation: float
    w_torques: float
    w_action_rate: float
    w_feet_air_time: float
    w_feet_slip: float
    w_termination: float
    w_alive: float
    reward_floor: float  # the step's reward is at least this (-inf: no floor)

    @classmethod
    def with_defaults(cls, **overrides: float) -> G1Params:
        """C++'s defaults with ``overrides`` (names checked against the C++ table)."""
        defaults = _core.task_defaults(G1WalkFlat.name)
        unknown = set(overrides) - set(defaults)
        if unknown:
            raise ValueError(f"g1-walk-flat has no parameter(s) {sorted(unknown)}; it has: "
                             f"{sorted(defaults)}")
        return cls(**{**defaults, **overrides})


def gravity(qpos: np.ndarray) -> np.ndarray:
    """World gravity direction in the pelvis frame, (n, 3), from the free joint quaternion."""
    w, x, y, z = qpos[:, 3], qpos[:, 4], qpos[:, 5], qpos[:, 6]
    return np.stack([-2 * (x * z - w * y), -2 * (y * z + w * x),
                     -(w * w - x * x - y * y + z * z)], axis=1)


class G1WalkFlat(NumpyTask):
    """Velocity tracking with the 29-DoF G1; see the module doc."""

    name = "g1-walk-flat"
    outputs = {"sensordata": None, "actuator_force": None}

    def __init__(self, **params: float) -> None:
        self.p = G1Params.with_defaults(**params)
        self._model: mujoco.MjModel | None = None

    def model(self) -> mujoco.MjModel:
        if self._model is None:
            from lightning_unilab.envs.tasks import g1_xml

            self._model = mujoco.MjModel.from_xml_path(str(g1_xml()))
            self._setup(self._model)
        return self._model

    def _setup(self, m: mujoco.MjModel) -> None:
        p = self.p
        self.frame_skip = max(1, round(p.ctrl_dt / m.opt.timestep))
        self.dt = self.frame_skip * m.opt.timestep
        key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "knees_bent")
        self.home = (m.key_qpos[key] if key >= 0 else m.qpos0).copy()
        self.default = self.home[7:]

        def sensor(name: str) -> slice:
            s = m.sensor(name)
            return slice(int(s.adr[0]), int(s.adr[0]) + int(s.dim[0]))

        self.s_gyro = sensor("gyro_pelvis")
        self.s_local_linvel = sensor("local_linvel_pelvis")
        self.s_global_linvel = sensor("global_linvel_pelvis")
        self.s_foot_linvel = [sensor("left_foot_global_linvel"),
                              sensor("right_foot_global_linvel")]
        self.s_contact = [sensor("left_foot_floor_found").start,
                          sensor("right_foot_floor_found").start]
        self.command_low = np.array([p.command_vx_min, p.command_vy_min, p.command_yaw_min])
        self.command_high = np.array([p.command_vx_max, p.command_vy_max, p.command_yaw_max])
        self.cos_max_tilt = np.cos(p.max_tilt_deg * np.pi / 180.0)

    @property
    def spec(self) -> TaskSpec:
        self.model()
        return TaskSpec(obs_size=OBS, critic_size=CRITIC, action_size=JOINTS,
                        frame_skip=self.frame_skip,
                        max_episode_steps=round(self.p.episode_length_s / self.dt),
                        memory_size=MEMORY, resample_steps=int(self.p.resample_steps),
                        action_low=-np.ones(JOINTS), action_high=np.ones(JOINTS))

    # ------------------------------------------------------------------ array level

    def sample_start(self, ids: np.ndarray, rng: EnvRng) -> tuple[np.ndarray, np.ndarray]:
        """Start qpos (n, 36) and base velocities (n, 6) for the envs ids."""
        qpos = np.broadcast_to(self.home, (len(ids), self.home.size)).copy()
        n = self.p.reset_joint_noise
        qpos[:, 7:] += rng.uniform(ids, -n, n, JOINTS)
        v = self.p.reset_base_vel_noise
        return qpos, rng.uniform(ids, -v, v, 6)

    def controls(self, actions: np.ndarray) -> np.ndarray:
        return self.default + self.p.action_scale * actions

    def rewards(self, qpos: np.ndarray, qvel: np.ndarray, sensordata: np.ndarray,
                actuator_force: np.ndarray, actions: np.ndarray,
                memory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reward and termination of n envs; updates their memory rows (returned copy-free)."""
        p = self.p
        s = sensordata
        gyro = s[:, self.s_gyro]
        v = s[:, self.s_local_linvel]
        cmd = memory[:, COMMAND]
        g = gravity(qpos)
        ex, ey, ew = cmd[:, 0] - v[:, 0], cmd[:, 1] - v[:, 1], cmd[:, 2] - gyro[:, 2]
        lin = np.exp(-(ex * ex + ey * ey) / p.tracking_sigma)
        ang = np.exp(-(ew * ew) / p.tracking_sigma)
        vz = s[:, self.s_global_linvel.start + 2]
        linz = vz * vz
        angxy = gyro[:, 0] * gyro[:, 0] + gyro[:, 1] * gyro[:, 1]
        orient = g[:, 0] * g[:, 0] + g[:, 1] * g[:, 1]
        torque = np.einsum("ij,ij->i", actuator_force, actuator_force)
        da = actions - memory[:, LAST_ACTION]
        rate = np.einsum("ij,ij->i", da, da)
        air = np.zeros(len(qpos))
        slip = np.zeros(len(qpos))
        for f in range(2):  # the two feet
            contact = s[:, self.s_contact[f]] > 0
            at = JOINTS + 3 + f
            memory[:, at] += self.dt
            first = contact & (memory[:, JOINTS + 5 + f] == 0)
            air += np.where(first, memory[:, at] - p.air_time_threshold, 0.0)
            fv = s[:, self.s_foot_linvel[f]]
            slip += np.where(contact, fv[:, 0] * fv[:, 0] + fv[:, 1] * fv[:, 1], 0.0)
            memory[:, at] = np.where(contact, 0.0, memory[:, at])
            memory[:, JOINTS + 5 + f] = contact
        air = np.where(cmd[:, 0] * cmd[:, 0] + cmd[:, 1] * cmd[:, 1] > 0.01, air, 0.0)
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        fallen = ~finite | (qpos[:, 2] < p.min_base_height) | (-g[:, 2] < self.cos_max_tilt)
        total = (p.w_tracking_lin_vel * lin + p.w_tracking_ang_vel * ang + p.w_lin_vel_z * linz
                 + p.w_ang_vel_xy * angxy + p.w_orientation * orient + p.w_torques * torque
                 + p.w_action_rate * rate + p.w_feet_air_time * air + p.w_feet_slip * slip
                 + p.w_termination * fallen + p.w_alive * ~fallen)
        memory[:, LAST_ACTION] = actions
        memory[:, STEP] += 1
        return np.maximum(p.reward_floor, self.dt * total), fallen

    def observe_arrays(self, qpos: np.ndarray, qvel: np.ndarray, sensordata: np.ndarray,
                       memory: np.ndarray, critic: bool = True
                       ) -> tuple[np.ndarray, np.ndarray | None]:
        s = sensordata
        phase = 2 * np.pi * self.p.gait_frequency * self.dt * memory[:, STEP]
        obs = np.concatenate([s[:, self.s_gyro], gravity(qpos), qpos[:, 7:] - self.default,
                              qvel[:, 6:], memory[:, LAST_ACTION], memory[:, COMMAND],
                              np.cos(phase)[:, None], np.sin(phase)[:, None]], axis=1)
        if not critic:
            return obs, None
        contact = np.stack([s[:, c] > 0 for c in self.s_contact], axis=1).astype(np.float64)
        crit = np.concatenate([obs, s[:, self.s_local_linvel], qpos[:, 2:3], contact,
                               memory[:, AIR_TIME]], axis=1)
        return obs, crit

    # ------------------------------------------------------------------ NumpyTask on a pool

    @staticmethod
    def _sensors(pool: BatchEnvPool, ids: np.ndarray) -> np.ndarray:
        return pool.outputs["sensordata"][ids, :, 0]

    def reset(self, pool: BatchEnvPool, ids: np.ndarray, rng: EnvRng,
              memory: np.ndarray) -> None:
        qpos, base_vel = self.sample_start(ids, rng)
        pool.qpos[ids] = qpos
        vel = pool.qvel[ids]
        vel[:, :6] = base_vel
        pool.qvel[ids] = vel

    def start(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray) -> None:
        memory[ids] = 0.0

    def resample(self, ids: np.ndarray, rng: EnvRng, memory: np.ndarray) -> None:
        memory[ids, COMMAND] = rng.uniform(ids, self.command_low, self.command_high, 3)

    def act(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
            memory: np.ndarray) -> None:
        pool.ctrl[ids] = self.controls(actions)

    def evaluate(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
                 memory: np.ndarray) -> Transition:
        mem = memory[ids]
        reward, fallen = self.rewards(pool.qpos[ids], pool.qvel[ids], self._sensors(pool, ids),
                                      pool.outputs["actuator_force"][ids, :, 0], actions, mem)
        memory[ids] = mem
        return Transition(reward=reward, terminated=fallen)

    def observe(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray,
                obs: np.ndarray, critic: np.ndarray | None) -> None:
        o, c = self.observe_arrays(pool.qpos[ids], pool.qvel[ids], self._sensors(pool, ids),
                                   memory[ids], critic is not None)
        obs[ids] = o
        if critic is not None:
            critic[ids] = c


def randomization(friction: tuple[float, float] | None = (0.4, 1.0),
                  mass_scale: tuple[float, float] | None = (0.9, 1.1),
                  kp_scale: tuple[float, float] | None = (0.9, 1.1),
                  kd_scale: tuple[float, float] | None = None,
                  model: mujoco.MjModel | None = None):
    """A TaskVectorEnv ``randomization`` for the G1: floor/foot friction, link masses, kp/kd.

    Values are drawn per env and per episode and applied through BatchEnvPool.reset; kd scales
    the position actuators' own damping (zero in this G1, whose damping is in dof_damping).
    """
    m = model if model is not None else G1WalkFlat().model()
    gain = m.actuator_gainprm[:, 0].copy()
    kd = -m.actuator_biasprm[:, 2].copy()

    def draw(rng: np.random.Generator, ids: np.ndarray) -> dict[str, np.ndarray]:
        n = len(ids)
        out: dict[str, np.ndarray] = {}
        if friction is not None:
            f = np.broadcast_to(m.geom_friction, (n, *m.geom_friction.shape)).copy()
            f[:, :, 0] = rng.uniform(*friction, size=(n, 1))
            out["geom_friction"] = f
        if mass_scale is not None:
            out["body_mass"] = m.body_mass * rng.uniform(*mass_scale, size=(n, m.nbody))
        if kp_scale is not None:
            out["actuator_kp"] = gain * rng.uniform(*kp_scale, size=(n, m.nu))
        if kd_scale is not None:
            out["actuator_kd"] = kd * rng.uniform(*kd_scale, size=(n, m.nu))
        return out

    return draw
