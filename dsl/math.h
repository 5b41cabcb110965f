// Elementwise math on DSL expressions: + - * /, exp, log, sigmoid, logsigmoid, softplus,
// tanh, elu, relu, silu, min/max and powers. Operands broadcast over tokens, heads and
// features (a per-head parameter divides a per-token gate); the key and value feature
// axes never meet. Everything is evaluated per element inside the kernel, so gate
// preprocessing written here (logsigmoid(x) / 16) costs no pass over memory.
#pragma once

#include "expression.h"

namespace ladle::dsl {

template <ir::Op O, expression A>
class Unary : public Expression<Unary<O, A>> {
 public:
  static constexpr ir::Extent extent = A::extent;
  constexpr explicit Unary(const A& a) : a_(a) {}
  std::int32_t lower(ir::ExprBuilder& b) const { return b.unary(O, a_.lower(b)); }

 private:
  A a_;
};

template <ir::Op O, expression A, expression B>
class Binary : public Expression<Binary<O, A, B>> {
  // The key features and the value features are different axes of the state [K,V]: an
  // elementwise result over both would be a [K,V] matrix per token, which no slot holds.
  static_assert(can_combine<A, B>,
                "ladle::dsl: cannot combine an expression over the key features [..,K] with one "
                "over the value features [..,V]");

 public:
  static constexpr ir::Extent extent = ir::join(A::extent, B::extent);
  constexpr Binary(const A& a, const B& b) : a_(a), b_(b) {}
  std::int32_t lower(ir::ExprBuilder& b) const {
    const std::int32_t lhs = a_.lower(b);
    return b.binary(O, lhs, b_.lower(b));
  }

 private:
  A a_;
  B b_;
};

// At least one side is a DSL expression; the other may be a plain number.
template <class A, class B>
concept binary_operands = (expression<A> || expression<B>) && operand<A> && operand<B>;

template <ir::Op O, class A, class B>
using binary_t = Binary<O, as_expression_t<A>, as_expression_t<B>>;

#define LADLE_DSL_UNARY(name, op)                             \
  template <expression A>                                     \
  constexpr Unary<ir::Op::op, A> name(const A& a) {           \
    return Unary<ir::Op::op, A>(a);                           \
  }
#define LADLE_DSL_BINARY(name, op)                                                 \
  template <class A, class B>                                                      \
    requires binary_operands<A, B>                                                 \
  constexpr binary_t<ir::Op::op, A, B> name(const A& a, const B& b) {              \
    return binary_t<ir::Op::op, A, B>(as_expression(a), as_expression(b));         \
  }

LADLE_DSL_UNARY(operator-, neg)
LADLE_DSL_UNARY(abs, abs)
LADLE_DSL_UNARY(exp, exp)
LADLE_DSL_UNARY(log, log)
LADLE_DSL_UNARY(sqrt, sqrt)
LADLE_DSL_UNARY(sigmoid, sigmoid)
LADLE_DSL_UNARY(logsigmoid, logsigmoid)  // log(sigmoid(x)), without overflow for large |x|
LADLE_DSL_UNARY(softplus, softplus)      // log(1 + exp(x)), without overflow for large |x|
LADLE_DSL_UNARY(tanh, tanh)
LADLE_DSL_UNARY(elu, elu)                // x > 0 ? x : exp(x) - 1
LADLE_DSL_UNARY(relu, relu)
LADLE_DSL_UNARY(silu, silu)              // x * sigmoid(x)

LADLE_DSL_BINARY(operator+, add)
LADLE_DSL_BINARY(operator-, sub)
LADLE_DSL_BINARY(operator*, mul)
LADLE_DSL_BINARY(operator/, div)
LADLE_DSL_BINARY(min, min)
LADLE_DSL_BINARY(max, max)
LADLE_DSL_BINARY(pow, pow)

#undef LADLE_DSL_UNARY
#undef LADLE_DSL_BINARY

}  // namespace ladle::dsl
