// TaskEnv: a vectorized RL environment made of a BatchEnvPool and a Task. One Step is one
// BatchEnvPool::Apply: per env, action -> controls -> guarded substeps -> reward, termination,
// observation -> auto-reset, all in the worker that holds the env's data, writing straight into
// caller buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "omnilab/batch_env_pool.h"
#include "omnilab/task.h"

namespace omnilab {

// Status bit set on an env whose action held NaN or inf (the env is not stepped; its episode is
// truncated). Beside kStatusError, below it, above the MuJoCo warning bits.
inline constexpr std::uint32_t kStatusBadAction = 1u << 29;

// Output buffers of one call, each num_envs rows; nullable ones may be nullptr.
struct StepBuffers {
  mjtNum* obs = nullptr;             // (N, obs_size)
  mjtNum* critic = nullptr;          // (N, critic_size), nullable
  mjtNum* reward = nullptr;          // (N,)
  std::uint8_t* terminated = nullptr;
  std::uint8_t* truncated = nullptr;
  mjtNum* final_obs = nullptr;       // (N, obs_size): same-step mode, rows of finished envs
  mjtNum* final_critic = nullptr;    // nullable
  mjtNum* episode_return = nullptr;  // (N,): rows of finished envs
  std::int32_t* episode_length = nullptr;
  mjtNum* info = nullptr;            // (N, info size), nullable: the task's named diagnostics
  std::uint32_t* status = nullptr;   // (N,), nullable: the env's status bits at the end of its
                                     // step, before a same-step auto-reset clears them
};

// Per-env episode bookkeeping of a TaskEnv, num_envs rows each: with the pool's state rows,
// status and model fields, what a checkpoint needs for the env to continue bit for bit.
struct EpisodeState {
  std::vector<std::uint64_t> rng;  // splitmix64 counters
  std::vector<mjtNum> memory;      // (N, memory_size)
  std::vector<mjtNum> returns;     // of the running episodes
  std::vector<std::int32_t> lengths;
  std::vector<std::uint8_t> pending;  // next-step mode: restarts at the next step
  std::vector<mjtNum> shared;         // the task's shared state (Task::shared)
};

enum class Autoreset {
  kSameStep,  // gymnasium's SAME_STEP: a finished env restarts in the step that ended it
  kNextStep,  // gymnasium's NEXT_STEP: it restarts in the next step, which ignores its action
};

class TaskEnv {
 public:
  // pool must outlive the env (the bindings keep it alive).
  TaskEnv(BatchEnvPool* pool, std::unique_ptr<Task> task, Autoreset mode);

  const Task& task() const { return *task_; }
  int num_envs() const { return pool_->num_envs(); }
  Autoreset mode() const { return mode_; }
  BatchEnvPool& pool() { return *pool_; }

  // Re-seeds the streams of the given envs (nullptr: all) from seed.
  void Seed(const int* ids, int nid, std::uint64_t seed);
  // Starts new episodes in the given envs: sampled, or from states (nid rows of state_size).
  // Writes obs (and critic) rows of those envs only.
  void Reset(const int* ids, int nid, const mjtNum* states, const StepBuffers& out);
  // One env step of every env; actions (N, action_size).
  void Step(const mjtNum* actions, const StepBuffers& out, bool float32_actions = false);

  EpisodeState GetState() const;
  // Throws std::invalid_argument naming the field whose size is not num_envs rows.
  void SetState(const EpisodeState& state);

  // Per-env task memory (N, memory_size), e.g. commands; writable between calls.
  mjtNum* memory() { return memory_.data(); }
  const std::int32_t* episode_steps() const { return length_.data(); }

 private:
  struct Call {
    TaskEnv* env;
    const mjtNum* actions;
    const mjtNum* states;
    const int* ids;
    StepBuffers out;
    bool float32_actions;
  };
  static void StepKernel(const mjModel* m, mjData* d, int env, void* arg);
  static void ResetKernel(const mjModel* m, mjData* d, int env, void* arg);
  void StartEpisode(const mjModel* m, mjData* d, int env, const mjtNum* state);
  void ObserveInto(const mjModel* m, const mjData* d, int env, mjtNum* obs, mjtNum* critic);
  void StartInfoInto(const mjModel* m, const mjData* d, int env, mjtNum* info);

  BatchEnvPool* pool_;
  std::unique_ptr<Task> task_;
  Autoreset mode_;
  std::vector<Rng> rng_;
  std::vector<mjtNum> memory_;
  std::vector<mjtNum> return_;
  std::vector<std::int32_t> length_;
  std::vector<std::uint8_t> pending_;  // next-step mode: restart at the next step
  std::vector<int> rows_;              // Reset: row of states for each env
};

}  // namespace omnilab
