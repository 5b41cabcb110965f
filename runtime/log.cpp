#include "log.h"

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>

namespace ladle::log {

Level threshold() {
  static const Level level = [] {
    const char* env = std::getenv("LADLE_LOG");
    if (!env) return Level::info;
    std::string v(env);
    if (v == "debug") return Level::debug;
    if (v == "info") return Level::info;
    if (v == "warn" || v == "warning") return Level::warn;
    if (v == "error" || v == "quiet") return Level::error;
    std::cerr << "ladle [warn] LADLE_LOG='" << v
              << "' is not one of debug|info|warn|error; using info\n";
    return Level::info;
  }();
  return level;
}

bool enabled(Level level) { return static_cast<int>(level) >= static_cast<int>(threshold()); }

void write(Level level, std::string_view message) {
  if (!enabled(level)) return;
  static std::mutex mutex;
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard lock(mutex);
  std::cerr << "ladle [" << names[static_cast<int>(level)] << "] " << message << '\n';
}

}  // namespace ladle::log
