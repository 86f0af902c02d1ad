#include "omnilab/data_fields.h"

#include <mujoco/mjxmacro.h>

namespace omnilab {
namespace {

std::optional<DataField> Make(const char* name, mjtNum* mjData::*member, mjtSize rows,
                              mjtSize cols) {
  return DataField{name, member, static_cast<int>(rows), static_cast<int>(cols)};
}

// Integer and pointer fields are state bookkeeping, not outputs.
template <typename T>
std::optional<DataField> Make(const char*, T* mjData::*, mjtSize, mjtSize) {
  return std::nullopt;
}

}  // namespace

std::optional<DataField> FindDataField(const mjModel* m, std::string_view name) {
#define X(type, field, nr, nc) \
  if (name == #field) return Make(#field, &mjData::field, m->nr, nc);
#define XNV X
  MJDATA_POINTERS
#undef XNV
#undef X
  return std::nullopt;
}

std::vector<std::string> DataFieldNames() {
  std::vector<std::string> names;
#define X(type, field, nr, nc) \
  if (std::is_same_v<type, mjtNum>) names.emplace_back(#field);
#define XNV X
  MJDATA_POINTERS
#undef XNV
#undef X
  return names;
}

}  // namespace omnilab
