// The primitives of a softmax-attention variant:
//   score                     q_i . k_j, the raw dot product of a query and a key
//   query_index, key_index    i and j, counted from the start of their sequence
//   head_index, batch_index   h (the query head) and b (the sequence)
//   pair("bias")              a [B,H,Tq,Tk] input (B and H broadcastable) read at (b,h,i,j)
//   softmax(logit)            the attention of the logit expression, then
//     .causal()               keep j <= i + (Tk - Tq)
//     .sliding_window()       keep the run-time window (left, right) around that diagonal
//     .segment_ids()          keep q_segment_ids[i] == kv_segment_ids[j]
//     .mask(predicate)        keep where the predicate (an expression, != 0) holds; twice: both
//     .sinks()                softmax_aux [H,S] logits join the denominator
//     .dropout()              dropout on p with a run-time rate and seed
// Scores are ordinary expressions: softmax(soft_cap(score * scalar("scale") + pair("bias"), 30.f))
// or an ALiBi slope: softmax(score * scale - head_param("slope") * (query_index - key_index)).
// Comparisons (< <= > >= == !=) and logic (&& || !) give 1 or 0, for masks.
// Building an expression does no work; dsl::lower(softmax(...)) is where it happens.
#pragma once

#include <string>
#include <utility>

#include "attention_ir.h"
#include "math.h"
#include "recurrence.h"

namespace ladle::dsl {

template <ir::Op O>
class Leaf : public Expression<Leaf<O>> {
 public:
  static constexpr ir::Extent extent{true, true, ir::Feature::none};
  std::int32_t lower(ir::ExprBuilder& b) const { return b.leaf(O); }
};

inline constexpr Leaf<ir::Op::score> score{};
inline constexpr Leaf<ir::Op::query_index> query_index{};
inline constexpr Leaf<ir::Op::key_index> key_index{};
inline constexpr Leaf<ir::Op::head_index> head_index{};
inline constexpr Leaf<ir::Op::batch_index> batch_index{};

constexpr auto pair(const char* name) { return Symbol<ir::InputKind::pair>{name}; }  // [B,H,Tq,Tk]

#define LADLE_DSL_BINARY(name, op)                                         \
  template <class A, class B>                                              \
    requires binary_operands<A, B>                                         \
  constexpr binary_t<ir::Op::op, A, B> name(const A& a, const B& b) {      \
    return binary_t<ir::Op::op, A, B>(as_expression(a), as_expression(b)); \
  }
LADLE_DSL_BINARY(operator<, less)
LADLE_DSL_BINARY(operator<=, less_equal)
LADLE_DSL_BINARY(operator==, equal)
LADLE_DSL_BINARY(operator!=, not_equal)
LADLE_DSL_BINARY(operator&&, logical_and)
LADLE_DSL_BINARY(operator||, logical_or)
#undef LADLE_DSL_BINARY

template <class A, class B>
  requires binary_operands<A, B>
constexpr auto operator>(const A& a, const B& b) {
  return binary_t<ir::Op::less, B, A>(as_expression(b), as_expression(a));
}
template <class A, class B>
  requires binary_operands<A, B>
constexpr auto operator>=(const A& a, const B& b) {
  return binary_t<ir::Op::less_equal, B, A>(as_expression(b), as_expression(a));
}
template <expression A>
constexpr Unary<ir::Op::logical_not, A> operator!(const A& a) {
  return Unary<ir::Op::logical_not, A>(a);
}

// cap * tanh(x / cap): logits bounded by cap, as Gemma-2 and Grok do.
template <expression X, operand C>
constexpr auto soft_cap(const X& x, const C& cap) {
  return as_expression(cap) * tanh(x / as_expression(cap));
}

// The structured masks and extras of a softmax, known to the kernel by flag.
struct SoftmaxFlags {
  bool causal = false, window = false, segment_ids = false, sinks = false, dropout = false;
};

template <class Logit, class Keep = None>
class Softmax {
  static_assert(Logit::extent.feature == ir::Feature::none,
                "softmax(logit): the logit is one number per (query, key) pair; it must not vary over "
                "features (q_i . k_j is dsl::score)");
  static_assert(!is_present<Keep> || Keep::extent.feature == ir::Feature::none,
                "mask(predicate): the predicate is one number per (query, key) pair");

 public:
  using Flags = SoftmaxFlags;

  constexpr Softmax(const Logit& logit, const Keep& keep = {}, Flags flags = {})
      : logit_(logit), keep_(keep), flags_(flags) {}

  constexpr Softmax causal() const { return with(&Flags::causal); }
  constexpr Softmax sliding_window() const { return with(&Flags::window); }
  constexpr Softmax segment_ids() const { return with(&Flags::segment_ids); }
  constexpr Softmax sinks() const { return with(&Flags::sinks); }
  constexpr Softmax dropout() const { return with(&Flags::dropout); }
  template <expression P>
  constexpr auto mask(const P& predicate) const {
    if constexpr (is_present<Keep>) {
      const auto both = keep_ && predicate;
      return Softmax<Logit, std::remove_cvref_t<decltype(both)>>(logit_, both, flags_);
    } else {
      return Softmax<Logit, P>(logit_, predicate, flags_);
    }
  }

  constexpr const Logit& logit() const { return logit_; }
  constexpr const Keep& keep() const { return keep_; }
  constexpr const Flags& flags() const { return flags_; }

 private:
  constexpr Softmax with(bool Flags::*flag) const {
    Flags f = flags_;
    f.*flag = true;
    return {logit_, keep_, f};
  }

  Logit logit_;
  Keep keep_;
  Flags flags_;
};

template <operand L>
constexpr Softmax<as_expression_t<L>> softmax(const L& logit) {
  return Softmax<as_expression_t<L>>(as_expression(logit));
}

template <class L, class K>
ir::AttentionVariant lower(const Softmax<L, K>& attention, std::string name = {}) {
  ir::AttentionVariant variant;
  variant.name = std::move(name);
  {
    ir::ExprBuilder inputs(variant.inputs);  // q, k, v come first, whatever the score reads
    inputs.input(q.name(), ir::InputKind::token_key, ir::Role::query);
    inputs.input(k.name(), ir::InputKind::token_key, ir::Role::key);
    inputs.input(v.name(), ir::InputKind::token_value, ir::Role::value);
  }
  ir::ExprBuilder logit(variant.inputs);
  attention.logit().lower(logit);
  variant.score = logit.take();
  if constexpr (is_present<K>) {
    ir::ExprBuilder keep(variant.inputs);
    attention.keep().lower(keep);
    variant.keep = keep.take();
  }
  const auto& f = attention.flags();
  variant.causal = f.causal;
  variant.window = f.window;
  variant.segment_ids = f.segment_ids;
  variant.sinks = f.sinks;
  variant.dropout = f.dropout;
  return variant;
}

}  // namespace ladle::dsl
