// ladle-tune: tunes an op's kernel at given shapes on this GPU, prints the table of
// candidates (config, time, valid, why not) and stores the best in the tuned-config cache,
// where later calls of the op find it (LADLE_AUTOTUNE=cached).
//   ladle-tune --op gla -B 8 -T 4096 -H 16 -K 128 -V 128 [--gates g_gamma] [--algo chunked]
//              [--dtype bf16] [--budget 15]
// The family is the one the op would run at that shape (Algorithm::automatic) unless --algo
// names it. Inputs are random bf16 or f16 on the device (gates as GLA makes them).
#include <cmath>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/tune_recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "device_fill.h"

int main(int argc, char** argv) {
  CLI::App app{"ladle-tune: tune an op's kernel at a shape and store the result"};
  std::string op = "gla", gates, algo, dtype = "bf16";
  int B = 8, T = 4096, H = 16, K = 128, V = 128;
  double budget_s = 15;
  app.add_option("--op", op, "the op")->check(CLI::IsMember({"gla", "recurrent"}));
  app.add_option("--gates", gates, "recurrent: among g,gk,gv,g_gamma; gla: g_gamma adds it");
  app.add_option("-B", B);
  app.add_option("-T", T);
  app.add_option("-H", H);
  app.add_option("-K", K);
  app.add_option("-V", V);
  app.add_option("--algo", algo, "kernel family (default: the op's choice at this shape)")
      ->check(CLI::IsMember({"recurrent", "chunked"}));
  app.add_option("--dtype", dtype, "q, k, v and o")->check(CLI::IsMember({"bf16", "f16"}));
  app.add_option("--budget", budget_s, "seconds");
  CLI11_PARSE(app, argc, argv);
  try {
    auto& device = ladle::Device::get();
    const ladle::ir::Variant& variant = ladle::named_variant(op, gates);
    const auto type = dtype == "f16" ? ladle::ElementType::f16 : ladle::ElementType::bf16;
    std::vector<ladle::DeviceBuffer> buffers;
    ladle::VariantInputs inputs;
    inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(K)));
    auto device_view = [&](std::vector<std::int64_t> shape, unsigned seed, bool gate) {
      std::int64_t n = 1;
      for (auto s : shape) n *= s;
      buffers.emplace_back(static_cast<std::size_t>(n) * 2);
      ladle::bench::fill(buffers.back(), type, seed, gate);
      return ladle::TensorView::contiguous(reinterpret_cast<const void*>(buffers.back().device_ptr()), type,
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
    const ladle::ops::BoundInputs bound = ladle::ops::bind_inputs(op, variant, q, k, v, inputs, options);
    // Throws for a family the variant or shape cannot run (chunked with a normaliser, K > 256).
    options.algorithm = ladle::gpu::choose_algorithm(variant, bound, options);
    ladle::TuneJob job =
        options.algorithm == ladle::Algorithm::chunked
            ? ladle::gpu::chunked_tune_job(variant, bound, options, ladle::gpu::heuristic_chunked_tile(variant, bound))
            : ladle::gpu::recurrent_tune_job(variant, bound, options, ladle::gpu::heuristic_tile(bound));
    ladle::TuneOptions tune_options;
    tune_options.budget_ms = budget_s * 1e3;
    std::cout << "tuning " << job.key.to_string() << "\n";
    const ladle::TuneResult result = job.measure(tune_options);
    std::cout << ladle::format_table(result) << "\n";
    const auto path = ladle::TunedCache::global().store(job.key, result);
    std::cout << "stored: " << (path.empty() ? std::string("(memory only)") : path.string()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "ladle-tune: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
