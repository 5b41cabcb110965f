// The fingerprint's content-hash kernel (ops/detail/fingerprint.h) on the host emulation
// (cuda_emulation.h, which is why this test lives beside the generated families' tests): for
// every element size and the layouts the kernel treats apart (contiguous and 8-byte aligned,
// contiguous from an unaligned start, strided with a reversed and a broadcast axis), over grids
// that leave words to the grid-stride loop, its sum is the host's content_hash of the same view.
// A GPU backward compares the two, so they must agree bit for bit.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include <ladle/ops/detail/fingerprint.h>

#include "cuda_emulation.h"

// The two device operations the kernel needs beyond the emulation's: a 64-bit __shfl_xor_sync
// (through the warp's exchange, its two halves posted in the first two registers) and the 64-bit
// atomicAdd.
inline unsigned long long __shfl_xor_sync(unsigned /*full mask*/, unsigned long long value, int lane_mask) {
  cuda_emulation::WarpExchange& x = *cuda_emulation::warp_exchange;
  const unsigned l = cuda_emulation::lane();
  x.a[l][0] = static_cast<unsigned>(value);
  x.a[l][1] = static_cast<unsigned>(value >> 32);
  x.barrier.arrive_and_wait();
  const unsigned other = (l ^ static_cast<unsigned>(lane_mask)) % 32;
  const unsigned long long result = x.a[other][0] | (static_cast<unsigned long long>(x.a[other][1]) << 32);
  x.barrier.arrive_and_wait();
  return result;
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}

#include "content_hash_kernel.inc"

using ladle::DType;
using ladle::TensorView;

namespace {

// What device_content_hashes launches for one view, on the emulation: `blocks` blocks of 256.
std::uint64_t emulated_hash(const TensorView& view, std::uint64_t seed, unsigned blocks) {
  const ladle::ops::detail::HashLayout layout = ladle::ops::detail::hash_layout(view);
  REQUIRE(layout.shape.size() <= static_cast<std::size_t>(LADLE_HASH_MAX_RANK));
  ladle_hash_layout kernel_layout{};
  for (std::size_t d = 0; d < layout.shape.size(); ++d) {
    kernel_layout.shape[d] = layout.shape[d];
    kernel_layout.strides[d] = layout.strides[d];
  }
  unsigned long long sum = 0;
  cuda_emulation::launch(blocks, 1, 256, [&] {
    ladle_content_hash(static_cast<const unsigned char*>(view.data), static_cast<int>(ladle::dtype_size(view.type)),
                       static_cast<int>(layout.shape.size()), kernel_layout, layout.count, seed, &sum);
  });
  return sum;
}

}  // namespace

TEST_CASE("the content-hash kernel sums what the host sums, for every element size and layout", "[ops][fingerprint][emulation]") {
  std::mt19937_64 rng(28);
  for (const DType type : {DType::u8, DType::bf16, DType::f32, DType::f64}) {
    const std::int64_t size = static_cast<std::int64_t>(ladle::dtype_size(type));
    // 8-byte aligned storage, random bytes, room for 3 x 517 x 5 elements and one more.
    const std::int64_t n = 3 * 517 * 5;
    std::vector<std::uint64_t> storage(static_cast<std::size_t>(((n + 1) * size + 7) / 8));
    for (std::uint64_t& word : storage) word = rng();
    auto* base = reinterpret_cast<std::byte*>(storage.data());

    const TensorView aligned = TensorView::contiguous(base, type, {3, 517, 5});
    const TensorView unaligned = TensorView::contiguous(base + size, type, {n});  // a partial last word too, for size < 8
    TensorView strided = aligned;  // [3, 2, 517, 5]: the second axis broadcast, the third reversed, the last transposed away
    strided.shape = {3, 2, 517, 4};
    strided.strides = {517 * 5, 0, -5, 1};
    strided.data = base + 516 * 5 * size;
    TensorView transposed = aligned;  // [5, 517, 3] over the same memory
    transposed.shape = {5, 517, 3};
    transposed.strides = {1, 5, 517 * 5};
    for (const auto& [name, view] : {std::pair{"aligned", aligned}, std::pair{"unaligned", unaligned}, std::pair{"strided", strided},
                                     std::pair{"transposed", transposed}}) {
      const std::uint64_t seed = ladle::ops::detail::layout_seed(view);
      const std::uint64_t want = ladle::ops::detail::content_hash(view, seed);
      for (const unsigned blocks : {1u, 3u}) {  // few threads for the words: the grid-stride loop takes turns
        INFO(ladle::dtype_name(type) << " " << name << ", " << blocks << " blocks");
        CHECK(emulated_hash(view, seed, blocks) == want);
      }
    }
  }
}
