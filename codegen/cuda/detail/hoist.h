// Loop-invariant factors of an expression, computed once per thread instead of per element.
//
// A score expression such as logits_soft_cap * tanh(score * scale / logits_soft_cap), rendered
// as written and multiplied by log2 e, costs an IEEE division and four multiplies per (query,
// key) pair: C arithmetic cannot be reassociated by the compiler. hoist_invariants rewrites it
// into c1 * tanh(c2 * score), where c1 = log2 e * logits_soft_cap and c2 = scale /
// logits_soft_cap are computed once before the key loop. The rewrite gathers every product and
// quotient into a monomial, keeps its varying factors (score, the indices, pair inputs) in
// place and folds the invariant ones (constants, scalars, per-head inputs, the head and batch
// index) into one value; an outer factor (log2 e) is pushed through sums into each term. The
// result differs from the expression as written by rounding only (a few fp32 ulps).
// Internal to codegen (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <ladle/dsl/ir.h>

namespace ladle::cuda::detail {

struct HoistedExpression {
  // The expression's inputs, then one scalar input per hoisted value (named ladle_hoisted<k>).
  std::vector<ir::Input> inputs;
  // factor * the expression, reading the hoisted values as those scalar inputs. Its tanh nodes
  // take their argument multiplied by tanh_argument_factor (a family's scaled tanh).
  ir::Expr expr;
  // invariants[k] computes inputs[first_hoisted + k] from the original inputs (plain math: its
  // tanh is tanh).
  std::vector<ir::Expr> invariants;
  std::size_t first_hoisted = 0;
};

// Whether a node of `expr` varies over the (query, key) pairs: a score, a query or key index, a
// pair input or anything computed from them.
std::vector<bool> varying_nodes(const std::vector<ir::Input>& inputs, const ir::Expr& expr);

// The top of a hoisted expression as factor * rest, the factor an invariant node (operand a of the
// root multiply, where hoist_invariants puts it): the two nodes; nullopt for any other top.
struct LeadingFactor {
  std::int32_t factor = -1, rest = -1;
};
std::optional<LeadingFactor> leading_factor(const HoistedExpression& h);
// The value of node `node` of h.expr where it reads only constants and scalar inputs (a hoisted
// value through its invariant expression); nullopt otherwise. scalars: index-aligned with the
// original inputs.
std::optional<double> scalar_value(const HoistedExpression& h, std::int32_t node, const std::vector<float>& scalars);
// The subtree under `node` as an expression of its own.
ir::Expr subtree(const ir::Expr& expr, std::int32_t node);

HoistedExpression hoist_invariants(const std::vector<ir::Input>& inputs, const ir::Expr& expr, double factor = 1.0,
                                   double tanh_argument_factor = 1.0);

}  // namespace ladle::cuda::detail
