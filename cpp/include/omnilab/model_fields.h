// Named mjModel arrays and mjOption fields, located in any mjModel by name.
#pragma once

#include <mujoco/mujoco.h>

#include <cstddef>
#include <optional>
#include <string_view>

namespace omnilab {

// Where a field lives in an mjModel struct: offset (from the struct's start) of its pointer
// member for arrays, or of the value itself for "opt.<name>" fields; and its size in bytes.
struct ModelFieldRef {
  std::size_t offset;
  std::size_t bytes;
  bool is_option;  // the value is inside the struct (m->opt), not behind a pointer
};

// The array field (as in MjModel) or "opt.<field>" called name, sized for m; nullopt if none.
std::optional<ModelFieldRef> FindModelField(const mjModel* m, std::string_view name);

// Address of the field's data in m.
inline char* FieldData(mjModel* m, const ModelFieldRef& ref) {
  char* at = reinterpret_cast<char*>(m) + ref.offset;
  return ref.is_option ? at : *reinterpret_cast<char**>(at);
}
inline const char* FieldData(const mjModel* m, const ModelFieldRef& ref) {
  return FieldData(const_cast<mjModel*>(m), ref);
}
// Points the array field of m at data (arrays only).
inline void PointField(mjModel* m, const ModelFieldRef& ref, char* data) {
  *reinterpret_cast<char**>(reinterpret_cast<char*>(m) + ref.offset) = data;
}

}  // namespace omnilab
