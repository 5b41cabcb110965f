#include "cpu_expr.h"

#include <algorithm>
#include <cmath>

namespace ladle::cpu {

RowProgram::RowProgram(const ir::Variant& variant, const ir::Expr& expr, std::int64_t width)
    : extent_(ir::extent(variant, expr)) {
  std::vector<bool> over_features(expr.nodes.size());
  for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
    const ir::Node& n = expr.nodes[i];
    if (n.op == ir::Op::input)
      over_features[i] = ir::extent_of(variant.inputs[n.input].kind).feature != ir::Feature::none;
    else if (n.op != ir::Op::constant)
      over_features[i] = over_features[n.a] || (n.b >= 0 && over_features[n.b]);
    Step step;
    step.node = n;
    step.length = over_features[i] ? width : 1;
    step.offset = scratch_size_;
    scratch_size_ += static_cast<std::size_t>(step.length);
    nodes_.push_back(step);
  }
}

namespace {

float unary(ir::Op op, float x) {
  switch (op) {
    case ir::Op::neg: return -x;
    case ir::Op::abs: return std::fabs(x);
    case ir::Op::exp: return std::exp(x);
    case ir::Op::log: return std::log(x);
    case ir::Op::sqrt: return std::sqrt(x);
    case ir::Op::sigmoid: return 1.0f / (1.0f + std::exp(-x));
    case ir::Op::logsigmoid: return std::fmin(x, 0.0f) - std::log1p(std::exp(-std::fabs(x)));
    case ir::Op::softplus: return std::fmax(x, 0.0f) + std::log1p(std::exp(-std::fabs(x)));
    case ir::Op::tanh: return std::tanh(x);
    case ir::Op::elu: return x > 0.0f ? x : std::expm1(x);
    case ir::Op::relu: return std::fmax(x, 0.0f);
    case ir::Op::silu: return x / (1.0f + std::exp(-x));
    default: return x;
  }
}

float binary(ir::Op op, float a, float b) {
  switch (op) {
    case ir::Op::add: return a + b;
    case ir::Op::sub: return a - b;
    case ir::Op::mul: return a * b;
    case ir::Op::div: return a / b;
    case ir::Op::min: return std::fmin(a, b);
    case ir::Op::max: return std::fmax(a, b);
    case ir::Op::pow: return std::pow(a, b);
    default: return a;
  }
}

}  // namespace

const float* RowProgram::evaluate(const InputLoader& loader, float* scratch) const {
  for (const Step& step : nodes_) {
    float* out = scratch + step.offset;
    const ir::Node& n = step.node;
    const std::int64_t len = step.length;
    switch (n.op) {
      case ir::Op::constant: out[0] = n.value; break;
      case ir::Op::input: loader.load(n.input, out, len); break;
      default:
        if (ir::is_unary(n.op)) {
          const float* a = scratch + nodes_[n.a].offset;
          for (std::int64_t j = 0; j < len; ++j) out[j] = unary(n.op, a[j]);
        } else {
          // An operand of length 1 is broadcast over the row.
          const Step& sa = nodes_[n.a];
          const Step& sb = nodes_[n.b];
          const float* a = scratch + sa.offset;
          const float* b = scratch + sb.offset;
          const std::int64_t step_a = sa.length == 1 ? 0 : 1, step_b = sb.length == 1 ? 0 : 1;
          for (std::int64_t j = 0; j < len; ++j) out[j] = binary(n.op, a[j * step_a], b[j * step_b]);
        }
    }
  }
  return scratch + nodes_.back().offset;
}

}  // namespace ladle::cpu
