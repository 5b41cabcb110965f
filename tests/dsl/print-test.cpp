// The readable printout the dump tool and the generated kernel's header show.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>

using namespace ladle;

namespace {

template <class E>
std::string printed(const E& e) {
  const ir::Variant v = dsl::lower_expression(e);
  return ir::to_string(v, v.slot(ir::Slot::log_decay_k));
}

}  // namespace

TEST_CASE("expressions print infix with only the parentheses they need", "[dsl][print]") {
  const auto a = dsl::token_key("a"), b = dsl::token_key("b"), c = dsl::token_key("c");
  CHECK(printed(a + b * c) == "a + b * c");
  CHECK(printed((a + b) * c) == "(a + b) * c");
  CHECK(printed(a - b - c) == "a - b - c");
  CHECK(printed(a - (b - c)) == "a - (b - c)");
  CHECK(printed(a / (b * c)) == "a / (b * c)");
  CHECK(printed(-(a + b)) == "-(a + b)");
  CHECK(printed(-a * b) == "-a * b");
  CHECK(printed(-(-a)) == "-(-a)");
  CHECK(printed(a * -2) == "a * -2");
  CHECK(printed(dsl::logsigmoid(a) / dsl::head_param("tau")) == "logsigmoid(a) / tau");
  CHECK(printed(dsl::pow(dsl::max(a, 0), 0.1)) == "pow(max(a, 0), 0.1)");
  CHECK(printed(dsl::exp(a) + 1e-10) == "exp(a) + 1e-10");
  CHECK(printed(a / 3) == "a / 3");
  CHECK(printed(a * (1.0f / 3)) == "a * 0.33333334");
}

TEST_CASE("a variant prints its inputs, its recurrence and every slot", "[dsl][print]") {
  const auto x = dsl::token_key("x");
  const ir::Variant v = dsl::lower(
      dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / dsl::head_param("tau")), dsl::q, dsl::scalar("scale")),
      "custom_gate");
  const std::string text = ir::to_string(v);
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("variant custom_gate  hash " + ir::hash_hex(v) + "\n"));
  CHECK_THAT(text, Catch::Contains("  k          key    [B,T,H_kv,K]\n"));
  CHECK_THAT(text, Catch::Contains("  tau        other  [H] or [B,H]\n"));
  CHECK_THAT(text, Catch::Contains("  S_t = diag(exp(log_decay_k)) S_{t-1} + k_feature v^T\n"));
  CHECK_THAT(text, Catch::Contains("  o_t = (scale q_feature)^T S_t\n"));
  CHECK_THAT(text, Catch::Contains("  log_decay_k    = logsigmoid(x) / tau\n"));
  CHECK_THAT(text, Catch::Contains("  log_decay_v    = (none)\n"));

  const ir::Variant n = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(dsl::head_param("g_gamma")), dsl::q).normalized());
  const std::string normalised = ir::to_string(n);
  CHECK_THAT(normalised, Catch::Contains("variant (unnamed)"));
  CHECK_THAT(normalised, Catch::Contains("  o_t = q_feature^T S_t / (q_feature^T n_t + 1e-10)\n  n_t = n_{t-1} exp(log_decay_head) + k_feature\n"));
}
