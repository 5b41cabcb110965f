#include "interim.h"

#include <algorithm>
#include <exception>

#include <fmt/format.h>
#include <ladle/runtime/background.h>
#include <ladle/runtime/cache.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/log.h>

namespace ladle::gpu::detail {

bool interim(const RunOptions& options, const std::string& job, const std::string& arch,
             const std::function<std::vector<GeneratedKernel>()>& programs, const LaunchOptions& launch, const char* what) {
  if (options.algorithm != Algorithm::automatic || options.chunked_tile || !background_compile_enabled() ||
      !DiskCache::global().enabled())
    return false;
  BackgroundCompiles& jobs = BackgroundCompiles::global();
  const BackgroundState state = jobs.state(job);
  if (state == BackgroundState::done) return false;
  const bool capturing = launch.stream ? launch.stream->capturing() : Stream::borrowed(nullptr).capturing();
  if (capturing) {
    if (state == BackgroundState::running) jobs.wait_all();
    return false;
  }
  if (state == BackgroundState::running) return true;
  std::vector<GeneratedKernel> planned;
  try {
    planned = programs();
  } catch (const std::exception&) {
    planned.clear();  // the chosen form runs, and reports it
  }
  const bool compiled = std::all_of(planned.begin(), planned.end(), [&](const GeneratedKernel& k) { return is_compiled(k, arch); });
  if (compiled) {
    jobs.mark_done(job);
    return false;
  }
  log::debug(fmt::format("{} program(s) of a call compile in the background; {} runs the call meanwhile", planned.size(), what));
  jobs.start(job, [planned = std::move(planned), arch] { compile_side_by_side(planned, arch); });
  return true;
}

}  // namespace ladle::gpu::detail
