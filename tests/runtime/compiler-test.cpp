#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <ladle/runtime/cache.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>

#include "kernels.h"
#include "scoped_env.h"
#include "temp_dir.h"

using namespace ladle;

TEST_CASE("a vector add compiles to PTX that holds its entry point") {
  test::TempDir dir;
  DiskCache cache(DiskCache::Settings::at(dir.path()));
  CompileOptions options;
  options.arch = "compute_80";
  auto program = compile(test::vector_add_source, options, cache);
  REQUIRE(program.ptx.find(".entry vector_add") != std::string::npos);
  REQUIRE(program.ptx.find(".target sm_80") != std::string::npos);
  REQUIRE(program.cubin.empty());  // a virtual target has no machine code
  REQUIRE(program.kernels.size() == 1);
  REQUIRE(program.kernels[0].name == "vector_add");
  REQUIRE_FALSE(program.from_cache);
}

TEST_CASE("a real arch yields PTX, a cubin and the resource usage of each kernel") {
  test::TempDir dir;
  DiskCache cache(DiskCache::Settings::at(dir.path()));
  CompileOptions options;
  options.arch = "sm_90a";
  auto program = compile(test::block_sum_source, options, cache);
  REQUIRE_FALSE(program.ptx.empty());
  REQUIRE(program.cubin.size() > 4);
  REQUIRE(program.cubin.substr(0, 4) == "\x7f" "ELF");
  const KernelResources* r = program.resources("block_sum");
  INFO("NVRTC " << nvrtc_version() << " log:\n" << program.log);
  REQUIRE(r != nullptr);
  CHECK(r->registers > 0);
  CHECK(r->shared_bytes == 64 * 4);
  CHECK(r->spill_store_bytes == 0);
  if (!program.log.empty()) CHECK(r->barriers >= 1);  // barriers come only from ptxas' report
}

// Two threads asking for one program at once (a cold call's interim compiles beside its background
// job's): NVRTC runs once, the other caller waits for that compile. Either way exactly one of them
// compiled it: the other waited (in flight) or found it in the cache (after).
TEST_CASE("a program compiled by two threads at once is compiled once") {
  test::TempDir dir;
  DiskCache cache(DiskCache::Settings::at(dir.path()));
  CompileOptions options;
  options.arch = "sm_90a";
  std::vector<CompiledProgram> programs(4);
  std::vector<std::thread> threads;
  for (CompiledProgram& program : programs) threads.emplace_back([&] { program = compile(test::block_sum_source, options, cache); });
  for (std::thread& thread : threads) thread.join();
  const auto compiled = std::count_if(programs.begin(), programs.end(), [](const CompiledProgram& p) { return !p.from_cache; });
  CHECK(compiled == 1);
  for (const CompiledProgram& program : programs) CHECK(program.cubin == programs.front().cubin);
  // A failed compile: every caller gets its error.
  const std::string broken = "extern \"C\" __global__ void broken_twice(float* x) { x[0] = undeclared_twice; }";
  std::vector<int> errors(2, 0);
  threads.clear();
  for (int& error : errors)
    threads.emplace_back([&] {
      try {
        compile(broken, options, cache);
      } catch (const CompileError& e) {
        error = std::string(e.log()).find("undeclared_twice") != std::string::npos ? 1 : 2;
      }
    });
  for (std::thread& thread : threads) thread.join();
  CHECK(errors == std::vector<int>{1, 1});
}

TEST_CASE("a syntax error raises CompileError carrying the log and the written source") {
  test::TempDir dir;
  DiskCache cache(DiskCache::Settings::at(dir.path()));
  const std::string broken = "extern \"C\" __global__ void broken(float* x) { x[0] = undeclared_name; }";
  CompileOptions options;
  options.arch = "sm_80";
  try {
    compile(broken, options, cache);
    FAIL("compile accepted a program with an undeclared identifier");
  } catch (const CompileError& e) {
    CHECK_THAT(e.log(), Catch::Contains("undeclared_name"));
    CHECK_THAT(std::string(e.what()), Catch::Contains(e.source_path()));
    REQUIRE(std::filesystem::exists(e.source_path()));
    std::ifstream in(e.source_path());
    std::stringstream text;
    text << in.rdbuf();
    CHECK_THAT(text.str(), Catch::Contains("undeclared_name"));
  }
}

TEST_CASE("a malformed arch is rejected with the arch named") {
  DiskCache cache(DiskCache::Settings::off());
  CompileOptions options;
  options.arch = "hopper";
  REQUIRE_THROWS_WITH(compile(test::vector_add_source, options, cache),
                      Catch::Contains("'hopper'") && Catch::Contains("sm_NN"));
  REQUIRE_THROWS_AS(compile(test::vector_add_source, options, cache), InvalidArgument);
}

TEST_CASE("in-memory headers are compiled and change the key") {
  DiskCache cache(DiskCache::Settings::off());
  const std::string source =
      "#include \"scale.h\"\nextern \"C\" __global__ void k(float* x) { x[0] *= kScale; }";
  CompileOptions options;
  options.arch = "compute_80";
  options.headers = {{"scale.h", "constexpr float kScale = 2.0f;"}};
  auto a = compile(source, options, cache);
  options.headers = {{"scale.h", "constexpr float kScale = 3.0f;"}};
  auto b = compile(source, options, cache);
  REQUIRE(a.key != b.key);
  REQUIRE(a.ptx != b.ptx);
}

TEST_CASE("LADLE_NVRTC_FLAGS adds options to every compile and to the key; a word that is no option is refused") {
  DiskCache cache(DiskCache::Settings::off());
  CompileOptions options;
  options.arch = "compute_80";
  const auto plain = compile(test::vector_add_source, options, cache);
  CHECK(plain.ptx.find(".loc") == std::string::npos);
  {
    test::ScopedEnv flags("LADLE_NVRTC_FLAGS", " -lineinfo  -DLADLE_UNUSED=1 ");
    const auto traced = compile(test::vector_add_source, options, cache);
    CHECK(traced.key != plain.key);
    CHECK(std::count(traced.options.begin(), traced.options.end(), "-lineinfo") == 1);
    CHECK(std::count(traced.options.begin(), traced.options.end(), "-DLADLE_UNUSED=1") == 1);
    CHECK(traced.ptx.find(".loc") != std::string::npos);  // the line table -lineinfo asks for
  }
  test::ScopedEnv flags("LADLE_NVRTC_FLAGS", "-lineinfo fast");
  REQUIRE_THROWS_AS(compile(test::vector_add_source, options, cache), InvalidArgument);
  REQUIRE_THROWS_WITH(compile(test::vector_add_source, options, cache), Catch::Contains("LADLE_NVRTC_FLAGS") && Catch::Contains("'fast'"));
}

TEST_CASE("ptxas' verbose report is parsed per kernel") {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'first' for 'sm_90a'\n"
      "ptxas info    : Function properties for first\n"
      "    48 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 32768 bytes smem, 400 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'second' for 'sm_90a'\n"
      "ptxas info    : Function properties for second\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 12 registers, used 0 barriers, 380 bytes cmem[0]\n";
  auto kernels = parse_ptxas_info(log);
  REQUIRE(kernels.size() == 2);
  CHECK(kernels[0].name == "first");
  CHECK(kernels[0].registers == 168);
  CHECK(kernels[0].stack_frame_bytes == 48);
  CHECK(kernels[0].spill_store_bytes == 8);
  CHECK(kernels[0].spill_load_bytes == 4);
  CHECK(kernels[0].shared_bytes == 32768);
  CHECK(kernels[0].constant_bytes == 400);
  CHECK(kernels[1].registers == 12);
  CHECK(kernels[1].shared_bytes == 0);
}

TEST_CASE("NVRTC reports its version and the arches it targets") {
  REQUIRE_THAT(nvrtc_version(), Catch::Matches(R"(\d+\.\d+)"));
  auto arches = nvrtc_supported_arches();
  REQUIRE(std::find(arches.begin(), arches.end(), "sm_90a") != arches.end());
  REQUIRE(std::find(arches.begin(), arches.end(), "sm_80") != arches.end());
}
