// The chunked delta-rule generator (codegen/cuda/chunked_delta.h): its kernels run on the host
// emulation of CUDA (ldmatrix and mma.sync fragments as the PTX ISA lays them out) against the CPU
// path, which tests/ops/update_forms holds against the fp64 oracle; NVRTC compiles them for sm_80 and
// sm_90a without spills; bad specs and variants are refused by name.
#include <catch2/catch.hpp>

#include <ladle/codegen/cpu/recurrent.h>
#include <ladle/codegen/cuda/chunked_delta.h>
#include <ladle/codegen/device/headers.h>
#include <ladle/ops/bind.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/update_forms.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>

#include <cstring>
#include <string>

#include "case_binding.h"
#include "chunked_delta_cases.h"
#include "cuda_emulation.h"
#include "support/full_sweep.h"
#include "chunked_delta_kernels.inc"

using namespace ladle;
using namespace case_binding;
using cuda::ChunkedDeltaPhase;

TEST_CASE("chunked delta: every case on the host emulation computes what the CPU path computes", "[codegen][chunked_delta][emulation]") {
  const auto cases = chunked_delta_cases::all();
  REQUIRE(std::size(emulated_delta) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i].c;
    const cuda::ChunkedDeltaKernel first = cuda::generate_chunked_delta(c.variant, cases[i].spec(ChunkedDeltaPhase::prepare));
    const cuda::ChunkedDeltaKernel second = cuda::generate_chunked_delta(c.variant, cases[i].spec(ChunkedDeltaPhase::states));
    const cuda::ChunkedDeltaKernel third = cuda::generate_chunked_delta(c.variant, cases[i].spec(ChunkedDeltaPhase::outputs));
    const cuda::ChunkedDeltaSpec prepare = cases[i].spec(ChunkedDeltaPhase::prepare);
    INFO(c.name << " (" << first.name << ", " << second.name << ", " << third.name << ")");
    REQUIRE(first.name == emulated_delta[i].prepare.name);
    REQUIRE(second.name == emulated_delta[i].states.name);
    REQUIRE(third.name == emulated_delta[i].outputs.name);
    for (const auto* kernel : {&first, &second, &third}) REQUIRE(kernel->shared_bytes <= int(cuda_emulation::dynamic_shared_bytes));
    const Errors errors = emulated_against_cpu(c, 4000 + i, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
      const std::int64_t C = cuda::chunked_delta_chunk;
      std::vector<std::int64_t> offsets{0};
      if (c.cu_seqlens.empty()) {
        offsets.push_back(bound.sequences * ((c.T + C - 1) / C));
      } else {
        for (std::size_t n = 0; n + 1 < c.cu_seqlens.size(); ++n)
          offsets.push_back(offsets.back() + (c.cu_seqlens[n + 1] - c.cu_seqlens[n] + C - 1) / C);
      }
      const std::int64_t chunks = offsets.back();
      // Poisoned work arrays (bf16 NaN): a row a kernel should write and does not stands out.
      const auto bf16s = [](std::int64_t n) { return std::vector<unsigned short>(static_cast<std::size_t>(n), 0x7fc0); };
      std::vector<unsigned short> w = bf16s(cuda::chunked_delta_w_elements(prepare, chunks, c.H)), kn = w;
      std::vector<unsigned short> u = bf16s(cuda::chunked_delta_u_elements(prepare, chunks, c.H)), e = u;
      std::vector<unsigned short> h = bf16s(cuda::chunked_delta_h_elements(prepare, chunks, c.H));
      std::vector<float> gamma(static_cast<std::size_t>(cuda::chunked_delta_gamma_elements(prepare, chunks, c.H)), std::numeric_limits<float>::quiet_NaN());
      SplitArguments work;
      work.chunk_offsets = offsets.data();
      work.sequences = bound.sequences;
      work.delta_w = w.data(), work.delta_u = u.data(), work.delta_k = kn.data(), work.delta_e = e.data(), work.delta_h = h.data();
      work.delta_gamma = gamma.data();
      const unsigned value_blocks = static_cast<unsigned>((c.V + 63) / 64);
      Arguments first_args(first.params, c, gpu_run.args, work);
      if (chunks > 0)
        cuda_emulation::launch(static_cast<unsigned>(chunks), static_cast<unsigned>(c.H), 1, first.threads,
                               [&] { emulated_delta[i].prepare.launch(first_args.data()); });
      Arguments second_args(second.params, c, gpu_run.args, work);
      cuda_emulation::launch(value_blocks, static_cast<unsigned>(bound.sequences * c.H), 1, second.threads,
                             [&] { emulated_delta[i].states.launch(second_args.data()); });
      Arguments third_args(third.params, c, gpu_run.args, work);
      if (chunks > 0)
        cuda_emulation::launch(static_cast<unsigned>(chunks), static_cast<unsigned>(c.H), static_cast<unsigned>((c.V + third.block_v - 1) / third.block_v), third.threads,
                               [&] { emulated_delta[i].outputs.launch(third_args.data()); });
    });
    // bf16 operands on the tensor cores (q, k, W, U, the state's copy), fp32 accumulation and state.
    CHECK(errors.o < 2e-2);
    if (c.spec.final_state) CHECK(errors.final_state < 2e-2);
  }
}

TEST_CASE("chunked delta: the source says what it computes; specs and variants are checked", "[codegen][chunked_delta]") {
  const ir::Variant& gated = delta_rule_variant(true, true);
  cuda::KernelTypes types;
  types.input_types.assign(gated.inputs.size(), DType::bf16);
  types.output_type = DType::bf16;
  const cuda::ChunkedDeltaSpec states = cuda::chunked_delta_spec(types, 128, 100, ChunkedDeltaPhase::states);
  CHECK(states.block_k == 128);
  CHECK(states.value_pad == 128);
  CHECK(cuda::chunked_delta_spec(types, 40, 300, ChunkedDeltaPhase::prepare).block_k == 64);
  const cuda::ChunkedDeltaKernel kernel = cuda::generate_chunked_delta(gated, states);
  CHECK_THAT(kernel.source, Catch::StartsWith("// ladle: chunked delta rule, states kernel " + kernel.name));
  CHECK_THAT(kernel.source, Catch::Contains("E = U - W S_0"));
  CHECK_THAT(cuda::generate_chunked_delta(gated, cuda::chunked_delta_spec(types, 128, 100, ChunkedDeltaPhase::outputs)).source,
             Catch::Contains("o = scale (exp(gamma) q h + tril(q k^T exp(gamma_t - gamma_s)) E)"));
  CHECK_THAT(kernel.source, Catch::Contains("the gated delta rule"));
  CHECK_THAT(kernel.source, Catch::Contains("ladle_mma_bf16("));
  CHECK(kernel.threads == 256);
  CHECK(cuda::generate_chunked_delta(gated, cuda::chunked_delta_spec(types, 128, 100, ChunkedDeltaPhase::prepare)).name != kernel.name);

  CHECK_THAT(cuda::chunked_delta_unsupported(gated, 256, 128), Catch::Contains("K = 256, expected at most 128"));
  CHECK_THAT(cuda::chunked_delta_unsupported(gated, 128, 512), Catch::Contains("V = 512"));
  CHECK_THAT(cuda::chunked_delta_unsupported(rwkv6_variant(), 64, 64), Catch::Contains("the delta rule only"));
  CHECK(cuda::chunked_delta_unsupported(gated, 128, 128).empty());
  {  // KDA's key-side decay: per-feature gates, the scores against per-feature references
    const ir::Variant& kda = kda_variant(true, true, true, true);
    CHECK(cuda::chunked_delta_unsupported(kda, 128, 128).empty());
    cuda::KernelTypes kda_types = types;
    kda_types.input_types.assign(kda.inputs.size(), DType::bf16);
    const cuda::ChunkedDeltaKernel outputs = cuda::generate_chunked_delta(kda, cuda::chunked_delta_spec(kda_types, 128, 128, ChunkedDeltaPhase::outputs));
    CHECK_THAT(outputs.source, Catch::Contains("KDA: gamma is per feature"));
    CHECK_THAT(outputs.source, Catch::Contains("the diagonal block element by element"));
    CHECK(outputs.shared_bytes == cuda::generate_chunked_delta(gated, cuda::chunked_delta_spec(types, 128, 128, ChunkedDeltaPhase::outputs)).shared_bytes);
  }
  cuda::ChunkedDeltaSpec bad = states;
  bad.block_k = 96;
  CHECK_THROWS_WITH(cuda::generate_chunked_delta(gated, bad), Catch::Contains("block_k = 96, expected 64 or 128"));
  bad = states;
  bad.value_pad = 100;
  CHECK_THROWS_WITH(cuda::generate_chunked_delta(gated, bad), Catch::Contains("value_pad = 100"));
  bad = states;
  bad.input_types.pop_back();
  CHECK_THROWS_WITH(cuda::generate_chunked_delta(gated, bad), Catch::Contains("input_types"));
  cuda::KernelTypes rwkv_types;
  rwkv_types.input_types.assign(rwkv6_variant().inputs.size(), DType::bf16);
  CHECK_THROWS_WITH(cuda::generate_chunked_delta(rwkv6_variant(), cuda::chunked_delta_spec(rwkv_types, 64, 64, ChunkedDeltaPhase::states)),
                    Catch::Contains("the delta rule only"));
}

TEST_CASE("chunked delta: NVRTC compiles the three kernels for sm_80 and sm_90a without spills", "[codegen][chunked_delta][nvrtc]") {
  // By default each case for one target (the two turn with the cases: each kernel of every form
  // reaches both), both targets under the full sweep.
  const auto cases = chunked_delta_cases::all();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& dc = cases[i];
    for (ChunkedDeltaPhase phase : {ChunkedDeltaPhase::prepare, ChunkedDeltaPhase::states, ChunkedDeltaPhase::outputs}) {
      const cuda::ChunkedDeltaKernel kernel = cuda::generate_chunked_delta(dc.c.variant, dc.spec(phase));
      for (const char* arch : {"sm_80", "sm_90a"}) {
        if (!test::full_sweep() && (std::string(arch) == "sm_90a") != (i % 2 == 1)) continue;
        INFO(dc.c.name << " " << kernel.name << " " << arch);
        CompileOptions options;
        options.arch = arch;
        options.headers = ladle::device::headers_for(kernel.source);
        const CompiledProgram program = compile(kernel.source, options);
        const KernelResources* usage = program.resources(kernel.name);
        REQUIRE(usage != nullptr);
        INFO(usage->registers << " registers, " << usage->spill_store_bytes << " bytes spilled");
        CHECK(usage->spill_store_bytes == 0);
        CHECK(usage->spill_load_bytes == 0);
        // Blocks an SM: prepare 3 (128 threads), states 2 (256), outputs 2 (256) or 3 (128, V <= 64): the
        // launch bounds and the shared memory keep what the kernel promises.
        const int blocks = kernel.blocks_per_sm;
        CHECK(blocks == (phase == ChunkedDeltaPhase::prepare || kernel.threads == 128 ? 3 : 2));
        CHECK(usage->registers * int(kernel.threads) * blocks <= 65536);
        CHECK(kernel.shared_bytes * blocks <= 227 * 1024);
      }
    }
  }
}
