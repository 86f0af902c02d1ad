// Gymnasium v5 MuJoCo tasks, re-expressed as fused kernels. Defaults, observation layouts, reward
// terms, termination rules and reset noise follow gymnasium 1.x's v5 envs (read for facts); the
// parity tests hold every step against gymnasium's own env. Facts worth knowing:
// - gymnasium runs mj_rnePostConstraint after the substeps, so cfrc_ext in observations and costs
//   describes the last substep; xpos / xipos used for displacement are one substep stale (they
//   come from the last mj_step's forward pass) and so are they here.
// - the time limit (1000 steps) comes from gymnasium.make's TimeLimit; here max_episode_steps.
#include <algorithm>
#include <cmath>
#include <limits>

#include "omnilab/task.h"

namespace omnilab {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

mjtNum SumSquares(const mjtNum* x, int n) {
  mjtNum s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

// numpy's sum of a contiguous array (np.add.reduce's pairwise summation: one accumulator below
// 8 elements, eight from 8 to 128, combined pairwise, halves above); gymnasium's envs sum
// squared actions this way, so the control costs below round exactly as theirs
template <typename T>
T PairwiseSum(const T* x, int n) {
  if (n < 8) {
    T s = 0;
    for (int i = 0; i < n; ++i) s += x[i];
    return s;
  }
  if (n > 128) {
    const int half = (n / 2) - (n / 2) % 8;
    return PairwiseSum(x, half) + PairwiseSum(x + half, n - half);
  }
  T r[8];
  for (int j = 0; j < 8; ++j) r[j] = x[j];
  int i = 8;
  for (; i < n - n % 8; i += 8) {
    for (int j = 0; j < 8; ++j) r[j] += x[i + j];
  }
  T s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) s += x[i];
  return s;
}

// weight * np.sum(np.square(action)) as gymnasium computes it: in float64 for float64 actions;
// for float32 actions numpy squares and sums in float32 and the weight multiplies as a float32
// (NEP 50), a difference of up to ~1e-6 per step otherwise
mjtNum ControlCost(double weight, const mjtNum* action, int n, bool float32_actions) {
  constexpr int kMax = 256;  // no gymnasium task has more actuators
  if (n > kMax) return weight * SumSquares(action, n);
  if (float32_actions) {
    float squares[kMax];
    for (int i = 0; i < n; ++i) {
      const float a = static_cast<float>(action[i]);
      squares[i] = a * a;
    }
    return static_cast<float>(weight) * PairwiseSum(squares, n);
  }
  mjtNum squares[kMax];
  for (int i = 0; i < n; ++i) squares[i] = action[i] * action[i];
  return weight * PairwiseSum(squares, n);
}

bool AllFinite(const mjtNum* x, int n) {
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

// What every gymnasium MuJoCo task shares: ctrl = action, qpos0 + noise starts, dt.
class GymTask : public Task {
 public:
  enum class Noise { kUniform, kNormal };

  GymTask(const mjModel* m, ParamReader& params, int frame_skip, double noise_scale,
          Noise qvel_noise)
      : qvel_noise_(qvel_noise) {
    spec_.frame_skip = static_cast<int>(params.Get("frame_skip", frame_skip));
    spec_.max_episode_steps = static_cast<int>(params.Get("max_episode_steps", 1000));
    noise_ = params.Get("reset_noise_scale", noise_scale);
    spec_.action_size = m->nu;
    for (int i = 0; i < m->nu; ++i) {
      spec_.action_low.push_back(m->actuator_ctrlrange[2 * i]);
      spec_.action_high.push_back(m->actuator_ctrlrange[2 * i + 1]);
    }
    dt_ = m->opt.timestep * spec_.frame_skip;
    y0_ = m->nq > 1 ? m->qpos0[1] : 0;
  }

  void Reset(const mjModel* m, mjData* d, Rng& rng, mjtNum* /*memory*/) const override {
    for (int i = 0; i < m->nq; ++i) d->qpos[i] = m->qpos0[i] + rng.Uniform(-noise_, noise_);
    for (int i = 0; i < m->nv; ++i) {
      d->qvel[i] = qvel_noise_ == Noise::kUniform ? rng.Uniform(-noise_, noise_)
                                                  : noise_ * rng.Normal();
    }
  }

  void Act(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* /*memory*/) const override {
    for (int i = 0; i < m->nu; ++i) d->ctrl[i] = action[i];
  }

 protected:
  // Planar runners: memory[0] holds x before the step. The speed over the step, and the new x.
  static void RememberX(const mjData* d, mjtNum* memory) { memory[0] = d->qpos[0]; }
  mjtNum ForwardVelocity(const mjData* d, mjtNum* memory) const {
    const mjtNum velocity = (d->qpos[0] - memory[0]) / dt_;
    RememberX(d, memory);
    return velocity;
  }

  double noise_ = 0;
  double dt_ = 0;
  double y0_ = 0;  // qpos0[1]: gymnasium's init_qpos[1], for the planar walkers' z distance
  Noise qvel_noise_;
};

// HalfCheetah-v5: run forward; no termination.
class HalfCheetah : public GymTask {
 public:
  HalfCheetah(const mjModel* m, ParamReader& p) : GymTask(m, p, 5, 0.1, Noise::kNormal) {
    forward_w_ = p.Get("forward_reward_weight", 1.0);
    ctrl_w_ = p.Get("ctrl_cost_weight", 0.1);
    spec_.obs_size = m->nq - 1 + m->nv;
    spec_.memory_size = 1;  // x before the step
    spec_.info_names = {"x_position", "x_velocity", "reward_forward", "reward_ctrl"};
    spec_.reset_info_size = 1;
  }
  void Start(const mjModel*, const mjData* d, mjtNum* memory) const override {
    RememberX(d, memory);
  }
  void StartInfo(const mjModel*, const mjData* d, mjtNum* info) const override {
    info[0] = d->qpos[0];
  }
  void Evaluate(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory,
                Transition* out) const override {
    const mjtNum velocity = ForwardVelocity(d, memory);
    const mjtNum forward = forward_w_ * velocity;
    const mjtNum ctrl = ControlCost(ctrl_w_, action, m->nu, out->float32_actions);
    out->reward = forward - ctrl;
    if (mjtNum* info = out->info) {
      info[0] = d->qpos[0];
      info[1] = velocity;
      info[2] = forward;
      info[3] = -ctrl;
    }
  }
  void Observe(const mjModel* m, const mjData* d, const mjtNum*, mjtNum* obs,
               mjtNum*) const override {
    std::copy(d->qpos + 1, d->qpos + m->nq, obs);
    std::copy(d->qvel, d->qvel + m->nv, obs + m->nq - 1);
  }

 private:
  double forward_w_, ctrl_w_;
};

// Ant-v5: run forward in x; healthy while finite and torso z in [0.2, 1.0]; contact forces of
// every body but the world (clipped to [-1, 1]) observed and penalized.
class Ant : public GymTask {
 public:
  Ant(const mjModel* m, ParamReader& p) : GymTask(m, p, 5, 0.1, Noise::kNormal) {
    forward_w_ = p.Get("forward_reward_weight", 1.0);
    ctrl_w_ = p.Get("ctrl_cost_weight", 0.5);
    contact_w_ = p.Get("contact_cost_weight", 5e-4);
    healthy_reward_ = p.Get("healthy_reward", 1.0);
    terminate_ = p.Get("terminate_when_unhealthy", 1.0) != 0;
    z_low_ = p.Get("healthy_z_min", 0.2);
    z_high_ = p.Get("healthy_z_max", 1.0);
    force_low_ = p.Get("contact_force_min", -1.0);
    force_high_ = p.Get("contact_force_max", 1.0);
    main_body_ = static_cast<int>(p.Get("main_body", 1));
    spec_.obs_size = m->nq - 2 + m->nv + 6 * (m->nbody - 1);
    spec_.memory_size = 2;  // main body xy before the step
    spec_.info_names = {"x_position",     "y_position",    "distance_from_origin",
                        "x_velocity",     "y_velocity",    "reward_forward",
                        "reward_ctrl",    "reward_contact", "reward_survive"};
    spec_.reset_info_size = 3;
  }
  void Start(const mjModel*, const mjData* d, mjtNum* memory) const override {
    memory[0] = d->xpos[3 * main_body_];
    memory[1] = d->xpos[3 * main_body_ + 1];
  }
  void StartInfo(const mjModel*, const mjData* d, mjtNum* info) const override {
    info[0] = d->qpos[0];
    info[1] = d->qpos[1];
    info[2] = std::hypot(d->qpos[0], d->qpos[1]);
  }
  mjtNum Clip(mjtNum f) const { return std::min(std::max(f, force_low_), force_high_); }
  void Evaluate(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory,
                Transition* out) const override {
    mj_rnePostConstraint(m, d);
    const mjtNum x_velocity = (d->xpos[3 * main_body_] - memory[0]) / dt_;
    const mjtNum y_velocity = (d->xpos[3 * main_body_ + 1] - memory[1]) / dt_;
    memory[0] = d->xpos[3 * main_body_];
    memory[1] = d->xpos[3 * main_body_ + 1];
    const bool healthy = AllFinite(d->qpos, m->nq) && AllFinite(d->qvel, m->nv) &&
                         z_low_ <= d->qpos[2] && d->qpos[2] <= z_high_;
    mjtNum contact = 0;
    for (int i = 0; i < 6 * m->nbody; ++i) contact += Clip(d->cfrc_ext[i]) * Clip(d->cfrc_ext[i]);
    const mjtNum forward = x_velocity * forward_w_;
    const mjtNum survive = healthy * healthy_reward_;
    const mjtNum ctrl = ControlCost(ctrl_w_, action, m->nu, out->float32_actions);
    const mjtNum contact_cost = contact_w_ * contact;
    out->reward = (forward + survive) - (ctrl + contact_cost);
    out->terminated = !healthy && terminate_;
    if (mjtNum* info = out->info) {
      StartInfo(m, d, info);
      info[3] = x_velocity;
      info[4] = y_velocity;
      info[5] = forward;
      info[6] = -ctrl;
      info[7] = -contact_cost;
      info[8] = survive;
    }
  }
  void Observe(const mjModel* m, const mjData* d, const mjtNum*, mjtNum* obs,
               mjtNum*) const override {
    obs = std::copy(d->qpos + 2, d->qpos + m->nq, obs);
    obs = std::copy(d->qvel, d->qvel + m->nv, obs);
    for (int i = 6; i < 6 * m->nbody; ++i) *obs++ = Clip(d->cfrc_ext[i]);
  }

 private:
  double forward_w_, ctrl_w_, contact_w_, healthy_reward_, z_low_, z_high_, force_low_,
      force_high_;
  bool terminate_;
  int main_body_;
};

// Hopper-v5 and Walker2d-v5: planar walkers, forward in x, healthy by height, angle and (Hopper)
// the range of the rest of the state; velocities clipped to [-10, 10] in observations.
class Planar : public GymTask {
 public:
  Planar(const mjModel* m, ParamReader& p, bool hopper)
      : GymTask(m, p, 4, 5e-3, Noise::kUniform) {
    forward_w_ = p.Get("forward_reward_weight", 1.0);
    ctrl_w_ = p.Get("ctrl_cost_weight", 1e-3);
    healthy_reward_ = p.Get("healthy_reward", 1.0);
    terminate_ = p.Get("terminate_when_unhealthy", 1.0) != 0;
    z_low_ = p.Get("healthy_z_min", hopper ? 0.7 : 0.8);
    z_high_ = p.Get("healthy_z_max", hopper ? kInf : 2.0);
    angle_low_ = p.Get("healthy_angle_min", hopper ? -0.2 : -1.0);
    angle_high_ = p.Get("healthy_angle_max", hopper ? 0.2 : 1.0);
    state_low_ = hopper ? p.Get("healthy_state_min", -100.0) : -kInf;
    state_high_ = hopper ? p.Get("healthy_state_max", 100.0) : kInf;
    check_state_ = hopper;
    spec_.obs_size = m->nq - 1 + m->nv;
    spec_.memory_size = 1;
    spec_.info_names = {"x_position", "z_distance_from_origin", "x_velocity",
                        "reward_forward", "reward_ctrl", "reward_survive"};
    spec_.reset_info_size = 2;
  }
  void Start(const mjModel*, const mjData* d, mjtNum* memory) const override {
    RememberX(d, memory);
  }
  void StartInfo(const mjModel*, const mjData* d, mjtNum* info) const override {
    info[0] = d->qpos[0];
    info[1] = d->qpos[1] - y0_;
  }
  void Evaluate(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory,
                Transition* out) const override {
    const mjtNum velocity = ForwardVelocity(d, memory);
    const mjtNum z = d->qpos[1], angle = d->qpos[2];
    bool healthy = z_low_ < z && z < z_high_ && angle_low_ < angle && angle < angle_high_;
    if (check_state_) {
      for (int i = 2; i < m->nq; ++i) healthy &= state_low_ < d->qpos[i] && d->qpos[i] < state_high_;
      for (int i = 0; i < m->nv; ++i) healthy &= state_low_ < d->qvel[i] && d->qvel[i] < state_high_;
    }
    const mjtNum forward = velocity * forward_w_;
    const mjtNum survive = healthy * healthy_reward_;
    const mjtNum ctrl = ControlCost(ctrl_w_, action, m->nu, out->float32_actions);
    out->reward = (forward + survive) - ctrl;
    out->terminated = !healthy && terminate_;
    if (mjtNum* info = out->info) {
      StartInfo(m, d, info);
      info[2] = velocity;
      info[3] = forward;
      info[4] = -ctrl;
      info[5] = survive;
    }
  }
  void Observe(const mjModel* m, const mjData* d, const mjtNum*, mjtNum* obs,
               mjtNum*) const override {
    obs = std::copy(d->qpos + 1, d->qpos + m->nq, obs);
    for (int i = 0; i < m->nv; ++i) obs[i] = std::min(std::max(d->qvel[i], -10.0), 10.0);
  }

 private:
  double forward_w_, ctrl_w_, healthy_reward_, z_low_, z_high_, angle_low_, angle_high_,
      state_low_, state_high_;
  bool terminate_, check_state_;
};

// Humanoid-v5: run forward (centre of mass in x); healthy while 1 < z < 2; observes cinert, cvel,
// actuator forces and contact forces of every body but the world.
class Humanoid : public GymTask {
 public:
  Humanoid(const mjModel* m, ParamReader& p) : GymTask(m, p, 5, 1e-2, Noise::kUniform) {
    forward_w_ = p.Get("forward_reward_weight", 1.25);
    ctrl_w_ = p.Get("ctrl_cost_weight", 0.1);
    contact_w_ = p.Get("contact_cost_weight", 5e-7);
    contact_high_ = p.Get("contact_cost_max", 10.0);
    healthy_reward_ = p.Get("healthy_reward", 5.0);
    terminate_ = p.Get("terminate_when_unhealthy", 1.0) != 0;
    z_low_ = p.Get("healthy_z_min", 1.0);
    z_high_ = p.Get("healthy_z_max", 2.0);
    const int nb = m->nbody - 1;
    spec_.obs_size = m->nq - 2 + m->nv + 10 * nb + 6 * nb + (m->nv - 6) + 6 * nb;
    spec_.memory_size = 2;  // mass centre xy before the step
    spec_.info_names = {"x_position",     "y_position",     "distance_from_origin",
                        "x_velocity",     "y_velocity",     "reward_survive",
                        "reward_forward", "reward_ctrl",    "reward_contact"};
    spec_.reset_info_size = 3;
  }
  // mass centre coordinate k (0: x, 1: y) from xipos
  static mjtNum MassCenter(const mjModel* m, const mjData* d, int k) {
    mjtNum num = 0, mass = 0;
    for (int b = 0; b < m->nbody; ++b) {
      num += m->body_mass[b] * d->xipos[3 * b + k];
      mass += m->body_mass[b];
    }
    return num / mass;
  }
  void Start(const mjModel* m, const mjData* d, mjtNum* memory) const override {
    memory[0] = MassCenter(m, d, 0);
    memory[1] = MassCenter(m, d, 1);
  }
  void StartInfo(const mjModel*, const mjData* d, mjtNum* info) const override {
    info[0] = d->qpos[0];
    info[1] = d->qpos[1];
    info[2] = std::hypot(d->qpos[0], d->qpos[1]);
  }
  void Evaluate(const mjModel* m, mjData* d, const mjtNum*, mjtNum* memory,
                Transition* out) const override {
    mj_rnePostConstraint(m, d);
    const mjtNum x = MassCenter(m, d, 0), y = MassCenter(m, d, 1);
    const mjtNum x_velocity = (x - memory[0]) / dt_;
    const mjtNum y_velocity = (y - memory[1]) / dt_;
    memory[0] = x;
    memory[1] = y;
    const bool healthy = z_low_ < d->qpos[2] && d->qpos[2] < z_high_;
    const mjtNum contact =
        std::min(contact_w_ * SumSquares(d->cfrc_ext, 6 * m->nbody), contact_high_);
    const mjtNum forward = forward_w_ * x_velocity;
    const mjtNum survive = healthy * healthy_reward_;
    const mjtNum ctrl = ControlCost(ctrl_w_, d->ctrl, m->nu, false);  // float64 ctrl, as gymnasium
    out->reward = (forward + survive) - (ctrl + contact);
    out->terminated = !healthy && terminate_;
    if (mjtNum* info = out->info) {
      StartInfo(m, d, info);
      info[3] = x_velocity;
      info[4] = y_velocity;
      info[5] = survive;
      info[6] = forward;
      info[7] = -ctrl;
      info[8] = -contact;
    }
  }
  void Observe(const mjModel* m, const mjData* d, const mjtNum*, mjtNum* obs,
               mjtNum*) const override {
    obs = std::copy(d->qpos + 2, d->qpos + m->nq, obs);
    obs = std::copy(d->qvel, d->qvel + m->nv, obs);
    obs = std::copy(d->cinert + 10, d->cinert + 10 * m->nbody, obs);
    obs = std::copy(d->cvel + 6, d->cvel + 6 * m->nbody, obs);
    obs = std::copy(d->qfrc_actuator + 6, d->qfrc_actuator + m->nv, obs);
    std::copy(d->cfrc_ext + 6, d->cfrc_ext + 6 * m->nbody, obs);
  }

 private:
  double forward_w_, ctrl_w_, contact_w_, contact_high_, healthy_reward_, z_low_, z_high_;
  bool terminate_;
};

// InvertedPendulum-v5: reward 1 per step while |pole angle| <= 0.2 and the state is finite.
class InvertedPendulum : public GymTask {
 public:
  InvertedPendulum(const mjModel* m, ParamReader& p) : GymTask(m, p, 2, 0.01, Noise::kUniform) {
    spec_.obs_size = m->nq + m->nv;
    spec_.info_names = {"reward_survive"};
  }
  void Evaluate(const mjModel* m, mjData* d, const mjtNum*, mjtNum*,
                Transition* out) const override {
    const bool bad = !AllFinite(d->qpos, m->nq) || !AllFinite(d->qvel, m->nv) ||
                     std::abs(d->qpos[1]) > 0.2;
    out->terminated = bad;
    out->reward = bad ? 0 : 1;
    if (out->info) out->info[0] = out->reward;
  }
  void Observe(const mjModel* m, const mjData* d, const mjtNum*, mjtNum* obs,
               mjtNum*) const override {
    obs = std::copy(d->qpos, d->qpos + m->nq, obs);
    std::copy(d->qvel, d->qvel + m->nv, obs);
  }
};

template <typename T, typename... Extra>
TaskFactory Factory(const std::string& name, Extra... extra) {
  return [name, extra...](const mjModel* m, const TaskParams& params,
                          const TaskArrays& arrays) -> std::unique_ptr<Task> {
    RefuseArrays(name, arrays);
    ParamReader reader(params);
    auto task = std::make_unique<T>(m, reader, extra...);
    reader.CheckAllUsed(name);
    return task;
  };
}

}  // namespace

void RegisterGymTasks() {
  RegisterTask("HalfCheetah-v5", Factory<HalfCheetah>("HalfCheetah-v5"));
  RegisterTask("Ant-v5", Factory<Ant>("Ant-v5"));
  RegisterTask("Hopper-v5", Factory<Planar>("Hopper-v5", true));
  RegisterTask("Walker2d-v5", Factory<Planar>("Walker2d-v5", false));
  RegisterTask("Humanoid-v5", Factory<Humanoid>("Humanoid-v5"));
  RegisterTask("InvertedPendulum-v5", Factory<InvertedPendulum>("InvertedPendulum-v5"));
}

}  // namespace omnilab
