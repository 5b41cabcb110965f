// A pretend kernel family for the autotuner's tests: a tile space with the usual rules
// (divisibility, threads, shared memory), a device small enough that the rules bite, and a
// Candidate whose "GPU" is a formula, with failures, a fake clock and a record of how it
// was called. No GPU and no compiler needed.
#pragma once

#include <ladle/runtime/autotune.h>
#include <ladle/runtime/error.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ladle::test {

// Real GPUs' limits, written by hand, for enumerating a family's space without a device.
inline DeviceLimits h100() {
  DeviceLimits d;
  d.name = "NVIDIA H100 80GB HBM3";
  d.arch = "sm_90a";
  d.sm_count = 132;
  d.max_shared_per_block = 232448;  // 227 KiB opt-in
  d.max_shared_per_sm = 233472;
  d.max_registers_per_block = 65536;
  d.max_threads_per_block = 1024;
  return d;
}

inline DeviceLimits a100() {
  DeviceLimits d;
  d.name = "NVIDIA A100-SXM4-80GB";
  d.arch = "sm_80";
  d.sm_count = 108;
  d.max_shared_per_block = 166912;  // 163 KiB opt-in
  d.max_shared_per_sm = 167936;
  d.max_registers_per_block = 65536;
  d.max_threads_per_block = 1024;
  return d;
}

// 48 KiB of shared memory and 128 threads per block: warps=8 and the big tiles do not fit.
inline DeviceLimits small_device() {
  DeviceLimits d;
  d.name = "Test GPU";
  d.arch = "sm_90a";
  d.sm_count = 16;
  d.max_shared_per_block = 48 * 1024;
  d.max_shared_per_sm = 96 * 1024;
  d.max_registers_per_block = 65536;
  d.max_threads_per_block = 128;
  return d;
}

// Shared memory of a tile config: `stages` buffers of a 64-row slice of K and V in bf16.
inline long long tile_shared_bytes(const Config& c) {
  return static_cast<long long>(c["stages"]) * (c["BK"] + c["BV"]) * 64 * 2;
}

// 3 x 3 x 3 x 3 = 81 points. With K=128, V=96 on small_device(): BV must be 32 (divides 96),
// warps 2 or 4 (128 threads), and BK=128 with 3 stages needs 60 KiB > 48 KiB: 8 x 2 = 16 valid.
inline SearchSpace tile_space(int K, int V) {
  SearchSpace space;
  space.param("BK", {32, 64, 128})
      .param("BV", {32, 64, 128})
      .param("warps", {2, 4, 8})
      .param("stages", {1, 2, 3})
      .rule([K, V](const Config& c, const DeviceLimits& d) {
        return rule::first(
            {rule::divides("BK", c["BK"], "K", K), rule::divides("BV", c["BV"], "V", V),
             rule::threads(32LL * c["warps"], d), rule::shared_memory(tile_shared_bytes(c), d)});
      });
  return space;
}

inline Config tile(int bk, int bv, int warps, int stages) {
  return Config{{"BK", bk}, {"BV", bv}, {"warps", warps}, {"stages", stages}};
}

// Time in milliseconds; the tuner's budget and progress read it (only on the tuning thread).
struct FakeClock {
  double now = 0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

class FakeCandidate : public Candidate {
 public:
  // The "GPU": a time per config. Default: bigger tiles and more stages are faster.
  std::function<double(const Config&)> time_of = [](const Config& c) {
    return 1.0 + 8.0 / c["BK"] + 8.0 / c["BV"] + 0.1 / c["stages"] + 0.01 * c["warps"];
  };
  std::set<Config> fail_prepare, fail_check, fail_run;
  std::chrono::milliseconds prepare_sleep{0};
  FakeClock* clock = nullptr;
  double clock_ms_per_time = 0;  // advanced per time_ms call, as if measuring took time

  // What the tuner did.
  std::atomic<int> prepares{0};
  std::atomic<int> max_in_flight{0};
  std::mutex mutex;
  std::vector<Config> timed;
  std::set<std::thread::id> timing_threads;
  std::optional<Config> reference;

  void prepare(const Config& config) override {
    const int now = ++in_flight_;
    int seen = max_in_flight.load();
    while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
    }
    ++prepares;
    if (prepare_sleep.count() > 0) std::this_thread::sleep_for(prepare_sleep);
    --in_flight_;
    if (fail_prepare.count(config)) {
      throw CompileError("NVRTC could not compile the kernel (" + config.to_string() + ")",
                         "error: too many resources\nline 2", "/tmp/failed.cu");
    }
    std::lock_guard lock(mutex);
    prepared_.insert(config);
  }

  void record_reference(const Config& heuristic) override {
    require_prepared(heuristic);
    reference = heuristic;
  }

  Check matches_reference(const Config& config) override {
    require_prepared(config);
    if (!reference) throw std::logic_error("matches_reference before record_reference");
    if (fail_check.count(config)) return Check::fail("relative L2 error 0.5 > 1e-05");
    return Check::pass();
  }

  double time_ms(const Config& config) override {
    require_prepared(config);
    if (fail_run.count(config))
      throw CudaError("cuLaunchKernel: too many resources requested", 701);
    if (clock) clock->now += clock_ms_per_time;
    std::lock_guard lock(mutex);
    timed.push_back(config);
    timing_threads.insert(std::this_thread::get_id());
    return time_of(config);
  }

 private:
  void require_prepared(const Config& config) {
    std::lock_guard lock(mutex);
    if (!prepared_.count(config))
      throw std::logic_error("used before prepare: " + config.to_string());
  }

  std::atomic<int> in_flight_{0};
  std::set<Config> prepared_;
};

// A forced tuning of a family's real space with a FakeCandidate on a fake clock, the result
// kept in memory: what the families' tests run to see the tuner reject a wrong config.
struct FakeTuning {
  FakeClock clock;
  TunedCache cache{TunedCache::Settings::memory_only()};
  TuneOptions options;
  explicit FakeTuning(FakeCandidate& fake) {
    fake.clock = &clock;
    fake.clock_ms_per_time = 1;
    options.policy = Policy::force;
    options.cache = &cache;
    options.budget_ms = 60'000;
    options.clock_ms = clock.fn();
    options.on_progress = [](const TuneProgress&) {};
  }

  // The fastest config failed its output check, so the second fastest won, every valid config
  // was prepared and measured, and the winner is stored under `key`.
  void check_second_wins(const TuneResult& result, const FakeCandidate& fake, const TunedKey& key, const Config& fastest,
                         const Config& second, std::size_t valid) {
    REQUIRE(result.source == TuneSource::tuned);
    REQUIRE(result.best == second);
    REQUIRE(result.space_valid == valid);
    REQUIRE(result.candidates.size() == valid);  // fewer than max_candidates: nothing pruned
    REQUIRE(fake.prepares == static_cast<int>(valid));
    const auto rejected = std::find_if(result.candidates.begin(), result.candidates.end(),
                                       [&](const CandidateRecord& r) { return r.config == fastest; });
    REQUIRE(rejected != result.candidates.end());
    REQUIRE_FALSE(rejected->valid);
    REQUIRE_THAT(rejected->reason, Catch::Contains("relative L2 error"));
    REQUIRE(cache.lookup(key)->best == second);
  }
};

}  // namespace ladle::test

// Failed comparisons print configs as "BK=64 BV=32 ...".
namespace Catch {
template <>
struct StringMaker<ladle::Config> {
  static std::string convert(const ladle::Config& config) { return config.to_string(); }
};
}  // namespace Catch
