// A sample for ladle-dump: a row-wise softmax with shared-memory reductions.
extern "C" __global__ void softmax_rows(const float* x, float* y, int cols) {
  __shared__ float scratch[32];
  const float* row = x + blockIdx.x * (long)cols;
  float local_max = __int_as_float(0xff800000);  // -inf: NVRTC has no <cmath>
  for (int j = threadIdx.x; j < cols; j += blockDim.x) local_max = fmaxf(local_max, row[j]);
  for (int o = 16; o > 0; o /= 2) local_max = fmaxf(local_max, __shfl_xor_sync(~0u, local_max, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = local_max;
  __syncthreads();
  float row_max = __int_as_float(0xff800000);
  for (int w = 0; w < blockDim.x / 32; ++w) row_max = fmaxf(row_max, scratch[w]);
  __syncthreads();
  float local_sum = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) local_sum += __expf(row[j] - row_max);
  for (int o = 16; o > 0; o /= 2) local_sum += __shfl_xor_sync(~0u, local_sum, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = local_sum;
  __syncthreads();
  float row_sum = 0;
  for (int w = 0; w < blockDim.x / 32; ++w) row_sum += scratch[w];
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    y[blockIdx.x * (long)cols + j] = __expf(row[j] - row_max) / row_sum;
}
