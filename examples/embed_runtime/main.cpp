// A tiny application that embeds ladle's runtime: it compiles a kernel at run time
// (through the disk cache), runs it on the GPU when there is one, and otherwise says why
// not and computes the same thing on the CPU. Either way it checks the result: the last line
// is the verdict, `embed_runtime: ok`, or `embed_runtime: FAILED (why)` and exit status 1.
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>

#include "verdict.h"

static const char* kSaxpy = R"(
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

namespace {

// Compiles saxpy, runs it (on the CPU when there is no GPU) and checks every element; returns
// "" when all matched, else the first that did not.
std::string run() {
  const int n = 1 << 20;
  const float a = 0.5f;
  std::vector<float> x(n), y(n), expected(n);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int i = 0; i < n; ++i) x[i] = dist(rng), y[i] = dist(rng), expected[i] = a * x[i] + y[i];

  ladle::CompiledProgram program = ladle::compile(kSaxpy);
  std::printf("compiled saxpy for %s: %zu bytes of PTX, %zu of cubin (%s, %.1f ms)\n",
              program.arch.c_str(), program.ptx.size(), program.cubin.size(),
              program.from_cache ? "cache hit" : "NVRTC", program.compile_ms);
  if (const auto* r = program.resources("saxpy"))
    std::printf("saxpy uses %d registers, %d bytes of shared memory\n", r->registers,
                r->shared_bytes);
  if (program.ptx.empty()) return "NVRTC gave no PTX for saxpy";

  std::vector<float> result(n);
  if (ladle::driver_available()) {
    ladle::Module module(program);
    ladle::Kernel kernel = module.kernel("saxpy");
    ladle::DeviceBuffer dx(n * sizeof(float)), dy(n * sizeof(float));
    dx.copy_from_host(x.data(), dx.bytes());
    dy.copy_from_host(y.data(), dy.bytes());
    ladle::KernelArgs args;
    args.add(a).add(dx).add(dy).add(n);
    kernel.launch({(n + 255) / 256}, {256}, args);
    dy.copy_to_host(result.data(), dy.bytes());
    std::printf("ran on %s\n", ladle::Device::get().properties().name.c_str());
  } else {
    for (int i = 0; i < n; ++i) result[i] = a * x[i] + y[i];
  }
  for (int i = 0; i < n; ++i) {
    if (!(std::fabs(result[i] - expected[i]) <= 1e-6f)) {
      char why[128];
      std::snprintf(why, sizeof why, "saxpy wrong at %d: %g, expected %g", i, result[i],
                    expected[i]);
      return why;
    }
  }
  std::printf("saxpy verified on %d elements\n", n);
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (!example::parse_arguments(argc, argv, "example-embed-runtime", false)) return 2;
  return example::report("embed_runtime", run);
}
