// tensor/dtype.h: DType names and sizes, and ladle::half and ladle::bfloat16 (rounding from
// double and from float, special values, limits, typed loads and stores, use in xt::xarray).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xoperation.hpp>

#include <ladle/tensor/dtype.h>

using ladle::bfloat16;
using ladle::half;

namespace {
std::uint16_t to_f16(float x) { return half(x).bits(); }
std::uint16_t to_bf16(float x) { return bfloat16(x).bits(); }
float from_f16(std::uint16_t bits) { return half::from_bits(bits); }
float from_bf16(std::uint16_t bits) { return bfloat16::from_bits(bits); }
}  // namespace

TEST_CASE("half converts known values to their IEEE binary16 bit patterns") {
  CHECK(half(1.0f).bits() == 0x3C00);
  CHECK(half(-2.0f).bits() == 0xC000);
  CHECK(half(65504.0f).bits() == 0x7BFF);
  CHECK(half(0.1f).bits() == 0x2E66);
  CHECK(half(0.5).bits() == 0x3800);
  CHECK(half(1).bits() == 0x3C00);
  CHECK(half(0.0f).bits() == 0x0000);
  CHECK(half(-0.0f).bits() == 0x8000);
  CHECK(half(0x1p-14f).bits() == 0x0400);  // smallest normal
  CHECK(half(0x1p-24f).bits() == 0x0001);  // smallest subnormal
  STATIC_REQUIRE(half(0.1f).bits() == 0x2E66);  // usable in constant expressions
}

TEST_CASE("half rounds ties to even in the normal and the subnormal range") {
  CHECK(half(1.0 + 0x1p-11).bits() == 0x3C00);            // tie, 0x3C00 is even
  CHECK(half(1.0 + 3 * 0x1p-11).bits() == 0x3C02);        // tie, 0x3C02 is even
  CHECK(half(1.0 + 0x1p-11 + 0x1p-20).bits() == 0x3C01);  // just above the tie
  CHECK(half(1.0 + 0x1p-11 - 0x1p-22).bits() == 0x3C00);  // just below the tie
  CHECK(half(0x1p-25).bits() == 0x0000);                  // half the smallest subnormal
  CHECK(half(3 * 0x1p-25).bits() == 0x0002);
  CHECK(half(5 * 0x1p-25).bits() == 0x0002);
  CHECK(half(0x1p-25 + 0x1p-35).bits() == 0x0001);
  CHECK(half(1023.5 * 0x1p-24).bits() == 0x0400);  // largest subnormal rounds up to a normal
  CHECK(half(-3 * 0x1p-25).bits() == 0x8002);
}

TEST_CASE("half overflows to infinity past the largest finite value") {
  CHECK(half(65519.0f).bits() == 0x7BFF);  // below the tie with 65536
  CHECK(half(65520.0f).bits() == 0x7C00);  // the tie rounds to the even side: infinity
  CHECK(half(1e6f).bits() == 0x7C00);
  CHECK(half(-1e6f).bits() == 0xFC00);
  CHECK(half(1e300).bits() == 0x7C00);
  CHECK(half(std::numeric_limits<float>::infinity()).bits() == 0x7C00);
  CHECK(half(-std::numeric_limits<double>::infinity()).bits() == 0xFC00);
}

TEST_CASE("half and bfloat16 keep a NaN a NaN, with its sign") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(static_cast<float>(half(nan))));
  CHECK(std::isnan(static_cast<float>(bfloat16(nan))));
  CHECK((half(-nan).bits() & 0x8000) != 0);
  CHECK((bfloat16(-nan).bits() & 0x8000) != 0);
  // A NaN whose payload sits only in bits that narrowing drops must not become infinity.
  // (A double, since widening a float signaling NaN to double may already set the quiet bit.)
  const double low_payload_nan = std::bit_cast<double>(std::uint64_t{0x7FF0000000000001});
  CHECK(std::isnan(static_cast<float>(half(low_payload_nan))));
  CHECK(std::isnan(static_cast<float>(bfloat16(low_payload_nan))));
  CHECK(std::isnan(static_cast<float>(half(std::bit_cast<float>(0x7F800001u)))));
  CHECK(std::isnan(static_cast<float>(half(std::numeric_limits<double>::signaling_NaN()))));
}

TEST_CASE("bfloat16 converts known values to their bit patterns") {
  CHECK(bfloat16(1.0f).bits() == 0x3F80);
  CHECK(bfloat16(-2.0f).bits() == 0xC000);
  CHECK(bfloat16(1.0f / 3.0f).bits() == 0x3EAB);
  CHECK(bfloat16(1.0 / 3.0).bits() == 0x3EAB);
  CHECK(bfloat16(65504.0f).bits() == 0x4780);
  CHECK(bfloat16(0.1f).bits() == 0x3DCD);
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits() == 0x7F80);  // rounds to infinity
  CHECK(bfloat16(-0.0f).bits() == 0x8000);
  CHECK(static_cast<float>(bfloat16::from_bits(0x3EAB)) == 0.333984375f);
}

TEST_CASE("bfloat16 rounds ties to even in the normal and the subnormal range") {
  CHECK(bfloat16(1.0 + 0x1p-8).bits() == 0x3F80);
  CHECK(bfloat16(1.0 + 3 * 0x1p-8).bits() == 0x3F82);
  CHECK(bfloat16(1.0 + 0x1p-8 + 0x1p-30).bits() == 0x3F81);
  CHECK(bfloat16(0x1p-133).bits() == 0x0001);
  CHECK(bfloat16(0x1p-134).bits() == 0x0000);
  CHECK(bfloat16(3 * 0x1p-134).bits() == 0x0002);
}

TEST_CASE("narrowing a double rounds once, not twice through float") {
  // Through float, these land exactly on a tie and then round down to even.
  const double above_half_tie = 1.0 + 0x1p-11 + 0x1p-40;
  CHECK(half(static_cast<float>(above_half_tie)).bits() == 0x3C00);
  CHECK(half(above_half_tie).bits() == 0x3C01);
  const double above_bf16_tie = 1.0 + 0x1p-8 + 0x1p-40;
  CHECK(bfloat16(static_cast<float>(above_bf16_tie)).bits() == 0x3F80);
  CHECK(bfloat16(above_bf16_tie).bits() == 0x3F81);
}

template <class T>
int count_round_trip_failures() {
  int failures = 0;
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float widened = T::from_bits(static_cast<std::uint16_t>(bits));
    if (std::isnan(widened)) {
      failures += std::isnan(static_cast<float>(T(widened))) ? 0 : 1;
    } else {
      failures += T(widened).bits() == bits ? 0 : 1;
    }
  }
  return failures;
}

TEST_CASE("every half and bfloat16 bit pattern widens exactly and narrows back unchanged") {
  CHECK(count_round_trip_failures<half>() == 0);
  CHECK(count_round_trip_failures<bfloat16>() == 0);
  CHECK(static_cast<float>(half::from_bits(0x0001)) == 0x1p-24f);
  CHECK(static_cast<float>(half::from_bits(0x03FF)) == 1023 * 0x1p-24f);
  CHECK(static_cast<float>(half::from_bits(0x7BFF)) == 65504.0f);
  CHECK(static_cast<float>(half::from_bits(0xFC00)) == -std::numeric_limits<float>::infinity());
  CHECK(static_cast<float>(bfloat16::from_bits(0x0001)) == 0x1p-133f);
}

TEST_CASE("numeric_limits describes half and bfloat16") {
  using half_limits = std::numeric_limits<half>;
  using bf16_limits = std::numeric_limits<bfloat16>;
  STATIC_REQUIRE(half_limits::is_specialized);
  CHECK(static_cast<float>(half_limits::max()) == 65504.0f);
  CHECK(static_cast<float>(half_limits::lowest()) == -65504.0f);
  CHECK(static_cast<float>(half_limits::min()) == 0x1p-14f);
  CHECK(static_cast<float>(half_limits::denorm_min()) == 0x1p-24f);
  CHECK(static_cast<float>(half_limits::epsilon()) == 0x1p-10f);
  CHECK(std::isinf(static_cast<float>(half_limits::infinity())));
  CHECK(std::isnan(static_cast<float>(half_limits::quiet_NaN())));
  CHECK(std::isnan(static_cast<float>(half_limits::signaling_NaN())));
  CHECK(static_cast<float>(bf16_limits::max()) == std::bit_cast<float>(0x7F7F0000u));
  CHECK(static_cast<float>(bf16_limits::min()) == std::numeric_limits<float>::min());
  CHECK(static_cast<float>(bf16_limits::epsilon()) == 0x1p-7f);
  CHECK(std::isnan(static_cast<float>(bf16_limits::quiet_NaN())));
}

TEST_CASE("xt::xarray of bfloat16 supports construction, element access, assignment and casts") {
  xt::xarray<bfloat16> values = {{bfloat16(1.0f), bfloat16(2.0f)}, {bfloat16(3.0f), bfloat16(1 / 3.0)}};
  CHECK(values.shape()[0] == 2);
  CHECK(values(1, 1).bits() == 0x3EAB);
  values(0, 1) = bfloat16(-2.0f);
  CHECK(values(0, 1).bits() == 0xC000);

  const xt::xarray<float> widened = xt::cast<float>(values);
  CHECK(widened(1, 0) == 3.0f);
  CHECK(widened(1, 1) == 0.333984375f);
  const xt::xarray<bfloat16> narrowed = xt::cast<bfloat16>(xt::xarray<float>{0.1f, 65504.0f});
  CHECK(narrowed(0).bits() == 0x3DCD);
  CHECK(narrowed(1).bits() == 0x4780);

  xt::xarray<bfloat16> copy = values;
  CHECK(copy(1, 1).bits() == 0x3EAB);
  const xt::xarray<half> halves(std::vector<std::size_t>{2, 2}, half(0.1f));
  CHECK(halves(1, 1).bits() == 0x2E66);
}

TEST_CASE("every fp16 value widens and narrows back to itself", "[tensor][dtype]") {
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

TEST_CASE("fp16 narrowing rounds to nearest, ties to even", "[tensor][dtype]") {
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

TEST_CASE("bf16 keeps the top half of a float, rounded to nearest even", "[tensor][dtype]") {
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

TEST_CASE("typed loads and stores go through the narrowing", "[tensor][dtype]") {
  std::uint16_t h = 0;
  ladle::store_float(&h, ladle::DType::f16, 0.1f);
  CHECK(h == to_f16(0.1f));
  CHECK(ladle::load_float(&h, ladle::DType::f16) == from_f16(h));
  double d = 0;
  ladle::store_float(&d, ladle::DType::f64, 0.25f);
  CHECK(ladle::load_float(&d, ladle::DType::f64) == 0.25f);
  CHECK(ladle::round_to(ladle::DType::bf16, 1.0f + std::ldexp(1.0f, -9)) == 1.0f);
}

TEST_CASE("narrowing a float takes the float path and agrees with narrowing it as a double", "[tensor][dtype]") {
  std::mt19937 rng(15);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    const double d = f;
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(half(f))));
      CHECK(std::isnan(static_cast<float>(bfloat16(f))));
      continue;
    }
    if (half(f).bits() != half(d).bits()) FAIL("half from float " << f << " differs from half from double");
    if (bfloat16(f).bits() != bfloat16(d).bits()) FAIL("bfloat16 from float " << f << " differs from bfloat16 from double");
  }
}

TEST_CASE("dtypes have one short name and a size, and parse from numpy's names and aliases", "[tensor][dtype]") {
  using ladle::DType;
  CHECK(std::string(ladle::dtype_name(DType::bf16)) == "bf16");
  CHECK(ladle::dtype_size(DType::f16) == 2);
  CHECK(ladle::dtype_size(DType::i64) == 8);
  CHECK(ladle::dtype_of<half> == DType::f16);
  CHECK(ladle::parse_dtype("BFloat16") == DType::bf16);
  CHECK(ladle::parse_dtype("fp32") == DType::f32);
  CHECK(ladle::parse_dtype("half") == DType::f16);
  CHECK(ladle::parse_dtype("u8") == DType::u8);
  CHECK_THROWS_WITH(ladle::parse_dtype("f8"), Catch::Contains("'f8' is not a dtype") && Catch::Contains("bf16/bfloat16"));
}
