#include "backward.h"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <ladle/runtime/error.h>

#include "detail/cuda_source.h"

namespace ladle::cuda {

using namespace detail;

namespace {

bool is_zero(const ir::Expr& e) { return e.nodes.size() == 1 && e.nodes[0].op == ir::Op::constant && e.nodes[0].value == 0.0f; }

bool reads(const ir::Expr& e, std::size_t input) {
  for (const ir::Node& node : e.nodes)
    if (node.op == ir::Op::input && node.input == static_cast<std::int32_t>(input)) return true;
  return false;
}

}  // namespace

unsigned backward_threads(std::int64_t key_dim, std::int64_t value_dim) {
  const std::int64_t wide = std::max({key_dim, value_dim, std::int64_t{1}});
  if (wide > 1024)
    throw InvalidArgument("the recurrent backward on the GPU takes K and V up to 1024 (one thread per feature), got K = " +
                          std::to_string(key_dim) + ", V = " + std::to_string(value_dim));
  return static_cast<unsigned>((wide + 31) / 32 * 32);
}

const char* to_string(BackwardPhase phase) {
  return phase == BackwardPhase::slots ? "slots" : phase == BackwardPhase::totals ? "totals" : "chain";
}

std::string backward_spec_key(const BackwardKernelSpec& spec) {
  std::string key = std::string(to_string(spec.phase)) + types_key(spec);
  for (DType t : spec.input_types) key += dtype_name(t);
  for (DType t : {spec.slot_type, spec.d_output_type, spec.log_a_next_type, spec.log_b_next_type}) key += std::string("|") + dtype_name(t);
  key += "|";
  for (bool flag : {spec.fold_scale, spec.write_q, spec.write_k, spec.write_v, spec.write_do, spec.write_log_a, spec.write_log_b,
                    spec.write_first, spec.direct_q, spec.direct_k, spec.direct_v, spec.update_form})
    key += flag ? '1' : '0';
  return key;
}

namespace {

// Emits one phase's kernel of the recurrent backward part by part: every part reads the
// variant, the spec and what they decide (the flags below), and writes into one Code.
class BackwardEmitter {
 public:
  BackwardEmitter(const ir::Variant& variant, const BackwardKernelSpec& spec, const std::vector<std::string>& id)
      : variant_(variant),
        spec_(spec),
        inputs_(variant.inputs),
        id_(id),
        decays_k_(has(ir::Slot::log_decay_k) || has(ir::Slot::log_decay_head)),
        decays_v_(has(ir::Slot::log_decay_v)),
        head_decay_(has(ir::Slot::log_decay_head)),
        key_decay_(has(ir::Slot::log_decay_k)),
        separate_head_(head_decay_ && !key_decay_),
        slots_(spec.phase == BackwardPhase::slots),
        all_(variant.inputs.size(), true),
        added_(variant.inputs.size(), false) {}

  BackwardKernel generate();

 private:
  bool has(ir::Slot s) const { return variant_.has(s); }
  std::string slot_or(ir::Slot s, const std::string& suffix, const char* otherwise) const {
    return has(s) ? render_slot(variant_, id_, s, suffix) : std::string(otherwise);
  }

  void extra(const std::string& c_type, const std::string& name, const std::string& what = "");
  void d_out_params();
  void gradient_params();
  void declare_parameters();
  std::string header() const;
  void prologue();
  void side_loads(bool key_side);
  void decay_stores(bool next);
  void slots_body();
  std::string key_term() const;
  std::string value_term() const;
  void step_prologue();
  void totals_body();
  void chain_body();
  void update_slots_body();
  void update_chain_body();
  void chain_walk(const std::function<void()>& key_side, const std::function<void()>& value_side);
  void chain_slot(ir::Slot s, const std::string& gradient, const std::string& suffix);
  bool direct(std::size_t k) const;
  void chain_writes();

  const ir::Variant& variant_;
  const BackwardKernelSpec& spec_;
  const std::vector<ir::Input>& inputs_;
  const std::vector<std::string> id_;
  // A head decay beside a key-side one is folded into log_a; alone it is its own per-token gate, log_h.
  const bool decays_k_, decays_v_, head_decay_, key_decay_, separate_head_, slots_;
  const std::vector<bool> all_;
  // Inputs that get a part in the chain (an input whose gradient a recurrence wrote gets only the other slots').
  std::vector<bool> added_;
  BackwardKernel kernel_;
  std::vector<std::string> declarations_;
  Code c_;
};

void BackwardEmitter::extra(const std::string& c_type, const std::string& name, const std::string& what) {
  declarations_.push_back(c_type + (c_type.back() == '*' ? " __restrict__ " : " ") + name);
  kernel_.extra_params.push_back(what.empty() ? name : what);
  kernel_.extra_types.push_back(c_type);
}

// Every tensor input's gradient (fp32) and its strides in the canonical layout, for the chain.
void BackwardEmitter::gradient_params() {
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    if (inputs_[k].kind == ir::InputKind::scalar) continue;
    extra("float*", "d_" + id_[k], "d/" + inputs_[k].name);
    for (const char* dim : {"sb", "st", "sh", "sd"}) extra("long long", "d_" + id_[k] + "_" + dim, "d/" + inputs_[k].name + "/" + dim);
  }
}

void BackwardEmitter::d_out_params() {
  extra(std::string("const ") + storage_type(spec_.d_output_type) + "*", "d_out");
  for (const char* name : {"d_out_stride_b", "d_out_stride_t", "d_out_stride_h", "d_out_stride_d"}) extra("long long", name);
}

// The inputs as the forward's kernels take them, then the phase's own.
void BackwardEmitter::declare_parameters() {
  {
    KernelTypes types = spec_;
    types.initial_state = types.final_state = types.varlen = false;
    std::vector<KernelParam> all;
    std::vector<std::string> all_declarations;
    declare_params(variant_, id_, types, all_declarations, all);
    for (std::size_t p = 0; p < all.size(); ++p)
      if (all[p].input >= 0) kernel_.params.push_back(all[p]), declarations_.push_back(all_declarations[p]);
  }
  const std::string E = storage_type(spec_.slot_type);
  if (spec_.update_form) {
    const bool table_scale = has(ir::Slot::scale) && !spec_.fold_scale;
    const std::string access = slots_ ? "float*" : "const float*";
    static constexpr const char* slot_names[2][3] = {{"gq", "gk", "gv"}, {"qs", "kf", "vf"}};
    for (const char* name : slot_names[slots_ ? 1 : 0]) extra(access, name);
    if (slots_) extra("float*", "dos");
    if (key_decay_) extra(access, slots_ ? "log_a" : "ga");
    if (separate_head_) extra(access, slots_ ? "log_h" : "gh");
    if (table_scale) extra(access, slots_ ? "scale_s" : "gscale");
    if (has(ir::Slot::write_strength)) extra(access, slots_ ? "beta_s" : "gbeta");
    if (has(ir::Slot::bonus)) extra(access, slots_ ? "bonus_s" : "gbonus");
    if (slots_) {
      d_out_params();
    } else {
      gradient_params();
    }
  } else if (slots_) {
    if (spec_.write_q) extra(E + "*", "qs");
    if (spec_.write_k) extra(E + "*", "kf");
    if (spec_.write_v) extra(E + "*", "vf");
    if (spec_.write_do) extra(E + "*", "dos");
    if (key_decay_) {
      if (spec_.write_log_a) extra("float*", "log_a");
      extra(std::string(storage_type(spec_.log_a_next_type)) + "*", "log_a_next");
    }
    if (separate_head_) extra("float*", "log_h"), extra("float*", "log_h_next");
    if (decays_v_) {
      if (spec_.write_log_b) extra("float*", "log_b");
      extra(std::string(storage_type(spec_.log_b_next_type)) + "*", "log_b_next");
    }
    if (spec_.write_first) extra("float*", "first_decay");
    if (spec_.write_do) d_out_params();
  } else {
    for (const char* name : {"u", "dks", "dvs"}) extra("const float*", name);
    if (decays_v_) extra("const float*", "o_f");
    d_out_params();
    if (spec_.phase == BackwardPhase::totals) {
      extra("float*", "totals");
    } else {
      if (decays_k_ || decays_v_) extra("const float*", "carry");
      gradient_params();
    }
  }
  if (spec_.varlen) extra("const long long*", "cu_seqlens");
  // VS: the value-side slot tensors' row width (V, and V + 1 for a normalised read: the normaliser is
  // the state's extra column, its value 1).
  for (const char* name : {"B", "T", "H", "K", "V", "VS", "C"}) extra("int", name);
}

std::string BackwardEmitter::header() const {
  const BackwardKernelSpec& spec = spec_;
  std::string header = "ladle: recurrent backward, " + std::string(to_string(spec.phase)) + " kernel " + kernel_.name +
                       "\nGenerated by codegen/cuda/backward.cpp; do not edit.\n\n";
  header += ir::to_string(variant_);
  header += "\nlaunch: grid (C = chunks of " + std::to_string(backward_chunk) +
            " steps in the longest sequence, N * H), block (one thread per feature: max(K, V) rounded to warps)\n";
  header += "types: " + types_line(variant_, id_, spec) + "; slots " + dtype_name(spec.slot_type) + "\n";
  header += std::string("reverse=") + (spec.reverse ? "1" : "0") + " varlen=" + (spec.varlen ? "1" : "0") + "\n";
  {  // the launcher's plan for this call, as far as it changes the code
    std::string in_place, written, direct;
    const auto list = [](std::string& to, bool on, const char* what) {
      if (on) to += (to.empty() ? "" : ", ") + std::string(what);
    };
    list(in_place, !spec.write_q, "q"), list(in_place, !spec.write_k, "k"), list(in_place, !spec.write_v, "v");
    list(in_place, !spec.write_do, "d_output");
    list(written, spec.write_q, "qs"), list(written, spec.write_k, "kf"), list(written, spec.write_v, "vf"), list(written, spec.write_do, "dos");
    list(direct, spec.direct_q, "dq"), list(direct, spec.direct_k, "dk"), list(direct, spec.direct_v, "dv");
    header += "plan: scale " + std::string(spec.fold_scale ? "folded into the recurrences" : "applied here") +
              "; slots written: " + (written.empty() ? "none" : written) + "; read in place: " + (in_place.empty() ? "none" : in_place) +
              "; gradients the recurrences write: " + (direct.empty() ? "none" : direct) + "\n";
  }
  if (slots_)
    header += "Writes the slots at every token: qs = q_feature * scale, kf, vf, dos (d_output), the log decays and\n"
              "the next step's log decays (0 at a sequence's last step).\n";
  else if (spec.phase == BackwardPhase::totals)
    header += "Sums each block's per-step terms of the decays' gradients: (scale q_feature) . u - k_feature . dk per key\n"
              "feature, o . do - v . dv per value feature (the slots recomputed from the inputs, in fp32).\n";
  else
    header += "Walks each block's steps backwards: the decays' gradients are running sums from carry; every slot's\n"
              "gradient times d slot / d input (ir::derivative) is added into that input's gradient.\n";
  return header;
}

// The block's sequence and steps [s0, s1), this thread's features, the inputs' heads.
void BackwardEmitter::prologue() {
  Code& c = c_;
  c("constexpr int CHUNK = " + std::to_string(backward_chunk) + ";");
  c(std::string("constexpr bool REVERSE = ") + (spec_.reverse ? "true" : "false") + ";");
  c("const int n = blockIdx.y / H, h = blockIdx.y % H;");
  emit_sequence_bounds(c, false, spec_.varlen);
  c("const long long len = eos - bos, s0 = static_cast<long long>(blockIdx.x) * CHUNK;");
  c("if (s0 >= len) return;");
  c("const long long s1 = s0 + CHUNK < len ? s0 + CHUNK : len;");
  c("const int i = threadIdx.x, j = threadIdx.x;  // this thread's key feature and value feature");
  c("const bool key = i < K, value = j < V;");
  c("(void)B;");
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    if (inputs_[k].kind == ir::InputKind::scalar) continue;
    c("const int " + id_[k] + "_head = h * " + id_[k] + "_heads / H; (void)" + id_[k] + "_head;");
  }
  for (std::size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].kind == ir::InputKind::head)
      c("const float " + id_[k] + "_value = ladle_load(" + id_[k] + " + b * " + id_[k] + "_stride_b + " + id_[k] + "_head * " + id_[k] +
        "_stride_h); (void)" + id_[k] + "_value;");
}

// The loads of a side's per-feature inputs at feature i (key) or j (value).
void BackwardEmitter::side_loads(bool key_side) {
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    const bool wanted = key_side ? inputs_[k].kind == ir::InputKind::token_key || inputs_[k].kind == ir::InputKind::head_key
                                 : inputs_[k].kind == ir::InputKind::token_value;
    if (!wanted) continue;
    const std::string f = key_side ? "i" : "j";
    c_("const float " + id_[k] + "_" + f + " = " + row_load(id_, k, f) + "; (void)" + id_[k] + "_" + f + ";");
  }
}

// The log decays of the current token: the key side's own (log_a), the head's, the value side's.
void BackwardEmitter::decay_stores(bool next) {
  Code& c = c_;
  const ir::Variant& variant = variant_;
  const std::vector<std::string>& id = id_;
  const std::string guard = next ? "live ? " : "", otherwise = next ? " : 0.0f" : "";
  const std::string suffix = next ? "_next" : "";
  if (head_decay_)
    c("const float head_t = " + guard + "(" + render_slot(variant, id, ir::Slot::log_decay_head, "") + ")" + otherwise + ";");
  if (separate_head_) c("if (threadIdx.x == 0) log_h" + suffix + "[r] = head_t;");
  if (key_decay_) {
    c("if (key) {");
    c.in();
    side_loads(true);
    c("const float a = " + guard + "(" + render_slot(variant, id, ir::Slot::log_decay_k, "_i") + ")" + (head_decay_ ? " + head_t" : "") +
      otherwise + ";");
    if (next) c("ladle_store(log_a_next + r * K + i, a);");
    else if (spec_.write_log_a) c("log_a[r * K + i] = a;");
    if (!next && spec_.write_first) c("if (s == 0) first_decay[static_cast<long long>(blockIdx.y) * (K + V) + i] = a;");
    c.out();
    c("}");
  } else if (!next && spec_.write_first) {  // every entry is written: a side without decays gets 0
    c("if (key && s == 0) first_decay[static_cast<long long>(blockIdx.y) * (K + V) + i] = " + std::string(head_decay_ ? "head_t" : "0.0f") + ";");
  }
  if (decays_v_) {
    c("if (value) {");
    c.in();
    side_loads(false);
    c("const float bv = " + guard + "(" + render_slot(variant, id, ir::Slot::log_decay_v, "_j") + ")" + otherwise + ";");
    if (next) c("ladle_store(log_b_next + r * VS + j, bv);");
    else if (spec_.write_log_b) c("log_b[r * VS + j] = bv;");
    if (!next && spec_.write_first) c("if (s == 0) first_decay[static_cast<long long>(blockIdx.y) * (K + V) + K + j] = bv;");
    c.out();
    c("}");
  } else if (!next && spec_.write_first) {
    c("if (value && s == 0) first_decay[static_cast<long long>(blockIdx.y) * (K + V) + K + j] = 0.0f;");
  }
}

void BackwardEmitter::slots_body() {
  Code& c = c_;
  const ir::Variant& variant = variant_;
  const BackwardKernelSpec& spec = spec_;
  const std::vector<std::string>& id = id_;
  c("for (long long s = s0; s < s1; ++s) {");
  c.in();
  c("const long long t_step = REVERSE ? eos - 1 - s : bos + s;");
  c("const long long r = (static_cast<long long>(b) * T + t_step) * H + h;  // the slot row");
  c("{");
  c.in();
  c("const long long t = t_step;");
  token_rows(c, variant, id, all_, false);
  if (spec.write_q || spec.write_k) {
    c("if (key) {");
    c.in();
    side_loads(true);
    if (spec.write_q)
      c("ladle_store(qs + r * K + i, " + render_slot(variant, id, ir::Slot::q_feature, "_i") +
        (spec.fold_scale ? std::string() : " * (" + slot_or(ir::Slot::scale, "", "1.0f") + ")") + ");");
    if (spec.write_k) c("ladle_store(kf + r * K + i, " + render_slot(variant, id, ir::Slot::k_feature, "_i") + ");");
    c.out();
    c("}");
  }
  if (spec.write_v || spec.write_do) {
    c("if (value) {");
    c.in();
    side_loads(false);
    if (spec.write_v) c("ladle_store(vf + r * VS + j, " + render_slot(variant, id, ir::Slot::v, "_j") + ");");
    if (spec.write_v && variant.normalize) c("if (j == 0) ladle_store(vf + r * VS + V, 1.0f);  // the normaliser's column");
    if (spec.write_do)
      c("ladle_store(dos + r * VS + j, ladle_load(d_out + b * d_out_stride_b + t * d_out_stride_t + h * d_out_stride_h + j * "
        "d_out_stride_d));");
    c.out();
    c("}");
  }
  if (spec.write_log_a || spec.write_log_b || separate_head_) {
    decay_stores(false);
  } else if (spec.write_first) {  // only the first step's decays (d initial_state): not evaluated at every step
    c("if (s == 0) {");
    c.in();
    decay_stores(false);
    c.out();
    c("}");
  }
  c.out();
  c("}");
  if (decays_k_ || decays_v_) {
    c("{  // the next step's decays at this step's row: what the backward's recurrences over dS multiply by");
    c.in();
    c("const bool live = s + 1 < len;");
    c("const long long t = live ? (REVERSE ? t_step - 1 : t_step + 1) : t_step;");
    token_rows(c, variant, id, all_, true);
    decay_stores(true);
    c.out();
    c("}");
  }
  c.out();
  c("}");
}

// The decays' per-step terms, from the slots recomputed in fp32 (the recurrences' operands may be 16-bit).
std::string BackwardEmitter::key_term() const {
  return std::string("(") + render_slot(variant_, id_, ir::Slot::q_feature, "_i") + ")" + (spec_.fold_scale ? "" : " * scale_t") + " * u_i - (" +
         render_slot(variant_, id_, ir::Slot::k_feature, "_i") + ") * dk_i";
}

std::string BackwardEmitter::value_term() const {
  return "o_f[r * VS + j] * ladle_load(d_out + b * d_out_stride_b + t * d_out_stride_t + h * d_out_stride_h + j * d_out_stride_d) - (" +
         render_slot(variant_, id_, ir::Slot::v, "_j") + ") * dv_j";
}

void BackwardEmitter::step_prologue() {
  c_("const long long r = (static_cast<long long>(b) * T + t) * H + h;  // the slot row");
  token_rows(c_, variant_, id_, all_, false);
  c_("const float scale_t = " + slot_or(ir::Slot::scale, "", "1.0f") + "; (void)scale_t;");
}

void BackwardEmitter::totals_body() {
  Code& c = c_;
  c("float ta = 0.0f, tb = 0.0f;");
  c("for (long long s = s0; s < s1; ++s) {");
  c.in();
  c("const long long t = REVERSE ? eos - 1 - s : bos + s;");
  step_prologue();
  if (decays_k_) {
    c("if (key) {");
    c.in();
    side_loads(true);
    c("const float u_i = u[r * K + i], dk_i = dks[r * K + i];");
    c("ta += " + key_term() + ";");
    c.out();
    c("}");
  }
  if (decays_v_) {
    c("if (value) {");
    c.in();
    side_loads(false);
    c("const float dv_j = dvs[r * VS + j];");
    c("tb += " + value_term() + ";");
    c.out();
    c("}");
  }
  c.out();
  c("}");
  c("const long long row = (static_cast<long long>(blockIdx.y) * C + blockIdx.x) * (K + V);");
  c("if (key) totals[row + i] = ta;");
  c("if (value) totals[row + K + j] = tb;");
}

// Each slot's gradient at this thread's feature, and its derivative by every input it reads.
void BackwardEmitter::chain_slot(ir::Slot s, const std::string& gradient, const std::string& suffix) {
  const BackwardKernelSpec& spec = spec_;
  if (!has(s)) return;
  if ((s == ir::Slot::q_feature && spec.direct_q) || (s == ir::Slot::k_feature && spec.direct_k) || (s == ir::Slot::v && spec.direct_v))
    return;
  if (s == ir::Slot::scale && spec.fold_scale) return;  // a per-call scale: no tensor input
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    if (inputs_[k].kind == ir::InputKind::scalar || !reads(variant_.slot(s), k)) continue;
    const ir::Expr d = ir::derivative(variant_.slot(s), static_cast<std::int32_t>(k));
    if (is_zero(d)) continue;
    c_("acc_" + id_[k] + " += (" + gradient + ") * (" + render_expr(variant_, id_, d, suffix) + ");  // " + ir::slot_name(s));
    added_[k] = true;
  }
}

bool BackwardEmitter::direct(std::size_t k) const {
  const ir::Role role = inputs_[k].role;
  return (role == ir::Role::query && spec_.direct_q) || (role == ir::Role::key && spec_.direct_k) ||
         (role == ir::Role::value && spec_.direct_v);
}

void BackwardEmitter::chain_body() {
  Code& c = c_;
  const BackwardKernelSpec& spec = spec_;
  const std::vector<std::string>& id = id_;
  c("const long long carry_row = (static_cast<long long>(blockIdx.y) * C + blockIdx.x) * (K + V);");
  if (decays_k_) c("float ga = key && carry ? carry[carry_row + i] : 0.0f;  // d L / d log_a at the current step");
  if (decays_v_) c("float gb = value && carry ? carry[carry_row + K + j] : 0.0f;  // d L / d log_b");
  chain_walk(
      [&] {
        c("const float u_i = u[r * K + i], dk_i = dks[r * K + i];");
        if (decays_k_) c("ga += " + key_term() + ";");
        chain_slot(ir::Slot::q_feature, spec.fold_scale ? "u_i" : "scale_t * u_i", "_i");
        chain_slot(ir::Slot::k_feature, "dk_i", "_i");
        chain_slot(ir::Slot::log_decay_k, "ga", "_i");
        chain_slot(ir::Slot::log_decay_head, "ga", "_i");
        // d L / d scale = sum_i q_feature_i u_i: each thread adds its feature's part.
        chain_slot(ir::Slot::scale, "(" + render_slot(variant_, id, ir::Slot::q_feature, "_i") + ") * u_i", "_i");
      },
      [&] {
        c("const float dv_j = dvs[r * VS + j];");
        if (decays_v_) c("gb += " + value_term() + ";");
        chain_slot(ir::Slot::v, "dv_j", "_j");
        chain_slot(ir::Slot::log_decay_v, "gb", "_j");
      });
}

// The chain's walk back over a block's steps: per step every input's accumulator, the key side's
// and the value side's parts (what key_side and value_side emit, after the side's input loads), the
// writes; then each per-head input's sum over the block's threads.
void BackwardEmitter::chain_walk(const std::function<void()>& key_side, const std::function<void()>& value_side) {
  Code& c = c_;
  const std::vector<std::string>& id = id_;
  for (std::size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].kind == ir::InputKind::head) c("float head_" + id[k] + " = 0.0f;  // this thread's part of d " + inputs_[k].name);
  c("for (long long s = s1 - 1; s >= s0; --s) {");
  c.in();
  c("const long long t = REVERSE ? eos - 1 - s : bos + s;");
  step_prologue();
  for (std::size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].kind != ir::InputKind::scalar) c("float acc_" + id[k] + " = 0.0f; (void)acc_" + id[k] + ";");
  c("if (key) {");
  c.in();
  side_loads(true);
  key_side();
  c.out();
  c("}");
  c("if (value) {");
  c.in();
  side_loads(false);
  value_side();
  c.out();
  c("}");
  chain_writes();
  c.out();
  c("}");
  for (std::size_t k = 0; k < inputs_.size(); ++k)
    if (inputs_[k].kind == ir::InputKind::head) {
      const std::string d = "d_" + id[k];
      c("for (int offset = 16; offset > 0; offset /= 2) head_" + id[k] + " += __shfl_xor_sync(0xffffffffu, head_" + id[k] + ", offset);");
      c("if (threadIdx.x % 32 == 0 && head_" + id[k] + " != 0.0f) atomicAdd(" + d + " + b * " + d + "_sb + " + id[k] + "_head * " + d +
        "_sh, head_" + id[k] + ");");
    }
}

// The update forms' slots, fp32, at every token (BackwardKernelSpec::update_form).
void BackwardEmitter::update_slots_body() {
  Code& c = c_;
  const ir::Variant& variant = variant_;
  const std::vector<std::string>& id = id_;
  c("for (long long s = s0; s < s1; ++s) {");
  c.in();
  c("const long long t = REVERSE ? eos - 1 - s : bos + s;");
  c("const long long r = (static_cast<long long>(b) * T + t) * H + h;  // the slot row");
  token_rows(c, variant, id, all_, false);
  if (head_decay_) c("const float head_t = " + render_slot(variant, id, ir::Slot::log_decay_head, "") + ";");
  c("if (key) {");
  c.in();
  side_loads(true);
  c("qs[r * K + i] = " + render_slot(variant, id, ir::Slot::q_feature, "_i") + ";");
  c("kf[r * K + i] = " + render_slot(variant, id, ir::Slot::k_feature, "_i") + ";");
  if (key_decay_)
    c("log_a[r * K + i] = " + render_slot(variant, id, ir::Slot::log_decay_k, "_i") + (head_decay_ ? " + head_t" : "") + ";");
  if (has(ir::Slot::bonus)) c("bonus_s[r * K + i] = " + render_slot(variant, id, ir::Slot::bonus, "_i") + ";");
  c.out();
  c("}");
  c("if (value) {");
  c.in();
  side_loads(false);
  c("vf[r * V + j] = " + render_slot(variant, id, ir::Slot::v, "_j") + ";");
  c("dos[r * V + j] = ladle_load(d_out + b * d_out_stride_b + t * d_out_stride_t + h * d_out_stride_h + j * d_out_stride_d);");
  c.out();
  c("}");
  c("if (threadIdx.x == 0) {");
  c.in();
  if (separate_head_) c("log_h[r] = head_t;");
  if (has(ir::Slot::scale) && !spec_.fold_scale) c("scale_s[r] = " + render_slot(variant, id, ir::Slot::scale, "") + ";");
  if (has(ir::Slot::write_strength)) c("beta_s[r] = " + render_slot(variant, id, ir::Slot::write_strength, "") + ";");
  c.out();
  c("}");
  c.out();
  c("}");
}

// The update forms' chain: the slots' gradients (ladle_bwd_update and ladle_bwd_update_finish wrote
// them, fp32) times d slot / d input.
void BackwardEmitter::update_chain_body() {
  chain_walk(
      [&] {
        chain_slot(ir::Slot::q_feature, "gq[r * K + i]", "_i");
        chain_slot(ir::Slot::k_feature, "gk[r * K + i]", "_i");
        chain_slot(ir::Slot::log_decay_k, "ga[r * K + i]", "_i");
        chain_slot(ir::Slot::log_decay_head, key_decay_ ? "ga[r * K + i]" : "(i == 0 ? gh[r] : 0.0f)", "_i");
        chain_slot(ir::Slot::scale, "(i == 0 ? gscale[r] : 0.0f)", "_i");
        chain_slot(ir::Slot::write_strength, "(i == 0 ? gbeta[r] : 0.0f)", "_i");
        chain_slot(ir::Slot::bonus, "gbonus[r * K + i]", "_i");
      },
      [&] { chain_slot(ir::Slot::v, "gv[r * V + j]", "_j"); });
}

// Writes: a feature's element is this thread's alone unless query heads share the input (GQA).
void BackwardEmitter::chain_writes() {
  Code& c = c_;
  const std::vector<std::string>& id = id_;
  for (std::size_t k = 0; k < inputs_.size(); ++k) {
    const auto kind = inputs_[k].kind;
    const std::string d = "d_" + id[k];
    const std::string at = d + " + b * " + d + "_sb + t * " + d + "_st + " + id[k] + "_head * " + d + "_sh";
    if (direct(k) && !added_[k]) continue;  // the recurrence's output is the whole gradient
    if (kind == ir::InputKind::token_key || kind == ir::InputKind::token_value) {
      const std::string f = kind == ir::InputKind::token_key ? "i" : "j";
      c(std::string("if (") + (kind == ir::InputKind::token_key ? "key" : "value") + ") {");
      c("  float* const p = " + at + " + " + f + " * " + d + "_sd;");
      if (direct(k)) {
        c("  *p += acc_" + id[k] + ";  // onto the recurrence's part");
      } else {
        c("  if (" + id[k] + "_heads == H) *p = acc_" + id[k] + ";");
        c("  else atomicAdd(p, acc_" + id[k] + ");");
      }
      c("}");
    } else if (kind == ir::InputKind::head_key) {  // [H,K] or [B,H,K]: every token adds into its row
      c("if (key && acc_" + id[k] + " != 0.0f) atomicAdd(" + d + " + b * " + d + "_sb + " + id[k] + "_head * " + d + "_sh + i * " + d +
        "_sd, acc_" + id[k] + ");");
    } else if (kind == ir::InputKind::token_head) {
      c("for (int offset = 16; offset > 0; offset /= 2) acc_" + id[k] + " += __shfl_xor_sync(0xffffffffu, acc_" + id[k] + ", offset);");
      c("if (threadIdx.x % 32 == 0 && acc_" + id[k] + " != 0.0f) atomicAdd(" + at + ", acc_" + id[k] + ");");
    } else if (kind == ir::InputKind::head) {
      c("head_" + id[k] + " += acc_" + id[k] + ";");
    }
  }
}

BackwardKernel BackwardEmitter::generate() {
  kernel_.name = std::string("ladle_bwd_") + to_string(spec_.phase) + "_" + hex(fnv1a(backward_spec_key(spec_), ir::hash(variant_)));
  declare_parameters();
  Code& c = c_;
  c(comment_block(header()) + "\n" + storage_helpers);
  c("extern \"C\" __global__ void __launch_bounds__(1024) " + kernel_.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations_.size(); ++p) c(declarations_[p] + (p + 1 < declarations_.size() ? "," : ") {"));
  c.out();
  prologue();
  if (spec_.update_form) slots_ ? update_slots_body() : update_chain_body();
  else if (slots_) slots_body();
  else if (spec_.phase == BackwardPhase::totals) totals_body();
  else chain_body();
  c.out();
  c("}");
  kernel_.source = c.text();
  return std::move(kernel_);
}

}  // namespace

BackwardKernel generate_backward(const ir::Variant& variant, const BackwardKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_backward: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (!variant.plain_form() && !spec.update_form)
    fail("the backward of " + ir::form_name(variant) + " runs its recurrence in ladle_bwd_update (spec.update_form)");
  if (variant.plain_form() && spec.update_form) fail("update_form is for the update forms, and this variant is the diagonal-decay form");
  if (spec.update_form && spec.phase == BackwardPhase::totals) fail("the update forms have no totals phase");
  if (variant.normalize && (spec.write_do || !spec.write_v || spec.direct_v))
    fail("a normalised read's backward writes v with the normaliser's column and takes do from the normalised-read helper");
  check_types("generate_backward", variant, spec);
  if (!floating(spec.slot_type) || !floating(spec.d_output_type)) fail("slot_type and d_output_type must be f32, f16 or bf16");
  const auto& inputs = variant.inputs;
  const InputUse use = input_use(variant);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].kind == ir::InputKind::token_key && use.value_side[k])
      fail("input '" + inputs[k].name + "' has the key width but a value-side slot reads it");
    if (inputs[k].kind == ir::InputKind::token_value && use.key_side[k])
      fail("input '" + inputs[k].name + "' has the value width but a key-side slot reads it");
  }
  return detail::with_input_names<BackwardKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return BackwardEmitter(variant, spec, id).generate(); });
}

namespace {

// The helpers' source in pieces (backward_helpers_source, backward_helper_source): what each needs,
// then each kernel's text; the convert and normalized kernels are one macro each, instantiated per type.
std::string helper_prelude() {
  return "\n#define LADLE_BWD_CHUNK " + std::to_string(backward_chunk) + "\n" + R"(// The sequence of (sequence n): its batch row and tokens [bos, eos).
__device__ __forceinline__ void ladle_bwd_bounds(const long long* cu_seqlens, int n, int T, int& b, long long& bos, long long& eos) {
  if (cu_seqlens) b = 0, bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
  else b = n, bos = 0, eos = T;
}

)";
}
constexpr const char* carry_helper = R"(
// One thread per (n, h, f < K + V): carry[(n H + h) C + c][f] = init + the totals of the blocks after c,
// init = factor sum_j d_final[i][j] S[i][j] (f = i < K) or sum_i (f = K + j), d_final [N,H,K,VS] and S read from
// s_t [N,H,VS,K] (VS = V, or V + 1 with the normaliser's column).
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_carry(
    const float* __restrict__ totals, const float* __restrict__ d_final, float factor, const float* __restrict__ s_t,
    float* __restrict__ carry, const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int VS, int C) {
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int KV = K + V;
  if (index >= static_cast<long long>(N) * H * KV) return;
  const long long p = index / KV;
  const int f = static_cast<int>(index % KV), n = static_cast<int>(p / H);
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, n, T, b, bos, eos);
  const long long chunks = (eos - bos + LADLE_BWD_CHUNK - 1) / LADLE_BWD_CHUNK;
  float acc = 0.0f;
  if (d_final) {
    if (f < K)
      for (int j = 0; j < VS; ++j) acc += d_final[(p * K + f) * VS + j] * s_t[(p * VS + j) * K + f];
    else
      for (int i = 0; i < K; ++i) acc += d_final[(p * K + i) * VS + (f - K)] * s_t[(p * VS + (f - K)) * K + i];
  }
  acc *= factor;
  for (long long c = chunks - 1; c >= 0; --c) {
    carry[(p * C + c) * KV + f] = acc;
    acc += totals[(p * C + c) * KV + f];
  }
}
)";
constexpr const char* update_finish_helper = R"(
// The update forms (update_backward.h), one warp per token row r < rows: gq holds dL/d qhat and
// becomes dL/d q_feature (qhat = scale q rn_q, rn = (sum x^2 + eps)^(-1/2) where l2, else 1: dq = scale
// (rn dqhat - q rn^3 (dqhat . q))), gk likewise without the scale; gscale[r] = rn_q q . dqhat (null:
// none); gh[r] = sum over K of ga (null: none). scale_s null: the call's scale.
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_update_finish(
    const float* __restrict__ qs, const float* __restrict__ kf, const float* __restrict__ scale_s, float scale,
    float* __restrict__ gq, float* __restrict__ gk, const float* __restrict__ ga, float* __restrict__ gscale,
    float* __restrict__ gh, int l2, float eps, long long rows, int K) {
  const long long r = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float qq = 0.0f, kk = 0.0f, dotq = 0.0f, dotk = 0.0f, hs = 0.0f;
  for (int f = lane; f < K; f += 32) {
    const float q = qs[r * K + f], k = kf[r * K + f];
    qq += q * q, kk += k * k;
    dotq += gq[r * K + f] * q, dotk += gk[r * K + f] * k;
    if (gh) hs += ga[r * K + f];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    qq += __shfl_xor_sync(0xffffffffu, qq, offset), kk += __shfl_xor_sync(0xffffffffu, kk, offset);
    dotq += __shfl_xor_sync(0xffffffffu, dotq, offset), dotk += __shfl_xor_sync(0xffffffffu, dotk, offset);
    hs += __shfl_xor_sync(0xffffffffu, hs, offset);
  }
  const float qrn = l2 ? rsqrtf(qq + eps) : 1.0f, krn = l2 ? rsqrtf(kk + eps) : 1.0f;
  const float sc = scale_s ? scale_s[r] : scale;
  if (lane == 0) {
    if (gscale) gscale[r] = qrn * dotq;
    if (gh) gh[r] = hs;
  }
  for (int f = lane; f < K; f += 32) {
    const float q = qs[r * K + f], k = kf[r * K + f];
    gq[r * K + f] = sc * (qrn * gq[r * K + f] - (l2 ? q * qrn * qrn * qrn * dotq : 0.0f));
    gk[r * K + f] = krn * gk[r * K + f] - (l2 ? k * krn * krn * krn * dotk : 0.0f);
  }
}
)";
constexpr const char* carry_states_helper = R"(
// The carries from the states at the blocks' boundaries: block (c, n H + h) of LADLE_BWD_CHUNK steps,
// e its last step, has carry[f] = factor sum over the state's elements of S_e . A_(e+1) D_(e+1) . B_(e+1)
// (f = i < K: over row i; f = K + j: over column j), S_e the forward's state after step e (s_states
// row s_first[n] + c: the split form's chunk states, the first row of each sequence's being h0, skipped) and D_(e+1) the gradient reaching it from later steps, divided by factor (d_states row
// first[n] + chunks - 2 - c), A and B the decays at step e + 1 (log_a_next, log_h_next and log_b_next of
// step e, null where the variant has none; their types by a_type and b_type). The sequence's last block
// takes factor sum(d_final * S_T) as ladle_bwd_carry does (d_final [N,H,K,V], s_t [N,H,V,K]; null: 0).
// Grid (C, N H), block 256; K up to 1024.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define LADLE_BWD_UNROLL_4 _Pragma("unroll 4")
#else
#define LADLE_BWD_UNROLL_4
#endif
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_carry_states(
    const float* __restrict__ s_states, const float* __restrict__ d_states, const long long* __restrict__ s_first,
    const long long* __restrict__ first,
    const void* __restrict__ log_a_next, int a_type, const float* __restrict__ log_h_next, const void* __restrict__ log_b_next,
    int b_type, const float* __restrict__ d_final, float factor, const float* __restrict__ s_t, float* __restrict__ carry,
    const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int C, int reverse) {
  __shared__ float rows[1024], decay_a[1024];
  const int p = blockIdx.y, n = p / H, h = p % H, c = blockIdx.x, KV = K + V;
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, n, T, b, bos, eos);
  const long long chunks = (eos - bos + LADLE_BWD_CHUNK - 1) / LADLE_BWD_CHUNK;
  if (c >= chunks) return;
  float* const out = carry + (static_cast<long long>(p) * C + c) * KV;
  if (c == chunks - 1) {  // after the sequence: d_final and S_T
    for (int f = threadIdx.x; f < KV; f += blockDim.x) {
      float acc = 0.0f;
      if (d_final && f < K)
        for (int j = 0; j < V; ++j) acc += d_final[(static_cast<long long>(p) * K + f) * V + j] * s_t[(static_cast<long long>(p) * V + j) * K + f];
      else if (d_final)
        for (int i = 0; i < K; ++i) acc += d_final[(static_cast<long long>(p) * K + i) * V + (f - K)] * s_t[(static_cast<long long>(p) * V + (f - K)) * K + i];
      out[f] = factor * acc;
    }
    return;
  }
  const long long e = static_cast<long long>(c) * LADLE_BWD_CHUNK + LADLE_BWD_CHUNK - 1;
  const long long r = (static_cast<long long>(b) * T + (reverse ? eos - 1 - e : bos + e)) * H + h;  // step e's slot row
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    float la = log_a_next ? ladle_load_typed(log_a_next, a_type, r * K + i) : 0.0f;
    if (log_h_next) la += log_h_next[r];
    decay_a[i] = expf(la);
    rows[i] = 0.0f;
  }
  __syncthreads();
  const long long area = static_cast<long long>(K) * V;
  const float* const S = s_states + ((s_first[n] + c) * H + h) * area;
  const float* const D = d_states + ((first[n] + chunks - 2 - c) * H + h) * area;
  // Warp w takes rows w, w + 8, ...; a lane the columns j0 + lane + 32 m of each 128-column group: every
  // load of a row in flight at once, the row's sum by shuffles (its warp alone writes it: no atomics),
  // the columns' partial sums in registers, then over the warps through shared memory. x = S D b_j; a
  // row sums a_i x, a column a_i x over the rows.
  __shared__ float columns[8][128];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int j0 = 0; j0 < V; j0 += 128) {
    float decay_b[4], column[4];
    for (int m = 0; m < 4; ++m) {
      const int j = j0 + lane + 32 * m;
      decay_b[m] = j < V ? (log_b_next ? expf(ladle_load_typed(log_b_next, b_type, r * V + j)) : 1.0f) : 0.0f;
      column[m] = 0.0f;
    }
    LADLE_BWD_UNROLL_4 for (int i = warp; i < K; i += warps) {
      const float* const s_row = S + static_cast<long long>(i) * V + j0 + lane;
      const float* const d_row = D + static_cast<long long>(i) * V + j0 + lane;
      float row = 0.0f;
      for (int m = 0; m < 4; ++m) {
        const bool live = j0 + lane + 32 * m < V;
        const float x = live ? s_row[32 * m] * d_row[32 * m] * decay_b[m] : 0.0f;
        column[m] += decay_a[i] * x;
        row += x;
      }
      for (int offset = 16; offset > 0; offset /= 2) row += __shfl_xor_sync(0xffffffffu, row, offset);
      if (lane == 0) rows[i] += decay_a[i] * row;
    }
    for (int m = 0; m < 4; ++m) columns[warp][lane + 32 * m] = column[m];
    __syncthreads();
    for (int t = threadIdx.x; t < 128; t += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < warps; ++w) sum += columns[w][t];
      if (j0 + t < V) out[K + j0 + t] = factor * sum;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < K; i += blockDim.x) out[i] = factor * rows[i];
}
)";
constexpr const char* initial_helper = R"(
// One thread per (n, h, i, j): d_h0 = factor exp(log_a_0[i]) dS_0 exp(log_b_0[j]), the total log decays at the sequence's
// first step from first_decay [N,H,K+V] (null: no decay); dS_0 alone for an empty sequence.
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_initial(
    const float* __restrict__ ds0, const float* __restrict__ first_decay, float factor, float* __restrict__ d_h0,
    const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int VS) {
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<long long>(N) * H * K * V) return;
  const long long p = index / (static_cast<long long>(K) * V);
  const int i = static_cast<int>(index / V % K), j = static_cast<int>(index % V);
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, static_cast<int>(p / H), T, b, bos, eos);
  float x = factor * ds0[(p * K + i) * VS + j];  // ds0 [N,H,K,VS]
  if (eos > bos && first_decay) x *= expf(first_decay[p * (K + V) + i] + first_decay[p * (K + V) + K + j]);
  d_h0[index] = x;
}
)";
constexpr const char* convert_helper = R"(
// One thread per element of a strided [N,H,R,C] tensor, times factor: out [N,H,R,CP] and out_t [N,H,CP,R], fp32 (either
// may be null; CP >= C, the padding left as it was).
#define LADLE_BWD_CONVERT(NAME, E)                                                                            \
extern "C" __global__ void __launch_bounds__(256) NAME(                                                       \
    const E* __restrict__ in, long long s0, long long s1, long long s2, long long s3, int N, int H, int R, int C, \
    int CP, float factor, float* __restrict__ out, float* __restrict__ out_t) {                               \
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;                      \
  if (index >= static_cast<long long>(N) * H * R * C) return;                                                  \
  const int c = static_cast<int>(index % C), r = static_cast<int>(index / C % R);                              \
  const long long p = index / (static_cast<long long>(R) * C);                                                 \
  const float x = factor * ladle_load(in + (p / H) * s0 + (p % H) * s1 + r * s2 + c * s3);                     \
  if (out) out[(p * R + r) * CP + c] = x;                                                                     \
  if (out_t) out_t[(p * CP + c) * R + r] = x;                                                                 \
}
)";
constexpr const char* normalized_helper = R"(
// A normalised read o = num / den, den = (scale q)^T n + eps, from num' [rows][V + 1] (the read of the state with the
// normaliser's column: num, then den - eps): do' [rows][V + 1] = do / den, then d den = -sum_j do_j num_j / den^2.
// One warp per row r = (b T + t) H + h; block (256).
#define LADLE_BWD_NORMALIZED(NAME, E)                                                                         \
extern "C" __global__ void __launch_bounds__(256) NAME(                                                       \
    const float* __restrict__ num, const E* __restrict__ d_out, long long sb, long long st, long long sh, long long sd, \
    int B, int T, int H, int V, float eps, float* __restrict__ d_num) {                                       \
  const long long r = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;                    \
  const int lane = threadIdx.x % 32;                                                                          \
  if (r >= static_cast<long long>(B) * T * H) return;                                                         \
  const int h = static_cast<int>(r % H);                                                                      \
  const long long t = r / H % T, b = r / H / T;                                                               \
  const float* const row = num + r * (V + 1);                                                                 \
  const float den = row[V] + eps;                                                                             \
  float dot = 0.0f;                                                                                           \
  for (int j = lane; j < V; j += 32) {                                                                        \
    const float g = ladle_load(d_out + b * sb + t * st + h * sh + j * sd);                                    \
    dot += g * row[j];                                                                                        \
    d_num[r * (V + 1) + j] = g / den;                                                                         \
  }                                                                                                           \
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);             \
  if (lane == 0) d_num[r * (V + 1) + V] = -dot / (den * den);                                                  \
}
)";

// Each named kernel: its text, or (convert, normalized) its macro and the element type it takes.
struct HelperText {
  const char* text;
  const char* macro;  // null: text is the kernel
  const char* type;
};

std::optional<HelperText> helper_text(const std::string& name) {
  if (name == "ladle_bwd_carry") return HelperText{carry_helper, nullptr, nullptr};
  if (name == "ladle_bwd_update_finish") return HelperText{update_finish_helper, nullptr, nullptr};
  if (name == "ladle_bwd_carry_states") return HelperText{carry_states_helper, nullptr, nullptr};
  if (name == "ladle_bwd_initial") return HelperText{initial_helper, nullptr, nullptr};
  for (const auto& [suffix, type] : {std::pair{"f32", "float"}, std::pair{"bf16", "ladle_bf16"}, std::pair{"f16", "ladle_f16"}}) {
    if (name == std::string("ladle_bwd_convert_") + suffix) return HelperText{convert_helper, "LADLE_BWD_CONVERT", type};
    if (name == std::string("ladle_bwd_normalized_") + suffix) return HelperText{normalized_helper, "LADLE_BWD_NORMALIZED", type};
  }
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& backward_helper_names() {
  static const std::vector<std::string> names{"ladle_bwd_carry", "ladle_bwd_update_finish", "ladle_bwd_carry_states", "ladle_bwd_initial",
                                              "ladle_bwd_normalized_f32", "ladle_bwd_normalized_bf16", "ladle_bwd_normalized_f16",
                                              "ladle_bwd_convert_f32", "ladle_bwd_convert_bf16", "ladle_bwd_convert_f16"};
  return names;
}

std::string backward_helpers_source() {
  std::string s = "// ladle: the recurrent backward's helper kernels (codegen/cuda/backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += helper_prelude();
  for (const char* text : {carry_helper, update_finish_helper, carry_states_helper, initial_helper, convert_helper, normalized_helper}) {
    s += text;
    s += "\n";
  }
  for (const char* suffix : {"f32", "bf16", "f16"}) {
    const HelperText t = *helper_text(std::string("ladle_bwd_normalized_") + suffix);
    s += fmt::format("{}(ladle_bwd_normalized_{}, {})\n", t.macro, suffix, t.type);
  }
  for (const char* suffix : {"f32", "bf16", "f16"}) {
    const HelperText t = *helper_text(std::string("ladle_bwd_convert_") + suffix);
    s += fmt::format("{}(ladle_bwd_convert_{}, {})\n", t.macro, suffix, t.type);
  }
  return s;
}

std::string backward_helper_source(const std::string& name) {
  const std::optional<HelperText> t = helper_text(name);
  if (!t) throw InvalidArgument("backward_helper_source: '" + name + "' is not a helper kernel (backward_helper_names lists them)");
  std::string s = "// ladle: the recurrent backward's helper kernel " + name + " (codegen/cuda/backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += helper_prelude();
  s += t->text;
  s += "\n";
  if (t->macro) s += fmt::format("{}({}, {})\n", t->macro, name, t->type);
  return s;
}

std::string backward_block_source() {
  std::string s = "// ladle: the recurrent backward's block kernel (codegen/cuda/backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += "#include <ladle/codegen/device/tensor_core.cuh>\n"
       "#include <ladle/codegen/device/block_mma.cuh>\n"
       "#include <ladle/codegen/device/plain_backward.cuh>\n";
  return s;
}

}  // namespace ladle::cuda
