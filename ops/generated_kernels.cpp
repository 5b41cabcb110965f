#include "generated_kernels.h"

#include <fmt/format.h>
#include <ladle/codegen/cuda/chunked_delta.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include <cstddef>
#include <future>
#include <numeric>

#include "attention_bind.h"
#include "bind.h"
#include "gpu_backward.h"
#include "detail/loaded_kernel.h"
#include "gpu_attention.h"
#include "gpu_attention_backward.h"
#include "chunked_plan.h"
#include "gpu_recurrent.h"

namespace ladle {
namespace {

// What every view points at: an address aligned as a fresh allocation's. The plan reads shapes,
// strides and alignment, never the data (cu_seqlens excepted: those are real, below).
alignas(256) const std::byte placeholder[256] = {};

TensorView view_of(DType type, std::vector<std::int64_t> shape) {
  TensorView view;
  view.data = const_cast<std::byte*>(placeholder);
  view.type = type;
  view.strides.assign(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
    view.strides[d] = view.strides[d + 1] * shape[d + 1];
  view.shape = std::move(shape);
  return view;
}

gpu::GpuTarget plan_target(const std::string& arch) {
  if (!arch.empty()) return gpu::named_target(arch);
  if (driver_available()) return gpu::device_target();
  return gpu::named_target(default_ptx_arch());
}

std::string name_of(const ir::Variant& variant) {
  return variant.name.empty() ? "variant" : variant.name;
}

// The packed sequences' offsets [N+1] (i64), or an empty tensor.
Tensor offsets_of(const CallShape& shape) {
  if (shape.sequence_lengths.empty()) return Tensor();
  Tensor offsets(DType::i64, {static_cast<std::int64_t>(shape.sequence_lengths.size()) + 1});
  auto* out = static_cast<std::int64_t*>(offsets.data());
  out[0] = 0;
  std::partial_sum(shape.sequence_lengths.begin(), shape.sequence_lengths.end(), out + 1);
  return offsets;
}

DType input_type(const CallShape& shape, const std::string& name, DType otherwise) {
  const auto found = shape.input_types.find(name);
  return found != shape.input_types.end() ? found->second : otherwise;
}

float scalar_of(const CallShape& shape, const std::string& name) {
  const auto found = shape.scalars.find(name);
  return found != shape.scalars.end() ? found->second : 1.0f;
}

}  // namespace

namespace {

// A recurrent call of this shape as views without memory: q, k, v, the variant's inputs and the
// options with the packed sequences' offsets (kept here) and the initial state.
struct ShapedCall {
  TensorView q, k, v;
  VariantInputs inputs;
  Tensor offsets;
  RunOptions call;
};
ShapedCall shaped_call(const ir::Variant& variant, const CallShape& shape, const RunOptions& options) {
  const std::int64_t B = shape.batch, T = shape.tokens, H = shape.heads,
                     Hkv = shape.kv_heads > 0 ? shape.kv_heads : shape.heads;
  const std::int64_t K = shape.key_dim, V = shape.value_dim;
  const TensorView q = view_of(shape.type, {B, T, H, K}), k = view_of(shape.type, {B, T, Hkv, K}),
                   v = view_of(shape.type, {B, T, Hkv, V});
  VariantInputs inputs;
  for (const ir::Input& input : variant.inputs) {
    if (input.role != ir::Role::other) continue;
    const DType type = input_type(shape, input.name, shape.type);
    switch (input.kind) {
      case ir::InputKind::scalar:
        inputs.scalars.emplace(input.name, scalar_of(shape, input.name));
        break;
      case ir::InputKind::token_key:
        inputs.tensors.emplace(input.name, view_of(type, {B, T, H, K}));
        break;
      case ir::InputKind::token_value:
        inputs.tensors.emplace(input.name, view_of(type, {B, T, H, V}));
        break;
      case ir::InputKind::token_head:
        inputs.tensors.emplace(input.name, view_of(type, {B, T, H}));
        break;
      case ir::InputKind::head:
        inputs.tensors.emplace(input.name, view_of(type, {H}));
        break;
      case ir::InputKind::head_key:
        inputs.tensors.emplace(input.name, view_of(type, {H, K}));
        break;
      case ir::InputKind::pair:
        throw InvalidArgument(fmt::format(
            "generated_kernels: {} is a pair input [B,H,Tq,Tk], which only attention variants read",
            input.name));
    }
  }
  Tensor offsets = offsets_of(shape);
  RunOptions call = options;
  call.cu_seqlens.reset();
  call.initial_state.reset();
  if (!shape.sequence_lengths.empty()) call.cu_seqlens = offsets.view();
  const std::int64_t N =
      shape.sequence_lengths.empty() ? B : static_cast<std::int64_t>(shape.sequence_lengths.size());
  if (shape.initial_state) call.initial_state = view_of(DType::f32, {N, H, K, V});
  return {q, k, v, std::move(inputs), std::move(offsets), std::move(call)};
}

}  // namespace

std::vector<GeneratedKernel> generated_kernels(const ir::Variant& variant, const CallShape& shape,
                                               const RunOptions& options, const std::string& arch) {
  const ShapedCall c = shaped_call(variant, shape, options);
  const ops::BoundInputs bound = ops::bind_inputs(name_of(variant), variant, c.q, c.k, c.v, c.inputs, c.call);
  return generated_kernels(variant, bound, c.call, arch);
}

std::vector<GeneratedKernel> generated_backward_kernels(const ir::Variant& variant, const CallShape& shape, const RunOptions& options,
                                                        const std::string& arch) {
  const ShapedCall c = shaped_call(variant, shape, options);
  const TensorView d_output = view_of(shape.type, {shape.batch, shape.tokens, shape.heads, shape.value_dim});
  std::optional<TensorView> d_final_state;
  if (options.return_state) {
    const std::int64_t N = shape.sequence_lengths.empty() ? shape.batch : static_cast<std::int64_t>(shape.sequence_lengths.size());
    d_final_state = view_of(DType::f32, {N, shape.heads, shape.key_dim, shape.value_dim});
  }
  RunOptions call = c.call;
  call.return_state = false;  // the backward takes d_final_state instead
  return gpu::backward_planned_kernels(variant, c.q, c.k, c.v, c.inputs, call, d_output, d_final_state,
                                       arch.empty() ? default_ptx_arch() : arch);
}

std::vector<GeneratedKernel> generated_kernels(const ir::Variant& variant, const ops::BoundInputs& bound,
                                               const RunOptions& call, const std::string& arch) {
  const gpu::GpuTarget target = plan_target(arch);
  std::vector<GeneratedKernel> out;
  const Algorithm algorithm = gpu::choose_algorithm(variant, bound, call);
  if (algorithm == Algorithm::chunked && variant.update == ir::Update::delta) {
    for (const gpu::ChunkedDeltaLaunch& each : gpu::plan_chunked_delta(variant, bound, call).launches) {
      const cuda::ChunkedDeltaSpec& spec = each.spec;
      cuda::ChunkedDeltaKernel kernel = cuda::generate_chunked_delta(variant, spec);
      const char* phase = spec.phase == cuda::ChunkedDeltaPhase::prepare ? "prepare" : spec.phase == cuda::ChunkedDeltaPhase::states ? "states" : "outputs";
      out.push_back({kernel.name, std::move(kernel.source), std::string("delta ") + phase,
                     fmt::format("chunk {} block_k={} value_pad={}", cuda::chunked_delta_chunk,
                                 spec.block_k, spec.value_pad),
                     kernel.threads, kernel.shared_bytes});
    }
  } else if (algorithm == Algorithm::chunked) {
    // The launcher's plan: the segments by shape, the tile for that many (segments of) sequences.
    for (const gpu::ChunkedLaunch& each : gpu::plan_chunked(variant, bound, call, target).launches) {
      cuda::ChunkedKernel kernel = cuda::generate_chunked(variant, each.spec);
      out.push_back(
          {kernel.name, std::move(kernel.source),
           std::string(each.spec.segmented ? "segmented " : "chunked ") + cuda::to_string(each.spec.phase),
           cuda::to_string(each.spec.tile), kernel.threads, kernel.shared_bytes});
    }
  } else {
    const cuda::RecurrentKernelSpec spec = gpu::kernel_spec(variant, bound, call, target);
    cuda::RecurrentKernel kernel = cuda::generate_recurrent(variant, spec);
    out.push_back({kernel.name, std::move(kernel.source), "recurrent", cuda::to_string(spec.tile),
                   kernel.threads, 0});
  }
  return out;
}

std::vector<GeneratedKernel> generated_kernels(const ir::AttentionVariant& variant,
                                               const CallShape& shape,
                                               const AttentionRunOptions& options,
                                               const std::string& arch,
                                               const std::optional<cuda::AttentionTile>& tile) {
  const std::int64_t B = shape.batch, Tq = shape.tokens,
                     Tk = shape.key_tokens > 0 ? shape.key_tokens : shape.tokens;
  const std::int64_t H = shape.heads, Hkv = shape.kv_heads > 0 ? shape.kv_heads : shape.heads;
  const TensorView q = view_of(shape.type, {B, Tq, H, shape.key_dim}),
                   k = view_of(shape.type, {B, Tk, Hkv, shape.key_dim}),
                   v = view_of(shape.type, {B, Tk, Hkv, shape.value_dim});
  VariantInputs inputs;
  for (const ir::Input& input : variant.inputs) {
    if (input.role != ir::Role::other) continue;
    const DType type =
        input_type(shape, input.name, input.name == "attention_mask" ? DType::u8 : DType::f32);
    if (input.kind == ir::InputKind::scalar)
      inputs.scalars.emplace(input.name, scalar_of(shape, input.name));
    else if (input.kind == ir::InputKind::pair)
      inputs.tensors.emplace(input.name, view_of(type, {B, H, Tq, Tk}));
    else
      inputs.tensors.emplace(input.name, view_of(type, {H}));
  }
  AttentionRunOptions call = options;
  call.q_segment_ids.reset(), call.kv_segment_ids.reset(), call.softmax_aux.reset(),
      call.cu_seqlens_q.reset(), call.cu_seqlens_k.reset();
  if (variant.segment_ids)
    call.q_segment_ids = view_of(DType::i32, {B, Tq}),
    call.kv_segment_ids = view_of(DType::i32, {B, Tk});
  if (variant.sinks) call.softmax_aux = view_of(DType::f32, {H, 1});
  const Tensor offsets = offsets_of(shape);
  if (!shape.sequence_lengths.empty()) call.cu_seqlens_q = call.cu_seqlens_k = offsets.view();
  const ops::AttentionArgs args = ops::bind_attention(
      variant.name.empty() ? "attention" : variant.name, variant, q, k, v, inputs, call);
  // The launcher's plan: one program (a decode plan's merge kernel is in the same source).
  const gpu::AttentionPlan plan = gpu::plan_attention(variant, args, tile, plan_target(arch));
  cuda::AttentionKernel kernel = cuda::generate_attention(variant, plan.spec);
  std::vector<GeneratedKernel> out;
  out.push_back({kernel.name, std::move(kernel.source), plan.form == gpu::AttentionPlan::Form::tiles ? std::string("attention") : std::string("attention ") + gpu::to_string(plan.form),
                 cuda::to_string(plan.spec.tile), kernel.threads, kernel.shared_bytes});
  return out;
}

std::vector<GeneratedKernel> generated_backward_kernels(const ir::AttentionVariant& variant, const CallShape& shape,
                                                        const AttentionRunOptions& options, const std::string& arch) {
  const std::string op = (variant.name.empty() ? std::string("attention") : variant.name) + " backward";
  const std::int64_t B = shape.batch, Tq = shape.tokens, Tk = shape.key_tokens > 0 ? shape.key_tokens : shape.tokens;
  const std::int64_t H = shape.heads, Hkv = shape.kv_heads > 0 ? shape.kv_heads : shape.heads;
  const TensorView q = view_of(shape.type, {B, Tq, H, shape.key_dim}), k = view_of(shape.type, {B, Tk, Hkv, shape.key_dim}),
                   v = view_of(shape.type, {B, Tk, Hkv, shape.value_dim});
  VariantInputs inputs;
  for (const ir::Input& input : variant.inputs) {
    if (input.role != ir::Role::other) continue;
    const DType type = input_type(shape, input.name, input.name == "attention_mask" ? DType::u8 : DType::f32);
    if (input.kind == ir::InputKind::scalar) inputs.scalars.emplace(input.name, scalar_of(shape, input.name));
    else if (input.kind == ir::InputKind::pair) inputs.tensors.emplace(input.name, view_of(type, {B, H, Tq, Tk}));
    else inputs.tensors.emplace(input.name, view_of(type, {H}));
  }
  AttentionRunOptions call = options;
  call.q_segment_ids.reset(), call.kv_segment_ids.reset(), call.softmax_aux.reset(), call.cu_seqlens_q.reset(), call.cu_seqlens_k.reset();
  if (variant.segment_ids) call.q_segment_ids = view_of(DType::i32, {B, Tq}), call.kv_segment_ids = view_of(DType::i32, {B, Tk});
  if (variant.sinks) call.softmax_aux = view_of(DType::f32, {H, 1});
  const Tensor offsets = offsets_of(shape);
  if (!shape.sequence_lengths.empty()) call.cu_seqlens_q = call.cu_seqlens_k = offsets.view();
  call.return_lse = true;  // the forward that keeps what the backward needs
  ops::AttentionArgs args = ops::bind_attention(op, variant, q, k, v, inputs, call);
  const std::vector<std::int64_t> lse_shape = args.packed ? std::vector<std::int64_t>{H, Tq} : std::vector<std::int64_t>{B, H, Tq};
  ops::bind_attention_outputs(op, call, {view_of(shape.type, args.output_shape()), view_of(DType::f32, lse_shape)}, args);
  cpu::AttentionGrads grads;  // as run_attention_backward allocates them
  grads.d_output = view_of(shape.type, args.output_shape());
  grads.dq = view_of(DType::f32, args.q.shape), grads.dk = view_of(DType::f32, args.k.shape), grads.dv = view_of(DType::f32, args.v.shape);
  grads.d_tensors.resize(variant.inputs.size());
  for (std::size_t i = 0; i < variant.inputs.size(); ++i)
    if (variant.inputs[i].role == ir::Role::other && variant.inputs[i].kind != ir::InputKind::scalar && args.tensors[i].type != DType::u8)
      grads.d_tensors[i] = view_of(DType::f32, args.tensors[i].shape);
  if (args.softmax_aux) grads.d_softmax_aux = view_of(DType::f32, args.softmax_aux->shape);
  const std::string target = plan_target(arch).arch;
  const gpu::AttentionBackwardPlan plan = gpu::plan_attention_backward(variant, args, grads, std::nullopt, target);  // as the launcher
  cuda::AttentionBackwardKernel kernel = cuda::generate_attention_backward(variant, plan.spec);
  std::vector<GeneratedKernel> out;
  out.push_back({kernel.name, std::move(kernel.source), "attention backward", gpu::to_string(plan), kernel.main_threads, kernel.shared_bytes});
  return out;
}

CompiledProgram compile_generated(const GeneratedKernel& kernel, const std::string& arch) {
  return gpu::detail::compile_named(kernel.source, kernel.name, arch, kernel.dynamic_shared_bytes);
}

bool is_compiled(const GeneratedKernel& kernel, const std::string& arch) {
  return is_compiled(kernel.source, gpu::detail::named_options(kernel.source, kernel.name, arch));
}

void compile_side_by_side(const std::vector<GeneratedKernel>& kernels, const std::string& arch) {
  std::vector<std::future<void>> compiling;
  for (const GeneratedKernel& kernel : kernels)
    compiling.push_back(std::async(std::launch::async, [&kernel, &arch] { compile_generated(kernel, arch); }));
  for (auto& job : compiling) {
    try {
      job.get();
    } catch (const std::exception&) {
      // Reported where the kernel is launched.
    }
  }
}

}  // namespace ladle
