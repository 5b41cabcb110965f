// What each driver call a ladle call makes costs on a real GPU, so that the counts the stand-in
// driver prints (LADLE_FAKE_CUDA_COUNTS=1 bench/host-overhead.sh) become microseconds. Run on the
// GPU machine:
//   c++ -O2 -std=c++20 -I/usr/local/cuda/include bench/host-overhead/driver_costs.cpp
//       -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/driver-costs && /tmp/driver-costs
// Prints nanoseconds a call, best of 5 runs of 20,000 calls.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace {

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* name = "?";
    cuGetErrorName(r, &name);
    std::fprintf(stderr, "%s failed: %s\n", what, name);
    std::exit(1);
  }
}

double ns_per_call(const char* name, const std::function<void()>& call, int calls = 20000) {
  for (int i = 0; i < 100; ++i) call();
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / calls);
  }
  std::printf("%-44s %9.1f ns a call\n", name, best);
  return best;
}

// An empty kernel, in PTX, for the launch's own cost.
const char* const kEmptyPtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry empty(.param .u64 p0, .param .u64 p1) { ret; }
)";

}  // namespace

int main() {
  check(cuInit(0), "cuInit");
  CUdevice device = 0;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context = nullptr;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  CUstream stream = nullptr;
  check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUdeviceptr buffer = 0;
  const std::size_t bytes = std::size_t{64} << 20;
  check(cuMemAlloc(&buffer, bytes), "cuMemAlloc");
  CUmodule module = nullptr;
  check(cuModuleLoadData(&module, kEmptyPtx), "cuModuleLoadData");
  CUfunction empty = nullptr;
  check(cuModuleGetFunction(&empty, module, "empty"), "cuModuleGetFunction");

  ns_per_call("cuDeviceGetCount", [] {
    int n = 0;
    check(cuDeviceGetCount(&n), "cuDeviceGetCount");
  });
  ns_per_call("cuCtxSetCurrent (already current)", [&] { check(cuCtxSetCurrent(context), "cuCtxSetCurrent"); });
  ns_per_call("cuCtxGetCurrent", [] {
    CUcontext c = nullptr;
    check(cuCtxGetCurrent(&c), "cuCtxGetCurrent");
  });
  int host_value = 0;
  for (const auto& [name, address] : {std::pair{"cuPointerGetAttributes (device)", static_cast<CUdeviceptr>(buffer + 4096)},
                                       std::pair{"cuPointerGetAttributes (host)", reinterpret_cast<CUdeviceptr>(&host_value)}}) {
    ns_per_call(name, [address = address] {
      unsigned int memory_type = 0;
      int ordinal = 0;
      CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
      void* values[] = {&memory_type, &ordinal};
      check(cuPointerGetAttributes(2, attributes, values, address), "cuPointerGetAttributes");
    });
  }
  ns_per_call("cuTensorMapEncodeTiled (2-D bf16, 64x64 box)", [&] {
    CUtensorMap map;
    const cuuint64_t dims[] = {128, 32768};
    const cuuint64_t strides[] = {128 * 2};
    const cuuint32_t box[] = {64, 64};
    const cuuint32_t element_strides[] = {1, 1};
    check(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(buffer), dims, strides, box,
                                 element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
  });
  ns_per_call("cuMemAllocAsync + cuMemFreeAsync (1 MB)", [&] {
    CUdeviceptr p = 0;
    check(cuMemAllocAsync(&p, 1 << 20, stream), "cuMemAllocAsync");
    check(cuMemFreeAsync(p, stream), "cuMemFreeAsync");
  });
  ns_per_call("cuMemsetD8Async (4 KB)", [&] { check(cuMemsetD8Async(buffer, 0, 4096, stream), "cuMemsetD8Async"); }, 2000);
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  ns_per_call("cuLaunchKernel (empty, 2 params)", [&] {
    void* params[] = {&buffer, &buffer};
    check(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr), "cuLaunchKernel");
  }, 2000);
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  ns_per_call("cuStreamQuery", [&] { (void)cuStreamQuery(stream); });
  return 0;
}
