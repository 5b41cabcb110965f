// ladle's host-side cost a call, without a GPU: run with the stand-in driver (fake_cuda.c, through
// LADLE_CUDA_DRIVER_LIBRARY), which launches nothing, so the time a call takes is the library's own
// (planning, checks, driver calls answered at once). NVRTC compiles for real, once, before timing.
//   host-overhead [calls]   prints one line per case: microseconds a call (best of 5 runs)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include <ladle/ops/attention.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/dlpack.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_backward.h>
#include <ladle/runtime/tensor.h>

namespace {

ladle::Tensor device(ladle::DType type, std::vector<std::int64_t> shape) {
  return ladle::Tensor(type, std::move(shape), ladle::Location::device(0));
}

double us_per_call(const std::function<void()>& call, int calls) {
  for (int i = 0; i < 20; ++i) call();
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count() / calls);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 2000;
  const std::string only = argc > 2 ? argv[2] : "";
  using ladle::DType;
  struct Shape {
    const char* name;
    std::int64_t B, T, H, K, V;
  };
  for (const Shape& s : {Shape{"B1 T64 H1 K64 V64", 1, 64, 1, 64, 64}, Shape{"B8 T4096 H16 K128 V128", 8, 4096, 16, 128, 128}}) {
    const ladle::Tensor q = device(DType::bf16, {s.B, s.T, s.H, s.K}), k = device(DType::bf16, {s.B, s.T, s.H, s.K});
    const ladle::Tensor v = device(DType::bf16, {s.B, s.T, s.H, s.V}), g = device(DType::bf16, {s.B, s.T, s.H, s.K});
    const ladle::Tensor o = device(DType::bf16, {s.B, s.T, s.H, s.V});
    for (const auto algorithm : {ladle::Algorithm::chunked, ladle::Algorithm::recurrent}) {
      const char* form = algorithm == ladle::Algorithm::chunked ? "chunked" : "recurrent";
      if (!only.empty() && only != form) continue;
      ladle::GlaOptions options;
      options.algorithm = algorithm;
      const double us = us_per_call([&] { ladle::gla_into(q.view(), k.view(), v.view(), g.view(), options, {o.view(), std::nullopt}); },
                                    calls);
      std::printf("gla %-9s %-24s %8.2f us a call\n", form, s.name, us);
    }
    if (only.empty() || only == "extension") {
      // What the Python extension does around the same call: each tensor taken over from DLPack
      // (ladle::DLPackTensor), the caller's stream borrowed, the variant run by run_variant_into.
      const ladle::ir::Variant variant = ladle::named_variant("gla", "");
      const ladle::Stream stream = ladle::Stream::borrowed(nullptr);
      const auto dl = [](const ladle::TensorView& view) {
        auto* managed = new DLManagedTensor{};
        managed->dl_tensor.data = view.data;
        managed->dl_tensor.device = {kDLCUDA, 0};
        managed->dl_tensor.ndim = view.rank();
        managed->dl_tensor.dtype = {kDLBfloat, 16, 1};
        managed->dl_tensor.shape = const_cast<std::int64_t*>(view.shape.data());
        managed->dl_tensor.strides = const_cast<std::int64_t*>(view.strides.data());
        managed->deleter = [](DLManagedTensor* self) { delete self; };
        return ladle::DLPackTensor(managed);
      };
      const ladle::TensorView qv = q.view(), kv = k.view(), vv = v.view(), gv = g.view(), ov = o.view();
      const double us = us_per_call(
          [&] {
            const ladle::DLPackTensor tq = dl(qv), tk = dl(kv), tv = dl(vv), tg = dl(gv), to = dl(ov);
            ladle::VariantInputs inputs;
            inputs.tensors.emplace("g", tg.view());
            inputs.scalars.emplace("scale", 0.125f);
            ladle::RunOptions options;
            options.backend = ladle::Backend::gpu;
            options.algorithm = ladle::Algorithm::chunked;
            options.gpu.stream = &stream;
            options.gpu.upload_host_tensors = false;
            ladle::run_variant_into(variant, tq.view(), tk.view(), tv.view(), inputs, options, {to.view(), std::nullopt});
          },
          calls);
      std::printf("extension-like gla   %-24s %8.2f us a call\n", s.name, us);
    }
    if (only.empty() || only == "backward") {
      // GLA's GPU backward (the default gate gradients): slots, the recurrences (with the boundary states
      // where they take the ws form), the carries, the block kernel and the chain, planned every call.
      const ladle::ir::Variant& variant = ladle::gla_variant(false);
      const ladle::Tensor d_o = device(DType::bf16, {s.B, s.T, s.H, s.V});
      const ladle::Tensor dq = device(DType::f32, {s.B, s.T, s.H, s.K}), dk = device(DType::f32, {s.B, s.T, s.H, s.K});
      const ladle::Tensor dv = device(DType::f32, {s.B, s.T, s.H, s.V}), dg = device(DType::f32, {s.B, s.T, s.H, s.K});
      ladle::VariantInputs inputs;
      inputs.tensors.emplace("g", g.view());
      inputs.scalars.emplace("scale", 0.125f);
      const ladle::RecurrentGradientViews grads{dq.view(), dk.view(), dv.view(), {{"g", dg.view()}}, std::nullopt};
      const double us = us_per_call(
          [&] { ladle::run_variant_backward_into(variant, q.view(), k.view(), v.view(), inputs, {}, d_o.view(), std::nullopt, grads); },
          calls / 20 + 1);
      std::printf("gla backward      %-24s %8.2f us a call\n", s.name, us);
    }
    if (only.empty() || only == "attention") {
      ladle::AttentionOptions options;
      options.causal = true;
      const double us = us_per_call([&] { ladle::attention_into(q.view(), k.view(), v.view(), options, {o.view(), std::nullopt}); },
                                    calls / 4 + 1);
      std::printf("attention causal  %-24s %8.2f us a call\n", s.name, us);
    }
  }
}
