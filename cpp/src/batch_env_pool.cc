#include "omnilab/batch_env_pool.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "omnilab/kernels.h"
#include "omnilab/model_fields.h"

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
  const std::uint32_t raised = GuardedSteps(m, d, args.nstep, pool.state_row(env), args.max_speed);
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

int BatchEnvPool::Step(const int* ids, int nid, int nstep, int stage, double max_speed) {
  KernelArgs args{this, nstep, stage, max_speed};
  return Apply(ids, nid, &StepKernel, &args, true);
}

int BatchEnvPool::Forward(const int* ids, int nid, int stage) {
  KernelArgs args{this, 0, stage, 0};
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
  void* data = mjb_expand(batch_.get(), name.c_str(), size, elemsize);
  if (data && std::find(expanded_.begin(), expanded_.end(), name) == expanded_.end()) {
    expanded_.push_back(name);
  }
  return data;
}

const void* BatchEnvPool::Expanded(const std::string& name, int* size, int* elemsize) {
  std::lock_guard<std::mutex> lock(mutex_);
  return mjb_expanded(batch_.get(), name.c_str(), size, elemsize);
}

// Everything one parallel mj_setConst call shares with its kernels; read-only in the kernels
// except the per-row slots of tmp and changed, which one kernel each writes.
struct BatchEnvPool::SetConstCall {
  struct Input {  // an expanded field that mj_setConst reads
    ModelFieldRef ref;
    const char* storage;  // num_envs rows of row bytes
    std::size_t row;
  };
  struct Output {  // a field mj_setConst writes
    ModelFieldRef ref;
    std::size_t compare;  // bytes per env the batch keeps (bvh_aabb: the bodies' rows only)
    const char* storage;  // expanded rows, or nullptr: the shared model's value
    std::size_t offset;   // in a row of tmp
  };
  BatchEnvPool* pool;
  std::vector<Input> inputs;
  std::vector<Output> outputs;
  std::vector<int> row_of;            // env -> row of tmp
  std::vector<char> tmp;              // per selected env: the outputs that changed
  std::size_t tmp_row = 0;
  std::vector<std::uint8_t> changed;  // per selected env and output
};

BatchEnvPool::Scratch& BatchEnvPool::ScratchFor(const mjData* d, const SetConstCall& call) {
  std::lock_guard<std::mutex> lock(scratch_mutex_);
  for (auto& s : scratch_) {
    if (s->owner == d) return *s;
  }
  auto s = std::make_unique<Scratch>();
  s->owner = d;
  s->model = *model();  // the struct: arrays still the shared model's
  for (const auto& out : call.outputs) {
    const char* shared = FieldData(model(), out.ref);
    s->buffers.emplace_back(shared, shared + out.ref.bytes);
    PointField(&s->model, out.ref, s->buffers.back().data());
  }
  scratch_.push_back(std::move(s));
  return *scratch_.back();
}

void BatchEnvPool::SetConstKernel(const mjModel*, mjData* d, int env, void* arg) {
  SetConstCall& call = *static_cast<SetConstCall*>(arg);
  Scratch& s = call.pool->ScratchFor(d, call);
  mjModel* m = &s.model;
  for (const auto& in : call.inputs) {
    char* row = const_cast<char*>(in.storage) + static_cast<std::size_t>(env) * in.row;
    if (in.ref.is_option) {
      std::memcpy(FieldData(m, in.ref), row, in.row);
    } else {
      PointField(m, in.ref, row);  // read in place: mj_setConst does not write its inputs
    }
  }
  const std::size_t nout = call.outputs.size();
  for (std::size_t k = 0; k < nout; ++k) {  // start from the env's values (inputs among them)
    const auto& out = call.outputs[k];
    const char* current = out.storage ? out.storage + static_cast<std::size_t>(env) * out.compare
                                      : FieldData(call.pool->model(), out.ref);
    std::memcpy(s.buffers[k].data(), current, out.compare);
  }
  mj_setConst(m, d);
  const std::size_t row = call.row_of[env];
  for (std::size_t k = 0; k < nout; ++k) {
    const auto& out = call.outputs[k];
    const char* current = out.storage ? out.storage + static_cast<std::size_t>(env) * out.compare
                                      : FieldData(call.pool->model(), out.ref);
    if (std::memcmp(s.buffers[k].data(), current, out.compare) != 0) {
      std::memcpy(call.tmp.data() + row * call.tmp_row + out.offset, s.buffers[k].data(),
                  out.compare);
      call.changed[row * nout + k] = 1;
    }
  }
}

int BatchEnvPool::SetConst(const int* ids, int nid, const std::vector<std::string>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  mjBatch* b = batch_.get();
  const mjModel* m = model();
  // one thread, or one env: nothing to spread, and mjb_setConst runs only the groups of
  // constants that its changed inputs affect, which is cheaper than a whole mj_setConst
  if (num_threads() == 1 || (ids && nid < 2)) return mjb_setConst(b, ids, nid);
  if (!scratch_.empty() && outputs != scratch_outputs_) scratch_.clear();
  scratch_outputs_ = outputs;

  SetConstCall call;
  call.pool = this;
  // rows of bvh_aabb the batch keeps per env: the bodies' hierarchies, before the meshes'
  int body_bvh = 0;
  for (int i = 0; i < m->nbody; ++i) {
    if (m->body_bvhadr[i] >= 0) body_bvh = std::max(body_bvh, m->body_bvhadr[i] + m->body_bvhnum[i]);
  }
  for (const std::string& name : outputs) {
    std::optional<ModelFieldRef> ref = FindModelField(m, name);
    if (!ref || ref->is_option) throw std::invalid_argument("'" + name + "' is not an array");
    std::size_t compare = ref->bytes;
    if (name == "bvh_aabb") compare = sizeof(mjtNum) * 6 * static_cast<std::size_t>(body_bvh);
    int size = 0, elemsize = 0;
    const void* storage = mjb_expanded(b, name.c_str(), &size, &elemsize);
    if (storage && static_cast<std::size_t>(size) * elemsize != compare) {
      throw std::logic_error("per-env size of '" + name + "' is not what mj_setConst writes");
    }
    call.outputs.push_back({*ref, compare, static_cast<const char*>(storage), call.tmp_row});
    call.tmp_row += compare;
  }
  for (const std::string& name : expanded_) {
    if (std::find(outputs.begin(), outputs.end(), name) != outputs.end()) continue;
    std::optional<ModelFieldRef> ref = FindModelField(m, name);
    int size = 0, elemsize = 0;
    const void* storage = mjb_expanded(b, name.c_str(), &size, &elemsize);
    if (!ref || !storage) continue;  // not an mjModel array (none so far): mj_setConst ignores it
    const std::size_t row = static_cast<std::size_t>(size) * elemsize;
    if (row != ref->bytes) continue;  // a prefix of an array, as bvh_aabb: an output only
    call.inputs.push_back({*ref, static_cast<const char*>(storage), row});
  }
  const int n = ids ? nid : num_envs();
  call.row_of.assign(num_envs(), -1);
  for (int i = 0; i < n; ++i) call.row_of[ids ? ids[i] : i] = i;
  call.tmp.assign(static_cast<std::size_t>(n) * call.tmp_row, 0);
  call.changed.assign(static_cast<std::size_t>(n) * outputs.size(), 0);

  const int nfail = mjb_apply(b, ids, nid, &SetConstKernel, &call, 0);
  const int* failed = mjb_status(b);
  for (std::size_t k = 0; k < call.outputs.size(); ++k) {
    char* storage = nullptr;
    for (int i = 0; i < n; ++i) {
      const int env = ids ? ids[i] : i;
      if (!call.changed[static_cast<std::size_t>(i) * outputs.size() + k] || failed[env]) continue;
      if (!storage) {  // first change: per-env values from now on
        int size = 0, elemsize = 0;
        storage = static_cast<char*>(mjb_expand(b, outputs[k].c_str(), &size, &elemsize));
        if (!storage || static_cast<std::size_t>(size) * elemsize != call.outputs[k].compare) {
          throw std::logic_error("the batch cannot hold per-env values of '" + outputs[k] + "'");
        }
        if (std::find(expanded_.begin(), expanded_.end(), outputs[k]) == expanded_.end()) {
          expanded_.push_back(outputs[k]);
        }
      }
      const std::size_t compare = call.outputs[k].compare;
      std::memcpy(storage + static_cast<std::size_t>(env) * compare,
                  call.tmp.data() + static_cast<std::size_t>(i) * call.tmp_row +
                      call.outputs[k].offset,
                  compare);
    }
  }
  return nfail;
}

std::string BatchEnvPool::Error(int env) const { return mjb_error(batch_.get(), env); }

}  // namespace omnilab
