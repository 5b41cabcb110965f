#include "attention_ir.h"

#include <cmath>

#include "detail/ir_common.h"

namespace ladle::ir {

int AttentionVariant::find_input(const std::string& input_name) const {
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].name == input_name) return static_cast<int>(i);
  return -1;
}

namespace {

void check_expr(const AttentionVariant& variant, const Expr& expr, const std::string& where,
                std::vector<std::string>& problems) {
  for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
    const Node& n = expr.nodes[i];
    const std::string node = where + ": node " + std::to_string(i) + " (" + op_name(n.op) + ")";
    if (!operands_valid(expr, i)) {
      problems.push_back(node + " has operands that are missing or not earlier nodes");
      return;
    }
    if (n.op == Op::input) {
      if (n.input < 0 || static_cast<std::size_t>(n.input) >= variant.inputs.size()) {
        problems.push_back(node + " reads input " + std::to_string(n.input) + ", which does not exist");
        return;
      }
      const Input& in = variant.inputs[n.input];
      if (in.role != Role::other)
        problems.push_back(node + " reads '" + in.name + "' directly; a score sees q and k only through `score`");
    }
    if (n.op == Op::constant && !std::isfinite(n.value))
      problems.push_back(node + ": constant " + shortest(n.value) + " is not finite");
  }
}

}  // namespace

std::vector<std::string> validate(const AttentionVariant& variant) {
  std::vector<std::string> problems;
  const auto& inputs = variant.inputs;
  const Role roles[3] = {Role::query, Role::key, Role::value};
  const InputKind kinds[3] = {InputKind::token_key, InputKind::token_key, InputKind::token_value};
  for (int r = 0; r < 3; ++r) {
    if (inputs.size() <= static_cast<std::size_t>(r) || inputs[r].role != roles[r] || inputs[r].kind != kinds[r])
      problems.push_back(std::string("input ") + std::to_string(r) + " must be the " + role_name(roles[r]) + " " +
                         shape_of(kinds[r], roles[r]));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Input& in = inputs[i];
    if (in.name.empty()) problems.push_back("input " + std::to_string(i) + " has no name");
    for (std::size_t j = 0; j < i; ++j)
      if (inputs[j].name == in.name) problems.push_back("input name '" + in.name + "' is used twice");
    if (i >= 3) {
      if (in.role != Role::other) problems.push_back("input '" + in.name + "' repeats the role " + role_name(in.role));
      if (in.kind != InputKind::pair && in.kind != InputKind::head && in.kind != InputKind::scalar)
        problems.push_back("input '" + in.name + "' is " + shape_of(in.kind, in.role) +
                           "; an attention score reads pair [B,H,Tq,Tk], per-head [H] or scalar inputs");
    }
  }
  if (variant.score.empty()) problems.push_back("the score expression is required but empty");
  check_expr(variant, variant.score, "score", problems);
  check_expr(variant, variant.keep, "keep", problems);
  return problems;
}

std::uint64_t hash(const AttentionVariant& variant) {
  Fnv1a h;
  h.str("ladle.ir.attention.v1");
  h.inputs(variant.inputs);
  h.expr(variant.score);
  h.expr(variant.keep);
  for (bool flag : {variant.causal, variant.window, variant.segment_ids, variant.sinks, variant.dropout})
    h.byte(flag ? 1 : 0);
  return h.value();
}

std::string hash_hex(const AttentionVariant& variant) { return hex16(hash(variant)); }

std::string to_string(const AttentionVariant& variant) {
  std::string out = "attention " + (variant.name.empty() ? std::string("(unnamed)") : variant.name) + "  hash " +
                    hash_hex(variant) + "\ninputs:\n";
  for (const Input& in : variant.inputs) {
    std::string name = in.name;
    name.resize(std::max<std::size_t>(name.size(), 16), ' ');
    out += "  " + name + " " + shape_of(in.kind, in.role) + "\n";
  }
  out += "per sequence, query head h, query i and key j (score = q_i . k_j):\n";
  out += "  logit  = " + to_string(variant.inputs, variant.score) + "\n";
  std::string attend;
  const auto also = [&](const std::string& term) { attend += (attend.empty() ? "" : "\n        && ") + term; };
  if (!variant.keep.empty()) also(to_string(variant.inputs, variant.keep));
  if (variant.causal) also("j <= i + (Tk - Tq)                          (causal)");
  if (variant.window) also("|j - (i + Tk - Tq)| within (left, right)     (sliding window)");
  if (variant.segment_ids) also("q_segment_ids[i] == kv_segment_ids[j]       (segment ids)");
  out += "  attend = " + (attend.empty() ? std::string("every j") : attend) + "\n";
  out += std::string("  p      = softmax_j(logit)") + (variant.sinks ? " with softmax_aux[h, :] in the denominator" : "") +
         "\n";
  out += std::string("  o_i    = sum_j ") + (variant.dropout ? "dropout(p_ij)" : "p_ij") + " v_j\n";
  return out;
}

}  // namespace ladle::ir
