// Compiles behind a call (runtime/background.h) and the cache probe a call makes before it starts one
// (is_compiled, runtime/compiler.h).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <ladle/runtime/background.h>
#include <ladle/runtime/cache.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>

#include "kernels.h"
#include "scoped_env.h"
#include "temp_dir.h"

using namespace ladle;

namespace {

// A gate a job waits on, so that the test sees it running.
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

}  // namespace

TEST_CASE("a background job runs once per key, is seen running, then done; wait_all waits for it", "[background]") {
  BackgroundCompiles jobs;
  Gate gate;
  std::atomic<int> runs{0};
  CHECK(jobs.state("a") == BackgroundState::none);
  CHECK(jobs.start("a", [&] {
    gate.wait();
    ++runs;
  }));
  CHECK(jobs.state("a") == BackgroundState::running);
  CHECK_FALSE(jobs.start("a", [&] { ++runs; }));  // one job per key, even while it runs
  CHECK(jobs.started() == 1);
  gate.open();
  jobs.wait_all();
  CHECK(jobs.state("a") == BackgroundState::done);
  CHECK(runs == 1);
  CHECK_FALSE(jobs.start("a", [&] { ++runs; }));  // nor after it ended
  jobs.wait_all();
  CHECK(runs == 1);
}

TEST_CASE("a failing job ends as done, its error dropped; mark_done records a key without running anything", "[background]") {
  BackgroundCompiles jobs;
  CHECK(jobs.start("throws", [] { throw std::runtime_error("NVRTC said no"); }));
  jobs.wait_all();
  CHECK(jobs.state("throws") == BackgroundState::done);
  jobs.mark_done("found");
  CHECK(jobs.state("found") == BackgroundState::done);
  CHECK_FALSE(jobs.start("found", [] { FAIL("a key marked done must not run"); }));
  CHECK(jobs.started() == 1);
}

TEST_CASE("an object's destructor waits for its jobs", "[background]") {
  std::atomic<bool> finished{false};
  {
    BackgroundCompiles jobs;
    jobs.start("slow", [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      finished = true;
    });
  }
  CHECK(finished);
}

TEST_CASE("LADLE_BACKGROUND_COMPILE is on unless 0, and anything else is refused by name", "[background]") {
  {
    test::ScopedEnv unset("LADLE_BACKGROUND_COMPILE", nullptr);
    CHECK(background_compile_enabled());
  }
  {
    test::ScopedEnv off("LADLE_BACKGROUND_COMPILE", "0");
    CHECK_FALSE(background_compile_enabled());
  }
  {
    test::ScopedEnv on("LADLE_BACKGROUND_COMPILE", "1");
    CHECK(background_compile_enabled());
  }
  test::ScopedEnv bad("LADLE_BACKGROUND_COMPILE", "off");
  CHECK_THROWS_AS(background_compile_enabled(), InvalidArgument);
  CHECK_THROWS_WITH(background_compile_enabled(), Catch::Contains("LADLE_BACKGROUND_COMPILE='off'") && Catch::Contains("expected 1"));
}

TEST_CASE("is_compiled says whether compile() would hit the cache, in memory or on disk", "[background][cache]") {
  test::TempDir dir;
  CompileOptions options;
  options.arch = "compute_80";
  {
    DiskCache cache(DiskCache::Settings::at(dir.path()));
    CHECK_FALSE(is_compiled(test::vector_add_source, options, cache));
    const CompiledProgram program = compile(test::vector_add_source, options, cache);
    CHECK_FALSE(program.from_cache);
    CHECK(is_compiled(test::vector_add_source, options, cache));
    CompileOptions other = options;
    other.flags.push_back("-DLADLE_OTHER=1");  // another key
    CHECK_FALSE(is_compiled(test::vector_add_source, other, cache));
    CompileOptions uncached = options;
    uncached.use_cache = false;
    CHECK_FALSE(is_compiled(test::vector_add_source, uncached, cache));
  }
  DiskCache reopened(DiskCache::Settings::at(dir.path()));  // a new process's view: the entry on disk
  CHECK(is_compiled(test::vector_add_source, options, reopened));
  DiskCache off(DiskCache::Settings::off());
  CHECK_FALSE(is_compiled(test::vector_add_source, options, off));
  CHECK_THROWS_AS(is_compiled("", options, off), InvalidArgument);
}
