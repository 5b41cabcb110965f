// How every example ends: one line saying it runs on the CPU where there is no driver (why, in a
// few words), the run, then one verdict line, `<name>: ok`, or `<name>: FAILED (why)` and exit
// status 1 (an error's first line there, the whole message on stderr).
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include <ladle/runtime/driver.h>

namespace example {

// run() returns "" when everything it checked holds, else what did not. on_cpu: how the CPU line starts.
inline int report(const char* name, const std::function<std::string()>& run, const char* on_cpu = "running on the CPU") {
  if (!ladle::driver_available()) std::printf("%s: %s\n", on_cpu, ladle::driver_unavailable_summary().c_str());
  std::string failure;
  try {
    failure = run();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    failure = what.substr(0, what.find('\n'));  // the verdict stays one line
    if (failure != what) std::fprintf(stderr, "%s\n", what.c_str());
  }
  if (failure.empty()) {
    std::printf("%s: ok\n", name);
    return 0;
  }
  std::printf("%s: FAILED (%s)\n", name, failure.c_str());
  return 1;
}

}  // namespace example
