// ladle-cache: lists, sizes and clears the compile cache (docs/caches.md) and the
// tuned-config cache beside it.
//   ladle-cache list | size | path | tuned [-v] | clear [--compiled | --tuned]
#include <chrono>
#include <ctime>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

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
  CLI11_PARSE(app, argc, argv);

  try {
    const auto settings = ladle::DiskCache::settings_from_env();
    if (settings.disabled) {
      std::cout << "the cache is disabled (LADLE_DISABLE_CACHE is set); tuned configs live in "
                   "each process's memory only\n";
      return 0;
    }
    ladle::DiskCache cache(settings);
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
