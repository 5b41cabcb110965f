// ladle-bench-recurrent: the fused-recurrent GLA forward on the GPU at one shape, for the
// side-by-side table with fla (bench/gpu-check.sh runs both in one call). Inputs are
// random on the device (a fill kernel compiled through ladle): q, k, v ~ N(0,1)-ish,
// g = logsigmoid(x)/16 as GLA uses it. Prints one JSON line per tile tried:
//   {"op":"fused_recurrent_gla","impl":"ladle","tile":"...","ms":...,"GBps":...}
// plus the measured device copy bandwidth for the byte floor.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/gla.h>
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
  app.add_option("--reps", reps);
  app.add_option("--tile", tiles, "block_k,block_v,warps (repeatable); default: the heuristic");
  CLI11_PARSE(app, argc, argv);
  try {
    auto& device = ladle::Device::get();
    const long long n_k = 1LL * B * T * H * K, n_v = 1LL * B * T * H * V;
    ladle::DeviceBuffer q(n_k * 2), k(n_k * 2), v(n_v * 2), g(n_k * 2), o(n_v * 2);
    ladle::bench::fill_bf16(q, 1, false);
    ladle::bench::fill_bf16(k, 2, false);
    ladle::bench::fill_bf16(v, 3, false);
    ladle::bench::fill_bf16(g, 4, true);
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
      return ladle::TensorView::contiguous(reinterpret_cast<const void*>(b.device_ptr()), ladle::ElementType::bf16,
                                           std::move(shape));
    };
    const auto qv = view(q, {B, T, H, K}), kv = view(k, {B, T, H, K}), vv = view(v, {B, T, H, V}),
               gv = view(g, {B, T, H, K}), ov = view(o, {B, T, H, V});
    const double bytes = 2.0 * (3.0 * n_k + 2.0 * n_v);  // q, k, g, v read once; o written once
    if (tiles.empty()) tiles.push_back("");
    const char* policy = std::getenv("LADLE_AUTOTUNE");
    const std::string untiled_label = !policy || std::string(policy) != "heuristic"
                                          ? std::string("tuned(") + (policy && *policy ? policy : "cached") + ")"
                                          : "heuristic";
    for (const auto& tile_text : tiles) {
      ladle::RunOptions options;
      if (!tile_text.empty()) {
        ladle::cuda::RecurrentTile tile;
        if (std::sscanf(tile_text.c_str(), "%d,%d,%d", &tile.block_k, &tile.block_v, &tile.warps) != 3) {
          std::fprintf(stderr, "--tile expects block_k,block_v,warps, got '%s'\n", tile_text.c_str());
          return 1;
        }
        options.tile = tile;
      }
      double first_call_ms = 0;
      ladle::VariantInputs inputs;
      inputs.tensors.emplace("g", gv);
      inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(K)));
      const auto& variant = ladle::gla_variant(false);
      ladle::gpu::LaunchOptions launch{&stream};
      try {
        // The first call includes tuning when no tile is named and LADLE_AUTOTUNE is not
        // heuristic: its wall time is what a first call costs.
        const auto first_start = std::chrono::steady_clock::now();
        ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch);
        stream.synchronize();
        first_call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start).count();
        for (int i = 0; i < 2; ++i) ladle::gpu::run_variant_into(variant, qv, kv, vv, inputs, options, {ov, std::nullopt}, launch);
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
        std::printf("{\"op\":\"fused_recurrent_gla\",\"impl\":\"ladle\",\"shape\":\"B%d T%d H%d K%d V%d bf16\","
                    "\"tile\":\"%s\",\"ms\":%.4f,\"GBps\":%.1f,\"floor_ms\":%.4f,\"first_call_ms\":%.1f}\n",
                    B, T, H, K, V, tile_text.empty() ? untiled_label.c_str() : tile_text.c_str(), median,
                    bytes / (median * 1e-3) / 1e9, bytes / (copy_gbps * 1e9) * 1e3, first_call_ms);
      } catch (const std::exception& e) {
        std::printf("{\"op\":\"fused_recurrent_gla\",\"impl\":\"ladle\",\"tile\":\"%s\",\"error\":\"%s\"}\n",
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
