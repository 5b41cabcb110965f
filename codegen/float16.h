// fp16 (IEEE binary16) and bf16 conversions and typed element loads/stores for host views,
// both narrowing with round-to-nearest-even. Small on purpose, so that the host half types
// of runtime/half.h can replace it when the branches meet.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "tensor_view.h"

namespace ladle::narrow_float {

constexpr float from_bf16(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

constexpr std::uint16_t to_bf16(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);  // ties to even; overflow -> inf
  return static_cast<std::uint16_t>(rounded >> 16);
}

constexpr float from_f16(std::uint16_t bits) {
  const std::uint32_t sign = std::uint32_t{bits & 0x8000u} << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

constexpr std::uint16_t to_f16(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf, or NaN kept quiet
    return static_cast<std::uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
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

// Rounds a float to the nearest value of a floating element type (f32, f16, bf16).
inline float round_to(ElementType type, float value) {
  switch (type) {
    case ElementType::f16: return from_f16(to_f16(value));
    case ElementType::bf16: return from_bf16(to_bf16(value));
    default: return value;
  }
}

// One element at `p` of a floating element type (f32, f16, bf16, f64), as float.
inline float load(const void* p, ElementType type) {
  switch (type) {
    case ElementType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case ElementType::f16:
    case ElementType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return type == ElementType::f16 ? from_f16(h) : from_bf16(h);
    }
    case ElementType::f64: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
    default: return 0.0f;
  }
}

inline void store(void* p, ElementType type, float value) {
  switch (type) {
    case ElementType::f32: std::memcpy(p, &value, 4); break;
    case ElementType::f16:
    case ElementType::bf16: {
      const std::uint16_t h = type == ElementType::f16 ? to_f16(value) : to_bf16(value);
      std::memcpy(p, &h, 2);
      break;
    }
    case ElementType::f64: {
      const double d = value;
      std::memcpy(p, &d, 8);
      break;
    }
    default: break;
  }
}

}  // namespace ladle::narrow_float
