// For the [background] tests on the GPU: every compile of the scope cold and the interim path on. A
// fresh -D in LADLE_NVRTC_FLAGS (part of every cache key) keeps the test cache of an earlier run from
// hiding the path; LADLE_BACKGROUND_COMPILE=1 undoes the test main's default (tests/main.cpp). A test
// calls ladle::finish_background_compiles() before the scope ends: the jobs read the flags.
#pragma once

#include <random>
#include <string>

#include <catch2/catch.hpp>
#include <ladle/runtime/driver.h>

#include "runtime/scoped_env.h"

namespace ladle::test {

// Whether a GPU runs the test; without one it warns (the stand-in driver's tests check the host side).
inline bool background_gpu() {
  if (ladle::driver_available()) return true;
  WARN("no GPU: the interim path's host side is checked on the stand-in driver (ops-stand_in_driver [background])");
  return false;
}

class ColdCompiles {
 public:
  ColdCompiles() : fresh_("-DLADLE_TEST_FRESH=" + std::to_string(std::random_device{}())) {}

 private:
  std::string fresh_;
  ScopedEnv flags_{"LADLE_NVRTC_FLAGS", fresh_.c_str()};
  ScopedEnv on_{"LADLE_BACKGROUND_COMPILE", "1"};
};

}  // namespace ladle::test
