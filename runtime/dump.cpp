#include "dump.h"

#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <optional>

#include "compiler.h"
#include "detail/files.h"
#include "log.h"

namespace ladle {
namespace {

std::mutex& dump_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::optional<std::filesystem::path>& chosen_directory() {
  static std::optional<std::filesystem::path> dir;
  return dir;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    else
      out += c;
  }
  return out + "\"";
}

std::string resources_json(const CompiledProgram& program, const std::string& program_name,
                           int dynamic_shared_bytes) {
  std::string out = fmt::format(
      "{{\n  \"program\": {},\n  \"key\": {},\n  \"arch\": {},\n  \"from_cache\": {},\n  "
      "\"kernels\": [",
      json_string(program_name), json_string(program.key), json_string(program.arch),
      program.from_cache ? "true" : "false");
  for (std::size_t i = 0; i < program.kernels.size(); ++i) {
    const KernelResources& k = program.kernels[i];
    const std::string dynamic =
        dynamic_shared_bytes >= 0 ? std::to_string(dynamic_shared_bytes) : "null";
    out += fmt::format(
        "{}\n    {{\"name\": {}, \"registers\": {}, \"stack_frame_bytes\": {}, "
        "\"spill_store_bytes\": {}, "
        "\"spill_load_bytes\": {}, \"static_shared_bytes\": {}, \"dynamic_shared_bytes\": {}, "
        "\"constant_bytes\": {}}}",
        i ? "," : "", json_string(k.name), k.registers, k.stack_frame_bytes, k.spill_store_bytes,
        k.spill_load_bytes, k.shared_bytes, dynamic, k.constant_bytes);
  }
  return out + "\n  ]\n}\n";
}

}  // namespace

void set_dump_directory(const std::filesystem::path& dir) {
  std::lock_guard lock(dump_mutex());
  if (dir.empty())
    chosen_directory().reset();
  else
    chosen_directory() = dir;
}

std::filesystem::path dump_directory() {
  {
    std::lock_guard lock(dump_mutex());
    if (chosen_directory()) return *chosen_directory();
  }
  const char* env = std::getenv("LADLE_DUMP");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path();
}

std::string dump_name(const CompiledProgram& program, const std::string& program_name) {
  const std::string stem = std::filesystem::path(program_name).stem().string();
  return (stem.empty() ? std::string("program") : stem) + "." + program.key.substr(0, 16);
}

std::filesystem::path dump_program(const CompiledProgram& program, const std::string& program_name,
                                   int dynamic_shared_bytes) {
  const std::filesystem::path dir = dump_directory();
  if (dir.empty()) return {};
  const std::filesystem::path base = dir / dump_name(program, program_name);
  try {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw std::runtime_error(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
    detail::write_file_atomically(base.string() + ".cu", program.source);
    detail::write_file_atomically(base.string() + ".ptx", program.ptx);
    detail::write_file_atomically(base.string() + ".json",
                                  resources_json(program, program_name, dynamic_shared_bytes));
  } catch (const std::exception& e) {
    log::warn(
        fmt::format("LADLE_DUMP: {} not dumped to {}: {}", program_name, dir.string(), e.what()));
    return {};
  }
  return base.string() + ".cu";
}

}  // namespace ladle
