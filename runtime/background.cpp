#include "background.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <string_view>

#include "cache.h"
#include "compiler.h"
#include "detail/api.h"
#include "dump.h"
#include "error.h"
#include "log.h"

namespace ladle {

struct BackgroundCompiles::Job {
  std::atomic<bool> done{false};
};

BackgroundCompiles& BackgroundCompiles::global() {
  // The process's jobs are never destroyed: start() registers the wait at exit. What a job touches
  // is made here, before any such registration, so that the wait runs before their destructors
  // (static objects are destroyed in the reverse order of their making, atexit's functions taking
  // their places in it): the cache, NVRTC's entry points and version, the ptxas report's patterns,
  // the log's level, the dump directory.
  static BackgroundCompiles* const jobs = [] {
    DiskCache::global();
    try {
      detail::nvrtc();
      nvrtc_version();
    } catch (const std::exception&) {
      // No NVRTC: a job fails where it compiles, and its caller's foreground compile says why.
    }
    parse_ptxas_info("");
    log::enabled(log::Level::debug);
    dump_directory();  // LADLE_DUMP's directory, read by a job's compile
    return new BackgroundCompiles();
  }();
  return *jobs;
}

BackgroundCompiles::~BackgroundCompiles() { wait_all(); }

bool BackgroundCompiles::start(const std::string& key, std::function<void()> job) {
  std::lock_guard lock(mutex_);
  auto& slot = jobs_[key];
  if (slot) return false;
  slot = std::make_shared<Job>();
  ++started_;
  // The wait at exit, registered anew with each job: after whatever the caller made before it.
  if (this == &global()) std::atexit([] { global().wait_all(); });
  threads_.emplace_back([state = slot, key, job = std::move(job)] {
    try {
      job();
    } catch (const std::exception& e) {
      log::debug("background compile " + key + " failed: " + e.what());
    } catch (...) {
      log::debug("background compile " + key + " failed");
    }
    state->done.store(true, std::memory_order_release);
  });
  return true;
}

BackgroundState BackgroundCompiles::state(const std::string& key) const {
  std::lock_guard lock(mutex_);
  const auto found = jobs_.find(key);
  if (found == jobs_.end()) return BackgroundState::none;
  return found->second->done.load(std::memory_order_acquire) ? BackgroundState::done : BackgroundState::running;
}

void BackgroundCompiles::mark_done(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto& slot = jobs_[key];
  if (!slot) {
    slot = std::make_shared<Job>();
    slot->done.store(true, std::memory_order_release);
  }
}

void BackgroundCompiles::wait_all() {
  std::vector<std::thread> running;
  {
    std::lock_guard lock(mutex_);
    running.swap(threads_);
  }
  for (std::thread& thread : running)
    if (thread.joinable()) thread.join();
}

int BackgroundCompiles::started() const {
  std::lock_guard lock(mutex_);
  return started_;
}

bool background_compile_enabled() {
  const char* env = std::getenv("LADLE_BACKGROUND_COMPILE");
  if (!env || !*env) return true;
  const std::string_view value(env);
  if (value == "1") return true;
  if (value == "0") return false;
  throw InvalidArgument("LADLE_BACKGROUND_COMPILE='" + std::string(value) + "': expected 1 (a cold call runs an interim kernel while its kernels compile) or 0 (it waits for them)");
}

void finish_background_compiles() { BackgroundCompiles::global().wait_all(); }

}  // namespace ladle
