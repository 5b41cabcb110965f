// The CPU evaluator of IR expressions: broadcasting between rows and single values, and
// gate math that stays finite at extreme inputs.
#include <catch2/catch.hpp>

#include <ladle/codegen/cpu/expr.h>
#include <ladle/dsl/dsl.h>

#include <cmath>
#include <map>

using namespace ladle;

namespace {

// Loads named inputs from fixed rows.
class Rows final : public cpu::InputLoader {
 public:
  Rows(const ir::Variant& variant, std::map<std::string, std::vector<float>> rows) : variant_(variant), rows_(std::move(rows)) {}
  void load(std::int32_t index, float* out, std::int64_t n) const override {
    const std::vector<float>& row = rows_.at(variant_.inputs[index].name);
    for (std::int64_t j = 0; j < n; ++j) out[j] = row[static_cast<std::size_t>(j)];
  }

 private:
  const ir::Variant& variant_;
  std::map<std::string, std::vector<float>> rows_;
};

template <class E>
std::vector<float> evaluate(const E& e, std::map<std::string, std::vector<float>> rows, std::int64_t width) {
  const ir::Variant variant = dsl::lower_expression(e);
  const cpu::RowProgram program(variant, variant.slot(ir::Slot::log_decay_k), width);
  std::vector<float> scratch(program.scratch_size());
  const float* result = program.evaluate(Rows(variant, std::move(rows)), scratch.data());
  return std::vector<float>(result, result + (program.varies_over_features() ? width : 1));
}

}  // namespace

TEST_CASE("a per-head value broadcasts over a row of features", "[codegen][cpu_expr]") {
  const auto x = dsl::token_key("x");
  const auto tau = dsl::head_param("tau");
  const auto out = evaluate(x / tau - 1, {{"x", {2, 4, 6, 8}}, {"tau", {2}}}, 4);
  CHECK(out == std::vector<float>{0, 1, 2, 3});
  const auto single = evaluate(dsl::exp(tau * 0), {{"tau", {5}}}, 4);
  CHECK(single == std::vector<float>{1});
}

TEST_CASE("gate math stays finite and accurate at extreme inputs", "[codegen][cpu_expr]") {
  const auto x = dsl::token_key("x");
  const std::vector<float> xs = {-1000, -100, -30, -1, 0, 1, 30, 100, 1000};
  const auto logsigmoid = evaluate(dsl::logsigmoid(x), {{"x", xs}}, 9);
  const auto softplus = evaluate(dsl::softplus(x), {{"x", xs}}, 9);
  const auto sigmoid = evaluate(dsl::sigmoid(x), {{"x", xs}}, 9);
  const auto silu = evaluate(dsl::silu(x), {{"x", xs}}, 9);
  const auto elu = evaluate(dsl::elu(x), {{"x", xs}}, 9);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    INFO("x = " << v);
    const double ls = std::fmin(v, 0.0) - std::log1p(std::exp(-std::fabs(v)));
    CHECK(logsigmoid[i] == Approx(ls).epsilon(1e-6).margin(1e-30));
    CHECK(softplus[i] == Approx(std::fmax(v, 0.0) + std::log1p(std::exp(-std::fabs(v)))).epsilon(1e-6).margin(1e-30));
    CHECK(sigmoid[i] == Approx(1 / (1 + std::exp(-v))).epsilon(1e-6).margin(1e-30));
    CHECK(std::isfinite(silu[i]));
    CHECK(std::isfinite(elu[i]));
  }
  CHECK(logsigmoid[0] == -1000.0f);
  CHECK(softplus[8] == 1000.0f);
  // The small tail survives where a naive log(sigmoid(x)) rounds to log(1) = 0.
  CHECK(logsigmoid[6] == Approx(-std::exp(-30.0)).epsilon(1e-6));
  CHECK(softplus[2] == Approx(std::exp(-30.0)).epsilon(1e-6));
  CHECK(logsigmoid[8] <= 0.0f);
  CHECK(elu[0] == -1.0f);
}

TEST_CASE("binary operations follow C semantics for min, max and pow", "[codegen][cpu_expr]") {
  const auto x = dsl::token_key("x");
  const auto y = dsl::token_key("y");
  CHECK(evaluate(dsl::min(x, y), {{"x", {1, 5}}, {"y", {3, 2}}}, 2) == std::vector<float>{1, 2});
  CHECK(evaluate(dsl::max(x, 0), {{"x", {-1, 5}}}, 2) == std::vector<float>{0, 5});
  CHECK(evaluate(dsl::pow(x, 2), {{"x", {-3, 0.5f}}}, 2) == std::vector<float>{9, 0.25f});
  CHECK(evaluate(dsl::relu(x) + dsl::abs(y), {{"x", {-1, 2}}, {"y", {-4, 4}}}, 2) == std::vector<float>{4, 6});
}
