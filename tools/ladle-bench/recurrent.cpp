// ladle-bench-recurrent: a linear-attention forward on the GPU at one shape, for the
// side-by-side table with fla (bench/gpu-check.sh runs both in one call). Inputs are
// random on the device (a fill kernel compiled through ladle): q, k, v ~ N(0,1)-ish,
// g = logsigmoid(x)/16 as GLA uses it. --op gla (g [B,T,H,K]), simple_gla (g_gamma [H]),
// or user (a variant fla has no kernel for: key gate logsigmoid(x)/tau with a per-head tau,
// plus a value gate -softplus(y)/16), delta_rule and gated_delta_rule (beta = sigmoid(x) [B,T,H],
// g [B,T,H] = logsigmoid(x)/16, q and k L2-normalised in the kernel as fla's use_qk_l2norm_in_kernel),
// rwkv6 (w = logsigmoid(x)/16 [B,T,H,K], u [H,K]), kda (g [B,T,H,K] = logsigmoid(x)/16, beta as the delta
// rules', q and k L2-normalised; --algo recurrent: the chunked form is not built); --algo recurrent or chunked.
// Prints one JSON line per
// tile tried:
//   {"op":"chunk_gla","impl":"ladle","tile":"...","ms":...,"GBps":...,"floor_ms":...}
// plus the measured device copy bandwidth for the byte floor.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/ops/gpu_backward.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/dsl/dsl.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/update_forms.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/background.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>

#include "device_fill.h"

namespace {



}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-bench-recurrent"};
  int B = 8, T = 4096, H = 16, K = 128, V = 128, reps = 20;
  std::vector<std::string> tiles;
  app.add_option("-B", B);
  app.add_option("-T", T);
  app.add_option("-H", H);
  app.add_option("-K", K);
  app.add_option("-V", V);
  int HV = 0;
  app.add_option("--HV", HV, "v's heads (grouped value heads, fla's GVA: a multiple of H; v, o, the gates and beta take HV heads, q and k H); default H");
  app.add_option("--reps", reps);
  app.add_option("--tile", tiles, "recurrent: block_k,block_v,warps; chunked: block_k,chunk,block_v,warps[,wgmma|,ws] or block_k,chunk,block_v,warps,state_block_k,state_block_v,state_warps[,f32] (repeatable); default: the heuristic");
  std::vector<long long> segment_list;
  app.add_option("--segment-tokens", segment_list,
                 "chunked: tokens per segment of the serial form (repeatable; 0: whole sequences); default: by shape");
  std::string op = "gla", algo = "recurrent";
  app.add_option("--op", op)->check(CLI::IsMember({"gla", "simple_gla", "user", "delta_rule", "gated_delta_rule", "rwkv6", "kda"}));
  app.add_option("--algo", algo, "recurrent, chunked, or auto (ladle chooses; a cold call's interim kernel included)")
      ->check(CLI::IsMember({"recurrent", "chunked", "auto"}));
  bool backward = false;
  app.add_flag("--backward", backward,
               "time the forward and the backward (gpu::run_variant_backward_into, device tensors, d_output random) "
               "with events; the loss sum(o * d_output)");
  std::string gate_gradients = "boundary_blocks";
  app.add_option("--gate-gradients", gate_gradients, "--backward: RunOptions::gate_gradients (ops/variant.h)")
      ->check(CLI::IsMember({"boundary_states", "boundary_blocks", "block_sums"}));
  CLI11_PARSE(app, argc, argv);
  if (HV == 0) HV = H;
  if (HV < H || HV % H != 0) {
    std::fprintf(stderr, "ladle-bench-recurrent: --HV %d, expected a multiple of -H (%d)\n", HV, H);
    return 1;
  }
  if (backward && HV != H) {
    std::fprintf(stderr, "ladle-bench-recurrent: --HV with --backward: the bench times the backward without grouped value heads\n");
    return 1;
  }
  try {
    auto& device = ladle::Device::get();
    // q and k: H heads; v, o, the gates and beta: HV (the recurrence's heads).
    const long long n_k = 1LL * B * T * H * K, n_g = 1LL * B * T * HV * K, n_v = 1LL * B * T * HV * V;
    const long long n_h = 1LL * B * T * HV;
    const bool delta = op == "delta_rule" || op == "gated_delta_rule" || op == "kda";
    ladle::DeviceBuffer q(n_k * 2), k(n_k * 2), v(n_v * 2), g(n_g * 2), o(n_v * 2), y(n_v * 2), heads(HV * 4);
    ladle::DeviceBuffer beta(n_h * 2), g_head(n_h * 2), u(1LL * HV * K * 4);
    ladle::bench::fill_bf16(q, 1, false);
    ladle::bench::fill_bf16(k, 2, false);
    ladle::bench::fill_bf16(v, 3, false);
    ladle::bench::fill_bf16(g, 4, true);
    if (op == "user") ladle::bench::fill_bf16(y, 5, false);
    if (delta) ladle::bench::fill_sigmoid_bf16(beta, 6), ladle::bench::fill_bf16(g_head, 7, true);
    if (op == "rwkv6") {
      std::vector<float> bonus(static_cast<std::size_t>(HV) * K);
      for (std::size_t i = 0; i < bonus.size(); ++i) bonus[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
      u.copy_from_host(bonus.data(), bonus.size() * 4);
    }
    std::vector<float> per_head(HV);
    for (int h = 0; h < HV; ++h) per_head[h] = op == "user" ? 16.0f : std::log(1.0f - std::exp2(-5.0f - h * 0.5f));
    heads.copy_from_host(per_head.data(), per_head.size() * 4);
    device.synchronize();

    // Device copy bandwidth (bytes read + written), for the floor.
    ladle::Stream stream;
    ladle::Event e0, e1;
    ladle::DeviceBuffer big_a(1ull << 30), big_b(1ull << 30);
    std::vector<float> copy_ms;
    for (int i = 0; i < 10; ++i) {
      e0.record(&stream);
      big_b.copy_from(big_a, big_a.bytes(), &stream);
      e1.record(&stream);
      e1.synchronize();
      copy_ms.push_back(e0.elapsed_ms_to(e1));
    }
    std::sort(copy_ms.begin(), copy_ms.end());
    const double copy_gbps = 2.0 * (1ull << 30) / (copy_ms[copy_ms.size() / 2] * 1e-3) / 1e9;
    std::printf("{\"metric\":\"ladle_copy_bandwidth_GBps\",\"value\":%.1f}\n", copy_gbps);

    auto view = [](const ladle::DeviceBuffer& b, std::vector<std::int64_t> shape) {
      return b.view(ladle::DType::bf16,
                                           std::move(shape));
    };
    const auto qv = view(q, {B, T, H, K}), kv = view(k, {B, T, H, K}), vv = view(v, {B, T, HV, V}),
               gv = view(g, {B, T, HV, K}), ov = view(o, {B, T, HV, V});
    // The floor: every input read once, o written once.
    const double bytes = op == "gla" || op == "rwkv6" ? 2.0 * (2.0 * n_k + n_g + 2.0 * n_v)
                         : op == "simple_gla"          ? 2.0 * (2.0 * n_k + 2.0 * n_v)
                         : op == "delta_rule"          ? 2.0 * (2.0 * n_k + 2.0 * n_v + n_h)
                         : op == "gated_delta_rule"    ? 2.0 * (2.0 * n_k + 2.0 * n_v + 2.0 * n_h)
                         : op == "kda"                 ? 2.0 * (2.0 * n_k + n_g + 2.0 * n_v + n_h)
                                                       : 2.0 * (2.0 * n_k + n_g + 3.0 * n_v);
    const std::string label = (algo == "chunked" ? "chunk_" : algo == "auto" ? "auto_" : "fused_recurrent_") + std::string(op == "user" ? "user_gk_gv" : op);
    const ladle::ir::Variant user_variant = ladle::dsl::lower(
        ladle::dsl::read(ladle::dsl::scan(ladle::dsl::k, ladle::dsl::v)
                             .decay_k(ladle::dsl::logsigmoid(ladle::dsl::token_key("x")) / ladle::dsl::head_param("tau"))
                             .decay_v(-ladle::dsl::softplus(ladle::dsl::token_value("y")) / 16.0f),
                         ladle::dsl::q, ladle::dsl::scalar("scale")),
        "user_gk_gv");
    const ladle::ir::Variant& variant = op == "gla"                ? ladle::gla_variant(false)
                                        : op == "simple_gla"       ? ladle::recurrent_variant(false, false, false, true)
                                        : op == "delta_rule"       ? ladle::delta_rule_variant(false, true)
                                        : op == "gated_delta_rule" ? ladle::delta_rule_variant(true, true)
                                        : op == "rwkv6"            ? ladle::rwkv6_variant()
                                        : op == "kda"              ? ladle::kda_variant(false, false, false, true)
                                                                   : user_variant;
    if (backward) {
      // The forward (o), then the backward into fp32 gradients, each timed alone and together.
      ladle::VariantInputs inputs;
      inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(K)));
      const auto f32 = [](const ladle::DeviceBuffer& b, std::vector<std::int64_t> shape) {
        return b.view(ladle::DType::f32, std::move(shape));
      };
      const auto heads_view = f32(heads, {H});
      ladle::DeviceBuffer d_o(n_v * 2), dq(n_k * 4), dk(n_k * 4), dv(n_v * 4), dg(n_k * 4), dy(n_v * 4), dh(H * 4);
      ladle::bench::fill_bf16(d_o, 6, false);
      ladle::gpu::RecurrentGradientViews grads{f32(dq, {B, T, H, K}), f32(dk, {B, T, H, K}), f32(dv, {B, T, H, V}), {}, std::nullopt};
      if (op == "gla") inputs.tensors.emplace("g", gv), grads.inputs.emplace("g", f32(dg, {B, T, H, K}));
      if (op == "simple_gla") inputs.tensors.emplace("g_gamma", heads_view), grads.inputs.emplace("g_gamma", f32(dh, {H}));
      // The update forms (ladle_bwd_update): beta, the head gate, the key gate, the bonus.
      ladle::DeviceBuffer d_beta(n_h * 4), d_head(n_h * 4), du(1LL * H * K * 4);
      if (delta) inputs.tensors.emplace("beta", view(beta, {B, T, H})), grads.inputs.emplace("beta", f32(d_beta, {B, T, H}));
      if (op == "gated_delta_rule") inputs.tensors.emplace("g", view(g_head, {B, T, H})), grads.inputs.emplace("g", f32(d_head, {B, T, H}));
      if (op == "kda") inputs.tensors.emplace("g", gv), grads.inputs.emplace("g", f32(dg, {B, T, H, K}));
      if (op == "rwkv6") {
        inputs.tensors.emplace("w", gv), grads.inputs.emplace("w", f32(dg, {B, T, H, K}));
        inputs.tensors.emplace("u", f32(u, {H, K})), grads.inputs.emplace("u", f32(du, {H, K}));
      }
      if (op == "user") {
        inputs.tensors.emplace("x", gv), grads.inputs.emplace("x", f32(dg, {B, T, H, K}));
        inputs.tensors.emplace("y", view(y, {B, T, H, V})), grads.inputs.emplace("y", f32(dy, {B, T, H, V}));
        inputs.tensors.emplace("tau", heads_view), grads.inputs.emplace("tau", f32(dh, {H}));
      }
      ladle::RunOptions options;
      options.algorithm = algo == "chunked" ? ladle::Algorithm::chunked : algo == "auto" ? ladle::Algorithm::automatic : ladle::Algorithm::recurrent;
      options.gate_gradients =
          gate_gradients == "block_sums"             ? ladle::GateGradients::block_sums
          : gate_gradients == "boundary_blocks" ? ladle::GateGradients::boundary_blocks
                                                     : ladle::GateGradients::boundary_states;
      ladle::gpu::LaunchOptions launch{&stream};
      const auto forward = [&] { ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch); };
      const auto backward_pass = [&] {
        ladle::gpu::run_variant_backward_into(variant, qv, kv, vv, inputs, options, view(d_o, {B, T, H, V}), std::nullopt, grads, launch);
      };
      const auto first_start = std::chrono::steady_clock::now();
      const int compiles_before = ladle::BackgroundCompiles::global().started();
      forward();
      backward_pass();
      stream.synchronize();
      const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start).count();
      const bool interim = ladle::BackgroundCompiles::global().started() > compiles_before;
      const auto background_start = std::chrono::steady_clock::now();
      ladle::finish_background_compiles();  // time the kernels a steady call runs, not the interim one
      const double background_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - background_start).count();
      const auto median = [&](auto&& run) {
        std::vector<float> ms;
        for (int i = 0; i < reps; ++i) {
          e0.record(&stream);
          run();
          e1.record(&stream);
          e1.synchronize();
          ms.push_back(e0.elapsed_ms_to(e1));
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
      };
      const float fwd = median(forward), bwd = median(backward_pass), both = median([&] { forward(), backward_pass(); });
      std::vector<float> first(1);
      ladle::Device::get().synchronize();
      dq.copy_to_host(first.data(), 4);
      std::printf("{\"op\":\"%s_fwd_bwd\",\"impl\":\"ladle\",\"algo\":\"%s\",\"shape\":\"B%d T%d H%d K%d V%d bf16\","
                  "\"gate_gradients\":\"%s\",\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"total_ms\":%.3f,\"first_call_ms\":%.0f,"
                  "\"interim\":%s,\"background_ms\":%.0f,\"dq0\":%.6g}\n",
                  op.c_str(), algo.c_str(), B, T, H, K, V, gate_gradients.c_str(), fwd, bwd, both, first_ms,
                  interim ? "true" : "false", background_ms, first[0]);
      return 0;
    }
    if (tiles.empty()) tiles.push_back("");
    const char* policy = std::getenv("LADLE_AUTOTUNE");
    const std::string untiled_label = !policy || std::string(policy) != "heuristic"
                                          ? std::string("tuned(") + (policy && *policy ? policy : "cached") + ")"
                                          : "heuristic";
    std::vector<std::optional<long long>> segment_choices;
    for (long long s : segment_list) segment_choices.push_back(s);
    if (segment_choices.empty()) segment_choices.push_back(std::nullopt);
    for (const auto& segment_tokens : segment_choices)
    for (const auto& tile_text : tiles) {
      ladle::RunOptions options;
      if (segment_tokens) options.chunked_segment_tokens = *segment_tokens;
      const std::string segment_label = segment_tokens ? std::to_string(*segment_tokens) : "auto";
      options.algorithm = algo == "chunked" ? ladle::Algorithm::chunked : algo == "auto" ? ladle::Algorithm::automatic : ladle::Algorithm::recurrent;
      if (!tile_text.empty() && algo == "chunked") {
        const ladle::cuda::ChunkedTile tile = ladle::cuda::parse_chunked_tile(tile_text);
        options.chunked_tile = tile;
      } else if (!tile_text.empty()) {
        ladle::cuda::RecurrentTile tile;
        if (std::sscanf(tile_text.c_str(), "%d,%d,%d", &tile.block_k, &tile.block_v, &tile.warps) != 3) {
          std::fprintf(stderr, "--tile expects block_k,block_v,warps, got '%s'\n", tile_text.c_str());
          return 1;
        }
        options.tile = tile;
      }
      double first_call_ms = 0, background_ms = 0, second_call_ms = 0;
      bool interim = false;
      ladle::VariantInputs inputs;
      inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(K)));
      if (op == "gla") inputs.tensors.emplace("g", gv);
      if (op == "simple_gla")
        inputs.tensors.emplace("g_gamma", heads.view(ladle::DType::f32, {HV}));
      if (op == "user") {
        inputs.tensors.emplace("x", gv);
        inputs.tensors.emplace("y", view(y, {B, T, HV, V}));
        inputs.tensors.emplace("tau", heads.view(ladle::DType::f32, {HV}));
      }
      if (delta) inputs.tensors.emplace("beta", view(beta, {B, T, HV}));
      if (op == "gated_delta_rule") inputs.tensors.emplace("g", view(g_head, {B, T, HV}));
      if (op == "kda") inputs.tensors.emplace("g", gv);
      if (op == "rwkv6") {
        inputs.tensors.emplace("w", gv);
        inputs.tensors.emplace("u", u.view(ladle::DType::f32, {HV, K}));
      }
      ladle::gpu::LaunchOptions launch{&stream};
      try {
        // The first call includes tuning when no tile is named and LADLE_AUTOTUNE is not
        // heuristic: its wall time is what a first call costs.
        const int compiles_before = ladle::BackgroundCompiles::global().started();
        const auto first_start = std::chrono::steady_clock::now();
        ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch);
        stream.synchronize();
        first_call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start).count();
        // A cold call may have run the interim kernel while its kernels compile behind it: time the kernels
        // a steady call runs. background_ms: how long the compile went on after the first call.
        interim = ladle::BackgroundCompiles::global().started() > compiles_before;
        const auto background_start = std::chrono::steady_clock::now();
        ladle::finish_background_compiles();
        background_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - background_start).count();
        // The call after them: where the first call ran the interim kernel under the cached policy, this
        // one times the tuner's candidates (compiled by then).
        const auto second_start = std::chrono::steady_clock::now();
        ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch);
        stream.synchronize();
        second_call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - second_start).count();
        ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch);
        std::vector<float> ms;
        for (int i = 0; i < reps; ++i) {
          e0.record(&stream);
          ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch);
          e1.record(&stream);
          e1.synchronize();
          ms.push_back(e0.elapsed_ms_to(e1));
        }
        std::sort(ms.begin(), ms.end());
        const double median = ms[ms.size() / 2];
        const std::string heads_text = HV == H ? "H" + std::to_string(H) : "H" + std::to_string(H) + " HV" + std::to_string(HV);
        std::printf("{\"op\":\"%s\",\"impl\":\"ladle\",\"shape\":\"B%d T%d %s K%d V%d bf16\","
                    "\"tile\":\"%s\",\"segment_tokens\":\"%s\",\"ms\":%.4f,\"GBps\":%.1f,\"floor_ms\":%.4f,\"first_call_ms\":%.1f,"
                    "\"interim\":%s,\"background_ms\":%.0f,\"second_call_ms\":%.1f}\n",
                    label.c_str(), B, T, heads_text.c_str(), K, V, tile_text.empty() ? untiled_label.c_str() : tile_text.c_str(),
                    segment_label.c_str(), median, bytes / (median * 1e-3) / 1e9, bytes / (copy_gbps * 1e9) * 1e3, first_call_ms,
                    interim ? "true" : "false", background_ms, second_call_ms);
      } catch (const std::exception& e) {
        std::printf("{\"op\":\"%s\",\"impl\":\"ladle\",\"tile\":\"%s\",\"error\":\"%s\"}\n", label.c_str(),
                    tile_text.c_str(), e.what());
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ladle-bench-recurrent: %s\n", e.what());
    return 1;
  }
  return 0;
}
