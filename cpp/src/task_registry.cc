// The task registry: a function-local map of factories, filled by the task files' registrars.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "omnilab/task.h"

namespace omnilab {

namespace {

struct Registered {
  TaskFactory factory;
  TaskParams defaults;
};

std::map<std::string, Registered>& Registry() {
  static std::map<std::string, Registered> registry;
  return registry;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

void RegisterGymTasks();
void RegisterG1Tasks();
void RegisterG1TrackingTasks();

namespace {
void EnsureRegistered() {
  static const bool done = [] {
    RegisterGymTasks();
    RegisterG1Tasks();
    RegisterG1TrackingTasks();
    return true;
  }();
  (void)done;
}
}  // namespace

std::vector<std::string> TaskNames() {
  EnsureRegistered();
  std::vector<std::string> names;
  for (const auto& entry : Registry()) names.push_back(entry.first);
  return names;
}

void RegisterTask(const std::string& name, TaskFactory factory, TaskParams defaults) {
  if (!Registry().emplace(name, Registered{std::move(factory), std::move(defaults)}).second) {
    throw std::invalid_argument("task '" + name + "' is registered twice");
  }
}

namespace {
const Registered& Find(const std::string& name) {
  EnsureRegistered();
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    throw std::invalid_argument("unknown task '" + name + "'; known tasks: " + Join(TaskNames()));
  }
  return it->second;
}
}  // namespace

std::unique_ptr<Task> MakeTask(const std::string& name, const mjModel* m,
                               const TaskParams& params, const TaskArrays& arrays) {
  return Find(name).factory(m, params, arrays);
}

TaskParams TaskDefaults(const std::string& name) { return Find(name).defaults; }

double ParamReader::Get(const std::string& key, double fallback) {
  used_.push_back(key);
  auto it = params_.find(key);
  return it == params_.end() ? fallback : it->second;
}

void ParamReader::CheckAllUsed(const std::string& task) const {
  for (const auto& entry : params_) {
    if (std::find(used_.begin(), used_.end(), entry.first) == used_.end()) {
      std::vector<std::string> known = used_;
      std::sort(known.begin(), known.end());
      throw std::invalid_argument("task '" + task + "' has no parameter '" + entry.first +
                                  "'; it has: " + Join(known));
    }
  }
}

void RefuseArrays(const std::string& task, const TaskArrays& arrays) {
  if (!arrays.empty()) {
    throw std::invalid_argument("task '" + task + "' reads no arrays; got '" +
                                arrays.begin()->first + "'");
  }
}

const std::vector<double>& RequireArray(const std::string& task, const TaskArrays& arrays,
                                        const std::string& key, size_t row) {
  auto it = arrays.find(key);
  if (it == arrays.end()) {
    throw std::invalid_argument("task '" + task + "' needs the array '" + key + "'");
  }
  if (it->second.empty() || row == 0 || it->second.size() % row != 0) {
    throw std::invalid_argument("task '" + task + "': array '" + key + "' has " +
                                std::to_string(it->second.size()) +
                                " values, expected a positive multiple of " + std::to_string(row));
  }
  return it->second;
}

void CheckSolverParams(const std::string& task, const mjModel* m, double integrator,
                       double solver_iterations) {
  auto text = [](double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  if (!(integrator >= 0 && integrator <= 3) || integrator != std::floor(integrator)) {
    throw std::invalid_argument(task + ": integrator must be 0 (Euler), 1 (RK4), 2 (implicit) or "
                                "3 (implicitfast), got " + text(integrator));
  }
  if (!(solver_iterations >= 1 && solver_iterations <= 1000) ||
      solver_iterations != std::floor(solver_iterations)) {
    throw std::invalid_argument(task + ": solver_iterations must be a whole number in [1, 1000], "
                                "got " + text(solver_iterations));
  }
  if (m->opt.integrator != static_cast<int>(integrator) ||
      m->opt.iterations != static_cast<int>(solver_iterations)) {
    throw std::invalid_argument(
        task + ": the model's integrator " + std::to_string(m->opt.integrator) +
        " and solver iterations " + std::to_string(m->opt.iterations) + " are not the task's " +
        text(integrator) + " and " + text(solver_iterations) +
        " (set model.opt before building the pool, as TaskVectorEnv does)");
  }
}

}  // namespace omnilab
