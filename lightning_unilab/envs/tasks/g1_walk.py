"""g1-walk-flat in numpy: the twin and test reference of cpp/src/tasks/g1_walk.cc.

Every term is documented in docs/unilab/tasks.md; change both files together. The parameters'
defaults are C++'s alone (:class:`G1Params` reads them through ``_core.task_defaults``). The
array-level functions (:meth:`G1WalkFlat.rewards`, :meth:`G1WalkFlat.observe_arrays`) take plain
(n, ...) arrays, so that the same task also runs over ``mujoco.batch.Batch``
(benchmarks/task_bench.py). The terms are :mod:`lightning_unilab.envs.terms`' (arithmetic
unchanged from the hand-written form: the twin's outputs are bit-identical).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mujoco
import numpy as np

from lightning_unilab import _core
from lightning_unilab.envs import terms
from lightning_unilab.envs.tasks.base import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.deployment import Deployment, ObservationTerm
from lightning_unilab.envs.tasks.evaluation import VelocityTracking
from lightning_unilab.envs.tasks.rng import EnvRng

if TYPE_CHECKING:
    from lightning_unilab.envs.pool import BatchEnvPool

JOINTS = 29
# per-env memory, as in the C++ task: last action, command (vx, vy, yaw rate), feet air time,
# feet contact at the last step, steps in the episode, the next push (steps until it, vx, vy);
# then the training-only columns, there only while obs_noise or action_delay_prob is on (off,
# the memory is PLAIN_MEMORY wide, so that an env state saved before them still loads): the
# episode's noise key (a 53-bit whole number) and whether its actions are delayed (1) or not (0)
LAYOUT = terms.MemoryLayout(last_action=JOINTS, command=3, air_time=2, last_contact=2, step=1,
                            push=3, noise_key=1, action_delayed=1)
LAST_ACTION = LAYOUT["last_action"]
COMMAND = LAYOUT["command"]
AIR_TIME = LAYOUT["air_time"]
LAST_CONTACT = LAYOUT["last_contact"]
STEP = LAYOUT.column("step")
PUSH = LAYOUT["push"]
NOISE_KEY = LAYOUT.column("noise_key")
DELAYED = LAYOUT.column("action_delayed")
MEMORY = LAYOUT.size
PLAIN_MEMORY = NOISE_KEY  # with obs_noise and action_delay_prob off
# obs_noise's magnitude parameter of each noised actor term (the others get none)
NOISE_PARAMS = {"gyro": "obs_noise_gyro", "projected_gravity": "obs_noise_gravity",
                "joint_pos": "obs_noise_joint_pos", "joint_vel": "obs_noise_joint_vel",
                "local_linvel": "obs_noise_linvel"}
OBS = 3 + 3 + 3 * JOINTS + 3 + 2  # 98; + 3 (the local linear velocity) with observe_linvel
CRITIC_EXTRA = 3 + 1 + 2 + 2  # the critic's fields after the actor's
CRITIC = OBS + CRITIC_EXTRA  # 106
FEET = ("left_foot", "right_foot")  # the foot sites, each above the box geom of its name
# info after the reward shares, as C++'s info_names: the evaluation's series (after the substeps;
# the command the step followed, before any resample)
SERIES = ("vx", "vy", "yaw_rate", "vx_command", "vy_command", "yaw_rate_command", "base_height")
# the evaluator's hooks: the series above, and the evaluation's parameters: no pushes, every
# command component as drawn (a command mix would make it easier), exact observations and
# prompt actions (noise and delay are training's alone)
class G1WalkEvaluation(VelocityTracking):
    """The velocity-tracking hooks, and a command set from outside (the robustness schedule)."""

    def set_command(self, env: Any, obs: np.ndarray, command: np.ndarray) -> bool:
        start = 0
        for term in observation_terms(False, 1.0, "", []):  # the command's place: fixed
            if term.name == "command":
                break
            start += term.size
        env.memory[:, COMMAND] = command
        obs[:, start:start + 3] = command
        return True


EVALUATION = G1WalkEvaluation(training_only={
    "push_low": 0.0, "push_high": 0.0, "command_keep_vx": 1.0, "command_keep_vy": 1.0,
    "command_keep_yaw": 1.0, "obs_noise": 0.0, "action_delay_prob": 0.0})


STEP_RATIO_TOLERANCE = 1e-4  # of ctrl_dt / timestep from a whole number, as in C++
# the command's components and the parameters bounding each one's draw (Deployment.command)
COMMAND_PARAMS = {"vx": ("command_vx_min", "command_vx_max"),
                  "vy": ("command_vy_min", "command_vy_max"),
                  "yaw_rate": ("command_yaw_min", "command_yaw_max")}


def observation_terms(observe_linvel: bool, gait_frequency: float, base_joint: str,
                      command_range: list[list[float]]) -> tuple[ObservationTerm, ...]:
    """The actor's observation, term by term in order: :meth:`G1WalkFlat.observe_arrays`
    concatenates in this order (C++'s Observe writes the same, held equal by the twin's tests),
    and the export writes it into its JSON for a robot program (``command_range``: each
    command component's [low, high], the range training drew from)."""
    terms_ = [
        ObservationTerm("gyro", 3, "the pelvis's angular velocity in its own frame (rad/s): "
                        "the IMU's gyro", {"sensor": "gyro_pelvis"}),
        ObservationTerm("projected_gravity", 3, "the world's down direction (0, 0, -1) in the "
                        "pelvis frame, from the floating base's orientation (w, x, y, z)",
                        {"joint": base_joint}),
        ObservationTerm("joint_pos", JOINTS, "joint angles minus default_joint_pos (rad), in "
                        "action order"),
        ObservationTerm("joint_vel", JOINTS, "joint velocities (rad/s), in action order"),
        ObservationTerm("last_action", JOINTS, "the action of the previous control step (0 at "
                        "the start)"),
        ObservationTerm("command", 3, "the velocity command: forward and lateral speed (m/s) "
                        "in the pelvis's heading, yaw rate (rad/s)",
                        {"components": list(COMMAND_PARAMS), "range": command_range}),
        ObservationTerm("gait_clock", 2, "cos and sin of 2 pi frequency_hz t, t = control "
                        "steps since the start x the control period",
                        {"frequency_hz": gait_frequency}),
    ]
    if observe_linvel:
        terms_.append(ObservationTerm("local_linvel", 3, "the pelvis's linear velocity in its "
                                      "own frame (m/s)", {"sensor": "local_linvel_pelvis"}))
    return tuple(terms_)


def frame_skip(ctrl_dt: float, timestep: float) -> int:
    """Substeps per control step, ctrl_dt / timestep: a whole number (within 1e-4, so that
    0.0066667 passes for ctrl_dt / 3) of at least 1, else ValueError (C++'s FrameSkip)."""
    if not (math.isfinite(timestep) and timestep > 0):
        raise ValueError(f"g1-walk-flat: timestep must be a positive number, got {timestep!r}")
    ratio = ctrl_dt / timestep
    whole = round(ratio) if math.isfinite(ratio) else 0
    if whole < 1 or abs(ratio - whole) > STEP_RATIO_TOLERANCE:
        raise ValueError(f"g1-walk-flat: ctrl_dt {ctrl_dt!r} / timestep {timestep!r} = {ratio!r} "
                         "must be a whole number of substeps (>= 1)")
    return whole


@dataclass(frozen=True)
class G1Params:
    """The C++ task's parameters (same names). Their defaults live in one table in
    cpp/src/tasks/g1_walk.cc; :meth:`with_defaults` fills them in from there, so that the twin
    cannot drift from the task it mirrors."""

    ctrl_dt: float
    timestep: float  # the physics step, model.opt.timestep: ctrl_dt / timestep substeps
    eulerdamp: float  # 1: the Euler integrator's implicit damping on (model.opt.disableflags)
    integrator: float  # model.opt.integrator (mjtIntegrator: 0 Euler, 3 implicitfast)
    solver_iterations: float  # model.opt.iterations
    episode_length_s: float
    max_speed: float  # rad/s (m/s): roll back and truncate a faster substep; 0: off
    resample_steps: float
    observe_linvel: float  # 1: the actor observes the pelvis's local linear velocity too
    push_low: float  # m/s: one push per command period of U(push_low, push_high); 0 high: off
    push_high: float
    obs_noise: float  # the actor's observation noise: U(-1, 1) x this x each term's magnitude
    obs_noise_gyro: float  # rad/s
    obs_noise_gravity: float
    obs_noise_joint_pos: float  # rad
    obs_noise_joint_vel: float  # rad/s
    obs_noise_linvel: float  # m/s, with observe_linvel
    action_delay_prob: float  # the probability that an episode's actions act a step late
    action_scale: float
    upper_body_action_factor: float  # the waist's and arms' scale: action_scale x this
    reset_joint_noise: float
    reset_base_vel_noise: float
    command_vx_min: float
    command_vx_max: float
    command_vy_min: float
    command_vy_max: float
    command_yaw_min: float
    command_yaw_max: float
    command_keep_vx: float  # the probability a drawn component is kept, else 0
    command_keep_vy: float
    command_keep_yaw: float
    gait_frequency: float
    min_base_height: float
    max_tilt_deg: float
    tracking_sigma: float
    air_time_threshold: float
    feet_phase_swing_height: float  # m, the feet's height above the floor at mid-swing
    feet_phase_sigma: float
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
    w_feet_phase: float
    w_pose: float  # posture terms (MuJoCo Playground's G1): see the C++ table
    w_joint_deviation_hip: float
    w_joint_deviation_knee: float
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


class G1WalkFlat(NumpyTask):
    """Velocity tracking with the 29-DoF G1; see the module doc."""

    name = "g1-walk-flat"
    # the foot sites' world positions (feet_phase): as the C++ task's site_xpos, one substep stale
    outputs = {"sensordata": None, "actuator_force": None, "site_xpos": list(FEET)}
    evaluation = EVALUATION

    def __init__(self, **params: float) -> None:
        self.p = G1Params.with_defaults(**params)
        self._model: mujoco.MjModel | None = None

    def model(self) -> mujoco.MjModel:
        """The G1 scene at the task's ``timestep``: the same model TaskVectorEnv builds for the
        C++ task (the registry's TaskInfo.load_model applies it)."""
        if self._model is None:
            from lightning_unilab.envs import tasks

            self._model = tasks.get(G1WalkFlat.name).load_model(dataclasses.asdict(self.p))
            self._setup(self._model)
        return self._model

    def _setup(self, m: mujoco.MjModel) -> None:
        p = self.p
        self.frame_skip = frame_skip(p.ctrl_dt, p.timestep)
        if not (math.isfinite(p.max_speed) and p.max_speed >= 0):
            raise ValueError(f"g1-walk-flat: max_speed must be a finite number >= 0 (0: no "
                             f"bound), got {p.max_speed!r}")
        damped = not int(m.opt.disableflags) & int(mujoco.mjtDisableBit.mjDSBL_EULERDAMP)
        if p.eulerdamp not in (0, 1) or damped != bool(p.eulerdamp):
            raise ValueError(f"g1-walk-flat: eulerdamp must be 0 or 1 and the model's flag, got "
                             f"{p.eulerdamp!r} (the model's: {int(damped)})")
        if (m.opt.integrator, m.opt.iterations) != (p.integrator, p.solver_iterations):
            raise ValueError(f"g1-walk-flat: the model's integrator {m.opt.integrator} and solver "
                             f"iterations {m.opt.iterations} are not the task's "
                             f"{p.integrator!r} and {p.solver_iterations!r}")
        if m.opt.timestep != p.timestep:
            raise ValueError(f"g1-walk-flat: the model's opt.timestep {m.opt.timestep!r} is not "
                             f"the task's timestep {p.timestep!r}")
        if p.observe_linvel not in (0, 1):
            raise ValueError(f"g1-walk-flat: observe_linvel must be 0 or 1, got "
                             f"{p.observe_linvel!r}")
        if not (math.isfinite(p.upper_body_action_factor) and p.upper_body_action_factor >= 0):
            raise ValueError(f"g1-walk-flat: upper_body_action_factor must be a finite number "
                             f">= 0, got {p.upper_body_action_factor!r}")
        leg = np.array([any(part in m.joint(int(j)).name for part in ("hip", "knee", "ankle"))
                        for j in m.actuator_trnid[:, 0]])
        self.action_scale = p.action_scale * np.where(leg, 1.0, p.upper_body_action_factor)
        if not (0.0 <= p.push_low <= p.push_high and math.isfinite(p.push_high)):
            raise ValueError(f"g1-walk-flat: push_low, push_high: expected 0 <= push_low <= "
                             f"push_high (m/s), got {p.push_low!r} and {p.push_high!r}")
        self.dt = self.frame_skip * p.timestep
        self.max_episode_steps = round(p.episode_length_s / self.dt)
        self.push_period = int(p.resample_steps) or self.max_episode_steps
        key = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY, "knees_bent")
        self.robot = terms.Robot.from_model(m, keyframe=key if key >= 0 else None)
        self.keyframe = "knees_bent" if key >= 0 else None
        base = next(j for j in range(m.njnt) if m.jnt_qposadr[j] == self.robot.base_qpos)
        bounds = [[getattr(p, low), getattr(p, high)] for low, high in COMMAND_PARAMS.values()]
        self.obs_terms = observation_terms(bool(p.observe_linvel), p.gait_frequency,
                                           m.joint(base).name, bounds)
        self.obs_size = sum(t.size for t in self.obs_terms)  # OBS, + 3 with observe_linvel
        self._setup_robustness()
        self.home = self.robot.default_qpos
        self.default = self.robot.default_joint_pos
        self.s_gyro = terms.sensor_slice(m, "gyro_pelvis")
        self.s_local_linvel = terms.sensor_slice(m, "local_linvel_pelvis")
        self.s_global_linvel = terms.sensor_slice(m, "global_linvel_pelvis")
        # (2, 3) sensordata columns: sensordata[:, s_foot_linvel] is (n, feet, xyz)
        self.s_foot_linvel = np.array([np.r_[terms.sensor_slice(m, f"{side}_foot_global_linvel")]
                                       for side in ("left", "right")])
        self.s_contact = terms.sensor_columns(m, ["left_foot_floor_found",
                                                  "right_foot_floor_found"])
        addrs = list(np.arange(m.nq)[self.robot.joint_qpos])

        def col(joint: str) -> int:  # the joint's column among the robot's joints
            return addrs.index(int(m.jnt_qposadr[m.joint(joint).id]))

        # (2, 2) hip columns among the joints: each side's roll, yaw; (2,) the knees'
        self.hip_cols = np.array([[col(f"{side}_hip_{axis}_joint")
                                   for axis in ("roll", "yaw")] for side in ("left", "right")])
        self.knee_cols = np.array([col(f"{side}_knee_joint")
                                   for side in ("left", "right")])
        self.feet_sites = np.array([mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, f)
                                    for f in FEET])
        self.sole_depth = np.array([sole_depth(m, f) for f in FEET])
        self.command_low = np.array([p.command_vx_min, p.command_vy_min, p.command_yaw_min])
        self.command_high = np.array([p.command_vx_max, p.command_vy_max, p.command_yaw_max])
        self.command_keep = np.array([p.command_keep_vx, p.command_keep_vy, p.command_keep_yaw])
        for name in ("command_keep_vx", "command_keep_vy", "command_keep_yaw"):
            if not 0.0 <= getattr(p, name) <= 1.0:
                raise ValueError(f"g1-walk-flat: {name} must be a probability in [0, 1], got "
                                 f"{getattr(p, name)!r}")
        self.max_tilt = p.max_tilt_deg * np.pi / 180.0
        self.reward_sum = terms.RewardSum(
            {"tracking_lin_vel": p.w_tracking_lin_vel, "tracking_ang_vel": p.w_tracking_ang_vel,
             "lin_vel_z": p.w_lin_vel_z, "ang_vel_xy": p.w_ang_vel_xy,
             "orientation": p.w_orientation, "torques": p.w_torques,
             "action_rate": p.w_action_rate, "feet_air_time": p.w_feet_air_time,
             "feet_slip": p.w_feet_slip, "termination": p.w_termination, "alive": p.w_alive,
             "feet_phase": p.w_feet_phase, "pose": p.w_pose,
             "joint_deviation_hip": p.w_joint_deviation_hip,
             "joint_deviation_knee": p.w_joint_deviation_knee},
            scale=self.dt, floor=p.reward_floor, after_floor=("termination",))

    def _setup_robustness(self) -> None:
        """obs_noise's per-field scale of the actor's observation, and action_delay_prob:
        finite and >= 0 (a probability for the delay), else ValueError (C++'s
        ReadRobustness)."""
        p = self.p
        for name in ("obs_noise", *NOISE_PARAMS.values()):
            value = getattr(p, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"g1-walk-flat: {name}: expected a finite number >= 0, got "
                                 f"{value!r}")
        if not 0.0 <= p.action_delay_prob <= 1.0:
            raise ValueError(f"g1-walk-flat: action_delay_prob: expected a probability in "
                             f"[0, 1], got {p.action_delay_prob!r}")
        self.noise_scale = np.concatenate([
            np.full(t.size, p.obs_noise * getattr(p, NOISE_PARAMS[t.name])
                    if t.name in NOISE_PARAMS else 0.0) for t in self.obs_terms])
        self.robust = p.obs_noise > 0 or p.action_delay_prob > 0

    @property
    def spec(self) -> TaskSpec:
        self.model()
        return TaskSpec(obs_size=self.obs_size, critic_size=self.obs_size + CRITIC_EXTRA,
                        action_size=JOINTS,
                        frame_skip=self.frame_skip,
                        max_episode_steps=self.max_episode_steps,
                        memory_size=MEMORY if self.robust else PLAIN_MEMORY,
                        resample_steps=int(self.p.resample_steps),
                        max_speed=self.p.max_speed,
                        action_low=-np.ones(JOINTS), action_high=np.ones(JOINTS),
                        info_names=self.reward_sum.info_names + SERIES)

    def deployment(self) -> Deployment:
        """The observation layout, the action mapping of :meth:`controls` and the control
        period, for the export's JSON and a robot program."""
        m = self.model()
        joints = m.actuator_trnid[:, 0]
        # the observed joints (the robot's, model order) are the actuated ones in action order
        if not np.array_equal(m.jnt_qposadr[joints], np.arange(m.nq)[self.robot.joint_qpos]):
            raise ValueError("g1-walk-flat: the model's actuators are not in its joints' order; "
                             "the observation's joint terms would not be in action order")
        p = self.p
        return Deployment(
            observation=self.obs_terms, joint_names=tuple(m.joint(int(j)).name for j in joints),
            action_scale=self.action_scale.copy(), default_joint_pos=self.default.copy(),
            control_dt=self.dt, substeps=self.frame_skip, keyframe=self.keyframe,
            command=COMMAND_PARAMS,
            fall={"min_base_height": p.min_base_height, "max_tilt_deg": p.max_tilt_deg},
            no_fall={"min_base_height": -math.inf, "max_tilt_deg": 180.0})

    # ------------------------------------------------------------------ array level

    def sample_start(self, ids: np.ndarray, rng: EnvRng) -> tuple[np.ndarray, np.ndarray]:
        """Start qpos (n, 36) and base velocities (n, 6) for the envs ids."""
        qpos = terms.reset_joints(rng, ids, self.robot, self.p.reset_joint_noise)
        return qpos, terms.reset_base_velocity(rng, ids, self.p.reset_base_vel_noise)

    def controls(self, actions: np.ndarray) -> np.ndarray:
        return self.default + self.action_scale * actions

    def foot_heights(self, feet_z: np.ndarray) -> np.ndarray:
        """(n, 2) soles' heights above the floor (0 standing) from the foot sites' world z."""
        return feet_z - self.sole_depth

    def rewards(self, qpos: np.ndarray, qvel: np.ndarray, sensordata: np.ndarray,
                actuator_force: np.ndarray, actions: np.ndarray, memory: np.ndarray,
                feet_z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reward and termination of n envs; updates their memory rows (returned copy-free).
        feet_z (n, 2): the foot sites' world z (``site_xpos[:, feet_sites, 2]``)."""
        reward, fallen, _ = self.rewards_info(qpos, qvel, sensordata, actuator_force, actions,
                                              memory, feet_z)
        return reward, fallen

    def rewards_info(self, qpos: np.ndarray, qvel: np.ndarray, sensordata: np.ndarray,
                     actuator_force: np.ndarray, actions: np.ndarray, memory: np.ndarray,
                     feet_z: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """:meth:`rewards` and the step's info (``spec.info_names``): each term's share of
        the reward, what the floor added, and the evaluation's :data:`SERIES`."""
        p = self.p
        s = sensordata
        gyro = s[:, self.s_gyro]
        cmd = memory[:, COMMAND]
        g = terms.projected_gravity(qpos[:, self.robot.base_quat])
        contact = terms.contact_found(s, self.s_contact)
        air = terms.feet_air_time(contact, memory[:, AIR_TIME], memory[:, LAST_CONTACT],
                                  self.dt, p.air_time_threshold)
        moving = cmd[:, 0] * cmd[:, 0] + cmd[:, 1] * cmd[:, 1] > 0.01
        air = np.where(moving, air, 0.0)
        # the clock the policy saw (this step's count); not computed at weight 0, as in C++
        phase = np.zeros(len(qpos))
        if p.w_feet_phase != 0:
            clock = terms.gait_phase(memory[:, STEP], self.dt, p.gait_frequency, (0.0, np.pi))
            phase = np.where(moving, terms.feet_phase(self.foot_heights(feet_z), clock,
                                                      p.feet_phase_swing_height,
                                                      p.feet_phase_sigma), 0.0)
        rel = terms.joint_pos_rel(qpos, self.robot)
        # hip roll left free while the command steps sideways (C++'s rule)
        hip_weights = np.ones((len(qpos), 2, 2))
        hip_weights[:, :, 0] = np.where(np.abs(cmd[:, 1]) > 0.1, 0.0, 1.0)[:, None]
        fallen = (terms.nonfinite(qpos, qvel) | terms.base_too_low(qpos[:, 2], p.min_base_height)
                  | terms.tilted(g, self.max_tilt))
        linvel = s[:, self.s_local_linvel]
        reward, info = self.reward_sum({
            "tracking_lin_vel": terms.tracking_lin_vel_xy(cmd, linvel, p.tracking_sigma),
            "tracking_ang_vel": terms.tracking_yaw_rate(cmd[:, 2], gyro[:, 2], p.tracking_sigma),
            "lin_vel_z": terms.lin_vel_z(s[:, self.s_global_linvel.start + 2]),
            "ang_vel_xy": terms.ang_vel_xy(gyro),
            "orientation": terms.flat_orientation(g),
            "torques": terms.torques(actuator_force),
            "action_rate": terms.action_rate(actions, memory[:, LAST_ACTION]),
            "feet_air_time": air,
            "feet_slip": terms.feet_slip(contact, s[:, self.s_foot_linvel]),
            "termination": fallen,
            "alive": ~fallen,
            "feet_phase": phase,
            "pose": terms.pose_deviation(rel),
            "joint_deviation_hip": terms.joint_deviation(rel[:, self.hip_cols.ravel()],
                                                         hip_weights.reshape(len(qpos), 4)),
            "joint_deviation_knee": terms.joint_deviation(rel[:, self.knee_cols], np.ones(2)),
        })
        info.update({"vx": linvel[:, 0], "vy": linvel[:, 1], "yaw_rate": gyro[:, 2],
                     "vx_command": cmd[:, 0].copy(), "vy_command": cmd[:, 1].copy(),
                     "yaw_rate_command": cmd[:, 2].copy(), "base_height": qpos[:, 2]})
        memory[:, LAST_ACTION] = actions
        memory[:, STEP] += 1
        return reward, fallen, info

    def observe_arrays(self, qpos: np.ndarray, qvel: np.ndarray, sensordata: np.ndarray,
                       memory: np.ndarray, critic: bool = True
                       ) -> tuple[np.ndarray, np.ndarray | None]:
        s = sensordata
        phase = terms.gait_phase(memory[:, STEP], self.dt, self.p.gait_frequency)
        linvel = s[:, self.s_local_linvel]
        parts = {"gyro": s[:, self.s_gyro],
                 "projected_gravity": terms.projected_gravity(qpos[:, self.robot.base_quat]),
                 "joint_pos": terms.joint_pos_rel(qpos, self.robot),
                 "joint_vel": terms.joint_vel(qvel, self.robot),
                 "last_action": memory[:, LAST_ACTION], "command": memory[:, COMMAND],
                 "gait_clock": terms.gait_clock(phase), "local_linvel": linvel}
        # in the order of obs_terms: the one statement of the layout (the export's JSON too)
        obs = np.concatenate([parts[t.name] for t in self.obs_terms], axis=1)
        crit = None
        if critic:
            contact = terms.contact_found(s, self.s_contact).astype(np.float64)
            crit = np.concatenate([obs, linvel, qpos[:, 2:3], contact,
                                   memory[:, AIR_TIME]], axis=1)
        if self.p.obs_noise > 0:  # the actor's alone, after the critic's clean copy
            obs = terms.observation_noise(obs, memory[:, NOISE_KEY], memory[:, STEP],
                                          self.noise_scale)
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
        memory[ids, COMMAND] = terms.sample_velocity_command(rng, ids, self.command_low,
                                                             self.command_high, self.command_keep)
        if self.p.push_high > 0:
            memory[ids, PUSH] = terms.sample_push(rng, ids, self.push_period, self.p.push_low,
                                                  self.p.push_high)
        start = ids[memory[ids, STEP] == 0]  # the episodes' starts: their training-only draws
        if self.p.obs_noise > 0:
            memory[start, NOISE_KEY] = rng.uniform(start, 0.0, 2.0**53, 1)[:, 0]  # whole numbers
        if self.p.action_delay_prob > 0:
            drawn = rng.uniform(start, 0.0, 1.0, 1)[:, 0]
            memory[start, DELAYED] = drawn < self.p.action_delay_prob

    def act(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
            memory: np.ndarray) -> None:
        applied = actions
        if self.p.action_delay_prob > 0:  # a delayed episode: the previous step's action
            mem = memory[ids]
            applied = np.where(mem[:, DELAYED, None] != 0, mem[:, LAST_ACTION], actions)
        pool.ctrl[ids] = self.controls(applied)
        if self.p.push_high > 0:
            push, qvel = memory[ids, PUSH], pool.qvel[ids]
            if terms.apply_due_push(qvel, push, self.robot).any():
                pool.qvel[ids] = qvel
            memory[ids, PUSH] = push

    def evaluate(self, pool: BatchEnvPool, ids: np.ndarray, actions: np.ndarray,
                 memory: np.ndarray) -> Transition:
        mem = memory[ids]
        reward, fallen, info = self.rewards_info(
            pool.qpos[ids], pool.qvel[ids], self._sensors(pool, ids),
            pool.outputs["actuator_force"][ids, :, 0], actions, mem,
            pool.outputs["site_xpos"][ids, :, 2])
        memory[ids] = mem
        return Transition(reward=reward, terminated=fallen, info=info)

    def observe(self, pool: BatchEnvPool, ids: np.ndarray, memory: np.ndarray,
                obs: np.ndarray, critic: np.ndarray | None) -> None:
        o, c = self.observe_arrays(pool.qpos[ids], pool.qvel[ids], self._sensors(pool, ids),
                                   memory[ids], critic is not None)
        obs[ids] = o
        if critic is not None:
            critic[ids] = c


def sole_depth(m: mujoco.MjModel, foot: str) -> float:
    """How far the sole of the box geom ``foot`` lies below the site ``foot`` (same body): site
    z minus this is the sole's height above the floor while the foot is level (C++'s
    FootSite)."""
    site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, foot)
    geom = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, foot)
    if site < 0 or geom < 0 or m.geom_type[geom] != mujoco.mjtGeom.mjGEOM_BOX \
            or m.geom_bodyid[geom] != m.site_bodyid[site]:
        raise ValueError(f"g1-walk-flat: the model lacks the foot site and box geom {foot} on "
                         "one body")
    return float(m.site_pos[site, 2] - (m.geom_pos[geom, 2] - m.geom_size[geom, 2]))

