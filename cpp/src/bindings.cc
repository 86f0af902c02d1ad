// Python bindings of lightning_unilab._core. Validation and documentation live in
// lightning_unilab/envs/pool.py; here ids and buffers arrive already checked.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>

#include "omnilab/batch_env_pool.h"
#include "omnilab/bindings.h"
#include "omnilab/data_fields.h"
#include "omnilab/kernels.h"
#include "omnilab/model_fields.h"

namespace py = pybind11;
using omnilab::BatchEnvPool;

namespace {

using IdArray = py::array_t<int, py::array::c_style>;
using NumArray = py::array_t<mjtNum, py::array::c_style>;

// (pointer, count) of optional ids; nullptr selects every environment.
std::pair<const int*, int> Ids(const std::optional<IdArray>& ids) {
  if (!ids) return {nullptr, 0};
  return {ids->data(), static_cast<int>(ids->size())};
}

// A numpy view of memory the pool owns; it keeps the pool alive.
template <typename T>
py::array View(py::handle owner, T* data, std::vector<py::ssize_t> shape) {
  return py::array_t<T>(shape, data, owner);
}

}  // namespace

PYBIND11_MODULE(_core, mod) {
  mod.doc() = "C++ core of lightning_unilab: BatchEnvPool on MuJoCo's batch engine.";
  mod.def("mujoco_build_version", [] { return mjVERSION_HEADER; },
          "mjVERSION_HEADER of the headers this extension was compiled against.");
  mod.def("mujoco_runtime_version", [] { return mj_version(); },
          "mj_version() of the libmujoco loaded at run time.");
  mod.def("data_field_names", &omnilab::DataFieldNames,
          "mjData fields that can be copied out per environment.");
  mod.attr("STATUS_ERROR") = omnilab::kStatusError;
  mod.attr("STATUS_TOO_FAST") = omnilab::kStatusTooFast;
  mod.attr("NUM_WARNINGS") = static_cast<int>(mjNWARNING);

  py::class_<BatchEnvPool>(mod, "BatchEnvPool")
      .def(py::init([](std::uintptr_t model_address, int num_envs, int num_threads,
                       const std::vector<std::pair<std::string, std::vector<int>>>& outputs) {
             std::vector<omnilab::OutputSpec> specs;
             for (const auto& [field, rows] : outputs) specs.push_back({field, rows});
             const auto* model = reinterpret_cast<const mjModel*>(model_address);
             py::gil_scoped_release release;
             return std::make_unique<BatchEnvPool>(model, num_envs, num_threads, specs);
           }),
           py::arg("model_address"), py::arg("num_envs"), py::arg("num_threads"),
           py::arg("outputs"))
      .def_property_readonly("num_envs", &BatchEnvPool::num_envs)
      .def_property_readonly("num_threads", &BatchEnvPool::num_threads)
      .def_property_readonly("state_size", &BatchEnvPool::state_size)
      .def("state",
           [](py::object self) {
             auto& pool = self.cast<BatchEnvPool&>();
             return View(self, pool.state(), {pool.num_envs(), pool.state_size()});
           })
      .def("state_component", &BatchEnvPool::StateComponent, py::arg("component"))
      .def("status",
           [](py::object self) {
             auto& pool = self.cast<BatchEnvPool&>();
             return View(self, pool.status(), {pool.num_envs()});
           })
      .def("outputs",
           [](py::object self) {
             auto& pool = self.cast<BatchEnvPool&>();
             py::dict views;
             for (auto& out : pool.outputs()) {
               views[py::str(out.field.name)] =
                   View(self, out.values.data(),
                        {pool.num_envs(), static_cast<py::ssize_t>(out.rows.size()),
                         out.field.cols});
             }
             return views;
           })
      .def(
          "step",
          [](BatchEnvPool& pool, std::optional<IdArray> ids, int nstep, int stage,
             double max_speed) {
            auto [ptr, n] = Ids(ids);
            py::gil_scoped_release release;
            return pool.Step(ptr, n, nstep, stage, max_speed);
          },
          py::arg("ids"), py::arg("nstep"), py::arg("stage"), py::arg("max_speed") = 0.0)
      .def(
          "forward",
          [](BatchEnvPool& pool, std::optional<IdArray> ids, int stage) {
            auto [ptr, n] = Ids(ids);
            py::gil_scoped_release release;
            return pool.Forward(ptr, n, stage);
          },
          py::arg("ids"), py::arg("stage"))
      .def(
          "reset",
          [](BatchEnvPool& pool, std::optional<IdArray> ids, std::optional<IdArray> keys,
             std::optional<NumArray> initial_state, int stage) {
            auto [ptr, n] = Ids(ids);
            const int* key = keys ? keys->data() : nullptr;
            const mjtNum* init = initial_state ? initial_state->data() : nullptr;
            py::gil_scoped_release release;
            return pool.Reset(ptr, n, key, init, stage);
          },
          py::arg("ids"), py::arg("keys"), py::arg("initial_state"), py::arg("stage"))
      .def(
          "set_const",
          [](BatchEnvPool& pool, std::optional<IdArray> ids,
             const std::vector<std::string>& outputs) {
            auto [ptr, n] = Ids(ids);
            py::gil_scoped_release release;
            return pool.SetConst(ptr, n, outputs);
          },
          py::arg("ids"), py::arg("outputs"))
      .def(
          "expand",
          [](py::object self, const std::string& name, bool create) -> py::object {
            auto& pool = self.cast<BatchEnvPool&>();
            int size = 0, elemsize = 0;
            void* data = create ? pool.Expand(name, &size, &elemsize)
                                : const_cast<void*>(pool.Expanded(name, &size, &elemsize));
            if (!data) return py::none();
            return View(self, static_cast<std::uint8_t*>(data),
                        {pool.num_envs(), static_cast<py::ssize_t>(size) * elemsize});
          },
          py::arg("name"), py::arg("create"))
      .def(
          "model_bytes",
          [](py::object self, const std::string& name) -> py::object {
            // the bytes of a field of the pool's own model copy (the shared, unexpanded values)
            auto& pool = self.cast<BatchEnvPool&>();
            std::optional<omnilab::ModelFieldRef> ref = omnilab::FindModelField(pool.model(), name);
            if (!ref) return py::none();
            const char* data = omnilab::FieldData(pool.model(), *ref);
            return View(self, reinterpret_cast<std::uint8_t*>(const_cast<char*>(data)),
                        {static_cast<py::ssize_t>(ref->bytes)});
          },
          py::arg("name"))
      .def("error", &BatchEnvPool::Error, py::arg("env"));

  omnilab::BindTasks(mod);
  omnilab::BindSharedAtomics(mod);
}
