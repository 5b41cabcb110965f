// Kernel dumps: every kernel a program compiles through ladle::compile, a cache hit or a miss,
// also written to a directory, in the manner of Triton's and NVRTC users' dump switches:
//   LADLE_DUMP=/tmp/kernels ./my_app           or   ladle::set_dump_directory("/tmp/kernels");
// Each compile writes three files named after the program and its cache key,
// <program>.<key prefix>.cu (the source), .ptx and .json (the target, the key, whether the cache
// held it, and per kernel: registers, stack, spills, static shared memory, the dynamic shared
// memory its launcher passes where known (null otherwise), constant memory). A directory that
// cannot be written is reported once per compile as a warning; the compile itself still succeeds.
#pragma once

#include <filesystem>
#include <string>

namespace ladle {

struct CompiledProgram;

// Dumps to `dir` (created when needed) from now on, for every thread; an empty path hands the
// choice back to the LADLE_DUMP environment variable (unset or empty: no dumps).
void set_dump_directory(const std::filesystem::path& dir);

// Where compiles are dumped now: set_dump_directory's path, else $LADLE_DUMP, else empty (off).
std::filesystem::path dump_directory();

// The base name a program's dump files share, without the directory or extension:
// "<program_name stem>.<first 16 hex digits of the cache key>".
std::string dump_name(const CompiledProgram& program, const std::string& program_name);

// Writes `program`'s three files into dump_directory() when it is set; returns the .cu file's
// path, or an empty path when dumps are off. dynamic_shared_bytes < 0: not known.
// ladle::compile calls it for every result; it is public for programs that compile elsewhere.
std::filesystem::path dump_program(const CompiledProgram& program, const std::string& program_name,
                                   int dynamic_shared_bytes = -1);

}  // namespace ladle
