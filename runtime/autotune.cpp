#include "autotune.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <thread>
#include <vector>

#include "error.h"
#include "log.h"

namespace ladle {

Check compare_outputs(const std::vector<float>& out, const std::vector<float>& reference, double tolerance) {
  if (out.size() != reference.size())
    return Check::fail("output has " + std::to_string(out.size()) + " values, the reference " +
                       std::to_string(reference.size()));
  return compare_outputs(out.data(), reference.data(), out.size(), DType::f32, tolerance);
}

Check compare_outputs(const void* out, const void* reference, std::size_t count, DType type, double tolerance) {
  if (type != DType::f32 && type != DType::f16 && type != DType::bf16)
    throw InvalidArgument(fmt::format("compare_outputs: type {}, expected f32, f16 or bf16", dtype_name(type)));
  const std::size_t size = dtype_size(type);
  const auto* a = static_cast<const std::byte*>(out);
  const auto* b = static_cast<const std::byte*>(reference);
  // Sums of squares per part, each part's in double, added in order (the same result on every run).
  const std::size_t parts = std::clamp<std::size_t>(count >> 20, 1, std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<double> diff(parts, 0.0), norm(parts, 0.0);
  const auto sum = [&](std::size_t part) {
    const std::size_t begin = count * part / parts, end = count * (part + 1) / parts;
    double d = 0, n = 0;
    const auto add = [&](auto load) {
      for (std::size_t i = begin; i < end; ++i) {
        const double x = load(a + i * size), r = load(b + i * size);
        d += (x - r) * (x - r);
        n += r * r;
      }
    };
    if (type == DType::bf16) {
      add([](const std::byte* p) {
        std::uint16_t bits;
        std::memcpy(&bits, p, 2);
        const std::uint32_t wide = std::uint32_t{bits} << 16;
        float f;
        std::memcpy(&f, &wide, 4);
        return f;
      });
    } else {
      add([type](const std::byte* p) { return load_float(p, type); });
    }
    diff[part] = d, norm[part] = n;
  };
  {
    std::vector<std::jthread> threads;
    for (std::size_t part = 1; part < parts; ++part) threads.emplace_back(sum, part);
    sum(0);
  }
  double d = 0, n = 0;
  for (std::size_t part = 0; part < parts; ++part) d += diff[part], n += norm[part];
  const double error = n > 0 ? std::sqrt(d / n) : std::sqrt(d);
  if (!(error <= tolerance)) return Check::fail(fmt::format("relative L2 error {:.2e} > {:.0e}", error, tolerance));
  return Check::pass();
}

namespace {

constexpr double kDefaultBudgetMs = 15000;

double steady_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string first_line(std::string text) {
  if (auto eol = text.find('\n'); eol != std::string::npos) text = text.substr(0, eol);
  return text;
}

// Tunings in one process take turns: two at once would disturb each other's timings.
std::mutex& tuning_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The prepare() side: worker threads take configs in plan order and report each one ready
// or failed. Stopping (budget spent, or the tuning thread leaving by an exception) lets
// the configs being prepared finish; none is started after.
class Preparer {
 public:
  enum class State { pending, ready, failed };
  struct Slot {
    State state = State::pending;
    std::string error;
    double prepare_ms = 0;
  };

  Preparer(Candidate& candidate, const std::vector<Config>& configs, unsigned threads)
      : candidate_(candidate), configs_(configs), slots_(configs.size()) {
    for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~Preparer() {
    stop();
    for (auto& worker : workers_) worker.join();
  }
  Preparer(const Preparer&) = delete;
  Preparer& operator=(const Preparer&) = delete;

  void stop() { stop_ = true; }

  // Waits up to `wait_ms` for config i; the slot when it is done, else nullopt.
  std::optional<Slot> wait(std::size_t i, double wait_ms) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, std::chrono::duration<double, std::milli>(wait_ms),
                    [&] { return slots_[i].state != State::pending; });
    if (slots_[i].state == State::pending) return std::nullopt;
    return slots_[i];
  }

 private:
  void work() {
    while (!stop_) {
      const std::size_t i = next_.fetch_add(1);
      if (i >= configs_.size()) return;
      Slot slot;
      const double start = steady_ms();
      try {
        candidate_.prepare(configs_[i]);
        slot.state = State::ready;
      } catch (const std::exception& e) {
        slot.state = State::failed;
        slot.error = e.what();
      } catch (...) {
        slot.state = State::failed;
        slot.error = "an exception that is not a std::exception";
      }
      slot.prepare_ms = steady_ms() - start;
      {
        std::lock_guard lock(mutex_);
        slots_[i] = std::move(slot);
      }
      ready_.notify_all();
    }
  }

  Candidate& candidate_;
  const std::vector<Config>& configs_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;  // last: they start once everything above exists
};

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// A time from Candidate::time_ms, or the reason it is not one.
Reason check_time(double ms) {
  if (std::isfinite(ms) && ms > 0) return std::nullopt;
  return fmt::format("time_ms returned {}, not a positive time", ms);
}

// The heuristic config's time, after recording its output as the reference. Without a
// working heuristic there is nothing to compare with, and the op would fail untuned too:
// that is the family's bug, reported as such rather than skipped.
double measure_heuristic(const TunedKey& key, Candidate& candidate, const Preparer::Slot& slot,
                         const Config& heuristic) {
  auto failure = [&](std::string_view what, const std::string& detail) {
    return Error(fmt::format("tuning [{}]: the heuristic config '{}' {}: {}", key.to_string(),
                             heuristic.to_string(), what, detail));
  };
  if (slot.state == Preparer::State::failed) throw failure("failed to prepare", slot.error);
  double ms = 0;
  try {
    candidate.record_reference(heuristic);
    ms = candidate.time_ms(heuristic);
  } catch (...) {
    throw failure("failed to run", describe(std::current_exception()));
  }
  if (auto reason = check_time(ms)) throw failure("has no time", *reason);
  return ms;
}

// Checks, then times, one prepared candidate; any failure makes it invalid with the reason.
// A wrong output is not timed: its speed means nothing.
void measure_candidate(Candidate& candidate, const Preparer::Slot& slot, CandidateRecord& record) {
  if (slot.state == Preparer::State::failed) {
    record.reason = "prepare: " + first_line(slot.error);
    return;
  }
  try {
    const Check check = candidate.matches_reference(record.config);
    if (!check.ok) {
      record.reason = "output differs from the heuristic's: " + check.reason;
      return;
    }
    const double ms = candidate.time_ms(record.config);
    if (auto reason = check_time(ms)) {
      record.reason = *reason;
      return;
    }
    record.ms = ms;
    record.valid = true;
  } catch (...) {
    record.reason = "run: " + first_line(describe(std::current_exception()));
  }
}

}  // namespace

const char* to_string(Policy policy) {
  switch (policy) {
    case Policy::heuristic:
      return "heuristic";
    case Policy::cached:
      return "cached";
    case Policy::force:
      return "force";
  }
  return "?";
}

Policy parse_policy(std::string_view text, std::string_view source) {
  if (text == "heuristic") return Policy::heuristic;
  if (text == "cached") return Policy::cached;
  if (text == "force") return Policy::force;
  throw InvalidArgument(
      fmt::format("{}='{}' is not a tuning policy; expected heuristic (never "
                  "tune), cached (tune once per key, the default) or force",
                  source, text));
}

Policy policy_from_env() {
  const char* env = std::getenv("LADLE_AUTOTUNE");
  if (!env || !*env) return Policy::cached;
  return parse_policy(env, "LADLE_AUTOTUNE");
}

double budget_ms_from_env() {
  const char* env = std::getenv("LADLE_AUTOTUNE_BUDGET");
  if (!env || !*env) return kDefaultBudgetMs;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !std::isfinite(seconds) || seconds <= 0) {
    throw InvalidArgument(fmt::format(
        "LADLE_AUTOTUNE_BUDGET='{}' is not a time; expected seconds, such as 15 or 2.5", env));
  }
  return seconds * 1000;
}

std::string format_progress(const TuneProgress& p) {
  std::string out =
      fmt::format("tuning {} {} {}: {}/{} candidates", p.key ? p.key->family : "?",
                  p.key ? p.key->shape_bucket : "", p.key ? p.key->dtype : "", p.done, p.total);
  if (p.best && p.best->ms) {
    out += fmt::format(", best {:.4f} ms ({})", *p.best->ms, p.best->config.to_string());
  }
  return out;
}

Tuner::Tuner(SearchSpace space, DeviceLimits device, Config heuristic)
    : space_(std::move(space)), device_(std::move(device)), heuristic_(std::move(heuristic)) {
  if (auto reason = space_.why_invalid(heuristic_, device_)) {
    throw InvalidArgument(fmt::format("the heuristic config '{}' is invalid on {}: {}",
                                      heuristic_.to_string(), device_.name, *reason));
  }
  heuristic_ = space_.normalize(heuristic_);
}

std::optional<TuneResult> Tuner::cached(TunedCache& cache, const TunedKey& key, bool report) const {
  auto hit = cache.lookup(key);
  if (!hit) return std::nullopt;
  if (auto reason = space_.why_invalid(hit->best, device_)) {
    if (report) {
      log::warn(
          fmt::format("tuned-config cache: the stored config '{}' for [{}] is not valid "
                      "any more ({}); tuning again",
                      hit->best.to_string(), key.to_string(), *reason));
    }
    return std::nullopt;
  }
  hit->best = space_.normalize(hit->best);
  log::debug(fmt::format("tuned config for [{}] from the cache: {}", key.to_string(),
                         hit->best.to_string()));
  return hit;
}

TuneResult Tuner::tune(const TunedKey& key, Candidate& candidate,
                       const TuneOptions& options) const {
  return apply_policy(key, options, [&] { return run(key, candidate, options); });
}

TuneResult Tuner::tune(const TunedKey& key, const CandidateFactory& make_candidate,
                       const TuneOptions& options) const {
  return apply_policy(key, options, [&] {
    std::unique_ptr<Candidate> candidate = make_candidate ? make_candidate() : nullptr;
    if (!candidate)
      throw Error(fmt::format("tuning [{}]: the family built no candidate", key.to_string()));
    return run(key, *candidate, options);
  });
}

TuneResult Tuner::apply_policy(const TunedKey& key, const TuneOptions& options,
                               const std::function<TuneResult()>& tune_now) const {
  const Policy policy = options.policy ? *options.policy : policy_from_env();
  if (policy == Policy::heuristic) {
    TuneResult result;
    result.best = result.heuristic = heuristic_;
    result.source = TuneSource::heuristic;
    return result;
  }
  TunedCache& cache = options.cache ? *options.cache : TunedCache::global();
  if (policy == Policy::cached) {
    if (auto hit = cached(cache, key, true)) return *hit;
  }
  std::lock_guard lock(tuning_mutex());
  // Another thread may have tuned this key while this one waited for its turn.
  if (policy == Policy::cached) {
    if (auto hit = cached(cache, key, false)) return *hit;
  }
  TuneResult result = tune_now();
  cache.store(key, result);
  return result;
}

TuneResult Tuner::measure(const TunedKey& key, Candidate& candidate,
                          const TuneOptions& options) const {
  std::lock_guard lock(tuning_mutex());
  return run(key, candidate, options);
}

TuneResult Tuner::run(const TunedKey& key, Candidate& candidate, const TuneOptions& options) const {
  const std::function<double()> clock = options.clock_ms ? options.clock_ms : steady_ms;
  const std::function<void(const TuneProgress&)> report =
      options.on_progress ? options.on_progress : [](const TuneProgress& p) {
        // The last report is the summary line below.
        if (!p.finished && log::enabled(log::Level::info)) log::info(format_progress(p));
      };
  const double start = clock();
  const double budget_ms = options.budget_ms ? *options.budget_ms : budget_ms_from_env();

  const TunePlan plan = space_.plan(device_, heuristic_, options.max_candidates);
  TuneResult result;
  result.heuristic = heuristic_;
  result.space_size = plan.space_size;
  result.space_valid = plan.valid;
  result.pruned = plan.pruned;
  result.source = TuneSource::tuned;
  for (const auto& config : plan.configs)
    result.candidates.push_back({config, {}, false, {}, {}, false});
  result.candidates[0].heuristic = true;
  const std::size_t total = plan.configs.size();

  std::optional<std::size_t> best;
  std::size_t done = 0;
  double last_report = start;
  auto progress = [&](bool finished) {
    TuneProgress p;
    p.key = &key;
    p.done = done;
    p.total = total;
    p.best = best ? &result.candidates[*best] : nullptr;
    p.elapsed_ms = clock() - start;
    p.finished = finished;
    report(p);
  };
  auto over_budget = [&] { return clock() - start >= budget_ms; };

  unsigned threads = options.prepare_threads;
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, total));
  {
    Preparer preparer(candidate, plan.configs, threads);
    for (std::size_t i = 0; i < total; ++i) {
      // The heuristic is always measured: it is the reference and the baseline.
      if (i > 0 && over_budget()) break;
      std::optional<Preparer::Slot> slot;
      while (!(slot = preparer.wait(i, 50)) && !(i > 0 && over_budget())) {
      }
      if (!slot) break;

      CandidateRecord& record = result.candidates[i];
      record.prepare_ms = slot->prepare_ms;
      if (i == 0) {
        record.ms = measure_heuristic(key, candidate, *slot, heuristic_);
        record.valid = true;
        result.heuristic_ms = record.ms;
      } else {
        measure_candidate(candidate, *slot, record);
      }
      if (record.valid && (!best || *record.ms < *result.candidates[*best].ms)) best = i;
      ++done;
      if (clock() - last_report >= options.progress_interval_ms) {
        last_report = clock();
        progress(false);
      }
    }
    preparer.stop();
  }  // joins the workers: configs being prepared finish, none starts

  if (done < total) {
    result.budget_exhausted = true;
    for (std::size_t i = done; i < total; ++i) {
      result.candidates[i].reason =
          fmt::format("not measured: the time budget of {:.1f} s ran out", budget_ms / 1000);
    }
  }
  result.best = result.candidates[*best].config;
  result.best_ms = result.candidates[*best].ms;
  result.wall_ms = clock() - start;
  progress(true);
  log::info(fmt::format("tuned [{}]: {}", key.to_string(), format_summary(result)));
  return result;
}

TuneResult TuneJob::measure(const TuneOptions& options) const {
  std::unique_ptr<Candidate> candidate = make_candidate ? make_candidate() : nullptr;
  if (!candidate) {
    throw Error(fmt::format("tuning [{}]: the family built no candidate", key.to_string()));
  }
  return tuner.measure(key, *candidate, options);
}

}  // namespace ladle
