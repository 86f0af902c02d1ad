"""Reusable terms of locomotion tasks: observations, rewards, terminations, reset events.

Each term is a plain function over the rows of many envs at once: (n, ...) arrays gathered
once per step from the pool's views (``qpos = pool.qpos[ids]``,
``pool.outputs["sensordata"][ids, :, 0]``), returning (n,) or (n, k). A :class:`NumpyTask`
then calls each term once per step for all its envs, never once per env. Names are resolved
to indices once, when the task is built (:class:`Robot`, :func:`sensor_columns`,
:class:`MemoryLayout`); :class:`RewardSum` weighs the reward terms into the reward and the
``info`` shares a task reports. docs/unilab/tasks.md ("Reusable terms") lists them with an
example task.
"""

from lightning_unilab.envs.terms.events import (
    apply_due_push,
    quat_mul,
    reset_base_pose,
    reset_base_velocity,
    reset_joints,
    sample_push,
    sample_velocity_command,
)
from lightning_unilab.envs.terms.layout import MemoryLayout, Robot, sensor_columns, sensor_slice
from lightning_unilab.envs.terms.observations import (
    base_ang_vel_local,
    base_lin_vel_local,
    body_lin_vel_world,
    gait_clock,
    gait_phase,
    joint_pos_rel,
    joint_vel,
    observation_noise,
    projected_gravity,
    quat_rotate_inverse,
)
from lightning_unilab.envs.terms.rewards import (
    RewardSum,
    action_rate,
    ang_vel_xy,
    base_height,
    feet_air_time,
    feet_contact_phase,
    feet_phase,
    feet_slip,
    feet_swing_height,
    flat_orientation,
    in_stance,
    joint_deviation,
    lin_vel_z,
    pose_deviation,
    swing_height_target,
    swing_target_bezier,
    torques,
    tracking_kernel,
    tracking_lin_vel_xy,
    tracking_yaw_rate,
)
from lightning_unilab.envs.terms.terminations import (
    base_too_low,
    body_contact,
    contact_found,
    nonfinite,
    tilted,
)

__all__ = [
    "MemoryLayout", "RewardSum", "Robot", "action_rate", "ang_vel_xy", "apply_due_push",
    "base_ang_vel_local",
    "base_height", "base_lin_vel_local", "base_too_low", "body_contact", "body_lin_vel_world",
    "contact_found", "feet_air_time", "feet_contact_phase", "feet_phase", "feet_slip",
    "feet_swing_height", "flat_orientation", "gait_clock", "gait_phase", "in_stance",
    "joint_deviation", "joint_pos_rel", "joint_vel", "lin_vel_z", "nonfinite",
    "observation_noise", "pose_deviation", "projected_gravity", "quat_mul",
    "quat_rotate_inverse", "reset_base_pose", "reset_base_velocity", "reset_joints",
    "sample_push", "sample_velocity_command", "sensor_columns", "sensor_slice",
    "swing_height_target", "swing_target_bezier", "tilted", "torques", "tracking_kernel",
    "tracking_lin_vel_xy", "tracking_yaw_rate",
]
