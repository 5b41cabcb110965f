// The element types of ladle's tensors, in one place: the DType enum every layer uses, and
// the host 16-bit floats ladle::half (IEEE binary16) and ladle::bfloat16. The 16-bit types
// are storage types: narrowing is explicit and rounds to nearest-even (in one step, from
// double or from float), widening to float is implicit and exact, arithmetic is in float.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>

namespace ladle {

// The order is fixed: tensors, DLPack and .npy map to it by value.
enum class DType : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8 };

// "f32", "f16", "bf16", "f64", "i32", "i64", "u8": what messages, kernel names and keys say.
constexpr const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType dtype) { return dtype <= DType::f64; }

// Case-insensitive: the short names above, numpy's ("float32", "bfloat16", "int64", "uint8")
// and the usual aliases ("fp32", "float", "fp16", "half", "double", "int"). Throws
// InvalidArgument listing every accepted name.
DType parse_dtype(std::string_view name);

namespace detail {

[[noreturn]] void throw_unknown_dtype(int value);

// Rounds a double to a 16-bit IEEE-style format (sign, kExponentBits, kMantissaBits) with
// ties to even. A double narrows in one step: through float first would round twice and can
// land on the wrong side of a tie.
template <int kExponentBits, int kMantissaBits>
constexpr std::uint16_t round_double_to_narrow(double value) noexcept {
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

// The same roundings from float, in float's bits: the CPU path narrows every element it
// stores, and a float is exact in double, so the result is the one above (NaNs stay quiet NaNs).
constexpr std::uint16_t round_float_to_bf16(float value) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);  // ties to even; overflow -> inf
  return static_cast<std::uint16_t>(rounded >> 16);
}

constexpr std::uint16_t round_float_to_half(float value) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
  if (magnitude > 0x7f800000u)  // NaN: the top of the payload, quiet
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (magnitude >= 0x38800000u) {  // normal: rebias the exponent, round off 13 mantissa bits
    const std::uint32_t rebased = magnitude - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13));
  }
  const std::uint32_t exponent = magnitude >> 23;  // subnormal half: round(value / 2^-24)
  if (exponent < 101) return static_cast<std::uint16_t>(sign);
  const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126 - exponent;
  std::uint32_t kept = significand >> shift;
  const std::uint32_t dropped = significand & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (kept & 1u))) ++kept;
  return static_cast<std::uint16_t>(sign | kept);
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

  constexpr explicit half(float value) noexcept : bits_(detail::round_float_to_half(value)) {}
  template <class T>
    requires std::is_arithmetic_v<T> && (!std::same_as<T, float>)
  constexpr explicit half(T value) noexcept
      : bits_(detail::round_double_to_narrow<5, 10>(static_cast<double>(value))) {}

  constexpr operator float() const noexcept { return detail::half_bits_to_float(bits_); }

  static constexpr half from_bits(std::uint16_t bits) noexcept { return half(bits, detail::from_bits_tag{}); }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  constexpr half(std::uint16_t bits, detail::from_bits_tag) noexcept : bits_(bits) {}
  std::uint16_t bits_;
};

// bfloat16: the top half of a float32 (8 exponent bits, 7 mantissa bits), same range as float.
class bfloat16 {
 public:
  bfloat16() = default;

  constexpr explicit bfloat16(float value) noexcept : bits_(detail::round_float_to_bf16(value)) {}
  template <class T>
    requires std::is_arithmetic_v<T> && (!std::same_as<T, float>)
  constexpr explicit bfloat16(T value) noexcept
      : bits_(detail::round_double_to_narrow<8, 7>(static_cast<double>(value))) {}

  constexpr operator float() const noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(bits_) << 16); }

  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept { return bfloat16(bits, detail::from_bits_tag{}); }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  constexpr bfloat16(std::uint16_t bits, detail::from_bits_tag) noexcept : bits_(bits) {}
  std::uint16_t bits_;
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

template <class T>
concept TensorElement = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16> ||
                        std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                        std::same_as<T, std::int64_t> || std::same_as<T, std::uint8_t>;

template <TensorElement T>
inline constexpr DType dtype_of = std::same_as<T, float>          ? DType::f32
                                  : std::same_as<T, half>         ? DType::f16
                                  : std::same_as<T, bfloat16>     ? DType::bf16
                                  : std::same_as<T, double>       ? DType::f64
                                  : std::same_as<T, std::int32_t> ? DType::i32
                                  : std::same_as<T, std::int64_t> ? DType::i64
                                                                  : DType::u8;

// Runs f(std::type_identity<T>{}) for the element type T of dtype, so that code is written
// once for every dtype: visit_dtype(dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... }).
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(std::type_identity<float>{});
    case DType::f16: return f(std::type_identity<half>{});
    case DType::bf16: return f(std::type_identity<bfloat16>{});
    case DType::f64: return f(std::type_identity<double>{});
    case DType::i32: return f(std::type_identity<std::int32_t>{});
    case DType::i64: return f(std::type_identity<std::int64_t>{});
    case DType::u8: return f(std::type_identity<std::uint8_t>{});
  }
  detail::throw_unknown_dtype(static_cast<int>(dtype));
}

// Rounds a float to the nearest value of a floating dtype (f32 and f64 keep it).
constexpr float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f16: return half(value);
    case DType::bf16: return bfloat16(value);
    default: return value;
  }
}

// One element at host address `p` of a floating dtype (f32, f16, bf16, f64), as float; 0 for
// an integer dtype.
inline float load_float(const void* p, DType dtype) {
  switch (dtype) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::f16:
    case DType::bf16: {
      std::uint16_t bits;
      std::memcpy(&bits, p, 2);
      return dtype == DType::f16 ? float(half::from_bits(bits)) : float(bfloat16::from_bits(bits));
    }
    case DType::f64: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
    default: return 0.0f;
  }
}

// Stores value, rounded to nearest-even, as one element of a floating dtype at host address `p`.
inline void store_float(void* p, DType dtype, float value) {
  switch (dtype) {
    case DType::f32: std::memcpy(p, &value, 4); break;
    case DType::f16:
    case DType::bf16: {
      const std::uint16_t bits = dtype == DType::f16 ? half(value).bits() : bfloat16(value).bits();
      std::memcpy(p, &bits, 2);
      break;
    }
    case DType::f64: {
      const double d = value;
      std::memcpy(p, &d, 8);
      break;
    }
    default: break;
  }
}

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
