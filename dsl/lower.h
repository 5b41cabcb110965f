// Lowering: one DSL recurrence (a read of a scan) -> ir::Variant. This is the only place
// where a DSL expression does work; each slot becomes one expression DAG with identical
// subexpressions shared, and the inputs are listed in order of first use.
#pragma once

#include <string>
#include <utility>

#include "recurrence.h"

namespace ladle::dsl {

namespace lowering {
template <class E>
void slot(ir::Variant& variant, ir::Slot s, const E& e) {
  if constexpr (is_present<E>) {
    ir::ExprBuilder builder(variant);
    e.lower(builder);
    variant.slot(s) = builder.take();
  }
}
}  // namespace lowering

template <class S, class Q, class Scale, bool Normalize, class Form>
ir::Variant lower(const Read<S, Q, Scale, Normalize, Form>& read, std::string name = {}) {
  ir::Variant variant;
  variant.name = std::move(name);
  lowering::slot(variant, ir::Slot::q_feature, read.query());
  lowering::slot(variant, ir::Slot::k_feature, read.state().key());
  lowering::slot(variant, ir::Slot::v, read.state().value());
  lowering::slot(variant, ir::Slot::log_decay_k, read.state().log_decay_k());
  lowering::slot(variant, ir::Slot::log_decay_v, read.state().log_decay_v());
  lowering::slot(variant, ir::Slot::log_decay_head, read.state().log_decay_head());
  lowering::slot(variant, ir::Slot::scale, read.scale());
  lowering::slot(variant, ir::Slot::write_strength, read.state().write_strength());
  lowering::slot(variant, ir::Slot::bonus, read.bonus_weight());
  variant.normalize = Normalize;
  if constexpr (Normalize) variant.normalize_eps = read.eps();
  if constexpr (S::is_delta) variant.update = ir::Update::delta;
  variant.read_before_update = Form::before;
  variant.l2_normalize_qk = Form::l2;
  return variant;
}

// Lowers one elementwise expression alone, as slot `s` of an otherwise empty variant; for
// tests and tools that look at a single expression.
template <expression E>
ir::Variant lower_expression(const E& e, ir::Slot s = ir::Slot::log_decay_k) {
  ir::Variant variant;
  lowering::slot(variant, s, e);
  return variant;
}

}  // namespace ladle::dsl
