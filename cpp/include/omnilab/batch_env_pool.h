// BatchEnvPool: many environments of one MuJoCo model, stepped on a thread pool.
//
// The engine is MuJoCo's own mjBatch (state rows, per-thread mjData, per-environment model
// fields, bit-exact at any thread count); the pool adds what an RL environment needs on top of
// it: instability detection with rollback, final-state outputs gathered straight into dense
// per-environment arrays, and one kernel per call so that task logic can run while the data is
// hot in the worker's cache.
#pragma once

#include <mujoco/mjbatch.h>
#include <mujoco/mujoco.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "omnilab/data_fields.h"

namespace omnilab {

// Per-environment status: bit w (w < mjNWARNING) is set when MuJoCo raised warning w in that
// environment; kStatusError when MuJoCo raised an error. Bits stay until the environment is reset.
inline constexpr std::uint32_t kStatusError = 1u << 30;

// An mjData field to copy out after every call, restricted to some of its rows (all if empty).
struct OutputSpec {
  std::string field;
  std::vector<int> rows;
};

// A dense (num_envs, rows.size(), cols) array filled from one mjData field.
struct Output {
  DataField field;
  std::vector<int> rows;
  std::vector<mjtNum> values;
};

class BatchEnvPool {
 public:
  // Copies model; num_threads counts the calling thread.
  BatchEnvPool(const mjModel* model, int num_envs, int num_threads,
               const std::vector<OutputSpec>& outputs);

  BatchEnvPool(const BatchEnvPool&) = delete;
  BatchEnvPool& operator=(const BatchEnvPool&) = delete;

  int num_envs() const { return mjb_nsim(batch_.get()); }
  int num_threads() const { return mjb_nthread(batch_.get()); }
  int state_size() const { return mjb_nstate(batch_.get()); }
  const mjModel* model() const { return mjb_model(batch_.get()); }

  mjtNum* state() { return mjb_state(batch_.get()); }
  mjtNum* state_row(int env) { return state() + static_cast<size_t>(env) * state_size(); }
  // Offset and size of one mjtState component inside a state row.
  std::pair<int, int> StateComponent(int component);
  std::uint32_t* status() { return status_.data(); }
  std::vector<Output>& outputs() { return outputs_; }

  // Each call below takes ids (nid of them, sorted and unique; nullptr for all environments),
  // releases nothing itself (the caller drops the GIL) and returns how many environments failed.

  // nstep substeps with controls held, then forward stages up to stage, then outputs. An env
  // that warns, or leaves |qvel| above max_speed (0: no bound), goes back to its state before.
  int Step(const int* ids, int nid, int nstep, int stage, double max_speed = 0);
  // Forward stages up to stage at the current state, then outputs.
  int Forward(const int* ids, int nid, int stage);
  // Defaults (keys nullptr or -1) or keyframes, or the given state rows; clears status.
  int Reset(const int* ids, int nid, const int* keys, const mjtNum* initial_state, int stage);
  // Per-environment storage of a model field (num_envs x size elements of elemsize bytes).
  void* Expand(const std::string& name, int* size, int* elemsize);
  const void* Expanded(const std::string& name, int* size, int* elemsize);
  // mj_setConst on the selected environments' models, spread over the batch's threads
  // (mjb_setConst runs them one after another). outputs: the fields mj_setConst computes
  // (mujoco.MjModel._setconst_outputs that the batch can expand); an output is expanded only
  // when some environment's value changes, as mjb_setConst does. Returns the number of failed
  // environments; failures leave status alone (their message is in Error()).
  int SetConst(const int* ids, int nid, const std::vector<std::string>& outputs);
  // Runs func on each selected environment inside the batch's threads (state loaded into d;
  // saved back after func if save). The building block of every kernel, task kernels included.
  int Apply(const int* ids, int nid, mjfBatchFunc func, void* arg, bool save);
  // Copies the configured outputs of env out of d; called from kernels.
  void Gather(const mjData* d, int env);
  // OR bits into env's status; called from kernels (each env is touched by one thread).
  void MarkStatus(int env, std::uint32_t bits) { status_[env] |= bits; }
  // Message of the error the environment raised in its last call, or "".
  std::string Error(int env) const;

 private:
  struct BatchDeleter {
    void operator()(mjBatch* b) const { mjb_deleteBatch(b); }
  };
  struct KernelArgs {
    BatchEnvPool* pool;
    int nstep;
    int stage;
    double max_speed;
  };

  // A thread's copy of the model struct for mj_setConst: its arrays are the shared model's,
  // except the outputs, which point to its own buffers.
  struct Scratch {
    const mjData* owner;  // the batch's per-thread mjData this scratch belongs to
    mjModel model;
    std::vector<std::vector<char>> buffers;  // one per output
  };
  struct SetConstCall;

  static void StepKernel(const mjModel* m, mjData* d, int env, void* arg);
  static void ForwardKernel(const mjModel* m, mjData* d, int env, void* arg);
  static void SetConstKernel(const mjModel* m, mjData* d, int env, void* arg);
  Scratch& ScratchFor(const mjData* d, const SetConstCall& call);
  int MarkFailures(const int* ids, int nid, int nfail);

  std::unique_ptr<mjBatch, BatchDeleter> batch_;
  std::vector<std::uint32_t> status_;
  std::vector<Output> outputs_;
  std::mutex mutex_;  // one call at a time: the batch's scratch data is shared
  std::vector<std::unique_ptr<Scratch>> scratch_;
  std::vector<std::string> scratch_outputs_;  // the outputs the scratch buffers hold
  std::mutex scratch_mutex_;
  std::vector<std::string> expanded_;  // fields given per-environment values so far
};

}  // namespace omnilab
