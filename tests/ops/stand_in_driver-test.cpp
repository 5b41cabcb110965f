// The GPU path's host side without a GPU: ctest runs this program with LADLE_CUDA_DRIVER_LIBRARY set to
// a stand-in libcuda (bench/host-overhead/fake_cuda.c) that describes an H100, keeps "device" memory
// in host memory and launches nothing. So the checks on device tensors, the plans, the NVRTC compiles
// of the planned kernels and the argument packing of every launch run here as they run on the GPU
// machine, and their errors are held to name their argument. Results are not checked here (nothing
// computes them); the GPU tests do that.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/attention.h>
#include <ladle/ops/context_parallel.h>
#include <ladle/ops/gpu_backward.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/update_forms.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/background.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "runtime/scoped_env.h"

using ladle::DType;
using ladle::Tensor;

namespace {

Tensor device(DType type, std::vector<std::int64_t> shape) { return Tensor(type, std::move(shape), ladle::Location::device(0)); }

}  // namespace

// The stand-in's count of calls to a driver entry (cuda.h's name: cuMemAlloc is cuMemAlloc_v2).
unsigned long driver_calls(const char* entry) {
  const char* path = std::getenv("LADLE_CUDA_DRIVER_LIBRARY");
  REQUIRE(path != nullptr);
  void* library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(library != nullptr);
  const auto calls = reinterpret_cast<unsigned long (*)(const char*)>(dlsym(library, "ladle_fake_cuda_calls"));
  REQUIRE(calls != nullptr);
  const unsigned long n = calls(entry);
  dlclose(library);
  return n;
}

// Device tensors for the default stream take stream-ordered memory (neither end waits for the
// device); a tensor made for another stream keeps cuMemAlloc / cuMemFree (runtime/tensor.h).
TEST_CASE("device tensors for the default stream are stream-ordered, others not", "[stand-in]") {
  REQUIRE(ladle::driver_available());
  // The stand-in's stream-ordered entries call its plain ones: plain = all - ordered.
  const auto allocs = [] { return std::pair{driver_calls("cuMemAllocAsync"), driver_calls("cuMemAlloc_v2") - driver_calls("cuMemAllocAsync")}; };
  const auto frees = [] { return std::pair{driver_calls("cuMemFreeAsync"), driver_calls("cuMemFree_v2") - driver_calls("cuMemFreeAsync")}; };
  const auto [async0, plain0] = allocs();
  const auto [free_async0, free0] = frees();
  {
    const Tensor t = device(DType::f32, {4, 8});
    CHECK(allocs() == std::pair{async0 + 1, plain0});
    const Tensor copy = t.to(ladle::Location::device(0));
    CHECK(allocs() == std::pair{async0 + 2, plain0});
  }
  CHECK(frees() == std::pair{free_async0 + 2, free0});
  {
    const ladle::Stream stream;
    const Tensor t(DType::f32, {4, 8}, ladle::Location::device(0), &stream);
    CHECK(allocs() == std::pair{async0 + 2, plain0 + 1});
  }
  CHECK(frees() == std::pair{free_async0 + 2, free0 + 1});
}

// Tensor::for_output: the constructor's memory without its 0xff fill, unless LADLE_POISON_OUTPUTS=1
// (the test main's default; ctest also runs this case with 0, as a user's process runs).
TEST_CASE("output tensors skip the poison fill unless LADLE_POISON_OUTPUTS=1", "[stand-in]") {
  REQUIRE(ladle::driver_available());
  const char* setting = std::getenv("LADLE_POISON_OUTPUTS");
  const bool poison = setting != nullptr && std::string(setting) == "1";
  INFO("LADLE_POISON_OUTPUTS=" << (setting ? setting : "(unset)"));
  const unsigned long fills = driver_calls("cuMemsetD8Async"), allocs = driver_calls("cuMemAllocAsync");
  {
    const Tensor filled = device(DType::f32, {4, 8});
    CHECK(driver_calls("cuMemsetD8Async") == fills + 1);
    const Tensor out = Tensor::for_output(DType::bf16, {4, 8}, ladle::Location::device(0));
    CHECK(driver_calls("cuMemsetD8Async") == fills + 1 + (poison ? 1 : 0));
    CHECK(driver_calls("cuMemAllocAsync") == allocs + 2);  // stream-ordered like the constructor's
    CHECK(out.view().numel() == 32);
    CHECK(out.location().is_device());
  }
  // On the host it is the constructor's: NaN in every element.
  const Tensor host = Tensor::for_output(DType::f32, {3}, ladle::Location::host());
  CHECK(std::isnan(host.get(0)));
}

TEST_CASE("the GPU path's host side runs through a stand-in driver", "[stand-in]") {
  REQUIRE(ladle::driver_available());
  REQUIRE(ladle::Device::get().properties().arch() == "sm_90a");
  const Tensor q = device(DType::bf16, {1, 128, 2, 64}), k = device(DType::bf16, {1, 128, 2, 64});
  const Tensor v = device(DType::bf16, {1, 128, 2, 64}), g = device(DType::bf16, {1, 128, 2, 64});
  const Tensor o = device(DType::bf16, {1, 128, 2, 64});

  SECTION("the chunked and fused-recurrent forwards plan, compile and pack their launches") {
    for (const auto algorithm : {ladle::Algorithm::chunked, ladle::Algorithm::recurrent}) {
      ladle::GlaOptions options;
      options.algorithm = algorithm;
      CHECK_NOTHROW(ladle::gla_into(q.view(), k.view(), v.view(), g.view(), options, {o.view(), std::nullopt}));
    }
    const Tensor narrow = device(DType::bf16, {1, 128, 2, 32});
    CHECK_THROWS_WITH(ladle::gla_into(q.view(), k.view(), v.view(), narrow.view(), {}, {o.view(), std::nullopt}),
                      Catch::Contains("g has shape [1,128,2,32]"));
    const Tensor host(DType::bf16, {1, 128, 2, 64}, 0.5f);
    ladle::GlaOptions strict;
    strict.gpu.upload_host_tensors = false;
    CHECK_THROWS_WITH(ladle::gla_into(q.view(), k.view(), v.view(), host.view(), strict, {o.view(), std::nullopt}),
                      Catch::Contains("g") && Catch::Contains("upload_host_tensors"));
  }

  SECTION("a repeated call reuses its plan only where what chose it is the same (ops/detail/call_signature.h)") {
    // The heuristic's plan here is the ws form, whose TMA copies need 16-byte aligned addresses.
    ladle::CallShape shape;
    shape.batch = 1, shape.tokens = 128, shape.heads = 2, shape.key_dim = 64, shape.value_dim = 64;
    ladle::RunOptions chunked;
    chunked.algorithm = ladle::Algorithm::chunked;
    const auto planned = ladle::generated_kernels(ladle::named_variant("gla"), shape, chunked, "sm_90a");
    REQUIRE(std::any_of(planned.begin(), planned.end(), [](const ladle::GeneratedKernel& kernel) {
      return kernel.tile.find("ws") != std::string::npos;
    }));
    ladle::GlaOptions options;
    options.algorithm = ladle::Algorithm::chunked;
    for (int call = 0; call < 3; ++call)
      CHECK_NOTHROW(ladle::gla_into(q.view(), k.view(), v.view(), g.view(), options, {o.view(), std::nullopt}));
    // The same shapes with q two bytes off: TMA cannot copy it, so the remembered ws plan must not
    // be reused (its tensor map would refuse the address); the heuristic picks another form.
    const Tensor wide = device(DType::bf16, {q.view().numel() + 8});
    ladle::TensorView shifted = q.view();
    shifted.data = static_cast<std::byte*>(wide.view().data) + 2;
    CHECK_NOTHROW(ladle::gla_into(shifted, k.view(), v.view(), g.view(), options, {o.view(), std::nullopt}));
    CHECK_NOTHROW(ladle::gla_into(q.view(), k.view(), v.view(), g.view(), options, {o.view(), std::nullopt}));
  }

  SECTION("the chunked delta kernels (gated delta rule, KDA), packed sequences and the segmented form") {
    const Tensor beta = device(DType::bf16, {1, 128, 2}), gh = device(DType::f32, {1, 128, 2});
    ladle::UpdateFormOptions options;
    options.algorithm = ladle::Algorithm::chunked;
    CHECK_NOTHROW(ladle::gated_delta_rule_into(q.view(), k.view(), v.view(), gh.view(), beta.view(), options, {o.view(), std::nullopt}));
    ladle::KdaOptions kda;
    kda.algorithm = ladle::Algorithm::chunked;
    CHECK_NOTHROW(ladle::kda(q.view(), k.view(), v.view(), g.view(), beta.view(), kda));
    // Packed sequences, one of them empty, with cu_seqlens on the device (the checks copy it down).
    Tensor offsets(DType::i32, {4});
    const std::int32_t at[] = {0, 50, 50, 128};
    std::memcpy(offsets.data(), at, sizeof(at));
    const Tensor device_offsets = offsets.to(ladle::Location::device(0));
    ladle::GlaOptions packed;
    packed.cu_seqlens = device_offsets.view();
    packed.return_state = true;
    const Tensor state = device(DType::f32, {3, 2, 64, 64});
    CHECK_NOTHROW(ladle::gla_into(q.view(), k.view(), v.view(), g.view(), packed, {o.view(), state.view()}));
    // Few long sequences: the segmented form (its state pass and fold) at 32-token segments.
    ladle::RecurrentOptions segmented;
    segmented.g = g.view();
    segmented.algorithm = ladle::Algorithm::chunked;
    segmented.chunked_segment_tokens = 64;
    CHECK_NOTHROW(ladle::recurrent_into(q.view(), k.view(), v.view(), segmented, {o.view(), std::nullopt}));
  }

  SECTION("softmax attention plans and packs its launch") {
    ladle::AttentionOptions options;
    options.causal = true;
    CHECK_NOTHROW(ladle::attention_into(q.view(), k.view(), v.view(), options, {o.view(), std::nullopt}));
    // Decode-shaped (2 query tokens against 1024 keys, GQA 4:1): the plan's split kernel and its merge,
    // each launched once (the stand-in counts launches).
    const Tensor few = device(DType::bf16, {1, 2, 8, 64}), keys = device(DType::bf16, {1, 1024, 2, 64});
    const Tensor values = device(DType::bf16, {1, 1024, 2, 64}), out = device(DType::bf16, {1, 2, 8, 64});
    const unsigned long launches = driver_calls("cuLaunchKernel");
    CHECK_NOTHROW(ladle::attention_into(few.view(), keys.view(), values.view(), {}, {out.view(), std::nullopt}));
    CHECK(driver_calls("cuLaunchKernel") - launches == 2);
  }

  SECTION("run_variant_backward_into runs the GPU backward's launches into caller-owned gradients") {
    const ladle::ir::Variant& gla = ladle::gla_variant(false);
    ladle::VariantInputs inputs;
    inputs.tensors = {{"g", g.view()}};
    inputs.scalars = {{"scale", 0.125f}};
    const Tensor dq = device(DType::f32, {1, 128, 2, 64}), dk = device(DType::f32, {1, 128, 2, 64});
    const Tensor dv = device(DType::f32, {1, 128, 2, 64}), dg = device(DType::f32, {1, 128, 2, 64});
    const ladle::RecurrentGradientViews grads{dq.view(), dk.view(), dv.view(), {{"g", dg.view()}}, std::nullopt};
    CHECK_NOTHROW(ladle::run_variant_backward_into(gla, q.view(), k.view(), v.view(), inputs, {}, o.view(), std::nullopt, grads));
    ladle::RecurrentGradientViews missing = grads;
    missing.inputs.clear();
    CHECK_THROWS_WITH(ladle::run_variant_backward_into(gla, q.view(), k.view(), v.view(), inputs, {}, o.view(), std::nullopt, missing),
                      Catch::Contains("gradients has no tensor for input 'g'"));
    // The update forms' GPU backward (ladle_bwd_update): its kernels compile and launch; a gradient
    // missing or of the wrong shape is refused by name.
    const Tensor beta = device(DType::bf16, {1, 128, 2}), gh = device(DType::f32, {1, 128, 2});
    ladle::VariantInputs gdn_inputs;
    gdn_inputs.tensors = {{"g", gh.view()}, {"beta", beta.view()}};
    gdn_inputs.scalars = {{"scale", 0.125f}};
    const Tensor dgh = device(DType::f32, {1, 128, 2}), dbeta = device(DType::f32, {1, 128, 2});
    const ladle::RecurrentGradientViews gdn_grads{dq.view(), dk.view(), dv.view(), {{"g", dgh.view()}, {"beta", dbeta.view()}},
                                                  std::nullopt};
    for (const bool l2 : {false, true})
      CHECK_NOTHROW(ladle::run_variant_backward_into(ladle::delta_rule_variant(true, l2), q.view(), k.view(), v.view(), gdn_inputs, {},
                                                     o.view(), std::nullopt, gdn_grads));
    ladle::RecurrentGradientViews no_beta = gdn_grads;
    no_beta.inputs.erase("beta");
    CHECK_THROWS_WITH(ladle::run_variant_backward_into(ladle::delta_rule_variant(true, false), q.view(), k.view(), v.view(), gdn_inputs,
                                                       {}, o.view(), std::nullopt, no_beta),
                      Catch::Contains("gradients has no tensor for input 'beta'"));
    const Tensor wrong = device(DType::f32, {1, 128, 3});
    ladle::RecurrentGradientViews bad_beta = gdn_grads;
    bad_beta.inputs.at("beta") = wrong.view();
    CHECK_THROWS_WITH(ladle::run_variant_backward_into(ladle::delta_rule_variant(true, false), q.view(), k.view(), v.view(), gdn_inputs,
                                                       {}, o.view(), std::nullopt, bad_beta),
                      Catch::Contains("gradients.dbeta has shape [1,128,3], expected [1,128,2]"));
    // d initial_state alone (what a context-parallel backward exchanges): no chain, no other gradient.
    const Tensor h0 = device(DType::f32, {1, 2, 64, 64}), dh0 = device(DType::f32, {1, 2, 64, 64});
    ladle::RunOptions with_h0;
    with_h0.initial_state = h0.view();
    CHECK_NOTHROW(ladle::gpu::run_initial_state_gradient(ladle::delta_rule_variant(true, true), q.view(), k.view(), v.view(), gdn_inputs,
                                                         with_h0, o.view(), std::nullopt, dh0.view()));
    // RWKV6: the bonus u [H,K] and w [B,T,H,K].
    const Tensor u = device(DType::f32, {2, 64}), du = device(DType::f32, {2, 64});
    ladle::VariantInputs rwkv_inputs;
    rwkv_inputs.tensors = {{"w", g.view()}, {"u", u.view()}};
    rwkv_inputs.scalars = {{"scale", 0.125f}};
    const ladle::RecurrentGradientViews rwkv_grads{dq.view(), dk.view(), dv.view(), {{"w", dg.view()}, {"u", du.view()}}, std::nullopt};
    CHECK_NOTHROW(ladle::run_variant_backward_into(ladle::rwkv6_variant(), q.view(), k.view(), v.view(), rwkv_inputs, {}, o.view(),
                                                   std::nullopt, rwkv_grads));
  }
}

TEST_CASE("a chunked launch over more than 65535 (row, head) pairs goes in parts (the driver refuses a larger grid.y or z)",
          "[stand-in]") {
  // 70000 one-token segments of one head: the state pass's grid.z would be 70000 (the GPU backward at
  // T = 256K H16 failed so before run_chunked_plan split such launches).
  const std::int64_t rows = 70000;
  const Tensor q = device(DType::bf16, {1, rows, 1, 16}), k = device(DType::bf16, {1, rows, 1, 16});
  const Tensor v = device(DType::bf16, {1, rows, 1, 16}), g = device(DType::bf16, {1, rows, 1, 16});
  ladle::cuda::ChunkedSegments segments;
  for (long long r = 0; r < rows; ++r) {
    const long long row[8] = {0, r, r + 1, r, 0, r, 0, 0};
    segments.earlier.insert(segments.earlier.end(), row, row + 8);
    const long long last[8] = {0, r, r + 1, r, 0, r, 1, 0};
    segments.all.insert(segments.all.end(), last, last + 8);
  }
  const Tensor states = device(DType::f32, {rows, 1, 16, 16}), decay = device(DType::f32, {rows, 1, 16});
  const ladle::VariantInputs inputs{{{"g", g.view()}}, {{"scale", 0.25f}}};
  CHECK_NOTHROW(ladle::gpu::run_segment_summaries(ladle::named_variant("gla"), q.view(), k.view(), v.view(), inputs, {}, segments,
                                                  reinterpret_cast<std::uintptr_t>(states.data()),
                                                  reinterpret_cast<std::uintptr_t>(decay.data())));
}

TEST_CASE("context parallelism's GPU path plans, compiles and packs its launches (2 thread ranks on the stand-in device)",
          "[stand-in][context_parallel]") {
  // Long slices of few sequences take the one-pass forward (the slice's own segmented state pass
  // gives the summaries), then the fold kernel; the backward adds dS's recurrence alone.
  const std::int64_t T = 8192, H = 2, D = 64;
  const Tensor q = device(DType::bf16, {1, T, H, D}), k = device(DType::bf16, {1, T, H, D}), v = device(DType::bf16, {1, T, H, D});
  const Tensor g = device(DType::bf16, {1, T, H, D}), d_o = device(DType::bf16, {1, T, H, D});
  const auto half = [](const Tensor& t, int r) {
    ladle::TensorView view = t.view();
    view.shape[1] /= 2;
    view.data = static_cast<std::byte*>(view.data) + r * view.shape[1] * view.strides[1] * 2;
    return view;
  };
  ladle::ThreadGroup group(2, ladle::Location::device(0));
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        const ladle::VariantInputs inputs{{{"g", half(g, r)}}, {{"scale", 0.125f}}};
        const ladle::ir::Variant& gla = ladle::named_variant("gla");
        const ladle::RecurrentResult out = ladle::context_parallel::run_variant(gla, half(q, r), half(k, r), half(v, r), inputs, {}, group.rank(r));
        const Tensor dq = device(DType::f32, {1, T / 2, H, D}), dk = device(DType::f32, {1, T / 2, H, D});
        const Tensor dv = device(DType::f32, {1, T / 2, H, D}), dg = device(DType::f32, {1, T / 2, H, D});
        ladle::context_parallel::run_variant_backward_into(gla, half(q, r), half(k, r), half(v, r), inputs, {}, half(d_o, r), std::nullopt,
                                                           {dq.view(), dk.view(), dv.view(), {{"g", dg.view()}}, std::nullopt}, group.rank(r));
        ladle::AttentionOptions causal;
        causal.causal = true;
        (void)ladle::context_parallel::attention(half(q, r), half(k, r), half(v, r), causal, group.rank(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

// The stand-in's name of the kernel it launched last.
std::string last_launch() {
  void* library = dlopen(std::getenv("LADLE_CUDA_DRIVER_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(library != nullptr);
  const auto last = reinterpret_cast<const char* (*)()>(dlsym(library, "ladle_fake_cuda_last_launch"));
  REQUIRE(last != nullptr);
  std::string name = last();
  dlclose(library);
  return name;
}

// A cold call (runtime/background.h): its chunked kernels compile behind it while the fused recurrent
// kernel runs it; once they are compiled, the chunked kernels run.
TEST_CASE("a cold chunked call runs the fused recurrent kernel while its chunked kernels compile behind it", "[stand-in][background]") {
  REQUIRE(ladle::driver_available());
  ladle::test::ScopedEnv on("LADLE_BACKGROUND_COMPILE", "1");  // tests/main.cpp turns it off for the others
  // Variants no other case compiles, new to every run (the constant is in the source), so that neither
  // this process nor the test's disk cache holds their kernels.
  std::random_device seed;
  const auto fresh_variant = [&](const char* name) {
    const float c = 0.5f + static_cast<float>(seed() % 1000000) / 4e6f;
    const auto x = ladle::dsl::token_key("x");
    return ladle::dsl::lower(ladle::dsl::read(ladle::dsl::scan(ladle::dsl::k, ladle::dsl::v).decay_k(ladle::dsl::logsigmoid(x) * c),
                                              ladle::dsl::q, ladle::dsl::scalar("scale")),
                             name);
  };
  const std::int64_t T = 128, H = 2, D = 64;
  const Tensor q = device(DType::bf16, {1, T, H, D}), k = device(DType::bf16, {1, T, H, D});
  const Tensor v = device(DType::bf16, {1, T, H, D}), x = device(DType::bf16, {1, T, H, D});
  const Tensor o = device(DType::bf16, {1, T, H, D});
  const ladle::VariantInputs inputs{{{"x", x.view()}}, {{"scale", 0.125f}}};
  ladle::CallShape shape;
  shape.batch = 1, shape.tokens = T, shape.heads = H, shape.key_dim = D, shape.value_dim = D;
  const auto kernel_names = [&](const ladle::ir::Variant& variant, ladle::Algorithm algorithm) {
    ladle::RunOptions options;
    options.algorithm = algorithm;
    std::vector<std::string> names;
    for (const ladle::GeneratedKernel& kernel : ladle::generated_kernels(variant, shape, options, "sm_90a")) names.push_back(kernel.name);
    return names;
  };
  ladle::BackgroundCompiles& jobs = ladle::BackgroundCompiles::global();
  const auto run = [&](const ladle::ir::Variant& variant, const ladle::RunOptions& options) {
    ladle::gpu::run_variant_into(variant, q.view(), k.view(), v.view(), inputs, options, {o.view(), std::nullopt});
  };

  SECTION("the first call starts one background job and launches the recurrent kernel; after it the chunked one runs") {
    const ladle::ir::Variant variant = fresh_variant("interim_gate");
    const std::vector<std::string> chunked = kernel_names(variant, ladle::Algorithm::chunked);
    const std::vector<std::string> recurrent = kernel_names(variant, ladle::Algorithm::recurrent);
    REQUIRE(chunked.size() == 1);
    REQUIRE(recurrent.size() == 1);
    REQUIRE(chunked != recurrent);
    const int started = jobs.started();
    run(variant, {});
    CHECK(jobs.started() == started + 1);
    CHECK(last_launch() == recurrent.front());
    ladle::finish_background_compiles();
    run(variant, {});
    CHECK(last_launch() == chunked.front());
    run(variant, {});  // remembered now: the same kernel, no new job
    CHECK(last_launch() == chunked.front());
    CHECK(jobs.started() == started + 1);
  }

  SECTION("a cold backward runs the fused-recurrent backward while the chunked backward's programs compile behind it") {
    const ladle::ir::Variant variant = fresh_variant("interim_backward");
    const Tensor d_o = device(DType::bf16, {1, T, H, D});
    const Tensor dq = device(DType::f32, {1, T, H, D}), dk = device(DType::f32, {1, T, H, D});
    const Tensor dv = device(DType::f32, {1, T, H, D}), dx = device(DType::f32, {1, T, H, D});
    const ladle::RecurrentGradientViews gradients{dq.view(), dk.view(), dv.view(), {{"x", dx.view()}}, std::nullopt};
    shape.input_types = {{"x", DType::bf16}};
    const auto programs = [&](ladle::Algorithm algorithm) {
      ladle::RunOptions options;
      options.algorithm = algorithm;
      std::set<std::string> names;
      for (const ladle::GeneratedKernel& kernel : ladle::generated_backward_kernels(variant, shape, options, "sm_90a")) names.insert(kernel.name);
      return names;
    };
    const std::set<std::string> chunked = programs(ladle::Algorithm::chunked), recurrent = programs(ladle::Algorithm::recurrent);
    const auto backward = [&](const ladle::RunOptions& options) {
      ladle::gpu::run_variant_backward_into(variant, q.view(), k.view(), v.view(), inputs, options, d_o.view(), std::nullopt, gradients);
    };
    const int started = jobs.started();
    backward({});
    CHECK(jobs.started() == started + 1);
    // The last launch is the chain kernel: the fused-recurrent backward's (fp32 slots), not the chunked one's.
    CHECK(recurrent.count(last_launch()) == 1);
    CHECK(chunked.count(last_launch()) == 0);
    ladle::finish_background_compiles();
    backward({});
    CHECK(chunked.count(last_launch()) == 1);
    CHECK(recurrent.count(last_launch()) == 0);
    CHECK(jobs.started() == started + 1);
    // A form the caller names is the one that runs, cold or not.
    ladle::RunOptions named;
    named.algorithm = ladle::Algorithm::chunked;
    const ladle::ir::Variant other = fresh_variant("named_backward");
    std::set<std::string> other_chunked;
    for (const ladle::GeneratedKernel& kernel : ladle::generated_backward_kernels(other, shape, named, "sm_90a")) other_chunked.insert(kernel.name);
    ladle::gpu::run_variant_backward_into(other, q.view(), k.view(), v.view(), inputs, named, d_o.view(), std::nullopt, gradients);
    CHECK(other_chunked.count(last_launch()) == 1);
    CHECK(jobs.started() == started + 1);
  }

  SECTION("no interim kernel where the caller names the chunked form, with LADLE_BACKGROUND_COMPILE=0, or in a graph capture") {
    const int started = jobs.started();
    const ladle::ir::Variant named = fresh_variant("named_chunked");
    ladle::RunOptions chunked;
    chunked.algorithm = ladle::Algorithm::chunked;
    run(named, chunked);
    CHECK(last_launch() == kernel_names(named, ladle::Algorithm::chunked).front());
    {
      ladle::test::ScopedEnv off("LADLE_BACKGROUND_COMPILE", "0");
      const ladle::ir::Variant waited = fresh_variant("waited");
      run(waited, {});
      CHECK(last_launch() == kernel_names(waited, ladle::Algorithm::chunked).front());
    }
    {
      // Inside a CUDA graph's capture the launched kernel is what every replay runs: the chunked one.
      ladle::test::ScopedEnv capturing("LADLE_FAKE_CUDA_CAPTURING", "1");
      const ladle::ir::Variant captured = fresh_variant("captured");
      run(captured, {});
      CHECK(last_launch() == kernel_names(captured, ladle::Algorithm::chunked).front());
    }
    CHECK(jobs.started() == started);
    ladle::test::ScopedEnv bad("LADLE_BACKGROUND_COMPILE", "yes");
    CHECK_THROWS_WITH(run(fresh_variant("bad_switch"), {}), Catch::Contains("LADLE_BACKGROUND_COMPILE='yes'") && Catch::Contains("expected 1"));
  }

  SECTION("under LADLE_AUTOTUNE=cached a shape not tuned yet compiles the tuner's candidates behind the call") {
    const ladle::ir::Variant variant = fresh_variant("interim_tuning");
    const int started = jobs.started();
    {
      ladle::test::ScopedEnv cached("LADLE_AUTOTUNE", "cached");
      run(variant, {});
      CHECK(jobs.started() == started + 1);
      CHECK(last_launch() == kernel_names(variant, ladle::Algorithm::recurrent).front());
      ladle::finish_background_compiles();
    }
    // The heuristic's tile was among the candidates: its kernel is compiled, so no second job, no interim.
    run(variant, {});
    CHECK(last_launch() == kernel_names(variant, ladle::Algorithm::chunked).front());
    CHECK(jobs.started() == started + 1);
  }

  SECTION("the gated delta rule's chunked kernels take the same path") {
    const Tensor beta = device(DType::bf16, {1, T, H}), gh = device(DType::f32, {1, T, H});
    // A gated delta rule no other case compiles: its gate scaled by a fresh constant.
    const float c = 0.5f + static_cast<float>(seed() % 1000000) / 4e6f;
    const auto g = ladle::dsl::token_head("g");
    const auto b = ladle::dsl::token_head("beta");
    const ladle::ir::Variant variant = ladle::dsl::lower(
        ladle::dsl::read(ladle::dsl::scan(ladle::dsl::k, ladle::dsl::v).decay_head(g * c).delta(b), ladle::dsl::q, ladle::dsl::scalar("scale")),
        "interim_delta");
    const ladle::VariantInputs delta_inputs{{{"g", gh.view()}, {"beta", beta.view()}}, {{"scale", 0.125f}}};
    shape.input_types = {{"g", DType::f32}};
    const std::vector<std::string> chunked = kernel_names(variant, ladle::Algorithm::chunked);
    const std::vector<std::string> recurrent = kernel_names(variant, ladle::Algorithm::recurrent);
    const int started = jobs.started();
    const auto call = [&] {
      ladle::gpu::run_variant_into(variant, q.view(), k.view(), v.view(), delta_inputs, {}, {o.view(), std::nullopt});
    };
    call();
    CHECK(jobs.started() == started + 1);
    CHECK(last_launch() == recurrent.front());
    ladle::finish_background_compiles();
    call();
    CHECK(last_launch() == chunked.back());
  }
}
