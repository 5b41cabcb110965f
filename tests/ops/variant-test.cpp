// User-built variants through run_variant: gate math computed in the kernel from raw
// inputs, feature maps with a normalised read, per-token scalar gates, value-side gates,
// per-head scales; each against the fp64 reference fed with the same math done in double.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/variant.h>

#include "reference/recurrent_reference.h"
#include "support/tensors.h"

using namespace ladle;

namespace {

struct Sizes {
  int B = 2, T = 10, H = 4, H_kv = 2, K = 8, V = 6;
};

reference::Recurrent reference_for(const Sizes& s, const test::Filled& q, const test::Filled& k, const test::Filled& v) {
  reference::Recurrent ref;
  ref.B = s.B, ref.T = s.T, ref.H = s.H, ref.H_kv = s.H_kv, ref.K = s.K, ref.V = s.V;
  ref.q = q.values, ref.k = k.values, ref.v = v.values;
  return ref;
}

double elu_plus_one(double x) { return x > 0 ? x + 1 : std::expm1(x) + 1; }

}  // namespace

TEST_CASE("a key-side gate computed in the kernel from a raw input and a per-head temperature", "[ops][variant]") {
  const auto x = dsl::token_key("x");
  const auto tau = dsl::head_param("tau");
  const ir::Variant variant =
      dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / tau), dsl::q, dsl::scalar("scale")), "custom_gate");

  for (DType type : {DType::f32, DType::f16, DType::bf16})
    for (bool per_batch : {false, true}) {
      INFO(dtype_name(type) << " per_batch=" << per_batch);
      Sizes s;
      std::mt19937_64 rng(100 + static_cast<int>(type) * 2 + per_batch);
      const auto q = test::normal(rng, type, {s.B, s.T, s.H, s.K});
      const auto k = test::normal(rng, type, {s.B, s.T, s.H_kv, s.K});
      const auto v = test::normal(rng, type, {s.B, s.T, s.H_kv, s.V});
      const auto xs = test::normal(rng, type, {s.B, s.T, s.H, s.K}, 3.0);
      std::uniform_real_distribution<double> temperature(4.0, 32.0);
      const auto taus = test::filled(DType::f32, per_batch ? std::vector<std::int64_t>{s.B, s.H} : std::vector<std::int64_t>{s.H},
                                     [&] { return temperature(rng); });
      const auto h0 = test::normal(rng, DType::f32, {s.B, s.H, s.K, s.V});

      VariantInputs inputs{{{"x", xs.tensor.view()}, {"tau", taus.tensor.view()}}, {{"scale", 0.3f}}};
      RunOptions options;
      options.initial_state = h0.tensor.view();
      options.return_state = true;
      const RecurrentResult out = run_variant(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs, options);

      reference::Recurrent ref = reference_for(s, q, k, v);
      ref.scale = 0.3f;
      ref.initial_state = h0.values;
      ref.gk.resize(xs.values.size());
      for (std::size_t i = 0; i < xs.values.size(); ++i) {
        const std::size_t h = (i / s.K) % s.H, b = i / (std::size_t(s.K) * s.H * s.T);
        ref.gk[i] = test::logsigmoid(xs.values[i]) / taus.values[per_batch ? b * s.H + h : h];
      }
      const auto expected = reference::recurrent(ref);
      CHECK(test::relative_error(out.o, expected.o) < test::tolerance(type));
      CHECK(test::relative_error(*out.final_state, expected.final_state) < test::tolerance(type));
    }
}

TEST_CASE("the GLA gate written in the expression equals the precomputed gate", "[ops][variant]") {
  // logsigmoid(x) / 16 from the raw x inside the kernel, against recurrent() given g.
  const auto x = dsl::token_key("x");
  const ir::Variant variant =
      dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / 16), dsl::q, dsl::scalar("scale")), "gla_from_x");
  Sizes s;
  std::mt19937_64 rng(5);
  const auto q = test::normal(rng, DType::f32, {s.B, s.T, s.H, s.K});
  const auto k = test::normal(rng, DType::f32, {s.B, s.T, s.H_kv, s.K});
  const auto v = test::normal(rng, DType::f32, {s.B, s.T, s.H_kv, s.V});
  const auto xs = test::normal(rng, DType::f32, {s.B, s.T, s.H, s.K}, 2.0);
  Tensor g(DType::f32, {s.B, s.T, s.H, s.K});
  for (std::int64_t i = 0; i < g.numel(); ++i) g.set(i, static_cast<float>(test::logsigmoid(xs.values[i]) / 16));

  const auto in_kernel = run_variant(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(),
                                     {{{"x", xs.tensor.view()}}, {{"scale", 0.25f}}});
  RecurrentOptions options;
  options.g = g.view();
  options.scale = 0.25f;
  const auto precomputed = recurrent(q.tensor.view(), k.tensor.view(), v.tensor.view(), options);
  CHECK(test::relative_error(in_kernel.o, test::values_of(precomputed.o)) < 1e-6);
}

TEST_CASE("feature maps on q and k with a normalised read", "[ops][variant]") {
  const auto phi_q = dsl::elu(dsl::q) + 1;
  const auto phi_k = dsl::elu(dsl::k) + 1;
  const auto g = dsl::token_key("g");
  const ir::Variant variant = dsl::lower(
      dsl::read(dsl::scan(phi_k, dsl::v).decay_k(g).decay_head(dsl::head_param("g_gamma")), phi_q, dsl::scalar("scale")).normalized(1e-6f),
      "normalised_linear");
  REQUIRE(variant.normalize);

  for (DType type : {DType::f32, DType::bf16})
    for (bool reverse : {false, true}) {
      INFO(dtype_name(type) << " reverse=" << reverse);
      Sizes s;
      s.B = 1;
      std::mt19937_64 rng(17 + reverse);
      const auto q = test::normal(rng, type, {s.T, s.H, s.K});  // packed layout
      const auto k = test::normal(rng, type, {s.T, s.H_kv, s.K});
      const auto v = test::normal(rng, type, {s.T, s.H_kv, s.V});
      const auto gs = test::log_gate(rng, type, {s.T, s.H, s.K});
      const auto gamma = test::filled(DType::f32, {s.H}, [] { return -0.1; });
      Tensor cu(DType::i64, {3});
      const std::int64_t offsets[] = {0, 3, s.T};
      std::memcpy(cu.data(), offsets, sizeof offsets);

      RunOptions options;
      options.cu_seqlens = cu.view();
      options.reverse = reverse;
      const auto out = run_variant(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(),
                                   {{{"g", gs.tensor.view()}, {"g_gamma", gamma.tensor.view()}}, {{"scale", 0.5f}}}, options);
      CHECK(out.o.shape() == std::vector<std::int64_t>{s.T, s.H, s.V});

      reference::Recurrent ref = reference_for(s, q, k, v);
      for (double& e : ref.q) e = elu_plus_one(e);
      for (double& e : ref.k) e = elu_plus_one(e);
      ref.g = gs.values;
      ref.g_gamma = gamma.values;
      ref.scale = 0.5;
      ref.normalize = true;
      ref.eps = 1e-6f;
      ref.cu_seqlens = {0, 3, s.T};
      ref.reverse = reverse;
      CHECK(test::relative_error(out.o, reference::recurrent(ref).o) < test::tolerance(type));
    }
}

TEST_CASE("a per-token scalar gate, a value-side gate from a raw input, and a per-head scale", "[ops][variant]") {
  // decay_head(g_t) with g_t [B,T,H] (one gate per token and head), decay_v(-softplus(y)),
  // v scaled by sigmoid(u), and a scale that differs per head.
  const auto gt = dsl::token_head("g_t");
  const auto y = dsl::token_value("y");
  const auto u = dsl::token_value("u");
  const auto per_head = dsl::head_param("s");
  const auto expression = dsl::read(dsl::scan(dsl::k, dsl::v * dsl::sigmoid(u)).decay_head(gt).decay_v(-dsl::softplus(y)),
                                    dsl::q, dsl::scalar("scale") * per_head);
  const ir::Variant variant = dsl::lower(expression, "mixed");

  Sizes s;
  std::mt19937_64 rng(23);
  const auto q = test::normal(rng, DType::f32, {s.B, s.T, s.H, s.K});
  const auto k = test::normal(rng, DType::f32, {s.B, s.T, s.H_kv, s.K});
  const auto v = test::normal(rng, DType::f32, {s.B, s.T, s.H_kv, s.V});
  const auto gts = test::log_gate(rng, DType::f32, {s.B, s.T, s.H});
  const auto ys = test::normal(rng, DType::f32, {s.B, s.T, s.H, s.V}, 2.0);
  const auto us = test::normal(rng, DType::f32, {s.B, s.T, s.H, s.V});
  const auto ss = test::filled(DType::f32, {s.H}, [h = 0]() mutable { return 0.5 + 0.25 * h++; });
  const VariantInputs inputs{{{"g_t", gts.tensor.view()}, {"y", ys.tensor.view()}, {"u", us.tensor.view()}, {"s", ss.tensor.view()}},
                             {{"scale", 0.5f}}};
  const auto out = run_variant(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs);

  // The reference has v per key/value head; with v * sigmoid(u[h]) it is per query head, so
  // expand to H_kv = H. The per-head scale goes into q, the per-token gate into gk.
  reference::Recurrent ref;
  ref.B = s.B, ref.T = s.T, ref.H = s.H, ref.H_kv = s.H, ref.K = s.K, ref.V = s.V;
  ref.scale = 1.0;
  const int group = s.H / s.H_kv;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.H; ++h) {
        const std::size_t bth = (std::size_t(b) * s.T + t) * s.H + h, bthk = (std::size_t(b) * s.T + t) * s.H_kv + h / group;
        for (int i = 0; i < s.K; ++i) {
          ref.q.push_back(q.values[bth * s.K + i] * 0.5f * ss.values[h]);
          ref.k.push_back(k.values[bthk * s.K + i]);
          ref.gk.push_back(gts.values[bth]);
        }
        for (int j = 0; j < s.V; ++j) {
          ref.v.push_back(v.values[bthk * s.V + j] / (1 + std::exp(-us.values[bth * s.V + j])));
          const double yv = ys.values[bth * s.V + j];
          ref.gv.push_back(-(std::fmax(yv, 0.0) + std::log1p(std::exp(-std::fabs(yv)))));
        }
      }
  CHECK(test::relative_error(out.o, reference::recurrent(ref).o) < 1e-5);
}

TEST_CASE("the result does not depend on the number of threads", "[ops][variant]") {
  const ir::Variant& variant = recurrent_variant(true, false, true, true);
  Sizes s;
  s.H = 6, s.H_kv = 3;
  std::mt19937_64 rng(31);
  const auto q = test::normal(rng, DType::bf16, {s.B, s.T, s.H, s.K});
  const auto k = test::normal(rng, DType::bf16, {s.B, s.T, s.H_kv, s.K});
  const auto v = test::normal(rng, DType::bf16, {s.B, s.T, s.H_kv, s.V});
  const auto g = test::log_gate(rng, DType::bf16, {s.B, s.T, s.H, s.K});
  const auto gv = test::log_gate(rng, DType::bf16, {s.B, s.T, s.H, s.V});
  const auto gamma = test::filled(DType::f32, {s.H}, [] { return -0.02; });
  const VariantInputs inputs{{{"g", g.tensor.view()}, {"gv", gv.tensor.view()}, {"g_gamma", gamma.tensor.view()}}, {{"scale", 0.3f}}};
  RunOptions one, many;
  one.threads = 1;
  many.threads = 5;
  one.return_state = many.return_state = true;
  const auto a = run_variant(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs, one);
  const auto b = run_variant(variant, q.tensor.view(), k.tensor.view(), v.tensor.view(), inputs, many);
  CHECK(test::values_of(a.o) == test::values_of(b.o));
  CHECK(test::values_of(*a.final_state) == test::values_of(*b.final_state));
}

TEST_CASE("named_variant picks the named op's variant and names a bad op or gate", "[ops]") {
  CHECK(ladle::ir::hash(ladle::named_variant("gla")) == ladle::ir::hash(ladle::gla_variant(false)));
  CHECK(ladle::ir::hash(ladle::named_variant("gla", "g_gamma")) == ladle::ir::hash(ladle::gla_variant(true)));
  CHECK(ladle::ir::hash(ladle::named_variant("recurrent", "gk,g_gamma")) ==
        ladle::ir::hash(ladle::recurrent_variant(false, true, false, true)));
  CHECK(ladle::ir::hash(ladle::named_variant("recurrent")) != ladle::ir::hash(ladle::named_variant("recurrent", "g")));
  REQUIRE_THROWS_WITH(ladle::named_variant("recurrent", "g,decay"), Catch::Contains("gate 'decay'"));
  REQUIRE_THROWS_WITH(ladle::named_variant("retnet"), Catch::Contains("op 'retnet'"));
  REQUIRE_THROWS_WITH(ladle::named_variant("gla", "gv"), Catch::Contains("gla takes only"));
}
