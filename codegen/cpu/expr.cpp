#include "expr.h"

#include <algorithm>
#include <cmath>

namespace ladle::cpu {

RowProgram::RowProgram(const ir::Variant& variant, const ir::Expr& expr, std::int64_t width)
    : RowProgram(expr, width, [&](const ir::Node& leaf) {
        return ir::extent_of(variant.inputs[leaf.input].kind).feature != ir::Feature::none;
      }) {
  varies_over_tokens_ = ir::extent(variant, expr).token;
}

RowProgram::RowProgram(const ir::Expr& expr, std::int64_t width, const std::function<bool(const ir::Node&)>& varies) {
  std::vector<bool> over_row(expr.nodes.size());
  for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
    const ir::Node& n = expr.nodes[i];
    if (n.op == ir::Op::input || ir::is_attention_leaf(n.op))
      over_row[i] = varies(n);
    else if (n.op != ir::Op::constant)
      over_row[i] = over_row[n.a] || (n.b >= 0 && over_row[n.b]);
    Step step;
    step.node = n;
    step.length = over_row[i] ? width : 1;
    step.offset = scratch_size_;
    scratch_size_ += static_cast<std::size_t>(step.length);
    nodes_.push_back(step);
  }
  varies_over_row_ = !over_row.empty() && over_row.back();
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
    case ir::Op::logical_not: return x == 0.0f ? 1.0f : 0.0f;
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
    case ir::Op::less: return a < b ? 1.0f : 0.0f;
    case ir::Op::less_equal: return a <= b ? 1.0f : 0.0f;
    case ir::Op::equal: return a == b ? 1.0f : 0.0f;
    case ir::Op::not_equal: return a != b ? 1.0f : 0.0f;
    case ir::Op::logical_and: return a != 0.0f && b != 0.0f ? 1.0f : 0.0f;
    case ir::Op::logical_or: return a != 0.0f || b != 0.0f ? 1.0f : 0.0f;
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
      case ir::Op::score:
      case ir::Op::query_index:
      case ir::Op::key_index:
      case ir::Op::head_index:
      case ir::Op::batch_index: loader.load_leaf(n.op, out, len); break;
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
