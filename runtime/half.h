// Host-side 16-bit floats: ladle::half (IEEE binary16) and ladle::bfloat16. They are storage
// types for tensors and files: narrowing is explicit and rounds to nearest-even, widening to
// float is implicit and exact, and all arithmetic happens in float.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace ladle {

namespace detail {

// Rounds a double to a 16-bit IEEE-style format (sign, kExponentBits, kMantissaBits) with
// ties to even. Everything narrows from double in one step: narrowing a double through float
// first would round twice and can land on the wrong side of a tie.
template <int kExponentBits, int kMantissaBits>
constexpr std::uint16_t round_to_narrow_float(double value) noexcept {
  static_assert(1 + kExponentBits + kMantissaBits == 16);
  constexpr int exponent_all_ones = (1 << kExponentBits) - 1;
  constexpr int bias = exponent_all_ones >> 1;
  constexpr int min_normal_exponent = 1 - bias;
  constexpr std::uint16_t infinity = exponent_all_ones << kMantissaBits;
  constexpr std::uint16_t quiet_bit = 1u << (kMantissaBits - 1);

  const auto bits = std::bit_cast<std::uint64_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 63) << 15);
  const int exponent_field = static_cast<int>((bits >> 52) & 0x7FF);
  const std::uint64_t mantissa = bits & ((std::uint64_t{1} << 52) - 1);

  if (exponent_field == 0x7FF) {
    if (mantissa == 0) return sign | infinity;
    // Keep the top of the payload but force the quiet bit: dropping the low payload bits
    // alone could leave a zero mantissa, which would turn the NaN into an infinity.
    const auto payload = static_cast<std::uint16_t>(mantissa >> (52 - kMantissaBits));
    return sign | infinity | quiet_bit | payload;
  }
  // Double subnormals are far below half the smallest 16-bit subnormal.
  if (exponent_field == 0) return sign;

  const int exponent = exponent_field - 1023;
  if (exponent > bias) return sign | infinity;

  const std::uint64_t significand = mantissa | (std::uint64_t{1} << 52);
  int shift = 52 - kMantissaBits;
  if (exponent < min_normal_exponent) shift += min_normal_exponent - exponent;
  // The significand is below 2^53, so past this shift it is below half an ulp of zero.
  if (shift > 53) return sign;

  std::uint64_t kept = significand >> shift;
  const std::uint64_t dropped = significand & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t halfway = std::uint64_t{1} << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (kept & 1) != 0)) ++kept;

  // A subnormal's kept bits are its encoding; rounding up into 2^kMantissaBits yields the
  // smallest normal, which is also the right encoding.
  if (exponent < min_normal_exponent) return sign | static_cast<std::uint16_t>(kept);
  // `kept` still carries the implicit bit, hence the -1 on the exponent. A carry out of the
  // mantissa moves into the exponent, and from the largest finite value on to infinity.
  const std::uint64_t biased = static_cast<std::uint64_t>(exponent + bias - 1);
  return sign | static_cast<std::uint16_t>((biased << kMantissaBits) + kept);
}

constexpr float half_bits_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

struct from_bits_tag {};

}  // namespace detail

// IEEE 754 binary16: 5 exponent bits, 10 mantissa bits, largest finite value 65504.
class half {
 public:
  // Trivial, like float, so that large buffers are not written twice; half{} is +0.
  half() = default;

  template <class T>
    requires std::is_arithmetic_v<T>
  constexpr explicit half(T value) noexcept
      : bits_(detail::round_to_narrow_float<5, 10>(static_cast<double>(value))) {}

  constexpr operator float() const noexcept { return detail::half_bits_to_float(bits_); }

  static constexpr half from_bits(std::uint16_t bits) noexcept {
    return half(bits, detail::from_bits_tag{});
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  constexpr half(std::uint16_t bits, detail::from_bits_tag) noexcept : bits_(bits) {}
  std::uint16_t bits_;
};

// bfloat16: the top half of a float32 (8 exponent bits, 7 mantissa bits), same range as float.
class bfloat16 {
 public:
  bfloat16() = default;

  template <class T>
    requires std::is_arithmetic_v<T>
  constexpr explicit bfloat16(T value) noexcept
      : bits_(detail::round_to_narrow_float<8, 7>(static_cast<double>(value))) {}

  constexpr operator float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits_) << 16);
  }

  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    return bfloat16(bits, detail::from_bits_tag{});
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  constexpr bfloat16(std::uint16_t bits, detail::from_bits_tag) noexcept : bits_(bits) {}
  std::uint16_t bits_;
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

namespace detail {

// What numeric_limits says identically for both 16-bit formats.
struct narrow_float_limits_common {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int radix = 2;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
};

}  // namespace detail
}  // namespace ladle

// Generic code (xtensor's printers and reducers among it) asks numeric_limits about element
// types; these answer for the 16-bit formats instead of the all-zero primary template.
template <>
class std::numeric_limits<ladle::half> : public ladle::detail::narrow_float_limits_common {
  using half = ladle::half;

 public:
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr half min() noexcept { return half::from_bits(0x0400); }
  static constexpr half lowest() noexcept { return half::from_bits(0xFBFF); }
  static constexpr half max() noexcept { return half::from_bits(0x7BFF); }
  static constexpr half epsilon() noexcept { return half::from_bits(0x1400); }
  static constexpr half round_error() noexcept { return half::from_bits(0x3800); }
  static constexpr half infinity() noexcept { return half::from_bits(0x7C00); }
  static constexpr half quiet_NaN() noexcept { return half::from_bits(0x7E00); }
  static constexpr half signaling_NaN() noexcept { return half::from_bits(0x7D00); }
  static constexpr half denorm_min() noexcept { return half::from_bits(0x0001); }
};

template <>
class std::numeric_limits<ladle::bfloat16> : public ladle::detail::narrow_float_limits_common {
  using bfloat16 = ladle::bfloat16;

 public:
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bfloat16 min() noexcept { return bfloat16::from_bits(0x0080); }
  static constexpr bfloat16 lowest() noexcept { return bfloat16::from_bits(0xFF7F); }
  static constexpr bfloat16 max() noexcept { return bfloat16::from_bits(0x7F7F); }
  static constexpr bfloat16 epsilon() noexcept { return bfloat16::from_bits(0x3C00); }
  static constexpr bfloat16 round_error() noexcept { return bfloat16::from_bits(0x3F00); }
  static constexpr bfloat16 infinity() noexcept { return bfloat16::from_bits(0x7F80); }
  static constexpr bfloat16 quiet_NaN() noexcept { return bfloat16::from_bits(0x7FC0); }
  static constexpr bfloat16 signaling_NaN() noexcept { return bfloat16::from_bits(0x7FA0); }
  static constexpr bfloat16 denorm_min() noexcept { return bfloat16::from_bits(0x0001); }
};
