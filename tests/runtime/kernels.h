// Small real kernels the runtime tests compile.
#pragma once

namespace ladle::test {

inline const char* vector_add_source = R"(
extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
)";

// Uses 256 bytes of static shared memory, so the resource report has something to show.
inline const char* block_sum_source = R"(
extern "C" __global__ void block_sum(const float* x, float* partial, int n) {
  __shared__ float tile[64];
  int i = blockIdx.x * 64 + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int stride = 32; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) tile[threadIdx.x] += tile[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = tile[0];
}
)";

}  // namespace ladle::test
