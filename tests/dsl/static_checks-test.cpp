// What the compiler checks about an expression. The traits behind the static_asserts are
// tested here; tests/dsl/compile_fail/ holds programs that must not compile, each with the
// diagnostic it must produce (run by CTest as dsl-compile-fail-<name>).
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>

using namespace ladle;

namespace {
using Q = std::remove_cv_t<decltype(dsl::q)>;
using K = std::remove_cv_t<decltype(dsl::k)>;
using V = std::remove_cv_t<decltype(dsl::v)>;
using Param = decltype(dsl::head_param("p"));
using TokenHead = decltype(dsl::token_head("t"));
using State = decltype(dsl::scan(dsl::k, dsl::v));

template <class A, class B>
concept addable = requires(const A& a, const B& b) { a + b; };
template <class A, class B>
concept multipliable = requires(const A& a, const B& b) { a * b; };
template <class A>
concept has_dsl_exp = requires(const A& a) { dsl::exp(a); };
}  // namespace

TEST_CASE("the key and value feature axes never meet; everything else broadcasts", "[dsl][static]") {
  STATIC_REQUIRE_FALSE(dsl::can_combine<K, V>);
  STATIC_REQUIRE_FALSE(dsl::can_combine<decltype(dsl::exp(dsl::q)), decltype(dsl::v * 2)>);
  STATIC_REQUIRE(dsl::can_combine<Q, K>);
  STATIC_REQUIRE(dsl::can_combine<K, Param>);
  STATIC_REQUIRE(dsl::can_combine<V, TokenHead>);
  STATIC_REQUIRE(dsl::can_combine<Param, decltype(dsl::scalar("s"))>);
}

TEST_CASE("a state is not an elementwise operand, and neither is a bool", "[dsl][static]") {
  STATIC_REQUIRE(dsl::expression<K>);
  STATIC_REQUIRE_FALSE(dsl::expression<State>);
  STATIC_REQUIRE_FALSE(dsl::operand<State>);
  STATIC_REQUIRE_FALSE(dsl::operand<bool>);
  STATIC_REQUIRE(dsl::operand<double>);
  STATIC_REQUIRE_FALSE(addable<State, int>);
  STATIC_REQUIRE_FALSE(addable<State, K>);
  STATIC_REQUIRE_FALSE(has_dsl_exp<State>);
  STATIC_REQUIRE_FALSE(has_dsl_exp<float>);  // plain numbers stay with std::exp
  STATIC_REQUIRE_FALSE(multipliable<K, bool>);
  STATIC_REQUIRE(multipliable<Q, int>);
  STATIC_REQUIRE(multipliable<double, Q>);
  STATIC_REQUIRE(multipliable<Q, Param>);
}

TEST_CASE("extents are known at compile time", "[dsl][static]") {
  STATIC_REQUIRE(decltype(dsl::q * dsl::head_param("t"))::extent == ir::Extent{true, true, ir::Feature::key});
  STATIC_REQUIRE(decltype(dsl::head_param("t") + 1)::extent == ir::Extent{false, true, ir::Feature::none});
  STATIC_REQUIRE(decltype(dsl::token_head("g") * dsl::v)::extent.feature == ir::Feature::value);
  STATIC_REQUIRE_FALSE(State::has_decay_v);
  STATIC_REQUIRE(decltype(dsl::scan(dsl::k, dsl::v).decay_v(dsl::token_value("gv")))::has_decay_v);
}
