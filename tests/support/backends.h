// The backends a test runs an op on: always the CPU path, and the GPU when this machine has
// one. Without a GPU the test says so in its output (a Catch2 warning), it does not skip
// silently; CI has no GPU, bench/gpu-check.sh runs the same tests where there is one.
#pragma once

#include <vector>

#include <catch2/catch.hpp>

#include <ladle/ops/variant.h>
#include <ladle/runtime/driver.h>

namespace test {

inline const std::vector<ladle::Backend>& backends() {
  static const std::vector<ladle::Backend> list = [] {
    std::vector<ladle::Backend> b{ladle::Backend::cpu};
    if (ladle::driver_available()) b.push_back(ladle::Backend::gpu);
    return b;
  }();
  if (list.size() == 1) {
    static bool warned = false;
    if (!warned) {
      warned = true;
      WARN("GPU backend not exercised here: " << ladle::driver_unavailable_reason());
    }
  }
  return list;
}

}  // namespace test
