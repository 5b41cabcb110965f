// fp16 and bf16 narrowing: round to nearest even, overflow to infinity, subnormals, NaN.
#include <catch2/catch.hpp>

#include <ladle/codegen/float16.h>

#include <cmath>
#include <limits>

using namespace ladle::narrow_float;

TEST_CASE("every fp16 value widens and narrows back to itself", "[codegen][float16]") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = from_f16(h);
    if (std::isnan(f)) {
      CHECK((h & 0x7c00) == 0x7c00);
      CHECK(std::isnan(from_f16(to_f16(f))));
    } else if (to_f16(f) != h) {
      FAIL("fp16 " << bits << " -> " << f << " -> " << to_f16(f));
    }
  }
  CHECK(from_f16(0x3c00) == 1.0f);
  CHECK(from_f16(0x7bff) == 65504.0f);
  CHECK(from_f16(0x0001) == std::ldexp(1.0f, -24));
  CHECK(from_f16(0xc000) == -2.0f);
}

TEST_CASE("fp16 narrowing rounds to nearest, ties to even", "[codegen][float16]") {
  const float ulp = std::ldexp(1.0f, -10);  // at 1.0
  CHECK(to_f16(1.0f + ulp / 2) == 0x3c00);          // tie, down to even
  CHECK(to_f16(1.0f + 3 * ulp / 2) == 0x3c02);      // tie, up to even
  CHECK(to_f16(1.0f + ulp / 2 + 1e-7f) == 0x3c01);  // past the tie
  CHECK(to_f16(65504.0f) == 0x7bff);
  CHECK(to_f16(65519.0f) == 0x7bff);
  CHECK(to_f16(65520.0f) == 0x7c00);  // rounds past the largest finite value
  CHECK(to_f16(-1e10f) == 0xfc00);
  CHECK(to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(to_f16(std::ldexp(1.0f, -25)) == 0x0000);         // tie between 0 and the least subnormal
  CHECK(to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(to_f16(std::ldexp(3.0f, -25)) == 0x0002);         // tie, up to even
  CHECK(to_f16(std::ldexp(1.0f, -14) * (1 - std::ldexp(1.0f, -12))) == 0x0400);  // rounds up into the normals
  CHECK(to_f16(std::ldexp(1.0f, -14) * 0.999f) == 0x03ff);
  CHECK(to_f16(-0.0f) == 0x8000);
  CHECK((to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00) == 0x7e00);
}

TEST_CASE("bf16 keeps the top half of a float, rounded to nearest even", "[codegen][float16]") {
  CHECK(to_bf16(1.0f) == 0x3f80);
  CHECK(from_bf16(0x3f80) == 1.0f);
  const float ulp = std::ldexp(1.0f, -7);
  CHECK(to_bf16(1.0f + ulp / 2) == 0x3f80);      // tie, down to even
  CHECK(to_bf16(1.0f + 3 * ulp / 2) == 0x3f82);  // tie, up to even
  CHECK(to_bf16(1.0f + ulp / 2 + 1e-6f) == 0x3f81);
  CHECK(to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // past the largest bf16
  CHECK(to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits in the dropped half stays a NaN.
  CHECK(std::isnan(from_bf16(to_bf16(std::bit_cast<float>(0x7f800001u)))));
  for (std::uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const float f = from_bf16(static_cast<std::uint16_t>(bits));
    if (!std::isnan(f)) CHECK(to_bf16(f) == bits);
  }
}

TEST_CASE("typed loads and stores go through the narrowing", "[codegen][float16]") {
  std::uint16_t h = 0;
  store(&h, ladle::ElementType::f16, 0.1f);
  CHECK(h == to_f16(0.1f));
  CHECK(load(&h, ladle::ElementType::f16) == from_f16(h));
  double d = 0;
  store(&d, ladle::ElementType::f64, 0.25f);
  CHECK(load(&d, ladle::ElementType::f64) == 0.25f);
  CHECK(round_to(ladle::ElementType::bf16, 1.0f + std::ldexp(1.0f, -9)) == 1.0f);
}
