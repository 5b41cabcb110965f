// Kernels built ahead of time: `ladle-cache prebuild` compiles, with no GPU, the kernels the
// launcher would compile for named ops at given shapes on an arch; a process that then loads that
// directory read-only (LADLE_CACHE_READONLY=1) finds every one of them, so a deployment compiles
// nothing. The GPU half (a call on an H100 running on a cache prebuilt here, zero compiles) is
// bench/start-fast.sh (its "first" step, with .prebuilt carried).
#include <ladle/ops/attention.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/cache.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <string>

#include "runtime/scoped_env.h"
#include "support/command.h"
#include "runtime/temp_dir.h"

using namespace ladle;

namespace {

// Runs the tool with `arguments` and the given cache directory; returns its output and exit status.
std::pair<std::string, int> run_tool(const std::string& arguments, const std::filesystem::path& cache_dir) {
  return test::run_command("LADLE_CACHE_DIR='" + cache_dir.string() + "' " + std::string(LADLE_CACHE_TOOL) + " " + arguments +
                           " 2>&1");
}

CallShape small_shape() {
  CallShape shape;
  shape.batch = 2, shape.tokens = 256, shape.heads = 4, shape.key_dim = 64, shape.value_dim = 64;
  return shape;
}

}  // namespace

TEST_CASE("a cache prebuilt by ladle-cache holds every kernel the calls launch; read only, nothing compiles") {
  test::TempDir dir;
  const std::string calls = "--op gla --op attention --mask causal --shape 2x256x4x64x64 --shape 1x4096x2x64x64 --arch sm_90a";
  const auto [first, status] = run_tool("prebuild " + calls, dir.path());
  INFO(first);
  REQUIRE(status == 0);
  std::smatch counts;
  REQUIRE(std::regex_search(first, counts, std::regex(R"(([0-9]+) kernels for sm_90a \(([0-9]+) compiled, 0 already cached, 0 failed\))")));
  CHECK(std::stoi(counts[1]) >= 3);  // GLA at two shapes (the long one segmented: more kernels), attention's kernel
  CHECK(counts[1] == counts[2]);
  // Again: the same keys, every one already there.
  const auto [second, again] = run_tool("prebuild " + calls, dir.path());
  CHECK(again == 0);
  CHECK_THAT(second, Catch::Contains(std::string(counts[1]) + " kernels for sm_90a (0 compiled, " + std::string(counts[1]) + " already cached, 0 failed)"));

  // A process of the application, the directory read only: the launcher's kernels for those calls
  // are all found (this process's global cache is built here, from this environment).
  test::ScopedEnv location("LADLE_CACHE_DIR", dir.path().c_str());
  test::ScopedEnv read_only("LADLE_CACHE_READONLY", "1");
  REQUIRE(DiskCache::global().read_only());
  std::set<std::string> found;
  for (const std::int64_t tokens : {256, 4096}) {
    CallShape shape = small_shape();
    if (tokens == 4096) shape.batch = 1, shape.tokens = 4096, shape.heads = 2;
    for (const GeneratedKernel& kernel : generated_kernels(named_variant("gla"), shape, {}, "sm_90a")) {
      INFO(kernel.role << " " << kernel.name);
      CHECK(compile_generated(kernel, "sm_90a").from_cache);
      found.insert(kernel.name);
    }
    AttentionRunOptions options;
    const auto& causal = attention_variant(parse_attention_features("causal"));
    for (const GeneratedKernel& kernel : generated_kernels(causal, shape, options, "sm_90a")) {
      INFO(kernel.role << " " << kernel.name);
      CHECK(compile_generated(kernel, "sm_90a").from_cache);
      found.insert(kernel.name);
    }
  }
  CHECK(static_cast<int>(found.size()) == std::stoi(counts[1]));
}

TEST_CASE("ladle-cache prebuild names a bad shape, dtype or flag") {
  test::TempDir dir;
  const auto [shape, s1] = run_tool("prebuild --op gla --shape 8x4096x16", dir.path());
  CHECK(s1 != 0);
  CHECK_THAT(shape, Catch::Contains("--shape '8x4096x16', expected BxTxHxKxV"));
  const auto [dtype, s2] = run_tool("prebuild --op gla --dtype f8", dir.path());
  CHECK(s2 != 0);
  CHECK_THAT(dtype, Catch::Contains("--dtype 'f8', expected bf16, f16 or f32"));
  const auto [mask, s3] = run_tool("prebuild --op gla --mask causal", dir.path());
  CHECK(s3 != 0);
  CHECK_THAT(mask, Catch::Contains("--mask and --mods apply to --op attention, not to --op gla"));
  const auto [op, s4] = run_tool("prebuild --op glaa", dir.path());
  CHECK(s4 != 0);
  CHECK_THAT(op, Catch::Contains("glaa"));
}

// --backward: a call that trains (its forward returns lse) and the attention backward's program, in
// the form the launcher takes on the arch (ws at D = 256 on sm_90a, the mma.sync form for f32 on
// sm_80): the kernels the library plans, compiled by the tool and found cached by a second run.
TEST_CASE("ladle-cache prebuild --backward compiles the attention backward's kernels; a second run compiles nothing") {
  test::TempDir dir;
  struct Row {
    const char* dtype;
    const char* arch;
    DType type;
    std::int64_t dim;
    const char* form;
  };
  const Row rows[] = {{"bf16", "sm_90a", DType::bf16, 256, "form ws, stages=2 dq=red"}, {"f32", "sm_80", DType::f32, 64, "form sync, "}};
  const auto prebuild = [&](const Row& row) {
    const std::string dims = std::to_string(row.dim) + "x" + std::to_string(row.dim);
    return run_tool(std::string("prebuild --op attention --mask causal --backward --dtype ") + row.dtype + " --arch " + row.arch +
                        " --shape 2x256x4x" + dims,
                    dir.path());
  };
  for (const Row& row : rows) {
    const auto [out, status] = prebuild(row);
    INFO(out);
    REQUIRE(status == 0);
    CHECK_THAT(out, Catch::Contains("attention backward") && Catch::Contains(" 0 failed"));
  }

  // The kernels the library plans for those calls are the ones the tool compiled, and a second run finds
  // every one of them (this process's global cache belongs to the test case above, so a fresh process looks).
  for (const Row& row : rows) {
    CallShape shape = small_shape();
    shape.type = row.type, shape.key_dim = shape.value_dim = row.dim;
    AttentionRunOptions options;
    options.return_lse = true;
    const auto& causal = attention_variant(parse_attention_features("causal"));
    const std::vector<GeneratedKernel> kernels = generated_backward_kernels(causal, shape, options, row.arch);
    REQUIRE(kernels.size() == 1);
    INFO(row.arch << " " << kernels[0].name << " " << kernels[0].tile);
    CHECK(kernels[0].role == "attention backward");
    CHECK_THAT(kernels[0].tile, Catch::StartsWith(row.form));
    CHECK(kernels[0].source.find("ladle_attention_bwd_prep_") != std::string::npos);
    const auto [again, status] = prebuild(row);
    INFO(again);
    CHECK(status == 0);
    CHECK_THAT(again, Catch::Contains(kernels[0].name + "  already cached"));
    const std::vector<GeneratedKernel> forward = generated_kernels(causal, shape, options, row.arch);
    REQUIRE(!forward.empty());
    CHECK_THAT(again, Catch::Contains(forward[0].name + "  already cached") && Catch::Contains("(0 compiled"));
  }
}

// A recurrent op that trains: its GPU backward's programs, planned without a GPU as the launcher plans
// them (gpu::backward_planned_kernels). GLA at B8 T4096 H16 K=V=128 bf16 on sm_90a: the recurrences run
// the serial ws form, which also writes the boundary states (two chunk-states kernels, no state pass),
// then the slots, chain, helpers' and block kernel's programs; at T 1000 (not whole blocks) dv's
// recurrence keeps its own kernel and the dS table its state pass. The same names the launcher compiled
// on the H200 (bench/RESULTS.md, stop 56).
TEST_CASE("ladle-cache prebuild --backward compiles a recurrent op's backward programs; a second run compiles nothing") {
  test::TempDir dir;
  CallShape shape;
  shape.batch = 8, shape.tokens = 4096, shape.heads = 16, shape.key_dim = 128, shape.value_dim = 128;
  const std::vector<GeneratedKernel> planned = generated_backward_kernels(named_variant("gla"), shape, {}, "sm_90a");
  std::multiset<std::string> roles;
  for (const GeneratedKernel& kernel : planned) roles.insert(kernel.role);
  CHECK(roles.count("boundary states") == 2);
  CHECK(roles.count("entry states") == 0);
  CHECK(roles.count("backward slots") == 1);
  CHECK(roles.count("backward chain") == 1);
  CHECK(roles.count("backward totals") == 0);  // 16-bit slots: the carries come from the boundary states
  CHECK(roles.count("backward helper") == 1);  // each helper its own program: the carries from the boundary states
  CHECK(roles.count("backward block") == 1);
  for (const GeneratedKernel& kernel : planned)
    if (kernel.role == "backward helper") CHECK(kernel.name == "ladle_bwd_carry_states");
  for (const GeneratedKernel& kernel : planned)
    if (kernel.role == "boundary states") CHECK_THAT(kernel.source, Catch::Contains("the state entering this chunk"));

  const std::string call = "prebuild --op gla --backward --shape 8x4096x16x128x128 --arch sm_90a";
  const auto [first, status] = run_tool(call, dir.path());
  INFO(first);
  REQUIRE(status == 0);
  for (const GeneratedKernel& kernel : planned) CHECK_THAT(first, Catch::Contains(kernel.name + "  compiled"));
  std::smatch counts;
  REQUIRE(std::regex_search(first, counts, std::regex(R"(([0-9]+) kernels for sm_90a \(([0-9]+) compiled, 0 already cached, 0 failed\))")));
  CHECK(std::stoul(counts[1]) == planned.size() + 1);  // and the forward's ws kernel
  const auto [second, again] = run_tool(call, dir.path());
  CHECK(again == 0);
  CHECK_THAT(second, Catch::Contains("(0 compiled, " + std::string(counts[1]) + " already cached, 0 failed)"));

  // Not whole blocks: dv's recurrence runs as it is and the dS table takes the segmented pass and fold.
  shape.tokens = 1000;
  std::multiset<std::string> ragged;
  for (const GeneratedKernel& kernel : generated_backward_kernels(named_variant("gla"), shape, {}, "sm_90a")) ragged.insert(kernel.role);
  CHECK(ragged.count("boundary states") == 1);
  CHECK(ragged.count("entry states") >= 1);
  // An update form (the gated delta rule): slots, its form's program, chain, helpers; and misuse named.
  const std::vector<GeneratedKernel> delta = generated_backward_kernels(named_variant("gated_delta_rule"), shape, {}, "sm_90a");
  std::multiset<std::string> delta_roles;
  for (const GeneratedKernel& kernel : delta) delta_roles.insert(kernel.role);
  CHECK(delta_roles.count("backward update form") == 1);
  CHECK(delta_roles.count("backward block") == 0);
}
