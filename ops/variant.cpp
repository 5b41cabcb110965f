#include "variant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include <ladle/runtime/driver.h>

#include "bind.h"
#include "detail/checks.h"
#include "detail/fingerprint.h"
#include "detail/gpu_call.h"
#include "gpu_backward.h"
#include "chunked_plan.h"
#include "gpu_recurrent.h"
#include "recurrent.h"

namespace ladle {

namespace {

std::string op_name(const ir::Variant& variant) { return variant.name.empty() ? "variant" : variant.name; }

// Every tensor argument of a call, by the name its caller knows.
std::vector<ops::detail::NamedView> argument_views(const TensorView& q, const TensorView& k, const TensorView& v,
                                                   const VariantInputs& inputs, const RunOptions& options) {
  std::vector<ops::detail::NamedView> views{{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, view] : inputs.tensors) views.push_back({name, &view});
  if (options.initial_state) views.push_back({"initial_state", &*options.initial_state});
  if (options.cu_seqlens) views.push_back({"cu_seqlens", &*options.cu_seqlens});
  return views;
}

// The options the checks read: they read cu_seqlens on the host, so a device one is copied down
// (into `keep`).
RunOptions with_host_seqlens(const RunOptions& options, std::optional<Tensor>& keep) {
  RunOptions checked = options;
  if (options.cu_seqlens && options.cu_seqlens->on_device()) {
    keep = Tensor::copy_of(*options.cu_seqlens, Location::host(), options.gpu.stream);
    checked.cu_seqlens = keep->view();
  }
  return checked;
}

// The GPU path: device tensors as they are, host ones through the call's stream.
// views: every tensor argument, the outputs among them.
void run_on_gpu(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                const std::vector<ops::detail::NamedView>& views) {
  const std::string op = op_name(variant);
  // Bad input, a bad tile or algorithm among it, is refused before any GPU work: here, where some
  // tensor is to be uploaded; else gpu::run_variant_into's own checks come before its first.
  if (std::any_of(views.begin(), views.end(), [](const ops::detail::NamedView& named) { return named.view->on_host(); })) {
    std::optional<Tensor> seqlens;
    const RunOptions checked = with_host_seqlens(options, seqlens);
    ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, checked);
    ops::bind_outputs(op, checked, outputs, bound);
    const Algorithm algorithm = gpu::choose_algorithm(variant, bound, options);
    if (algorithm == Algorithm::chunked && variant.update != ir::Update::delta) (void)gpu::chunked_kernel_spec(variant, bound, options);
    else if (algorithm == Algorithm::recurrent) (void)gpu::kernel_spec(variant, bound, options);
  }
  ops::detail::GpuCall call(op, options.gpu);
  const TensorView dq = call.input("q", q), dk = call.input("k", k), dv = call.input("v", v);
  VariantInputs device_inputs;
  device_inputs.scalars = inputs.scalars;
  for (const auto& [name, view] : inputs.tensors) device_inputs.tensors[name] = call.input(name, view);
  RunOptions device_options = options;
  if (options.initial_state) device_options.initial_state = call.input("initial_state", *options.initial_state);
  if (options.cu_seqlens) device_options.cu_seqlens = call.host_input("cu_seqlens", *options.cu_seqlens);
  RecurrentOutputs device_outputs{call.output("o", outputs.o), std::nullopt};
  if (outputs.final_state) device_outputs.final_state = call.output("final_state", *outputs.final_state);
  gpu::run_variant_into(variant, dq, dk, dv, device_inputs, device_options, device_outputs, {options.gpu.stream});
  call.finish();
}

}  // namespace

RecurrentResult run_variant(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                            const TensorView& v, const VariantInputs& inputs, const RunOptions& options) {
  const std::string op = op_name(variant);
  const auto views = argument_views(q, k, v, inputs, options);
  const bool on_gpu = ops::detail::runs_on_gpu(op, options.backend, views);  // false: every view is host memory
  // The shapes of the outputs.
  std::optional<Tensor> seqlens;
  const ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, with_host_seqlens(options, seqlens));
  const Location where = on_gpu && q.on_device() ? q.location : Location::host();
  RecurrentResult result{Tensor(bound.dims.type, bound.dims.output_shape(), where, options.gpu.stream), std::nullopt};
  RecurrentOutputs outputs{result.o.view(), std::nullopt};
  if (options.return_state) {
    result.final_state.emplace(DType::f32, bound.dims.state_shape(), where, options.gpu.stream);
    outputs.final_state = result.final_state->view();
  }
  run_variant_into(variant, q, k, v, inputs, options, outputs);
  return result;
}

void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                      const RecurrentOutputs& outputs) {
  const std::string op = op_name(variant);
  auto views = argument_views(q, k, v, inputs, options);
  views.push_back({"o", &outputs.o});
  if (outputs.final_state) views.push_back({"final_state", &*outputs.final_state});
  if (ops::detail::runs_on_gpu(op, options.backend, views)) return run_on_gpu(variant, q, k, v, inputs, options, outputs, views);
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  ops::bind_outputs(op, options, outputs, bound);
  cpu::run_recurrent(variant, bound.args);
}

namespace {

// Device tensors are hashed on the device (ops/detail/fingerprint.h), on the call's stream.
std::uint64_t fingerprint(const TensorView& q, const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                          const RunOptions& options) {
  // cu_seqlens too: other offsets over the same tokens are another call.
  return ops::detail::fingerprint({q, k, v, options.initial_state, options.cu_seqlens}, inputs.tensors, inputs.scalars, options.gpu.stream);
}

}  // namespace

RecurrentForward run_variant_for_backward(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                                          const TensorView& v, const VariantInputs& inputs, const RunOptions& options) {
  const std::string op = op_name(variant);
  const ops::detail::Checker check(op);
  const bool on_gpu = ops::detail::runs_on_gpu(op, options.backend, argument_views(q, k, v, inputs, options));
  if (on_gpu) {
    // The forward as run_variant runs it (device tensors in place, outputs where q lives); the
    // fingerprint after it, once the GPU path has checked every address it hashes.
    RecurrentForward out{run_variant(variant, q, k, v, inputs, options), {variant, q, k, v, inputs, options, nullptr, 0, true}};
    out.saved.options.backend = Backend::gpu;
    out.saved.fingerprint = fingerprint(q, k, v, inputs, options);
    return out;
  }
  // The CPU path: every view is host memory (runs_on_gpu refused a device one).
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  RecurrentForward out{{Tensor(bound.dims.type, bound.dims.output_shape()), std::nullopt},
                       {variant, q, k, v, inputs, options, nullptr, fingerprint(q, k, v, inputs, options), true}};
  out.saved.options.backend = Backend::cpu;
  RecurrentOutputs outputs{out.result.o.view(), std::nullopt};
  if (options.return_state) {
    out.result.final_state.emplace(DType::f32, bound.dims.state_shape());
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

namespace {

// The checks every backward makes before any work: saved, d_output and d_final_state against the
// forward's arguments (cu_seqlens read on the host: a device one is copied into `seqlens`).
ops::BoundInputs check_backward(const std::string& op, const RecurrentSaved& saved, const TensorView& d_output,
                                const std::optional<TensorView>& d_final_state, std::optional<Tensor>& seqlens) {
  ops::BoundInputs bound = ops::bind_inputs(op, saved.variant, saved.q, saved.k, saved.v, saved.inputs,
                                            with_host_seqlens(saved.options, seqlens));
  ops::bind_backward(op, bound, d_output, d_final_state);
  return bound;
}

// That saved's tensors still hold what its forward read. On the GPU path it runs once the GpuCall
// has checked every address with the driver, so a mislabelled pointer is refused by name before
// the fingerprint's kernel reads it.
void check_fingerprint(const std::string& op, const RecurrentSaved& saved) {
  if (fingerprint(saved.q, saved.k, saved.v, saved.inputs, saved.options) != saved.fingerprint)
    ops::detail::Checker(op).fail("saved: its tensors no longer hold what its forward read (changed since, or the value belongs to "
                                  "another call)");
}

// What both CPU backwards share: the checks of saved, d_output and d_final_state, the zeroed gradients
// and the canonical views of them that the CPU code adds into.
struct BackwardSetup {
  ops::BoundInputs bound;
  RecurrentGradients out;
  std::vector<std::optional<TensorView>> d_tensors;
  std::optional<TensorView> d_initial_state;
};

BackwardSetup setup_backward(const RecurrentSaved& saved, const TensorView& d_output, const std::optional<TensorView>& d_final_state) {
  const ir::Variant& variant = saved.variant;
  const std::string op = op_name(variant) + " backward";
  // The CPU reads every tensor, the forward's and the backward's, on the host: a device one is
  // refused by name (a CPU forward saved host views only; a GPU forward's may be device ones).
  auto views = argument_views(saved.q, saved.k, saved.v, saved.inputs, saved.options);
  views.push_back({"d_output", &d_output});
  if (d_final_state) views.push_back({"d_final_state", &*d_final_state});
  ops::detail::runs_on_gpu(op, Backend::cpu, views);
  std::optional<Tensor> seqlens;  // none: cu_seqlens is host memory
  BackwardSetup s{check_backward(op, saved, d_output, d_final_state, seqlens),
                  {Tensor(DType::f32, saved.q.shape, 0.0f), Tensor(DType::f32, saved.k.shape, 0.0f),
                   Tensor(DType::f32, saved.v.shape, 0.0f), {}, std::nullopt},
                  {},
                  std::nullopt};
  check_fingerprint(op, saved);
  const ops::RecurrentDims& d = s.bound.dims;
  s.d_tensors.resize(variant.inputs.size());
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Input& in = variant.inputs[i];
    if (in.kind == ir::InputKind::scalar) continue;
    Tensor* target = nullptr;
    if (in.role == ir::Role::query) target = &s.out.dq;
    else if (in.role == ir::Role::key) target = &s.out.dk;
    else if (in.role == ir::Role::value) target = &s.out.dv;
    else target = &s.out.inputs.emplace(in.name, Tensor(DType::f32, saved.inputs.tensors.at(in.name).shape, 0.0f)).first->second;
    // The canonical view bind_inputs made of the input, over the gradient's memory.
    if (in.kind == ir::InputKind::head_key) {
      s.d_tensors[i] = ops::detail::head_key_view(target->view(), d.B, d.T);
      continue;
    }
    const int rank = in.kind == ir::InputKind::head ? 2 : in.kind == ir::InputKind::token_head ? 3 : 4;
    TensorView view = ops::detail::lead_with_ones(target->view(), rank);
    if (in.kind == ir::InputKind::head) view.shape[0] = d.B;  // [H] broadcasts over B: its gradient sums over B
    s.d_tensors[i] = view;
  }
  if (saved.options.initial_state) {
    s.out.d_initial_state.emplace(DType::f32, d.state_shape(), 0.0f);
    s.d_initial_state = s.out.d_initial_state->view();
  }
  return s;
}

// The backward on the GPU (gpu::run_variant_backward_into) under the forward's rules (GpuCall):
// device tensors read in place, host ones uploaded on options.gpu.stream (or refused by name when
// upload_host_tensors is off), into `gradients` wherever they live (host ones through device
// stand-ins). `verify` runs once the GpuCall has checked every address (a saved value's fingerprint).
void backward_into_on_gpu(const std::string& op, const ir::Variant& variant, const TensorView& q_in, const TensorView& k_in,
                          const TensorView& v_in, const VariantInputs& inputs_in, const RunOptions& options,
                          const TensorView& d_output, const std::optional<TensorView>& d_final_state,
                          const RecurrentGradientViews& gradients, const std::function<void()>& verify) {
  ops::detail::GpuCall call(op, options.gpu);
  const TensorView q = call.input("q", q_in), k = call.input("k", k_in), v = call.input("v", v_in);
  VariantInputs inputs;
  inputs.scalars = inputs_in.scalars;
  for (const auto& [name, view] : inputs_in.tensors) inputs.tensors[name] = call.input(name, view);
  RunOptions device_options = options;
  if (options.initial_state) device_options.initial_state = call.input("initial_state", *options.initial_state);
  if (options.cu_seqlens) device_options.cu_seqlens = call.host_input("cu_seqlens", *options.cu_seqlens);
  const TensorView d_o = call.input("d_output", d_output);
  std::optional<TensorView> d_final;
  if (d_final_state) d_final = call.input("d_final_state", *d_final_state);
  if (verify) verify();
  RecurrentGradientViews views{call.output("dq", gradients.dq), call.output("dk", gradients.dk), call.output("dv", gradients.dv), {}, std::nullopt};
  for (const auto& [name, view] : gradients.inputs) views.inputs[name] = call.output("d" + name, view);
  if (gradients.d_initial_state) views.d_initial_state = call.output("d_initial_state", *gradients.d_initial_state);
  gpu::run_variant_backward_into(variant, q, k, v, inputs, device_options, d_o, d_final, views, {options.gpu.stream});
  call.finish();
}

// The backward of a saved GPU forward, into gradients it allocates where q lives. On device tensors
// alone it waits for the stream once (the fingerprint's sums, 8 bytes a tensor) and returns with its
// kernels queued.
RecurrentGradients backward_on_gpu(const RecurrentSaved& saved, const TensorView& d_output,
                                   const std::optional<TensorView>& d_final_state) {
  const ir::Variant& variant = saved.variant;
  const RunOptions& options = saved.options;
  const std::string op = op_name(variant) + " backward";
  std::optional<Tensor> seqlens;
  const ops::BoundInputs bound = check_backward(op, saved, d_output, d_final_state, seqlens);

  const Location where = saved.q.on_device() ? saved.q.location : Location::host();
  const auto gradient = [&](const std::vector<std::int64_t>& shape) { return Tensor(DType::f32, shape, where, options.gpu.stream); };
  RecurrentGradients out{gradient(saved.q.shape), gradient(saved.k.shape), gradient(saved.v.shape), {}, std::nullopt};
  RecurrentGradientViews views{out.dq.view(), out.dk.view(), out.dv.view(), {}, std::nullopt};
  for (const ir::Input& in : variant.inputs) {
    if (in.kind == ir::InputKind::scalar || in.role != ir::Role::other) continue;
    views.inputs[in.name] = out.inputs.emplace(in.name, gradient(saved.inputs.tensors.at(in.name).shape)).first->second.view();
  }
  if (options.initial_state) {
    out.d_initial_state.emplace(gradient(bound.dims.state_shape()));
    views.d_initial_state = out.d_initial_state->view();
  }
  backward_into_on_gpu(op, variant, saved.q, saved.k, saved.v, saved.inputs, options, d_output, d_final_state, views,
                       [&] { check_fingerprint(op, saved); });
  return out;
}

}  // namespace

RecurrentGradients run_variant_backward(const RecurrentSaved& saved, const TensorView& d_output,
                                        const std::optional<TensorView>& d_final_state) {
  if (!saved.valid)
    throw InvalidArgument(op_name(saved.variant) + " backward: saved holds no forward (make it with run_variant_for_backward)");
  if (!saved.checkpoints) return run_variant_backward_composed(saved, d_output, d_final_state, Backend::gpu);
  BackwardSetup s = setup_backward(saved, d_output, d_final_state);
  cpu::RecurrentGrads grads;
  grads.d_output = ops::detail::lead_with_ones(d_output, 4);
  grads.d_final_state = d_final_state;
  grads.checkpoints = saved.checkpoints.get();
  grads.d_tensors = s.d_tensors;
  grads.d_initial_state = s.d_initial_state;
  cpu::run_recurrent_backward(saved.variant, s.bound.args, grads);
  return std::move(s.out);
}

RecurrentGradients run_variant_backward_composed(const RecurrentSaved& saved, const TensorView& d_output,
                                                 const std::optional<TensorView>& d_final_state, Backend backend) {
  const ir::Variant& variant = saved.variant;
  const std::string op = op_name(variant) + " backward";
  if (!saved.valid) throw InvalidArgument(op + ": saved holds no forward (make it with run_variant_for_backward)");
  // Where it runs as a forward would decide (backend = cpu refuses a device tensor by name).
  auto views = argument_views(saved.q, saved.k, saved.v, saved.inputs, saved.options);
  views.push_back({"d_output", &d_output});
  if (d_final_state) views.push_back({"d_final_state", &*d_final_state});
  // The update forms' GPU backward runs their recurrence in one kernel (codegen/cuda/update_backward.h).
  if (ops::detail::runs_on_gpu(op, backend, views)) return backward_on_gpu(saved, d_output, d_final_state);
  if (!variant.plain_form())
    throw InvalidArgument(op + ": the backward by composition on the CPU runs the diagonal form, not " + ir::form_name(variant) +
                          " (run_variant_backward runs its CPU backward)");
  BackwardSetup s = setup_backward(saved, d_output, d_final_state);
  if (variant.normalize)
    throw InvalidArgument(op + ": the backward by composition on the CPU has no normalised read (the GPU's and the direct CPU backward do)");
  const cpu::RecurrentArgs& a = s.bound.args;
  const std::int64_t B = a.batch, T = a.tokens, H = a.heads, K = a.key_dim, V = a.value_dim, N = s.bound.dims.N;
  const bool reverse = a.reverse;
  const cpu::RecurrentSlotTensors slots = cpu::materialize_slots(variant, a);
  const auto tensor = [](const std::vector<float>& values, std::vector<std::int64_t> shape) {
    Tensor t(DType::f32, std::move(shape), 0.0f);
    std::copy(values.begin(), values.end(), static_cast<float*>(t.data()));
    return t;
  };
  const auto floats = [](const Tensor& t) { return static_cast<const float*>(t.data()); };
  // The sequences as the recurrence walks them: token of step s of sequence n.
  const auto bounds = [&](std::int64_t n) {
    const std::int64_t begin = a.cu_seqlens.empty() ? 0 : a.cu_seqlens[static_cast<std::size_t>(n)];
    const std::int64_t end = a.cu_seqlens.empty() ? T : a.cu_seqlens[static_cast<std::size_t>(n) + 1];
    return std::pair{begin, end};
  };
  const auto row = [&](std::int64_t n, std::int64_t t, std::int64_t h) { return ((a.cu_seqlens.empty() ? n : 0) * T + t) * H + h; };
  const auto token_of = [&](std::int64_t n, std::int64_t step) {
    const auto [begin, end] = bounds(n);
    return reverse ? end - 1 - step : begin + step;
  };

  // The slot tensors, [B,T,H,D] f32: q times the scale, k, v, the log decays, and do.
  std::vector<float> qs = slots.q;
  for (std::size_t r = 0; r < slots.scale.size(); ++r)
    for (std::int64_t f = 0; f < K; ++f) qs[r * static_cast<std::size_t>(K) + static_cast<std::size_t>(f)] *= slots.scale[r];
  const Tensor q_s = tensor(qs, {B, T, H, K}), k_f = tensor(slots.k, {B, T, H, K}), v_f = tensor(slots.v, {B, T, H, V});
  const Tensor log_a = tensor(slots.log_a, {B, T, H, K}), log_b = tensor(slots.log_b, {B, T, H, V});
  Tensor d_o(DType::f32, {B, T, H, V}, 0.0f);
  {
    const TensorView g = ops::detail::lead_with_ones(d_output, 4);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t j = 0; j < V; ++j) {
            const auto* p = static_cast<const std::byte*>(g.data) +
                            (b * g.strides[0] + t * g.strides[1] + h * g.strides[2] + j * g.strides[3]) * static_cast<std::int64_t>(dtype_size(g.type));
            static_cast<float*>(d_o.data())[((b * T + t) * H + h) * V + j] = load_float(p, g.type);
          }
  }
  // The decays shifted one step along the recurrence (the backward's dS_t = A_(t+1) dS_(t+1) B_(t+1) + ...):
  // at each token the next step's, 0 at a sequence's last step.
  const auto shifted = [&](const Tensor& x, std::int64_t D) {
    Tensor out(DType::f32, x.shape(), 0.0f);
    for (std::int64_t n = 0; n < N; ++n) {
      const auto [begin, end] = bounds(n);
      for (std::int64_t step = 0; step + 1 < end - begin; ++step)
        for (std::int64_t h = 0; h < H; ++h)
          std::copy_n(floats(x) + row(n, token_of(n, step + 1), h) * D, D, static_cast<float*>(out.data()) + row(n, token_of(n, step), h) * D);
    }
    return out;
  };
  const Tensor log_a_next = shifted(log_a, K), log_b_next = shifted(log_b, V);
  const auto transpose_state = [&](const Tensor& x, std::int64_t rows, std::int64_t cols) {  // [N,H,rows,cols] -> [N,H,cols,rows]
    Tensor out(DType::f32, {N, H, cols, rows}, 0.0f);
    for (std::int64_t p = 0; p < N * H; ++p)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          static_cast<float*>(out.data())[(p * cols + j) * rows + i] = floats(x)[(p * rows + i) * cols + j];
    return out;
  };
  Tensor d_final(DType::f32, {N, H, K, V}, 0.0f);
  if (d_final_state)
    for (std::int64_t e = 0; e < d_final.numel(); ++e) {
      const TensorView& g = *d_final_state;
      std::int64_t rest = e, offset = 0;
      for (int dim = 3; dim >= 0; --dim) {
        offset += rest % g.shape[static_cast<std::size_t>(dim)] * g.strides[static_cast<std::size_t>(dim)];
        rest /= g.shape[static_cast<std::size_t>(dim)];
      }
      d_final.set(e, load_float(static_cast<const std::byte*>(g.data) + offset * static_cast<std::int64_t>(dtype_size(g.type)), g.type));
    }

  // One recurrence of the plain form: S = diag(exp(gk)) S diag(exp(gv)) + k v^T, o = q^T S.
  const ir::Variant& plain = recurrent_variant(false, true, true, false);
  RunOptions run;
  run.backend = backend;
  run.cu_seqlens = saved.options.cu_seqlens;
  run.threads = saved.options.threads;
  run.return_state = true;
  const auto recurrence = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gk, const Tensor& gv,
                              bool backwards, const std::optional<Tensor>& h0) {
    RunOptions o = run;
    o.reverse = backwards;
    if (h0) o.initial_state = h0->view();
    VariantInputs in{{{"gk", gk.view()}, {"gv", gv.view()}}, {{"scale", 1.0f}}};
    return run_variant(plain, q.view(), k.view(), v.view(), in, o);
  };
  std::optional<Tensor> h0_t;  // the initial state, f32 and transposed
  std::optional<Tensor> h0;
  if (saved.options.initial_state) {
    Tensor h(DType::f32, {N, H, K, V}, 0.0f);
    const TensorView& g = *a.initial_state;
    for (std::int64_t e = 0; e < h.numel(); ++e) {
      std::int64_t rest = e, offset = 0;
      for (int dim = 3; dim >= 0; --dim) {
        offset += rest % g.shape[static_cast<std::size_t>(dim)] * g.strides[static_cast<std::size_t>(dim)];
        rest /= g.shape[static_cast<std::size_t>(dim)];
      }
      h.set(e, load_float(static_cast<const std::byte*>(g.data) + offset * static_cast<std::int64_t>(dtype_size(g.type)), g.type));
    }
    h0_t = transpose_state(h, K, V);
    h0 = std::move(h);
  }
  // u_t = S_t do_t (the transposed state read by do), and S_T (transposed back).
  const RecurrentResult u = recurrence(d_o, v_f, k_f, log_b, log_a, reverse, h0_t);
  const Tensor S_T = transpose_state(*u.final_state, V, K);
  // g_v = dS_t^T k_t, and dS before the first step; g_k = dS_t v_t.
  const RecurrentResult gv = recurrence(k_f, q_s, d_o, log_a_next, log_b_next, !reverse, d_final);
  const RecurrentResult gk = recurrence(v_f, d_o, q_s, log_b_next, log_a_next, !reverse, transpose_state(d_final, K, V));
  // The forward's output (unnormalised, f32), for the value-side decay's gradient.
  std::optional<RecurrentResult> o;
  if (variant.has(ir::Slot::log_decay_v)) o = recurrence(q_s, k_f, v_f, log_a, log_b, reverse, h0);

  cpu::RecurrentSlotTensors g;
  g.q.assign(slots.q.size(), 0.0f), g.k.assign(slots.k.size(), 0.0f), g.v.assign(slots.v.size(), 0.0f);
  g.log_a.assign(slots.log_a.size(), 0.0f), g.log_b.assign(slots.log_b.size(), 0.0f), g.scale.assign(slots.scale.size(), 0.0f);
  for (std::size_t r = 0; r < slots.scale.size(); ++r)
    for (std::int64_t f = 0; f < K; ++f) {
      const std::size_t e = r * static_cast<std::size_t>(K) + static_cast<std::size_t>(f);
      const float ue = floats(u.o)[e];
      g.q[e] = slots.scale[r] * ue;
      g.scale[r] += slots.q[e] * ue;
      g.k[e] = floats(gk.o)[e];
    }
  std::copy_n(floats(gv.o), g.v.size(), g.v.begin());
  // d log a: from the last step back, sum_j dfinal S_T, then + q . g_q - k . g_k per step (and
  // d log b: sum_i dfinal S_T, then + o . do - v . g_v); d initial_state = A_0 dS_0 B_0.
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t p = n * H + h;
      std::vector<double> ga(static_cast<std::size_t>(K), 0.0), gb(static_cast<std::size_t>(V), 0.0);
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) {
          const double x = double(floats(d_final)[(p * K + i) * V + j]) * floats(S_T)[(p * K + i) * V + j];
          ga[static_cast<std::size_t>(i)] += x, gb[static_cast<std::size_t>(j)] += x;
        }
      const auto [begin, end] = bounds(n);
      for (std::int64_t step = end - begin - 1; step >= 0; --step) {
        const std::int64_t r = row(n, token_of(n, step), h);
        for (std::int64_t i = 0; i < K; ++i) {
          const std::size_t e = static_cast<std::size_t>(r * K + i);
          ga[static_cast<std::size_t>(i)] += double(slots.q[e]) * g.q[e] - double(slots.k[e]) * g.k[e];
          g.log_a[e] = float(ga[static_cast<std::size_t>(i)]);
        }
        for (std::int64_t j = 0; j < V; ++j) {
          const std::size_t e = static_cast<std::size_t>(r * V + j);
          const double od = o ? double(floats(o->o)[e]) * floats(d_o)[e] : 0.0;
          gb[static_cast<std::size_t>(j)] += od - double(slots.v[e]) * g.v[e];
          g.log_b[e] = float(gb[static_cast<std::size_t>(j)]);
        }
      }
      if (s.d_initial_state) {
        float* dh = static_cast<float*>(s.d_initial_state->data) + p * K * V;
        const float* first = floats(*gv.final_state) + p * K * V;  // dS before the first step
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j) {
            float x = first[i * V + j];
            if (end > begin) {
              const std::int64_t r = row(n, token_of(n, 0), h);
              x *= std::exp(slots.log_a[static_cast<std::size_t>(r * K + i)]) * std::exp(slots.log_b[static_cast<std::size_t>(r * V + j)]);
            }
            dh[i * V + j] = x;
          }
      }
    }
  cpu::chain_slot_gradients(variant, a, g, s.d_tensors);
  return std::move(s.out);
}

void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients) {
  const std::string op = op_name(variant) + " backward";
  const ops::detail::Checker check(op);
  auto views = argument_views(q, k, v, inputs, options);
  views.push_back({"d_output", &d_output});
  if (d_final_state) views.push_back({"d_final_state", &*d_final_state});
  const bool on_gpu = ops::detail::runs_on_gpu(op, options.backend, views);
  {
    // Every argument and every gradient's shape, before any work.
    std::optional<Tensor> seqlens;
    ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, with_host_seqlens(options, seqlens));
    ops::bind_backward(op, bound, d_output, d_final_state);
    const auto expect = [&](const std::string& name, const TensorView* given, const std::vector<std::int64_t>& shape) {
      if (!given) check.fail("gradients has no tensor for input '" + name + "'");
      check.type(("gradients.d" + name).c_str(), *given, DType::f32, "fp32 gradients");
      if (given->shape != shape)
        check.fail("gradients.d" + name + " has shape " + ops::detail::shape_text(given->shape) + ", expected " +
                   ops::detail::shape_text(shape));
    };
    expect("q", &gradients.dq, q.shape);
    expect("k", &gradients.dk, k.shape);
    expect("v", &gradients.dv, v.shape);
    for (const ir::Input& in : variant.inputs) {
      if (in.kind == ir::InputKind::scalar || in.role != ir::Role::other) continue;
      const auto it = gradients.inputs.find(in.name);
      expect(in.name, it == gradients.inputs.end() ? nullptr : &it->second, inputs.tensors.at(in.name).shape);
    }
    for (const auto& [name, view] : gradients.inputs)
      if (variant.find_input(name) < 0) check.fail("gradients." + name + ": the variant has no input of that name");
    if (options.initial_state) expect("_initial_state", gradients.d_initial_state ? &*gradients.d_initial_state : nullptr, bound.dims.state_shape());
    else if (gradients.d_initial_state) check.fail("gradients.d_initial_state is given but options.initial_state is not");
  }
  if (on_gpu) {
    backward_into_on_gpu(op, variant, q, k, v, inputs, options, d_output, d_final_state, gradients, {});
    return;
  }
  // The CPU: the forward again, for its checkpoints, then the direct CPU backward, copied out.
  RunOptions cpu = options;
  cpu.backend = Backend::cpu;
  cpu.return_state = false;
  const RecurrentForward forward = run_variant_for_backward(variant, q, k, v, inputs, cpu);
  const RecurrentGradients grads = run_variant_backward(forward.saved, d_output, d_final_state);
  copy(grads.dq.view(), gradients.dq);
  copy(grads.dk.view(), gradients.dk);
  copy(grads.dv.view(), gradients.dv);
  for (const auto& [name, tensor] : grads.inputs) copy(tensor.view(), gradients.inputs.at(name));
  if (grads.d_initial_state) copy(grads.d_initial_state->view(), *gradients.d_initial_state);
}

}  // namespace ladle
