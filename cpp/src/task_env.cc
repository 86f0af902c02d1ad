#include "omnilab/task_env.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "omnilab/kernels.h"

namespace omnilab {

TaskEnv::TaskEnv(BatchEnvPool* pool, std::unique_ptr<Task> task, Autoreset mode)
    : pool_(pool), task_(std::move(task)), mode_(mode) {
  if (!pool_) throw std::invalid_argument("TaskEnv needs a pool");
  const TaskSpec& spec = task_->spec();
  if (spec.action_size <= 0 || spec.obs_size <= 0 || spec.frame_skip <= 0) {
    throw std::invalid_argument("task spec needs actions, observations and frame_skip >= 1");
  }
  const int n = pool_->num_envs();
  rng_.resize(n);
  memory_.assign(static_cast<size_t>(n) * spec.memory_size, 0.0);
  return_.assign(n, 0.0);
  length_.assign(n, 0);
  pending_.assign(n, 0);
  rows_.assign(n, -1);
  Seed(nullptr, 0, 0);
}

void TaskEnv::Seed(const int* ids, int nid, std::uint64_t seed) {
  const int n = ids ? nid : num_envs();
  for (int i = 0; i < n; ++i) {
    const int env = ids ? ids[i] : i;
    rng_[env] = Rng::ForEnv(seed, env);
  }
}

EpisodeState TaskEnv::GetState() const {
  EpisodeState state{{}, memory_, return_, length_, pending_, task_->shared()};
  state.rng.reserve(rng_.size());
  for (const Rng& rng : rng_) state.rng.push_back(rng.state);
  return state;
}

namespace {
void CheckRows(const char* name, size_t got, size_t want) {
  if (got != want) {
    throw std::invalid_argument(std::string("state['") + name + "']: expected " +
                                std::to_string(want) + " values, got " + std::to_string(got));
  }
}
}  // namespace

void TaskEnv::SetState(const EpisodeState& state) {
  const size_t n = num_envs();
  CheckRows("rng", state.rng.size(), n);
  CheckRows("memory", state.memory.size(), memory_.size());
  CheckRows("returns", state.returns.size(), n);
  CheckRows("lengths", state.lengths.size(), n);
  CheckRows("pending", state.pending.size(), n);
  CheckRows("shared", state.shared.size(), task_->shared().size());
  for (size_t i = 0; i < n; ++i) rng_[i].state = state.rng[i];
  // copies into the existing buffers: Python holds views of memory_ and length_
  std::copy(state.memory.begin(), state.memory.end(), memory_.begin());
  std::copy(state.returns.begin(), state.returns.end(), return_.begin());
  std::copy(state.lengths.begin(), state.lengths.end(), length_.begin());
  std::copy(state.pending.begin(), state.pending.end(), pending_.begin());
  task_->shared() = state.shared;
}

void TaskEnv::ObserveInto(const mjModel* m, const mjData* d, int env, mjtNum* obs,
                          mjtNum* critic) {
  const TaskSpec& spec = task_->spec();
  task_->Observe(m, d, memory_.data() + static_cast<size_t>(env) * spec.memory_size,
                 obs + static_cast<size_t>(env) * spec.obs_size,
                 critic && spec.critic_size ? critic + static_cast<size_t>(env) * spec.critic_size
                                            : nullptr);
}

void TaskEnv::StartInfoInto(const mjModel* m, const mjData* d, int env, mjtNum* info) {
  const TaskSpec& spec = task_->spec();
  if (!info || spec.info_names.empty()) return;
  mjtNum* row = info + static_cast<size_t>(env) * spec.info_names.size();
  for (size_t i = 0; i < spec.info_names.size(); ++i) row[i] = 0;
  task_->StartInfoWithMemory(m, d, memory_.data() + static_cast<size_t>(env) * spec.memory_size,
                             row);
}

void TaskEnv::StartEpisode(const mjModel* m, mjData* d, int env, const mjtNum* state) {
  mjtNum* memory = memory_.data() + static_cast<size_t>(env) * task_->spec().memory_size;
  mj_resetData(m, d);  // a clean d: derived fields of the thread's last env must not leak in
  if (state) {
    mj_setState(m, d, state, mjSTATE_INTEGRATION);
  } else {
    task_->Reset(m, d, rng_[env], memory);
  }
  mj_forward(m, d);
  task_->Start(m, d, memory);
  task_->Resample(rng_[env], memory);
  return_[env] = 0;
  length_[env] = 0;
  pending_[env] = 0;
  pool_->status()[env] = 0;
}

void TaskEnv::ResetKernel(const mjModel* m, mjData* d, int env, void* arg) {
  const Call& call = *static_cast<Call*>(arg);
  TaskEnv& self = *call.env;
  const mjtNum* state = nullptr;
  if (call.states) {
    state = call.states + static_cast<size_t>(self.rows_[env]) * self.pool_->state_size();
  }
  self.StartEpisode(m, d, env, state);
  self.ObserveInto(m, d, env, call.out.obs, call.out.critic);
  self.StartInfoInto(m, d, env, call.out.info);
}

void TaskEnv::Reset(const int* ids, int nid, const mjtNum* states, const StepBuffers& out) {
  const int n = ids ? nid : num_envs();
  for (int i = 0; i < n; ++i) rows_[ids ? ids[i] : i] = i;
  Call call{this, nullptr, states, ids, out, false};
  pool_->Apply(ids, nid, &ResetKernel, &call, true);
}

void TaskEnv::StepKernel(const mjModel* m, mjData* d, int env, void* arg) {
  const Call& call = *static_cast<Call*>(arg);
  TaskEnv& self = *call.env;
  const Task& task = *self.task_;
  const TaskSpec& spec = task.spec();
  const StepBuffers& out = call.out;
  mjtNum* memory = self.memory_.data() + static_cast<size_t>(env) * spec.memory_size;

  if (self.pending_[env]) {  // next-step mode: this step only restarts the env
    self.StartEpisode(m, d, env, nullptr);
    self.ObserveInto(m, d, env, out.obs, out.critic);
    self.StartInfoInto(m, d, env, out.info);
    out.reward[env] = 0;
    out.terminated[env] = 0;
    out.truncated[env] = 0;
    if (out.status) out.status[env] = 0;
    return;
  }

  const mjtNum* action = call.actions + static_cast<size_t>(env) * spec.action_size;
  bool finite = true;
  for (int i = 0; i < spec.action_size; ++i) finite &= std::isfinite(action[i]);

  Transition tr;
  tr.float32_actions = call.float32_actions;
  if (out.info && !spec.info_names.empty()) {
    tr.info = out.info + static_cast<size_t>(env) * spec.info_names.size();
    for (size_t i = 0; i < spec.info_names.size(); ++i) tr.info[i] = 0;
  }
  if (finite) {
    task.Act(m, d, action, memory);
    const std::uint32_t raised = GuardedSteps(m, d, spec.frame_skip, self.pool_->state_row(env),
                                                spec.max_speed);
    if (raised) {
      // rolled back: derived quantities must describe the restored state; the episode ends
      self.pool_->MarkStatus(env, raised);
      mj_forward(m, d);
    }
    task.Evaluate(m, d, action, memory, &tr);
    if (raised) tr.truncated = true;
  } else {
    self.pool_->MarkStatus(env, kStatusBadAction);
    mj_forward(m, d);  // d holds the state from before the call, with nothing derived yet
    tr.truncated = true;
  }
  self.return_[env] += tr.reward;
  const int length = ++self.length_[env];
  if (spec.max_episode_steps > 0 && length >= spec.max_episode_steps) tr.truncated = true;
  if (spec.resample_steps > 0 && length % spec.resample_steps == 0 && !tr.terminated &&
      !tr.truncated) {
    task.Resample(self.rng_[env], memory);
  }
  self.ObserveInto(m, d, env, out.obs, out.critic);
  out.reward[env] = tr.reward;
  out.terminated[env] = tr.terminated;
  out.truncated[env] = tr.truncated;
  // read before a same-step restart clears them: why the episode ended (warning, bad action)
  if (out.status) out.status[env] = self.pool_->status()[env];
  if (!tr.terminated && !tr.truncated) return;

  if (out.episode_return) out.episode_return[env] = self.return_[env];
  if (out.episode_length) out.episode_length[env] = length;
  if (self.mode_ == Autoreset::kNextStep) {
    self.pending_[env] = 1;
    return;
  }
  if (out.final_obs) {
    std::memcpy(out.final_obs + static_cast<size_t>(env) * spec.obs_size,
                out.obs + static_cast<size_t>(env) * spec.obs_size, sizeof(mjtNum) * spec.obs_size);
  }
  if (out.final_critic && out.critic && spec.critic_size) {
    std::memcpy(out.final_critic + static_cast<size_t>(env) * spec.critic_size,
                out.critic + static_cast<size_t>(env) * spec.critic_size,
                sizeof(mjtNum) * spec.critic_size);
  }
  self.StartEpisode(m, d, env, nullptr);
  self.ObserveInto(m, d, env, out.obs, out.critic);
}

void TaskEnv::Step(const mjtNum* actions, const StepBuffers& out, bool float32_actions) {
  Call call{this, actions, nullptr, nullptr, out, float32_actions};
  pool_->Apply(nullptr, 0, &StepKernel, &call, true);
  task_->Update(memory_.data(), num_envs());
}

}  // namespace omnilab
