#include "gla.h"
#include "context_parallel.h"

#include <ladle/dsl/dsl.h>

#include "named_op.h"

namespace ladle {

namespace {

ir::Variant lower_gla(bool has_g_gamma) {
  constexpr auto g = dsl::token_key("g");
  constexpr auto scale = dsl::scalar("scale");
  const auto state = dsl::scan(dsl::k, dsl::v).decay_k(g);
  if (has_g_gamma) return dsl::lower(dsl::read(state.decay_head(dsl::head_param("g_gamma")), dsl::q, scale), "gla");
  return dsl::lower(dsl::read(state, dsl::q, scale), "gla");
}

RecurrentOptions as_recurrent(const TensorView& g, const GlaOptions& options) {
  RecurrentOptions o;
  o.g = g;
  o.g_gamma = options.g_gamma;
  o.scale = options.scale;
  o.initial_state = options.initial_state;
  o.reverse = options.reverse;
  o.cu_seqlens = options.cu_seqlens;
  o.return_state = options.return_state;
  o.backend = options.backend;
  o.gpu = options.gpu;
  o.algorithm = options.algorithm;
  o.chunked_tile = options.chunked_tile;
  o.gate_gradients = options.gate_gradients;
  return o;
}

}  // namespace

const ir::Variant& gla_variant(bool g_gamma) {
  static const ir::Variant plain = lower_gla(false), with_gamma = lower_gla(true);
  return g_gamma ? with_gamma : plain;
}

RecurrentResult gla(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                    const GlaOptions& options) {
  const RecurrentOptions o = as_recurrent(g, options);
  return run_variant(gla_variant(options.g_gamma.has_value()), q, k, v, ops::named_inputs(q, o), ops::run_options(o));
}

void gla_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
              const GlaOptions& options, const RecurrentOutputs& outputs) {
  const RecurrentOptions o = as_recurrent(g, options);
  run_variant_into(gla_variant(options.g_gamma.has_value()), q, k, v, ops::named_inputs(q, o), ops::run_options(o), outputs);
}

RecurrentForward gla_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                  const GlaOptions& options) {
  const RecurrentOptions o = as_recurrent(g, options);
  return run_variant_for_backward(gla_variant(options.g_gamma.has_value()), q, k, v, ops::named_inputs(q, o), ops::run_options(o));
}

RecurrentResult context_parallel::gla(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                     const GlaOptions& options, Communicator& group) {
  const RecurrentOptions o = as_recurrent(g, options);
  return run_variant(gla_variant(options.g_gamma.has_value()), q, k, v, ops::named_inputs(q, o), ops::run_options(o), group);
}

}  // namespace ladle
