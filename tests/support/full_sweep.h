// How far a test sweeps. By default a sweep runs a set that still reaches every value of every
// axis (each gate combination, dtype, mode, head dim, tile field, form) without their product;
// under LADLE_TEST_SWEEP=full (the ctest label `full`: `ctest -L full`, on demand and on the GPU
// machine) it runs the whole product.
#pragma once

#include <cstdlib>
#include <string_view>

namespace test {

inline bool full_sweep() {
  const char* value = std::getenv("LADLE_TEST_SWEEP");
  return value && std::string_view(value) == "full";
}

}  // namespace test
