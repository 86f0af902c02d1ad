// Task: what turns bare physics into an RL environment (observations, rewards, terminations,
// start states, action-to-control mapping, commands). Every method but the constructor runs
// inside the pool's worker threads right after the substeps, with the environment's state loaded
// in d, so each one must be noexcept in spirit: no C++ exceptions, no objects with destructors.
#pragma once

#include <mujoco/mujoco.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace omnilab {

// A splitmix64 stream per environment: tiny, trivially copyable, and simple enough that the numpy
// reference tasks reproduce it bit for bit (lightning_unilab/envs/tasks/rng.py).
struct Rng {
  std::uint64_t state = 0;

  static std::uint64_t Mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Stream of environment env under a user seed.
  static Rng ForEnv(std::uint64_t seed, int env) {
    return Rng{Mix(seed + 0x632BE59BD9B4E019ull * static_cast<std::uint64_t>(env + 1))};
  }
  std::uint64_t Next() {
    state += 0x9E3779B97F4A7C15ull;
    return Mix(state);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double low, double high) { return low + (high - low) * Uniform(); }
  // Standard normal (Box-Muller; one of the pair is dropped to keep the stream simple).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
};

struct TaskSpec {
  int obs_size = 0;
  int critic_size = 0;         // 0: no separate critic observation
  int action_size = 0;
  int frame_skip = 1;          // substeps per env step
  int max_episode_steps = 0;   // truncation; 0: none
  int memory_size = 0;         // mjtNum per env kept between steps (last action, command ...)
  int resample_steps = 0;      // commands are resampled every this many steps; 0: per episode
  double max_speed = 0;        // roll back and truncate when a substep leaves |qvel| above it; 0: off
  std::vector<double> action_low, action_high;
  // Named per-step diagnostics (reward terms, positions, velocities) written by Evaluate into
  // Transition::info; the first reset_info_size of them are also written at episode start.
  std::vector<std::string> info_names;
  int reset_info_size = 0;
};

// What one env step produced, filled in by Task::Evaluate.
struct Transition {
  mjtNum reward = 0;
  bool terminated = false;
  bool truncated = false;  // task-level truncation, on top of max_episode_steps
  // spec().info_names.size() values to fill, or nullptr when the caller keeps no info
  mjtNum* info = nullptr;
  // in: the caller's actions were float32 (float64 here, exactly); tasks that mirror a library
  // computing costs of float32 actions in float32 use it to round the same way
  bool float32_actions = false;
};

class Task {
 public:
  virtual ~Task() = default;
  const TaskSpec& spec() const { return spec_; }

  // Write a start state into d, which was just mj_resetData'd; mj_forward runs afterwards.
  virtual void Reset(const mjModel* m, mjData* d, Rng& rng, mjtNum* memory) const = 0;
  // d is at a start state with mj_forward done (sampled, or given by the caller): prime memory.
  virtual void Start(const mjModel* /*m*/, const mjData* /*d*/, mjtNum* /*memory*/) const {}
  // New commands (velocity targets ...) into memory.
  virtual void Resample(Rng& /*rng*/, mjtNum* /*memory*/) const {}
  // Map a (finite) action to d->ctrl before the substeps.
  virtual void Act(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory) const = 0;
  // After the substeps: reward and termination; may update memory.
  virtual void Evaluate(const mjModel* m, mjData* d, const mjtNum* action, mjtNum* memory,
                        Transition* out) const = 0;
  // Episode-start values of the first spec().reset_info_size info entries (positions ...).
  virtual void StartInfo(const mjModel* /*m*/, const mjData* /*d*/, mjtNum* /*info*/) const {}
  // The same with the env's memory at hand (the tracking task's reference frame); by default
  // StartInfo's values.
  virtual void StartInfoWithMemory(const mjModel* m, const mjData* d, const mjtNum* /*memory*/,
                                   mjtNum* info) const {
    StartInfo(m, d, info);
  }
  // Observation (and critic observation if spec().critic_size) at the current state.
  virtual void Observe(const mjModel* m, const mjData* d, const mjtNum* memory, mjtNum* obs,
                       mjtNum* critic) const = 0;
  // Between steps, in the calling thread, after every env stepped: fold what the envs left in
  // their memory rows (num_envs rows of spec().memory_size) into shared(). The tracking task's
  // failure statistics per start bin live there: the const methods above read them inside the
  // step, so a step's result never depends on the order the workers ran in.
  virtual void Update(mjtNum* /*memory*/, int /*num_envs*/) {}
  // Task-level state shared by every env (empty for most tasks): part of a checkpoint.
  std::vector<mjtNum>& shared() { return shared_; }
  const std::vector<mjtNum>& shared() const { return shared_; }

 protected:
  TaskSpec spec_;
  std::vector<mjtNum> shared_;
};

// Factory: the task's model (for ids and sizes), named float parameters overriding defaults, and
// named arrays of data that are not parameters (a tracking task's reference motion), flattened;
// Python validates and lays them out (lightning_unilab/envs/tasks/), the task checks their sizes.
using TaskParams = std::map<std::string, double>;
using TaskArrays = std::map<std::string, std::vector<double>>;
using TaskFactory =
    std::function<std::unique_ptr<Task>(const mjModel*, const TaskParams&, const TaskArrays&)>;

// Registered task names, sorted.
std::vector<std::string> TaskNames();
// Adds a factory, with the defaults of the parameters it reads when the task declares them in one
// table (Python's twin reads them from there); throws if the name is taken.
void RegisterTask(const std::string& name, TaskFactory factory, TaskParams defaults = {});
// The defaults a task registered (empty for one that keeps them inline); throws
// std::invalid_argument for an unknown name.
TaskParams TaskDefaults(const std::string& name);
// Builds a task; throws std::invalid_argument listing the known names for an unknown one, and for
// parameters the task does not have.
// Arrays are refused for a task that reads none.
std::unique_ptr<Task> MakeTask(const std::string& name, const mjModel* m, const TaskParams& params,
                               const TaskArrays& arrays = {});

// Reads params[key] if present (and marks it used), else fallback; used by factories.
class ParamReader {
 public:
  explicit ParamReader(const TaskParams& params) : params_(params) {}
  double Get(const std::string& key, double fallback);
  // Throws std::invalid_argument naming any parameter that no Get asked for.
  void CheckAllUsed(const std::string& task) const;

 private:
  const TaskParams& params_;
  std::vector<std::string> used_;
};

// Throws std::invalid_argument when a task that reads no arrays is given some.
void RefuseArrays(const std::string& task, const TaskArrays& arrays);

// The array arrays[key], which must hold a multiple of `row` values (at least one row), else
// std::invalid_argument naming the task and the key.
const std::vector<double>& RequireArray(const std::string& task, const TaskArrays& arrays,
                                        const std::string& key, size_t row = 1);

// A task's solver parameters, which live in the model as timestep does: `integrator` (an
// mjtIntegrator, 0-3) and `solver_iterations` (a whole number >= 1) must be valid and equal
// m->opt.integrator and m->opt.iterations, else std::invalid_argument naming `task`.
void CheckSolverParams(const std::string& task, const mjModel* m, double integrator,
                       double solver_iterations);

}  // namespace omnilab
