#include "variant.h"

#include <cstring>

#include <ladle/runtime/driver.h>

#include "bind.h"
#include "gpu_recurrent.h"

namespace ladle {

namespace {
bool use_gpu(const RunOptions& options) {
  return options.backend == Backend::gpu ||
         (options.backend == Backend::automatic && driver_available());
}


std::string op_name(const ir::Variant& variant) { return variant.name.empty() ? "variant" : variant.name; }
}  // namespace

RecurrentResult run_variant(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                            const TensorView& v, const VariantInputs& inputs, const RunOptions& options) {
  if (use_gpu(options)) return gpu::run_variant(variant, q, k, v, inputs, options);
  const std::string op = op_name(variant);
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  RecurrentResult result{HostTensor(bound.dims.type, bound.dims.output_shape()), std::nullopt};
  RecurrentOutputs outputs{result.o.view(), std::nullopt};
  if (options.return_state) {
    result.final_state.emplace(ElementType::f32, bound.dims.state_shape());
    outputs.final_state = result.final_state->view();
  }
  ops::bind_outputs(op, options, outputs, bound);
  cpu::run_recurrent(variant, bound.args);
  return result;
}

void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                      const RecurrentOutputs& outputs) {
  const std::string op = op_name(variant);
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  ops::bind_outputs(op, options, outputs, bound);
  if (use_gpu(options)) {
    RunOptions with_state = options;
    with_state.return_state = outputs.final_state.has_value();
    const RecurrentResult result = gpu::run_variant(variant, q, k, v, inputs, with_state);
    store_into(result.o, outputs.o);
    if (outputs.final_state) store_into(*result.final_state, *outputs.final_state);
    return;
  }
  cpu::run_recurrent(variant, bound.args);
}

}  // namespace ladle
