#include "render_c.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace ladle::ir {

std::string render_c_literal(float value) {
  char text[40];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(text, sizeof text, "%.*g", precision, static_cast<double>(value));
    if (std::strtof(text, nullptr) == value) break;
  }
  std::string literal = text;
  if (literal.find_first_of(".e") == std::string::npos) literal += ".0";
  return literal + "f";
}

namespace {

// Needs no parentheses as an operand: a name, a call, an indexed or member access.
bool is_primary(const std::string& s) {
  int depth = 0;
  for (char c : s) {
    if (c == '(' || c == '[') ++depth;
    else if (c == ')' || c == ']') --depth;
    else if (depth == 0 && !(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'))
      return false;
  }
  return true;
}

std::string call(const char* f, const std::string& a) { return std::string(f) + "(" + a + ")"; }
std::string call(const char* f, const std::string& a, const std::string& b) {
  return std::string(f) + "(" + a + ", " + b + ")";
}

}  // namespace

std::string render_c(const Variant& variant, const Expr& expr, const LoadFn& load) {
  return render_c(variant.inputs, expr, load, [](Op leaf) -> std::string {
    throw std::logic_error(std::string("render_c: a recurrence has no ") + op_name(leaf));
  });
}

std::string render_c(const std::vector<Input>& inputs, const Expr& expr, const LoadFn& load, const LeafFn& leaf,
                     const RenderFunctions& functions) {
  std::vector<std::string> text(expr.nodes.size());
  for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
    const Node& n = expr.nodes[i];
    const std::string& a = n.a >= 0 ? text[n.a] : text[i];
    const std::string& b = n.b >= 0 ? text[n.b] : text[i];
    std::string& out = text[i];
    switch (n.op) {
      case Op::constant: {
        const std::string literal = render_c_literal(n.value);
        out = literal[0] == '-' ? "(" + literal + ")" : literal;
        break;
      }
      case Op::input: {
        const std::string loaded = load(inputs.at(n.input), n.input);
        out = is_primary(loaded) ? loaded : "(" + loaded + ")";
        break;
      }
      case Op::neg: out = "(-" + a + ")"; break;
      case Op::abs: out = call("fabsf", a); break;
      case Op::exp: out = call("expf", a); break;
      case Op::log: out = call("logf", a); break;
      case Op::sqrt: out = call("sqrtf", a); break;
      case Op::sigmoid: out = "(1.0f / (1.0f + expf(-" + a + ")))"; break;
      case Op::logsigmoid: out = "(fminf(" + a + ", 0.0f) - log1pf(expf(-fabsf(" + a + "))))"; break;
      case Op::softplus: out = "(fmaxf(" + a + ", 0.0f) + log1pf(expf(-fabsf(" + a + "))))"; break;
      case Op::tanh: out = call(functions.tanh.c_str(), a); break;
      case Op::elu: out = "(" + a + " > 0.0f ? " + a + " : expm1f(" + a + "))"; break;
      case Op::relu: out = call("fmaxf", a, "0.0f"); break;
      case Op::silu: out = "(" + a + " / (1.0f + expf(-" + a + ")))"; break;
      case Op::add: out = "(" + a + " + " + b + ")"; break;
      case Op::sub: out = "(" + a + " - " + b + ")"; break;
      case Op::mul: out = "(" + a + " * " + b + ")"; break;
      case Op::div: out = "(" + a + " / " + b + ")"; break;
      case Op::min: out = call("fminf", a, b); break;
      case Op::max: out = call("fmaxf", a, b); break;
      case Op::pow: out = call("powf", a, b); break;
      case Op::score:
      case Op::query_index:
      case Op::key_index:
      case Op::head_index:
      case Op::batch_index: {
        const std::string loaded = leaf(n.op);
        out = is_primary(loaded) ? loaded : "(" + loaded + ")";
        break;
      }
      // Comparisons and logic as floats, 1.0f or 0.0f, so they mix with arithmetic.
      case Op::less: out = "(" + a + " < " + b + " ? 1.0f : 0.0f)"; break;
      case Op::less_equal: out = "(" + a + " <= " + b + " ? 1.0f : 0.0f)"; break;
      case Op::equal: out = "(" + a + " == " + b + " ? 1.0f : 0.0f)"; break;
      case Op::not_equal: out = "(" + a + " != " + b + " ? 1.0f : 0.0f)"; break;
      case Op::logical_and: out = "(" + a + " != 0.0f && " + b + " != 0.0f ? 1.0f : 0.0f)"; break;
      case Op::logical_or: out = "(" + a + " != 0.0f || " + b + " != 0.0f ? 1.0f : 0.0f)"; break;
      case Op::logical_not: out = "(" + a + " == 0.0f ? 1.0f : 0.0f)"; break;
    }
  }
  return text.empty() ? std::string("0.0f") : text.back();
}

}  // namespace ladle::ir
