// The version of the ladle library that is running (not the one a program was built
// against): it enters every cache key, so an upgrade never reuses an older ladle's results.
#pragma once

#include <string>

namespace ladle {

std::string version();  // "0.1.0"

}  // namespace ladle
