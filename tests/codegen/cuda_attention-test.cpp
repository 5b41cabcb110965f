// The softmax-attention CUDA generator. Without a GPU its kernels are checked by running them
// on the host emulation of CUDA (tensor-core fragments, quad shuffles and cp.async included)
// against the fp64 reference, with arguments bound by the op's own checks and packed by the
// GPU launcher's own packing; and by NVRTC, which must compile the family for every flag
// combination (PTX) and a sweep of tiles for sm_90a without spills.
#include <catch2/catch.hpp>

#include <ladle/codegen/cuda/attention.h>
#include <ladle/ops/attention_bind.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

#include "reference/attention_reference.h"
#include "support/full_sweep.h"
#include "support/tensors.h"

namespace cuda_emulation {
// 16-byte chunks staged into shared memory (copied or zero-filled): what tile skipping saves.
inline std::atomic<long long> staged_chunks{0};
}  // namespace cuda_emulation
#define LADLE_COUNT_STAGED() ::cuda_emulation::staged_chunks.fetch_add(1, std::memory_order_relaxed)
#include "cuda_emulation.h"

#include "attention_binding.h"
#include "attention_cases.h"
#include "attention_kernels.inc"

using namespace ladle;
using attention_cases::Case;
using attention_binding::Bound;
using attention_binding::bind;
using attention_binding::integers;

namespace {

// The decode form: the split kernel into NaN-filled partials (a row a split leaves unwritten would
// show), then the merge kernel.
void run_decode(std::size_t index, const cuda::AttentionKernel& kernel, const ops::AttentionArgs& args, const cuda::AttentionTile& tile,
                int splits) {
  REQUIRE(emulated_merges[index].launch != nullptr);
  REQUIRE(kernel.merge_name == emulated_merges[index].name);
  gpu::AttentionDecodeSplit split = gpu::attention_decode_split(args, tile, 132);
  if (splits > 0) {  // the case's own count, as the launcher would cut it
    const std::int64_t tiles = (args.longest_k() + tile.block_n - 1) / tile.block_n, per = (tiles + splits - 1) / splits;
    split.splits = static_cast<int>((tiles + per - 1) / per), split.split_len = static_cast<int>(per * tile.block_n);
  }
  const std::int64_t rows = args.N * args.H * split.partial_rows;
  std::vector<float> o_part(static_cast<std::size_t>(split.splits * rows * args.Dv), std::nanf("")),
      lse_part(static_cast<std::size_t>(split.splits * rows), std::nanf(""));
  split.o_part = o_part.data(), split.lse_part = lse_part.data();
  KernelArgs packed = gpu::pack_attention_arguments(kernel.params, args, args.cu_seqlens_q.data(), args.cu_seqlens_k.data(),
                                                    describe_tensor_map, &split);
  const cuda::AttentionGrid grid =
      cuda::attention_decode_grid(split.splits, (args.longest_q() * (args.H / args.H_kv) + kernel.block_m - 1) / kernel.block_m, args.N * args.H_kv);
  cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.threads, [&] { emulated_kernels[index].launch(packed.data()); });
  KernelArgs merged = gpu::pack_attention_arguments(kernel.merge_params, args, args.cu_seqlens_q.data(), args.cu_seqlens_k.data(),
                                                    describe_tensor_map, &split);
  cuda_emulation::launch(cuda::attention_merge_blocks(rows), 1, 1, cuda::attention_merge_threads,
                         [&] { emulated_merges[index].launch(merged.data()); });
  INFO("splits " << split.splits << " of " << split.split_len << " keys");
}

void run_emulated(std::size_t index, const cuda::AttentionKernel& kernel, const ops::AttentionArgs& args) {
  std::int64_t rows = args.Tq;
  if (!args.cu_seqlens_q.empty()) {
    rows = 0;
    for (std::size_t n = 0; n + 1 < args.cu_seqlens_q.size(); ++n) rows = std::max(rows, args.cu_seqlens_q[n + 1] - args.cu_seqlens_q[n]);
  }
  if (kernel.persistent) {
    // Three blocks walk every item (the emulation runs blocks one after the other: the first draws
    // all but the second's and the third's first), so a block meets many items, empty ones included.
    gpu::AttentionWork work = gpu::attention_work(args, kernel.block_m);
    unsigned counter = 0;
    work.counter = &counter;
    KernelArgs persistent = gpu::pack_attention_arguments(kernel.params, args, args.cu_seqlens_q.data(), args.cu_seqlens_k.data(),
                                                          describe_tensor_map, nullptr, &work);
    cuda_emulation::launch(cuda::attention_persistent_blocks(work.items(args), 3), 1, 1, kernel.threads,
                           [&] { emulated_kernels[index].launch(persistent.data()); });
    CHECK(counter == static_cast<unsigned>(work.items(args)));  // a draw per item: the last of each block's past the end
    return;
  }
  KernelArgs packed = gpu::pack_attention_arguments(kernel.params, args, args.cu_seqlens_q.data(), args.cu_seqlens_k.data(),
                                                    describe_tensor_map);
  const cuda::AttentionGrid grid = cuda::attention_grid(args.N * args.H, (rows + kernel.block_m - 1) / kernel.block_m);
  cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.threads,
                         [&] { emulated_kernels[index].launch(packed.data()); });
}

}  // namespace

TEST_CASE("attention: the source opens with the variant, its expressions, config and launch", "[codegen][attention]") {
  const Case c = attention_cases::all()[7];  // the user ALiBi variant
  const cuda::AttentionKernel kernel = cuda::generate_attention(c.variant, c.spec());
  INFO(kernel.source);
  CHECK_THAT(kernel.source, Catch::StartsWith("// ladle: attention kernel " + kernel.name + "\n"));
  std::istringstream printed(ir::to_string(c.variant));
  for (std::string line; std::getline(printed, line);) CHECK_THAT(kernel.source, Catch::Contains("// " + line + "\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// logit = "));
  CHECK_THAT(kernel.source, Catch::Contains("// keep  = "));
  CHECK_THAT(kernel.source, Catch::Contains("// config: block_m=64 block_n=32 warps=4 stages=2 (128 threads), D=64 Dv=64\n"));
  CHECK_THAT(kernel.source, Catch::Contains("tensor cores: mma.sync m16n8k16"));
  CHECK_THAT(kernel.source, !Catch::Contains("wgmma"));
  CHECK_THAT(kernel.source, Catch::Contains("dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes"));
  CHECK_THAT(kernel.source, Catch::Contains("ladle_mma_f16("));
  CHECK_THAT(kernel.source, Catch::Contains("row_max"));
  CHECK_THAT(kernel.source, Catch::Contains("o_acc"));
  CHECK_THAT(kernel.source, Catch::Contains("slope_value"));
  CHECK(kernel.threads == 128);
  CHECK(kernel.block_m == 64);
  CHECK(kernel.shared_bytes == cuda::attention_shared_bytes(c.tile, 64, 64, false));
  Case other = c;
  other.tile.stages = 1;
  CHECK(cuda::generate_attention(other.variant, other.spec()).name != kernel.name);
  CHECK(cuda::generate_attention(c.variant, c.spec()).source == kernel.source);
}

TEST_CASE("attention: the persistent ws form's launch, work, layout and refusals", "[codegen][attention]") {
  // A block an SM, never more blocks than items.
  CHECK(cuda::attention_persistent_blocks(4096, 132) == 132u);
  CHECK(cuda::attention_persistent_blocks(5, 132) == 5u);
  CHECK_THROWS_WITH(cuda::attention_persistent_blocks(0, 132), Catch::Contains("items = 0"));
  CHECK_THROWS_WITH(cuda::attention_persistent_blocks(10, 0), Catch::Contains("sms = 0"));
  CHECK_THROWS_WITH(cuda::attention_persistent_blocks(std::int64_t{1} << 31, 132), Catch::Contains("2^31 - 1 items"));
  // The work: ceil(longest query sequence / block_m) row blocks per (sequence, head).
  Case c = attention_cases::make("causal", attention_variant(parse_attention_features("causal")));
  c.B = 3, c.Tq = 300, c.Tk = 300, c.H = 4, c.H_kv = 4;
  const Bound bound = bind(c, 17);
  const gpu::AttentionWork work = gpu::attention_work(bound.args, 128);
  CHECK(work.row_blocks == 3);
  CHECK(work.items(bound.args) == 3 * 4 * 3);
  CHECK_THROWS_WITH(gpu::attention_work(bound.args, 0), Catch::Contains("block_m = 0"));
  // Its parameters are refused without the work, by name.
  c.tile = {128, 64, 8, 2, cuda::AttentionMma::ws}, c.persistent = true, c.D = c.Dv = 64;
  const cuda::AttentionKernel kernel = cuda::generate_attention(c.variant, c.spec());
  CHECK(kernel.persistent);
  CHECK_THROWS_WITH(gpu::pack_attention_arguments(kernel.params, bound.args, nullptr, nullptr, describe_tensor_map),
                    Catch::Contains("work_counter is the persistent form's"));
  // Two q tiles where they fit: the grid form's layout holds one.
  const cuda::AttentionTile wide{128, 128, 8, 2, cuda::AttentionMma::ws};
  CHECK(cuda::attention_ws_q_stages(wide, 128, 128) == 2);
  CHECK(cuda::attention_ws_q_stages(wide, 256, 256) == 1);
  CHECK(kernel.shared_bytes == cuda::attention_ws_shared_bytes(c.tile, 64, 64, 2));
  Case grid = c;
  grid.persistent = false;
  const cuda::AttentionKernel grid_kernel = cuda::generate_attention(grid.variant, grid.spec());
  CHECK(grid_kernel.shared_bytes == cuda::attention_ws_shared_bytes(c.tile, 64, 64, 1));
  CHECK(grid_kernel.name != kernel.name);
  CHECK_FALSE(grid_kernel.persistent);
  // Only the ws pipeline has the form.
  Case sync = c;
  sync.tile = {64, 32, 4, 2};
  cuda::AttentionKernelSpec refused = sync.spec();
  refused.persistent = true;
  CHECK_THROWS_WITH(cuda::generate_attention(sync.variant, refused), Catch::Contains("only the ws pipeline has a persistent form"));
}

TEST_CASE("attention: the grid covers every (head, block) once, a group's heads side by side", "[codegen][attention]") {
  for (const auto& [heads, blocks, group] : {std::tuple{128, 32, 4u}, std::tuple{6, 5, 2u}, std::tuple{7, 3, 1u}, std::tuple{1, 1, 1u},
                                             std::tuple{262140, 65535, 4u}}) {
    const cuda::AttentionGrid grid = cuda::attention_grid(heads, blocks);
    CAPTURE(heads, blocks, grid.x, grid.y, grid.z);
    CHECK(grid.x == group);
    CHECK(grid.y == static_cast<unsigned>(blocks));
    REQUIRE(static_cast<std::int64_t>(grid.x) * grid.z == heads);
    if (heads > 1000) continue;
    // The kernels' decoding, in launch order (x fastest): every pair once, and a group's blocks in
    // order (block 0 of the group's heads before block 1 of any).
    std::vector<int> seen(static_cast<std::size_t>(heads * blocks), 0);
    std::int64_t last_group = -1, last_block = -1;
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          const std::int64_t head = z * grid.x + x;
          ++seen[static_cast<std::size_t>(head * blocks + y)];
          CHECK((z > last_group || static_cast<std::int64_t>(y) >= last_block));
          last_group = z, last_block = y;
        }
    CHECK(std::count(seen.begin(), seen.end(), 1) == heads * blocks);
  }
  CHECK_THROWS_WITH(cuda::attention_grid(8, 65536), Catch::Contains("65536 blocks") && Catch::Contains("at most 65535"));
  CHECK_THROWS_WITH(cuda::attention_grid(4 * 65536, 2), Catch::Contains("65536 groups of 4 heads"));
  CHECK_THROWS_WITH(cuda::attention_grid(0, 2), Catch::Contains("heads = 0"));
}

TEST_CASE("attention: tiles are validated", "[codegen][attention]") {
  CHECK(cuda::validate_attention_tile({128, 64, 8, 2}, 128, 128).empty());
  CHECK(cuda::validate_attention_tile(cuda::default_attention_tile(256, 64), 256, 64).empty());
  // D = Dv = 256 would keep 64 q values and 128 o values per thread in registers: it spills.
  CHECK_THAT(cuda::validate_attention_tile(cuda::default_attention_tile(256, 256), 256, 256).front(), Catch::Contains("registers"));
  CHECK_THAT(cuda::validate_attention_tile({128, 64, 4, 2}, 128, 128).front(), Catch::Contains("block_m = 16 * warps"));
  CHECK_THAT(cuda::validate_attention_tile({128, 48, 8, 2}, 128, 128).front(), Catch::Contains("block_n = 48"));
  CHECK_THAT(cuda::validate_attention_tile({128, 64, 8, 3}, 128, 128).front(), Catch::Contains("stages = 3"));
  CHECK_THAT(cuda::validate_attention_tile({128, 64, 8, 2}, 300, 64).front(), Catch::Contains("D = 300, expected 1 to 256"));
  CHECK(cuda::validate_attention_tile({128, 64, 8, 2}, 72, 40).empty());  // padded to 80 and 48 inside
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 2}, 256, 256).front(), Catch::Contains("registers"));
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 2}, 128, 128, 100 * 1024).front(), Catch::Contains("shared memory"));
  // wgmma: sm_90a only, 16-bit inputs only; the tile's name says so.
  cuda::AttentionTile wgmma{128, 64, 8, 2, cuda::AttentionMma::wgmma};
  CHECK(cuda::to_string(wgmma) == "block_m=128 block_n=64 warps=8 stages=2 mma=wgmma");
  CHECK(cuda::validate_attention_tile(wgmma, 128, 128, 227 * 1024, false, "sm_90a").empty());
  CHECK(cuda::validate_attention_tile(wgmma, 128, 128, 227 * 1024, false, "compute_90a").empty());
  CHECK_THAT(cuda::validate_attention_tile(wgmma, 128, 128).front(), Catch::Contains("needs the target sm_90a"));
  CHECK_THAT(cuda::validate_attention_tile(wgmma, 128, 128, 0, false, "sm_80").front(), Catch::Contains("the target is sm_80"));
  CHECK_THAT(cuda::validate_attention_tile(wgmma, 128, 128, 0, false, "sm_90").front(), Catch::Contains("needs the target sm_90a"));
  CHECK_THAT(cuda::validate_attention_tile(wgmma, 128, 128, 0, true, "sm_90a").front(), Catch::Contains("f16/bf16"));
  CHECK_THAT(cuda::validate_attention_tile({128, 64, 4, 2, cuda::AttentionMma::wgmma}, 128, 128, 0, false, "sm_90a").front(),
             Catch::Contains("block_m = 16 * warps"));
  CHECK(cuda::attention_shared_bytes(wgmma, 128, 128, false) == 128 * 128 * 2 + 2 * 2 * 64 * 128 * 2);  // q + 2 stages of K, V
  cuda::AttentionKernelSpec spec = attention_cases::all()[0].spec();
  spec.tile.mma = cuda::AttentionMma::wgmma;
  REQUIRE_THROWS_WITH(cuda::generate_attention(attention_cases::all()[0].variant, spec), Catch::Contains("sm_90a"));
  spec.arch = "sm_90a";
  const cuda::AttentionKernel hopper = cuda::generate_attention(attention_cases::all()[0].variant, spec);
  CHECK_THAT(hopper.source, Catch::Contains("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16"));
  CHECK_THAT(hopper.source, Catch::Contains("mma=wgmma"));
  CHECK(hopper.name != cuda::generate_attention(attention_cases::all()[0].variant, attention_cases::all()[0].spec()).name);
  spec = attention_cases::all()[0].spec();
  spec.tile.warps = 3;
  REQUIRE_THROWS_WITH(cuda::generate_attention(attention_cases::all()[0].variant, spec), Catch::Contains("warps = 3"));
  spec = attention_cases::all()[0].spec();
  spec.input_types.pop_back();
  REQUIRE_THROWS_AS(cuda::generate_attention(attention_cases::all()[0].variant, spec), InvalidArgument);
}

TEST_CASE("attention: every kernel, run on the host emulation of CUDA, matches the fp64 reference", "[codegen][attention][emulation]") {
  const auto cases = attention_cases::all();
  REQUIRE(std::size(emulated_kernels) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const cuda::AttentionKernel kernel = cuda::generate_attention(c.variant, c.spec());
    INFO(c.name << " (" << kernel.name << ", " << cuda::to_string(c.tile) << ")");
    REQUIRE(kernel.name == emulated_kernels[i].name);
    REQUIRE(static_cast<std::size_t>(kernel.shared_bytes) <= cuda_emulation::dynamic_shared_bytes);
    Bound bound = bind(c, 3000 + i);
    if (c.tile.mma == cuda::AttentionMma::decode) run_decode(i, kernel, bound.args, c.tile, c.splits);
    else run_emulated(i, kernel, bound.args);
    const reference::AttentionOutput want = reference::attention(bound.ref);
    // 16-bit inputs: 1e-2; fp32 inputs through split bf16 operands: docs/design.md's 2e-3 for
    // fp32 through tensor cores.
    const double tolerance = c.type == DType::f32 ? 2e-3 : 1e-2;
    const double error = test::relative_error(bound.dense_o(), want.o);
    INFO("relative error of o: " << error);
    CHECK(error < tolerance);
    if (c.lse) {
      const std::vector<double> got = test::values_of(bound.lse);
      int wrong = 0, empty_rows = 0;
      for (std::size_t e = 0; e < got.size(); ++e) {
        if (std::isinf(want.lse[e])) {
          ++empty_rows;
          wrong += !(std::isinf(got[e]) && got[e] < 0);
        } else {
          wrong += !(std::abs(got[e] - want.lse[e]) <= 2e-2 * std::max(1.0, std::abs(want.lse[e])));
        }
      }
      INFO("rows with nothing attended: " << empty_rows);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("attention: a sliding window stages only the key tiles its rows can reach", "[codegen][attention][emulation]") {
  const auto cases = attention_cases::all();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (!c.variant.window && !c.variant.causal) continue;
    if (c.tile.mma == cuda::AttentionMma::decode) continue;  // its rows are packed heads (the decode test below)
    if (!c.cu_seqlens_q.empty() || !c.async_copy || c.type == DType::f32) continue;
    INFO(c.name);
    const cuda::AttentionKernel kernel = cuda::generate_attention(c.variant, c.spec());
    Bound bound = bind(c, 4000 + i);
    cuda_emulation::staged_chunks = 0;
    run_emulated(i, kernel, bound.args);
    // The tiles with at least one attended key for some row of the block, by definition.
    const int diagonal = c.Tk - c.Tq, bm = c.tile.block_m, bn = c.tile.block_n;
    // Head dims padded to the tensor-core step; ws copies whole boxes of 64 columns (TMA).
    const int pad = c.tile.mma == cuda::AttentionMma::ws ? 64 : 16;
    const int dp = (c.D + pad - 1) / pad * pad, dvp = (c.Dv + pad - 1) / pad * pad;
    long long expected = 0, all_tiles = 0;
    for (int m0 = 0; m0 < c.Tq; m0 += bm) {
      expected += static_cast<long long>(bm) * dp / 8;  // the q tile
      all_tiles += static_cast<long long>(bm) * dp / 8;
      for (int j0 = 0; j0 < c.Tk; j0 += bn) {
        bool needed = false;
        for (int row = m0; row < std::min(m0 + bm, c.Tq) && !needed; ++row)
          for (int j = j0; j < std::min(j0 + bn, c.Tk) && !needed; ++j) {
            bool in = true;
            if (c.variant.causal && j > row + diagonal) in = false;
            if (c.variant.window && c.window_left >= 0 && j < row + diagonal - c.window_left) in = false;
            if (c.variant.window && c.window_right >= 0 && j > row + diagonal + c.window_right) in = false;
            needed = in;
          }
        const long long chunks = static_cast<long long>(bn) * (dp + dvp) / 8;
        expected += needed ? chunks : 0;
        all_tiles += chunks;
      }
    }
    expected *= c.B * c.H, all_tiles *= c.B * c.H;
    INFO("staged " << cuda_emulation::staged_chunks << " chunks; every tile would be " << all_tiles);
    CHECK(cuda_emulation::staged_chunks == expected);
  }
}

// ---- NVRTC

namespace {

cuda::AttentionKernelSpec spec_for(const ir::AttentionVariant& variant, DType type, int D, int Dv) {
  cuda::AttentionKernelSpec spec;
  for (const ir::Input& in : variant.inputs)
    spec.input_types.push_back(in.role != ir::Role::other ? type : in.name == "attention_mask" ? DType::u8 : DType::f32);
  spec.output_type = type;
  spec.D = D, spec.Dv = Dv;
  spec.tile = cuda::default_attention_tile(D, Dv);
  return spec;
}

}  // namespace

TEST_CASE("attention: NVRTC compiles the family for every mask and modifier combination (PTX)", "[codegen][attention][nvrtc]") {
  const char* names[] = {"causal", "window", "segments", "mask", "sinks", "dropout", "bias", "softcap"};
  // By default 16 of the 64 combinations (bits * 7 mod 64 below 16: each mask feature on in 7 or 8
  // of them and off in the rest, each dtype, varlen, lse, bias and soft cap both ways); all 64 in
  // the full sweep.
  int compiled = 0;
  for (int bits = 0; bits < 64; ++bits) {
    if (!test::full_sweep() && bits * 7 % 64 >= 16) continue;
    std::string list;
    for (int f = 0; f < 6; ++f)
      if (bits & (1 << f)) list += std::string(list.empty() ? "" : ",") + names[f];
    if (bits % 2 == 0) list += std::string(list.empty() ? "" : ",") + "bias";
    if (bits % 3 == 0) list += std::string(list.empty() ? "" : ",") + "softcap";
    const ir::AttentionVariant& variant = attention_variant(parse_attention_features(list));
    auto spec = spec_for(variant, bits % 4 == 1 ? DType::f16 : DType::bf16, 128, 128);
    spec.varlen = bits % 5 == 0;
    spec.lse = bits % 2 == 1;
    INFO(list);
    const auto result = gpu::compile_attention(variant, spec, "compute_80");
    REQUIRE(result.program.ptx.find(".entry " + result.kernel.name) != std::string::npos);
    REQUIRE(result.program.ptx.find("mma.sync.aligned.m16n8k16") != std::string::npos);
    REQUIRE(result.program.ptx.find("cp.async") != std::string::npos);
    ++compiled;
  }
  const auto user = gpu::compile_attention(attention_cases::user_alibi(), spec_for(attention_cases::user_alibi(), DType::f16, 64, 64), "compute_80");
  CHECK(user.program.ptx.find(".entry " + user.kernel.name) != std::string::npos);
  CHECK(compiled == (test::full_sweep() ? 64 : 16));
}

// The NVRTC sweeps below compile, by default, each feature set at one head dim (the two head dims
// turn with it) and the tile sweeps' fields each value at least once; their products under the
// full sweep.
static bool sweep_keeps(int index, int of) { return test::full_sweep() || index % of == 0; }

// A tile of a sweep over block_m (64, 128), block_n (32, 64, 128) and a third field (its index c):
// by default the block_n that turns with the other two, so that every value of each field is kept.
static bool tile_kept(int block_m, int block_n, int c) {
  const int m = block_m / 128, n = block_n == 32 ? 0 : block_n == 64 ? 1 : 2;
  return test::full_sweep() || n == (2 * m + c) % 3;
}

// One kernel of the NVRTC sweeps: compiled for sm_90a with lse, its resources printed, and
// checked to fit (registers, no spills, shared memory within the H100's opt-in limit).
struct SweepItem {
  const char* features;
  DType type;
  int D, Dv;
  cuda::AttentionTile tile;
  bool persistent = false;  // ws: the persistent form (LADLE_ATTENTION_PERSISTENT=1)
};

static gpu::CompiledAttention compile_sm90a(const SweepItem& item) {
    const ir::AttentionVariant& variant = attention_variant(parse_attention_features(item.features));
    auto spec = spec_for(variant, item.type, item.D, item.Dv);
    spec.tile = item.tile;
    spec.persistent = item.persistent;
    spec.lse = true;
    const auto result = gpu::compile_attention(variant, spec, "sm_90a");
    const auto* r = result.program.resources(result.kernel.name);
    REQUIRE(r != nullptr);
    const std::string line = std::string(item.features) + " " + dtype_name(item.type) + " D=" + std::to_string(item.D) +
                             " Dv=" + std::to_string(item.Dv) + " " + cuda::to_string(item.tile) +
                             (spec.persistent ? " persistent" : "") + ": " +
                             std::to_string(r->registers) + " registers, " + std::to_string(r->spill_store_bytes) +
                             " bytes spilled, " + std::to_string(result.kernel.shared_bytes) + " bytes of shared memory";
    std::cout << "sm_90a " << line << "\n";
    INFO(line);
    CHECK(r->registers > 0);
    CHECK(r->spill_store_bytes == 0);
    CHECK(result.kernel.shared_bytes <= 227 * 1024);
  return result;
}

TEST_CASE("attention: sm_90a cubins at D = 64 and 128 and over a sweep of tiles fit without spills; sm_80 too", "[codegen][attention][nvrtc]") {
  std::vector<SweepItem> items;
  int n = 0;
  for (int D : {64, 128})
    for (const char* f : {"causal", "window,softcap", "causal,sinks", "bias,mask,segments,dropout"})
      if (sweep_keeps(n++ + D / 64, 2)) items.push_back({f, DType::bf16, D, D, cuda::default_attention_tile(D, D)});
  items.push_back({"causal", DType::f16, 128, 128, cuda::default_attention_tile(128, 128)});
  items.push_back({"causal", DType::f32, 128, 128, {128, 32, 8, 2}});
  items.push_back({"causal", DType::bf16, 256, 64, cuda::default_attention_tile(256, 64)});
  items.push_back({"causal", DType::bf16, 128, 64, cuda::default_attention_tile(128, 64)});
  for (int block_m : {64, 128})
    for (int block_n : {32, 64, 128})
      for (int stages : {1, 2}) {
        const cuda::AttentionTile tile{block_m, block_n, block_m / 16, stages};
        if (tile_kept(block_m, block_n, stages - 1) && cuda::validate_attention_tile(tile, 128, 128, 227 * 1024).empty())
          items.push_back({"causal", DType::bf16, 128, 128, tile});
      }
  CHECK(items.size() >= (test::full_sweep() ? 20u : 10u));
  for (const SweepItem& item : items) {
    compile_sm90a(item);
  }
  // sm_80 at both head dims, as a launcher compiles them (a positive scale).
  const ir::AttentionVariant& causal = attention_variant(parse_attention_features("causal"));
  for (int D : {64, 128}) {
    auto spec = spec_for(causal, DType::bf16, D, D);
    spec.positive_logit_factor = true;
    REQUIRE(cuda::validate_attention_tile(spec.tile, D, D, 163 * 1024).empty());
    const auto result = gpu::compile_attention(causal, spec, "sm_80");
    const auto* r = result.program.resources(result.kernel.name);
    REQUIRE(r != nullptr);
    std::cout << "sm_80 causal bf16 D=" << D << " " << cuda::to_string(spec.tile) << ": " << r->registers << " registers, "
              << r->spill_store_bytes << " bytes spilled\n";
    CHECK(r->spill_store_bytes == 0);
  }
}

TEST_CASE("attention: wgmma kernels compile for sm_90a without spills, and their PTX holds wgmma.mma_async", "[codegen][attention][nvrtc][wgmma]") {
  std::vector<SweepItem> items;
  int n = 0;
  for (int D : {64, 128})
    for (const char* f : {"causal", "window,softcap", "causal,sinks", "bias,mask,segments,dropout"})
      if (sweep_keeps(n++ + D / 64, 2)) items.push_back({f, DType::bf16, D, D, {128, 64, 8, 2}});
  items.push_back({"causal", DType::f16, 128, 128, {128, 64, 8, 2}});
  items.push_back({"causal", DType::bf16, 256, 64, {128, 64, 8, 2}});
  items.push_back({"causal", DType::bf16, 128, 64, {128, 128, 8, 2}});
  for (int block_m : {64, 128})
    for (int block_n : {32, 64, 128})
      for (int stages : {1, 2})
        if (tile_kept(block_m, block_n, stages - 1)) items.push_back({"causal", DType::bf16, 128, 128, {block_m, block_n, block_m / 16, stages}});
  for (SweepItem& item : items) item.tile.mma = cuda::AttentionMma::wgmma;
  for (const SweepItem& item : items) {
    if (!cuda::validate_attention_tile(item.tile, item.D, item.Dv, 227 * 1024, false, "sm_90a").empty()) continue;
    const auto result = compile_sm90a(item);
    CHECK(result.program.ptx.find("wgmma.mma_async.sync.aligned.m64n" + std::to_string(item.tile.block_n) + "k16") != std::string::npos);
    CHECK(result.program.ptx.find("wgmma.fence.sync.aligned") != std::string::npos);
    CHECK(result.program.ptx.find("wgmma.commit_group.sync.aligned") != std::string::npos);
    CHECK(result.program.ptx.find("wgmma.wait_group.sync.aligned") != std::string::npos);
    CHECK(result.program.ptx.find("mma.sync") == std::string::npos);
  }
  // A wgmma tile is refused for sm_80.
  const ir::AttentionVariant& causal = attention_variant(parse_attention_features("causal"));
  auto spec = spec_for(causal, DType::bf16, 128, 128);
  spec.tile.mma = cuda::AttentionMma::wgmma;
  REQUIRE_THROWS_WITH(gpu::compile_attention(causal, spec, "sm_80"), Catch::Contains("sm_90a"));
}

TEST_CASE("attention: ws kernels compile for sm_90a without spills, with TMA copies, mbarriers, setmaxnreg and wgmma in the PTX", "[codegen][attention][nvrtc][ws]") {
  std::vector<SweepItem> items;
  int n = 0;
  for (int D : {64, 128})
    for (const char* f : {"causal", "window,softcap", "causal,sinks", "bias,mask,segments,dropout"}) {
      if (!sweep_keeps(n++ + D / 64, 2)) continue;
      // A variant that reads a pair input or draws dropout per score takes 64-key tiles (the
      // heuristic's rule): at 128 keys it spills within the launch bound's 168 registers.
      const bool light = std::string(f).find("bias") == std::string::npos;
      items.push_back({f, DType::bf16, D, D, {128, light ? 128 : 64, 8, 2}});
    }
  items.push_back({"causal", DType::f16, 128, 128, {128, 128, 8, 2}});
  items.push_back({"causal", DType::bf16, 256, 256, {128, 64, 8, 2}});
  items.push_back({"causal", DType::bf16, 192, 128, {128, 64, 8, 2}});
  items.push_back({"causal", DType::bf16, 128, 64, {128, 128, 8, 3}});
  // Three consumer warpgroups, the heuristic's tile at head dims to 64 (160 registers each).
  items.push_back({"causal", DType::bf16, 64, 64, {192, 128, 12, 3}});
  items.push_back({"causal,sinks", DType::bf16, 64, 64, {192, 128, 12, 3}});
  for (int block_m : {64, 128})
    for (int block_n : {32, 64, 128})
      for (int stages : {2, 3, 4})
        if (tile_kept(block_m, block_n, stages - 2)) items.push_back({"causal", DType::bf16, 128, 128, {block_m, block_n, block_m / 16, stages}});
  // The persistent form too, at the heuristic's tiles and the widest head dims.
  n = 0;
  for (const char* f : {"causal", "window,softcap", "causal,sinks"})
    if (sweep_keeps(n++, 2)) items.push_back({f, DType::bf16, 128, 128, {128, 128, 8, 2}, true});
  items.push_back({"bias,mask,segments,dropout", DType::bf16, 128, 128, {128, 64, 8, 2}, true});
  items.push_back({"causal", DType::bf16, 256, 256, {128, 64, 8, 2}, true});
  items.push_back({"causal", DType::bf16, 128, 128, {64, 128, 4, 2}, true});
  int compiled = 0;
  for (SweepItem& item : items) item.tile.mma = cuda::AttentionMma::ws;
  for (const SweepItem& item : items) {
    if (!cuda::validate_attention_tile(item.tile, item.D, item.Dv, 227 * 1024, false, "sm_90a").empty()) continue;
    ++compiled;
    const auto result = compile_sm90a(item);
    const std::string& ptx = result.program.ptx;
    CHECK(ptx.find("wgmma.mma_async.sync.aligned.m64n" + std::to_string(item.tile.block_n) + "k16") != std::string::npos);
    CHECK(ptx.find("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes") != std::string::npos);
    CHECK(ptx.find("mbarrier.try_wait.parity") != std::string::npos);
    CHECK(ptx.find("mbarrier.arrive.expect_tx") != std::string::npos);
    // One block-wide barrier (bar.sync 0), after the mbarriers' initialisation; two consumer
    // warpgroups also take turns issuing through named barriers (ping-pong), one does not.
    CHECK(ptx.find("bar.sync \t0;") != std::string::npos);
    CHECK(ptx.find("bar.sync \t0;") == ptx.rfind("bar.sync \t0;"));
    CHECK((ptx.find("bar.arrive") != std::string::npos) == (item.tile.warps == 8));
    CHECK((ptx.find("setmaxnreg.inc.sync.aligned.u32 240") != std::string::npos) == (item.tile.warps == 8));
    CHECK(ptx.find("mma.sync") == std::string::npos);
    // Value head dims to 64 without dropout sum each row's p on the tensor cores (P times ones, m64n8k16).
    const bool tensor_sums = item.Dv <= 64 && std::string(item.features).find("dropout") == std::string::npos;
    CHECK((ptx.find("wgmma.mma_async.sync.aligned.m64n8k16") != std::string::npos) == tensor_sums);
    CHECK(result.kernel.threads == 32u * item.tile.warps + 128u);
    // The persistent form draws its items from the counter (one atomic add a drawn item).
    CHECK(result.kernel.persistent == item.persistent);
    CHECK((ptx.find("atom.global.add.u32") != std::string::npos) == item.persistent);
    // ptxas keeps the products asynchronous: no wgmma serialized (C7514) and no fence it had to
    // add (C7519) because a register was touched between a fence and its wgmma.
    INFO(result.program.log);
    CHECK(result.program.log.find("C7514") == std::string::npos);
    CHECK(result.program.log.find("C7519") == std::string::npos);
  }
  CHECK(compiled >= (test::full_sweep() ? 20 : 12));
  // ws is refused for sm_80, for fp32 inputs, for head dims TMA cannot copy, and without aligned rows.
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 2, cuda::AttentionMma::ws}, 128, 128, 0, false, "sm_80").front(),
             Catch::Contains("mma=ws needs the target sm_90a"));
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 2, cuda::AttentionMma::ws}, 128, 128, 0, true, "sm_90a").front(),
             Catch::Contains("f16/bf16"));
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 2, cuda::AttentionMma::ws}, 100, 128, 0, false, "sm_90a").front(),
             Catch::Contains("multiples of 8"));
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 1, cuda::AttentionMma::ws}, 128, 128, 0, false, "sm_90a").front(),
             Catch::Contains("expected 2 to 4"));
  CHECK_THAT(cuda::validate_attention_tile({128, 128, 8, 4, cuda::AttentionMma::ws}, 128, 128, 227 * 1024, false, "sm_90a").front(),
             Catch::Contains("shared memory"));
  // Three consumer warpgroups (192 rows, 12 warps) are ws's alone, with their fragments in 128 registers.
  CHECK(cuda::validate_attention_tile({192, 128, 12, 3, cuda::AttentionMma::ws}, 64, 64, 227 * 1024, false, "sm_90a").empty());
  CHECK_THAT(cuda::validate_attention_tile({192, 128, 12, 2, cuda::AttentionMma::ws}, 128, 128, 227 * 1024, false, "sm_90a").front(),
             Catch::Contains("at most 128"));
  CHECK_THAT(cuda::validate_attention_tile({192, 64, 12, 2, cuda::AttentionMma::wgmma}, 64, 64, 0, false, "sm_90a").front(),
             Catch::Contains("expected 4 or 8"));
  CHECK_THAT(cuda::validate_attention_tile({192, 64, 8, 2, cuda::AttentionMma::ws}, 64, 64, 0, false, "sm_90a").front(),
             Catch::Contains("block_m = 16 * warps"));
  CHECK(cuda::parse_attention_tile("128,128,8,3,ws") == cuda::AttentionTile{128, 128, 8, 3, cuda::AttentionMma::ws});
  CHECK(cuda::to_string(cuda::AttentionTile{128, 128, 8, 3, cuda::AttentionMma::ws}) == "block_m=128 block_n=128 warps=8 stages=3 mma=ws");
  const ir::AttentionVariant& causal = attention_variant(parse_attention_features("causal"));
  auto spec = spec_for(causal, DType::bf16, 128, 128);
  spec.tile = {128, 128, 8, 2, cuda::AttentionMma::ws};
  spec.async_copy = false;
  REQUIRE_THROWS_WITH(gpu::compile_attention(causal, spec, "sm_90a"), Catch::Contains("TMA"));
}

TEST_CASE("attention: decode kernels and their merge compile for sm_90a and sm_80 without spills", "[codegen][attention][nvrtc][decode]") {
  constexpr auto decode = cuda::AttentionMma::decode;
  std::vector<SweepItem> items;
  for (const char* f : {"causal", "window,softcap,sinks", "bias,mask,segments,causal"})
    for (int warps : {1, 4}) items.push_back({f, DType::bf16, 128, 128, {16 * warps, 64, warps, 2, decode}});
  items.push_back({"causal", DType::f16, 64, 64, {32, 128, 2, 2, decode}});
  items.push_back({"causal,softcap", DType::bf16, 128, 128, {16, 32, 1, 4, decode}});
  items.push_back({"causal", DType::bf16, 128, 128, {16, 64, 1, 3, decode}});
  items.push_back({"causal,sinks", DType::bf16, 128, 128, {16, 64, 4, 2, decode}});
  items.push_back({"window,softcap", DType::bf16, 128, 128, {16, 128, 8, 2, decode}});
  items.push_back({"causal", DType::bf16, 64, 64, {32, 64, 4, 2, decode}});
  for (const SweepItem& item : items) {
    REQUIRE(cuda::validate_attention_tile(item.tile, item.D, item.Dv, 227 * 1024, item.type == DType::f32, "sm_90a").empty());
    const auto result = compile_sm90a(item);
    REQUIRE_FALSE(result.kernel.merge_name.empty());
    const auto* merge = result.program.resources(result.kernel.merge_name);
    REQUIRE(merge != nullptr);
    CHECK(merge->spill_store_bytes == 0);
    CHECK(result.program.ptx.find("mma.sync.aligned.m16n8k16") != std::string::npos);
  }
  auto spec = spec_for(attention_variant(parse_attention_features("causal,sinks")), DType::bf16, 128, 128);
  spec.tile = {16, 64, 1, 2, decode};
  const auto sm80 = gpu::compile_attention(attention_variant(parse_attention_features("causal,sinks")), spec, "sm_80");
  REQUIRE(sm80.program.resources(sm80.kernel.name) != nullptr);
  CHECK(sm80.program.resources(sm80.kernel.name)->spill_store_bytes == 0);
  // Dropout is the forward's alone, by name.
  spec = spec_for(attention_variant(parse_attention_features("causal,dropout")), DType::bf16, 64, 64);
  spec.tile = {16, 64, 1, 2, decode};
  CHECK_THROWS_WITH(cuda::generate_attention(attention_variant(parse_attention_features("causal,dropout")), spec),
                    Catch::Contains("decode form, which draws no dropout"));
  CHECK(cuda::parse_attention_tile("16,64,1,2,decode") == cuda::AttentionTile{16, 64, 1, 2, decode});
  CHECK_THAT(cuda::validate_attention_tile({128, 64, 8, 2, decode}, 128, 128).front(), Catch::Contains("expected 16, 32 or 64 (mma=decode)"));
  CHECK_THAT(cuda::validate_attention_tile({16, 32, 4, 2, decode}, 128, 128).front(), Catch::Contains("16 keys or a multiple of 16 a warp"));
  CHECK_THAT(cuda::validate_attention_tile({32, 64, 1, 2, decode}, 128, 128).front(), Catch::Contains("a multiple of block_m / 16 warps"));
  CHECK(cuda::validate_attention_tile({16, 64, 4, 2, decode}, 128, 128).empty());
}
