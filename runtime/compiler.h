// CUDA C++ source -> PTX (and cubin for a concrete arch) through NVRTC, loaded at run time,
// with every result kept in the disk cache (cache.h). This is the only place ladle calls NVRTC.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ladle {

class DiskCache;

// What ptxas reported for one kernel of a compiled program.
struct KernelResources {
  std::string name;          // the kernel's symbol (mangled if it is not extern "C")
  int registers = -1;        // per thread
  int stack_frame_bytes = 0; // per thread
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int shared_bytes = 0;      // static shared memory
  int constant_bytes = 0;    // cmem[0], kernel parameters and constants
  int barriers = 0;
};

struct CompileOptions {
  // Target: "sm_90a", "sm_80", ... A real arch yields PTX and a cubin; "compute_XX" yields
  // PTX only. Empty means: the current device's arch if a driver and GPU are present,
  // else PTX for default_ptx_arch().
  std::string arch;
  std::vector<std::string> flags;  // extra NVRTC options, e.g. "-DTILE=64", "--use_fast_math"
  // In-memory headers the source may #include, as (name, contents).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string program_name = "ladle_kernel.cu";
  bool use_cache = true;  // false: always compile (the cache is neither read nor written)
};

struct CompiledProgram {
  std::string key;          // cache key (hex), see DiskCache
  std::string source;
  std::string arch;         // the arch it was compiled for, e.g. "sm_90a" or "compute_80"
  std::vector<std::string> options;  // the NVRTC options actually passed
  std::string ptx;
  std::string cubin;        // empty for a virtual ("compute_XX") target
  std::string log;          // NVRTC's log (warnings, ptxas -v output)
  std::vector<KernelResources> kernels;
  bool from_cache = false;
  double compile_ms = 0;    // NVRTC time on a miss; lookup time on a hit
  std::string entry_path;   // the cache entry directory ("" when memory-only)

  const KernelResources* resources(const std::string& kernel_name) const;
};

// Compiles, or returns the cached result of an identical earlier compile. Throws
// CompileError (with the log and the path of the written source) when NVRTC rejects it,
// LibraryUnavailable when libnvrtc cannot be opened, InvalidArgument for a malformed arch.
CompiledProgram compile(const std::string& source, const CompileOptions& options = {});
CompiledProgram compile(const std::string& source, const CompileOptions& options, DiskCache& cache);
// Whether compile() would find this program in the cache (memory or disk) instead of running NVRTC:
// what a call checks before it decides to compile its kernels in the background (background.h).
// False where options.use_cache is off or the cache is disabled. Throws as compile() does for a
// malformed arch or an empty source.
bool is_compiled(const std::string& source, const CompileOptions& options = {});
bool is_compiled(const std::string& source, const CompileOptions& options, DiskCache& cache);

// "12.8", "13.0": the NVRTC that ladle opened (throws LibraryUnavailable if none).
std::string nvrtc_version();
// The arch used for PTX when no device and no arch are given.
std::string default_ptx_arch();
// The arches this NVRTC can target, e.g. {"sm_75", ..., "sm_90a", ...}.
std::vector<std::string> nvrtc_supported_arches();
// Parses ptxas' verbose output ("Used 32 registers, ...") into one record per kernel.
std::vector<KernelResources> parse_ptxas_info(const std::string& log);

}  // namespace ladle
