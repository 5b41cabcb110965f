// Function tables for libnvrtc and libcuda, filled by dlopen/dlsym on first use so that
// ladle builds and starts on machines with neither. Internal: not installed.
#pragma once

#include <cuda.h>
#include <nvrtc.h>

#include <string>

namespace ladle::detail {

#define LADLE_NVRTC_FUNCTIONS(X)                                                        \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog)              \
  X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)             \
  X(nvrtcGetNumSupportedArchs) X(nvrtcGetSupportedArchs)

// cuda.h maps many names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2); the table
// looks up the mapped name, which is the one this header's types belong to.
#define LADLE_CUDA_FUNCTIONS(X)                                                          \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                 \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute)         \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)          \
  X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuStreamCreate) X(cuStreamDestroy)           \
  X(cuStreamSynchronize) X(cuStreamIsCapturing) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)            \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuMemAlloc) X(cuMemFree)                \
  X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute) \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async)     \
  X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)  \
  X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuTensorMapEncodeTiled) X(cuPointerGetAttributes)

struct NvrtcApi {
#define LADLE_DECLARE(name) decltype(&::name) name = nullptr;
  LADLE_NVRTC_FUNCTIONS(LADLE_DECLARE)
  std::string library_path;
};

struct CudaApi {
  LADLE_CUDA_FUNCTIONS(LADLE_DECLARE)
#undef LADLE_DECLARE
  std::string library_path;
};

// The libnvrtc file that nvrtc() opens, found without opening it ("" when only the dynamic
// loader's own search could find it).
std::string nvrtc_library_file();

// Throw LibraryUnavailable (NoCudaDriver for libcuda) with the paths tried.
const NvrtcApi& nvrtc();
const CudaApi& cuda();  // also calls cuInit(0) once
// Why cuda() throws, in one line without the paths tried ("" when it does not throw).
std::string cuda_failure_summary();

// Checked calls: throw CudaError naming the call and the driver's error name.
void check_cuda(CUresult result, const char* call);
void check_nvrtc(nvrtcResult result, const char* call);

}  // namespace ladle::detail

#define LADLE_CU(call) ::ladle::detail::check_cuda((call), #call)
#define LADLE_NVRTC(call) ::ladle::detail::check_nvrtc((call), #call)
