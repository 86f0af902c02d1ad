// g1-motion-tracking: the 29-DoF Unitree G1 imitating reference clips (BeyondMimic's terms, as
// UniLab's G1MotionTracking and mjlab's tracking task use them; our own defaults, all in
// docs/unilab/tracking.md). lightning_unilab/envs/tasks/g1_tracking.py is the numpy twin and
// test reference, and lays out the clip arrays this task reads: change both together.
//
// Reference frames: memory holds the frame the robot is at. Act drives toward the next frame
// (with residual actions, around its joint angles); Evaluate moves the frame on by one and
// compares the robot with it; Observe shows the frame after that, the next target. Body poses
// and velocities are those of the state after the substeps (Evaluate recomputes kinematics
// and com velocities: one cheap pass, no collision).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "omnilab/task.h"

namespace omnilab {

namespace {

constexpr int kJoints = 29;
constexpr int kNq = 7 + kJoints;
// memory layout
constexpr int kFrame = 0;    // global reference frame the robot is at
constexpr int kClip = 1;     // clip index
constexpr int kClipEnd = 2;  // the clip's last global frame
constexpr int kEvent = 3;    // 1 + the start bin of a failure that ended the episode; 0: none
constexpr int kLastAction = 4;
constexpr int kMemory = kLastAction + kJoints;
constexpr int kActorObs = kJoints * 2 + 6 + 3 + kJoints * 3;  // 154
constexpr double kStepRatioTolerance = 1e-4;
constexpr size_t kMaxBodies = 64;

const TaskParams& Defaults() {
  static const TaskParams defaults = {
      {"ctrl_dt", 0.02},
      // the physics step: the G1 scene's own 10 x 2 ms per control step, as g1-walk-flat
      {"timestep", 0.002},
      {"eulerdamp", 0.0},
      {"integrator", 0.0},         // as g1-walk-flat's: mjtIntegrator, on the model
      {"solver_iterations", 3.0},  // the model's opt.iterations
      {"max_speed", 100.0},
      // episodes end at this length or at the end of their clip, whichever comes first
      {"episode_length_s", 10.0},
      // joint targets: the next reference frame's angles (residual_actions 1) or the home
      // pose (0, BeyondMimic's offset), plus action_scale x action (rad)
      {"residual_actions", 1.0},
      {"action_scale", 0.5},
      // >= 0: every episode starts at this global frame (evaluation); -1: sampled over bins
      {"start_frame", -1.0},
      // start-frame sampling over bins of bin_s seconds of each clip: failure-weighted
      // (adaptive_sampling 1: an exponential average of the failures per bin, rate
      // adaptive_alpha, each bin also weighted by adaptive_lambda x its next bin's failures,
      // mixed with adaptive_uniform of uniform), or uniform (0)
      {"adaptive_sampling", 1.0},
      {"bin_s", 1.0},
      {"adaptive_alpha", 0.001},
      {"adaptive_uniform", 0.1},
      {"adaptive_lambda", 0.8},
      // reference state initialization noise, U(-x, x): base xy (m), roll and pitch, yaw (rad),
      // base linear and angular velocity (world frame), joint angles
      {"reset_pos_noise", 0.05},
      {"reset_tilt_noise", 0.1},
      {"reset_yaw_noise", 0.2},
      {"reset_lin_vel_noise", 0.2},
      {"reset_ang_vel_noise", 0.2},
      {"reset_joint_noise", 0.1},
      // exp(-error^2 / std^2) kernels (BeyondMimic's standard deviations)
      {"std_anchor_pos", 0.3},
      {"std_anchor_ori", 0.4},
      {"std_body_pos", 0.3},
      {"std_body_ori", 0.4},
      {"std_body_lin_vel", 1.0},
      {"std_body_ang_vel", 3.14},
      {"w_anchor_pos", 0.5},
      {"w_anchor_ori", 0.5},
      {"w_body_pos", 1.0},
      {"w_body_ori", 1.0},
      {"w_body_lin_vel", 1.0},
      {"w_body_ang_vel", 1.0},
      {"w_action_rate", -0.1},
      // summed excess of each joint over its soft range (soft_limit_factor of its range)
      {"w_joint_limit", -10.0},
      {"soft_limit_factor", 0.9},
      {"w_termination", 0.0},
      // terminations: the anchor's height, its gravity direction's z, or an end effector's
      // height off the reference by more than these
      {"max_anchor_height_error", 0.25},
      {"max_anchor_gravity_error", 0.8},
      {"max_end_effector_height_error", 0.25},
  };
  return defaults;
}

double Param(ParamReader& p, const std::string& key) { return p.Get(key, Defaults().at(key)); }

const char* kTask = "g1-motion-tracking";

[[noreturn]] void Fail(const std::string& what) {
  throw std::invalid_argument(std::string(kTask) + ": " + what);
}

// --- quaternions (w, x, y, z) and rotations -------------------------------------------------

void QuatMul(const mjtNum* a, const mjtNum* b, mjtNum* out) {
  const mjtNum w = a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3];
  const mjtNum x = a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2];
  const mjtNum y = a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1];
  const mjtNum z = a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0];
  out[0] = w, out[1] = x, out[2] = y, out[3] = z;
}

void QuatConj(const mjtNum* q, mjtNum* out) { out[0] = q[0], out[1] = -q[1], out[2] = -q[2], out[3] = -q[3]; }

// v rotated by q (q v q*)
void QuatRotate(const mjtNum* q, const mjtNum* v, mjtNum* out) {
  const mjtNum w = q[0], x = q[1], y = q[2], z = q[3];
  // t = 2 (q_xyz x v); out = v + w t + q_xyz x t
  const mjtNum tx = 2 * (y * v[2] - z * v[1]);
  const mjtNum ty = 2 * (z * v[0] - x * v[2]);
  const mjtNum tz = 2 * (x * v[1] - y * v[0]);
  out[0] = v[0] + w * tx + (y * tz - z * ty);
  out[1] = v[1] + w * ty + (z * tx - x * tz);
  out[2] = v[2] + w * tz + (x * ty - y * tx);
}

void QuatRotateInv(const mjtNum* q, const mjtNum* v, mjtNum* out) {
  mjtNum c[4];
  QuatConj(q, c);
  QuatRotate(c, v, out);
}

// The rotation angle between a and b: 2 atan2(|xyz|, |w|) of a* b.
mjtNum QuatAngle(const mjtNum* a, const mjtNum* b) {
  mjtNum c[4], r[4];
  QuatConj(a, c);
  QuatMul(c, b, r);
  return 2 * std::atan2(std::sqrt(r[1] * r[1] + r[2] * r[2] + r[3] * r[3]), std::abs(r[0]));
}

// The yaw part of q: a turn about the world z by q's heading.
void YawQuat(const mjtNum* q, mjtNum* out) {
  const mjtNum yaw = std::atan2(2 * (q[0] * q[3] + q[1] * q[2]), 1 - 2 * (q[2] * q[2] + q[3] * q[3]));
  out[0] = std::cos(0.5 * yaw), out[1] = 0, out[2] = 0, out[3] = std::sin(0.5 * yaw);
}

// The first two columns of q's rotation matrix, row by row (m00 m01 m10 m11 m20 m21).
void Rot6(const mjtNum* q, mjtNum* out) {
  mjtNum mat[9];
  mju_quat2Mat(mat, q);
  for (int r = 0; r < 3; ++r) out[2 * r] = mat[3 * r], out[2 * r + 1] = mat[3 * r + 1];
}

// q = qz(yaw) qy(pitch) qx(roll)
void QuatFromEuler(mjtNum roll, mjtNum pitch, mjtNum yaw, mjtNum* out) {
  const mjtNum cr = std::cos(0.5 * roll), sr = std::sin(0.5 * roll);
  const mjtNum cp = std::cos(0.5 * pitch), sp = std::sin(0.5 * pitch);
  const mjtNum cy = std::cos(0.5 * yaw), sy = std::sin(0.5 * yaw);
  out[0] = cy * cp * cr + sy * sp * sr;
  out[1] = cy * cp * sr - sy * sp * cr;
  out[2] = cy * sp * cr + sy * cp * sr;
  out[3] = sy * cp * cr - cy * sp * sr;
}

int FrameSkip(double ctrl_dt, double timestep) {
  if (!(timestep > 0) || !std::isfinite(timestep)) Fail("timestep must be a positive number");
  const double ratio = ctrl_dt / timestep;
  const double whole = std::round(ratio);
  if (!(whole >= 1) || !(std::abs(ratio - whole) <= kStepRatioTolerance)) {
    Fail("ctrl_dt / timestep must be a whole number of substeps (>= 1)");
  }
  return static_cast<int>(whole);
}

// What the tracking terms compare: the robot's tracked bodies against the reference's, the
// reference re-anchored to the robot's anchor in the horizontal plane and heading.
struct Comparison {
  mjtNum body_pos = 0, body_ori = 0, body_lin_vel = 0, body_ang_vel = 0;  // mean squared
  mjtNum body_pos_error = 0;  // mean distance (m)
  mjtNum anchor_pos = 0, anchor_ori = 0;  // squared distance, squared angle
  mjtNum anchor_height = 0, ref_anchor_height = 0, anchor_gravity_error = 0;
  mjtNum end_effector_height_error = 0;  // the largest
};

class G1MotionTracking : public Task {
 public:
  G1MotionTracking(const mjModel* m, ParamReader& p, const TaskArrays& arrays) {
    if (m->nu != kJoints || m->nq != kNq || m->nv != 6 + kJoints) {
      Fail("needs the 29-DoF G1 model (nu 29, nq 36)");
    }
    const double timestep = Param(p, "timestep");
    spec_.frame_skip = FrameSkip(Param(p, "ctrl_dt"), timestep);
    if (m->opt.timestep != timestep) Fail("the model's opt.timestep is not the task's timestep");
    const double eulerdamp = Param(p, "eulerdamp");
    if ((eulerdamp != 0 && eulerdamp != 1) ||
        (eulerdamp != 0) == ((m->opt.disableflags & mjDSBL_EULERDAMP) != 0)) {
      Fail("eulerdamp must be 0 or 1 and the model's flag");
    }
    CheckSolverParams("g1-motion-tracking", m, Param(p, "integrator"),
                      Param(p, "solver_iterations"));
    dt_ = spec_.frame_skip * timestep;
    spec_.max_episode_steps = static_cast<int>(std::lround(Param(p, "episode_length_s") / dt_));
    if (spec_.max_episode_steps < 1) Fail("episode_length_s must be at least one control step");
    spec_.max_speed = Param(p, "max_speed");
    if (!(spec_.max_speed >= 0) || !std::isfinite(spec_.max_speed)) Fail("max_speed must be >= 0");
    residual_ = Flag(Param(p, "residual_actions"), "residual_actions");
    action_scale_ = Param(p, "action_scale");
    start_frame_ = Param(p, "start_frame");
    adaptive_ = Flag(Param(p, "adaptive_sampling"), "adaptive_sampling");
    const double bin_s = Param(p, "bin_s");
    alpha_ = Param(p, "adaptive_alpha");
    uniform_ = Param(p, "adaptive_uniform");
    lambda_ = Param(p, "adaptive_lambda");
    if (!(bin_s > 0) || !(alpha_ >= 0 && alpha_ <= 1) || !(uniform_ >= 0 && uniform_ <= 1) ||
        !(lambda_ >= 0)) {
      Fail("bin_s > 0, adaptive_alpha and adaptive_uniform in [0, 1], adaptive_lambda >= 0");
    }
    const char* noise_names[] = {"reset_pos_noise",     "reset_tilt_noise",
                                 "reset_yaw_noise",     "reset_lin_vel_noise",
                                 "reset_ang_vel_noise", "reset_joint_noise"};
    for (int i = 0; i < 6; ++i) noise_[i] = Param(p, noise_names[i]);
    const char* std_names[] = {"std_anchor_pos", "std_anchor_ori", "std_body_pos",
                               "std_body_ori",   "std_body_lin_vel", "std_body_ang_vel"};
    for (int i = 0; i < 6; ++i) {
      const double s = Param(p, std_names[i]);
      if (!(s > 0)) Fail(std::string(std_names[i]) + " must be > 0");
      inv_var_[i] = 1.0 / (s * s);
    }
    const char* w_names[] = {"w_anchor_pos",   "w_anchor_ori",   "w_body_pos",
                             "w_body_ori",     "w_body_lin_vel", "w_body_ang_vel",
                             "w_action_rate",  "w_joint_limit",  "w_termination"};
    for (int i = 0; i < 9; ++i) w_[i] = Param(p, w_names[i]);
    const double soft = Param(p, "soft_limit_factor");
    if (!(soft > 0 && soft <= 1)) Fail("soft_limit_factor must be in (0, 1]");
    max_height_error_ = Param(p, "max_anchor_height_error");
    max_gravity_error_ = Param(p, "max_anchor_gravity_error");
    max_ee_error_ = Param(p, "max_end_effector_height_error");

    ReadClips(m, arrays);
    if (start_frame_ >= 0 && !(start_frame_ < frames_ && start_frame_ == std::floor(start_frame_))) {
      Fail("start_frame must be -1 or a whole frame below the library's " +
           std::to_string(frames_) + " frames");
    }
    for (int j = 0; j < kJoints; ++j) {
      const int jnt = m->actuator_trnid[2 * j];
      if (m->jnt_qposadr[jnt] != 7 + j) Fail("actuator order must follow the joints' qpos order");
      const mjtNum lo = m->jnt_range[2 * jnt], hi = m->jnt_range[2 * jnt + 1];
      const mjtNum mid = 0.5 * (lo + hi), half = 0.5 * (hi - lo);
      range_[2 * j] = lo, range_[2 * j + 1] = hi;
      soft_[2 * j] = mid - soft * half, soft_[2 * j + 1] = mid + soft * half;
    }
    const int key = mj_name2id(m, mjOBJ_KEY, "knees_bent");
    const mjtNum* pose = key >= 0 ? m->key_qpos + static_cast<size_t>(key) * m->nq : m->qpos0;
    for (int i = 0; i < kNq; ++i) home_[i] = pose[i];

    const int nb = static_cast<int>(body_ids_.size());
    spec_.obs_size = kActorObs;
    spec_.critic_size = kActorObs + 3 + 3 + nb * 9;
    spec_.action_size = kJoints;
    spec_.memory_size = kMemory;
    spec_.action_low.assign(kJoints, -1.0);
    spec_.action_high.assign(kJoints, 1.0);
    spec_.info_names = {"frame", "clip", "body_pos_error", "anchor_pos_error", "anchor_ori_error",
                        "joint_error",
                        "reward_anchor_pos", "reward_anchor_ori", "reward_body_pos",
                        "reward_body_ori", "reward_body_lin_vel", "reward_body_ang_vel",
                        "reward_action_rate", "reward_joint_limit", "reward_termination",
                        "anchor_height", "ref_anchor_height"};
    spec_.reset_info_size = 6;
    MakeBins(static_cast<int>(std::lround(bin_s / dt_)));
  }

  void Reset(const mjModel*, mjData* d, Rng& rng, mjtNum* memory) const override {
    int frame = static_cast<int>(start_frame_);
    if (start_frame_ < 0) {
      const mjtNum* cdf = shared_.data() + nbins_;
      const mjtNum u = rng.Uniform();
      int b = 0;
      while (b < nbins_ - 1 && !(u < cdf[b])) ++b;
      frame = bin_start_[b] + std::min(static_cast<int>(rng.Uniform() * bin_count_[b]),
                                       bin_count_[b] - 1);
    }
    const int clip = ClipOf(frame);
    memory[kFrame] = frame;
    memory[kClip] = clip;
    memory[kClipEnd] = clip_start_[clip] + clip_frames_[clip] - 1;

    mjtNum n[5];  // x, y, roll, pitch, yaw
    n[0] = rng.Uniform(-noise_[0], noise_[0]);
    n[1] = rng.Uniform(-noise_[0], noise_[0]);
    n[2] = rng.Uniform(-noise_[1], noise_[1]);
    n[3] = rng.Uniform(-noise_[1], noise_[1]);
    n[4] = rng.Uniform(-noise_[2], noise_[2]);
    mjtNum vel[6];
    for (int i = 0; i < 3; ++i) vel[i] = rng.Uniform(-noise_[3], noise_[3]);
    for (int i = 3; i < 6; ++i) vel[i] = rng.Uniform(-noise_[4], noise_[4]);

    const mjtNum* rp = &root_pos_[3 * frame];
    d->qpos[0] = rp[0] + n[0];
    d->qpos[1] = rp[1] + n[1];
    d->qpos[2] = rp[2];
    mjtNum turn[4];
    QuatFromEuler(n[2], n[3], n[4], turn);
    QuatMul(turn, &root_quat_[4 * frame], d->qpos + 3);
    const mjtNum* jp = &joint_pos_[kJoints * frame];
    const mjtNum* jv = &joint_vel_[kJoints * frame];
    for (int j = 0; j < kJoints; ++j) {
      const mjtNum q = jp[j] + rng.Uniform(-noise_[5], noise_[5]);
      d->qpos[7 + j] = std::min(std::max(q, range_[2 * j]), range_[2 * j + 1]);
      d->qvel[6 + j] = jv[j];
    }
    for (int i = 0; i < 3; ++i) d->qvel[i] = root_lin_vel_[3 * frame + i] + vel[i];
    mjtNum w[3];
    for (int i = 0; i < 3; ++i) w[i] = root_ang_vel_[3 * frame + i] + vel[3 + i];
    QuatRotateInv(d->qpos + 3, w, d->qvel + 3);  // the free joint's angular velocity is local
  }

  void Start(const mjModel*, const mjData*, mjtNum* memory) const override {
    for (int i = 0; i < kJoints; ++i) memory[kLastAction + i] = 0;
  }

  void Act(const mjModel*, mjData* d, const mjtNum* action, mjtNum* memory) const override {
    const int next = Next(memory);
    const mjtNum* base = residual_ ? &joint_pos_[kJoints * next] : home_ + 7;
    for (int j = 0; j < kJoints; ++j) d->ctrl[j] = base[j] + action_scale_ * action[j];
  }

  void Evaluate(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory,
                Transition* out) const override {
    mj_kinematics(m, d);
    mj_comPos(m, d);
    mj_comVel(m, d);
    memory[kFrame] += 1;
    const int frame = static_cast<int>(memory[kFrame]);
    const Comparison c = Compare(m, d, frame);
    mjtNum rate = 0, limit = 0;
    for (int j = 0; j < kJoints; ++j) {
      const mjtNum da = action[j] - memory[kLastAction + j];
      rate += da * da;
      const mjtNum q = d->qpos[7 + j];
      limit += std::max<mjtNum>(0, soft_[2 * j] - q) + std::max<mjtNum>(0, q - soft_[2 * j + 1]);
    }
    bool finite = true;
    for (int i = 0; i < m->nq; ++i) finite &= std::isfinite(d->qpos[i]);
    for (int i = 0; i < m->nv; ++i) finite &= std::isfinite(d->qvel[i]);
    const bool failed = !finite ||
                        std::abs(c.anchor_height - c.ref_anchor_height) > max_height_error_ ||
                        c.anchor_gravity_error > max_gravity_error_ ||
                        c.end_effector_height_error > max_ee_error_;
    const mjtNum terms[] = {std::exp(-c.anchor_pos * inv_var_[0]),
                            std::exp(-c.anchor_ori * inv_var_[1]),
                            std::exp(-c.body_pos * inv_var_[2]),
                            std::exp(-c.body_ori * inv_var_[3]),
                            std::exp(-c.body_lin_vel * inv_var_[4]),
                            std::exp(-c.body_ang_vel * inv_var_[5]),
                            rate,
                            limit,
                            failed ? 1.0 : 0.0};
    mjtNum reward = 0;
    for (int k = 0; k < 9; ++k) reward += dt_ * w_[k] * terms[k];
    out->reward = reward;
    out->terminated = failed;
    out->truncated = frame >= memory[kClipEnd];
    if (failed) memory[kEvent] = 1 + BinOf(frame);
    if (mjtNum* info = out->info) {
      Errors(d, memory, c, info);
      for (int k = 0; k < 9; ++k) info[6 + k] = dt_ * w_[k] * terms[k];
      info[15] = c.anchor_height;
      info[16] = c.ref_anchor_height;
    }
    for (int j = 0; j < kJoints; ++j) memory[kLastAction + j] = action[j];
  }

  void StartInfoWithMemory(const mjModel* m, const mjData* d, const mjtNum* memory,
                           mjtNum* info) const override {
    Errors(d, memory, Compare(m, d, static_cast<int>(memory[kFrame])), info);
  }

  void Observe(const mjModel*, const mjData* d, const mjtNum* memory, mjtNum* obs,
               mjtNum* critic) const override {
    const int next = Next(memory);
    const mjtNum* anchor_pos = d->xpos + 3 * body_ids_[anchor_];
    const mjtNum* anchor_quat = d->xquat + 4 * body_ids_[anchor_];
    const mjtNum* ref_pos = Ref(body_pos_, next, anchor_, 3);
    const mjtNum* ref_quat = Ref(body_quat_, next, anchor_, 4);
    mjtNum* o = obs;
    const mjtNum* jp = &joint_pos_[kJoints * next];
    for (int j = 0; j < kJoints; ++j) *o++ = jp[j] - home_[7 + j];
    const mjtNum* jv = &joint_vel_[kJoints * next];
    for (int j = 0; j < kJoints; ++j) *o++ = jv[j];
    mjtNum conj[4], rel[4];
    QuatConj(anchor_quat, conj);
    QuatMul(conj, ref_quat, rel);
    Rot6(rel, o);
    o += 6;
    for (int i = 0; i < 3; ++i) *o++ = d->qvel[3 + i];
    for (int j = 0; j < kJoints; ++j) *o++ = d->qpos[7 + j] - home_[7 + j];
    for (int j = 0; j < kJoints; ++j) *o++ = d->qvel[6 + j];
    for (int j = 0; j < kJoints; ++j) *o++ = memory[kLastAction + j];
    if (!critic) return;
    std::copy(obs, obs + kActorObs, critic);
    mjtNum* c = critic + kActorObs;
    mjtNum diff[3];
    for (int i = 0; i < 3; ++i) diff[i] = ref_pos[i] - anchor_pos[i];
    QuatRotateInv(anchor_quat, diff, c);
    c += 3;
    QuatRotateInv(d->qpos + 3, d->qvel, c);  // the pelvis's linear velocity, local
    c += 3;
    for (int b : body_ids_) {
      for (int i = 0; i < 3; ++i) diff[i] = d->xpos[3 * b + i] - anchor_pos[i];
      QuatRotateInv(anchor_quat, diff, c);
      c += 3;
      mjtNum q[4];
      QuatMul(conj, d->xquat + 4 * b, q);
      Rot6(q, c);
      c += 6;
    }
  }

  void Update(mjtNum* memory, int num_envs) override {
    mjtNum* fail = shared_.data();
    std::vector<int>& count = count_;
    std::fill(count.begin(), count.end(), 0);
    bool any = false;
    for (int e = 0; e < num_envs; ++e) {
      mjtNum& event = memory[static_cast<size_t>(e) * kMemory + kEvent];
      if (event > 0) {
        ++count[static_cast<int>(event) - 1];
        event = 0;
        any = true;
      }
    }
    if (!any && alpha_ == 0) return;
    for (int b = 0; b < nbins_; ++b) fail[b] = (1 - alpha_) * fail[b] + alpha_ * count[b];
    if (adaptive_) Distribution();
  }

 private:
  static bool Flag(double value, const char* name) {
    if (value != 0 && value != 1) Fail(std::string(name) + " must be 0 or 1");
    return value != 0;
  }

  // The reference row of tracked body b at frame f in an (F, B, width) array.
  const mjtNum* Ref(const std::vector<mjtNum>& a, int f, int b, int width) const {
    return &a[(static_cast<size_t>(f) * body_ids_.size() + b) * width];
  }

  int Next(const mjtNum* memory) const {
    return static_cast<int>(std::min(memory[kFrame] + 1, memory[kClipEnd]));
  }

  int ClipOf(int frame) const {
    int c = 0;
    while (c + 1 < static_cast<int>(clip_start_.size()) && frame >= clip_start_[c + 1]) ++c;
    return c;
  }

  int BinOf(int frame) const {
    const int c = ClipOf(frame);
    const int k = std::min((frame - clip_start_[c]) / bin_frames_, clip_bins_[c] - 1);
    return clip_first_bin_[c] + k;
  }

  void ReadClips(const mjModel* m, const TaskArrays& arrays) {
    const auto& frames = RequireArray(kTask, arrays, "clip_frames");
    int total = 0;
    for (double f : frames) {
      if (!(f >= 2) || f != std::floor(f)) Fail("each clip needs at least 2 whole frames");
      clip_start_.push_back(total);
      clip_frames_.push_back(static_cast<int>(f));
      total += static_cast<int>(f);
    }
    frames_ = total;
    for (double b : RequireArray(kTask, arrays, "body_ids")) {
      if (!(b >= 1 && b < m->nbody) || b != std::floor(b)) Fail("body_ids: not a body of the model");
      body_ids_.push_back(static_cast<int>(b));
    }
    const size_t nb = body_ids_.size();
    if (nb > kMaxBodies) Fail("at most " + std::to_string(kMaxBodies) + " tracked bodies");
    const double anchor = RequireArray(kTask, arrays, "anchor")[0];
    if (!(anchor >= 0 && anchor < nb) || anchor != std::floor(anchor)) Fail("anchor: not a tracked body");
    anchor_ = static_cast<int>(anchor);
    for (double e : RequireArray(kTask, arrays, "end_effectors")) {
      if (!(e >= 0 && e < nb) || e != std::floor(e)) Fail("end_effectors: not tracked bodies");
      end_effectors_.push_back(static_cast<int>(e));
    }
    auto take = [&](const char* key, size_t row) {
      const auto& a = RequireArray(kTask, arrays, key, row);
      if (a.size() != static_cast<size_t>(total) * row) {
        Fail(std::string("array '") + key + "' has " + std::to_string(a.size()) +
             " values, expected " + std::to_string(total) + " frames x " + std::to_string(row));
      }
      for (double x : a) {
        if (!std::isfinite(x)) Fail(std::string("array '") + key + "' holds NaN or inf");
      }
      return a;
    };
    joint_pos_ = take("joint_pos", kJoints);
    joint_vel_ = take("joint_vel", kJoints);
    root_pos_ = take("root_pos", 3);
    root_quat_ = take("root_quat", 4);
    root_lin_vel_ = take("root_lin_vel", 3);
    root_ang_vel_ = take("root_ang_vel", 3);
    body_pos_ = take("body_pos", nb * 3);
    body_quat_ = take("body_quat", nb * 4);
    body_lin_vel_ = take("body_lin_vel", nb * 3);
    body_ang_vel_ = take("body_ang_vel", nb * 3);
    if (arrays.size() != 14) Fail("unexpected arrays beside the clip library's 14");
  }

  // Bins of bin_frames start frames over each clip (its last frame starts nothing); shared_ =
  // [failure average per bin, cumulative sampling distribution per bin].
  void MakeBins(int bin_frames) {
    bin_frames_ = std::max(1, bin_frames);
    for (size_t c = 0; c < clip_start_.size(); ++c) {
      const int starts = clip_frames_[c] - 1;
      const int nbins = (starts + bin_frames_ - 1) / bin_frames_;
      clip_first_bin_.push_back(static_cast<int>(bin_start_.size()));
      clip_bins_.push_back(nbins);
      for (int k = 0; k < nbins; ++k) {
        bin_start_.push_back(clip_start_[c] + k * bin_frames_);
        bin_count_.push_back(std::min(bin_frames_, starts - k * bin_frames_));
        bin_has_next_.push_back(k + 1 < nbins);
      }
    }
    nbins_ = static_cast<int>(bin_start_.size());
    count_.assign(nbins_, 0);
    shared_.assign(2 * nbins_, 0.0);
    Distribution();
  }

  void Distribution() {
    const mjtNum* fail = shared_.data();
    mjtNum* cdf = shared_.data() + nbins_;
    std::vector<mjtNum> weight(nbins_);
    mjtNum total = 0;
    for (int b = 0; b < nbins_; ++b) {
      weight[b] = fail[b] + (bin_has_next_[b] ? lambda_ * fail[b + 1] : 0.0);
      total += weight[b];
    }
    mjtNum sum = 0;
    for (int b = 0; b < nbins_; ++b) {
      const mjtNum p = adaptive_ && total > 0
                           ? (1 - uniform_) * weight[b] / total + uniform_ / nbins_
                           : 1.0 / nbins_;
      sum += p;
      cdf[b] = sum;
    }
  }

  Comparison Compare(const mjModel* m, const mjData* d, int frame) const {
    Comparison c;
    const int nb = static_cast<int>(body_ids_.size());
    const int ab = body_ids_[anchor_];
    const mjtNum* anchor_pos = d->xpos + 3 * ab;
    const mjtNum* anchor_quat = d->xquat + 4 * ab;
    const mjtNum* ref_anchor_pos = Ref(body_pos_, frame, anchor_, 3);
    const mjtNum* ref_anchor_quat = Ref(body_quat_, frame, anchor_, 4);
    for (int i = 0; i < 3; ++i) {
      const mjtNum e = ref_anchor_pos[i] - anchor_pos[i];
      c.anchor_pos += e * e;
    }
    const mjtNum angle = QuatAngle(ref_anchor_quat, anchor_quat);
    c.anchor_ori = angle * angle;
    c.anchor_height = anchor_pos[2];
    c.ref_anchor_height = ref_anchor_pos[2];
    // the z of gravity's direction in the anchor frame: -R[2][2]
    mjtNum mat[9], ref_mat[9];
    mju_quat2Mat(mat, anchor_quat);
    mju_quat2Mat(ref_mat, ref_anchor_quat);
    c.anchor_gravity_error = std::abs(ref_mat[8] - mat[8]);
    // the reference re-anchored: its anchor moved onto the robot's in x, y and heading
    mjtNum conj[4], delta[4], yaw[4];
    QuatConj(ref_anchor_quat, conj);
    QuatMul(anchor_quat, conj, delta);
    YawQuat(delta, yaw);
    const mjtNum shift[3] = {anchor_pos[0], anchor_pos[1], ref_anchor_pos[2]};
    mjtNum rel_z[kMaxBodies];  // worker threads: no allocation
    for (int b = 0; b < nb; ++b) {
      const int id = body_ids_[b];
      const mjtNum* rp = Ref(body_pos_, frame, b, 3);
      mjtNum off[3] = {rp[0] - ref_anchor_pos[0], rp[1] - ref_anchor_pos[1],
                       rp[2] - ref_anchor_pos[2]};
      mjtNum rot[3];
      QuatRotate(yaw, off, rot);
      mjtNum dist2 = 0;
      for (int i = 0; i < 3; ++i) {
        const mjtNum e = shift[i] + rot[i] - d->xpos[3 * id + i];
        dist2 += e * e;
      }
      rel_z[b] = shift[2] + rot[2];
      c.body_pos += dist2;
      c.body_pos_error += std::sqrt(dist2);
      mjtNum q[4];
      QuatMul(yaw, Ref(body_quat_, frame, b, 4), q);
      const mjtNum a = QuatAngle(q, d->xquat + 4 * id);
      c.body_ori += a * a;
      mjtNum v[6];
      // at the body's frame origin, the point body_pos holds (as the clips' velocities)
      mj_objectVelocity(m, d, mjOBJ_XBODY, id, v, 0);
      const mjtNum* rv = Ref(body_lin_vel_, frame, b, 3);
      const mjtNum* rw = Ref(body_ang_vel_, frame, b, 3);
      for (int i = 0; i < 3; ++i) {
        const mjtNum ev = rv[i] - v[3 + i], ew = rw[i] - v[i];
        c.body_lin_vel += ev * ev;
        c.body_ang_vel += ew * ew;
      }
    }
    for (int e : end_effectors_) {
      c.end_effector_height_error =
          std::max(c.end_effector_height_error, std::abs(rel_z[e] - d->xpos[3 * body_ids_[e] + 2]));
    }
    c.body_pos /= nb, c.body_ori /= nb, c.body_lin_vel /= nb, c.body_ang_vel /= nb;
    c.body_pos_error /= nb;
    return c;
  }

  // info[0..5]: frame, clip, body position error (m), anchor position error (m), anchor
  // orientation error (rad), mean joint angle error (rad)
  void Errors(const mjData* d, const mjtNum* memory, const Comparison& c, mjtNum* info) const {
    const int frame = static_cast<int>(memory[kFrame]);
    info[0] = frame;
    info[1] = memory[kClip];
    info[2] = c.body_pos_error;
    info[3] = std::sqrt(c.anchor_pos);
    info[4] = std::sqrt(c.anchor_ori);
    mjtNum joint = 0;
    for (int j = 0; j < kJoints; ++j) {
      joint += std::abs(d->qpos[7 + j] - joint_pos_[kJoints * frame + j]);
    }
    info[5] = joint / kJoints;
  }

  double dt_, action_scale_, start_frame_, alpha_, uniform_, lambda_;
  double max_height_error_, max_gravity_error_, max_ee_error_;
  bool residual_, adaptive_;
  double noise_[6], inv_var_[6], w_[9];
  mjtNum range_[2 * kJoints], soft_[2 * kJoints], home_[kNq];
  int frames_ = 0, anchor_ = 0, bin_frames_ = 1, nbins_ = 0;
  std::vector<int> clip_start_, clip_frames_, body_ids_, end_effectors_;
  std::vector<int> clip_first_bin_, clip_bins_, bin_start_, bin_count_;
  std::vector<bool> bin_has_next_;
  std::vector<int> count_;  // Update's failures per bin this step
  std::vector<mjtNum> joint_pos_, joint_vel_, root_pos_, root_quat_, root_lin_vel_, root_ang_vel_;
  std::vector<mjtNum> body_pos_, body_quat_, body_lin_vel_, body_ang_vel_;
};

}  // namespace

void RegisterG1TrackingTasks() {
  RegisterTask(
      kTask,
      [](const mjModel* m, const TaskParams& params, const TaskArrays& arrays) {
        ParamReader reader(params);
        auto task = std::make_unique<G1MotionTracking>(m, reader, arrays);
        reader.CheckAllUsed(kTask);
        return std::unique_ptr<Task>(std::move(task));
      },
      Defaults());
}

}  // namespace omnilab
