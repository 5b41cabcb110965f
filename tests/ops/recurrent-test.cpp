// recurrent() on the CPU path against the fp64 reference: every gate combination, reverse,
// packed sequences with initial states and an empty sequence, GQA, K != V, f32/f16/bf16.
#include <catch2/catch.hpp>

#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "reference/recurrent_reference.h"
#include "support/cold_compiles.h"
#include "support/tensors.h"
#include "support/backends.h"
#include <ladle/runtime/background.h>
#include <ladle/runtime/driver.h>


using ladle::DType;
using ladle::Tensor;

namespace {

struct Case {
  int B = 2, T = 9, H = 4, H_kv = 2, K = 8, V = 12;
  int gva = 0;  // grouped value heads: q and k with this many heads, v (and o, the gates, the state) with H
  bool g = false, gk = false, gv = false, g_gamma = false;
  bool gamma_per_batch = false;  // g_gamma [B,H] instead of [H]
  bool reverse = false;
  DType type = DType::f32;
  DType gate_type = DType::f32;
  std::vector<std::int64_t> cu_seqlens;  // packed sequences (then B = 1, T = the last offset)
  bool packed_rank3 = false;             // inputs [T,H,D] instead of [1,T,H,D]
  bool initial_state = false;
  std::optional<float> scale;
  ladle::Algorithm algorithm = ladle::Algorithm::automatic;  // the GPU's family
  std::optional<ladle::cuda::ChunkedTile> chunked_tile;       // the chunked family's tile (else the heuristic)
  std::optional<std::int64_t> segment_tokens;                 // the chunked serial form's segments (else by shape)
  double gate_level = 0;  // not 0: every gate (and g_gamma) within 1 of this per token
  double hard_reset = 0;  // not 0: g, gk, gv take this value (-inf: a hard reset) where reset_at says; g_gamma for head 0

  std::string describe() const {
    std::ostringstream s;
    s << "B=" << B << " T=" << T << " H=" << H << " H_kv=" << H_kv << " gva=" << gva << " K=" << K << " V=" << V << " gates:"
      << (g ? " g" : "") << (gk ? " gk" : "") << (gv ? " gv" : "") << (g_gamma ? (gamma_per_batch ? " g_gamma[B,H]" : " g_gamma[H]") : "")
      << " reverse=" << reverse << " dtype=" << ladle::dtype_name(type)
      << " gates=" << ladle::dtype_name(gate_type) << " varlen=" << cu_seqlens.size()
      << " rank3=" << packed_rank3 << " h0=" << initial_state
      << " algorithm=" << (algorithm == ladle::Algorithm::chunked ? "chunked" : algorithm == ladle::Algorithm::recurrent ? "recurrent" : "auto")
      << " gate_level=" << gate_level << " hard_reset=" << hard_reset
      << " chunked_tile=" << (chunked_tile ? ladle::cuda::to_string(*chunked_tile) : "heuristic")
      << " segment_tokens=" << (segment_tokens ? std::to_string(*segment_tokens) : "auto");
    return s.str();
  }
};

// Where a hard_reset case plants its value: tokens at chunk starts, middles and ends (chunks of
// 16, 32, 64) and runs of consecutive tokens; there, dimensions i with (t + i) % 3 != 1, and all
// of them at tokens 33 and 70-72. t counts along the T axis (packed: across sequences).
bool reset_at(std::int64_t t, std::int64_t i) {
  static const std::int64_t tokens[] = {0, 1, 2, 9, 15, 16, 31, 32, 33, 40, 47, 63, 64, 70, 71, 72, 100, 127, 128, 149};
  bool listed = false;
  for (std::int64_t x : tokens) listed = listed || x == t;
  return listed && ((t + i) % 3 != 1 || t == 33 || (t >= 70 && t <= 72));
}

// Plants c.hard_reset into a [.., T, heads, features] gate (and its fp64 copy).
void plant_resets(const Case& c, test::Filled& gate, std::int64_t heads, std::int64_t features) {
  if (c.hard_reset == 0) return;
  for (std::int64_t e = 0; e < gate.tensor.numel(); ++e)
    if (reset_at(e / (heads * features) % c.T, e % features)) {
      gate.tensor.set(e, static_cast<float>(c.hard_reset));
      gate.values[e] = gate.tensor.get(e);
    }
}

std::uint64_t seed_of(const Case& c) {
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : c.describe()) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

// Runs one case through recurrent_into with NaN-poisoned outputs and compares o and the
// final state with the reference.
void check_case(Case c) {
  if (!c.cu_seqlens.empty()) {
    c.B = 1;
    c.T = static_cast<int>(c.cu_seqlens.back());
  }
  INFO(c.describe());
  std::mt19937_64 rng(seed_of(c));
  const auto token_shape = [&](int heads, int features) {
    if (c.packed_rank3) return std::vector<std::int64_t>{c.T, heads, features};
    return std::vector<std::int64_t>{c.B, c.T, heads, features};
  };
  const int N = c.cu_seqlens.empty() ? c.B : static_cast<int>(c.cu_seqlens.size()) - 1;

  test::Filled q = test::normal(rng, c.type, token_shape(c.gva ? c.gva : c.H, c.K));
  test::Filled k = test::normal(rng, c.type, token_shape(c.gva ? c.gva : c.H_kv, c.K));
  test::Filled v = test::normal(rng, c.type, token_shape(c.gva ? c.H : c.H_kv, c.V));
  reference::Recurrent ref;
  ref.B = c.B, ref.T = c.T, ref.H = c.H, ref.H_kv = c.H_kv, ref.K = c.K, ref.V = c.V, ref.gva_heads = c.gva;
  ref.q = q.values, ref.k = k.values, ref.v = v.values;
  ref.reverse = c.reverse;
  ref.scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.K)));
  ref.cu_seqlens = c.cu_seqlens;

  ladle::RecurrentOptions options;
  options.reverse = c.reverse;
  options.scale = c.scale;
  options.return_state = true;
  options.algorithm = c.algorithm;
  options.chunked_tile = c.chunked_tile;
  options.chunked_segment_tokens = c.segment_tokens;
  std::optional<test::Filled> g, gk, gv, g_gamma, h0;
  std::uniform_real_distribution<double> strong(c.gate_level - 1, c.gate_level + 1);
  const auto gate = [&](std::vector<std::int64_t> shape) {
    if (c.gate_level == 0) return test::log_gate(rng, c.gate_type, std::move(shape));
    return test::filled(c.gate_type, std::move(shape), [&] { return strong(rng); });
  };
  if (c.g) g = gate(token_shape(c.H, c.K)), plant_resets(c, *g, c.H, c.K), options.g = g->tensor.view(), ref.g = g->values;
  if (c.gk) gk = gate(token_shape(c.H, c.K)), plant_resets(c, *gk, c.H, c.K), options.gk = gk->tensor.view(), ref.gk = gk->values;
  if (c.gv) gv = gate(token_shape(c.H, c.V)), plant_resets(c, *gv, c.H, c.V), options.gv = gv->tensor.view(), ref.gv = gv->values;
  if (c.g_gamma) {
    std::uniform_real_distribution<double> decay(c.gate_level == 0 ? -0.3 : c.gate_level - 1, c.gate_level == 0 ? -0.01 : c.gate_level + 1);
    std::vector<std::int64_t> shape = c.gamma_per_batch ? std::vector<std::int64_t>{c.B, c.H} : std::vector<std::int64_t>{c.H};
    g_gamma = test::filled(c.gate_type, shape, [&] { return decay(rng); });
    if (c.hard_reset != 0) g_gamma->tensor.set(0, static_cast<float>(c.hard_reset)), g_gamma->values[0] = g_gamma->tensor.get(0);
    options.g_gamma = g_gamma->tensor.view();
    ref.g_gamma = g_gamma->values;
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

  const reference::RecurrentOutput expected = reference::recurrent(ref);
  for (ladle::Backend backend : test::backends()) {
    options.backend = backend;
    INFO("backend " << (backend == ladle::Backend::gpu ? "gpu" : "cpu"));
    // Poisoned outputs: an element the op does not write stays NaN and fails the comparison.
    std::vector<std::int64_t> o_shape = token_shape(c.H, c.V);
    Tensor o(c.type, o_shape, std::numeric_limits<float>::quiet_NaN());
    Tensor final_state(DType::f32, {N, c.H, c.K, c.V}, std::numeric_limits<float>::quiet_NaN());
    ladle::recurrent_into(q.tensor.view(), k.tensor.view(), v.tensor.view(), options, {o.view(), final_state.view()});

    const double tolerance = test::tolerance(c.type);
    const double o_error = test::relative_error(o, expected.o);
    const double state_error = test::relative_error(final_state, expected.final_state);
    INFO("o error " << o_error << ", final_state error " << state_error);
    CHECK(o_error < tolerance);
    CHECK(state_error < tolerance);

    // A sequence with no tokens leaves its state exactly as it came in.
    for (std::size_t n = 0; n + 1 < c.cu_seqlens.size(); ++n) {
      if (c.cu_seqlens[n] != c.cu_seqlens[n + 1]) continue;
      const std::int64_t size = std::int64_t{c.H} * c.K * c.V;
      for (std::int64_t i = 0; i < size; ++i)
        REQUIRE(final_state.get(n * size + i) == (c.initial_state ? h0->tensor.get(n * size + i) : 0.0f));
    }
  }
}

const DType all_types[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("recurrent matches the fp64 reference for every gate combination, direction and dtype", "[ops][recurrent]") {
  for (DType type : all_types)
    for (unsigned gates = 0; gates < 16; ++gates)
      for (bool reverse : {false, true}) {
        Case c;
        c.type = c.gate_type = type;
        c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
        c.reverse = reverse;
        c.initial_state = gates % 3 == 0;
        check_case(c);
      }
}

TEST_CASE("recurrent handles packed sequences with initial states and an empty sequence", "[ops][recurrent][varlen]") {
  for (DType type : all_types)
    for (bool reverse : {false, true})
      for (bool rank3 : {false, true})
        for (bool h0 : {false, true}) {
          Case c;
          c.type = c.gate_type = type;
          c.cu_seqlens = {0, 5, 5, 12, 13, 20};
          c.packed_rank3 = rank3;
          c.initial_state = h0;
          c.reverse = reverse;
          c.g = c.gv = c.g_gamma = true;
          check_case(c);
        }
}

TEST_CASE("recurrent handles a packed batch of only empty sequences", "[ops][recurrent][varlen]") {
  Case c;
  c.cu_seqlens = {0, 0, 0};
  c.initial_state = true;
  c.gk = true;
  check_case(c);
}

TEST_CASE("recurrent supports GQA and K != V", "[ops][recurrent][gqa]") {
  struct Heads {
    int H, H_kv, K, V;
  };
  for (const Heads& s : {Heads{4, 1, 8, 12}, Heads{4, 2, 12, 4}, Heads{4, 4, 16, 16}, Heads{6, 3, 5, 7}, Heads{3, 1, 1, 3}})
    for (DType type : all_types) {
      Case c;
      c.H = s.H, c.H_kv = s.H_kv, c.K = s.K, c.V = s.V;
      c.type = c.gate_type = type;
      c.g = c.gk = c.gv = c.g_gamma = true;
      c.initial_state = true;
      check_case(c);
    }
}

TEST_CASE("recurrent and chunked take grouped value heads (v with more heads than q and k, fla's GVA)", "[ops][recurrent][gva]") {
  struct Heads {
    int H, gva;
  };
  for (const Heads& s : {Heads{4, 2}, Heads{6, 2}, Heads{4, 1}})
    for (DType type : all_types) {
      Case c;
      c.H = s.H, c.gva = s.gva;
      c.type = c.gate_type = type;
      c.g = c.gk = c.gv = c.g_gamma = true;
      c.initial_state = true;
      check_case(c);
    }
  for (ladle::Algorithm algorithm : {ladle::Algorithm::recurrent, ladle::Algorithm::chunked})
    for (int form = 0; form < 3; ++form) {  // GLA (a key gate), simple GLA (g_gamma), a value gate; packed
      Case c;
      c.algorithm = algorithm;
      c.B = 2, c.T = 150, c.H = 8, c.gva = 4, c.K = 64, c.V = 64;
      c.type = c.gate_type = DType::bf16;
      c.gk = form == 0, c.g_gamma = form == 1, c.gv = form == 2;
      c.initial_state = true, c.reverse = form == 1;
      if (form == 2) c.cu_seqlens = {0, 70, 70, 200};
      check_case(c);
    }
  // The chunked family's other forms, named: split (a state pass, then every chunk at once), segmented
  // (few long sequences), and on sm_90a the warp-specialised form, whose TMA maps are q's, k's and v's own.
  Case c;
  c.algorithm = ladle::Algorithm::chunked;
  c.B = 1, c.T = 600, c.H = 8, c.gva = 4, c.K = 64, c.V = 64;
  c.type = c.gate_type = DType::bf16;
  c.gk = true, c.initial_state = true;
  c.chunked_tile = ladle::cuda::parse_chunked_tile("64,64,64,8,64,64,4");
  check_case(c);
  c.chunked_tile.reset(), c.segment_tokens = 128;
  check_case(c);
  if (ladle::driver_available() && ladle::Device::get().properties().arch() == "sm_90a") {
    ladle::cuda::ChunkedTile ws{64, 64, 64, 8};
    ws.ws = true;
    c.segment_tokens.reset(), c.chunked_tile = ws;
    check_case(c);
  }
}

TEST_CASE("recurrent takes g_gamma per batch, gates in another dtype, and an explicit scale", "[ops][recurrent]") {
  Case c;
  c.g_gamma = c.gamma_per_batch = true;
  c.gk = true;
  check_case(c);
  c.type = DType::bf16;  // 16-bit q, k, v with fp32 gates
  c.gate_type = DType::f32;
  c.scale = 0.5f;
  check_case(c);
  c.type = DType::f32;  // and the other way round
  c.gate_type = DType::f16;
  c.B = 3;
  check_case(c);
}

TEST_CASE("recurrent allocates its outputs and returns the final state only when asked", "[ops][recurrent]") {
  std::mt19937_64 rng(7);
  const auto q = test::normal(rng, DType::f16, {1, 5, 2, 4});
  const auto k = test::normal(rng, DType::f16, {1, 5, 2, 4});
  const auto v = test::normal(rng, DType::f16, {1, 5, 2, 3});
  ladle::RecurrentResult without = ladle::recurrent(q.tensor.view(), k.tensor.view(), v.tensor.view());
  CHECK(without.o.type() == DType::f16);
  CHECK(without.o.shape() == std::vector<std::int64_t>{1, 5, 2, 3});
  CHECK_FALSE(without.final_state.has_value());

  ladle::RecurrentOptions options;
  options.return_state = true;
  ladle::RecurrentResult with = ladle::recurrent(q.tensor.view(), k.tensor.view(), v.tensor.view(), options);
  REQUIRE(with.final_state.has_value());
  CHECK(with.final_state->type() == DType::f32);
  CHECK(with.final_state->shape() == std::vector<std::int64_t>{1, 2, 4, 3});
  CHECK(test::values_of(with.o) == test::values_of(without.o));
}

TEST_CASE("recurrent reads strided views", "[ops][recurrent]") {
  // q, k, v are the first K (or V) features of wider tensors; g is a [B,T,H,K] view whose
  // head axis is the slowest in memory.
  std::mt19937_64 rng(11);
  const int B = 2, T = 6, H = 2, K = 4, V = 3;
  const auto wide_q = test::normal(rng, DType::f32, {B, T, H, 2 * K});
  const auto wide_k = test::normal(rng, DType::f32, {B, T, H, 2 * K});
  const auto wide_v = test::normal(rng, DType::f32, {B, T, H, 2 * V});
  const auto g_hbtk = test::log_gate(rng, DType::f32, {H, B, T, K});
  const auto narrow = [](const ladle::Tensor& t, int features) {
    ladle::TensorView view = t.view();
    view.shape.back() = features;
    return view;
  };
  ladle::TensorView g = g_hbtk.tensor.view();
  g.shape = {B, T, H, K};
  g.strides = {T * K, K, B * T * K, 1};

  reference::Recurrent ref;
  ref.B = B, ref.T = T, ref.H = H, ref.H_kv = H, ref.K = K, ref.V = V;
  ref.scale = 1.0 / std::sqrt(double(K));
  const auto dense = [&](const test::Filled& f, int width, int features) {
    std::vector<double> out;
    for (std::size_t i = 0; i < f.values.size(); ++i)
      if (static_cast<int>(i % width) < features) out.push_back(f.values[i]);
    return out;
  };
  ref.q = dense(wide_q, 2 * K, K), ref.k = dense(wide_k, 2 * K, K), ref.v = dense(wide_v, 2 * V, V);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < K; ++i) ref.g.push_back(g_hbtk.values[((h * B + b) * T + t) * K + i]);

  ladle::RecurrentOptions options;
  options.g = g;
  const auto result = ladle::recurrent(narrow(wide_q.tensor, K), narrow(wide_k.tensor, K), narrow(wide_v.tensor, V), options);
  CHECK(test::relative_error(result.o, reference::recurrent(ref).o) < 1e-5);
}

TEST_CASE("gla is recurrent with g only, and lowers to the same variant", "[ops][gla]") {
  CHECK(ladle::ir::hash(ladle::gla_variant(false)) == ladle::ir::hash(ladle::recurrent_variant(true, false, false, false)));
  CHECK(ladle::ir::hash(ladle::gla_variant(true)) == ladle::ir::hash(ladle::recurrent_variant(true, false, false, true)));
  CHECK(ladle::gla_variant(true).name == "gla");

  for (DType type : all_types) {
    INFO(ladle::dtype_name(type));
    std::mt19937_64 rng(3 + static_cast<int>(type));
    const int B = 1, T = 12, H = 4, H_kv = 2, K = 8, V = 6;
    const auto q = test::normal(rng, type, {B, T, H, K});
    const auto k = test::normal(rng, type, {B, T, H_kv, K});
    const auto v = test::normal(rng, type, {B, T, H_kv, V});
    const auto g = test::log_gate(rng, type, {B, T, H, K});
    const auto gamma = test::filled(DType::f32, {H}, [] { return -0.05; });
    const auto h0 = test::normal(rng, DType::f32, {2, H, K, V});
    const auto cu = [] {
      Tensor t(DType::i32, {3});
      const std::int32_t offsets[] = {0, 7, 12};
      std::memcpy(t.data(), offsets, sizeof offsets);
      return t;
    }();
    ladle::GlaOptions options;
    options.g_gamma = gamma.tensor.view();
    options.initial_state = h0.tensor.view();
    options.cu_seqlens = cu.view();
    options.reverse = true;
    options.return_state = true;
    const auto out = ladle::gla(q.tensor.view(), k.tensor.view(), v.tensor.view(), g.tensor.view(), options);

    reference::Recurrent ref;
    ref.B = B, ref.T = T, ref.H = H, ref.H_kv = H_kv, ref.K = K, ref.V = V;
    ref.q = q.values, ref.k = k.values, ref.v = v.values, ref.g = g.values, ref.g_gamma = gamma.values;
    ref.initial_state = h0.values;
    ref.cu_seqlens = {0, 7, 12};
    ref.reverse = true;
    ref.scale = 1.0 / std::sqrt(double(K));
    const auto expected = reference::recurrent(ref);
    CHECK(test::relative_error(out.o, expected.o) < test::tolerance(type));
    REQUIRE(out.final_state.has_value());
    CHECK(test::relative_error(*out.final_state, expected.final_state) < test::tolerance(type));
  }
}

// The chunked tensor-core family (issue 4): forced with Algorithm::chunked it runs on the GPU
// backend (the CPU backend is the sequential path whatever the algorithm, so on a machine
// without a GPU these cases check the CPU path and the reference at the same sizes).
TEST_CASE("chunked: every gate combination, direction and 16-bit dtype over several chunks", "[ops][chunked]") {
  for (DType type : {DType::f16, DType::bf16})
    for (unsigned gates = 0; gates < 16; ++gates)
      for (bool reverse : {false, true}) {
        Case c;
        c.algorithm = ladle::Algorithm::chunked;
        c.T = 150;
        c.K = 32, c.V = 48;
        c.type = c.gate_type = type;
        c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
        c.reverse = reverse;
        c.initial_state = gates % 3 == 0;
        check_case(c);
      }
}

TEST_CASE("chunked: K and V of 64, 128 and 256, GQA, packed uneven sequences", "[ops][chunked]") {
  for (int dim : {64, 128, 256}) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 200, c.H = 2, c.H_kv = 1, c.K = c.V = dim;
    c.type = DType::bf16;
    c.g = true;
    c.initial_state = true;
    check_case(c);
    c.g = false, c.g_gamma = true;  // simple GLA
    check_case(c);
  }
  for (DType type : {DType::f16, DType::bf16})
    for (bool reverse : {false, true}) {
      Case c;
      c.algorithm = ladle::Algorithm::chunked;
      c.type = c.gate_type = type;
      c.cu_seqlens = {0, 1, 70, 70, 200, 329};
      c.H = 4, c.H_kv = 2, c.K = 64, c.V = 32;
      c.g = c.gv = true;
      c.initial_state = true;
      c.reverse = reverse;
      check_case(c);
    }
}

// The split form (a state pass writing the state entering every chunk, then every chunk's
// output at once) through the op: state tiles that split K, fp32 and bf16 per-chunk states,
// packed sequences with an empty one, GQA, reverse, strong gates (16-token and single-token
// steps inside the output pass). On a GPU machine these run the two generated kernels.
TEST_CASE("chunked: the split form over every gate combination, packed sequences and strong gates", "[ops][chunked][split]") {
  for (unsigned gates = 0; gates < 16; ++gates) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.T = 150;
    c.K = 32, c.V = 48;
    c.type = c.gate_type = gates % 2 ? DType::bf16 : DType::f16;
    c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
    c.reverse = gates % 3 == 1;
    c.initial_state = gates % 3 != 2;
    c.chunked_tile = ladle::cuda::ChunkedTile{32, gates % 4 == 0 ? 32 : 64, 32, 4, 16, 32, 2, gates % 5 == 0};
    check_case(c);
  }
  for (bool reverse : {false, true}) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.type = c.gate_type = DType::bf16;
    c.cu_seqlens = {0, 1, 70, 70, 200, 329};
    c.H = 4, c.H_kv = 2, c.K = 64, c.V = 32;
    c.g = c.gv = true;
    c.initial_state = true;
    c.reverse = reverse;
    c.chunked_tile = ladle::cuda::ChunkedTile{64, 64, 32, 4, 32, 32, 4, reverse};
    check_case(c);
  }
  for (double level : {-2.5, -10.0}) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 1000, c.H = 2, c.H_kv = 2, c.K = 64, c.V = 64;
    c.type = DType::bf16;
    c.g = c.gv = c.g_gamma = true;
    c.gate_level = level;
    c.initial_state = true;
    c.chunked_tile = ladle::cuda::ChunkedTile{64, 64, 64, 8, 64, 64, 4, false};
    check_case(c);
  }
}

TEST_CASE("chunked: the segmented form (few long sequences cut into segments joined through their states)",
          "[ops][chunked][segmented]") {
  for (unsigned gates = 0; gates < 16; ++gates) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.T = 300;
    c.K = 32, c.V = 48;
    c.type = c.gate_type = gates % 2 ? DType::bf16 : DType::f16;
    c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
    c.reverse = gates % 3 == 1;
    c.initial_state = gates % 3 != 2;
    c.segment_tokens = gates % 4 == 0 ? 64 : 100;
    if (gates % 2) c.chunked_tile = ladle::cuda::ChunkedTile{32, 32, 48, 4};
    check_case(c);
  }
  for (bool reverse : {false, true}) {  // packed sequences, an empty one and one shorter than a segment
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.type = c.gate_type = DType::bf16;
    c.cu_seqlens = {0, 1, 170, 170, 400, 529};
    c.H = 4, c.H_kv = 2, c.K = 64, c.V = 32;
    c.g = c.gv = true;
    c.initial_state = true;
    c.reverse = reverse;
    c.segment_tokens = 96;
    check_case(c);
  }
  for (double level : {-2.5, -10.0}) {  // strong gates: the steps' fallbacks inside segments
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 3000, c.H = 2, c.H_kv = 2, c.K = 64, c.V = 64;
    c.type = DType::bf16;
    c.g = c.gv = c.g_gamma = true;
    c.gate_level = level;
    c.initial_state = true;
    c.segment_tokens = 512;
    check_case(c);
  }
  for (int v = 0; v < 4; ++v) {  // bf16 k and v: the state pass in its suffix form, long segments in pieces
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 5000, c.H = 2, c.H_kv = 1;
    c.K = v == 3 ? 112 : 128, c.V = v % 2 ? 96 : 128;
    c.type = DType::bf16;
    c.gate_type = v % 2 ? DType::bf16 : DType::f32;
    c.gk = v < 2, c.g_gamma = v == 1 || v == 2, c.g = v == 3;  // GLA, GLA + g_gamma, g_gamma, a per-token head gate
    c.gate_level = v == 1 ? -2.5 : v == 2 ? -10.0 : 0.0;
    c.reverse = v % 2 == 1;
    c.initial_state = v != 2;
    c.segment_tokens = 2048;
    check_case(c);
  }
  {  // hard resets across segment boundaries
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 400, c.K = 32, c.V = 32;
    c.type = DType::bf16;
    c.g = c.gv = c.g_gamma = true;
    c.hard_reset = -std::numeric_limits<double>::infinity();
    c.initial_state = true;
    c.segment_tokens = 64;
    check_case(c);
  }
}

TEST_CASE("chunked: the state update on wgmma (sm_90a tiles) matches the reference", "[ops][chunked][wgmma]") {
  // On a GPU other than sm_90a a wgmma tile is refused by name; without a GPU the CPU path runs
  // (the generated kernels are checked on the host emulation: codegen-cuda_chunked [wgmma]).
  const bool gpu = ladle::driver_available();
  const bool hopper = gpu && ladle::Device::get().properties().arch() == "sm_90a";
  const auto tile = [](int block_k, int chunk, int block_v, int warps) {
    ladle::cuda::ChunkedTile t{block_k, chunk, block_v, warps};
    t.wgmma = true;
    return t;
  };
  if (gpu && !hopper) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.type = DType::bf16;
    c.K = c.V = 64;
    c.chunked_tile = tile(64, 32, 64, 4);
    REQUIRE_THROWS_WITH(check_case(c), Catch::Contains("wgmma needs the target sm_90a"));
    WARN("this GPU is not sm_90a: the wgmma tiles ran on the host emulation only");
    return;
  }
  if (!gpu) WARN("no GPU: the wgmma kernels ran on the host emulation only (codegen-cuda_chunked [wgmma])");
  for (unsigned gates = 0; gates < 16; ++gates) {  // every gate combination, K = V = 64, 4 warps
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.T = 200;
    c.K = c.V = 64;
    c.type = c.gate_type = gates % 2 ? DType::bf16 : DType::f16;
    c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
    c.reverse = gates % 3 == 1;
    c.initial_state = gates % 3 != 2;
    const int chunks[] = {16, 32, 64};
    c.chunked_tile = tile(64, chunks[gates % 3], gates % 4 == 0 ? 32 : 64, 4);
    check_case(c);
  }
  for (bool reverse : {false, true}) {  // K = V = 128 at the benchmark's tile: GLA and simple GLA, h0
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 333, c.H = 4, c.H_kv = 4, c.K = c.V = 128;
    c.type = c.gate_type = DType::bf16;
    c.g = !reverse, c.g_gamma = reverse;
    c.reverse = reverse;
    c.initial_state = true;
    c.chunked_tile = tile(128, 32, 128, 8);
    check_case(c);
  }
  {  // packed sequences with an empty one, GQA, K != V
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.type = c.gate_type = DType::bf16;
    c.cu_seqlens = {0, 1, 170, 170, 400};
    c.H = 4, c.H_kv = 2, c.K = 64, c.V = 32;
    c.g = c.gv = true;
    c.initial_state = true;
    c.chunked_tile = tile(64, 16, 32, 4);
    check_case(c);
  }
  for (double level : {-2.5, -10.0}) {  // strong gates: 16-token and single-token steps; segments
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 1500, c.H = 2, c.H_kv = 2, c.K = 64, c.V = 64;
    c.type = DType::bf16;
    c.g = c.gv = c.g_gamma = true;
    c.gate_level = level;
    c.initial_state = true;
    c.segment_tokens = 512;
    c.chunked_tile = tile(64, 64, 64, 4);
    check_case(c);
  }
  {  // hard resets
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 150, c.K = 128, c.V = 64;
    c.type = DType::bf16;
    c.g = c.gv = c.g_gamma = true;
    c.hard_reset = -std::numeric_limits<double>::infinity();
    c.initial_state = true;
    c.chunked_tile = tile(128, 32, 64, 8);
    check_case(c);
  }
}

TEST_CASE("chunked: the warp-specialised form (sm_90a ws tiles) matches the reference", "[ops][chunked][ws]") {
  // On a GPU other than sm_90a a ws tile is refused by name; without a GPU the CPU path runs (the
  // generated kernels are checked on the host emulation: codegen-cuda_chunked [ws]).
  const bool gpu = ladle::driver_available();
  const bool hopper = gpu && ladle::Device::get().properties().arch() == "sm_90a";
  const auto tile = [](int K, int V) {
    ladle::cuda::ChunkedTile t{K <= 64 ? 64 : 128, 64, V <= 64 ? 64 : 128, V <= 64 ? 8 : 12};
    t.ws = true;
    return t;
  };
  if (gpu && !hopper) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.type = DType::bf16;
    c.K = c.V = 64;
    c.g_gamma = true;
    c.chunked_tile = tile(64, 64);
    REQUIRE_THROWS_WITH(check_case(c), Catch::Contains("ws needs the target sm_90a"));
    WARN("this GPU is not sm_90a: the ws tiles ran on the host emulation only");
    return;
  }
  if (!gpu) WARN("no GPU: the ws kernels ran on the host emulation only (codegen-cuda_chunked [ws])");
  for (int v = 0; v < 8; ++v) {  // g_gamma or no decay; K, V of 64, 96 and 128; reverse, GQA, h0
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = v % 4 == 3 ? 40 : 333, c.H = 4, c.H_kv = v % 2 ? 2 : 4;
    c.K = v < 4 ? 128 : 64, c.V = v % 3 == 0 ? 128 : v % 3 == 1 ? 96 : 64;
    c.type = DType::bf16;
    c.gate_type = v % 2 ? DType::bf16 : DType::f32;
    c.g_gamma = v != 5;
    c.gamma_per_batch = v == 6;
    c.reverse = v % 3 == 2;
    c.initial_state = v % 4 != 1;
    c.chunked_tile = tile(c.K, c.V);
    check_case(c);
  }
  for (bool reverse : {false, true}) {  // packed sequences with an empty one and one below a chunk
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.type = DType::bf16;
    c.cu_seqlens = {0, 1, 170, 170, 400, 429};
    c.H = 4, c.H_kv = 2, c.K = 128, c.V = 128;
    c.g_gamma = true;
    c.initial_state = true;
    c.reverse = reverse;
    c.chunked_tile = tile(128, 128);
    check_case(c);
  }
  for (double level : {-2.5, -10.0}) {  // strong decay, and segments of a long sequence
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 5000, c.H = 2, c.H_kv = 2, c.K = c.V = 128;
    c.type = DType::bf16;
    c.g_gamma = true;
    c.gate_level = level;
    c.initial_state = true;
    c.segment_tokens = 2048;
    c.chunked_tile = tile(128, 128);
    check_case(c);
  }
  {  // hard resets: g_gamma of -inf for head 0
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 150, c.K = 128, c.V = 64;
    c.type = DType::bf16;
    c.g_gamma = true;
    c.hard_reset = -std::numeric_limits<double>::infinity();
    c.initial_state = true;
    c.chunked_tile = tile(128, 64);
    check_case(c);
  }
}

// The ws form of a gate on one side alone (gk: GLA's g, a gate per key feature; gv: a gate per value
// column, as the recurrences of GLA's backward carry it on their output side), its input in bf16 or
// f16: K, V of 64 and 128, reverse, GQA, h0, T below a chunk, packed sequences; strong decay (the key
// side's 8-token windows and single tokens, the value side's exact per-element sum) over segments;
// hard resets. Off sm_90a the ws tiles are refused (the test above says so); without a GPU the CPU
// path runs.
static void check_ws_gate(bool value_side) {
  const bool gpu = ladle::driver_available();
  if (gpu && ladle::Device::get().properties().arch() != "sm_90a") {
    WARN("this GPU is not sm_90a: the ws tiles of a " << (value_side ? "value" : "key") << "-side gate ran on the host emulation only");
    return;
  }
  const auto tile = [](int K, int V) {
    ladle::cuda::ChunkedTile t{K <= 64 ? 64 : 128, 64, V <= 64 ? 64 : 128, V <= 64 ? 8 : 12};
    t.ws = true;
    return t;
  };
  const auto gated = [&](Case& c) { (value_side ? c.gv : c.g) = true; };
  for (int v = 0; v < 6; ++v) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = v == 3 ? 40 : 333, c.H = 4, c.H_kv = v % 2 ? 2 : 4;
    c.K = v < 3 ? 128 : 64, c.V = v % 2 == 0 ? 128 : 64;
    c.type = DType::bf16;
    c.gate_type = v % 3 == 2 ? DType::f16 : DType::bf16;
    gated(c);
    c.reverse = v % 3 == 1;
    c.initial_state = v != 4;
    if (v == 5) c.cu_seqlens = {0, 1, 170, 170, 400, 429};
    c.chunked_tile = tile(c.K, c.V);
    check_case(c);
  }
  // -1: every value column fits one reference per chunk; -2.5 and -10 take the fallbacks.
  for (double level : value_side ? std::vector<double>{-1.0, -2.5, -10.0} : std::vector<double>{-2.5, -10.0}) {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 5000, c.H = 2, c.H_kv = 2, c.K = c.V = 128;
    c.type = c.gate_type = DType::bf16;
    gated(c);
    c.gate_level = level;
    c.initial_state = true;
    c.reverse = level < -5;
    c.segment_tokens = 2048;
    c.chunked_tile = tile(128, 128);
    check_case(c);
  }
  {
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 2, c.T = 150, c.K = 128, c.V = 128;
    c.type = c.gate_type = DType::bf16;
    gated(c);
    c.hard_reset = -std::numeric_limits<double>::infinity();
    c.initial_state = true;
    c.chunked_tile = tile(128, 128);
    check_case(c);
  }
}

TEST_CASE("chunked: the warp-specialised form of a value-side gate (sm_90a ws tiles) matches the reference",
          "[ops][chunked][ws][ws-value]") {
  check_ws_gate(true);
}

TEST_CASE("chunked: the warp-specialised form of a key-side gate (GLA, sm_90a ws tiles) matches the reference",
          "[ops][chunked][ws][ws-key]") {
  check_ws_gate(false);
}

TEST_CASE("chunked: strong decay (gates near -10 per token) at T = 65536 neither overflows nor loses accuracy", "[ops][chunked][stability]") {
  for (unsigned gates : {1u, 4u, 8u, 15u}) {  // g, gv, g_gamma, all
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.B = 1, c.T = 65536, c.H = 2, c.H_kv = 2, c.K = 16, c.V = 16;
    c.type = DType::bf16;
    c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
    c.gate_level = -10;
    c.initial_state = true;
    check_case(c);
  }
  Case c;  // moderate: 16-token steps
  c.algorithm = ladle::Algorithm::chunked;
  c.B = 1, c.T = 4096, c.H = 2, c.K = 64, c.V = 64;
  c.type = DType::bf16;
  c.g = c.gv = true;
  c.gate_level = -2.5;
  check_case(c);
}

// A cold call (runtime/background.h): the fused recurrent kernel runs it while the chunked kernels
// compile behind it; the calls after those compiles run the chunked kernels. Both results against the
// reference. A fresh -D in LADLE_NVRTC_FLAGS (part of every cache key) makes every compile cold, so
// that the test cache of an earlier run cannot hide the path.
TEST_CASE("a cold chunked call: the interim recurrent kernel's result and the chunked kernels' after it match the reference",
          "[ops][chunked][background]") {
  if (!ladle::test::background_gpu()) return;
  const ladle::test::ColdCompiles cold;
  std::mt19937_64 rng(std::random_device{}());
  const int B = 2, T = 333, H = 4, K = 64, V = 64;
  test::Filled q = test::normal(rng, DType::bf16, {B, T, H, K}), k = test::normal(rng, DType::bf16, {B, T, H, K});
  test::Filled v = test::normal(rng, DType::bf16, {B, T, H, V}), g = test::log_gate(rng, DType::bf16, {B, T, H, K});
  reference::Recurrent ref;
  ref.B = B, ref.T = T, ref.H = H, ref.H_kv = H, ref.K = K, ref.V = V;
  ref.q = q.values, ref.k = k.values, ref.v = v.values, ref.gk = g.values;
  ref.scale = 1.0 / std::sqrt(static_cast<double>(K));
  const reference::RecurrentOutput expected = reference::recurrent(ref);
  ladle::RecurrentOptions options;
  options.gk = g.tensor.view();
  options.return_state = true;
  options.backend = ladle::Backend::gpu;
  ladle::BackgroundCompiles& jobs = ladle::BackgroundCompiles::global();
  const int started = jobs.started();
  for (int call = 0; call < 2; ++call) {
    INFO("call " << call);
    Tensor o(DType::bf16, {B, T, H, V}, std::numeric_limits<float>::quiet_NaN());
    Tensor final_state(DType::f32, {B, H, K, V}, std::numeric_limits<float>::quiet_NaN());
    ladle::recurrent_into(q.tensor.view(), k.tensor.view(), v.tensor.view(), options, {o.view(), final_state.view()});
    CHECK(jobs.started() == started + 1);  // the first call started the chunked kernels' compile; the second none
    CHECK(test::relative_error(o, expected.o) < test::tolerance(DType::bf16));
    CHECK(test::relative_error(final_state, expected.final_state) < test::tolerance(DType::bf16));
    ladle::finish_background_compiles();  // before the flags go: the job reads them
  }
}

TEST_CASE("chunked: bad requests are refused by name", "[ops][chunked]") {
  std::mt19937_64 rng(11);
  const auto q = test::normal(rng, DType::bf16, {1, 80, 2, 300});
  const auto v = test::normal(rng, DType::bf16, {1, 80, 2, 16});
  ladle::RecurrentOptions options;
  options.algorithm = ladle::Algorithm::chunked;
  options.backend = ladle::Backend::gpu;
  // Checked on the host before any device work, so it holds with or without a GPU.
  REQUIRE_THROWS_WITH(ladle::recurrent(q.tensor.view(), q.tensor.view(), v.tensor.view(), options),
                      Catch::Contains("algorithm chunked: K = 300, expected at most 256"));
}

// Hard resets: a log gate of -inf wipes the state at its token (exp(-inf) = 0), in the
// dimensions it covers; so does a finite gate below what fp32 tells apart from -inf after exp.
// The chunked kernel once gave NaN there ((-inf) - (-inf) in its cumulative gates), and the ops
// choose it by themselves for 16-bit inputs with 64 tokens or more.
TEST_CASE("the fp64 reference wipes the state at a gate of -inf", "[ops][recurrent][reset]") {
  std::mt19937_64 rng(5);
  const int T = 6, K = 3, V = 2, r = 3;  // every dimension of token r resets
  reference::Recurrent ref;
  ref.T = T, ref.K = K, ref.V = V;
  ref.q = test::normal(rng, DType::f32, {1, T, 1, K}).values;
  ref.k = test::normal(rng, DType::f32, {1, T, 1, K}).values;
  ref.v = test::normal(rng, DType::f32, {1, T, 1, V}).values;
  ref.g = test::log_gate(rng, DType::f32, {1, T, 1, K}).values;
  ref.gv = test::log_gate(rng, DType::f32, {1, T, 1, V}).values;
  ref.initial_state = test::normal(rng, DType::f32, {1, 1, K, V}).values;
  for (int i = 0; i < K; ++i) ref.g[r * K + i] = -std::numeric_limits<double>::infinity();
  const reference::RecurrentOutput out = reference::recurrent(ref);
  for (double x : out.o) REQUIRE(std::isfinite(x));
  for (int j = 0; j < V; ++j) {  // o_r = (scale q_r . k_r) v_r: nothing from before r
    double qk = 0;
    for (int i = 0; i < K; ++i) qk += ref.q[r * K + i] * ref.k[r * K + i];
    CHECK(out.o[r * V + j] == Approx(qk * ref.v[r * V + j]).epsilon(1e-12));
  }
  // Tokens before r and the initial state change nothing from r on.
  reference::Recurrent other = ref;
  for (int t = 0; t < r; ++t)
    for (int i = 0; i < K; ++i) other.k[t * K + i] += 1.0;
  for (double& x : other.initial_state) x = -x;
  const reference::RecurrentOutput again = reference::recurrent(other);
  for (int t = r; t < T; ++t)
    for (int j = 0; j < V; ++j) CHECK(again.o[t * V + j] == out.o[t * V + j]);
  CHECK(again.final_state == out.final_state);
}

TEST_CASE("chunked: hard resets (gates of -inf, or finite below fp32's reach) wipe the state exactly", "[ops][chunked][reset]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType type : {DType::f16, DType::bf16})
    for (unsigned gates : {1u, 4u, 8u, 9u, 15u})  // g, gv, g_gamma (head 0: every token), g and g_gamma, all
      for (bool reverse : {false, true}) {
        Case c;
        c.algorithm = ladle::Algorithm::chunked;
        c.T = 150;
        c.K = 32, c.V = 48;
        c.type = c.gate_type = type;
        c.g = gates & 1, c.gk = gates & 2, c.gv = gates & 4, c.g_gamma = gates & 8;
        c.reverse = reverse;
        c.initial_state = true;
        c.hard_reset = -inf;
        check_case(c);
      }
  for (double value : {-1e4, -300.0}) {  // finite: below the kernel's floor (-256 in log2, about -177)
    Case c;
    c.algorithm = ladle::Algorithm::chunked;
    c.T = 150;
    c.K = 32, c.V = 48;
    c.type = DType::bf16;
    c.gate_type = DType::f32;
    c.g = c.gv = c.g_gamma = true;
    c.initial_state = true;
    c.hard_reset = value;
    check_case(c);
  }
  Case c;  // packed sequences: resets at sequence starts, middles and ends
  c.algorithm = ladle::Algorithm::chunked;
  c.type = c.gate_type = DType::bf16;
  c.cu_seqlens = {0, 1, 70, 70, 150};
  c.H = 4, c.H_kv = 2, c.K = 64, c.V = 32;
  c.g = c.gv = true;
  c.initial_state = true;
  c.hard_reset = -inf;
  check_case(c);
}
