#include "cuda_backward.h"

#include <algorithm>
#include <initializer_list>

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

BackwardKernel generate_backward(const ir::Variant& variant, const BackwardKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_backward: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (variant.normalize) fail("a normalised read has no GPU backward (its CPU backward runs)");
  check_types("generate_backward", variant, spec);
  if (!floating(spec.slot_type) || !floating(spec.d_output_type)) fail("slot_type and d_output_type must be f32, f16 or bf16");

  // The kernel's own names: an input called s, t or u is renamed (in<i>_s) rather than shadowed.
  const std::vector<std::string> id = identifiers(
      variant, {"CHUNK", "REVERSE", "B", "T", "H", "K", "V", "C", "n", "h", "b", "bos", "eos", "len", "s", "s0", "s1", "i", "j", "key",
                "value", "t", "t_step", "r", "live", "scale_t", "ga", "gb", "u", "dks", "dvs", "qs", "kf", "vf", "dos", "o_f", "carry",
                "carry_row", "log_a", "log_a_next", "log_b", "log_b_next", "d_out", "u_i", "dk_i", "dv_j", "p", "offset", "cu_seqlens"});
  const auto& inputs = variant.inputs;
  const auto has = [&](ir::Slot s) { return variant.has(s); };
  const bool decays_k = has(ir::Slot::log_decay_k) || has(ir::Slot::log_decay_head);
  const bool decays_v = has(ir::Slot::log_decay_v);
  const InputUse use = input_use(variant);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].kind == ir::InputKind::token_key && use.value_side[k])
      fail("input '" + inputs[k].name + "' has the key width but a value-side slot reads it");
    if (inputs[k].kind == ir::InputKind::token_value && use.key_side[k])
      fail("input '" + inputs[k].name + "' has the value width but a key-side slot reads it");
  }
  const bool slots = spec.phase == BackwardPhase::slots;

  const std::string key = std::string(to_string(spec.phase)) + types_key(spec) + element_type_name(spec.slot_type) +
                          element_type_name(spec.d_output_type);
  BackwardKernel kernel;
  kernel.name = std::string("ladle_bwd_") + to_string(spec.phase) + "_" + hex(fnv1a(key, ir::hash(variant)));

  // ---- Parameters: the inputs as the forward's kernels take them, then the phase's own.
  std::vector<std::string> declarations;
  {
    KernelTypes types = spec;
    types.initial_state = types.final_state = types.varlen = false;
    std::vector<KernelParam> all;
    std::vector<std::string> all_declarations;
    declare_params(variant, id, types, all_declarations, all);
    for (std::size_t p = 0; p < all.size(); ++p)
      if (all[p].input >= 0) kernel.params.push_back(all[p]), declarations.push_back(all_declarations[p]);
  }
  const std::string E = storage_type(spec.slot_type);
  const auto extra = [&](const std::string& c_type, const std::string& name, const std::string& what = "") {
    declarations.push_back(c_type + (c_type.back() == '*' ? " __restrict__ " : " ") + name);
    kernel.extra_params.push_back(what.empty() ? name : what);
  };
  const auto d_out_params = [&] {
    extra(std::string("const ") + storage_type(spec.d_output_type) + "*", "d_out");
    for (const char* name : {"d_out_stride_b", "d_out_stride_t", "d_out_stride_h", "d_out_stride_d"}) extra("long long", name);
  };
  if (slots) {
    for (const char* name : {"qs", "kf", "vf", "dos"}) extra(E + "*", name);
    if (decays_k) extra("float*", "log_a"), extra("float*", "log_a_next");
    if (decays_v) extra("float*", "log_b"), extra("float*", "log_b_next");
    d_out_params();
  } else {
    for (const char* name : {"u", "dks", "dvs"}) extra("const float*", name);
    if (decays_v) extra("const float*", "o_f");
    d_out_params();
    if (spec.phase == BackwardPhase::totals) {
      extra("float*", "totals");
    } else {
      if (decays_k || decays_v) extra("const float*", "carry");
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (inputs[k].kind == ir::InputKind::scalar) continue;
        extra("float*", "d_" + id[k], "d/" + inputs[k].name);
        for (const char* dim : {"sb", "st", "sh", "sd"})
          extra("long long", "d_" + id[k] + "_" + dim, "d/" + inputs[k].name + "/" + dim);
      }
    }
  }
  if (spec.varlen) extra("const long long*", "cu_seqlens");
  for (const char* name : {"B", "T", "H", "K", "V", "C"}) extra("int", name);

  // ---- Header
  std::string header = "ladle: recurrent backward, " + std::string(to_string(spec.phase)) + " kernel " + kernel.name +
                       "\nGenerated by codegen/cuda_backward.cpp; do not edit.\n\n";
  header += ir::to_string(variant);
  header += "\nlaunch: grid (C = chunks of " + std::to_string(backward_chunk) +
            " steps in the longest sequence, N * H), block (one thread per feature: max(K, V) rounded to warps)\n";
  header += "types: " + types_line(variant, id, spec) + "; slots " + element_type_name(spec.slot_type) + "\n";
  header += std::string("reverse=") + (spec.reverse ? "1" : "0") + " varlen=" + (spec.varlen ? "1" : "0") + "\n";
  if (slots)
    header += "Writes the slots at every token: qs = q_feature * scale, kf, vf, dos (d_output), the log decays and\n"
              "the next step's log decays (0 at a sequence's last step).\n";
  else if (spec.phase == BackwardPhase::totals)
    header += "Sums each block's per-step terms of the decays' gradients: (scale q_feature) . u - k_feature . dk per key\n"
              "feature, o . do - v . dv per value feature (the slots recomputed from the inputs, in fp32).\n";
  else
    header += "Walks each block's steps backwards: the decays' gradients are running sums from carry; every slot's\n"
              "gradient times d slot / d input (ir::derivative) is added into that input's gradient.\n";

  Code c;
  c(comment_block(header) + "\n" + storage_helpers);
  c("extern \"C\" __global__ void __launch_bounds__(1024) " + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("constexpr int CHUNK = " + std::to_string(backward_chunk) + ";");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("const int n = blockIdx.y / H, h = blockIdx.y % H;");
  emit_sequence_bounds(c, false, spec.varlen);
  c("const long long len = eos - bos, s0 = static_cast<long long>(blockIdx.x) * CHUNK;");
  c("if (s0 >= len) return;");
  c("const long long s1 = s0 + CHUNK < len ? s0 + CHUNK : len;");
  c("const int i = threadIdx.x, j = threadIdx.x;  // this thread's key feature and value feature");
  c("const bool key = i < K, value = j < V;");
  c("(void)B;");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].kind == ir::InputKind::scalar) continue;
    c("const int " + id[k] + "_head = h * " + id[k] + "_heads / H; (void)" + id[k] + "_head;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
        "_stride_h); (void)" + id[k] + "_value;");
  std::vector<bool> all(inputs.size(), true);
  // The loads of a side's per-feature inputs at feature i (key) or j (value).
  const auto side_loads = [&](bool key_side) {
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const bool wanted = key_side ? inputs[k].kind == ir::InputKind::token_key : inputs[k].kind == ir::InputKind::token_value;
      if (!wanted) continue;
      const std::string f = key_side ? "i" : "j";
      c("const float " + id[k] + "_" + f + " = " + row_load(id, k, f) + "; (void)" + id[k] + "_" + f + ";");
    }
  };
  const auto slot_or = [&](ir::Slot s, const std::string& suffix, const char* otherwise) {
    return has(s) ? render_slot(variant, id, s, suffix) : std::string(otherwise);
  };
  const auto log_a_expr = [&] {
    std::vector<std::string> terms;
    for (ir::Slot s : {ir::Slot::log_decay_k, ir::Slot::log_decay_head})
      if (has(s)) terms.push_back(render_slot(variant, id, s, "_i"));
    std::string e;
    for (const std::string& term : terms) {
      if (!e.empty()) e.append(" + ");
      e.append("(").append(term).append(")");
    }
    return e;
  };

  if (slots) {
    c("for (long long s = s0; s < s1; ++s) {");
    c.in();
    c("const long long t_step = REVERSE ? eos - 1 - s : bos + s;");
    c("const long long r = (static_cast<long long>(b) * T + t_step) * H + h;  // the slot row");
    c("{");
    c.in();
    c("const long long t = t_step;");
    token_rows(c, variant, id, all, false);
    c("const float scale_t = " + slot_or(ir::Slot::scale, "", "1.0f") + ";");
    c("if (key) {");
    c.in();
    side_loads(true);
    c("ladle_store(qs + r * K + i, (" + render_slot(variant, id, ir::Slot::q_feature, "_i") + ") * scale_t);");
    c("ladle_store(kf + r * K + i, " + render_slot(variant, id, ir::Slot::k_feature, "_i") + ");");
    if (decays_k) c("log_a[r * K + i] = " + log_a_expr() + ";");
    c.out();
    c("}");
    c("if (value) {");
    c.in();
    side_loads(false);
    c("ladle_store(vf + r * V + j, " + render_slot(variant, id, ir::Slot::v, "_j") + ");");
    c("ladle_store(dos + r * V + j, ladle_load(d_out + b * d_out_stride_b + t * d_out_stride_t + h * d_out_stride_h + j * "
      "d_out_stride_d));");
    if (decays_v) c("log_b[r * V + j] = " + render_slot(variant, id, ir::Slot::log_decay_v, "_j") + ";");
    c.out();
    c("}");
    c.out();
    c("}");
    if (decays_k || decays_v) {
      c("{  // the next step's decays at this step's row: what the backward's recurrences over dS multiply by");
      c.in();
      c("const bool live = s + 1 < len;");
      c("const long long t = live ? (REVERSE ? t_step - 1 : t_step + 1) : t_step;");
      token_rows(c, variant, id, all, true);
      if (decays_k) {
        c("if (key) {");
        c.in();
        side_loads(true);
        c("log_a_next[r * K + i] = live ? " + log_a_expr() + " : 0.0f;");
        c.out();
        c("}");
      }
      if (decays_v) {
        c("if (value) {");
        c.in();
        side_loads(false);
        c("log_b_next[r * V + j] = live ? " + render_slot(variant, id, ir::Slot::log_decay_v, "_j") + " : 0.0f;");
        c.out();
        c("}");
      }
      c.out();
      c("}");
    }
    c.out();
    c("}");
    c.out();
    c("}");
    kernel.source = c.text();
    return kernel;
  }

  // The decays' per-step terms, from the slots recomputed in fp32 (the recurrences' operands may be 16-bit).
  const std::string key_term = "(" + render_slot(variant, id, ir::Slot::q_feature, "_i") + ") * scale_t * u_i - (" +
                               render_slot(variant, id, ir::Slot::k_feature, "_i") + ") * dk_i";
  const std::string value_term =
      "o_f[r * V + j] * ladle_load(d_out + b * d_out_stride_b + t * d_out_stride_t + h * d_out_stride_h + j * d_out_stride_d) - (" +
      render_slot(variant, id, ir::Slot::v, "_j") + ") * dv_j";
  const auto step_prologue = [&] {
    c("const long long r = (static_cast<long long>(b) * T + t) * H + h;  // the slot row");
    token_rows(c, variant, id, all, false);
    c("const float scale_t = " + slot_or(ir::Slot::scale, "", "1.0f") + "; (void)scale_t;");
  };
  if (spec.phase == BackwardPhase::totals) {
    c("float ta = 0.0f, tb = 0.0f;");
    c("for (long long s = s0; s < s1; ++s) {");
    c.in();
    c("const long long t = REVERSE ? eos - 1 - s : bos + s;");
    step_prologue();
    if (decays_k) {
      c("if (key) {");
      c.in();
      side_loads(true);
      c("const float u_i = u[r * K + i], dk_i = dks[r * K + i];");
      c("ta += " + key_term + ";");
      c.out();
      c("}");
    }
    if (decays_v) {
      c("if (value) {");
      c.in();
      side_loads(false);
      c("const float dv_j = dvs[r * V + j];");
      c("tb += " + value_term + ";");
      c.out();
      c("}");
    }
    c.out();
    c("}");
    c("const long long row = (static_cast<long long>(blockIdx.y) * C + blockIdx.x) * (K + V);");
    c("if (key) totals[row + i] = ta;");
    c("if (value) totals[row + K + j] = tb;");
    c.out();
    c("}");
    kernel.source = c.text();
    return kernel;
  }

  // ---- chain
  c("const long long carry_row = (static_cast<long long>(blockIdx.y) * C + blockIdx.x) * (K + V);");
  if (decays_k) c("float ga = key && carry ? carry[carry_row + i] : 0.0f;  // d L / d log_a at the current step");
  if (decays_v) c("float gb = value && carry ? carry[carry_row + K + j] : 0.0f;  // d L / d log_b");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].kind == ir::InputKind::head) c("float head_" + id[k] + " = 0.0f;  // this thread's part of d " + inputs[k].name);
  c("for (long long s = s1 - 1; s >= s0; --s) {");
  c.in();
  c("const long long t = REVERSE ? eos - 1 - s : bos + s;");
  step_prologue();
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].kind != ir::InputKind::scalar) c("float acc_" + id[k] + " = 0.0f;");
  // Each slot's gradient at this thread's feature, and its derivative by every input it reads.
  const auto chain_slot = [&](ir::Slot s, const std::string& gradient, const std::string& suffix) {
    if (!has(s)) return;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k].kind == ir::InputKind::scalar || !reads(variant.slot(s), k)) continue;
      const ir::Expr d = ir::derivative(variant.slot(s), static_cast<std::int32_t>(k));
      if (is_zero(d)) continue;
      c("acc_" + id[k] + " += (" + gradient + ") * (" + render_expr(variant, id, d, suffix) + ");  // " + ir::slot_name(s));
    }
  };
  c("if (key) {");
  c.in();
  side_loads(true);
  c("const float u_i = u[r * K + i], dk_i = dks[r * K + i];");
  if (decays_k) c("ga += " + key_term + ";");
  chain_slot(ir::Slot::q_feature, "scale_t * u_i", "_i");
  chain_slot(ir::Slot::k_feature, "dk_i", "_i");
  chain_slot(ir::Slot::log_decay_k, "ga", "_i");
  chain_slot(ir::Slot::log_decay_head, "ga", "_i");
  // d L / d scale = sum_i q_feature_i u_i: each thread adds its feature's part.
  chain_slot(ir::Slot::scale, "(" + render_slot(variant, id, ir::Slot::q_feature, "_i") + ") * u_i", "_i");
  c.out();
  c("}");
  c("if (value) {");
  c.in();
  side_loads(false);
  c("const float dv_j = dvs[r * V + j];");
  if (decays_v) c("gb += " + value_term + ";");
  chain_slot(ir::Slot::v, "dv_j", "_j");
  chain_slot(ir::Slot::log_decay_v, "gb", "_j");
  c.out();
  c("}");
  // Writes: a feature's element is this thread's alone unless query heads share the input (GQA).
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const auto kind = inputs[k].kind;
    const std::string d = "d_" + id[k];
    const std::string at = d + " + b * " + d + "_sb + t * " + d + "_st + " + id[k] + "_head * " + d + "_sh";
    if (kind == ir::InputKind::token_key || kind == ir::InputKind::token_value) {
      const std::string f = kind == ir::InputKind::token_key ? "i" : "j";
      c(std::string("if (") + (kind == ir::InputKind::token_key ? "key" : "value") + ") {");
      c("  float* const p = " + at + " + " + f + " * " + d + "_sd;");
      c("  if (" + id[k] + "_heads == H) *p = acc_" + id[k] + ";");
      c("  else atomicAdd(p, acc_" + id[k] + ");");
      c("}");
    } else if (kind == ir::InputKind::token_head) {
      c("for (int offset = 16; offset > 0; offset /= 2) acc_" + id[k] + " += __shfl_xor_sync(0xffffffffu, acc_" + id[k] + ", offset);");
      c("if (threadIdx.x % 32 == 0 && acc_" + id[k] + " != 0.0f) atomicAdd(" + at + ", acc_" + id[k] + ");");
    } else if (kind == ir::InputKind::head) {
      c("head_" + id[k] + " += acc_" + id[k] + ";");
    }
  }
  c.out();
  c("}");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].kind == ir::InputKind::head) {
      const std::string d = "d_" + id[k];
      c("for (int offset = 16; offset > 0; offset /= 2) head_" + id[k] + " += __shfl_xor_sync(0xffffffffu, head_" + id[k] + ", offset);");
      c("if (threadIdx.x % 32 == 0 && head_" + id[k] + " != 0.0f) atomicAdd(" + d + " + b * " + d + "_sb + " + id[k] + "_head * " + d +
        "_sh, head_" + id[k] + ");");
    }
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

std::string backward_helpers_source() {
  std::string s = "// ladle: the recurrent backward's helper kernels (codegen/cuda_backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += R"(
#define LADLE_BWD_CHUNK )" + std::to_string(backward_chunk) + R"(

// The sequence of (sequence n): its batch row and tokens [bos, eos).
__device__ __forceinline__ void ladle_bwd_bounds(const long long* cu_seqlens, int n, int T, int& b, long long& bos, long long& eos) {
  if (cu_seqlens) b = 0, bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
  else b = n, bos = 0, eos = T;
}

// One thread per (n, h, f < K + V): carry[(n H + h) C + c][f] = init + the totals of the blocks after c,
// init = sum_j d_final[i][j] S[i][j] (f = i < K) or sum_i (f = K + j), S read from s_t [N,H,V,K].
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_carry(
    const float* __restrict__ totals, const float* __restrict__ d_final, const float* __restrict__ s_t,
    float* __restrict__ carry, const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int C) {
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
      for (int j = 0; j < V; ++j) acc += d_final[(p * K + f) * V + j] * s_t[(p * V + j) * K + f];
    else
      for (int i = 0; i < K; ++i) acc += d_final[(p * K + i) * V + (f - K)] * s_t[(p * V + (f - K)) * K + i];
  }
  for (long long c = chunks - 1; c >= 0; --c) {
    carry[(p * C + c) * KV + f] = acc;
    acc += totals[(p * C + c) * KV + f];
  }
}

// One thread per (n, h, i, j): d_h0 = exp(log_a) dS_0 exp(log_b) at the sequence's first step (dS_0 alone
// for an empty sequence).
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_initial(
    const float* __restrict__ ds0, const float* __restrict__ log_a, const float* __restrict__ log_b,
    float* __restrict__ d_h0, const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int reverse) {
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<long long>(N) * H * K * V) return;
  const long long p = index / (static_cast<long long>(K) * V);
  const int i = static_cast<int>(index / V % K), j = static_cast<int>(index % V);
  const int n = static_cast<int>(p / H), h = static_cast<int>(p % H);
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, n, T, b, bos, eos);
  float x = ds0[index];
  if (eos > bos) {
    const long long r = (static_cast<long long>(b) * T + (reverse ? eos - 1 : bos)) * H + h;
    if (log_a) x *= expf(log_a[r * K + i]);
    if (log_b) x *= expf(log_b[r * V + j]);
  }
  d_h0[index] = x;
}

// One thread per element of a strided [N,H,R,C] tensor: out [N,H,R,C] and out_t [N,H,C,R], fp32 (either may be null).
#define LADLE_BWD_CONVERT(NAME, E)                                                                            \
extern "C" __global__ void __launch_bounds__(256) NAME(                                                       \
    const E* __restrict__ in, long long s0, long long s1, long long s2, long long s3, int N, int H, int R, int C, \
    float* __restrict__ out, float* __restrict__ out_t) {                                                     \
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;                      \
  if (index >= static_cast<long long>(N) * H * R * C) return;                                                  \
  const int c = static_cast<int>(index % C), r = static_cast<int>(index / C % R);                              \
  const long long p = index / (static_cast<long long>(R) * C);                                                 \
  const float x = ladle_load(in + (p / H) * s0 + (p % H) * s1 + r * s2 + c * s3);                              \
  if (out) out[index] = x;                                                                                    \
  if (out_t) out_t[(p * C + c) * R + r] = x;                                                                  \
}
LADLE_BWD_CONVERT(ladle_bwd_convert_f32, float)
LADLE_BWD_CONVERT(ladle_bwd_convert_bf16, ladle_bf16)
LADLE_BWD_CONVERT(ladle_bwd_convert_f16, ladle_f16)
)";
  return s;
}

}  // namespace ladle::cuda
