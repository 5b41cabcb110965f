#include "ir.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "detail/ir_common.h"

namespace ladle::ir {

bool is_unary(Op op) { return (op >= Op::neg && op <= Op::silu) || op == Op::logical_not; }
bool is_binary(Op op) { return (op >= Op::add && op <= Op::pow) || (op >= Op::less && op <= Op::logical_or); }
bool is_attention_leaf(Op op) { return op >= Op::score && op <= Op::batch_index; }
bool is_attention_only(Op op) { return op >= Op::score && op <= Op::logical_not; }

const char* op_name(Op op) {
  switch (op) {
    case Op::constant: return "constant";
    case Op::input: return "input";
    case Op::neg: return "neg";
    case Op::abs: return "abs";
    case Op::exp: return "exp";
    case Op::log: return "log";
    case Op::sqrt: return "sqrt";
    case Op::sigmoid: return "sigmoid";
    case Op::logsigmoid: return "logsigmoid";
    case Op::softplus: return "softplus";
    case Op::tanh: return "tanh";
    case Op::elu: return "elu";
    case Op::relu: return "relu";
    case Op::silu: return "silu";
    case Op::add: return "add";
    case Op::sub: return "sub";
    case Op::mul: return "mul";
    case Op::div: return "div";
    case Op::min: return "min";
    case Op::max: return "max";
    case Op::pow: return "pow";
    case Op::score: return "score";
    case Op::query_index: return "i";
    case Op::key_index: return "j";
    case Op::head_index: return "h";
    case Op::batch_index: return "b";
    case Op::less: return "less";
    case Op::less_equal: return "less_equal";
    case Op::equal: return "equal";
    case Op::not_equal: return "not_equal";
    case Op::logical_and: return "and";
    case Op::logical_or: return "or";
    case Op::logical_not: return "not";
  }
  return "?";
}

const char* slot_name(Slot slot) {
  switch (slot) {
    case Slot::q_feature: return "q_feature";
    case Slot::k_feature: return "k_feature";
    case Slot::v: return "v";
    case Slot::log_decay_k: return "log_decay_k";
    case Slot::log_decay_v: return "log_decay_v";
    case Slot::log_decay_head: return "log_decay_head";
    case Slot::scale: return "scale";
    case Slot::write_strength: return "write_strength";
    case Slot::bonus: return "bonus";
    case Slot::count: break;
  }
  return "?";
}

std::string form_name(const Variant& variant) {
  if (variant.update == Update::delta) {
    std::string out = variant.has(Slot::log_decay_k)      ? "the delta rule with a key-side decay (KDA)"
                      : variant.has(Slot::log_decay_head) ? "the gated delta rule"
                                                          : "the delta rule";
    if (variant.read_before_update) out += " read before the update";
    return out;
  }
  if (variant.read_before_update)
    return variant.has(Slot::bonus) ? "a read before the update with a bonus (RWKV6)" : "a read before the update";
  return variant.l2_normalize_qk ? "the diagonal-decay form with L2-normalised q and k" : "the diagonal-decay form";
}

const char* kind_name(InputKind kind) {
  switch (kind) {
    case InputKind::token_key: return "token_key";
    case InputKind::token_value: return "token_value";
    case InputKind::token_head: return "token_head";
    case InputKind::head: return "head";
    case InputKind::head_key: return "head_key";
    case InputKind::scalar: return "scalar";
    case InputKind::pair: return "pair";
  }
  return "?";
}

const char* role_name(Role role) {
  switch (role) {
    case Role::query: return "query";
    case Role::key: return "key";
    case Role::value: return "value";
    case Role::other: return "other";
  }
  return "?";
}

std::string shape_of(InputKind kind, Role role) {
  const bool kv = role == Role::key || role == Role::value;
  const std::string heads = kv ? "H_kv" : "H";
  switch (kind) {
    case InputKind::token_key: return "[B,T," + heads + ",K]";
    case InputKind::token_value: return "[B,T," + heads + ",V]";
    case InputKind::token_head: return "[B,T," + heads + "]";
    case InputKind::head: return "[H] or [B,H]";
    case InputKind::head_key: return "[H,K] or [B,H,K]";
    case InputKind::scalar: return "scalar";
    case InputKind::pair: return "[B,H,Tq,Tk] (broadcastable)";
  }
  return "?";
}

int Variant::find_input(const std::string& input_name) const {
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].name == input_name) return static_cast<int>(i);
  return -1;
}

// ---------------------------------------------------------------------------------------
// Extents

bool operands_valid(const Expr& expr, std::size_t i) {
  const Node& n = expr.nodes[i];
  const auto before = [&](std::int32_t j) { return j >= 0 && static_cast<std::size_t>(j) < i; };
  if (n.op == Op::constant || n.op == Op::input || is_attention_leaf(n.op)) return n.a < 0 && n.b < 0;
  if (is_unary(n.op)) return before(n.a) && n.b < 0;
  return before(n.a) && before(n.b);
}


Extent extent(const Variant& variant, const Expr& expr) {
  std::vector<Extent> of(expr.nodes.size());
  for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
    const Node& n = expr.nodes[i];
    if (!operands_valid(expr, i)) return {true, true, Feature::both};
    if (n.op == Op::input) {
      if (n.input < 0 || static_cast<std::size_t>(n.input) >= variant.inputs.size())
        return {true, true, Feature::both};
      of[i] = extent_of(variant.inputs[n.input].kind);
    } else if (n.op == Op::constant) {
      of[i] = {};
    } else if (is_attention_leaf(n.op)) {
      of[i] = {true, true, Feature::none};
    } else if (is_unary(n.op)) {
      of[i] = of[n.a];
    } else {
      of[i] = join(of[n.a], of[n.b]);
    }
  }
  return of.empty() ? Extent{} : of.back();
}

// ---------------------------------------------------------------------------------------
// Hash: FNV-1a 64 over a canonical encoding. Every field is written explicitly, integers
// little-endian, so the value depends on nothing but the variant's content.


std::uint64_t hash(const Variant& variant) {
  Fnv1a h;
  h.str("ladle.ir.recurrent.v1");
  h.inputs(variant.inputs);
  // The slots and fields of the diagonal-decay form keep the encoding they had before the other
  // update forms existed, so that the disk caches of those variants stay valid.
  for (std::size_t s = 0; s <= static_cast<std::size_t>(Slot::scale); ++s) h.expr(variant.slots[s]);
  h.byte(variant.normalize ? 1 : 0);
  h.f32(variant.normalize ? variant.normalize_eps : 0.0f);
  if (!variant.plain_form() || variant.has(Slot::write_strength) || variant.has(Slot::bonus)) {
    h.str("update forms");
    h.byte(static_cast<std::uint8_t>(variant.update));
    h.byte(variant.read_before_update ? 1 : 0);
    h.byte(variant.l2_normalize_qk ? 1 : 0);
    h.expr(variant.slot(Slot::write_strength));
    h.expr(variant.slot(Slot::bonus));
  }
  return h.value();
}

std::string hash_hex(const Variant& variant) { return hex16(hash(variant)); }

// ---------------------------------------------------------------------------------------
// Printing

namespace {

// Precedence of what a node prints as, C's order: || < && < == != < < <= < + - < * / <
// prefix minus and ! (and negative literals) < names, calls and non-negative literals.
int precedence(const Node& n) {
  switch (n.op) {
    case Op::logical_or: return 1;
    case Op::logical_and: return 2;
    case Op::equal:
    case Op::not_equal: return 3;
    case Op::less:
    case Op::less_equal: return 4;
    case Op::add:
    case Op::sub: return 5;
    case Op::mul:
    case Op::div: return 6;
    case Op::neg:
    case Op::logical_not: return 7;
    case Op::constant: return std::signbit(n.value) ? 7 : 8;
    default: return 8;
  }
}

const char* infix(Op op) {
  switch (op) {
    case Op::add: return " + ";
    case Op::sub: return " - ";
    case Op::mul: return " * ";
    case Op::div: return " / ";
    case Op::less: return " < ";
    case Op::less_equal: return " <= ";
    case Op::equal: return " == ";
    case Op::not_equal: return " != ";
    case Op::logical_and: return " && ";
    case Op::logical_or: return " || ";
    default: return nullptr;
  }
}

std::string print(const std::vector<Input>& inputs, const Expr& expr, std::int32_t i) {
  const Node& n = expr.nodes[i];
  if (is_attention_leaf(n.op)) return op_name(n.op);
  if (const char* sign = infix(n.op)) {
    const int p = precedence(n);
    std::string a = print(inputs, expr, n.a), b = print(inputs, expr, n.b);
    if (precedence(expr.nodes[n.a]) < p) a = "(" + a + ")";
    if (precedence(expr.nodes[n.b]) <= p) b = "(" + b + ")";
    return a + sign + b;
  }
  switch (n.op) {
    case Op::constant: return shortest(n.value);
    case Op::input:
      return n.input >= 0 && static_cast<std::size_t>(n.input) < inputs.size()
                 ? inputs[n.input].name
                 : "<input " + std::to_string(n.input) + ">";
    case Op::neg:
    case Op::logical_not: {
      const std::string a = print(inputs, expr, n.a);
      std::string out = n.op == Op::neg ? "-" : "!";
      if (precedence(expr.nodes[n.a]) <= 7) out += "(" + a + ")";
      else out += a;
      return out;
    }
    case Op::min:
    case Op::max:
    case Op::pow:
      return std::string(op_name(n.op)) + "(" + print(inputs, expr, n.a) + ", " + print(inputs, expr, n.b) + ")";
    default: return std::string(op_name(n.op)) + "(" + print(inputs, expr, n.a) + ")";
  }
}

}  // namespace

std::string to_string(const std::vector<Input>& inputs, const Expr& expr) {
  if (expr.empty()) return "(none)";
  for (std::size_t i = 0; i < expr.nodes.size(); ++i)
    if (!operands_valid(expr, i)) return "<malformed expression>";
  return print(inputs, expr, expr.root());
}

std::string to_string(const Variant& variant, const Expr& expr) { return to_string(variant.inputs, expr); }

std::string to_string(const Variant& variant) {
  std::string out = "variant " + (variant.name.empty() ? std::string("(unnamed)") : variant.name) +
                    "  hash " + hash_hex(variant) + "\n";
  out += "inputs:\n";
  for (const Input& in : variant.inputs) {
    std::string name = in.name;
    name.resize(std::max<std::size_t>(name.size(), 10), ' ');
    std::string role = role_name(in.role);
    role.resize(7, ' ');
    out += "  " + name + " " + role + shape_of(in.kind, in.role) + "\n";
  }
  const auto has = [&](Slot s) { return variant.has(s); };
  const std::string q = has(Slot::scale) ? "(scale q_feature)" : "q_feature";
  const std::string k = variant.l2_normalize_qk ? "k_hat" : "k_feature";
  const std::string qr = variant.l2_normalize_qk ? (has(Slot::scale) ? "(scale q_hat)" : "q_hat") : q;
  out += "recurrence (per sequence and query head; S is [K,V], fp32):";
  if (!variant.plain_form()) {
    out += ' ';
    out += form_name(variant);
  }
  out += "\n  S_t = ";
  if (variant.update == Update::delta) {
    const std::string beta = has(Slot::write_strength) ? "write_strength " : "";
    if (has(Slot::log_decay_head)) out += "exp(log_decay_head) ";
    const std::string decayed = has(Slot::log_decay_k) ? "diag(exp(log_decay_k)) S_{t-1}" : "S_{t-1}";
    for (const std::string& part : {std::string("(I - "), beta, k, std::string(" "), k, std::string("^T) "), decayed, std::string(" + "), beta, k,
                                    std::string(" v^T\n")})
      out += part;
  } else {
    if (has(Slot::log_decay_k)) out += "diag(exp(log_decay_k)) ";
    out += "S_{t-1}";
    if (has(Slot::log_decay_v)) out += " diag(exp(log_decay_v))";
    if (has(Slot::log_decay_head)) out += " exp(log_decay_head)";
    out += " + " + k + " v^T\n";
  }
  if (variant.read_before_update) {
    out += "  o_t = ";
    out += qr;
    if (has(Slot::bonus)) {
      out += "^T (S_{t-1} + diag(bonus) ";
      out += k;
      out += " v^T)";
    } else {
      out += "^T S_{t-1}";
    }
    out += "  (read before the update)";
  } else {
    out += "  o_t = " + qr + "^T S_t";
  }
  if (variant.normalize) {
    out += " / (" + q + "^T n_t + " + shortest(variant.normalize_eps) + ")\n  n_t = ";
    if (has(Slot::log_decay_k)) out += "diag(exp(log_decay_k)) ";
    out += "n_{t-1}";
    if (has(Slot::log_decay_head)) out += " exp(log_decay_head)";
    out += " + k_feature";
  }
  if (variant.l2_normalize_qk)
    out += "\n  q_hat, k_hat = q_feature, k_feature / sqrt(sum over K of x^2 + " + shortest(l2_normalize_eps) + ")";
  out += "\nwhere:\n";
  for (std::size_t s = 0; s < slot_count; ++s) {
    // The other forms' slots are listed only where the variant has that form.
    if ((s == static_cast<std::size_t>(Slot::write_strength) && variant.update != Update::delta && !variant.has(Slot::write_strength)) ||
        (s == static_cast<std::size_t>(Slot::bonus) && !variant.read_before_update && !variant.has(Slot::bonus)))
      continue;
    std::string name = slot_name(static_cast<Slot>(s));
    name.resize(14, ' ');
    out += "  " + name + " = " + to_string(variant, variant.slots[s]) + "\n";
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Validation

std::vector<std::string> validate(const Variant& variant) {
  std::vector<std::string> problems;
  const auto& inputs = variant.inputs;

  int role_count[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Input& in = inputs[i];
    if (in.name.empty()) problems.push_back("input " + std::to_string(i) + " has no name");
    for (std::size_t j = 0; j < i; ++j)
      if (inputs[j].name == in.name)
        problems.push_back("input name '" + in.name + "' is used twice, as " + shape_of(inputs[j].kind, inputs[j].role) +
                           " (" + role_name(inputs[j].role) + ") and as " + shape_of(in.kind, in.role) + " (" +
                           role_name(in.role) + ")");
    ++role_count[static_cast<int>(in.role)];
    const bool key_axis = in.kind == InputKind::token_key, value_axis = in.kind == InputKind::token_value;
    if ((in.role == Role::query || in.role == Role::key) && !key_axis)
      problems.push_back("input '" + in.name + "' has role " + role_name(in.role) + " but is not [B,T,H,K]");
    if (in.role == Role::value && !value_axis)
      problems.push_back("input '" + in.name + "' has role value but is not [B,T,H,V]");
    if (in.kind == InputKind::pair)
      problems.push_back("input '" + in.name + "' is a per-(query, key) pair input, which only softmax attention has");
    if (in.kind == InputKind::head_key && in.role != Role::other)
      problems.push_back("input '" + in.name + "' is a per-head parameter over K and cannot have role " + role_name(in.role));
  }
  for (Role r : {Role::query, Role::key, Role::value})
    if (role_count[static_cast<int>(r)] > 1)
      problems.push_back(std::string("more than one input has role ") + role_name(r));

  for (std::size_t s = 0; s < slot_count; ++s) {
    const Slot slot = static_cast<Slot>(s);
    const Expr& expr = variant.slots[s];
    const std::string where = std::string("slot ") + slot_name(slot);
    if (expr.empty()) {
      if (slot == Slot::q_feature || slot == Slot::k_feature || slot == Slot::v)
        problems.push_back(where + " is required but empty");
      continue;
    }
    bool nodes_ok = true;
    for (std::size_t i = 0; i < expr.nodes.size(); ++i) {
      const Node& n = expr.nodes[i];
      if (!operands_valid(expr, i)) {
        problems.push_back(where + ": node " + std::to_string(i) + " (" + op_name(n.op) +
                           ") has operands that are missing or not earlier nodes");
        nodes_ok = false;
      } else if (n.op == Op::input && (n.input < 0 || static_cast<std::size_t>(n.input) >= inputs.size())) {
        problems.push_back(where + ": node " + std::to_string(i) + " reads input " + std::to_string(n.input) +
                           ", which does not exist");
        nodes_ok = false;
      } else if (n.op == Op::constant && !std::isfinite(n.value)) {
        problems.push_back(where + ": constant " + shortest(n.value) + " is not finite");
      } else if (is_attention_only(n.op)) {
        problems.push_back(where + ": node " + std::to_string(i) + " (" + op_name(n.op) +
                           ") belongs to softmax attention, not to a recurrence");
        nodes_ok = false;
      }
    }
    if (!nodes_ok) continue;
    const Extent e = extent(variant, expr);
    const std::string text = where + " = " + to_string(variant, expr);
    if (e.feature == Feature::both) {
      problems.push_back(text + " mixes the key features [..,K] and the value features [..,V]");
      continue;
    }
    switch (slot) {
      case Slot::q_feature:
      case Slot::k_feature:
        if (e.feature != Feature::key) problems.push_back(text + " must vary over the key features [..,K]");
        break;
      case Slot::v:
        if (e.feature != Feature::value) problems.push_back(text + " must vary over the value features [..,V]");
        break;
      case Slot::log_decay_k:
        if (e.feature == Feature::value) problems.push_back(text + " is a key-side decay over the value features");
        break;
      case Slot::log_decay_v:
        if (e.feature == Feature::key) problems.push_back(text + " is a value-side decay over the key features");
        break;
      case Slot::log_decay_head:
      case Slot::scale:
      case Slot::write_strength:
        if (e.feature != Feature::none) problems.push_back(text + " must not vary over features");
        break;
      case Slot::bonus:
        if (e.feature == Feature::value) problems.push_back(text + " is a bonus over the value features; it weighs the key features [..,K]");
        break;
      case Slot::count: break;
    }
  }
  // The update forms: which slots and flags go with which.
  if (variant.update == Update::delta) {
    if (variant.has(Slot::log_decay_v))
      problems.push_back("the delta rule decays the state's rows (log_decay_head, or log_decay_k: KDA), not by a value-side decay");
    if (variant.normalize) problems.push_back("the delta rule has no normaliser (normalize)");
    if (variant.read_before_update) problems.push_back("the delta rule is read after its update (read_before_update is not defined for it)");
  } else {
    if (variant.has(Slot::write_strength))
      problems.push_back("slot write_strength (beta) belongs to the delta rule, and this variant's update is additive");
    if (variant.l2_normalize_qk) problems.push_back("l2_normalize_qk belongs to the delta rule, and this variant's update is additive");
  }
  if (variant.has(Slot::bonus) && !variant.read_before_update)
    problems.push_back("slot bonus belongs to a read before the update (read_before_update), and this variant reads after it");
  if (variant.read_before_update) {
    if (variant.normalize) problems.push_back("a read before the update has no normaliser (normalize)");
    if (variant.has(Slot::log_decay_v)) problems.push_back("a read before the update takes no value-side decay (log_decay_v)");
  }
  if (variant.normalize && variant.has(Slot::log_decay_v))
    problems.push_back("normalisation of the read is defined only without a value-side decay");
  if (variant.normalize && !(variant.normalize_eps >= 0 && std::isfinite(variant.normalize_eps)))
    problems.push_back("normalize_eps must be finite and non-negative");
  return problems;
}

// ---------------------------------------------------------------------------------------
// Builder

std::int32_t ExprBuilder::add(const Node& node) {
  for (std::size_t i = 0; i < expr_.nodes.size(); ++i) {
    const Node& n = expr_.nodes[i];
    // Constants compare by bits, so that 0 and -0 (and each NaN) stay distinct.
    const bool same = n.op == node.op && n.a == node.a && n.b == node.b && n.input == node.input &&
                      std::bit_cast<std::uint32_t>(n.value) == std::bit_cast<std::uint32_t>(node.value);
    if (same) return static_cast<std::int32_t>(i);
  }
  expr_.nodes.push_back(node);
  return expr_.root();
}

std::int32_t ExprBuilder::input(const char* input_name, InputKind kind, Role role) {
  Input wanted{input_name, kind, role};
  std::int32_t index = -1;
  for (std::size_t i = 0; i < inputs_.size() && index < 0; ++i)
    if (inputs_[i] == wanted) index = static_cast<std::int32_t>(i);
  if (index < 0) {
    // A name reused with another kind is kept as a second input; validate() reports it.
    inputs_.push_back(std::move(wanted));
    index = static_cast<std::int32_t>(inputs_.size()) - 1;
  }
  Node n;
  n.op = Op::input;
  n.input = index;
  return add(n);
}

std::int32_t ExprBuilder::leaf(Op op) {
  Node n;
  n.op = op;
  return add(n);
}

std::int32_t ExprBuilder::constant(float value) {
  Node n;
  n.op = Op::constant;
  n.value = value;
  return add(n);
}

std::int32_t ExprBuilder::unary(Op op, std::int32_t a) {
  Node n;
  n.op = op;
  n.a = a;
  return add(n);
}

std::int32_t ExprBuilder::binary(Op op, std::int32_t a, std::int32_t b) {
  Node n;
  n.op = op;
  n.a = a;
  n.b = b;
  return add(n);
}

}  // namespace ladle::ir
