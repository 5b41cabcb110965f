// ladle's device helpers of the tensor-core families (chunked, attention): exp2, bf16 packing,
// ldmatrix, mma.sync, cp.async and 16-byte row accesses. Needs storage.cuh first.
#ifndef LADLE_CHUNKED_HELPERS
#define LADLE_CHUNKED_HELPERS
#define LADLE_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
// 2^x on the special function unit (ex2.approx: 2 ulp); x is a difference of log2 gates.
__device__ __forceinline__ float ladle_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned ladle_float_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float ladle_bits_float(unsigned x) { return __uint_as_float(x); }
__device__ __forceinline__ float ladle_bf16_float(unsigned short bits) { return __uint_as_float(static_cast<unsigned>(bits) << 16); }
__device__ __forceinline__ unsigned short ladle_bf16_bits(float value) {
  const unsigned x = __float_as_uint(value);  // round to nearest even; NaN stays quiet
  return (x & 0x7fffffffu) > 0x7f800000u ? static_cast<unsigned short>((x >> 16) | 0x40u)
                                           : static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
// Two floats to a bf16 pair (lo in the low half) in one instruction, rounding to nearest even.
__device__ __forceinline__ unsigned ladle_pack_bf16(float lo, float hi) {
  unsigned pair;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(hi), "f"(lo));
  return pair;
}
__device__ __forceinline__ unsigned ladle_shared_address(const void* p) {
  unsigned address;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
  return address;
}
// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ladle_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ladle_shared_address(p)));
}
__device__ __forceinline__ void ladle_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ladle_shared_address(p)));
}
// The same from a 32-bit shared-memory address (ladle_shared_address of the row's element).
__device__ __forceinline__ void ladle_ldmatrix_x4_at(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ __forceinline__ void ladle_ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void ladle_mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // LADLE_CHUNKED_HELPERS
#ifndef LADLE_CP_ASYNC_HELPERS
#define LADLE_CP_ASYNC_HELPERS
// 16 bytes global -> shared without passing through registers; complete after the wait.
__device__ __forceinline__ void ladle_cp_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ladle_shared_address(shared)), "l"(global));
}
__device__ __forceinline__ void ladle_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int Pending>
__device__ __forceinline__ void ladle_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(Pending)); }
#endif  // LADLE_CP_ASYNC_HELPERS
#ifndef LADLE_VECTOR8_HELPERS
#define LADLE_VECTOR8_HELPERS
// Eight consecutive values in one 16-byte access: a staged row's features from global memory
// (where the row is contiguous and aligned) and the shared-memory passes over staged rows.
// One address and one access per eight values instead of eight (the profile of the serial
// form: 41 % of its instructions were the per-element index arithmetic of the staging).
struct alignas(16) ladle_u4 { unsigned x, y, z, w; };
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ ladle_u4 ladle_ld16(const void* p) { return *reinterpret_cast<const ladle_u4*>(p); }
__device__ __forceinline__ void ladle_st16(void* p, ladle_u4 value) { *reinterpret_cast<ladle_u4*>(p) = value; }
#else
inline ladle_u4 ladle_ld16(const void* p) { ladle_u4 value; std::memcpy(&value, p, 16); return value; }
inline void ladle_st16(void* p, ladle_u4 value) { std::memcpy(p, &value, 16); }
#endif
// A bf16 pair (an mma fragment register) times two factors, rounded back to a bf16 pair.
__device__ __forceinline__ unsigned ladle_scale_bf16x2(unsigned pair, float lo, float hi) {
  return ladle_pack_bf16(ladle_bits_float(pair << 16) * lo, ladle_bits_float(pair & 0xffff0000u) * hi);
}
__device__ __forceinline__ bool ladle_row_vector(const void* p, long long stride, int count) {
  return stride == 1 && count >= 8 && (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}
__device__ __forceinline__ void ladle_unpack8_bf16(float (&x)[8], ladle_u4 w) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  LADLE_UNROLL for (int u = 0; u < 4; ++u) {
    x[2 * u] = ladle_bf16_float(static_cast<unsigned short>(words[u] & 0xffffu));
    x[2 * u + 1] = ladle_bf16_float(static_cast<unsigned short>(words[u] >> 16));
  }
}
__device__ __forceinline__ void ladle_unpack8_f16(float (&x)[8], ladle_u4 w) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  LADLE_UNROLL for (int u = 0; u < 4; ++u) {
    const ladle_f16 lo{static_cast<unsigned short>(words[u] & 0xffffu)}, hi{static_cast<unsigned short>(words[u] >> 16)};
    x[2 * u] = ladle_load(&lo);
    x[2 * u + 1] = ladle_load(&hi);
  }
}
// x[u] = p[u * stride] for u < count; p[0] past count (the caller masks those), so that no
// load sits in a branch of its own.
__device__ __forceinline__ void ladle_load8(float (&x)[8], const ladle_bf16* p, long long stride, int count) {
  if (ladle_row_vector(p, stride, count)) {
    ladle_unpack8_bf16(x, ladle_ld16(p));
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_load(p + (u < count ? u * stride : 0));
  }
}
__device__ __forceinline__ void ladle_load8(float (&x)[8], const ladle_f16* p, long long stride, int count) {
  if (ladle_row_vector(p, stride, count)) {
    ladle_unpack8_f16(x, ladle_ld16(p));
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_load(p + (u < count ? u * stride : 0));
  }
}
__device__ __forceinline__ void ladle_load8(float (&x)[8], const float* p, long long stride, int count) {
  if (ladle_row_vector(p, stride, count)) {
    const ladle_f4 a = ladle_ld4(p), b = ladle_ld4(p + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_load(p + (u < count ? u * stride : 0));
  }
}
// Eight raw 16-bit values of a prefetch buffer in shared memory (16-byte aligned by
// construction: no alignment test, one 16-byte load).
__device__ __forceinline__ void ladle_load8_raw(float (&x)[8], const ladle_bf16* s) { ladle_unpack8_bf16(x, ladle_ld16(s)); }
__device__ __forceinline__ void ladle_load8_raw(float (&x)[8], const ladle_f16* s) { ladle_unpack8_f16(x, ladle_ld16(s)); }
// Two adjacent values of a [K][V] state in global memory: one 4-byte (bf16) or 8-byte (fp32)
// store where both are inside the row and the pair is aligned, else one store each.
__device__ __forceinline__ void ladle_store2(ladle_bf16* p, float a, float b, bool second) {
  if (second && (reinterpret_cast<unsigned long long>(p) & 3ull) == 0) {
    *reinterpret_cast<unsigned*>(p) = ladle_pack_bf16(a, b);
  } else {
    ladle_store(p, a);
    if (second) ladle_store(p + 1, b);
  }
}
__device__ __forceinline__ void ladle_store2(ladle_f16* p, float a, float b, bool second) {
  if (second && (reinterpret_cast<unsigned long long>(p) & 3ull) == 0) {
    ladle_f16 pair[2];  // rounded as ladle_store rounds, then one 4-byte store
    ladle_store(&pair[0], a);
    ladle_store(&pair[1], b);
    *reinterpret_cast<unsigned*>(p) = static_cast<unsigned>(pair[0].bits) | (static_cast<unsigned>(pair[1].bits) << 16);
  } else {
    ladle_store(p, a);
    if (second) ladle_store(p + 1, b);
  }
}
struct alignas(8) ladle_f2 { float x, y; };
__device__ __forceinline__ void ladle_store2(float* p, float a, float b, bool second) {
  if (second && (reinterpret_cast<unsigned long long>(p) & 7ull) == 0) {
    *reinterpret_cast<ladle_f2*>(p) = ladle_f2{a, b};
  } else {
    *p = a;
    if (second) p[1] = b;
  }
}
// Two adjacent values in one 4-byte (16-bit) or 8-byte (fp32) store, where the caller has checked
// that the pair is aligned and inside the row.
__device__ __forceinline__ void ladle_store_pair(ladle_bf16* p, float a, float b) { *reinterpret_cast<unsigned*>(p) = ladle_pack_bf16(a, b); }
__device__ __forceinline__ void ladle_store_pair(ladle_f16* p, float a, float b) {
  ladle_f16 pair[2];
  ladle_store(&pair[0], a);
  ladle_store(&pair[1], b);
  *reinterpret_cast<unsigned*>(p) = static_cast<unsigned>(pair[0].bits) | (static_cast<unsigned>(pair[1].bits) << 16);
}
__device__ __forceinline__ void ladle_store_pair(float* p, float a, float b) { *reinterpret_cast<ladle_f2*>(p) = ladle_f2{a, b}; }
// The next chunk's raw 16-bit row segment into shared memory: one cp.async where the row is
// contiguous and aligned, else plain copies; nothing where the segment is outside the tensor
// (count <= 0: the staging masks it).
template <typename T16>
__device__ __forceinline__ void ladle_prefetch8(T16* raw, const T16* p, long long stride, int count) {
  if (count <= 0) return;
  if (ladle_row_vector(p, stride, count)) {
    ladle_cp_async_16(raw, p);
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) raw[u] = p[u < count ? u * stride : 0];
  }
}
// Staged rows in shared memory (16-byte aligned): eight bf16 or eight fp32 values.
__device__ __forceinline__ void ladle_load8_bf16(float (&x)[8], const unsigned short* s) { ladle_unpack8_bf16(x, ladle_ld16(s)); }
__device__ __forceinline__ void ladle_store8_bf16(unsigned short* s, const float (&x)[8]) {
  ladle_st16(s, ladle_u4{ladle_pack_bf16(x[0], x[1]), ladle_pack_bf16(x[2], x[3]), ladle_pack_bf16(x[4], x[5]),
                         ladle_pack_bf16(x[6], x[7])});
}
__device__ __forceinline__ void ladle_load8_f32(float (&x)[8], const float* s) {
  const ladle_u4 a = ladle_ld16(s), b = ladle_ld16(s + 4);
  const unsigned words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_bits_float(words[u]);
}
__device__ __forceinline__ void ladle_store8_f32(float* s, const float (&x)[8]) {
  ladle_st16(s, ladle_u4{ladle_float_bits(x[0]), ladle_float_bits(x[1]), ladle_float_bits(x[2]), ladle_float_bits(x[3])});
  ladle_st16(s + 4, ladle_u4{ladle_float_bits(x[4]), ladle_float_bits(x[5]), ladle_float_bits(x[6]), ladle_float_bits(x[7])});
}
#endif  // LADLE_VECTOR8_HELPERS
