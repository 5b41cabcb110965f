#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/event_timer.h>

#include <catch2/catch.hpp>
#include <vector>

#include "kernels.h"

using namespace ladle;

TEST_CASE("the median resists one slow repeat") {
  REQUIRE(median({3.0}) == 3.0);
  REQUIRE(median({5.0, 1.0, 3.0}) == 3.0);
  REQUIRE(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  REQUIRE(median({1.0, 1.1, 0.9, 1.0, 250.0}) == 1.0);  // one preempted run
  REQUIRE_THROWS_AS(median({}), InvalidArgument);
}

// Runs only where a GPU is present (the lent GPU, not CI).
TEST_CASE("time_launches rotates the input sets and times each repeat on the GPU") {
  if (!driver_available()) {
    WARN("no GPU: " << driver_unavailable_reason());
    return;
  }
  Device& device = Device::get();
  CompileOptions options;
  auto program = compile(test::vector_add_source, options);
  Module module(program);
  Kernel kernel = module.kernel("vector_add");
  const int n = 1 << 22;
  std::vector<DeviceBuffer> inputs;
  for (int i = 0; i < 3; ++i) inputs.emplace_back(sizeof(float) * n);
  DeviceBuffer out(sizeof(float) * n);
  Stream stream;
  std::vector<int> launched;
  TimingOptions timing;
  timing.warmup = 2;
  timing.repeats = 7;
  timing.input_sets = 3;
  const double ms = time_launches(
      stream,
      [&](int set) {
        launched.push_back(set);
        KernelArgs args;
        args.add(inputs[set]).add(inputs[(set + 1) % 3]).add(out).add(n);
        kernel.launch({static_cast<unsigned>(n / 256)}, {256}, args, 0, &stream);
      },
      timing);
  REQUIRE(launched == std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2});
  REQUIRE(ms > 0);
  REQUIRE(ms < 100);  // 48 MiB moved: well under a millisecond on a current GPU
  (void)device;
}
