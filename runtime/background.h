// Compiles that run behind the caller. A GPU call whose fastest kernels are neither loaded nor in the
// compile cache starts their compile here and runs a kernel that compiles in a fraction of the time
// meanwhile (the fused recurrent one; ops/gpu_recurrent.cpp, docs/caches.md "A first call"); the
// calls after it take the fast kernels once they are ready.
//   ladle::finish_background_compiles();  // before timing: every started compile has ended
// LADLE_BACKGROUND_COMPILE=0 turns this off: a cold call then waits for its own kernels.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ladle {

enum class BackgroundState { none, running, done };

class BackgroundCompiles {
 public:
  // The process's jobs. Its jobs are waited for at exit, before the compile cache is destroyed, so
  // that a program which returns during a compile neither crashes nor loses the cache entry.
  static BackgroundCompiles& global();

  BackgroundCompiles() = default;
  BackgroundCompiles(const BackgroundCompiles&) = delete;
  BackgroundCompiles& operator=(const BackgroundCompiles&) = delete;
  ~BackgroundCompiles();  // waits for every job

  // Runs job on a thread of its own under key, unless a job under key runs or ran: returns whether
  // it started one. A job's exception is logged (debug) and dropped: the caller's foreground compile
  // of the same program reports it where it launches.
  bool start(const std::string& key, std::function<void()> job);
  // What was started under key: none, running or done (ended, with or without an error).
  BackgroundState state(const std::string& key) const;
  // Records key as done without running anything (its programs were found compiled).
  void mark_done(const std::string& key);
  // Waits for every job started before the call.
  void wait_all();
  // Jobs started since the process began (by this object).
  int started() const;

 private:
  struct Job;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::vector<std::thread> threads_;
  int started_ = 0;
};

// LADLE_BACKGROUND_COMPILE: unset, empty or "1": on; "0": off (anything else throws InvalidArgument
// naming the variable). Read on every call.
bool background_compile_enabled();

// Waits until every compile started behind a call has ended (BackgroundCompiles::global().wait_all()):
// benchmarks call it before they time, so that they time the fast kernels, not the interim one.
void finish_background_compiles();

}  // namespace ladle
