#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>

#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "kernels.h"

using namespace ladle;

namespace {
std::string run_probe(const std::string& env) {
  const std::string command = env + " " + LADLE_TEST_PROBE + " driver 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  REQUIRE(pipe);
  std::string out;
  std::array<char, 512> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe.get())) out += buffer.data();
  return out;
}
}  // namespace

TEST_CASE("a missing driver library yields the documented NoCudaDriver error") {
  const std::string out = run_probe("LADLE_CUDA_DRIVER_LIBRARY=/nonexistent/libcuda.so.1");
  INFO(out);
  REQUIRE_THAT(out, Catch::Contains("available=0"));
  REQUIRE_THAT(out, Catch::Contains("NoCudaDriver: no CUDA driver"));
  REQUIRE_THAT(out, Catch::Contains("/nonexistent/libcuda.so.1"));
}

TEST_CASE("the driver layer either runs a kernel or says why it cannot") {
  if (!driver_available()) {
    const std::string reason = driver_unavailable_reason();
    INFO("no GPU here: " << reason);
    REQUIRE_THAT(reason, Catch::Contains("no CUDA driver"));
    // The one-line form the examples print: the same reason, no list of the paths tried.
    const std::string summary = driver_unavailable_summary();
    CHECK_THAT(summary, Catch::StartsWith("no CUDA driver") || Catch::StartsWith("no usable GPU") || Catch::StartsWith("no GPU"));
    CHECK(summary.find('\n') == std::string::npos);
    CHECK(summary.size() < reason.size());
    REQUIRE_THROWS_AS(Device::count(), NoCudaDriver);
    REQUIRE_THROWS_AS(DeviceBuffer(16), NoCudaDriver);
    return;
  }
  // On a machine with a GPU: a real launch, checked element by element.
  CHECK(driver_unavailable_summary().empty());
  const auto& props = Device::get().properties();
  REQUIRE(props.sm_count > 0);
  auto program = compile(test::vector_add_source);
  Module module(program);
  Kernel kernel = module.kernel("vector_add");
  const int n = 100003;
  std::vector<float> a(n), b(n), c(n, -1.0f);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int i = 0; i < n; ++i) a[i] = dist(rng), b[i] = dist(rng);
  DeviceBuffer da(n * 4), db(n * 4), dc(n * 4);
  da.copy_from_host(a.data(), n * 4);
  db.copy_from_host(b.data(), n * 4);
  dc.fill_bytes(0xff);  // NaN poison
  KernelArgs args;
  args.add(da).add(db).add(dc).add(n);
  kernel.launch({(n + 255) / 256}, {256}, args);
  Device::get().synchronize();
  dc.copy_to_host(c.data(), n * 4);
  for (int i = 0; i < n; ++i) REQUIRE(c[i] == a[i] + b[i]);
  REQUIRE_THROWS_AS(module.kernel("no_such_kernel"), CudaError);
  REQUIRE_THROWS_AS(da.copy_to_host(c.data(), n * 4, 8), InvalidArgument);
}
