// The compile cache on disk (docs/caches.md). An entry is one directory named by its
// key, holding the source, the PTX, the cubin and a manifest with their checksums:
//   <dir>/<key>/{kernel.cu, kernel.ptx, kernel.cubin, manifest.json}
// An entry is built in a private temporary directory and renamed into place, so a reader
// sees either no entry or a whole one; a reader that finds a damaged entry (a checksum or
// size that disagrees with the manifest) treats it as a miss, and the next store replaces it.
// A read-only cache (LADLE_CACHE_READONLY=1, or a directory this process cannot write) serves
// its entries and keeps what it compiles in memory: an application ships a cache built ahead
// of time (`ladle-cache prebuild`) and loads it where it cannot, or must not, be written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler.h"

namespace ladle {

struct CacheEntryInfo {
  std::string key;
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  std::string arch;
  std::string kernels;  // comma-separated kernel names
  std::int64_t last_used_unix = 0;
  bool valid = true;
};

class DiskCache {
 public:
  struct Settings {
    std::filesystem::path dir;  // empty: no disk (memory only)
    std::uint64_t max_bytes = std::uint64_t{2} << 30;  // LRU bound on the disk
    bool disabled = false;      // neither memory nor disk
    bool read_only = false;     // entries are read, never written, touched or removed

    static Settings at(std::filesystem::path dir) {
      Settings s;
      s.dir = std::move(dir);
      return s;
    }
    static Settings off() {
      Settings s;
      s.disabled = true;
      return s;
    }
  };

  // Settings from the environment: LADLE_DISABLE_CACHE=1, LADLE_CACHE_DIR, else
  // $XDG_CACHE_HOME/ladle, else ~/.cache/ladle; LADLE_CACHE_MAX_BYTES (suffix K/M/G ok);
  // LADLE_CACHE_READONLY=1.
  static Settings settings_from_env();
  // The process-wide cache built from settings_from_env().
  static DiskCache& global();

  explicit DiskCache(Settings settings);

  // Key over everything that changes the compiled bytes.
  static std::string make_key(const std::string& source, const std::vector<std::string>& options,
                              const std::string& arch, const std::string& nvrtc_version);

  std::optional<CompiledProgram> lookup(const std::string& key);
  // Writes the entry (atomically) and evicts least recently used entries over the bound.
  // Returns the entry path ("" if memory-only).
  std::string store(const CompiledProgram& program);

  // Whether entries are written to the disk (not for a read-only or memory-only cache).
  bool disk_enabled() const { return !memory_only_ && !read_only_ && !settings_.disabled; }
  // Whether entries are read from the disk (a read-only cache's too).
  bool disk_readable() const { return !memory_only_ && !settings_.disabled; }
  bool read_only() const { return read_only_; }
  bool enabled() const { return !settings_.disabled; }
  const std::filesystem::path& dir() const { return settings_.dir; }
  std::uint64_t max_bytes() const { return settings_.max_bytes; }

  std::vector<CacheEntryInfo> list() const;  // sorted by last use, newest first
  std::uint64_t disk_bytes() const;
  std::size_t clear();                        // removes every entry; returns how many
  void evict_to(std::uint64_t max_bytes);
  // Small facts worth remembering across processes (e.g. which NVRTC version a library file
  // is, so a warm start need not open NVRTC). Written atomically; nullopt when absent.
  std::optional<std::string> read_note(const std::string& name) const;
  void write_note(const std::string& name, const std::string& text) const;

  // Path where a failing source is written for the user (inside the cache dir, or /tmp).
  std::filesystem::path failed_source_path(const std::string& key) const;

 private:
  std::optional<CompiledProgram> read_entry(const std::filesystem::path& entry) const;
  std::vector<CacheEntryInfo> scan() const;  // sizes and times only, no checksums
  void touch(const std::filesystem::path& entry) const;

  Settings settings_;
  bool memory_only_ = false;
  bool read_only_ = false;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, CompiledProgram> memory_;
};

}  // namespace ladle
