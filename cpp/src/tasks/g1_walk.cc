#include "omnilab/task.h"

namespace omnilab {
void RegisterG1Tasks() {}
}  // namespace omnilab
