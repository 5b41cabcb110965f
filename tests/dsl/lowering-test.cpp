// Lowering a DSL expression to ir::Variant: the inputs it lists, the slot each primitive
// fills, shared subexpressions, and the problems validate() reports.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>

#include <type_traits>

using namespace ladle;
using ir::InputKind;
using ir::Role;
using ir::Slot;

TEST_CASE("building an expression is a constant expression and owns nothing", "[dsl][lowering]") {
  constexpr auto x = dsl::token_key("x");
  constexpr auto gate = dsl::logsigmoid(x) / 16;
  constexpr auto variant = dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(gate), dsl::q, dsl::scalar("scale"));
  STATIC_REQUIRE(std::is_trivially_copyable_v<decltype(variant)>);
  STATIC_REQUIRE(std::is_trivially_destructible_v<decltype(variant)>);
  STATIC_REQUIRE(decltype(gate)::extent == ir::Extent{true, true, ir::Feature::key});
}

TEST_CASE("GLA lowers to five inputs and three filled optional slots", "[dsl][lowering]") {
  const auto g = dsl::token_key("g");
  const ir::Variant v = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(g), dsl::q, dsl::scalar("scale")), "gla");
  CHECK(v.name == "gla");
  const std::vector<ir::Input> expected = {{"q", InputKind::token_key, Role::query},
                                           {"k", InputKind::token_key, Role::key},
                                           {"v", InputKind::token_value, Role::value},
                                           {"g", InputKind::token_key, Role::other},
                                           {"scale", InputKind::scalar, Role::other}};
  CHECK(v.inputs == expected);
  CHECK(v.slot(Slot::q_feature).nodes.size() == 1);
  CHECK(v.slot(Slot::q_feature).nodes[0].op == ir::Op::input);
  CHECK(v.slot(Slot::q_feature).nodes[0].input == 0);
  CHECK(v.slot(Slot::log_decay_k).nodes[0].input == 3);
  CHECK(v.has(Slot::scale));
  CHECK_FALSE(v.has(Slot::log_decay_v));
  CHECK_FALSE(v.has(Slot::log_decay_head));
  CHECK_FALSE(v.normalize);
  CHECK(ir::validate(v).empty());
}

TEST_CASE("each primitive fills its slot", "[dsl][lowering]") {
  const auto gk = dsl::token_key("gk");
  const auto gv = dsl::token_value("gv");
  const auto gamma = dsl::head_param("g_gamma");
  const ir::Variant v = dsl::lower(
      dsl::read(dsl::scan(dsl::elu(dsl::k) + 1, dsl::v * 2).decay_v(gv).decay_head(gamma).decay_k(gk), dsl::relu(dsl::q)).scaled(0.5).scaled(gamma));
  CHECK(ir::to_string(v, v.slot(Slot::q_feature)) == "relu(q)");
  CHECK(ir::to_string(v, v.slot(Slot::k_feature)) == "elu(k) + 1");
  CHECK(ir::to_string(v, v.slot(Slot::v)) == "v * 2");
  CHECK(ir::to_string(v, v.slot(Slot::log_decay_k)) == "gk");
  CHECK(ir::to_string(v, v.slot(Slot::log_decay_v)) == "gv");
  CHECK(ir::to_string(v, v.slot(Slot::log_decay_head)) == "g_gamma");
  CHECK(ir::to_string(v, v.slot(Slot::scale)) == "0.5 * g_gamma");
  CHECK(ir::validate(v).empty());
}

TEST_CASE("a decay given twice adds in log space", "[dsl][lowering]") {
  const auto g = dsl::token_key("g");
  const auto gk = dsl::token_key("gk");
  const ir::Variant v = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(g).decay_k(gk).decay_k(-0.25), dsl::q));
  CHECK(ir::to_string(v, v.slot(Slot::log_decay_k)) == "g + gk + -0.25");
}

TEST_CASE("identical subexpressions are lowered once; an input is listed once", "[dsl][lowering]") {
  const auto x = dsl::token_key("x");
  const ir::Variant v = dsl::lower(
      dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::sigmoid(x) * dsl::sigmoid(x) - dsl::q), dsl::q * dsl::sigmoid(x)));
  CHECK(v.slot(Slot::log_decay_k).nodes.size() == 5);  // x, sigmoid(x), product, q, difference
  CHECK(v.inputs.size() == 4);                         // q, x, k, v
  CHECK(v.inputs[1].name == "x");
  CHECK(ir::extent(v, v.slot(Slot::log_decay_k)) == ir::Extent{true, true, ir::Feature::key});
}

TEST_CASE("plain numbers on either side become constants", "[dsl][lowering]") {
  const auto x = dsl::token_key("x");
  const ir::Variant v = dsl::lower_expression(1 - 2.0 * dsl::max(x, 0) / dsl::pow(x, 3) + dsl::min(0.5f, x));
  CHECK(ir::to_string(v, v.slot(Slot::log_decay_k)) == "1 - 2 * max(x, 0) / pow(x, 3) + min(0.5, x)");
  const ir::Variant e = dsl::lower_expression(dsl::scalar("s") * 3, Slot::scale);
  CHECK(ir::extent(e, e.slot(Slot::scale)) == ir::Extent{});
}

TEST_CASE("extents follow the inputs read", "[dsl][lowering]") {
  const auto gate = dsl::token_head("g") / dsl::head_param("tau");
  const ir::Variant v = dsl::lower_expression(gate, Slot::log_decay_head);
  CHECK(ir::extent(v, v.slot(Slot::log_decay_head)) == ir::Extent{true, true, ir::Feature::none});
  const ir::Variant p = dsl::lower_expression(dsl::exp(dsl::head_param("a")) + dsl::scalar("b"), Slot::log_decay_head);
  CHECK(ir::extent(p, p.slot(Slot::log_decay_head)) == ir::Extent{false, true, ir::Feature::none});
}

TEST_CASE("normalized() sets the flag and its epsilon", "[dsl][lowering]") {
  const ir::Variant v = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v), dsl::q).normalized(1e-6f));
  CHECK(v.normalize);
  CHECK(v.normalize_eps == 1e-6f);
}

TEST_CASE("validate reports what the DSL cannot rule out at compile time", "[dsl][lowering]") {
  // One name with two kinds.
  const ir::Variant clash = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("x")).decay_v(dsl::token_value("x")), dsl::q));
  const auto problems = ir::validate(clash);
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains("input name 'x' is used twice, as [B,T,H,K] (other) and as [B,T,H,V] (other)"));

  // An IR built by hand: a key-side decay over V, a required slot missing, a bad constant.
  ir::Variant v;
  {
    ir::ExprBuilder b(v);
    b.input("q", InputKind::token_key, Role::query);
    v.slot(Slot::q_feature) = b.take();
  }
  {
    ir::ExprBuilder b(v);
    b.input("v", InputKind::token_value, Role::value);
    v.slot(Slot::v) = b.take();
  }
  {
    ir::ExprBuilder b(v);
    b.binary(ir::Op::mul, b.input("gv", InputKind::token_value, Role::other), b.constant(1.0f / 0.0f));
    v.slot(Slot::log_decay_k) = b.take();
  }
  v.normalize = true;
  const auto found = ir::validate(v);
  std::string all;
  for (const auto& p : found) all += p + "\n";
  CHECK_THAT(all, Catch::Contains("slot k_feature is required but empty"));
  CHECK_THAT(all, Catch::Contains("slot log_decay_k: constant inf is not finite"));
  CHECK_THAT(all, Catch::Contains("slot log_decay_k = gv * inf is a key-side decay over the value features"));

  ir::Variant disordered = v;
  disordered.slot(Slot::log_decay_k).nodes[2].a = 2;  // uses itself
  std::string disordered_problems;
  for (const auto& p : ir::validate(disordered)) disordered_problems += p + "\n";
  CHECK_THAT(disordered_problems, Catch::Contains("slot log_decay_k: node 2 (mul) has operands that are missing or not earlier nodes"));
}
