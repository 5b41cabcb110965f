// The host emulation of Hopper's wgmma.mma_async (tests/codegen/cuda_emulation.h) against a
// plain matrix product: operands placed in shared memory by the PTX ISA's canonical no-swizzle
// layouts (written out here independently of the emulation), descriptors encoded by the ISA's
// bit layout, the register A operand and the accumulator read through their fragment layouts.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_emulation.h"

namespace {

using ladle::narrow_float::from_bf16;
using ladle::narrow_float::from_f16;
using ladle::narrow_float::to_bf16;
using ladle::narrow_float::to_f16;

// PTX ISA 9.7.15.5.1.2.2: start, LBO, SBO as (x & 0x3FFFF) >> 4 at bits 0, 16, 32; swizzle 0.
std::uint64_t descriptor(unsigned address, unsigned leading_bytes, unsigned stride_bytes) {
  return std::uint64_t((address & 0x3FFFFu) >> 4) | (std::uint64_t((leading_bytes & 0x3FFFFu) >> 4) << 16) |
         (std::uint64_t((stride_bytes & 0x3FFFFu) >> 4) << 32);
}

// Byte offsets of element (mn, k) of a 16-bit operand in the canonical no-swizzle layouts.
std::size_t k_major(unsigned mn, unsigned k, unsigned lbo, unsigned sbo) { return mn % 8 * 16 + mn / 8 * sbo + k % 8 * 2 + k / 8 * lbo; }
std::size_t mn_major(unsigned mn, unsigned k, unsigned lbo, unsigned sbo) { return mn % 8 * 2 + mn / 8 * sbo + k % 8 * 16 + k / 8 * lbo; }

struct Matrices {
  std::vector<unsigned short> a, b;  // A [64][16 * steps], B [16 * steps][n], 16-bit bits
  std::vector<double> want;          // [64][n]: sum over k of A B, in double
};

Matrices random_matrices(int n, int steps, bool f16, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int k = 16 * steps;
  Matrices m;
  const auto bits = [&](float x) { return f16 ? to_f16(x) : to_bf16(x); };
  const auto value = [&](unsigned short b) { return double(f16 ? from_f16(b) : from_bf16(b)); };
  for (int i = 0; i < 64 * k; ++i) m.a.push_back(bits(normal(rng)));
  for (int i = 0; i < k * n; ++i) m.b.push_back(bits(normal(rng)));
  m.want.assign(std::size_t(64) * n, 0.0);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < n; ++c)
      for (int kk = 0; kk < k; ++kk) m.want[r * n + c] += value(m.a[r * k + kk]) * value(m.b[kk * n + c]);
  return m;
}

void put(unsigned char* shared, std::size_t byte, unsigned short bits) { std::memcpy(shared + byte, &bits, 2); }

// The accumulator fragment of m64nNk16 read back into [64][N]: thread t, element i.
template <int N>
void scatter(const float (&d)[N / 8][4], unsigned t, std::vector<float>& out) {
  for (unsigned i = 0; i < N / 2; ++i) {
    const unsigned row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (t % 4) + i % 2;
    out[row * N + col] = d[i / 4][i % 4];
  }
}

double max_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  return worst;
}

}  // namespace

TEST_CASE("emulated wgmma: descriptor element addressing is the PTX ISA's canonical layouts", "[codegen][wgmma][emulation]") {
  // The ISA's example "MN-Major, no-swizzling and bf16": LBO = 128 * 2 bytes, SBO = 64 * 2 bytes,
  // exact layout ((8,1,2),(8,2)):((1,8,64),(8,128)) in elements.
  std::vector<unsigned char> shared(cuda_emulation::dynamic_shared_bytes, 0);
  cuda_emulation::shared_buffer = shared.data();
  for (unsigned e = 0; e < 256; ++e) put(shared.data(), 2 * e, static_cast<unsigned short>(e));
  const auto mn = cuda_emulation::decode_descriptor(descriptor(0, 256, 128));
  const auto k = cuda_emulation::decode_descriptor(descriptor(0, 128, 256));
  for (unsigned m = 0; m < 16; ++m)
    for (unsigned kk = 0; kk < 16; ++kk) {
      INFO("mn " << m << " k " << kk);
      CHECK(cuda_emulation::descriptor_element(mn, m, kk, true) == m % 8 + m / 8 * 64 + kk % 8 * 8 + kk / 8 * 128);
      // K-major ((8,m),(8,2)):((8,SBO),(1,LBO)) with LBO = 64, SBO = 128 elements.
      CHECK(cuda_emulation::descriptor_element(k, m, kk, false) == m % 8 * 8 + m / 8 * 128 + kk % 8 + kk / 8 * 64);
    }
  cuda_emulation::shared_buffer = nullptr;
}

TEST_CASE("emulated wgmma: m64n64k16 with A and B K-major in shared memory is A B", "[codegen][wgmma][emulation]") {
  for (bool f16 : {false, true}) {
    constexpr int N = 64;
    const int steps = 2;  // two k16 products accumulate
    const Matrices m = random_matrices(N, steps, f16, f16 ? 7 : 8);
    // Strides not implied by the sizes: A's 8-row groups 512 bytes apart, its k halves 256
    // apart; B (K-major: row = n) 8-column groups 2048 bytes apart, k halves 128 apart.
    const unsigned a_base = 1024, b_base = 32768, a_lbo = 256, a_sbo = 512 * 2, b_lbo = 128 * 3, b_sbo = 2048;
    std::vector<float> got(64 * N, -1.0f);
    cuda_emulation::launch(1, 1, 128, [&] {
      unsigned char* shared = cuda_emulation::shared_buffer;
      if (threadIdx.x == 0) {
        for (int s = 0; s < steps; ++s)
          for (unsigned r = 0; r < 64; ++r)
            for (unsigned kk = 0; kk < 16; ++kk) {
              put(shared, a_base + s * 8192 + k_major(r, kk, a_lbo, a_sbo), m.a[r * 16 * steps + s * 16 + kk]);
            }
        for (int s = 0; s < steps; ++s)
          for (unsigned c = 0; c < N; ++c)
            for (unsigned kk = 0; kk < 16; ++kk) put(shared, b_base + s * 32768 + k_major(c, kk, b_lbo, b_sbo), m.b[(s * 16 + kk) * N + c]);
      }
      __syncthreads();
      float d[N / 8][4] = {};
      for (int s = 0; s < steps; ++s) {
        const auto a = descriptor(a_base + s * 8192, a_lbo, a_sbo), b = descriptor(b_base + s * 32768, b_lbo, b_sbo);
        if (f16) ladle_wgmma_ss_f16<N>(d, a, b);
        else ladle_wgmma_ss_bf16<N>(d, a, b);
      }
      scatter<N>(d, threadIdx.x, got);
    });
    INFO((f16 ? "f16" : "bf16"));
    CHECK(max_error(got, m.want) < 1e-3);
  }
}

TEST_CASE("emulated wgmma: m64n32k16 with A in registers and B N-major in shared memory is A B", "[codegen][wgmma][emulation]") {
  for (bool f16 : {false, true}) {
    constexpr int N = 32;
    const int steps = 3;
    const Matrices m = random_matrices(N, steps, f16, f16 ? 9 : 10);
    // N-major B: 8 n-columns of one k contiguous; 8-column groups SBO apart, 8-k groups LBO apart.
    const unsigned b_base = 2048, lbo = 1024, sbo = 128;
    std::vector<float> got(64 * N, -1.0f);
    cuda_emulation::launch(1, 1, 128, [&] {
      unsigned char* shared = cuda_emulation::shared_buffer;
      if (threadIdx.x == 0)
        for (int s = 0; s < steps; ++s)
          for (unsigned c = 0; c < N; ++c)
            for (unsigned kk = 0; kk < 16; ++kk) put(shared, b_base + s * 8192 + mn_major(c, kk, lbo, sbo), m.b[(s * 16 + kk) * N + c]);
      __syncthreads();
      const unsigned t = threadIdx.x, row = 16 * (t / 32) + (t % 32) / 4, col = 2 * (t % 4);
      float d[N / 8][4] = {};
      for (int s = 0; s < steps; ++s) {
        const auto at = [&](unsigned r, unsigned k) { return static_cast<unsigned>(m.a[r * 16 * steps + s * 16 + k]); };
        // The A fragment: a0 (row, col..col+1), a1 (row + 8, ...), a2 (row, col + 8..), a3 (row + 8, col + 8..).
        const unsigned a[4] = {at(row, col) | at(row, col + 1) << 16, at(row + 8, col) | at(row + 8, col + 1) << 16,
                               at(row, col + 8) | at(row, col + 9) << 16, at(row + 8, col + 8) | at(row + 8, col + 9) << 16};
        const auto b = descriptor(b_base + s * 8192, lbo, sbo);
        if (f16) ladle_wgmma_rs_f16<N>(d, a, b);
        else ladle_wgmma_rs_bf16<N>(d, a, b);
      }
      scatter<N>(d, threadIdx.x, got);
    });
    INFO((f16 ? "f16" : "bf16"));
    CHECK(max_error(got, m.want) < 1e-3);
  }
}
