#include "recurrent.h"
#include "context_parallel.h"

#include <array>
#include <cmath>

#include <ladle/dsl/dsl.h>
#include <ladle/runtime/error.h>

#include "gla.h"
#include "update_forms.h"

#include "named_op.h"

namespace ladle {

namespace {

// Calls next(decay(state)) or next(state): each set of present gates is its own expression
// type, so the choice made at run time picks one of the instantiations.
template <class State, class Decay, class Next>
ir::Variant optionally(bool on, const State& state, Decay decay, Next next) {
  return on ? next(decay(state)) : next(state);
}

ir::Variant lower_recurrent(bool has_g, bool has_gk, bool has_gv, bool has_g_gamma) {
  constexpr auto g = dsl::token_key("g");
  constexpr auto gk = dsl::token_key("gk");
  constexpr auto gv = dsl::token_value("gv");
  constexpr auto g_gamma = dsl::head_param("g_gamma");
  constexpr auto scale = dsl::scalar("scale");
  return optionally(has_g, dsl::scan(dsl::k, dsl::v), [&](const auto& s) { return s.decay_k(g); }, [&](const auto& s1) {
    return optionally(has_gk, s1, [&](const auto& s) { return s.decay_k(gk); }, [&](const auto& s2) {
      return optionally(has_gv, s2, [&](const auto& s) { return s.decay_v(gv); }, [&](const auto& s3) {
        return optionally(has_g_gamma, s3, [&](const auto& s) { return s.decay_head(g_gamma); }, [&](const auto& s4) {
          return dsl::lower(dsl::read(s4, dsl::q, scale), "recurrent");
        });
      });
    });
  });
}

const ir::Variant& variant_for(const RecurrentOptions& o) {
  return recurrent_variant(o.g.has_value(), o.gk.has_value(), o.gv.has_value(), o.g_gamma.has_value());
}

}  // namespace

const ir::Variant& recurrent_variant(bool g, bool gk, bool gv, bool g_gamma) {
  static const std::array<ir::Variant, 16> variants = [] {
    std::array<ir::Variant, 16> all;
    for (unsigned bits = 0; bits < 16; ++bits) all[bits] = lower_recurrent(bits & 1, bits & 2, bits & 4, bits & 8);
    return all;
  }();
  return variants[(g ? 1 : 0) | (gk ? 2 : 0) | (gv ? 4 : 0) | (g_gamma ? 8 : 0)];
}

const ir::Variant& named_variant(std::string_view op, std::string_view gates) {
  bool g = false, gk = false, gv = false, g_gamma = false, l2norm = false;
  bool in_kernel_gate = false, dt_bias = false, beta_sigmoid = false;  // kda's
  for (std::size_t start = 0; start < gates.size();) {
    std::size_t end = gates.find(',', start);
    if (end == std::string_view::npos) end = gates.size();
    const std::string_view gate = gates.substr(start, end - start);
    if (gate == "g") g = true;
    else if (gate == "gk") gk = true;
    else if (gate == "gv") gv = true;
    else if (gate == "g_gamma") g_gamma = true;
    else if (gate == "l2norm") l2norm = true;
    else if (gate == "gate") in_kernel_gate = true;
    else if (gate == "dt_bias") dt_bias = true;
    else if (gate == "sigmoid") beta_sigmoid = true;
    else if (!gate.empty())
      throw InvalidArgument("named_variant: gate '" + std::string(gate) + "', expected g, gk, gv, g_gamma or l2norm (kda: l2norm, gate, dt_bias, sigmoid)");
    start = end + 1;
  }
  if (op == "kda") {
    if (g || gk || gv || g_gamma)
      throw InvalidArgument("named_variant: kda takes no gates (its g and beta are its own); only l2norm, gate, dt_bias and sigmoid");
    if (dt_bias && !in_kernel_gate) throw InvalidArgument("named_variant: kda's dt_bias belongs to the gate in the kernel (add gate)");
    return kda_variant(in_kernel_gate, dt_bias, beta_sigmoid, l2norm);
  }
  if (in_kernel_gate || dt_bias || beta_sigmoid)
    throw InvalidArgument("named_variant: gate, dt_bias and sigmoid belong to kda");
  if (op == "delta_rule" || op == "gated_delta_rule") {
    if (g || gk || gv || g_gamma)
      throw InvalidArgument("named_variant: " + std::string(op) + " takes no gates (its g and beta are its own); only l2norm");
    return delta_rule_variant(op == "gated_delta_rule", l2norm);
  }
  if (l2norm) throw InvalidArgument("named_variant: l2norm belongs to delta_rule and gated_delta_rule");
  if (op == "rwkv6") {
    if (g || gk || gv || g_gamma) throw InvalidArgument("named_variant: rwkv6 takes no gates (its w and u are its own)");
    return rwkv6_variant();
  }
  if (op == "gla") {
    if (gk || gv) throw InvalidArgument("named_variant: gla takes only g (always) and g_gamma");
    return gla_variant(g_gamma);
  }
  if (op == "recurrent") return recurrent_variant(g, gk, gv, g_gamma);
  throw InvalidArgument("named_variant: op '" + std::string(op) + "', expected gla, recurrent, delta_rule, gated_delta_rule, rwkv6 or kda");
}

RecurrentResult recurrent(const TensorView& q, const TensorView& k, const TensorView& v,
                          const RecurrentOptions& options) {
  return run_variant(variant_for(options), q, k, v, ops::named_inputs(q, options), ops::run_options(options));
}

void recurrent_into(const TensorView& q, const TensorView& k, const TensorView& v,
                    const RecurrentOptions& options, const RecurrentOutputs& outputs) {
  run_variant_into(variant_for(options), q, k, v, ops::named_inputs(q, options), ops::run_options(options), outputs);
}

RecurrentForward recurrent_for_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const RecurrentOptions& options) {
  return run_variant_for_backward(variant_for(options), q, k, v, ops::named_inputs(q, options), ops::run_options(options));
}

namespace ops {

VariantInputs named_inputs(const TensorView& q, const RecurrentOptions& options) {
  VariantInputs inputs;
  if (options.g) inputs.tensors.emplace("g", *options.g);
  if (options.gk) inputs.tensors.emplace("gk", *options.gk);
  if (options.gv) inputs.tensors.emplace("gv", *options.gv);
  if (options.g_gamma) inputs.tensors.emplace("g_gamma", *options.g_gamma);
  inputs.scalars.emplace("scale", default_scale(q, options.scale));
  return inputs;
}

float default_scale(const TensorView& q, std::optional<float> scale) {
  const float k_dim = q.rank() > 0 && q.shape.back() > 0 ? static_cast<float>(q.shape.back()) : 1.0f;
  return scale.value_or(1.0f / std::sqrt(k_dim));
}

RunOptions run_options(const RecurrentOptions& options) {
  RunOptions run;
  run.initial_state = options.initial_state;
  run.cu_seqlens = options.cu_seqlens;
  run.reverse = options.reverse;
  run.return_state = options.return_state;
  run.backend = options.backend;
  run.gpu = options.gpu;
  run.algorithm = options.algorithm;
  run.chunked_tile = options.chunked_tile;
  run.gate_gradients = options.gate_gradients;
  run.chunked_segment_tokens = options.chunked_segment_tokens;
  return run;
}

}  // namespace ops

RecurrentResult context_parallel::recurrent(const TensorView& q, const TensorView& k, const TensorView& v, const RecurrentOptions& options,
                                           Communicator& group) {
  return run_variant(variant_for(options), q, k, v, ops::named_inputs(q, options), ops::run_options(options), group);
}

}  // namespace ladle
