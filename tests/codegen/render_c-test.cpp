// render_c: the C/CUDA text of an IR expression. The text is checked for a few forms, and
// every case of render_c_cases.h is compiled (rendered_cases.inc, made at build time) and
// compared value by value with the CPU evaluator, extreme inputs included.
#include <catch2/catch.hpp>

#include <ladle/codegen/cpu/expr.h>
#include <ladle/codegen/render_c.h>
#include <ladle/dsl/dsl.h>

#include <cmath>

#include "render_c_cases.h"
#include "rendered_cases.inc"

using namespace ladle;

TEST_CASE("literals read back as the same float", "[codegen][render_c]") {
  CHECK(ir::render_c_literal(16.0f) == "16.0f");
  CHECK(ir::render_c_literal(0.0625f) == "0.0625f");
  CHECK(ir::render_c_literal(-2.5f) == "-2.5f");
  CHECK(ir::render_c_literal(1e-10f) == "1e-10f");
  CHECK(ir::render_c_literal(0.1f) == "0.1f");
  CHECK(ir::render_c_literal(1.0f / 3) == "0.33333334f");
  CHECK(ir::render_c_literal(3e38f) == "3e+38f");
  CHECK(ir::render_c_literal(0.0f) == "0.0f");
}

TEST_CASE("input loads are named by the caller and gate math is inline", "[codegen][render_c]") {
  const auto x = dsl::token_key("x");
  const ir::Variant v = dsl::lower_expression(dsl::logsigmoid(x) / dsl::head_param("tau") * -2);
  const auto load = [](const ir::Input& in, std::int32_t index) {
    return in.kind == ir::InputKind::head ? in.name + "[h]" : "load(" + in.name + ", " + std::to_string(index) + ", i)";
  };
  CHECK(ir::render_c(v, v.slot(ir::Slot::log_decay_k), load) ==
        "(((fminf(load(x, 0, i), 0.0f) - log1pf(expf(-fabsf(load(x, 0, i))))) / tau[h]) * (-2.0f))");
  const ir::Variant s = dsl::lower_expression(dsl::softplus(x - 1) + dsl::sigmoid(x));
  CHECK(ir::render_c(s, s.slot(ir::Slot::log_decay_k), [](const ir::Input&, std::int32_t) { return "x_i"; }) ==
        "((fmaxf((x_i - 1.0f), 0.0f) + log1pf(expf(-fabsf((x_i - 1.0f))))) + (1.0f / (1.0f + expf(-x_i))))");
  const ir::Variant e = dsl::lower_expression(dsl::elu(x));
  CHECK(ir::render_c(e, e.slot(ir::Slot::log_decay_k), [](const ir::Input&, std::int32_t) { return "a + b"; }) ==
        "((a + b) > 0.0f ? (a + b) : expm1f((a + b)))");
  // tanh is tanhf unless the family names its own (attention: ladle_tanh).
  const ir::Variant t = dsl::lower_expression(dsl::tanh(x));
  const auto x_i = [](const ir::Input&, std::int32_t) -> std::string { return "x_i"; };
  const auto no_leaf = [](ir::Op) -> std::string { return "?"; };
  CHECK(ir::render_c(t.inputs, t.slot(ir::Slot::log_decay_k), x_i, no_leaf) == "tanhf(x_i)");
  ir::RenderFunctions fast;
  fast.tanh = "ladle_tanh";
  CHECK(ir::render_c(t.inputs, t.slot(ir::Slot::log_decay_k), x_i, no_leaf, fast) == "ladle_tanh(x_i)");
}

namespace {

class XP final : public cpu::InputLoader {
 public:
  XP(const ir::Variant& v, float x, float p) : v_(v), x_(x), p_(p) {}
  void load(std::int32_t index, float* out, std::int64_t) const override { out[0] = v_.inputs[index].name == "x" ? x_ : p_; }

 private:
  const ir::Variant& v_;
  float x_, p_;
};

}  // namespace

TEST_CASE("compiled render_c output agrees with the CPU evaluator, extremes included", "[codegen][render_c]") {
  const auto cases = render_c_cases::all();
  REQUIRE(std::size(rendered_cases) == cases.size());
  const float xs[] = {-1000, -88, -20, -1, -1e-3f, 0, 1e-3f, 0.5f, 1, 20, 88, 1000};
  const float ps[] = {0.5f, 3, 16};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const ir::Variant& v = cases[c].second;
    const cpu::RowProgram program(v, v.slot(ir::Slot::log_decay_k), 1);
    std::vector<float> scratch(program.scratch_size());
    for (float x : xs)
      for (float p : ps) {
        const float compiled = rendered_cases[c](x, p);
        const float evaluated = *program.evaluate(XP(v, x, p), scratch.data());
        INFO(cases[c].first << " at x = " << x << ", p = " << p << ": compiled " << compiled << ", evaluated " << evaluated);
        if (cases[c].first != "tanh" && cases[c].first != "elu") CHECK_FALSE(std::isnan(compiled));
        CHECK(compiled == Approx(evaluated).epsilon(1e-6).margin(1e-30));
      }
  }
  // The careful forms at the ends of the range.
  CHECK(rendered_cases[0](-1000, 0) == -1000.0f);  // logsigmoid
  CHECK(rendered_cases[1](1000, 0) == 1000.0f);    // softplus
  CHECK(rendered_cases[2](-1000, 0) == 0.0f);      // sigmoid
}
