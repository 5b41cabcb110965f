#include "cache.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "detail/files.h"
#include "error.h"
#include "hash.h"
#include "log.h"

#ifndef LADLE_VERSION_STRING
#define LADLE_VERSION_STRING "0.0.0"
#endif

namespace fs = std::filesystem;
using nlohmann::json;

namespace ladle {
namespace {

using detail::read_file;
using detail::unique_suffix;
using detail::write_file;

constexpr int kManifestFormat = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kSource = "kernel.cu";
constexpr const char* kPtx = "kernel.ptx";
constexpr const char* kCubin = "kernel.cubin";

bool is_key(const std::string& name) {
  return name.size() == 32 &&
         std::all_of(name.begin(), name.end(), [](char c) { return std::isxdigit(c) != 0; });
}

std::uint64_t parse_size(const std::string& text) {
  std::smatch m;
  static const std::regex pattern(R"(\s*(\d+)\s*([kKmMgGtT]?)[iI]?[bB]?\s*)");
  if (!std::regex_match(text, m, pattern)) {
    throw InvalidArgument(fmt::format(
        "LADLE_CACHE_MAX_BYTES='{}' is not a size; expected a number with an optional K/M/G suffix",
        text));
  }
  std::uint64_t value = std::stoull(m[1]);
  switch (m[2].str().empty() ? ' ' : std::tolower(m[2].str()[0])) {
    case 't': value <<= 10; [[fallthrough]];
    case 'g': value <<= 10; [[fallthrough]];
    case 'm': value <<= 10; [[fallthrough]];
    case 'k': value <<= 10; break;
    default: break;
  }
  return value;
}

std::uint64_t directory_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) total += it->file_size(size_ec);
  }
  return total;
}

std::int64_t to_unix(fs::file_time_type time) {
  // libstdc++ 12 lacks clock_cast; shift by the offset between the two clocks now.
  const auto system = std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          time - fs::file_time_type::clock::now());
  return std::chrono::duration_cast<std::chrono::seconds>(system.time_since_epoch()).count();
}

// Makes a directory vanish atomically (rename), then deletes it at leisure.
void remove_entry_dir(const fs::path& entry) {
  std::error_code ec;
  fs::path trash = entry.parent_path() / (".trash-" + unique_suffix());
  fs::rename(entry, trash, ec);
  fs::remove_all(ec ? entry : trash, ec);
}

}  // namespace

DiskCache::Settings DiskCache::settings_from_env() {
  Settings settings;
  if (const char* off = std::getenv("LADLE_DISABLE_CACHE"); off && std::string(off) != "0" &&
                                                            std::string(off) != "") {
    settings.disabled = true;
    return settings;
  }
  if (const char* dir = std::getenv("LADLE_CACHE_DIR"); dir && *dir) {
    settings.dir = dir;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    settings.dir = fs::path(xdg) / "ladle";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    settings.dir = fs::path(home) / ".cache" / "ladle";
  }
  if (const char* max = std::getenv("LADLE_CACHE_MAX_BYTES"); max && *max) {
    settings.max_bytes = parse_size(max);
  }
  if (const char* read_only = std::getenv("LADLE_CACHE_READONLY"); read_only && *read_only) {
    const std::string value = read_only;
    if (value != "0" && value != "1")
      throw InvalidArgument(fmt::format("LADLE_CACHE_READONLY='{}', expected 1 (read only) or 0", value));
    settings.read_only = value == "1";
  }
  return settings;
}

DiskCache& DiskCache::global() {
  static DiskCache cache(settings_from_env());
  return cache;
}

DiskCache::DiskCache(Settings settings) : settings_(std::move(settings)) {
  if (settings_.disabled) return;
  if (settings_.dir.empty()) {
    memory_only_ = true;
    log::warn("compile cache: no cache directory (set LADLE_CACHE_DIR or HOME); memory only");
    return;
  }
  std::error_code ec;
  const bool exists = fs::is_directory(settings_.dir, ec);
  if (settings_.read_only) {
    read_only_ = true;
    if (!exists)
      log::warn(fmt::format("compile cache: the read-only cache '{}' does not exist; kernels are compiled and kept in "
                            "memory only",
                            settings_.dir.string()));
    return;
  }
  if (!detail::is_writable_directory(settings_.dir)) {
    if (exists) {
      read_only_ = true;
      log::warn(fmt::format(
          "compile cache: '{}' is not writable; its entries are used, and new kernels are kept in memory only for "
          "this process (set LADLE_CACHE_DIR to a writable directory, or LADLE_CACHE_READONLY=1 to say so)",
          settings_.dir.string()));
      return;
    }
    memory_only_ = true;
    log::warn(fmt::format(
        "compile cache: '{}' is not writable; kernels are cached in memory only for this "
        "process (set LADLE_CACHE_DIR to a writable directory)",
        settings_.dir.string()));
  }
}

std::string DiskCache::make_key(const std::string& source, const std::vector<std::string>& options,
                                const std::string& arch, const std::string& nvrtc_version) {
  FieldHasher hasher;
  hasher.add("ladle-compile-cache").add(std::to_string(kManifestFormat)).add(LADLE_VERSION_STRING);
  hasher.add(source).add(arch).add(nvrtc_version);
  for (const auto& option : options) hasher.add(option);
  return hasher.hex();
}

std::optional<CompiledProgram> DiskCache::read_entry(const fs::path& entry) const {
  auto manifest_text = read_file(entry / kManifest);
  if (!manifest_text) return std::nullopt;
  try {
    json manifest = json::parse(*manifest_text);
    if (manifest.at("format").get<int>() != kManifestFormat) return std::nullopt;
    CompiledProgram program;
    program.key = manifest.at("key").get<std::string>();
    if (program.key != entry.filename().string()) return std::nullopt;
    program.arch = manifest.at("arch").get<std::string>();
    program.options = manifest.at("options").get<std::vector<std::string>>();
    program.log = manifest.at("log").get<std::string>();
    for (const auto& k : manifest.at("kernels")) {
      KernelResources r;
      r.name = k.at("name").get<std::string>();
      r.registers = k.at("registers").get<int>();
      r.stack_frame_bytes = k.at("stack_frame_bytes").get<int>();
      r.spill_store_bytes = k.at("spill_store_bytes").get<int>();
      r.spill_load_bytes = k.at("spill_load_bytes").get<int>();
      r.shared_bytes = k.at("shared_bytes").get<int>();
      r.constant_bytes = k.at("constant_bytes").get<int>();
      r.barriers = k.at("barriers").get<int>();
      program.kernels.push_back(r);
    }
    for (const auto& [name, file] : manifest.at("files").items()) {
      auto bytes = read_file(entry / name);
      if (!bytes || bytes->size() != file.at("bytes").get<std::uint64_t>() ||
          content_hash(*bytes) != file.at("hash").get<std::string>()) {
        log::warn(fmt::format("compile cache: entry '{}' is damaged ({} does not match its "
                              "checksum); it will be rebuilt",
                              entry.string(), name));
        return std::nullopt;
      }
      if (name == kSource) program.source = std::move(*bytes);
      else if (name == kPtx) program.ptx = std::move(*bytes);
      else if (name == kCubin) program.cubin = std::move(*bytes);
    }
    if (program.ptx.empty() || program.source.empty()) return std::nullopt;
    program.entry_path = entry.string();
    return program;
  } catch (const json::exception& e) {
    log::warn(fmt::format("compile cache: entry '{}' has an unreadable manifest ({}); it will "
                          "be rebuilt",
                          entry.string(), e.what()));
    return std::nullopt;
  }
}

void DiskCache::touch(const fs::path& entry) const {
  std::error_code ec;
  fs::last_write_time(entry, fs::file_time_type::clock::now(), ec);
}

std::optional<CompiledProgram> DiskCache::lookup(const std::string& key) {
  if (settings_.disabled) return std::nullopt;
  {
    std::lock_guard lock(mutex_);
    if (auto it = memory_.find(key); it != memory_.end()) return it->second;
  }
  if (!disk_readable()) return std::nullopt;
  const fs::path entry = settings_.dir / key;
  std::error_code ec;
  if (!fs::exists(entry, ec)) return std::nullopt;
  auto program = read_entry(entry);
  if (!program) {
    if (!read_only_) remove_entry_dir(entry);
    return std::nullopt;
  }
  if (!read_only_) touch(entry);
  std::lock_guard lock(mutex_);
  memory_.emplace(key, *program);
  return program;
}

std::string DiskCache::store(const CompiledProgram& program) {
  if (settings_.disabled) return "";
  {
    std::lock_guard lock(mutex_);
    memory_.insert_or_assign(program.key, program);
  }
  if (!disk_enabled()) return "";

  const fs::path entry = settings_.dir / program.key;
  const fs::path temp = settings_.dir / (".tmp-" + program.key + "-" + unique_suffix());
  try {
    fs::create_directories(temp);
    json files = json::object();
    auto put = [&](const char* name, const std::string& bytes) {
      write_file(temp / name, bytes);
      files[name] = {{"bytes", bytes.size()}, {"hash", content_hash(bytes)}};
    };
    put(kSource, program.source);
    put(kPtx, program.ptx);
    if (!program.cubin.empty()) put(kCubin, program.cubin);
    json kernels = json::array();
    for (const auto& k : program.kernels) {
      kernels.push_back({{"name", k.name},
                         {"registers", k.registers},
                         {"stack_frame_bytes", k.stack_frame_bytes},
                         {"spill_store_bytes", k.spill_store_bytes},
                         {"spill_load_bytes", k.spill_load_bytes},
                         {"shared_bytes", k.shared_bytes},
                         {"constant_bytes", k.constant_bytes},
                         {"barriers", k.barriers}});
    }
    json manifest = {{"format", kManifestFormat},  {"key", program.key},
                     {"arch", program.arch},       {"options", program.options},
                     {"log", program.log},         {"kernels", kernels},
                     {"files", files},             {"ladle_version", LADLE_VERSION_STRING}};
    write_file(temp / kManifest, manifest.dump(2));

    // Publish. If another process published first, keep its entry when it is whole.
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::error_code ec;
      fs::rename(temp, entry, ec);
      if (!ec) break;
      if (read_entry(entry)) {
        fs::remove_all(temp, ec);
        break;
      }
      remove_entry_dir(entry);
    }
    std::error_code ec;
    if (fs::exists(temp, ec)) fs::remove_all(temp, ec);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(temp, ec);
    log::warn(fmt::format("compile cache: could not store entry {}: {}", program.key, e.what()));
    return "";
  }
  evict_to(settings_.max_bytes);
  return entry.string();
}

std::vector<CacheEntryInfo> DiskCache::scan() const {
  std::vector<CacheEntryInfo> entries;
  if (settings_.dir.empty()) return entries;
  std::error_code ec;
  for (fs::directory_iterator it(settings_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code kind_ec;
    if (!it->is_directory(kind_ec) || !is_key(name)) continue;
    CacheEntryInfo info;
    info.key = name;
    info.path = it->path();
    info.bytes = directory_bytes(it->path());
    std::error_code time_ec;
    info.last_used_unix = to_unix(fs::last_write_time(it->path(), time_ec));
    entries.push_back(std::move(info));
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.last_used_unix > b.last_used_unix; });
  return entries;
}

std::vector<CacheEntryInfo> DiskCache::list() const {
  auto entries = scan();
  for (auto& info : entries) {
    auto program = read_entry(info.path);
    info.valid = program.has_value();
    if (!program) continue;
    info.arch = program->arch;
    for (const auto& k : program->kernels)
      info.kernels += (info.kernels.empty() ? "" : ",") + k.name;
  }
  return entries;
}

std::uint64_t DiskCache::disk_bytes() const {
  std::uint64_t total = 0;
  for (const auto& e : scan()) total += e.bytes;
  return total;
}

std::size_t DiskCache::clear() {
  if (read_only_)
    throw InvalidArgument(fmt::format("the compile cache '{}' is read only (LADLE_CACHE_READONLY=1 or not writable); "
                                      "nothing was removed",
                                      settings_.dir.string()));
  {
    std::lock_guard lock(mutex_);
    memory_.clear();
  }
  std::size_t removed = 0;
  if (settings_.dir.empty()) return 0;
  std::vector<fs::path> doomed;
  std::error_code ec;
  // Only what ladle made: key-named entries, its temporaries and failed sources.
  for (fs::directory_iterator it(settings_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_key(name)) ++removed;
    if (is_key(name) || name.starts_with(".tmp-") || name.starts_with(".trash-") || name.starts_with(".note-") ||
        name == "failed")
      doomed.push_back(it->path());
  }
  for (const auto& path : doomed) remove_entry_dir(path);
  return removed;
}

void DiskCache::evict_to(std::uint64_t max_bytes) {
  if (!disk_enabled()) return;
  auto entries = scan();  // newest first
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  while (total > max_bytes && !entries.empty()) {
    const auto& oldest = entries.back();
    log::debug(fmt::format("compile cache: evicting {} ({} bytes)", oldest.key, oldest.bytes));
    remove_entry_dir(oldest.path);
    {
      std::lock_guard lock(mutex_);
      memory_.erase(oldest.key);
    }
    total -= oldest.bytes;
    entries.pop_back();
  }
}

std::optional<std::string> DiskCache::read_note(const std::string& name) const {
  if (!disk_readable()) return std::nullopt;
  return read_file(settings_.dir / (".note-" + name));
}

void DiskCache::write_note(const std::string& name, const std::string& text) const {
  if (!disk_enabled()) return;
  try {
    detail::write_file_atomically(settings_.dir / (".note-" + name), text);
  } catch (const Error&) {
    // A note is only a shortcut; without it the next process asks NVRTC again.
  }
}

fs::path DiskCache::failed_source_path(const std::string& key) const {
  if (disk_enabled()) {
    std::error_code ec;
    fs::create_directories(settings_.dir / "failed", ec);
    if (!ec) return settings_.dir / "failed" / (key + ".cu");
  }
  return fs::temp_directory_path() / ("ladle-failed-" + key + ".cu");
}

}  // namespace ladle
