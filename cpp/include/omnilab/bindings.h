// Pieces of the _core module defined in separate files.
#pragma once

#include <pybind11/pybind11.h>

namespace omnilab {

// Task environments on top of BatchEnvPool (cpp/src/task_bindings.cc).
void BindTasks(pybind11::module_& mod);

// Cross-process atomics on shared-memory words (cpp/src/shm_atomics.cc).
void BindSharedAtomics(pybind11::module_& mod);

}  // namespace omnilab
