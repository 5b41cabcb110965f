// LADLE_DUMP and set_dump_directory (runtime/dump.h): every compile, a miss or a hit, leaves its
// source, PTX and resources in the dump directory.
#include <ladle/runtime/cache.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/dump.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kernels.h"
#include "scoped_env.h"
#include "temp_dir.h"

using namespace ladle;

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Turns the call's directory off again when a test ends, whatever it asserted.
struct DumpOff {
  ~DumpOff() { set_dump_directory({}); }
};

}  // namespace

TEST_CASE(
    "set_dump_directory writes the source, PTX and resources of a compiled kernel, named after its "
    "key") {
  test::TempDir cache_dir, dump_dir;
  DiskCache cache(DiskCache::Settings::at(cache_dir.path()));
  const test::ScopedEnv no_env("LADLE_DUMP", nullptr);
  const DumpOff off;
  set_dump_directory(dump_dir.path() / "kernels");
  REQUIRE(dump_directory() == dump_dir.path() / "kernels");
  CompileOptions options;
  options.arch = "sm_90a";
  options.program_name = "vector_add.cu";
  const CompiledProgram program = compile(test::vector_add_source, options, cache);
  REQUIRE_FALSE(program.from_cache);
  REQUIRE(dump_program(program, options.program_name, 4096).filename().string() == dump_name(program, options.program_name) + ".cu");

  const std::filesystem::path base =
      dump_dir.path() / "kernels" / dump_name(program, options.program_name);
  REQUIRE(base.filename().string() == "vector_add." + program.key.substr(0, 16));
  REQUIRE(read(base.string() + ".cu") == program.source);
  REQUIRE(read(base.string() + ".ptx").find(".entry vector_add") != std::string::npos);
  const auto resources = nlohmann::json::parse(read(base.string() + ".json"));
  REQUIRE(resources.at("key") == program.key);
  REQUIRE(resources.at("arch") == "sm_90a");
  REQUIRE(resources.at("from_cache") == false);
  REQUIRE(resources.at("kernels").size() == 1);
  const auto& kernel = resources.at("kernels")[0];
  REQUIRE(kernel.at("name") == "vector_add");
  REQUIRE(kernel.at("registers").get<int>() == program.kernels[0].registers);
  REQUIRE(kernel.at("registers").get<int>() > 0);
  REQUIRE(kernel.at("static_shared_bytes").get<int>() == program.kernels[0].shared_bytes);
  REQUIRE(kernel.at("dynamic_shared_bytes").get<int>() == 4096);  // the caller's figure, over compile's null
}

TEST_CASE("a cache hit is dumped too, and LADLE_DUMP chooses the directory when no call did") {
  test::TempDir cache_dir, first_dir, env_dir;
  DiskCache cache(DiskCache::Settings::at(cache_dir.path()));
  const DumpOff off;
  CompileOptions options;
  options.arch = "sm_80";
  options.program_name = "block_sum.cu";
  const test::ScopedEnv env("LADLE_DUMP", env_dir.path().c_str());
  set_dump_directory(first_dir.path());
  const CompiledProgram miss = compile(test::block_sum_source, options, cache);
  REQUIRE(
      std::filesystem::exists(first_dir.path() / (dump_name(miss, options.program_name) + ".cu")));
  REQUIRE(
      std::filesystem::is_empty(env_dir.path()));  // the call's directory wins over the variable

  set_dump_directory({});  // back to LADLE_DUMP
  REQUIRE(dump_directory() == env_dir.path());
  const CompiledProgram hit = compile(test::block_sum_source, options, cache);
  REQUIRE(hit.from_cache);
  const std::filesystem::path base = env_dir.path() / dump_name(hit, options.program_name);
  REQUIRE(read(base.string() + ".cu").find("block_sum") != std::string::npos);
  REQUIRE(read(base.string() + ".ptx").find(".entry block_sum") != std::string::npos);
  const auto resources = nlohmann::json::parse(read(base.string() + ".json"));
  REQUIRE(resources.at("from_cache") == true);
  REQUIRE(resources.at("kernels")[0].at("name") == "block_sum");
  REQUIRE(
      resources.at("kernels")[0].at("dynamic_shared_bytes").is_null());  // not known to this caller
}

TEST_CASE("without LADLE_DUMP or a call nothing is dumped") {
  const test::ScopedEnv no_env("LADLE_DUMP", nullptr);
  set_dump_directory({});
  REQUIRE(dump_directory().empty());
  test::TempDir cache_dir;
  DiskCache cache(DiskCache::Settings::at(cache_dir.path()));
  CompileOptions options;
  options.arch = "compute_80";
  REQUIRE(
      dump_program(compile(test::vector_add_source, options, cache), options.program_name).empty());
}
