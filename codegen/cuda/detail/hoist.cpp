#include "hoist.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>

namespace ladle::cuda::detail {

std::vector<bool> varying_nodes(const std::vector<ir::Input>& inputs, const ir::Expr& expr) {
  std::vector<bool> varying(expr.nodes.size(), false);
  for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
    const ir::Node& n = expr.nodes[i];
    switch (n.op) {
      case ir::Op::score:
      case ir::Op::query_index:
      case ir::Op::key_index: varying[i] = true; break;
      case ir::Op::input: {
        const ir::InputKind kind = inputs.at(n.input).kind;
        varying[i] = kind != ir::InputKind::scalar && kind != ir::InputKind::head;
        break;
      }
      default:
        varying[i] = (n.a >= 0 && varying[n.a]) || (n.b >= 0 && varying[n.b]);
        break;
    }
  }
  return varying;
}

namespace {

// c * prod(factors), each factor a node of the source expression, multiplied or divided.
struct Monomial {
  double c = 1.0;
  std::vector<std::pair<std::int32_t, bool>> factors;  // (node, divides)
  bool trivial() const { return c == 1.0 && factors.empty(); }
};

class Hoister {
 public:
  Hoister(const std::vector<ir::Input>& inputs, const ir::Expr& src, double tanh_argument_factor)
      : inputs_(inputs), src_(src), varying_(varying_nodes(inputs, src)), tanh_factor_(tanh_argument_factor) {
    // Whether a node reads a rounded value (a score, a pair input); the others are exact
    // integers of the indices, whose differences must be formed before any scaling.
    reads_values_.assign(src.nodes.size(), false);
    for (std::size_t i = 0; i < src.nodes.size(); ++i) {
      const ir::Node& n = src.nodes[i];
      reads_values_[i] = n.op == ir::Op::score ||
                         (n.op == ir::Op::input && inputs.at(n.input).kind == ir::InputKind::pair) ||
                         (n.a >= 0 && reads_values_[n.a]) || (n.b >= 0 && reads_values_[n.b]);
    }
  }

  HoistedExpression run(double factor) {
    HoistedExpression h;
    h.first_hoisted = inputs_.size();
    if (!src_.empty()) {
      Monomial m;
      m.c = factor;
      rewrite(src_.root(), m);
    }
    h.inputs = inputs_;
    for (std::size_t k = 0; k < invariants_.size(); ++k)
      h.inputs.push_back(ir::Input{"ladle_hoisted" + std::to_string(k), ir::InputKind::scalar, ir::Role::other});
    h.expr = std::move(out_);
    h.invariants = std::move(invariants_);
    return h;
  }

 private:
  std::int32_t push(ir::Expr& e, ir::Node n) {
    e.nodes.push_back(n);
    return e.root();
  }
  std::int32_t constant(ir::Expr& e, double v) {
    ir::Node n;
    n.op = ir::Op::constant;
    n.value = static_cast<float>(v);
    return push(e, n);
  }
  std::int32_t binary(ir::Expr& e, ir::Op op, std::int32_t a, std::int32_t b) {
    ir::Node n;
    n.op = op, n.a = a, n.b = b;
    return push(e, n);
  }

  // The source subtree under `node`, copied into `e` (memo: source node -> node of e).
  std::int32_t copy(ir::Expr& e, std::int32_t node, std::map<std::int32_t, std::int32_t>& memo) {
    if (auto it = memo.find(node); it != memo.end()) return it->second;
    ir::Node n = src_.nodes[node];
    if (n.a >= 0) n.a = copy(e, n.a, memo);
    if (n.b >= 0) n.b = copy(e, n.b, memo);
    return memo[node] = push(e, n);
  }

  // A leaf every thread reads as is (a constant, a scalar or per-head input, an index).
  bool is_leaf(std::int32_t node) const {
    const ir::Node& n = src_.nodes[node];
    return n.op == ir::Op::constant || n.op == ir::Op::input || ir::is_attention_leaf(n.op);
  }

  // The invariant value of m: a constant, a leaf read as is, or a hoisted value.
  std::int32_t invariant(const Monomial& m) {
    if (m.factors.empty()) return constant(out_, m.c);
    if (m.c == 1.0 && m.factors.size() == 1 && !m.factors[0].second && is_leaf(m.factors[0].first)) {
      std::map<std::int32_t, std::int32_t> memo;
      return copy(out_, m.factors[0].first, memo);
    }
    ir::Expr e;
    std::map<std::int32_t, std::int32_t> memo;
    std::int32_t r = -1;
    for (const auto& [node, divides] : m.factors)
      if (!divides) r = r < 0 ? copy(e, node, memo) : binary(e, ir::Op::mul, r, copy(e, node, memo));
    if (r < 0) r = constant(e, m.c);
    else if (m.c != 1.0) r = binary(e, ir::Op::mul, constant(e, m.c), r);
    for (const auto& [node, divides] : m.factors)
      if (divides) r = binary(e, ir::Op::div, r, copy(e, node, memo));
    std::size_t k = 0;
    while (k < invariants_.size() && !(invariants_[k] == e)) ++k;
    if (k == invariants_.size()) invariants_.push_back(std::move(e));
    ir::Node n;
    n.op = ir::Op::input;
    n.input = static_cast<std::int32_t>(inputs_.size() + k);
    return push(out_, n);
  }

  // m * t, t a node of the output.
  std::int32_t scaled(std::int32_t t, const Monomial& m) {
    if (m.trivial()) return t;
    return binary(out_, ir::Op::mul, invariant(m), t);
  }

  // Gathers the factors of a product / quotient under `node` into m (invariant ones) and
  // `varying` (the others, with whether they divide).
  void collect(std::int32_t node, bool divides, Monomial& m, std::vector<std::pair<std::int32_t, bool>>& varying) {
    const ir::Node& n = src_.nodes[node];
    if (!varying_[node]) {
      if (n.op == ir::Op::constant && n.value != 0.0f) m.c = divides ? m.c / n.value : m.c * n.value;
      else m.factors.emplace_back(node, divides);
      return;
    }
    switch (n.op) {
      case ir::Op::mul:
        collect(n.a, divides, m, varying);
        collect(n.b, divides, m, varying);
        return;
      case ir::Op::div:
        collect(n.a, divides, m, varying);
        collect(n.b, !divides, m, varying);
        return;
      case ir::Op::neg:
        m.c = -m.c;
        collect(n.a, divides, m, varying);
        return;
      default: varying.emplace_back(node, divides); return;
    }
  }

  // m * (source node), as a node of the output.
  std::int32_t rewrite(std::int32_t node, Monomial m) {
    if (!varying_[node]) {
      m.factors.emplace_back(node, false);
      return invariant(m);
    }
    const ir::Node& n = src_.nodes[node];
    switch (n.op) {
      case ir::Op::mul:
      case ir::Op::div:
      case ir::Op::neg: {
        std::vector<std::pair<std::int32_t, bool>> varying;
        collect(node, false, m, varying);
        std::int32_t r = -1;
        for (const auto& [v, divides] : varying)
          if (!divides) r = r < 0 ? rewrite(v, {}) : binary(out_, ir::Op::mul, r, rewrite(v, {}));
        r = r < 0 ? invariant(m) : scaled(r, m);
        for (const auto& [v, divides] : varying)
          if (divides) r = binary(out_, ir::Op::div, r, rewrite(v, {}));
        return r;
      }
      case ir::Op::add:
      case ir::Op::sub: {
        // m pushed into both terms (score * scale + bias: log2 e joins each term's own factor),
        // unless the terms are exact index arithmetic: scaling j and i apart would round each
        // before the difference and lose (j - i) to cancellation.
        if (!reads_values_[node]) {
          const std::int32_t ra = rewrite(n.a, {});
          return scaled(binary(out_, n.op, ra, rewrite(n.b, {})), m);
        }
        Monomial a = m;
        const std::int32_t ra = rewrite(n.a, a);
        const std::int32_t rb = rewrite(n.b, m);
        return binary(out_, n.op, ra, rb);
      }
      case ir::Op::tanh: {
        Monomial arg;
        arg.c = tanh_factor_;
        ir::Node t;
        t.op = ir::Op::tanh;
        t.a = rewrite(n.a, arg);
        return scaled(push(out_, t), m);
      }
      default: {
        if (ir::is_attention_leaf(n.op) || n.op == ir::Op::input) {
          std::map<std::int32_t, std::int32_t> memo;
          return scaled(copy(out_, node, memo), m);
        }
        ir::Node t = n;
        if (t.a >= 0) t.a = rewrite(n.a, {});
        if (t.b >= 0) t.b = rewrite(n.b, {});
        return scaled(push(out_, t), m);
      }
    }
  }

  const std::vector<ir::Input>& inputs_;
  const ir::Expr& src_;
  std::vector<bool> varying_, reads_values_;
  double tanh_factor_;
  ir::Expr out_;
  std::vector<ir::Expr> invariants_;
};

}  // namespace

std::optional<LeadingFactor> leading_factor(const HoistedExpression& h) {
  if (h.expr.empty()) return std::nullopt;
  const ir::Node& root = h.expr.nodes[h.expr.root()];
  if (root.op != ir::Op::mul) return std::nullopt;
  if (varying_nodes(h.inputs, h.expr)[root.a]) return std::nullopt;
  return LeadingFactor{root.a, root.b};
}

namespace {

std::optional<double> evaluate_scalars(const std::vector<ir::Input>& inputs, const ir::Expr& e, std::int32_t node,
                                       const std::vector<float>& scalars, const HoistedExpression* h) {
  const ir::Node& n = e.nodes.at(node);
  std::optional<double> a, b;
  if (n.a >= 0 && !(a = evaluate_scalars(inputs, e, n.a, scalars, h))) return std::nullopt;
  if (n.b >= 0 && !(b = evaluate_scalars(inputs, e, n.b, scalars, h))) return std::nullopt;
  switch (n.op) {
    case ir::Op::constant: return n.value;
    case ir::Op::input: {
      const auto k = static_cast<std::size_t>(n.input);
      if (h && k >= h->first_hoisted) {
        const ir::Expr& inv = h->invariants.at(k - h->first_hoisted);
        return evaluate_scalars(inputs, inv, inv.root(), scalars, nullptr);
      }
      if (inputs.at(k).kind != ir::InputKind::scalar || k >= scalars.size()) return std::nullopt;
      return scalars[k];
    }
    case ir::Op::neg: return -*a;
    case ir::Op::abs: return std::fabs(*a);
    case ir::Op::exp: return std::exp(*a);
    case ir::Op::log: return std::log(*a);
    case ir::Op::sqrt: return std::sqrt(*a);
    case ir::Op::tanh: return std::tanh(*a);
    case ir::Op::sigmoid: return 1.0 / (1.0 + std::exp(-*a));
    case ir::Op::add: return *a + *b;
    case ir::Op::sub: return *a - *b;
    case ir::Op::mul: return *a * *b;
    case ir::Op::div: return *a / *b;
    case ir::Op::min: return std::fmin(*a, *b);
    case ir::Op::max: return std::fmax(*a, *b);
    case ir::Op::pow: return std::pow(*a, *b);
    default: return std::nullopt;  // an index, a per-head input, a comparison: not one value per call
  }
}

}  // namespace

std::optional<double> scalar_value(const HoistedExpression& h, std::int32_t node, const std::vector<float>& scalars) {
  // Hoisted values are computed from the original inputs (h.inputs begins with them).
  return evaluate_scalars(h.inputs, h.expr, node, scalars, &h);
}

ir::Expr subtree(const ir::Expr& expr, std::int32_t node) {
  ir::Expr out;
  std::map<std::int32_t, std::int32_t> memo;
  const auto copy = [&](const auto& self, std::int32_t k) -> std::int32_t {
    if (auto it = memo.find(k); it != memo.end()) return it->second;
    ir::Node n = expr.nodes.at(k);
    if (n.a >= 0) n.a = self(self, n.a);
    if (n.b >= 0) n.b = self(self, n.b);
    out.nodes.push_back(n);
    return memo[k] = out.root();
  };
  copy(copy, node);
  return out;
}

HoistedExpression hoist_invariants(const std::vector<ir::Input>& inputs, const ir::Expr& expr, double factor,
                                   double tanh_argument_factor) {
  return Hoister(inputs, expr, tanh_argument_factor).run(factor);
}

}  // namespace ladle::cuda::detail
