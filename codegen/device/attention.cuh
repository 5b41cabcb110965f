// ladle's device helpers of the softmax-attention family: row statistics of an mma accumulator,
// f16 tensor cores, tanh. Needs storage.cuh and tensor_core.cuh first.
#ifndef LADLE_ATTENTION_PORTABLE
#define LADLE_ATTENTION_PORTABLE
// Row statistics of an mma accumulator: the four lanes of a quad hold one row's columns.
__device__ __forceinline__ float ladle_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float ladle_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// The dropout uniform of ops/attention.h: splitmix64's finaliser over the seed mixed with
// (sequence, head, i, j), top 24 bits, in [0, 1).
__device__ __forceinline__ float ladle_dropout_uniform(unsigned long long seed, unsigned long long sequence,
                                                       unsigned long long head, unsigned long long i,
                                                       unsigned long long j) {
  unsigned long long x = seed ^ (sequence * 0x9E3779B97F4A7C15ull) ^ (head * 0xC2B2AE3D27D4EB4Full) ^
                         (i * 0x165667B19E3779F9ull) ^ (j * 0xD6E8FEB86659FD93ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x = x ^ (x >> 31);
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}
__device__ __forceinline__ float ladle_load(const unsigned char* p) { return static_cast<float>(*p); }
#endif  // LADLE_ATTENTION_PORTABLE
#ifndef LADLE_ATTENTION_HELPERS
#define LADLE_ATTENTION_HELPERS
__device__ __forceinline__ unsigned short ladle_f16_bits(float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}
__device__ __forceinline__ unsigned ladle_pack_f16(float lo, float hi) {
  return static_cast<unsigned>(ladle_f16_bits(lo)) | (static_cast<unsigned>(ladle_f16_bits(hi)) << 16);
}
// d += a (16x16, row) * b (16x8, col), f16 in, fp32 accumulate.
__device__ __forceinline__ void ladle_mma_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ladle_zero_16(void* shared) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(ladle_shared_address(shared)), "r"(0u));
}
__device__ __forceinline__ float ladle_neg_inf() { return __int_as_float(0xff800000); }
// A value every lane of the warp holds alike, as lane 0's: the compiler then keeps what is
// computed from it (the matrix descriptors of the Hopper tiles) in uniform registers.
__device__ __forceinline__ int ladle_warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }
// Whether any lane of the (converged) warp has p: a branch every lane takes the same way.
__device__ __forceinline__ bool ladle_warp_any(bool p) { return __any_sync(0xffffffffu, p); }
// tanh for the score expressions (a soft cap), as 1 - 2 / (2^(2 x log2 e) + 1) with the fast
// exp2 and divide: a few instructions against tanhf's dozens, within about 1e-6 absolute
// (exact limits: +-1 past |x| ~ 44, where 2^... overflows to inf or underflows to 0).
__device__ __forceinline__ float ladle_tanh(float x) { return 1.0f - __fdividef(2.0f, ladle_exp2(2.8853900817779268f * x) + 1.0f); }
// tanh(y / (2 log2 e)): the logit's tanh, whose argument already carries the 2 log2 e (folded
// into the hoisted factor before it, detail/hoist.h): one multiply fewer per element.
__device__ __forceinline__ float ladle_tanh_exp2(float y) { return 1.0f - __fdividef(2.0f, ladle_exp2(y) + 1.0f); }
// tanh.approx.f32 (sm_75 and later): one MUFU operation, relative error at most 2^-11.
__device__ __forceinline__ float ladle_tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif  // LADLE_ATTENTION_HELPERS
