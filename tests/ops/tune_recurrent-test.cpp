// The recurrence families in the autotuner, without a GPU: the chunked family's search space
// (enumeration, validity against an H100's and an A100's limits, the cost model's ranking and
// pruning), the heuristic tile's place in it, the tuned-config keys of both families, and a
// tuning of the chunked space through the Tuner with a fake candidate and clock.
#include <catch2/catch.hpp>

#include <ladle/ops/chunked_plan.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/tune_recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <set>

#include "runtime/tune_fixtures.h"
#include "support/tensors.h"

using namespace ladle;
using gpu::chunked_search_space;
using gpu::to_chunked_tile;
using gpu::to_config;
using gpu::TuneShape;

namespace {

using ladle::test::a100;
using ladle::test::h100;

// The limits heuristic_chunked_tile() read: this GPU's when there is one, else (CI) the H100
// figures it assumes without a device.
DeviceLimits heuristic_device() {
  return driver_available() ? DeviceLimits::from(Device::get().properties()) : h100();
}

// A call's bound inputs at any size without the memory: every tensor is one element seen
// through zero strides (binding checks shapes and dtypes, never reads the data).
struct Call {
  const ir::Variant& variant;
  DType type;
  float element = 0;
  VariantInputs inputs;
  RunOptions options;
  ops::BoundInputs bound;

  Call(const ir::Variant& v, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t K, std::int64_t V,
       DType t = DType::bf16)
      : variant(v), type(t) {
    auto view = [&](std::vector<std::int64_t> shape) {
      TensorView broadcast;
      broadcast.data = &element;
      broadcast.type = type;
      broadcast.strides.assign(shape.size(), 0);
      broadcast.shape = std::move(shape);
      return broadcast;
    };
    inputs.scalars.emplace("scale", 1.0f / std::sqrt(static_cast<float>(K)));
    for (const auto& input : variant.inputs) {
      if (input.role != ir::Role::other || input.kind == ir::InputKind::scalar) continue;
      if (input.kind == ir::InputKind::token_key) inputs.tensors.emplace(input.name, view({B, T, H, K}));
      else if (input.kind == ir::InputKind::token_value) inputs.tensors.emplace(input.name, view({B, T, H, V}));
      else if (input.kind == ir::InputKind::head) inputs.tensors.emplace(input.name, view({H}));
    }
    bound = ops::bind_inputs(variant.name, variant, view({B, T, H, K}), view({B, T, H, K}), view({B, T, H, V}),
                             inputs, options);
  }

  TuneShape shape() const { return TuneShape::of(bound); }
  cuda::ChunkedTile heuristic() const { return gpu::heuristic_chunked_tile(variant, bound); }
  SearchSpace space() const { return chunked_search_space(variant, shape(), heuristic()); }
  TunedKey key(std::string_view family, const DeviceLimits& device = h100()) const {
    return gpu::tune_key(family, variant, gpu::kernel_types(variant, bound, options), shape(), device);
  }
};

const ir::Variant& gla() { return named_variant("gla"); }
const ir::Variant& gk_gv() { return named_variant("recurrent", "gk,gv"); }

Config chunked(int block_k, int chunk, int block_v, int warps, bool wgmma = false) {
  cuda::ChunkedTile tile{block_k, chunk, block_v, warps};
  tile.wgmma = wgmma;
  return to_config(tile);
}

// Whether the heuristic's device runs wgmma (sm_90a; without a device, the H100 it assumes).
bool hopper() { return cuda::has_wgmma(heuristic_device().arch); }

}  // namespace

TEST_CASE("chunked configs name block_k, chunk, block_v and warps, and convert back to the tile") {
  const cuda::ChunkedTile tile{128, 32, 64, 4};
  const Config config = to_config(tile);
  REQUIRE(config.to_string() == "block_k=128 chunk=32 block_v=64 warps=4 wgmma=0");
  REQUIRE(to_chunked_tile(config) == tile);
  cuda::ChunkedTile w = tile;
  w.wgmma = true;
  REQUIRE(to_config(w).to_string() == "block_k=128 chunk=32 block_v=64 warps=4 wgmma=1");
  REQUIRE(to_chunked_tile(to_config(w)) == w);
  REQUIRE(gpu::to_recurrent_tile(to_config(cuda::RecurrentTile{128, 32, 16})) == cuda::RecurrentTile{128, 32, 16});
  REQUIRE_THROWS_WITH(to_chunked_tile(gpu::to_config(cuda::RecurrentTile{128, 32, 16})), Catch::Contains("'chunk'"));
}

TEST_CASE("the chunked space is chunk x block_v x warps at the heuristic block_k") {
  const Call call(gla(), 8, 4096, 16, 128, 128);
  const SearchSpace space = call.space();
  // On sm_90a (and without a device, which assumes the H100) each tile also runs its state
  // update on wgmma or on mma.sync.
  REQUIRE(call.heuristic().wgmma == hopper());
  REQUIRE(space.size() == 3 * 4 * 3 * (hopper() ? 2 : 1));
  REQUIRE(space.has_cost_model());
  for (const Config& c : space.all()) {
    REQUIRE(c["block_k"] == 128);
    REQUIRE(std::set<int>{0, 1}.count(c["wgmma"]));
    REQUIRE(std::set<int>{16, 32, 64}.count(c["chunk"]));
    REQUIRE(std::set<int>{16, 32, 64, 128}.count(c["block_v"]));
    REQUIRE(std::set<int>{2, 4, 8}.count(c["warps"]));
  }
  const Call wide(gla(), 8, 4096, 16, 256, 256);
  for (const Config& c : wide.space().all()) REQUIRE(c["block_k"] == 256);
}

TEST_CASE("the chunked space's validity is validate_chunked_tile with the device's shared memory and arch") {
  const std::vector<std::pair<const ir::Variant*, int>> cases{{&gla(), 64}, {&gla(), 128}, {&gla(), 256}, {&gk_gv(), 128}, {&gk_gv(), 256}};
  for (const auto& [variant, K] : cases) {
    for (const DeviceLimits& device : {h100(), a100()}) {
      const Call call(*variant, 8, 4096, 16, K, K);
      const SearchSpace space = call.space();
      std::size_t valid = 0;
      for (const auto& [config, reason] : space.explain(device)) {
        const auto problems = cuda::validate_chunked_tile(to_chunked_tile(config), *variant, K, K,
                                                          device.max_shared_per_block, device.arch);
        INFO(variant->name << " K=V=" << K << " on " << device.name << ": " << config.to_string());
        REQUIRE(reason.has_value() == !problems.empty());
        if (reason) REQUIRE_THAT(*reason, Catch::Contains(problems.front()));
        valid += !reason;
      }
      REQUIRE(valid > 0);
      REQUIRE(valid < space.size());
    }
  }
  // At K=V=128 with GLA on an H100: 8 warps for every chunk-64 tile (one warp per 16 rows), at
  // most 64 state values per thread; shared memory never binds.
  const Call call(gla(), 8, 4096, 16, 128, 128);
  const SearchSpace space = call.space();
  // With wgmma (sm_90a): the same tiles at 4 or 8 warps (a warpgroup's rows divide block_k) again.
  const auto valid = space.enumerate(h100());
  REQUIRE(std::count_if(valid.begin(), valid.end(), [](const Config& c) { return c["wgmma"] == 0; }) == 25);
  // One wgmma tile less: 128,64,16,8,wgmma, refused with GLA's key gate (NaN on the GPU, an open bug).
  REQUIRE(valid.size() == (hopper() ? 45u : 25u));
  REQUIRE_THAT(*space.why_invalid(chunked(128, 64, 16, 8, true), h100()), Catch::Contains("an open bug"));
  REQUIRE_THAT(*space.why_invalid(chunked(128, 16, 16, 2, true), h100()), Catch::Contains("warps = 4 or 8"));
  REQUIRE_THAT(*space.why_invalid(chunked(128, 64, 64, 2), h100()), Catch::Contains("needs at least 4 warps"));
  REQUIRE_THAT(*space.why_invalid(chunked(128, 16, 128, 2), h100()), Catch::Contains("state values"));
  REQUIRE_FALSE(space.why_invalid(chunked(128, 64, 64, 8), h100()));
}

TEST_CASE("a tile that needs more shared memory than the device allows is invalid, naming the limit") {
  SECTION("gk and gv at K=V=256, chunk 64, block_v 128: over an H100's 227 KiB") {
    const Call call(gk_gv(), 8, 4096, 16, 256, 256);
    const Config config = chunked(256, 64, 128, 8);
    REQUIRE(cuda::chunked_shared_bytes(gk_gv(), to_chunked_tile(config)) > 232448);
    const auto reason = call.space().why_invalid(config, h100());
    REQUIRE(reason);
    REQUIRE_THAT(*reason, Catch::Contains("shared memory") && Catch::Contains("232448"));
  }
  SECTION("GLA at K=V=256, chunk 64, block_v 64: fits an H100, not an A100's 163 KiB") {
    const Call call(gla(), 8, 4096, 16, 256, 256);
    const Config config = chunked(256, 64, 64, 8);
    const int bytes = cuda::chunked_shared_bytes(gla(), to_chunked_tile(config));
    REQUIRE(bytes > 166912);
    REQUIRE(bytes <= 232448);
    REQUIRE_FALSE(call.space().why_invalid(config, h100()));
    const auto reason = call.space().why_invalid(config, a100());
    REQUIRE(reason);
    REQUIRE_THAT(*reason, Catch::Contains("shared memory") && Catch::Contains("166912"));
    REQUIRE(call.space().enumerate(a100()).size() < call.space().enumerate(h100()).size());
  }
  SECTION("gk and gv at K=V=256 on an A100: chunk 64 misses by a few bytes, chunk 32 fits") {
    const Call call(gk_gv(), 8, 4096, 16, 256, 256);
    REQUIRE(call.space().why_invalid(chunked(256, 64, 32, 8), a100()));
    REQUIRE_FALSE(call.space().why_invalid(chunked(256, 32, 32, 8), a100()));
  }
  SECTION("more threads than the device allows") {
    DeviceLimits small = h100();
    small.max_threads_per_block = 128;
    const Call call(gla(), 8, 4096, 16, 128, 128);
    REQUIRE_THAT(*call.space().why_invalid(chunked(128, 64, 64, 8), small), Catch::Contains("256 threads > 128"));
  }
}

TEST_CASE("the heuristic chunked tile is in the valid set at K=V=64, 128 and 256") {
  const DeviceLimits device = heuristic_device();
  for (const ir::Variant* variant : {&gla(), &gk_gv(), &named_variant("gla", "g_gamma")}) {
    for (int K : {64, 128, 256}) {
      for (const auto& [B, T] : std::vector<std::pair<int, int>>{{32, 1024}, {8, 4096}, {2, 16384}, {1, 128}}) {
        const Call call(*variant, B, T, 16, K, K);
        const Config heuristic = to_config(call.heuristic());
        INFO(variant->name << " B" << B << " T" << T << " K=V=" << K << ": " << heuristic.to_string());
        REQUIRE_FALSE(call.space().why_invalid(heuristic, device));
        const auto valid = call.space().enumerate(device);
        REQUIRE(std::find(valid.begin(), valid.end(), heuristic) != valid.end());
        REQUIRE_NOTHROW(Tuner(call.space(), device, heuristic));
      }
    }
  }
}

TEST_CASE("the cost model ranks the heuristic first at the benchmark shapes and prunes the rest") {
  // Planned from a poor start, the model's own best comes right after it.
  const Config poor = chunked(128, 16, 16, 2);
  for (const auto& [B, T] : std::vector<std::pair<int, int>>{{32, 1024}, {8, 4096}, {2, 16384}}) {
    const Call call(gla(), B, T, 16, 128, 128);
    INFO("B" << B << " T" << T);
    const SearchSpace space = call.space();
    REQUIRE_FALSE(space.why_invalid(poor, h100()));
    const TunePlan from_poor = space.plan(h100(), poor, 64);
    REQUIRE(from_poor.configs.size() == from_poor.valid);
    REQUIRE(from_poor.configs[1] == to_config(call.heuristic()));
  }
  SECTION("the plan from the heuristic keeps max_candidates, the heuristic among them") {
    const Call call(gla(), 8, 4096, 16, 128, 128);
    const Config heuristic = to_config(call.heuristic());
    REQUIRE(heuristic == chunked(128, 32, 128, 8, hopper()));  // the fastest measured on the H100 (bench/RESULTS.md)
    const TunePlan plan = call.space().plan(h100(), heuristic, 8);
    REQUIRE(plan.space_size == 36 * (hopper() ? 2 : 1));
    const auto valid = call.space().enumerate(h100());
    REQUIRE(std::count_if(valid.begin(), valid.end(), [](const Config& c) { return c["wgmma"] == 0; }) == 25);
    REQUIRE(plan.valid == valid.size());
    // The model ranks the heuristic among the 8 best, so it takes one of the 8 places.
    REQUIRE(plan.configs.size() == 8);
    REQUIRE(plan.pruned == plan.valid - 8);
    REQUIRE(plan.configs.front() == heuristic);
    REQUIRE(std::set<Config>(plan.configs.begin(), plan.configs.end()).size() == plan.configs.size());
    const TunePlan all = call.space().plan(h100(), heuristic, 64);
    REQUIRE(all.pruned == 0);
    REQUIRE(std::equal(plan.configs.begin(), plan.configs.end(), all.configs.begin()));  // a prefix of the order
    // Pruned: the slowest by the model, e.g. 16-token chunks at 2 warps.
    REQUIRE(std::find(plan.configs.begin(), plan.configs.end(), poor) == plan.configs.end());
  }
  SECTION("64-token chunks rank before shorter ones of the same block_v and warps") {
    const Call call(gla(), 8, 4096, 16, 128, 128);
    const auto order = call.space().plan(h100(), chunked(128, 16, 16, 2), 64).configs;
    auto rank = [&](const Config& c) { return std::find(order.begin(), order.end(), c) - order.begin(); };
    REQUIRE(rank(chunked(128, 64, 64, 8)) < rank(chunked(128, 32, 64, 8)));
    REQUIRE(rank(chunked(128, 32, 64, 8)) < rank(chunked(128, 16, 64, 8)));
    REQUIRE(rank(chunked(128, 64, 32, 8)) < rank(chunked(128, 16, 32, 8)));
  }
  SECTION("few (sequence, head) pairs: narrow value tiles rank first, for more blocks than SMs") {
    const Call call(gla(), 1, 4096, 16, 128, 128);  // 16 pairs, 132 SMs
    const auto order = call.space().plan(h100(), poor, 64).configs;
    REQUIRE(order[1]["block_v"] <= 32);
    const Call many(gla(), 8, 4096, 16, 128, 128);
    REQUIRE(many.space().plan(h100(), poor, 64).configs[1]["block_v"] == 128);
  }
}

TEST_CASE("a per-head decay takes 64-token chunks on sm_90a, a key gate 32") {
  // Measured on the H100 (bench/RESULTS.md, issue 11, seventh step): with the state update beside
  // the output, simple GLA B8 T4096 ran 0.492 ms at 128,64,128,8,wgmma and 0.539 at 32 tokens;
  // GLA 1.12 ms at 64 and 0.84 at 32.
  const Call simple(named_variant("recurrent", "g_gamma"), 8, 4096, 16, 128, 128);
  const Call keyed(gla(), 8, 4096, 16, 128, 128);
  REQUIRE(cuda::chunked_head_decay_only(simple.variant));
  REQUIRE_FALSE(cuda::chunked_head_decay_only(keyed.variant));
  REQUIRE_FALSE(cuda::chunked_head_decay_only(gk_gv()));
  REQUIRE(to_config(keyed.heuristic()) == chunked(128, 32, 128, 8, hopper()));
  REQUIRE(to_config(simple.heuristic()) == (hopper() ? chunked(128, 64, 128, 8, true) : chunked(128, 32, 128, 8)));
}

TEST_CASE("the heuristic takes the ws form for a per-head decay or a key-side gate in bf16 that TMA can copy, and the tuner tries it") {
  // Real (contiguous, aligned) tensors: the zero-stride views of Call are not what TMA copies.
  std::mt19937_64 rng(21);
  const ir::Variant& simple = named_variant("recurrent", "g_gamma");
  const auto bind = [&](const ir::Variant& variant, DType type, std::int64_t K, std::int64_t V, std::int64_t t_stride_pad,
                        DType gate_type = DType::bf16) {
    struct Bound {
      std::deque<::test::Filled> keep;  // stable addresses
      ops::BoundInputs bound;
    } out;
    const std::int64_t H = 2, T = 64;
    const auto tensor = [&](std::int64_t D) {
      out.keep.push_back(::test::normal(rng, type, {1, T, H, D + t_stride_pad}));
      TensorView view = out.keep.back().tensor.view();
      view.shape[3] = D;  // a row of D features inside a padded one: strides of D + pad elements
      return view;
    };
    VariantInputs inputs;
    inputs.scalars.emplace("scale", 0.125f);
    const TensorView q = tensor(K), k = tensor(K), v = tensor(V);
    if (variant.find_input("g_gamma") >= 0) {
      out.keep.push_back(::test::filled(DType::f32, {H}, [] { return -0.1; }));
      inputs.tensors.emplace("g_gamma", out.keep.back().tensor.view());
    }
    if (variant.find_input("g") >= 0) {
      out.keep.push_back(::test::normal(rng, gate_type, {1, T, H, K}));
      inputs.tensors.emplace("g", out.keep.back().tensor.view());
    }
    out.bound = ops::bind_inputs(variant.name, variant, q, k, v, inputs, RunOptions{});
    return out;
  };
  auto plain = bind(simple, DType::bf16, 128, 128, 0);
  REQUIRE(gpu::ws_copyable(simple, plain.bound).empty());
  cuda::ChunkedTile ws{128, 64, 128, 12};
  ws.ws = true;
  REQUIRE((gpu::heuristic_chunked_tile(simple, plain.bound) == ws) == hopper());
  auto narrow = bind(simple, DType::bf16, 64, 64, 0);
  if (hopper()) REQUIRE(gpu::heuristic_chunked_tile(simple, narrow.bound) == [] {
    cuda::ChunkedTile t{64, 64, 64, 8};
    t.ws = true;
    return t;
  }());
  // Rows 132 features apart (264 bytes): not whole 16 bytes, so TMA cannot copy them, and the heuristic
  // keeps the wgmma tile; f16 q, k, v do not take it either. A key-side gate (GLA) takes it with a 16-bit
  // gate input, not with an fp32 one.
  auto padded = bind(simple, DType::bf16, 128, 128, 4);
  CHECK_THAT(gpu::ws_copyable(simple, padded.bound), Catch::Contains("q: ") && Catch::Contains("16"));
  CHECK_FALSE(gpu::heuristic_chunked_tile(simple, padded.bound).ws);
  auto f16 = bind(simple, DType::f16, 128, 128, 0);
  CHECK_FALSE(gpu::heuristic_chunked_tile(simple, f16.bound).ws);
  auto keyed = bind(gla(), DType::bf16, 128, 128, 0);
  CHECK(gpu::ws_copyable(gla(), keyed.bound).empty());
  CHECK((gpu::heuristic_chunked_tile(gla(), keyed.bound) == ws) == hopper());
  auto keyed_f32 = bind(gla(), DType::bf16, 128, 128, 0, DType::f32);
  CHECK_THAT(gpu::ws_copyable(gla(), keyed_f32.bound), Catch::Contains("g is not 16-bit"));
  CHECK_FALSE(gpu::heuristic_chunked_tile(gla(), keyed_f32.bound).ws);
  // The tuner's space holds ws configs beside the others, and the model ranks the ws tile first.
  if (hopper()) {
    const TuneShape shape = TuneShape::of(plain.bound);
    const SearchSpace space = chunked_search_space(simple, shape, ws);
    REQUIRE(to_chunked_tile(to_config(ws)) == ws);
    REQUIRE(to_config(ws).to_string() == "block_k=128 chunk=64 block_v=128 warps=12 wgmma=0 ws=1");
    const TunePlan plan = space.plan(h100(), to_config(ws), 8);
    REQUIRE(plan.configs.front() == to_config(ws));
    REQUIRE(std::count_if(plan.configs.begin(), plan.configs.end(), [](const Config& c) { return c["ws"] == 0; }) >= 1);
  }
}

TEST_CASE("chunked and fused-recurrent keys differ, and differ by dtype and shape bucket") {
  const Call call(gla(), 8, 4096, 16, 128, 128);
  const TunedKey chunked_key = call.key(gpu::chunked_family);
  const TunedKey recurrent_key = call.key(gpu::recurrent_family);
  REQUIRE(chunked_key.family == "chunked");
  REQUIRE(recurrent_key.family == "fused_recurrent");
  REQUIRE(chunked_key.hash() != recurrent_key.hash());
  REQUIRE(chunked_key.variant == recurrent_key.variant);  // the same variant and types
  // The fused-recurrent key's form is what earlier versions stored: keep it.
  REQUIRE(recurrent_key.variant == ir::hash_hex(gla()) + "-rfalsevfalseifalseffalse-bf16-bf16-bf16-bf16-f32");
  // The kernel's flags are in the key: a reverse call is another kernel.
  cuda::KernelTypes reversed = gpu::kernel_types(gla(), call.bound, call.options);
  reversed.reverse = true;
  const TunedKey reversed_key = gpu::tune_key(gpu::chunked_family, gla(), reversed, call.shape(), h100());
  REQUIRE(reversed_key.variant == ir::hash_hex(gla()) + "-rtruevfalseifalseffalse-bf16-bf16-bf16-bf16-f32");
  REQUIRE(reversed_key.hash() != chunked_key.hash());
  REQUIRE(chunked_key.shape_bucket == "N8-T4096-H16-K128-V128");
  REQUIRE(chunked_key.dtype == "bf16");
  REQUIRE(chunked_key.gpu == "NVIDIA H100 80GB HBM3");
  REQUIRE(chunked_key.sm_count == 132);

  const Call f16(gla(), 8, 4096, 16, 128, 128, DType::f16);
  REQUIRE(f16.key(gpu::chunked_family).dtype == "f16");
  REQUIRE(f16.key(gpu::chunked_family).hash() != chunked_key.hash());
  // Within a bucket: one key (T and N by powers of two).
  REQUIRE(Call(gla(), 8, 3000, 16, 128, 128).key(gpu::chunked_family) == chunked_key);
  REQUIRE(Call(gla(), 6, 4096, 16, 128, 128).key(gpu::chunked_family) == chunked_key);
  // Another bucket, head count, head dim or device: another key.
  for (const TunedKey& other :
       {Call(gla(), 8, 8192, 16, 128, 128).key(gpu::chunked_family), Call(gla(), 16, 4096, 16, 128, 128).key(gpu::chunked_family),
        Call(gla(), 8, 4096, 8, 128, 128).key(gpu::chunked_family), Call(gla(), 8, 4096, 16, 64, 64).key(gpu::chunked_family),
        call.key(gpu::chunked_family, a100()), Call(gk_gv(), 8, 4096, 16, 128, 128).key(gpu::chunked_family)}) {
    INFO(other.to_string());
    REQUIRE(other.hash() != chunked_key.hash());
  }
}

TEST_CASE("policy heuristic returns the heuristic chunked tile without a device or a job") {
  const Call call(gla(), 8, 4096, 16, 128, 128);
  TuneOptions options;
  options.policy = Policy::heuristic;
  const cuda::ChunkedTile odd{128, 32, 32, 4};  // whatever the caller passes is returned
  REQUIRE(gpu::tuned_chunked_tile(gla(), call.bound, call.options, odd, options) == odd);
  if (!driver_available()) {
    options.policy = Policy::cached;
    REQUIRE_THROWS_AS(gpu::tuned_chunked_tile(gla(), call.bound, call.options, odd, options), NoCudaDriver);
  }
}

TEST_CASE("tuning the chunked space picks the fastest valid candidate and rejects a mismatching one") {
  const Call call(gla(), 8, 4096, 16, 128, 128);
  const Config heuristic = to_config(call.heuristic());
  const Tuner tuner(call.space(), h100(), heuristic);
  ladle::test::FakeCandidate fake;
  // The "GPU": longer chunks, narrower value tiles and fewer warps are faster.
  fake.time_of = [](const Config& c) {
    return 1.0 + 16.0 / c["chunk"] + 0.001 * c["block_v"] + 0.01 * c["warps"] + 2.0 * c["wgmma"];
  };
  const auto valid = call.space().enumerate(h100());
  auto by_time = valid;
  std::stable_sort(by_time.begin(), by_time.end(),
                   [&](const Config& a, const Config& b) { return fake.time_of(a) < fake.time_of(b); });
  const Config fastest = by_time[0], second = by_time[1];
  REQUIRE(fastest == chunked(128, 64, 16, 4));
  REQUIRE(second == chunked(128, 64, 32, 4));
  REQUIRE(fake.time_of(heuristic) > fake.time_of(second));
  fake.fail_check.insert(fastest);  // its output differs from the heuristic's

  ladle::test::FakeTuning tuning(fake);
  const TunedKey key = call.key(gpu::chunked_family);
  const TuneResult result = tuner.tune(key, fake, tuning.options);
  tuning.check_second_wins(result, fake, key, fastest, second, valid.size());
  REQUIRE(result.heuristic == heuristic);
  REQUIRE(result.space_size == 36 * (hopper() ? 2 : 1));
  for (const Config& timed : fake.timed) REQUIRE_FALSE(call.space().why_invalid(timed, h100()));
  REQUIRE_FALSE(tuning.cache.lookup(call.key(gpu::recurrent_family)));
}
