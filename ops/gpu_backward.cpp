#include "gpu_backward.h"

#include <mutex>
#include <set>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <variant>

#include <fmt/format.h>

#include <ladle/runtime/cache.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include <ladle/dsl/dsl.h>

#include "detail/checks.h"
#include "detail/interim.h"
#include "detail/loaded_kernel.h"
#include "chunked_plan.h"
#include "generated_kernels.h"
#include "detail/pack_input.h"
#include "recurrent.h"

namespace ladle::gpu {
namespace {

std::string op_name(const ir::Variant& variant) { return (variant.name.empty() ? "variant" : variant.name) + " backward"; }

std::uint64_t ptr(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// The helper kernels' module sources do not depend on the call: one entry per kernel name (the block
// kernel's program is its own; every other name is in the helpers' program).
struct HelperKernel {
  std::string name;
  int shared_bytes = 0;  // dynamic, at launch (past 48 KB: the function's limit raised once, as loaded)
};

const detail::LoadedKernel<HelperKernel>& helper(const std::string& name, int shared_bytes = 0) {
  const std::string arch = Device::get().properties().arch();
  return detail::loaded_kernel<HelperKernel>("backward helper|" + name, arch, [&](const std::string& target) {
    struct {
      HelperKernel kernel;
      CompiledProgram program;
    } out{{name, shared_bytes}, name == "ladle_bwd_block_bf16" ? compile_backward_block(target) : compile_backward_helper(name, target)};
    return out;
  });
}

const char* type_suffix(DType t) { return t == DType::bf16 ? "bf16" : t == DType::f16 ? "f16" : "f32"; }

using Extra = std::variant<std::uint64_t, long long, int>;

// Planning without memory (backward_planned_kernels): a contiguous view at a placeholder address, which
// nothing reads (the checks only ask for an address).
TensorView planned_view(DType type, const std::vector<std::int64_t>& shape) {
  static const unsigned char placeholder[16] = {};
  return TensorView::contiguous(const_cast<unsigned char*>(placeholder), type, shape);
}

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
  if (!variant.plain_form()) {  // the update forms: fp32 slots, every one written (ladle_bwd_update reads them)
    spec.update_form = true;
    spec.slot_type = DType::f32;
    spec.write_q = spec.write_k = spec.write_v = spec.write_do = true;
    spec.write_log_a = spec.write_log_b = spec.write_first = false;
    spec.direct_q = spec.direct_k = spec.direct_v = false;
  }
  return spec;
}

cuda::UpdateBackwardSpec update_backward_spec(const ir::Variant& variant, const ops::BoundInputs& bound, bool d_final,
                                              UpdateBackward form) {
  if (variant.plain_form()) throw InvalidArgument("update_backward_spec: " + ir::form_name(variant) + " is not an update form");
  const cpu::RecurrentArgs& a = bound.args;
  cuda::UpdateBackwardSpec spec;
  spec.delta = variant.update == ir::Update::delta;
  spec.key_decay = variant.has(ir::Slot::log_decay_k);
  spec.head_decay = variant.has(ir::Slot::log_decay_head) && !spec.key_decay;  // beside a key-side one: folded into log_a
  spec.beta = variant.has(ir::Slot::write_strength);
  spec.bonus = variant.has(ir::Slot::bonus);
  spec.l2 = variant.l2_normalize_qk;
  spec.scale_table = variant.has(ir::Slot::scale) && !call_scale(variant, a).has_value();
  spec.reverse = a.reverse;
  spec.varlen = !a.cu_seqlens.empty();
  spec.initial_state = a.initial_state.has_value();
  spec.d_final = d_final;
  spec.block_v = cuda::update_backward_block_v(a.key_dim, spec.delta);
  // The chunked WY form on the tensor cores where it runs the form and the inputs are 16-bit (its
  // products take bf16 operands) and longer than one chunk; else the recurrence in fp32 (form:
  // RunOptions::update_backward; LADLE_UPDATE_BWD_FORM = recurrent or chunked overrides it, a
  // measurement knob).
  if (const char* forced = std::getenv("LADLE_UPDATE_BWD_FORM")) {
    if (std::string(forced) == "recurrent") form = UpdateBackward::recurrent;
    else if (std::string(forced) == "chunked") form = UpdateBackward::chunked;
  }
  const bool can_chunk = cuda::update_backward_unchunked(spec, a.key_dim, a.value_dim).empty();
  if (form == UpdateBackward::recurrent) spec.chunked = false;
  else if (form == UpdateBackward::chunked) spec.chunked = can_chunk;
  else spec.chunked = can_chunk && bound.dims.type != DType::f32 && bound.dims.T >= cuda::update_backward_chunk;
  spec.block_k = cuda::update_backward_block_k(a.key_dim);
  return spec;
}

CompiledProgram compile_update_backward(const cuda::UpdateBackwardSpec& spec, const std::string& arch) {
  return detail::compile_named(cuda::update_backward_source(spec), cuda::update_backward_name(spec), arch, 0);
}

CompiledProgram compile_backward_helper(const std::string& name, const std::string& arch) {
  return detail::compile_named(cuda::backward_helper_source(name), name, arch, 0);
}

CompiledProgram compile_backward_block(const std::string& arch) {
  return detail::compile_named(cuda::backward_block_source(), "ladle_bwd_block", arch, cuda::backward_block_shared);
}

bool backward_block_kernel(const ir::Variant& variant, const cuda::BackwardKernelSpec& slots, const RunOptions& options,
                           std::int64_t key_dim, std::int64_t value_dim) {
  const bool decays = variant.has(ir::Slot::log_decay_k) || variant.has(ir::Slot::log_decay_head);
  return variant.plain_form() && decays && !variant.has(ir::Slot::log_decay_v) && !variant.normalize &&
         slots.slot_type == DType::bf16 && options.gate_gradients == GateGradients::boundary_blocks &&
         key_dim <= cuda::backward_block_features && value_dim <= cuda::backward_block_features;
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

namespace {

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

// The operands of one recurrence: q, k and v of the plain form, its gates and direction, its
// initial state, output and final state.
struct Recurrence {
  const Scratch &rq, &rk, &rv;
  Gates gates;
  bool backwards;
  const Scratch* initial;
  TensorView out;
  const Scratch* final_state;
};

// One call of the backward, a method per step, in run()'s order. The constructor checks every
// argument before any GPU work.
class BackwardCall {
 public:
  BackwardCall(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v, const VariantInputs& inputs,
               const RunOptions& options, const TensorView& d_output, const std::optional<TensorView>& d_final_state,
               const RecurrentGradientViews& gradients, const LaunchOptions& launch, bool initial_only = false,
               bool plan_only = false)
      : variant_(variant), options_(options), d_output_(d_output), d_final_state_(d_final_state), gradients_(gradients),
        launch_(launch), op_(op_name(variant)), check_(op_), bound_(ops::bind_inputs(op_, variant, q, k, v, inputs, options)),
        a_(bound_.args), initial_only_(initial_only), plan_only_(plan_only) {
    ops::bind_backward(op_, bound_, d_output, d_final_state);
    B_ = a_.batch, T_ = a_.tokens, H_ = a_.heads, K_ = a_.key_dim, V_ = a_.value_dim, N_ = bound_.dims.N;
    threads_ = cuda::backward_threads(K_, V_);
    VS_ = variant.normalize ? V_ + 1 : V_;  // a normalised read: the normaliser is the state's extra column (its value 1)
    check_gradients(q, k, v, inputs);
    plan_ = backward_kernel_spec(variant, bound_, options, cuda::BackwardPhase::slots, d_output.type);
    scale_ = plan_.fold_scale ? *call_scale(variant, a_) : 1.0f;
    // A head decay beside a key-side one is folded into log_a; alone it is the recurrences' per-token head gate.
    key_decay_ = variant.has(ir::Slot::log_decay_k);
    head_decay_ = variant.has(ir::Slot::log_decay_head) && !key_decay_;
    decays_k_ = key_decay_ || head_decay_;
    decays_v_ = variant.has(ir::Slot::log_decay_v);
    need_s_t_ = d_final_state && (decays_k_ || decays_v_);
    // 16-bit slots: the recurrences run on the tensor cores, and the carries come from boundary states.
    boundary_states_ = plan_.slot_type != DType::f32 && VS_ == V_ && (decays_k_ || decays_v_) &&
                       options.gate_gradients != GateGradients::block_sums;
    // u and dk a block at a time from the boundary states (ladle_bwd_block_bf16) instead of their recurrences.
    block_kernel_ = backward_block_kernel(variant, plan_, options, K_, V_);
    if (plan_.update_form) {  // the update forms' kernel: its limits, before any GPU work
      update_spec_ = update_backward_spec(variant, bound_, d_final_state.has_value(), options.update_backward);
      if (N_ * H_ > 65535)
        check_.fail(fmt::format("the update forms' GPU backward takes up to 65535 (sequence, head) pairs, got {}", N_ * H_));
    }
  }

  void run() {
    Device::get();
    arch_ = Device::get().properties().arch();
    if (!zero_gradients()) return;
    if (plan_.update_form) return update_form();
    write_slots();
    convert_states();
    if (initial_only_) {
      // dS before each sequence's first step from dv's recurrence alone (its output unused).
      dvs_ = scratch(DType::f32, value_shape_, launch_.stream);
      dv_out_ = dvs_.view;
      ds0_ = scratch(DType::f32, {N_, H_, K_, VS_}, launch_.stream);
      run_recurrence(the_recurrences()[1]);
      initial_state_gradient();
      return;
    }
    recurrences();
    decay_totals();
    chain();
    initial_state_gradient();
  }

 private:
  // The gradients: fp32, contiguous, each in its input's shape.
  const TensorView& gradient(const std::string& name, const TensorView* given, const TensorView& input) const {
    if (!given) check_.fail("gradients has no tensor for input '" + name + "'");
    check_.type(("gradients." + name).c_str(), *given, DType::f32, "fp32 gradients");
    if (given->shape != input.shape)
      check_.fail("gradients." + name + " has shape " + ops::detail::shape_text(given->shape) + ", expected its input's " +
                  ops::detail::shape_text(input.shape));
    if (given->strides != TensorView::contiguous(nullptr, DType::f32, given->shape).strides)
      check_.fail("gradients." + name + " must be contiguous");
    if (!plan_only_) check_.data(("gradients." + name).c_str(), *given);
    return *given;
  }

  void check_gradients(const TensorView& q, const TensorView& k, const TensorView& v, const VariantInputs& inputs) {
    grad_of_.assign(variant_.inputs.size(), nullptr);
    if (initial_only_) {
      if (!options_.initial_state) check_.fail("the initial state's gradient alone needs options.initial_state (its shape and type)");
      if (variant_.normalize) check_.fail("the initial state's gradient alone is not built for a normalised read");
    }
    for (std::size_t i = 0; i < variant_.inputs.size() && !initial_only_; ++i) {
      const ir::Input& in = variant_.inputs[i];
      if (in.kind == ir::InputKind::scalar) continue;
      if (in.role == ir::Role::query) grad_of_[i] = &gradient("dq", &gradients_.dq, q);
      else if (in.role == ir::Role::key) grad_of_[i] = &gradient("dk", &gradients_.dk, k);
      else if (in.role == ir::Role::value) grad_of_[i] = &gradient("dv", &gradients_.dv, v);
      else {
        const auto found = gradients_.inputs.find(in.name);
        grad_of_[i] = &gradient(in.name, found == gradients_.inputs.end() ? nullptr : &found->second, inputs.tensors.at(in.name));
      }
    }
    if (options_.initial_state) {
      if (!gradients_.d_initial_state) check_.fail("options.initial_state is given but gradients.d_initial_state is not");
      gradient("d_initial_state", &*gradients_.d_initial_state, *options_.initial_state);
    }
  }

  // The gradients the chain adds into start at 0; those a recurrence writes are written whole. False:
  // the call has no work (every gradient is 0).
  bool zero_gradients() {
    const Stream* stream = launch_.stream;
    for (std::size_t i = 0; i < variant_.inputs.size(); ++i) {
      if (!grad_of_[i]) continue;
      const ir::Role role = variant_.inputs[i].role;
      // ladle_bwd_block_bf16 writes u and dk at the sequences' tokens only: the others' are zeroed here.
      const bool whole = !(block_kernel_ && !a_.cu_seqlens.empty());
      if ((role == ir::Role::query && plan_.direct_q && whole) || (role == ir::Role::key && plan_.direct_k && whole) ||
          (role == ir::Role::value && plan_.direct_v))
        continue;
      fill_device_bytes(ptr(grad_of_[i]->data), static_cast<std::size_t>(grad_of_[i]->numel()) * 4, 0, stream);
    }
    if (N_ * H_ * K_ * V_ == 0) {
      if (initial_only_) return false;
      for (const TensorView* g : {&gradients_.dq, &gradients_.dk, &gradients_.dv})
        fill_device_bytes(ptr(g->data), static_cast<std::size_t>(g->numel()) * 4, 0, stream);
      return false;
    }
    C_ = longest_blocks();
    if (!a_.cu_seqlens.empty()) {
      offsets_ = DeviceBuffer::on_stream(a_.cu_seqlens.size() * sizeof(std::int64_t), stream);
      offsets_.copy_from_host(a_.cu_seqlens.data(), offsets_.bytes(), 0, stream);
    }
    return true;
  }

  const detail::LoadedKernel<cuda::BackwardKernel>& generated(cuda::BackwardPhase phase) const {
    cuda::BackwardKernelSpec spec = plan_;
    spec.phase = phase;
    const std::string key = "backward|" + ir::hash_hex(variant_) + "|" + cuda::backward_spec_key(spec);
    return detail::loaded_kernel<cuda::BackwardKernel>(key, arch_, [&](const std::string& target) {
      return compile_backward(variant_, spec, target);
    });
  }

  void launch_generated(cuda::BackwardPhase phase) const {
    const auto& loaded = generated(phase);
    KernelArgs packed;
    for (const cuda::KernelParam& p : loaded.kernel.params)
      if (!detail::pack_input(packed, p, variant_, a_)) throw Error(op_ + ": kernel parameter " + p.name + " is not an input's");
    for (const std::string& name : loaded.kernel.extra_params) {
      const auto found = extras_.find(name);
      if (found == extras_.end()) throw Error(op_ + ": no argument for the backward kernel's parameter " + name);
      std::visit([&](auto value) { packed.add(value); }, found->second);
    }
    loaded.function->launch({static_cast<unsigned>(C_), static_cast<unsigned>(N_ * H_), 1}, {threads_, 1, 1}, packed, 0, launch_.stream);
  }

  TensorView input_view(ir::Slot slot, ir::InputKind kind) const {
    return a_.tensors[static_cast<std::size_t>(plain_input(variant_, a_, slot, kind))];
  }
  static Scratch wrap(const TensorView& view) { return Scratch{DeviceBuffer(), view}; }
  // A scratch tensor on the call's stream; planning only, its view without memory.
  Scratch make(DType type, const std::vector<std::int64_t>& shape) const {
    return plan_only_ ? wrap(planned_view(type, shape)) : scratch(type, shape, launch_.stream);
  }

  // d_output and its strides, as the generated kernels take them.
  void d_output_extras() {
    const TensorView g = ops::detail::lead_with_ones(d_output_, 4);
    extras_["d_out"] = ptr(g.data);
    extras_["d_out_stride_b"] = static_cast<long long>(g.strides[0]);
    extras_["d_out_stride_t"] = static_cast<long long>(g.strides[1]);
    extras_["d_out_stride_h"] = static_cast<long long>(g.strides[2]);
    extras_["d_out_stride_d"] = static_cast<long long>(g.strides[3]);
  }

  // 1. The slots: scratch tensors for those that are not one of the call's tensors as they stand.
  void write_slots() {
    const DType E = plan_.slot_type;
    key_shape_ = {B_, T_, H_, K_}, value_shape_ = {B_, T_, H_, VS_};
    const std::vector<std::int64_t> head_shape{B_, T_, H_};
    qs_ = plan_.write_q ? make(E, key_shape_) : wrap(input_view(ir::Slot::q_feature, ir::InputKind::token_key));
    kf_ = plan_.write_k ? make(E, key_shape_) : wrap(input_view(ir::Slot::k_feature, ir::InputKind::token_key));
    vf_ = plan_.write_v ? make(E, value_shape_) : wrap(input_view(ir::Slot::v, ir::InputKind::token_value));
    dos_ = plan_.write_do || variant_.normalize ? make(E, value_shape_) : wrap(ops::detail::lead_with_ones(d_output_, 4));
    if (key_decay_) {
      log_a_ = plan_.write_log_a ? make(DType::f32, key_shape_) : wrap(input_view(ir::Slot::log_decay_k, ir::InputKind::token_key));
      log_a_next_ = make(plan_.log_a_next_type, key_shape_);
    }
    if (head_decay_) log_h_ = make(DType::f32, head_shape), log_h_next_ = make(DType::f32, head_shape);
    if (decays_v_) {
      log_b_ = plan_.write_log_b ? make(DType::f32, value_shape_)
                                 : wrap(input_view(ir::Slot::log_decay_v, ir::InputKind::token_value));
      log_b_next_ = make(plan_.log_b_next_type, value_shape_);
    }
    if (plan_.write_first) first_decay_ = make(DType::f32, {N_, H_, K_ + V_});
    extras_ = {{"B", static_cast<int>(B_)}, {"T", static_cast<int>(T_)}, {"H", static_cast<int>(H_)},
               {"K", static_cast<int>(K_)}, {"V", static_cast<int>(V_)}, {"VS", static_cast<int>(VS_)},
               {"C", static_cast<int>(C_)},
               {"cu_seqlens", offsets_.device_ptr()},
               {"qs", ptr(qs_.view.data)}, {"kf", ptr(kf_.view.data)}, {"vf", ptr(vf_.view.data)},
               {"dos", ptr(dos_.view.data)}, {"log_a", ptr(log_a_.view.data)},
               {"log_a_next", ptr(log_a_next_.view.data)}, {"log_b", ptr(log_b_.view.data)},
               {"log_b_next", ptr(log_b_next_.view.data)}, {"log_h", ptr(log_h_.view.data)},
               {"log_h_next", ptr(log_h_next_.view.data)}, {"first_decay", ptr(first_decay_.view.data)}};
    d_output_extras();
    if (C_ > 0 && !plan_only_) launch_generated(cuda::BackwardPhase::slots);
  }

  // A state in fp32, as given (out) and transposed (out_t), times factor.
  void convert(const TensorView& state, float factor, Scratch* out, Scratch* out_t) const {
    const Stream* stream = launch_.stream;
    if (out) *out = make(DType::f32, {N_, H_, K_, VS_});
    if (out_t) *out_t = make(DType::f32, {N_, H_, VS_, K_});
    if (plan_only_) return;
    for (Scratch* padded : {out, out_t})  // the normaliser's column starts at 0 (and d final_state has none)
      if (padded && VS_ != V_) fill_device_bytes(padded->buffer.device_ptr(), padded->buffer.bytes(), 0, stream);
    const auto& loaded = helper(std::string("ladle_bwd_convert_") + type_suffix(state.type));
    KernelArgs packed;
    packed.add(ptr(state.data));
    for (int dim = 0; dim < 4; ++dim) packed.add(static_cast<long long>(state.strides[static_cast<std::size_t>(dim)]));
    packed.add(static_cast<int>(N_)).add(static_cast<int>(H_)).add(static_cast<int>(K_)).add(static_cast<int>(V_)).add(static_cast<int>(VS_));
    packed.add(factor);
    packed.add(out ? out->buffer.device_ptr() : std::uint64_t{0}).add(out_t ? out_t->buffer.device_ptr() : std::uint64_t{0});
    loaded.function->launch({blocks_of(N_ * H_ * K_ * V_, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }

  // 2. The states in fp32, as given and transposed: h0 for the forward's o, h0^T for u; d_final for dv,
  //    d_final^T for dk (divided by a folded scale: those recurrences read dS / scale, times scale).
  void convert_states() {
    if (a_.initial_state) convert(*a_.initial_state, 1.0f, decays_v_ || variant_.normalize || boundary_states_ ? &h0_ : nullptr, &h0_t_);
    if (d_final_state_) convert(*d_final_state_, 1.0f / scale_, &d_final_, &d_final_t_);
  }

  RecurrenceCall recurrence_call(const Recurrence& r) const {
    RunOptions run;
    run.cu_seqlens = options_.cu_seqlens;
    run.algorithm = options_.algorithm == Algorithm::recurrent ? Algorithm::recurrent : Algorithm::automatic;
    RecurrenceCall call{plain_variant(r.gates.gk != nullptr, r.gates.gv != nullptr, r.gates.gh != nullptr), run,
                        VariantInputs{{}, {{"scale", scale_}}},
                        {r.out, r.final_state ? std::optional<TensorView>(r.final_state->view) : std::nullopt}};
    call.options.reverse = r.backwards;
    if (r.initial) call.options.initial_state = r.initial->view;
    call.options.return_state = r.final_state != nullptr;
    if (r.gates.gk) call.inputs.tensors["gk"] = r.gates.gk->view;
    if (r.gates.gv) call.inputs.tensors["gv"] = r.gates.gv->view;
    if (r.gates.gh) call.inputs.tensors["gh"] = r.gates.gh->view;
    return call;
  }
  void run_recurrence(const Recurrence& r) const {
    const RecurrenceCall call = recurrence_call(r);
    run_variant_into(call.plain, r.rq.view, r.rk.view, r.rv.view, call.inputs, call.options, call.outputs, launch_);
  }

  TensorView grad_view(ir::Role role, const TensorView& fallback) const {
    for (std::size_t i = 0; i < variant_.inputs.size(); ++i)
      if (variant_.inputs[i].role == role) return ops::detail::lead_with_ones(*grad_of_[i], 4);
    return fallback;
  }

  // The three recurrences (the decays of the first in the forward's direction, the others' shifted one step):
  // u_t = scale S_t do_t over the transposed state (and S_T^T at the end); dv_t = dS_t^T k_t (and dS
  // before the first step); dk_t = dS_t v_t.
  // The log decays the recurrences take (null where the variant has none): the step's own, or the
  // next step's (shifted one step, for the recurrences over dS).
  struct Decays {
    const Scratch *a, *b, *h;  // key side, value side, head alone
  };
  Decays decays(bool next) const {
    return {key_decay_ ? (next ? &log_a_next_ : &log_a_) : nullptr, decays_v_ ? (next ? &log_b_next_ : &log_b_) : nullptr,
            head_decay_ ? (next ? &log_h_next_ : &log_h_) : nullptr};
  }

  // The recurrences this call runs (block_kernel_: u's only for its final state S_T, dk's not at all).
  std::vector<Recurrence> recurrences_run() const {
    const std::array<Recurrence, 3> all = the_recurrences();
    std::vector<Recurrence> out;
    for (std::size_t r = 0; r < all.size(); ++r)
      if (!block_kernel_ || r == 1 || (r == 0 && need_s_t_)) out.push_back(all[r]);
    return out;
  }

  std::array<Recurrence, 3> the_recurrences() const {
    const Decays now = decays(false), next = decays(true);
    const Scratch *la = now.a, *lb = now.b, *lh = now.h, *la_next = next.a, *lb_next = next.b, *lh_next = next.h;
    const bool reverse = a_.reverse;
    return {Recurrence{dos_, vf_, kf_, {lb, la, lh}, reverse, a_.initial_state ? &h0_t_ : nullptr, u_out_, need_s_t_ ? &s_t_ : nullptr},
            Recurrence{kf_, qs_, dos_, {la_next, lb_next, lh_next}, !reverse, d_final_state_ ? &d_final_ : nullptr, dv_out_,
                       a_.initial_state ? &ds0_ : nullptr},
            Recurrence{vf_, dos_, qs_, {lb_next, la_next, lh_next}, !reverse, d_final_state_ ? &d_final_t_ : nullptr, dk_out_, nullptr}};
  }

  // The forward's read of [S | n] (num, then den - eps), then do' = do / den and d den for the normaliser's column.
  void normalized_read() {
    const Stream* stream = launch_.stream;
    Scratch num = scratch(DType::f32, value_shape_, stream);
    run_recurrence({qs_, kf_, vf_, {key_decay_ ? &log_a_ : nullptr, nullptr, head_decay_ ? &log_h_ : nullptr}, a_.reverse,
                    a_.initial_state ? &h0_ : nullptr, num.view, nullptr});
    const auto& loaded = helper(std::string("ladle_bwd_normalized_") + type_suffix(d_output_.type));
    const TensorView g = ops::detail::lead_with_ones(d_output_, 4);
    KernelArgs packed;
    packed.add(num.buffer.device_ptr()).add(ptr(g.data));
    for (int dim = 0; dim < 4; ++dim) packed.add(static_cast<long long>(g.strides[static_cast<std::size_t>(dim)]));
    packed.add(static_cast<int>(B_)).add(static_cast<int>(T_)).add(static_cast<int>(H_)).add(static_cast<int>(V_));
    packed.add(variant_.normalize_eps).add(dos_.buffer.device_ptr());
    loaded.function->launch({blocks_of(B_ * T_ * H_ * 32, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }

  // Once per process and call signature: planning generates every source, later calls skip it.
  bool first_of_its_kind() const {
    static std::mutex mutex;
    static std::set<std::string> seen;
    const std::string key = signature();
    const std::lock_guard lock(mutex);
    return seen.insert(key).second;
  }

 public:
  // What chooses this call's programs: the variant, the slots' spec, the shape and the call's options.
  // Made once a call (the interim check and the compile-ahead both ask; it hashes the variant).
  const std::string& signature() const {
    if (signature_.empty())
      signature_ = fmt::format("{}|{}|{} {} {} {} {} {}|{}{}{}{}|{}", ir::hash_hex(variant_), cuda::backward_spec_key(plan_), B_, T_, H_, K_,
                       V_, N_, a_.cu_seqlens.empty(), a_.reverse, a_.initial_state.has_value(), d_final_state_.has_value(),
                       plan_.update_form ? cuda::update_backward_name(update_spec_) : std::string("plain"));
    return signature_;
  }

  // Whether the call runs the chunked forms ladle chose (the recurrences on the tensor cores, or the
  // update forms' chunked WY form): those whose programs take seconds of NVRTC, with an interim form.
  bool chunked() const {
    if (plan_.update_form) return update_spec_.chunked && options_.update_backward == UpdateBackward::automatic;
    return choose_algorithm(variant_, bound_, options_) == Algorithm::chunked;
  }

 private:

  // The kernels still to come (the recurrences', the decays' totals and the chain's, the helpers),
  // compiled side by side now: a first call would otherwise compile them one after another. Not
  // without a cache to keep them in (each would be compiled twice).
  // The GPU this call plans for: this one, or (planning only) a GPU of arch_ (named_target).
  GpuTarget target() const { return plan_only_ ? named_target(arch_) : device_target(); }

  // The blocks of the longest sequence.
  std::int64_t longest_blocks() const {
    std::int64_t longest = 0;
    for (std::int64_t n = 0; n < N_; ++n)
      longest = std::max(longest, a_.cu_seqlens.empty() ? T_
                                                        : a_.cu_seqlens[static_cast<std::size_t>(n) + 1] - a_.cu_seqlens[static_cast<std::size_t>(n)]);
    return (longest + cuda::backward_chunk - 1) / cuda::backward_chunk;
  }

  // The backward's generated kernel of `phase` as a program to compile; the helpers' program.
  GeneratedKernel own_kernel(cuda::BackwardPhase phase) const {
    cuda::BackwardKernelSpec spec = plan_;
    spec.phase = phase;
    cuda::BackwardKernel kernel = cuda::generate_backward(variant_, spec);
    return {kernel.name, std::move(kernel.source), std::string("backward ") + cuda::to_string(phase), "-", threads_, 0};
  }
  static GeneratedKernel helper_program(const std::string& name) {
    return {name, cuda::backward_helper_source(name), "backward helper", "-", 256, 0};
  }

  // The helper kernels a call launches (each its own program): the states' conversions, a normalised
  // read's, the decays' carries, d initial_state; an update form's finish.
  std::vector<std::string> helpers_launched() const {
    std::vector<std::string> names;
    if (a_.initial_state) names.push_back(std::string("ladle_bwd_convert_") + type_suffix(a_.initial_state->type));
    if (d_final_state_) names.push_back(std::string("ladle_bwd_convert_") + type_suffix(d_final_state_->type));
    if (plan_.update_form) {
      names.push_back("ladle_bwd_update_finish");
    } else {
      if (variant_.normalize) names.push_back(std::string("ladle_bwd_normalized_") + type_suffix(d_output_.type));
      if (decays_k_ || decays_v_) names.push_back(boundary_states_ ? "ladle_bwd_carry_states" : "ladle_bwd_carry");
      if (a_.initial_state) names.push_back("ladle_bwd_initial");
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  // What the plain form's call compiles, as it plans it: the recurrences' chunked kernels (with their
  // chunk-states forms where they write the boundary states), the state passes left, the slots, totals
  // and chain kernels, the helpers' program and the block kernel's. Needs the slots' views (write_slots,
  // convert_states, recurrence_outputs); compile_ahead compiles the list, backward_planned_kernels returns it.
  std::vector<GeneratedKernel> plain_kernels() const {
    std::vector<GeneratedKernel> planned;
    const std::string& arch = arch_;
    const auto add = [&](GeneratedKernel kernel) {
      if (std::none_of(planned.begin(), planned.end(), [&](const GeneratedKernel& p) { return p.name == kernel.name; }))
        planned.push_back(std::move(kernel));
    };
    // The boundary states from the recurrences' own ws kernels where they run them (boundary_tables()):
    // their kernels with chunk_states_out (heuristic tiles), in place of the recurrence and its state pass.
    std::array<bool, 2> from_recurrence{false, false};  // S (the forward's recurrence), dS (dv's)
    if (boundary_states_ && !(options_.cu_seqlens && options_.cu_seqlens->on_device())) {
      const std::array<EntryStates, 2> entries = entry_state_calls();
      const std::array<Recurrence, 3> recurrences = the_recurrences();
      const std::array<const Recurrence*, 2> tables{&entries[0].recurrence, &recurrences[1]};
      for (std::size_t t = 0; t < 2; ++t) {
        if (t == 1 && !blocks_aligned()) continue;
        const RecurrenceCall call = recurrence_call(*tables[t]);
        RunOptions chunked = call.options;
        chunked.algorithm = Algorithm::chunked;
        ops::BoundInputs b = ops::bind_inputs(op_, call.plain, tables[t]->rq.view, tables[t]->rk.view, tables[t]->rv.view, call.inputs, chunked);
        ops::bind_outputs(op_, call.options, call.outputs, b);
        if (const std::optional<ChunkedPlan> plan = chunk_states_plan(call.plain, b, chunked, target())) {
          cuda::ChunkedKernel kernel = cuda::generate_chunked(call.plain, plan->launches[0].spec);
          add({kernel.name, std::move(kernel.source), "boundary states", cuda::to_string(plan->spec.tile), kernel.threads, kernel.shared_bytes});
          from_recurrence[t] = true;
        }
      }
    }
    const std::vector<Recurrence> run = recurrences_run();
    for (std::size_t i = 0; i < run.size(); ++i) {
      const Recurrence& r = run[i];
      if (&r.rv == &dos_ && from_recurrence[1]) continue;  // dv's: its chunk-states kernel above
      const RecurrenceCall call = recurrence_call(r);
      if (call.options.cu_seqlens && call.options.cu_seqlens->on_device()) continue;  // the call reads them on the host: not here
      ops::BoundInputs b = ops::bind_inputs(op_, call.plain, r.rq.view, r.rk.view, r.rv.view, call.inputs, call.options);
      ops::bind_outputs(op_, call.options, call.outputs, b);
      for (GeneratedKernel& kernel : generated_kernels(call.plain, b, call.options, arch)) add(std::move(kernel));
    }
    if (boundary_states_ && !(options_.cu_seqlens && options_.cu_seqlens->on_device())) {
      const std::array<EntryStates, 2> entries = entry_state_calls();
      for (std::size_t t = 0; t < 2; ++t) {
        if (from_recurrence[t]) continue;
        const EntryStates& each = entries[t];
        const RecurrenceCall call = recurrence_call(each.recurrence);
        RunOptions chunked = call.options;
        chunked.algorithm = Algorithm::chunked;
        const Recurrence& r = each.recurrence;
        const ops::BoundInputs b = ops::bind_inputs(op_, call.plain, r.rq.view, r.rk.view, r.rv.view, call.inputs, chunked);
        for (const ChunkedLaunch& launch : plan_entry_states(call.plain, b, chunked, each.segments, target()).launches) {
          cuda::ChunkedKernel kernel = cuda::generate_chunked(call.plain, launch.spec);
          add({kernel.name, std::move(kernel.source), "entry states", cuda::to_string(launch.spec.tile), kernel.threads, kernel.shared_bytes});
        }
      }
    }
    std::vector<cuda::BackwardPhase> phases{cuda::BackwardPhase::slots};
    if ((decays_k_ || decays_v_) && !boundary_states_) phases.push_back(cuda::BackwardPhase::totals);
    phases.push_back(cuda::BackwardPhase::chain);
    for (const cuda::BackwardPhase phase : phases) add(own_kernel(phase));
    for (const std::string& name : helpers_launched()) add(helper_program(name));
    if (block_kernel_) add({"ladle_bwd_block", cuda::backward_block_source(), "backward block", "-", 256, cuda::backward_block_shared});
    return planned;
  }

  // The plain form's programs (plain_kernels) compiled side by side into the cache before the
  // recurrences run, once per process and call signature: a cold first call would otherwise compile
  // them one after another. Planning is a head start only: what fails here fails where it launches.
  void compile_ahead() const {
    if (!DiskCache::global().enabled() || !first_of_its_kind()) return;
    std::vector<GeneratedKernel> planned;
    try {
      planned = plain_kernels();
    } catch (const std::exception&) {
      return;
    }
    compile_side_by_side(planned, arch_);
  }

  // The recurrences' outputs: the gradients where they are written directly, else scratch.
  void recurrence_outputs() {
    if (!plan_.direct_q) u_ = make(DType::f32, key_shape_);
    if (!plan_.direct_k) dks_ = make(DType::f32, key_shape_);
    if (!plan_.direct_v) dvs_ = make(DType::f32, value_shape_);
    u_out_ = plan_.direct_q ? grad_view(ir::Role::query, u_.view) : u_.view;
    dk_out_ = plan_.direct_k ? grad_view(ir::Role::key, dks_.view) : dks_.view;
    dv_out_ = plan_.direct_v ? grad_view(ir::Role::value, dvs_.view) : dvs_.view;
    if (need_s_t_) s_t_ = make(DType::f32, {N_, H_, VS_, K_});
    if (a_.initial_state) ds0_ = make(DType::f32, {N_, H_, K_, VS_});
  }

  void recurrences() {
    const Stream* stream = launch_.stream;
    recurrence_outputs();
    if (variant_.normalize) normalized_read();
    compile_ahead();
    if (boundary_states_) {
      boundary_tables();
    } else {
      for (const Recurrence& r : recurrences_run()) run_recurrence(r);
    }
    if (decays_v_) {
      o_f_ = scratch(DType::f32, value_shape_, stream);
      run_recurrence({qs_, kf_, vf_, {key_decay_ ? &log_a_ : nullptr, &log_b_, head_decay_ ? &log_h_ : nullptr}, a_.reverse,
                      a_.initial_state ? &h0_ : nullptr, o_f_.view, nullptr});
    }
  }

  // 4. The decays' gradients: what each block's running sums start from (carry). With 16-bit slots,
  //    from the states at the blocks' boundaries (boundary_carry); with fp32 slots, each block's totals
  //    summed back from the sequence's end.
  void decay_totals() {
    const Stream* stream = launch_.stream;
    extras_["u"] = ptr(u_out_.data);
    extras_["dks"] = ptr(dk_out_.data);
    extras_["dvs"] = ptr(dv_out_.data);
    extras_["o_f"] = o_f_.buffer.device_ptr();
    if (!(decays_k_ || decays_v_) || C_ == 0) return;
    carry_ = scratch(DType::f32, {N_, H_, C_, K_ + V_}, stream);
    if (boundary_states_) return boundary_carry();
    totals_ = scratch(DType::f32, {N_, H_, C_, K_ + V_}, stream);
    extras_["totals"] = totals_.buffer.device_ptr();
    launch_generated(cuda::BackwardPhase::totals);
    const auto& loaded = helper("ladle_bwd_carry");
    KernelArgs packed;
    packed.add(totals_.buffer.device_ptr()).add(need_s_t_ ? d_final_.buffer.device_ptr() : std::uint64_t{0});
    packed.add(scale_).add(s_t_.buffer.device_ptr()).add(carry_.buffer.device_ptr()).add(offsets_.device_ptr());
    packed.add(static_cast<int>(N_)).add(static_cast<int>(T_)).add(static_cast<int>(H_)).add(static_cast<int>(K_)).add(static_cast<int>(V_));
    packed.add(static_cast<int>(VS_)).add(static_cast<int>(C_));
    loaded.function->launch({blocks_of(N_ * H_ * (K_ + V_), 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
  }

  // The recurrences and, where the serial ws form runs them, the boundary states from the same kernels
  // (gpu::run_variant_with_chunk_states): S entering each block from the forward's recurrence (qs, kf,
  // vf; run for this alone, its output into u_out_, which the block kernel or u's recurrence rewrites
  // after), dS / scale entering each block from dv's where every sequence's length is a multiple of the
  // block (its chunks, which start at the sequence's other end, then meet the blocks). boundary_carry()
  // forms what is left the old way.
  std::int64_t sequence_length(std::int64_t n) const {
    return a_.cu_seqlens.empty() ? T_ : a_.cu_seqlens[static_cast<std::size_t>(n) + 1] - a_.cu_seqlens[static_cast<std::size_t>(n)];
  }
  // Every sequence a whole number of blocks: dv's chunks, from the other end, meet the blocks.
  bool blocks_aligned() const {
    for (std::int64_t n = 0; n < N_; ++n)
      if (sequence_length(n) % cuda::backward_chunk != 0) return false;
    return true;
  }
  void boundary_tables() {
    const Stream* stream = launch_.stream;
    chunk_rows_.assign(static_cast<std::size_t>(N_), 0);
    long long chunks = 0;
    for (std::int64_t n = 0; n < N_; ++n) {
      chunk_rows_[static_cast<std::size_t>(n)] = chunks + 1;
      chunks += (sequence_length(n) + cuda::backward_chunk - 1) / cuda::backward_chunk;
    }
    const bool aligned = blocks_aligned();
    const auto with_table = [&](const Recurrence& r, Scratch& table) {
      table = scratch(DType::f32, {std::max<long long>(chunks, 1), H_, K_, V_}, stream);
      const RecurrenceCall call = recurrence_call(r);
      if (run_variant_with_chunk_states(call.plain, r.rq.view, r.rk.view, r.rv.view, call.inputs, call.options, call.outputs,
                                        table.buffer.device_ptr(), launch_))
        return true;
      table = Scratch{};
      return false;
    };
    // First: its output goes to u_out_, which u's recurrence (below) or the block kernel (later) writes.
    s_table_ready_ = chunks > 0 && with_table(entry_state_calls()[0].recurrence, s_table_);
    for (const Recurrence& r : recurrences_run()) {
      if (&r.rv == &dos_) {  // dv's
        d_table_ready_ = aligned && chunks > 0 && with_table(r, d_table_);
        if (d_table_ready_) continue;
      }
      run_recurrence(r);
    }
  }

  // The same segments in the other direction: each sequence's rows in reverse order.
  static cuda::ChunkedSegments reversed(const cuda::ChunkedSegments& forward) {
    cuda::ChunkedSegments out;
    const std::size_t rows = forward.all.size() / 8;
    for (std::size_t begin = 0; begin < rows;) {
      std::size_t end = begin;
      while (end < rows && forward.all[end * 8 + 3] == forward.all[begin * 8 + 3]) ++end;
      for (std::size_t r = end; r-- > begin;) {
        long long row[8];
        std::copy_n(forward.all.begin() + static_cast<std::ptrdiff_t>(r * 8), 8, row);
        row[4] = static_cast<long long>(end - 1 - r);
        row[6] = r == begin ? 1 : 0;
        out.all.insert(out.all.end(), row, row + 8);
        if (r != begin) out.earlier.insert(out.earlier.end(), row, row + 8);
      }
      begin = end;
    }
    return out;
  }

  // The carry of block c of a sequence, e its last step: sum over the state of S_e A_(e+1) dS_(e+1) B_(e+1),
  // by row and by column (A, B the decays of step e + 1), in fp32. Only the 64 steps inside a block are
  // then summed from the recurrences' rounded outputs (the chain); summing every later block's totals
  // instead carried their bf16 rounding amplified (docs/design.md). S_e is the state the forward's
  // recurrence (qs, kf, vf) enters block c + 1 with, dS_(e+1) / scale the one dv's recurrence (kf, qs,
  // dos, the decays shifted) enters block c with: the segmented form's state pass and fold over 64-step
  // segments, cut at the same steps in both directions.
  // The two calls of gpu::run_entry_states: the forward's recurrence over the blocks, and dv's over the same
  // blocks in the other order.
  struct EntryStates {
    Recurrence recurrence;
    cuda::ChunkedSegments segments;
  };
  std::array<EntryStates, 2> entry_state_calls() const {
    const cuda::ChunkedSegments blocks = cuda::chunked_segments(N_, T_, a_.cu_seqlens, cuda::backward_chunk, a_.reverse);
    const Decays now = decays(false), next = decays(true);
    return {EntryStates{Recurrence{qs_, kf_, vf_, {now.a, now.b, now.h}, a_.reverse, a_.initial_state ? &h0_ : nullptr, u_out_, nullptr},
                        blocks},
            EntryStates{Recurrence{kf_, qs_, dos_, {next.a, next.b, next.h}, !a_.reverse, d_final_state_ ? &d_final_ : nullptr,
                                   dv_out_, nullptr},
                        reversed(blocks)}};
  }

  void boundary_carry() {
    const Stream* stream = launch_.stream;
    const std::array<EntryStates, 2> calls = entry_state_calls();
    const cuda::ChunkedSegments& blocks = calls[0].segments;
    const std::int64_t rows = blocks.earlier_segments();
    std::array<Scratch, 2> states;
    DeviceBuffer first, s_first;
    const Scratch* s_table = &states[0];
    const Scratch* d_table = &states[1];
    if (rows > 0) {
      // S_e: the forward's recurrence runs in its own direction, so its blocks are the split form's
      // chunks: the state entering every chunk in one pass per state tile (gpu::run_chunk_states),
      // the state after block c of sequence n at chunk row s_first[n] + c. dS: dv's recurrence runs
      // the other way, whose chunks need not meet the blocks (T not a multiple of 64): the segmented
      // form's state pass and fold over the reversed blocks (gpu::run_entry_states), row first[n] + r.
      std::vector<long long> chunk_rows(static_cast<std::size_t>(N_), 0);
      long long total_chunks = 0;
      for (std::int64_t n = 0; n < N_; ++n) {
        const std::int64_t length = a_.cu_seqlens.empty() ? T_ : a_.cu_seqlens[static_cast<std::size_t>(n) + 1] - a_.cu_seqlens[static_cast<std::size_t>(n)];
        chunk_rows[static_cast<std::size_t>(n)] = total_chunks + 1;
        total_chunks += (length + cuda::backward_chunk - 1) / cuda::backward_chunk;
      }
      if (s_table_ready_) s_table = &s_table_;
      else states[0] = scratch(DType::f32, {total_chunks, H_, K_, V_}, stream);
      if (d_table_ready_) d_table = &d_table_;
      else states[1] = scratch(DType::f32, {rows, H_, K_, V_}, stream);
      for (std::size_t c = 0; c < 2; ++c) {
        if (c == 0 ? s_table_ready_ : d_table_ready_) continue;  // boundary_tables() has it
        const Recurrence& r = calls[c].recurrence;
        const RecurrenceCall call = recurrence_call(r);
        if (c == 0)
          run_chunk_states(call.plain, r.rq.view, r.rk.view, r.rv.view, call.inputs, call.options, static_cast<int>(cuda::backward_chunk),
                           states[c].buffer.device_ptr(), launch_);
        else
          run_entry_states(call.plain, r.rq.view, r.rk.view, r.rv.view, call.inputs, call.options, calls[c].segments,
                           states[c].buffer.device_ptr(), launch_);
      }
      first_rows_.assign(static_cast<std::size_t>(N_), 0);
      if (d_table_ready_)  // dv's chunk j of sequence n (j >= 1: dS after block chunks - 1 - j) at row chunk_rows_[n] - 1 + j
        first_rows_ = chunk_rows_;
      else
        for (std::size_t r = 0; r < blocks.all.size(); r += 8) first_rows_[static_cast<std::size_t>(blocks.all[r + 3])] = blocks.all[r + 5];
      first = DeviceBuffer::on_stream(first_rows_.size() * sizeof(long long), stream);
      first.copy_from_host(first_rows_.data(), first.bytes(), 0, stream);
      s_first = DeviceBuffer::on_stream(chunk_rows.size() * sizeof(long long), stream);
      s_first.copy_from_host(chunk_rows.data(), s_first.bytes(), 0, stream);
    }
    const Scratch &s_states = *s_table, &d_states = *d_table;
    const auto type_code = [](DType t) { return t == DType::bf16 ? 1 : t == DType::f16 ? 2 : 0; };
    const auto& loaded = helper("ladle_bwd_carry_states");
    KernelArgs packed;
    packed.add(s_states.buffer.device_ptr()).add(d_states.buffer.device_ptr()).add(s_first.device_ptr()).add(first.device_ptr());
    packed.add(log_a_next_.buffer.device_ptr()).add(type_code(plan_.log_a_next_type)).add(log_h_next_.buffer.device_ptr());
    packed.add(log_b_next_.buffer.device_ptr()).add(type_code(plan_.log_b_next_type));
    packed.add(need_s_t_ ? d_final_.buffer.device_ptr() : std::uint64_t{0}).add(scale_).add(s_t_.buffer.device_ptr());
    packed.add(carry_.buffer.device_ptr()).add(offsets_.device_ptr());
    packed.add(static_cast<int>(N_)).add(static_cast<int>(T_)).add(static_cast<int>(H_)).add(static_cast<int>(K_)).add(static_cast<int>(V_));
    packed.add(static_cast<int>(C_)).add(a_.reverse ? 1 : 0);
    loaded.function->launch({static_cast<unsigned>(C_), static_cast<unsigned>(N_ * H_), 1}, {256, 1, 1}, packed, 0, stream);
    if (block_kernel_) block_gradients(s_states, s_first, d_states, first);
  }

  // u (into u_out_) and dk (into dk_out_) a block at a time from the same boundary states, in fp32 from
  // one set of products (ladle_bwd_block_bf16, codegen/device/plain_backward.cuh).
  void block_gradients(const Scratch& s_states, const DeviceBuffer& s_first, const Scratch& d_states, const DeviceBuffer& first) const {
    const auto& loaded = helper("ladle_bwd_block_bf16", cuda::backward_block_shared);
    const auto type_code = [](DType t) { return t == DType::bf16 ? 1 : t == DType::f16 ? 2 : 0; };
    KernelArgs packed;
    const auto view = [&](const TensorView& x) {
      packed.add(ptr(x.data));
      for (int d = 0; d < 4; ++d) packed.add(static_cast<long long>(x.strides[static_cast<std::size_t>(d)]));
    };
    view(qs_.view), view(kf_.view), view(vf_.view), view(dos_.view);
    if (key_decay_) view(log_a_.view);
    else view(TensorView::contiguous(nullptr, DType::f32, {B_, T_, H_, K_}));
    packed.add(type_code(key_decay_ ? log_a_.view.type : DType::f32));
    packed.add(log_h_.buffer.device_ptr()).add(log_a_next_.buffer.device_ptr()).add(type_code(plan_.log_a_next_type));
    packed.add(log_h_next_.buffer.device_ptr());
    packed.add(s_states.buffer.device_ptr()).add(s_first.device_ptr()).add(h0_.buffer.device_ptr());
    packed.add(d_states.buffer.device_ptr()).add(first.device_ptr()).add(d_final_.buffer.device_ptr()).add(scale_);
    view(u_out_), view(dk_out_);
    packed.add(offsets_.device_ptr());
    packed.add(static_cast<int>(T_)).add(static_cast<int>(H_)).add(static_cast<int>(K_)).add(static_cast<int>(V_)).add(a_.reverse ? 1 : 0);
    const auto halves = static_cast<unsigned>((K_ + cuda::backward_block_keys - 1) / cuda::backward_block_keys);
    loaded.function->launch({static_cast<unsigned>(C_), static_cast<unsigned>(N_ * H_), halves}, {256, 1, 1}, packed,
                            static_cast<unsigned>(cuda::backward_block_shared), launch_.stream);
  }

  // 5. The chain rule into every input's gradient.
  void chain() {
    extras_["carry"] = carry_.buffer.device_ptr();
    for (std::size_t i = 0; i < variant_.inputs.size(); ++i) {
      if (!grad_of_[i]) continue;
      const ir::Input& in = variant_.inputs[i];
      const std::string key = "d/" + in.name;
      const int rank = in.kind == ir::InputKind::head ? 2 : in.kind == ir::InputKind::token_head ? 3 : 4;
      // The view bind_inputs made of the input, over the gradient's memory ([H,K]: no token stride).
      const TensorView g = in.kind == ir::InputKind::head_key ? ops::detail::head_key_view(*grad_of_[i], B_, T_)
                                                              : ops::detail::lead_with_ones(*grad_of_[i], rank);
      // [H] broadcasts over the batch: every b adds into the same element.
      const long long sb = in.kind == ir::InputKind::head && grad_of_[i]->rank() == 1 ? 0 : g.strides[0];
      extras_[key] = ptr(g.data);
      extras_[key + "/sb"] = sb;
      extras_[key + "/st"] = static_cast<long long>(rank >= 3 ? g.strides[1] : 0);
      extras_[key + "/sh"] = static_cast<long long>(g.strides[rank == 2 ? 1 : 2]);
      extras_[key + "/sd"] = static_cast<long long>(rank == 4 ? g.strides[3] : 0);
    }
    if (C_ > 0) launch_generated(cuda::BackwardPhase::chain);
  }

  // The update forms' programs (slots, the form's kernels, chain, helpers), compiled side by side
  // into the cache before the first launch (as compile_ahead does for the plain form): a cold first
  // call would otherwise compile them one after another.
  void compile_update_ahead() const {
    if (!DiskCache::global().enabled() || !first_of_its_kind()) return;
    std::vector<GeneratedKernel> planned;
    try {
      planned = update_kernels();
    } catch (const std::exception&) {
      return;  // a head start only: a kernel that fails to compile fails where it is launched, with its message
    }
    compile_side_by_side(planned, arch_);
  }

  // What an update form's call compiles: slots, the form's program, chain, helpers.
  std::vector<GeneratedKernel> update_kernels() const {
    std::vector<GeneratedKernel> planned{own_kernel(cuda::BackwardPhase::slots)};
    planned.push_back({cuda::update_backward_name(update_spec_), cuda::update_backward_source(update_spec_), "backward update form", "-", 0, 0});
    if (!initial_only_) planned.push_back(own_kernel(cuda::BackwardPhase::chain));
    for (const std::string& name : helpers_launched()) planned.push_back(helper_program(name));
    return planned;
  }

 public:
  // backward_planned_kernels: the programs this call compiles, planned for `arch` with nothing allocated
  // or launched (the call was made with plan_only).
  std::vector<GeneratedKernel> planned(const std::string& arch) {
    arch_ = arch;
    if (plan_.update_form) return update_kernels();
    C_ = longest_blocks();
    if (N_ * H_ * K_ * V_ == 0) return {};
    write_slots();
    convert_states();
    recurrence_outputs();
    return plain_kernels();
  }

 private:

  // The update forms (cuda::UpdateBackwardSpec): their slots in fp32, their form's kernels (ladle_bwd_update's
  // recurrence, then ladle_bwd_update_finish; or the chunked WY form's three), then the chain.
  void update_form() {
    const Stream* stream = launch_.stream;
    const std::int64_t rows = B_ * T_ * H_;
    compile_update_ahead();
    key_shape_ = {B_, T_, H_, K_}, value_shape_ = {B_, T_, H_, V_};
    const std::vector<std::int64_t> head_shape{B_, T_, H_};
    const cuda::UpdateBackwardSpec& spec = update_spec_;
    const auto zeroed = [&](const std::vector<std::int64_t>& shape) {
      Scratch out = scratch(DType::f32, shape, stream);
      fill_device_bytes(out.buffer.device_ptr(), out.buffer.bytes(), 0, stream);
      return out;
    };
    qs_ = scratch(DType::f32, key_shape_, stream), kf_ = scratch(DType::f32, key_shape_, stream);
    vf_ = scratch(DType::f32, value_shape_, stream), dos_ = scratch(DType::f32, value_shape_, stream);
    if (key_decay_) log_a_ = scratch(DType::f32, key_shape_, stream);
    if (head_decay_) log_h_ = scratch(DType::f32, head_shape, stream);
    Scratch scale_s, beta_s, bonus_s;
    if (spec.scale_table) scale_s = scratch(DType::f32, head_shape, stream);
    if (spec.beta) beta_s = scratch(DType::f32, head_shape, stream);
    if (spec.bonus) bonus_s = scratch(DType::f32, key_shape_, stream);
    extras_ = {{"B", static_cast<int>(B_)}, {"T", static_cast<int>(T_)}, {"H", static_cast<int>(H_)},
               {"K", static_cast<int>(K_)}, {"V", static_cast<int>(V_)}, {"VS", static_cast<int>(V_)},
               {"C", static_cast<int>(C_)}, {"cu_seqlens", offsets_.device_ptr()},
               {"qs", ptr(qs_.view.data)}, {"kf", ptr(kf_.view.data)}, {"vf", ptr(vf_.view.data)}, {"dos", ptr(dos_.view.data)},
               {"log_a", log_a_.buffer.device_ptr()}, {"log_h", log_h_.buffer.device_ptr()},
               {"scale_s", scale_s.buffer.device_ptr()}, {"beta_s", beta_s.buffer.device_ptr()},
               {"bonus_s", bonus_s.buffer.device_ptr()}};
    d_output_extras();
    if (C_ > 0) launch_generated(cuda::BackwardPhase::slots);
    if (a_.initial_state) convert(*a_.initial_state, 1.0f, &h0_, nullptr);
    if (d_final_state_) convert(*d_final_state_, 1.0f, &d_final_, nullptr);

    // The slots' gradients: the recurrent form adds those summed over the value slices atomically
    // (zeroed first) and writes dv whole for every token of a sequence; the chunked form writes every
    // one for every token of a sequence, a head decay's d log h per token (into gh directly). Zeroed
    // where tokens outside every sequence would keep them.
    const bool written = spec.chunked && !spec.varlen;
    const auto slot_gradient = [&](const std::vector<std::int64_t>& shape) { return written ? scratch(DType::f32, shape, stream) : zeroed(shape); };
    Scratch gq = slot_gradient(key_shape_), gk = slot_gradient(key_shape_), gv = slot_gradient(value_shape_), ga, gh, gscale, gbeta, gbonus;
    if (spec.chunked && head_decay_) gh = slot_gradient(head_shape);
    else if (key_decay_ || head_decay_) ga = spec.chunked ? slot_gradient(key_shape_) : zeroed(key_shape_);
    if (head_decay_ && !spec.chunked) gh = scratch(DType::f32, head_shape, stream);
    if (spec.scale_table) gscale = scratch(DType::f32, head_shape, stream);
    if (spec.beta) gbeta = spec.chunked ? slot_gradient(head_shape) : zeroed(head_shape);
    if (spec.bonus) gbonus = zeroed(key_shape_);
    Scratch ckpt = scratch(DType::f32, {cuda::update_backward_ckpt_floats(spec, N_, H_, C_, K_, V_)}, stream);
    Scratch chunk = scratch(DType::f32, {cuda::update_backward_chunk_floats(spec, N_, H_, K_, V_)}, stream);
    {
      const bool initial_gradient = a_.initial_state && gradients_.d_initial_state;
      KernelArgs packed;
      packed.add(ptr(qs_.view.data)).add(ptr(kf_.view.data)).add(ptr(vf_.view.data)).add(ptr(dos_.view.data));
      packed.add(log_a_.buffer.device_ptr()).add(log_h_.buffer.device_ptr()).add(scale_s.buffer.device_ptr()).add(scale_);
      packed.add(beta_s.buffer.device_ptr()).add(bonus_s.buffer.device_ptr()).add(h0_.buffer.device_ptr()).add(d_final_.buffer.device_ptr());
      packed.add(ckpt.buffer.device_ptr()).add(chunk.buffer.device_ptr());
      packed.add(gq.buffer.device_ptr()).add(gk.buffer.device_ptr()).add(gv.buffer.device_ptr());
      packed.add(spec.chunked && head_decay_ ? gh.buffer.device_ptr() : ga.buffer.device_ptr());  // the chunked form: d log h per token
      packed.add(gbeta.buffer.device_ptr()).add(gbonus.buffer.device_ptr());
      packed.add(initial_gradient ? ptr(gradients_.d_initial_state->data) : std::uint64_t{0});
      packed.add(offsets_.device_ptr());
      packed.add(static_cast<int>(T_)).add(static_cast<int>(H_)).add(static_cast<int>(K_)).add(static_cast<int>(V_)).add(static_cast<int>(C_));
      for (const cuda::UpdateBackwardLaunch& launch : cuda::update_backward_launches(spec, N_, H_, C_, K_, V_)) {
        struct UpdateKernel {
          std::string name;
          int shared_bytes = 0;
        };
        const auto& loaded = detail::loaded_kernel<UpdateKernel>("update backward|" + launch.name, arch_, [&](const std::string& target) {
          struct {
            UpdateKernel kernel;
            CompiledProgram program;
          } out{{launch.name, launch.shared_bytes}, compile_update_backward(spec, target)};
          return out;
        });
        if (launch.grid[0] > 0 && launch.grid[1] > 0 && launch.grid[2] > 0)
          loaded.function->launch({launch.grid[0], launch.grid[1], launch.grid[2]}, {launch.threads, 1, 1}, packed,
                                  static_cast<unsigned>(launch.shared_bytes), stream);
      }
    }
    {
      const auto& loaded = helper("ladle_bwd_update_finish");
      KernelArgs packed;
      packed.add(ptr(qs_.view.data)).add(ptr(kf_.view.data)).add(scale_s.buffer.device_ptr()).add(scale_);
      packed.add(gq.buffer.device_ptr()).add(gk.buffer.device_ptr()).add(ga.buffer.device_ptr()).add(gscale.buffer.device_ptr());
      packed.add(spec.chunked ? std::uint64_t{0} : gh.buffer.device_ptr()).add(spec.l2 ? 1 : 0).add(ir::l2_normalize_eps);
      packed.add(static_cast<long long>(rows));
      packed.add(static_cast<int>(K_));
      if (rows > 0) loaded.function->launch({blocks_of(rows * 32, 256), 1, 1}, {256, 1, 1}, packed, 0, stream);
    }
    extras_["gq"] = gq.buffer.device_ptr(), extras_["gk"] = gk.buffer.device_ptr(), extras_["gv"] = gv.buffer.device_ptr();
    extras_["ga"] = ga.buffer.device_ptr(), extras_["gh"] = gh.buffer.device_ptr(), extras_["gscale"] = gscale.buffer.device_ptr();
    extras_["gbeta"] = gbeta.buffer.device_ptr(), extras_["gbonus"] = gbonus.buffer.device_ptr();
    if (!initial_only_) chain();  // run_initial_state_gradient: d initial_state alone (the kernel wrote it)
  }

  // 6. d initial_state = A_0 dS_0 B_0 at each sequence's first step (dS_0 read as dS_0 / scale).
  void initial_state_gradient() const {
    if (!a_.initial_state) return;
    const auto& loaded = helper("ladle_bwd_initial");
    KernelArgs packed;
    packed.add(ds0_.buffer.device_ptr()).add(first_decay_.buffer.device_ptr()).add(scale_);
    packed.add(ptr(gradients_.d_initial_state->data)).add(offsets_.device_ptr());
    packed.add(static_cast<int>(N_)).add(static_cast<int>(T_)).add(static_cast<int>(H_)).add(static_cast<int>(K_)).add(static_cast<int>(V_));
    packed.add(static_cast<int>(VS_));
    loaded.function->launch({blocks_of(N_ * H_ * K_ * V_, 256), 1, 1}, {256, 1, 1}, packed, 0, launch_.stream);
  }

  const ir::Variant& variant_;
  const RunOptions& options_;
  const TensorView& d_output_;
  const std::optional<TensorView>& d_final_state_;
  const RecurrentGradientViews& gradients_;
  const LaunchOptions& launch_;
  const std::string op_;
  const ops::detail::Checker check_;
  const ops::BoundInputs bound_;
  const cpu::RecurrentArgs& a_;
  const bool initial_only_;  // run_initial_state_gradient: dL/d initial_state alone
  const bool plan_only_;     // planned(): views without memory, nothing launched (backward_planned_kernels)
  std::int64_t B_ = 0, T_ = 0, H_ = 0, K_ = 0, V_ = 0, N_ = 0, VS_ = 0, C_ = 0;
  unsigned threads_ = 0;
  std::vector<const TensorView*> grad_of_;
  cuda::BackwardKernelSpec plan_;
  cuda::UpdateBackwardSpec update_spec_;  // the update forms'
  float scale_ = 1.0f;
  bool key_decay_ = false, head_decay_ = false, decays_k_ = false, decays_v_ = false, need_s_t_ = false, boundary_states_ = false;
  Scratch s_table_, d_table_;        // boundary_tables(): S and dS / scale entering every block, where the ws form wrote them
  bool s_table_ready_ = false, d_table_ready_ = false;
  std::vector<long long> chunk_rows_;  // each sequence's first block row + 1 in those tables
  bool block_kernel_ = false;  // u and dk from ladle_bwd_block_bf16: recurrence 0 runs only for S_T, recurrence 2 not at all
  std::vector<long long> first_rows_;  // boundary_carry: each sequence's first row of the boundary tables
  std::string arch_;
  DeviceBuffer offsets_;
  std::vector<std::int64_t> key_shape_, value_shape_;
  Scratch qs_, kf_, vf_, dos_, log_a_, log_a_next_, log_b_, log_b_next_, log_h_, log_h_next_, first_decay_;
  Scratch h0_, h0_t_, d_final_, d_final_t_;
  Scratch u_, dks_, dvs_, s_t_, ds0_, o_f_, totals_, carry_;
  TensorView u_out_, dk_out_, dv_out_;
  std::map<std::string, Extra> extras_;
  mutable std::string signature_;  // signature(), once made
};

}  // namespace

void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients,
                               const LaunchOptions& launch) {
  BackwardCall call(variant, q, k, v, inputs, options, d_output, d_final_state, gradients, launch);
  // A cold call of the chunked forms (their programs in neither cache) starts their compile behind it
  // and runs the fused-recurrent backward meanwhile (detail/interim.h): its programs compile in about a
  // third of the time. The same gradients, computed with fp32 slots.
  if (options.algorithm == Algorithm::automatic && !options.chunked_tile && call.chunked()) {
    const std::string arch = Device::get().properties().arch();
    const auto programs = [&] {
      return backward_planned_kernels(variant, q, k, v, inputs, options, d_output, d_final_state, arch);
    };
    if (detail::interim(options, "backward\n" + call.signature(), arch, programs, launch, "the fused-recurrent backward")) {
      RunOptions recurrent = options;
      recurrent.algorithm = Algorithm::recurrent;
      if (recurrent.update_backward == UpdateBackward::automatic) recurrent.update_backward = UpdateBackward::recurrent;
      BackwardCall(variant, q, k, v, inputs, recurrent, d_output, d_final_state, gradients, launch).run();
      return;
    }
  }
  call.run();
}

std::vector<GeneratedKernel> backward_planned_kernels(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                                                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                                                      const TensorView& d_output, const std::optional<TensorView>& d_final_state,
                                                      const std::string& arch) {
  if (arch.empty()) throw InvalidArgument(op_name(variant) + ": backward_planned_kernels: arch is empty, expected a target such as sm_90a");
  // The gradients as the call would take them, without memory: fp32, each its input's shape.
  const auto like = [](const TensorView& x) { return planned_view(DType::f32, x.shape); };
  RecurrentGradientViews gradients{like(q), like(k), like(v), {}, std::nullopt};
  for (const ir::Input& in : variant.inputs)
    if (in.kind != ir::InputKind::scalar && in.role == ir::Role::other)
      if (const auto found = inputs.tensors.find(in.name); found != inputs.tensors.end()) gradients.inputs.emplace(in.name, like(found->second));
  if (options.initial_state) gradients.d_initial_state = like(*options.initial_state);
  return BackwardCall(variant, q, k, v, inputs, options, d_output, d_final_state, gradients, {}, false, true).planned(arch);
}

void run_initial_state_gradient(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                                const std::optional<TensorView>& d_final_state, const TensorView& d_initial_state,
                                const LaunchOptions& launch) {
  RecurrentGradientViews only;
  only.d_initial_state = d_initial_state;
  BackwardCall(variant, q, k, v, inputs, options, d_output, d_final_state, only, launch, true).run();
}

}  // namespace ladle::gpu
