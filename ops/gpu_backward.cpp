#include "gpu_backward.h"

#include <algorithm>
#include <variant>

#include <fmt/format.h>

#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "detail/checks.h"
#include "detail/loaded_kernel.h"
#include "detail/pack_input.h"
#include "device_upload.h"
#include "recurrent.h"

namespace ladle::gpu {
namespace {

std::string op_name(const ir::Variant& variant) { return (variant.name.empty() ? "variant" : variant.name) + " backward"; }

std::uint64_t ptr(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// The helper kernels' module source does not depend on the call: one entry per kernel name.
struct HelperKernel {
  std::string name;
};

const detail::LoadedKernel<HelperKernel>& helper(const std::string& name) {
  const std::string arch = Device::get().properties().arch();
  return detail::loaded_kernel<HelperKernel>("backward helper|" + name, arch, [&](const std::string& target) {
    struct {
      HelperKernel kernel;
      CompiledProgram program;
    } out{{name}, {}};
    CompileOptions options;
    options.arch = target;
    options.program_name = "ladle_bwd_helpers.cu";
    out.program = compile(cuda::backward_helpers_source(), options);
    return out;
  });
}

const char* type_suffix(ElementType t) { return t == ElementType::bf16 ? "bf16" : t == ElementType::f16 ? "f16" : "f32"; }

using Extra = std::variant<std::uint64_t, long long, int>;

// A scratch tensor on the call's stream and its contiguous view.
struct Scratch {
  DeviceBuffer buffer;
  TensorView view;
};
Scratch scratch(ElementType type, const std::vector<std::int64_t>& shape, const Stream* stream) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  Scratch out{DeviceBuffer::on_stream(std::max<std::size_t>(16, static_cast<std::size_t>(n) * element_size(type)), stream), {}};
  out.view = TensorView::contiguous(reinterpret_cast<const void*>(out.buffer.device_ptr()), type, shape);
  return out;
}

unsigned blocks_of(std::int64_t elements, unsigned threads) {
  return static_cast<unsigned>((elements + threads - 1) / threads);
}

}  // namespace

cuda::BackwardKernelSpec backward_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                                              cuda::BackwardPhase phase, ElementType d_output_type) {
  cuda::BackwardKernelSpec spec;
  static_cast<cuda::KernelTypes&>(spec) = kernel_types(variant, bound, options);
  spec.initial_state = spec.final_state = false;
  spec.output_type = ElementType::f32;
  spec.phase = phase;
  // 16-bit slots where the recurrences run on the tensor cores; fp32 for the fused-recurrent kernels.
  const bool chunked = choose_algorithm(variant, bound, options) == Algorithm::chunked;
  spec.slot_type = chunked && bound.dims.type != ElementType::f32 ? bound.dims.type : ElementType::f32;
  spec.d_output_type = d_output_type;
  return spec;
}

CompiledBackward compile_backward(const ir::Variant& variant, const cuda::BackwardKernelSpec& spec, const std::string& arch) {
  CompiledBackward out;
  out.kernel = cuda::generate_backward(variant, spec);
  CompileOptions options;
  options.arch = arch;
  options.program_name = out.kernel.name + ".cu";
  out.program = compile(out.kernel.source, options);
  return out;
}

void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients,
                               const LaunchOptions& launch) {
  const std::string op = op_name(variant);
  const ops::detail::Checker check(op);
  if (variant.normalize) check.fail("the GPU backward has no normalised read yet (its CPU backward runs it)");
  const ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  ops::bind_backward(op, bound, d_output, d_final_state);
  const cpu::RecurrentArgs& a = bound.args;
  const ops::RecurrentDims& d = bound.dims;
  const std::int64_t B = a.batch, T = a.tokens, H = a.heads, K = a.key_dim, V = a.value_dim, N = d.N;
  const unsigned threads = cuda::backward_threads(K, V);

  // The gradients: fp32, contiguous, each in its input's shape.
  const auto gradient = [&](const std::string& name, const TensorView* given, const TensorView& input) -> const TensorView& {
    if (!given) check.fail("gradients has no tensor for input '" + name + "'");
    check.type(("gradients." + name).c_str(), *given, ElementType::f32, "fp32 gradients");
    if (given->shape != input.shape)
      check.fail("gradients." + name + " has shape " + ops::detail::shape_text(given->shape) + ", expected its input's " +
                 ops::detail::shape_text(input.shape));
    if (given->strides != TensorView::contiguous(nullptr, ElementType::f32, given->shape).strides)
      check.fail("gradients." + name + " must be contiguous");
    check.data(("gradients." + name).c_str(), *given);
    return *given;
  };
  std::vector<const TensorView*> grad_of(variant.inputs.size(), nullptr);
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Input& in = variant.inputs[i];
    if (in.kind == ir::InputKind::scalar) continue;
    if (in.role == ir::Role::query) grad_of[i] = &gradient("dq", &gradients.dq, q);
    else if (in.role == ir::Role::key) grad_of[i] = &gradient("dk", &gradients.dk, k);
    else if (in.role == ir::Role::value) grad_of[i] = &gradient("dv", &gradients.dv, v);
    else {
      const auto found = gradients.inputs.find(in.name);
      grad_of[i] = &gradient(in.name, found == gradients.inputs.end() ? nullptr : &found->second, inputs.tensors.at(in.name));
    }
  }
  if (options.initial_state) {
    if (!gradients.d_initial_state) check.fail("options.initial_state is given but gradients.d_initial_state is not");
    gradient("d_initial_state", &*gradients.d_initial_state, *options.initial_state);
  }

  Device::get();
  const Stream* stream = launch.stream;
  for (std::size_t i = 0; i < variant.inputs.size(); ++i)
    if (grad_of[i]) fill_device_bytes(ptr(grad_of[i]->data), static_cast<std::size_t>(grad_of[i]->numel()) * 4, 0, stream);
  if (N * H * K * V == 0) return;
  const bool decays_k = variant.has(ir::Slot::log_decay_k) || variant.has(ir::Slot::log_decay_head);
  const bool decays_v = variant.has(ir::Slot::log_decay_v);
  std::int64_t longest = 0;
  for (std::int64_t n = 0; n < N; ++n)
    longest = std::max(longest, a.cu_seqlens.empty() ? T : a.cu_seqlens[static_cast<std::size_t>(n) + 1] - a.cu_seqlens[static_cast<std::size_t>(n)]);
  const std::int64_t C = (longest + cuda::backward_chunk - 1) / cuda::backward_chunk;
  DeviceBuffer offsets;
  if (!a.cu_seqlens.empty()) {
    offsets = DeviceBuffer::on_stream(a.cu_seqlens.size() * sizeof(std::int64_t), stream);
    offsets.copy_from_host(a.cu_seqlens.data(), offsets.bytes(), 0, stream);
  }
  const std::string arch = Device::get().properties().arch();
  const auto generated = [&](cuda::BackwardPhase phase) -> const detail::LoadedKernel<cuda::BackwardKernel>& {
    const cuda::BackwardKernelSpec spec = backward_kernel_spec(variant, bound, options, phase, d_output.type);
    std::string key = "backward|" + ir::hash_hex(variant) + "|" + cuda::to_string(phase) + "|" + element_type_name(spec.slot_type) +
                      element_type_name(spec.d_output_type) + (spec.reverse ? "R" : "") + (spec.varlen ? "L" : "");
    for (ElementType t : spec.input_types) key += element_type_name(t);
    return detail::loaded_kernel<cuda::BackwardKernel>(key, arch, [&](const std::string& target) {
      return compile_backward(variant, spec, target);
    });
  };
  const auto launch_generated = [&](const detail::LoadedKernel<cuda::BackwardKernel>& loaded, const std::map<std::string, Extra>& extras) {
    KernelArgs packed;
    for (const cuda::KernelParam& p : loaded.kernel.params)
      if (!detail::pack_input(packed, p, variant, a)) throw Error(op + ": kernel parameter " + p.name + " is not an input's");
    for (const std::string& name : loaded.kernel.extra_params) {
      const auto found = extras.find(name);
      if (found == extras.end()) throw Error(op + ": no argument for the backward kernel's parameter " + name);
      std::visit([&](auto value) { packed.add(value); }, found->second);
    }
    loaded.function->launch({static_cast<unsigned>(C), static_cast<unsigned>(N * H), 1}, {threads, 1, 1}, packed, 0, stream);
  };
  const ElementType E = backward_kernel_spec(variant, bound, options, cuda::BackwardPhase::slots, d_output.type).slot_type;

  // 1. The slots.
  const std::vector<std::int64_t> key_shape{B, T, H, K}, value_shape{B, T, H, V};
  Scratch qs = scratch(E, key_shape, stream), kf = scratch(E, key_shape, stream), vf = scratch(E, value_shape, stream),
          dos = scratch(E, value_shape, stream);
  Scratch log_a, log_a_next, log_b, log_b_next;
  if (decays_k) log_a = scratch(ElementType::f32, key_shape, stream), log_a_next = scratch(ElementType::f32, key_shape, stream);
  if (decays_v) log_b = scratch(ElementType::f32, value_shape, stream), log_b_next = scratch(ElementType::f32, value_shape, stream);
  std::map<std::string, Extra> extras{{"B", static_cast<int>(B)}, {"T", static_cast<int>(T)}, {"H", static_cast<int>(H)},
                                      {"K", static_cast<int>(K)}, {"V", static_cast<int>(V)}, {"C", static_cast<int>(C)},
                                      {"cu_seqlens", offsets.device_ptr()},
                                      {"qs", qs.buffer.device_ptr()}, {"kf", kf.buffer.device_ptr()},
                                      {"vf", vf.buffer.device_ptr()}, {"dos", dos.buffer.device_ptr()},
                                      {"log_a", log_a.buffer.device_ptr()}, {"log_a_next", log_a_next.buffer.device_ptr()},
                                      {"log_b", log_b.buffer.device_ptr()}, {"log_b_next", log_b_next.buffer.device_ptr()}};
  {
    const TensorView g = ops::detail::lead_with_ones(d_output, 4);
    extras["d_out"] = ptr(g.data);
    extras["d_out_stride_b"] = static_cast<long long>(g.strides[0]);
    extras["d_out_stride_t"] = static_cast<long long>(g.strides[1]);
    extras["d_out_stride_h"] = static_cast<long long>(g.strides[2]);
    extras["d_out_stride_d"] = static_cast<long long>(g.strides[3]);
  }
  if (C > 0) launch_generated(generated(cuda::BackwardPhase::slots), extras);

  // 2. The states in fp32, as given and transposed: h0 for the forward's o, h0^T for u; d_final for dv, d_final^T for dk.
  const auto convert = [&](const TensorView& state, std::int64_t rows, std::int64_t cols, Scratch* out, Scratch* out_t) {
    if (out) *out = scratch(ElementType::f32, {N, H, rows, cols}, stream);
    if (out_t) *out_t = scratch(ElementType::f32, {N, H, cols, rows}, stream);
    const auto& loaded = helper(std::string("ladle_bwd_convert_") + type_suffix(state.type));
    KernelArgs packed;
    packed.add(ptr(state.data));
    for (int dim = 0; dim < 4; ++dim) packed.add(static_cast<long long>(state.strides[static_cast<std::size_t>(dim)]));
    packed.add(static_cast<int>(N)).add(static_cast<int>(H)).add(static_cast<int>(rows)).add(static_cast<int>(cols));
    packed.add(out ? out->buffer.device_ptr() : std::uint64_t{0}).add(out_t ? out_t->buffer.device_ptr() : std::uint64_t{0});
    loaded.function->launch({blocks_of(N * H * rows * cols, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  };
  Scratch h0, h0_t, d_final, d_final_t;
  if (a.initial_state) convert(*a.initial_state, K, V, decays_v ? &h0 : nullptr, &h0_t);
  if (d_final_state) convert(*d_final_state, K, V, &d_final, &d_final_t);

  // 3. The recurrences of the plain form, outputs in fp32.
  RunOptions run;
  run.cu_seqlens = options.cu_seqlens;
  run.algorithm = options.algorithm == Algorithm::recurrent ? Algorithm::recurrent : Algorithm::automatic;
  const auto recurrence = [&](const Scratch& rq, const Scratch& rk, const Scratch& rv, const Scratch* gk, const Scratch* gv, bool backwards,
                              const Scratch* initial, const Scratch& out, const Scratch* final_state) {
    const ir::Variant& plain = recurrent_variant(false, gk != nullptr, gv != nullptr, false);
    RunOptions o = run;
    o.reverse = backwards;
    if (initial) o.initial_state = initial->view;
    o.return_state = final_state != nullptr;
    VariantInputs in{{}, {{"scale", 1.0f}}};
    if (gk) in.tensors["gk"] = gk->view;
    if (gv) in.tensors["gv"] = gv->view;
    RecurrentOutputs outs{out.view, final_state ? std::optional<TensorView>(final_state->view) : std::nullopt};
    run_variant_into(plain, rq.view, rk.view, rv.view, in, o, outs, launch);
  };
  const Scratch* la = decays_k ? &log_a : nullptr;
  const Scratch* la_next = decays_k ? &log_a_next : nullptr;
  const Scratch* lb = decays_v ? &log_b : nullptr;
  const Scratch* lb_next = decays_v ? &log_b_next : nullptr;
  const bool need_s_t = d_final_state && (decays_k || decays_v);
  Scratch u = scratch(ElementType::f32, key_shape, stream), dks = scratch(ElementType::f32, key_shape, stream),
          dvs = scratch(ElementType::f32, value_shape, stream), s_t, ds0, o_f;
  if (need_s_t) s_t = scratch(ElementType::f32, {N, H, V, K}, stream);
  if (a.initial_state) ds0 = scratch(ElementType::f32, {N, H, K, V}, stream);
  // u_t = S_t do_t over the transposed state (and S_T^T at the end);
  recurrence(dos, vf, kf, lb, la, a.reverse, a.initial_state ? &h0_t : nullptr, u, need_s_t ? &s_t : nullptr);
  // dv_t = dS_t^T k_t and dS before the first step; dk_t = dS_t v_t.
  recurrence(kf, qs, dos, la_next, lb_next, !a.reverse, d_final_state ? &d_final : nullptr, dvs, a.initial_state ? &ds0 : nullptr);
  recurrence(vf, dos, qs, lb_next, la_next, !a.reverse, d_final_state ? &d_final_t : nullptr, dks, nullptr);
  // The forward's output (unnormalised, fp32), for the value-side decay's gradient.
  if (decays_v) {
    o_f = scratch(ElementType::f32, value_shape, stream);
    recurrence(qs, kf, vf, la, lb, a.reverse, a.initial_state ? &h0 : nullptr, o_f, nullptr);
  }

  // 4. The decays' gradients: each block's totals, then what each block's running sums start from.
  Scratch totals, carry;
  if ((decays_k || decays_v) && C > 0) {
    totals = scratch(ElementType::f32, {N, H, C, K + V}, stream);
    carry = scratch(ElementType::f32, {N, H, C, K + V}, stream);
    extras["u"] = u.buffer.device_ptr();
    extras["dks"] = dks.buffer.device_ptr();
    extras["dvs"] = dvs.buffer.device_ptr();
    extras["o_f"] = o_f.buffer.device_ptr();
    extras["totals"] = totals.buffer.device_ptr();
    launch_generated(generated(cuda::BackwardPhase::totals), extras);
    {
      const auto& loaded = helper("ladle_bwd_carry");
      KernelArgs packed;
      packed.add(totals.buffer.device_ptr()).add(need_s_t ? d_final.buffer.device_ptr() : std::uint64_t{0});
      packed.add(s_t.buffer.device_ptr()).add(carry.buffer.device_ptr()).add(offsets.device_ptr());
      packed.add(static_cast<int>(N)).add(static_cast<int>(T)).add(static_cast<int>(H)).add(static_cast<int>(K)).add(static_cast<int>(V));
      packed.add(static_cast<int>(C));
      loaded.function->launch({blocks_of(N * H * (K + V), 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
    }
  }

  // 5. The chain rule into every input's gradient.
  extras["u"] = u.buffer.device_ptr();
  extras["dks"] = dks.buffer.device_ptr();
  extras["dvs"] = dvs.buffer.device_ptr();
  extras["o_f"] = o_f.buffer.device_ptr();
  extras["carry"] = carry.buffer.device_ptr();
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    if (!grad_of[i]) continue;
    const ir::Input& in = variant.inputs[i];
    const int rank = in.kind == ir::InputKind::head ? 2 : in.kind == ir::InputKind::token_head ? 3 : 4;
    const TensorView g = ops::detail::lead_with_ones(*grad_of[i], rank);
    // [H] broadcasts over the batch: every b adds into the same element.
    const long long sb = in.kind == ir::InputKind::head && grad_of[i]->rank() == 1 ? 0 : g.strides[0];
    const std::string key = "d/" + in.name;
    extras[key] = ptr(g.data);
    extras[key + "/sb"] = sb;
    extras[key + "/st"] = static_cast<long long>(rank >= 3 ? g.strides[1] : 0);
    extras[key + "/sh"] = static_cast<long long>(g.strides[rank == 2 ? 1 : 2]);
    extras[key + "/sd"] = static_cast<long long>(rank == 4 ? g.strides[3] : 0);
  }
  if (C > 0) launch_generated(generated(cuda::BackwardPhase::chain), extras);

  // 6. d initial_state = A_0 dS_0 B_0 at each sequence's first step.
  if (a.initial_state) {
    const auto& loaded = helper("ladle_bwd_initial");
    KernelArgs packed;
    packed.add(ds0.buffer.device_ptr()).add(log_a.buffer.device_ptr()).add(log_b.buffer.device_ptr());
    packed.add(ptr(gradients.d_initial_state->data)).add(offsets.device_ptr());
    packed.add(static_cast<int>(N)).add(static_cast<int>(T)).add(static_cast<int>(H)).add(static_cast<int>(K)).add(static_cast<int>(V));
    packed.add(static_cast<int>(a.reverse));
    loaded.function->launch({blocks_of(N * H * K * V, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }
}

void run_variant_backward(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                          const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                          const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients) {
  const std::string op = op_name(variant);
  // Everything is checked on the host first, so bad input never reaches the device.
  const ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  ops::bind_backward(op, bound, d_output, d_final_state);
  Device::get();
  std::vector<Uploaded> keep;
  const auto put = [&](const TensorView& host) {
    keep.push_back(upload(host));
    return keep.back().view;
  };
  VariantInputs device_inputs;
  device_inputs.scalars = inputs.scalars;
  for (const auto& [name, view] : inputs.tensors) device_inputs.tensors[name] = put(view);
  RunOptions device_options = options;
  if (options.initial_state) device_options.initial_state = put(*options.initial_state);
  const TensorView dq = put(q), dk = put(k), dv = put(v), d_o = put(d_output);
  std::optional<TensorView> d_final;
  if (d_final_state) d_final = put(*d_final_state);
  // The gradients on the device, then back into the caller's host tensors.
  std::vector<std::pair<Uploaded, TensorView>> outs;
  const auto out = [&](const TensorView& host) {
    outs.emplace_back(poisoned(ElementType::f32, host.shape), host);
    return outs.back().first.view;
  };
  RecurrentGradientViews device_grads{out(gradients.dq), out(gradients.dk), out(gradients.dv), {}, std::nullopt};
  for (const auto& [name, view] : gradients.inputs) device_grads.inputs[name] = out(view);
  if (gradients.d_initial_state) device_grads.d_initial_state = out(*gradients.d_initial_state);
  run_variant_backward_into(variant, dq, dk, dv, device_inputs, device_options, d_o, d_final, device_grads);
  Device::get().synchronize();
  for (auto& [device, host] : outs) {
    if (host.type != ElementType::f32 || host.strides != TensorView::contiguous(nullptr, ElementType::f32, host.shape).strides)
      throw InvalidArgument(op + ": host gradients must be fp32 and contiguous");
    device.buffer.copy_to_host(host.data, device.buffer.bytes());
  }
}

}  // namespace ladle::gpu
