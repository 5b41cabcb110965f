#include "gpu_backward.h"

#include <future>
#include <mutex>
#include <set>
#include <algorithm>
#include <array>
#include <cmath>
#include <variant>

#include <fmt/format.h>

#include <ladle/runtime/cache.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include <ladle/dsl/dsl.h>

#include "detail/checks.h"
#include "detail/loaded_kernel.h"
#include "generated_kernels.h"
#include "detail/pack_input.h"
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
    } out{{name}, compile_backward_helpers(target)};
    return out;
  });
}

const char* type_suffix(DType t) { return t == DType::bf16 ? "bf16" : t == DType::f16 ? "f16" : "f32"; }

using Extra = std::variant<std::uint64_t, long long, int>;

// A scratch tensor on the call's stream and its contiguous view.
struct Scratch {
  DeviceBuffer buffer;
  TensorView view;
};
Scratch scratch(DType type, const std::vector<std::int64_t>& shape, const Stream* stream) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  Scratch out{DeviceBuffer::on_stream(std::max<std::size_t>(16, static_cast<std::size_t>(n) * dtype_size(type)), stream), {}};
  out.view = out.buffer.view(type, shape);
  return out;
}

unsigned blocks_of(std::int64_t elements, unsigned threads) {
  return static_cast<unsigned>((elements + threads - 1) / threads);
}

}  // namespace

namespace {

// The input a slot is exactly (one input node of `kind`, every query head in the canonical view), or -1.
int plain_input(const ir::Variant& variant, const cpu::RecurrentArgs& a, ir::Slot slot, ir::InputKind kind) {
  const ir::Expr& e = variant.slot(slot);
  if (e.nodes.size() != 1 || e.nodes[0].op != ir::Op::input) return -1;
  const int k = e.nodes[0].input;
  if (variant.inputs[static_cast<std::size_t>(k)].kind != kind || a.tensors[static_cast<std::size_t>(k)].shape[2] != a.heads) return -1;
  return k;
}

// The read scale when it is the same for every token and head (absent, a constant or a scalar input) and not 0.
std::optional<float> call_scale(const ir::Variant& variant, const cpu::RecurrentArgs& a) {
  if (!variant.has(ir::Slot::scale)) return 1.0f;
  const ir::Expr& e = variant.slot(ir::Slot::scale);
  if (e.nodes.size() != 1) return std::nullopt;
  float value = 0.0f;
  if (e.nodes[0].op == ir::Op::constant) value = e.nodes[0].value;
  else if (e.nodes[0].op == ir::Op::input && variant.inputs[static_cast<std::size_t>(e.nodes[0].input)].kind == ir::InputKind::scalar)
    value = a.scalars[static_cast<std::size_t>(e.nodes[0].input)];
  else return std::nullopt;
  if (value == 0.0f || !std::isfinite(value) || !std::isfinite(1.0f / value)) return std::nullopt;
  return value;
}

DType next_type(const cpu::RecurrentArgs& a, int plain) {
  if (plain < 0) return DType::f32;
  const DType t = a.tensors[static_cast<std::size_t>(plain)].type;
  return t == DType::bf16 || t == DType::f16 ? t : DType::f32;  // a 16-bit gate copies exactly
}

}  // namespace

cuda::BackwardKernelSpec backward_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                                              cuda::BackwardPhase phase, DType d_output_type) {
  const cpu::RecurrentArgs& a = bound.args;
  cuda::BackwardKernelSpec spec;
  static_cast<cuda::KernelTypes&>(spec) = kernel_types(variant, bound, options);
  spec.initial_state = spec.final_state = false;
  spec.output_type = DType::f32;
  spec.phase = phase;
  // 16-bit slots where the recurrences run on the tensor cores; fp32 for the fused-recurrent kernels.
  const bool chunked = choose_algorithm(variant, bound, options) == Algorithm::chunked;
  // A normalised read runs in fp32 on the fused-recurrent kernels: its value side has V + 1 columns.
  const DType E = chunked && bound.dims.type != DType::f32 && !variant.normalize ? bound.dims.type : DType::f32;
  spec.slot_type = E;
  spec.d_output_type = d_output_type;
  spec.fold_scale = call_scale(variant, a).has_value();
  const int q_in = plain_input(variant, a, ir::Slot::q_feature, ir::InputKind::token_key);
  const int k_in = plain_input(variant, a, ir::Slot::k_feature, ir::InputKind::token_key);
  const int v_in = plain_input(variant, a, ir::Slot::v, ir::InputKind::token_value);
  const int a_in = plain_input(variant, a, ir::Slot::log_decay_k, ir::InputKind::token_key);
  const int b_in = plain_input(variant, a, ir::Slot::log_decay_v, ir::InputKind::token_value);
  const auto typed = [&](int k) { return k >= 0 && a.tensors[static_cast<std::size_t>(k)].type == E; };
  const auto role = [&](int k, ir::Role r) { return k >= 0 && variant.inputs[static_cast<std::size_t>(k)].role == r; };
  spec.write_q = !(spec.fold_scale && typed(q_in));
  spec.write_k = !typed(k_in);
  spec.write_v = !typed(v_in);
  spec.write_do = d_output_type != E;
  const bool merged_head = variant.has(ir::Slot::log_decay_k) && variant.has(ir::Slot::log_decay_head);
  spec.write_log_a = variant.has(ir::Slot::log_decay_k) && (a_in < 0 || merged_head);
  spec.write_log_b = variant.has(ir::Slot::log_decay_v) && b_in < 0;
  spec.log_a_next_type = merged_head ? DType::f32 : next_type(a, a_in);
  spec.log_b_next_type = next_type(a, b_in);
  const bool decays = variant.has(ir::Slot::log_decay_k) || variant.has(ir::Slot::log_decay_head) || variant.has(ir::Slot::log_decay_v);
  spec.write_first = a.initial_state.has_value() && decays;
  spec.direct_q = spec.fold_scale && role(q_in, ir::Role::query);
  spec.direct_k = role(k_in, ir::Role::key);
  spec.direct_v = role(v_in, ir::Role::value);
  if (variant.normalize) spec.write_v = true, spec.write_do = false, spec.direct_v = false;  // the normaliser's column
  return spec;
}

CompiledProgram compile_backward_helpers(const std::string& arch) {
  return detail::compile_named(cuda::backward_helpers_source(), "ladle_bwd_helpers", arch, 0);
}

CompiledBackward compile_backward(const ir::Variant& variant, const cuda::BackwardKernelSpec& spec, const std::string& arch) {
  CompiledBackward out;
  out.kernel = cuda::generate_backward(variant, spec);
  out.program = detail::compile_named(out.kernel.source, out.kernel.name, arch, 0);
  return out;
}

namespace {

// The plain recurrences the backward runs: S = exp(gh) diag(exp(gk)) S diag(exp(gv)) + k v^T, o = scale q^T S,
// each gate present or not.
const ir::Variant& plain_variant(bool gk, bool gv, bool gh) {
  namespace dsl = ladle::dsl;
  static const std::array<ir::Variant, 8> variants = [] {
    std::array<ir::Variant, 8> all;
    for (unsigned bits = 0; bits < 8; ++bits) {
      const auto scan = dsl::scan(dsl::k, dsl::v);
      const auto with_head = [&](const auto& st) {
        return bits & 4 ? dsl::lower(dsl::read(st.decay_head(dsl::token_head("gh")), dsl::q, dsl::scalar("scale")), "backward_plain")
                        : dsl::lower(dsl::read(st, dsl::q, dsl::scalar("scale")), "backward_plain");
      };
      const auto with_v = [&](const auto& st) { return bits & 2 ? with_head(st.decay_v(dsl::token_value("gv"))) : with_head(st); };
      all[bits] = bits & 1 ? with_v(scan.decay_k(dsl::token_key("gk"))) : with_v(scan);
    }
    return all;
  }();
  return variants[(gk ? 1 : 0) | (gv ? 2 : 0) | (gh ? 4 : 0)];
}

}  // namespace

void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients,
                               const LaunchOptions& launch) {
  const std::string op = op_name(variant);
  const ops::detail::Checker check(op);
  const ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  ops::bind_backward(op, bound, d_output, d_final_state);
  const cpu::RecurrentArgs& a = bound.args;
  const ops::RecurrentDims& d = bound.dims;
  const std::int64_t B = a.batch, T = a.tokens, H = a.heads, K = a.key_dim, V = a.value_dim, N = d.N;
  const unsigned threads = cuda::backward_threads(K, V);
  // A normalised read: the normaliser n_t is the state's extra column (its value 1), VS = V + 1 columns.
  const std::int64_t VS = variant.normalize ? V + 1 : V;

  // The gradients: fp32, contiguous, each in its input's shape.
  const auto gradient = [&](const std::string& name, const TensorView* given, const TensorView& input) -> const TensorView& {
    if (!given) check.fail("gradients has no tensor for input '" + name + "'");
    check.type(("gradients." + name).c_str(), *given, DType::f32, "fp32 gradients");
    if (given->shape != input.shape)
      check.fail("gradients." + name + " has shape " + ops::detail::shape_text(given->shape) + ", expected its input's " +
                 ops::detail::shape_text(input.shape));
    if (given->strides != TensorView::contiguous(nullptr, DType::f32, given->shape).strides)
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
  const cuda::BackwardKernelSpec plan = backward_kernel_spec(variant, bound, options, cuda::BackwardPhase::slots, d_output.type);
  const float scale = plan.fold_scale ? *call_scale(variant, a) : 1.0f;

  Device::get();
  const Stream* stream = launch.stream;
  // The gradients the chain adds into start at 0; those a recurrence writes are written whole.
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    if (!grad_of[i]) continue;
    const ir::Role role = variant.inputs[i].role;
    if ((role == ir::Role::query && plan.direct_q) || (role == ir::Role::key && plan.direct_k) || (role == ir::Role::value && plan.direct_v))
      continue;
    fill_device_bytes(ptr(grad_of[i]->data), static_cast<std::size_t>(grad_of[i]->numel()) * 4, 0, stream);
  }
  if (N * H * K * V == 0) {
    for (const TensorView* g : {&gradients.dq, &gradients.dk, &gradients.dv}) fill_device_bytes(ptr(g->data), static_cast<std::size_t>(g->numel()) * 4, 0, stream);
    return;
  }
  // A head decay beside a key-side one is folded into log_a; alone it is the recurrences' per-token head gate.
  const bool key_decay = variant.has(ir::Slot::log_decay_k), head_decay = variant.has(ir::Slot::log_decay_head) && !key_decay;
  const bool decays_k = key_decay || head_decay, decays_v = variant.has(ir::Slot::log_decay_v);
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
    cuda::BackwardKernelSpec spec = plan;
    spec.phase = phase;
    const std::string key = "backward|" + ir::hash_hex(variant) + "|" + cuda::backward_spec_key(spec);
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
  const DType E = plan.slot_type;
  const auto input_view = [&](ir::Slot slot, ir::InputKind kind) {
    return a.tensors[static_cast<std::size_t>(plain_input(variant, a, slot, kind))];
  };
  const auto wrap = [](const TensorView& view) { return Scratch{DeviceBuffer(), view}; };

  // 1. The slots: scratch tensors for those that are not one of the call's tensors as they stand.
  const std::vector<std::int64_t> key_shape{B, T, H, K}, value_shape{B, T, H, VS}, head_shape{B, T, H};
  Scratch qs = plan.write_q ? scratch(E, key_shape, stream) : wrap(input_view(ir::Slot::q_feature, ir::InputKind::token_key));
  Scratch kf = plan.write_k ? scratch(E, key_shape, stream) : wrap(input_view(ir::Slot::k_feature, ir::InputKind::token_key));
  Scratch vf = plan.write_v ? scratch(E, value_shape, stream) : wrap(input_view(ir::Slot::v, ir::InputKind::token_value));
  Scratch dos = plan.write_do || variant.normalize ? scratch(E, value_shape, stream) : wrap(ops::detail::lead_with_ones(d_output, 4));
  Scratch log_a, log_a_next, log_b, log_b_next, log_h, log_h_next, first_decay;
  if (key_decay) {
    log_a = plan.write_log_a ? scratch(DType::f32, key_shape, stream) : wrap(input_view(ir::Slot::log_decay_k, ir::InputKind::token_key));
    log_a_next = scratch(plan.log_a_next_type, key_shape, stream);
  }
  if (head_decay) log_h = scratch(DType::f32, head_shape, stream), log_h_next = scratch(DType::f32, head_shape, stream);
  if (decays_v) {
    log_b = plan.write_log_b ? scratch(DType::f32, value_shape, stream) : wrap(input_view(ir::Slot::log_decay_v, ir::InputKind::token_value));
    log_b_next = scratch(plan.log_b_next_type, value_shape, stream);
  }
  if (plan.write_first) first_decay = scratch(DType::f32, {N, H, K + V}, stream);
  std::map<std::string, Extra> extras{{"B", static_cast<int>(B)}, {"T", static_cast<int>(T)}, {"H", static_cast<int>(H)},
                                      {"K", static_cast<int>(K)}, {"V", static_cast<int>(V)}, {"VS", static_cast<int>(VS)},
                                      {"C", static_cast<int>(C)},
                                      {"cu_seqlens", offsets.device_ptr()},
                                      {"qs", ptr(qs.view.data)}, {"kf", ptr(kf.view.data)}, {"vf", ptr(vf.view.data)},
                                      {"dos", ptr(dos.view.data)}, {"log_a", ptr(log_a.view.data)},
                                      {"log_a_next", ptr(log_a_next.view.data)}, {"log_b", ptr(log_b.view.data)},
                                      {"log_b_next", ptr(log_b_next.view.data)}, {"log_h", ptr(log_h.view.data)},
                                      {"log_h_next", ptr(log_h_next.view.data)}, {"first_decay", ptr(first_decay.view.data)}};
  {
    const TensorView g = ops::detail::lead_with_ones(d_output, 4);
    extras["d_out"] = ptr(g.data);
    extras["d_out_stride_b"] = static_cast<long long>(g.strides[0]);
    extras["d_out_stride_t"] = static_cast<long long>(g.strides[1]);
    extras["d_out_stride_h"] = static_cast<long long>(g.strides[2]);
    extras["d_out_stride_d"] = static_cast<long long>(g.strides[3]);
  }
  if (C > 0) launch_generated(generated(cuda::BackwardPhase::slots), extras);

  // 2. The states in fp32, as given and transposed: h0 for the forward's o, h0^T for u; d_final for dv,
  //    d_final^T for dk (divided by a folded scale: those recurrences read dS / scale, times scale).
  const auto convert = [&](const TensorView& state, float factor, Scratch* out, Scratch* out_t) {
    if (out) *out = scratch(DType::f32, {N, H, K, VS}, stream);
    if (out_t) *out_t = scratch(DType::f32, {N, H, VS, K}, stream);
    for (Scratch* padded : {out, out_t})  // the normaliser's column starts at 0 (and d final_state has none)
      if (padded && VS != V) fill_device_bytes(padded->buffer.device_ptr(), padded->buffer.bytes(), 0, stream);
    const auto& loaded = helper(std::string("ladle_bwd_convert_") + type_suffix(state.type));
    KernelArgs packed;
    packed.add(ptr(state.data));
    for (int dim = 0; dim < 4; ++dim) packed.add(static_cast<long long>(state.strides[static_cast<std::size_t>(dim)]));
    packed.add(static_cast<int>(N)).add(static_cast<int>(H)).add(static_cast<int>(K)).add(static_cast<int>(V)).add(static_cast<int>(VS));
    packed.add(factor);
    packed.add(out ? out->buffer.device_ptr() : std::uint64_t{0}).add(out_t ? out_t->buffer.device_ptr() : std::uint64_t{0});
    loaded.function->launch({blocks_of(N * H * K * V, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  };
  Scratch h0, h0_t, d_final, d_final_t;
  if (a.initial_state) convert(*a.initial_state, 1.0f, decays_v || variant.normalize ? &h0 : nullptr, &h0_t);
  if (d_final_state) convert(*d_final_state, 1.0f / scale, &d_final, &d_final_t);

  // 3. The recurrences of the plain form, outputs in fp32 (into the gradients themselves where a slot is
  //    exactly q, k or v).
  RunOptions run;
  run.cu_seqlens = options.cu_seqlens;
  run.algorithm = options.algorithm == Algorithm::recurrent ? Algorithm::recurrent : Algorithm::automatic;
  struct Gates {
    const Scratch *gk, *gv, *gh;
  };
  // One recurrence of the plain form: its variant, options, inputs and outputs.
  struct RecurrenceCall {
    const ir::Variant& plain;
    RunOptions options;
    VariantInputs inputs;
    RecurrentOutputs outputs;
  };
  const auto recurrence_call = [&](Gates gates, bool backwards, const Scratch* initial, const TensorView& out,
                                   const Scratch* final_state) {
    RecurrenceCall call{plain_variant(gates.gk != nullptr, gates.gv != nullptr, gates.gh != nullptr), run,
                        VariantInputs{{}, {{"scale", scale}}},
                        {out, final_state ? std::optional<TensorView>(final_state->view) : std::nullopt}};
    call.options.reverse = backwards;
    if (initial) call.options.initial_state = initial->view;
    call.options.return_state = final_state != nullptr;
    if (gates.gk) call.inputs.tensors["gk"] = gates.gk->view;
    if (gates.gv) call.inputs.tensors["gv"] = gates.gv->view;
    if (gates.gh) call.inputs.tensors["gh"] = gates.gh->view;
    return call;
  };
  const auto recurrence = [&](const Scratch& rq, const Scratch& rk, const Scratch& rv, Gates gates, bool backwards,
                              const Scratch* initial, const TensorView& out, const Scratch* final_state) {
    const RecurrenceCall call = recurrence_call(gates, backwards, initial, out, final_state);
    run_variant_into(call.plain, rq.view, rk.view, rv.view, call.inputs, call.options, call.outputs, launch);
  };
  const Scratch* la = key_decay ? &log_a : nullptr;
  const Scratch* la_next = key_decay ? &log_a_next : nullptr;
  const Scratch* lh = head_decay ? &log_h : nullptr;
  const Scratch* lh_next = head_decay ? &log_h_next : nullptr;
  const Scratch* lb = decays_v ? &log_b : nullptr;
  const Scratch* lb_next = decays_v ? &log_b_next : nullptr;
  const bool need_s_t = d_final_state && (decays_k || decays_v);
  const auto grad_view = [&](ir::Role role, const TensorView& fallback) {
    for (std::size_t i = 0; i < variant.inputs.size(); ++i)
      if (variant.inputs[i].role == role) return ops::detail::lead_with_ones(*grad_of[i], 4);
    return fallback;
  };
  Scratch u, dks, dvs, s_t, ds0, o_f;
  if (!plan.direct_q) u = scratch(DType::f32, key_shape, stream);
  if (!plan.direct_k) dks = scratch(DType::f32, key_shape, stream);
  if (!plan.direct_v) dvs = scratch(DType::f32, value_shape, stream);
  const TensorView u_out = plan.direct_q ? grad_view(ir::Role::query, u.view) : u.view;
  const TensorView dk_out = plan.direct_k ? grad_view(ir::Role::key, dks.view) : dks.view;
  const TensorView dv_out = plan.direct_v ? grad_view(ir::Role::value, dvs.view) : dvs.view;
  if (need_s_t) s_t = scratch(DType::f32, {N, H, VS, K}, stream);
  if (a.initial_state) ds0 = scratch(DType::f32, {N, H, K, VS}, stream);
  if (variant.normalize) {
    // The forward's read of [S | n] (num, then den - eps), then do' = do / den and d den for the normaliser's column.
    Scratch num = scratch(DType::f32, value_shape, stream);
    recurrence(qs, kf, vf, {la, nullptr, lh}, a.reverse, a.initial_state ? &h0 : nullptr, num.view, nullptr);
    const auto& loaded = helper(std::string("ladle_bwd_normalized_") + type_suffix(d_output.type));
    const TensorView g = ops::detail::lead_with_ones(d_output, 4);
    KernelArgs packed;
    packed.add(num.buffer.device_ptr()).add(ptr(g.data));
    for (int dim = 0; dim < 4; ++dim) packed.add(static_cast<long long>(g.strides[static_cast<std::size_t>(dim)]));
    packed.add(static_cast<int>(B)).add(static_cast<int>(T)).add(static_cast<int>(H)).add(static_cast<int>(V));
    packed.add(variant.normalize_eps).add(dos.buffer.device_ptr());
    loaded.function->launch({blocks_of(B * T * H * 32, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }
  // The kernels still to come (the recurrences', the decays' totals and the chain's, the helpers),
  // compiled side by side now: a first call would otherwise compile them one after another. Once per
  // process and call signature (planning generates every source: later calls skip it), and not
  // without a cache to keep them in (each would be compiled twice).
  const auto first_of_its_kind = [&] {
    static std::mutex mutex;
    static std::set<std::string> seen;
    const std::string key = fmt::format("{}|{}|{} {} {} {} {} {}|{}{}{}{}", ir::hash_hex(variant), cuda::backward_spec_key(plan), B, T, H,
                                        K, V, N, a.cu_seqlens.empty(), a.reverse, a.initial_state.has_value(), d_final_state.has_value());
    const std::lock_guard lock(mutex);
    return seen.insert(key).second;
  };
  if (DiskCache::global().enabled() && first_of_its_kind()) {
    std::vector<GeneratedKernel> planned;
    const auto plan_recurrence = [&](const Scratch& rq, const Scratch& rk, const Scratch& rv, Gates gates, bool backwards,
                                     const Scratch* initial, const TensorView& out, const Scratch* final_state) {
      const RecurrenceCall call = recurrence_call(gates, backwards, initial, out, final_state);
      if (call.options.cu_seqlens && call.options.cu_seqlens->on_device()) return;  // the call reads them on the host: not here
      ops::BoundInputs b = ops::bind_inputs(op, call.plain, rq.view, rk.view, rv.view, call.inputs, call.options);
      ops::bind_outputs(op, call.options, call.outputs, b);
      for (GeneratedKernel& kernel : generated_kernels(call.plain, b, call.options, arch))
        if (std::none_of(planned.begin(), planned.end(), [&](const GeneratedKernel& p) { return p.name == kernel.name; }))
          planned.push_back(std::move(kernel));
    };
    std::vector<std::future<void>> compiling;
    try {
      plan_recurrence(dos, vf, kf, {lb, la, lh}, a.reverse, a.initial_state ? &h0_t : nullptr, u_out, need_s_t ? &s_t : nullptr);
      plan_recurrence(kf, qs, dos, {la_next, lb_next, lh_next}, !a.reverse, d_final_state ? &d_final : nullptr, dv_out,
                      a.initial_state ? &ds0 : nullptr);
      plan_recurrence(vf, dos, qs, {lb_next, la_next, lh_next}, !a.reverse, d_final_state ? &d_final_t : nullptr, dk_out, nullptr);
      for (const GeneratedKernel& kernel : planned)
        compiling.push_back(std::async(std::launch::async, [&kernel, &arch] { compile_generated(kernel, arch); }));
      for (const auto phase : {cuda::BackwardPhase::totals, cuda::BackwardPhase::chain}) {
        if (phase == cuda::BackwardPhase::totals && !(decays_k || decays_v)) continue;
        cuda::BackwardKernelSpec spec = plan;
        spec.phase = phase;
        compiling.push_back(std::async(std::launch::async, [&variant, spec, &arch] { compile_backward(variant, spec, arch); }));
      }
      compiling.push_back(std::async(std::launch::async, [&arch] { compile_backward_helpers(arch); }));
    } catch (const std::exception&) {
      // Planning is only a head start: the calls below plan, compile and report for themselves.
    }
    for (auto& job : compiling) {
      try {
        job.get();
      } catch (const std::exception&) {
        // As above: a kernel that fails to compile fails where it is launched, with its message.
      }
    }
  }
  // u_t = scale S_t do_t over the transposed state (and S_T^T at the end);
  recurrence(dos, vf, kf, {lb, la, lh}, a.reverse, a.initial_state ? &h0_t : nullptr, u_out, need_s_t ? &s_t : nullptr);
  // dv_t = dS_t^T k_t and dS before the first step; dk_t = dS_t v_t.
  recurrence(kf, qs, dos, {la_next, lb_next, lh_next}, !a.reverse, d_final_state ? &d_final : nullptr, dv_out, a.initial_state ? &ds0 : nullptr);
  recurrence(vf, dos, qs, {lb_next, la_next, lh_next}, !a.reverse, d_final_state ? &d_final_t : nullptr, dk_out, nullptr);
  // The forward's output (unnormalised, fp32), for the value-side decay's gradient.
  if (decays_v) {
    o_f = scratch(DType::f32, value_shape, stream);
    recurrence(qs, kf, vf, {la, lb, lh}, a.reverse, a.initial_state ? &h0 : nullptr, o_f.view, nullptr);
  }

  // 4. The decays' gradients: each block's totals, then what each block's running sums start from.
  extras["u"] = ptr(u_out.data);
  extras["dks"] = ptr(dk_out.data);
  extras["dvs"] = ptr(dv_out.data);
  extras["o_f"] = o_f.buffer.device_ptr();
  Scratch totals, carry;
  if ((decays_k || decays_v) && C > 0) {
    totals = scratch(DType::f32, {N, H, C, K + V}, stream);
    carry = scratch(DType::f32, {N, H, C, K + V}, stream);
    extras["totals"] = totals.buffer.device_ptr();
    launch_generated(generated(cuda::BackwardPhase::totals), extras);
    const auto& loaded = helper("ladle_bwd_carry");
    KernelArgs packed;
    packed.add(totals.buffer.device_ptr()).add(need_s_t ? d_final.buffer.device_ptr() : std::uint64_t{0});
    packed.add(scale).add(s_t.buffer.device_ptr()).add(carry.buffer.device_ptr()).add(offsets.device_ptr());
    packed.add(static_cast<int>(N)).add(static_cast<int>(T)).add(static_cast<int>(H)).add(static_cast<int>(K)).add(static_cast<int>(V));
    packed.add(static_cast<int>(VS)).add(static_cast<int>(C));
    loaded.function->launch({blocks_of(N * H * (K + V), 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }

  // 5. The chain rule into every input's gradient.
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

  // 6. d initial_state = A_0 dS_0 B_0 at each sequence's first step (dS_0 read as dS_0 / scale).
  if (a.initial_state) {
    const auto& loaded = helper("ladle_bwd_initial");
    KernelArgs packed;
    packed.add(ds0.buffer.device_ptr()).add(first_decay.buffer.device_ptr()).add(scale);
    packed.add(ptr(gradients.d_initial_state->data)).add(offsets.device_ptr());
    packed.add(static_cast<int>(N)).add(static_cast<int>(T)).add(static_cast<int>(H)).add(static_cast<int>(K)).add(static_cast<int>(V));
    packed.add(static_cast<int>(VS));
    loaded.function->launch({blocks_of(N * H * K * V, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }
}

}  // namespace ladle::gpu
