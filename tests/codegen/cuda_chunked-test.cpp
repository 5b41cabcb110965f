// The chunked CUDA generator. Without a GPU its kernels are checked by running them on the
// host emulation of CUDA (tensor-core fragments included) against the CPU path, and by
// NVRTC, which must compile the family for every variant and a sweep of tiles, for sm_80 (PTX)
// and sm_90a (cubin, no spills).
#include <catch2/catch.hpp>

#include <ladle/codegen/cuda/chunked.h>
#include <ladle/codegen/cpu/recurrent.h>
#include <ladle/ops/bind.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "case_binding.h"
#include "chunked_cases.h"
#include "cuda_emulation.h"
#include "sweep.h"
#include "chunked_kernels.inc"

using namespace ladle;
using namespace case_binding;

TEST_CASE("chunked: the source opens with the variant, config, launch and gate modes", "[codegen][chunked]") {
  const auto cases = chunked_cases::all();
  const chunked_cases::Case& c = cases.back();  // g_gamma, reverse
  const cuda::ChunkedKernel kernel = cuda::generate_chunked(c.c.variant, c.spec());
  INFO(kernel.source);
  std::istringstream printed(ir::to_string(c.c.variant));
  for (std::string line; std::getline(printed, line);) CHECK_THAT(kernel.source, Catch::Contains("// " + line + "\n"));
  CHECK_THAT(kernel.source, Catch::StartsWith("// ladle: chunked kernel " + kernel.name + "\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// config: block_k=16 chunk=32 block_v=16 warps=2 (64 threads); requires K <= 16\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// gates: key side per-token scalar, value side none\n"));
  CHECK_THAT(kernel.source, Catch::Contains("dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes"));
  CHECK_THAT(kernel.source, Catch::Contains("ladle_mma_bf16("));
  // Log2 gates below the floor (-inf: a hard reset) count as the floor in the cumulative sums.
  CHECK_THAT(kernel.source, Catch::Contains("constexpr float GATE_FLOOR = -256.0f;"));
  CHECK_THAT(kernel.source, Catch::Contains("if (lg < GATE_FLOOR) floors += run + GATE_FLOOR, run = 0.0f;"));
  CHECK(kernel.shared_bytes == cuda::chunked_shared_bytes(c.c.variant, c.tile));
  CHECK(kernel.threads == 64);
  CHECK(kernel.block_v == 16);
  // Another tile, another name; the same inputs, the same source.
  chunked_cases::Case other = c;
  other.tile.chunk = 16;
  CHECK(cuda::generate_chunked(other.c.variant, other.spec()).name != kernel.name);
  CHECK(cuda::generate_chunked(c.c.variant, c.spec()).source == kernel.source);
}

TEST_CASE("chunked: tiles and variants are validated", "[codegen][chunked]") {
  const ir::Variant& gla = recurrent_variant(true, false, false, false);
  CHECK(cuda::validate_chunked_tile({128, 64, 64, 8}, gla, 128, 128).empty());
  CHECK(cuda::validate_chunked_tile(cuda::default_chunked_tile(256, 256), gla, 256, 256).empty());
  CHECK(cuda::validate_chunked_tile(cuda::default_chunked_tile(64, 64), gla, 64, 64).empty());
  CHECK_THAT(cuda::validate_chunked_tile({128, 48, 64, 8}, gla, 128, 128).front(), Catch::Contains("chunk = 48, expected 16, 32 or 64"));
  CHECK_THAT(cuda::validate_chunked_tile({128, 64, 64, 2}, gla, 128, 128).front(), Catch::Contains("needs at least 4 warps"));
  CHECK_THAT(cuda::validate_chunked_tile({256, 64, 128, 4}, gla, 256, 128).front(), Catch::Contains("state values in registers"));
  CHECK_THAT(cuda::validate_chunked_tile({64, 64, 64, 8}, gla, 128, 128).front(), Catch::Contains("K = 128 exceeds block_k = 64"));
  CHECK_THAT(cuda::validate_chunked_tile({128, 64, 24, 8}, gla, 128, 128).front(), Catch::Contains("block_v = 24"));
  CHECK_THAT(cuda::validate_chunked_tile({256, 64, 64, 8}, gla, 256, 64, 163 * 1024).front(), Catch::Contains("bytes of shared memory"));

  // The split form's state tile.
  CHECK(cuda::validate_chunked_tile({128, 64, 64, 8, 64, 64, 4, false}, gla, 128, 128).empty());
  CHECK(cuda::validate_chunked_tile({128, 64, 64, 8, 32, 16, 1, true}, gla, 128, 128).empty());
  CHECK_THAT(cuda::validate_chunked_tile({128, 64, 64, 8, 64, 64, 3, false}, gla, 128, 128).front(), Catch::Contains("state_warps = 3"));
  CHECK_THAT(cuda::validate_chunked_tile({128, 64, 64, 8, 24, 64, 4, false}, gla, 128, 128).front(), Catch::Contains("state_block_k = 24"));
  CHECK_THAT(cuda::validate_chunked_tile({128, 64, 64, 8, 0, 64, 4, false}, gla, 128, 128).front(), Catch::Contains("need state_block_k > 0"));
  CHECK_THAT(cuda::validate_chunked_tile({128, 64, 64, 8, 128, 128, 1, false}, gla, 128, 128).front(),
             Catch::Contains("state pass would keep 512 state values"));
  CHECK(cuda::to_string(cuda::ChunkedTile{128, 64, 64, 8, 64, 32, 4, true}) == "block_k=128 chunk=64 block_v=64 warps=8 states=64x32x4 f32");
  CHECK(cuda::parse_chunked_tile("128,64,64,8,64,32,4,f32") == cuda::ChunkedTile{128, 64, 64, 8, 64, 32, 4, true});
  CHECK(cuda::parse_chunked_tile("128,64,64,8") == cuda::ChunkedTile{128, 64, 64, 8});
  CHECK_THROWS_WITH(cuda::parse_chunked_tile("128,64,64"), Catch::Contains("expected block_k,chunk,block_v,warps"));
  CHECK_THROWS_WITH(cuda::parse_chunked_tile("128,64,64,8,64,32,4,f16"), Catch::Contains("'128,64,64,8,64,32,4,f16'"));
  // wgmma tiles: the serial form's state update on whole warpgroups, sm_90a only.
  {
    cuda::ChunkedTile w{128, 32, 128, 8};
    w.wgmma = true;
    CHECK(cuda::parse_chunked_tile("128,32,128,8,wgmma") == w);
    CHECK(cuda::to_string(w) == "block_k=128 chunk=32 block_v=128 warps=8 wgmma");
    CHECK_THROWS_WITH(cuda::parse_chunked_tile("128,32,128,8,wgmm"), Catch::Contains("[,wgmma]"));
    CHECK_THROWS_WITH(cuda::parse_chunked_tile("128,32,128,8,wgmma,1"), Catch::Contains("'128,32,128,8,wgmma,1'"));
    CHECK(cuda::validate_chunked_tile(w, gla, 128, 128, 0, "sm_90a").empty());
    CHECK(cuda::validate_chunked_tile(w, gla, 128, 128).empty());  // no target named: not checked here
    CHECK_THAT(cuda::validate_chunked_tile(w, gla, 128, 128, 0, "sm_80").front(), Catch::Contains("wgmma needs the target sm_90a"));
    CHECK_THAT(cuda::validate_chunked_tile({64, 32, 64, 8, 0, 0, 0, false, true}, gla, 64, 64).front(),
               Catch::Contains("block_k / 16 to be a multiple of warps"));
    CHECK_THAT(cuda::validate_chunked_tile({64, 32, 32, 2, 0, 0, 0, false, true}, gla, 64, 64).front(), Catch::Contains("warps = 4 or 8"));
    CHECK_THAT(cuda::validate_chunked_tile({128, 32, 64, 8, 64, 64, 4, false, true}, gla, 128, 128).front(),
               Catch::Contains("wgmma is the serial form's"));
    cuda::ChunkedKernelSpec spec;
    spec.input_types.assign(gla.inputs.size(), DType::bf16);
    spec.tile = w;
    REQUIRE_THROWS_WITH(cuda::generate_chunked(gla, spec), Catch::Contains("wgmma needs the target sm_90a") && Catch::Contains("not given"));
    spec.arch = "sm_80";
    REQUIRE_THROWS_WITH(cuda::generate_chunked(gla, spec), Catch::Contains("the target is sm_80"));
    spec.arch = "sm_90a";
    const cuda::ChunkedKernel kernel = cuda::generate_chunked(gla, spec);
    CHECK_THAT(kernel.source, Catch::Contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
    CHECK_THAT(kernel.source, Catch::Contains("// tensor cores: the state update on wgmma.mma_async m64n128k16"));
    spec.tile.wgmma = false;
    CHECK(cuda::generate_chunked(gla, spec).name != kernel.name);
    CHECK_THAT(cuda::generate_chunked(gla, spec).source, !Catch::Contains("wgmma"));
  }
  {
    cuda::ChunkedKernelSpec split;
    split.input_types.assign(gla.inputs.size(), DType::bf16);
    split.tile = {128, 64, 64, 8, 64, 64, 4, false};
    REQUIRE_THROWS_WITH(cuda::generate_chunked(gla, split), Catch::Contains("phase serial with a split tile"));
    split.tile = {128, 64, 64, 8};
    split.phase = cuda::ChunkedPhase::outputs;
    REQUIRE_THROWS_WITH(cuda::generate_chunked(gla, split), Catch::Contains("phase outputs needs a split tile"));
  }

  const auto normalised = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v), dsl::q, dsl::scalar("scale")).normalized(1e-6f), "n");
  CHECK_THAT(cuda::chunked_unsupported(normalised), Catch::Contains("normaliser"));
  cuda::ChunkedKernelSpec spec;
  spec.input_types.assign(normalised.inputs.size(), DType::bf16);
  REQUIRE_THROWS_AS(cuda::generate_chunked(normalised, spec), InvalidArgument);
  spec.input_types.assign(gla.inputs.size(), DType::bf16);
  spec.tile.warps = 3;
  REQUIRE_THROWS_WITH(cuda::generate_chunked(gla, spec), Catch::Contains("warps = 3"));
}

namespace {

// Case c on the host emulation (`emulate`) against the CPU path: bf16 tensor-core operands,
// so 1e-2 whatever the input type.
void check_against_cpu(const chunked_cases::Case& cc, std::uint64_t seed,
                       const std::function<void(const ops::BoundInputs& gpu_run, const Bound& bound)>& emulate) {
  const Errors errors = emulated_against_cpu(cc.c, seed, emulate);
  CHECK(errors.o < 1e-2);
  if (cc.c.spec.final_state) CHECK(errors.final_state < 1e-2);
}
// The runs of a case under the sweep (sweep.h): lengths vary, the kernel and its arguments' layout do not.
std::vector<std::pair<chunked_cases::Case, std::uint64_t>> runs(const chunked_cases::Case& cc, std::uint64_t seed) {
  return sweep::runs(cc, seed, [](auto& c) -> auto& { return c.c; });
}
std::vector<std::pair<chunked_cases::SegmentedCase, std::uint64_t>> runs(const chunked_cases::SegmentedCase& sc, std::uint64_t seed) {
  return sweep::runs(sc, seed, [](auto& c) -> auto& { return c.c.c; });
}

// Runs a segmented case's kernels on the emulation as the launcher does and checks the result against
// the CPU path: the state pass over every earlier segment (whose states and decays must then all be
// written), the fold unless the serial kernel folds them itself (the ws form), then the serial form
// over every segment.
void check_segmented(const chunked_cases::SegmentedCase& sc, std::uint64_t seed, const cuda::ChunkedKernel& first,
                     const cuda::ChunkedKernel& fold, const cuda::ChunkedKernel& serial, const EmulatedSegmented& kernels) {
  const cuda_cases::Case& c = sc.c.c;
  check_against_cpu(sc.c, seed, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
    const cuda::ChunkedSegments segments =
        cuda::chunked_segments(bound.sequences, c.T, c.cu_seqlens, sc.segment_tokens, c.spec.reverse, sc.state_pieces);
    const std::int64_t earlier = segments.earlier_segments();
    const std::int64_t width = cuda::chunked_segment_decay_width(c.variant, c.K, c.V);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> own_states(static_cast<std::size_t>(std::max<std::int64_t>(1, earlier * c.H * c.K * c.V)), nan);
    std::vector<float> own_decay(static_cast<std::size_t>(std::max<std::int64_t>(1, earlier * c.H * width)), nan);
    SplitArguments split;
    split.segment_states = own_states.data();
    split.segment_decay = own_decay.data();
    if (earlier > 0) {
      split.segments = segments.earlier.data();
      Arguments arguments(first.params, c, gpu_run.args, split);
      const cuda::ChunkedGrid grid = cuda::chunked_grid(first, earlier, c.H, c.K, c.V, 0);
      cuda_emulation::launch(grid.x, grid.y, grid.z, first.threads, [&] { kernels.first.launch(arguments.data()); });
      for (std::int64_t e = 0; e < earlier * c.H * c.K * c.V; ++e) REQUIRE(!std::isnan(own_states[static_cast<std::size_t>(e)]));
      for (std::int64_t e = 0; e < earlier * c.H * width; ++e) REQUIRE(!std::isnan(own_decay[static_cast<std::size_t>(e)]));
      if (!sc.c.tile.ws) {  // the fold over every segment row: the state entering each segment in place of L_j
        split.segments = segments.all.data();
        Arguments fold_arguments(fold.params, c, gpu_run.args, split);
        const cuda::ChunkedGrid fold_grid = cuda::chunked_grid(fold, segments.segments(), c.H, c.K, c.V, 0);
        cuda_emulation::launch(fold_grid.x, fold_grid.y, fold_grid.z, fold.threads, [&] { kernels.fold.launch(fold_arguments.data()); });
      }
    }
    split.segments = segments.all.data();
    Arguments arguments(serial.params, c, gpu_run.args, split);
    const cuda::ChunkedGrid grid = cuda::chunked_grid(serial, segments.segments(), c.H, c.K, c.V, 0);
    cuda_emulation::launch(grid.x, grid.y, grid.z, serial.threads, [&] { kernels.serial.launch(arguments.data()); });
  });
}

}  // namespace

TEST_CASE("chunked: every kernel, run on the host emulation of CUDA, computes what the CPU path computes", "[codegen][chunked][emulation]") {
  const auto cases = chunked_cases::all();
  REQUIRE(std::size(emulated_kernels) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i].c;
    const cuda::ChunkedKernel kernel = cuda::generate_chunked(c.variant, cases[i].spec());
    INFO(c.name << " (" << kernel.name << ", " << cuda::to_string(cases[i].tile) << ")");
    REQUIRE(kernel.name == emulated_kernels[i].name);
    REQUIRE(cuda::validate_chunked_tile(cases[i].tile, c.variant, c.K, c.V).empty());
    REQUIRE(static_cast<std::size_t>(kernel.shared_bytes) <= cuda_emulation::dynamic_shared_bytes);
    for (const auto& [run, seed] : runs(cases[i], 2000 + i)) {
      INFO(run.c.name);
      check_against_cpu(run, seed, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
        Arguments arguments(kernel.params, c, gpu_run.args);
        const cuda::ChunkedGrid grid = cuda::chunked_grid(kernel, bound.sequences, c.H, c.K, c.V, 0);
        cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.threads, [&] { emulated_kernels[i].launch(arguments.data()); });
      });
    }
  }
}

TEST_CASE("chunked: the state update on wgmma (sm_90a), run on the host emulation, computes what the CPU path computes",
          "[codegen][chunked][emulation][wgmma]") {
  const auto cases = chunked_cases::wgmma();
  REQUIRE(std::size(emulated_wgmma_kernels) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i].c;
    const cuda::ChunkedKernel kernel = cuda::generate_chunked(c.variant, cases[i].spec());
    INFO(c.name << " (" << kernel.name << ", " << cuda::to_string(cases[i].tile) << ")");
    REQUIRE(kernel.name == emulated_wgmma_kernels[i].name);
    // Every tile is valid, but the one the library refuses for an open bug: on the GPU it computes NaN
    // from the second chunk on; here it must still compute right (the emulation is not where it fails).
    const auto problems = cuda::validate_chunked_tile(cases[i].tile, c.variant, c.K, c.V, 0, "sm_90a");
    const bool open_bug = cases[i].tile.block_v == 16 && cases[i].tile.warps == 8 && cases[i].tile.chunk == 64 &&
                         !cuda::chunked_head_decay_only(c.variant);
    if (open_bug) REQUIRE_THAT(problems.front(), Catch::Contains("an open bug"));
    else REQUIRE(problems.empty());
    REQUIRE_THAT(kernel.source, Catch::Contains("ladle_wgmma_rs_bf16<BV>(sacc[m]"));
    for (const auto& [run, seed] : runs(cases[i], 5000 + i)) {
      INFO(run.c.name);
      check_against_cpu(run, seed, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
        Arguments arguments(kernel.params, c, gpu_run.args);
        const cuda::ChunkedGrid grid = cuda::chunked_grid(kernel, bound.sequences, c.H, c.K, c.V, 0);
        cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.threads, [&] { emulated_wgmma_kernels[i].launch(arguments.data()); });
      });
    }
  }
}

TEST_CASE("chunked: the warp-specialised form (sm_90a: TMA producer, wgmma consumers), run on the host emulation, computes "
          "what the CPU path computes", "[codegen][chunked][emulation][ws]") {
  const auto cases = chunked_cases::ws();
  REQUIRE(std::size(emulated_ws_kernels) == cases.size());
  REQUIRE(cases.size() >= 8);  // every head-decay and key-gate case of all() and the four of ws() itself
  int key_gated = 0;
  for (const auto& c : cases) key_gated += c.c.variant.has(ir::Slot::log_decay_k) ? 1 : 0;
  CHECK(key_gated >= 6);
  int value_gated = 0;  // the recurrences of GLA's backward with the gate on their output side
  for (const auto& c : cases) value_gated += c.c.variant.has(ir::Slot::log_decay_v) ? 1 : 0;
  CHECK(value_gated >= 5);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i].c;
    const cuda::ChunkedKernel kernel = cuda::generate_chunked(c.variant, cases[i].spec());
    INFO(c.name << " (" << kernel.name << ", " << cuda::to_string(cases[i].tile) << ")");
    REQUIRE(kernel.name == emulated_ws_kernels[i].name);
    // Every tile is valid, but the one the library refuses for an open bug: on the GPU it computes NaN
    // from the second chunk on; here it must still compute right (the emulation is not where it fails).
    const auto problems = cuda::validate_chunked_tile(cases[i].tile, c.variant, c.K, c.V, 0, "sm_90a");
    const bool open_bug = cases[i].tile.block_v == 16 && cases[i].tile.warps == 8 && cases[i].tile.chunk == 64 &&
                         !cuda::chunked_head_decay_only(c.variant);
    if (open_bug) REQUIRE_THAT(problems.front(), Catch::Contains("an open bug"));
    else REQUIRE(problems.empty());
    REQUIRE(static_cast<std::size_t>(kernel.shared_bytes) <= cuda_emulation::dynamic_shared_bytes);
    REQUIRE(kernel.threads == static_cast<unsigned>(128 * (1 + cases[i].tile.block_v / 64)));
    for (const auto& [run, seed] : runs(cases[i], 7000 + i)) {
      INFO(run.c.name);
      check_against_cpu(run, seed, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
        Arguments arguments(kernel.params, c, gpu_run.args);
        const cuda::ChunkedGrid grid = cuda::chunked_grid(kernel, bound.sequences, c.H, c.K, c.V, 0);
        cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.threads, [&] { emulated_ws_kernels[i].launch(arguments.data()); });
      });
    }
  }
}

// chunk_states_out: the ws serial kernel also writes the state entering each of its 64-token chunks (the
// recurrent backward's boundary states). Against the CPU path's checkpoints (the state entering every
// 64-token chunk in the recurrence's direction, fp32): forward and reverse, packed with an empty
// sequence, h0, GQA, key gates and head decays; o and the final state as without the flag.
TEST_CASE("chunked: the ws serial kernel's chunk entry states (chunk_states_out), on the host emulation, equal the CPU "
          "path's state before each chunk", "[codegen][chunked][emulation][ws][ws-states]") {
  const auto cases = chunked_cases::ws_chunk_states();
  REQUIRE(std::size(emulated_ws_chunk_states_kernels) == cases.size());
  REQUIRE(cases.size() >= 6);
  int reversed = 0, packed = 0, key_gated = 0, many_chunks = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i].c;
    const cuda::ChunkedKernel kernel = cuda::generate_chunked(c.variant, chunked_cases::chunk_states_spec(cases[i]));
    INFO(c.name << " (" << kernel.name << ", " << cuda::to_string(cases[i].tile) << ")");
    REQUIRE(kernel.name == emulated_ws_chunk_states_kernels[i].name);
    CHECK(kernel.name != cuda::generate_chunked(c.variant, cases[i].spec()).name);
    CHECK_THAT(kernel.source, Catch::Contains("the state entering this chunk"));
    reversed += c.spec.reverse ? 1 : 0, packed += c.spec.varlen ? 1 : 0;
    key_gated += c.variant.has(ir::Slot::log_decay_k) ? 1 : 0;
    for (const auto& [run, seed] : runs(cases[i], 9000 + i)) {
      INFO(run.c.name);
      check_against_cpu(run, seed, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
        // The CPU path's checkpoints: the reference, and the chunks' numbering.
        cpu::RecurrentCheckpoints checkpoints;
        cpu::RecurrentArgs reference = gpu_run.args;
        Tensor scratch_o(DType::f32, {run.c.B, run.c.T, run.c.H, run.c.V}, 0.0f);
        reference.output = scratch_o.view();
        reference.final_state.reset();
        checkpoints.allocate(reference.batch, reference.tokens, reference.cu_seqlens, reference.heads, reference.key_dim, reference.value_dim);
        reference.checkpoints = &checkpoints;
        cpu::run_recurrent(c.variant, reference);
        REQUIRE(checkpoints.interval == 64);
        const std::int64_t chunks = checkpoints.first_chunk.back();
        many_chunks += chunks >= 2 * bound.sequences ? 1 : 0;
        const std::size_t area = static_cast<std::size_t>(c.K * c.V);
        std::vector<float> table(static_cast<std::size_t>(chunks * c.H) * area, std::numeric_limits<float>::quiet_NaN());
        SplitArguments split{table.data(), checkpoints.first_chunk.data(), bound.sequences};
        Arguments arguments(kernel.params, c, gpu_run.args, split);
        const cuda::ChunkedGrid grid = cuda::chunked_grid(kernel, bound.sequences, c.H, c.K, c.V, 0);
        cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.threads, [&] { emulated_ws_chunk_states_kernels[i].launch(arguments.data()); });
        // Every row written; each (chunk, head) within bf16 operands' error of the CPU path's state.
        double worst = 0;
        for (std::int64_t row = 0; row < chunks * c.H; ++row) {
          const float* got = table.data() + static_cast<std::size_t>(row) * area;
          const float* want = checkpoints.values.data() + static_cast<std::size_t>(row) * (area + static_cast<std::size_t>(c.K));
          double diff = 0, norm = 0;
          for (std::size_t e = 0; e < area; ++e) {
            REQUIRE(!std::isnan(got[e]));
            diff += (got[e] - want[e]) * double(got[e] - want[e]), norm += want[e] * double(want[e]);
          }
          worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
          if (norm == 0) CHECK(diff == 0);  // a zero state (no h0, the first chunk) written as zero
        }
        INFO("worst relative error of a chunk's state " << worst);
        CHECK(worst < 1e-2);
      });
    }
  }
  CHECK(reversed >= 1);
  CHECK(packed >= 1);
  CHECK(key_gated >= 2);
  CHECK(many_chunks >= 1);
}

TEST_CASE("chunked: the ws form's source, tile rules and the variants it refuses", "[codegen][chunked][ws]") {
  const ir::Variant simple_gla = recurrent_variant(false, false, false, true);
  const ir::Variant gla = recurrent_variant(true, false, false, false);
  cuda::ChunkedTile ws{128, 64, 128, 12};
  ws.ws = true;
  CHECK(cuda::parse_chunked_tile("128,64,128,12,ws") == ws);
  CHECK(cuda::to_string(ws) == "block_k=128 chunk=64 block_v=128 warps=12 ws");
  CHECK(cuda::validate_chunked_tile(ws, simple_gla, 128, 128, 0, "sm_90a").empty());
  CHECK_THAT(cuda::validate_chunked_tile(ws, simple_gla, 128, 128, 0, "sm_80").front(), Catch::Contains("ws needs the target sm_90a"));
  CHECK(cuda::validate_chunked_tile(ws, gla, 128, 128, 0, "sm_90a").empty());
  CHECK(cuda::validate_chunked_tile(ws, recurrent_variant(false, false, true, false), 128, 128, 0, "sm_90a").empty());
  CHECK(cuda::chunked_shared_bytes(recurrent_variant(false, false, true, false), ws) <= 227 * 1024);
  CHECK_THAT(cuda::validate_chunked_tile(ws, recurrent_variant(false, true, true, false), 128, 128, 0, "sm_90a").front(),
             Catch::Contains("a value-side gate alone"));
  CHECK_THAT(cuda::validate_chunked_tile(ws, recurrent_variant(false, false, true, true), 128, 128, 0, "sm_90a").front(),
             Catch::Contains("a value-side gate alone"));
  CHECK_THAT(cuda::validate_chunked_tile(ws, recurrent_variant(true, false, false, true), 128, 128, 0, "sm_90a").front(),
             Catch::Contains("a key-side gate or a per-head decay, not both"));
  // A read before the update: the ws form takes RWKV6 (a key-side gate alone, a bonus per head), not a
  // head decay or a bonus that varies over tokens (the serial form runs those).
  namespace dsl = ladle::dsl;
  CHECK(cuda::validate_chunked_tile(ws, ladle::rwkv6_variant(), 128, 128, 0, "sm_90a").empty());
  const ir::Variant before_head =
      dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_head(dsl::token_head("g_t")), dsl::q, dsl::scalar("scale")), "before_head");
  CHECK_THAT(cuda::validate_chunked_tile(ws, before_head, 128, 128, 0, "sm_90a").front(),
             Catch::Contains("reads before the update only with a key-side gate alone"));
  const ir::Variant token_bonus =
      dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("w")), dsl::q, dsl::scalar("scale"))
                     .bonus(dsl::token_key("u")),
                 "token_bonus");
  CHECK_THAT(cuda::validate_chunked_tile(ws, token_bonus, 128, 128, 0, "sm_90a").front(), Catch::Contains("not one that varies over tokens"));
  CHECK(cuda::chunked_unsupported(before_head).empty());
  CHECK(cuda::chunked_unsupported(token_bonus).empty());
  CHECK_THAT(cuda::chunked_unsupported(ladle::delta_rule_variant(false, false)), Catch::Contains("generate_chunked_delta"));
  cuda::ChunkedTile bad = ws;
  bad.warps = 8;
  CHECK_THAT(cuda::validate_chunked_tile(bad, simple_gla, 128, 128).front(), Catch::Contains("ws needs warps = 12"));
  bad = ws, bad.chunk = 32;
  CHECK_THAT(cuda::validate_chunked_tile(bad, simple_gla, 128, 128).front(), Catch::Contains("ws needs chunk = 64"));
  bad = ws, bad.block_k = 256;
  CHECK_THAT(cuda::validate_chunked_tile(bad, simple_gla, 256, 128).front(), Catch::Contains("ws needs block_k = 64 or 128"));
  CHECK(cuda::chunked_shared_bytes(simple_gla, ws) <= 227 * 1024);
  // A feature map or a per-token read scale is not what TMA copies.
  const ir::Variant mapped = dsl::lower(dsl::read(dsl::scan(dsl::elu(dsl::k) + 1, dsl::v).decay_head(dsl::head_param("g_gamma")),
                                                  dsl::q, dsl::scalar("scale")), "mapped");
  CHECK_THAT(cuda::validate_chunked_tile(ws, mapped, 128, 128, 0, "sm_90a").front(), Catch::Contains("no feature map"));

  cuda::ChunkedKernelSpec spec;
  spec.tile = ws;
  for (const ir::Input& in : simple_gla.inputs)
    spec.input_types.push_back(in.role == ir::Role::other || in.kind == ir::InputKind::scalar ? DType::f32 : DType::bf16);
  spec.output_type = DType::bf16;
  REQUIRE_THROWS_WITH(cuda::generate_chunked(simple_gla, spec), Catch::Contains("ws needs the target sm_90a") && Catch::Contains("not given"));
  spec.arch = "sm_90a";
  const cuda::ChunkedKernel kernel = cuda::generate_chunked(simple_gla, spec);
  CHECK(kernel.threads == 384);
  CHECK_THAT(kernel.name, Catch::StartsWith("ladle_chunked_ws_"));
  CHECK_THAT(kernel.source, Catch::Contains("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"));
  // TMA and the stage ring come from the device header (codegen/device/pipeline.cuh).
  CHECK_THAT(kernel.source, Catch::Contains("#include <ladle/codegen/device/pipeline.cuh>"));
  CHECK_THAT(kernel.source, Catch::Contains("stage_ring.acquire(c, STAGE_BYTES);"));
  CHECK_THAT(kernel.source, Catch::Contains("ladle_tma_load_4d("));
  CHECK_THAT(kernel.source, Catch::Contains("ladle_wgmma_ss_bf16_tab<64>(S[mt]"));
  CHECK_THAT(kernel.source, Catch::Contains("const __grid_constant__ ladle_tensor_map q_map"));
  int maps = 0;
  for (const cuda::KernelParam& p : kernel.params)
    if (p.role == cuda::KernelParam::Role::input_tensor_map) {
      CHECK(p.box_rows == 64);
      ++maps;
    }
  CHECK(maps == 3);
  // f16 q is refused by name.
  spec.input_types[0] = DType::f16;
  CHECK_THROWS_WITH(cuda::generate_chunked(simple_gla, spec), Catch::Contains("bf16 by TMA") && Catch::Contains("q is f16"));

  // GLA: the gate's input by TMA beside q, k and v (a fourth tensor map), q~ and k~ against a reference per
  // key feature, in two stages of the ring (four would not fit 227 KiB beside q~, k~ and st).
  cuda::ChunkedKernelSpec gla_spec;
  gla_spec.tile = ws;
  gla_spec.arch = "sm_90a";
  for (const ir::Input& in : gla.inputs) gla_spec.input_types.push_back(in.kind == ir::InputKind::scalar ? DType::f32 : DType::bf16);
  gla_spec.output_type = DType::bf16;
  const cuda::ChunkedKernel gla_kernel = cuda::generate_chunked(gla, gla_spec);
  CHECK_THAT(gla_kernel.source, Catch::Contains("q~_t = q_t 2^(G_t - R)") && Catch::Contains("STAGES = 2;"));
  CHECK(gla_kernel.shared_bytes == cuda::chunked_shared_bytes(gla, ws));
  CHECK(gla_kernel.shared_bytes <= 227 * 1024);
  maps = 0;
  for (const cuda::KernelParam& p : gla_kernel.params) maps += p.role == cuda::KernelParam::Role::input_tensor_map ? 1 : 0;
  CHECK(maps == 4);
  // The gate's inputs in fp32 are not what TMA copies in 16 bits: refused by name.
  for (std::size_t k = 0; k < gla.inputs.size(); ++k)
    if (gla.inputs[k].role == ir::Role::other && gla.inputs[k].kind != ir::InputKind::scalar) gla_spec.input_types[k] = DType::f32;
  CHECK_THROWS_WITH(cuda::generate_chunked(gla, gla_spec), Catch::Contains("in 16 bits"));

  // A value-side gate alone: its input by TMA beside v (a fourth tensor map), vt against a reference
  // per value column, the exact per-element sum where a column does not fit.
  const ir::Variant& value_gate = recurrent_variant(false, false, true, false);
  cuda::ChunkedKernelSpec value_spec = gla_spec;
  value_spec.input_types.clear();
  for (const ir::Input& in : value_gate.inputs)
    value_spec.input_types.push_back(in.kind == ir::InputKind::scalar ? DType::f32 : DType::bf16);
  const cuda::ChunkedKernel value_kernel = cuda::generate_chunked(value_gate, value_spec);
  CHECK_THAT(value_kernel.source, Catch::Contains("vt_s = v_s 2^(R - G_s)") && Catch::Contains("2^(G_t - G_s) v_s per element") &&
                                      Catch::Contains("STAGES = 2;"));
  CHECK(value_kernel.shared_bytes == cuda::chunked_shared_bytes(value_gate, ws));
  CHECK(value_kernel.shared_bytes <= 227 * 1024);
  maps = 0;
  for (const cuda::KernelParam& p : value_kernel.params) maps += p.role == cuda::KernelParam::Role::input_tensor_map ? 1 : 0;
  CHECK(maps == 4);
  // No ws state pass for it (the segmented form's state pass takes the suffix or split form).
  value_spec.phase = cuda::ChunkedPhase::states;
  value_spec.segmented = true;
  value_spec.tile = {128, 64, 64, 8};
  value_spec.tile.ws = true;
  CHECK_THAT(cuda::chunked_ws_unsupported(value_gate, value_spec), Catch::Contains("no value-side gate"));
  value_spec.phase = cuda::ChunkedPhase::serial, value_spec.segmented = false, value_spec.tile = ws;
  for (std::size_t k = 0; k < value_gate.inputs.size(); ++k)
    if (value_gate.inputs[k].role == ir::Role::other && value_gate.inputs[k].kind != ir::InputKind::scalar)
      value_spec.input_types[k] = DType::f32;
  CHECK_THROWS_WITH(cuda::generate_chunked(value_gate, value_spec), Catch::Contains("in 16 bits"));
}

TEST_CASE("chunked: the segmented form with a ws serial kernel computes what the CPU path computes",
          "[codegen][chunked][emulation][ws][ws-segmented]") {
  const auto cases = chunked_cases::ws_segmented();
  REQUIRE(std::size(emulated_ws_segmented_kernels) == cases.size());
  REQUIRE(!cases.empty());
  int key_gated = 0, key_state_passes = 0;  // key-side gate cases with a ws serial kernel, with a ws state pass
  int value_gated = 0;                       // value-side gate cases with a ws serial kernel (per-column folds)
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const chunked_cases::SegmentedCase& sc = cases[i];
    const cuda_cases::Case& c = sc.c.c;
    const cuda::ChunkedKernel first = cuda::generate_chunked(c.variant, sc.first_spec());
    const cuda::ChunkedKernel fold = cuda::generate_chunked(c.variant, sc.fold_spec());
    const cuda::ChunkedKernel serial = cuda::generate_chunked(c.variant, sc.serial_spec());
    INFO(c.name << " (" << cuda::to_string(sc.c.tile) << ", segments of " << sc.segment_tokens << " tokens)");
    REQUIRE(serial.name == emulated_ws_segmented_kernels[i].serial.name);
    if (sc.c.tile.ws) {
      REQUIRE_THAT(serial.name, Catch::StartsWith("ladle_chunked_ws_segmented_"));
      CHECK_THAT(serial.source, Catch::Contains("S = 2^D_j S + L_j"));
    }
    if (c.variant.has(ir::Slot::log_decay_k)) {
      if (sc.first.ws) {
        REQUIRE_THAT(first.name, Catch::StartsWith("ladle_chunked_ws_states_segmented_"));
        CHECK_THAT(first.source, Catch::Contains("kup = k 2^(G_C - G_s)"));
      }
      key_gated += sc.c.tile.ws ? 1 : 0;
      key_state_passes += sc.first.ws ? 1 : 0;
    }
    if (c.variant.has(ir::Slot::log_decay_v) && sc.c.tile.ws) {
      CHECK(!sc.first.ws);  // the ws state pass takes no value-side gate
      ++value_gated;
    }
    for (const auto& [run, seed] : runs(sc, 8000 + i)) {
      INFO(run.c.c.name);
      check_segmented(run, seed, first, fold, serial, emulated_ws_segmented_kernels[i]);
    }
  }
  CHECK(key_gated >= 2);
  CHECK(key_state_passes >= 2);
  CHECK(value_gated >= 2);
}

TEST_CASE("chunked: the split form (state pass, then every chunk at once) computes what the CPU path computes",
          "[codegen][chunked][emulation]") {
  const auto cases = chunked_cases::split();
  REQUIRE(std::size(emulated_split_kernels) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i].c;
    cuda::ChunkedKernelSpec spec = cases[i].spec();
    spec.phase = cuda::ChunkedPhase::states;
    const cuda::ChunkedKernel states = cuda::generate_chunked(c.variant, spec);
    spec.phase = cuda::ChunkedPhase::outputs;
    const cuda::ChunkedKernel outputs = cuda::generate_chunked(c.variant, spec);
    INFO(c.name << " (" << cuda::to_string(cases[i].tile) << ")");
    REQUIRE(states.name == emulated_split_kernels[i].states.name);
    REQUIRE(outputs.name == emulated_split_kernels[i].outputs.name);
    REQUIRE(cuda::validate_chunked_tile(cases[i].tile, c.variant, c.K, c.V).empty());
    REQUIRE(static_cast<std::size_t>(outputs.shared_bytes) <= cuda_emulation::dynamic_shared_bytes);
    CHECK(states.shared_bytes == cuda::chunked_shared_bytes(c.variant, cases[i].tile, cuda::ChunkedPhase::states));
    for (const auto& [run, seed] : runs(cases[i], 3000 + i)) {
      INFO(run.c.name);
      check_against_cpu(run, seed, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
        // The chunks of every sequence, numbered as the launcher numbers them.
        const int C = cases[i].tile.chunk;
        std::vector<std::int64_t> offsets{0};
        for (int n = 0; n < bound.sequences; ++n) {
          const std::int64_t length = run.c.cu_seqlens.empty() ? run.c.T : run.c.cu_seqlens[n + 1] - run.c.cu_seqlens[n];
          offsets.push_back(offsets.back() + (length + C - 1) / C);
        }
        const std::int64_t chunks = offsets.back();
        const std::size_t element = cases[i].tile.state_f32 ? 4 : 2;
        std::vector<unsigned char> chunk_states(static_cast<std::size_t>(chunks * c.H * c.K * c.V) * element, 0xff);  // NaN
        SplitArguments split{chunk_states.data(), offsets.data(), bound.sequences};
        for (const auto* kernel : {&states, &outputs}) {
          Arguments arguments(kernel->params, c, gpu_run.args, split);
          const auto& launcher = kernel == &states ? emulated_split_kernels[i].states : emulated_split_kernels[i].outputs;
          const cuda::ChunkedGrid grid = cuda::chunked_grid(*kernel, bound.sequences, c.H, c.K, c.V, chunks);
          cuda_emulation::launch(grid.x, grid.y, grid.z, kernel->threads, [&] { launcher.launch(arguments.data()); });
        }
        // The state pass wrote the state entering every chunk: nothing is left NaN.
        Tensor written(element == 4 ? DType::f32 : DType::bf16, {std::int64_t(chunk_states.size() / element)});
        std::memcpy(written.data(), chunk_states.data(), chunk_states.size());
        for (const double x : test::values_of(written)) REQUIRE(!std::isnan(x));
      });
    }
  }
}

TEST_CASE("chunked: the segmented form (each segment's own state, then the serial form from the state the earlier "
          "ones leave) computes what the CPU path computes", "[codegen][chunked][emulation]") {
  const auto cases = chunked_cases::segmented();
  REQUIRE(std::size(emulated_segmented_kernels) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const chunked_cases::SegmentedCase& sc = cases[i];
    const cuda_cases::Case& c = sc.c.c;
    const cuda::ChunkedKernel first = cuda::generate_chunked(c.variant, sc.first_spec());
    const cuda::ChunkedKernel fold = cuda::generate_chunked(c.variant, sc.fold_spec());
    const cuda::ChunkedKernel serial = cuda::generate_chunked(c.variant, sc.serial_spec());
    INFO(c.name << " (" << cuda::to_string(sc.c.tile) << ", first " << cuda::to_string(sc.first) << ", segments of "
                << sc.segment_tokens << " tokens, " << sc.state_pieces << " state pieces each; first kernel " << first.name << ")");
    REQUIRE(first.name == emulated_segmented_kernels[i].first.name);
    REQUIRE(fold.name == emulated_segmented_kernels[i].fold.name);
    REQUIRE(serial.name == emulated_segmented_kernels[i].serial.name);
    REQUIRE(cuda::validate_chunked_tile(sc.first, c.variant, c.K, c.V).empty());
    REQUIRE(static_cast<std::size_t>(first.shared_bytes) <= cuda_emulation::dynamic_shared_bytes);
    CHECK_THAT(fold.source, Catch::Contains("S = 2^D_j S + L_j"));
    CHECK_THAT(serial.source, Catch::Contains("the fold kernel's"));
    for (const auto& [run, seed] : runs(sc, 4000 + i)) {
      INFO(run.c.c.name);
      check_segmented(run, seed, first, fold, serial, emulated_segmented_kernels[i]);
    }
  }
}

TEST_CASE("chunked: segments cover every sequence in the recurrence's direction", "[codegen][chunked]") {
  // Two sequences of 100 tokens in segments of 40: 40, 40, 20 forward; from the back reversed.
  const cuda::ChunkedSegments forward = cuda::chunked_segments(2, 100, {}, 40, false);
  REQUIRE(forward.segments() == 6);
  REQUIRE(forward.earlier_segments() == 4);
  const std::vector<long long> row4(forward.all.begin() + 4 * 8, forward.all.begin() + 5 * 8);
  CHECK(row4 == std::vector<long long>{1, 40, 80, 1, 1, 2, 0, 0});
  const cuda::ChunkedSegments reverse = cuda::chunked_segments(2, 100, {}, 40, true);
  const std::vector<long long> row2(reverse.all.begin() + 2 * 8, reverse.all.begin() + 3 * 8);
  CHECK(row2 == std::vector<long long>{0, 0, 20, 0, 2, 0, 1, 0});
  // Packed sequences (one empty): positions in the packed row, one empty segment for the empty one.
  const cuda::ChunkedSegments packed = cuda::chunked_segments(3, 0, {0, 50, 50, 90}, 32, false);
  REQUIRE(packed.segments() == 5);
  const std::vector<long long> empty(packed.all.begin() + 2 * 8, packed.all.begin() + 3 * 8);
  CHECK(empty == std::vector<long long>{0, 50, 50, 1, 0, 1, 1, 0});
  const std::vector<long long> last(packed.all.begin() + 4 * 8, packed.all.begin() + 5 * 8);
  CHECK(last == std::vector<long long>{0, 82, 90, 2, 1, 1, 1, 0});
  // The state pass in pieces: each earlier segment of 40 tokens as 3 pieces of 14, 14 and 12, in
  // the recurrence's direction; the rows of `all` count the pieces before their segment.
  const cuda::ChunkedSegments pieces = cuda::chunked_segments(2, 100, {}, 40, false, 3);
  REQUIRE(pieces.segments() == 6);
  REQUIRE(pieces.earlier_segments() == 12);
  CHECK(std::vector<long long>(pieces.earlier.begin() + 3 * 8, pieces.earlier.begin() + 6 * 8) ==
        std::vector<long long>{0, 40, 54, 0, 3, 0, 0, 0, 0, 54, 68, 0, 4, 0, 0, 0, 0, 68, 80, 0, 5, 0, 0, 0});
  CHECK(std::vector<long long>(pieces.all.begin() + 5 * 8, pieces.all.begin() + 6 * 8) == std::vector<long long>{1, 80, 100, 1, 6, 6, 1, 0});
  const cuda::ChunkedSegments reversed_pieces = cuda::chunked_segments(1, 100, {}, 40, true, 3);
  CHECK(std::vector<long long>(reversed_pieces.earlier.begin(), reversed_pieces.earlier.begin() + 3 * 8) ==
        std::vector<long long>{0, 86, 100, 0, 0, 0, 0, 0, 0, 72, 86, 0, 1, 0, 0, 0, 0, 60, 72, 0, 2, 0, 0, 0});
  CHECK_THROWS_WITH(cuda::chunked_segments(2, 100, {}, 40, false, 0), Catch::Contains("state_pieces = 0, expected > 0"));
  CHECK_THROWS_WITH(cuda::chunked_segments(2, 100, {}, 0, false), Catch::Contains("segment_tokens = 0, expected > 0"));
  CHECK_THROWS_WITH(cuda::chunked_segments(2, 100, {0, 5}, 8, false), Catch::Contains("cu_seqlens has 2 offsets, expected 3"));
  // The segmented kernels refuse what they cannot take.
  const ir::Variant& gla = recurrent_variant(true, false, false, false);
  cuda::ChunkedKernelSpec spec;
  spec.input_types.assign(gla.inputs.size(), DType::bf16);
  spec.segmented = true;
  spec.varlen = true;
  CHECK_THROWS_WITH(cuda::generate_chunked(gla, spec), Catch::Contains("not cu_seqlens"));
  spec.varlen = false;
  spec.tile = {128, 64, 64, 8, 64, 64, 4, false};
  spec.phase = cuda::ChunkedPhase::states;
  spec.final_state = true;
  CHECK_THROWS_WITH(cuda::generate_chunked(gla, spec), Catch::Contains("starts from zero"));
  spec.phase = cuda::ChunkedPhase::outputs;
  CHECK_THROWS_WITH(cuda::generate_chunked(gla, spec), Catch::Contains("no segmented form"));
}
