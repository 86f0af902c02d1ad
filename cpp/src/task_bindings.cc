// Bindings of the task layer: TaskEnv over a BatchEnvPool, and the task registry. Buffers arrive
// validated by lightning_unilab/envs/vector_env.py; the checks here only keep C++ memory-safe.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "omnilab/bindings.h"
#include "omnilab/task.h"
#include "omnilab/task_env.h"

namespace py = pybind11;

namespace omnilab {

namespace {

using IdArray = py::array_t<int, py::array::c_style>;

// Pointer to a C-contiguous, writable array of T with at least count elements (or nullptr for
// None when optional); never copies, so that writes land in the caller's memory.
template <typename T>
T* Buffer(const py::object& obj, size_t count, const char* name, bool optional = false) {
  if (obj.is_none()) {
    if (optional) return nullptr;
    throw std::invalid_argument(std::string(name) + ": a buffer is required");
  }
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array>(obj) || !arr.dtype().is(py::dtype::of<T>()) ||
      !(arr.flags() & py::array::c_style) || !arr.writeable() ||
      static_cast<size_t>(arr.size()) < count) {
    throw std::invalid_argument(std::string(name) + ": expected a writable C-contiguous " +
                                py::str(py::dtype::of<T>()).cast<std::string>() +
                                " array of " + std::to_string(count) + " elements");
  }
  return static_cast<T*>(arr.mutable_data());
}

template <typename T>
const T* Input(const py::object& obj, size_t count, const char* name) {
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array>(obj) || !arr.dtype().is(py::dtype::of<T>()) ||
      !(arr.flags() & py::array::c_style) || static_cast<size_t>(arr.size()) != count) {
    throw std::invalid_argument(std::string(name) + ": expected a C-contiguous " +
                                py::str(py::dtype::of<T>()).cast<std::string>() +
                                " array of " + std::to_string(count) + " elements");
  }
  return static_cast<const T*>(arr.data());
}

py::dict SpecDict(const TaskSpec& s) {
  py::dict d;
  d["obs_size"] = s.obs_size;
  d["critic_size"] = s.critic_size;
  d["action_size"] = s.action_size;
  d["frame_skip"] = s.frame_skip;
  d["max_episode_steps"] = s.max_episode_steps;
  d["memory_size"] = s.memory_size;
  d["resample_steps"] = s.resample_steps;
  d["max_speed"] = s.max_speed;
  d["action_low"] = s.action_low;
  d["action_high"] = s.action_high;
  d["info_names"] = s.info_names;
  d["reset_info_size"] = s.reset_info_size;
  return d;
}

template <typename T>
py::array_t<T> ToArray(const std::vector<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

template <typename T>
std::vector<T> FromArray(const py::dict& state, const char* key) {
  if (!state.contains(key)) {
    throw std::invalid_argument(std::string("state: missing '") + key + "'");
  }
  auto arr = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(state[key]);
  if (!arr) throw std::invalid_argument(std::string("state['") + key + "']: expected an array");
  return std::vector<T>(arr.data(), arr.data() + arr.size());
}

}  // namespace

void BindTasks(py::module_& mod) {
  mod.def("task_names", &TaskNames, "Names of the C++ tasks, sorted.");
  mod.def("task_defaults", &TaskDefaults, py::arg("name"),
          "{parameter: default} of a task that declares its defaults in one table (else {}).");
  mod.attr("STATUS_BAD_ACTION") = kStatusBadAction;

  py::class_<TaskEnv>(mod, "TaskEnv")
      .def(py::init([](BatchEnvPool& pool, const std::string& name, const TaskParams& params,
                       bool same_step, const TaskArrays& arrays) {
             auto task = MakeTask(name, pool.model(), params, arrays);
             return std::make_unique<TaskEnv>(
                 &pool, std::move(task), same_step ? Autoreset::kSameStep : Autoreset::kNextStep);
           }),
           py::arg("pool"), py::arg("task"), py::arg("params"), py::arg("same_step"),
           py::arg("arrays") = TaskArrays{}, py::keep_alive<1, 2>())
      .def_property_readonly("spec", [](const TaskEnv& env) { return SpecDict(env.task().spec()); })
      .def("shared",
           [](const TaskEnv& env) { return ToArray(env.task().shared()); },
           "A copy of the task's shared state (the tracking task's start-bin statistics).")
      .def(
          "seed",
          [](TaskEnv& env, std::optional<IdArray> ids, std::uint64_t seed) {
            env.Seed(ids ? ids->data() : nullptr, ids ? static_cast<int>(ids->size()) : 0, seed);
          },
          py::arg("ids"), py::arg("seed"))
      .def(
          "reset",
          [](TaskEnv& env, std::optional<IdArray> ids, py::object states, py::object obs,
             py::object critic, py::object info) {
            const TaskSpec& s = env.task().spec();
            const size_t n = env.num_envs();
            const int nid = ids ? static_cast<int>(ids->size()) : static_cast<int>(n);
            StepBuffers out;
            out.obs = Buffer<mjtNum>(obs, n * s.obs_size, "obs");
            out.critic = Buffer<mjtNum>(critic, n * s.critic_size, "critic", true);
            out.info = Buffer<mjtNum>(info, n * s.info_names.size(), "info", true);
            const mjtNum* rows = nullptr;
            if (!states.is_none()) {
              rows = Input<mjtNum>(states, static_cast<size_t>(nid) * env.pool().state_size(),
                                   "initial_state");
            }
            const int* ptr = ids ? ids->data() : nullptr;
            py::gil_scoped_release release;
            env.Reset(ptr, nid, rows, out);
          },
          py::arg("ids"), py::arg("states"), py::arg("obs"), py::arg("critic"),
          py::arg("info") = py::none())
      .def(
          "step",
          [](TaskEnv& env, py::object actions, py::object obs, py::object critic,
             py::object reward, py::object terminated, py::object truncated, py::object final_obs,
             py::object final_critic, py::object episode_return, py::object episode_length,
             py::object info, py::object status, bool float32_actions) {
            const TaskSpec& s = env.task().spec();
            const size_t n = env.num_envs();
            const mjtNum* act = Input<mjtNum>(actions, n * s.action_size, "actions");
            StepBuffers out;
            out.obs = Buffer<mjtNum>(obs, n * s.obs_size, "obs");
            out.critic = Buffer<mjtNum>(critic, n * s.critic_size, "critic", true);
            out.reward = Buffer<mjtNum>(reward, n, "reward");
            out.terminated = Buffer<std::uint8_t>(terminated, n, "terminated");
            out.truncated = Buffer<std::uint8_t>(truncated, n, "truncated");
            out.final_obs = Buffer<mjtNum>(final_obs, n * s.obs_size, "final_obs", true);
            out.final_critic =
                Buffer<mjtNum>(final_critic, n * s.critic_size, "final_critic", true);
            out.episode_return = Buffer<mjtNum>(episode_return, n, "episode_return", true);
            out.episode_length =
                Buffer<std::int32_t>(episode_length, n, "episode_length", true);
            out.info = Buffer<mjtNum>(info, n * s.info_names.size(), "info", true);
            out.status = Buffer<std::uint32_t>(status, n, "status", true);
            py::gil_scoped_release release;
            env.Step(act, out, float32_actions);
          },
          py::arg("actions"), py::arg("obs"), py::arg("critic"), py::arg("reward"),
          py::arg("terminated"), py::arg("truncated"), py::arg("final_obs"),
          py::arg("final_critic"), py::arg("episode_return"), py::arg("episode_length"),
          py::arg("info") = py::none(), py::arg("status") = py::none(),
          py::arg("float32_actions") = false)
      .def("get_state",
           [](const TaskEnv& env) {
             const EpisodeState state = env.GetState();
             py::dict out;
             out["rng"] = ToArray(state.rng);
             out["memory"] = ToArray(state.memory);
             out["returns"] = ToArray(state.returns);
             out["lengths"] = ToArray(state.lengths);
             out["pending"] = ToArray(state.pending);
             out["shared"] = ToArray(state.shared);
             return out;
           })
      .def(
          "set_state",
          [](TaskEnv& env, const py::dict& state) {
            env.SetState(EpisodeState{FromArray<std::uint64_t>(state, "rng"),
                                      FromArray<mjtNum>(state, "memory"),
                                      FromArray<mjtNum>(state, "returns"),
                                      FromArray<std::int32_t>(state, "lengths"),
                                      FromArray<std::uint8_t>(state, "pending"),
                                      FromArray<mjtNum>(state, "shared")});
          },
          py::arg("state"))
      .def("memory",
           [](py::object self) {
             auto& env = self.cast<TaskEnv&>();
             const int size = env.task().spec().memory_size;
             return py::array_t<mjtNum>({env.num_envs(), size}, env.memory(), self);
           })
      .def("episode_steps", [](py::object self) {
        auto& env = self.cast<TaskEnv&>();
        return py::array_t<std::int32_t>({env.num_envs()}, env.episode_steps(), self);
      });
}

}  // namespace omnilab
