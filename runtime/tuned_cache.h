// The tuned-config cache: what the autotuner found, kept beside the compile cache so that a
// config is tuned once per (kernel family, variant, shape bucket, dtype, GPU, ladle version)
// and reused by every later process. One small JSON file per key:
//   <compile cache dir>/tuned/<key hash>.json
// holding the key's fields (so that a hash collision or a hand-copied file is caught), the
// best config with its time, the heuristic's, and the candidate table. The rules are the
// compile cache's (docs/caches.md): files are written to a temporary and renamed into
// place; a file that does not parse, lacks a field or holds another key is reported once,
// treated as a miss and replaced by the next store; an unwritable directory degrades to
// memory only with one warning.
//
// LADLE_DISABLE_CACHE=1 turns the disk off but keeps the memory: each process then tunes a
// key once (on its first call) and reuses the result, instead of spending the tuning budget
// on every call, which no user wants; use LADLE_AUTOTUNE=heuristic to skip tuning entirely.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tune_result.h"

namespace ladle {

struct DeviceLimits;

// The smallest power of two at least n (1 -> 1, 1000 -> 1024, 4096 -> 4096); 0 for n <= 0.
// Shapes within one bucket share a tuned config.
std::int64_t bucket_pow2(std::int64_t n);
// "B8-T4096-H16-K128" from {{"B", 8}, {"T", 4096}, {"H", 16}, {"K", 128}}: the family
// decides which sizes it buckets (bucket_pow2 the sequence length, keep head dims exact).
std::string shape_bucket(std::initializer_list<std::pair<std::string_view, std::int64_t>> sizes);

struct TunedKey {
  std::string family;         // "fused_recurrent", "chunked", "attention", ...
  std::string variant;        // the variant's hash (what the expression computes)
  std::string shape_bucket;   // from shape_bucket()
  std::string dtype;          // "bf16"
  std::string gpu;            // the device name
  int sm_count = 0;           // same name, different SM count (MIG, cut-down parts): another key
  std::string ladle_version;  // empty: filled with version() by make()

  // A key for this device: gpu and sm_count from the limits, ladle_version from version().
  static TunedKey make(std::string family, std::string variant, std::string shape_bucket,
                       std::string dtype, const DeviceLimits& device);
  std::string hash() const;  // 32 hex digits over every field: the file name
  std::string to_string()
      const;  // "chunked 1a2b3c4d B8-T4096-H16-K128 bf16 on NVIDIA H100 (132 SMs)"
  friend bool operator==(const TunedKey&, const TunedKey&) = default;
};

struct TunedEntry {
  TunedKey key;
  TuneResult result;
  std::filesystem::path path;  // the file ("" for a memory-only entry)
};

// One file found by list(): readable ones carry their entry, damaged ones their reason.
struct TunedFileInfo {
  std::filesystem::path path;
  std::optional<TunedEntry> entry;
  std::string problem;  // why the file is not a usable entry ("" when it is)
};

class TunedCache {
 public:
  struct Settings {
    std::filesystem::path dir;  // the tuned/ directory itself; empty: memory only
    bool read_only = false;     // files are read, never written (new results stay in memory)
    static Settings at(std::filesystem::path dir) { return {std::move(dir)}; }
    static Settings memory_only() { return {}; }
    // <compile cache dir>/tuned from DiskCache::settings_from_env(); memory only (silently)
    // under LADLE_DISABLE_CACHE; read only under LADLE_CACHE_READONLY=1.
    static Settings from_env();
  };

  static TunedCache& global();  // built from Settings::from_env(); thread-safe
  explicit TunedCache(Settings settings);

  // The stored result for key (source set to TuneSource::cache), or nullopt. Thread-safe.
  std::optional<TuneResult> lookup(const TunedKey& key);
  // Keeps result in memory and (atomically) on disk; returns the file ("" when memory only).
  std::filesystem::path store(const TunedKey& key, const TuneResult& result);

  bool disk_enabled() const { return !dir_.empty(); }  // read from the disk (and written unless read only)
  bool read_only() const { return read_only_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path_for(const TunedKey& key) const;  // where key's file is (or would be)

  // Every file on disk (or, memory only, every entry in memory), sorted by family, then key.
  std::vector<TunedFileInfo> list() const;
  std::size_t clear();  // removes every entry, on disk and in memory; returns how many files

  // The JSON text of an entry, and back (throws Error saying what is wrong). Public for tools
  // and tests; lookup() and store() are what code should use.
  static std::string to_json(const TunedKey& key, const TuneResult& result);
  static TunedEntry from_json(std::string_view text);

 private:
  std::filesystem::path dir_;
  bool read_only_ = false;
  mutable std::mutex mutex_;
  std::map<std::string, TunedEntry> memory_;  // by key hash
  std::set<std::string> reported_;            // hashes whose damaged file was reported
};

}  // namespace ladle
