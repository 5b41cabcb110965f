// Diagnostics on stderr, filtered by LADLE_LOG=debug|info|warn|error (default info).
// Library code never prints to stdout: that belongs to the application.
#pragma once

#include <string_view>

namespace ladle::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

Level threshold();  // read once from LADLE_LOG
bool enabled(Level level);
void write(Level level, std::string_view message);

inline void debug(std::string_view m) { write(Level::debug, m); }
inline void info(std::string_view m) { write(Level::info, m); }
inline void warn(std::string_view m) { write(Level::warn, m); }

}  // namespace ladle::log
