#include "target.h"

#include <map>
#include <mutex>
#include <regex>

#include <ladle/runtime/error.h>

namespace ladle::cuda {

const char* const Target::hopper = "sm_90a";

namespace {

Target parse(const std::string& arch) {
  Target t;
  t.arch = arch;
  if (arch.empty()) return t;
  static const std::regex pattern(R"((sm|compute)_(\d{2,3})([af]?))");
  std::smatch m;
  if (!std::regex_match(arch, m, pattern))
    throw InvalidArgument("target: arch '" + arch + "' is not a CUDA target; expected sm_NN[a] or compute_NN[a], e.g. sm_90a");
  t.version = std::stoi(m[2].str());
  t.arch_specific = m[3].str() == "a";
  t.mma_sync = t.version >= 80;
  t.tma = t.version >= 90;
  t.wgmma = t.version == 90 && t.arch_specific;
  // Opt-in shared memory per block (the CUDA C++ Programming Guide's table of compute capabilities).
  switch (t.version) {
    case 80: case 87: t.max_shared_bytes = 163 * 1024; break;
    case 86: case 89: case 120: t.max_shared_bytes = 99 * 1024; break;
    case 90: case 100: t.max_shared_bytes = 227 * 1024; break;
    default: break;
  }
  return t;
}

}  // namespace

// Memoised by arch: the launchers ask on every call, and the pattern match cost a chunked call's
// host time more than the rest of its target checks (bench/host-overhead.sh).
Target target(const std::string& arch) {
  static std::mutex mutex;
  static std::map<std::string, Target> parsed;
  {
    const std::lock_guard lock(mutex);
    if (const auto it = parsed.find(arch); it != parsed.end()) return it->second;
  }
  Target t = parse(arch);  // throws for a malformed arch, which is then not kept
  const std::lock_guard lock(mutex);
  return parsed.emplace(arch, std::move(t)).first->second;
}

bool has_wgmma(const std::string& arch) { return target(arch).wgmma; }

}  // namespace ladle::cuda
