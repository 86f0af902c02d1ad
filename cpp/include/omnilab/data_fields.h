// Names of mjData arrays that a pool can copy out per environment.
#pragma once

#include <mujoco/mujoco.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace omnilab {

// One mjtNum array of mjData, viewed as (rows, cols).
struct DataField {
  std::string name;
  mjtNum* mjData::*member;
  int rows;
  int cols;
};

// The mjtNum field of mjData called name, sized for model m; nullopt if there is none (arena
// fields such as efc_* change size every step and are not listed).
std::optional<DataField> FindDataField(const mjModel* m, std::string_view name);

// Names of every field FindDataField accepts, for error messages.
std::vector<std::string> DataFieldNames();

}  // namespace omnilab
