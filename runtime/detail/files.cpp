#include "files.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "../error.h"

namespace fs = std::filesystem;

namespace ladle::detail {

std::optional<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(out).str();
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw Error(fmt::format("cache: could not write '{}'", path.string()));
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  const fs::path temp =
      path.parent_path() / (".tmp-" + path.filename().string() + "-" + unique_suffix());
  std::error_code ec;
  try {
    write_file(temp, bytes);
  } catch (...) {
    fs::remove(temp, ec);
    throw;
  }
  fs::rename(temp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw Error(fmt::format("cache: could not rename '{}' to '{}': {}", temp.string(),
                            path.string(), ec.message()));
  }
}

std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  return fmt::format("{}-{}-{}", ::getpid(),
                     std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000,
                     counter.fetch_add(1));
}

bool is_writable_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return false;
  const fs::path probe = dir / (".probe-" + unique_suffix());
  std::ofstream out(probe);
  out << "ladle";
  out.close();
  const bool writable = static_cast<bool>(out);
  fs::remove(probe, ec);
  return writable;
}

}  // namespace ladle::detail
