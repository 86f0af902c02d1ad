#include "omnilab/model_fields.h"

#include <mujoco/mjxmacro.h>

#include <string>

namespace omnilab {

std::optional<ModelFieldRef> FindModelField(const mjModel* m, std::string_view name) {
  const char* base = reinterpret_cast<const char*>(m);
  if (name.substr(0, 4) == "opt.") {
    const std::string_view field = name.substr(4);
#define X(type, field_name, n)                                                               \
  if (field == #field_name) {                                                                \
    return ModelFieldRef{static_cast<std::size_t>(                                           \
                             reinterpret_cast<const char*>(&m->opt.field_name) - base),      \
                         sizeof(type) * (n), true};                                          \
  }
#define XVEC X
    MJOPTION_FIELDS
#undef XVEC
#undef X
    return std::nullopt;
  }
  MJMODEL_POINTERS_PREAMBLE(m)
#define X(type, field_name, nr, nc)                                                          \
  if (name == #field_name) {                                                                 \
    return ModelFieldRef{static_cast<std::size_t>(                                           \
                             reinterpret_cast<const char*>(&m->field_name) - base),          \
                         sizeof(type) * static_cast<std::size_t>(m->nr) * (nc), false};      \
  }
#define XNV X
  MJMODEL_POINTERS
#undef XNV
#undef X
  return std::nullopt;
}

}  // namespace omnilab
