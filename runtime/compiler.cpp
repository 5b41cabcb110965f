#include "compiler.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "cache.h"
#include "detail/api.h"
#include "dump.h"
#include "driver.h"
#include "error.h"
#include "hash.h"
#include "log.h"

#ifndef LADLE_DEFAULT_CUDA_ROOT
#define LADLE_DEFAULT_CUDA_ROOT "/usr/local/cuda"
#endif

namespace ladle {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// "sm_90a", "sm_80", "compute_90a": the forms NVRTC's -arch accepts.
void check_arch(const std::string& arch) {
  static const std::regex pattern(R"((sm|compute)_\d{2,3}[af]?)");
  if (!std::regex_match(arch, pattern)) {
    throw InvalidArgument(fmt::format(
        "compile: arch '{}' is not a CUDA target; expected sm_NN[a] (PTX and cubin) or "
        "compute_NN[a] (PTX only), e.g. sm_90a",
        arch));
  }
}

bool is_real_arch(const std::string& arch) { return arch.rfind("sm_", 0) == 0; }

std::string resolve_arch(const CompileOptions& options) {
  if (!options.arch.empty()) {
    check_arch(options.arch);
    return options.arch;
  }
  if (driver_available()) return Device::get(0).properties().arch();
  return default_ptx_arch();
}

// NVRTC finds cuda_fp16.h and friends through the toolkit's include directory.
std::vector<std::string> toolkit_include_flags() {
  std::vector<std::string> flags;
  const char* roots[] = {std::getenv("CUDA_HOME"), LADLE_DEFAULT_CUDA_ROOT, "/usr/local/cuda"};
  for (const char* root : roots) {
    if (!root) continue;
    std::filesystem::path include = std::filesystem::path(root) / "include";
    std::error_code ec;
    if (std::filesystem::exists(include / "cuda_fp16.h", ec)) {
      flags.push_back("-I" + include.string());
      break;
    }
  }
  return flags;
}

// Kernel names from PTX when there is no ptxas report (virtual targets).
std::vector<KernelResources> entries_from_ptx(const std::string& ptx) {
  static const std::regex entry(R"(\.entry\s+([A-Za-z_$][\w$]*))");
  std::vector<KernelResources> kernels;
  for (std::sregex_iterator it(ptx.begin(), ptx.end(), entry), end; it != end; ++it) {
    KernelResources k;
    k.name = (*it)[1];
    kernels.push_back(k);
  }
  return kernels;
}

struct ProgramHandle {
  nvrtcProgram program = nullptr;
  ~ProgramHandle() {
    if (program) detail::nvrtc().nvrtcDestroyProgram(&program);
  }
};

std::string head_of(const std::string& log, int lines) {
  std::string out;
  int n = 0;
  for (char c : log) {
    out += c;
    if (c == '\n' && ++n == lines) {
      out += "...\n";
      break;
    }
  }
  return out;
}

CompiledProgram run_nvrtc(const std::string& source, const CompileOptions& options,
                          const std::string& arch, const std::vector<std::string>& flags,
                          const std::string& key, DiskCache& cache) {
  const auto& api = detail::nvrtc();
  const auto start = Clock::now();
  std::vector<const char*> header_sources, header_names;
  for (const auto& [name, text] : options.headers) {
    header_names.push_back(name.c_str());
    header_sources.push_back(text.c_str());
  }
  ProgramHandle handle;
  LADLE_NVRTC(api.nvrtcCreateProgram(&handle.program, source.c_str(), options.program_name.c_str(),
                                     static_cast<int>(header_sources.size()),
                                     header_sources.data(), header_names.data()));
  std::vector<const char*> argv;
  for (const auto& f : flags) argv.push_back(f.c_str());
  const nvrtcResult result =
      api.nvrtcCompileProgram(handle.program, static_cast<int>(argv.size()), argv.data());

  std::size_t log_size = 0;
  LADLE_NVRTC(api.nvrtcGetProgramLogSize(handle.program, &log_size));
  std::string log(log_size, '\0');
  if (log_size > 0) LADLE_NVRTC(api.nvrtcGetProgramLog(handle.program, log.data()));
  while (!log.empty() && log.back() == '\0') log.pop_back();

  if (result != NVRTC_SUCCESS) {
    const auto path = cache.failed_source_path(key);
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << source;
      for (const auto& [name, text] : options.headers)
        out << "\n// ---- in-memory header \"" << name << "\" ----\n" << text;
    }
    std::string command = "nvrtc";
    for (const auto& f : flags) command += " " + f;
    throw CompileError(
        fmt::format("NVRTC could not compile '{}' for {} ({}). Source written to {}\n"
                    "options: {}\n{}",
                    options.program_name, arch, api.nvrtcGetErrorString(result), path.string(),
                    command, head_of(log, 20)),
        log, path.string());
  }

  CompiledProgram program;
  program.key = key;
  program.source = source;
  program.arch = arch;
  program.options = flags;
  program.log = log;
  std::size_t ptx_size = 0;
  LADLE_NVRTC(api.nvrtcGetPTXSize(handle.program, &ptx_size));
  program.ptx.assign(ptx_size, '\0');
  LADLE_NVRTC(api.nvrtcGetPTX(handle.program, program.ptx.data()));
  while (!program.ptx.empty() && program.ptx.back() == '\0') program.ptx.pop_back();
  if (is_real_arch(arch)) {
    std::size_t cubin_size = 0;
    LADLE_NVRTC(api.nvrtcGetCUBINSize(handle.program, &cubin_size));
    program.cubin.assign(cubin_size, '\0');
    if (cubin_size) LADLE_NVRTC(api.nvrtcGetCUBIN(handle.program, program.cubin.data()));
    program.kernels = parse_ptxas_info(log);
    if (program.kernels.empty()) {
      // Some NVRTC builds return no ptxas report; ask the driver when the cubin is for
      // this very GPU. Spills then show as local memory (stack_frame_bytes).
      program.kernels = entries_from_ptx(program.ptx);
      if (driver_available() && Device::get().properties().arch() == arch) {
        Module module(program);
        for (auto& k : program.kernels) {
          Kernel function = module.kernel(k.name);
          k.registers = function.registers();
          k.stack_frame_bytes = function.local_bytes();
          k.shared_bytes = function.static_shared_bytes();
        }
      }
    }
  } else {
    program.kernels = entries_from_ptx(program.ptx);
  }
  program.compile_ms = ms_since(start);
  return program;
}

// The NVRTC version for the cache key, without opening NVRTC when an earlier process
// already recorded the version of this exact library file (path, size, mtime): opening
// libnvrtc costs ~8 ms, more than a whole warm kernel load.
std::string nvrtc_version_for_key(DiskCache& cache) {
  static std::mutex mutex;
  static std::string remembered;
  std::lock_guard lock(mutex);
  if (!remembered.empty()) return remembered;
  const std::string file = detail::nvrtc_library_file();
  std::error_code ec;
  const auto canonical = file.empty() ? std::filesystem::path() : std::filesystem::canonical(file, ec);
  static const std::regex version_pattern(R"(\d+\.\d+)");
  // No NVRTC here: a cache built ahead of time (ladle-cache prebuild) says which NVRTC built its
  // entries, so that a deployment without NVRTC still finds them (a miss then needs NVRTC).
  if ((file.empty() || ec) && cache.disk_readable())
    if (auto shipped = cache.read_note("nvrtc-version"); shipped && std::regex_match(*shipped, version_pattern))
      return remembered = *shipped;
  if (file.empty() || ec || !cache.disk_readable()) return remembered = nvrtc_version();
  const auto size = std::filesystem::file_size(canonical, ec);
  const auto mtime = std::filesystem::last_write_time(canonical, ec).time_since_epoch().count();
  if (ec) return remembered = nvrtc_version();
  const std::string note =
      "nvrtc-" + content_hash(fmt::format("{}|{}|{}", canonical.string(), size, mtime)).substr(0, 16);
  if (auto known = cache.read_note(note); known && std::regex_match(*known, version_pattern)) {
    remembered = *known;
  } else {
    remembered = nvrtc_version();
    cache.write_note(note, remembered);
  }
  if (cache.read_note("nvrtc-version") != remembered) cache.write_note("nvrtc-version", remembered);
  return remembered;
}

}  // namespace

std::string nvrtc_version() {
  static const std::string version = [] {
    int major = 0, minor = 0;
    LADLE_NVRTC(detail::nvrtc().nvrtcVersion(&major, &minor));
    return fmt::format("{}.{}", major, minor);
  }();
  return version;
}

std::string default_ptx_arch() { return "sm_80"; }

std::vector<std::string> nvrtc_supported_arches() {
  const auto& api = detail::nvrtc();
  int count = 0;
  LADLE_NVRTC(api.nvrtcGetNumSupportedArchs(&count));
  std::vector<int> arches(static_cast<std::size_t>(count));
  LADLE_NVRTC(api.nvrtcGetSupportedArchs(arches.data()));
  std::vector<std::string> names;
  for (int a : arches) {
    names.push_back(fmt::format("sm_{}", a));
    if (a == 90 || a == 100 || a == 120) names.push_back(fmt::format("sm_{}a", a));
  }
  return names;
}

CompiledProgram compile(const std::string& source, const CompileOptions& options) {
  return compile(source, options, DiskCache::global());
}

namespace {

// The NVRTC options and the cache key compile() uses for (source, options): arch, flags and key.
struct Keyed {
  std::string arch;
  std::vector<std::string> flags;
  std::string key;
};
Keyed keyed(const std::string& source, const CompileOptions& options, DiskCache& cache) {
  if (source.empty()) throw InvalidArgument("compile: source is empty");
  Keyed out;
  out.arch = resolve_arch(options);
  const std::string& arch = out.arch;
  std::vector<std::string>& flags = out.flags;
  flags = {"-arch=" + arch, "-std=c++17", "-default-device"};
  if (is_real_arch(arch)) flags.push_back("-Xptxas=-v");
  for (auto& f : toolkit_include_flags()) flags.push_back(std::move(f));
  for (const auto& f : options.flags) flags.push_back(f);
  // LADLE_NVRTC_FLAGS: options for every compile of the process (part of the key), e.g. -lineinfo for
  // Nsight Compute's source view. Words split at white space; each must be an option.
  if (const char* extra = std::getenv("LADLE_NVRTC_FLAGS"); extra && *extra) {
    std::istringstream words(extra);
    for (std::string word; words >> word;) {
      if (word.front() != '-')
        throw InvalidArgument("LADLE_NVRTC_FLAGS: '" + word + "' is not an NVRTC option (expected words such as -lineinfo)");
      flags.push_back(word);
    }
  }
  // The key covers in-memory headers too: they are part of what gets compiled.
  std::string keyed_source = source;
  for (const auto& [name, text] : options.headers)
    keyed_source += "\n//@header " + name + "\n" + text;
  out.key = DiskCache::make_key(keyed_source, flags, arch, nvrtc_version_for_key(cache));
  return out;
}

}  // namespace

bool is_compiled(const std::string& source, const CompileOptions& options) {
  return is_compiled(source, options, DiskCache::global());
}

bool is_compiled(const std::string& source, const CompileOptions& options, DiskCache& cache) {
  if (source.empty()) throw InvalidArgument("is_compiled: source is empty");
  if (!options.use_cache || !cache.enabled()) return false;
  return cache.lookup(keyed(source, options, cache).key).has_value();
}

namespace {

// The cached compiles in flight, by key: a caller that asks for a program another thread is compiling
// (a cold call's interim programs beside its background job, which share the update forms' slots and
// chain; side-by-side compiles of one plan) waits for that compile instead of running NVRTC again.
struct InFlight {
  std::mutex mutex;
  std::map<std::string, std::shared_future<CompiledProgram>> running;
};

InFlight& in_flight() {
  static auto* const state = new InFlight();  // never destroyed: background compiles may outlive statics
  return *state;
}

}  // namespace

CompiledProgram compile(const std::string& source, const CompileOptions& options,
                        DiskCache& cache) {
  const auto start = Clock::now();
  const auto [arch, flags, key] = keyed(source, options, cache);

  if (!options.use_cache) {
    CompiledProgram program = run_nvrtc(source, options, arch, flags, key, cache);
    log::debug(fmt::format("compiled {} for {} in {:.1f} ms", options.program_name, arch, program.compile_ms));
    dump_program(program, options.program_name);
    return program;
  }
  if (auto hit = cache.lookup(key)) {
    hit->from_cache = true;
    hit->compile_ms = ms_since(start);
    dump_program(*hit, options.program_name);
    return *std::move(hit);
  }
  InFlight& flights = in_flight();
  std::promise<CompiledProgram> promise;
  // Per cache: a program compiled for another cache would not be stored in this one.
  const std::string flight = key + "@" + std::to_string(reinterpret_cast<std::uintptr_t>(&cache));
  {
    std::unique_lock lock(flights.mutex);
    if (const auto found = flights.running.find(flight); found != flights.running.end()) {
      const std::shared_future<CompiledProgram> other = found->second;
      lock.unlock();
      CompiledProgram program = other.get();  // its error, if it failed: the same source's
      program.from_cache = true;              // compiled once, by the other caller
      program.compile_ms = ms_since(start);
      return program;
    }
    flights.running.emplace(flight, promise.get_future().share());
  }
  const auto landed = [&] {
    const std::lock_guard lock(flights.mutex);
    flights.running.erase(flight);
  };
  try {
    CompiledProgram program = run_nvrtc(source, options, arch, flags, key, cache);
    log::debug(fmt::format("compiled {} for {} in {:.1f} ms", options.program_name, arch, program.compile_ms));
    program.entry_path = cache.store(program);
    dump_program(program, options.program_name);
    promise.set_value(program);
    landed();
    return program;
  } catch (...) {
    promise.set_exception(std::current_exception());
    landed();
    throw;
  }
}

}  // namespace ladle
