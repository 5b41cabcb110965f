// ladle-dump shows what the launcher launches: for attention and the recurrent and chunked ops on
// sm_90a and sm_80, the kernels the tool prints are the ones the launcher's heuristics choose for
// that target (ladle::generated_kernels, built on gpu::attention_kernel_spec,
// heuristic_chunked_tile, chunked_launch_specs ...), and those are the forms the heuristics
// document.
#include <ladle/codegen/cuda/attention.h>
#include <ladle/codegen/cuda/attention_backward.h>
#include <ladle/codegen/cuda/backward.h>
#include <ladle/ops/attention.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/chunked_plan.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/scoped_env.h"
#include "support/command.h"
#include "runtime/temp_dir.h"

using namespace ladle;

namespace {

std::string run_tool(const std::string& arguments) {
  return test::run_command(std::string(LADLE_DUMP_TOOL) + " " + arguments + " --only resources 2>&1").first;
}

// The generated kernels' names in the tool's resource tables, in order.
std::vector<std::string> shown_kernels(const std::string& output) {
  std::vector<std::string> names;
  const std::regex row(R"(\n(ladle_[a-z_]+_[0-9a-f]+) +[0-9]+ )");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), row);
       it != std::sregex_iterator(); ++it)
    names.push_back((*it)[1]);
  return names;
}

std::vector<std::string> names_of(const std::vector<GeneratedKernel>& kernels) {
  std::vector<std::string> names;
  for (const auto& k : kernels) names.push_back(k.name);
  return names;
}

}  // namespace

TEST_CASE(
    "ladle-dump --op attention shows the kernel the launcher's heuristic takes on sm_90a and "
    "sm_80") {
  test::TempDir cache;
  const test::ScopedEnv env("LADLE_CACHE_DIR", cache.path().c_str());
  AttentionFeatures causal;
  causal.causal = true;
  const ir::AttentionVariant& variant = attention_variant(causal);
  CallShape shape;  // the tool's default shape: B8 T1024 H16
  shape.key_dim = shape.value_dim = 128;
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    const auto planned = generated_kernels(variant, shape, {}, arch);
    REQUIRE(planned.size() == 1);
    // 16-bit q, k, v and D a multiple of 8: the ws pipeline on sm_90a, mma.sync on sm_80.
    REQUIRE((planned[0].tile.find("mma=ws") != std::string::npos) == (arch == "sm_90a"));
    if (arch == "sm_80") REQUIRE(planned[0].tile.find("wgmma") == std::string::npos);
    const std::string output =
        run_tool("--op attention --mask causal --dtype bf16 -D 128 --arch " + arch);
    INFO(output);
    REQUIRE(shown_kernels(output) == names_of(planned));
    REQUIRE(output.find("tile " + planned[0].tile) != std::string::npos);
  }
}

TEST_CASE("ladle-dump --op attention --tk --hkv shows the decode kernel and its merge for a decode-shaped call") {
  test::TempDir cache;
  const test::ScopedEnv env("LADLE_CACHE_DIR", cache.path().c_str());
  AttentionFeatures causal;
  causal.causal = true;
  const ir::AttentionVariant& variant = attention_variant(causal);
  CallShape shape;
  shape.batch = 64, shape.tokens = 1, shape.key_tokens = 8192, shape.heads = 32, shape.kv_heads = 8;
  shape.key_dim = shape.value_dim = 128;
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    const auto planned = generated_kernels(variant, shape, {}, arch);
    REQUIRE(planned.size() == 1);
    REQUIRE(planned[0].tile.find("mma=decode") != std::string::npos);
    const std::string output = run_tool("--op attention --mask causal -B 64 -T 1 --tk 8192 -H 32 --hkv 8 -D 128 --arch " + arch);
    INFO(output);
    REQUIRE(shown_kernels(output) == names_of(planned));
    REQUIRE(output.find("tile " + planned[0].tile) != std::string::npos);
    REQUIRE(output.find(planned[0].name + "_merge") != std::string::npos);  // the merge kernel, in the same source
  }
}

TEST_CASE(
    "ladle-dump --op gla shows the launcher's recurrent and chunked kernels, the segmented form "
    "without a fold on ws tiles") {
  test::TempDir cache;
  const test::ScopedEnv env("LADLE_CACHE_DIR", cache.path().c_str());
  const ir::Variant& variant = named_variant("gla", "");
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    RunOptions recurrent;
    recurrent.algorithm = Algorithm::recurrent;
    const auto fused = generated_kernels(variant, CallShape{}, recurrent, arch);
    REQUIRE(fused.size() == 1);
    REQUIRE(fused[0].role == "recurrent");
    std::string output = run_tool("--op gla --arch " + arch);
    INFO(output);
    REQUIRE(shown_kernels(output) == names_of(fused));

    RunOptions chunked;
    chunked.algorithm = Algorithm::chunked;
    const auto serial = generated_kernels(variant, CallShape{}, chunked, arch);
    REQUIRE(serial.size() == 1);
    const bool ws =
        serial[0].tile.size() > 3 && serial[0].tile.substr(serial[0].tile.size() - 3) == " ws";
    REQUIRE(ws == (arch == "sm_90a"));  // a key gate alone in bf16: the ws form on sm_90a
    REQUIRE(serial[0].dynamic_shared_bytes > 0);
    output = run_tool("--op gla --algo chunked --arch " + arch);
    REQUIRE(shown_kernels(output) == names_of(serial));
    // The dynamic shared memory the launcher passes, beside ptxas' static figure.
    REQUIRE(output.find(" " + std::to_string(serial[0].dynamic_shared_bytes) + " ") !=
            std::string::npos);

    chunked.chunked_segment_tokens = 256;  // --segmented at T 1024: segments of T/4
    const auto segmented = generated_kernels(variant, CallShape{}, chunked, arch);
    std::vector<std::string> roles;
    for (const auto& k : segmented) roles.push_back(k.role);
    if (ws)
      REQUIRE(roles == std::vector<std::string>{"segmented states", "segmented serial"});
    else
      REQUIRE(roles ==
              std::vector<std::string>{"segmented states", "segmented fold", "segmented serial"});
    output = run_tool("--op gla --algo chunked --segmented --arch " + arch);
    REQUIRE(shown_kernels(output) == names_of(segmented));
  }
}

TEST_CASE("ladle-dump's kernels follow the shape as the launcher's do") {
  test::TempDir cache;
  const test::ScopedEnv env("LADLE_CACHE_DIR", cache.path().c_str());
  const ir::Variant& variant = named_variant("gla", "");
  RunOptions chunked;
  chunked.algorithm = Algorithm::chunked;
  CallShape few;  // two long sequences of 16 heads: segmented by shape, as the launcher cuts them
  few.batch = 2, few.tokens = 16384;
  const auto kernels = generated_kernels(variant, few, chunked, "sm_90a");
  REQUIRE(kernels.size() >= 2);
  REQUIRE(kernels.back().role == "segmented serial");
  const std::string output = run_tool("--op gla --algo chunked -B 2 -T 16384 -H 16 --arch sm_90a");
  INFO(output);
  REQUIRE(shown_kernels(output) == names_of(kernels));
}

TEST_CASE("ladle-dump refuses flags that do not apply, naming the flag and the op") {
  REQUIRE(run_tool("--op gla --mask causal --arch sm_90a")
              .find("ladle-dump: --mask applies to --op attention, not to --op gla") !=
          std::string::npos);
  REQUIRE(run_tool("--op gla -D 64 --arch sm_90a").find("ladle-dump: -D applies to") !=
          std::string::npos);
  REQUIRE(run_tool("--op attention --gates gk --arch sm_90a")
              .find("ladle-dump: --gates applies to the recurrent ops") != std::string::npos);
  REQUIRE(run_tool("--op attention -K 64 --arch sm_90a")
              .find("ladle-dump: -K applies to the recurrent ops") != std::string::npos);
  REQUIRE(run_tool("--op gla -K 300 --arch sm_90a").find("ladle-dump: -K 300 exceeds 256") !=
          std::string::npos);
  // -K without its value: named, and the next flag's value is not taken for a file.
  const std::string missing = run_tool("--op gla -K --arch sm_90a");
  INFO(missing);
  REQUIRE(missing.find("ladle-dump: -K needs a value (got the flag --arch)") != std::string::npos);
  REQUIRE(missing.find("File does not exist") == std::string::npos);
}

TEST_CASE("ladle-dump --backward shows the update forms' kernels: slots, ladle_bwd_update or the chunked three, chain (RWKV6's u bound as [H,K])") {
  test::TempDir cache;
  const test::ScopedEnv env("LADLE_CACHE_DIR", cache.path().c_str());
  // RWKV6: the fused-recurrent form; the gated delta rule (bf16, T 64): the chunked WY form's three kernels.
  for (const char* op : {"rwkv6", "gated_delta_rule"}) {
    const std::string output = run_tool(std::string("--op ") + op + " --backward --arch sm_90a");
    INFO(output);
    CHECK(output.find("u has shape") == std::string::npos);  // the tool's u binds: [H,K], not [B,T,H,K]
    const bool chunked = std::string(op) == "gated_delta_rule";
    const std::size_t slots = output.find("kernel ladle_bwd_slots_"),
                      update = output.find(chunked ? "kernel ladle_bwd_wy_prepare_" : "kernel ladle_bwd_update_"),
                      chain = output.find("kernel ladle_bwd_chain_");
    REQUIRE(slots != std::string::npos);
    REQUIRE(update != std::string::npos);
    REQUIRE(chain != std::string::npos);
    CHECK(slots < update);  // in launch order
    CHECK(update < chain);
    if (chunked) {
      const std::size_t states = output.find("kernel ladle_bwd_wy_states_"), gradients = output.find("kernel ladle_bwd_wy_gradients_");
      CHECK(update < states);
      CHECK(states < gradients);
      CHECK(gradients < chain);
    }
    CHECK(output.find("ladle_bwd_totals_") == std::string::npos);  // the diagonal form's alone
  }
  // The diagonal form's: slots, totals, chain where the slots are fp32 (the fused-recurrent kernels: 64
  // steps choose them); on the tensor cores (--algo chunked, bf16 slots) the carries come from the
  // boundary states: no totals; the helpers' block kernel with its dynamic shared memory.
  const std::string gla = run_tool("--op gla --backward --arch sm_90a");
  CHECK(gla.find("ladle_bwd_slots_") != std::string::npos);
  CHECK(gla.find("ladle_bwd_totals_") != std::string::npos);
  const std::string chunked = run_tool("--op gla --backward --algo chunked --arch sm_90a");
  INFO(chunked.substr(0, 400));
  CHECK(chunked.find("ladle_bwd_slots_") != std::string::npos);
  CHECK(chunked.find("ladle_bwd_chain_") != std::string::npos);
  CHECK(chunked.find("ladle_bwd_totals_") == std::string::npos);
  CHECK(std::regex_search(chunked, std::regex(R"(\nladle_bwd_block_bf16 +[0-9]+ +0 +0 +0 +[0-9]+ +)" +
                                              std::to_string(cuda::backward_block_shared) + " ")));
  CHECK(gla.find("ladle: the update forms' recurrent backward") == std::string::npos);  // ladle_bwd_update's source
  CHECK(gla.find("kernel ladle_bwd_wy_") == std::string::npos);
}

// The attention backward's form follows the types, head dims and target as the launcher's
// (cuda::attention_backward_form): ws on sm_90a for 16-bit inputs to D = 256, the mma.sync form for
// f32 or on sm_80; the main kernel's dynamic shared memory is the launcher's, prep's none.
TEST_CASE("ladle-dump --op attention --backward shows the launcher's form and its dynamic shared memory") {
  struct Row {
    const char* arguments;
    const char* form;
    int shared_bytes;
  };
  cuda::AttentionBackwardSpec wide;  // the ws form at D = 256: blocks of 64 keys, the warpgroups splitting the columns
  wide.D = wide.Dv = 256, wide.stages = 2, wide.dq_tma = false;
  const int ws_bytes = cuda::attention_backward_shared_bytes(wide);
  cuda::AttentionBackwardSpec split;  // f32 on sm_90a: the sync form's tile
  split.input_types = {DType::f32, DType::f32, DType::f32, DType::f32};
  split.D = split.Dv = 128, split.arch = "sm_90a", split.form = cuda::AttentionBackwardForm::sync;
  const int sync_bytes = cuda::attention_backward_shared_bytes(cuda::with_sync_tile(split));
  for (const Row& row : {Row{"--op attention --backward --mask causal -D 256 --arch sm_90a", "form ws", ws_bytes},
                         Row{"--op attention --backward --mask causal -D 128 --dtype f32 --arch sm_90a", "form sync", sync_bytes},
                         Row{"--op attention --backward --mask causal -D 64 --arch sm_80", "form sync", -1}}) {
    const std::string output = run_tool(row.arguments);
    INFO(row.arguments << "\n" << output);
    CHECK(output.find(row.form) != std::string::npos);
    std::vector<std::string> kernels = shown_kernels(output);
    REQUIRE(kernels.size() == 2);
    // The table lists a program's kernels in the order the compiled module gives them, which differs
    // between a machine with a driver and one without: main first, prep second, by name.
    if (kernels[0].rfind("ladle_attention_bwd_prep_", 0) == 0) std::swap(kernels[0], kernels[1]);
    REQUIRE(kernels[1].rfind("ladle_attention_bwd_prep_", 0) == 0);
    const std::regex main_row("\n" + kernels[0] + R"( +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +([0-9]+) )");
    std::smatch m;
    REQUIRE(std::regex_search(output, m, main_row));
    if (row.shared_bytes >= 0) CHECK(std::stoi(m[1]) == row.shared_bytes);
    CHECK(std::stoi(m[1]) > 0);
    CHECK(std::regex_search(output, std::regex("\n" + kernels[1] + R"( +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +0 )")));
  }
}
