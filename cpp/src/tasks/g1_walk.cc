// g1-walk-flat: the 29-DoF Unitree G1 on flat ground tracking a commanded planar velocity and yaw
// rate, in the style of MuJoCo Playground's G1 joystick task (our own terms and weights, all in
// docs/unilab/tasks.md). lightning_unilab/envs/tasks/g1_walk.py is the numpy twin and test
// reference: change both together.
//
// Sensor values (and the foot sites' site_xpos, feet_phase's heights) are those of the last
// substep's forward pass (as mj_step leaves them, one substep stale), which costs no extra
// forward pass per control step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "omnilab/task.h"

namespace omnilab {

namespace {

constexpr int kJoints = 29;
// memory layout
constexpr int kLastAction = 0;
constexpr int kCommand = kLastAction + kJoints;
constexpr int kAirTime = kCommand + 3;
constexpr int kLastContact = kAirTime + 2;
constexpr int kStep = kLastContact + 2;
constexpr int kPush = kStep + 1;  // the next push: steps until it, then its (vx, vy)
constexpr int kMemory = kPush + 3;
// training-only columns, there only while obs_noise or action_delay_prob is on (off, the memory
// is the 40 above, so that an env state saved before them still loads): the episode's noise key
// (a 53-bit whole number) and whether the episode's actions are delayed (1) or not (0)
constexpr int kNoiseKey = kMemory;
constexpr int kDelayed = kNoiseKey + 1;
constexpr int kRobustMemory = kDelayed + 1;
constexpr int kObs = 3 + 3 + kJoints + kJoints + kJoints + 3 + 2;  // 98, + 3 with observe_linvel
constexpr int kCriticExtra = 3 + 1 + 2 + 2;                          // after the actor's
constexpr double kStepRatioTolerance = 1e-4;  // of ctrl_dt / timestep, from a whole number

// g1-walk-flat's parameters and their defaults: the one table. The numpy twin
// (lightning_unilab/envs/tasks/g1_walk.py) reads it through _core.task_defaults.
const TaskParams& Defaults() {
  static const TaskParams defaults = {
      {"ctrl_dt", 0.02},
      // the physics step: the scene's own 10 x 2 ms per control step. 4 x 5 ms (Isaac Lab's G1
      // velocity task) is stable under random and zero actions but not under a trained policy:
      // 2% of its env steps passed 100 rad/s, peaks of thousands (docs/unilab/tasks.md,
      // "Stability"). The model must carry it (TaskVectorEnv sets m->opt.timestep from this
      // parameter before the pool is built); the task checks that it does.
      {"timestep", 0.002},
      // 1: MuJoCo's implicit joint damping in the Euler integrator, which the scene turns off
      // (for MJX). On, the trained policy's blow-ups at 5 ms fell 380x, but the standing robot
      // jitters (joint speeds to 73 rad/s under zero actions). A model-level parameter too.
      {"eulerdamp", 0.0},
      // MuJoCo's integrator (mjtIntegrator: 0 Euler, 1 RK4, 2 implicit, 3 implicitfast) and
      // the constraint solver's iteration cap, model-level parameters as timestep is. The
      // scene's Euler at 2 ms with 3 iterations (tuned for MJX) is the default; implicitfast
      // is stable at 6.67 ms x 3 substeps with 10 (docs/unilab/tasks.md, "Stability").
      {"integrator", 0.0},
      {"solver_iterations", 3.0},
      {"episode_length_s", 20.0},
      // rad/s (m/s on the base's linear dofs): a substep that leaves any dof faster is rolled
      // back and its episode truncated, as after a MuJoCo warning. A trained policy met a finite
      // blow-up (thousands of rad/s, no warning) that poisoned the observation normalizer;
      // random actions stay below 27 rad/s at 5 ms (docs/unilab/tasks.md, "Stability"). 0: off
      {"max_speed", 100.0},
      {"resample_steps", 0},
      // 1: the actor also observes the pelvis's local linear velocity (the critic always
      // does), appended after the gait clock, as MuJoCo Playground's G1 and Isaac Lab's velocity
      // tasks give their actors (screened: docs/unilab/results.md, "The forward freeze")
      {"observe_linvel", 0.0},
      // m/s: one push per command period (resample_steps, else the episode), at a step drawn
      // in it: the base's planar velocity changes by U(push_low, push_high) in a drawn world
      // direction, as MuJoCo Playground's G1 joystick trains (0.1 to 2 m/s every 5 to 10 s).
      // push_high 0: off (no draws). The evaluation turns pushes off (evaluate.py).
      {"push_low", 0.0},
      {"push_high", 0.0},
      // the actor's observation noise, as MuJoCo Playground's G1 joystick: each noised field
      // + U(-1, 1) x obs_noise x its term's magnitude (rad/s, -, rad, rad/s, m/s); none on the
      // last action, command or gait clock, none in the critic's copy. obs_noise 0: off (no
      // draws). The draws are a stream of the episode's noise key and the step count, so that
      // Observe needs no Rng and observing a state twice gives the same noise.
      {"obs_noise", 0.0},
      {"obs_noise_gyro", 0.2},
      {"obs_noise_gravity", 0.05},
      {"obs_noise_joint_pos", 0.03},
      {"obs_noise_joint_vel", 1.5},
      {"obs_noise_linvel", 0.1},
      // the probability that an episode's actions act one control step late: drawn at each
      // episode start, a delayed env applies the previous step's action (zeros, the home pose,
      // at the first step). The action-rate reward keeps the policy's own actions. 0: off (no
      // draws). The evaluation turns both off.
      {"action_delay_prob", 0.0},
      {"action_scale", 0.5},
      // the waist's and arms' action scale is action_scale x this: 0 holds them at the home
      // pose, so that the policy walks with its legs alone (Unitree's rl_gym trains the G1's
      // 12 leg joints only); their action fields are then ignored
      {"upper_body_action_factor", 1.0},
      {"reset_joint_noise", 0.1},
      {"reset_base_vel_noise", 0.2},
      {"command_vx_min", -1.0},
      {"command_vx_max", 1.0},
      {"command_vy_min", -0.5},
      {"command_vy_max", 0.5},
      {"command_yaw_min", -1.0},
      {"command_yaw_max", 1.0},
      // the probability that a drawn command component is kept, else it is 0: MuJoCo
      // Playground's G1 joystick keeps vx 0.9, vy 0.25 and the yaw rate 0.5 of the time, so
      // that most commands walk straight. All 1: no draws (the stream of the plain draw).
      {"command_keep_vx", 1.0},
      {"command_keep_vy", 1.0},
      {"command_keep_yaw", 1.0},
      {"gait_frequency", 1.25},
      {"min_base_height", 0.55},
      {"max_tilt_deg", 25.0},
      {"tracking_sigma", 0.25},
      {"air_time_threshold", 0.4},
      // feet_phase: each foot's height above the floor follows a swing target on the gait
      // clock (MuJoCo Playground's G1 joystick term and sigma; its swing target is 0.15 m on
      // the foot site, ours 0.08 m on the sole: 0.12 stood still, docs/unilab/results.md)
      {"feet_phase_swing_height", 0.08},
      {"feet_phase_sigma", 0.01},
      {"w_tracking_lin_vel", 1.0},
      {"w_tracking_ang_vel", 0.5},
      {"w_lin_vel_z", -2.0},
      {"w_ang_vel_xy", -0.05},
      {"w_orientation", -1.0},
      {"w_torques", -1e-5},
      {"w_action_rate", -0.01},
      {"w_feet_air_time", 2.0},
      {"w_feet_slip", -0.25},
      {"w_termination", -1.0},
      {"w_alive", 0.0},
      {"w_feet_phase", 0.0},
      // posture, as MuJoCo Playground's G1 joystick (its weights: -0.1, -0.25, -0.1): pose is
      // the squared distance of all 29 joints from the home pose; joint_deviation_hip the summed
      // |deviation| of both hips' roll and yaw (roll left free while |command vy| > 0.1: a
      // sideways step needs it); joint_deviation_knee that of both knees
      {"w_pose", 0.0},
      {"w_joint_deviation_hip", 0.0},
      {"w_joint_deviation_knee", 0.0},
      {"reward_floor", 0.0},
  };
  return defaults;
}

// params[key] if given, else the table's default (every parameter read has one).
double Param(ParamReader& p, const std::string& key) { return p.Get(key, Defaults().at(key)); }

// x in the fewest digits that read back as x (0.005, not 0.0050000000000000001).
std::string Num(double x) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// Substeps per control step: ctrl_dt / timestep, which must be a whole number (within 1e-4,
// so that 0.0066667 passes for ctrl_dt / 3) of at least 1. The numpy twin's frame_skip() is the
// same rule.
int FrameSkip(double ctrl_dt, double timestep) {
  if (!(timestep > 0) || !std::isfinite(timestep)) {
    throw std::invalid_argument("g1-walk-flat: timestep must be a positive number, got " +
                                Num(timestep));
  }
  const double ratio = ctrl_dt / timestep;
  const double whole = std::round(ratio);
  if (!(whole >= 1) || !(std::abs(ratio - whole) <= kStepRatioTolerance)) {
    throw std::invalid_argument("g1-walk-flat: ctrl_dt " + Num(ctrl_dt) + " / timestep " +
                                Num(timestep) + " = " + Num(ratio) +
                                " must be a whole number of substeps (>= 1)");
  }
  return static_cast<int>(whole);
}

class G1WalkFlat : public Task {
 public:
  G1WalkFlat(const mjModel* m, ParamReader& p) {
    if (m->nu != kJoints || m->nq != 7 + kJoints || m->nv != 6 + kJoints) {
      throw std::invalid_argument("g1-walk-flat needs the 29-DoF G1 model (nu 29, nq 36)");
    }
    const double ctrl_dt = Param(p, "ctrl_dt");
    const double timestep = Param(p, "timestep");
    spec_.frame_skip = FrameSkip(ctrl_dt, timestep);
    if (m->opt.timestep != timestep) {
      throw std::invalid_argument(
          "g1-walk-flat: the model's opt.timestep " + Num(m->opt.timestep) +
          " is not the task's timestep " + Num(timestep) +
          " (set model.opt.timestep to the task's timestep before building the pool, as "
          "TaskVectorEnv does)");
    }
    const double eulerdamp = Param(p, "eulerdamp");
    if (eulerdamp != 0 && eulerdamp != 1) {
      throw std::invalid_argument("g1-walk-flat: eulerdamp must be 0 or 1, got " + Num(eulerdamp));
    }
    if ((eulerdamp != 0) == ((m->opt.disableflags & mjDSBL_EULERDAMP) != 0)) {
      throw std::invalid_argument(
          "g1-walk-flat: the model's eulerdamp flag is not the task's eulerdamp " + Num(eulerdamp) +
          " (set it in model.opt.disableflags before building the pool, as TaskVectorEnv does)");
    }
    CheckSolverParams("g1-walk-flat", m, Param(p, "integrator"), Param(p, "solver_iterations"));
    dt_ = spec_.frame_skip * timestep;
    spec_.max_episode_steps = static_cast<int>(std::lround(Param(p, "episode_length_s") / dt_));
    spec_.resample_steps = static_cast<int>(Param(p, "resample_steps"));
    spec_.max_speed = Param(p, "max_speed");
    if (!(spec_.max_speed >= 0) || !std::isfinite(spec_.max_speed)) {
      throw std::invalid_argument("g1-walk-flat: max_speed must be a finite number >= 0 (0: no "
                                  "bound), got " + Num(spec_.max_speed));
    }
    const double observe_linvel = Param(p, "observe_linvel");
    if (observe_linvel != 0 && observe_linvel != 1) {
      throw std::invalid_argument("g1-walk-flat: observe_linvel must be 0 or 1, got " +
                                  Num(observe_linvel));
    }
    observe_linvel_ = observe_linvel != 0;
    spec_.obs_size = kObs + (observe_linvel_ ? 3 : 0);
    spec_.critic_size = spec_.obs_size + kCriticExtra;
    spec_.action_size = kJoints;
    ReadRobustness(p);
    spec_.memory_size = noise_on_ || delay_prob_ > 0 ? kRobustMemory : kMemory;
    spec_.action_low.assign(kJoints, -1.0);
    spec_.action_high.assign(kJoints, 1.0);
    // each term's share of the reward (ctrl_dt x weight x term): they sum to the reward
    spec_.info_names = {"reward_tracking_lin_vel", "reward_tracking_ang_vel", "reward_lin_vel_z",
                        "reward_ang_vel_xy",       "reward_orientation",      "reward_torques",
                        "reward_action_rate",      "reward_feet_air_time",    "reward_feet_slip",
                        "reward_termination",      "reward_alive",            "reward_feet_phase",
                        "reward_pose",             "reward_joint_deviation_hip",
                        "reward_joint_deviation_knee", "reward_floor",
                        // the evaluation's series: the pelvis's local velocity (sensor) and
                        // yaw rate (gyro) against the command, and the base height
                        "vx", "vy", "yaw_rate", "vx_command", "vy_command", "yaw_rate_command",
                        "base_height"};

    push_low_ = Param(p, "push_low");
    push_high_ = Param(p, "push_high");
    if (!(push_low_ >= 0 && push_low_ <= push_high_) || !std::isfinite(push_high_)) {
      throw std::invalid_argument("g1-walk-flat: push_low, push_high: expected 0 <= push_low <= "
                                  "push_high (m/s), got " + Num(push_low_) + " and " +
                                  Num(push_high_));
    }
    push_period_ = spec_.resample_steps > 0 ? spec_.resample_steps : spec_.max_episode_steps;
    const double action_scale = Param(p, "action_scale");
    const double upper = Param(p, "upper_body_action_factor");
    if (!(upper >= 0) || !std::isfinite(upper)) {
      throw std::invalid_argument("g1-walk-flat: upper_body_action_factor must be a finite "
                                  "number >= 0, got " + Num(upper));
    }
    joint_noise_ = Param(p, "reset_joint_noise");
    base_vel_noise_ = Param(p, "reset_base_vel_noise");
    command_low_[0] = Param(p, "command_vx_min");
    command_high_[0] = Param(p, "command_vx_max");
    command_low_[1] = Param(p, "command_vy_min");
    command_high_[1] = Param(p, "command_vy_max");
    command_low_[2] = Param(p, "command_yaw_min");
    command_high_[2] = Param(p, "command_yaw_max");
    command_keep_[0] = Param(p, "command_keep_vx");
    command_keep_[1] = Param(p, "command_keep_vy");
    command_keep_[2] = Param(p, "command_keep_yaw");
    const char* keep_names[] = {"command_keep_vx", "command_keep_vy", "command_keep_yaw"};
    for (int i = 0; i < 3; ++i) {
      if (!(command_keep_[i] >= 0 && command_keep_[i] <= 1)) {
        throw std::invalid_argument(std::string("g1-walk-flat: ") + keep_names[i] +
                                    " must be a probability in [0, 1], got " +
                                    Num(command_keep_[i]));
      }
      if (command_keep_[i] < 1) keep_draws_ = true;
    }
    gait_frequency_ = Param(p, "gait_frequency");
    min_height_ = Param(p, "min_base_height");
    cos_max_tilt_ = std::cos(Param(p, "max_tilt_deg") * M_PI / 180.0);
    sigma_ = Param(p, "tracking_sigma");
    air_threshold_ = Param(p, "air_time_threshold");
    w_lin_ = Param(p, "w_tracking_lin_vel");
    w_ang_ = Param(p, "w_tracking_ang_vel");
    w_linz_ = Param(p, "w_lin_vel_z");
    w_angxy_ = Param(p, "w_ang_vel_xy");
    w_orient_ = Param(p, "w_orientation");
    w_torque_ = Param(p, "w_torques");
    w_rate_ = Param(p, "w_action_rate");
    w_air_ = Param(p, "w_feet_air_time");
    w_slip_ = Param(p, "w_feet_slip");
    w_term_ = Param(p, "w_termination");
    w_alive_ = Param(p, "w_alive");
    w_phase_ = Param(p, "w_feet_phase");
    swing_height_ = Param(p, "feet_phase_swing_height");
    phase_sigma_ = Param(p, "feet_phase_sigma");
    w_pose_ = Param(p, "w_pose");
    w_hip_ = Param(p, "w_joint_deviation_hip");
    w_knee_ = Param(p, "w_joint_deviation_knee");
    // The step's reward is at least this (MuJoCo Playground's joystick tasks and legged_gym's
    // only_positive_rewards use 0): with penalties outweighing the tracking terms early on, a
    // negative per-step reward makes falling at once the best policy.
    reward_floor_ = Param(p, "reward_floor");

    const int key = mj_name2id(m, mjOBJ_KEY, "knees_bent");
    const mjtNum* pose = key >= 0 ? m->key_qpos + static_cast<size_t>(key) * m->nq : m->qpos0;
    for (int i = 0; i < 7 + kJoints; ++i) home_[i] = pose[i];
    gyro_ = Sensor(m, "gyro_pelvis", 3);
    local_linvel_ = Sensor(m, "local_linvel_pelvis", 3);
    global_linvel_ = Sensor(m, "global_linvel_pelvis", 3);
    foot_linvel_[0] = Sensor(m, "left_foot_global_linvel", 3);
    foot_linvel_[1] = Sensor(m, "right_foot_global_linvel", 3);
    foot_contact_[0] = Sensor(m, "left_foot_floor_found", 1);
    foot_contact_[1] = Sensor(m, "right_foot_floor_found", 1);
    FootSite(m, "left_foot", &foot_site_[0], &sole_depth_[0]);
    FootSite(m, "right_foot", &foot_site_[1], &sole_depth_[1]);
    // a leg joint is one of the hips, knees or ankles; every other joint is the upper body's
    for (int i = 0; i < kJoints; ++i) {
      const char* raw = mj_id2name(m, mjOBJ_JOINT, m->actuator_trnid[2 * i]);
      const std::string name = raw ? raw : "";
      const bool leg = name.find("hip") != std::string::npos ||
                       name.find("knee") != std::string::npos ||
                       name.find("ankle") != std::string::npos;
      action_scale_[i] = leg ? action_scale : action_scale * upper;
    }
    const char* sides[] = {"left", "right"};
    for (int f = 0; f < 2; ++f) {
      hip_roll_[f] = Joint(m, std::string(sides[f]) + "_hip_roll_joint");
      hip_yaw_[f] = Joint(m, std::string(sides[f]) + "_hip_yaw_joint");
      knee_[f] = Joint(m, std::string(sides[f]) + "_knee_joint");
    }
  }

  void Reset(const mjModel*, mjData* d, Rng& rng, mjtNum*) const override {
    for (int i = 0; i < 7 + kJoints; ++i) d->qpos[i] = home_[i];
    for (int i = 0; i < kJoints; ++i) d->qpos[7 + i] += rng.Uniform(-joint_noise_, joint_noise_);
    for (int i = 0; i < 6; ++i) d->qvel[i] = rng.Uniform(-base_vel_noise_, base_vel_noise_);
  }

  void Start(const mjModel*, const mjData*, mjtNum* memory) const override {
    for (int i = 0; i < spec_.memory_size; ++i) memory[i] = 0;
  }

  void Resample(Rng& rng, mjtNum* memory) const override {
    for (int i = 0; i < 3; ++i) memory[kCommand + i] = rng.Uniform(command_low_[i], command_high_[i]);
    if (keep_draws_) {  // as lightning_unilab.envs.terms.sample_velocity_command's keep
      for (int i = 0; i < 3; ++i) {
        if (rng.Uniform(0, 1) >= command_keep_[i]) memory[kCommand + i] = 0;
      }
    }
    if (push_high_ > 0) {  // as lightning_unilab.envs.terms.sample_push
      const mjtNum at = rng.Uniform(0, push_period_);
      const mjtNum speed = rng.Uniform(push_low_, push_high_);
      const mjtNum angle = rng.Uniform(-M_PI, M_PI);
      memory[kPush] = std::min(std::floor(at), push_period_ - 1.0) + 1.0;
      memory[kPush + 1] = speed * std::cos(angle);
      memory[kPush + 2] = speed * std::sin(angle);
    }
    if (memory[kStep] == 0) {  // the episode's start: its training-only draws
      if (noise_on_) memory[kNoiseKey] = rng.Uniform(0, 0x1p53);  // a whole number, exactly
      if (delay_prob_ > 0) memory[kDelayed] = rng.Uniform(0, 1) < delay_prob_ ? 1 : 0;
    }
  }

  void Act(const mjModel*, mjData* d, const mjtNum* action, mjtNum* memory) const override {
    // a delayed episode applies the previous step's action, which last_action still holds
    const bool delayed = delay_prob_ > 0 && memory[kDelayed] != 0;
    const mjtNum* applied = delayed ? memory + kLastAction : action;
    for (int i = 0; i < kJoints; ++i) d->ctrl[i] = home_[7 + i] + action_scale_[i] * applied[i];
    if (push_high_ > 0) {  // as lightning_unilab.envs.terms.apply_due_push: due once
      memory[kPush] -= 1;
      if (memory[kPush] == 0) {
        d->qvel[0] += memory[kPush + 1];
        d->qvel[1] += memory[kPush + 2];
      }
    }
  }

  void Evaluate(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory,
                Transition* out) const override {
    const mjtNum* s = d->sensordata;
    const mjtNum* gyro = s + gyro_;
    const mjtNum* v = s + local_linvel_;
    const mjtNum* cmd = memory + kCommand;
    mjtNum g[3];
    Gravity(d->qpos, g);

    const mjtNum ex = cmd[0] - v[0], ey = cmd[1] - v[1], ew = cmd[2] - gyro[2];
    const mjtNum lin = std::exp(-(ex * ex + ey * ey) / sigma_);
    const mjtNum ang = std::exp(-(ew * ew) / sigma_);
    const mjtNum vz = s[global_linvel_ + 2];
    const mjtNum linz = vz * vz;
    const mjtNum angxy = gyro[0] * gyro[0] + gyro[1] * gyro[1];
    const mjtNum orient = g[0] * g[0] + g[1] * g[1];
    mjtNum torque = 0, rate = 0;
    for (int i = 0; i < kJoints; ++i) {
      torque += d->actuator_force[i] * d->actuator_force[i];
      const mjtNum da = action[i] - memory[kLastAction + i];
      rate += da * da;
    }
    mjtNum air = 0, slip = 0;
    for (int f = 0; f < 2; ++f) {
      const bool contact = s[foot_contact_[f]] > 0;
      memory[kAirTime + f] += dt_;
      const bool first = contact && memory[kLastContact + f] == 0;
      if (first) air += memory[kAirTime + f] - air_threshold_;
      if (contact) {
        memory[kAirTime + f] = 0;
        const mjtNum* fv = s + foot_linvel_[f];
        slip += fv[0] * fv[0] + fv[1] * fv[1];
      }
      memory[kLastContact + f] = contact ? 1 : 0;
    }
    // both terms are paid only while the command asks to move
    const bool moving = cmd[0] * cmd[0] + cmd[1] * cmd[1] > 0.01;
    if (!moving) air = 0;
    // feet_phase: the feet half a cycle apart (left at phase, right at phase + pi) on the clock
    // the policy saw (this step's count, before it moves on below); not computed at weight 0
    mjtNum phase_term = 0;
    if (moving && w_phase_ != 0) {
      const mjtNum phase = 2 * M_PI * gait_frequency_ * dt_ * memory[kStep];
      mjtNum err = 0;
      for (int f = 0; f < 2; ++f) {
        const mjtNum rz = SwingTarget(phase + f * M_PI, swing_height_);
        const mjtNum e = FootHeight(d, f) - rz;
        err += e * e;
      }
      phase_term = std::exp(-err / phase_sigma_);
    }

    mjtNum pose = 0, hip = 0, knee = 0;
    for (int i = 0; i < kJoints; ++i) {
      const mjtNum e = d->qpos[7 + i] - home_[7 + i];
      pose += e * e;
    }
    const bool sideways = std::abs(cmd[1]) > 0.1;
    for (int f = 0; f < 2; ++f) {
      if (!sideways) hip += std::abs(d->qpos[hip_roll_[f]] - home_[hip_roll_[f]]);
      hip += std::abs(d->qpos[hip_yaw_[f]] - home_[hip_yaw_[f]]);
      knee += std::abs(d->qpos[knee_[f]] - home_[knee_[f]]);
    }

    bool finite = true;
    for (int i = 0; i < m->nq; ++i) finite &= std::isfinite(d->qpos[i]);
    for (int i = 0; i < m->nv; ++i) finite &= std::isfinite(d->qvel[i]);
    const bool fallen = !finite || d->qpos[2] < min_height_ || -g[2] < cos_max_tilt_;

    // the termination penalty is added after the floor (as legged_gym does), so that the floor
    // cannot cancel it: under the floor a fall would cost at most that step's positive rest
    const mjtNum floored = w_lin_ * lin + w_ang_ * ang + w_linz_ * linz + w_angxy_ * angxy +
                           w_orient_ * orient + w_torque_ * torque + w_rate_ * rate +
                           w_air_ * air + w_slip_ * slip + w_alive_ * (fallen ? 0.0 : 1.0) +
                           w_phase_ * phase_term + w_pose_ * pose + w_hip_ * hip + w_knee_ * knee;
    const mjtNum lifted = std::max(reward_floor_, dt_ * floored);
    out->reward = lifted + dt_ * w_term_ * (fallen ? 1.0 : 0.0);
    out->terminated = fallen;
    if (mjtNum* info = out->info) {
      const mjtNum terms[] = {w_lin_ * lin,   w_ang_ * ang,       w_linz_ * linz, w_angxy_ * angxy,
                              w_orient_ * orient, w_torque_ * torque, w_rate_ * rate,
                              w_air_ * air,   w_slip_ * slip,     w_term_ * (fallen ? 1.0 : 0.0),
                              w_alive_ * (fallen ? 0.0 : 1.0), w_phase_ * phase_term,
                              w_pose_ * pose, w_hip_ * hip,   w_knee_ * knee};
      constexpr int kTerms = sizeof(terms) / sizeof(terms[0]);
      for (int k = 0; k < kTerms; ++k) info[k] = dt_ * terms[k];
      info[kTerms] = lifted - dt_ * floored;  // what the floor added: shares sum to reward
      const mjtNum series[] = {v[0], v[1], gyro[2], cmd[0], cmd[1], cmd[2], d->qpos[2]};
      for (int k = 0; k < 7; ++k) info[kTerms + 1 + k] = series[k];
    }
    for (int i = 0; i < kJoints; ++i) memory[kLastAction + i] = action[i];
    memory[kStep] += 1;
  }

  void Observe(const mjModel*, const mjData* d, const mjtNum* memory, mjtNum* obs,
               mjtNum* critic) const override {
    const mjtNum* s = d->sensordata;
    mjtNum* o = obs;
    for (int i = 0; i < 3; ++i) *o++ = s[gyro_ + i];
    Gravity(d->qpos, o);
    o += 3;
    for (int i = 0; i < kJoints; ++i) *o++ = d->qpos[7 + i] - home_[7 + i];
    for (int i = 0; i < kJoints; ++i) *o++ = d->qvel[6 + i];
    for (int i = 0; i < kJoints; ++i) *o++ = memory[kLastAction + i];
    for (int i = 0; i < 3; ++i) *o++ = memory[kCommand + i];
    const mjtNum phase = 2 * M_PI * gait_frequency_ * dt_ * memory[kStep];
    *o++ = std::cos(phase);
    *o++ = std::sin(phase);
    if (observe_linvel_) {
      for (int i = 0; i < 3; ++i) *o++ = s[local_linvel_ + i];
    }
    const int actor = static_cast<int>(o - obs);
    if (critic) {
      for (int i = 0; i < actor; ++i) critic[i] = obs[i];
      mjtNum* c = critic + actor;
      for (int i = 0; i < 3; ++i) *c++ = s[local_linvel_ + i];
      *c++ = d->qpos[2];
      for (int f = 0; f < 2; ++f) *c++ = s[foot_contact_[f]] > 0 ? 1 : 0;
      for (int f = 0; f < 2; ++f) *c++ = memory[kAirTime + f];
    }
    if (noise_on_) {  // the actor's alone, after the critic's clean copy
      // as lightning_unilab.envs.terms.observation_noise: one draw per field, noised or not
      Rng stream = Rng::ForEnv(static_cast<std::uint64_t>(memory[kNoiseKey]),
                               static_cast<int>(memory[kStep]));
      for (int i = 0; i < actor; ++i) {
        const mjtNum u = stream.Uniform(-1, 1);
        if (noise_scale_[i] != 0) obs[i] += noise_scale_[i] * u;
      }
    }
  }

 private:
  // obs_noise and its terms' magnitudes (noise_scale_ per actor field), action_delay_prob:
  // finite and >= 0 (a probability for the delay), else std::invalid_argument
  void ReadRobustness(ParamReader& p) {
    const double noise = NonNegative(Param(p, "obs_noise"), "obs_noise");
    const double gyro = noise * NonNegative(Param(p, "obs_noise_gyro"), "obs_noise_gyro");
    const double gravity =
        noise * NonNegative(Param(p, "obs_noise_gravity"), "obs_noise_gravity");
    const double joint_pos =
        noise * NonNegative(Param(p, "obs_noise_joint_pos"), "obs_noise_joint_pos");
    const double joint_vel =
        noise * NonNegative(Param(p, "obs_noise_joint_vel"), "obs_noise_joint_vel");
    const double linvel = noise * NonNegative(Param(p, "obs_noise_linvel"), "obs_noise_linvel");
    // the actor's fields in Observe's order; the last action, command and clock stay 0
    noise_scale_.assign(spec_.obs_size, 0.0);
    int at = 0;
    const auto fill = [&](int count, double scale) {
      for (int i = 0; i < count; ++i) noise_scale_[at + i] = scale;
      at += count;
    };
    fill(3, gyro);
    fill(3, gravity);
    fill(kJoints, joint_pos);
    fill(kJoints, joint_vel);
    at += kJoints + 3 + 2;
    if (observe_linvel_) fill(3, linvel);
    noise_on_ = noise > 0;
    delay_prob_ = Param(p, "action_delay_prob");
    if (!(delay_prob_ >= 0 && delay_prob_ <= 1)) {
      throw std::invalid_argument("g1-walk-flat: action_delay_prob: expected a probability in "
                                  "[0, 1], got " + Num(delay_prob_));
    }
  }

  static double NonNegative(double x, const char* name) {
    if (!(x >= 0) || !std::isfinite(x)) {
      throw std::invalid_argument(std::string("g1-walk-flat: ") + name +
                                  ": expected a finite number >= 0, got " + Num(x));
    }
    return x;
  }

  // The swing target of a foot at gait phase `phase` (radians, any value): with the phase
  // wrapped to phi in [-pi, pi) and x = (phi + pi) / (2 pi) in [0, 1), the height rises from 0
  // (x = 0) to h (x = 1/2) and falls back to 0 (x = 1) along the cubic Bezier
  // a + (b - a) (u^3 + 3 u^2 (1 - u)), u = 2x, then 2x - 1 (MuJoCo Playground's G1 joystick).
  // The twin is lightning_unilab.envs.terms.swing_target_bezier.
  static mjtNum SwingTarget(mjtNum phase, mjtNum h) {
    mjtNum wrapped = std::fmod(phase + M_PI, 2 * M_PI);  // numpy's mod: the divisor's sign
    if (wrapped < 0) wrapped += 2 * M_PI;
    const mjtNum phi = wrapped - M_PI;
    const mjtNum x = (phi + M_PI) / (2 * M_PI);
    const bool rising = x <= 0.5;
    const mjtNum u = rising ? 2 * x : 2 * x - 1;
    const mjtNum bezier = u * u * u + 3 * u * u * (1 - u);
    return rising ? h * bezier : h - h * bezier;
  }

  // World gravity direction (0, 0, -1) in the pelvis frame, from the free joint's quaternion.
  static void Gravity(const mjtNum* qpos, mjtNum* g) {
    const mjtNum w = qpos[3], x = qpos[4], y = qpos[5], z = qpos[6];
    g[0] = -2 * (x * z - w * y);
    g[1] = -2 * (y * z + w * x);
    g[2] = -(w * w - x * x - y * y + z * z);
  }

  // The foot site `name` and the depth of its foot's sole below it: the site sits in the ankle
  // body above the foot's box geom of the same name, so site z - depth is the sole's height
  // above the floor while the foot is level (0 standing, as the swing target's 0 means).
  static void FootSite(const mjModel* m, const char* name, int* site, mjtNum* depth) {
    *site = mj_name2id(m, mjOBJ_SITE, name);
    const int geom = mj_name2id(m, mjOBJ_GEOM, name);
    if (*site < 0 || geom < 0 || m->geom_type[geom] != mjGEOM_BOX ||
        m->geom_bodyid[geom] != m->site_bodyid[*site]) {
      throw std::invalid_argument(std::string("g1-walk-flat: the model lacks the foot site and "
                                              "box geom ") + name + " on one body");
    }
    *depth = m->site_pos[3 * *site + 2] - (m->geom_pos[3 * geom + 2] - m->geom_size[3 * geom + 2]);
  }

  // foot f's sole height above the floor (the last substep's kinematics, as the sensors)
  mjtNum FootHeight(const mjData* d, int f) const {
    return d->site_xpos[3 * foot_site_[f] + 2] - sole_depth_[f];
  }

  // the qpos address of the hinge joint `name`
  static int Joint(const mjModel* m, const std::string& name) {
    const int id = mj_name2id(m, mjOBJ_JOINT, name.c_str());
    if (id < 0 || m->jnt_type[id] != mjJNT_HINGE) {
      throw std::invalid_argument("g1-walk-flat: the model lacks the hinge joint " + name);
    }
    return m->jnt_qposadr[id];
  }

  static int Sensor(const mjModel* m, const char* name, int dim) {
    const int id = mj_name2id(m, mjOBJ_SENSOR, name);
    if (id < 0 || m->sensor_dim[id] != dim) {
      throw std::invalid_argument(std::string("g1-walk-flat: the model lacks sensor ") + name);
    }
    return m->sensor_adr[id];
  }

  mjtNum action_scale_[kJoints];  // per actuator: the upper body's may differ
  double dt_, joint_noise_, base_vel_noise_, gait_frequency_, min_height_,
      cos_max_tilt_, sigma_, air_threshold_;
  double command_low_[3], command_high_[3], command_keep_[3];
  bool keep_draws_ = false;
  bool observe_linvel_;
  double push_low_, push_high_, push_period_;
  std::vector<double> noise_scale_;  // per actor field: obs_noise x its term's magnitude
  bool noise_on_ = false;
  double delay_prob_ = 0;
  double w_lin_, w_ang_, w_linz_, w_angxy_, w_orient_, w_torque_, w_rate_, w_air_, w_slip_,
      w_term_, w_alive_, w_phase_, swing_height_, phase_sigma_, reward_floor_, w_pose_, w_hip_,
      w_knee_;
  mjtNum home_[7 + kJoints];
  int gyro_, local_linvel_, global_linvel_, foot_linvel_[2], foot_contact_[2], foot_site_[2];
  int hip_roll_[2], hip_yaw_[2], knee_[2];  // qpos addresses
  mjtNum sole_depth_[2];
};

}  // namespace

void RegisterG1Tasks() {
  RegisterTask(
      "g1-walk-flat",
      [](const mjModel* m, const TaskParams& params, const TaskArrays& arrays) {
        RefuseArrays("g1-walk-flat", arrays);
        ParamReader reader(params);
        auto task = std::make_unique<G1WalkFlat>(m, reader);
        reader.CheckAllUsed("g1-walk-flat");
        return std::unique_ptr<Task>(std::move(task));
      },
      Defaults());
}

}  // namespace omnilab
