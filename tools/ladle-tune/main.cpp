// ladle-tune: tunes an op's kernel at given shapes on this GPU, prints the table of
// candidates (config, time, valid, why not) and stores the best in the tuned-config cache,
// where later calls of the op find it (LADLE_AUTOTUNE=cached).
//   ladle-tune --op gla -B 8 -T 4096 -H 16 -K 128 -V 128 [--gates g_gamma] [--algo chunked]
//              [--dtype bf16] [--budget 15] [--backward]
//   ladle-tune --op attention [--mask causal,window,segments,mask,sinks,dropout] [--mods bias,softcap]
//              -B 8 -T 4096 [--tk 4096] -H 16 [--hkv 16] -D 128 [--dv 128] [--window 1024] [--dtype bf16]
// --backward with --op attention tunes the backward's kernel (gpu::attention_backward_tune_job: stages x
// the dQ path, each tile's gradients checked against the heuristic tile's before it may win) after
// one forward for o and lse; with a recurrent op it tunes the recurrences the op's backward runs at that shape (gpu::run_variant_backward_into
// once under LADLE_AUTOTUNE=force: each pass's tiles are timed and checked against the heuristic's
// output, itself a part of the gradients, then stored where the next backward finds them).
// The recurrence family is the one the op would run at that shape (Algorithm::automatic)
// unless --algo names it. Inputs are random bf16 or f16 on the device (gates as GLA makes
// them; attention: q, k, v and a bias as ladle-bench-attention makes them, a mask keeping 9 of
// 10 pairs, segments of 1024 tokens, 4 sink logits per head, soft cap 30, dropout 0.1).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/ops/attention.h>
#include <ladle/ops/attention_bind.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/ops/gpu_attention_backward.h>
#include <ladle/ops/gpu_backward.h>
#include <ladle/ops/chunked_plan.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/tune_attention.h>
#include <ladle/ops/tune_recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "device_fill.h"

namespace {

// Measures every planned candidate of the job, prints the table and stores the result.
void measure_and_store(const ladle::TuneJob& job, double budget_s) {
  ladle::TuneOptions tune_options;
  tune_options.budget_ms = budget_s * 1e3;
  std::cout << "tuning " << job.key.to_string() << "\n";
  const ladle::TuneResult result = job.measure(tune_options);
  std::cout << ladle::format_table(result) << "\n";
  const auto path = ladle::TunedCache::global().store(job.key, result);
  std::cout << "stored: " << (path.empty() ? std::string("(memory only)") : path.string()) << "\n";
}

struct AttentionShape {
  int B, T, Tk, H, H_kv, D, Dv, window;
};

// The softmax-attention kernel at one shape, its inputs made on the device.
void tune_attention(const std::string& masks, const std::string& mods, const AttentionShape& s, const std::string& dtype,
                    double budget_s, bool backward) {
  const std::string list = masks + (!masks.empty() && !mods.empty() ? "," : "") + mods;
  const ladle::AttentionFeatures features = ladle::parse_attention_features(list);  // bad flags: said before the GPU
  const ladle::ir::AttentionVariant& variant = ladle::attention_variant(features);
  auto& device = ladle::Device::get();
  const auto type = dtype == "f16" ? ladle::DType::f16 : ladle::DType::bf16;
  std::vector<ladle::DeviceBuffer> buffers;
  buffers.reserve(12);
  const auto view = [&](ladle::DType of, std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    buffers.emplace_back(static_cast<std::size_t>(n) * ladle::dtype_size(of));
    return buffers.back().view(of, std::move(shape));
  };
  const auto random = [&](std::vector<std::int64_t> shape, unsigned seed) {
    const ladle::TensorView made = view(type, std::move(shape));
    ladle::bench::fill(buffers.back(), type, seed, false);
    return made;
  };
  const auto from_host = [&](ladle::DType of, std::vector<std::int64_t> shape, const void* data) {
    const ladle::TensorView made = view(of, std::move(shape));
    buffers.back().copy_from_host(data, buffers.back().bytes());
    return made;
  };
  const ladle::TensorView q = random({s.B, s.T, s.H, s.D}, 1), k = random({s.B, s.Tk, s.H_kv, s.D}, 2),
                          v = random({s.B, s.Tk, s.H_kv, s.Dv}, 3);
  ladle::VariantInputs inputs;
  inputs.scalars["scale"] = 1.0f / std::sqrt(static_cast<float>(s.D));
  if (features.soft_cap) inputs.scalars["logits_soft_cap"] = 30.0f;
  if (features.bias) inputs.tensors["bias"] = random({1, 1, s.T, s.Tk}, 4);
  if (features.mask) {
    std::vector<unsigned char> keep(static_cast<std::size_t>(s.T) * s.Tk);
    for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = (i * 2654435761u) % 10 != 0;
    inputs.tensors["attention_mask"] = from_host(ladle::DType::u8, {1, 1, s.T, s.Tk}, keep.data());
  }
  ladle::AttentionRunOptions options;
  if (features.window) options.window_left = s.window, options.window_right = 0;
  if (features.segment_ids) {
    const auto segments = [&](int tokens) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(s.B) * tokens);
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % tokens / 1024);
      return from_host(ladle::DType::i32, {s.B, tokens}, ids.data());
    };
    options.q_segment_ids = segments(s.T);
    options.kv_segment_ids = segments(s.Tk);
  }
  if (features.sinks) {
    std::vector<float> logits(static_cast<std::size_t>(s.H) * 4);
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 0.5f * static_cast<float>(i % 4);
    options.softmax_aux = from_host(ladle::DType::f32, {s.H, 4}, logits.data());
  }
  if (features.dropout) options.dropout_p = 0.1f, options.seed = 1;
  const ladle::TensorView o = view(type, {s.B, s.T, s.H, s.Dv});
  device.synchronize();
  ladle::ops::AttentionArgs args = ladle::ops::bind_attention("attention", variant, q, k, v, inputs, options);
  if (!backward) {
    ladle::ops::bind_attention_outputs("attention", options, {o, std::nullopt}, args);
    measure_and_store(ladle::gpu::attention_tune_job(variant, args, ladle::gpu::heuristic_attention_tile(args)), budget_s);
    return;
  }
  // The backward: the forward once (its o and lse, the library's tile), then the backward's tiles on a
  // random d_output into fp32 gradients, each checked against the heuristic tile's gradients.
  options.return_lse = true;
  const ladle::TensorView lse = view(ladle::DType::f32, {s.B, s.H, s.T});
  ladle::ops::bind_attention_outputs("attention", options, {o, lse}, args);
  ladle::gpu::run_attention_into(variant, args);
  ladle::cpu::AttentionGrads grads;
  grads.d_output = random({s.B, s.T, s.H, s.Dv}, 5);
  grads.dq = view(ladle::DType::f32, {s.B, s.T, s.H, s.D});
  grads.dk = view(ladle::DType::f32, {s.B, s.Tk, s.H_kv, s.D});
  grads.dv = view(ladle::DType::f32, {s.B, s.Tk, s.H_kv, s.Dv});
  grads.d_tensors.resize(variant.inputs.size());
  for (std::size_t i = 0; i < variant.inputs.size(); ++i)
    if (variant.inputs[i].name == "bias") {  // [1,1,T,Tk], seen as the kernels' [B,H,Tq,Tk] (broadcast: stride 0)
      ladle::TensorView d_bias = view(ladle::DType::f32, {s.T, s.Tk});
      d_bias.shape = {s.B, s.H, s.T, s.Tk}, d_bias.strides = {0, 0, s.Tk, 1};
      grads.d_tensors[i] = d_bias;
    }
  if (features.sinks) grads.d_softmax_aux = view(ladle::DType::f32, {s.H, 4});
  device.synchronize();
  // The launcher's plan for this call: its heuristic tile is where the tuning starts.
  const ladle::gpu::AttentionBackwardPlan plan =
      ladle::gpu::plan_attention_backward(variant, args, grads, std::nullopt, device.properties().arch());
  measure_and_store(ladle::gpu::attention_backward_tune_job(variant, args, grads, plan.tile), budget_s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-tune: tune an op's kernel at a shape and store the result"};
  std::string op = "gla", gates, algo, dtype = "bf16", masks, mods;
  int B = 8, T = 4096, H = 16, K = 128, V = 128, Tk = 0, H_kv = 0, D = 128, Dv = 0, window = 1024;
  double budget_s = 15;
  app.add_option("--op", op, "the op")->check(CLI::IsMember({"gla", "recurrent", "attention"}));
  app.add_option("--gates", gates, "recurrent: among g,gk,gv,g_gamma; gla: g_gamma adds it");
  app.add_option("-B", B);
  app.add_option("-T", T, "tokens (attention: of q)");
  app.add_option("-H", H, "heads (attention: of q)");
  app.add_option("-K", K);
  app.add_option("-V", V);
  app.add_option("--mask", masks, "attention: comma-separated among causal,window,segments,mask,sinks,dropout");
  app.add_option("--mods", mods, "attention: comma-separated score modifiers among bias,softcap");
  app.add_option("--tk", Tk, "attention: tokens of k and v (default: T)");
  app.add_option("--hkv", H_kv, "attention: heads of k and v (default: H)");
  app.add_option("-D", D, "attention: the head dim of q and k");
  app.add_option("--dv", Dv, "attention: the head dim of v (default: D)");
  app.add_option("--window", window, "attention with window: keys before the diagonal");
  app.add_option("--algo", algo, "kernel family (default: the op's choice at this shape)")
      ->check(CLI::IsMember({"recurrent", "chunked"}));
  app.add_option("--dtype", dtype, "q, k, v and o")->check(CLI::IsMember({"bf16", "f16"}));
  app.add_option("--budget", budget_s, "seconds");
  bool backward = false;
  app.add_flag("--backward", backward,
               "tune the op's backward at this shape (recurrent ops: its recurrences; attention: the backward's stages and dQ path)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (op == "attention") {
      tune_attention(masks, mods, {B, T, Tk ? Tk : T, H, H_kv ? H_kv : H, D, Dv ? Dv : D, window}, dtype, budget_s, backward);
      return 0;
    }
    auto& device = ladle::Device::get();
    const ladle::ir::Variant& variant = ladle::named_variant(op, gates);
    const auto type = dtype == "f16" ? ladle::DType::f16 : ladle::DType::bf16;
    std::vector<ladle::DeviceBuffer> buffers;
    ladle::VariantInputs inputs;
    inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(K)));
    auto device_view = [&](std::vector<std::int64_t> shape, unsigned seed, bool gate) {
      std::int64_t n = 1;
      for (auto s : shape) n *= s;
      buffers.emplace_back(static_cast<std::size_t>(n) * 2);
      ladle::bench::fill(buffers.back(), type, seed, gate);
      return buffers.back().view(type,
                                           std::move(shape));
    };
    buffers.reserve(8);
    const auto q = device_view({B, T, H, K}, 1, false), k = device_view({B, T, H, K}, 2, false),
               v = device_view({B, T, H, V}, 3, false);
    unsigned seed = 4;
    for (const auto& input : variant.inputs) {
      if (input.role != ladle::ir::Role::other || input.kind == ladle::ir::InputKind::scalar) continue;
      if (input.kind == ladle::ir::InputKind::token_key) inputs.tensors.emplace(input.name, device_view({B, T, H, K}, seed++, true));
      else if (input.kind == ladle::ir::InputKind::token_value) inputs.tensors.emplace(input.name, device_view({B, T, H, V}, seed++, true));
      else if (input.kind == ladle::ir::InputKind::head) inputs.tensors.emplace(input.name, device_view({H}, seed++, true));
    }
    device.synchronize();
    ladle::RunOptions options;
    if (algo == "recurrent") options.algorithm = ladle::Algorithm::recurrent;
    if (algo == "chunked") options.algorithm = ladle::Algorithm::chunked;
    if (backward) {
      // d_output random, fp32 gradients; the backward's recurrences tune as they first run.
      const auto d_o = device_view({B, T, H, V}, 99, false);
      std::vector<ladle::DeviceBuffer> grad_buffers;
      grad_buffers.reserve(8);
      const auto grad = [&](const ladle::TensorView& input) {
        grad_buffers.emplace_back(static_cast<std::size_t>(input.numel()) * 4);
        return grad_buffers.back().view(ladle::DType::f32,
                                             input.shape);
      };
      ladle::gpu::RecurrentGradientViews grads{grad(q), grad(k), grad(v), {}, std::nullopt};
      for (const auto& [name, view] : inputs.tensors) grads.inputs.emplace(name, grad(view));
      ::setenv("LADLE_AUTOTUNE", "force", 1);
      ::setenv("LADLE_AUTOTUNE_BUDGET", fmt::format("{}", budget_s).c_str(), 1);
      std::cout << fmt::format("tuning the backward of {} at B{} T{} H{} K{} V{} {}: its recurrences, each as it first runs\n", op, B, T, H,
                               K, V, dtype);
      ladle::gpu::run_variant_backward_into(variant, q, k, v, inputs, options, d_o, std::nullopt, grads);
      device.synchronize();
      std::cout << "stored: the next backward at this shape (LADLE_AUTOTUNE=cached) takes these tiles\n";
      return 0;
    }
    const ladle::ops::BoundInputs bound = ladle::ops::bind_inputs(op, variant, q, k, v, inputs, options);
    // Throws for a family the variant or shape cannot run (chunked with a normaliser, K > 256).
    options.algorithm = ladle::gpu::choose_algorithm(variant, bound, options);
    ladle::TuneJob job =
        options.algorithm == ladle::Algorithm::chunked
            ? ladle::gpu::chunked_tune_job(variant, bound, options, ladle::gpu::heuristic_chunked_tile(variant, bound))
            : ladle::gpu::recurrent_tune_job(variant, bound, options, ladle::gpu::heuristic_tile(bound));
    measure_and_store(job, budget_s);
  } catch (const std::exception& e) {
    std::cerr << "ladle-tune: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
