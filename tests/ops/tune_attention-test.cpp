// The softmax-attention family in the autotuner, without a GPU: its search space (enumeration,
// validity against an H100's and an A100's limits with reasons that name the limit, the cost
// model's ranking and pruning), the heuristic tile's place in it, the tuned-config keys (apart
// from the recurrence families', and by flags, dtype, shape bucket, head dims and device), the
// heuristic policy without a device, and a tuning through the Tuner with a fake candidate and
// clock.
#include <catch2/catch.hpp>

#include <ladle/ops/attention.h>
#include <ladle/ops/attention_bind.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/ops/gpu_attention_backward.h>
#include <ladle/ops/tune_attention.h>
#include <ladle/ops/tune_recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "runtime/scoped_env.h"
#include "runtime/tune_fixtures.h"

using namespace ladle;
using gpu::AttentionTuneShape;
using gpu::to_attention_tile;
using gpu::to_config;

namespace {

using ladle::test::a100;
using ladle::test::h100;

// The limits heuristic_attention_tile() read: this GPU's when there is one, else (CI) the
// 132 SMs it assumes without a device.
DeviceLimits heuristic_device() {
  return driver_available() ? DeviceLimits::from(Device::get().properties()) : h100();
}

constexpr auto mma_sync = cuda::AttentionMma::sync;
constexpr auto wgmma = cuda::AttentionMma::wgmma;

Config tile(int block_m, int block_n, int warps, int stages, cuda::AttentionMma mma = mma_sync) {
  cuda::AttentionTile t;
  t.block_m = block_m, t.block_n = block_n, t.warps = warps, t.stages = stages, t.mma = mma;
  return to_config(t);
}

// A call's bound arguments at any size without the memory: every tensor is one element seen
// through zero strides (binding checks shapes and dtypes, never reads the data).
struct Call {
  AttentionFeatures features;
  DType type;
  alignas(16) float element[4] = {};
  VariantInputs inputs;
  AttentionRunOptions options;
  ops::AttentionArgs args;

  Call(std::int64_t B, std::int64_t Tq, std::int64_t H, std::int64_t D, AttentionFeatures f = causal(),
       DType t = DType::bf16, std::int64_t H_kv = 0, std::int64_t Dv = 0, std::int64_t Tk = 0,
       std::int64_t window_left = 1024)
      : features(f), type(t) {
    if (!H_kv) H_kv = H;
    if (!Dv) Dv = D;
    if (!Tk) Tk = Tq;
    auto view = [&](DType of, std::vector<std::int64_t> shape) {
      TensorView broadcast;
      broadcast.data = element;
      broadcast.type = of;
      broadcast.strides.assign(shape.size(), 0);
      broadcast.shape = std::move(shape);
      return broadcast;
    };
    inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(D)));
    if (f.soft_cap) inputs.scalars.emplace("logits_soft_cap", 30.0f);
    if (f.bias) inputs.tensors.emplace("bias", view(type, {B, H, Tq, Tk}));
    if (f.mask) inputs.tensors.emplace("attention_mask", view(DType::u8, {B, H, Tq, Tk}));
    if (f.window) options.window_left = window_left, options.window_right = 0;
    if (f.segment_ids) {
      options.q_segment_ids = view(DType::i32, {B, Tq});
      options.kv_segment_ids = view(DType::i32, {B, Tk});
    }
    if (f.sinks) options.softmax_aux = view(DType::f32, {H, 4});
    if (f.dropout) options.dropout_p = 0.1f;
    args = ops::bind_attention("attention", variant(), view(type, {B, Tq, H, D}), view(type, {B, Tk, H_kv, D}),
                               view(type, {B, Tk, H_kv, Dv}), inputs, options);
  }

  static AttentionFeatures causal() {
    AttentionFeatures f;
    f.causal = true;
    return f;
  }
  const ir::AttentionVariant& variant() const { return attention_variant(features); }
  AttentionTuneShape shape() const { return AttentionTuneShape::of(variant(), args); }
  cuda::AttentionTile heuristic() const { return gpu::heuristic_attention_tile(args); }
  cuda::AttentionKernelSpec spec() const { return gpu::attention_kernel_spec(variant(), args, heuristic()); }
  // The views see one element through zero strides: no rows TMA could copy (async_copy false),
  // as the launcher would find; space(true) is the space of aligned rows.
  SearchSpace space(bool async_copy = false) const { return gpu::attention_search_space(shape(), type, async_copy); }
  TunedKey key(const DeviceLimits& device = h100()) const {
    return gpu::attention_tune_key(variant(), spec(), shape(), device);
  }
};

}  // namespace

TEST_CASE("attention configs name block_m, block_n, warps, stages and mma, and convert back to the tile") {
  cuda::AttentionTile t;
  t.block_m = 64, t.block_n = 128, t.warps = 4, t.stages = 1;
  const Config config = to_config(t);
  REQUIRE(config.to_string() == "block_m=64 block_n=128 warps=4 stages=1 mma=0");
  REQUIRE(to_attention_tile(config) == t);
  t.mma = wgmma;
  REQUIRE(to_config(t).to_string() == "block_m=64 block_n=128 warps=4 stages=1 mma=1");
  REQUIRE(to_attention_tile(to_config(t)) == t);
  REQUIRE(to_attention_tile(to_config(cuda::AttentionTile{})) == cuda::AttentionTile{});
  REQUIRE_THROWS_WITH(to_attention_tile(Config{{"block_m", 64}}), Catch::Contains("'block_n'"));
}

TEST_CASE("the attention space is block_m x block_n x warps x stages x mma, warps agreeing with block_m") {
  const Call call(8, 4096, 16, 128);
  const SearchSpace space = call.space();
  REQUIRE(space.size() == 3 * 3 * 3 * 4 * 3);
  REQUIRE(space.has_cost_model());
  for (const Config& c : space.all()) {
    REQUIRE(std::set<int>{64, 128, 192}.count(c["block_m"]));
    REQUIRE(std::set<int>{32, 64, 128}.count(c["block_n"]));
    REQUIRE(std::set<int>{4, 8, 12}.count(c["warps"]));
    REQUIRE(std::set<int>{1, 2, 3, 4}.count(c["stages"]));
    REQUIRE(std::set<int>{0, 1, 2}.count(c["mma"]));
  }
  // Most combinations put 16 rows on other than one warp; stages 3 and 4 are ws's only, so are 192
  // rows (three consumer warpgroups), and ws needs rows TMA can copy. At D=128 on an H100: 12 sync
  // and 12 wgmma; with aligned rows also the 16 ws tiles of one or two consumer warpgroups whose ring
  // fits 227 KiB and whose fragments fit 192 registers, and the 6 of three (32 or 64 keys, whose
  // fragments fit their 128); an A100 has neither wgmma nor ws: 12.
  const auto valid = space.enumerate(h100());
  REQUIRE(valid.size() == 24);
  const auto aligned = call.space(true).enumerate(h100());
  REQUIRE(aligned.size() == 46);
  REQUIRE(std::count_if(aligned.begin(), aligned.end(), [](const Config& c) { return c["warps"] == 12; }) == 6);
  for (const Config& c : aligned) REQUIRE((c["stages"] <= 2 || c["mma"] == 2));
  REQUIRE_THAT(*space.why_invalid(tile(128, 128, 8, 2, cuda::AttentionMma::ws), h100()), Catch::Contains("TMA"));
  REQUIRE_THAT(*call.space(true).why_invalid(tile(128, 128, 8, 4, cuda::AttentionMma::ws), h100()), Catch::Contains("shared memory"));
  REQUIRE_THAT(*call.space(true).why_invalid(tile(128, 64, 8, 3), h100()), Catch::Contains("expected 1 or 2"));
  for (const Config& c : valid) REQUIRE(c["block_m"] == 16 * c["warps"]);
  REQUIRE_THAT(*space.why_invalid(tile(128, 64, 4, 2), h100()), Catch::Contains("block_m = 16 * warps"));
  const auto on_a100 = space.enumerate(a100());
  REQUIRE(on_a100.size() == 12);
  for (const Config& c : on_a100) REQUIRE(c["mma"] == 0);
  REQUIRE_THAT(*space.why_invalid(tile(128, 64, 8, 2, wgmma), a100()), Catch::Contains("needs the target sm_90a") && Catch::Contains("sm_80"));
  // fp32 inputs go through split bf16 pairs on mma.sync only.
  const Call f32(8, 4096, 16, 64, Call::causal(), DType::f32);
  REQUIRE_THAT(*f32.space().why_invalid(tile(128, 64, 8, 2, wgmma), h100()), Catch::Contains("fp32 inputs"));
}

TEST_CASE("the attention space's validity is validate_attention_tile with the device's shared memory") {
  struct Dims {
    int D, Dv;
    DType type;
  };
  for (const Dims dims : {Dims{64, 64, DType::bf16}, Dims{128, 128, DType::bf16}, Dims{128, 128, DType::f16},
                          Dims{256, 64, DType::bf16}, Dims{192, 192, DType::bf16}, Dims{128, 64, DType::f32},
                          Dims{80, 80, DType::f32}}) {
    for (const DeviceLimits& device : {h100(), a100()}) {
      const Call call(8, 4096, 16, dims.D, Call::causal(), dims.type, 16, dims.Dv);
      const bool split = dims.type == DType::f32;
      std::size_t valid = 0;
      for (const auto& [config, reason] : call.space().explain(device)) {
        const auto problems = cuda::validate_attention_tile(to_attention_tile(config), dims.D, dims.Dv,
                                                            device.max_shared_per_block, split, device.arch);
        INFO("D=" << dims.D << " Dv=" << dims.Dv << " " << dtype_name(dims.type) << " on " << device.name << ": "
                  << config.to_string());
        const bool ws_copy = to_attention_tile(config).mma == cuda::AttentionMma::ws && problems.empty();  // no aligned rows
        REQUIRE(reason.has_value() == (!problems.empty() || ws_copy));
        if (ws_copy) REQUIRE_THAT(*reason, Catch::Contains("TMA"));
        if (reason && !problems.empty()) REQUIRE_THAT(*reason, Catch::Contains(problems.front()));
        valid += !reason;
      }
      REQUIRE(valid > 0);
      REQUIRE(valid < call.space().size());
    }
  }
  SECTION("the register guard: 128-key tiles at D=Dv=192, mma.sync at D=Dv=256") {
    const Call wide(8, 4096, 16, 192);
    REQUIRE_THAT(*wide.space().why_invalid(tile(128, 128, 8, 2), h100()),
                 Catch::Contains("fragment values") && Catch::Contains("at most 160"));
    REQUIRE_FALSE(wide.space().why_invalid(tile(128, 32, 8, 2), h100()));
    REQUIRE(Call(8, 4096, 16, 256).space().enumerate(a100()).empty());
    for (const Config& c : Call(8, 4096, 16, 256).space().enumerate(h100())) REQUIRE(c["mma"] != 0);  // q in shared memory
  }
  SECTION("D=256 Dv=64, 128-key tiles, 2 stages: fit an H100's 227 KiB, not an A100's 163 KiB") {
    const Call call(8, 4096, 16, 256, Call::causal(), DType::bf16, 16, 64);
    const Config config = tile(128, 128, 8, 2);
    const int bytes = cuda::attention_shared_bytes(to_attention_tile(config), 256, 64, false);
    REQUIRE(bytes > 166912);
    REQUIRE(bytes <= 232448);
    REQUIRE_FALSE(call.space().why_invalid(config, h100()));
    const auto reason = call.space().why_invalid(config, a100());
    REQUIRE(reason);
    REQUIRE_THAT(*reason, Catch::Contains("shared memory") && Catch::Contains("166912"));
    REQUIRE_FALSE(call.space().why_invalid(tile(128, 128, 8, 1), a100()));
    REQUIRE(call.space().enumerate(a100()).size() < call.space().enumerate(h100()).size() / 2);
  }
  SECTION("fp32 inputs split into bf16 pairs: twice the shared memory, past a small device's limit") {
    const Call f32(8, 4096, 16, 128, Call::causal(), DType::f32, 16, 64);
    const Call bf16(8, 4096, 16, 128, Call::causal(), DType::bf16, 16, 64);
    const Config config = tile(128, 128, 8, 2);
    REQUIRE(cuda::attention_shared_bytes(to_attention_tile(config), 128, 64, true) == 212992);
    REQUIRE_FALSE(f32.space().why_invalid(config, h100()));
    REQUIRE_THAT(*f32.space().why_invalid(config, a100()), Catch::Contains("166912"));
    REQUIRE_FALSE(bf16.space().why_invalid(config, a100()));
  }
  SECTION("more threads than the device allows") {
    DeviceLimits small = h100();
    small.max_threads_per_block = 128;
    const Call call(8, 4096, 16, 128);
    REQUIRE_THAT(*call.space().why_invalid(tile(128, 64, 8, 2), small), Catch::Contains("256 threads > 128"));
    REQUIRE_FALSE(call.space().why_invalid(tile(64, 64, 4, 2), small));
  }
}

TEST_CASE("the heuristic attention tile is valid and in the space at D=64, 128 and 192") {
  const DeviceLimits device = heuristic_device();
  for (int D : {64, 128, 192}) {
    for (const auto& [B, T] : std::vector<std::pair<int, int>>{{8, 4096}, {2, 16384}, {1, 1024}, {1, 128}}) {
      for (DType type : {DType::bf16, DType::f16}) {
        const Call call(B, T, 16, D, Call::causal(), type);
        const Config heuristic = to_config(call.heuristic());
        INFO("B" << B << " T" << T << " D" << D << " " << dtype_name(type) << ": " << heuristic.to_string());
        REQUIRE_FALSE(call.space().why_invalid(heuristic, device));
        const auto valid = call.space().enumerate(device);
        REQUIRE(std::find(valid.begin(), valid.end(), heuristic) != valid.end());
        REQUIRE_NOTHROW(Tuner(call.space(), device, heuristic));
      }
    }
  }
}

TEST_CASE("the cost model ranks the heuristic first at the benchmark shapes and at D=64, and prunes") {
  // Planned from a poor start, the model's own best comes right after it.
  const Config poor = tile(64, 32, 4, 1);
  struct Shape {
    int B, T, D;
  };
  for (const Shape s : {Shape{8, 4096, 128}, Shape{2, 16384, 128}, Shape{8, 4096, 64}, Shape{2, 16384, 64}}) {
    for (const DeviceLimits& device : {h100(), a100()}) {
      const Call call(s.B, s.T, 16, s.D);
      INFO("B" << s.B << " T" << s.T << " D" << s.D << " on " << device.name);
      const TunePlan from_poor = call.space().plan(device, poor, 64);
      REQUIRE(from_poor.configs.size() == (device.arch == "sm_90a" ? 24u : 12u));
      REQUIRE(from_poor.configs[1] == to_config(call.heuristic()));
      REQUIRE(call.heuristic() == cuda::AttentionTile{});  // 128 x 64, 8 warps, 2 stages
    }
  }
  SECTION("the sliding window + soft cap and the sinks + GQA benchmark cases too") {
    AttentionFeatures window;
    window.window = window.soft_cap = true;
    AttentionFeatures sinks = Call::causal();
    sinks.sinks = true;
    const Call windowed(8, 4096, 16, 128, window), gqa(8, 4096, 16, 128, sinks, DType::bf16, 2);
    REQUIRE(windowed.space().plan(h100(), poor, 64).configs[1] == to_config(windowed.heuristic()));
    REQUIRE(gqa.space().plan(h100(), poor, 64).configs[1] == to_config(gqa.heuristic()));
  }
  SECTION("wgmma, modelled at mma.sync's rate until measured, ranks right after its mma.sync twin") {
    const Call call(8, 4096, 16, 128);
    const auto order = call.space().plan(h100(), poor, 64).configs;
    REQUIRE(order[1] == tile(128, 64, 8, 2, mma_sync));
    REQUIRE(order[2] == tile(128, 64, 8, 2, wgmma));
    // At D=192 mma.sync holds 160 fragment values a thread, wgmma (q in shared memory) 120.
    const Call wide(8, 4096, 16, 192);
    REQUIRE(wide.space().plan(h100(), tile(64, 32, 4, 1), 64).configs[1] == tile(128, 32, 8, 2, wgmma));
  }
  SECTION("few (sequence, head) pairs: 64-row tiles rank first, as the heuristic picks them") {
    const Call call(1, 1024, 8, 128);  // 8 x 8 blocks of 128 rows, 132 SMs
    const cuda::AttentionTile heuristic = call.heuristic();
    REQUIRE(heuristic.block_m == 64);
    REQUIRE(heuristic.warps == 4);
    REQUIRE(call.space().plan(h100(), poor, 64).configs[1] == to_config(heuristic));
  }
  SECTION("the plan from the heuristic keeps max_candidates, the heuristic among them") {
    const Call call(8, 4096, 16, 128);
    const Config heuristic = to_config(call.heuristic());
    const TunePlan plan = call.space().plan(h100(), heuristic, 4);
    REQUIRE(plan.space_size == 324);
    REQUIRE(plan.valid == 24);
    REQUIRE(plan.configs.size() == 4);
    REQUIRE(plan.pruned == 24 - 4);
    REQUIRE(plan.configs.front() == heuristic);
    REQUIRE(std::set<Config>(plan.configs.begin(), plan.configs.end()).size() == plan.configs.size());
    const TunePlan all = call.space().plan(h100(), heuristic, 64);
    REQUIRE(all.pruned == 0);
    REQUIRE(std::equal(plan.configs.begin(), plan.configs.end(), all.configs.begin()));  // a prefix of the order
    // Pruned: the slowest by the model, e.g. 64 x 32 tiles with one stage.
    REQUIRE(std::find(plan.configs.begin(), plan.configs.end(), poor) == plan.configs.end());
  }
  SECTION("two stages rank before one, unless the second stage costs a resident block") {
    const Call call(8, 4096, 16, 128);
    const auto order = call.space().plan(h100(), to_config(call.heuristic()), 64).configs;
    auto rank = [&](const Config& c) { return std::find(order.begin(), order.end(), c) - order.begin(); };
    for (int block_n : {32, 64, 128}) REQUIRE(rank(tile(128, block_n, 8, 2)) < rank(tile(128, block_n, 8, 1)));
    for (int block_n : {32, 64}) REQUIRE(rank(tile(64, block_n, 4, 2)) < rank(tile(64, block_n, 4, 1)));
    // 64 x 128 at D=128: two stages take 136 KiB, one block per SM; one stage lets two in.
    REQUIRE(rank(tile(64, 128, 4, 1)) < rank(tile(64, 128, 4, 2)));
  }
}

TEST_CASE("a sliding window's span is in the attention key, by power-of-two bucket") {
  AttentionFeatures window;
  window.window = window.soft_cap = true;
  const auto key = [&](std::int64_t left) {
    return Call(8, 4096, 16, 128, window, DType::bf16, 0, 0, 0, left).key();
  };
  REQUIRE_THAT(key(1024).shape_bucket, Catch::EndsWith("-W1024"));  // 1024 keys left of the diagonal, 0 right
  REQUIRE(key(1000) == key(1024));
  REQUIRE(key(1024).hash() != key(8192).hash());
  REQUIRE(key(-1).hash() != key(1024).hash());  // unbounded on the left: every key up to i
  REQUIRE_THAT(Call(8, 4096, 16, 128).key().shape_bucket, !Catch::Contains("-W"));  // no window, no span
}

TEST_CASE("attention keys are apart from the recurrence families' and differ by flags, dtype, bucket, dims, device") {
  const Call call(8, 4096, 16, 128);
  const TunedKey key = call.key();
  REQUIRE(key.family == "attention");
  REQUIRE(key.shape_bucket == "N8-Tq4096-Tk4096-H16-Hkv16-D128-Dv128");
  REQUIRE(key.dtype == "bf16");
  REQUIRE(key.gpu == "NVIDIA H100 80GB HBM3");
  REQUIRE(key.sm_count == 132);
  REQUIRE_THAT(key.variant, Catch::StartsWith(ir::hash_hex(call.variant()) + "-vfalselfalse"));
  REQUIRE_THAT(key.variant, Catch::EndsWith("-bf16-bf16-bf16-f32"));  // q, k, v, scale
  // Another family of the same bucket, dtype and device: another key.
  for (std::string_view family : {gpu::recurrent_family, gpu::chunked_family}) {
    const TunedKey other = TunedKey::make(std::string(family), key.variant, key.shape_bucket, key.dtype, h100());
    REQUIRE(other.hash() != key.hash());
  }
  // The kernel's flags: varlen, lse, cp.async.
  for (auto flip : {+[](cuda::AttentionKernelSpec& s) { s.varlen = !s.varlen; },
                    +[](cuda::AttentionKernelSpec& s) { s.lse = !s.lse; },
                    +[](cuda::AttentionKernelSpec& s) { s.async_copy = !s.async_copy; },
                    +[](cuda::AttentionKernelSpec& s) { s.output_type = DType::f32; }}) {
    cuda::AttentionKernelSpec spec = call.spec();
    flip(spec);
    REQUIRE(gpu::attention_tune_key(call.variant(), spec, call.shape(), h100()).hash() != key.hash());
  }
  // The tile is not in the key.
  cuda::AttentionKernelSpec other_tile = call.spec();
  other_tile.tile.block_n = 32;
  REQUIRE(gpu::attention_tune_key(call.variant(), other_tile, call.shape(), h100()) == key);

  const Call f16(8, 4096, 16, 128, Call::causal(), DType::f16);
  REQUIRE(f16.key().dtype == "f16");
  REQUIRE(f16.key().hash() != key.hash());
  // Within a bucket: one key (N, Tq and Tk by powers of two).
  REQUIRE(Call(8, 3000, 16, 128).key() == key);
  REQUIRE(Call(6, 4096, 16, 128).key() == key);
  AttentionFeatures plain;
  AttentionFeatures sinks = Call::causal();
  sinks.sinks = true;
  // Another bucket, head count, head dim, variant or device: another key.
  for (const TunedKey& other :
       {Call(8, 8192, 16, 128).key(), Call(16, 4096, 16, 128).key(), Call(8, 4096, 8, 128).key(),
        Call(8, 4096, 16, 128, Call::causal(), DType::bf16, 2).key(),
        Call(8, 4096, 16, 64).key(), Call(8, 4096, 16, 128, Call::causal(), DType::bf16, 16, 64).key(),
        Call(8, 4096, 16, 128, Call::causal(), DType::bf16, 16, 128, 8192).key(), call.key(a100()),
        Call(8, 4096, 16, 128, plain).key(), Call(8, 4096, 16, 128, sinks).key()}) {
    INFO(other.to_string());
    REQUIRE(other.hash() != key.hash());
  }
  REQUIRE(Call(8, 4096, 16, 128, Call::causal(), DType::bf16, 16, 128, 8192).key().shape_bucket ==
          "N8-Tq4096-Tk8192-H16-Hkv16-D128-Dv128");
  REQUIRE_THAT(Call(8, 4096, 16, 128, sinks).key().variant, Catch::EndsWith("-f32-f32"));  // scale, then sinks
}

TEST_CASE("policy heuristic returns the heuristic attention tile without a device or a job") {
  const Call call(8, 4096, 16, 128);
  TuneOptions options;
  options.policy = Policy::heuristic;
  cuda::AttentionTile odd;  // whatever the caller passes is returned
  odd.block_m = 64, odd.block_n = 32, odd.warps = 4, odd.stages = 1;
  REQUIRE(gpu::tuned_attention_tile(call.variant(), call.args, odd, options) == odd);
  if (!driver_available()) {
    options.policy = Policy::cached;
    REQUIRE_THROWS_AS(gpu::tuned_attention_tile(call.variant(), call.args, odd, options), NoCudaDriver);
  }
}

TEST_CASE("tuning the attention space picks the fastest valid candidate and rejects a mismatching one") {
  const Call call(8, 4096, 16, 128);
  const Config heuristic = to_config(call.heuristic());
  const Tuner tuner(call.space(), h100(), heuristic);
  test::FakeCandidate fake;
  // The "GPU": wider key tiles, two stages, 64-row blocks and wgmma are faster.
  fake.time_of = [](const Config& c) {
    return 1.0 + 16.0 / c["block_n"] + 0.1 / c["stages"] + 0.0001 * c["block_m"] - 0.01 * c["mma"];
  };
  const auto valid = call.space().enumerate(h100());
  auto by_time = valid;
  std::stable_sort(by_time.begin(), by_time.end(),
                   [&](const Config& a, const Config& b) { return fake.time_of(a) < fake.time_of(b); });
  const Config fastest = by_time[0], second = by_time[1];
  REQUIRE(fastest == tile(64, 128, 4, 2, wgmma));
  REQUIRE(second == tile(128, 128, 8, 2, wgmma));
  REQUIRE(fake.time_of(heuristic) > fake.time_of(second));
  fake.fail_check.insert(fastest);  // its output differs from the heuristic's

  test::FakeTuning tuning(fake);
  const TunedKey key = call.key();
  const TuneResult result = tuner.tune(key, fake, tuning.options);
  tuning.check_second_wins(result, fake, key, fastest, second, valid.size());
  REQUIRE(result.heuristic == heuristic);
  REQUIRE(result.space_size == 324);
  for (const Config& timed : fake.timed) REQUIRE_FALSE(call.space().why_invalid(timed, h100()));
  REQUIRE(tuning.cache.list().size() == 1);
  for (std::string_view family : {gpu::recurrent_family, gpu::chunked_family})
    REQUIRE_FALSE(tuning.cache.lookup(TunedKey::make(std::string(family), key.variant, key.shape_bucket, key.dtype, h100())));
}

TEST_CASE("the heuristic tile fits every head dim wherever some tile of the space fits, without a tile named") {
  // Issue 12: D = Dv = 256 bf16 threw "does not fit" unless the caller named a tile.
  int checked = 0;
  for (const DType type : {DType::bf16, DType::f32})
    for (const std::int64_t D : {1, 8, 40, 64, 100, 128, 160, 192, 200, 256})
      for (const std::int64_t Dv : {D, std::int64_t{64}, std::int64_t{256}})
        for (const DeviceLimits& device : {h100(), a100()}) {
          const Call call(8, 4096, 16, D, Call::causal(), type, 16, Dv);
          const cuda::AttentionTile tile =
              gpu::heuristic_attention_tile(call.args, device.sm_count, device.arch, device.max_shared_per_block);
          const bool split = type == DType::f32;
          const auto problems = cuda::validate_attention_tile(tile, static_cast<int>(D), static_cast<int>(Dv),
                                                              device.max_shared_per_block, split, device.arch);
          INFO(dtype_name(type) << " D=" << D << " Dv=" << Dv << " on " << device.name << ": "
                                       << cuda::to_string(tile) << (problems.empty() ? "" : ": " + problems.front()));
          if (call.space().enumerate(device).empty()) {
            REQUIRE_FALSE(problems.empty());  // nothing fits (mma.sync at D = 256 on sm_80): the launcher says why
            continue;
          }
          REQUIRE(problems.empty());
          ++checked;
          if (D <= 128 && Dv <= 128 && !split) REQUIRE(tile == cuda::default_attention_tile(128, 128));  // unchanged
          if (D == 256 && Dv == 256 && device.arch == "sm_90a") REQUIRE(tile.mma == cuda::AttentionMma::wgmma);
        }
  REQUIRE(checked > 80);
}

TEST_CASE("on sm_90a the heuristic takes the ws pipeline where TMA can copy the rows") {
  // The views of Call with contiguous strides (the data is never read): rows TMA can copy.
  const auto aligned = [](Call& call) {
    ops::AttentionArgs& a = call.args;
    const auto dense = [&](TensorView& v) { v = TensorView::contiguous(v.data, v.type, v.shape); };
    dense(a.q), dense(a.k), dense(a.v);
    for (int i = 0; i < 3; ++i) dense(a.tensors[i]);
  };
  const auto pick = [](const Call& call, const DeviceLimits& device) {
    return gpu::heuristic_attention_tile(call.args, device.sm_count, device.arch, device.max_shared_per_block);
  };
  using cuda::AttentionMma;
  Call causal(8, 4096, 16, 128);
  aligned(causal);
  REQUIRE(pick(causal, h100()) == cuda::AttentionTile{128, 128, 8, 2, AttentionMma::ws});
  REQUIRE(pick(causal, a100()).mma == AttentionMma::sync);  // no wgmma, no TMA
  REQUIRE(pick(Call(8, 4096, 16, 128), h100()).mma == AttentionMma::sync);  // zero strides: no TMA copy
  // 64-key tiles for dropout, pair inputs and segment ids, and past D = 128; 128 for a window.
  AttentionFeatures window;
  window.window = window.soft_cap = true;
  AttentionFeatures dropout = Call::causal();
  dropout.dropout = true;
  AttentionFeatures bias = Call::causal();
  bias.bias = true;
  AttentionFeatures sinks = Call::causal();
  sinks.sinks = true;
  for (const auto& [features, D, block_n] : {std::tuple{window, 128, 128}, std::tuple{dropout, 128, 64}, std::tuple{bias, 128, 64},
                                             std::tuple{sinks, 128, 128}, std::tuple{Call::causal(), 256, 64},
                                             std::tuple{Call::causal(), 64, 128}}) {
    Call call(8, 4096, 16, D, features);
    aligned(call);
    const cuda::AttentionTile tile = pick(call, h100());
    INFO("D=" << D << ": " << cuda::to_string(tile));
    REQUIRE(tile.mma == AttentionMma::ws);
    REQUIRE(tile.block_n == block_n);
    REQUIRE(cuda::validate_attention_tile(tile, D, D, h100().max_shared_per_block, false, "sm_90a").empty());
  }
  // Head dims to 64 take three consumer warpgroups where the shape fills the GPU, but not with a
  // window (bench/RESULTS.md, H19), nor on a shape of fewer 192-row blocks than SMs.
  Call causal64(8, 4096, 16, 64);
  aligned(causal64);
  REQUIRE(pick(causal64, h100()) == cuda::AttentionTile{192, 128, 12, 3, AttentionMma::ws});
  Call sinks64(8, 4096, 16, 64, sinks, DType::bf16, 2);
  aligned(sinks64);
  REQUIRE(pick(sinks64, h100()).warps == 12);
  Call window64(8, 4096, 16, 64, window);
  aligned(window64);
  REQUIRE(pick(window64, h100()) == cuda::AttentionTile{128, 128, 8, 2, AttentionMma::ws});
  Call short64(1, 1024, 16, 64);  // 16 x 6 = 96 row blocks of 192
  aligned(short64);
  REQUIRE(pick(short64, h100()).warps != 12);
  // fp32 inputs and head dims TMA cannot copy keep the other families.
  Call f32(8, 4096, 16, 64, Call::causal(), DType::f32);
  aligned(f32);
  REQUIRE(pick(f32, h100()).mma == AttentionMma::sync);
  Call odd(8, 4096, 16, 100);
  aligned(odd);
  REQUIRE(pick(odd, h100()).mma != AttentionMma::ws);
}

TEST_CASE("a few query tokens against many keys take the decode form, its splits filling the GPU") {
  const auto pick = [](const Call& call, const DeviceLimits& device) {
    return gpu::heuristic_attention_tile(call.args, device.sm_count, device.arch, device.max_shared_per_block);
  };
  using cuda::AttentionMma;
  AttentionFeatures plain;
  // B64 Tq1 Tk8192 H32:8 D128: 4 rows a group, four warps splitting each tile, three stages in flight;
  // 512 groups of 128 key tiles.
  Call decode(64, 1, 32, 128, plain, DType::bf16, 8, 0, 8192);
  const cuda::AttentionTile tile = pick(decode, h100());
  REQUIRE(tile == cuda::AttentionTile{16, 64, 4, 3, AttentionMma::decode});
  REQUIRE(pick(decode, a100()).mma == AttentionMma::decode);  // mma.sync: sm_80 too
  TuneOptions force;
  force.policy = Policy::force;
  REQUIRE(gpu::tuned_attention_tile(decode.variant(), decode.args, tile, force) == tile);  // never tuned, no device touched
  const gpu::AttentionDecodeSplit split = gpu::attention_decode_split(decode.args, tile, 132);
  // Two blocks an SM (three stages of K and V each): 512 blocks of all 128 tiles in 2 waves beat 1024 of
  // 64 in 4 and 1536 of 43 in 6 (measured on the H200: bench/RESULTS.md, H18).
  CHECK(split.splits == 1);
  CHECK(static_cast<std::int64_t>(split.splits) * split.split_len >= 8192);
  CHECK((static_cast<std::int64_t>(split.splits) - 1) * split.split_len < 8192);  // no split empty
  CHECK(split.split_len % tile.block_n == 0);
  CHECK(split.partial_rows == 1);
  // One sequence of 16 tokens, GQA 8:1: 128 rows, four row warps a block, the keys split many ways.
  Call wide(1, 16, 8, 64, Call::causal(), DType::bf16, 1, 0, 32768);
  const cuda::AttentionTile four = pick(wide, h100());
  REQUIRE(four == cuda::AttentionTile{64, 64, 4, 2, AttentionMma::decode});
  CHECK(gpu::attention_decode_split(wide.args, four, 132).splits == 64);  // eight tiles a split, 128 blocks: one wave
  // A long context in few groups (B1 Tk128K H32:8: 8 groups of 2048 tiles): 33 splits of 63 tiles, one wave
  // of 264 blocks (two an SM).
  Call longest(1, 1, 32, 128, plain, DType::bf16, 8, 0, 131072);
  const gpu::AttentionDecodeSplit waves = gpu::attention_decode_split(longest.args, pick(longest, h100()), 132);
  CHECK(waves.splits == 33);
  CHECK(waves.split_len == 63 * 64);
  // Not decode-shaped: more query tokens, too few keys, dropout; D = 256 (no mma.sync tile fits).
  CHECK(pick(Call(64, 17, 32, 128, plain, DType::bf16, 8, 0, 8192), h100()).mma != AttentionMma::decode);
  CHECK(pick(Call(64, 4, 32, 128, plain, DType::bf16, 8, 0, 24), h100()).mma != AttentionMma::decode);
  AttentionFeatures dropout;
  dropout.dropout = true;
  CHECK(pick(Call(64, 1, 32, 128, dropout, DType::bf16, 8, 0, 8192), h100()).mma != AttentionMma::decode);
  CHECK(pick(Call(8, 1, 32, 256, plain, DType::bf16, 8, 0, 8192), h100()).mma != AttentionMma::decode);
  CHECK(pick(Call(8192, 1, 64, 64, plain, DType::bf16, 16, 0, 256), h100()).mma != AttentionMma::decode);  // 131072 pairs: past the grid
}

// ---- The backward's tiles

namespace {

// A backward call's gradients over the Call's one element (never read here): dq contiguous,
// 16-byte aligned (TMA may add into it) unless `odd_dq`.
cpu::AttentionGrads grads_of(Call& call, bool odd_dq = false) {
  const auto contiguous = [&](DType of, std::vector<std::int64_t> shape) {
    return TensorView::contiguous(call.element, of, std::move(shape));
  };
  const ops::AttentionArgs& a = call.args;
  cpu::AttentionGrads g;
  g.d_output = contiguous(call.type, {a.B, a.Tq, a.H, a.Dv});
  g.dq = contiguous(DType::f32, {a.B, a.Tq, a.H, a.D});
  if (odd_dq) g.dq.data = call.element + 1;
  g.dk = contiguous(DType::f32, {a.B, a.Tk, a.H_kv, a.D});
  g.dv = contiguous(DType::f32, {a.B, a.Tk, a.H_kv, a.Dv});
  return g;
}

Config bwd(int stages, bool tma) { return gpu::to_config(cuda::AttentionBackwardTile{stages, tma}); }

}  // namespace

TEST_CASE("the attention backward's space is stages x dq path, valid where shared memory and dq allow") {
  Call call(8, 4096, 16, 128);
  const cuda::AttentionBackwardTile tile{3, false};
  REQUIRE(gpu::to_config(tile).to_string() == bwd(3, false).to_string());
  REQUIRE(gpu::to_attention_backward_tile(bwd(4, true)).stages == 4);
  REQUIRE(gpu::to_attention_backward_tile(bwd(4, true)).dq_tma);
  REQUIRE(cuda::to_string(tile) == "stages=3 dq=red");

  const cpu::AttentionGrads grads = grads_of(call);
  const cuda::AttentionBackwardSpec base = gpu::attention_backward_spec(call.variant(), call.args, grads);
  REQUIRE(base.dq_tma);
  const SearchSpace space = gpu::attention_backward_search_space(call.variant(), base);
  const auto valid = space.enumerate(h100());
  // D = 128: dQ's 32 KiB stage fits beside 2 or 3 stages of q / d_output, not 4.
  for (const Config& c : {bwd(2, true), bwd(3, true), bwd(2, false), bwd(3, false), bwd(4, false)})
    CHECK(std::find(valid.begin(), valid.end(), c) != valid.end());
  CHECK(valid.size() == 5);
  CHECK_THAT(space.why_invalid(bwd(4, true), h100()).value_or(""), Catch::Contains("does not fit beside 4 stages"));
  CHECK(std::find(valid.begin(), valid.end(), gpu::to_config(gpu::heuristic_attention_backward_tile(base))) != valid.end());
  // Another GPU: the kernels need sm_90a.
  CHECK(space.enumerate(a100()).empty());
  CHECK_THAT(space.why_invalid(bwd(2, false), a100()).value_or(""), Catch::Contains("sm_90a"));
  // At D = 64 everything fits.
  Call narrow(8, 4096, 16, 64);
  const auto narrow_grads = grads_of(narrow);
  CHECK(gpu::attention_backward_search_space(narrow.variant(), gpu::attention_backward_spec(narrow.variant(), narrow.args, narrow_grads))
            .enumerate(h100())
            .size() == 6);
  // A dq TMA cannot add into: red.global only, and the heuristic says so.
  Call odd(8, 4096, 16, 128);
  const cuda::AttentionBackwardSpec odd_base = gpu::attention_backward_spec(odd.variant(), odd.args, grads_of(odd, true));
  REQUIRE_FALSE(odd_base.dq_tma);
  const SearchSpace odd_space = gpu::attention_backward_search_space(odd.variant(), odd_base);
  CHECK(odd_space.enumerate(h100()).size() == 3);
  CHECK_THAT(odd_space.why_invalid(bwd(2, true), h100()).value_or(""), Catch::Contains("not 16-byte aligned"));
  CHECK_FALSE(gpu::heuristic_attention_backward_tile(odd_base).dq_tma);
  // with_tile keeps TMA only where it fits.
  CHECK_FALSE(cuda::with_tile(base, {4, true}).dq_tma);
  CHECK(cuda::with_tile(base, {3, true}).dq_tma);
  CHECK(cuda::with_tile(base, {3, true}).stages == 3);
}

TEST_CASE("attention backward keys are apart from the forward's and differ by the dq path, wanted gradients, dtype and shape") {
  Call call(8, 4096, 16, 128);
  const cpu::AttentionGrads grads = grads_of(call);
  const cuda::AttentionBackwardSpec base = gpu::attention_backward_spec(call.variant(), call.args, grads);
  const TunedKey key = gpu::attention_backward_tune_key(call.variant(), base, call.shape(), h100());
  CHECK(key.family == gpu::attention_backward_family);
  CHECK(key.hash() != call.key().hash());
  cuda::AttentionBackwardSpec other = base;
  other.dq_tma = false;
  CHECK(gpu::attention_backward_tune_key(call.variant(), other, call.shape(), h100()).hash() != key.hash());
  other = base;
  other.input_gradients.back() = !other.input_gradients.back();
  CHECK(gpu::attention_backward_tune_key(call.variant(), other, call.shape(), h100()).hash() != key.hash());
  other = base;
  other.d_output_type = DType::f32;
  CHECK(gpu::attention_backward_tune_key(call.variant(), other, call.shape(), h100()).hash() != key.hash());
  Call longer(8, 8192, 16, 128);
  CHECK(gpu::attention_backward_tune_key(call.variant(), base, longer.shape(), h100()).hash() != key.hash());
  CHECK(gpu::attention_backward_tune_key(call.variant(), base, call.shape(), a100()).hash() != key.hash());
}

TEST_CASE("policy heuristic returns the heuristic backward tile without a device; tuning rejects a tile whose gradients differ") {
  Call call(8, 4096, 16, 128);
  const cpu::AttentionGrads grads = grads_of(call);
  TuneOptions options;
  options.policy = Policy::heuristic;
  const cuda::AttentionBackwardTile odd{4, false};
  const cuda::AttentionBackwardTile got = gpu::tuned_attention_backward_tile(call.variant(), call.args, grads, odd, options);
  REQUIRE((got.stages == 4 && !got.dq_tma));
  if (!driver_available()) {
    options.policy = Policy::cached;
    REQUIRE_THROWS_AS(gpu::tuned_attention_backward_tile(call.variant(), call.args, grads, odd, options), NoCudaDriver);
  }

  const cuda::AttentionBackwardSpec base = gpu::attention_backward_spec(call.variant(), call.args, grads);
  const SearchSpace space = gpu::attention_backward_search_space(call.variant(), base);
  const Config heuristic = gpu::to_config(gpu::heuristic_attention_backward_tile(base));
  const Tuner tuner(space, h100(), heuristic);
  test::FakeCandidate fake;
  // The "GPU": TMA reductions and deeper rings are faster; the fastest's gradients differ.
  fake.time_of = [](const Config& c) { return 4.0 - 0.5 * c["dq_tma"] - 0.1 * c["stages"]; };
  const Config fastest = bwd(3, true), second = bwd(2, true);
  fake.fail_check.insert(fastest);
  test::FakeTuning tuning(fake);
  const TunedKey key = gpu::attention_backward_tune_key(call.variant(), base, call.shape(), h100());
  const TuneResult result = tuner.tune(key, fake, tuning.options);
  tuning.check_second_wins(result, fake, key, fastest, second, 5);
  REQUIRE(result.space_size == 6);
}

// ---- The plans: the form, the tile, the splits or row blocks and the launches, decided once

TEST_CASE("an attention plan names its form, its splits or row blocks and its launches in order") {
  using Launch = gpu::AttentionLaunch;
  const gpu::GpuTarget hopper = gpu::named_target("sm_90a");
  AttentionFeatures plain;
  // Decode-shaped (B64 Tq1 Tk8192 H32:8): the split kernel over the key splits, then the merge over the rows.
  Call decode(64, 1, 32, 128, plain, DType::bf16, 8, 0, 8192);
  const gpu::AttentionPlan small = gpu::plan_attention(decode.variant(), decode.args, std::nullopt, hopper);
  CHECK(small.form == gpu::AttentionPlan::Form::decode);
  CHECK(small.spec.tile.mma == cuda::AttentionMma::decode);
  const gpu::AttentionDecodeSplit split = gpu::attention_decode_split(decode.args, small.spec.tile, hopper.sms);
  CHECK(small.split.splits == split.splits);
  CHECK(small.split.split_len == split.split_len);
  REQUIRE(small.launches.size() == 2);
  CHECK((small.launches[0].kernel == Launch::Kernel::main && small.launches[0].over == Launch::Over::key_splits));
  CHECK((small.launches[1].kernel == Launch::Kernel::merge && small.launches[1].over == Launch::Over::merged_rows));
  CHECK_THAT(gpu::to_string(small), Catch::StartsWith("decode: ") && Catch::Contains("merge over merged_rows"));
  // Fewer SMs: the splits follow the target's count, as the launcher's on that GPU.
  gpu::GpuTarget few = hopper;
  few.sms = 16;
  CHECK(gpu::plan_attention(decode.variant(), decode.args, std::nullopt, few).split.splits ==
        gpu::attention_decode_split(decode.args, small.spec.tile, 16).splits);

  // A long causal call: a block per (sequence, head, row block), the row blocks of the tile's block_m.
  Call causal(2, 1000, 16, 128);
  {
    const test::ScopedEnv persistent("LADLE_ATTENTION_PERSISTENT", nullptr);
    const gpu::AttentionPlan plan = gpu::plan_attention(causal.variant(), causal.args, std::nullopt, hopper);
    CHECK(plan.form == gpu::AttentionPlan::Form::tiles);
    CHECK(plan.row_blocks == (1000 + plan.spec.tile.block_m - 1) / plan.spec.tile.block_m);
    REQUIRE(plan.launches.size() == 1);
    CHECK((plan.launches[0].kernel == Launch::Kernel::main && plan.launches[0].over == Launch::Over::row_blocks));
    // The tile named is the tile planned; one that does not fit is refused, naming it.
    const cuda::AttentionTile named{64, 32, 4, 1};
    CHECK(gpu::plan_attention(causal.variant(), causal.args, named, hopper).spec.tile == named);
    CHECK(gpu::plan_attention(causal.variant(), causal.args, named, hopper).row_blocks == 16);
    CHECK_THROWS_WITH(gpu::plan_attention(causal.variant(), causal.args, cuda::AttentionTile{128, 64, 4, 2}, hopper),
                      Catch::Contains("tile (block_m=128 block_n=64 warps=4"));
  }
  {
    // The persistent form only where asked, and only for a ws tile.
    const test::ScopedEnv persistent("LADLE_ATTENTION_PERSISTENT", "1");
    cuda::AttentionTile ws{128, 128, 8, 2, cuda::AttentionMma::ws};
    const gpu::AttentionPlan plan = gpu::plan_attention(causal.variant(), causal.args, ws, hopper);
    CHECK(plan.form == gpu::AttentionPlan::Form::persistent);
    REQUIRE(plan.launches.size() == 1);
    CHECK(plan.launches[0].over == Launch::Over::work_items);
    CHECK(gpu::plan_attention(causal.variant(), causal.args, cuda::AttentionTile{64, 32, 4, 1}, hopper).form ==
          gpu::AttentionPlan::Form::tiles);
  }
}

TEST_CASE("the attention backward's plan: prep then main, the ws tile given or the heuristic's, the sync form for f32") {
  using Launch = gpu::AttentionLaunch;
  Call call(8, 4096, 16, 128);
  const cpu::AttentionGrads grads = grads_of(call);
  const gpu::AttentionBackwardPlan plan = gpu::plan_attention_backward(call.variant(), call.args, grads, std::nullopt, "sm_90a");
  CHECK(plan.spec.form == cuda::AttentionBackwardForm::ws);
  const cuda::AttentionBackwardTile heuristic = gpu::heuristic_attention_backward_tile(plan.spec);
  CHECK((plan.tile.stages == heuristic.stages && plan.tile.dq_tma == heuristic.dq_tma));
  CHECK(plan.spec.stages == plan.tile.stages);
  REQUIRE(plan.launches.size() == 2);
  CHECK((plan.launches[0].kernel == Launch::Kernel::prep && plan.launches[0].over == Launch::Over::query_rows));
  CHECK((plan.launches[1].kernel == Launch::Kernel::main && plan.launches[1].over == Launch::Over::key_blocks));
  CHECK(gpu::to_string(plan) == "form ws, " + cuda::to_string(plan.tile));  // D = 128: dQ's TMA stage fits, as given
  const gpu::AttentionBackwardPlan three =
      gpu::plan_attention_backward(call.variant(), call.args, grads, cuda::AttentionBackwardTile{3, false}, "sm_90a");
  CHECK((three.spec.stages == 3 && !three.spec.dq_tma));
  // D = 256: with_tile takes dQ's TMA stage off (no room); the plan says what runs, not what was asked.
  Call wide(2, 1024, 4, 256);
  const cpu::AttentionGrads wide_grads = grads_of(wide);
  const gpu::AttentionBackwardPlan red = gpu::plan_attention_backward(wide.variant(), wide.args, wide_grads, std::nullopt, "sm_90a");
  CHECK(red.tile.dq_tma);
  CHECK_FALSE(red.spec.dq_tma);
  CHECK(gpu::to_string(red) == "form ws, stages=2 dq=red");
  CHECK_THROWS_WITH(gpu::plan_attention_backward(call.variant(), call.args, grads, cuda::AttentionBackwardTile{5, false}, "sm_90a"),
                    Catch::Contains("backward tile stages=5") && Catch::Contains("expected 2 to 4"));
  // f32 inputs, or a target without wgmma: the sync form, whatever tile is given.
  Call f32(2, 512, 4, 64, Call::causal(), DType::f32);
  const cpu::AttentionGrads f32_grads = grads_of(f32);
  const gpu::AttentionBackwardPlan sync = gpu::plan_attention_backward(f32.variant(), f32.args, f32_grads, std::nullopt, "sm_90a");
  CHECK(sync.spec.form == cuda::AttentionBackwardForm::sync);
  CHECK_THAT(gpu::to_string(sync), Catch::StartsWith("form sync, "));
  CHECK(gpu::plan_attention_backward(call.variant(), call.args, grads, std::nullopt, "sm_80").spec.form == cuda::AttentionBackwardForm::sync);
}
