// Symbolic partial derivatives of elementwise expressions (ir::derivative), forward mode: each
// node's derivative is built from its operands' derivatives and values, in the same topological
// order, so the result is again an ir::Expr that every evaluator (the CPU row programs, render_c)
// runs as it runs the forward expression.
#include <ladle/dsl/ir.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace ladle::ir {

namespace {

class Builder {
 public:
  explicit Builder(const Expr& e) : out_(e) {}
  static constexpr std::int32_t zero = -1;  // a derivative known to be 0 (no node)

  std::int32_t constant(float value) { return push({Op::constant, -1, -1, -1, value}); }
  std::int32_t unary(Op op, std::int32_t a) { return push({op, a, -1, -1, 0.0f}); }
  std::int32_t binary(Op op, std::int32_t a, std::int32_t b) { return push({op, a, b, -1, 0.0f}); }

  // Sums and products that skip a known zero.
  std::int32_t add(std::int32_t a, std::int32_t b) {
    if (a == zero) return b;
    if (b == zero) return a;
    return binary(Op::add, a, b);
  }
  std::int32_t sub(std::int32_t a, std::int32_t b) {
    if (b == zero) return a;
    if (a == zero) return unary(Op::neg, b);
    return binary(Op::sub, a, b);
  }
  std::int32_t mul(std::int32_t a, std::int32_t b) {
    if (a == zero || b == zero) return zero;
    return binary(Op::mul, a, b);
  }
  std::int32_t div(std::int32_t a, std::int32_t b) { return a == zero ? zero : binary(Op::div, a, b); }

  Expr take(std::int32_t root) {
    if (root == zero) return Expr{{Node{Op::constant, -1, -1, -1, 0.0f}}};
    // The root must be the last node: a copy of it at the end where the result is an earlier node.
    if (root != static_cast<std::int32_t>(out_.nodes.size()) - 1) push(out_.nodes[static_cast<std::size_t>(root)]);
    return std::move(out_);
  }

 private:
  std::int32_t push(const Node& n) {
    out_.nodes.push_back(n);
    return static_cast<std::int32_t>(out_.nodes.size()) - 1;
  }
  Expr out_;
};

// d e / d (the leaves `is_target` picks), forward mode.
template <typename Target>
Expr differentiate(const Expr& e, const Target& is_target) {
  if (e.empty()) throw std::invalid_argument("ir::derivative: empty expression");
  Builder b(e);
  constexpr std::int32_t zero = Builder::zero;
  std::vector<std::int32_t> d(e.nodes.size(), zero);
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const Node& n = e.nodes[i];
    const std::int32_t self = static_cast<std::int32_t>(i), x = n.a, y = n.b;
    const std::int32_t dx = x >= 0 ? d[static_cast<std::size_t>(x)] : zero, dy = y >= 0 ? d[static_cast<std::size_t>(y)] : zero;
    if (n.op == Op::input || is_attention_leaf(n.op)) {
      d[i] = is_target(n) ? b.constant(1.0f) : zero;
      continue;
    }
    if (is_unary(n.op) && dx == zero) continue;
    if (!is_unary(n.op) && n.op != Op::constant && !is_attention_leaf(n.op) && dx == zero && dy == zero) continue;
    std::int32_t r = zero;
    switch (n.op) {
      case Op::constant:
      case Op::score:
      case Op::query_index:
      case Op::key_index:
      case Op::head_index:
      case Op::batch_index:
      case Op::less:
      case Op::less_equal:
      case Op::equal:
      case Op::not_equal:
      case Op::logical_and:
      case Op::logical_or:
      case Op::logical_not: r = zero; break;  // piecewise constant (or a leaf other than an input)
      case Op::input: break;                  // above
      case Op::neg: r = b.unary(Op::neg, dx); break;
      case Op::abs: {  // sign(x) dx, 0 at 0
        const std::int32_t c0 = b.constant(0.0f);
        r = b.mul(b.binary(Op::sub, b.binary(Op::less, c0, x), b.binary(Op::less, x, c0)), dx);
        break;
      }
      case Op::exp: r = b.mul(self, dx); break;
      case Op::log: r = b.div(dx, x); break;
      case Op::sqrt: r = b.div(b.mul(b.constant(0.5f), dx), self); break;
      case Op::sigmoid: r = b.mul(b.mul(self, b.binary(Op::sub, b.constant(1.0f), self)), dx); break;
      case Op::logsigmoid: r = b.mul(b.unary(Op::sigmoid, b.unary(Op::neg, x)), dx); break;  // 1 - sigmoid(x)
      case Op::softplus: r = b.mul(b.unary(Op::sigmoid, x), dx); break;
      case Op::tanh: r = b.mul(b.binary(Op::sub, b.constant(1.0f), b.binary(Op::mul, self, self)), dx); break;
      case Op::elu: {  // 1 for x > 0, else exp(x) = elu(x) + 1
        const std::int32_t below = b.binary(Op::less_equal, x, b.constant(0.0f));
        r = b.mul(b.binary(Op::add, b.constant(1.0f), b.binary(Op::mul, below, self)), dx);
        break;
      }
      case Op::relu: r = b.mul(b.binary(Op::less, b.constant(0.0f), x), dx); break;
      case Op::silu: {  // sigmoid(x) (1 + x (1 - sigmoid(x)))
        const std::int32_t s = b.unary(Op::sigmoid, x);
        const std::int32_t inner = b.binary(Op::add, b.constant(1.0f), b.binary(Op::mul, x, b.binary(Op::sub, b.constant(1.0f), s)));
        r = b.mul(b.binary(Op::mul, s, inner), dx);
        break;
      }
      case Op::add: r = b.add(dx, dy); break;
      case Op::sub: r = b.sub(dx, dy); break;
      case Op::mul: r = b.add(b.mul(dx, y), b.mul(x, dy)); break;
      case Op::div: r = b.sub(b.div(dx, y), b.mul(b.div(self, y), dy)); break;  // dx / y - (x / y) dy / y
      case Op::min: r = b.add(b.mul(b.binary(Op::less_equal, x, y), dx), b.mul(b.binary(Op::less, y, x), dy)); break;
      case Op::max: r = b.add(b.mul(b.binary(Op::less_equal, y, x), dx), b.mul(b.binary(Op::less, x, y), dy)); break;
      case Op::pow: {  // y x^(y-1) dx + x^y log(x) dy
        const std::int32_t base = dx == zero ? zero : b.mul(b.binary(Op::mul, y, b.binary(Op::pow, x, b.binary(Op::sub, y, b.constant(1.0f)))), dx);
        const std::int32_t exponent = dy == zero ? zero : b.mul(b.binary(Op::mul, self, b.unary(Op::log, x)), dy);
        r = b.add(base, exponent);
        break;
      }
    }
    d[i] = r;
  }
  return b.take(d.back());
}

}  // namespace

Expr derivative(const Expr& expr, std::int32_t input) {
  return differentiate(expr, [&](const Node& n) { return n.op == Op::input && n.input == input; });
}

Expr derivative(const Expr& expr, Op leaf) {
  if (!is_attention_leaf(leaf)) throw std::invalid_argument(std::string("ir::derivative: ") + op_name(leaf) + " is not a leaf");
  return differentiate(expr, [&](const Node& n) { return n.op == leaf; });
}

}  // namespace ladle::ir
