// Context parallelism (ops/context_parallel.h) with ranks as threads (runtime/communicator.h's
// ThreadGroup): the sequence cut into slices, each rank's call on its own slice, the slices'
// outputs and gradients put back together and held against the whole call on one rank (and the
// forward against the fp64 oracle): the fold's algebra (slices folded equal the whole sequence) for
// batch rows and packed sequences that cross any number of rank boundaries, both directions, initial
// and final states, every gate kind, RWKV6's read before the update. Then misuse: every rank gets
// the same clear error. On a machine with a GPU the same runs on one device cut into ranks.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/context_parallel.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/update_forms.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "reference/attention_reference.h"
#include "reference/recurrent_reference.h"
#include "support/backends.h"
#include "support/tensors.h"

using ladle::DType;
using ladle::Location;
using ladle::Tensor;
using ladle::TensorView;
namespace ir = ladle::ir;
namespace cp = ladle::context_parallel;

namespace {

// One call cut into slices: the whole tensors on the host (f32 values of the test's dtype), and
// which of them are cut along the tokens.
struct Call {
  const ir::Variant* variant = nullptr;
  DType type = DType::f32;
  std::int64_t B = 2, T = 0, H = 2, K = 16, V = 8;
  std::vector<std::int64_t> cu;  // packed: q [T,H,K], B = 1
  bool reverse = false, initial_state = false, return_state = false;
  std::map<std::string, Tensor> tensors;     // q, k, v and every named input
  std::map<std::string, bool> per_token;     // cut along the tokens
  std::map<std::string, float> scalars;
  std::optional<Tensor> h0;
};

int token_axis(const Call& c) { return c.cu.empty() ? 1 : 0; }

// Tokens [lo, hi) of a host tensor along `axis`.
Tensor slice(const Tensor& t, int axis, std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> shape = t.shape();
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const std::int64_t T = shape[axis];
  shape[axis] = hi - lo;
  Tensor out(t.type(), shape);
  const std::size_t esize = ladle::dtype_size(t.type());
  for (std::int64_t o = 0; o < outer; ++o)
    std::memcpy(static_cast<std::byte*>(out.data()) + o * (hi - lo) * inner * esize,
                static_cast<const std::byte*>(t.data()) + (o * T + lo) * inner * esize, (hi - lo) * inner * esize);
  return out;
}

// The slices put back together along `axis`.
std::vector<double> join(const std::vector<Tensor>& parts, int axis) {
  std::vector<std::int64_t> shape = parts[0].shape();
  std::int64_t outer = 1, inner = 1, T = 0;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  for (const Tensor& p : parts) T += p.shape()[axis];
  std::vector<double> out(static_cast<std::size_t>(outer * T * inner));
  std::int64_t at = 0;
  for (const Tensor& p : parts) {
    const std::int64_t t = p.shape()[axis];
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < t * inner; ++i) out[(o * T + at) * inner + i] = p.get(o * t * inner + i);
    at += t;
  }
  return out;
}

Call make_call(const ir::Variant& variant, std::mt19937_64& rng, DType type, std::int64_t B, std::int64_t T,
               std::vector<std::int64_t> cu, bool reverse, bool with_states, std::int64_t K = 16, std::int64_t V = 8) {
  Call c;
  c.K = K, c.V = V;
  c.variant = &variant, c.type = type, c.B = cu.empty() ? B : 1, c.T = T, c.cu = std::move(cu), c.reverse = reverse;
  c.initial_state = c.return_state = with_states;
  const bool packed = !c.cu.empty();
  const auto token_shape = [&](std::int64_t D) {
    return packed ? std::vector<std::int64_t>{T, c.H, D} : std::vector<std::int64_t>{c.B, T, c.H, D};
  };
  c.tensors.emplace("q", test::normal(rng, type, token_shape(c.K), 0.5).tensor);
  c.tensors.emplace("k", test::normal(rng, type, token_shape(c.K), 0.5).tensor);
  c.tensors.emplace("v", test::normal(rng, type, token_shape(c.V)).tensor);
  for (const ir::Input& in : variant.inputs) {
    if (in.role != ir::Role::other) continue;
    switch (in.kind) {
      case ir::InputKind::token_key:
        c.tensors.emplace(in.name, test::log_gate(rng, type, token_shape(c.K)).tensor), c.per_token[in.name] = true;
        break;
      case ir::InputKind::token_value:
        c.tensors.emplace(in.name, test::log_gate(rng, type, token_shape(c.V)).tensor), c.per_token[in.name] = true;
        break;
      case ir::InputKind::token_head: {
        const std::vector<std::int64_t> shape = packed ? std::vector<std::int64_t>{T, c.H} : std::vector<std::int64_t>{c.B, T, c.H};
        std::uniform_real_distribution<double> unit(0.1, 0.9);
        c.tensors.emplace(in.name, in.name == "beta" ? test::filled(type, shape, [&] { return unit(rng); }).tensor
                                                      : test::log_gate(rng, type, shape).tensor);
        c.per_token[in.name] = true;
        break;
      }
      case ir::InputKind::head: c.tensors.emplace(in.name, test::log_gate(rng, DType::f32, {c.H}).tensor); break;
      case ir::InputKind::head_key: c.tensors.emplace(in.name, test::normal(rng, DType::f32, {c.H, c.K}, 0.5).tensor); break;
      case ir::InputKind::scalar: c.scalars[in.name] = 0.25f; break;
      default: FAIL("an input kind the test does not make: " << in.name);
    }
  }
  c.per_token["q"] = c.per_token["k"] = c.per_token["v"] = true;
  const std::int64_t N = packed ? static_cast<std::int64_t>(c.cu.size()) - 1 : c.B;
  if (with_states) c.h0 = test::normal(rng, DType::f32, {N, c.H, c.K, c.V}, 0.5).tensor;
  return c;
}

// The tensors of one rank (its tokens [lo, hi)), at `where`.
struct Rank {
  std::map<std::string, Tensor> tensors;
  ladle::VariantInputs inputs;
  TensorView q, k, v;
};
Rank rank_tensors(const Call& c, std::int64_t lo, std::int64_t hi, Location where) {
  Rank r;
  for (const auto& [name, t] : c.tensors) {
    Tensor part = c.per_token.count(name) && c.per_token.at(name) ? slice(t, token_axis(c), lo, hi) : t;
    r.tensors.emplace(name, where.is_device() ? part.to(where) : part);
  }
  r.q = r.tensors.at("q").view(), r.k = r.tensors.at("k").view(), r.v = r.tensors.at("v").view();
  for (const auto& [name, t] : r.tensors)
    if (name != "q" && name != "k" && name != "v") r.inputs.tensors.emplace(name, t.view());
  r.inputs.scalars = c.scalars;
  return r;
}

ladle::RunOptions options_of(const Call& c, std::optional<Tensor>& h0, std::optional<Tensor>& cu, Location where) {
  ladle::RunOptions o;
  o.reverse = c.reverse;
  o.return_state = c.return_state;
  o.backend = where.is_device() ? ladle::Backend::gpu : ladle::Backend::cpu;
  if (c.h0) h0 = where.is_device() ? c.h0->to(where) : *c.h0, o.initial_state = h0->view();
  if (!c.cu.empty()) {
    cu.emplace(DType::i64, std::vector<std::int64_t>{static_cast<std::int64_t>(c.cu.size())});
    std::memcpy(cu->data(), c.cu.data(), c.cu.size() * 8);
    o.cu_seqlens = cu->view();
  }
  return o;
}

// Each rank on its own thread; the first exception of each rank.
template <class F>
std::vector<std::string> on_ranks(int P, F&& f) {
  std::vector<std::string> errors(static_cast<std::size_t>(P));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<double> values(const Tensor& t) { return test::values_of(t.location().is_device() ? t.to(Location::host()) : t); }

struct Compared {
  double o = 0, final_state = 0;  // the slices' against the whole call's
  // Against the fp64 oracle (recurrent_variant calls): the slices' and the whole call's errors.
  double o_cut = 0, o_whole = 0, final_cut = 0, final_whole = 0;
};

reference::RecurrentOutput oracle_of(const Call& c);

// The call cut at `cuts` (the ranks' first tokens after rank 0's, so P = cuts.size() + 1), against the
// whole call.
Compared forward_cut(const Call& c, const std::vector<std::int64_t>& cuts, Location where) {
  const int P = static_cast<int>(cuts.size()) + 1;
  std::vector<std::int64_t> starts{0};
  starts.insert(starts.end(), cuts.begin(), cuts.end());
  starts.push_back(c.T);
  ladle::ThreadGroup group(P, where);
  std::vector<Tensor> o(static_cast<std::size_t>(P)), finals(static_cast<std::size_t>(P));
  const auto errors = on_ranks(P, [&](int r) {
    Rank mine = rank_tensors(c, starts[r], starts[r + 1], where);
    std::optional<Tensor> h0, cu;
    const ladle::RunOptions options = options_of(c, h0, cu, where);
    ladle::RecurrentResult result = cp::run_variant(*c.variant, mine.q, mine.k, mine.v, mine.inputs, options, group.rank(r));
    if (where.is_device()) ladle::Device::get().synchronize();
    o[r] = result.o.location().is_device() ? result.o.to(Location::host()) : result.o;
    if (result.final_state) finals[r] = result.final_state->location().is_device() ? result.final_state->to(Location::host()) : *result.final_state;
  });
  for (int r = 0; r < P; ++r) REQUIRE(errors[r] == "");
  // The whole call on one rank.
  Rank whole = rank_tensors(c, 0, c.T, where);
  std::optional<Tensor> h0, cu;
  const ladle::RunOptions options = options_of(c, h0, cu, where);
  ladle::RecurrentResult single = ladle::run_variant(*c.variant, whole.q, whole.k, whole.v, whole.inputs, options);
  Compared out;
  out.o = test::relative_error(join(o, token_axis(c)), values(single.o));
  if (c.return_state)
    for (int r = 0; r < P; ++r) out.final_state = std::max(out.final_state, test::relative_error(values(finals[r]), values(*single.final_state)));
  if (c.scalars.count("scale") && c.variant->name == "recurrent") {
    const reference::RecurrentOutput ref = oracle_of(c);
    out.o_cut = test::relative_error(join(o, token_axis(c)), ref.o), out.o_whole = test::relative_error(values(single.o), ref.o);
    if (c.return_state) {
      out.final_whole = test::relative_error(values(*single.final_state), ref.final_state);
      for (int r = 0; r < P; ++r) out.final_cut = std::max(out.final_cut, test::relative_error(values(finals[r]), ref.final_state));
    }
  }
  return out;
}

// The fp64 oracle of a recurrent_variant call.
reference::RecurrentOutput oracle_of(const Call& c) {
  reference::Recurrent p;
  p.B = static_cast<int>(c.B), p.T = static_cast<int>(c.T), p.H = p.H_kv = static_cast<int>(c.H), p.K = static_cast<int>(c.K),
  p.V = static_cast<int>(c.V);
  p.q = test::values_of(c.tensors.at("q")), p.k = test::values_of(c.tensors.at("k")), p.v = test::values_of(c.tensors.at("v"));
  if (c.tensors.count("g")) p.g = test::values_of(c.tensors.at("g"));
  if (c.tensors.count("gk")) p.gk = test::values_of(c.tensors.at("gk"));
  if (c.tensors.count("gv")) p.gv = test::values_of(c.tensors.at("gv"));
  if (c.tensors.count("g_gamma")) p.g_gamma = test::values_of(c.tensors.at("g_gamma"));
  p.scale = c.scalars.at("scale");
  if (c.h0) p.initial_state = test::values_of(*c.h0);
  p.cu_seqlens = c.cu;
  p.reverse = c.reverse;
  return reference::recurrent(p);
}
std::vector<double> oracle(const Call& c) { return oracle_of(c).o; }

struct GradErrors {
  std::map<std::string, double> error;  // by gradient name
};

// f32 gradients for every tensor of `r` (and h0's where the call has one), at `where`, and their views.
ladle::RecurrentGradientViews gradient_views(const Call& c, const Rank& r, Location where, std::map<std::string, Tensor>& grads,
                                             std::optional<Tensor>& g_h0) {
  for (const auto& [name, t] : r.tensors) grads.emplace(name, Tensor(DType::f32, t.shape(), where));
  if (c.h0) g_h0.emplace(DType::f32, c.h0->shape(), where);
  ladle::RecurrentGradientViews views{grads.at("q").view(), grads.at("k").view(), grads.at("v").view(), {}, std::nullopt};
  for (const auto& [name, t] : grads)
    if (name != "q" && name != "k" && name != "v") views.inputs.emplace(name, t.view());
  if (g_h0) views.d_initial_state = g_h0->view();
  return views;
}

// The backward cut at `cuts` against the whole call's backward, with fresh d_output (and d_final_state
// where the call has states).
GradErrors backward_cut(const Call& c, const std::vector<std::int64_t>& cuts, Location where, std::mt19937_64& rng) {
  const int P = static_cast<int>(cuts.size()) + 1;
  std::vector<std::int64_t> starts{0};
  starts.insert(starts.end(), cuts.begin(), cuts.end());
  starts.push_back(c.T);
  const bool packed = !c.cu.empty();
  const std::vector<std::int64_t> o_shape =
      packed ? std::vector<std::int64_t>{c.T, c.H, c.V} : std::vector<std::int64_t>{c.B, c.T, c.H, c.V};
  const Tensor d_o = test::normal(rng, c.type, o_shape).tensor;
  std::optional<Tensor> d_final;
  if (c.h0) d_final = test::normal(rng, DType::f32, c.h0->shape()).tensor;
  std::map<std::string, std::vector<Tensor>> parts;  // per gradient, per rank
  std::vector<Tensor> d_h0(static_cast<std::size_t>(P));
  ladle::ThreadGroup group(P, where);
  const auto to_host = [](const Tensor& t) { return t.location().is_device() ? t.to(Location::host()) : t; };
  for (const auto& [name, t] : c.tensors) parts[name].resize(static_cast<std::size_t>(P));
  const auto errors = on_ranks(P, [&](int r) {
    Rank mine = rank_tensors(c, starts[r], starts[r + 1], where);
    std::optional<Tensor> h0, cu;
    const ladle::RunOptions options = options_of(c, h0, cu, where);
    Tensor my_do = slice(d_o, token_axis(c), starts[r], starts[r + 1]);
    if (where.is_device()) my_do = my_do.to(where);
    std::optional<Tensor> my_final;
    if (d_final) my_final = where.is_device() ? d_final->to(where) : *d_final;
    std::map<std::string, Tensor> grads;
    std::optional<Tensor> g_h0;
    const ladle::RecurrentGradientViews views = gradient_views(c, mine, where, grads, g_h0);
    cp::run_variant_backward_into(*c.variant, mine.q, mine.k, mine.v, mine.inputs, options, my_do.view(),
                                  my_final ? std::optional<TensorView>(my_final->view()) : std::nullopt, views, group.rank(r));
    if (where.is_device()) ladle::Device::get().synchronize();
    for (const auto& [name, t] : grads) parts[name][r] = to_host(t);
    if (g_h0) d_h0[r] = to_host(*g_h0);
  });
  for (int r = 0; r < P; ++r) REQUIRE(errors[r] == "");
  // The whole call's backward.
  Rank whole = rank_tensors(c, 0, c.T, where);
  std::optional<Tensor> h0, cu;
  const ladle::RunOptions options = options_of(c, h0, cu, where);
  std::map<std::string, Tensor> grads;
  std::optional<Tensor> g_h0;
  const ladle::RecurrentGradientViews views = gradient_views(c, whole, where, grads, g_h0);
  const Tensor whole_do = where.is_device() ? d_o.to(where) : d_o;
  std::optional<Tensor> whole_final;
  if (d_final) whole_final = where.is_device() ? d_final->to(where) : *d_final;
  ladle::run_variant_backward_into(*c.variant, whole.q, whole.k, whole.v, whole.inputs, options, whole_do.view(),
                                   whole_final ? std::optional<TensorView>(whole_final->view()) : std::nullopt, views);
  GradErrors out;
  for (const auto& [name, ranks] : parts) {
    const bool cut = c.per_token.count(name) && c.per_token.at(name);
    const std::vector<double> ref = values(grads.at(name));
    double worst = 0;
    if (cut) worst = test::relative_error(join(ranks, token_axis(c)), ref);
    else
      for (const Tensor& t : ranks) worst = std::max(worst, test::relative_error(values(t), ref));  // every rank holds the sum
    out.error[name] = worst;
  }
  if (c.h0)
    for (const Tensor& t : d_h0) out.error["initial_state"] = std::max(out.error["initial_state"], test::relative_error(values(t), values(*g_h0)));
  return out;
}

// The cut call's errors against the fp64 oracle beside the whole call's own (o and final state).
void check_beside_whole(const Compared& e) {
  INFO("o: cut " << e.o_cut << ", whole " << e.o_whole << "; final state: cut " << e.final_cut << ", whole " << e.final_whole);
  CHECK(e.o_cut < 1.5 * e.o_whole + 1e-4);
  CHECK(e.final_cut < 1.5 * e.final_whole + 1e-4);
}

void check_within(const GradErrors& e, double tolerance) {
  for (const auto& [name, error] : e.error) {
    INFO("the gradient of " << name << ": relative error " << error);
    CHECK(error < tolerance);
  }
}

}  // namespace

TEST_CASE("context parallel: slices folded equal the whole sequence (CPU, every gate kind, both directions)", "[context_parallel]") {
  std::mt19937_64 rng(20261127);
  struct Gates {
    bool g, gk, gv, g_gamma;
  };
  for (const Gates gates : {Gates{true, false, false, false}, Gates{false, false, true, true}, Gates{true, true, true, true},
                            Gates{false, false, false, false}}) {
    for (const bool reverse : {false, true}) {
      const ir::Variant& variant = ladle::recurrent_variant(gates.g, gates.gk, gates.gv, gates.g_gamma);
      INFO("gates g " << gates.g << " gk " << gates.gk << " gv " << gates.gv << " g_gamma " << gates.g_gamma << ", reverse " << reverse);
      const Call c = make_call(variant, rng, DType::f32, 2, 61, {}, reverse, true);
      for (const std::vector<std::int64_t>& cuts : {std::vector<std::int64_t>{30}, {7, 40, 41}}) {
        INFO(cuts.size() + 1 << " ranks");
        const Compared e = forward_cut(c, cuts, Location::host());
        CHECK(e.o < 2e-6);
        CHECK(e.final_state < 2e-6);
        CHECK(e.o_cut < 1e-5);
        CHECK(e.final_cut < 1e-5);
      }
      // And against the fp64 oracle.
      const Compared e = forward_cut(c, {20}, Location::host());
      CHECK(e.o < 2e-6);
      Rank whole = rank_tensors(c, 0, c.T, Location::host());
      ladle::ThreadGroup group(3);
      std::vector<Tensor> o(3);
      const std::vector<std::int64_t> starts{0, 9, 33, c.T};
      const auto errors = on_ranks(3, [&](int r) {
        Rank mine = rank_tensors(c, starts[r], starts[r + 1], Location::host());
        std::optional<Tensor> h0, cu;
        o[r] = cp::run_variant(variant, mine.q, mine.k, mine.v, mine.inputs, options_of(c, h0, cu, Location::host()), group.rank(r)).o;
      });
      for (const auto& error : errors) REQUIRE(error == "");
      CHECK(test::relative_error(join(o, 1), oracle(c)) < 1e-5);
    }
  }
}

TEST_CASE("context parallel: packed sequences across rank boundaries, an empty one, a sequence over three ranks", "[context_parallel]") {
  std::mt19937_64 rng(7);
  // 5 sequences over 70 tokens: [0,12) [12,12) [12,50) [50,51) [51,70); cut at 10, 30, 45, 60: sequence 2
  // spans ranks 1, 2 and 3, sequence 0 crosses 0 | 1, sequence 4 crosses 3 | 4.
  const std::vector<std::int64_t> cu{0, 12, 12, 50, 51, 70};
  for (const bool reverse : {false, true}) {
    for (const bool states : {true, false}) {
      INFO("reverse " << reverse << ", states " << states);
      const Call c = make_call(ladle::recurrent_variant(true, false, true, false), rng, DType::f32, 1, 70, cu, reverse, states);
      const Compared e = forward_cut(c, {10, 30, 45, 60}, Location::host());
      CHECK(e.o < 2e-6);
      CHECK(e.final_state < 2e-6);
      // A cut exactly at a sequence's start, and at the empty sequence.
      const Compared at = forward_cut(c, {12, 50}, Location::host());
      CHECK(at.o < 2e-6);
      CHECK(at.final_state < 2e-6);
      // Against the oracle through a four-way cut.
      ladle::ThreadGroup group(4);
      std::vector<Tensor> o(4);
      const std::vector<std::int64_t> starts{0, 5, 20, 55, 70};
      const auto errors = on_ranks(4, [&](int r) {
        Rank mine = rank_tensors(c, starts[r], starts[r + 1], Location::host());
        std::optional<Tensor> h0, cuv;
        o[r] = cp::run_variant(*c.variant, mine.q, mine.k, mine.v, mine.inputs, options_of(c, h0, cuv, Location::host()), group.rank(r)).o;
      });
      for (const auto& error : errors) REQUIRE(error == "");
      CHECK(test::relative_error(join(o, 0), oracle(c)) < 1e-5);
    }
  }
}

TEST_CASE("context parallel: one rank, and GQA's shared key/value heads", "[context_parallel]") {
  std::mt19937_64 rng(61);
  const Call c = make_call(ladle::recurrent_variant(true, false, false, false), rng, DType::f32, 2, 33, {}, true, true);
  const Compared one = forward_cut(c, {}, Location::host());  // a group of one: the whole call
  CHECK(one.o < 1e-7);
  CHECK(one.final_state < 1e-7);
  // q with 4 heads, k and v with 2 (each serves two query heads).
  const std::int64_t B = 1, T = 40, H = 4, Hkv = 2, K = 16, V = 8;
  const Tensor q = test::normal(rng, DType::f32, {B, T, H, K}).tensor, k = test::normal(rng, DType::f32, {B, T, Hkv, K}).tensor;
  const Tensor v = test::normal(rng, DType::f32, {B, T, Hkv, V}).tensor, g = test::log_gate(rng, DType::f32, {B, T, H, K}).tensor;
  ladle::GlaOptions options;
  options.backend = ladle::Backend::cpu, options.return_state = true;
  ladle::ThreadGroup group(3);
  std::vector<Tensor> o(3), finals(3);
  const std::vector<std::int64_t> starts{0, 13, 14, T};
  const auto errors = on_ranks(3, [&](int r) {
    const Tensor qs = slice(q, 1, starts[r], starts[r + 1]), ks = slice(k, 1, starts[r], starts[r + 1]);
    const Tensor vs = slice(v, 1, starts[r], starts[r + 1]), gs = slice(g, 1, starts[r], starts[r + 1]);
    ladle::RecurrentResult out = cp::gla(qs.view(), ks.view(), vs.view(), gs.view(), options, group.rank(r));
    o[r] = out.o, finals[r] = *out.final_state;
  });
  for (const auto& e : errors) REQUIRE(e == "");
  const ladle::RecurrentResult whole = ladle::gla(q.view(), k.view(), v.view(), g.view(), options);
  CHECK(test::relative_error(join(o, 1), values(whole.o)) < 2e-6);
  for (const Tensor& f : finals) CHECK(test::relative_error(values(f), values(*whole.final_state)) < 2e-6);
}

TEST_CASE("context parallel: RWKV6's read before the update with its bonus", "[context_parallel]") {
  std::mt19937_64 rng(11);
  const Call c = make_call(ladle::rwkv6_variant(), rng, DType::f32, 2, 50, {}, false, true);
  const Compared e = forward_cut(c, {17, 33}, Location::host());
  CHECK(e.o < 2e-6);
  CHECK(e.final_state < 2e-6);
}

TEST_CASE("context parallel: the update forms (delta rule, gated delta rule, KDA) fold K x K transitions (CPU)",
          "[context_parallel][update_forms]") {
  std::mt19937_64 rng(29);
  for (const char* op : {"delta_rule", "gated_delta_rule", "kda"}) {
    for (const bool reverse : {false, true}) {
      INFO(op << ", reverse " << reverse);
      const ir::Variant& variant = ladle::named_variant(op, "l2norm");
      const Call c = make_call(variant, rng, DType::f32, 2, 45, {}, reverse, true);
      const Compared e = forward_cut(c, {11, 30}, Location::host());
      CHECK(e.o < 2e-5);
      CHECK(e.final_state < 2e-5);
      const Call packed = make_call(variant, rng, DType::f32, 1, 50, {0, 18, 18, 50}, reverse, true);
      const Compared f = forward_cut(packed, {10, 25, 40}, Location::host());
      CHECK(f.o < 2e-5);
      CHECK(f.final_state < 2e-5);
      const GradErrors g = backward_cut(c, {20}, Location::host(), rng);
      check_within(g, 5e-5);
    }
  }
}

TEST_CASE("context parallel: gradients of the slices equal the whole call's (CPU)", "[context_parallel][backward]") {
  std::mt19937_64 rng(3);
  SECTION("GLA with g_gamma, batch rows, three ranks, both directions") {
    for (const bool reverse : {false, true}) {
      INFO("reverse " << reverse);
      const Call c = make_call(ladle::recurrent_variant(true, false, false, true), rng, DType::f32, 2, 40, {}, reverse, true);
      const GradErrors e = backward_cut(c, {13, 29}, Location::host(), rng);
      check_within(e, 5e-6);
      CHECK(e.error.count("g_gamma") == 1);
      CHECK(e.error.count("initial_state") == 1);
    }
  }
  SECTION("a value-side gate, packed sequences across boundaries, four ranks") {
    for (const bool reverse : {false, true}) {
      INFO("reverse " << reverse);
      const Call c = make_call(ladle::recurrent_variant(false, true, true, false), rng, DType::f32, 1, 48, {0, 20, 20, 41, 48}, reverse, true);
      const GradErrors e = backward_cut(c, {8, 25, 33}, Location::host(), rng);
      check_within(e, 5e-6);
    }
  }
  SECTION("the update forms (K x K transitions, dS folded by M^T) and RWKV6, three ranks") {
    for (const char* op : {"gated_delta_rule", "kda", "rwkv6"}) {
      INFO(op);
      const Call c = make_call(ladle::named_variant(op, op == std::string("rwkv6") ? "" : "l2norm"), rng, DType::f32, 2, 40, {}, false, true);
      const GradErrors e = backward_cut(c, {13, 29}, Location::host(), rng);
      check_within(e, 5e-5);
      CHECK(e.error.count("beta") == (op == std::string("rwkv6") ? 0u : 1u));
    }
  }
}

TEST_CASE("context parallel: misuse is refused on every rank with an error naming it", "[context_parallel][errors]") {
  std::mt19937_64 rng(5);
  const ir::Variant& gla = ladle::recurrent_variant(true, false, false, false);
  const Call c = make_call(gla, rng, DType::f32, 2, 24, {}, false, false);
  const auto run_two = [&](const std::function<void(int, Rank&, ladle::RunOptions&)>& spoil) {
    ladle::ThreadGroup group(2);
    return on_ranks(2, [&](int r) {
      Rank mine = rank_tensors(c, r == 0 ? 0 : 12, r == 0 ? 12 : 24, Location::host());
      std::optional<Tensor> h0, cu;
      ladle::RunOptions options = options_of(c, h0, cu, Location::host());
      spoil(r, mine, options);
      cp::run_variant(gla, mine.q, mine.k, mine.v, mine.inputs, options, group.rank(r));
    });
  };
  SECTION("slices of unequal head counts") {
    Call other = make_call(gla, rng, DType::f32, 2, 24, {}, false, false);
    Tensor q3 = test::normal(rng, DType::f32, {2, 12, 3, 16}).tensor, k3 = test::normal(rng, DType::f32, {2, 12, 3, 16}).tensor;
    Tensor v3 = test::normal(rng, DType::f32, {2, 12, 3, 8}).tensor, g3 = test::log_gate(rng, DType::f32, {2, 12, 3, 16}).tensor;
    const auto errors = run_two([&](int r, Rank& mine, ladle::RunOptions&) {
      if (r == 1) mine.q = q3.view(), mine.k = k3.view(), mine.v = v3.view(), mine.inputs.tensors["g"] = g3.view();
    });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("the ranks disagree on the heads H: rank 0 has 2, rank 1 has 3"));
  }
  SECTION("a bad input on one rank is reported on both") {
    Tensor bad = test::log_gate(rng, DType::f32, {2, 12, 2, 15}).tensor;
    const auto errors = run_two([&](int r, Rank& mine, ladle::RunOptions&) {
      if (r == 1) mine.inputs.tensors["g"] = bad.view();
    });
    CHECK_THAT(errors[1], Catch::Contains("g has shape [2,12,2,15]"));
    CHECK_THAT(errors[0], Catch::Contains("rank 1 of 2 refused its arguments") && Catch::Contains("g has shape [2,12,2,15]"));
  }
  SECTION("varlen offsets that disagree between ranks") {
    Tensor cu0(DType::i64, {3}), cu1(DType::i64, {3});
    const std::int64_t a[3] = {0, 10, 24}, b[3] = {0, 14, 24};
    std::memcpy(cu0.data(), a, 24), std::memcpy(cu1.data(), b, 24);
    Tensor q = test::normal(rng, DType::f32, {12, 2, 16}).tensor, k = test::normal(rng, DType::f32, {12, 2, 16}).tensor;
    Tensor v = test::normal(rng, DType::f32, {12, 2, 8}).tensor, g = test::log_gate(rng, DType::f32, {12, 2, 16}).tensor;
    const auto errors = run_two([&](int r, Rank& mine, ladle::RunOptions& options) {
      mine.q = q.view(), mine.k = k.view(), mine.v = v.view(), mine.inputs.tensors["g"] = g.view();
      options.cu_seqlens = (r == 0 ? cu0 : cu1).view();
    });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("disagree on options.cu_seqlens"));
  }
  SECTION("offsets that do not end at the ranks' tokens together") {
    Tensor cu(DType::i64, {3});
    const std::int64_t a[3] = {0, 10, 30};
    std::memcpy(cu.data(), a, 24);
    Tensor q = test::normal(rng, DType::f32, {12, 2, 16}).tensor, k = test::normal(rng, DType::f32, {12, 2, 16}).tensor;
    Tensor v = test::normal(rng, DType::f32, {12, 2, 8}).tensor, g = test::log_gate(rng, DType::f32, {12, 2, 16}).tensor;
    const auto errors = run_two([&](int, Rank& mine, ladle::RunOptions& options) {
      mine.q = q.view(), mine.k = k.view(), mine.v = v.view(), mine.inputs.tensors["g"] = g.view();
      options.cu_seqlens = cu.view();
    });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("cu_seqlens ends at 30, but the ranks' slices hold 24 tokens"));
  }
  SECTION("a device tensor with a host group, and a rank outside the group") {
    CHECK_THROWS_WITH(ladle::ThreadGroup(2).rank(2), Catch::Contains("expected 0 to 1"));
    CHECK_THROWS_WITH(ladle::ThreadGroup(0), Catch::Contains("expected at least 1"));
  }
}

TEST_CASE("context parallel on one GPU cut into ranks (bf16; device ThreadGroup)", "[context_parallel][gpu]") {
  if (test::backends().size() < 2) return;  // backends() said why (a Catch2 warning)
  std::mt19937_64 rng(17);
  const Location gpu = Location::device(0);
  SECTION("GLA forward, batch rows, 4 ranks, at the chunked family's sizes") {
    Call c = make_call(ladle::recurrent_variant(true, false, false, false), rng, DType::bf16, 2, 1024, {}, false, true, 64, 64);
    const Compared e = forward_cut(c, {256, 512, 768}, gpu);
    CHECK(e.o < 1e-2);
    CHECK(e.final_state < 5e-3);
    // Beside the whole call's own error against the fp64 oracle.
    check_beside_whole(e);
  }
  SECTION("simple GLA (g_gamma) and a value gate, packed sequences across ranks, reverse") {
    for (const bool reverse : {false, true}) {
      Call c = make_call(ladle::recurrent_variant(false, false, true, true), rng, DType::bf16, 1, 900, {0, 300, 301, 700, 900}, reverse, true, 64,
                         64);
      const Compared e = forward_cut(c, {200, 450, 640}, gpu);
      CHECK(e.o < 1e-2);
      CHECK(e.final_state < 5e-3);
      check_beside_whole(e);
    }
  }
  SECTION("long slices: each rank's summary folded from several state-pass blocks, batch rows and packed") {
    Call c = make_call(ladle::recurrent_variant(true, false, false, false), rng, DType::bf16, 1, 8192, {}, false, true, 64, 64);
    c.H = 2;
    const Compared e = forward_cut(c, {4096}, gpu);
    check_beside_whole(e);
    for (const bool reverse : {false, true}) {
      Call p = make_call(ladle::recurrent_variant(false, false, true, true), rng, DType::bf16, 1, 12288, {0, 5000, 12288}, reverse, true, 64,
                         64);
      const Compared f = forward_cut(p, {3000, 9000}, gpu);
      INFO("reverse " << reverse);
      check_beside_whole(f);
    }
  }
  SECTION("the gated delta rule and KDA: K x K transitions, 2 and 3 ranks") {
    for (const char* op : {"gated_delta_rule", "kda"}) {
      INFO(op);
      Call c = make_call(ladle::named_variant(op, "l2norm"), rng, DType::bf16, 2, 1536, {}, false, true, 64, 64);
      const Compared e = forward_cut(c, {512, 1024}, gpu);
      CHECK(e.o < 1e-2);
      CHECK(e.final_state < 5e-3);
    }
  }
  SECTION("GLA backward, 2 ranks") {
    Call c = make_call(ladle::recurrent_variant(true, false, false, false), rng, DType::bf16, 2, 512, {}, false, true, 64, 64);
    const GradErrors e = backward_cut(c, {256}, gpu, rng);
    check_within(e, 2e-2);
  }
  SECTION("the gated delta rule's and RWKV6's backward (ladle_bwd_update on each slice), 2 ranks") {
    for (const char* op : {"gated_delta_rule", "rwkv6"}) {
      INFO(op);
      Call c = make_call(ladle::named_variant(op, op == std::string("rwkv6") ? "" : "l2norm"), rng, DType::bf16, 2, 512, {}, false, true,
                         64, 64);
      const GradErrors e = backward_cut(c, {256}, gpu, rng);
      check_within(e, 2e-2);
    }
  }
}

// ---- Causal softmax attention: all-gather of k and v, the load-balanced split -----------------------

namespace {

ir::AttentionVariant causal_variant(bool window, bool soft_cap) {
  namespace dsl = ladle::dsl;
  const auto logit = dsl::score * dsl::scalar("scale");
  if (soft_cap) {
    const auto s = dsl::softmax(dsl::soft_cap(logit, 2.0f)).causal();
    return window ? dsl::lower(s.sliding_window(), "cp_attention") : dsl::lower(s, "cp_attention");
  }
  const auto s = dsl::softmax(logit).causal();
  return window ? dsl::lower(s.sliding_window(), "cp_attention") : dsl::lower(s, "cp_attention");
}

struct AttentionCase {
  std::int64_t B = 2, T = 48, H = 4, H_kv = 2, D = 16;
  DType type = DType::f32;
  Tensor q, k, v, d_o;
};

AttentionCase make_attention(std::mt19937_64& rng, DType type, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t H_kv,
                             std::int64_t D) {
  AttentionCase c;
  c.B = B, c.T = T, c.H = H, c.H_kv = H_kv, c.D = D, c.type = type;
  c.q = test::normal(rng, type, {B, T, H, D}).tensor, c.k = test::normal(rng, type, {B, T, H_kv, D}).tensor;
  c.v = test::normal(rng, type, {B, T, H_kv, D}).tensor, c.d_o = test::normal(rng, type, {B, T, H, D}).tensor;
  return c;
}

// A rank's two chunks of a [B,T,X,Y] tensor, concatenated.
Tensor two_chunks(const Tensor& t, const cp::AttentionSlice& s) {
  const Tensor a = slice(t, 1, s.first_begin, s.first_end), b = slice(t, 1, s.second_begin, s.second_end);
  std::vector<std::int64_t> shape = a.shape();
  shape[1] *= 2;
  Tensor out(t.type(), shape);
  const std::int64_t B = shape[0], row = a.numel() / B;
  const std::size_t e = ladle::dtype_size(t.type());
  for (std::int64_t i = 0; i < B; ++i) {
    std::memcpy(static_cast<std::byte*>(out.data()) + 2 * i * row * e, static_cast<const std::byte*>(a.data()) + i * row * e, row * e);
    std::memcpy(static_cast<std::byte*>(out.data()) + (2 * i + 1) * row * e, static_cast<const std::byte*>(b.data()) + i * row * e, row * e);
  }
  return out;
}

// The whole [B,T,...] tensor's values from every rank's two chunks.
std::vector<double> from_chunks(const std::vector<Tensor>& parts, int P, std::int64_t T) {
  std::vector<std::int64_t> shape = parts[0].shape();
  const std::int64_t B = shape[0], c = shape[1] / 2, row = parts[0].numel() / (B * shape[1]);
  std::vector<double> out(static_cast<std::size_t>(B * T * row));
  for (int r = 0; r < P; ++r) {
    const cp::AttentionSlice s = cp::attention_slice(T, P, r);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < 2 * c; ++t) {
        const std::int64_t global = t < c ? s.first_begin + t : s.second_begin + t - c;
        for (std::int64_t i = 0; i < row; ++i) out[(b * T + global) * row + i] = parts[r].get((b * 2 * c + t) * row + i);
      }
  }
  return out;
}

struct AttentionErrors {
  double o = 0, o_oracle = 0, o_whole_oracle = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

AttentionErrors attention_cut(const AttentionCase& c, const ir::AttentionVariant& variant, int P, Location where, bool backward,
                              std::int64_t window_left = -1, std::int64_t window_right = -1, bool oracle = true) {
  ladle::ThreadGroup group(P, where);
  ladle::VariantInputs inputs{{}, {{"scale", 0.3f}}};
  ladle::AttentionRunOptions options;
  options.return_lse = true, options.window_left = window_left, options.window_right = window_right;
  options.backend = where.is_device() ? ladle::Backend::gpu : ladle::Backend::cpu;
  const auto at = [&](const Tensor& t) { return where.is_device() ? t.to(where) : t; };
  const auto host = [](const Tensor& t) { return t.location().is_device() ? t.to(Location::host()) : t; };
  std::vector<Tensor> o(P), lse(P), dq(P), dk(P), dv(P);
  const auto errors = on_ranks(P, [&](int r) {
    const cp::AttentionSlice s = cp::attention_slice(c.T, P, r);
    const Tensor q = at(two_chunks(c.q, s)), k = at(two_chunks(c.k, s)), v = at(two_chunks(c.v, s));
    ladle::AttentionResult result = cp::run_attention(variant, q.view(), k.view(), v.view(), inputs, options, group.rank(r));
    if (backward) {
      const Tensor d_o = at(two_chunks(c.d_o, s));
      Tensor gq(DType::f32, q.shape(), where), gk(DType::f32, k.shape(), where), gv(DType::f32, v.shape(), where);
      cp::run_attention_backward_into(variant, q.view(), k.view(), v.view(), inputs, options, result.o.view(), result.lse->view(),
                                      d_o.view(), {gq.view(), gk.view(), gv.view()}, group.rank(r));
      if (where.is_device()) ladle::Device::get().synchronize();
      dq[r] = host(gq), dk[r] = host(gk), dv[r] = host(gv);
    }
    if (where.is_device()) ladle::Device::get().synchronize();
    o[r] = host(result.o), lse[r] = host(*result.lse);
  });
  for (int r = 0; r < P; ++r) REQUIRE(errors[r] == "");
  // The whole call on one rank.
  const Tensor q = at(c.q), k = at(c.k), v = at(c.v);
  AttentionErrors e;
  if (!backward) {
    const ladle::AttentionResult whole = ladle::run_attention(variant, q.view(), k.view(), v.view(), inputs, options);
    e.o = test::relative_error(from_chunks(o, P, c.T), values(whole.o));
    // lse [B,H,T]: rank r's [B,H,2c] in the same chunks along its last axis.
    const Tensor whole_lse = host(*whole.lse);
    double diff = 0, norm = 0;
    for (int r = 0; r < P; ++r) {
      const cp::AttentionSlice s = cp::attention_slice(c.T, P, r);
      const std::int64_t ch = s.first_end - s.first_begin;
      for (std::int64_t bh = 0; bh < c.B * c.H; ++bh)
        for (std::int64_t t = 0; t < 2 * ch; ++t) {
          const std::int64_t g = t < ch ? s.first_begin + t : s.second_begin + t - ch;
          const double a = lse[r].get(bh * 2 * ch + t), b = whole_lse.get(bh * c.T + g);
          diff += (a - b) * (a - b), norm += b * b;
        }
    }
    e.lse = std::sqrt(diff / norm);
    if (oracle) {
      reference::Attention p;
      p.B = int(c.B), p.Tq = p.Tk = int(c.T), p.H = int(c.H), p.H_kv = int(c.H_kv), p.D = p.Dv = int(c.D);
      p.q = test::values_of(c.q), p.k = test::values_of(c.k), p.v = test::values_of(c.v);
      p.scale = 0.3, p.causal = true;
      if (window_left >= 0 || window_right >= 0) p.window = true, p.window_left = window_left, p.window_right = window_right;
      const std::vector<double> ref = reference::attention(p).o;
      e.o_oracle = test::relative_error(from_chunks(o, P, c.T), ref), e.o_whole_oracle = test::relative_error(values(whole.o), ref);
    }
    return e;
  }
  ladle::AttentionForward whole = ladle::run_attention_for_backward(variant, q.view(), k.view(), v.view(), inputs, options);
  const Tensor d_o = at(c.d_o);
  const ladle::AttentionGradients g = ladle::run_attention_backward(whole.saved, d_o.view());
  e.dq = test::relative_error(from_chunks(dq, P, c.T), values(g.dq));
  e.dk = test::relative_error(from_chunks(dk, P, c.T), values(g.dk));
  e.dv = test::relative_error(from_chunks(dv, P, c.T), values(g.dv));
  return e;
}

}  // namespace

TEST_CASE("context parallel attention: the load-balanced chunks equal the whole causal call (CPU)", "[context_parallel][attention]") {
  std::mt19937_64 rng(41);
  CHECK(cp::attention_slice(48, 3, 1).first_begin == 8);
  CHECK(cp::attention_slice(48, 3, 1).second_begin == 32);
  CHECK_THROWS_WITH(cp::attention_slice(50, 3, 0), Catch::Contains("a multiple of 2 x ranks = 6"));
  const AttentionCase c = make_attention(rng, DType::f32, 2, 48, 4, 2, 16);
  for (const int P : {2, 3}) {
    INFO(P << " ranks");
    const AttentionErrors plain = attention_cut(c, causal_variant(false, false), P, Location::host(), false);
    CHECK(plain.o < 1e-6);
    CHECK(plain.lse < 1e-6);
    CHECK(plain.o_oracle < 1e-5);
    const AttentionErrors windowed = attention_cut(c, causal_variant(true, true), P, Location::host(), false, 10, 0, false);
    CHECK(windowed.o < 1e-6);
    CHECK(windowed.lse < 1e-6);
    const AttentionErrors grads = attention_cut(c, causal_variant(false, false), P, Location::host(), true);
    CHECK(grads.dq < 1e-5);
    CHECK(grads.dk < 1e-5);
    CHECK(grads.dv < 1e-5);
  }
}

TEST_CASE("context parallel attention: misuse is refused on every rank", "[context_parallel][attention][errors]") {
  std::mt19937_64 rng(43);
  const AttentionCase c = make_attention(rng, DType::f32, 1, 24, 2, 2, 16);
  const ir::AttentionVariant variant = causal_variant(false, false);
  ladle::ThreadGroup group(2);
  SECTION("unequal slices") {
    const auto errors = on_ranks(2, [&](int r) {
      const Tensor q = slice(c.q, 1, 0, r == 0 ? 12 : 10), k = slice(c.k, 1, 0, r == 0 ? 12 : 10), v = slice(c.v, 1, 0, r == 0 ? 12 : 10);
      cp::run_attention(variant, q.view(), k.view(), v.view(), {{}, {{"scale", 0.3f}}}, {}, group.rank(r));
    });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("rank 0 holds 12 tokens, rank 1 holds 10"));
  }
  SECTION("dropout") {
    namespace dsl = ladle::dsl;
    const ir::AttentionVariant dropped = dsl::lower(dsl::softmax(dsl::score * dsl::scalar("scale")).causal().dropout(), "dropped");
    const auto errors = on_ranks(2, [&](int r) {
      const Tensor q = slice(c.q, 1, 12 * r, 12 * r + 12), k = slice(c.k, 1, 12 * r, 12 * r + 12), v = slice(c.v, 1, 12 * r, 12 * r + 12);
      cp::run_attention(dropped, q.view(), k.view(), v.view(), {{}, {{"scale", 0.3f}}}, {}, group.rank(r));
    });
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("dropout"));
  }
}

TEST_CASE("context parallel attention on one GPU cut into ranks (bf16)", "[context_parallel][attention][gpu]") {
  if (test::backends().size() < 2) return;  // backends() said why (a Catch2 warning)
  std::mt19937_64 rng(47);
  const AttentionCase c = make_attention(rng, DType::bf16, 1, 2048, 4, 2, 128);
  const AttentionErrors f = attention_cut(c, causal_variant(false, false), 2, Location::device(0), false, -1, -1, false);
  CHECK(f.o < 1e-2);
  CHECK(f.lse < 1e-3);
  const AttentionErrors w = attention_cut(c, causal_variant(true, true), 4, Location::device(0), false, 300, 0, false);
  CHECK(w.o < 1e-2);
  const AttentionErrors g = attention_cut(c, causal_variant(false, false), 2, Location::device(0), true);
  CHECK(g.dq < 2e-2);
  CHECK(g.dk < 2e-2);
  CHECK(g.dv < 2e-2);
}

TEST_CASE("context parallel: the named ops' forms (gla, recurrent, attention) equal their whole calls", "[context_parallel][named]") {
  std::mt19937_64 rng(53);
  const std::int64_t B = 1, T = 40, H = 2, K = 16, V = 8;
  const Tensor q = test::normal(rng, DType::f32, {B, T, H, K}).tensor, k = test::normal(rng, DType::f32, {B, T, H, K}).tensor;
  const Tensor v = test::normal(rng, DType::f32, {B, T, H, V}).tensor, g = test::log_gate(rng, DType::f32, {B, T, H, K}).tensor;
  const Tensor gamma = test::log_gate(rng, DType::f32, {H}).tensor;
  ladle::GlaOptions gla_options;
  gla_options.g_gamma = gamma.view(), gla_options.backend = ladle::Backend::cpu;
  ladle::RecurrentOptions rec_options;
  const Tensor gv = test::log_gate(rng, DType::f32, {B, T, H, V}).tensor;
  rec_options.gv = gv.view(), rec_options.backend = ladle::Backend::cpu;
  ladle::ThreadGroup group(2);
  std::vector<Tensor> o_gla(2), o_rec(2);
  const auto errors = on_ranks(2, [&](int r) {
    const std::int64_t lo = r == 0 ? 0 : 17, hi = r == 0 ? 17 : T;
    const Tensor qs = slice(q, 1, lo, hi), ks = slice(k, 1, lo, hi), vs = slice(v, 1, lo, hi), gs = slice(g, 1, lo, hi);
    const Tensor gvs = slice(gv, 1, lo, hi);
    o_gla[r] = cp::gla(qs.view(), ks.view(), vs.view(), gs.view(), gla_options, group.rank(r)).o;
    ladle::RecurrentOptions mine = rec_options;
    mine.gv = gvs.view();
    o_rec[r] = cp::recurrent(qs.view(), ks.view(), vs.view(), mine, group.rank(r)).o;
  });
  for (const auto& e : errors) REQUIRE(e == "");
  CHECK(test::relative_error(join(o_gla, 1), values(ladle::gla(q.view(), k.view(), v.view(), g.view(), gla_options).o)) < 2e-6);
  CHECK(test::relative_error(join(o_rec, 1), values(ladle::recurrent(q.view(), k.view(), v.view(), rec_options).o)) < 2e-6);
  // The update forms by name: the gated delta rule and KDA, their gates and beta cut with the tokens.
  std::uniform_real_distribution<double> unit(0.1, 0.9);
  const Tensor beta = test::filled(DType::f32, {B, T, H}, [&] { return unit(rng); }).tensor;
  const Tensor gh = test::log_gate(rng, DType::f32, {B, T, H}).tensor;
  ladle::UpdateFormOptions uf;
  uf.use_qk_l2norm_in_kernel = true, uf.backend = ladle::Backend::cpu;
  ladle::KdaOptions kda_options;
  kda_options.use_qk_l2norm_in_kernel = true, kda_options.backend = ladle::Backend::cpu;
  const Tensor vk = test::normal(rng, DType::f32, {B, T, H, K}).tensor;  // KDA: V = K here
  std::vector<Tensor> o_gdn(2), o_kda(2);
  const auto uf_errors = on_ranks(2, [&](int r) {
    const std::int64_t lo = r == 0 ? 0 : 23, hi = r == 0 ? 23 : T;
    const Tensor qs = slice(q, 1, lo, hi), ks = slice(k, 1, lo, hi), vs = slice(v, 1, lo, hi), bs = slice(beta, 1, lo, hi);
    const Tensor ghs = slice(gh, 1, lo, hi), gs = slice(g, 1, lo, hi), vks = slice(vk, 1, lo, hi);
    o_gdn[r] = cp::gated_delta_rule(qs.view(), ks.view(), vs.view(), ghs.view(), bs.view(), uf, group.rank(r)).o;
    o_kda[r] = cp::kda(qs.view(), ks.view(), vks.view(), gs.view(), bs.view(), kda_options, group.rank(r)).o;
  });
  for (const auto& e : uf_errors) REQUIRE(e == "");
  CHECK(test::relative_error(join(o_gdn, 1),
                             values(ladle::gated_delta_rule(q.view(), k.view(), v.view(), gh.view(), beta.view(), uf).o)) < 2e-5);
  CHECK(test::relative_error(join(o_kda, 1), values(ladle::kda(q.view(), k.view(), vk.view(), g.view(), beta.view(), kda_options).o)) <
        2e-5);
  // Causal attention by its options.
  const AttentionCase c = make_attention(rng, DType::f32, 1, 32, 2, 1, 16);
  ladle::AttentionOptions a;
  a.causal = true, a.backend = ladle::Backend::cpu;
  std::vector<Tensor> o_att(2);
  const auto att_errors = on_ranks(2, [&](int r) {
    const cp::AttentionSlice s = cp::attention_slice(32, 2, r);
    const Tensor qs = two_chunks(c.q, s), ks = two_chunks(c.k, s), vs = two_chunks(c.v, s);
    o_att[r] = cp::attention(qs.view(), ks.view(), vs.view(), a, group.rank(r)).o;
  });
  for (const auto& e : att_errors) REQUIRE(e == "");
  CHECK(test::relative_error(from_chunks(o_att, 2, 32), values(ladle::attention(c.q.view(), c.k.view(), c.v.view(), a).o)) < 1e-6);
}
