#include "gla.h"

#include <cmath>

#include <ladle/dsl/dsl.h>

namespace ladle {

namespace {

ir::Variant lower_gla(bool has_g_gamma) {
  constexpr auto g = dsl::token_key("g");
  constexpr auto scale = dsl::scalar("scale");
  const auto state = dsl::scan(dsl::k, dsl::v).decay_k(g);
  if (has_g_gamma) return dsl::lower(dsl::read(state.decay_head(dsl::head_param("g_gamma")), dsl::q, scale), "gla");
  return dsl::lower(dsl::read(state, dsl::q, scale), "gla");
}

VariantInputs named_inputs(const TensorView& q, const TensorView& g, const GlaOptions& options) {
  VariantInputs inputs;
  inputs.tensors.emplace("g", g);
  if (options.g_gamma) inputs.tensors.emplace("g_gamma", *options.g_gamma);
  const float k_dim = q.rank() > 0 && q.shape.back() > 0 ? static_cast<float>(q.shape.back()) : 1.0f;
  inputs.scalars.emplace("scale", options.scale.value_or(1.0f / std::sqrt(k_dim)));
  return inputs;
}

RunOptions run_options(const GlaOptions& options) {
  RunOptions run;
  run.initial_state = options.initial_state;
  run.cu_seqlens = options.cu_seqlens;
  run.reverse = options.reverse;
  run.return_state = options.return_state;
  return run;
}

}  // namespace

const ir::Variant& gla_variant(bool g_gamma) {
  static const ir::Variant plain = lower_gla(false), with_gamma = lower_gla(true);
  return g_gamma ? with_gamma : plain;
}

RecurrentResult gla(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                    const GlaOptions& options) {
  return run_variant(gla_variant(options.g_gamma.has_value()), q, k, v, named_inputs(q, g, options),
                     run_options(options));
}

void gla_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
              const GlaOptions& options, const RecurrentOutputs& outputs) {
  run_variant_into(gla_variant(options.g_gamma.has_value()), q, k, v, named_inputs(q, g, options),
                   run_options(options), outputs);
}

}  // namespace ladle
