// ladle's wgmma parts (sm_90a): matrix descriptors, fences, commit and wait groups, and the
// declarations of the products, whose register lists each kernel specialises for its N.
// Needs tensor_core.cuh first.
#ifndef LADLE_WGMMA_PORTABLE
#define LADLE_WGMMA_PORTABLE
// A wgmma matrix descriptor (PTX ISA 9.7.15.5.1.2.2): bits 0-13 the start address, 16-29 the
// leading dimension byte offset, 32-45 the stride dimension byte offset, each (x & 0x3FFFF) >> 4;
// base offset 0 and swizzle mode 0 (none, bits 62-63).
__device__ __forceinline__ unsigned long long ladle_wgmma_desc(const void* p, unsigned leading_bytes, unsigned stride_bytes) {
  return static_cast<unsigned long long>((ladle_shared_address(p) & 0x3FFFFu) >> 4) |
         (static_cast<unsigned long long>((leading_bytes & 0x3FFFFu) >> 4) << 16) |
         (static_cast<unsigned long long>((stride_bytes & 0x3FFFFu) >> 4) << 32);
}
#endif  // LADLE_WGMMA_PORTABLE
#ifndef LADLE_WGMMA_HELPERS
#define LADLE_WGMMA_HELPERS
// Orders this thread's register accesses before the next wgmma.mma_async.
__device__ __forceinline__ void ladle_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void ladle_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void ladle_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory"); }
// Shared memory written through the generic proxy (st.shared, cp.async), made visible to the
// async proxy that wgmma reads it through.
__device__ __forceinline__ void ladle_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accesses of an accumulator across the asynchronous product.
template <int N>
__device__ __forceinline__ void ladle_wgmma_fence_operand(float (&d)[N / 8][4]) {
  LADLE_UNROLL for (int i = 0; i < N / 8; ++i)
    LADLE_UNROLL for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
template <int N> __device__ void ladle_wgmma_ss_bf16(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1);
template <int N> __device__ void ladle_wgmma_ss_f16(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1);
template <int N> __device__ void ladle_wgmma_rs_bf16(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, int accumulate = 1);
template <int N> __device__ void ladle_wgmma_rs_f16(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, int accumulate = 1);
#endif  // LADLE_WGMMA_HELPERS
