// The GPU path's pieces that need no GPU: NVRTC compiles the fused-recurrent CUDA of every
// variant the op matrix runs (PTX for sm_80 and sm_90a, cubins with resource usage for
// sm_90a), and without a driver the GPU entry point fails with NoCudaDriver. On a machine
// with a GPU, recurrent-test.cpp runs the whole matrix on it against the fp64 reference.
#include <catch2/catch.hpp>

#include <ladle/codegen/device/headers.h>
#include <ladle/ops/detail/fingerprint.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_backward.h>
#include <ladle/ops/chunked_plan.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "support/full_sweep.h"
#include "support/tensors.h"

using ladle::DType;

#include <ladle/dsl/dsl.h>

namespace {

ladle::cuda::ChunkedKernelSpec chunked_spec_for(const ladle::ir::Variant& variant, DType type, int K, int V) {
  ladle::cuda::ChunkedKernelSpec spec;
  spec.tile = ladle::cuda::default_chunked_tile(K, V);
  for (const auto& input : variant.inputs)
    spec.input_types.push_back(input.kind == ladle::ir::InputKind::scalar || input.role == ladle::ir::Role::other
                                   ? DType::f32 : type);
  spec.output_type = type;
  return spec;
}

ladle::cuda::RecurrentKernelSpec spec_for(const ladle::ir::Variant& variant, DType type,
                                          int K, int V) {
  ladle::cuda::RecurrentKernelSpec spec;
  spec.tile = ladle::cuda::default_tile(K, V);
  for (const auto& input : variant.inputs)
    spec.input_types.push_back(input.kind == ladle::ir::InputKind::scalar ? DType::f32 : type);
  spec.output_type = type;
  return spec;
}

}  // namespace

// By default each gate combination once, its dtype and mode turning with it (16 = 3 x 4 + 4: every
// dtype with every mode); the whole product under the full sweep.
TEST_CASE("NVRTC compiles the fused-recurrent kernel of every gate combination, dtype and mode", "[gpu][nvrtc]") {
  int compiled = 0;
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  for (int t = 0; t < 3; ++t) {
    const DType type = types[t];
    for (unsigned gates = 0; gates < 16; ++gates) {
      const auto& variant = ladle::recurrent_variant(gates & 1, gates & 2, gates & 4, gates & 8);
      for (int mode = 0; mode < 4; ++mode) {
        if (!test::full_sweep() && (t != static_cast<int>(gates % 3) || mode != static_cast<int>(gates % 4))) continue;
        auto spec = spec_for(variant, type, 64, 48);
        spec.reverse = mode & 1;
        spec.varlen = spec.initial_state = mode & 2;
        spec.final_state = mode != 0;
        INFO(ladle::ir::to_string(variant) << " " << ladle::dtype_name(type) << " mode " << mode);
        auto result = ladle::gpu::compile_recurrent(variant, spec, "compute_80");
        REQUIRE(result.program.ptx.find(".entry " + result.kernel.name) != std::string::npos);
        ++compiled;
      }
    }
  }
  CHECK(compiled == (test::full_sweep() ? 3 * 16 * 4 : 16));
}

TEST_CASE("NVRTC compiles the recurrent backward's kernels for every gate combination, user gates and modes",
          "[gpu][nvrtc][backward]") {
  namespace dsl = ladle::dsl;
  std::vector<ladle::ir::Variant> variants;
  for (unsigned gates = 0; gates < 16; ++gates) variants.push_back(ladle::recurrent_variant(gates & 1, gates & 2, gates & 4, gates & 8));
  variants.push_back(ladle::gla_variant(true));
  variants.push_back(dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(dsl::token_key("x")) / dsl::head_param("tau")),
                                          dsl::q, dsl::sigmoid(dsl::token_head("s"))),
                                "user_gate"));
  variants.push_back(dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("g")), dsl::q, dsl::scalar("scale")).normalized(),
                                "normalized"));
  // By default each variant in one mode (turning with it: every mode four or five times), every phase.
  int compiled = 0;
  for (std::size_t i = 0; i < variants.size(); ++i)
    for (int mode = 0; mode < 4; ++mode)
      for (auto phase : {ladle::cuda::BackwardPhase::slots, ladle::cuda::BackwardPhase::totals, ladle::cuda::BackwardPhase::chain}) {
        if (!test::full_sweep() && mode != static_cast<int>(i % 4)) continue;
        const ladle::ir::Variant& variant = variants[i];
        ladle::cuda::BackwardKernelSpec spec;
        const DType type = mode & 1 ? DType::bf16 : DType::f32;
        for (const auto& input : variant.inputs) spec.input_types.push_back(input.kind == ladle::ir::InputKind::scalar ? DType::f32 : type);
        spec.slot_type = type;
        spec.d_output_type = mode == 3 ? DType::f16 : type;
        spec.reverse = mode & 2;
        spec.varlen = mode & 1;
        spec.phase = phase;
        if (mode & 1) {  // the slots read from the call's tensors, a folded scale, gradients written by the recurrences
          spec.fold_scale = true;
          spec.write_q = spec.write_k = spec.write_v = spec.write_do = spec.write_log_a = spec.write_log_b = false;
          spec.log_a_next_type = spec.log_b_next_type = DType::bf16;
          spec.write_first = spec.direct_q = spec.direct_k = spec.direct_v = true;
        }
        if (variant.normalize) spec.write_v = true, spec.write_do = false, spec.direct_v = false;  // as the launcher plans it
        INFO(ladle::ir::to_string(variant) << " mode " << mode << " " << ladle::cuda::to_string(phase));
        const auto result = ladle::gpu::compile_backward(variant, spec, "compute_80");
        REQUIRE(result.program.ptx.find(".entry " + result.kernel.name) != std::string::npos);
        ++compiled;
      }
  CHECK(compiled == (test::full_sweep() ? 19 * 4 * 3 : 19 * 3));
  // The helpers (the state conversion once per dtype).
  ladle::CompileOptions options;
  options.arch = "compute_80";
  options.headers = ladle::device::headers_for(ladle::cuda::backward_helpers_source());
  const auto helpers = ladle::compile(ladle::cuda::backward_helpers_source(), options);
  for (const char* name : {"ladle_bwd_carry", "ladle_bwd_initial", "ladle_bwd_normalized_f32", "ladle_bwd_normalized_bf16",
                           "ladle_bwd_convert_f32", "ladle_bwd_convert_bf16", "ladle_bwd_convert_f16"})
    CHECK(helpers.ptx.find(std::string(".entry ") + name) != std::string::npos);
  // What the launcher compiles: each helper alone, in a program of its own (backward_helper_source), with
  // its own kernel and no other; an unknown name refused by name.
  for (const std::string& name : ladle::cuda::backward_helper_names()) {
    INFO(name);
    const std::string source = ladle::cuda::backward_helper_source(name);
    options.headers = ladle::device::headers_for(source);
    const auto one = ladle::compile(source, options);
    CHECK(one.ptx.find(".entry " + name + "(") != std::string::npos);
    for (const std::string& other : ladle::cuda::backward_helper_names())
      if (other != name) CHECK(one.ptx.find(".entry " + other + "(") == std::string::npos);
  }
  CHECK_THROWS_WITH(ladle::cuda::backward_helper_source("ladle_bwd_nothing"),
                    Catch::Contains("'ladle_bwd_nothing' is not a helper kernel"));
  // The block kernel in a program of its own (compiled beside the helpers on a cold call), and only there.
  CHECK(helpers.ptx.find(".entry ladle_bwd_block_bf16") == std::string::npos);
  options.headers = ladle::device::headers_for(ladle::cuda::backward_block_source());
  const auto block = ladle::compile(ladle::cuda::backward_block_source(), options);
  CHECK(block.ptx.find(".entry ladle_bwd_block_bf16") != std::string::npos);
  CHECK(block.ptx.find(".entry ladle_bwd_carry") == std::string::npos);
}

// The plain form's block kernel (codegen/device/plain_backward.cuh) runs one block of 256 threads an SM
// with backward_block_shared bytes of dynamic shared memory: it must build without spills for both
// targets, and its shared memory must fit an SM's opt-in limit (227 KB on sm_80 and sm_90).
TEST_CASE("NVRTC compiles ladle_bwd_block_bf16 for sm_80 and sm_90a without spills, its shared memory under 227 KB",
          "[gpu][nvrtc][backward]") {
  CHECK(ladle::cuda::backward_block_shared <= 227 * 1024);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    INFO(arch);
    const ladle::CompiledProgram program = ladle::gpu::compile_backward_block(arch);
    const auto* r = program.resources("ladle_bwd_block_bf16");
    REQUIRE(r != nullptr);
    INFO(r->registers << " registers, " << r->spill_store_bytes << " bytes spilled, " << r->shared_bytes << " static shared");
    CHECK(r->registers > 0);
    CHECK(r->registers <= 255);
    CHECK(r->spill_store_bytes == 0);
    CHECK(r->stack_frame_bytes == 0);  // no array left in local memory
    CHECK(r->shared_bytes + ladle::cuda::backward_block_shared <= 227 * 1024);
    WARN(arch << ": ladle_bwd_block_bf16 " << r->registers << " registers, " << r->spill_store_bytes << " bytes spilled, "
              << r->stack_frame_bytes << " bytes of stack");
  }
}

// The kernel that hashes a device tensor for the backward's fingerprint (ops/detail/fingerprint.h):
// what a GPU runs at every backward entry point, so it must build for every target without a driver.
TEST_CASE("NVRTC compiles the fingerprint's content-hash kernel for sm_80 and sm_90a without spills", "[gpu][nvrtc][backward]") {
  for (const char* arch : {"sm_80", "sm_90a"}) {
    INFO(arch);
    const ladle::CompiledProgram program = ladle::ops::detail::compile_content_hash_kernel(arch);
    CHECK(program.ptx.find(".entry ladle_content_hash") != std::string::npos);
    CHECK_FALSE(program.cubin.empty());
    const auto* r = program.resources("ladle_content_hash");
    REQUIRE(r != nullptr);
    INFO(r->registers << " registers, " << r->spill_store_bytes << " bytes spilled");
    CHECK(r->registers > 0);
    CHECK(r->spill_store_bytes == 0);
  }
}

TEST_CASE("the sm_90a cubins of the named ops fit without spills at K = V = 64, 128 and 256", "[gpu][nvrtc]") {
  for (int D : {64, 128, 256}) {
    for (DType type : {DType::f32, DType::bf16}) {
      const auto& variant = ladle::gla_variant(false);
      auto spec = spec_for(variant, type, D, D);
      auto result = ladle::gpu::compile_recurrent(variant, spec, "sm_90a");
      const auto* r = result.program.resources(result.kernel.name);
      REQUIRE(r != nullptr);
      INFO("D=" << D << " " << ladle::dtype_name(type) << ": " << r->registers << " registers, "
                << r->spill_store_bytes << " bytes spilled");
      CHECK(r->registers > 0);
      CHECK(r->spill_store_bytes == 0);
      CHECK(r->registers <= 255);
    }
  }
}

TEST_CASE("a bad tile is refused with the tile and the sizes named", "[gpu]") {
  std::mt19937_64 rng(3);
  auto q = test::normal(rng, DType::f32, {1, 8, 2, 32});
  auto k = test::normal(rng, DType::f32, {1, 8, 2, 32});
  auto v = test::normal(rng, DType::f32, {1, 8, 2, 32});
  ladle::RunOptions options;
  options.backend = ladle::Backend::gpu;
  options.tile = ladle::cuda::RecurrentTile{16, 32, 3};
  REQUIRE_THROWS_WITH(ladle::run_variant(ladle::recurrent_variant(false, false, false, false), q.tensor.view(),
                                         k.tensor.view(), v.tensor.view(), {{}, {{"scale", 0.5f}}}, options),
                      Catch::Contains("tile") && Catch::Contains("K=32"));
}

TEST_CASE("the backward's state passes refuse what they cannot take by name", "[gpu][backward]") {
  // Host tensors, a chunk the split form does not take, a final state the passes do not write: each
  // refused before any device work (the values themselves are checked by the GPU backward's test).
  std::mt19937_64 rng(4);
  auto q = test::normal(rng, DType::bf16, {1, 80, 2, 32});
  auto k = test::normal(rng, DType::bf16, {1, 80, 2, 32});
  auto v = test::normal(rng, DType::bf16, {1, 80, 2, 32});
  const ladle::ir::Variant& variant = ladle::recurrent_variant(false, false, false, false);
  const ladle::VariantInputs inputs{{}, {{"scale", 0.5f}}};
  ladle::RunOptions options;
  REQUIRE_THROWS_WITH(ladle::gpu::run_chunk_states(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs, options, 48, 0),
                      Catch::Contains("chunk states: chunk = 48, expected 16, 32 or 64"));
  REQUIRE_THROWS_WITH(ladle::gpu::run_chunk_states(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs, options, 64, 0),
                      Catch::Contains("chunk states") && Catch::Contains("device tensors"));
  options.return_state = true;
  REQUIRE_THROWS_WITH(ladle::gpu::run_chunk_states(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs, options, 64, 0),
                      Catch::Contains("chunk states: options.return_state: the state passes write no final state"));
}

// GLA on the GPU backend against the CPU path on the same random inputs; without a driver,
// the GPU backend must say so with NoCudaDriver.
static void check_gla_gpu_against_cpu(std::uint64_t seed, std::vector<std::int64_t> shape, bool return_state) {
  std::mt19937_64 rng(seed);
  auto q = test::normal(rng, DType::bf16, shape);
  auto k = test::normal(rng, DType::bf16, shape);
  auto v = test::normal(rng, DType::bf16, shape);
  auto g = test::log_gate(rng, DType::bf16, shape);
  ladle::GlaOptions options;
  options.backend = ladle::Backend::gpu;
  options.algorithm = ladle::Algorithm::recurrent;  // the fused family (chunked: recurrent-test.cpp)
  options.return_state = return_state;
  if (!ladle::driver_available()) {
    WARN("no GPU: " << ladle::driver_unavailable_reason());
    REQUIRE_THROWS_AS(ladle::gla(q.tensor.view(), k.tensor.view(), v.tensor.view(), g.tensor.view(), options),
                      ladle::NoCudaDriver);
    return;
  }
  auto gpu = ladle::gla(q.tensor.view(), k.tensor.view(), v.tensor.view(), g.tensor.view(), options);
  options.backend = ladle::Backend::cpu;
  auto cpu = ladle::gla(q.tensor.view(), k.tensor.view(), v.tensor.view(), g.tensor.view(), options);
  CHECK(test::relative_error(gpu.o, test::values_of(cpu.o)) < 1e-2);
  if (return_state) CHECK(test::relative_error(*gpu.final_state, test::values_of(*cpu.final_state)) < 1e-5);
}

TEST_CASE("without a driver the GPU backend says so; with one it agrees with the CPU path", "[gpu]") {
  check_gla_gpu_against_cpu(11, {2, 33, 4, 64}, false);
}

TEST_CASE("at K = V = 128 the shape-chosen GPU tile agrees with the CPU path", "[gpu]") {
  check_gla_gpu_against_cpu(5, {1, 70, 2, 128}, true);
}

TEST_CASE("NVRTC compiles the chunked kernel of every gate combination, 16-bit dtype and mode", "[gpu][nvrtc][chunked]") {
  int compiled = 0;  // by default each gate combination once, dtype and mode turning with it
  for (DType type : {DType::f16, DType::bf16})
    for (unsigned gates = 0; gates < 16; ++gates) {
      const auto& variant = ladle::recurrent_variant(gates & 1, gates & 2, gates & 4, gates & 8);
      for (int mode = 0; mode < 2; ++mode) {
        if (!test::full_sweep() && ((type == DType::bf16) != static_cast<bool>(gates & 1) || mode != static_cast<int>((gates >> 1) & 1)))
          continue;
        auto spec = chunked_spec_for(variant, type, 64, 64);
        spec.reverse = spec.varlen = spec.initial_state = spec.final_state = mode == 1;
        INFO(ladle::ir::to_string(variant) << " " << ladle::dtype_name(type) << " mode " << mode);
        auto result = ladle::gpu::compile_chunked(variant, spec, "compute_80");
        REQUIRE(result.program.ptx.find(".entry " + result.kernel.name) != std::string::npos);
        REQUIRE(result.program.ptx.find("mma.sync.aligned.m16n8k16") != std::string::npos);
        ++compiled;
      }
    }
  CHECK(compiled == (test::full_sweep() ? 2 * 16 * 2 : 16));
}

// A user's key-side and value-side gates written in the DSL, for the chunked family's NVRTC sweeps.
const ladle::ir::Variant& user_gk_gv() {
  static const ladle::ir::Variant variant = ladle::dsl::lower(
      ladle::dsl::read(ladle::dsl::scan(ladle::dsl::k, ladle::dsl::v)
                           .decay_k(ladle::dsl::logsigmoid(ladle::dsl::token_key("x")) / ladle::dsl::head_param("tau"))
                           .decay_v(-ladle::dsl::softplus(ladle::dsl::token_value("y")) / 16.0f),
                       ladle::dsl::q, ladle::dsl::scalar("scale")),
      "user_gk_gv");
  return variant;
}

TEST_CASE("the chunked family's sm_90a cubins over a sweep of tiles, and K = V = 64, 128, 256, fit without spills", "[gpu][nvrtc][chunked][sweep]") {
  const auto& gla = ladle::gla_variant(false);
  const auto& simple = ladle::recurrent_variant(false, false, false, true);
  const ladle::ir::Variant& user = user_gk_gv();
  struct Item {
    const ladle::ir::Variant* variant;
    int D;
    ladle::cuda::ChunkedTile tile;
  };
  // By default each head dim with one variant (each variant with one head dim), the tile sweep's
  // fields each value at least once; the products under the full sweep.
  const bool full = test::full_sweep();
  std::vector<Item> items;
  const ladle::ir::Variant* const variants[] = {&gla, &simple, &user};
  const int dims[] = {64, 128, 256};
  for (int d = 0; d < 3; ++d)
    for (int i = 0; i < 3; ++i)
      if (full || d == i) items.push_back({variants[i], dims[d], ladle::cuda::default_chunked_tile(dims[d], dims[d])});
  // The heuristic's tile where the (sequence, head) pairs fill the GPU (B8 T4096 H16 K=V=128).
  for (const ladle::ir::Variant* v : {&gla, &simple, &user}) items.push_back({v, 128, ladle::cuda::ChunkedTile{128, 32, 128, 8}});
  // A per-head decay takes 64-token chunks on sm_90a (its wgmma twin below).
  items.push_back({&simple, 128, ladle::cuda::ChunkedTile{128, 64, 128, 8}});
  for (int chunk : {32, 64})
    for (int block_v : {32, 64, 128})
      for (int warps : {4, 8}) {
        if (!full && block_v != (32 << ((chunk / 64 * 2 + warps / 8) % 3))) continue;
        const ladle::cuda::ChunkedTile tile{128, chunk, block_v, warps};
        if (ladle::cuda::validate_chunked_tile(tile, gla, 128, 128, 227 * 1024).empty()) items.push_back({&gla, 128, tile});
      }
  WARN(items.size() << " tiles before the wgmma twins");
  CHECK(items.size() >= (full ? 15u : 8u));
  // Each tile again with its state update on wgmma, where its warps allow (sm_90a).
  for (std::size_t i = 0, n = items.size(); i < n; ++i) {
    Item twin = items[i];
    twin.tile.wgmma = true;
    if (ladle::cuda::validate_chunked_tile(twin.tile, *twin.variant, twin.D, twin.D, 227 * 1024, "sm_90a").empty()) items.push_back(twin);
  }
  WARN(std::count_if(items.begin(), items.end(), [](const Item& i) { return i.tile.wgmma; }) << " wgmma twins");
  CHECK(std::count_if(items.begin(), items.end(), [](const Item& i) { return i.tile.wgmma; }) >= (full ? 10 : 4));
  for (const Item& item : items) {
    auto spec = chunked_spec_for(*item.variant, DType::bf16, item.D, item.D);
    spec.tile = item.tile;
    spec.initial_state = spec.final_state = true;
    auto result = ladle::gpu::compile_chunked(*item.variant, spec, "sm_90a");
    const auto* r = result.program.resources(result.kernel.name);
    REQUIRE(r != nullptr);
    INFO(item.variant->name << " D=" << item.D << " " << ladle::cuda::to_string(item.tile) << ": " << r->registers
                            << " registers, " << r->spill_store_bytes << " bytes spilled, " << result.kernel.shared_bytes
                            << " bytes of shared memory");
    CHECK(r->registers > 0);
    CHECK(r->spill_store_bytes == 0);
    CHECK(result.kernel.shared_bytes <= 227 * 1024);
  }
}

TEST_CASE("the chunked family's split and segmented forms and its sm_80 tile compile without spills", "[gpu][nvrtc][chunked][sweep-forms]") {
  const auto& gla = ladle::gla_variant(false);
  const auto& simple = ladle::recurrent_variant(false, false, false, true);
  const ladle::ir::Variant& user = user_gk_gv();
  // The split form: both kernels (state pass, output pass) of every variant and head dim (by
  // default each variant at one head dim, each head dim with one variant).
  const bool full = test::full_sweep();
  const ladle::ir::Variant* const variants[] = {&gla, &simple, &user};
  for (int D : {64, 128, 256})
    for (const ladle::ir::Variant* v : variants) {
      if (!full && v != variants[D / 64 - (D == 256 ? 2 : 1)]) continue;
      auto spec = chunked_spec_for(*v, DType::bf16, D, D);
      spec.tile = ladle::gpu::split_chunked_tile(ladle::cuda::default_chunked_tile(D, D), D);
      spec.initial_state = spec.final_state = true;
      for (const auto phase : {ladle::cuda::ChunkedPhase::states, ladle::cuda::ChunkedPhase::outputs}) {
        spec.phase = phase;
        auto result = ladle::gpu::compile_chunked(*v, spec, "sm_90a");
        const auto* r = result.program.resources(result.kernel.name);
        REQUIRE(r != nullptr);
        INFO(v->name << " D=" << D << " " << ladle::cuda::to_string(spec.tile) << " " << ladle::cuda::to_string(phase) << ": "
                     << r->registers << " registers, " << r->spill_store_bytes << " bytes spilled");
        CHECK(r->spill_store_bytes == 0);
        CHECK(result.kernel.shared_bytes <= 227 * 1024);
      }
    }
  // The segmented form's two kernels with h0 and the final state (the fold of the earlier segments
  // at the serial kernel's start), at the heuristic's tile for B8 T4096 H16 and its wgmma twin.
  for (const ladle::ir::Variant* v : variants)
    for (const bool wgmma : {false, true}) {
      if (!full && wgmma != (v == &simple)) continue;  // by default: mma.sync for GLA and the user's, wgmma for simple GLA
      auto spec = chunked_spec_for(*v, DType::bf16, 128, 128);
      spec.tile = ladle::cuda::ChunkedTile{128, 32, 128, 8};
      spec.tile.wgmma = wgmma;
      spec.initial_state = spec.final_state = true;
      const auto specs = ladle::gpu::segmented_chunked_specs(*v, spec, 128, 128, 227 * 1024);
      for (const auto* s : {&specs.first, &specs.serial}) {
        auto result = ladle::gpu::compile_chunked(*v, *s, "sm_90a");
        const auto* r = result.program.resources(result.kernel.name);
        REQUIRE(r != nullptr);
        INFO(v->name << " segmented " << ladle::cuda::to_string(s->tile) << ": " << r->registers << " registers, "
                     << r->spill_store_bytes << " bytes spilled");
        CHECK(r->spill_store_bytes == 0);
      }
    }
  // The sm_80 path: the same instructions, an sm_80 cubin within its 163 KiB of shared memory.
  auto spec = chunked_spec_for(gla, DType::bf16, 128, 128);
  REQUIRE(ladle::cuda::validate_chunked_tile(spec.tile, gla, 128, 128, 163 * 1024).empty());
  auto result = ladle::gpu::compile_chunked(gla, spec, "sm_80");
  REQUIRE(result.program.resources(result.kernel.name) != nullptr);
  CHECK(result.program.resources(result.kernel.name)->spill_store_bytes == 0);
}

// How many kernels check_ws_serial_modes compiles: 2 head dims x 3 modes, or each mode once.
static int ws_modes() { return test::full_sweep() ? 6 : 3; }

// The ws serial kernel of a variant (a gate reading per-token inputs of `gate_kind`: those copied by
// TMA in bf16), at D = 64 and 128 in every mode (plain; h0, final state, reverse and varlen;
// segmented, then `segmented` is called with its spec): compiled for sm_90a without spills, in 227
// KiB, on wgmma and TMA. Returns how many compiled.
static int check_ws_serial_modes(const ladle::ir::Variant& v, std::optional<ladle::ir::InputKind> gate_kind,
                                 const std::function<void(const ladle::cuda::ChunkedKernelSpec&, int)>& segmented = {}) {
  int compiled = 0;
  for (int D : {64, 128})
    for (int mode = 0; mode < 3; ++mode) {
      // By default each mode at one head dim (D = 64 plain, 128 with h0 and reversed, the segmented
      // one at the dim that turns with the variant's name), both dims in the full sweep.
      if (!test::full_sweep() && D != (mode == 0 ? 64 : mode == 1 ? 128 : (v.name.size() % 2 ? 64 : 128))) continue;
      auto serial = chunked_spec_for(v, DType::bf16, D, D);
      for (std::size_t k = 0; k < v.inputs.size(); ++k)
        if (gate_kind && v.inputs[k].kind == *gate_kind) serial.input_types[k] = DType::bf16;
      serial.tile = ladle::cuda::ChunkedTile{D, 64, D, 4 + D / 16};
      serial.tile.ws = true;
      serial.initial_state = serial.final_state = mode != 0;
      serial.reverse = serial.varlen = mode == 1;
      serial.segmented = mode == 2;
      auto result = ladle::gpu::compile_chunked(v, serial, "sm_90a");
      const auto* r = result.program.resources(result.kernel.name);
      REQUIRE(r != nullptr);
      INFO(v.name << " ws serial D=" << D << " mode " << mode << ": " << r->registers << " registers, " << r->spill_store_bytes
                  << " bytes spilled, " << result.kernel.shared_bytes << " bytes of shared memory");
      CHECK(r->spill_store_bytes == 0);
      CHECK(result.kernel.shared_bytes <= 227 * 1024);
      CHECK(result.program.ptx.find("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") != std::string::npos);
      CHECK(result.program.ptx.find("cp.async.bulk.tensor.4d") != std::string::npos);
      ++compiled;
      if (mode == 2 && segmented) segmented(serial, D);
    }
  return compiled;
}

TEST_CASE("the chunked ws form's sm_90a cubins (TMA, wgmma) fit without spills in every mode", "[gpu][nvrtc][chunked][ws]") {
  namespace dsl = ladle::dsl;
  const auto& simple = ladle::recurrent_variant(false, false, false, true);
  const auto& plain = ladle::recurrent_variant(false, false, false, false);
  const auto user = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(-dsl::softplus(dsl::token_head("dt")) * dsl::head_param("A")),
                                         dsl::q, dsl::scalar("scale")),
                               "mamba2_like");
  for (const ladle::ir::Variant* v : {&simple, &plain, &user})
    CHECK(check_ws_serial_modes(*v, std::nullopt, [&](const ladle::cuda::ChunkedKernelSpec& spec, int D) {
            // The segmented form's state pass in the ws form: two blocks of 256 threads per SM.
            const auto specs = ladle::gpu::segmented_chunked_specs(*v, spec, D, D, 227 * 1024);
            REQUIRE(specs.first.tile.ws);
            auto first = ladle::gpu::compile_chunked(*v, specs.first, "sm_90a");
            const auto* f = first.program.resources(first.kernel.name);
            REQUIRE(f != nullptr);
            INFO("state pass: " << f->registers << " registers, " << first.kernel.shared_bytes << " bytes of shared memory");
            CHECK(first.kernel.name.find("ladle_chunked_ws_states_segmented_") == 0);
            CHECK(f->spill_store_bytes == 0);
            CHECK(f->registers <= 128);
            CHECK(2 * first.kernel.shared_bytes <= 227 * 1024);
          }) == ws_modes());
  // A key-side gate alone (GLA, a user's logsigmoid(x) / tau) with 16-bit gate inputs: the segmented
  // form's state pass in the ws form (LADLE_WS_KEY_STATES=1; the library keeps the suffix pass).
  const auto user_gk = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(dsl::token_key("x")) / dsl::head_param("tau")),
                                            dsl::q, dsl::scalar("scale")),
                                  "user_gk");
  for (const ladle::ir::Variant* v : {&ladle::gla_variant(false), &user_gk}) {
    auto spec = chunked_spec_for(*v, DType::bf16, 128, 128);
    for (std::size_t k = 0; k < v->inputs.size(); ++k)
      if (v->inputs[k].kind == ladle::ir::InputKind::token_key) spec.input_types[k] = DType::bf16;
    spec.tile = ladle::cuda::ChunkedTile{128, 32, 128, 8};
    spec.tile.wgmma = true;
    spec.arch = "sm_90a";
    spec.initial_state = spec.final_state = true;
    // The library keeps the suffix pass for a key gate (measured faster); the ws one is built on request.
    CHECK(!ladle::gpu::segmented_chunked_specs(*v, spec, 128, 128, 227 * 1024).first.tile.ws);
    auto ws_first = spec;
    ws_first.segmented = true, ws_first.phase = ladle::cuda::ChunkedPhase::states;
    ws_first.initial_state = ws_first.final_state = false;
    ws_first.tile = ladle::cuda::ChunkedTile{128, 64, 64, 8};
    ws_first.tile.ws = true;
    REQUIRE(ladle::cuda::chunked_ws_unsupported(*v, ws_first).empty());
    auto first = ladle::gpu::compile_chunked(*v, ws_first, "sm_90a");
    const auto* f = first.program.resources(first.kernel.name);
    REQUIRE(f != nullptr);
    INFO(v->name << " ws state pass: " << f->registers << " registers, " << first.kernel.shared_bytes << " bytes of shared memory");
    CHECK(f->spill_store_bytes == 0);
    CHECK(f->registers <= 128);
    CHECK(2 * first.kernel.shared_bytes <= 227 * 1024);
    // f32 gate inputs are not copied by TMA.
    auto f32_gates = ws_first;
    for (std::size_t k = 0; k < v->inputs.size(); ++k)
      if (v->inputs[k].kind == ladle::ir::InputKind::token_key && v->inputs[k].role == ladle::ir::Role::other)
        f32_gates.input_types[k] = DType::f32;
    CHECK_THAT(ladle::cuda::chunked_ws_unsupported(*v, f32_gates), Catch::Contains("16 bits"));
    // The serial kernel in the ws form (q~ and k~ against a reference per key feature) in every mode.
    CHECK(check_ws_serial_modes(*v, ladle::ir::InputKind::token_key) == ws_modes());
  }
}

TEST_CASE("the chunked ws form of a value-side gate: sm_90a cubins fit without spills in every mode", "[gpu][nvrtc][chunked][ws]") {
  namespace dsl = ladle::dsl;
  const auto user_gv = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_v(dsl::logsigmoid(dsl::token_value("y")) / dsl::head_param("tau")),
                                            dsl::q, dsl::scalar("scale")),
                                  "user_gv");
  for (const ladle::ir::Variant* v : {&ladle::recurrent_variant(false, false, true, false), &user_gv}) {
    CHECK(check_ws_serial_modes(*v, ladle::ir::InputKind::token_value) == ws_modes());
    // Segmented, the state pass is not the ws form's (it takes no value-side gate).
    auto spec = chunked_spec_for(*v, DType::bf16, 128, 128);
    spec.tile = ladle::cuda::ChunkedTile{128, 64, 128, 12};
    spec.tile.ws = true;
    spec.segmented = true;
    CHECK(!ladle::gpu::segmented_chunked_specs(*v, spec, 128, 128, 227 * 1024).first.tile.ws);
  }
}

TEST_CASE("the algorithm follows the shape and dtype unless forced", "[gpu][chunked]") {
  std::mt19937_64 rng(9);
  const auto& gla = ladle::gla_variant(false);
  const auto choose = [&](DType type, std::int64_t T, ladle::Algorithm forced, const ladle::ir::Variant& variant) {
    auto q = test::normal(rng, type, {2, T, 2, 16});
    auto g = test::log_gate(rng, type, {2, T, 2, 16});
    ladle::VariantInputs inputs;
    inputs.scalars["scale"] = 0.25f;
    if (!variant.inputs.empty() && variant.inputs.size() > 4) inputs.tensors["g"] = g.tensor.view();
    ladle::RunOptions options;
    options.algorithm = forced;
    const auto bound = ladle::ops::bind_inputs("test", variant, q.tensor.view(), q.tensor.view(), q.tensor.view(), inputs, options);
    return ladle::gpu::choose_algorithm(variant, bound, options);
  };
  using A = ladle::Algorithm;
  CHECK(choose(DType::bf16, 64, A::automatic, gla) == A::chunked);
  CHECK(choose(DType::f16, 200, A::automatic, gla) == A::chunked);
  CHECK(choose(DType::bf16, 16, A::automatic, gla) == A::recurrent);  // decode-sized
  CHECK(choose(DType::f32, 200, A::automatic, gla) == A::recurrent);  // fp32 keeps fp32 products
  CHECK(choose(DType::bf16, 16, A::chunked, gla) == A::chunked);
  CHECK(choose(DType::bf16, 200, A::recurrent, gla) == A::recurrent);
  const auto normalised = ladle::dsl::lower(
      ladle::dsl::read(ladle::dsl::scan(ladle::dsl::k, ladle::dsl::v), ladle::dsl::q, ladle::dsl::scalar("scale")).normalized(1e-6f), "n");
  CHECK(choose(DType::bf16, 200, A::automatic, normalised) == A::recurrent);
  REQUIRE_THROWS_WITH(choose(DType::bf16, 200, A::chunked, normalised), Catch::Contains("algorithm chunked") && Catch::Contains("normaliser"));
}
