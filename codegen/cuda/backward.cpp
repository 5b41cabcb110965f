#include "backward.h"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <set>
#include <utility>

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

std::string backward_block_source() {
  std::string s = "// ladle: the recurrent backward's block kernel (codegen/cuda/backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += "#include <ladle/codegen/device/tensor_core.cuh>\n"
       "#include <ladle/codegen/device/block_mma.cuh>\n"
       "#include <ladle/codegen/device/plain_backward.cuh>\n";
  return s;
}

}  // namespace ladle::cuda
