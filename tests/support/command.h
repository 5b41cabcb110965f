// Runs a shell command as a user would and returns what it printed (stdout and stderr, when the
// command redirects 2>&1) and its exit status: the tool tests run ladle-dump and ladle-cache so.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <utility>

namespace ladle::test {

inline std::pair<std::string, int> run_command(const std::string& command) {
  std::string out;
  int status = -1;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    status = ::pclose(pipe);
  }
  return {out, status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace ladle::test
