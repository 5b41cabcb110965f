// ladle-dump: shows everything ladle generates for a kernel: the CUDA source, the PTX,
// the resource usage ptxas reported, the cache entry, and the SASS when cuobjdump exists.
//   ladle-dump kernel.cu [--arch sm_90a] [--sass] [--only source|ptx|resources]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

namespace fs = std::filesystem;

namespace {

std::string find_cuobjdump() {
  if (const char* home = std::getenv("CUDA_HOME")) {
    fs::path p = fs::path(home) / "bin" / "cuobjdump";
    if (fs::exists(p)) return p.string();
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && fs::exists(fs::path(dir) / "cuobjdump")) return (fs::path(dir) / "cuobjdump").string();
  }
  if (fs::exists("/usr/local/cuda/bin/cuobjdump")) return "/usr/local/cuda/bin/cuobjdump";
  return "";
}

std::string run_capture(const std::string& command) {
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    ::pclose(pipe);
  }
  return out;
}

void section(const std::string& title) { std::cout << fmt::format("\n===== {} =====\n", title); }

void print_resources(const ladle::CompiledProgram& program) {
  std::cout << fmt::format("{:<40} {:>5} {:>7} {:>7} {:>7} {:>8} {:>6}\n", "kernel", "regs",
                           "stack", "spill-st", "spill-ld", "smem", "cmem");
  for (const auto& k : program.kernels) {
    if (k.registers < 0) {
      std::cout << fmt::format("{:<40} (PTX only: compile for a real arch, e.g. --arch sm_90a, "
                               "for resource usage)\n", k.name);
      continue;
    }
    std::cout << fmt::format("{:<40} {:>5} {:>7} {:>7} {:>7} {:>8} {:>6}\n", k.name, k.registers,
                             k.stack_frame_bytes, k.spill_store_bytes, k.spill_load_bytes,
                             k.shared_bytes, k.constant_bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-dump: the CUDA source, PTX, resource usage and SASS of a kernel"};
  std::string file, arch, only;
  std::vector<std::string> defines;
  bool sass = false;
  app.add_option("file", file, "a CUDA C++ source file (.cu)")->required()->check(CLI::ExistingFile);
  app.add_option("--arch", arch,
                 "target, e.g. sm_90a or compute_80 (default: this GPU, else sm_80)");
  app.add_option("-D,--define", defines, "preprocessor definitions passed to NVRTC (NAME=VALUE)");
  app.add_flag("--sass", sass, "also disassemble the cubin with cuobjdump");
  app.add_option("--only", only, "print one part only")
      ->check(CLI::IsMember({"source", "ptx", "resources", "path"}));
  CLI11_PARSE(app, argc, argv);

  try {
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    ladle::CompileOptions options;
    options.arch = arch;
    options.program_name = fs::path(file).filename().string();
    for (const auto& d : defines) options.flags.push_back("-D" + d);
    const ladle::CompiledProgram program = ladle::compile(text.str(), options);

    auto want = [&](const char* part) { return only.empty() || only == part; };
    if (want("source")) {
      section("source");
      std::cout << program.source;
    }
    if (want("ptx")) {
      section(fmt::format("PTX ({})", program.arch));
      std::cout << program.ptx;
    }
    if (want("resources")) {
      section("resource usage");
      print_resources(program);
    }
    if (want("path")) {
      section("cache");
      std::cout << fmt::format("key:   {}\nentry: {}\nhit:   {}\noptions:", program.key,
                               program.entry_path.empty() ? "(memory only)" : program.entry_path,
                               program.from_cache ? "yes" : "no (compiled now)");
      for (const auto& o : program.options) std::cout << ' ' << o;
      std::cout << '\n';
    }
    if (sass) {
      section("SASS");
      const std::string tool = find_cuobjdump();
      if (program.cubin.empty()) {
        std::cout << "(no cubin: compile for a real arch, e.g. --arch sm_90a)\n";
      } else if (tool.empty()) {
        std::cout << "(cuobjdump not found on PATH or in $CUDA_HOME/bin)\n";
      } else {
        fs::path cubin = fs::temp_directory_path() / ("ladle-dump-" + program.key + ".cubin");
        std::ofstream(cubin, std::ios::binary) << program.cubin;
        std::cout << run_capture(fmt::format("'{}' -sass '{}' 2>&1", tool, cubin.string()));
        fs::remove(cubin);
      }
    }
    if (!ladle::driver_available())
      std::cerr << "ladle-dump: " << ladle::driver_unavailable_reason() << "\n";
  } catch (const ladle::CompileError& e) {
    std::cerr << e.what() << "\n--- full NVRTC log ---\n" << e.log() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ladle-dump: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
