// ladle-bench-attention: the softmax-attention forward on the GPU at one shape, for the
// side-by-side table with PyTorch SDPA and FlexAttention (bench/attention_bench.py; both run
// in one call of bench/gpu-check.sh attention). Inputs are random bf16 on the device.
//   --case causal            causal, H = H_kv
//   --case window_softcap    sliding window (1024, 0) + soft cap 30
//   --case sinks_gqa         causal + 4 sinks, GQA H:H_kv = 16:2
//   --case decode            --tq query tokens (1) against -T keys, GQA H:--hkv (8), no mask: the
//                            decode shape (issue 38); also prints GB/s of K and V read once
// Prints one JSON line per tile tried:
//   {"op":"attention_causal","impl":"ladle","shape":"B8 T4096 H16 D128 bf16","tile":"...","ms":...,"TFLOPs":...}
// where TFLOP/s counts 4 * D flops per attended (query, key) pair (q k^T and P V).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <ladle/ops/attention.h>
#include <ladle/ops/attention_bind.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/ops/gpu_attention_backward.h>
#include <ladle/ops/tune_attention.h>
#include <ladle/runtime/driver.h>

#include "device_fill.h"

namespace {

// Attended (query, key) pairs of one sequence and head: causal keeps j <= i, the window
// keeps i - left <= j <= i + right (Tq = Tk).
double attended_pairs(long long T, bool causal, long long left, long long right) {
  double pairs = 0;
  for (long long i = 0; i < T; ++i) {
    long long lo = 0, hi = T - 1;
    if (causal) hi = std::min(hi, i);
    if (left >= 0) lo = std::max(lo, i - left);
    if (right >= 0) hi = std::min(hi, i + right);
    pairs += static_cast<double>(std::max(0LL, hi - lo + 1));
  }
  return pairs;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-bench-attention"};
  int B = 8, T = 4096, H = 16, D = 128, reps = 20, window = 1024, sinks = 4, H_kv_gqa = 2, tq = 1, hkv_decode = 8;
  std::string which = "causal";
  std::vector<std::string> tiles;
  bool backward = false;
  app.add_option("-B", B);
  app.add_option("-T", T);
  app.add_option("-H", H);
  app.add_option("-D", D, "head dim (D = Dv)");
  app.add_option("--reps", reps);
  app.add_option("--case", which)->check(CLI::IsMember({"causal", "window_softcap", "sinks_gqa", "decode"}));
  app.add_option("--tq", tq, "decode: query tokens (-T is the keys)")->check(CLI::Range(1, 4096));
  app.add_option("--hkv", hkv_decode, "decode: key/value heads (H a multiple of it)")->check(CLI::Range(1, 1024));
  app.add_option("--window", window, "window_softcap: keys before the diagonal");
  app.add_option("--tile", tiles, "block_m,block_n,warps,stages[,sync|wgmma|ws|decode] or default (repeatable); default: the heuristic");
  app.add_flag("--backward", backward, "also time the backward (ladle::gpu::run_attention_backward_into) and forward + backward");
  std::vector<int> bwd_stages{0};
  app.add_option("--bwd-stages", bwd_stages, "with --backward: the backward's q / d_output stages, each timed (0: the library's tile, tuned under LADLE_AUTOTUNE=cached)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    if (!ladle::driver_available()) {
      std::fprintf(stderr, "ladle-bench-attention: needs a GPU: %s\n", ladle::driver_unavailable_reason().c_str());
      return 1;
    }
    auto& device = ladle::Device::get();
    const bool decode = which == "decode";
    const int H_kv = which == "sinks_gqa" ? H_kv_gqa : decode ? hkv_decode : H;
    if (H % H_kv != 0) throw std::invalid_argument("--hkv " + std::to_string(H_kv) + " does not divide -H " + std::to_string(H));
    const int Tq = decode ? tq : T;  // decode: -T is the keys
    const long long n_q = 1LL * B * Tq * H * D, n_kv = 1LL * B * T * H_kv * D;
    ladle::DeviceBuffer q(n_q * 2), k(n_kv * 2), v(n_kv * 2), o(n_q * 2), aux(static_cast<std::size_t>(H) * sinks * 4);
    ladle::bench::fill_bf16(q, 1, false);
    ladle::bench::fill_bf16(k, 2, false);
    ladle::bench::fill_bf16(v, 3, false);
    std::vector<float> sink_logits(static_cast<std::size_t>(H) * sinks);
    for (std::size_t s = 0; s < sink_logits.size(); ++s) sink_logits[s] = 0.5f * static_cast<float>(s % 4);
    aux.copy_from_host(sink_logits.data(), sink_logits.size() * 4);
    device.synchronize();

    const auto view = [](const ladle::DeviceBuffer& b, ladle::DType type, std::vector<std::int64_t> shape) {
      return b.view(type, std::move(shape));
    };
    const auto bf16 = ladle::DType::bf16;
    const auto qv = view(q, bf16, {B, Tq, H, D}), kv = view(k, bf16, {B, T, H_kv, D}), vv = view(v, bf16, {B, T, H_kv, D});
    const auto ov = view(o, bf16, {B, Tq, H, D});

    ladle::AttentionFeatures features;
    ladle::VariantInputs inputs;
    inputs.scalars["scale"] = 1.0f / std::sqrt(static_cast<float>(D));
    ladle::AttentionRunOptions options;
    double pairs = 0;
    if (which == "causal") {
      features.causal = true;
      pairs = attended_pairs(T, true, -1, -1);
    } else if (which == "window_softcap") {
      features.window = features.soft_cap = true;
      inputs.scalars["logits_soft_cap"] = 30.0f;
      options.window_left = window, options.window_right = 0;
      pairs = attended_pairs(T, false, window, 0);
    } else if (decode) {
      pairs = static_cast<double>(Tq) * T;  // every query token sees every key
    } else {
      features.causal = features.sinks = true;
      options.softmax_aux = view(aux, ladle::DType::f32, {H, sinks});
      pairs = attended_pairs(T, true, -1, -1);
    }
    const ladle::ir::AttentionVariant& variant = ladle::attention_variant(features);
    const double flops = 4.0 * D * pairs * B * H;
    const std::string label = "attention_" + which;
    const std::string shape = "B" + std::to_string(B) + (decode ? " Tq" + std::to_string(Tq) + " Tk" : " T") + std::to_string(T) + " H" +
                              std::to_string(H) +
                              (H_kv != H ? ":" + std::to_string(H_kv) : "") + " D" + std::to_string(D) + " bf16";

    ladle::ops::AttentionArgs args = ladle::ops::bind_attention(label, variant, qv, kv, vv, inputs, options);
    // The backward's buffers: lse (the forward returns it), d_output, and fp32 gradients.
    if (decode && backward) throw std::invalid_argument("--backward is not timed for --case decode");
    ladle::DeviceBuffer lse(static_cast<std::size_t>(B) * H * T * 4), d_out(n_q * 2), dq(n_q * 4), dk(n_kv * 4), dv(n_kv * 4);
    ladle::bench::fill_bf16(d_out, 4, false);
    if (backward) options.return_lse = true;
    ladle::ops::bind_attention_outputs(
        label, options, {ov, backward ? std::optional(view(lse, ladle::DType::f32, {B, H, T})) : std::nullopt}, args);
    ladle::cpu::AttentionGrads grads;
    grads.d_output = view(d_out, bf16, {B, T, H, D});
    grads.dq = view(dq, ladle::DType::f32, {B, T, H, D});
    grads.dk = view(dk, ladle::DType::f32, {B, T, H_kv, D});
    grads.dv = view(dv, ladle::DType::f32, {B, T, H_kv, D});
    ladle::Stream stream;
    ladle::Event e0, e1;
    const ladle::gpu::LaunchOptions launch{&stream};
    if (tiles.empty()) tiles.push_back("");
    for (const auto& tile_text : tiles) {
      try {
        std::optional<ladle::cuda::AttentionTile> tile;
        if (!tile_text.empty() && tile_text != "default") {
          tile = ladle::cuda::parse_attention_tile(tile_text);
        } else {  // the library's own choice: the heuristic's, or the tuner's under LADLE_AUTOTUNE=cached / force
          tile = ladle::gpu::tuned_attention_tile(variant, args, ladle::gpu::heuristic_attention_tile(args), {});
        }
        const ladle::cuda::AttentionKernelSpec spec = ladle::gpu::attention_kernel_spec(variant, args, tile);
        // Warm up for at least 200 ms (and 3 runs): the first timed runs of a process otherwise
        // catch the GPU's clocks still rising (bench/RESULTS.md, issue 35).
        // pass 0: the forward; with --backward, pass 1: the backward alone, pass 2: forward + backward.
        int stages = 0;
        const auto run = [&](int pass) {
          if (pass != 1) ladle::gpu::run_attention_into(variant, args, launch, spec.tile);
          if (pass != 0)
            ladle::gpu::run_attention_backward_into(variant, args, grads, launch,
                                                    stages ? std::optional(ladle::cuda::AttentionBackwardTile{stages, true}) : std::nullopt);
        };
        if (backward) run(0);  // lse for the backward-alone pass
        // pass 0; then passes 1 and 2 for each --bwd-stages value.
        std::vector<std::pair<int, int>> passes{{0, 0}};
        if (backward)
          for (int s : bwd_stages) passes.insert(passes.end(), {{1, s}, {2, s}});
        for (const auto& [pass, pass_stages] : passes) {
          stages = pass_stages;
          e0.record(&stream);
          for (int i = 0;; ++i) {
            run(pass);
            e1.record(&stream);
            e1.synchronize();
            if (i >= 2 && e0.elapsed_ms_to(e1) >= 200.0f) break;
          }
          std::vector<float> ms;
          for (int i = 0; i < reps; ++i) {
            e0.record(&stream);
            run(pass);
            e1.record(&stream);
            e1.synchronize();
            ms.push_back(e0.elapsed_ms_to(e1));
          }
          std::sort(ms.begin(), ms.end());
          const double median = ms[ms.size() / 2];
          // FLOPs: the forward's two products; the backward's five (S again, dP, dV, dK, dQ).
          const double pass_flops = flops * (pass == 0 ? 1.0 : pass == 1 ? 2.5 : 3.5);
          const std::string name = label + (pass == 0 ? "" : pass == 1 ? "_bwd" : "_fwd_bwd");
          const std::string tile_name = ladle::cuda::to_string(spec.tile) + (pass != 0 && stages != 0 ? " bwd_stages=" + std::to_string(stages) : "");
          // decode: K and V read once (and q, o) over the time, the byte floor's rate.
          const double bytes = 2.0 * (2.0 * static_cast<double>(n_kv) + 2.0 * static_cast<double>(n_q));
          std::printf("{\"op\":\"%s\",\"impl\":\"ladle\",\"shape\":\"%s\",\"tile\":\"%s\",\"ms\":%.4f,\"TFLOPs\":%.1f,\"GBs\":%.0f}\n",
                      name.c_str(), shape.c_str(), tile_name.c_str(), median, pass_flops / (median * 1e-3) / 1e12,
                      bytes / (median * 1e-3) / 1e9);
        }
      } catch (const std::exception& e) {
        std::printf("{\"op\":\"%s\",\"impl\":\"ladle\",\"shape\":\"%s\",\"tile\":\"%s\",\"error\":\"%s\"}\n", label.c_str(),
                    shape.c_str(), tile_text.c_str(), e.what());
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ladle-bench-attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
