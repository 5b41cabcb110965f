// The kernel IR of one recurrent-attention variant: what the DSL lowers to and what every
// backend (the CPU path, the CUDA generator) walks. It is small and closed on purpose: a
// list of named inputs, and for each slot of the recurrence one elementwise expression DAG
// evaluated per (token, head, feature index). Users never build it by hand; they write DSL.
//
// The recurrence every variant computes (docs/operations.md), per sequence and query head:
//   S_t = diag(exp(log_decay_k)) S_{t-1} diag(exp(log_decay_v)) exp(log_decay_head)
//         + k_feature v^T
//   o_t = (scale q_feature)^T S_t               [ / ((scale q_feature)^T n_t + eps) ]
// where n_t, present only when `normalize` is set, follows S with v = 1 and no value decay.
// Two further update forms (docs/operations.md: update forms), set by Variant::update and
// Variant::read_before_update:
//   delta rule:  S_t = exp(log_decay_head) (I - beta k_feature k_feature^T) S_{t-1} + beta k_feature v^T,
//                beta = write_strength (absent: 1), read after the update; optionally with q_feature
//                and k_feature L2-normalised over K (l2_normalize_qk, eps 1e-6)
//   bonus read:  o_t = (scale q_feature)^T (S_{t-1} + diag(bonus) k_feature v^T), read before the update
//                of the diagonal form above (no bonus slot: o_t = (scale q_feature)^T S_{t-1})
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ladle::ir {

// What an input varies over, which fixes its shape. H is the number of query heads; the
// inputs with role key or value have H_kv heads instead (H_kv divides H, GQA).
enum class InputKind : std::uint8_t {
  token_key,    // [B,T,H,K]: per token, per head, over the key features
  token_value,  // [B,T,H,V]: per token, per head, over the value features
  token_head,   // [B,T,H]:   per token, per head
  head,         // [H] or [B,H]: a per-head parameter
  scalar,       // one float, passed by value
  pair,         // [B,H,Tq,Tk], B and H broadcastable: per (query, key) pair (attention only)
  head_key,     // [H,K] or [B,H,K]: a per-head parameter over the key features (RWKV6's bonus u);
                // last, so that the kinds before it keep the values the hash encodes
};

// Why the recurrence needs an input: q sets H, k and v set H_kv, everything else (gates,
// raw gate inputs, parameters) is `other` and is indexed by the query head.
enum class Role : std::uint8_t { query, key, value, other };

struct Input {
  std::string name;
  InputKind kind = InputKind::scalar;
  Role role = Role::other;
  friend bool operator==(const Input&, const Input&) = default;
};

enum class Op : std::uint8_t {
  constant,
  input,
  // unary
  neg,
  abs,
  exp,
  log,
  sqrt,
  sigmoid,
  logsigmoid,
  softplus,
  tanh,
  elu,
  relu,
  silu,
  // binary
  add,
  sub,
  mul,
  div,
  min,
  max,
  pow,
  // Softmax attention only (attention_ir.h): the leaves a score expression reads besides
  // its inputs, and predicates. Comparisons and logic give 1 for true and 0 for false.
  score,        // q_i . k_j, the raw dot product of one (query, key) pair
  query_index,  // i, from the start of the query's sequence
  key_index,    // j, from the start of the key's sequence
  head_index,   // h, the query head
  batch_index,  // b, the batch row (the sequence under cu_seqlens)
  less,
  less_equal,
  equal,
  not_equal,
  logical_and,
  logical_or,
  logical_not,
};

bool is_unary(Op op);
bool is_binary(Op op);
// The attention leaves (score, the indices): no operands, no input.
bool is_attention_leaf(Op op);
// Ops that only a softmax-attention expression may hold (leaves, comparisons, logic).
bool is_attention_only(Op op);
const char* op_name(Op op);  // "logsigmoid", "add", ...

struct Node {
  Op op = Op::constant;
  std::int32_t a = -1, b = -1;  // operands: indices of earlier nodes of the same Expr
  std::int32_t input = -1;      // Op::input: index into Variant::inputs
  float value = 0;              // Op::constant
  friend bool operator==(const Node&, const Node&) = default;
};

// One elementwise expression, a DAG in topological order (operands before their users);
// the root is the last node. No nodes: the slot is absent.
struct Expr {
  std::vector<Node> nodes;
  bool empty() const { return nodes.empty(); }
  std::int32_t root() const { return static_cast<std::int32_t>(nodes.size()) - 1; }
  friend bool operator==(const Expr&, const Expr&) = default;
};

// The slots of the recurrence. q_feature, k_feature and v are required; an absent decay is
// 0 in log space, an absent scale is 1.
enum class Slot : std::uint8_t {
  q_feature,       // over the key features
  k_feature,       // over the key features
  v,               // over the value features
  log_decay_k,     // over the key features (or broadcast over them)
  log_decay_v,     // over the value features (or broadcast over them)
  log_decay_head,  // per head, possibly per token; never over features
  scale,           // never over features
  write_strength,  // the delta rule's beta: per head, possibly per token; never over features
  bonus,           // a read before the update's weight of the current token, over the key features
  count,
};
inline constexpr std::size_t slot_count = static_cast<std::size_t>(Slot::count);
const char* slot_name(Slot slot);  // "log_decay_k", ...

// How the state takes in a token: by adding k v^T under the decays, or by the delta rule's
// correction (the state's current read of k is replaced by v, in proportion beta).
enum class Update : std::uint8_t { additive, delta };
inline constexpr float l2_normalize_eps = 1e-6f;  // of l2_normalize_qk: x / sqrt(sum x^2 + eps)

struct Variant {
  std::string name;           // for printouts and kernel names; not part of the hash
  std::vector<Input> inputs;  // each name once, in order of first use (slot order)
  std::array<Expr, slot_count> slots;
  bool normalize = false;     // divide the read by the read of the normaliser n_t
  float normalize_eps = 1e-10f;
  Update update = Update::additive;
  bool read_before_update = false;  // o_t reads S_{t-1} (plus the bonus term), not S_t
  bool l2_normalize_qk = false;     // q_feature, k_feature / sqrt(sum over K of x^2 + l2_normalize_eps)

  const Expr& slot(Slot s) const { return slots[static_cast<std::size_t>(s)]; }
  Expr& slot(Slot s) { return slots[static_cast<std::size_t>(s)]; }
  bool has(Slot s) const { return !slot(s).empty(); }
  // Index of the input of that name, or -1.
  int find_input(const std::string& input_name) const;
  // The diagonal-decay form read after the update: what every generator before issue 14 runs.
  bool plain_form() const { return update == Update::additive && !read_before_update && !l2_normalize_qk; }
};

// The variant's update form in words, for messages: "the gated delta rule", "a read before the
// update with a bonus", "the diagonal-decay form".
std::string form_name(const Variant& variant);

// What an expression varies over, from the inputs it reads.
enum class Feature : std::uint8_t { none, key, value, both /* ill-formed */ };
struct Extent {
  bool token = false;
  bool head = false;
  Feature feature = Feature::none;
  friend bool operator==(const Extent&, const Extent&) = default;
};
constexpr Extent extent_of(InputKind kind) {
  switch (kind) {
    case InputKind::token_key: return {true, true, Feature::key};
    case InputKind::token_value: return {true, true, Feature::value};
    case InputKind::token_head: return {true, true, Feature::none};
    case InputKind::head: return {false, true, Feature::none};
    case InputKind::head_key: return {false, true, Feature::key};
    case InputKind::pair: return {true, true, Feature::none};
    case InputKind::scalar: break;
  }
  return {};
}
// Of two operands of one elementwise operation.
constexpr Extent join(Extent a, Extent b) {
  const Feature f = a.feature == Feature::none                        ? b.feature
                    : b.feature == Feature::none || a.feature == b.feature ? a.feature
                                                                       : Feature::both;
  return {a.token || b.token, a.head || b.head, f};
}
Extent extent(const Variant& variant, const Expr& expr);

// d expr / d input (input: an index into the variant's inputs), elementwise, as an expression over
// the same leaves (dsl/derivative.cpp): the backward's gradients of gate math come from it. A
// constant 0 where expr does not read the input; piecewise-constant ops (comparisons, logic) and
// attention leaves other than inputs have derivative 0; abs, relu, min and max take the one-sided
// derivative the forward's branch took (0 for abs and relu at 0).
Expr derivative(const Expr& expr, std::int32_t input);
// d expr / d an attention leaf (Op::score: the raw q . k of the pair), the same way.
Expr derivative(const Expr& expr, Op leaf);

// Same variant (name aside) -> same value, on every run and machine: FNV-1a over a
// canonical byte encoding (floats by their bits, strings with their lengths).
std::uint64_t hash(const Variant& variant);
std::string hash_hex(const Variant& variant);  // 16 lowercase hex digits

// Readable printouts, as the dump tool and the generated kernel's header show them.
std::string to_string(const Variant& variant, const Expr& expr);  // infix, "logsigmoid(x) / tau"
std::string to_string(const std::vector<Input>& inputs, const Expr& expr);  // the same, by input list
std::string to_string(const Variant& variant);                    // the whole variant, many lines
std::string shape_of(InputKind kind, Role role);                  // "[B,T,H_kv,K]", ...
const char* kind_name(InputKind kind);
const char* role_name(Role role);

// Everything wrong with a variant (an empty list: it is well formed): required slots
// missing, a slot over the wrong axis, operands out of order, one input name used with two
// kinds, non-finite constants, normalisation together with a value-side decay, slots or flags
// that the update form does not have (beta without the delta rule, ...). The DSL
// makes most of these impossible; the ops turn the rest into InvalidArgument.
std::vector<std::string> validate(const Variant& variant);

// Builds one Expr, sharing identical subexpressions, and registers the inputs it reads in
// the variant. The DSL's lowering drives it; so may another front end.
class ExprBuilder {
 public:
  explicit ExprBuilder(Variant& variant) : inputs_(variant.inputs) {}
  explicit ExprBuilder(std::vector<Input>& inputs) : inputs_(inputs) {}
  std::int32_t input(const char* input_name, InputKind kind, Role role);
  std::int32_t constant(float value);
  std::int32_t leaf(Op op);  // an attention leaf: Op::score, Op::query_index, ...
  std::int32_t unary(Op op, std::int32_t a);
  std::int32_t binary(Op op, std::int32_t a, std::int32_t b);
  Expr take() { return std::move(expr_); }

 private:
  std::int32_t add(const Node& node);
  std::vector<Input>& inputs_;
  Expr expr_;
};

}  // namespace ladle::ir
