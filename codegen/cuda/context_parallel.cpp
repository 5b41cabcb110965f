#include "context_parallel.h"

#include "detail/cuda_source.h"

namespace ladle::cuda {

std::string context_parallel_source() {
  std::string s = "// ladle: the context-parallel fold (codegen/cuda/context_parallel.cpp; do not edit).\n";
  s += detail::storage_helpers;
  s += R"(
extern "C" __global__ void __launch_bounds__(256) ladle_cp_fold(
    const float* __restrict__ summaries, long long rank_stride, const float* __restrict__ decays, long long decay_stride,
    const void* __restrict__ source, int source_type, const long long* __restrict__ meta, const int* __restrict__ order,
    float* __restrict__ out, int rows_per_rank, int H, int K, int V, int decay_width, int key_width, int value_gate) {
  const long long HKV = static_cast<long long>(H) * K * V;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= HKV) return;
  const int n = blockIdx.y;
  const int h = static_cast<int>(i / (static_cast<long long>(K) * V));
  const int kk = static_cast<int>((i / V) % K), col = static_cast<int>(i % V);
  const long long* row = meta + 4 * static_cast<long long>(n);
  float s = 0.0f;
  if (row[0] >= 0 && source) {
    const long long at = row[0] * HKV + i;
    if (source_type == 1) s = ladle_load(static_cast<const ladle_bf16*>(source) + at);
    else if (source_type == 2) s = ladle_load(static_cast<const ladle_f16*>(source) + at);
    else s = static_cast<const float*>(source)[at];
  }
  for (long long c = row[1]; c < row[1] + row[2]; ++c) {
    const long long rank = order[c];
    const float* d = decays + rank * decay_stride + (row[3] * H + h) * decay_width;
    float log2_decay = 0.0f;
    if (key_width == 1) log2_decay += d[0];
    else if (key_width > 1) log2_decay += d[kk];
    if (value_gate) log2_decay += d[key_width + col];
    s = exp2f(log2_decay) * s + summaries[rank * rank_stride + row[3] * HKV + i];
  }
  out[static_cast<long long>(n) * HKV + i] = s;
}

// The total log2 decay of each chain of ladle_cp_fold's (its rows, source ignored): out row n
// [H][width] = the sum over c of decays + order[c] decay_stride + meta[4n+3] H width.
extern "C" __global__ void __launch_bounds__(256) ladle_cp_sum_decays(
    const float* __restrict__ decays, long long decay_stride, const long long* __restrict__ meta, const int* __restrict__ order,
    float* __restrict__ out, int H, int width) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(H) * width) return;
  const long long* row = meta + 4 * static_cast<long long>(blockIdx.y);
  float sum = 0.0f;
  for (long long c = row[1]; c < row[1] + row[2]; ++c) sum += decays[order[c] * decay_stride + row[3] * H * width + i];
  out[static_cast<long long>(blockIdx.y) * H * width + i] = sum;
}

// The update forms' fold: S = M S + L (M^T with transpose, the backward's dS), M [K][K] per head.
// grid (ceil(V / 32), rows, H), 256 threads, K * 32 floats of dynamic shared memory: a block keeps 32
// columns of its row's S; K <= 256.
extern "C" __global__ void __launch_bounds__(256) ladle_cp_fold_matrix(
    const float* __restrict__ summaries, long long rank_stride, const float* __restrict__ transitions, const void* __restrict__ source,
    int source_type, const long long* __restrict__ meta, const int* __restrict__ order, float* __restrict__ out, int rows_per_rank,
    int H, int K, int V, int transpose) {
  extern __shared__ float cols[];  // [K][32]
  const int n = blockIdx.y, h = blockIdx.z, v0 = blockIdx.x * 32;
  const long long KV = static_cast<long long>(K) * V, KK = static_cast<long long>(K) * K;
  const long long* row = meta + 4 * static_cast<long long>(n);
  for (int e = threadIdx.x; e < K * 32; e += blockDim.x) {
    const int i = e / 32, c = e % 32;
    float x = 0.0f;
    if (v0 + c < V && row[0] >= 0 && source) {
      const long long at = (row[0] * H + h) * KV + static_cast<long long>(i) * V + v0 + c;
      if (source_type == 1) x = ladle_load(static_cast<const ladle_bf16*>(source) + at);
      else if (source_type == 2) x = ladle_load(static_cast<const ladle_f16*>(source) + at);
      else x = static_cast<const float*>(source)[at];
    }
    cols[e] = x;
  }
  __syncthreads();
  for (long long ch = row[1]; ch < row[1] + row[2]; ++ch) {
    const long long rank = order[ch];
    const float* M = transitions + rank * rank_stride + (row[3] * H + h) * KK;
    const float* L = summaries + rank * rank_stride + (row[3] * H + h) * KV;
    float next[32];
    for (int q = 0; q < 32; ++q) {
      const int e = threadIdx.x + q * 256;
      if (e >= K * 32) break;
      const int i = e / 32, c = e % 32;
      float acc = v0 + c < V ? L[static_cast<long long>(i) * V + v0 + c] : 0.0f;
      for (int k = 0; k < K; ++k) acc += (transpose ? M[static_cast<long long>(k) * K + i] : M[static_cast<long long>(i) * K + k]) * cols[k * 32 + c];
      next[q] = acc;
    }
    __syncthreads();
    for (int q = 0; q < 32; ++q) {
      const int e = threadIdx.x + q * 256;
      if (e >= K * 32) break;
      cols[e] = next[q];
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < K * 32; e += blockDim.x) {
    const int i = e / 32, c = e % 32;
    if (v0 + c < V) out[(static_cast<long long>(n) * H + h) * KV + static_cast<long long>(i) * V + v0 + c] = cols[e];
  }
}

// to[b * to_batch + i] += from[b * from_batch + i] for i < n, b = blockIdx.y.
extern "C" __global__ void __launch_bounds__(256) ladle_cp_add(float* __restrict__ to, long long to_batch, const float* __restrict__ from,
                                                               long long from_batch, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  to[blockIdx.y * to_batch + i] += from[blockIdx.y * from_batch + i];
}
)";
  return s;
}

}  // namespace ladle::cuda
