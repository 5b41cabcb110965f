// Random inputs for a test case of cuda_cases.h, bound as the ops bind them, and the
// kernel argument array a launcher would pack from them (for the host emulation).
#pragma once

#include <ladle/codegen/cpu/recurrent.h>
#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/ops/bind.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/runtime/tensor_map.h>

#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "cuda_cases.h"
#include "support/tensors.h"

namespace case_binding {

using namespace ladle;


// Random inputs for every input of a case, bound as the ops bind them.
struct Bound {
  std::deque<Tensor> store;
  ops::BoundInputs inputs;
  RunOptions options;
  int sequences = 0;
};

inline Bound bind_case(const cuda_cases::Case& c, std::uint64_t seed) {
  Bound bound;
  std::mt19937_64 rng(seed);
  const auto keep = [&](test::Filled f) { return bound.store.emplace_back(std::move(f.tensor)).view(); };
  const ir::Variant& variant = c.variant;
  TensorView q, k, v;
  VariantInputs named;
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Input& in = variant.inputs[i];
    const DType type = c.spec.input_types[i];
    const int heads = in.role == ir::Role::key || in.role == ir::Role::value ? c.H_kv : c.H;
    const std::int64_t features = in.kind == ir::InputKind::token_value ? c.V : c.K;
    std::vector<std::int64_t> shape = {c.B, c.T, heads, features};
    if (in.kind == ir::InputKind::token_head) shape.pop_back();
    if (in.kind == ir::InputKind::head) shape = {c.H};
    if (in.kind == ir::InputKind::head_key) shape = {c.H, c.K};
    // w: RWKV6's per-key log decay.
    const bool gate = in.name == "g" || in.name == "gk" || in.name == "gv" || in.name == "g_t" || in.name == "state" || in.name == "w";
    std::uniform_real_distribution<double> positive(in.name == "tau" ? 4.0 : 0.5, in.name == "tau" ? 32.0 : 1.5);
    // A hard_reset case's value goes into the gates where cuda_cases::hard_reset_at says, into x
    // (logsigmoid(-inf) = -inf) and, negated, into y (-softplus(+inf) = -inf); g_gamma takes it
    // for head 0, so that every token of that head resets.
    const auto plant = [&](test::Filled f) {
      if (c.hard_reset == 0) return f;
      if (in.name == "g_gamma") {
        f.tensor.set(0, static_cast<float>(c.hard_reset));
      } else if (gate || in.name == "x" || in.name == "y") {
        const std::int64_t width = in.kind == ir::InputKind::token_head ? 1 : features;
        for (std::int64_t e = 0; e < f.tensor.numel(); ++e)
          if (cuda_cases::hard_reset_at(e / (width * heads) % c.T, e % width))
            f.tensor.set(e, static_cast<float>(in.name == "y" ? -c.hard_reset : c.hard_reset));
      }
      return f;
    };
    // The delta rule without in-kernel normalisation: keys of unit length on average and beta in
    // (0, 1], so that (I - beta k k^T) stays a contraction as in a model.
    const bool short_keys = variant.update == ir::Update::delta && !variant.l2_normalize_qk && in.role == ir::Role::key;
    if (in.kind == ir::InputKind::scalar) {
      named.scalars[in.name] = 0.4f;
    } else if (in.name == "beta") {
      std::uniform_real_distribution<double> strength(0.1, 1.0);
      named.tensors[in.name] = keep(test::filled(type, shape, [&] { return strength(rng); }));
    } else if (short_keys) {
      k = keep(test::normal(rng, type, shape, 1.0 / std::sqrt(double(c.K))));
    } else if (in.name == "g_gamma") {
      named.tensors[in.name] = keep(plant(test::filled(type, shape, [&] { return c.gate_level != 0 ? c.gate_level : -0.05; })));
    } else if (gate && c.gate_level != 0) {
      std::uniform_real_distribution<double> strong(c.gate_level - 2, c.gate_level + 2);
      named.tensors[in.name] = keep(plant(test::filled(type, shape, [&] { return strong(rng); })));
    } else if (in.kind == ir::InputKind::head) {
      named.tensors[in.name] = keep(test::filled(type, shape, [&] { return positive(rng); }));
    } else {
      const TensorView view = keep(plant(gate ? test::log_gate(rng, type, shape) : test::normal(rng, type, shape)));
      if (in.role == ir::Role::query) q = view;
      else if (in.role == ir::Role::key) k = view;
      else if (in.role == ir::Role::value) v = view;
      else named.tensors[in.name] = view;
    }
  }
  bound.sequences = c.cu_seqlens.empty() ? c.B : static_cast<int>(c.cu_seqlens.size()) - 1;
  if (!c.cu_seqlens.empty()) {
    Tensor& offsets = bound.store.emplace_back(DType::i64, std::vector<std::int64_t>{std::int64_t(c.cu_seqlens.size())});
    std::memcpy(offsets.data(), c.cu_seqlens.data(), c.cu_seqlens.size() * sizeof(std::int64_t));
    bound.options.cu_seqlens = offsets.view();
  }
  if (c.spec.initial_state)
    bound.options.initial_state = keep(test::normal(rng, c.spec.initial_state_type, {bound.sequences, c.H, c.K, c.V}));
  bound.options.reverse = c.spec.reverse;
  bound.options.return_state = c.spec.final_state;
  bound.inputs = ops::bind_inputs(c.name, variant, q, k, v, named, bound.options);
  return bound;
}

// What the split chunked form's kernels take besides the call's arguments (host memory here).
struct SplitArguments {
  void* chunk_states = nullptr;
  const std::int64_t* chunk_offsets = nullptr;
  int sequences = 0;
  const long long* segments = nullptr;  // the segmented form (cuda::ChunkedSegments)
  float* segment_states = nullptr;
  float* segment_decay = nullptr;
  void* delta_w = nullptr;  // the chunked delta rule's work arrays
  void* delta_u = nullptr;
  void* delta_k = nullptr;
  void* delta_e = nullptr;
  void* delta_h = nullptr;
  float* delta_gamma = nullptr;
};

// The kernel's argument array, packed from the bound arguments as a launcher packs it.
class Arguments {
 public:
  Arguments(const std::vector<cuda::KernelParam>& params, const cuda_cases::Case& c, const cpu::RecurrentArgs& args,
            const SplitArguments& split = {}) {
    using Role = cuda::KernelParam::Role;
    for (const cuda::KernelParam& p : params) {
      const TensorView* view = p.input >= 0 ? &args.tensors[p.input] : nullptr;
      const bool head_param = p.input >= 0 && c.variant.inputs[p.input].kind == ir::InputKind::head;
      switch (p.role) {
        case Role::input:
          if (p.type == cuda::KernelParam::Type::f32) push(args.scalars[p.input]);
          else push(static_cast<const void*>(view->data));
          break;
        case Role::input_stride_b: push(static_cast<long long>(view->strides[0])); break;
        case Role::input_stride_t: push(static_cast<long long>(view->strides[1])); break;
        case Role::input_stride_h: push(static_cast<long long>(view->strides[head_param ? 1 : 2])); break;
        case Role::input_stride_d: push(static_cast<long long>(view->strides[3])); break;
        case Role::input_heads: push(static_cast<int>(view->shape[head_param ? 1 : 2])); break;
        case Role::output: push(static_cast<const void*>(args.output.data)); break;
        case Role::output_stride_b: push(static_cast<long long>(args.output.strides[0])); break;
        case Role::output_stride_t: push(static_cast<long long>(args.output.strides[1])); break;
        case Role::output_stride_h: push(static_cast<long long>(args.output.strides[2])); break;
        case Role::output_stride_d: push(static_cast<long long>(args.output.strides[3])); break;
        case Role::initial_state: push(static_cast<const void*>(args.initial_state->data)); break;
        case Role::final_state: push(static_cast<const void*>(args.final_state->data)); break;
        case Role::cu_seqlens:
          offsets32_.assign(args.cu_seqlens.begin(), args.cu_seqlens.end());
          push(c.spec.cu_seqlens_type == DType::i32 ? static_cast<const void*>(offsets32_.data())
                                                          : static_cast<const void*>(args.cu_seqlens.data()));
          break;
        case Role::batch: push(static_cast<int>(args.batch)); break;
        case Role::tokens: push(static_cast<int>(args.tokens)); break;
        case Role::heads: push(static_cast<int>(args.heads)); break;
        case Role::key_dim: push(static_cast<int>(args.key_dim)); break;
        case Role::value_dim: push(static_cast<int>(args.value_dim)); break;
        case Role::chunk_states: push(static_cast<const void*>(split.chunk_states)); break;
        case Role::chunk_offsets: push(static_cast<const void*>(split.chunk_offsets)); break;
        case Role::sequences: push(split.sequences); break;
        case Role::segments: push(static_cast<const void*>(split.segments)); break;
        case Role::segment_states: push(static_cast<const void*>(split.segment_states)); break;
        case Role::segment_decay: push(static_cast<const void*>(split.segment_decay)); break;
        case Role::delta_w: push(static_cast<const void*>(split.delta_w)); break;
        case Role::delta_u: push(static_cast<const void*>(split.delta_u)); break;
        case Role::delta_k: push(static_cast<const void*>(split.delta_k)); break;
        case Role::delta_e: push(static_cast<const void*>(split.delta_e)); break;
        case Role::delta_h: push(static_cast<const void*>(split.delta_h)); break;
        case Role::delta_gamma: push(static_cast<const void*>(split.delta_gamma)); break;
        case Role::input_tensor_map: push(describe_tensor_map(gpu::attention_tensor_map(*view, p.box_rows))); break;
      }
    }
    for (auto& value : values_) pointers_.push_back(value.data());
  }
  void** data() { return pointers_.data(); }

 private:
  template <class T>
  void push(const T& value) {
    std::vector<std::byte>& bytes = values_.emplace_back(sizeof(T));
    std::memcpy(bytes.data(), &value, sizeof(T));
  }
  std::deque<std::vector<std::byte>> values_;
  std::vector<void*> pointers_;
  std::vector<std::int32_t> offsets32_;
};


// Runs case c through the CPU path and through `emulate` (a generated kernel on the host
// emulation, given the bound GPU-side arguments), both into NaN-poisoned outputs, and returns
// the relative errors of o and of the final state (0 when the case returns none) against the CPU.
struct Errors {
  double o = 0, final_state = 0;
};
inline Errors emulated_against_cpu(const cuda_cases::Case& c, std::uint64_t seed,
                                   const std::function<void(const ops::BoundInputs& gpu_run, const Bound& bound)>& emulate) {
  Bound bound = bind_case(c, seed);
  const std::vector<std::int64_t> o_shape = {c.B, c.T, c.H, c.V}, state_shape = {bound.sequences, c.H, c.K, c.V};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor o_cpu(c.spec.output_type, o_shape, nan), o_gpu(c.spec.output_type, o_shape, nan);
  Tensor final_cpu(DType::f32, state_shape, nan), final_gpu(DType::f32, state_shape, nan);
  const auto outputs = [&](Tensor& o, Tensor& final_state) {
    RecurrentOutputs out{o.view(), std::nullopt};
    if (c.spec.final_state) out.final_state = final_state.view();
    return out;
  };
  ops::BoundInputs cpu_run = bound.inputs;
  ops::bind_outputs(c.name, bound.options, outputs(o_cpu, final_cpu), cpu_run);
  cpu::run_recurrent(c.variant, cpu_run.args);

  ops::BoundInputs gpu_run = bound.inputs;
  ops::bind_outputs(c.name, bound.options, outputs(o_gpu, final_gpu), gpu_run);
  emulate(gpu_run, bound);

  Errors errors;
  errors.o = test::relative_error(o_gpu, test::values_of(o_cpu));
  if (c.spec.final_state) errors.final_state = test::relative_error(final_gpu, test::values_of(final_cpu));
  return errors;
}

}  // namespace case_binding
