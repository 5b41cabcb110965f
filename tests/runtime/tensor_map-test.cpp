// TMA tensor-map descriptions (runtime/tensor_map.h): the rules a description is checked
// against before the driver or the host emulation sees it, the bytes the emulation reads back,
// and the driver path without a driver.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/tensor_map.h>

namespace {

// A [B=2, T=37, H=3, D=80] bf16 tensor as the attention kernels describe it: dims innermost first.
ladle::TensorMapDescription qkv(const void* data) {
  ladle::TensorMapDescription map;
  map.address = data;
  map.rank = 4;
  map.bfloat16 = 1;
  const std::uint64_t dims[4] = {80, 37, 3, 2}, strides[4] = {2, 3 * 80 * 2, 80 * 2, 37 * 3 * 80 * 2};
  for (int d = 0; d < 4; ++d) map.dims[d] = dims[d], map.strides[d] = strides[d];
  map.box[0] = 64, map.box[1] = 32, map.box[2] = 1, map.box[3] = 1;
  return map;
}

}  // namespace

TEST_CASE("a tensor map description is checked against TMA's rules", "[runtime][tensor_map]") {
  alignas(16) static unsigned char data[64];
  const ladle::TensorMapDescription good = qkv(data);
  REQUIRE(ladle::validate_tensor_map(good).empty());
  REQUIRE(ladle::box_bytes(good) == 64 * 32 * 2);
  const auto first = [](ladle::TensorMapDescription map) {
    const auto problems = ladle::validate_tensor_map(map);
    return problems.empty() ? std::string() : problems.front();
  };
  ladle::TensorMapDescription bad = good;
  bad.address = data + 8;
  CHECK_THAT(first(bad), Catch::Contains("16-byte aligned"));
  bad = good, bad.strides[2] = 168;
  CHECK_THAT(first(bad), Catch::Contains("dimension 2: stride of 168 bytes"));
  bad = good, bad.box[0] = 128;
  CHECK_THAT(first(bad), Catch::Contains("inner box of 256 bytes"));
  bad = good, bad.box[0] = 4;
  CHECK_THAT(first(bad), Catch::Contains("inner box of 8 bytes"));
  bad = good, bad.box[1] = 300;
  CHECK_THAT(first(bad), Catch::Contains("dimension 1: box of 300"));
  bad = good, bad.dims[3] = 0;
  CHECK_THAT(first(bad), Catch::Contains("dimension 3 has 0 elements"));
  bad = good, bad.rank = 6;
  CHECK_THAT(first(bad), Catch::Contains("rank 6"));
  bad = good, bad.strides[0] = 4;
  CHECK_THAT(first(bad), Catch::Contains("strides[0] = 4"));
  bad = good, bad.address = data + 8;
  REQUIRE_THROWS_WITH(ladle::describe_tensor_map(bad), Catch::Contains("tensor map: the global address"));

  // fp32 elements (the attention backward's dq): 4-byte strides[0], 32-float boxes fill the span.
  ladle::TensorMapDescription f32 = good;
  f32.bfloat16 = 0, f32.float32 = 1;
  for (int d = 1; d < 4; ++d) f32.strides[d] *= 2;
  f32.strides[0] = 4, f32.box[0] = 32;
  CHECK(ladle::element_bytes(f32) == 4);
  CHECK(ladle::validate_tensor_map(f32).empty());
  CHECK(ladle::box_bytes(f32) == 32 * 32 * 4);
  bad = f32, bad.box[0] = 64;
  CHECK_THAT(first(bad), Catch::Contains("inner box of 256 bytes"));
  bad = f32, bad.strides[0] = 2;
  CHECK_THAT(first(bad), Catch::Contains("strides[0] = 2, expected 4 (contiguous fp32 elements)"));
}

TEST_CASE("describe_tensor_map keeps the description's bytes; encoding needs the driver", "[runtime][tensor_map]") {
  alignas(16) static unsigned char data[64];
  const ladle::TensorMapDescription map = qkv(data);
  const ladle::TensorMap described = ladle::describe_tensor_map(map);
  ladle::TensorMapDescription back;
  std::memcpy(&back, described.bytes, sizeof(back));
  CHECK(back.address == map.address);
  CHECK(back.rank == 4);
  CHECK(back.bfloat16 == 1);
  for (int d = 0; d < 4; ++d) {
    CHECK(back.dims[d] == map.dims[d]);
    CHECK(back.strides[d] == map.strides[d]);
    CHECK(back.box[d] == map.box[d]);
  }
  if (!ladle::driver_available()) {
    REQUIRE_THROWS_AS(ladle::encode_tensor_map(map), ladle::NoCudaDriver);
  } else {
    // A device tensor is not needed to encode: the driver only records the address.
    const ladle::TensorMap encoded = ladle::encode_tensor_map(map);
    bool any = false;
    for (std::byte b : encoded.bytes) any = any || b != std::byte{0};
    CHECK(any);
  }
}
