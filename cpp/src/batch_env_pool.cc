#include "omnilab/batch_env_pool.h"

#include <cstring>
#include <stdexcept>

#include "omnilab/kernels.h"

namespace omnilab {

BatchEnvPool::BatchEnvPool(const mjModel* model, int num_envs, int num_threads,
                           const std::vector<OutputSpec>& outputs) {
  if (num_envs < 1) throw std::invalid_argument("num_envs must be >= 1");
  if (num_threads < 1) throw std::invalid_argument("num_threads must be >= 1");
  mjBatchConfig config;
  mjb_defaultConfig(&config);
  config.nthread = num_threads;
  char error[1024] = "";
  batch_.reset(mjb_makeBatch(model, num_envs, &config, error, sizeof(error)));
  if (!batch_) throw std::runtime_error(std::string("could not create the batch: ") + error);
  status_.assign(num_envs, 0);
  const mjModel* m = this->model();
  for (const OutputSpec& spec : outputs) {
    std::optional<DataField> field = FindDataField(m, spec.field);
    if (!field) throw std::invalid_argument("'" + spec.field + "' is not an mjtNum mjData array");
    Output out{*field, spec.rows, {}};
    if (out.rows.empty()) {
      for (int r = 0; r < field->rows; ++r) out.rows.push_back(r);
    }
    for (int r : out.rows) {
      if (r < 0 || r >= field->rows) {
        throw std::out_of_range("row " + std::to_string(r) + " of " + spec.field +
                                " is outside [0, " + std::to_string(field->rows) + ")");
      }
    }
    out.values.assign(static_cast<size_t>(num_envs) * out.rows.size() * field->cols, 0.0);
    outputs_.push_back(std::move(out));
  }
}

std::pair<int, int> BatchEnvPool::StateComponent(int component) {
  int size = 0;
  const mjtNum* at = mjb_stateComponent(batch_.get(), component, &size);
  return {static_cast<int>(at - state()), size};
}

void BatchEnvPool::Gather(const mjData* d, int env) {
  for (Output& out : outputs_) {
    const int cols = out.field.cols;
    const mjtNum* src = d->*(out.field.member);
    mjtNum* dst = out.values.data() + static_cast<size_t>(env) * out.rows.size() * cols;
    for (int r : out.rows) {
      std::memcpy(dst, src + static_cast<size_t>(r) * cols, sizeof(mjtNum) * cols);
      dst += cols;
    }
  }
}

void BatchEnvPool::StepKernel(const mjModel* m, mjData* d, int env, void* arg) {
  const KernelArgs& args = *static_cast<KernelArgs*>(arg);
  BatchEnvPool& pool = *args.pool;
  const std::uint32_t raised = GuardedSteps(m, d, args.nstep, pool.state_row(env));
  pool.status_[env] |= raised;
  // after a rollback, outputs describe the restored state, never the diverged one
  ComputeStage(m, d, raised ? mjSTAGE_ACC : args.stage);
  pool.Gather(d, env);
}

void BatchEnvPool::ForwardKernel(const mjModel* m, mjData* d, int env, void* arg) {
  const KernelArgs& args = *static_cast<KernelArgs*>(arg);
  ComputeStage(m, d, args.stage);
  args.pool->Gather(d, env);
}

int BatchEnvPool::MarkFailures(const int* ids, int nid, int nfail) {
  if (!nfail) return 0;
  const int* failed = mjb_status(batch_.get());
  const int n = ids ? nid : num_envs();
  for (int i = 0; i < n; ++i) {
    const int env = ids ? ids[i] : i;
    if (failed[env]) status_[env] |= kStatusError;
  }
  return nfail;
}

int BatchEnvPool::Apply(const int* ids, int nid, mjfBatchFunc func, void* arg, bool save) {
  std::lock_guard<std::mutex> lock(mutex_);
  return MarkFailures(ids, nid, mjb_apply(batch_.get(), ids, nid, func, arg, save ? 1 : 0));
}

int BatchEnvPool::Step(const int* ids, int nid, int nstep, int stage) {
  KernelArgs args{this, nstep, stage};
  return Apply(ids, nid, &StepKernel, &args, true);
}

int BatchEnvPool::Forward(const int* ids, int nid, int stage) {
  KernelArgs args{this, 0, stage};
  return Apply(ids, nid, &ForwardKernel, &args, false);
}

int BatchEnvPool::Reset(const int* ids, int nid, const int* keys, const mjtNum* initial_state,
                        int stage) {
  std::unique_lock<std::mutex> lock(mutex_);
  const int n = ids ? nid : num_envs();
  int nfail = 0;
  if (initial_state) {
    const size_t row = state_size();
    for (int i = 0; i < n; ++i) {
      const int env = ids ? ids[i] : i;
      std::memcpy(state() + env * row, initial_state + i * row, sizeof(mjtNum) * row);
    }
  } else {
    nfail = mjb_reset(batch_.get(), ids, nid, keys, mjSTAGE_NONE);
  }
  for (int i = 0; i < n; ++i) status_[ids ? ids[i] : i] = 0;
  MarkFailures(ids, nid, nfail);
  lock.unlock();
  if (stage > mjSTAGE_NONE && !outputs_.empty()) nfail += Forward(ids, nid, stage);
  return nfail;
}

void* BatchEnvPool::Expand(const std::string& name, int* size, int* elemsize) {
  std::lock_guard<std::mutex> lock(mutex_);
  return mjb_expand(batch_.get(), name.c_str(), size, elemsize);
}

const void* BatchEnvPool::Expanded(const std::string& name, int* size, int* elemsize) {
  std::lock_guard<std::mutex> lock(mutex_);
  return mjb_expanded(batch_.get(), name.c_str(), size, elemsize);
}

int BatchEnvPool::SetConst(const int* ids, int nid) {
  std::lock_guard<std::mutex> lock(mutex_);
  // a failure here is a bad model patch, reported to the caller, not a simulation failure
  return mjb_setConst(batch_.get(), ids, nid);
}

std::string BatchEnvPool::Error(int env) const { return mjb_error(batch_.get(), env); }

}  // namespace omnilab
