// ptxas' verbose report, as NVRTC returns it in the program log, is the only source of
// resource usage that needs no driver, so the CPU-only CI machine can check it too.
#include <regex>
#include <sstream>

#include "compiler.h"

namespace ladle {

std::vector<KernelResources> parse_ptxas_info(const std::string& log) {
  static const std::regex entry(R"(Compiling entry function '([^']+)')");
  static const std::regex properties(R"(Function properties for ([^\s]+))");
  static const std::regex frame(
      R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex used(R"(Used (\d+) registers)");
  static const std::regex barriers(R"(used (\d+) barriers)");
  static const std::regex smem(R"((\d+) bytes smem)");
  static const std::regex cmem(R"((\d+) bytes cmem\[0\])");

  std::vector<KernelResources> kernels;
  KernelResources* current = nullptr;
  auto find = [&](const std::string& name) -> KernelResources* {
    for (auto& k : kernels)
      if (k.name == name) return &k;
    kernels.push_back(KernelResources{});
    kernels.back().name = name;
    return &kernels.back();
  };
  std::istringstream lines(log);
  std::string line;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, m, entry)) {
      current = find(m[1]);
    } else if (std::regex_search(line, m, properties)) {
      current = find(m[1]);
    } else if (current && std::regex_search(line, m, frame)) {
      current->stack_frame_bytes = std::stoi(m[1]);
      current->spill_store_bytes = std::stoi(m[2]);
      current->spill_load_bytes = std::stoi(m[3]);
    } else if (current && std::regex_search(line, m, used)) {
      current->registers = std::stoi(m[1]);
      if (std::regex_search(line, m, barriers)) current->barriers = std::stoi(m[1]);
      if (std::regex_search(line, m, smem)) current->shared_bytes = std::stoi(m[1]);
      if (std::regex_search(line, m, cmem)) current->constant_bytes = std::stoi(m[1]);
    }
  }
  // "Function properties" also names device functions that are not entries; keep entries
  // (those with a register count).
  std::erase_if(kernels, [](const KernelResources& k) { return k.registers < 0; });
  return kernels;
}

const KernelResources* CompiledProgram::resources(const std::string& kernel_name) const {
  for (const auto& k : kernels)
    if (k.name == kernel_name) return &k;
  return nullptr;
}

}  // namespace ladle
