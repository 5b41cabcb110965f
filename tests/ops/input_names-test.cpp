// An input named like one of a kernel's own identifiers is renamed in that kernel (in<i>_<name>),
// every other input keeps its name, and the kernel compiles. Which names a kernel takes is read
// from the kernel's own text (cuda::detail::with_input_names), for every family alike: here the
// recurrent, chunked (mma.sync and ws, a key gate and a head gate) and attention (mma.sync and ws)
// kernels of a call, planned as the launcher plans them and compiled by NVRTC.
#include <catch2/catch.hpp>

#include <functional>
#include <regex>
#include <string>
#include <vector>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/generated_kernels.h>

#include "runtime/scoped_env.h"
#include "runtime/temp_dir.h"

using namespace ladle;

namespace {

// Identifiers kernels of every family use for themselves; the first one a source uses.
std::vector<std::string> own_names(const std::string& source) {
  std::vector<std::string> found;
  for (const char* name : {"lane", "warp", "smem", "stage", "column", "cpos", "tile", "row0", "j0", "state", "acc", "valid"})
    if (std::regex_search(source, std::regex(std::string("[^\\w.]") + name + "[^\\w]"))) found.push_back(name);
  return found;
}

bool declares(const std::string& source, const std::string& param) {
  return std::regex_search(source, std::regex("[ *]" + param + "[,)]"));
}

struct Family {
  std::string name;
  std::function<std::vector<GeneratedKernel>(const std::string& input_name)> plan;
};

}  // namespace

TEST_CASE("inputs named like a kernel's own identifiers are renamed in it, and every family's kernel compiles", "[codegen][names]") {
  test::TempDir cache;
  const test::ScopedEnv env("LADLE_CACHE_DIR", cache.path().c_str());
  CallShape shape;
  shape.batch = 2, shape.tokens = 256, shape.heads = 4, shape.key_dim = shape.value_dim = 64;
  const auto key_gated = [](const std::string& name) {
    return dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key(name.c_str())), dsl::q), "key gate");
  };
  const auto head_gated = [](const std::string& name) {
    return dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(-dsl::softplus(dsl::token_head(name.c_str()))), dsl::q), "head gate");
  };
  const auto biased = [](const std::string& name) {
    return dsl::lower(dsl::softmax(dsl::score * 0.125f - dsl::head_param(name.c_str()) * (dsl::query_index - dsl::key_index)), "slope");
  };
  RunOptions recurrent, chunked;
  recurrent.algorithm = Algorithm::recurrent;
  chunked.algorithm = Algorithm::chunked;
  const std::vector<Family> families = {
      {"recurrent, sm_90a", [&](const std::string& n) { return generated_kernels(key_gated(n), shape, recurrent, "sm_90a"); }},
      {"chunked mma.sync, sm_80", [&](const std::string& n) { return generated_kernels(key_gated(n), shape, chunked, "sm_80"); }},
      {"chunked ws key gate, sm_90a", [&](const std::string& n) { return generated_kernels(key_gated(n), shape, chunked, "sm_90a"); }},
      {"chunked ws head gate, sm_90a", [&](const std::string& n) { return generated_kernels(head_gated(n), shape, chunked, "sm_90a"); }},
      {"attention mma.sync, sm_80", [&](const std::string& n) { return generated_kernels(biased(n), shape, {}, "sm_80"); }},
      {"attention ws, sm_90a", [&](const std::string& n) { return generated_kernels(biased(n), shape, {}, "sm_90a"); }},
  };
  int renamed = 0;
  for (const Family& family : families) {
    const std::vector<GeneratedKernel> plain = family.plan("gate");
    REQUIRE(!plain.empty());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      INFO(family.name << ", kernel " << plain[i].name << " (" << plain[i].role << ")");
      // Inputs no kernel text takes keep their names.
      CHECK(declares(plain[i].source, "q"));
      CHECK(declares(plain[i].source, "gate"));
      const std::vector<std::string> names = own_names(plain[i].source);
      REQUIRE(!names.empty());
      for (const std::string& name : {names.front(), names.back()}) {
        INFO("the input named " << name);
        const std::vector<GeneratedKernel> clashing = family.plan(name);
        REQUIRE(clashing.size() == plain.size());
        CHECK(std::regex_search(clashing[i].source, std::regex("[ *]in\\d+_" + name + "[,)]")));
        CHECK(declares(clashing[i].source, "q"));
        // NVRTC compiles it: the renamed input and the kernel's own name side by side.
        const std::string arch = family.name.find("sm_80") != std::string::npos ? "sm_80" : "sm_90a";
        CHECK_NOTHROW(compile_generated(clashing[i], arch));
        ++renamed;
      }
    }
  }
  CHECK(renamed >= 12);
}
