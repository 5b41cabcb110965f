#include "variant.h"

#include <cstring>

#include <ladle/runtime/driver.h>

#include "bind.h"
#include "detail/checks.h"
#include "detail/fingerprint.h"
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

namespace {

std::uint64_t fingerprint(const TensorView& q, const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                          const RunOptions& options) {
  return ops::detail::fingerprint({q, k, v, options.initial_state}, inputs.tensors, inputs.scalars);
}

}  // namespace

RecurrentForward run_variant_for_backward(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                                          const TensorView& v, const VariantInputs& inputs, const RunOptions& options) {
  const std::string op = op_name(variant);
  const ops::detail::Checker check(op);
  if (options.backend == Backend::gpu)
    check.fail("backend = gpu: the GPU backward is not built yet; backend = cpu or automatic runs the forward and backward on the CPU");
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  RecurrentForward out{{HostTensor(bound.dims.type, bound.dims.output_shape()), std::nullopt},
                       {variant, q, k, v, inputs, options, nullptr, fingerprint(q, k, v, inputs, options)}};
  RecurrentOutputs outputs{out.result.o.view(), std::nullopt};
  if (options.return_state) {
    out.result.final_state.emplace(ElementType::f32, bound.dims.state_shape());
    outputs.final_state = out.result.final_state->view();
  }
  ops::bind_outputs(op, options, outputs, bound);
  auto checkpoints = std::make_shared<cpu::RecurrentCheckpoints>();
  const auto& a = bound.args;
  checkpoints->allocate(a.batch, a.tokens, a.cu_seqlens, a.heads, a.key_dim, a.value_dim);
  bound.args.checkpoints = checkpoints.get();
  cpu::run_recurrent(variant, bound.args);
  out.saved.checkpoints = std::move(checkpoints);
  return out;
}

RecurrentGradients run_variant_backward(const RecurrentSaved& saved, const TensorView& d_output,
                                        const std::optional<TensorView>& d_final_state) {
  const ir::Variant& variant = saved.variant;
  const std::string op = op_name(variant) + " backward";
  const ops::detail::Checker check(op);
  if (!saved.checkpoints) check.fail("saved holds no forward (make it with run_variant_for_backward)");
  ops::BoundInputs bound = ops::bind_inputs(op, variant, saved.q, saved.k, saved.v, saved.inputs, saved.options);
  if (fingerprint(saved.q, saved.k, saved.v, saved.inputs, saved.options) != saved.fingerprint)
    check.fail("saved: its tensors no longer hold what its forward read (changed since, or the value belongs to another call)");
  const ops::RecurrentDims& d = bound.dims;
  check.floating("d_output", d_output);
  const std::vector<std::int64_t> out_shape = d.output_shape();
  if (d_output.shape != out_shape)
    check.fail("d_output has shape " + ops::detail::shape_text(d_output.shape) + ", expected the output's shape " +
               std::string(d.packed ? "[T,H,V] = " : "[B,T,H,V] = ") + ops::detail::shape_text(out_shape));
  check.data("d_output", d_output);
  if (d_final_state) {
    check.floating("d_final_state", *d_final_state);
    check.shape("d_final_state", *d_final_state, {{"N", d.N}, {"H", d.H}, {"K", d.K}, {"V", d.V}});
    check.data("d_final_state", *d_final_state);
  }

  RecurrentGradients out{HostTensor(ElementType::f32, saved.q.shape, 0.0f), HostTensor(ElementType::f32, saved.k.shape, 0.0f),
                         HostTensor(ElementType::f32, saved.v.shape, 0.0f), {}, std::nullopt};
  cpu::RecurrentGrads grads;
  grads.d_output = ops::detail::lead_with_ones(d_output, 4);
  grads.d_final_state = d_final_state;
  grads.checkpoints = saved.checkpoints.get();
  grads.d_tensors.resize(variant.inputs.size());
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Input& in = variant.inputs[i];
    if (in.kind == ir::InputKind::scalar) continue;
    HostTensor* target = nullptr;
    if (in.role == ir::Role::query) target = &out.dq;
    else if (in.role == ir::Role::key) target = &out.dk;
    else if (in.role == ir::Role::value) target = &out.dv;
    else target = &out.inputs.emplace(in.name, HostTensor(ElementType::f32, saved.inputs.tensors.at(in.name).shape, 0.0f)).first->second;
    // The canonical view bind_inputs made of the input, over the gradient's memory.
    const int rank = in.kind == ir::InputKind::head ? 2 : in.kind == ir::InputKind::token_head ? 3 : 4;
    TensorView view = ops::detail::lead_with_ones(target->view(), rank);
    if (in.kind == ir::InputKind::head) view.shape[0] = d.B;  // [H] broadcasts over B: its gradient sums over B
    grads.d_tensors[i] = view;
  }
  if (saved.options.initial_state) {
    out.d_initial_state.emplace(ElementType::f32, d.state_shape(), 0.0f);
    grads.d_initial_state = out.d_initial_state->view();
  }
  cpu::run_recurrent_backward(variant, bound.args, grads);
  return out;
}

}  // namespace ladle
