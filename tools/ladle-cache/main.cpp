// ladle-cache: lists, sizes and clears the compile cache (DESIGN.md section 3).
//   ladle-cache list | size | clear | path
#include <chrono>
#include <ctime>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/runtime/cache.h>
#include <ladle/runtime/error.h>

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
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-cache: inspect the compile cache"};
  app.require_subcommand(1);
  auto* list = app.add_subcommand("list", "one line per entry: key, arch, size, last use, kernels");
  auto* size = app.add_subcommand("size", "total bytes on disk and the bound");
  auto* clear = app.add_subcommand("clear", "remove every entry");
  auto* path = app.add_subcommand("path", "print the cache directory");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto settings = ladle::DiskCache::settings_from_env();
    if (settings.disabled) {
      std::cout << "the cache is disabled (LADLE_DISABLE_CACHE is set)\n";
      return 0;
    }
    ladle::DiskCache cache(settings);
    if (*path) std::cout << cache.dir().string() << "\n";
    if (*size) {
      std::cout << fmt::format("{}: {} in {} entries (bound {})\n", cache.dir().string(),
                               human(cache.disk_bytes()), cache.list().size(),
                               human(cache.max_bytes()));
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
      std::cout << fmt::format("{} entries in {}\n", entries.size(), cache.dir().string());
    }
    if (*clear) {
      const std::size_t removed = cache.clear();
      std::cout << fmt::format("removed {} entries from {}\n", removed, cache.dir().string());
    }
  } catch (const std::exception& e) {
    std::cerr << "ladle-cache: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
