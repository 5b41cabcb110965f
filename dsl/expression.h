// The base of the DSL: elementwise expressions as C++ expression templates, on a CRTP base
// in the xtensor style. Building one allocates nothing and runs nothing; every node knows at
// compile time what it varies over (tokens, heads, key or value features), so mixing axes
// that cannot meet is a compile error rather than a wrong kernel. dsl::lower is where work
// happens.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "ir.h"

namespace ladle::dsl {

template <class D>
class Expression {
 public:
  constexpr const D& derived() const noexcept { return static_cast<const D&>(*this); }
};

template <class T>
concept expression = std::derived_from<T, Expression<T>>;

// A named input. The name must outlive the expression up to lowering (a string literal).
template <ir::InputKind Kind, ir::Role R = ir::Role::other>
class Symbol : public Expression<Symbol<Kind, R>> {
 public:
  static constexpr ir::Extent extent = ir::extent_of(Kind);
  constexpr explicit Symbol(const char* name) : name_(name) {}
  constexpr const char* name() const { return name_; }
  std::int32_t lower(ir::ExprBuilder& b) const { return b.input(name_, Kind, R); }

 private:
  const char* name_;
};

class Constant : public Expression<Constant> {
 public:
  static constexpr ir::Extent extent{};
  constexpr explicit Constant(float value) : value_(value) {}
  constexpr float value() const { return value_; }
  std::int32_t lower(ir::ExprBuilder& b) const { return b.constant(value_); }

 private:
  float value_;
};

// The three inputs every variant has: q [B,T,H,K], k [B,T,H_kv,K], v [B,T,H_kv,V].
inline constexpr Symbol<ir::InputKind::token_key, ir::Role::query> q{"q"};
inline constexpr Symbol<ir::InputKind::token_key, ir::Role::key> k{"k"};
inline constexpr Symbol<ir::InputKind::token_value, ir::Role::value> v{"v"};

// Further inputs, named by the caller; indexed by the query head.
constexpr auto token_key(const char* name) { return Symbol<ir::InputKind::token_key>{name}; }      // [B,T,H,K]
constexpr auto token_value(const char* name) { return Symbol<ir::InputKind::token_value>{name}; }  // [B,T,H,V]
constexpr auto token_head(const char* name) { return Symbol<ir::InputKind::token_head>{name}; }    // [B,T,H]
constexpr auto head_param(const char* name) { return Symbol<ir::InputKind::head>{name}; }          // [H] or [B,H]
constexpr auto head_key(const char* name) { return Symbol<ir::InputKind::head_key>{name}; }        // [H,K] or [B,H,K]
constexpr auto scalar(const char* name) { return Symbol<ir::InputKind::scalar>{name}; }            // a float

// Plain numbers take part in expressions as constants.
template <class T>
concept operand = expression<T> || (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);

template <operand T>
constexpr auto as_expression(const T& x) {
  if constexpr (expression<T>)
    return x;
  else
    return Constant(static_cast<float>(x));
}
template <operand T>
using as_expression_t = decltype(as_expression(std::declval<const T&>()));

// Whether two expressions may meet in one elementwise operation: at most one feature axis.
template <class A, class B>
inline constexpr bool can_combine = ir::join(A::extent, B::extent).feature != ir::Feature::both;

}  // namespace ladle::dsl
