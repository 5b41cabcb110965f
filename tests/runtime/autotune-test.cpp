#include <fmt/format.h>
#include <ladle/runtime/autotune.h>
#include <ladle/runtime/cache.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/log.h>
#include <ladle/runtime/tuned_cache.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <limits>
#include <random>
#include <thread>

#include "capture_stderr.h"
#include "scoped_env.h"
#include "temp_dir.h"
#include "tune_fixtures.h"

using namespace ladle;
using test::FakeCandidate;
using test::FakeClock;
using test::ScopedEnv;
using test::small_device;
using test::tile;
using test::tile_space;

namespace {

// The tile family at K=128, V=96 on the small device: 16 valid configs.
Tuner tile_tuner() {
  return Tuner(tile_space(128, 96), small_device(), tile(32, 32, 2, 1));
}

TunedKey tile_key() {
  return TunedKey::make("tiles", "variant-1", "B1-T1024", "bf16", small_device());
}

// A private cache and a quiet, generous tuning unless a test says otherwise.
struct Fixture {
  test::TempDir dir;
  TunedCache cache{TunedCache::Settings::at(dir.path() / "tuned")};
  TuneOptions options;
  Fixture() {
    options.cache = &cache;
    options.budget_ms = 60'000;
    options.on_progress = [](const TuneProgress&) {};
  }
};

// The fastest config by the fake's formula among those the tuner may choose.
Config fastest(FakeCandidate& fake, const std::vector<Config>& configs) {
  return *std::min_element(configs.begin(), configs.end(), [&](const Config& a, const Config& b) {
    return fake.time_of(a) < fake.time_of(b);
  });
}

}  // namespace

TEST_CASE("the policy comes from LADLE_AUTOTUNE, cached by default") {
  {
    ScopedEnv env("LADLE_AUTOTUNE", nullptr);
    REQUIRE(policy_from_env() == Policy::cached);
  }
  {
    ScopedEnv env("LADLE_AUTOTUNE", "");
    REQUIRE(policy_from_env() == Policy::cached);
  }
  {
    ScopedEnv env("LADLE_AUTOTUNE", "heuristic");
    REQUIRE(policy_from_env() == Policy::heuristic);
  }
  {
    ScopedEnv env("LADLE_AUTOTUNE", "force");
    REQUIRE(policy_from_env() == Policy::force);
  }
  {
    ScopedEnv env("LADLE_AUTOTUNE", "fast");
    REQUIRE_THROWS_AS(policy_from_env(), InvalidArgument);
    REQUIRE_THROWS_WITH(policy_from_env(),
                        Catch::Contains("LADLE_AUTOTUNE='fast'") && Catch::Contains("heuristic") &&
                            Catch::Contains("cached") && Catch::Contains("force"));
  }
  REQUIRE(parse_policy("cached") == Policy::cached);
  REQUIRE_THROWS_WITH(parse_policy("Force", "--policy"), Catch::StartsWith("--policy='Force'"));
  REQUIRE(std::string(to_string(Policy::force)) == "force");
}

TEST_CASE("the budget comes from LADLE_AUTOTUNE_BUDGET in seconds, 15 s by default") {
  {
    ScopedEnv env("LADLE_AUTOTUNE_BUDGET", nullptr);
    REQUIRE(budget_ms_from_env() == 15000);
  }
  {
    ScopedEnv env("LADLE_AUTOTUNE_BUDGET", "2.5");
    REQUIRE(budget_ms_from_env() == 2500);
  }
  for (const char* bad : {"soon", "10s", "0", "-3"}) {
    ScopedEnv env("LADLE_AUTOTUNE_BUDGET", bad);
    REQUIRE_THROWS_WITH(budget_ms_from_env(),
                        Catch::Contains(std::string("LADLE_AUTOTUNE_BUDGET='") + bad + "'"));
  }
}

TEST_CASE("policy heuristic measures nothing and reads no cache") {
  Fixture f;
  FakeCandidate fake;
  f.options.policy = Policy::heuristic;
  f.cache.store(tile_key(), [] {
    TuneResult stored;
    stored.best = tile(64, 32, 4, 2);
    stored.best_ms = 0.1;
    return stored;
  }());
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);
  REQUIRE(result.source == TuneSource::heuristic);
  REQUIRE(result.best == tile(32, 32, 2, 1));  // not the stored one
  REQUIRE_FALSE(result.best_ms.has_value());
  REQUIRE(result.candidates.empty());
  REQUIRE(fake.prepares == 0);
  REQUIRE(fake.timed.empty());
}

TEST_CASE("the per-call policy overrides LADLE_AUTOTUNE") {
  Fixture f;
  SECTION("env heuristic, call force: tunes") {
    ScopedEnv env("LADLE_AUTOTUNE", "heuristic");
    FakeCandidate fake;
    f.options.policy = Policy::force;
    REQUIRE(tile_tuner().tune(tile_key(), fake, f.options).source == TuneSource::tuned);
    REQUIRE(fake.prepares == 16);
  }
  SECTION("env force, call heuristic: does not") {
    ScopedEnv env("LADLE_AUTOTUNE", "force");
    FakeCandidate fake;
    f.options.policy = Policy::heuristic;
    REQUIRE(tile_tuner().tune(tile_key(), fake, f.options).source == TuneSource::heuristic);
    REQUIRE(fake.prepares == 0);
  }
  SECTION("no override: the environment decides") {
    ScopedEnv env("LADLE_AUTOTUNE", "heuristic");
    FakeCandidate fake;
    REQUIRE(tile_tuner().tune(tile_key(), fake, f.options).source == TuneSource::heuristic);
    REQUIRE(fake.prepares == 0);
  }
}

TEST_CASE("tuning measures every valid config and picks the fastest") {
  Fixture f;
  FakeCandidate fake;
  f.options.policy = Policy::force;
  const Tuner tuner = tile_tuner();
  TuneResult result = tuner.tune(tile_key(), fake, f.options);

  auto valid = tuner.space().enumerate(small_device());
  REQUIRE(result.source == TuneSource::tuned);
  REQUIRE(result.candidates.size() == 16);
  REQUIRE(result.measured() == 16);
  REQUIRE(result.best == fastest(fake, valid));
  REQUIRE(result.best == tile(128, 32, 2, 2));
  REQUIRE(*result.best_ms == Approx(fake.time_of(result.best)));
  // The heuristic is measured too (first: it is the reference), and appears once.
  REQUIRE(result.candidates[0].heuristic);
  REQUIRE(result.candidates[0].config == tile(32, 32, 2, 1));
  REQUIRE(*result.heuristic_ms == Approx(fake.time_of(tile(32, 32, 2, 1))));
  REQUIRE(fake.timed.front() == tile(32, 32, 2, 1));
  REQUIRE(std::count_if(result.candidates.begin(), result.candidates.end(),
                        [](const auto& c) { return c.heuristic; }) == 1);
  REQUIRE(result.speedup() == Approx(*result.heuristic_ms / *result.best_ms));
  REQUIRE(result.speedup() > 1.15);
  REQUIRE(result.space_size == 81);
  REQUIRE(result.space_valid == 16);
  REQUIRE_FALSE(result.budget_exhausted);
  for (const auto& c : result.candidates) REQUIRE(c.prepare_ms.has_value());
  // Timing and checking happen on the calling thread only.
  REQUIRE(fake.timing_threads == std::set<std::thread::id>{std::this_thread::get_id()});
}

TEST_CASE("candidates that fail to compile, to run or to match the reference are rejected") {
  Fixture f;
  FakeCandidate fake;
  f.options.policy = Policy::force;
  // The three would be the fastest; none may win.
  const Config no_compile = tile(128, 32, 2, 2), no_launch = tile(128, 32, 4, 2),
               wrong = tile(128, 32, 2, 1);
  fake.fail_prepare = {no_compile};
  fake.fail_run = {no_launch};
  fake.fail_check = {wrong};
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);

  auto row = [&](const Config& c) {
    return *std::find_if(result.candidates.begin(), result.candidates.end(),
                         [&](const auto& r) { return r.config == c; });
  };
  REQUIRE_FALSE(row(no_compile).valid);
  REQUIRE_THAT(row(no_compile).reason, Catch::StartsWith("prepare: NVRTC could not compile"));
  REQUIRE_FALSE(row(no_launch).valid);
  REQUIRE_THAT(row(no_launch).reason, Catch::Contains("run: cuLaunchKernel: too many resources"));
  REQUIRE_FALSE(row(wrong).valid);
  REQUIRE_THAT(row(wrong).reason,
               Catch::Contains("output differs") && Catch::Contains("0.5 > 1e-05"));
  REQUIRE_FALSE(row(wrong).ms.has_value());  // a wrong kernel is not timed
  REQUIRE(result.measured() == 13);

  auto valid = tile_tuner().space().enumerate(small_device());
  std::erase_if(valid,
                [&](const Config& c) { return c == no_compile || c == no_launch || c == wrong; });
  REQUIRE(result.best == fastest(fake, valid));
  REQUIRE(result.best == tile(64, 32, 2, 3));

  const std::string table = format_table(result);
  REQUIRE_THAT(table, Catch::Contains("BK=64 BV=32 warps=2 stages=3") && Catch::Contains("best"));
  REQUIRE_THAT(table, Catch::Contains("prepare: NVRTC could not compile"));
  REQUIRE(table.find("best") < table.find("prepare:"));  // measured rows first
  REQUIRE(table.find("line 2") == std::string::npos);    // one line per row
}

TEST_CASE("a time that is not a positive number rejects the candidate") {
  Fixture f;
  FakeCandidate fake;
  f.options.policy = Policy::force;
  fake.time_of = [](const Config& c) {
    if (c == tile(64, 32, 2, 1)) return std::nan("");
    if (c == tile(64, 32, 4, 1)) return 0.0;
    return 1.0 + c["stages"];
  };
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);
  REQUIRE(result.measured() == 14);
  REQUIRE(*result.best_ms == 2.0);
}

TEST_CASE("a failing heuristic config is an error, not a silent fallback") {
  Fixture f;
  f.options.policy = Policy::force;
  SECTION("it does not compile") {
    FakeCandidate fake;
    fake.fail_prepare = {tile(32, 32, 2, 1)};
    REQUIRE_THROWS_WITH(
        tile_tuner().tune(tile_key(), fake, f.options),
        Catch::Contains("heuristic config 'BK=32 BV=32 warps=2 stages=1' failed to prepare") &&
            Catch::Contains("NVRTC could not compile"));
  }
  SECTION("it does not launch") {
    FakeCandidate fake;
    fake.fail_run = {tile(32, 32, 2, 1)};
    REQUIRE_THROWS_WITH(tile_tuner().tune(tile_key(), fake, f.options),
                        Catch::Contains("failed to run") && Catch::Contains("cuLaunchKernel"));
  }
  REQUIRE(f.cache.list().empty());  // nothing stored
}

TEST_CASE("the tuner refuses a heuristic that its own space calls invalid") {
  REQUIRE_THROWS_AS(Tuner(tile_space(128, 96), small_device(), tile(64, 64, 4, 1)),
                    InvalidArgument);
}

TEST_CASE("policy cached tunes once per key, then returns the stored result") {
  Fixture f;
  f.options.policy = Policy::cached;
  FakeCandidate first;
  TuneResult tuned = tile_tuner().tune(tile_key(), first, f.options);
  REQUIRE(tuned.source == TuneSource::tuned);
  REQUIRE(first.prepares == 16);
  REQUIRE(std::filesystem::exists(f.cache.path_for(tile_key())));

  FakeCandidate second;
  TuneResult hit = tile_tuner().tune(tile_key(), second, f.options);
  REQUIRE(hit.source == TuneSource::cache);
  REQUIRE(second.prepares == 0);
  REQUIRE(second.timed.empty());
  REQUIRE(hit.best == tuned.best);
  REQUIRE(hit.best_ms == tuned.best_ms);

  // Another process: a new cache instance on the same directory.
  TunedCache reopened(TunedCache::Settings::at(f.dir.path() / "tuned"));
  f.options.cache = &reopened;
  FakeCandidate third;
  REQUIRE(tile_tuner().tune(tile_key(), third, f.options).source == TuneSource::cache);
  REQUIRE(third.prepares == 0);

  // Another key (another dtype) is a miss.
  TunedKey fp16 = tile_key();
  fp16.dtype = "fp16";
  FakeCandidate fourth;
  REQUIRE(tile_tuner().tune(fp16, fourth, f.options).source == TuneSource::tuned);
  REQUIRE(fourth.prepares == 16);
}

TEST_CASE("policy force tunes again and replaces the stored result") {
  Fixture f;
  FakeCandidate first;
  f.options.policy = Policy::cached;
  const Config first_best = tile_tuner().tune(tile_key(), first, f.options).best;

  FakeCandidate second;  // the GPU changed its mind: small stages are now fastest
  second.time_of = [](const Config& c) {
    return 1.0 + c["stages"] + 0.01 * c["BK"] + 0.1 * c["warps"];
  };
  f.options.policy = Policy::force;
  TuneResult forced = tile_tuner().tune(tile_key(), second, f.options);
  REQUIRE(second.prepares == 16);
  REQUIRE(forced.best == tile(32, 32, 2, 1));
  REQUIRE_FALSE(forced.best == first_best);

  TunedCache reopened(TunedCache::Settings::at(f.dir.path() / "tuned"));
  REQUIRE(reopened.lookup(tile_key())->best == tile(32, 32, 2, 1));
}

TEST_CASE("a stored config the space no longer accepts is tuned again") {
  Fixture f;
  TuneResult stale;
  stale.best = Config{{"BK", 64}, {"BV", 32}, {"warps", 4}};  // an older space without stages
  stale.best_ms = 0.01;
  stale.heuristic = stale.best;
  f.cache.store(tile_key(), stale);
  FakeCandidate fake;
  f.options.policy = Policy::cached;
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);
  REQUIRE(result.source == TuneSource::tuned);
  REQUIRE(fake.prepares == 16);
  REQUIRE(f.cache.lookup(tile_key())->best.contains("stages"));
}

TEST_CASE("the time budget stops tuning early and keeps the best so far") {
  Fixture f;
  FakeClock clock;
  FakeCandidate fake;
  fake.clock = &clock;
  fake.clock_ms_per_time = 1000;  // each measurement takes a second
  f.options.policy = Policy::force;
  f.options.clock_ms = clock.fn();
  f.options.budget_ms = 5000;
  // The best config comes last in the plan; the budget never reaches it.
  fake.time_of = [](const Config& c) {
    return c == tile(128, 32, 4, 2) ? 0.1 : 10.0 - 0.1 * c["BK"] / 32 - 0.01 * c["stages"];
  };
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);

  REQUIRE(result.budget_exhausted);
  REQUIRE(fake.timed.size() == 5);
  REQUIRE(result.measured() == 5);
  REQUIRE(result.candidates.size() == 16);
  REQUIRE(result.wall_ms == 5000);
  REQUIRE_FALSE(result.best == tile(128, 32, 4, 2));
  REQUIRE(result.best == fastest(fake, fake.timed));
  for (std::size_t i = 5; i < 16; ++i) {
    REQUIRE_FALSE(result.candidates[i].valid);
    REQUIRE_THAT(result.candidates[i].reason, Catch::Contains("time budget of 5.0 s ran out"));
  }
  // What the budget allowed is stored: the next cached call does not tune again.
  FakeCandidate next;
  f.options.policy = Policy::cached;
  REQUIRE(tile_tuner().tune(tile_key(), next, f.options).best == result.best);
  REQUIRE(next.prepares == 0);
}

TEST_CASE("the heuristic is measured even when the budget is already spent") {
  Fixture f;
  FakeClock clock;
  FakeCandidate fake;
  f.options.policy = Policy::force;
  f.options.clock_ms = clock.fn();
  f.options.budget_ms = 0;
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);
  REQUIRE(result.budget_exhausted);
  REQUIRE(fake.timed == std::vector<Config>{tile(32, 32, 2, 1)});
  REQUIRE(result.best == tile(32, 32, 2, 1));
  REQUIRE(result.heuristic_ms.has_value());
}

TEST_CASE("prepare runs on several threads at once") {
  Fixture f;
  FakeCandidate fake;
  fake.prepare_sleep = std::chrono::milliseconds(100);
  f.options.policy = Policy::force;
  f.options.prepare_threads = 4;
  const auto start = std::chrono::steady_clock::now();
  TuneResult result = tile_tuner().tune(tile_key(), fake, f.options);
  const double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(fake.prepares == 16);
  REQUIRE(fake.max_in_flight >= 2);
  REQUIRE(fake.max_in_flight <= 4);
  // 16 prepares of 100 ms: 1.6 s one after another, about 0.4 s on four threads.
  REQUIRE(wall < 0.6 * 1600);
  REQUIRE(*result.candidates[5].prepare_ms >= 100);
}

TEST_CASE("one prepare thread prepares one config at a time") {
  Fixture f;
  FakeCandidate fake;
  f.options.policy = Policy::force;
  f.options.prepare_threads = 1;
  tile_tuner().tune(tile_key(), fake, f.options);
  REQUIRE(fake.max_in_flight == 1);
}

TEST_CASE("progress is reported at most once per interval, and once at the end") {
  Fixture f;
  FakeClock clock;
  FakeCandidate fake;
  fake.clock = &clock;
  fake.clock_ms_per_time = 300;
  f.options.policy = Policy::force;
  f.options.clock_ms = clock.fn();
  f.options.progress_interval_ms = 1000;
  std::vector<TuneProgress> reports;
  std::vector<std::string> lines;
  f.options.on_progress = [&](const TuneProgress& p) {
    reports.push_back(p);
    lines.push_back(format_progress(p));
  };
  tile_tuner().tune(tile_key(), fake, f.options);
  // 16 candidates x 300 ms = 4.8 s: reports after 1.2, 2.4, 3.6 and 4.8 s (the 4th, 8th,
  // 12th and 16th candidate), then the final one.
  REQUIRE(reports.size() == 5);
  REQUIRE(reports[0].done == 4);
  REQUIRE(reports[0].total == 16);
  REQUIRE_FALSE(reports[0].finished);
  REQUIRE(reports.back().finished);
  REQUIRE(reports.back().done == 16);
  REQUIRE(reports.back().elapsed_ms == 4800);
  REQUIRE_THAT(lines[0], Catch::StartsWith("tuning tiles B1-T1024 bf16: 4/16 candidates, best "));
  REQUIRE_THAT(lines[0],
               Catch::Matches(R"(.*best \d+\.\d{4} ms \(BK=\d+ BV=\d+ warps=\d+ stages=\d\))"));
}

TEST_CASE("with a cost model only the most promising configs are prepared") {
  Fixture f;
  SearchSpace space = tile_space(128, 96);
  space.cost_model(
      [](const Config& c, const DeviceLimits&) { return -1.0 * c["BK"] * c["stages"]; });
  Tuner tuner(space, small_device(), tile(32, 32, 2, 1));
  FakeCandidate fake;
  f.options.policy = Policy::force;
  f.options.max_candidates = 3;
  TuneResult result = tuner.tune(tile_key(), fake, f.options);
  REQUIRE(fake.prepares == 4);
  REQUIRE(result.candidates.size() == 4);
  REQUIRE(result.pruned == 16 - 1 - 3);
  REQUIRE(result.candidates[1].config == tile(128, 32, 2, 2));
}

TEST_CASE("two threads asking for the same key under cached tune it once") {
  Fixture f;
  f.options.policy = Policy::cached;
  FakeCandidate a, b;
  a.prepare_sleep = b.prepare_sleep = std::chrono::milliseconds(5);
  const Tuner tuner = tile_tuner();
  auto first = std::async(std::launch::async, [&] { return tuner.tune(tile_key(), a, f.options); });
  auto second =
      std::async(std::launch::async, [&] { return tuner.tune(tile_key(), b, f.options); });
  TuneResult ra = first.get(), rb = second.get();
  REQUIRE(a.prepares + b.prepares == 16);
  REQUIRE(ra.best == rb.best);
  REQUIRE((ra.source == TuneSource::cache) != (rb.source == TuneSource::cache));
}

TEST_CASE("measure() tunes whatever the policy and stores nothing") {
  Fixture f;
  ScopedEnv env("LADLE_AUTOTUNE", "heuristic");
  FakeCandidate fake;
  TuneResult result = tile_tuner().measure(tile_key(), fake, f.options);
  REQUIRE(result.source == TuneSource::tuned);
  REQUIRE(fake.prepares == 16);
  REQUIRE(f.cache.list().empty());
}

TEST_CASE("the summary names best and heuristic with the gain") {
  TuneResult r;
  r.best = tile(128, 32, 2, 2);
  r.best_ms = 0.5;
  r.heuristic = tile(32, 32, 2, 1);
  r.heuristic_ms = 0.75;
  r.candidates.resize(4);
  r.candidates[0].valid = true;
  r.wall_ms = 2500;
  REQUIRE(format_summary(r) ==
          "best BK=128 BV=32 warps=2 stages=2 0.5000 ms, heuristic BK=32 BV=32 warps=2 stages=1 "
          "0.7500 ms (1.50x); 4 candidates (1 valid) in 2.5 s");
}

TEST_CASE("a candidate factory is called only when a tuning runs") {
  Fixture f;
  int built = 0;
  auto factory = [&] {
    ++built;
    return std::unique_ptr<Candidate>(std::make_unique<FakeCandidate>());
  };
  const Tuner tuner = tile_tuner();
  f.options.policy = Policy::heuristic;
  REQUIRE(tuner.tune(tile_key(), factory, f.options).source == TuneSource::heuristic);
  REQUIRE(built == 0);
  f.options.policy = Policy::cached;
  REQUIRE(tuner.tune(tile_key(), factory, f.options).source == TuneSource::tuned);
  REQUIRE(built == 1);
  REQUIRE(tuner.tune(tile_key(), factory, f.options).source == TuneSource::cache);
  REQUIRE(built == 1);
  REQUIRE_THROWS_WITH(tuner.tune(tile_key(), CandidateFactory([] { return nullptr; }),
                                 [&] {
                                   auto o = f.options;
                                   o.policy = Policy::force;
                                   return o;
                                 }()),
                      Catch::Contains("built no candidate"));
}

TEST_CASE("a tune job bundles what a family hands to an op or to ladle-tune") {
  Fixture f;
  int built = 0;
  TuneJob job{tile_key(), tile_tuner(), [&] {
                ++built;
                return std::unique_ptr<Candidate>(std::make_unique<FakeCandidate>());
              }};
  f.options.policy = Policy::cached;
  const Config chosen = job.tune(f.options).best;
  REQUIRE(chosen == tile(128, 32, 2, 2));
  REQUIRE(job.tune(f.options).source == TuneSource::cache);
  TuneResult table = job.measure(f.options);
  REQUIRE(table.candidates.size() == 16);
  REQUIRE(built == 2);
}

namespace {

// A family whose prepare really generates and compiles CUDA through the compile cache;
// its "time" is read back from what ptxas reported, so each config's program must exist.
class CompilingCandidate : public Candidate {
 public:
  explicit CompilingCandidate(DiskCache& cache) : cache_(cache) {}
  PerConfig<CompiledProgram> programs;

  void prepare(const Config& c) override {
    const std::string source = fmt::format(R"(
#define TILE {}
#define STAGES {}
extern "C" __global__ void tile_copy(const float* x, float* y, int n) {{
  __shared__ float buffer[STAGES][TILE];
  for (int s = 0; s < STAGES; ++s) buffer[s][threadIdx.x % TILE] = x[(blockIdx.x * STAGES + s) * TILE + threadIdx.x % TILE];
  __syncthreads();
  float sum = 0.0f;
  for (int s = 0; s < STAGES; ++s) sum += buffer[s][(threadIdx.x + 1) % TILE];
  y[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}}
)",
                                           c["BK"], c["stages"]);
    CompileOptions options;
    options.arch = "sm_90a";
    programs.put(c, compile(source, options, cache_));
  }
  void record_reference(const Config&) override {}
  Check matches_reference(const Config&) override { return Check::pass(); }
  double time_ms(const Config& c) override {
    return 1.0 + programs.at(c).kernels.at(0).shared_bytes / 1000.0;
  }

 private:
  DiskCache& cache_;
};

}  // namespace

TEST_CASE("prepare compiles candidates through the compile cache on several threads") {
  Fixture f;
  test::TempDir compile_dir;
  DiskCache compile_cache(DiskCache::Settings::at(compile_dir.path()));
  SearchSpace space;
  space.param("BK", {32, 64, 128}).param("stages", {1, 2});
  const Tuner tuner(space, small_device(), Config{{"BK", 64}, {"stages", 2}});
  f.options.policy = Policy::force;
  f.options.prepare_threads = 3;

  CompilingCandidate cold(compile_cache);
  TuneResult result = tuner.tune(tile_key(), cold, f.options);
  REQUIRE(result.measured() == 6);
  REQUIRE(result.best == Config{{"BK", 32}, {"stages", 1}});  // the least shared memory
  REQUIRE(*result.best_ms == Approx(1.128));                  // 32 floats
  std::set<std::string> keys;
  for (const auto& row : result.candidates) {
    const CompiledProgram& program = cold.programs.at(row.config);
    REQUIRE_FALSE(program.from_cache);
    REQUIRE(program.kernels.at(0).shared_bytes == 4 * row.config["BK"] * row.config["stages"]);
    keys.insert(program.key);
  }
  REQUIRE(keys.size() == 6);
  REQUIRE(compile_cache.list().size() == 6);

  CompilingCandidate warm(compile_cache);  // a second tuning compiles nothing
  REQUIRE(tuner.tune(tile_key(), warm, f.options).best == result.best);
  for (const auto& row : result.candidates) REQUIRE(warm.programs.at(row.config).from_cache);
}

TEST_CASE("by default progress goes to the log at info level, silent above it") {
  Fixture f;
  f.options.on_progress = nullptr;  // the default sink
  f.options.progress_interval_ms = 0;
  f.options.policy = Policy::force;
  FakeCandidate fake;
  test::CaptureStderr captured;
  tile_tuner().tune(tile_key(), fake, f.options);
  const std::string text = captured.text();
  if (log::enabled(log::Level::info)) {  // LADLE_LOG unset or info (ctest)
    REQUIRE_THAT(
        text, Catch::Contains("ladle [info] tuning tiles B1-T1024 bf16: 1/16 candidates, best "));
    REQUIRE_THAT(text,
                 Catch::Contains("ladle [info] tuning tiles B1-T1024 bf16: 15/16 candidates"));
    REQUIRE_THAT(text, Catch::Contains("ladle [info] tuned [tiles variant-1 B1-T1024 bf16") &&
                           Catch::Contains("best BK=128 BV=32 warps=2 stages=2 1.3825 ms"));
  } else {  // LADLE_LOG=warn: nothing
    REQUIRE(text.find("tun") == std::string::npos);
  }
}

TEST_CASE("compare_outputs over raw f32, f16 and bf16 elements agrees with the float comparison, over threads") {
  // 3M elements: several parts, each summed on its own thread.
  const std::size_t n = 3 << 20;
  std::mt19937 rng(34);
  std::normal_distribution<float> normal;
  std::vector<float> reference(n), out(n);
  for (std::size_t i = 0; i < n; ++i) reference[i] = normal(rng), out[i] = reference[i] * (1.0f + 0.004f * normal(rng));
  for (const DType type : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(type));
    const std::size_t size = dtype_size(type);
    std::vector<std::byte> raw_out(n * size), raw_reference(n * size);
    std::vector<float> rounded_out(n), rounded_reference(n);
    for (std::size_t i = 0; i < n; ++i) {
      store_float(raw_out.data() + i * size, type, out[i]);
      store_float(raw_reference.data() + i * size, type, reference[i]);
      rounded_out[i] = load_float(raw_out.data() + i * size, type);
      rounded_reference[i] = load_float(raw_reference.data() + i * size, type);
    }
    // The same verdict as the float vectors' on both sides of the error (about 4e-3 here).
    CHECK(compare_outputs(raw_out.data(), raw_reference.data(), n, type, 1e-2).ok);
    CHECK(compare_outputs(rounded_out, rounded_reference, 1e-2).ok);
    const Check tight = compare_outputs(raw_out.data(), raw_reference.data(), n, type, 1e-3);
    CHECK_FALSE(tight.ok);
    CHECK_THAT(tight.reason, Catch::Contains("relative L2 error 4.") || Catch::Contains("relative L2 error 3."));
    CHECK(tight.reason == compare_outputs(rounded_out, rounded_reference, 1e-3).reason);
    // One NaN anywhere (here in the last part) fails.
    store_float(raw_out.data() + (n - 5) * size, type, std::numeric_limits<float>::quiet_NaN());
    CHECK_THAT(compare_outputs(raw_out.data(), raw_reference.data(), n, type, 1e-2).reason, Catch::Contains("nan"));
  }
  CHECK_THROWS_WITH(compare_outputs(out.data(), reference.data(), n, DType::i32, 1e-2), Catch::Contains("type i32, expected f32, f16 or bf16"));
}
