// Kernels this process has compiled and loaded, by key: a repeated call of any GPU op skips
// source generation, the disk cache lookup and the module load. Shared by the GPU launchers
// of every kernel family (ops/gpu_*.cpp). Internal to ops (not installed).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <ladle/codegen/device/headers.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/dump.h>

namespace ladle::gpu::detail {

// A generated kernel's source compiled through the cache for `arch` (empty: this GPU, else the
// default target), named `name`.cu in NVRTC's log and the cache's manifest; dynamic_shared_bytes
// (what the launcher passes, -1: not known) goes into LADLE_DUMP's resources (compile dumps without it).
inline CompileOptions named_options(const std::string& source, const std::string& name, const std::string& arch) {
  CompileOptions options;
  options.arch = arch;
  options.program_name = name + ".cu";
  options.headers = device::headers_for(source);
  return options;
}

inline CompiledProgram compile_named(const std::string& source, const std::string& name, const std::string& arch,
                                     int dynamic_shared_bytes = -1) {
  const CompileOptions options = named_options(source, name, arch);
  CompiledProgram program = compile(source, options);
  if (dynamic_shared_bytes >= 0) dump_program(program, options.program_name, dynamic_shared_bytes);
  return program;
}

template <class Generated>
struct LoadedKernel {
  Generated kernel;
  std::unique_ptr<Module> module;
  std::optional<Kernel> function;
  std::optional<Kernel> merge;  // a second kernel of the same source (attention decode's merge_name)
};

// The loaded kernel for `key` (which must name everything the source depends on and the
// arch), compiling it with compile(arch) -> {kernel, program} on the first call. Kernels
// needing more than 48 KiB of dynamic shared memory get the opt-in raised once, here.
template <class Generated, class Compile>
const LoadedKernel<Generated>& loaded_kernel(const std::string& key, const std::string& arch, Compile compile) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<LoadedKernel<Generated>>> kernels;
  std::lock_guard lock(mutex);
  auto& slot = kernels[key + "|" + arch];
  if (!slot) {
    auto compiled = compile(arch);
    auto loaded = std::make_unique<LoadedKernel<Generated>>();
    loaded->kernel = std::move(compiled.kernel);
    loaded->module = std::make_unique<Module>(compiled.program);
    loaded->function.emplace(loaded->module->kernel(loaded->kernel.name));
    if constexpr (requires { loaded->kernel.merge_name; })
      if (!loaded->kernel.merge_name.empty()) loaded->merge.emplace(loaded->module->kernel(loaded->kernel.merge_name));
    if constexpr (requires { loaded->kernel.shared_bytes; })
      if (loaded->kernel.shared_bytes > 48 * 1024) loaded->function->set_max_dynamic_shared(loaded->kernel.shared_bytes);
    slot = std::move(loaded);
  }
  return *slot;
}

}  // namespace ladle::gpu::detail
