// Opens libnvrtc and libcuda at run time. Search order for NVRTC: $LADLE_NVRTC_LIBRARY,
// the soname of the toolkit ladle was built against, then libnvrtc.so in the default
// search path and under the CUDA root seen at build time ($CUDA_HOME overrides it).
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "error.h"
#include "log.h"
#include "detail/api.h"

#ifndef LADLE_DEFAULT_CUDA_ROOT
#define LADLE_DEFAULT_CUDA_ROOT "/usr/local/cuda"
#endif

namespace ladle::detail {
namespace {

#define LADLE_STRINGIFY_EXPANDED(x) LADLE_STRINGIFY(x)
#define LADLE_STRINGIFY(x) #x

struct Opened {
  void* handle = nullptr;
  std::string path;
  std::string errors;
};

Opened open_first(const std::vector<std::string>& candidates) {
  Opened result;
  for (const auto& candidate : candidates) {
    if (candidate.empty()) continue;
    dlerror();
    if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      result.handle = handle;
      result.path = candidate;
      return result;
    }
    const char* why = dlerror();
    result.errors += fmt::format("\n  {}: {}", candidate, why ? why : "not found");
  }
  return result;
}

template <class Fn>
void bind(void* handle, const char* expanded_name, const char* plain_name, Fn& slot,
          const std::string& library) {
  void* symbol = dlsym(handle, expanded_name);
  if (!symbol) symbol = dlsym(handle, plain_name);  // older library without the versioned name
  if (!symbol) {
    throw LibraryUnavailable(fmt::format("{} has no symbol {} (library too old for ladle?)",
                                         library, expanded_name));
  }
  slot = reinterpret_cast<Fn>(symbol);
}

std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> candidates;
  // An explicit choice is the only candidate: falling back would hide the user's mistake.
  if (const char* env = std::getenv("LADLE_NVRTC_LIBRARY"); env && *env) return {env};
  const std::string major = std::to_string(CUDA_VERSION / 1000);
  candidates.push_back("libnvrtc.so." + major);
  candidates.push_back("libnvrtc.so");
  std::vector<std::string> roots;
  if (const char* env = std::getenv("CUDA_HOME")) roots.emplace_back(env);
  roots.emplace_back(LADLE_DEFAULT_CUDA_ROOT);
  roots.emplace_back("/usr/local/cuda");
  for (const auto& root : roots) {
    for (const char* lib : {"lib64", "lib", "targets/x86_64-linux/lib"}) {
      candidates.push_back(fmt::format("{}/{}/libnvrtc.so.{}", root, lib, major));
      candidates.push_back(fmt::format("{}/{}/libnvrtc.so", root, lib));
    }
  }
  return candidates;
}

// The first candidate that exists as a file: LD_LIBRARY_PATH, then the toolkit roots, then
// the distribution's library directories. Opening exactly this file keeps the identity used
// for cache keys (nvrtc_library_file) and the library actually loaded the same.
std::string resolve_nvrtc_file() {
  std::vector<std::string> candidates = nvrtc_candidates();
  if (const char* env = std::getenv("LADLE_NVRTC_LIBRARY"); env && *env) return env;
  const std::string major = std::to_string(CUDA_VERSION / 1000);
  std::vector<std::string> dirs;
  if (const char* ld = std::getenv("LD_LIBRARY_PATH")) {
    std::string list = ld;
    for (std::size_t start = 0, end; start <= list.size(); start = end + 1) {
      end = list.find(':', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) dirs.push_back(list.substr(start, end - start));
    }
  }
  std::vector<std::string> files;
  for (const auto& dir : dirs) files.push_back(dir + "/libnvrtc.so." + major);
  for (const auto& c : candidates)
    if (c.find('/') != std::string::npos) files.push_back(c);
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"})
    files.push_back(std::string(dir) + "/libnvrtc.so." + major);
  for (const auto& f : files) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(f, ec)) return f;
  }
  return "";
}

}  // namespace

std::string nvrtc_library_file() {
  static const std::string file = resolve_nvrtc_file();
  return file;
}

const NvrtcApi& nvrtc() {
  static NvrtcApi api;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string resolved = nvrtc_library_file();
    Opened lib = open_first(resolved.empty() ? nvrtc_candidates() : std::vector{resolved});
    if (!lib.handle) {
      failure = "ladle could not open libnvrtc (the CUDA run-time compiler). Install the CUDA "
                "toolkit or set LADLE_NVRTC_LIBRARY to the library's path. Tried:" + lib.errors;
      return;
    }
    try {
#define LADLE_BIND(name) \
  bind(lib.handle, LADLE_STRINGIFY_EXPANDED(name), #name, api.name, lib.path);
      LADLE_NVRTC_FUNCTIONS(LADLE_BIND)
      api.library_path = lib.path;
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw LibraryUnavailable(failure);
  return api;
}

namespace {

// Why libcuda could not be used: the full message (with the paths tried), the same in one
// line, and whether the machine has no usable driver (rather than an old one).
struct DriverFailure {
  std::string message;
  std::string summary;
  bool no_driver = false;
};

// Opens libcuda, binds the table and runs cuInit(0); returns why that failed (an empty
// message when it did not).
DriverFailure load_driver(CudaApi& api) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("LADLE_CUDA_DRIVER_LIBRARY"); env && *env) {
    candidates.emplace_back(env);  // explicit: the only candidate
  } else {
    candidates.emplace_back("libcuda.so.1");
    candidates.emplace_back("libcuda.so");
  }
  Opened lib = open_first(candidates);
  if (!lib.handle) {
    return {
        "no CUDA driver: libcuda.so.1 could not be opened (no NVIDIA driver installed "
        "on this machine?); GPU execution is unavailable, the CPU path still works. Tried:" +
            lib.errors,
        fmt::format("no CUDA driver ({} could not be opened)", candidates.front()), true};
  }
  try {
    LADLE_CUDA_FUNCTIONS(LADLE_BIND)
#undef LADLE_BIND
    api.library_path = lib.path;
    CUresult init = api.cuInit(0);
    if (init != CUDA_SUCCESS) {
      const char* name = nullptr;
      api.cuGetErrorName(init, &name);
      const std::string error = name ? name : "unknown error";
      return {fmt::format("no CUDA driver: cuInit failed with {} ({}); no usable GPU", error,
                          static_cast<int>(init)),
              fmt::format("no usable GPU (cuInit failed with {})", error), true};
    }
  } catch (const Error& e) {
    return {e.what(), e.what(), false};  // bind's message is one line already
  }
  return {};
}

CudaApi& cuda_table() {
  static CudaApi api;
  return api;
}

// Loads the driver on first use; the same answer after that.
const DriverFailure& driver_failure() {
  static DriverFailure failure;
  static std::once_flag once;
  std::call_once(once, [] {
    CudaApi& api = cuda_table();
    failure = load_driver(api);
    // Only a path that runs something (or asks which GPU is here) opens the driver; the debug
    // line shows when that happens, so that compiling alone can be checked never to (ladle-dump
    // --arch: tests/tools).
    log::debug(failure.message.empty()
                   ? fmt::format("CUDA driver: opened {}", api.library_path)
                   : fmt::format("CUDA driver: not available: {}", failure.message));
  });
  return failure;
}

}  // namespace

const CudaApi& cuda() {
  const DriverFailure& failure = driver_failure();
  if (!failure.message.empty()) {
    if (failure.no_driver) throw NoCudaDriver(failure.message);
    throw LibraryUnavailable(failure.message);
  }
  return cuda_table();
}

std::string cuda_failure_summary() {
  return driver_failure().summary;
}

void check_cuda(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const auto& api = cuda();
  const char* name = nullptr;
  const char* text = nullptr;
  api.cuGetErrorName(result, &name);
  api.cuGetErrorString(result, &text);
  throw CudaError(fmt::format("CUDA driver call failed: {} returned {} ({})", call,
                              name ? name : "?", text ? text : "no description"),
                  static_cast<int>(result));
}

void check_nvrtc(nvrtcResult result, const char* call) {
  if (result == NVRTC_SUCCESS) return;
  throw Error(fmt::format("NVRTC call failed: {} returned {}", call,
                          nvrtc().nvrtcGetErrorString(result)));
}

}  // namespace ladle::detail
