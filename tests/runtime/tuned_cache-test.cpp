#include <ladle/runtime/log.h>
#include <ladle/runtime/tuned_cache.h>
#include <ladle/runtime/version.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "capture_stderr.h"
#include "scoped_env.h"
#include "temp_dir.h"
#include "tune_fixtures.h"

using namespace ladle;
namespace fs = std::filesystem;
using test::ScopedEnv;
using test::small_device;
using test::tile;

namespace {

TunedKey key() {
  return TunedKey::make("chunked", "3f2a9c", "B8-T4096-H16-K128-V128", "bf16", small_device());
}

TuneResult result(double best_ms = 0.41) {
  TuneResult r;
  r.best = tile(64, 32, 4, 2);
  r.best_ms = best_ms;
  r.heuristic = tile(32, 32, 2, 1);
  r.heuristic_ms = 0.52;
  r.wall_ms = 8123.5;
  r.space_size = 81;
  r.space_valid = 16;
  r.pruned = 2;
  r.created_unix = 1700000000;
  r.candidates.push_back({tile(32, 32, 2, 1), 0.52, true, "", 120.5, true});
  r.candidates.push_back({tile(64, 32, 4, 2), 0.41, true, "", 98.0, false});
  r.candidates.push_back(
      {tile(128, 32, 4, 1), std::nullopt, false, "prepare: NVRTC failed", 33.0, false});
  r.candidates.push_back(
      {tile(128, 32, 2, 1), std::nullopt, false, "not measured: budget", std::nullopt, false});
  return r;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path());
  return out;
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("sizes bucket to the next power of two") {
  REQUIRE(bucket_pow2(1) == 1);
  REQUIRE(bucket_pow2(3) == 4);
  REQUIRE(bucket_pow2(1000) == 1024);
  REQUIRE(bucket_pow2(4096) == 4096);
  REQUIRE(bucket_pow2(4097) == 8192);
  REQUIRE(bucket_pow2(0) == 0);
  REQUIRE(bucket_pow2(-5) == 0);
  REQUIRE(shape_bucket({{"B", 8}, {"T", bucket_pow2(3000)}, {"H", 16}, {"K", 128}}) ==
          "B8-T4096-H16-K128");
}

TEST_CASE("a key is made for a device and this ladle") {
  TunedKey k = key();
  REQUIRE(k.gpu == "Test GPU");
  REQUIRE(k.sm_count == 16);
  REQUIRE(k.ladle_version == version());
  REQUIRE(k.hash().size() == 32);
  REQUIRE(k.hash() == key().hash());  // stable
  REQUIRE_THAT(k.to_string(), Catch::Contains("chunked") &&
                                  Catch::Contains("B8-T4096-H16-K128-V128") &&
                                  Catch::Contains("bf16") && Catch::Contains("Test GPU (16 SMs)"));
}

TEST_CASE("a stored result survives into another cache instance, field for field") {
  test::TempDir dir;
  const fs::path tuned = dir.path() / "tuned";
  fs::path written;
  {
    TunedCache first(TunedCache::Settings::at(tuned));
    REQUIRE(first.disk_enabled());
    REQUIRE_FALSE(first.lookup(key()).has_value());
    written = first.store(key(), result());
  }
  REQUIRE(written == tuned / (key().hash() + ".json"));
  REQUIRE(fs::exists(written));
  REQUIRE(files_in(tuned) == std::vector<fs::path>{written});  // no temporaries left

  TunedCache second(TunedCache::Settings::at(tuned));  // a new process: nothing in memory
  auto hit = second.lookup(key());
  REQUIRE(hit.has_value());
  const TuneResult expected = result();
  REQUIRE(hit->source == TuneSource::cache);
  REQUIRE(hit->best == expected.best);
  REQUIRE(hit->best.to_string() == "BK=64 BV=32 warps=4 stages=2");  // order kept
  REQUIRE(hit->best_ms == expected.best_ms);
  REQUIRE(hit->heuristic == expected.heuristic);
  REQUIRE(hit->heuristic_ms == expected.heuristic_ms);
  REQUIRE(hit->wall_ms == expected.wall_ms);
  REQUIRE(hit->space_size == 81);
  REQUIRE(hit->space_valid == 16);
  REQUIRE(hit->pruned == 2);
  REQUIRE(hit->created_unix == 1700000000);
  REQUIRE(hit->candidates.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(hit->candidates[i].config == expected.candidates[i].config);
    CHECK(hit->candidates[i].ms == expected.candidates[i].ms);
    CHECK(hit->candidates[i].valid == expected.candidates[i].valid);
    CHECK(hit->candidates[i].reason == expected.candidates[i].reason);
    CHECK(hit->candidates[i].prepare_ms == expected.candidates[i].prepare_ms);
    CHECK(hit->candidates[i].heuristic == expected.candidates[i].heuristic);
  }
}

TEST_CASE("the file is readable JSON holding every key field") {
  test::TempDir dir;
  TunedCache cache(TunedCache::Settings::at(dir.path()));
  const fs::path path = cache.store(key(), result());
  const auto document = nlohmann::json::parse(read(path));
  REQUIRE(document.at("format") == 1);
  REQUIRE(document.at("key").at("family") == "chunked");
  REQUIRE(document.at("key").at("variant") == "3f2a9c");
  REQUIRE(document.at("key").at("shape_bucket") == "B8-T4096-H16-K128-V128");
  REQUIRE(document.at("key").at("dtype") == "bf16");
  REQUIRE(document.at("key").at("gpu") == "Test GPU");
  REQUIRE(document.at("key").at("sm_count") == 16);
  REQUIRE(document.at("key").at("ladle_version") == version());
  REQUIRE(document.at("best").at("config").dump() == R"({"BK":64,"BV":32,"stages":2,"warps":4})");
  REQUIRE(document.at("best").at("ms") == 0.41);
  REQUIRE(document.at("candidates").size() == 4);
  REQUIRE(document.at("candidates")[2].at("ms").is_null());
}

TEST_CASE("every key field separates entries") {
  test::TempDir dir;
  TunedCache cache(TunedCache::Settings::at(dir.path()));
  cache.store(key(), result(0.41));
  std::vector<std::pair<const char*, TunedKey>> others;
  auto changed = [&](const char* what, auto change) {
    TunedKey k = key();
    change(k);
    others.emplace_back(what, k);
  };
  changed("family", [](TunedKey& k) { k.family = "fused_recurrent"; });
  changed("variant", [](TunedKey& k) { k.variant = "3f2a9d"; });
  changed("shape bucket", [](TunedKey& k) { k.shape_bucket = "B8-T8192-H16-K128-V128"; });
  changed("dtype", [](TunedKey& k) { k.dtype = "fp16"; });
  changed("gpu", [](TunedKey& k) { k.gpu = "NVIDIA H200"; });
  changed("sm count", [](TunedKey& k) { k.sm_count = 8; });
  changed("ladle version", [](TunedKey& k) { k.ladle_version = "9.9.9"; });

  std::set<fs::path> paths{cache.path_for(key())};
  for (const auto& [what, k] : others) {
    INFO("changed: " << what);
    CHECK(k.hash() != key().hash());
    CHECK_FALSE(cache.lookup(k).has_value());
    CHECK(paths.insert(cache.path_for(k)).second);
  }
  double ms = 1;
  for (const auto& [what, k] : others) cache.store(k, result(ms += 1));
  REQUIRE(files_in(dir.path()).size() == 8);

  TunedCache reopened(TunedCache::Settings::at(dir.path()));
  REQUIRE(*reopened.lookup(key())->best_ms == 0.41);
  ms = 1;
  for (const auto& [what, k] : others) {
    INFO("changed: " << what);
    CHECK(*reopened.lookup(k)->best_ms == (ms += 1));
  }
}

TEST_CASE("a damaged file is a miss, reported, and replaced by the next store") {
  test::TempDir dir;
  const fs::path path = [&] {
    TunedCache cache(TunedCache::Settings::at(dir.path()));
    return cache.store(key(), result());
  }();
  const std::string good = read(path);

  SECTION("truncated") {
    write(path, good.substr(0, good.size() / 2));
  }
  SECTION("empty") {
    write(path, "");
  }
  SECTION("garbage") {
    write(path,
          "\x7f"
          "ELF not json at all");
  }
  SECTION("not an object") {
    write(path, "[1, 2, 3]");
  }
  SECTION("a field missing") {
    auto document = nlohmann::json::parse(good);
    document.erase("best");
    write(path, document.dump());
  }
  SECTION("a field of the wrong type") {
    auto document = nlohmann::json::parse(good);
    document["best"]["ms"] = "fast";
    write(path, document.dump());
  }
  SECTION("a time that is not a time") {
    auto document = nlohmann::json::parse(good);
    document["best"]["ms"] = -1;
    write(path, document.dump());
  }
  SECTION("an empty best config") {
    auto document = nlohmann::json::parse(good);
    document["best"]["config"] = nlohmann::json::object();
    write(path, document.dump());
  }
  SECTION("another format") {
    auto document = nlohmann::json::parse(good);
    document["format"] = 2;
    write(path, document.dump());
  }
  SECTION("valid JSON for another key (a collision, or a copied file)") {
    auto document = nlohmann::json::parse(good);
    document["key"]["dtype"] = "fp16";
    write(path, document.dump());
  }

  TunedCache cache(TunedCache::Settings::at(dir.path()));
  REQUIRE_FALSE(cache.lookup(key()).has_value());
  auto listed = cache.list();
  REQUIRE(listed.size() == 1);
  REQUIRE_FALSE(listed[0].problem.empty());

  cache.store(key(), result(0.33));
  TunedCache reopened(TunedCache::Settings::at(dir.path()));
  auto hit = reopened.lookup(key());
  REQUIRE(hit.has_value());
  REQUIRE(*hit->best_ms == 0.33);
  REQUIRE(reopened.list()[0].problem.empty());
}

TEST_CASE("an unwritable directory degrades to memory only") {
  test::TempDir dir;
  fs::path location;
  SECTION("a path below a regular file (cannot be created, even by root)") {
    std::ofstream(dir.path() / "plain-file") << "x";
    location = dir.path() / "plain-file" / "tuned";
  }
  if (::geteuid() != 0) {
    SECTION("a read-only directory") {
      location = dir.path() / "readonly";
      fs::create_directories(location);
      fs::permissions(location, fs::perms::owner_read | fs::perms::owner_exec);
    }
  }
  TunedCache cache(TunedCache::Settings::at(location));
  REQUIRE_FALSE(cache.disk_enabled());
  REQUIRE(cache.store(key(), result()).empty());
  auto hit = cache.lookup(key());  // from memory
  REQUIRE(hit.has_value());
  REQUIRE(hit->best == result().best);
  REQUIRE(cache.list().size() == 1);
  REQUIRE(cache.clear() == 1);
  REQUIRE_FALSE(cache.lookup(key()).has_value());
}

TEST_CASE("memory-only caches do not share entries") {
  TunedCache a(TunedCache::Settings::memory_only());
  TunedCache b(TunedCache::Settings::memory_only());
  a.store(key(), result());
  REQUIRE(a.lookup(key()).has_value());
  REQUIRE_FALSE(b.lookup(key()).has_value());
}

TEST_CASE("the tuned cache lives in tuned/ beside the compile cache") {
  ScopedEnv off("LADLE_DISABLE_CACHE", nullptr);
  {
    ScopedEnv dir("LADLE_CACHE_DIR", "/tmp/explicit");
    REQUIRE(TunedCache::Settings::from_env().dir == "/tmp/explicit/tuned");
  }
  {
    ScopedEnv dir("LADLE_CACHE_DIR", nullptr), xdg("XDG_CACHE_HOME", "/tmp/xdg");
    REQUIRE(TunedCache::Settings::from_env().dir == "/tmp/xdg/ladle/tuned");
  }
  {
    ScopedEnv disabled("LADLE_DISABLE_CACHE", "1"), dir("LADLE_CACHE_DIR", "/tmp/explicit");
    REQUIRE(TunedCache::Settings::from_env().dir.empty());  // memory only: tune once per process
  }
}

TEST_CASE("list shows every entry sorted by family; clear removes only ladle's files") {
  test::TempDir dir;
  TunedCache cache(TunedCache::Settings::at(dir.path()));
  TunedKey softmax = key(), recurrent = key();
  softmax.family = "softmax";
  recurrent.family = "fused_recurrent";
  cache.store(softmax, result());
  cache.store(key(), result());
  cache.store(recurrent, result());
  write(dir.path() / "notes.txt", "mine");
  write(dir.path() / ".tmp-abandoned.json-1-2-3", "{");

  auto listed = cache.list();
  REQUIRE(listed.size() == 3);
  REQUIRE(listed[0].entry->key.family == "chunked");
  REQUIRE(listed[1].entry->key.family == "fused_recurrent");
  REQUIRE(listed[2].entry->key.family == "softmax");
  for (const auto& info : listed) REQUIRE(info.problem.empty());

  REQUIRE(cache.clear() == 3);
  REQUIRE(cache.list().empty());
  REQUIRE_FALSE(cache.lookup(key()).has_value());  // memory cleared too
  REQUIRE(files_in(dir.path()) == std::vector<fs::path>{dir.path() / "notes.txt"});
  // The next store recreates what clear removed.
  REQUIRE_FALSE(cache.store(key(), result()).empty());
}

TEST_CASE("a file whose name is not its key's hash is listed as a problem") {
  test::TempDir dir;
  TunedCache cache(TunedCache::Settings::at(dir.path()));
  const fs::path path = cache.store(key(), result());
  fs::rename(path, dir.path() / (std::string(32, 'a') + ".json"));
  auto listed = cache.list();
  REQUIRE(listed.size() == 1);
  REQUIRE(listed[0].entry.has_value());
  REQUIRE_THAT(listed[0].problem, Catch::Contains("file name differs"));
}

TEST_CASE("stores racing on one key from many threads leave one whole file") {
  test::TempDir dir;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      TunedCache cache(TunedCache::Settings::at(dir.path()));  // as if separate processes
      for (int i = 0; i < 20; ++i) cache.store(key(), result(1 + t));
    });
  }
  for (auto& thread : threads) thread.join();
  REQUIRE(files_in(dir.path()).size() == 1);
  TunedCache reader(TunedCache::Settings::at(dir.path()));
  auto hit = reader.lookup(key());
  REQUIRE(hit.has_value());
  REQUIRE(*hit->best_ms >= 1);
  REQUIRE(*hit->best_ms <= 8);
}

TEST_CASE("a damaged file is reported once, not on every lookup") {
  test::TempDir dir;
  TunedCache cache(TunedCache::Settings::at(dir.path()));
  write(cache.path_for(key()), "{ torn");
  test::CaptureStderr captured;
  REQUIRE_FALSE(cache.lookup(key()).has_value());
  REQUIRE_FALSE(cache.lookup(key()).has_value());
  const std::string text = captured.text();
  if (!log::enabled(log::Level::warn)) {  // LADLE_LOG=error: nothing at all
    REQUIRE(text.empty());
    return;
  }
  REQUIRE_THAT(text, Catch::Contains("is damaged") && Catch::Contains(key().hash()));
  REQUIRE(text.find("is damaged") == text.rfind("is damaged"));
}
