// Random bf16 or f16 inputs made on the device (a host RNG takes seconds at benchmark sizes):
// q, k, v ~ N(0,1) by a hashed Box-Muller, gates as GLA makes them, logsigmoid(x)/16, write strengths sigmoid(x).
// Shared by ladle-bench-recurrent and ladle-tune.
#pragma once

#include <string>

#include <ladle/tensor/tensor_view.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

namespace ladle::bench {

// type: bf16 or f16 (two bytes an element); anything else throws InvalidArgument.
// gate: 0 normal, 1 logsigmoid(x)/16 (a GLA gate), 2 sigmoid(x) (a write strength in (0, 1)).
inline void fill(const DeviceBuffer& buffer, DType type, unsigned seed, int gate) {
  static const char* source = R"(
#include <cuda_bf16.h>
#include <cuda_fp16.h>
__device__ float hashed_normal(unsigned long long i, unsigned seed) {
  // Two 32-bit hashes -> Box-Muller: cheap, deterministic, never all zeros.
  unsigned a = (unsigned)(i * 2654435761ull) ^ seed, b = (unsigned)((i + 0x9e3779b9ull) * 40503ull) ^ (seed * 7919u);
  a ^= a >> 16; a *= 0x7feb352du; a ^= a >> 15; a *= 0x846ca68bu; a ^= a >> 16;
  b ^= b >> 16; b *= 0x7feb352du; b ^= b >> 15; b *= 0x846ca68bu; b ^= b >> 16;
  float u1 = (a >> 8) * (1.0f / 16777216.0f) + 1e-7f, u2 = (b >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}
extern "C" __global__ void fill_bf16(__nv_bfloat16* x, long long n, unsigned seed, int gate) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float r = hashed_normal(i, seed);
    if (gate == 1) r = (fminf(r, 0.0f) - log1pf(expf(-fabsf(r)))) / 16.0f;
    if (gate == 2) r = 1.0f / (1.0f + expf(-r));
    x[i] = __float2bfloat16(r);
  }
}
extern "C" __global__ void fill_f16(__half* x, long long n, unsigned seed, int gate) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float r = hashed_normal(i, seed);
    if (gate == 1) r = (fminf(r, 0.0f) - log1pf(expf(-fabsf(r)))) / 16.0f;
    if (gate == 2) r = 1.0f / (1.0f + expf(-r));
    x[i] = __float2half(r);
  }
}
)";
  if (type != DType::bf16 && type != DType::f16)
    throw InvalidArgument(std::string("fill: dtype ") + dtype_name(type) + ", expected bf16 or f16");
  static const CompiledProgram program = compile(source);
  static const Module module(program);
  static const Kernel fill_bf16 = module.kernel("fill_bf16"), fill_f16 = module.kernel("fill_f16");
  KernelArgs args;
  args.add(buffer).add(static_cast<long long>(buffer.bytes() / 2)).add(seed).add(gate);
  (type == DType::bf16 ? fill_bf16 : fill_f16)
      .launch({static_cast<unsigned>(Device::get().properties().sm_count * 16)}, {256}, args);
}

inline void fill_bf16(const DeviceBuffer& buffer, unsigned seed, bool gate) {
  fill(buffer, DType::bf16, seed, gate ? 1 : 0);
}
inline void fill_sigmoid_bf16(const DeviceBuffer& buffer, unsigned seed) { fill(buffer, DType::bf16, seed, 2); }

}  // namespace ladle::bench
