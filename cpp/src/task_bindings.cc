#include "omnilab/bindings.h"

namespace omnilab {

void BindTasks(pybind11::module_& /*mod*/) {}

}  // namespace omnilab
