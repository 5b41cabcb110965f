// What every example shares: its arguments, the kernels it shows, and how it ends: one line saying it runs on the CPU where there is no driver (why, in a
// few words), the run, then one verdict line, `<name>: ok`, or `<name>: FAILED (why)` and exit
// status 1 (an error's first line there, the whole message on stderr).
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include <ladle/ops/generated_kernels.h>
#include <ladle/runtime/driver.h>

#include <cstring>
#include <optional>

namespace example {

// The arguments an example takes: none, or (with_dump) `--dump`. Returns whether --dump was
// given, or nullopt after naming an unknown argument on stderr (main then exits with status 2).
inline std::optional<bool> parse_arguments(int argc, char** argv, const char* program, bool with_dump) {
  bool dump = false;
  for (int i = 1; i < argc; ++i) {
    if (!with_dump || std::strcmp(argv[i], "--dump") != 0) {
      std::fprintf(stderr, "%s: unknown argument '%s' (expected: %s)\n", program, argv[i],
                   with_dump ? "--dump" : "no arguments");
      return std::nullopt;
    }
    dump = true;
  }
  return dump;
}

// One line for `what`'s relative error against a plain loop; "" when it is under tolerance (NaN is
// not), else why not.
inline std::string check_error(const char* what, double error, double tolerance) {
  std::printf("%s on the %s: relative error %.3g against a plain loop (< %g)\n", what,
              ladle::driver_available() ? "GPU" : "CPU", error, tolerance);
  if (error < tolerance) return "";
  char why[128];
  std::snprintf(why, sizeof why, "relative error %.3g against the plain loop, expected < %g", error, tolerance);
  return why;
}

// The kernels a call of `variant` at `shape` launches on Hopper (ladle::generated_kernels: the
// launcher's own plan, no GPU needed), each compiled by NVRTC for sm_90a: one line each (lines of
// CUDA, PTX bytes, registers, spills), the source too with `dump`. Returns "" when each compiled to
// PTX with resources, else what did not.
template <class Variant, class Options>
std::string show_kernels(const Variant& variant, const ladle::CallShape& shape, const Options& options, bool dump) {
  for (const ladle::GeneratedKernel& kernel : ladle::generated_kernels(variant, shape, options, "sm_90a")) {
    const ladle::CompiledProgram program = ladle::compile_generated(kernel, "sm_90a");
    const ladle::KernelResources* r = program.resources(kernel.name);
    std::size_t lines = 0;
    for (const char c : kernel.source) lines += c == '\n' ? 1 : 0;
    std::printf("generated %s (%s): %zu lines of CUDA, %zu bytes of PTX, sm_90a cubin: %d registers, %d bytes spilled\n",
                kernel.name.c_str(), kernel.role.c_str(), lines, program.ptx.size(), r ? r->registers : -1,
                r ? r->spill_store_bytes : -1);
    if (dump) std::printf("%s\n", kernel.source.c_str());
    if (program.ptx.empty() || !r) return "NVRTC gave no PTX or no sm_90a resources for " + kernel.name;
  }
  return "";
}

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
