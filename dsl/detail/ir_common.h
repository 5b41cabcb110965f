// What the recurrence IR (ir.cpp) and the attention IR (attention_ir.cpp) share: the
// canonical hash encoding, float printing and the operand-order rule of an Expr.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../ir.h"

namespace ladle::ir {

// FNV-1a 64 over a canonical encoding: every field written explicitly, integers
// little-endian, so a value depends on nothing but the content.
class Fnv1a {
 public:
  void byte(std::uint8_t b) {
    state_ ^= b;
    state_ *= 0x100000001b3ull;
  }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void f32(float v) { u32(std::bit_cast<std::uint32_t>(v)); }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    for (char c : s) byte(static_cast<std::uint8_t>(c));
  }
  void inputs(const std::vector<Input>& list) {
    u32(static_cast<std::uint32_t>(list.size()));
    for (const Input& in : list) {
      str(in.name);
      byte(static_cast<std::uint8_t>(in.kind));
      byte(static_cast<std::uint8_t>(in.role));
    }
  }
  void expr(const Expr& e) {
    u32(static_cast<std::uint32_t>(e.nodes.size()));
    for (const Node& n : e.nodes) {
      byte(static_cast<std::uint8_t>(n.op));
      i32(n.a);
      i32(n.b);
      i32(n.input);
      f32(n.op == Op::constant ? n.value : 0.0f);
    }
  }
  std::uint64_t value() const { return state_; }

 private:
  std::uint64_t state_ = 0xcbf29ce484222325ull;
};

inline std::string hex16(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// The shortest decimal that reads back as the same float.
inline std::string shortest(float value) {
  char text[32];
  if (value == static_cast<float>(static_cast<long>(value)) && value > -1e7f && value < 1e7f && !(value == 0 && std::signbit(value))) {
    std::snprintf(text, sizeof text, "%ld", static_cast<long>(value));  // 30, not 3e+01
    return text;
  }
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, static_cast<double>(value));
    if (std::strtof(text, nullptr) == value) break;
  }
  return text;
}

// Node i's operands exist and come before it (leaves have none).
bool operands_valid(const Expr& expr, std::size_t i);

}  // namespace ladle::ir
