// The chunked family's plan (ops/chunked_plan.h): one value decides the form, the tile, the
// segments and the state pass of a call; the launcher, the tuner and ladle-dump read it, and
// codegen emits what each launch's spec says without deciding again. Runs without a GPU: the plans
// are made for a named target (an H100's figures) from views that are never read.
#include <ladle/codegen/cuda/chunked.h>
#include <ladle/codegen/cuda/chunked_delta.h>
#include <ladle/ops/chunked_plan.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/error.h>

#include <catch2/catch.hpp>
#include <set>

#include "runtime/scoped_env.h"

using namespace ladle;
using Over = gpu::ChunkedLaunch::Over;

namespace {

// A call's bound inputs at any size without the memory: contiguous views of one aligned address
// (binding and planning check shapes, dtypes, strides and alignment; nothing reads the data).
struct Call {
  alignas(256) static inline unsigned char memory[256] = {};
  const ir::Variant& variant;
  VariantInputs inputs;
  RunOptions options;
  ops::BoundInputs bound;

  Call(const ir::Variant& v, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t K, std::int64_t V,
       RunOptions given = {})
      : variant(v), options(std::move(given)) {
    const auto view = [](std::vector<std::int64_t> shape) { return TensorView::contiguous(memory, DType::bf16, std::move(shape)); };
    inputs.scalars.emplace("scale", 0.125f);
    for (const auto& input : variant.inputs) {
      if (input.role != ir::Role::other || input.kind == ir::InputKind::scalar) continue;
      if (input.kind == ir::InputKind::token_key) inputs.tensors.emplace(input.name, view({B, T, H, K}));
      else if (input.kind == ir::InputKind::token_value) inputs.tensors.emplace(input.name, view({B, T, H, V}));
      else if (input.kind == ir::InputKind::head) inputs.tensors.emplace(input.name, view({H}));
      else if (input.kind == ir::InputKind::token_head) inputs.tensors.emplace(input.name, view({B, T, H}));
    }
    bound = ops::bind_inputs(variant.name, variant, view({B, T, H, K}), view({B, T, H, K}), view({B, T, H, V}), inputs, options);
  }
  gpu::ChunkedPlan plan(const gpu::ChunkedPlanKnobs& knobs = {}, const std::string& arch = "sm_90a") const {
    return gpu::plan_chunked(variant, bound, options, gpu::named_target(arch), knobs);
  }
};

const ir::Variant& gla() { return named_variant("gla"); }
const ir::Variant& simple_gla() { return recurrent_variant(false, false, false, true); }  // a per-head decay

// Every launch of a plan generates, as its spec says, and the kernels are distinct.
void check_generates(const ir::Variant& variant, const gpu::ChunkedPlan& plan) {
  std::set<std::string> names;
  for (const gpu::ChunkedLaunch& launch : plan.launches) {
    const cuda::ChunkedKernel kernel = cuda::generate_chunked(variant, launch.spec);
    CHECK(kernel.phase == launch.spec.phase);
    names.insert(kernel.name);
    if (launch.spec.suffix_states) CHECK(kernel.name.find("ladle_chunked_states_suffix_") == 0);
    if (launch.spec.tile.ws) CHECK(kernel.name.find("ladle_chunked_ws") == 0);
  }
  CHECK(names.size() == plan.launches.size());
}

}  // namespace

TEST_CASE("a chunked plan of many sequences is the serial form, one kernel over the sequences", "[plan]") {
  for (const ir::Variant* variant : {&gla(), &simple_gla()}) {
    const Call call(*variant, 8, 4096, 16, 128, 128);
    const gpu::ChunkedPlan plan = call.plan();
    INFO(variant->name << ": " << gpu::to_string(plan));
    CHECK(plan.form == gpu::ChunkedPlan::Form::serial);
    CHECK(plan.segment_tokens == 0);
    REQUIRE(plan.launches.size() == 1);
    CHECK(plan.launches[0].over == Over::sequences);
    CHECK(plan.launches[0].spec.tile == gpu::heuristic_chunked_tile(*variant, call.bound, 0, gpu::named_target("sm_90a")));
    CHECK(plan.launches[0].spec.arch == "sm_90a");
    check_generates(*variant, plan);
  }
}

TEST_CASE("a chunked plan of few long sequences is segmented: state pass, fold, serial form", "[plan]") {
  for (const ir::Variant* variant : {&gla(), &simple_gla()}) {
    const Call call(*variant, 2, 16384, 4, 128, 128);
    const gpu::ChunkedPlan plan = call.plan();
    INFO(variant->name << ": " << gpu::to_string(plan));
    REQUIRE(plan.form == gpu::ChunkedPlan::Form::segmented);
    CHECK(plan.segment_tokens == gpu::chunked_segment_tokens(call.bound, call.options, gpu::named_target("sm_90a")));
    REQUIRE(plan.segment_tokens > 0);
    const std::int64_t per_sequence = (16384 + plan.segment_tokens - 1) / plan.segment_tokens;
    CHECK(plan.segments.segments() == 2 * per_sequence);
    CHECK(plan.segments.earlier_segments() == 2 * (per_sequence - 1) * plan.state_pieces);
    // The tile is the heuristic's for that many segments.
    const gpu::GpuTarget h100 = gpu::named_target("sm_90a");
    CHECK(gpu::chunked_tile_sequences(call.bound, call.options, h100) == 2 * per_sequence);
    CHECK(plan.spec.tile == gpu::heuristic_chunked_tile(*variant, call.bound, 2 * per_sequence, h100));
    REQUIRE(plan.launches.size() >= 2);
    CHECK(plan.launches.front().over == Over::earlier_segments);
    CHECK(plan.launches.front().spec.phase == cuda::ChunkedPhase::states);
    CHECK(plan.launches.back().over == Over::all_segments);
    CHECK(plan.launches.back().spec.phase == cuda::ChunkedPhase::serial);
    // The fold runs as a kernel of its own except after a ws serial tile, which folds as it starts.
    CHECK(plan.launches.size() == (plan.spec.tile.ws ? 2u : 3u));
    for (const auto& launch : plan.launches) CHECK(launch.spec.segmented);
    // GLA's key-side gate keeps the suffix state pass at 32-token chunks; simple GLA's state pass
    // runs in the ws form.
    const gpu::ChunkedLaunch& first = plan.launches.front();
    if (variant == &gla()) {
      CHECK(first.spec.suffix_states);
      CHECK(first.spec.tile.chunk == 32);
    } else {
      CHECK(first.spec.tile.ws);
      CHECK_FALSE(first.spec.suffix_states);
    }
    check_generates(*variant, plan);
  }
}

TEST_CASE("a chunked plan's knobs name the state pass and its pieces", "[plan]") {
  const Call call(gla(), 2, 16384, 4, 128, 128);
  gpu::ChunkedPlanKnobs split;
  split.suffix_states = false;
  const gpu::ChunkedPlan with_split = call.plan(split);
  CHECK_FALSE(with_split.launches.front().spec.suffix_states);
  CHECK_FALSE(with_split.launches.front().spec.tile.ws);
  CHECK(with_split.launches.front().spec.tile.split());
  check_generates(gla(), with_split);

  gpu::ChunkedPlanKnobs longer;
  longer.suffix_chunk = 64;
  longer.state_pieces = 3;
  const gpu::ChunkedPlan with_longer = call.plan(longer);
  CHECK(with_longer.launches.front().spec.suffix_states);
  CHECK(with_longer.launches.front().spec.tile.chunk == 64);
  CHECK(with_longer.state_pieces == 3);
  const gpu::ChunkedPlan plain = call.plan();
  CHECK(with_longer.segments.earlier_segments() / 3 == plain.segments.earlier_segments() / plain.state_pieces);

  gpu::ChunkedPlanKnobs ws_keys;
  ws_keys.ws_key_states = true;
  CHECK(call.plan(ws_keys).launches.front().spec.tile.ws);  // GLA's state pass in the ws form, on request
  CHECK_FALSE(call.plan(ws_keys, "sm_80").launches.front().spec.tile.ws);  // not where wgmma is not
}

TEST_CASE("the chunked plan's knobs come from the environment, checked", "[plan]") {
  {
    const test::ScopedEnv a("LADLE_SUFFIX_STATES", "0"), b("LADLE_STATE_PIECES", "4"), c("LADLE_SUFFIX_CHUNK", "64"),
        d("LADLE_WS_KEY_STATES", "1");
    const gpu::ChunkedPlanKnobs knobs = gpu::chunked_plan_knobs();
    CHECK(knobs.suffix_states == false);
    CHECK(knobs.state_pieces == 4);
    CHECK(knobs.suffix_chunk == 64);
    CHECK(knobs.ws_key_states);
  }
  {
    const test::ScopedEnv a("LADLE_SUFFIX_STATES", nullptr), b("LADLE_STATE_PIECES", nullptr), c("LADLE_SUFFIX_CHUNK", nullptr),
        d("LADLE_WS_KEY_STATES", nullptr);
    const gpu::ChunkedPlanKnobs knobs = gpu::chunked_plan_knobs();
    CHECK_FALSE(knobs.suffix_states.has_value());
    CHECK(knobs.state_pieces == 0);
    CHECK(knobs.suffix_chunk == 32);
    CHECK_FALSE(knobs.ws_key_states);
  }
  {
    const test::ScopedEnv a("LADLE_SUFFIX_CHUNK", "48");
    CHECK_THROWS_WITH(gpu::chunked_plan_knobs(), Catch::Contains("LADLE_SUFFIX_CHUNK = '48', expected 32 or 64"));
  }
  {
    const test::ScopedEnv a("LADLE_STATE_PIECES", "0");
    CHECK_THROWS_WITH(gpu::chunked_plan_knobs(), Catch::Contains("LADLE_STATE_PIECES = '0', expected a count >= 1"));
  }
  {
    const test::ScopedEnv a("LADLE_STATE_PIECES", "2x");
    CHECK_THROWS_AS(gpu::chunked_plan_knobs(), InvalidArgument);
  }
  {
    const test::ScopedEnv a("LADLE_SUFFIX_STATES", "yes");
    CHECK_THROWS_WITH(gpu::chunked_plan_knobs(), Catch::Contains("LADLE_SUFFIX_STATES = 'yes'"));
  }
}

TEST_CASE("a chunked plan with a split tile: the state pass, then the outputs, over every chunk", "[plan]") {
  RunOptions options;
  options.chunked_tile = cuda::parse_chunked_tile("128,64,64,8,64,64,4");
  const Call call(gla(), 2, 1000, 4, 128, 128, options);
  const gpu::ChunkedPlan plan = call.plan();
  CHECK(plan.form == gpu::ChunkedPlan::Form::split);
  REQUIRE(plan.launches.size() == 2);
  CHECK(plan.launches[0].spec.phase == cuda::ChunkedPhase::states);
  CHECK(plan.launches[1].spec.phase == cuda::ChunkedPhase::outputs);
  for (const auto& launch : plan.launches) CHECK(launch.over == Over::chunks);
  check_generates(gla(), plan);
}

TEST_CASE("a chunked plan refuses a tile that does not fit, naming it", "[plan]") {
  RunOptions options;
  options.chunked_tile = cuda::parse_chunked_tile("64,64,64,8");  // K = 128 needs block_k 128
  const Call call(gla(), 2, 1000, 4, 128, 128, options);
  CHECK_THROWS_WITH(call.plan(), Catch::Contains("chunked_tile (block_k=64"));
  // A tile that computes NaN on the GPU with a key-side gate (an open bug) is refused for GLA, not
  // for a per-head decay.
  options.chunked_tile = cuda::parse_chunked_tile("128,64,16,8,wgmma");
  const Call open_bug(gla(), 2, 1000, 4, 128, 128, options);
  CHECK_THROWS_WITH(open_bug.plan(), Catch::Contains("block_v 16 on wgmma with two warpgroups"));
  const Call head_decay(simple_gla(), 2, 1000, 4, 128, 128, options);
  CHECK(head_decay.plan().spec.tile == *options.chunked_tile);
  options.chunked_tile = cuda::parse_chunked_tile("128,64,128,12,ws");
  const Call on_sm80(gla(), 2, 1000, 4, 128, 128, options);
  CHECK_THROWS_AS(on_sm80.plan({}, "sm_80"), InvalidArgument);
}

TEST_CASE("codegen emits the state pass a spec names and never falls back", "[plan]") {
  // A value-side gate has no suffix state pass: asking for it is an error, not the split form.
  const ir::Variant& gv = recurrent_variant(false, false, true, false);
  const Call call(gv, 2, 16384, 4, 128, 128);
  gpu::ChunkedPlan plan = call.plan();
  REQUIRE(plan.form == gpu::ChunkedPlan::Form::segmented);
  cuda::ChunkedKernelSpec first = plan.launches.front().spec;
  CHECK_FALSE(first.suffix_states);
  CHECK_FALSE(cuda::chunked_suffix_states_unsupported(gv, first).empty());
  first.suffix_states = true;
  first.tile.ws = false;
  CHECK_THROWS_WITH(cuda::generate_chunked(gv, first), Catch::Contains("suffix_states"));
}

TEST_CASE("ladle-dump's kernels are the plan's launches", "[plan]") {
  for (const auto& [B, T, H] : {std::tuple{8, 4096, 16}, std::tuple{2, 16384, 4}}) {
    const Call call(gla(), B, T, H, 128, 128);
    const gpu::ChunkedPlan plan = call.plan();
    RunOptions chunked = call.options;
    chunked.algorithm = Algorithm::chunked;
    const std::vector<GeneratedKernel> shown = generated_kernels(gla(), call.bound, chunked, "sm_90a");
    REQUIRE(shown.size() == plan.launches.size());
    for (std::size_t i = 0; i < shown.size(); ++i) CHECK(shown[i].name == cuda::generate_chunked(gla(), plan.launches[i].spec).name);
  }
}

TEST_CASE("the entry states' plan is the segmented state pass and fold over the caller's table, in either direction", "[plan]") {
  for (const ir::Variant* variant : {&gla(), &simple_gla()})
    for (const bool reverse : {false, true}) {
      RunOptions options;
      options.reverse = reverse;
      const Call call(*variant, 2, 1000, 4, 128, 128, options);
      // The backward's 64-step blocks: 16 a sequence, the last of 40 tokens, 15 earlier rows each.
      const cuda::ChunkedSegments blocks = cuda::chunked_segments(2, 1000, {}, 64, reverse);
      REQUIRE(blocks.segments() == 32);
      REQUIRE(blocks.earlier_segments() == 30);
      const gpu::ChunkedPlan plan = gpu::plan_entry_states(*variant, call.bound, call.options, blocks, gpu::named_target("sm_90a"));
      INFO(variant->name << (reverse ? " reverse: " : ": ") << gpu::to_string(plan));
      CHECK(plan.form == gpu::ChunkedPlan::Form::segmented);
      CHECK(plan.segments.all == blocks.all);
      CHECK(plan.segments.earlier == blocks.earlier);
      REQUIRE(plan.launches.size() == 2);  // no serial form: no output
      CHECK(plan.launches[0].spec.phase == cuda::ChunkedPhase::states);
      CHECK(plan.launches[0].over == Over::earlier_segments);
      CHECK(plan.launches[1].spec.phase == cuda::ChunkedPhase::fold);
      CHECK(plan.launches[1].over == Over::all_segments);
      for (const gpu::ChunkedLaunch& launch : plan.launches) {
        CHECK(launch.spec.segmented);
        CHECK(launch.spec.reverse == reverse);
        CHECK_FALSE(launch.spec.varlen);
      }
      check_generates(*variant, plan);
    }
  const Call call(gla(), 1, 100, 1, 64, 64);
  CHECK_THROWS_AS(gpu::plan_entry_states(gla(), call.bound, call.options, cuda::ChunkedSegments{}, gpu::named_target("sm_90a")),
                  InvalidArgument);
}

TEST_CASE("the delta rule's plan: prepare over the chunks, the states pass over the sequences, the outputs over the chunks", "[plan]") {
  using DeltaOver = gpu::ChunkedDeltaLaunch::Over;
  RunOptions chunked;
  chunked.algorithm = Algorithm::chunked;
  for (const char* op : {"delta_rule", "gated_delta_rule"})
    for (const std::int64_t K : {128, 60}) {
      const ir::Variant& variant = named_variant(op);
      INFO(op << " K = " << K);
      const Call call(variant, 2, 1000, 4, K, 128, chunked);
      const gpu::ChunkedDeltaPlan plan = gpu::plan_chunked_delta(variant, call.bound, call.options);
      REQUIRE(plan.launches.size() == 3);
      CHECK((plan.launches[0].spec.phase == cuda::ChunkedDeltaPhase::prepare && plan.launches[0].over == DeltaOver::chunks));
      CHECK((plan.launches[1].spec.phase == cuda::ChunkedDeltaPhase::states && plan.launches[1].over == DeltaOver::sequences));
      CHECK((plan.launches[2].spec.phase == cuda::ChunkedDeltaPhase::outputs && plan.launches[2].over == DeltaOver::chunks));
      for (const auto& launch : plan.launches) {
        CHECK(launch.spec.vector_loads == (K % 8 == 0));  // 16-byte rows where the features come in whole 16 bytes
        CHECK(launch.spec.block_k == plan.launches[0].spec.block_k);
      }
      // ladle-dump shows the plan's kernels, in its order.
      const std::vector<GeneratedKernel> shown = generated_kernels(variant, call.bound, chunked, "sm_90a");
      REQUIRE(shown.size() == 3);
      const char* roles[] = {"delta prepare", "delta states", "delta outputs"};
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(shown[i].name == cuda::generate_chunked_delta(variant, plan.launches[i].spec).name);
        CHECK(shown[i].role == roles[i]);
      }
    }
}
