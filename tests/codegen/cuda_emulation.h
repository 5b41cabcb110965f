// Runs generated CUDA kernels on the host, so that CI without a GPU checks what they
// compute: each CUDA thread of a block is a std::thread, __syncthreads is a std::barrier,
// __shared__ arrays are static (blocks run one after another), dynamic shared memory is a
// buffer per block, and the 16-bit helpers are the host ones. The warp-wide tensor-core
// operations of the chunked and attention families (ldmatrix, mma.sync m16n8k16 with bf16 or
// f16 operands, __shfl_xor_sync) are emulated through a per-warp exchange: every lane posts
// its operands, a 32-thread barrier, every lane computes its own fragment of the result
// exactly as the PTX ISA defines the fragment layouts. cp.async copies at once (a valid
// schedule: the ISA only promises completion by the matching wait_group). Hopper's
// wgmma.mma_async m64nNk16 (f16/bf16, fp32 accumulators) is emulated the same way per
// warpgroup of 128 threads: operands from shared memory are read through the matrix descriptor
// as the ISA decodes it (no-swizzle canonical layouts, K-major or MN-major), the register A
// operand and the accumulator D through their fragment layouts; the product completes at once
// (the ISA promises it by the matching wait_group), so fences, commit and wait are no-ops.
// Include it before the generated source.
#pragma once

#include <atomic>
#include <barrier>
#include <cstring>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <math.h>
#include <thread>
#include <vector>

#include <ladle/codegen/float16.h>

namespace cuda_emulation {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local Index thread_index, block_index, grid_dim;
inline thread_local std::barrier<>* barrier = nullptr;

// What the lanes of one warp post for a warp-wide operation.
struct WarpExchange {
  std::barrier<> barrier{32};
  const unsigned short* address[32] = {};
  unsigned a[32][4] = {};
  unsigned b[32][2] = {};
  float value[32] = {};
};
inline thread_local WarpExchange* warp_exchange = nullptr;
// What the threads of one warpgroup (4 warps) post for a wgmma.
struct WarpgroupExchange {
  std::barrier<> barrier{128};
  unsigned a[128][4] = {};
  unsigned long long a_desc[128] = {}, b_desc[128] = {};
};
inline thread_local WarpgroupExchange* warpgroup_exchange = nullptr;
inline thread_local unsigned char* shared_buffer = nullptr;
inline constexpr std::size_t dynamic_shared_bytes = 256 * 1024;

// Runs every block of a (grid_x, grid_y, grid_z) grid of `threads`-thread blocks, block by block.
inline void launch(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads, const std::function<void()>& kernel) {
  for (unsigned bz = 0; bz < grid_z; ++bz)
  for (unsigned by = 0; by < grid_y; ++by)
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      std::barrier<> block_barrier(static_cast<std::ptrdiff_t>(threads));
      std::vector<std::unique_ptr<WarpExchange>> warps;
      for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<WarpExchange>());
      std::vector<std::unique_ptr<WarpgroupExchange>> groups;  // whole warpgroups only
      for (unsigned g = 0; g < threads / 128; ++g) groups.push_back(std::make_unique<WarpgroupExchange>());
      // Dynamic shared memory starts as garbage on a GPU: NaN bytes here.
      std::vector<unsigned char> shared(dynamic_shared_bytes, 0xff);
      std::vector<std::thread> block;
      for (unsigned tx = 0; tx < threads; ++tx)
        block.emplace_back([&, tx] {
          thread_index = {tx, 0, 0};
          block_index = {bx, by, bz};
          grid_dim = {grid_x, grid_y, grid_z};
          barrier = &block_barrier;
          warp_exchange = warps[tx / 32].get();
          warpgroup_exchange = tx / 128 < groups.size() ? groups[tx / 128].get() : nullptr;
          shared_buffer = shared.data();
          kernel();
        });
      for (std::thread& t : block) t.join();
    }
}
inline void launch(unsigned grid_x, unsigned grid_y, unsigned threads, const std::function<void()>& kernel) {
  launch(grid_x, grid_y, 1, threads, kernel);
}
}  // namespace cuda_emulation

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __syncthreads() ::cuda_emulation::barrier->arrive_and_wait()
#define threadIdx ::cuda_emulation::thread_index
#define blockIdx ::cuda_emulation::block_index
#define gridDim ::cuda_emulation::grid_dim

#define LADLE_RECURRENT_HELPERS
struct ladle_f16 {
  unsigned short bits;
};
struct ladle_bf16 {
  unsigned short bits;
};
inline float ladle_load(const float* p) { return *p; }
inline float ladle_load(const ladle_f16* p) { return ladle::narrow_float::from_f16(p->bits); }
inline float ladle_load(const ladle_bf16* p) { return ladle::narrow_float::from_bf16(p->bits); }
inline void ladle_store(float* p, float value) { *p = value; }
inline void ladle_store(ladle_f16* p, float value) { p->bits = ladle::narrow_float::to_f16(value); }
inline void ladle_store(ladle_bf16* p, float value) { p->bits = ladle::narrow_float::to_bf16(value); }

// The chunked family's device helpers, on the host.
#define LADLE_CHUNKED_HELPERS
#define LADLE_DYNAMIC_SHARED(name) unsigned char* const name = ::cuda_emulation::shared_buffer
inline float ladle_exp2(float x) { return std::exp2(x); }
inline unsigned ladle_float_bits(float x) {
  unsigned bits;
  std::memcpy(&bits, &x, 4);
  return bits;
}
inline float ladle_bits_float(unsigned x) {
  float value;
  std::memcpy(&value, &x, 4);
  return value;
}
inline float ladle_bf16_float(unsigned short bits) { return ladle::narrow_float::from_bf16(bits); }
inline unsigned short ladle_bf16_bits(float value) { return ladle::narrow_float::to_bf16(value); }
inline unsigned ladle_pack_bf16(float lo, float hi) {
  return static_cast<unsigned>(ladle_bf16_bits(lo)) | (static_cast<unsigned>(ladle_bf16_bits(hi)) << 16);
}
inline unsigned atomicMax(unsigned* address, unsigned value) {
  std::atomic_ref<unsigned> target(*address);
  unsigned seen = target.load();
  while (seen < value && !target.compare_exchange_weak(seen, value)) {
  }
  return seen;
}
namespace cuda_emulation {
inline unsigned lane() { return thread_index.x % 32; }
// ldmatrix .x4: lane l receives, of matrix i (rows posted by lanes 8i..8i+7), row l / 4,
// columns 2 (l % 4) and +1; with .trans, column l / 4 of rows 2 (l % 4) and +1.
inline void ldmatrix(unsigned (&r)[4], const unsigned short* p, bool trans) {
  WarpExchange& x = *warp_exchange;
  x.address[lane()] = p;
  x.barrier.arrive_and_wait();
  const unsigned l = lane();
  for (unsigned i = 0; i < 4; ++i) {
    unsigned short lo, hi;
    if (trans) {
      lo = x.address[8 * i + 2 * (l % 4)][l / 4];
      hi = x.address[8 * i + 2 * (l % 4) + 1][l / 4];
    } else {
      lo = x.address[8 * i + l / 4][2 * (l % 4)];
      hi = x.address[8 * i + l / 4][2 * (l % 4) + 1];
    }
    r[i] = static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
  }
  x.barrier.arrive_and_wait();
}
inline float half_of(unsigned pair, unsigned k, bool f16 = false) {
  const unsigned short bits = static_cast<unsigned short>(k % 2 ? pair >> 16 : pair & 0xffffu);
  return f16 ? ladle::narrow_float::from_f16(bits) : ladle_bf16_float(bits);
}
// mma.m16n8k16 row.col: A[r][k] is in lane (r % 8) * 4 + (k % 8) / 2, register (r >= 8) + 2 (k >= 8);
// B[k][n] in lane n * 4 + (k % 8) / 2, register k >= 8; D[r][c]: lane (r % 8) * 4 + c / 2,
// element (r >= 8) * 2 + c % 2.
inline void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool f16 = false) {
  WarpExchange& x = *warp_exchange;
  const unsigned l = lane();
  for (int i = 0; i < 4; ++i) x.a[l][i] = a[i];
  x.b[l][0] = b0, x.b[l][1] = b1;
  x.barrier.arrive_and_wait();
  for (unsigned e = 0; e < 4; ++e) {
    const unsigned row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + e % 2;
    float sum = d[e];
    for (unsigned k = 0; k < 16; ++k) {
      const float av = half_of(x.a[(row % 8) * 4 + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k, f16);
      const float bv = half_of(x.b[col * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k, f16);
      sum += av * bv;
    }
    d[e] = sum;
  }
  x.barrier.arrive_and_wait();
}
// __shfl_xor_sync over the full warp: lane l reads the value lane l ^ lane_mask posted.
inline float shfl_xor(float value, int lane_mask) {
  WarpExchange& x = *warp_exchange;
  const unsigned l = lane();
  x.value[l] = value;
  x.barrier.arrive_and_wait();
  const float other = x.value[(l ^ static_cast<unsigned>(lane_mask)) % 32];
  x.barrier.arrive_and_wait();
  return other;
}
}  // namespace cuda_emulation
inline float __shfl_xor_sync(unsigned /*full mask*/, float value, int lane_mask) {
  return cuda_emulation::shfl_xor(value, lane_mask);
}
inline void ladle_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) { cuda_emulation::ldmatrix(r, p, false); }
inline void ladle_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) { cuda_emulation::ldmatrix(r, p, true); }
inline void ladle_mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { cuda_emulation::mma(d, a, b0, b1); }
inline void ladle_ldmatrix_x4_at(unsigned (&r)[4], unsigned address) {
  cuda_emulation::ldmatrix(r, reinterpret_cast<const unsigned short*>(::cuda_emulation::shared_buffer + address), false);
}
inline void ladle_ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned address) {
  cuda_emulation::ldmatrix(r, reinterpret_cast<const unsigned short*>(::cuda_emulation::shared_buffer + address), true);
}

// The attention family's device helpers, on the host. A test may define LADLE_COUNT_STAGED()
// before including this file to count the 16-byte chunks staged into shared memory.
#ifndef LADLE_COUNT_STAGED
#define LADLE_COUNT_STAGED()
#endif
#define LADLE_ATTENTION_HELPERS
inline unsigned short ladle_f16_bits(float value) { return ladle::narrow_float::to_f16(value); }
inline unsigned ladle_pack_f16(float lo, float hi) {
  return static_cast<unsigned>(ladle_f16_bits(lo)) | (static_cast<unsigned>(ladle_f16_bits(hi)) << 16);
}
inline void ladle_mma_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { cuda_emulation::mma(d, a, b0, b1, true); }
#define LADLE_CP_ASYNC_HELPERS
inline void ladle_cp_async_16(void* shared, const void* global) {
  LADLE_COUNT_STAGED();
  std::memcpy(shared, global, 16);
}
inline void ladle_cp_async_commit() {}
template <int Pending>
inline void ladle_cp_async_wait() {}
inline void ladle_zero_16(void* shared) {
  LADLE_COUNT_STAGED();
  std::memset(shared, 0, 16);
}
inline float ladle_neg_inf() { return -std::numeric_limits<float>::infinity(); }

// ---- Hopper's wgmma (sm_90a), per warpgroup
namespace cuda_emulation {
[[noreturn]] inline void wgmma_fault(const char* what) {
  std::fprintf(stderr, "emulated wgmma: %s\n", what);
  std::abort();
}
// A matrix descriptor as the PTX ISA lays it out (9.7.15.5.1.2.2): bits 0-13 start address,
// 16-29 leading dimension byte offset, 32-45 stride dimension byte offset (each stored >> 4),
// 49-51 base offset, 62-63 swizzle mode.
struct MatrixDescriptor {
  unsigned start, leading, stride, base_offset, swizzle;
};
inline MatrixDescriptor decode_descriptor(unsigned long long d) {
  return {static_cast<unsigned>(d & 0x3fffu) << 4, static_cast<unsigned>((d >> 16) & 0x3fffu) << 4,
          static_cast<unsigned>((d >> 32) & 0x3fffu) << 4, static_cast<unsigned>((d >> 49) & 7u), static_cast<unsigned>(d >> 62)};
}
// Element (mn, k) of a 16-bit operand (mn: the row of A or the column of B) under the
// no-swizzle canonical layouts (PTX ISA 9.7.15.5.1.2.1.3; T = 8 elements = 16 bytes):
//   K-major  ((8,m),(T,2k)):((1T,SBO),(1,LBO))    -> mn%8 * 16 + mn/8 * SBO + k%8 * 2 + k/8 * LBO bytes
//   MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) -> mn%8 * 2 + mn/8 * SBO + k%8 * 16 + k/8 * LBO bytes
inline unsigned short descriptor_element(const MatrixDescriptor& d, unsigned mn, unsigned k, bool mn_major) {
  if (d.swizzle != 0) wgmma_fault("only the no-swizzle layout is emulated");
  if (d.start % 16 != 0) wgmma_fault("matrix start address not 16-byte aligned");
  const std::size_t byte = d.start + (mn_major ? mn % 8 * 2 + k % 8 * 16 : mn % 8 * 16 + k % 8 * 2) +
                           std::size_t(mn / 8) * d.stride + std::size_t(k / 8) * d.leading;
  if (byte + 2 > dynamic_shared_bytes) wgmma_fault("operand past the end of shared memory");
  unsigned short bits;
  std::memcpy(&bits, shared_buffer + byte, 2);
  return bits;
}
inline float operand_value(unsigned short bits, bool f16) {
  return f16 ? ladle::narrow_float::from_f16(bits) : ladle::narrow_float::from_bf16(bits);
}
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16} with scale-d = 1: d += A B.
//   A: 64 x 16, from a K-major descriptor (a_regs null) or from registers: thread t of the
//      warpgroup holds, in a_regs[r], rows 16 (t / 32) + (t % 32) / 4 (+ 8 for r = 1, 3) at
//      columns 2 (t % 4) and + 1 (+ 8 for r = 2, 3), low half first.
//   B: 16 x N from a descriptor, K-major (trans_b false) or N-major (trans_b true).
//   D: thread t's d[i / 4][i % 4] is row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
//      column 8 (i / 4) + 2 (t % 4) + i % 2.
template <int N>
inline void wgmma(float (&d)[N / 8][4], const unsigned* a_regs, unsigned long long a_desc, unsigned long long b_desc,
                  bool trans_b, bool f16) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N = 8, 16, ..., 256");
  if (!warpgroup_exchange) wgmma_fault("the block is not made of whole warpgroups");
  WarpgroupExchange& x = *warpgroup_exchange;
  const unsigned t = thread_index.x % 128;
  if (a_regs)
    for (int r = 0; r < 4; ++r) x.a[t][r] = a_regs[r];
  x.a_desc[t] = a_desc, x.b_desc[t] = b_desc;
  x.barrier.arrive_and_wait();
  for (unsigned u = 0; u < 128; ++u)
    if (x.b_desc[u] != b_desc || (!a_regs && x.a_desc[u] != a_desc)) wgmma_fault("the threads of a warpgroup gave different descriptors");
  const MatrixDescriptor da = decode_descriptor(a_desc), db = decode_descriptor(b_desc);
  const unsigned warp = t / 32, l = t % 32;
  for (unsigned i = 0; i < N / 2; ++i) {
    const unsigned row = 16 * warp + l / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
    float sum = d[i / 4][i % 4];
    for (unsigned k = 0; k < 16; ++k) {
      const float a = a_regs ? half_of(x.a[32 * (row / 16) + 4 * (row % 8) + (k % 8) / 2][(row % 16 >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k, f16)
                             : operand_value(descriptor_element(da, row, k, false), f16);
      const float b = operand_value(descriptor_element(db, col, k, trans_b), f16);
      sum += a * b;
    }
    d[i / 4][i % 4] = sum;
  }
  x.barrier.arrive_and_wait();
}
}  // namespace cuda_emulation
inline unsigned ladle_shared_address(const void* p) {
  return static_cast<unsigned>(static_cast<const unsigned char*>(p) - ::cuda_emulation::shared_buffer);
}
#define LADLE_WGMMA_HELPERS
#define LADLE_WGMMA_EMULATED
inline void ladle_wgmma_fence() {}
inline void ladle_wgmma_commit() {}
template <int Pending>
inline void ladle_wgmma_wait() {}
inline void ladle_fence_proxy_async() {}
template <int N>
inline void ladle_wgmma_fence_operand(float (&)[N / 8][4]) {}
template <int N>
inline void ladle_wgmma_ss_bf16(float (&d)[N / 8][4], unsigned long long a, unsigned long long b) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, false, false);
}
template <int N>
inline void ladle_wgmma_ss_f16(float (&d)[N / 8][4], unsigned long long a, unsigned long long b) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, false, true);
}
template <int N>
inline void ladle_wgmma_rs_bf16(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b) {
  cuda_emulation::wgmma<N>(d, a, 0, b, true, false);
}
template <int N>
inline void ladle_wgmma_rs_f16(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b) {
  cuda_emulation::wgmma<N>(d, a, 0, b, true, true);
}

struct EmulatedKernel {
  const char* name;
  void (*launch)(void** args);
};
