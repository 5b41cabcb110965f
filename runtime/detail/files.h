// Small file helpers shared by the compile cache and the tuned-config cache, so that both
// follow one set of rules (docs/caches.md): a reader never sees a torn file, a
// directory is judged writable by writing to it. Internal: not installed.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace ladle::detail {

// The whole file, or nullopt when it cannot be opened or read.
std::optional<std::string> read_file(const std::filesystem::path& path);

// Writes (truncating) in place; throws ladle::Error naming the path on failure. Use only for
// files nobody else can see yet (inside a private temporary directory).
void write_file(const std::filesystem::path& path, std::string_view bytes);

// Writes to a temporary file beside `path` and renames it over `path`: a concurrent reader
// (another thread or process) sees the old file or the new one, never a part. The temporary
// is named ".tmp-<name>-<unique>" so that cache clean-ups recognise it. Throws ladle::Error.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

// A name no other process or thread will pick, for temporary and trash files.
std::string unique_suffix();

// Creates `dir` if needed and writes a probe file into it. Permissions alone don't tell
// (root, read-only mounts, ACLs).
bool is_writable_directory(const std::filesystem::path& dir);

}  // namespace ladle::detail
