// ladle-bench-runtime: the runtime layer on a real GPU. Compiles a vector add and a block
// reduction through ladle::compile (and so through the disk cache), runs both on random
// inputs and checks them against the CPU, then reports:
//   - compile time per kernel (a miss on a cold cache, a lookup on a warm one),
//   - module load and kernel lookup per kernel,
//   - process start to first launch (pass --t0-ns $(date +%s%N) from the shell),
//   - launch overhead: host enqueue cost and launch+sync round trip of an empty kernel.
// Exit status 1 when a result is wrong.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
std::int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* kVectorAdd = R"(
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    c[i] = a[i] + b[i];
}
)";

// Two-pass sum: one partial per block (warp shuffles, then shared memory), then one block.
const char* kReduce = R"(
extern "C" __global__ void reduce_sum(const float* __restrict__ x, float* __restrict__ partial, long n) {
  __shared__ float warp_sums[32];
  float sum = 0.0f;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    sum += x[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) partial[blockIdx.x] = sum;
  }
}
)";

const char* kEmpty = R"(extern "C" __global__ void empty_kernel(int) {})";

struct Loaded {
  ladle::CompiledProgram program;
  std::unique_ptr<ladle::Module> module;
  double compile_ms = 0, load_ms = 0;
};

Loaded load(const char* source, const char* name) {
  Loaded l;
  auto t = Clock::now();
  l.program = ladle::compile(source);
  l.compile_ms = ms_since(t);
  t = Clock::now();
  l.module = std::make_unique<ladle::Module>(l.program);
  (void)l.module->kernel(name);
  l.load_ms = ms_since(t);
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  const auto main_start = Clock::now();
  CLI::App app{"ladle-bench-runtime"};
  std::int64_t t0_ns = 0;
  long n = 1 << 26;
  int launches = 20000;
  bool quick = false;
  app.add_option("--t0-ns", t0_ns, "process start as unix ns (date +%s%N), for start-to-launch");
  app.add_option("-n", n, "elements");
  app.add_option("--launches", launches, "launches for the overhead measurement");
  app.add_flag("--quick", quick, "small sizes, no timing loops (for compute-sanitizer)");
  CLI11_PARSE(app, argc, argv);
  if (quick) n = 100003, launches = 10;

  try {
    if (!ladle::driver_available()) {
      std::printf("%s\n", ladle::driver_unavailable_reason().c_str());
      return 2;
    }
    auto& device = ladle::Device::get();
    const double init_ms = ms_since(main_start);
    Loaded add = load(kVectorAdd, "vector_add");
    ladle::Kernel add_kernel = add.module->kernel("vector_add");
    {
      // The first launch, on a tiny input, right after loading: what an application that
      // starts from a warm cache waits for.
      ladle::DeviceBuffer small(3 * 1024 * 4);
      small.fill_bytes(0);
      ladle::KernelArgs first;
      first.add(small.device_ptr()).add(small.device_ptr() + 4096).add(small.device_ptr() + 8192)
          .add(1024L);
      add_kernel.launch({4}, {256}, first);
      device.synchronize();
    }
    const double start_to_launch_ms =
        t0_ns ? (unix_ns() - t0_ns) / 1e6 : ms_since(main_start);

    std::vector<float> a(n), b(n), c(n);
    std::mt19937 rng(1234);
    std::normal_distribution<float> dist;
    for (long i = 0; i < n; ++i) a[i] = dist(rng), b[i] = dist(rng);
    ladle::DeviceBuffer da(n * 4), db(n * 4), dc(n * 4);
    da.copy_from_host(a.data(), n * 4);
    db.copy_from_host(b.data(), n * 4);
    dc.fill_bytes(0xff);  // NaN poison: unwritten elements fail the check

    const unsigned blocks = device.properties().sm_count * 8;
    ladle::KernelArgs add_args;
    add_args.add(da).add(db).add(dc).add(n);
    add_kernel.launch({blocks}, {256}, add_args);
    device.synchronize();

    Loaded red = load(kReduce, "reduce_sum");
    ladle::Kernel reduce_kernel = red.module->kernel("reduce_sum");
    Loaded empty = load(kEmpty, "empty_kernel");
    ladle::Kernel empty_kernel = empty.module->kernel("empty_kernel");

    dc.copy_to_host(c.data(), n * 4);
    long wrong = 0;
    for (long i = 0; i < n; ++i) wrong += c[i] != a[i] + b[i];

    ladle::DeviceBuffer partial(blocks * 4), total(4);
    ladle::KernelArgs r1, r2;
    r1.add(da).add(partial).add(n);
    r2.add(partial).add(total).add(static_cast<long>(blocks));
    reduce_kernel.launch({blocks}, {256}, r1);
    reduce_kernel.launch({1}, {1024}, r2);
    float gpu_sum = 0;
    total.copy_to_host(&gpu_sum, 4);
    double ref_sum = 0, abs_sum = 0;
    for (long i = 0; i < n; ++i) ref_sum += a[i], abs_sum += std::fabs(a[i]);
    const double sum_error = std::fabs(gpu_sum - ref_sum) / abs_sum;

    std::printf("device: %s (%s, %d SMs, driver %d)\n", device.properties().name.c_str(),
                device.properties().arch().c_str(), device.properties().sm_count,
                device.properties().driver_version);
    std::printf("check vector_add: %ld of %ld elements wrong\n", wrong, n);
    std::printf("check reduce_sum: gpu %.6f ref %.6f, |err|/sum|x| = %.2e\n", gpu_sum, ref_sum,
                sum_error);
    const bool ok = wrong == 0 && sum_error < 1e-5;
    if (quick) return ok ? 0 : 1;

    // Bandwidth of the vector add (12 bytes per element), for a sanity check of the launch.
    ladle::Stream stream;
    ladle::Event e0, e1;
    std::vector<float> times;
    for (int rep = 0; rep < 20; ++rep) {
      e0.record(&stream);
      add_kernel.launch({blocks}, {256}, add_args, 0, &stream);
      e1.record(&stream);
      e1.synchronize();
      times.push_back(e0.elapsed_ms_to(e1));
    }
    std::sort(times.begin(), times.end());
    const double add_ms = times[times.size() / 2];

    ladle::KernelArgs empty_args;
    empty_args.add(0);
    for (int i = 0; i < 100; ++i) empty_kernel.launch({1}, {32}, empty_args, 0, &stream);
    stream.synchronize();
    auto t = Clock::now();
    for (int i = 0; i < launches; ++i) empty_kernel.launch({1}, {32}, empty_args, 0, &stream);
    const double enqueue_us = ms_since(t) * 1e3 / launches;
    stream.synchronize();
    const int round_trips = std::min(launches, 2000);
    t = Clock::now();
    for (int i = 0; i < round_trips; ++i) {
      empty_kernel.launch({1}, {32}, empty_args, 0, &stream);
      stream.synchronize();
    }
    const double round_trip_us = ms_since(t) * 1e3 / round_trips;

    std::printf("\n%-34s %12s\n", "runtime metric", "value");
    std::printf("%-34s %9.2f ms\n", "driver init + context", init_ms);
    std::printf("%-34s %9.2f ms  (%s)\n", "compile vector_add", add.compile_ms,
                add.program.from_cache ? "cache hit" : "NVRTC");
    std::printf("%-34s %9.2f ms  (%s)\n", "compile reduce_sum", red.compile_ms,
                red.program.from_cache ? "cache hit" : "NVRTC");
    std::printf("%-34s %9.2f ms  (%s)\n", "module load vector_add", add.load_ms,
                add.module->loaded_from_cubin() ? "cubin" : "PTX JIT");
    std::printf("%-34s %9.2f ms  (%s)\n", "module load reduce_sum", red.load_ms,
                red.module->loaded_from_cubin() ? "cubin" : "PTX JIT");
    std::printf("%-34s %9.2f ms\n", "per kernel: lookup + load (mean)",
                (add.compile_ms + add.load_ms + red.compile_ms + red.load_ms) / 2);
    std::printf("%-34s %9.2f ms\n", "process start -> first launch done", start_to_launch_ms);
    std::printf("%-34s %9.2f us\n", "launch enqueue (empty kernel)", enqueue_us);
    std::printf("%-34s %9.2f us\n", "launch + sync round trip", round_trip_us);
    std::printf("%-34s %9.3f ms  (%.0f GB/s)\n", "vector_add 2^26 floats", add_ms,
                12.0 * n / add_ms / 1e6);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ladle-bench-runtime: %s\n", e.what());
    return 1;
  }
}
