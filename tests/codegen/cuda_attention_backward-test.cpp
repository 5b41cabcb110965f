// The softmax-attention backward's CUDA generator (codegen/cuda/attention_backward.h). Without a GPU
// its two kernels run on the host emulation of CUDA (TMA copies, mbarriers, named barriers, wgmma
// from swizzled shared memory and from registers) against the CPU backward (itself checked against
// finite differences of the fp64 reference in ops-backward), on fresh random inputs with the
// gradients poisoned first; arguments are bound by the op's own checks and packed by the GPU
// launcher's own packing. NVRTC compiles them for sm_90a without spills.
#include <catch2/catch.hpp>

#include <ladle/codegen/cpu/attention.h>
#include <ladle/codegen/cuda/attention_backward.h>
#include <ladle/ops/gpu_attention_backward.h>
#include <ladle/runtime/error.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <tuple>

#include "cuda_emulation.h"

#include "attention_binding.h"
#include "attention_backward_kernels.inc"

using namespace ladle;
using attention_binding::Bound;
using attention_cases::Case;

namespace {

// A gradient's view shaped as `canonical` (the bound input's view): leading axes added and each
// broadcast axis (size 1 in the gradient, more in the canonical view) at stride 0.
TensorView gradient_view(Tensor& grad, const TensorView& canonical) {
  TensorView view = grad.view();
  while (view.rank() < canonical.rank()) {
    view.shape.insert(view.shape.begin(), 1);
    view.strides.insert(view.strides.begin(), 0);
  }
  for (int d = 0; d < canonical.rank(); ++d)
    if (view.shape[static_cast<std::size_t>(d)] != canonical.shape[static_cast<std::size_t>(d)]) {
      view.shape[static_cast<std::size_t>(d)] = canonical.shape[static_cast<std::size_t>(d)];
      view.strides[static_cast<std::size_t>(d)] = 0;
    }
  return view;
}

// The gradients of one run, each filled with `fill` first, and their views.
struct Gradients {
  std::deque<Tensor> store;
  cpu::AttentionGrads views;
  std::vector<std::pair<std::string, Tensor*>> named;  // for the comparison
};

Gradients gradients(const Case& c, const Bound& bound, const TensorView& d_output, float fill) {
  Gradients g;
  const ops::AttentionArgs& a = bound.args;
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape, const TensorView& canonical) {
    Tensor& t = g.store.emplace_back(DType::f32, std::move(shape), fill);
    g.named.emplace_back(name, &t);
    return gradient_view(t, canonical);
  };
  g.views.d_output = d_output;
  g.views.dq = add("dq", {a.B, a.Tq, a.H, a.D}, a.q);
  g.views.dk = add("dk", {a.B, a.Tk, a.H_kv, a.D}, a.k);
  g.views.dv = add("dv", {a.B, a.Tk, a.H_kv, a.Dv}, a.v);
  g.views.d_tensors.resize(c.variant.inputs.size());
  for (std::size_t k = 3; k < c.variant.inputs.size(); ++k) {
    const ir::Input& in = c.variant.inputs[k];
    if (in.kind == ir::InputKind::scalar || a.tensors[k].type == DType::u8) continue;
    const std::vector<std::int64_t> given = in.kind == ir::InputKind::head ? std::vector<std::int64_t>{a.H} : a.tensors[k].shape;
    g.views.d_tensors[k] = add("d " + in.name, given, a.tensors[k]);
  }
  if (a.softmax_aux) g.views.d_softmax_aux = add("d softmax_aux", {a.H, a.sinks}, *a.softmax_aux);
  return g;
}

double relative_error(const Tensor& out, const Tensor& ref) {
  double diff = 0, norm = 0;
  const auto* x = static_cast<const float*>(out.data());
  const auto* y = static_cast<const float*>(ref.data());
  for (std::int64_t e = 0; e < out.numel(); ++e) {
    if (!std::isfinite(x[e])) return std::numeric_limits<double>::infinity();
    diff += (double(x[e]) - y[e]) * (double(x[e]) - y[e]);
    norm += double(y[e]) * y[e];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace

TEST_CASE("attention backward: the emulated kernels match the CPU backward for every mask and modifier", "[codegen][attention][backward]") {
  const auto cases = attention_cases::backward();
  REQUIRE(std::size(emulated_backward) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SECTION(c.name) {
      Bound bound = attention_binding::bind(c, 9000 + i);
      ops::AttentionArgs& args = bound.args;
      args.threads = 2;
      cpu::run_attention(c.variant, args);  // o and lse, as the forward leaves them
      std::mt19937_64 rng(77 + i);
      const Tensor d_output = test::normal(rng, c.d_output_f32 ? DType::f32 : c.type, args.output_shape()).tensor;
      const TensorView d_output_view = d_output.view();

      Gradients ref = gradients(c, bound, d_output_view, 0.0f);
      cpu::run_attention_backward(c.variant, args, ref.views);

      // The launcher's spec for these arguments is the case's (the emitted kernel).
      Gradients out = gradients(c, bound, d_output_view, std::numeric_limits<float>::quiet_NaN());
      cuda::AttentionBackwardSpec spec = gpu::attention_backward_spec(c.variant, args, out.views, c.backward_arch);
      const bool sync = spec.form == cuda::AttentionBackwardForm::sync;
      CHECK(sync == (c.name.rfind("backward sync", 0) == 0));
      if (sync && c.sync_rows) spec.sync_rows = c.sync_rows;  // a smaller target's tile, tried here
      if (!sync) {
        CHECK(spec.dq_tma);      // dq is 16-byte aligned here (with_tile then keeps it where dQ's stage fits)
        spec.stages = c.stages;  // the launcher's is 2; the cases try others
      }
      if (i == 0) {            // 8-byte aligned only (or a stride not a multiple of 4): red.global.add.v2
        cpu::AttentionGrads shifted = out.views;
        shifted.dq.data = static_cast<float*>(shifted.dq.data) + 2 + (reinterpret_cast<std::uintptr_t>(shifted.dq.data) % 16 == 8);
        CHECK_FALSE(gpu::attention_backward_spec(c.variant, args, shifted, "sm_90a").dq_tma);
        shifted = out.views;
        shifted.dq.strides[1] = 2 + shifted.dq.strides[1];
        CHECK_FALSE(gpu::attention_backward_spec(c.variant, args, shifted, "sm_90a").dq_tma);
      }
      spec.dq_tma = attention_cases::backward_spec(c).dq_tma;
      CHECK(spec.sync_rows == attention_cases::backward_spec(c).sync_rows);
      const cuda::AttentionBackwardKernel kernel = cuda::generate_attention_backward(c.variant, spec);
      REQUIRE(kernel.name == emulated_backward[i].name);
      // As the launcher does: the atomically added gradients start from zero; dk and dv stay poisoned
      // (main stores every row).
      for (auto& [name, tensor] : out.named)
        if (name != "dk" && name != "dv") std::fill_n(static_cast<float*>(tensor->data()), tensor->numel(), 0.0f);
      std::vector<float> row_stats(static_cast<std::size_t>(2 * args.B * args.H * args.Tq), std::numeric_limits<float>::quiet_NaN());
      Tensor copy(c.type, {args.B, args.Tq, args.H, args.Dv});
      gpu::AttentionBackwardArguments packed = gpu::pack_attention_backward_arguments(
          kernel, spec, args, out.views, row_stats.data(), copy.data(), args.cu_seqlens_q.data(), args.cu_seqlens_k.data(),
          describe_tensor_map);
      const std::int64_t rows_q = args.longest_q(), rows_k = args.longest_k();
      cuda_emulation::launch(static_cast<unsigned>((rows_q + kernel.prep_rows - 1) / kernel.prep_rows), static_cast<unsigned>(args.N * args.H),
                             kernel.prep_threads, [&] { emulated_backward[i].prep(packed.prep.data()); });
      const cuda::AttentionGrid grid =
          cuda::attention_grid(args.N * args.H_kv, (rows_k + kernel.block_n - 1) / kernel.block_n * kernel.column_parts);
      cuda_emulation::launch(grid.x, grid.y, grid.z, kernel.main_threads, [&] { emulated_backward[i].main(packed.main.data()); });
      REQUIRE(out.named.size() == ref.named.size());
      for (std::size_t g = 0; g < out.named.size(); ++g) {
        const double error = relative_error(*out.named[g].second, *ref.named[g].second);
        INFO(c.name << ": " << out.named[g].first << " relative error " << error);
        // f32 inputs go through the tensor cores as bf16 hi + lo pairs: about 16 bits of mantissa.
        CHECK(error < (c.type == DType::f32 ? 1e-4 : 1e-2));
        if (c.type == DType::f32) std::cout << c.name << ": " << out.named[g].first << " relative error " << error << "\n";
      }
    }
  }
}

TEST_CASE("attention backward: the source opens with the variant, its derivatives and the launch", "[codegen][attention][backward]") {
  const Case c = attention_cases::backward()[4];  // the user ALiBi variant
  const cuda::AttentionBackwardKernel kernel = cuda::generate_attention_backward(c.variant, attention_cases::backward_spec(c));
  INFO(kernel.source);
  CHECK_THAT(kernel.source, Catch::StartsWith("// ladle: attention backward kernels " + kernel.prep_name + ", " + kernel.name + "\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// d logit/dscore = "));
  CHECK_THAT(kernel.source, Catch::Contains("// d logit/dslope = "));
  CHECK_THAT(kernel.source, Catch::Contains("acc_slope"));
  CHECK_THAT(kernel.source, Catch::Contains("dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes"));
  CHECK(kernel.main_threads == 256);
  CHECK(cuda::generate_attention_backward(c.variant, attention_cases::backward_spec(c)).source == kernel.source);
}

TEST_CASE("attention backward: unsupported calls are refused by name", "[codegen][attention][backward]") {
  Case c = attention_cases::backward()[0];
  auto spec = attention_cases::backward_spec(c);
  spec.D = 256;
  spec.D = 264;
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, spec), Catch::Contains("D = 264") && Catch::Contains("8 to 256"));
  spec = attention_cases::backward_spec(c);
  spec.D = 256, spec.dq_tma = true;  // past D = 128 the warpgroups split the columns and add dQ by red.global
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, spec), Catch::Contains("dq_tma"));
  spec = attention_cases::backward_spec(c);
  spec.arch = "sm_80";
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, spec), Catch::Contains("sm_90a") && Catch::Contains("sm_80"));
  spec = attention_cases::backward_spec(c);
  spec.input_types[0] = spec.input_types[1] = spec.input_types[2] = DType::f32;
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, spec), Catch::Contains("one 16-bit type"));
  spec = attention_cases::backward_spec(c);
  spec.stages = 5;
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, spec), Catch::Contains("stages = 5"));
  // The sync form: head dims past 256, targets before sm_80, shared memory past the target's, tiles it has not.
  const auto sync_spec = [&](DType type, int dim, const char* arch) {
    Case s = c;
    s.type = type, s.D = s.Dv = dim, s.backward_arch = arch;
    return attention_cases::backward_spec(s);
  };
  CHECK(sync_spec(DType::f32, 64, "sm_90a").form == cuda::AttentionBackwardForm::sync);
  CHECK(sync_spec(DType::bf16, 256, "sm_90a").form == cuda::AttentionBackwardForm::ws);
  CHECK(sync_spec(DType::bf16, 256, "sm_80").form == cuda::AttentionBackwardForm::sync);
  CHECK(sync_spec(DType::bf16, 128, "sm_80").form == cuda::AttentionBackwardForm::sync);
  CHECK(sync_spec(DType::bf16, 128, "sm_90a").form == cuda::AttentionBackwardForm::ws);
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, sync_spec(DType::bf16, 264, "sm_90a")),
                      Catch::Contains("D = 264") && Catch::Contains("8 to 256"));
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, sync_spec(DType::bf16, 64, "sm_75")),
                      Catch::Contains("sm_80 or later") && Catch::Contains("sm_75"));
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, sync_spec(DType::f32, 256, "sm_80")),
                      Catch::Contains("bytes of shared memory") && Catch::Contains("sm_80"));
  spec = sync_spec(DType::bf16, 64, "sm_80");
  spec.sync_rows = 48;
  REQUIRE_THROWS_WITH(cuda::generate_attention_backward(c.variant, spec), Catch::Contains("sync_rows = 48"));
}

TEST_CASE("attention backward: NVRTC compiles every case for sm_90a, with wgmma, TMA and dQ by TMA reductions (or red.v2), spilling at most 64 bytes",
          "[codegen][attention][backward][nvrtc]") {
  auto cases = attention_cases::backward();
  Case benchmark = attention_cases::make("backward: causal, bf16, D=Dv=128 (the benchmark's)",
                                         attention_variant(parse_attention_features("causal")));
  benchmark.D = benchmark.Dv = 128;
  cases.push_back(benchmark);
  benchmark.name = "backward: causal, bf16, D=Dv=256 (the warpgroups split the columns)";
  benchmark.D = benchmark.Dv = 256;
  cases.push_back(benchmark);
  for (const Case& c : cases) {
    if (attention_cases::backward_spec(c).form == cuda::AttentionBackwardForm::sync) continue;  // the next test's
    const auto result = gpu::compile_attention_backward(c.variant, attention_cases::backward_spec(c), "sm_90a");
    const auto* r = result.program.resources(result.kernel.name);
    REQUIRE(r != nullptr);
    const std::string line = c.name + ": " + std::to_string(r->registers) + " registers, " + std::to_string(r->spill_store_bytes) +
                             " bytes spilled, " + std::to_string(result.kernel.shared_bytes) + " bytes of shared memory";
    std::cout << "sm_90a " << line << "\n";
    INFO(line);
    INFO(result.program.log);
    // 256 threads leave 255 registers a thread: dK's and dV's accumulators (DP / 2 + DVP / 2), the step's S^T
    // and dP^T (32 each) and P's and dS's fragments. At D = Dv = 128 ptxas spills a few words (36 bytes for
    // causal, measured on the H100 in bench/RESULTS.md); more than 64 would be a regression.
    CHECK(r->spill_store_bytes <= 64);
    CHECK(result.kernel.shared_bytes <= 227 * 1024);
    CHECK(result.program.resources(result.kernel.prep_name) != nullptr);
    const std::string& ptx = result.program.ptx;
    CHECK(ptx.find("wgmma.mma_async") != std::string::npos);
    CHECK(ptx.find("cp.async.bulk.tensor.4d") != std::string::npos);
    const bool bulk = attention_cases::backward_spec(c).dq_tma;
    CHECK(ptx.find(bulk ? "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group" : "red.global.add.v2.f32") != std::string::npos);
    CHECK(result.program.log.find("C7514") == std::string::npos);
  }
}

TEST_CASE("attention backward: NVRTC compiles the sync form for its targets on mma.sync, without spills", "[codegen][attention][backward][nvrtc]") {
  auto cases = attention_cases::backward();
  // The shapes a user meets most: 16-bit D = 256 on an A100, f32 D = 128 on the H100, bf16 D = 128 on an A100.
  for (const auto& [name, type, dim, arch] : {std::tuple{"backward sync: causal, bf16, D=Dv=256, sm_80", DType::bf16, 256, "sm_80"},
                                              std::tuple{"backward sync: causal, f32, D=Dv=128", DType::f32, 128, "sm_90a"},
                                              std::tuple{"backward sync: causal, bf16, D=Dv=128, sm_80", DType::bf16, 128, "sm_80"}}) {
    Case c = attention_cases::make(name, attention_variant(parse_attention_features("causal")));
    c.type = type, c.D = c.Dv = dim, c.backward_arch = arch;
    cases.push_back(c);
  }
  int compiled = 0;
  for (const Case& c : cases) {
    const cuda::AttentionBackwardSpec spec = attention_cases::backward_spec(c);
    if (spec.form != cuda::AttentionBackwardForm::sync) continue;
    const auto result = gpu::compile_attention_backward(c.variant, spec, c.backward_arch);
    const auto* r = result.program.resources(result.kernel.name);
    REQUIRE(r != nullptr);
    const std::string line = c.name + " (" + c.backward_arch + "): " + std::to_string(r->registers) + " registers, " +
                             std::to_string(r->spill_store_bytes) + " bytes spilled, " + std::to_string(result.kernel.shared_bytes) +
                             " bytes of shared memory, " + std::to_string(spec.sync_rows) + " rows x " + std::to_string(spec.sync_columns) +
                             " columns";
    std::cout << line << "\n";
    INFO(line);
    INFO(result.program.log);
    CHECK(r->spill_store_bytes == 0);
    CHECK(result.kernel.shared_bytes <= cuda::target(c.backward_arch).max_shared_bytes);
    CHECK(result.kernel.main_threads == 128);
    const std::string& ptx = result.program.ptx;
    CHECK(ptx.find("mma.sync.aligned.m16n8k16") != std::string::npos);
    CHECK(ptx.find("wgmma") == std::string::npos);
    CHECK(ptx.find("cp.async.bulk.tensor") == std::string::npos);
    ++compiled;
  }
  CHECK(compiled == 7);
}
