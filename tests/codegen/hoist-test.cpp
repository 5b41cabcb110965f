// hoist_invariants (codegen/cuda/detail/hoist.h): the attention family's logit with its invariant
// factors computed once. Checked by value (the rewritten expression, its hoisted values read
// back in, equals factor * the expression as written, in double arithmetic, on random leaves)
// and by form (a soft cap keeps no division per element; index differences stay exact).
#include <catch2/catch.hpp>

#include <ladle/codegen/cuda/attention.h>
#include <ladle/codegen/cuda/detail/hoist.h>
#include <ladle/dsl/dsl.h>

#include <cmath>
#include <map>
#include <random>

using namespace ladle;
using cuda::detail::HoistedExpression;
using cuda::detail::hoist_invariants;

namespace {

// Leaf values of one (query, key) pair: score, i, j, h, b and each input by name.
struct Leaves {
  double score = 0, i = 0, j = 0, h = 0, b = 0;
  std::map<std::string, double> inputs;
};

// The expression in double; tanh(y / tanh_factor) at a tanh node (the family's scaled tanh).
double evaluate(const std::vector<ir::Input>& inputs, const ir::Expr& e, const Leaves& at, double tanh_factor = 1.0) {
  std::vector<double> v(e.nodes.size());
  for (std::size_t n = 0; n < e.nodes.size(); ++n) {
    const ir::Node& x = e.nodes[n];
    const double a = x.a >= 0 ? v[x.a] : 0, b = x.b >= 0 ? v[x.b] : 0;
    switch (x.op) {
      case ir::Op::constant: v[n] = x.value; break;
      case ir::Op::input: v[n] = at.inputs.at(inputs.at(x.input).name); break;
      case ir::Op::score: v[n] = at.score; break;
      case ir::Op::query_index: v[n] = at.i; break;
      case ir::Op::key_index: v[n] = at.j; break;
      case ir::Op::head_index: v[n] = at.h; break;
      case ir::Op::batch_index: v[n] = at.b; break;
      case ir::Op::neg: v[n] = -a; break;
      case ir::Op::exp: v[n] = std::exp(a); break;
      case ir::Op::tanh: v[n] = std::tanh(a / tanh_factor); break;
      case ir::Op::abs: v[n] = std::fabs(a); break;
      case ir::Op::add: v[n] = a + b; break;
      case ir::Op::sub: v[n] = a - b; break;
      case ir::Op::mul: v[n] = a * b; break;
      case ir::Op::div: v[n] = a / b; break;
      case ir::Op::min: v[n] = std::min(a, b); break;
      case ir::Op::max: v[n] = std::max(a, b); break;
      case ir::Op::less: v[n] = a < b ? 1 : 0; break;
      default: FAIL("evaluate: op " << ir::op_name(x.op) << " not covered by this test"); break;
    }
  }
  return v.back();
}

int count(const ir::Expr& e, ir::Op op) {
  int n = 0;
  for (const ir::Node& x : e.nodes) n += x.op == op;
  return n;
}

// factor * the expression against the rewrite, at random leaves.
HoistedExpression check_values(const ir::AttentionVariant& variant, double factor, double tanh_factor) {
  const HoistedExpression h = hoist_invariants(variant.inputs, variant.score, factor, tanh_factor);
  REQUIRE(h.first_hoisted == variant.inputs.size());
  REQUIRE(h.inputs.size() == h.first_hoisted + h.invariants.size());
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> value(-3.0, 3.0), positive(0.5, 4.0);
  std::uniform_int_distribution<int> index(0, 5000);
  for (int trial = 0; trial < 200; ++trial) {
    Leaves at;
    at.score = value(rng) * 10;
    at.i = index(rng), at.j = index(rng), at.h = index(rng) % 16, at.b = index(rng) % 8;
    for (const ir::Input& in : variant.inputs) at.inputs[in.name] = in.kind == ir::InputKind::pair ? value(rng) : positive(rng);
    const double expected = factor * evaluate(variant.inputs, variant.score, at);
    Leaves hoisted = at;
    for (std::size_t k = 0; k < h.invariants.size(); ++k)
      hoisted.inputs[h.inputs[h.first_hoisted + k].name] = evaluate(variant.inputs, h.invariants[k], at);
    const double got = evaluate(h.inputs, h.expr, hoisted, tanh_factor);
    INFO("trial " << trial << ": score " << at.score << " i " << at.i << " j " << at.j);
    // The rewrite folds the factors into fp32 constants (2^-24 relative each) of terms up to about 50,
    // whose sum may cancel to near 0 (CI once met 0.00504516 against 0.00504515): an absolute margin
    // of 1e-5 over those terms' size, far under what a wrong rewrite moves on random leaves.
    CHECK(got == Approx(expected).epsilon(1e-6).margin(1e-5));
  }
  return h;
}

}  // namespace

TEST_CASE("hoist: a soft cap keeps one multiply before its tanh and one after, no division", "[codegen][hoist]") {
  const auto logit = dsl::soft_cap(dsl::score * dsl::scalar("scale"), dsl::scalar("logits_soft_cap"));
  const ir::AttentionVariant v = dsl::lower(dsl::softmax(logit).causal().sliding_window(), "softcap");
  const double log2e = 1.4426950408889634;
  const HoistedExpression h = check_values(v, log2e, 2 * log2e);
  CHECK(h.invariants.size() == 2);  // 2 log2 e scale / cap and log2 e cap
  CHECK(count(h.expr, ir::Op::div) == 0);
  CHECK(count(h.expr, ir::Op::mul) == 2);
  CHECK(count(h.expr, ir::Op::tanh) == 1);
  CHECK(count(h.expr, ir::Op::constant) == 0);
}

TEST_CASE("hoist: score * scale in log2 units is one multiply by one hoisted value", "[codegen][hoist]") {
  const ir::AttentionVariant v = dsl::lower(dsl::softmax(dsl::score * dsl::scalar("scale")).causal(), "plain");
  const HoistedExpression h = check_values(v, 1.4426950408889634, 1.0);
  CHECK(h.invariants.size() == 1);
  CHECK(h.expr.nodes.size() == 3);  // hoisted, score, mul
  CHECK(count(h.expr, ir::Op::mul) == 1);
}

TEST_CASE("hoist: index arithmetic is scaled after its difference, never before", "[codegen][hoist]") {
  // ALiBi: slope * (i - j) must not become (log2 e slope) i - (log2 e slope) j, which rounds
  // both products of large indices before they cancel.
  const auto logit = dsl::score * dsl::scalar("scale") - dsl::head_param("slope") * (dsl::query_index - dsl::key_index);
  const ir::AttentionVariant v = dsl::lower(dsl::softmax(logit), "alibi");
  const HoistedExpression h = check_values(v, 1.4426950408889634, 1.0);
  bool exact_difference = false;
  for (const ir::Node& x : h.expr.nodes)
    if (x.op == ir::Op::sub && h.expr.nodes[x.a].op == ir::Op::query_index && h.expr.nodes[x.b].op == ir::Op::key_index)
      exact_difference = true;
  CHECK(exact_difference);
  CHECK(count(h.expr, ir::Op::div) == 0);
}

TEST_CASE("hoist: divisions by varying values, negation, nested and invariant-only expressions", "[codegen][hoist]") {
  const auto scale = dsl::scalar("scale");
  const auto slope = dsl::head_param("slope");
  const auto bias = dsl::pair("bias");
  SECTION("a varying denominator stays a division; the invariant numerator is hoisted") {
    const auto logit = -(dsl::score * scale) / (dsl::key_index + 1.0f) * 3.0f / slope;
    const HoistedExpression h = check_values(dsl::lower(dsl::softmax(logit)), 1.4426950408889634, 1.0);
    CHECK(count(h.expr, ir::Op::div) == 1);
  }
  SECTION("a pair input beside the score, under a soft cap, and max / min with invariants") {
    const auto logit = dsl::soft_cap(dsl::score * scale + bias * slope, 30.0f) +
                       dsl::max(dsl::score / slope, bias * 2.0f) - dsl::min(dsl::exp(bias), slope + 1.0f);
    check_values(dsl::lower(dsl::softmax(logit)), 1.4426950408889634, 2 * 1.4426950408889634);
  }
  SECTION("an expression with no varying leaf is one hoisted value") {
    const auto logit = slope * scale + dsl::head_index * 0.5f + dsl::tanh(slope);
    const HoistedExpression h = check_values(dsl::lower(dsl::softmax(logit)), 1.4426950408889634, 2 * 1.4426950408889634);
    CHECK(h.expr.nodes.size() == 1);
    CHECK(h.invariants.size() == 1);
  }
  SECTION("the same invariant used twice is hoisted once") {
    const auto logit = dsl::score * (scale / slope) + bias * (scale / slope);
    const HoistedExpression h = check_values(dsl::lower(dsl::softmax(logit)), 1.0, 1.0);
    CHECK(h.invariants.size() == 1);
  }
}

TEST_CASE("hoist: the logit's leading factor, where scalars and constants alone make it", "[codegen][hoist]") {
  const double log2e = 1.4426950408889634;
  const auto scale = dsl::scalar("scale");
  {
    const ir::AttentionVariant v = dsl::lower(dsl::softmax(dsl::score * scale).causal());
    std::vector<float> scalars(v.inputs.size(), 0.0f);
    scalars[v.find_input("scale")] = 0.125f;
    REQUIRE(cuda::attention_logit_factor(v, scalars).has_value());
    CHECK(*cuda::attention_logit_factor(v, scalars) == Approx(log2e * 0.125).epsilon(1e-6));
    scalars[v.find_input("scale")] = -0.5f;
    CHECK(*cuda::attention_logit_factor(v, scalars) == Approx(-log2e * 0.5).epsilon(1e-6));
  }
  {
    const auto cap = dsl::scalar("cap");
    const ir::AttentionVariant v = dsl::lower(dsl::softmax(dsl::soft_cap(dsl::score * scale, cap)));
    std::vector<float> scalars(v.inputs.size(), 0.0f);
    scalars[v.find_input("scale")] = 0.125f, scalars[v.find_input("cap")] = 30.0f;
    REQUIRE(cuda::attention_logit_factor(v, scalars).has_value());
    CHECK(*cuda::attention_logit_factor(v, scalars) == Approx(log2e * 30.0).epsilon(1e-6));  // the cap outside tanh
  }
  {
    // A per-head factor is no single value; a sum at the top has no leading factor.
    const ir::AttentionVariant per_head = dsl::lower(dsl::softmax(dsl::score * dsl::head_param("temperature")));
    CHECK_FALSE(cuda::attention_logit_factor(per_head, std::vector<float>(per_head.inputs.size(), 1.0f)).has_value());
    const ir::AttentionVariant alibi =
        dsl::lower(dsl::softmax(dsl::score * scale - dsl::head_param("slope") * (dsl::query_index - dsl::key_index)));
    CHECK_FALSE(cuda::attention_logit_factor(alibi, std::vector<float>(alibi.inputs.size(), 1.0f)).has_value());
  }
}
