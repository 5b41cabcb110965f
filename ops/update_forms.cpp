#include "update_forms.h"
#include "context_parallel.h"

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

template <class Scan>
ir::Variant finish_kda(const Scan& scan, bool beta_sigmoid, bool l2) {
  constexpr auto beta = dsl::token_head("beta");
  constexpr auto scale = dsl::scalar("scale");
  if (beta_sigmoid) {
    const auto read = dsl::read(scan.delta(dsl::sigmoid(beta)), dsl::q, scale);
    return l2 ? dsl::lower(read.l2_normalized(), "kda") : dsl::lower(read, "kda");
  }
  const auto read = dsl::read(scan.delta(beta), dsl::q, scale);
  return l2 ? dsl::lower(read.l2_normalized(), "kda") : dsl::lower(read, "kda");
}

ir::Variant lower_kda(bool gate_in_kernel, bool dt_bias, bool beta_sigmoid, bool l2) {
  constexpr auto g = dsl::token_key("g");
  const auto scan = dsl::scan(dsl::k, dsl::v);
  const auto decay = -dsl::exp(dsl::head_param("A_log"));
  if (!gate_in_kernel) return finish_kda(scan.decay_k(g), beta_sigmoid, l2);
  if (dt_bias) return finish_kda(scan.decay_k(decay * dsl::softplus(g + dsl::head_key("dt_bias"))), beta_sigmoid, l2);
  return finish_kda(scan.decay_k(decay * dsl::softplus(g)), beta_sigmoid, l2);
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
  run.update_backward = options.update_backward;
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

const ir::Variant& kda_variant(bool gate_in_kernel, bool dt_bias, bool beta_sigmoid, bool l2_normalize_qk) {
  static const std::vector<ir::Variant> variants = [] {
    std::vector<ir::Variant> all;
    for (int bits = 0; bits < 16; ++bits) all.push_back(lower_kda(bits & 8, bits & 4, bits & 2, bits & 1));
    return all;
  }();
  if (dt_bias && !gate_in_kernel) throw InvalidArgument("kda: dt_bias belongs to the gate computed in the kernel (use_gate_in_kernel)");
  return variants[static_cast<std::size_t>((gate_in_kernel ? 8 : 0) + (dt_bias ? 4 : 0) + (beta_sigmoid ? 2 : 0) + (l2_normalize_qk ? 1 : 0))];
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

namespace {

// KDA's expression and inputs for these options, checked: A_log with the gate in the kernel and only then.
std::pair<const ir::Variant*, VariantInputs> kda_call(const TensorView& q, const TensorView& g, const TensorView& beta,
                                                      const KdaOptions& options) {
  if (options.use_gate_in_kernel && !options.A_log)
    throw InvalidArgument("kda: use_gate_in_kernel computes the decay as -exp(A_log) softplus(g + dt_bias): A_log [H] is required");
  if (!options.use_gate_in_kernel && (options.A_log || options.dt_bias))
    throw InvalidArgument(std::string("kda: ") + (options.A_log ? "A_log" : "dt_bias") +
                          " is given but use_gate_in_kernel is off (g is then the log decay itself)");
  const ir::Variant& variant = kda_variant(options.use_gate_in_kernel, options.dt_bias.has_value(), options.use_beta_sigmoid_in_kernel,
                                           options.use_qk_l2norm_in_kernel);
  VariantInputs inputs = inputs_of(q, options, {{"g", &g}, {"beta", &beta}});
  if (options.A_log) inputs.tensors.emplace("A_log", *options.A_log);
  if (options.dt_bias) inputs.tensors.emplace("dt_bias", *options.dt_bias);
  return {&variant, std::move(inputs)};
}

}  // namespace

RecurrentResult kda(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                    const KdaOptions& options) {
  const auto [variant, inputs] = kda_call(q, g, beta, options);
  return run_variant(*variant, q, k, v, inputs, run_options(options));
}

RecurrentForward kda_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                  const TensorView& beta, const KdaOptions& options) {
  const auto [variant, inputs] = kda_call(q, g, beta, options);
  return run_variant_for_backward(*variant, q, k, v, inputs, run_options(options));
}

RecurrentResult context_parallel::delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                                            const UpdateFormOptions& options, Communicator& group) {
  return run_variant(delta_rule_variant(false, options.use_qk_l2norm_in_kernel), q, k, v, inputs_of(q, options, {{"beta", &beta}}),
                     run_options(options), group);
}

RecurrentResult context_parallel::gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                                  const TensorView& beta, const UpdateFormOptions& options, Communicator& group) {
  return run_variant(delta_rule_variant(true, options.use_qk_l2norm_in_kernel), q, k, v, inputs_of(q, options, {{"g", &g}, {"beta", &beta}}),
                     run_options(options), group);
}

RecurrentResult context_parallel::rwkv6(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w, const TensorView& u,
                                       const UpdateFormOptions& options, Communicator& group) {
  return run_variant(rwkv6_checked(options), r, k, v, inputs_of(r, options, {{"w", &w}, {"u", &u}}), run_options(options), group);
}

RecurrentResult context_parallel::kda(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                                     const KdaOptions& options, Communicator& group) {
  const auto [variant, inputs] = kda_call(q, g, beta, options);
  return run_variant(*variant, q, k, v, inputs, run_options(options), group);
}

}  // namespace ladle
