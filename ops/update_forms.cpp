#include "update_forms.h"

#include <cmath>

#include <ladle/dsl/dsl.h>
#include <ladle/runtime/error.h>

#include "named_op.h"

namespace ladle {

namespace {

ir::Variant lower_delta_rule(bool gated, bool l2) {
  constexpr auto beta = dsl::token_head("beta");
  constexpr auto scale = dsl::scalar("scale");
  const char* name = gated ? "gated_delta_rule" : "delta_rule";
  const auto plain = dsl::read(dsl::scan(dsl::k, dsl::v).delta(beta), dsl::q, scale);
  const auto with_gate = dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(dsl::token_head("g")).delta(beta), dsl::q, scale);
  if (gated) return l2 ? dsl::lower(with_gate.l2_normalized(), name) : dsl::lower(with_gate, name);
  return l2 ? dsl::lower(plain.l2_normalized(), name) : dsl::lower(plain, name);
}

VariantInputs inputs_of(const TensorView& q, const UpdateFormOptions& options,
                        std::initializer_list<std::pair<const char*, const TensorView*>> tensors) {
  VariantInputs inputs;
  for (const auto& [name, view] : tensors) inputs.tensors.emplace(name, *view);
  inputs.scalars.emplace("scale", ops::default_scale(q, options.scale));
  return inputs;
}

RunOptions run_options(const UpdateFormOptions& options) {
  RunOptions run;
  run.initial_state = options.initial_state;
  run.cu_seqlens = options.cu_seqlens;
  run.reverse = options.reverse;
  run.return_state = options.return_state;
  run.backend = options.backend;
  run.gpu = options.gpu;
  run.algorithm = options.algorithm;
  run.tile = options.tile;
  return run;
}

const ir::Variant& rwkv6_checked(const UpdateFormOptions& options) {
  if (options.use_qk_l2norm_in_kernel)
    throw InvalidArgument("rwkv6: use_qk_l2norm_in_kernel belongs to the delta rules; rwkv6 reads r and k as given");
  return rwkv6_variant();
}

}  // namespace

const ir::Variant& delta_rule_variant(bool gated, bool l2_normalize_qk) {
  static const ir::Variant variants[4] = {lower_delta_rule(false, false), lower_delta_rule(false, true),
                                          lower_delta_rule(true, false), lower_delta_rule(true, true)};
  return variants[(gated ? 2 : 0) + (l2_normalize_qk ? 1 : 0)];
}

const ir::Variant& rwkv6_variant() {
  static const ir::Variant variant = [] {
    constexpr auto w = dsl::token_key("w");
    constexpr auto u = dsl::head_key("u");
    return dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_k(w), dsl::q, dsl::scalar("scale")).bonus(u), "rwkv6");
  }();
  return variant;
}

RecurrentResult delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                           const UpdateFormOptions& options) {
  return run_variant(delta_rule_variant(false, options.use_qk_l2norm_in_kernel), q, k, v, inputs_of(q, options, {{"beta", &beta}}),
                     run_options(options));
}

void delta_rule_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                     const UpdateFormOptions& options, const RecurrentOutputs& outputs) {
  run_variant_into(delta_rule_variant(false, options.use_qk_l2norm_in_kernel), q, k, v, inputs_of(q, options, {{"beta", &beta}}),
                   run_options(options), outputs);
}

RecurrentResult gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                 const TensorView& beta, const UpdateFormOptions& options) {
  return run_variant(delta_rule_variant(true, options.use_qk_l2norm_in_kernel), q, k, v,
                     inputs_of(q, options, {{"g", &g}, {"beta", &beta}}), run_options(options));
}

void gated_delta_rule_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                           const TensorView& beta, const UpdateFormOptions& options, const RecurrentOutputs& outputs) {
  run_variant_into(delta_rule_variant(true, options.use_qk_l2norm_in_kernel), q, k, v,
                   inputs_of(q, options, {{"g", &g}, {"beta", &beta}}), run_options(options), outputs);
}

RecurrentResult rwkv6(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w, const TensorView& u,
                      const UpdateFormOptions& options) {
  return run_variant(rwkv6_checked(options), r, k, v, inputs_of(r, options, {{"w", &w}, {"u", &u}}), run_options(options));
}

void rwkv6_into(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w, const TensorView& u,
                const UpdateFormOptions& options, const RecurrentOutputs& outputs) {
  run_variant_into(rwkv6_checked(options), r, k, v, inputs_of(r, options, {{"w", &w}, {"u", &u}}), run_options(options), outputs);
}

RecurrentForward delta_rule_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                                        const UpdateFormOptions& options) {
  return run_variant_for_backward(delta_rule_variant(false, options.use_qk_l2norm_in_kernel), q, k, v,
                                  inputs_of(q, options, {{"beta", &beta}}), run_options(options));
}

RecurrentForward gated_delta_rule_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                              const TensorView& beta, const UpdateFormOptions& options) {
  return run_variant_for_backward(delta_rule_variant(true, options.use_qk_l2norm_in_kernel), q, k, v,
                                  inputs_of(q, options, {{"g", &g}, {"beta", &beta}}), run_options(options));
}

RecurrentForward rwkv6_for_backward(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w,
                                    const TensorView& u, const UpdateFormOptions& options) {
  return run_variant_for_backward(rwkv6_checked(options), r, k, v, inputs_of(r, options, {{"w", &w}, {"u", &u}}), run_options(options));
}

}  // namespace ladle
