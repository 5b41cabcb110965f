// The test programs' main: Catch2's, after pinning what the tests run. Ops tests on the GPU take
// the heuristic tile unless the caller's environment names a policy (the tuner's own tests pass
// theirs explicitly), so that a test program run by hand does not tune every shape it meets (ops
// tests ran past 200 s that way); ctest sets the same. Outputs a kernel writes whole are poisoned
// (0xff, NaN) as they are made (LADLE_POISON_OUTPUTS), so that an element it skips fails a comparison.
// A cold call waits for its kernels (LADLE_BACKGROUND_COMPILE=0): a test checks the form it plans, not
// the interim form a cold cache would otherwise run first (the [background] tests turn it on).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdlib>

int main(int argc, char** argv) {
  setenv("LADLE_AUTOTUNE", "heuristic", /*overwrite=*/0);
  setenv("LADLE_POISON_OUTPUTS", "1", /*overwrite=*/0);
  setenv("LADLE_BACKGROUND_COMPILE", "0", /*overwrite=*/0);
  return Catch::Session().run(argc, argv);
}
