#include "attention.h"
#include "context_parallel.h"

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include <ladle/codegen/cpu/attention.h>
#include <ladle/dsl/softmax.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "attention_bind.h"
#include "detail/checks.h"
#include "detail/fingerprint.h"
#include "detail/gpu_call.h"
#include "gpu_attention.h"
#include "gpu_attention_backward.h"

namespace ladle {

double dropout_uniform(std::uint64_t seed, std::uint64_t sequence, std::uint64_t head, std::uint64_t i,
                       std::uint64_t j) {
  return cpu::dropout_uniform(seed, sequence, head, i, j);
}

namespace {

std::string op_name(const ir::AttentionVariant& variant) { return variant.name.empty() ? "attention" : variant.name; }

// Every tensor argument of a call, by the name its caller knows.
std::vector<ops::detail::NamedView> argument_views(const TensorView& q, const TensorView& k, const TensorView& v,
                                                   const VariantInputs& inputs, const AttentionRunOptions& options) {
  std::vector<ops::detail::NamedView> views{{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, view] : inputs.tensors) views.push_back({name, &view});
  const std::pair<const char*, const std::optional<TensorView>*> optional[] = {
      {"q_segment_ids", &options.q_segment_ids}, {"kv_segment_ids", &options.kv_segment_ids},
      {"softmax_aux", &options.softmax_aux},     {"cu_seqlens_q", &options.cu_seqlens_q},
      {"cu_seqlens_k", &options.cu_seqlens_k}};
  for (const auto& [name, view] : optional)
    if (*view) views.push_back({name, &**view});
  return views;
}

// The checks read cu_seqlens on the host: device ones are copied down (kept in `keep`).
AttentionRunOptions with_host_seqlens(const AttentionRunOptions& options, std::deque<Tensor>& keep) {
  AttentionRunOptions checked = options;
  for (std::optional<TensorView>* seqlens : {&checked.cu_seqlens_q, &checked.cu_seqlens_k})
    if (*seqlens && (*seqlens)->on_device()) {
      keep.push_back(Tensor::copy_of(**seqlens, Location::host(), options.gpu.stream));
      *seqlens = keep.back().view();
    }
  return checked;
}

// A call's named inputs and options as the GPU path reads them (the forward's and the backward's):
// each tensor through `call` (device memory in place, host memory uploaded or refused by name), the
// packed sequences' offsets on the host.
struct DeviceArguments {
  VariantInputs inputs;
  AttentionRunOptions options;
};

DeviceArguments device_arguments(ops::detail::GpuCall& call, const VariantInputs& inputs, const AttentionRunOptions& options) {
  DeviceArguments out{{{}, inputs.scalars}, options};
  for (const auto& [name, view] : inputs.tensors) out.inputs.tensors[name] = call.input(name, view);
  if (options.q_segment_ids) out.options.q_segment_ids = call.input("q_segment_ids", *options.q_segment_ids);
  if (options.kv_segment_ids) out.options.kv_segment_ids = call.input("kv_segment_ids", *options.kv_segment_ids);
  if (options.softmax_aux) out.options.softmax_aux = call.input("softmax_aux", *options.softmax_aux);
  if (options.cu_seqlens_q) out.options.cu_seqlens_q = call.host_input("cu_seqlens_q", *options.cu_seqlens_q);
  if (options.cu_seqlens_k) out.options.cu_seqlens_k = call.host_input("cu_seqlens_k", *options.cu_seqlens_k);
  return out;
}

// The GPU path: device tensors as they are, host ones through the call's stream.
void run_on_gpu(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                const VariantInputs& inputs, const AttentionRunOptions& options, const AttentionOutputs& outputs) {
  const std::string op = op_name(variant);
  {
    // Bad input is refused before any GPU work.
    std::deque<Tensor> keep;
    const AttentionRunOptions checked = with_host_seqlens(options, keep);
    ops::AttentionArgs args = ops::bind_attention(op, variant, q, k, v, inputs, checked);
    ops::bind_attention_outputs(op, checked, outputs, args);
  }
  ops::detail::GpuCall call(op, options.gpu);
  const auto [device_inputs, device_options] = device_arguments(call, inputs, options);
  const TensorView dq = call.input("q", q), dk = call.input("k", k), dv = call.input("v", v);
  ops::AttentionArgs device = ops::bind_attention(op, variant, dq, dk, dv, device_inputs, device_options);
  AttentionOutputs device_outputs{call.output("o", outputs.o), std::nullopt};
  if (outputs.lse) device_outputs.lse = call.output("lse", *outputs.lse);
  ops::bind_attention_outputs(op, options, device_outputs, device);
  gpu::run_attention_into(variant, device, {options.gpu.stream});
  call.finish();
}

}  // namespace

AttentionResult run_attention(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                              const TensorView& v, const VariantInputs& inputs, const AttentionRunOptions& options) {
  const std::string op = op_name(variant);
  const auto views = argument_views(q, k, v, inputs, options);
  const bool on_gpu = ops::detail::runs_on_gpu(op, options.backend, views);  // false: every view is host memory
  std::deque<Tensor> keep;
  const ops::AttentionArgs args = ops::bind_attention(op, variant, q, k, v, inputs, with_host_seqlens(options, keep));
  const Location where = on_gpu && q.on_device() ? q.location : Location::host();
  // Every row of o and lse is written (o = 0, lse = -inf where nothing was attended).
  AttentionResult result{Tensor::for_output(args.type, args.output_shape(), where, options.gpu.stream), std::nullopt};
  AttentionOutputs outputs{result.o.view(), std::nullopt};
  if (options.return_lse) {
    result.lse = Tensor::for_output(DType::f32, args.lse_shape(), where, options.gpu.stream);
    outputs.lse = result.lse->view();
  }
  run_attention_into(variant, q, k, v, inputs, options, outputs);
  return result;
}

void run_attention_into(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                        const TensorView& v, const VariantInputs& inputs, const AttentionRunOptions& options,
                        const AttentionOutputs& outputs) {
  const std::string op = op_name(variant);
  auto views = argument_views(q, k, v, inputs, options);
  views.push_back({"o", &outputs.o});
  if (outputs.lse) views.push_back({"lse", &*outputs.lse});
  if (ops::detail::runs_on_gpu(op, options.backend, views)) return run_on_gpu(variant, q, k, v, inputs, options, outputs);
  ops::AttentionArgs args = ops::bind_attention(op, variant, q, k, v, inputs, options);
  ops::bind_attention_outputs(op, options, outputs, args);
  cpu::run_attention(variant, args);
}

// ---------------------------------------------------------------------------------------
// The backward

namespace {

// Device tensors are hashed on the device (ops/detail/fingerprint.h), on the call's stream.
std::uint64_t fingerprint(const TensorView& q, const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                          const AttentionRunOptions& options) {
  return ops::detail::fingerprint({q, k, v, options.q_segment_ids, options.kv_segment_ids, options.softmax_aux, options.cu_seqlens_q,
                                   options.cu_seqlens_k},
                                  inputs.tensors, inputs.scalars, options.gpu.stream);
}

// The fingerprint a saved value keeps: none where the caller guards its tensors itself.
std::uint64_t saved_fingerprint(const TensorView& q, const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                                const AttentionRunOptions& options) {
  return options.check_saved ? fingerprint(q, k, v, inputs, options) : 0;
}

// A gradient's view shaped as `canonical` (the bound input's view): leading axes added and each
// broadcast axis (size 1 in the gradient, more in the canonical view) at stride 0.
TensorView broadcast_like(const TensorView& grad, const TensorView& canonical) {
  TensorView view = ops::detail::lead_with_ones(grad, canonical.rank());
  for (int d = 0; d < canonical.rank(); ++d)
    if (view.shape[static_cast<std::size_t>(d)] != canonical.shape[static_cast<std::size_t>(d)]) {
      view.shape[static_cast<std::size_t>(d)] = canonical.shape[static_cast<std::size_t>(d)];
      view.strides[static_cast<std::size_t>(d)] = 0;
    }
  return view;
}

// That saved's tensors still hold what its forward read. On the GPU path it runs once the GpuCall
// has checked every address with the driver, so a mislabelled pointer is refused by name before
// the fingerprint's kernel reads it.
void check_fingerprint(const std::string& op, const AttentionSaved& saved) {
  if (!saved.options.check_saved) return;  // the caller guards the tensors (AttentionRunOptions::check_saved)
  if (fingerprint(saved.q, saved.k, saved.v, saved.inputs, saved.options) != saved.fingerprint)
    throw InvalidArgument(op + ": saved: its tensors no longer hold what its forward read (changed since, or the value belongs to "
                               "another call)");
}

}  // namespace

AttentionForward run_attention_for_backward(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                                            const TensorView& v, const VariantInputs& inputs, const AttentionRunOptions& options) {
  const std::string op = op_name(variant);
  AttentionRunOptions run = options;
  if (ops::detail::runs_on_gpu(op, options.backend, argument_views(q, k, v, inputs, options))) {
    // The GPU backward when it takes the call (backend gpu: else an error saying why; automatic: else the CPU).
    std::deque<Tensor> keep;
    const ops::AttentionArgs args = ops::bind_attention(op, variant, q, k, v, inputs, with_host_seqlens(options, keep));
    Device::get();
    const std::vector<std::string> problems = gpu::gpu_attention_backward_unsupported(variant, args);
    if (problems.empty()) {
      run.backend = Backend::gpu;
      run.return_lse = true;  // the backward's softmax statistics
      // As run_attention runs it: device tensors in place, o and lse where q lives. The fingerprint
      // after it, once the GPU path has checked every address it hashes.
      AttentionResult result = run_attention(variant, q, k, v, inputs, run);
      // The caller's copies of o and lse (saved keeps its own), made on the call's stream: a Tensor's
      // copy constructor orders a device copy on the default stream, which a non-blocking stream's
      // kernels are not ordered with.
      const auto copied = [&](const Tensor& t) { return t.to(t.location(), options.gpu.stream); };
      AttentionForward out{{copied(result.o), std::nullopt},
                           {variant, q, k, v, inputs, run, saved_fingerprint(q, k, v, inputs, run), true, nullptr, nullptr}};
      if (options.return_lse) out.result.lse = copied(*result.lse);
      out.saved.o = std::make_shared<const Tensor>(std::move(result.o));
      out.saved.lse = std::make_shared<const Tensor>(std::move(*result.lse));
      return out;
    }
    if (options.backend == Backend::gpu) throw InvalidArgument(op + ": backend = gpu: the GPU backward does not take this call: " + problems.front());
    ops::detail::require_host_views(op, argument_views(q, k, v, inputs, options),
                                    "the GPU backward does not take this call (" + problems.front() +
                                        "), and the CPU path that backend = automatic falls back to reads every tensor on the host");
  }
  run.backend = Backend::cpu;
  AttentionForward out{run_attention(variant, q, k, v, inputs, run), {variant, q, k, v, inputs, run, saved_fingerprint(q, k, v, inputs, run), true, nullptr, nullptr}};
  return out;
}

namespace {

// The gradients a backward returns, at `where`: dq, dk, dv, every floating tensor input's of the
// score expression (a mask has none) and the sinks'. Host ones start at 0 (the CPU backward adds
// into them); the GPU backward overwrites every gradient.
AttentionGradients allocate_gradients(const AttentionSaved& saved, Location where, const Stream* stream) {
  const auto gradient = [&](const std::vector<std::int64_t>& shape) {
    return where.is_device() ? Tensor::for_output(DType::f32, shape, where, stream) : Tensor(DType::f32, shape, 0.0f);
  };
  AttentionGradients out{gradient(saved.q.shape), gradient(saved.k.shape), gradient(saved.v.shape), {}, std::nullopt};
  for (const ir::Input& in : saved.variant.inputs) {
    if (in.role != ir::Role::other || in.kind == ir::InputKind::scalar) continue;
    const TensorView& given = saved.inputs.tensors.at(in.name);
    if (given.type == DType::u8) continue;  // a mask: no gradient
    out.inputs.emplace(in.name, gradient(given.shape));
  }
  if (saved.options.softmax_aux) out.d_softmax_aux.emplace(gradient(saved.options.softmax_aux->shape));
  return out;
}

// The backward on the GPU under the forward's rules (GpuCall): device tensors read in place, host
// ones (the saved arguments, the forward's o and lse, d_output) uploaded on options.gpu.stream or
// refused by name when upload_host_tensors is off. The gradients live where q lives, as the
// forward's outputs do: a host one is computed in a device stand-in and copied back by finish().
AttentionGradients backward_on_gpu(const AttentionSaved& saved, const TensorView& d_output) {
  const std::string op = op_name(saved.variant) + " backward";
  const AttentionRunOptions& options = saved.options;
  ops::detail::GpuCall call(op, options.gpu);
  const TensorView q = call.input("q", saved.q), k = call.input("k", saved.k), v = call.input("v", saved.v);
  const auto [device_inputs, device_options] = device_arguments(call, saved.inputs, options);
  ops::AttentionArgs device = ops::bind_attention(op, saved.variant, q, k, v, device_inputs, device_options);
  AttentionOutputs outputs{call.input("o", saved.o->view()), call.input("lse", saved.lse->view())};
  ops::bind_attention_outputs(op, device_options, outputs, device);
  cpu::AttentionGrads grads;
  grads.d_output = ops::detail::lead_with_ones(call.input("d_output", d_output), 4);
  check_fingerprint(op, saved);

  AttentionGradients out = allocate_gradients(saved, saved.q.on_device() ? saved.q.location : Location::host(), options.gpu.stream);
  // The gradients as the kernels write them: canonical views (broadcast axes at stride 0).
  grads.dq = broadcast_like(call.output("dq", out.dq.view()), device.q);
  grads.dk = broadcast_like(call.output("dk", out.dk.view()), device.k);
  grads.dv = broadcast_like(call.output("dv", out.dv.view()), device.v);
  grads.d_tensors.resize(saved.variant.inputs.size());
  for (std::size_t i = 0; i < saved.variant.inputs.size(); ++i) {
    const auto found = out.inputs.find(saved.variant.inputs[i].name);
    if (found != out.inputs.end())
      grads.d_tensors[i] = broadcast_like(call.output("d" + found->first, found->second.view()), device.tensors[i]);
  }
  if (out.d_softmax_aux) grads.d_softmax_aux = broadcast_like(call.output("d_softmax_aux", out.d_softmax_aux->view()), *device.softmax_aux);
  gpu::run_attention_backward_into(saved.variant, device, grads, {options.gpu.stream});
  call.finish();
  return out;
}

}  // namespace

AttentionGradients run_attention_backward(const AttentionSaved& saved, const TensorView& d_output) {
  const std::string op = op_name(saved.variant) + " backward";
  if (!saved.valid) throw InvalidArgument(op + ": saved holds no forward (make it with run_attention_for_backward)");
  const bool on_gpu = saved.o && saved.lse;  // the forward ran on the GPU
  // The CPU backward reads every tensor on the host: a device one is refused by name.
  if (!on_gpu) {
    auto views = argument_views(saved.q, saved.k, saved.v, saved.inputs, saved.options);
    views.push_back({"d_output", &d_output});
    ops::detail::runs_on_gpu(op, Backend::cpu, views);
  }
  std::deque<Tensor> keep;
  ops::AttentionArgs args =
      ops::bind_attention(op, saved.variant, saved.q, saved.k, saved.v, saved.inputs, with_host_seqlens(saved.options, keep));
  const ops::detail::Checker check(op);
  check.floating("d_output", d_output);
  if (d_output.shape != args.output_shape())
    check.fail("d_output has shape " + ops::detail::shape_text(d_output.shape) + ", expected the output's shape " +
               std::string(args.packed ? "[Tq,H,Dv] = " : "[B,Tq,H,Dv] = ") + ops::detail::shape_text(args.output_shape()));
  check.data("d_output", d_output);
  if (on_gpu) return backward_on_gpu(saved, d_output);
  check_fingerprint(op, saved);

  AttentionGradients out = allocate_gradients(saved, Location::host(), nullptr);
  cpu::AttentionGrads grads;
  grads.d_output = ops::detail::lead_with_ones(d_output, 4);
  grads.dq = broadcast_like(out.dq.view(), args.q);
  grads.dk = broadcast_like(out.dk.view(), args.k);
  grads.dv = broadcast_like(out.dv.view(), args.v);
  grads.d_tensors.resize(saved.variant.inputs.size());
  for (std::size_t i = 0; i < saved.variant.inputs.size(); ++i) {
    const auto found = out.inputs.find(saved.variant.inputs[i].name);
    if (found != out.inputs.end()) grads.d_tensors[i] = broadcast_like(found->second.view(), args.tensors[i]);
  }
  if (args.softmax_aux) grads.d_softmax_aux = broadcast_like(out.d_softmax_aux->view(), *args.softmax_aux);
  cpu::run_attention_backward(saved.variant, args, grads);
  return out;
}

// ---------------------------------------------------------------------------------------
// The named op

namespace {

template <class Logit>
ir::AttentionVariant lower_with(const Logit& logit, const AttentionFeatures& f) {
  dsl::SoftmaxFlags flags;
  flags.causal = f.causal;
  flags.window = f.window;
  flags.segment_ids = f.segment_ids;
  flags.sinks = f.sinks;
  flags.dropout = f.dropout;
  const dsl::Softmax<Logit> softmax(logit, {}, flags);
  if (f.mask) return dsl::lower(softmax.mask(dsl::pair("attention_mask") != 0), "attention");
  return dsl::lower(softmax, "attention");
}

ir::AttentionVariant build_variant(const AttentionFeatures& f) {
  const auto scaled = dsl::score * dsl::scalar("scale");
  const auto bias = dsl::pair("bias");
  const auto cap = dsl::scalar("logits_soft_cap");
  if (f.bias && f.soft_cap) return lower_with(dsl::soft_cap(scaled + bias, cap), f);
  if (f.bias) return lower_with(scaled + bias, f);
  if (f.soft_cap) return lower_with(dsl::soft_cap(scaled, cap), f);
  return lower_with(scaled, f);
}

AttentionFeatures features_of(const AttentionOptions& o) {
  AttentionFeatures f;
  f.bias = o.bias.has_value();
  f.soft_cap = o.logits_soft_cap.has_value();
  f.causal = o.causal;
  f.window = o.sliding_window.has_value();
  f.mask = o.attention_mask.has_value();
  f.segment_ids = o.q_segment_ids.has_value() || o.kv_segment_ids.has_value();
  f.sinks = o.softmax_aux.has_value();
  f.dropout = o.dropout_p != 0;
  return f;
}

void named_arguments(const TensorView& q, const AttentionOptions& options, VariantInputs& inputs,
                     AttentionRunOptions& run) {
  const std::int64_t D = q.rank() >= 1 ? q.shape.back() : 0;
  const float scale = options.scale.value_or(D > 0 ? 1.0f / std::sqrt(static_cast<float>(D)) : 1.0f);
  if (!std::isfinite(scale)) throw InvalidArgument(fmt::format("attention: scale = {}, expected a finite number", scale));
  inputs.scalars["scale"] = scale;
  if (options.bias) inputs.tensors["bias"] = *options.bias;
  if (options.logits_soft_cap) {
    const float cap = *options.logits_soft_cap;
    if (!(cap > 0 && std::isfinite(cap)))
      throw InvalidArgument(fmt::format("attention: logits_soft_cap = {}, expected a finite number > 0", cap));
    inputs.scalars["logits_soft_cap"] = cap;
  }
  if (options.attention_mask) inputs.tensors["attention_mask"] = *options.attention_mask;
  if (options.sliding_window) {
    run.window_left = options.sliding_window->first;
    run.window_right = options.sliding_window->second;
  }
  run.q_segment_ids = options.q_segment_ids;
  run.kv_segment_ids = options.kv_segment_ids;
  run.softmax_aux = options.softmax_aux;
  run.cu_seqlens_q = options.cu_seqlens_q;
  run.cu_seqlens_k = options.cu_seqlens_k;
  run.dropout_p = options.dropout_p;
  run.seed = options.seed;
  run.return_lse = options.return_lse;
  run.threads = options.threads;
  run.backend = options.backend;
  run.gpu = options.gpu;
  run.check_saved = options.check_saved;
}

}  // namespace

const ir::AttentionVariant& attention_variant(const AttentionFeatures& features) {
  static std::mutex mutex;
  static std::deque<std::pair<AttentionFeatures, ir::AttentionVariant>> built;  // deque: references stay valid
  const std::lock_guard lock(mutex);
  for (const auto& [f, variant] : built)
    if (f == features) return variant;
  built.emplace_back(features, build_variant(features));
  return built.back().second;
}

AttentionFeatures parse_attention_features(std::string_view list) {
  AttentionFeatures f;
  const std::pair<const char*, bool AttentionFeatures::*> names[] = {
      {"causal", &AttentionFeatures::causal},   {"window", &AttentionFeatures::window},
      {"mask", &AttentionFeatures::mask},       {"segments", &AttentionFeatures::segment_ids},
      {"sinks", &AttentionFeatures::sinks},     {"dropout", &AttentionFeatures::dropout},
      {"bias", &AttentionFeatures::bias},       {"softcap", &AttentionFeatures::soft_cap}};
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view name = list.substr(start, comma - start);
    start = comma + 1;
    if (name.empty()) continue;
    bool found = false;
    for (const auto& [text, member] : names)
      if (name == text) {
        f.*member = true;
        found = true;
      }
    if (!found)
      throw InvalidArgument(fmt::format("attention features: unknown '{}', expected any of "
                                        "causal,window,mask,segments,sinks,dropout,bias,softcap",
                                        name));
  }
  return f;
}

AttentionForward attention_for_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const AttentionOptions& options) {
  VariantInputs inputs;
  AttentionRunOptions run;
  named_arguments(q, options, inputs, run);
  return run_attention_for_backward(attention_variant(features_of(options)), q, k, v, inputs, run);
}

AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options) {
  VariantInputs inputs;
  AttentionRunOptions run;
  named_arguments(q, options, inputs, run);
  return run_attention(attention_variant(features_of(options)), q, k, v, inputs, run);
}

void attention_into(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& options,
                    const AttentionOutputs& outputs) {
  VariantInputs inputs;
  AttentionRunOptions run;
  named_arguments(q, options, inputs, run);
  run_attention_into(attention_variant(features_of(options)), q, k, v, inputs, run, outputs);
}

AttentionResult context_parallel::attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const AttentionOptions& options, Communicator& group) {
  VariantInputs inputs;
  AttentionRunOptions run;
  named_arguments(q, options, inputs, run);
  return run_attention(attention_variant(features_of(options)), q, k, v, inputs, run, group);
}

}  // namespace ladle
