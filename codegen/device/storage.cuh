// ladle's device helpers, part of every generated kernel: 16-bit storage types without cuda_fp16.h
// and typed loads and stores through float. The host emulation (tests/codegen/cuda_emulation.h)
// defines the guards it replaces first.
#ifndef LADLE_UNROLL
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define LADLE_UNROLL _Pragma("unroll")
#define LADLE_UNROLL_1 _Pragma("unroll 1")
#define LADLE_UNROLL_2 _Pragma("unroll 2")
#define LADLE_UNROLL_4 _Pragma("unroll 4")
#define LADLE_UNROLL_8 _Pragma("unroll 8")
#else
#define LADLE_UNROLL
#define LADLE_UNROLL_1
#define LADLE_UNROLL_2
#define LADLE_UNROLL_4
#define LADLE_UNROLL_8
#endif
#endif
#ifndef LADLE_VECTOR4
#define LADLE_VECTOR4
// Four consecutive state rows' operands in one 16-byte shared-memory load.
struct alignas(16) ladle_f4 { float x, y, z, w; };
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ ladle_f4 ladle_ld4(const float* p) { return *reinterpret_cast<const ladle_f4*>(p); }
__device__ __forceinline__ void ladle_st4(float* p, ladle_f4 v) { *reinterpret_cast<ladle_f4*>(p) = v; }
#else
inline ladle_f4 ladle_ld4(const float* p) { return ladle_f4{p[0], p[1], p[2], p[3]}; }
inline void ladle_st4(float* p, ladle_f4 v) { p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w; }
#endif
#endif
#ifndef LADLE_RECURRENT_HELPERS
#define LADLE_RECURRENT_HELPERS
struct ladle_f16 { unsigned short bits; };   // IEEE binary16
struct ladle_bf16 { unsigned short bits; };  // bfloat16

__device__ __forceinline__ float ladle_load(const float* p) { return *p; }
__device__ __forceinline__ float ladle_load(const ladle_bf16* p) { return __uint_as_float(static_cast<unsigned>(p->bits) << 16); }
__device__ __forceinline__ float ladle_load(const ladle_f16* p) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(p->bits));
  return value;
}
__device__ __forceinline__ void ladle_store(float* p, float value) { *p = value; }
__device__ __forceinline__ void ladle_store(ladle_f16* p, float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  p->bits = bits;
}
__device__ __forceinline__ void ladle_store(ladle_bf16* p, float value) {
  const unsigned x = __float_as_uint(value);  // round to nearest even; NaN stays quiet
  p->bits = (x & 0x7fffffffu) > 0x7f800000u ? static_cast<unsigned short>((x >> 16) | 0x40u)
                                              : static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#endif  // LADLE_RECURRENT_HELPERS
#ifndef LADLE_LOAD_TYPED
#define LADLE_LOAD_TYPED
// A value of a tensor whose type is named at run time by `type` (0 f32, 1 bf16, 2 f16).
__device__ __forceinline__ float ladle_load_typed(const void* p, int type, long long at) {
  if (type == 1) return ladle_load(static_cast<const ladle_bf16*>(p) + at);
  if (type == 2) return ladle_load(static_cast<const ladle_f16*>(p) + at);
  return static_cast<const float*>(p)[at];
}
#endif
