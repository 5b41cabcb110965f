// The GPU path's pieces that need no GPU: NVRTC compiles the fused-recurrent CUDA of every
// variant the op matrix runs (PTX for sm_80 and sm_90a, cubins with resource usage for
// sm_90a), and without a driver the GPU entry point fails with NoCudaDriver. On a machine
// with a GPU, recurrent-test.cpp runs the whole matrix on it against the fp64 reference.
#include <catch2/catch.hpp>

#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "support/tensors.h"

using ladle::ElementType;

namespace {

ladle::cuda::RecurrentKernelSpec spec_for(const ladle::ir::Variant& variant, ElementType type,
                                          int K, int V) {
  ladle::cuda::RecurrentKernelSpec spec;
  spec.tile = ladle::cuda::default_tile(K, V);
  for (const auto& input : variant.inputs)
    spec.input_types.push_back(input.kind == ladle::ir::InputKind::scalar ? ElementType::f32 : type);
  spec.output_type = type;
  return spec;
}

}  // namespace

TEST_CASE("NVRTC compiles the fused-recurrent kernel of every gate combination, dtype and mode", "[gpu][nvrtc]") {
  int compiled = 0;
  for (ElementType type : {ElementType::f32, ElementType::f16, ElementType::bf16}) {
    for (unsigned gates = 0; gates < 16; ++gates) {
      const auto& variant = ladle::recurrent_variant(gates & 1, gates & 2, gates & 4, gates & 8);
      for (int mode = 0; mode < 4; ++mode) {
        auto spec = spec_for(variant, type, 64, 48);
        spec.reverse = mode & 1;
        spec.varlen = spec.initial_state = mode & 2;
        spec.final_state = mode != 0;
        INFO(ladle::ir::to_string(variant) << " " << ladle::element_type_name(type) << " mode " << mode);
        auto result = ladle::gpu::compile_recurrent(variant, spec, "compute_80");
        REQUIRE(result.program.ptx.find(".entry " + result.kernel.name) != std::string::npos);
        ++compiled;
      }
    }
  }
  CHECK(compiled == 3 * 16 * 4);
}

TEST_CASE("the sm_90a cubins of the named ops fit without spills at K = V = 64, 128 and 256", "[gpu][nvrtc]") {
  for (int D : {64, 128, 256}) {
    for (ElementType type : {ElementType::f32, ElementType::bf16}) {
      const auto& variant = ladle::gla_variant(false);
      auto spec = spec_for(variant, type, D, D);
      auto result = ladle::gpu::compile_recurrent(variant, spec, "sm_90a");
      const auto* r = result.program.resources(result.kernel.name);
      REQUIRE(r != nullptr);
      INFO("D=" << D << " " << ladle::element_type_name(type) << ": " << r->registers << " registers, "
                << r->spill_store_bytes << " bytes spilled");
      CHECK(r->registers > 0);
      CHECK(r->spill_store_bytes == 0);
      CHECK(r->registers <= 255);
    }
  }
}

TEST_CASE("a bad tile is refused with the tile and the sizes named", "[gpu]") {
  std::mt19937_64 rng(3);
  auto q = test::normal(rng, ElementType::f32, {1, 8, 2, 32});
  auto k = test::normal(rng, ElementType::f32, {1, 8, 2, 32});
  auto v = test::normal(rng, ElementType::f32, {1, 8, 2, 32});
  ladle::RunOptions options;
  options.backend = ladle::Backend::gpu;
  options.tile = ladle::cuda::RecurrentTile{16, 32, 3};
  REQUIRE_THROWS_WITH(ladle::run_variant(ladle::recurrent_variant(false, false, false, false), q.tensor.view(),
                                         k.tensor.view(), v.tensor.view(), {{}, {{"scale", 0.5f}}}, options),
                      Catch::Contains("tile") && Catch::Contains("K=32"));
}

// GLA on the GPU backend against the CPU path on the same random inputs; without a driver,
// the GPU backend must say so with NoCudaDriver.
static void check_gla_gpu_against_cpu(std::uint64_t seed, std::vector<std::int64_t> shape, bool return_state) {
  std::mt19937_64 rng(seed);
  auto q = test::normal(rng, ElementType::bf16, shape);
  auto k = test::normal(rng, ElementType::bf16, shape);
  auto v = test::normal(rng, ElementType::bf16, shape);
  auto g = test::log_gate(rng, ElementType::bf16, shape);
  ladle::GlaOptions options;
  options.backend = ladle::Backend::gpu;
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
