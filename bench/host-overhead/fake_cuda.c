/* A stand-in libcuda for measuring ladle's host-side cost a call without a GPU (bench/host-overhead.sh).
 * It answers the 38 driver calls ladle makes (runtime/detail/api.h) as an H100 would describe itself,
 * keeps "device" memory in host memory (so copies and memsets work), remembers those ranges for
 * cuPointerGetAttributes, and launches nothing: cuLaunchKernel returns at once. Loaded through
 * LADLE_CUDA_DRIVER_LIBRARY; never part of the library. The test ops-stand_in_driver runs the GPU path's
 * host side through it in CI (compiled there as C++: cuda.h's declarations give every function C
 * linkage). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <stdio.h>

/* LADLE_FAKE_CUDA_COUNTS=1 prints, at exit, how many times each entry was called: the driver calls
 * a ladle call makes, which on a real GPU cost 0.5-5 us each. */
#define MAX_NAMES 64
static struct {
  const char* name;
  unsigned long calls;
} counts[MAX_NAMES];
static int n_names;
static void count(const char* name) {
  for (int i = 0; i < n_names; ++i)
    if (counts[i].name == name) {
      ++counts[i].calls;
      return;
    }
  if (n_names < MAX_NAMES) {
    counts[n_names].name = name;
    counts[n_names++].calls = 1;
  }
}
__attribute__((destructor)) static void print_counts(void) {
  if (!getenv("LADLE_FAKE_CUDA_COUNTS")) return;
  for (int i = 0; i < n_names; ++i) fprintf(stderr, "%-28s %lu\n", counts[i].name, counts[i].calls);
}
#define COUNT count(__func__)
/* How many times the entry `name` was called (tests reach it with dlopen(RTLD_NOLOAD) and dlsym). */
#ifdef __cplusplus
extern "C"
#endif
unsigned long ladle_fake_cuda_calls(const char* name) {
  for (int i = 0; i < n_names; ++i)
    if (strcmp(counts[i].name, name) == 0) return counts[i].calls;
  return 0;
}

#define MAX_ALLOCS 4096
static struct {
  uintptr_t base;
  size_t bytes;
} allocs[MAX_ALLOCS];
static int n_allocs;

static void remember(void* p, size_t bytes) {
  if (n_allocs < MAX_ALLOCS) {
    allocs[n_allocs].base = (uintptr_t)p;
    allocs[n_allocs].bytes = bytes;
    ++n_allocs;
  }
}

static void forget(uintptr_t p) {
  for (int i = 0; i < n_allocs; ++i)
    if (allocs[i].base == p) {
      allocs[i] = allocs[--n_allocs];
      return;
    }
}

static int is_device(uintptr_t p) {
  for (int i = 0; i < n_allocs; ++i)
    if (p >= allocs[i].base && p < allocs[i].base + (allocs[i].bytes ? allocs[i].bytes : 1)) return 1;
  return 0;
}

CUresult cuInit(unsigned int flags) { COUNT; (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int* v) { COUNT; *v = 13000; return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult e, const char** s) { COUNT; (void)e; *s = "CUDA_ERROR_FAKE"; return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult e, const char** s) { COUNT; (void)e; *s = "an error of the stand-in driver"; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int* n) { COUNT; *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice* d, int ordinal) { COUNT; *d = ordinal; return CUDA_SUCCESS; }
CUresult cuDeviceGetName(char* name, int len, CUdevice d) { COUNT;
  (void)d;
  strncpy(name, "stand-in H100 (no GPU)", (size_t)len - 1);
  name[len - 1] = 0;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) { COUNT;
  (void)d;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 52428800; break;
    default: *v = 1; break;
  }
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice d) { COUNT; (void)d; *bytes = (size_t)80 << 30; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) { COUNT; (void)d; *c = (CUcontext)0x1; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { COUNT; (void)d; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { COUNT; (void)c; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { COUNT; return CUDA_SUCCESS; }
CUresult cuStreamCreate(CUstream* s, unsigned int flags) { COUNT; (void)flags; *s = (CUstream)0x2; return CUDA_SUCCESS; }
CUresult cuStreamDestroy(CUstream s) { COUNT; (void)s; return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s) { COUNT; (void)s; return CUDA_SUCCESS; }
/* LADLE_FAKE_CUDA_CAPTURING=1: every stream reports an active capture (as inside a CUDA graph's capture). */
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) { COUNT;
  (void)s;
  const char* capturing = getenv("LADLE_FAKE_CUDA_CAPTURING");
  *status = capturing && strcmp(capturing, "1") == 0 ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* e, unsigned int flags) { COUNT; (void)flags; *e = (CUevent)0x3; return CUDA_SUCCESS; }
CUresult cuEventDestroy(CUevent e) { COUNT; (void)e; return CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent e, CUstream s) { COUNT; (void)e; (void)s; return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent e) { COUNT; (void)e; return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) { COUNT; (void)a; (void)b; *ms = 1.0f; return CUDA_SUCCESS; }
CUresult cuMemAlloc(CUdeviceptr* p, size_t bytes) { COUNT;
  void* m = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  remember(m, bytes);
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr p) { COUNT; forget((uintptr_t)p); free((void*)(uintptr_t)p); return CUDA_SUCCESS; }
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream s) { COUNT; (void)s; return cuMemAlloc(p, bytes); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { COUNT; (void)s; return cuMemFree(p); }
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice d) { COUNT; (void)d; *pool = (CUmemoryPool)0x4; return CUDA_SUCCESS; }
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void* v) { COUNT; (void)pool; (void)a; (void)v; return CUDA_SUCCESS; }
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) { COUNT;
  (void)s;
  memcpy((void*)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) { COUNT;
  (void)s;
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { COUNT;
  (void)s;
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { COUNT;
  (void)s;
  memset((void*)(uintptr_t)dst, v, n);
  return CUDA_SUCCESS;
}
CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned int n, CUjit_option* o, void** v) { COUNT;
  (void)image; (void)n; (void)o; (void)v;
  *m = (CUmodule)0x5;
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule m) { COUNT; (void)m; return CUDA_SUCCESS; }
/* Functions by name: a handle is 0x1000 + its index, so that a launch can say which kernel it ran. */
#define MAX_FUNCTIONS 1024
static char* function_names[MAX_FUNCTIONS];
static int n_functions;
static char last_launch[256];
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) { COUNT;
  (void)m;
  int i = 0;
  while (i < n_functions && strcmp(function_names[i], name) != 0) ++i;
  if (i == n_functions && n_functions < MAX_FUNCTIONS) function_names[n_functions++] = strdup(name);
  *f = (CUfunction)(uintptr_t)(0x1000 + (i < MAX_FUNCTIONS ? i : 0));
  return CUDA_SUCCESS;
}
/* The name of the kernel launched last ("" before any). */
#ifdef __cplusplus
extern "C"
#endif
const char* ladle_fake_cuda_last_launch(void) { return last_launch; }
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { COUNT; (void)f; (void)a; (void)v; return CUDA_SUCCESS; }
CUresult cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) { COUNT;
  (void)f;
  switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 128; break;
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem,
                        CUstream s, void** params, void** extra) { COUNT;
  (void)smem; (void)s; (void)params; (void)extra;
  {
    const uintptr_t index = (uintptr_t)f - 0x1000;
    if (index < (uintptr_t)n_functions) {
      strncpy(last_launch, function_names[index], sizeof(last_launch) - 1);
      last_launch[sizeof(last_launch) - 1] = 0;
    }
  }
  /* The real driver's limits on a launch's shape (an H100's): refused as it refuses them. */
  if (gx == 0 || gy == 0 || gz == 0 || gx > 2147483647u || gy > 65535u || gz > 65535u) return CUDA_ERROR_INVALID_VALUE;
  if (bx == 0 || by == 0 || bz == 0 || (unsigned long long)bx * by * bz > 1024u || bz > 64u) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType t, cuuint32_t rank, void* address, const cuuint64_t* dims,
                                const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t* element_strides,
                                CUtensorMapInterleave i, CUtensorMapSwizzle sw, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) { COUNT;
  (void)t; (void)rank; (void)address; (void)dims; (void)strides; (void)box; (void)element_strides; (void)i; (void)sw; (void)l2;
  (void)oob;
  memset(map, 0, sizeof(*map));
  return CUDA_SUCCESS;
}
CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attributes, void** values, CUdeviceptr p) { COUNT;
  const int device = is_device((uintptr_t)p);
  for (unsigned int i = 0; i < n; ++i) {
    if (attributes[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) *(unsigned int*)values[i] = device ? CU_MEMORYTYPE_DEVICE : 0;
    else if (attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) *(int*)values[i] = 0;
  }
  return CUDA_SUCCESS;
}
