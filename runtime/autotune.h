// The autotuner (docs/caches.md: the autotuner), independent of any kernel. A kernel family gives it
// a SearchSpace (tune_space.h), its heuristic config and a Candidate: how to prepare a
// config (generate and compile), time it and check its output. The tuner prepares
// candidates on several host threads while it measures the ready ones on the calling
// thread, rejects any whose output differs from the heuristic config's, stops at a time
// budget keeping the best so far, and keeps the result in the tuned-config cache
// (tuned_cache.h) so that the next process does not tune again.
//
// Policy, from LADLE_AUTOTUNE or per call:
//   heuristic  never tune: the heuristic config, nothing measured, the cache not read;
//   cached     (the default) the stored result when there is one, else tune once and store;
//   force      tune now and replace the stored result.
// Progress goes to the log at info level (LADLE_LOG=warn silences it).
#pragma once

#include <ladle/tensor/dtype.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tune_result.h"
#include "tune_space.h"
#include "tuned_cache.h"

namespace ladle {

enum class Policy { heuristic, cached, force };

const char* to_string(Policy policy);
// "heuristic", "cached" or "force"; anything else throws InvalidArgument naming `source`
// (the variable or option the text came from) and the accepted values.
Policy parse_policy(std::string_view text, std::string_view source = "LADLE_AUTOTUNE");
// LADLE_AUTOTUNE, read on every call; cached when it is unset or empty.
Policy policy_from_env();
// LADLE_AUTOTUNE_BUDGET (seconds, e.g. "30" or "2.5"), else 15 s.
double budget_ms_from_env();

// Whether a config's output agrees with the heuristic config's.
struct Check {
  bool ok = true;
  std::string reason;  // when not ok: what differed ("relative L2 error 3.1e-2 > 1e-2")
  static Check pass() { return {}; }
  static Check fail(std::string reason) { return {false, std::move(reason)}; }
};

// A candidate's output against the reference's: passes when the relative L2 distance is
// within tolerance ("relative L2 error 3.1e-02 > 1e-02" otherwise; NaN never passes).
Check compare_outputs(const std::vector<float>& out, const std::vector<float>& reference, double tolerance);
// The same over `count` raw elements of `type` (f32, f16 or bf16) as a device copied them, split
// over threads: no float copy of a large output (a B8 T4096 H16 V128 one, 67M bf16 values, took
// ~300 ms per candidate as float vectors on one core, most of a tuning's time).
Check compare_outputs(const void* out, const void* reference, std::size_t count, DType type, double tolerance);

// What a kernel family implements so that the tuner can try its configs. Any method may
// throw (a compile error, a launch failure): the config is then recorded as invalid with
// the exception's message, and tuning goes on; only the heuristic config must succeed.
class Candidate {
 public:
  virtual ~Candidate() = default;
  // Makes config ready to run: generate the source, compile it (ladle::compile is
  // thread-safe and goes through the compile cache). Called on several threads at once,
  // for different configs, while the tuner's thread calls the methods below for configs
  // already prepared, so it must be thread-safe (PerConfig below holds the results).
  // Keep it to host work, compiling for DeviceLimits::arch (the worker threads have no
  // device context): load modules lazily in the methods below, which the tuner calls on its
  // own thread, where the device context is current.
  virtual void prepare(const Config& config) = 0;
  // Runs the heuristic config once and keeps its output as the reference. Called once,
  // before any matches_reference() or time_ms().
  virtual void record_reference(const Config& heuristic) = 0;
  // Runs config and compares its output with the reference, within the family's tolerance.
  virtual Check matches_reference(const Config& config) = 0;
  // The median time of one launch in milliseconds, after warm-up, over several repeats,
  // with inputs rotated so that the L2 cache does not hold the last run's data
  // (time_launches() in event_timer.h does this with CUDA events).
  virtual double time_ms(const Config& config) = 0;
};

// Thread-safe per-config storage for what prepare() makes (a compiled program, a module).
template <class T>
class PerConfig {
 public:
  void put(const Config& config, T value) {
    std::lock_guard lock(mutex_);
    values_.insert_or_assign(config, std::move(value));
  }
  // The value stored for config; throws std::out_of_range when prepare() did not store one.
  T& at(const Config& config) {
    std::lock_guard lock(mutex_);
    return values_.at(config);
  }
  bool contains(const Config& config) const {
    std::lock_guard lock(mutex_);
    return values_.count(config) != 0;
  }

 private:
  mutable std::mutex mutex_;
  std::map<Config, T> values_;  // std::map: references stay valid as others are added
};

struct TuneProgress {
  const TunedKey* key = nullptr;
  std::size_t done = 0;                   // candidates measured or rejected
  std::size_t total = 0;                  // candidates planned
  const CandidateRecord* best = nullptr;  // best so far (null before the first valid one)
  double elapsed_ms = 0;
  bool finished = false;  // the last report of this tuning
};
// "tuning chunked B8-T4096-H16-K128 bf16: 12/40 candidates, best 0.4120 ms (BK=64 BV=32)"
std::string format_progress(const TuneProgress& progress);

struct TuneOptions {
  std::optional<Policy> policy;     // per-call override of LADLE_AUTOTUNE
  std::optional<double> budget_ms;  // default: LADLE_AUTOTUNE_BUDGET, else 15 s
  // With a cost model, measure at most this many configs besides the heuristic.
  std::size_t max_candidates = 64;
  unsigned prepare_threads = 0;  // 0: the hardware's threads, at most 8
  TunedCache* cache = nullptr;   // null: TunedCache::global()
  // A monotonic clock in milliseconds, for the budget and the progress rate (tests inject one).
  std::function<double()> clock_ms;
  // Called at most once per progress_interval_ms, and once at the end. Default: log::info.
  std::function<void(const TuneProgress&)> on_progress;
  double progress_interval_ms = 1000;
};

// Builds a family's Candidate only when a tuning really runs: a cache hit or policy
// heuristic then costs no input buffers, no reference run.
using CandidateFactory = std::function<std::unique_ptr<Candidate>()>;

class Tuner {
 public:
  // The heuristic must be valid on device (else InvalidArgument).
  Tuner(SearchSpace space, DeviceLimits device, Config heuristic);

  // Applies the policy (options.policy, else LADLE_AUTOTUNE) for key.
  TuneResult tune(const TunedKey& key, Candidate& candidate, const TuneOptions& options = {}) const;
  // The same, building the candidate only when the policy and the cache call for tuning.
  TuneResult tune(const TunedKey& key, const CandidateFactory& make_candidate,
                  const TuneOptions& options = {}) const;
  // Measures every planned candidate now, whatever the policy, and stores nothing (ladle-tune
  // stores what it chooses to).
  TuneResult measure(const TunedKey& key, Candidate& candidate,
                     const TuneOptions& options = {}) const;

  const SearchSpace& space() const { return space_; }
  const DeviceLimits& device() const { return device_; }
  const Config& heuristic() const { return heuristic_; }
  TunePlan plan(std::size_t max_candidates) const {
    return space_.plan(device_, heuristic_, max_candidates);
  }

 private:
  TuneResult run(const TunedKey& key, Candidate& candidate, const TuneOptions& options) const;
  std::optional<TuneResult> cached(TunedCache& cache, const TunedKey& key, bool report) const;
  TuneResult apply_policy(const TunedKey& key, const TuneOptions& options,
                          const std::function<TuneResult()>& tune_now) const;

  SearchSpace space_;
  DeviceLimits device_;
  Config heuristic_;
};

// What a kernel family hands over for one problem (an op's call, or ladle-tune's command
// line): the key, the tuner, and how to build the candidate. An op then runs
//   const Config config = job.tune().best;
// and ladle-tune runs job.measure() and prints format_table() of the result.
struct TuneJob {
  TunedKey key;
  Tuner tuner;
  CandidateFactory make_candidate;

  TuneResult tune(const TuneOptions& options = {}) const {
    return tuner.tune(key, make_candidate, options);
  }
  TuneResult measure(const TuneOptions& options = {}) const;
};

}  // namespace ladle
