// ladle-cache: lists, sizes and clears the compile cache (docs/caches.md) and the
// tuned-config cache beside it, and fills it ahead of time for a deployment.
//   ladle-cache list | size | path | tuned [-v] | clear [--compiled | --tuned]
//   ladle-cache prebuild --op gla [--op attention ...] --arch sm_90a [--shape 8x4096x16x128x128 ...]
//                        [--dtype bf16] [--gates ...] [--mask ... --mods ...] [--algo ...] [--states] [--backward]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <future>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ladle/ops/attention.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/cache.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/tuned_cache.h>

namespace {
std::string human(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  return fmt::format("{:.1f} {}", value, units[unit]);
}

std::string when(std::int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M", std::localtime(&t));
  return text;
}

std::string ms(const std::optional<double>& value) {
  return value ? fmt::format("{:.4f}", *value) : std::string("-");
}

// One line per tuned entry; with `verbose`, each entry's candidate table under it.
void show_tuned(const ladle::TunedCache& cache, bool verbose) {
  const auto files = cache.list();
  std::cout << fmt::format("{:<16} {:<24} {:<5} {:<28} {:>9} {:>9} {:>6}  {:<16}  {}\n",
                           "family", "shape", "dtype", "gpu", "best ms", "heur. ms", "gain",
                           "tuned", "best config");
  for (const auto& file : files) {
    if (!file.entry) {
      std::cout << fmt::format("DAMAGED {}: {}\n", file.path.string(), file.problem);
      continue;
    }
    const auto& key = file.entry->key;
    const auto& r = file.entry->result;
    std::cout << fmt::format("{:<16} {:<24} {:<5} {:<28} {:>9} {:>9} {:>5.2f}x  {:<16}  {}{}\n",
                             key.family, key.shape_bucket, key.dtype,
                             fmt::format("{} ({} SMs)", key.gpu, key.sm_count), ms(r.best_ms),
                             ms(r.heuristic_ms), r.speedup(), when(r.created_unix),
                             r.best.to_string(),
                             file.problem.empty() ? "" : "  [" + file.problem + "]");
    if (verbose) {
      std::cout << fmt::format("  variant {}, ladle {}, {}\n  file {}\n", key.variant,
                               key.ladle_version, ladle::format_summary(r), file.path.string());
      std::string table = ladle::format_table(r);
      for (std::size_t start = 0; start < table.size();) {
        const std::size_t end = table.find('\n', start);
        std::cout << "    " << table.substr(start, end - start) << "\n";
        start = end == std::string::npos ? table.size() : end + 1;
      }
    }
  }
  std::cout << fmt::format("{} tuned configs in {}\n", files.size(), cache.dir().string());
}

// "8x4096x16x128x128": B x T x H x K x V (attention: B x T x H x D x Dv).
ladle::CallShape parse_shape(const std::string& text) {
  std::vector<std::int64_t> sizes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('x', start), text.size());
    const std::string part = text.substr(start, end - start);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 9) sizes.clear(), start = text.size() + 1;
    else sizes.push_back(std::stoll(part)), start = end + 1;
  }
  if (sizes.size() != 5 || std::count(sizes.begin(), sizes.end(), 0) > 0)
    throw ladle::InvalidArgument(
        fmt::format("--shape '{}', expected BxTxHxKxV of positive sizes, e.g. 8x4096x16x128x128", text));
  ladle::CallShape shape;
  shape.batch = sizes[0], shape.tokens = sizes[1], shape.heads = sizes[2], shape.key_dim = sizes[3], shape.value_dim = sizes[4];
  return shape;
}

ladle::DType parse_dtype(const std::string& name) {
  if (name == "bf16") return ladle::DType::bf16;
  if (name == "f16") return ladle::DType::f16;
  if (name == "f32") return ladle::DType::f32;
  throw ladle::InvalidArgument(fmt::format("--dtype '{}', expected bf16, f16 or f32", name));
}

struct PrebuildRequest {
  std::vector<std::string> ops, shapes{"8x1024x16x128x128"};
  std::string arch = "sm_90a", dtype = "bf16", gates, masks, mods, algo = "automatic";
  bool states = false;
  bool backward = false;  // also the backward's kernels (as a call that trains compiles them)
};

// Plans every kernel the requested calls launch on the arch (the launcher's own plan), compiles
// them in parallel into the cache and prints one line each. Returns the number that failed.
int prebuild(const PrebuildRequest& request, ladle::DiskCache& cache) {
  if (cache.read_only()) throw ladle::InvalidArgument(fmt::format("prebuild: the cache '{}' is read only", cache.dir().string()));
  if (!cache.disk_enabled())
    throw ladle::InvalidArgument("prebuild: the cache has no directory to fill (LADLE_DISABLE_CACHE, or no LADLE_CACHE_DIR / HOME)");
  const ladle::DType type = parse_dtype(request.dtype);
  const bool attention = std::count(request.ops.begin(), request.ops.end(), "attention") > 0;
  const bool recurrent = std::count(request.ops.begin(), request.ops.end(), "attention") < static_cast<long>(request.ops.size());
  if (!attention && (!request.masks.empty() || !request.mods.empty()))
    throw ladle::InvalidArgument(fmt::format("--mask and --mods apply to --op attention, not to --op {}", fmt::join(request.ops, ", --op ")));
  if (!recurrent && (!request.gates.empty() || request.algo != "automatic" || request.states))
    throw ladle::InvalidArgument("--gates, --algo and --states apply to the recurrent ops, not to --op attention");
  std::vector<std::pair<std::string, ladle::GeneratedKernel>> planned;  // (call, kernel)
  for (const std::string& op : request.ops)
    for (const std::string& text : request.shapes) {
      ladle::CallShape shape = parse_shape(text);
      shape.type = type;
      const std::string call = fmt::format("{} {} {}", op, text, request.dtype);
      std::vector<ladle::GeneratedKernel> kernels;
      if (op == "attention") {
        const std::string list = request.masks + (!request.masks.empty() && !request.mods.empty() ? "," : "") + request.mods;
        const ladle::ir::AttentionVariant& variant = ladle::attention_variant(ladle::parse_attention_features(list));
        ladle::AttentionRunOptions options;
        if (variant.dropout) options.dropout_p = 0.1f;
        kernels = ladle::generated_kernels(variant, shape, options, request.arch);
        if (request.backward) {  // a call that trains: its forward returns lse (another kernel), then the backward's
          options.return_lse = true;
          for (auto& kernel : ladle::generated_kernels(variant, shape, options, request.arch)) kernels.push_back(std::move(kernel));
          for (auto& kernel : ladle::generated_backward_kernels(variant, shape, options, request.arch)) kernels.push_back(std::move(kernel));
        }
      } else {
        const ladle::ir::Variant& variant = ladle::named_variant(op, request.gates);
        ladle::RunOptions options;
        if (request.algo == "chunked") options.algorithm = ladle::Algorithm::chunked;
        else if (request.algo == "recurrent") options.algorithm = ladle::Algorithm::recurrent;
        else if (request.algo != "automatic")
          throw ladle::InvalidArgument(fmt::format("--algo '{}', expected automatic, recurrent or chunked", request.algo));
        options.return_state = request.states;
        shape.initial_state = request.states;
        kernels = ladle::generated_kernels(variant, shape, options, request.arch);
        if (request.backward)  // the GPU backward's programs: its recurrences, state passes, own kernels and helpers
          for (auto& kernel : ladle::generated_backward_kernels(variant, shape, options, request.arch)) kernels.push_back(std::move(kernel));
      }
      for (auto& kernel : kernels) {  // a kernel two calls share (its name hashes its source) is compiled once
        const auto same = [&](const auto& p) { return p.second.name == kernel.name; };
        if (std::none_of(planned.begin(), planned.end(), same)) planned.emplace_back(call, std::move(kernel));
      }
    }
  // Compile side by side: each kernel is its own NVRTC program.
  const std::size_t workers = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 16));
  std::vector<std::future<ladle::CompiledProgram>> running;
  std::size_t next = 0, failed = 0, compiled = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto launch = [&] {
    const ladle::GeneratedKernel& kernel = planned[next++].second;
    running.push_back(std::async(std::launch::async, [&kernel, &request] { return ladle::compile_generated(kernel, request.arch); }));
  };
  while (next < planned.size() && running.size() < workers) launch();
  for (std::size_t i = 0; i < planned.size(); ++i) {
    const auto& [call, kernel] = planned[i];
    try {
      const ladle::CompiledProgram program = running[i].get();
      compiled += program.from_cache ? 0 : 1;
      std::cout << fmt::format("{:<40} {:<18} {}  {}\n", call, kernel.role, kernel.name,
                               program.from_cache ? "already cached" : fmt::format("compiled in {:.0f} ms", program.compile_ms));
    } catch (const std::exception& e) {
      ++failed;
      std::cout << fmt::format("{:<40} {:<18} {}  FAILED: {}\n", call, kernel.role, kernel.name, e.what());
    }
    if (next < planned.size()) launch();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("{} kernels for {} ({} compiled, {} already cached, {} failed) in {:.1f} s into {}\n", planned.size(),
                           request.arch, compiled, planned.size() - compiled - failed, failed, seconds, cache.dir().string());
  return static_cast<int>(failed);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-cache: inspect the compile cache and the tuned-config cache"};
  app.require_subcommand(1);
  auto* list = app.add_subcommand(
      "list", "one line per compiled entry: key, arch, size, last use, kernels");
  auto* size = app.add_subcommand("size", "total bytes on disk and the bound");
  auto* clear = app.add_subcommand("clear", "remove every compiled entry and every tuned config");
  bool only_compiled = false, only_tuned = false;
  clear->add_flag("--compiled", only_compiled, "remove compiled kernels only");
  clear->add_flag("--tuned", only_tuned, "remove tuned configs only");
  auto* path = app.add_subcommand("path", "print the cache directory");
  auto* tuned = app.add_subcommand(
      "tuned", "one line per tuned config: family, shape bucket, dtype, GPU, best time and config");
  bool verbose = false;
  tuned->add_flag("-v,--verbose", verbose, "also print each entry's candidate table");
  auto* prebuild_command = app.add_subcommand(
      "prebuild",
      "compile the kernels that named ops launch at given shapes on an arch into the cache, ahead of time "
      "(no GPU needed); ship the directory and load it with LADLE_CACHE_READONLY=1");
  PrebuildRequest request;
  prebuild_command->add_option("--op", request.ops, "gla, recurrent, delta_rule, gated_delta_rule, rwkv6 or attention (repeat for more)")
      ->required();
  prebuild_command->add_option("--shape", request.shapes, "BxTxHxKxV (attention: BxTxHxDxDv), repeat for more; default 8x1024x16x128x128");
  prebuild_command->add_option("--arch", request.arch, "the target, e.g. sm_90a (H100, H200) or sm_80 (A100); default sm_90a");
  prebuild_command->add_option("--dtype", request.dtype, "bf16, f16 or f32 (q, k, v); default bf16");
  prebuild_command->add_option("--gates", request.gates, "recurrent ops: as ladle-dump --gates (g,gk,gv,g_gamma; l2norm)");
  prebuild_command->add_option("--mask", request.masks, "attention: causal,window,segments,mask,sinks,dropout");
  prebuild_command->add_option("--mods", request.mods, "attention: bias,softcap");
  prebuild_command->add_option("--algo", request.algo, "recurrent ops: automatic (the op's choice), recurrent or chunked");
  prebuild_command->add_flag("--states", request.states, "recurrent ops: calls with an initial state and the final state returned");
  prebuild_command->add_flag("--backward", request.backward,
                             "also the backward's kernels: attention's (and the forward that returns lse, as a call that trains runs "
                             "it); a recurrent op's recurrences, state passes, slots, chain and helpers");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto settings = ladle::DiskCache::settings_from_env();
    if (settings.disabled) {
      std::cout << "the cache is disabled (LADLE_DISABLE_CACHE is set); tuned configs live in "
                   "each process's memory only\n";
      return 0;
    }
    ladle::DiskCache cache(settings);
    if (*prebuild_command) return prebuild(request, cache) == 0 ? 0 : 1;
    ladle::TunedCache tuned_cache(ladle::TunedCache::Settings::from_env());
    if (*path) std::cout << cache.dir().string() << "\n";
    if (*size) {
      std::cout << fmt::format("{}: {} in {} entries (bound {}); {} tuned configs\n",
                               cache.dir().string(), human(cache.disk_bytes()), cache.list().size(),
                               human(cache.max_bytes()), tuned_cache.list().size());
    }
    if (*list) {
      auto entries = cache.list();
      std::cout << fmt::format("{:<32}  {:<7} {:>10}  {:<16}  {}\n", "key", "arch", "size",
                               "last used", "kernels");
      for (const auto& e : entries) {
        std::cout << fmt::format("{:<32}  {:<7} {:>10}  {:<16}  {}\n", e.key,
                                 e.valid ? e.arch : "DAMAGED", human(e.bytes),
                                 when(e.last_used_unix), e.kernels);
      }
      std::cout << fmt::format("{} entries in {}; {} tuned configs (ladle-cache tuned)\n",
                               entries.size(), cache.dir().string(), tuned_cache.list().size());
    }
    if (*tuned) show_tuned(tuned_cache, verbose);
    if (*clear) {
      if (only_compiled && only_tuned) only_compiled = only_tuned = false;  // both: everything
      if (!only_tuned) {
        std::cout << fmt::format("removed {} compiled entries from {}\n", cache.clear(),
                                 cache.dir().string());
      }
      if (!only_compiled) {
        std::cout << fmt::format("removed {} tuned configs from {}\n", tuned_cache.clear(),
                                 tuned_cache.dir().string());
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "ladle-cache: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
