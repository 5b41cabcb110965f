// The host emulation of Hopper's wgmma.mma_async (tests/codegen/cuda_emulation.h) against a
// plain matrix product: operands placed in shared memory by the PTX ISA's canonical no-swizzle
// layouts (written out here independently of the emulation), descriptors encoded by the ISA's
// bit layout, the register A operand and the accumulator read through their fragment layouts.
// Then the rest of a Hopper pipeline: TMA tensor copies with the 128-byte swizzle and zero fill
// (checked element by element against the swizzle written out here), wgmma reading such
// copies through 128B-swizzle descriptors, and mbarriers with arrival and transaction counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_emulation.h"

namespace {

float from_bf16(std::uint16_t bits) { return ladle::bfloat16::from_bits(bits); }
float from_f16(std::uint16_t bits) { return ladle::half::from_bits(bits); }
std::uint16_t to_bf16(float x) { return ladle::bfloat16(x).bits(); }
std::uint16_t to_f16(float x) { return ladle::half(x).bits(); }

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
      // The first product's scale-d = 0 overwrites what d held (as the attention kernels' scores
      // use it, with no zeroing): d starts as garbage.
      float d[N / 8][4];
      for (auto& row : d) row[0] = row[1] = row[2] = row[3] = 12345.0f;
      for (int s = 0; s < steps; ++s) {
        const auto a = descriptor(a_base + s * 8192, a_lbo, a_sbo), b = descriptor(b_base + s * 32768, b_lbo, b_sbo);
        if (f16) ladle_wgmma_ss_f16<N>(d, a, b, s > 0);
        else ladle_wgmma_ss_bf16<N>(d, a, b, s > 0);
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

namespace {

// A descriptor for the 128-byte swizzle: swizzle mode 1 at bits 62-63.
std::uint64_t swizzled_descriptor(unsigned address, unsigned leading_bytes, unsigned stride_bytes) {
  return descriptor(address, leading_bytes, stride_bytes) | (std::uint64_t(1) << 62);
}

// Random nonzero 16-bit floats.
std::vector<unsigned short> random_bits(std::size_t count, bool f16, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<unsigned short> out(count);
  for (unsigned short& b : out) do
      b = f16 ? to_f16(normal(rng)) : to_bf16(normal(rng));
    while ((b & 0x7fffu) == 0);
  return out;
}

ladle_tensor_map tensor_map(const ladle::TensorMapDescription& description) {
  const ladle::TensorMap map = ladle::describe_tensor_map(description);
  ladle_tensor_map out;
  std::memcpy(out.bytes, map.bytes, sizeof out.bytes);
  return out;
}

// Where the 128-byte swizzle puts byte `byte` of 128-byte row `row` of a box copied to a
// 1024-byte-aligned address: its 16-byte piece p goes to piece p ^ row % 8.
std::size_t swizzled(std::size_t row, std::size_t byte) { return row * 128 + (byte / 16 ^ row % 8) * 16 + byte % 16; }

unsigned short get(const unsigned char* shared, std::size_t byte) {
  unsigned short bits;
  std::memcpy(&bits, shared + byte, 2);
  return bits;
}

}  // namespace

TEST_CASE("emulated TMA: a 4-d box copy lands 128B-swizzled, zero outside the tensor, and completes its bytes", "[codegen][wgmma][emulation]") {
  // A [B = 2][T = 37][H = 3][D = 80] bf16 tensor, rows of D padded to 88 elements (the padding
  // holds nonzero values too, so reading past D would show).
  const unsigned D = 80, T = 37, H = 3, B = 2, row = 88;
  const std::vector<unsigned short> global = random_bits(std::size_t(B) * T * H * row, false, 21);
  REQUIRE(reinterpret_cast<std::uintptr_t>(global.data()) % 16 == 0);
  ladle::TensorMapDescription description;
  description.address = global.data();
  description.rank = 4;
  description.bfloat16 = 1;
  const std::uint64_t dims[4] = {D, T, H, B}, strides[4] = {2, 2 * row * H, 2 * row, 2 * row * H * T};
  const std::uint32_t box[4] = {64, 32, 1, 1};
  for (int d = 0; d < 4; ++d) description.dims[d] = dims[d], description.strides[d] = strides[d], description.box[d] = box[d];
  const ladle_tensor_map map = tensor_map(description);
  const auto element = [&](long long d, long long t, long long h, long long b) -> unsigned short {
    if (d < 0 || d >= D || t < 0 || t >= T || h < 0 || h >= H || b < 0 || b >= B) return 0;
    return global[((b * T + t) * H + h) * row + d];
  };
  // Two copies onto one barrier: (64, 20, 1, 1) runs past D and T; (-8, -3, 2, 0) starts before both.
  const int corner[2][4] = {{64, 20, 1, 1}, {-8, -3, 2, 0}};
  const std::size_t at[2] = {1024, 8192}, box_bytes = 64 * 32 * 2;
  std::vector<unsigned char> shared;
  unsigned phases[3] = {9, 9, 9};
  cuda_emulation::launch(1, 1, 1, [&] {
    unsigned char* smem = cuda_emulation::shared_buffer;
    auto* bar = reinterpret_cast<unsigned long long*>(smem);
    ladle_mbarrier_init(bar, 1);
    ladle_fence_barrier_init();
    ladle_mbarrier_arrive_expect_tx(bar, 2 * box_bytes);
    phases[0] = cuda_emulation::mbarrier_phase(bar);  // the arrival is in, the bytes are not
    ladle_tma_load_4d(smem + at[0], &map, corner[0][0], corner[0][1], corner[0][2], corner[0][3], bar);
    phases[1] = cuda_emulation::mbarrier_phase(bar);  // half the bytes are
    ladle_tma_load_4d(smem + at[1], &map, corner[1][0], corner[1][1], corner[1][2], corner[1][3], bar);
    phases[2] = cuda_emulation::mbarrier_phase(bar);
    if (phases[2] == 1) ladle_mbarrier_wait(bar, 0);  // returns: the phase of parity 0 completed
    ladle_mbarrier_wait(bar, 1 ^ phases[2]);
    shared.assign(smem, smem + cuda_emulation::dynamic_shared_bytes);
  });
  CHECK(phases[0] == 0);
  CHECK(phases[1] == 0);
  CHECK(phases[2] == 1);
  std::vector<bool> written(shared.size(), false);
  std::size_t inside = 0;
  for (int c = 0; c < 2; ++c)
    for (unsigned i1 = 0; i1 < 32; ++i1)
      for (unsigned i0 = 0; i0 < 64; ++i0) {
        const std::size_t byte = at[c] + swizzled(i1, 2 * i0);
        const unsigned short want = element(corner[c][0] + i0, corner[c][1] + i1, corner[c][2], corner[c][3]);
        inside += want != 0;
        written[byte] = written[byte + 1] = true;
        INFO("copy " << c << " box element (" << i0 << ", " << i1 << ")");
        REQUIRE(get(shared.data(), byte) == want);
      }
  // (80 - 64) x (37 - 20) and (64 - 8) x (32 - 3) elements lie inside the tensor.
  CHECK(inside == 16 * 17 + 56 * 29);
  // Nothing else of shared memory (past the barrier) was written: it is still 0xff.
  std::size_t stray = 0;
  for (std::size_t i = 64; i < shared.size(); ++i) stray += !written[i] && shared[i] != 0xff;
  CHECK(stray == 0);
}

TEST_CASE("emulated wgmma: m64n64k16 reading TMA-copied 128B-swizzled K-major A and B is A B", "[codegen][wgmma][emulation]") {
  constexpr int N = 64;
  const unsigned K = 64, M = 80;
  // A: rows 5..68 of batch 1 of a [2][80][64] tensor; B: the [64 (n)][64 (k)] tensor, K-major.
  const std::vector<unsigned short> a = random_bits(std::size_t(2) * M * K, false, 31), b = random_bits(std::size_t(N) * K, false, 32);
  std::vector<double> want(64 * N, 0.0);
  for (unsigned r = 0; r < 64; ++r)
    for (unsigned c = 0; c < N; ++c)
      for (unsigned k = 0; k < K; ++k) want[r * N + c] += double(from_bf16(a[(M + 5 + r) * K + k])) * from_bf16(b[c * K + k]);
  ladle::TensorMapDescription da;
  da.address = a.data(), da.rank = 3, da.bfloat16 = 1;
  da.dims[0] = K, da.dims[1] = M, da.dims[2] = 2;
  da.strides[0] = 2, da.strides[1] = 2 * K, da.strides[2] = 2 * K * M;
  da.box[0] = 64, da.box[1] = 64, da.box[2] = 1;
  ladle::TensorMapDescription db = da;
  db.address = b.data(), db.dims[1] = N, db.dims[2] = 1, db.strides[2] = 2 * K * N;
  const ladle_tensor_map a_map = tensor_map(da), b_map = tensor_map(db);
  const unsigned a_base = 1024, b_base = 1024 + 8192;
  std::vector<float> got(64 * N, -1.0f);
  cuda_emulation::launch(1, 1, 128, [&] {
    unsigned char* smem = cuda_emulation::shared_buffer;
    auto* bar = reinterpret_cast<unsigned long long*>(smem);
    if (threadIdx.x == 0) {
      ladle_mbarrier_init(bar, 1);
      ladle_fence_barrier_init();
    }
    __syncthreads();
    ladle_setmaxnreg_inc<240>();
    if (threadIdx.x == 0) {
      ladle_mbarrier_arrive_expect_tx(bar, 2 * 8192);
      ladle_tma_load_3d(smem + a_base, &a_map, 0, 5, 1, bar);
      ladle_tma_load_3d(smem + b_base, &b_map, 0, 0, 0, bar);
    }
    ladle_mbarrier_wait(bar, 0);
    float d[N / 8][4] = {};
    ladle_wgmma_fence();
    // k16 step s starts 32 bytes further into each 128-byte row; the next 8 rows are 1024 bytes on.
    for (unsigned s = 0; s < K / 16; ++s)
      ladle_wgmma_ss_bf16<N>(d, swizzled_descriptor(a_base + 32 * s, 16, 1024), swizzled_descriptor(b_base + 32 * s, 16, 1024));
    ladle_wgmma_commit();
    ladle_wgmma_wait<0>();
    scatter<N>(d, threadIdx.x, got);
  });
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
  CHECK(worst < 1e-3);
}

TEST_CASE("emulated wgmma: m64n128k16 with A in registers and B MN-major from 128B-swizzled TMA copies is A B", "[codegen][wgmma][emulation]") {
  constexpr int N = 128;
  const unsigned keys = 32, heads = 2, stored_keys = 40;
  // V: keys 4..35 of head 1 of a [2][40][128] tensor, dv contiguous; A: [64][32] random.
  const std::vector<unsigned short> v = random_bits(std::size_t(heads) * stored_keys * N, false, 41), a = random_bits(64 * keys, false, 42);
  const auto v_at = [&](unsigned key, unsigned dv) { return v[(std::size_t(stored_keys) + 4 + key) * N + dv]; };
  std::vector<double> want(64 * N, 0.0);
  for (unsigned r = 0; r < 64; ++r)
    for (unsigned c = 0; c < N; ++c)
      for (unsigned k = 0; k < keys; ++k) want[r * N + c] += double(from_bf16(a[r * keys + k])) * from_bf16(v_at(k, c));
  ladle::TensorMapDescription dv;
  dv.address = v.data(), dv.rank = 3, dv.bfloat16 = 1;
  dv.dims[0] = N, dv.dims[1] = stored_keys, dv.dims[2] = heads;
  dv.strides[0] = 2, dv.strides[1] = 2 * N, dv.strides[2] = 2 * N * stored_keys;
  dv.box[0] = 64, dv.box[1] = keys, dv.box[2] = 1;
  const ladle_tensor_map v_map = tensor_map(dv);
  const unsigned base = 2048;
  std::vector<float> got(64 * N, -1.0f);
  cuda_emulation::launch(1, 1, 128, [&] {
    unsigned char* smem = cuda_emulation::shared_buffer;
    auto* bar = reinterpret_cast<unsigned long long*>(smem + 8);
    if (threadIdx.x == 0) {
      ladle_mbarrier_init(bar, 1);
      ladle_fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Two boxes of (64 dv, 32 keys): dv 0..63, then dv 64..127 at + 32 * 128 bytes.
      ladle_mbarrier_arrive_expect_tx(bar, 2 * 64 * keys * 2);
      ladle_tma_load_3d(smem + base, &v_map, 0, 4, 1, bar);
      ladle_tma_load_3d(smem + base + keys * 128, &v_map, 64, 4, 1, bar);
    }
    ladle_mbarrier_wait(bar, 0);
    const unsigned t = threadIdx.x, row = 16 * (t / 32) + (t % 32) / 4, col = 2 * (t % 4);
    float d[N / 8][4] = {};
    for (unsigned s = 0; s < keys / 16; ++s) {
      const auto at = [&](unsigned r, unsigned k) { return static_cast<unsigned>(a[r * keys + s * 16 + k]); };
      const unsigned frag[4] = {at(row, col) | at(row, col + 1) << 16, at(row + 8, col) | at(row + 8, col + 1) << 16,
                                at(row, col + 8) | at(row, col + 9) << 16, at(row + 8, col + 8) | at(row + 8, col + 9) << 16};
      // 16 keys are 16 rows of 128 bytes; LBO: the next 64 of dv (the second box); SBO: the next 8 keys.
      ladle_wgmma_rs_bf16<N>(d, frag, swizzled_descriptor(base + s * 16 * 128, keys * 128, 1024));
    }
    scatter<N>(d, threadIdx.x, got);
  });
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
  CHECK(worst < 1e-3);
}

TEST_CASE("emulated mbarriers: a two-stage ring passes values in order and holds the producer back", "[codegen][wgmma][emulation]") {
  const int count = 20, stages = 2;
  std::vector<unsigned> values(count);
  std::mt19937 seed_rng(51);
  for (unsigned& v : values) v = static_cast<unsigned>(seed_rng()) | 1u;
  std::vector<unsigned> received;
  std::vector<int> ahead;  // at each receipt: how many values the producer had written by then
  std::atomic<int> produced{0};
  cuda_emulation::launch(1, 1, 64, [&] {
    unsigned char* smem = cuda_emulation::shared_buffer;
    auto* full = reinterpret_cast<unsigned long long*>(smem);
    auto* empty = full + stages;
    auto* slot = reinterpret_cast<unsigned*>(smem + 64);
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s) ladle_mbarrier_init(&full[s], 1), ladle_mbarrier_init(&empty[s], 1);
      ladle_fence_barrier_init();
    }
    __syncthreads();
    std::mt19937 rng(threadIdx.x);
    const auto dawdle = [&] {
      for (unsigned n = rng() % 64; n > 0; --n) cuda_emulation::yield();
    };
    if (threadIdx.x == 0)
      for (int i = 0; i < count; ++i) {
        const int s = i % stages;
        const unsigned n = static_cast<unsigned>(i / stages);
        ladle_mbarrier_wait(&empty[s], (n & 1) ^ 1);  // the first pass finds every slot free
        slot[s] = values[i];
        produced.store(i + 1);
        ladle_mbarrier_arrive(&full[s]);
        dawdle();
      }
    if (threadIdx.x == 32)
      for (int i = 0; i < count; ++i) {
        const int s = i % stages;
        const unsigned n = static_cast<unsigned>(i / stages);
        ladle_mbarrier_wait(&full[s], n & 1);
        dawdle();
        received.push_back(slot[s]);
        ahead.push_back(produced.load() - i);
        ladle_mbarrier_arrive(&empty[s]);
      }
  });
  CHECK(received == values);
  // Until value i's slot is released, the producer can have written values i and i + 1 only.
  REQUIRE(ahead.size() == std::size_t(count));
  CHECK(*std::min_element(ahead.begin(), ahead.end()) >= 1);
  CHECK(*std::max_element(ahead.begin(), ahead.end()) <= stages);
}

TEST_CASE("emulated named barriers: two warpgroups take turns (ping-pong) in strict alternation", "[codegen][wgmma][emulation]") {
  // As the ws kernels' consumers do it: warpgroup g waits on barrier 1 + g, does its turn, then
  // arrives on the other's; warpgroup 1 opens with an arrival on barrier 1 and skips its last.
  constexpr int rounds = 5;
  std::vector<int> order;
  std::mutex mutex;
  cuda_emulation::launch(1, 1, 256, [&] {
    const int group = static_cast<int>(threadIdx.x / 128);
    if (group == 1) ladle_named_barrier_arrive(1, 256);
    for (int round = 0; round < rounds; ++round) {
      ladle_named_barrier_sync(1 + group, 256);
      if (threadIdx.x % 128 == 0) {
        const std::lock_guard<std::mutex> lock(mutex);
        order.push_back(group);
      }
      if (group == 0 || round + 1 < rounds) ladle_named_barrier_arrive(2 - group, 256);
    }
  });
  REQUIRE(order.size() == 2 * rounds);
  for (int k = 0; k < 2 * rounds; ++k) CHECK(order[k] == k % 2);
}
