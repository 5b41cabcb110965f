// Expressions whose C rendering is compiled into the codegen-render_c test (see
// CMakeLists.txt here): the emitter renders them, the test runs the compiled functions and
// compares them with the CPU evaluator. Inputs: x (over features) and p (per head).
#pragma once

#include <ladle/dsl/dsl.h>

#include <string>
#include <utility>
#include <vector>

namespace render_c_cases {

inline std::vector<std::pair<std::string, ladle::ir::Variant>> all() {
  using namespace ladle;
  const auto x = dsl::token_key("x");
  const auto p = dsl::head_param("p");
  std::vector<std::pair<std::string, ir::Variant>> cases;
  const auto add = [&](const char* name, const auto& e) { cases.emplace_back(name, dsl::lower_expression(e)); };
  add("logsigmoid", dsl::logsigmoid(x));
  add("softplus", dsl::softplus(x));
  add("sigmoid", dsl::sigmoid(x));
  add("silu", dsl::silu(x));
  add("elu", dsl::elu(x));
  add("tanh", dsl::tanh(x));
  add("relu", dsl::relu(x));
  add("neg abs", -dsl::abs(x));
  add("gla gate", dsl::logsigmoid(x) / 16);
  add("tempered gate", dsl::logsigmoid(x) / p);
  add("negative softplus", -dsl::softplus(x - 2) * p);
  add("exp log", dsl::log(1 + dsl::exp(-dsl::abs(x))));
  add("sqrt pow", dsl::sqrt(dsl::abs(x)) + dsl::pow(dsl::abs(x) + 1, 0.25));
  add("min max", dsl::min(x, -p) + dsl::max(x, p) * 0.5);
  add("nested", dsl::logsigmoid(dsl::logsigmoid(x) * -3) - -1.5 / (p + 2));
  add("constants", x * (1.0f / 3) + 1e-10 - 2.5e6);
  return cases;
}

}  // namespace render_c_cases
