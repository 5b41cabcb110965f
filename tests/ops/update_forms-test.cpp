// delta_rule, gated_delta_rule and rwkv6 (and user expressions of those forms) against the fp64
// oracle of tests/reference/update_forms_reference.h, on every backend this machine has: GQA,
// reverse, packed sequences with an empty one, initial and final states, T past any chunk, strong
// decay, beta = 1 with L2-normalised keys, f32/f16/bf16.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/update_forms.h>
#include <ladle/runtime/error.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "reference/update_forms_reference.h"
#include "support/backends.h"
#include "support/tensors.h"

using ladle::DType;
using ladle::Tensor;

namespace {

enum class Form { delta, gated_delta, rwkv6 };

struct Case {
  Form form = Form::delta;
  int B = 2, T = 9, H = 4, H_kv = 2, K = 8, V = 12;
  int gva = 0;  // grouped value heads: q and k with this many heads, v (and o, g, beta, the state) with H
  bool reverse = false;
  bool initial_state = true;
  bool l2 = false;          // use_qk_l2norm_in_kernel
  bool beta_one = false;    // beta = 1 (with l2: the hardest conditioning)
  bool u_per_batch = false; // u [B,H,K]
  double decay_level = 0;   // not 0: g (or w) drawn around this (strong decay)
  DType type = DType::f32;
  std::vector<std::int64_t> cu_seqlens;
  bool packed_rank3 = false;
  std::optional<float> scale;
  ladle::Algorithm algorithm = ladle::Algorithm::automatic;

  std::string describe() const {
    std::ostringstream s;
    s << (form == Form::delta ? "delta_rule" : form == Form::gated_delta ? "gated_delta_rule" : "rwkv6") << " B=" << B << " T=" << T
      << " H=" << H << " H_kv=" << H_kv << " gva=" << gva << " K=" << K << " V=" << V << " reverse=" << reverse << " h0=" << initial_state
      << " l2=" << l2 << " beta_one=" << beta_one << " u_per_batch=" << u_per_batch << " decay_level=" << decay_level
      << " dtype=" << ladle::dtype_name(type) << " varlen=" << cu_seqlens.size() << " rank3=" << packed_rank3
      << " algorithm=" << (algorithm == ladle::Algorithm::chunked ? "chunked" : algorithm == ladle::Algorithm::recurrent ? "recurrent" : "auto");
    return s.str();
  }
};

std::uint64_t seed_of(const Case& c) {
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : c.describe()) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

void check_case(Case c) {
  if (!c.cu_seqlens.empty()) c.B = 1, c.T = static_cast<int>(c.cu_seqlens.back());
  INFO(c.describe());
  std::mt19937_64 rng(seed_of(c));
  const auto token_shape = [&](int heads, int features) {
    if (c.packed_rank3) return features ? std::vector<std::int64_t>{c.T, heads, features} : std::vector<std::int64_t>{c.T, heads};
    return features ? std::vector<std::int64_t>{c.B, c.T, heads, features} : std::vector<std::int64_t>{c.B, c.T, heads};
  };
  const int N = c.cu_seqlens.empty() ? c.B : static_cast<int>(c.cu_seqlens.size()) - 1;
  const bool delta = c.form != Form::rwkv6;
  // Without in-kernel normalisation the keys are drawn at unit length on average, as a model's
  // normalised keys are: (I - beta k k^T) then stays a contraction.
  const double k_spread = delta && !c.l2 ? 1.0 / std::sqrt(double(c.K)) : 1.0;
  test::Filled q = test::normal(rng, c.type, token_shape(c.gva ? c.gva : c.H, c.K));
  test::Filled k = test::normal(rng, c.type, token_shape(c.gva ? c.gva : c.H_kv, c.K), k_spread);
  test::Filled v = test::normal(rng, c.type, token_shape(c.gva ? c.H : c.H_kv, c.V));

  reference::UpdateForm ref;
  ref.B = c.B, ref.T = c.T, ref.H = c.H, ref.H_kv = c.H_kv, ref.K = c.K, ref.V = c.V, ref.gva_heads = c.gva;
  ref.q = q.values, ref.k = k.values, ref.v = v.values;
  ref.reverse = c.reverse;
  ref.scale = c.scale.value_or(1.0 / std::sqrt(double(c.K)));
  ref.cu_seqlens = c.cu_seqlens;
  ref.l2_normalize = c.l2;

  ladle::UpdateFormOptions options;
  options.reverse = c.reverse;
  options.scale = c.scale;
  options.return_state = true;
  options.use_qk_l2norm_in_kernel = c.l2;
  options.algorithm = c.algorithm;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::optional<test::Filled> beta, g, w, u, h0;
  if (delta) {
    beta = test::filled(DType::f32, token_shape(c.H, 0), [&] { return c.beta_one ? 1.0 : 1.0 / (1.0 + std::exp(-4 * unit(rng) + 2)); });
    ref.beta = beta->values;
  }
  if (c.form == Form::gated_delta) {
    g = test::filled(DType::f32, token_shape(c.H, 0), [&] { return c.decay_level != 0 ? c.decay_level * (0.5 + unit(rng)) : test::logsigmoid(4 * unit(rng) - 2) / 4; });
    ref.g = g->values;
  }
  if (c.form == Form::rwkv6) {
    w = test::filled(c.type, token_shape(c.H, c.K), [&] { return c.decay_level != 0 ? c.decay_level * (0.5 + unit(rng)) : -std::exp(unit(rng) * 2 - 3); });
    ref.w = w->values;
    u = test::normal(rng, DType::f32, c.u_per_batch ? std::vector<std::int64_t>{c.B, c.H, c.K} : std::vector<std::int64_t>{c.H, c.K});
    ref.u = u->values;
  }
  if (c.initial_state) {
    h0 = test::normal(rng, DType::f32, {N, c.H, c.K, c.V});
    options.initial_state = h0->tensor.view();
    ref.initial_state = h0->values;
  }
  Tensor cu_seqlens;
  if (!c.cu_seqlens.empty()) {
    cu_seqlens = Tensor(DType::i64, {static_cast<std::int64_t>(c.cu_seqlens.size())});
    std::memcpy(cu_seqlens.data(), c.cu_seqlens.data(), c.cu_seqlens.size() * sizeof(std::int64_t));
    options.cu_seqlens = cu_seqlens.view();
  }
  const reference::RecurrentOutput expected = delta ? reference::delta_rule(ref) : reference::bonus_read(ref);

  for (ladle::Backend backend : test::backends()) {
    options.backend = backend;
    INFO("backend " << (backend == ladle::Backend::gpu ? "gpu" : "cpu"));
    Tensor o(c.type, token_shape(c.H, c.V), std::numeric_limits<float>::quiet_NaN());
    Tensor final_state(DType::f32, {N, c.H, c.K, c.V}, std::numeric_limits<float>::quiet_NaN());
    const ladle::RecurrentOutputs outputs{o.view(), final_state.view()};
    if (c.form == Form::delta) ladle::delta_rule_into(q.tensor.view(), k.tensor.view(), v.tensor.view(), beta->tensor.view(), options, outputs);
    if (c.form == Form::gated_delta)
      ladle::gated_delta_rule_into(q.tensor.view(), k.tensor.view(), v.tensor.view(), g->tensor.view(), beta->tensor.view(), options, outputs);
    if (c.form == Form::rwkv6)
      ladle::rwkv6_into(q.tensor.view(), k.tensor.view(), v.tensor.view(), w->tensor.view(), u->tensor.view(), options, outputs);
    const double o_error = test::relative_error(o, expected.o), state_error = test::relative_error(final_state, expected.final_state);
    INFO("o error " << o_error << ", final_state error " << state_error);
    // The chunked form multiplies in bf16 on the tensor cores whatever the inputs' dtype.
    const bool tensor_cores = backend == ladle::Backend::gpu && c.algorithm == ladle::Algorithm::chunked;
    const double tolerance = tensor_cores ? test::tolerance(DType::bf16) : test::tolerance(c.type);
    CHECK(o_error < tolerance);
    CHECK(state_error < tolerance);
    for (std::size_t n = 0; n + 1 < c.cu_seqlens.size(); ++n) {  // an empty sequence keeps its state
      if (c.cu_seqlens[n] != c.cu_seqlens[n + 1]) continue;
      const std::int64_t size = std::int64_t{c.H} * c.K * c.V;
      for (std::int64_t i = 0; i < size; ++i)
        REQUIRE(final_state.get(std::int64_t(n) * size + i) == (c.initial_state ? h0->tensor.get(std::int64_t(n) * size + i) : 0.0f));
    }
  }
}

const DType all_types[] = {DType::f32, DType::f16, DType::bf16};
const Form all_forms[] = {Form::delta, Form::gated_delta, Form::rwkv6};

}  // namespace

TEST_CASE("update forms match the fp64 oracle in each direction and dtype, with and without states", "[ops][update_forms]") {
  for (Form form : all_forms)
    for (DType type : all_types)
      for (bool reverse : {false, true})
        for (bool h0 : {false, true}) {
          Case c;
          c.form = form, c.type = type, c.reverse = reverse, c.initial_state = h0;
          check_case(c);
        }
}

TEST_CASE("delta rules normalise q and k in the kernel, and hold at beta = 1 on normalised keys", "[ops][update_forms]") {
  for (Form form : {Form::delta, Form::gated_delta})
    for (DType type : all_types)
      for (bool beta_one : {false, true}) {
        Case c;
        c.form = form, c.type = type, c.l2 = true, c.beta_one = beta_one;
        c.T = 150;  // past any chunk: 150 = 2 x 64 + 22
        c.K = 16, c.V = 16, c.H = 2, c.H_kv = 1, c.B = 1;
        check_case(c);
      }
}

TEST_CASE("delta rules on the chunked (tensor-core) form: chunks, partial chunks, packed, states, K and V of the models", "[ops][update_forms][chunked]") {
  // On the GPU these run the chunked delta kernels (codegen/cuda/chunked_delta.h); the CPU path runs
  // the same calls sequentially.
  for (Form form : {Form::delta, Form::gated_delta})
    for (bool reverse : {false, true}) {
      Case c;
      c.form = form, c.type = DType::bf16, c.l2 = true, c.reverse = reverse;
      c.algorithm = ladle::Algorithm::chunked;
      c.B = 2, c.T = 200, c.H = 4, c.H_kv = 2, c.K = 128, c.V = 128;
      check_case(c);
      c.cu_seqlens = {0, 64, 64, 130, 131, 300};  // a whole chunk, an empty sequence, a chunk and a token, one token
      c.K = 64, c.V = 96, c.beta_one = true;
      check_case(c);
    }
  Case strong;  // strong decay: gamma falls by ~8 a token
  strong.form = Form::gated_delta, strong.decay_level = -8.0, strong.T = 130, strong.type = DType::bf16;
  strong.algorithm = ladle::Algorithm::chunked, strong.K = 32, strong.V = 48;
  check_case(strong);
  Case plain;  // unnormalised keys of unit length, fp32 inputs forced onto the tensor cores
  plain.form = Form::delta, plain.T = 100, plain.algorithm = ladle::Algorithm::chunked, plain.K = 100, plain.V = 40;
  check_case(plain);
}

TEST_CASE("rwkv6 on the chunked (tensor-core) form: chunks, partial chunks, packed, states, strong decay, u per batch", "[ops][update_forms][chunked]") {
  // On the GPU these run the chunked family's read before the update (codegen/cuda/chunked.h): q~
  // with the gates up to t - 1, strictly causal scores, the bonus on their diagonal.
  for (bool reverse : {false, true}) {
    Case c;
    c.form = Form::rwkv6, c.type = DType::bf16, c.reverse = reverse;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 200, c.H = 4, c.H_kv = 2, c.K = 128, c.V = 128;
    check_case(c);
    c.cu_seqlens = {0, 64, 64, 130, 131, 300};  // a whole chunk, an empty sequence, a chunk and a token, one token
    c.K = 64, c.V = 96, c.initial_state = !reverse;
    check_case(c);
  }
  Case strong;  // w near -8 per token and feature: 16-token and single-token steps
  strong.form = Form::rwkv6, strong.decay_level = -8.0, strong.T = 130, strong.type = DType::bf16;
  strong.algorithm = ladle::Algorithm::chunked, strong.K = 32, strong.V = 48;
  check_case(strong);
  Case batch_u;  // u [B,H,K], fp32 inputs forced onto the tensor cores, K and V not multiples of 16
  batch_u.form = Form::rwkv6, batch_u.u_per_batch = true, batch_u.T = 100, batch_u.algorithm = ladle::Algorithm::chunked;
  batch_u.K = 40, batch_u.V = 24;
  check_case(batch_u);
}

TEST_CASE("update forms take packed sequences with an empty one, rank-3 inputs and GQA", "[ops][update_forms][varlen]") {
  for (Form form : all_forms)
    for (bool reverse : {false, true})
      for (bool rank3 : {false, true}) {
        Case c;
        c.form = form, c.reverse = reverse, c.packed_rank3 = rank3;
        c.cu_seqlens = {0, 5, 5, 12, 13, 20};
        c.type = rank3 ? DType::bf16 : DType::f32;
        check_case(c);
      }
  Case empty;  // only empty sequences: the states pass through
  empty.cu_seqlens = {0, 0, 0};
  for (Form form : all_forms) empty.form = form, check_case(empty);
}

TEST_CASE("update forms under strong decay, GQA shapes, K != V and an explicit scale", "[ops][update_forms]") {
  struct Heads {
    int H, H_kv, K, V;
  };
  for (Form form : all_forms) {
    for (const Heads& s : {Heads{4, 1, 8, 12}, Heads{6, 3, 5, 7}, Heads{3, 1, 1, 3}, Heads{2, 2, 32, 16}}) {
      Case c;
      c.form = form, c.H = s.H, c.H_kv = s.H_kv, c.K = s.K, c.V = s.V;
      c.T = 70;
      check_case(c);
    }
    if (form == Form::delta) continue;
    Case strong;
    strong.form = form, strong.decay_level = -8.0, strong.T = 40, strong.scale = 0.5f;
    check_case(strong);
  }
  Case per_batch;
  per_batch.form = Form::rwkv6, per_batch.u_per_batch = true, per_batch.B = 3;
  check_case(per_batch);
}

TEST_CASE("a user expression of the gated delta rule: gates as expressions, feature maps, L2 normalisation", "[ops][update_forms][dsl]") {
  // beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) (Gated DeltaNet's gate), q and k through
  // silu before the kernel's L2 normalisation.
  constexpr auto a = ladle::dsl::token_head("a");
  constexpr auto b = ladle::dsl::token_head("b");
  constexpr auto A_log = ladle::dsl::head_param("A_log");
  constexpr auto dt_bias = ladle::dsl::head_param("dt_bias");
  namespace dsl = ladle::dsl;
  const auto state = dsl::scan(dsl::silu(dsl::k), dsl::v).decay_head(-dsl::exp(A_log) * dsl::softplus(a + dt_bias)).delta(dsl::sigmoid(b));
  const ladle::ir::Variant variant = dsl::lower(dsl::read(state, dsl::silu(dsl::q), dsl::scalar("scale")).l2_normalized(), "gdn_user");
  REQUIRE(ladle::ir::validate(variant).empty());

  const int B = 2, T = 33, H = 4, H_kv = 2, K = 16, V = 8;
  std::mt19937_64 rng(17);
  const test::Filled q = test::normal(rng, DType::bf16, {B, T, H, K}), k = test::normal(rng, DType::bf16, {B, T, H_kv, K});
  const test::Filled v = test::normal(rng, DType::bf16, {B, T, H_kv, V});
  const test::Filled at = test::normal(rng, DType::f32, {B, T, H}), bt = test::normal(rng, DType::f32, {B, T, H});
  const test::Filled A = test::normal(rng, DType::f32, {H}, 0.5), dt = test::normal(rng, DType::f32, {H}, 0.5);
  reference::UpdateForm ref;
  ref.B = B, ref.T = T, ref.H = H, ref.H_kv = H_kv, ref.K = K, ref.V = V;
  const auto silu = [](std::vector<double> x) {
    for (double& e : x) e = e / (1 + std::exp(-e));
    return x;
  };
  ref.q = silu(q.values), ref.k = silu(k.values), ref.v = v.values;
  ref.scale = 0.3, ref.l2_normalize = true;
  for (std::size_t r = 0; r < at.values.size(); ++r) {
    const int h = static_cast<int>(r % H);
    ref.g.push_back(-std::exp(A.values[h]) * std::log1p(std::exp(at.values[r] + dt.values[h])));
    ref.beta.push_back(1 / (1 + std::exp(-bt.values[r])));
  }
  const reference::RecurrentOutput expected = reference::delta_rule(ref);
  for (ladle::Backend backend : test::backends()) {
    INFO("backend " << (backend == ladle::Backend::gpu ? "gpu" : "cpu"));
    ladle::RunOptions options;
    options.backend = backend;
    options.return_state = true;
    const ladle::RecurrentResult out = ladle::run_variant(
        variant, q.tensor.view(), k.tensor.view(), v.tensor.view(),
        {{{"a", at.tensor.view()}, {"b", bt.tensor.view()}, {"A_log", A.tensor.view()}, {"dt_bias", dt.tensor.view()}}, {{"scale", 0.3f}}},
        options);
    CHECK(test::relative_error(out.o, expected.o) < test::tolerance(DType::bf16));
    CHECK(test::relative_error(*out.final_state, expected.final_state) < 1e-4);
  }
}

TEST_CASE("update forms refuse bad input by name", "[ops][update_forms][errors]") {
  std::mt19937_64 rng(3);
  const auto q = test::normal(rng, DType::f32, {1, 4, 2, 8}), k = test::normal(rng, DType::f32, {1, 4, 2, 8});
  const auto v = test::normal(rng, DType::f32, {1, 4, 2, 6}), beta = test::normal(rng, DType::f32, {1, 4, 2});
  const auto w = test::normal(rng, DType::f32, {1, 4, 2, 8}), u = test::normal(rng, DType::f32, {2, 8});
  ladle::UpdateFormOptions cpu;
  cpu.backend = ladle::Backend::cpu;
  using Catch::Matchers::Contains;
  // beta over features, as fla's elementwise beta would be: not this op's shape.
  CHECK_THROWS_WITH(ladle::delta_rule(q.tensor.view(), k.tensor.view(), v.tensor.view(), w.tensor.view(), cpu),
                    Contains("delta_rule") && Contains("beta") && Contains("[B,T,H]"));
  CHECK_THROWS_WITH(ladle::gated_delta_rule(q.tensor.view(), k.tensor.view(), v.tensor.view(), w.tensor.view(), beta.tensor.view(), cpu),
                    Contains("gated_delta_rule") && Contains("g has shape"));
  const auto u_wrong = test::normal(rng, DType::f32, {2, 6});
  CHECK_THROWS_WITH(ladle::rwkv6(q.tensor.view(), k.tensor.view(), v.tensor.view(), w.tensor.view(), u_wrong.tensor.view(), cpu),
                    Contains("rwkv6") && Contains("u has shape") && Contains("[H,K]"));
  ladle::UpdateFormOptions l2 = cpu;
  l2.use_qk_l2norm_in_kernel = true;
  CHECK_THROWS_WITH(ladle::rwkv6(q.tensor.view(), k.tensor.view(), v.tensor.view(), w.tensor.view(), u.tensor.view(), l2),
                    Contains("use_qk_l2norm_in_kernel"));
  // The composition on the CPU runs the diagonal form only: refused by name, not run wrong. Their own
  // backward, on the CPU and on the GPU, refuses a d_output of the wrong shape and another call's saved.
  {
    const ladle::VariantInputs inputs{{{"beta", beta.tensor.view()}}, {{"scale", 1.0f}}};
    ladle::RunOptions on_cpu;
    on_cpu.backend = ladle::Backend::cpu;
    const ladle::RecurrentForward forward = ladle::run_variant_for_backward(ladle::delta_rule_variant(false, false), q.tensor.view(),
                                                                           k.tensor.view(), v.tensor.view(), inputs, on_cpu);
    const auto d_o = test::normal(rng, DType::f32, forward.result.o.shape());
    CHECK_THROWS_WITH(ladle::run_variant_backward_composed(forward.saved, d_o.tensor.view(), std::nullopt, ladle::Backend::cpu),
                      Contains("composition on the CPU runs the diagonal form, not the delta rule"));
    std::vector<std::int64_t> wrong_shape = forward.result.o.shape();
    wrong_shape.back() += 1;
    const auto wrong = test::normal(rng, DType::f32, wrong_shape);
    CHECK_THROWS_WITH(ladle::run_variant_backward(forward.saved, wrong.tensor.view()), Contains("d_output"));
    if (ladle::driver_available()) {
      ladle::RunOptions on_gpu;
      on_gpu.backend = ladle::Backend::gpu;
      const ladle::RecurrentForward gpu = ladle::run_variant_for_backward(ladle::delta_rule_variant(false, false), q.tensor.view(),
                                                                         k.tensor.view(), v.tensor.view(), inputs, on_gpu);
      CHECK_THROWS_WITH(ladle::run_variant_backward(gpu.saved, wrong.tensor.view()), Contains("d_output"));
      CHECK_NOTHROW(ladle::run_variant_backward(gpu.saved, d_o.tensor.view()));
    }
  }
  // The chunked delta rule stops at K = 128: a forced chunked call says so (on a GPU machine;
  // without one the GPU backend is refused first).
  ladle::UpdateFormOptions chunked = cpu;
  chunked.backend = ladle::Backend::gpu;
  chunked.algorithm = ladle::Algorithm::chunked;
  if (ladle::driver_available()) {
    const auto wide_q = test::normal(rng, DType::f32, {1, 4, 2, 160}), wide_k = test::normal(rng, DType::f32, {1, 4, 2, 160});
    CHECK_THROWS_WITH(ladle::delta_rule(wide_q.tensor.view(), wide_k.tensor.view(), v.tensor.view(), beta.tensor.view(), chunked),
                      Contains("K = 160, expected at most 128"));
  }
}

namespace {

struct KdaCase {
  int B = 2, T = 9, H = 4, H_kv = 4, K = 8, V = 6;
  int gva = 0;  // grouped value heads: q and k with this many heads, v (and o, g, beta, the state) with H
  DType type = DType::f32;
  bool gate_in_kernel = false, dt_bias = false, sigmoid = false, l2 = false, reverse = false;
  std::vector<std::int64_t> cu_seqlens;
  double decay_level = 0;  // not 0: g around this per token (strong decay: -8)
  bool hard_resets = false;  // g = -inf at some tokens and features (exp(-inf) = 0 wipes those rows)
  ladle::Algorithm algorithm = ladle::Algorithm::automatic;
  std::uint64_t seed = 900;
};

void check_kda(KdaCase c) {
  if (!c.cu_seqlens.empty()) c.B = 1, c.T = static_cast<int>(c.cu_seqlens.back());
  const int N = c.cu_seqlens.empty() ? c.B : static_cast<int>(c.cu_seqlens.size()) - 1;
  const int B = c.B, T = c.T, H = c.H, H_kv = c.H_kv, K = c.K, V = c.V;
  INFO("gate_in_kernel " << c.gate_in_kernel << " dt_bias " << c.dt_bias << " sigmoid " << c.sigmoid << " l2 " << c.l2 << " packed "
                         << c.cu_seqlens.size() << " reverse " << c.reverse << " " << ladle::dtype_name(c.type) << " B " << B << " T " << T
                         << " H " << H << " H_kv " << H_kv << " K " << K << " V " << V << " decay_level " << c.decay_level
                         << " hard_resets " << c.hard_resets << " gva " << c.gva << " chunked " << (c.algorithm == ladle::Algorithm::chunked));
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double k_spread = c.l2 ? 1.0 : 1.0 / std::sqrt(double(K));
  const int Hq = c.gva ? c.gva : H, Hk = c.gva ? c.gva : H_kv, Hv = c.gva ? H : H_kv;
  const test::Filled q = test::normal(rng, c.type, {B, T, Hq, K}), k = test::normal(rng, c.type, {B, T, Hk, K}, k_spread),
                     v = test::normal(rng, c.type, {B, T, Hv, V});
  // g: the log decay itself (logsigmoid(x) / 4, or around decay_level), or the gate's raw input; beta: in
  // (0, 1), or its logit. Hard resets: -inf at every 37th token in two features of three (raw input: -inf
  // goes through softplus(-inf) = 0, so those cases plant +inf instead: -exp(A) softplus(+inf) = -inf).
  std::int64_t element = 0;
  const test::Filled g = test::filled(DType::f32, {B, T, H, K}, [&] {
    const std::int64_t e = element++, t = e / (std::int64_t{H} * K) % T, i = e % K;
    if (c.hard_resets && t % 37 == 5 && i % 3 != 1)
      return c.gate_in_kernel ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    if (c.gate_in_kernel) return 2 * unit(rng) - 1;
    return c.decay_level != 0 ? c.decay_level * (0.5 + unit(rng)) : test::logsigmoid(4 * unit(rng) - 2) / 4;
  });
  const test::Filled beta = test::filled(DType::f32, {B, T, H}, [&] { return c.sigmoid ? 4 * unit(rng) - 2 : 0.1 + 0.8 * unit(rng); });
  const test::Filled a_log = test::filled(DType::f32, {H}, [&] { return unit(rng) - 1.5; });
  const test::Filled bias = test::filled(DType::f32, {H, K}, [&] { return unit(rng) - 0.5; });
  const test::Filled h0 = test::normal(rng, DType::f32, {N, H, K, V});

  reference::UpdateForm ref;
  ref.B = B, ref.T = T, ref.H = H, ref.H_kv = H_kv, ref.K = K, ref.V = V, ref.gva_heads = c.gva;
  ref.q = q.values, ref.k = k.values, ref.v = v.values, ref.scale = 1.0 / std::sqrt(double(K));
  ref.cu_seqlens = c.cu_seqlens, ref.reverse = c.reverse, ref.l2_normalize = c.l2, ref.initial_state = h0.values;
  ref.beta = beta.values;
  if (c.sigmoid)
    for (double& x : ref.beta) x = 1.0 / (1.0 + std::exp(-x));
  ref.gk = g.values;
  if (c.gate_in_kernel)
    for (std::size_t e = 0; e < ref.gk.size(); ++e) {
      const std::size_t h = e / K % H, i = e % K;
      const double x = ref.gk[e] + (c.dt_bias ? bias.values[h * K + i] : 0.0);
      ref.gk[e] = -std::exp(a_log.values[h]) * (x > 20 ? x : std::log1p(std::exp(x)));
    }
  const reference::RecurrentOutput expected = reference::delta_rule(ref);

  ladle::KdaOptions options;
  options.return_state = true, options.reverse = c.reverse, options.use_qk_l2norm_in_kernel = c.l2;
  options.use_gate_in_kernel = c.gate_in_kernel, options.use_beta_sigmoid_in_kernel = c.sigmoid;
  options.algorithm = c.algorithm;
  options.initial_state = h0.tensor.view();
  if (c.gate_in_kernel) options.A_log = a_log.tensor.view();
  if (c.dt_bias) options.dt_bias = bias.tensor.view();
  Tensor offsets;
  if (!c.cu_seqlens.empty()) {
    offsets = Tensor(DType::i64, {static_cast<std::int64_t>(c.cu_seqlens.size())});
    std::memcpy(offsets.data(), c.cu_seqlens.data(), c.cu_seqlens.size() * sizeof(std::int64_t));
    options.cu_seqlens = offsets.view();
  }
  for (ladle::Backend backend : test::backends()) {
    options.backend = backend;
    INFO("backend " << (backend == ladle::Backend::gpu ? "gpu" : "cpu"));
    const ladle::RecurrentResult got = ladle::kda(q.tensor.view(), k.tensor.view(), v.tensor.view(), g.tensor.view(), beta.tensor.view(), options);
    // The chunked form multiplies in bf16 on the tensor cores whatever the inputs' dtype.
    const bool tensor_cores = backend == ladle::Backend::gpu && c.algorithm == ladle::Algorithm::chunked;
    const double tolerance = tensor_cores ? test::tolerance(DType::bf16) : test::tolerance(c.type);
    const double o_error = test::relative_error(got.o, expected.o);
    INFO("o error " << o_error);
    CHECK(o_error < tolerance);
    REQUIRE(got.final_state);
    CHECK(test::relative_error(*got.final_state, expected.final_state) < tolerance);
  }
}

}  // namespace

TEST_CASE("kda matches the fp64 oracle: the gate and beta's sigmoid in the kernel, L2, GQA, packed, reverse, dtypes",
          "[ops][update_forms][kda]") {
  for (int bits = 0; bits < 8; ++bits) {
    KdaCase c;
    c.gate_in_kernel = bits & 1, c.l2 = bits & 2;
    c.dt_bias = c.gate_in_kernel && bits != 1, c.sigmoid = bits % 3 != 0, c.reverse = bits % 3 == 1;
    c.type = bits % 4 == 3 ? DType::bf16 : bits % 4 == 1 ? DType::f16 : DType::f32;
    c.H_kv = bits % 2 ? 2 : 4;
    if (bits & 4) c.cu_seqlens = {0, 5, 5, 13};
    c.seed = static_cast<std::uint64_t>(900 + bits);
    check_kda(c);
  }
  KdaCase strong;  // strong decay (g around -8) and hard resets on the fused-recurrent path (short sequences)
  strong.decay_level = -8.0, strong.T = 40, strong.l2 = true, strong.type = DType::bf16, strong.seed = 910;
  check_kda(strong);
  KdaCase resets;
  resets.hard_resets = true, resets.T = 45, resets.gate_in_kernel = true, resets.reverse = true, resets.cu_seqlens = {0, 20, 20, 45};
  resets.seed = 911;
  check_kda(resets);
}

TEST_CASE("kda on the chunked (tensor-core) form: chunks, partial chunks, packed, states, strong decay, hard resets, K and V of the models",
          "[ops][update_forms][kda][chunked]") {
  // On the GPU these run the chunked delta kernels with per-feature gates (codegen/cuda/chunked_delta.h);
  // the CPU path runs the same calls sequentially.
  for (bool reverse : {false, true}) {
    KdaCase c;
    c.type = DType::bf16, c.l2 = true, c.reverse = reverse, c.sigmoid = true, c.gate_in_kernel = reverse, c.dt_bias = reverse;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 200, c.H = 4, c.H_kv = 2, c.K = 128, c.V = 128, c.seed = 950 + reverse;
    check_kda(c);
    c.cu_seqlens = {0, 64, 64, 130, 131, 300};  // a whole chunk, an empty sequence, a chunk and a token, one token
    c.K = 64, c.V = 96;
    check_kda(c);
  }
  KdaCase strong;  // strong decay: g around -8 a token (every diagonal block element by element)
  strong.type = DType::bf16, strong.decay_level = -8.0, strong.T = 130, strong.K = 32, strong.V = 48, strong.l2 = true;
  strong.algorithm = ladle::Algorithm::chunked;
  check_kda(strong);
  KdaCase medium = strong;  // g around -1.5: the diagonal blocks fit, the chunk does not
  medium.decay_level = -1.5, medium.K = 128, medium.V = 64, medium.seed = 951;
  check_kda(medium);
  KdaCase resets = medium;  // hard resets (g = -inf) with the gate in the kernel, packed, reverse
  resets.decay_level = 0, resets.hard_resets = true, resets.gate_in_kernel = true, resets.reverse = true;
  resets.cu_seqlens = {0, 100, 100, 250}, resets.seed = 952;
  check_kda(resets);
  KdaCase plain;  // unnormalised keys, fp32 inputs forced onto the tensor cores
  plain.T = 100, plain.algorithm = ladle::Algorithm::chunked, plain.K = 100, plain.V = 40, plain.seed = 953;
  check_kda(plain);
}

TEST_CASE("update forms and KDA take grouped value heads (v, g, beta with more heads than q and k, fla's GVA)", "[ops][update_forms][gva]") {
  for (ladle::Algorithm algorithm : {ladle::Algorithm::automatic, ladle::Algorithm::chunked})
    for (Form form : all_forms) {
      Case c;
      c.form = form, c.algorithm = algorithm, c.H = 8, c.gva = 4, c.l2 = form != Form::rwkv6;
      if (algorithm == ladle::Algorithm::chunked) c.T = 150, c.K = 64, c.V = 64, c.type = DType::bf16, c.reverse = form == Form::delta;
      check_case(c);
      c.H = 6, c.gva = 2, c.cu_seqlens = {0, 5, 5, 13};
      if (algorithm == ladle::Algorithm::chunked) c.cu_seqlens = {0, 70, 70, 200};
      check_case(c);
    }
  for (ladle::Algorithm algorithm : {ladle::Algorithm::automatic, ladle::Algorithm::chunked}) {
    KdaCase c;
    c.H = 8, c.gva = 4, c.l2 = true, c.sigmoid = true, c.gate_in_kernel = true, c.dt_bias = true, c.algorithm = algorithm;
    if (algorithm == ladle::Algorithm::chunked) c.T = 150, c.K = 64, c.V = 64, c.type = DType::bf16;
    check_kda(c);
  }
}

TEST_CASE("grouped value heads are refused where the heads do not divide, by name", "[ops][update_forms][gva][errors]") {
  using Catch::Matchers::Contains;
  std::mt19937_64 rng(6);
  const auto make = [&](int heads, int features) { return test::normal(rng, DType::f32, {1, 4, heads, features}); };
  const test::Filled q = make(4, 8), k = make(4, 8), v6 = make(6, 8), v8 = make(8, 8), k2 = make(2, 8), k3 = make(3, 8);
  const test::Filled beta8 = test::normal(rng, DType::f32, {1, 4, 8}), beta4 = test::normal(rng, DType::f32, {1, 4, 4});
  ladle::UpdateFormOptions options;
  options.backend = ladle::Backend::cpu;
  CHECK_THROWS_WITH(ladle::delta_rule(q.tensor.view(), k.tensor.view(), v6.tensor.view(), beta8.tensor.view(), options),
                    Contains("delta_rule") && Contains("HV a multiple of H") && Contains("v's 6 heads"));
  CHECK_THROWS_WITH(ladle::delta_rule(q.tensor.view(), k2.tensor.view(), v8.tensor.view(), beta8.tensor.view(), options),
                    Contains("need k with q's heads (4)"));
  CHECK_THROWS_WITH(ladle::delta_rule(q.tensor.view(), k3.tensor.view(), k3.tensor.view(), beta4.tensor.view(), options),
                    Contains("do not divide"));
  CHECK_THROWS_WITH(ladle::delta_rule(q.tensor.view(), k2.tensor.view(), q.tensor.view(), beta4.tensor.view(), options),
                    Contains("k and v share their heads"));
  // beta follows v's heads (the recurrence's) under grouped value heads
  CHECK_THROWS_WITH(ladle::delta_rule(q.tensor.view(), k.tensor.view(), v8.tensor.view(), beta4.tensor.view(), options),
                    Contains("beta has shape") && Contains("[B,T,H] = [1,4,8]"));
  CHECK_NOTHROW(ladle::delta_rule(q.tensor.view(), k.tensor.view(), v8.tensor.view(), beta8.tensor.view(), options));
}

TEST_CASE("kda refuses a gate it cannot form by name", "[ops][update_forms][kda][errors]") {
  using Catch::Matchers::Contains;
  std::mt19937_64 rng(5);
  const test::Filled q = test::normal(rng, DType::f32, {1, 4, 2, 8}), v = test::normal(rng, DType::f32, {1, 4, 2, 8});
  const test::Filled g = test::normal(rng, DType::f32, {1, 4, 2, 8}), beta = test::normal(rng, DType::f32, {1, 4, 2});
  const test::Filled a_log = test::normal(rng, DType::f32, {2});
  ladle::KdaOptions options;
  options.backend = ladle::Backend::cpu;
  options.use_gate_in_kernel = true;
  CHECK_THROWS_WITH(ladle::kda(q.tensor.view(), q.tensor.view(), v.tensor.view(), g.tensor.view(), beta.tensor.view(), options),
                    Contains("kda") && Contains("A_log [H] is required"));
  options.use_gate_in_kernel = false;
  options.A_log = a_log.tensor.view();
  CHECK_THROWS_WITH(ladle::kda(q.tensor.view(), q.tensor.view(), v.tensor.view(), g.tensor.view(), beta.tensor.view(), options),
                    Contains("A_log is given but use_gate_in_kernel is off"));
  options.A_log.reset();
  const test::Filled g_wrong = test::normal(rng, DType::f32, {1, 4, 2});
  CHECK_THROWS_WITH(ladle::kda(q.tensor.view(), q.tensor.view(), v.tensor.view(), g_wrong.tensor.view(), beta.tensor.view(), options),
                    Contains("g has shape"));
  // beta over the features (fla's beta is per head): refused by name, with the shape expected
  const test::Filled beta_features = test::normal(rng, DType::f32, {1, 4, 2, 8});
  CHECK_THROWS_WITH(ladle::kda(q.tensor.view(), q.tensor.view(), v.tensor.view(), g.tensor.view(), beta_features.tensor.view(), options),
                    Contains("kda: beta has shape [1,4,2,8], expected [B,T,H]"));
}
