#include "tuned_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cache.h"
#include "detail/files.h"
#include "error.h"
#include "hash.h"
#include "log.h"
#include "version.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace ladle {
namespace {

constexpr int kFormat = 1;
constexpr std::string_view kSuffix = ".json";

bool is_entry_file(const fs::path& path) {
  const std::string name = path.filename().string();
  if (name.size() != 32 + kSuffix.size() || !name.ends_with(kSuffix)) return false;
  return std::all_of(name.begin(), name.begin() + 32,
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

json config_json(const Config& config) {
  json object = json::object();
  for (const auto& [name, value] : config.values()) object[name] = value;
  return object;
}

Config config_from(const json& object) {
  if (!object.is_object()) throw Error("a config is not an object");
  Config config;
  for (const auto& [name, value] : object.items()) {
    if (!value.is_number_integer())
      throw Error(fmt::format("config value '{}' is not an integer", name));
    config.set(name, value.get<int>());
  }
  return config;
}

json optional_ms(const std::optional<double>& ms) {
  return ms ? json(*ms) : json(nullptr);
}

std::optional<double> ms_from(const json& value, std::string_view what) {
  if (value.is_null()) return std::nullopt;
  if (!value.is_number()) throw Error(fmt::format("{} is not a number", what));
  const double ms = value.get<double>();
  if (!std::isfinite(ms) || ms < 0) throw Error(fmt::format("{} = {} is not a time", what, ms));
  return ms;
}

std::int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::int64_t bucket_pow2(std::int64_t n) {
  if (n <= 0) return 0;
  return static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(n)));
}

std::string shape_bucket(std::initializer_list<std::pair<std::string_view, std::int64_t>> sizes) {
  std::string out;
  for (const auto& [name, size] : sizes) {
    if (!out.empty()) out += '-';
    out += fmt::format("{}{}", name, size);
  }
  return out;
}

// ---- TunedKey ----

TunedKey TunedKey::make(std::string family, std::string variant, std::string bucket,
                        std::string dtype, const DeviceLimits& device) {
  TunedKey key;
  key.family = std::move(family);
  key.variant = std::move(variant);
  key.shape_bucket = std::move(bucket);
  key.dtype = std::move(dtype);
  key.gpu = device.name;
  key.sm_count = device.sm_count;
  key.ladle_version = version();
  return key;
}

std::string TunedKey::hash() const {
  FieldHasher hasher;
  hasher.add("ladle-tuned-config").add(std::to_string(kFormat));
  hasher.add(family).add(variant).add(shape_bucket).add(dtype).add(gpu);
  hasher.add(std::to_string(sm_count)).add(ladle_version);
  return hasher.hex();
}

std::string TunedKey::to_string() const {
  return fmt::format("{} {} {} {} on {} ({} SMs), ladle {}", family, variant.substr(0, 12),
                     shape_bucket, dtype, gpu, sm_count, ladle_version);
}

// ---- JSON ----

std::string TunedCache::to_json(const TunedKey& key, const TuneResult& result) {
  json candidates = json::array();
  for (const auto& c : result.candidates) {
    candidates.push_back({{"config", config_json(c.config)},
                          {"ms", optional_ms(c.ms)},
                          {"valid", c.valid},
                          {"reason", c.reason},
                          {"prepare_ms", optional_ms(c.prepare_ms)},
                          {"heuristic", c.heuristic}});
  }
  json document = {
      {"format", kFormat},
      {"key",
       {{"family", key.family},
        {"variant", key.variant},
        {"shape_bucket", key.shape_bucket},
        {"dtype", key.dtype},
        {"gpu", key.gpu},
        {"sm_count", key.sm_count},
        {"ladle_version", key.ladle_version}}},
      {"best", {{"config", config_json(result.best)}, {"ms", optional_ms(result.best_ms)}}},
      {"heuristic",
       {{"config", config_json(result.heuristic)}, {"ms", optional_ms(result.heuristic_ms)}}},
      {"wall_ms", result.wall_ms},
      {"budget_exhausted", result.budget_exhausted},
      {"space",
       {{"size", result.space_size}, {"valid", result.space_valid}, {"pruned", result.pruned}}},
      {"created_unix", result.created_unix},
      {"candidates", candidates},
  };
  return document.dump(1) + "\n";
}

TunedEntry TunedCache::from_json(std::string_view text) {
  try {
    const json document = json::parse(text);
    if (!document.is_object()) throw Error("the file is not a JSON object");
    if (document.at("format").get<int>() != kFormat) {
      throw Error(fmt::format("format {} is not {}", document.at("format").dump(), kFormat));
    }
    TunedEntry entry;
    const json& key = document.at("key");
    entry.key.family = key.at("family").get<std::string>();
    entry.key.variant = key.at("variant").get<std::string>();
    entry.key.shape_bucket = key.at("shape_bucket").get<std::string>();
    entry.key.dtype = key.at("dtype").get<std::string>();
    entry.key.gpu = key.at("gpu").get<std::string>();
    entry.key.sm_count = key.at("sm_count").get<int>();
    entry.key.ladle_version = key.at("ladle_version").get<std::string>();

    TuneResult& result = entry.result;
    result.best = config_from(document.at("best").at("config"));
    result.best_ms = ms_from(document.at("best").at("ms"), "best.ms");
    if (result.best.empty()) throw Error("best.config is empty");
    if (!result.best_ms || *result.best_ms <= 0) throw Error("best.ms is not a positive time");
    result.heuristic = config_from(document.at("heuristic").at("config"));
    result.heuristic_ms = ms_from(document.at("heuristic").at("ms"), "heuristic.ms");
    result.wall_ms = document.at("wall_ms").get<double>();
    result.budget_exhausted = document.at("budget_exhausted").get<bool>();
    result.space_size = document.at("space").at("size").get<std::size_t>();
    result.space_valid = document.at("space").at("valid").get<std::size_t>();
    result.pruned = document.at("space").at("pruned").get<std::size_t>();
    result.created_unix = document.at("created_unix").get<std::int64_t>();
    for (const auto& c : document.at("candidates")) {
      CandidateRecord record;
      record.config = config_from(c.at("config"));
      record.ms = ms_from(c.at("ms"), "candidate ms");
      record.valid = c.at("valid").get<bool>();
      record.reason = c.at("reason").get<std::string>();
      record.prepare_ms = ms_from(c.at("prepare_ms"), "candidate prepare_ms");
      record.heuristic = c.at("heuristic").get<bool>();
      result.candidates.push_back(std::move(record));
    }
    result.source = TuneSource::cache;
    return entry;
  } catch (const json::exception& e) {
    throw Error(e.what());
  }
}

// ---- TunedCache ----

TunedCache::Settings TunedCache::Settings::from_env() {
  const auto compile = DiskCache::settings_from_env();
  if (compile.disabled || compile.dir.empty()) return memory_only();
  Settings settings = at(compile.dir / "tuned");
  settings.read_only = compile.read_only;
  return settings;
}

TunedCache& TunedCache::global() {
  static TunedCache cache(Settings::from_env());
  return cache;
}

TunedCache::TunedCache(Settings settings) : dir_(std::move(settings.dir)), read_only_(settings.read_only) {
  if (dir_.empty() || read_only_) return;
  std::error_code ec;
  if (!detail::is_writable_directory(dir_) && fs::is_directory(dir_, ec)) {
    read_only_ = true;
    log::warn(fmt::format("tuned-config cache: '{}' is not writable; its configs are used, and new ones are kept in "
                          "memory only for this process",
                          dir_.string()));
    return;
  }
  if (!detail::is_writable_directory(dir_)) {
    log::warn(fmt::format(
        "tuned-config cache: '{}' is not writable; tuned configs are kept in memory only for "
        "this process (set LADLE_CACHE_DIR to a writable directory)",
        dir_.string()));
    dir_.clear();
  }
}

fs::path TunedCache::path_for(const TunedKey& key) const {
  return dir_.empty() ? fs::path() : dir_ / (key.hash() + std::string(kSuffix));
}

std::optional<TuneResult> TunedCache::lookup(const TunedKey& key) {
  const std::string hash = key.hash();
  {
    std::lock_guard lock(mutex_);
    if (auto it = memory_.find(hash); it != memory_.end() && it->second.key == key) {
      return it->second.result;
    }
  }
  if (!disk_enabled()) return std::nullopt;
  const fs::path path = path_for(key);
  auto text = detail::read_file(path);
  if (!text) return std::nullopt;
  TunedEntry entry;
  std::string problem;
  try {
    entry = from_json(*text);
    if (!(entry.key == key)) {
      problem = fmt::format("holds [{}], not [{}]", entry.key.to_string(), key.to_string());
    }
  } catch (const Error& e) {
    problem = fmt::format("is damaged ({})", e.what());
  }
  if (!problem.empty()) {
    std::lock_guard lock(mutex_);
    if (reported_.insert(hash).second) {  // once, not on every lookup until the next store
      log::warn(fmt::format("tuned-config cache: '{}' {}; treated as a miss, it will be replaced",
                            path.string(), problem));
    }
    return std::nullopt;
  }
  entry.path = path;
  std::lock_guard lock(mutex_);
  memory_.insert_or_assign(hash, entry);
  return entry.result;
}

fs::path TunedCache::store(const TunedKey& key, const TuneResult& result) {
  TunedEntry entry{key, result, {}};
  if (entry.result.created_unix == 0) entry.result.created_unix = now_unix();
  entry.result.source = TuneSource::cache;
  if (disk_enabled() && !read_only_) {
    const fs::path path = path_for(key);
    try {
      std::error_code ec;
      fs::create_directories(dir_, ec);  // `ladle-cache clear` may have removed it
      detail::write_file_atomically(path, to_json(key, entry.result));
      entry.path = path;
    } catch (const std::exception& e) {
      log::warn(
          fmt::format("tuned-config cache: could not store {}: {}", key.to_string(), e.what()));
    }
  }
  std::lock_guard lock(mutex_);
  memory_.insert_or_assign(key.hash(), entry);
  reported_.erase(key.hash());
  return entry.path;
}

std::vector<TunedFileInfo> TunedCache::list() const {
  std::vector<TunedFileInfo> out;
  if (!disk_enabled()) {
    std::lock_guard lock(mutex_);
    for (const auto& [hash, entry] : memory_) out.push_back({entry.path, entry, ""});
  } else {
    std::error_code ec;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      if (!is_entry_file(it->path())) continue;
      TunedFileInfo info;
      info.path = it->path();
      auto text = detail::read_file(info.path);
      try {
        if (!text) throw Error("unreadable");
        TunedEntry entry = from_json(*text);
        entry.path = info.path;
        if (entry.key.hash() + std::string(kSuffix) != info.path.filename().string()) {
          info.problem = fmt::format("holds [{}], whose file name differs", entry.key.to_string());
        }
        info.entry = std::move(entry);
      } catch (const Error& e) {
        info.problem = e.what();
      }
      out.push_back(std::move(info));
    }
  }
  auto order = [](const TunedFileInfo& info) {
    return info.entry ? std::make_pair(info.entry->key.family, info.entry->key.to_string())
                      : std::make_pair(std::string("~"), info.path.string());
  };
  std::sort(out.begin(), out.end(),
            [&](const auto& a, const auto& b) { return order(a) < order(b); });
  return out;
}

std::size_t TunedCache::clear() {
  if (read_only_)
    throw InvalidArgument(fmt::format("the tuned-config cache '{}' is read only (LADLE_CACHE_READONLY=1 or not "
                                      "writable); nothing was removed",
                                      dir_.string()));
  std::size_t removed = 0;
  {
    std::lock_guard lock(mutex_);
    if (!disk_enabled()) removed = memory_.size();
    memory_.clear();
  }
  if (!disk_enabled()) return removed;
  std::vector<fs::path> doomed;
  std::error_code ec;
  // Only what ladle made: entry files and its temporaries.
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_entry_file(it->path())) {
      ++removed;
      doomed.push_back(it->path());
    } else if (it->path().filename().string().starts_with(".tmp-")) {
      doomed.push_back(it->path());
    }
  }
  for (const auto& path : doomed) fs::remove(path, ec);
  return removed;
}

}  // namespace ladle
