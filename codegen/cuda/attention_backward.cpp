#include "attention_backward.h"

#include <algorithm>
#include <set>
#include <tuple>

#include <ladle/runtime/error.h>

#include "detail/attention_backward.h"
#include "detail/attention_helpers.h"
#include "detail/attention_parts.h"
#include "detail/cuda_source.h"
#include "detail/hoist.h"
#include "../render_c.h"

namespace ladle::cuda {

using namespace detail;

namespace {


int pad16(int x) { return (x + 15) / 16 * 16; }

bool sixteen_bit(DType t) { return t == DType::f16 || t == DType::bf16; }

// The dynamic shared memory a sync block may have on the target (unknown: sm_90's).
int sync_shared_limit(const std::string& arch) {
  const Target t = target(arch);
  return t.max_shared_bytes > 0 ? t.max_shared_bytes : attention_backward_max_shared_bytes;
}


}  // namespace

// ws: a 1024-byte alignment pad, K and V of the block's 128 keys, the q / d_output ring, dS^T
// twice, dQ's stages (dq_tma), the row statistics of two steps, the mbarriers. sync: K and V of the
// block's 64 keys, q and do of a step, dS^T (rows padded by 8 elements), each twice when split, and
// the row statistics of a step.
int attention_backward_shared_bytes(const AttentionBackwardSpec& spec) {
  if (spec.form == AttentionBackwardForm::sync) {
    const int ld = pad16(spec.D) + 8, vld = pad16(spec.Dv) + 8, rows = spec.sync_rows, halves = attention_backward_split(spec) ? 2 : 1;
    return halves * 2 * ((64 + rows) * (ld + vld) + 64 * (rows + 8)) + rows * 8;
  }
  constexpr int BM = 64;
  const int BN = attention_backward_column_split(spec) ? 64 : 128;
  const int DPB = (spec.D + 63) / 64 * 64, DVPB = (spec.Dv + 63) / 64 * 64;
  const int q_bytes = BM * DPB * 2, do_bytes = BM * DVPB * 2, k_bytes = BN * DPB * 2, v_bytes = BN * DVPB * 2, ds_bytes = BN * 128;
  return 1024 + k_bytes + v_bytes + spec.stages * (q_bytes + do_bytes) + 2 * ds_bytes + (spec.dq_tma ? 2 * 2 * BM * 128 : 0) + 2 * BM * 8 +
         8 * (1 + 2 * spec.stages);
}

bool attention_backward_column_split(const AttentionBackwardSpec& spec) {
  return spec.form == AttentionBackwardForm::ws && std::max(spec.D, spec.Dv) > 128;
}

const char* to_string(AttentionBackwardForm form) { return form == AttentionBackwardForm::sync ? "sync" : "ws"; }

bool attention_backward_split(const AttentionBackwardSpec& spec) {
  if (spec.input_types.size() < 3) return false;
  const DType q = spec.input_types[0];
  return !sixteen_bit(q) || spec.input_types[1] != q || spec.input_types[2] != q;
}

AttentionBackwardForm attention_backward_form(const std::vector<DType>& input_types, int D, int Dv, const std::string& arch) {
  const bool one_16_bit = input_types.size() >= 3 && sixteen_bit(input_types[0]) && input_types[1] == input_types[0] &&
                          input_types[2] == input_types[0];
  return one_16_bit && D <= 256 && Dv <= 256 && has_wgmma(arch) ? AttentionBackwardForm::ws : AttentionBackwardForm::sync;
}

AttentionBackwardSpec with_sync_tile(AttentionBackwardSpec spec) {
  spec.form = AttentionBackwardForm::sync;
  spec.dq_tma = false;
  spec.copy_d_output = false;
  // Registers: 4 warps of 16 keys hold dK and dV (columns / 2 floats a thread each), S^T and dP^T (rows / 2 each)
  // and P's and dS's fragments (rows / 4 each, twice when split). Split: 64 columns and 64 rows (244 registers
  // at D = 64, no spills); 16-bit: 128 columns and 32 rows past D = 64 (64 rows spill at D = 256), 16 past
  // D = 192 (32 spill 8 bytes at D = 256 on sm_80).
  const bool split = attention_backward_split(spec);
  spec.sync_columns = split || std::max(spec.D, spec.Dv) <= 64 ? 64 : 128;
  const int limit = sync_shared_limit(spec.arch);
  const bool wide = std::max(pad16(spec.D), pad16(spec.Dv)) > 192;  // 16-bit past 192: 32 rows spill on sm_80
  for (const int rows : {64, 32, 16}) {
    spec.sync_rows = rows;
    if (rows == 64 && spec.sync_columns == 128) continue;
    if (rows == 32 && spec.sync_columns == 128 && wide) continue;
    if (attention_backward_shared_bytes(spec) <= limit) break;
  }
  return spec;
}

std::string to_string(const AttentionBackwardTile& tile) {
  return "stages=" + std::to_string(tile.stages) + (tile.dq_tma ? " dq=tma" : " dq=red");
}

AttentionBackwardSpec with_tile(AttentionBackwardSpec spec, const AttentionBackwardTile& tile) {
  if (spec.form == AttentionBackwardForm::sync) return spec;  // its tile is with_sync_tile's
  spec.stages = tile.stages;
  spec.dq_tma = spec.dq_tma && tile.dq_tma && !attention_backward_column_split(spec) &&
                attention_backward_shared_bytes(spec) <= attention_backward_max_shared_bytes;
  return spec;
}

std::vector<std::string> attention_backward_unsupported(const ir::AttentionVariant& variant, const AttentionBackwardSpec& spec) {
  std::vector<std::string> problems;
  if (spec.input_types.size() < 3 || spec.input_types.size() != variant.inputs.size()) {
    problems.push_back("input_types has " + std::to_string(spec.input_types.size()) + " entries, expected one per variant input (" +
                       std::to_string(variant.inputs.size()) + ")");
    return problems;
  }
  const DType q = spec.input_types[0];
  if (spec.form == AttentionBackwardForm::sync) {
    for (int k = 0; k < 3; ++k)
      if (spec.input_types[k] != DType::f32 && !sixteen_bit(spec.input_types[k]))
        problems.push_back(std::string("q, k, v are ") + dtype_name(spec.input_types[0]) + ", " + dtype_name(spec.input_types[1]) + ", " +
                           dtype_name(spec.input_types[2]) + ": the GPU backward takes f32, f16 or bf16");
    for (const auto& [name, dim] : {std::pair{"D", spec.D}, std::pair{"Dv", spec.Dv}})
      if (dim < 8 || dim > 256 || dim % 8 != 0)
        problems.push_back(std::string(name) + " = " + std::to_string(dim) + ": the GPU backward takes head dims of 8 to 256, multiples of 8");
    const Target t = target(spec.arch);
    if (!t.arch.empty() && t.version > 0 && !t.mma_sync)
      problems.push_back("the GPU backward runs on mma.sync: it needs sm_80 or later, the target is " + spec.arch);
    if (spec.sync_rows != 16 && spec.sync_rows != 32 && spec.sync_rows != 64)
      problems.push_back("sync_rows = " + std::to_string(spec.sync_rows) + ", expected 16, 32 or 64");
    if (spec.sync_columns != 64 && spec.sync_columns != 128)
      problems.push_back("sync_columns = " + std::to_string(spec.sync_columns) + ", expected 64 or 128");
    else if (const int bytes = attention_backward_shared_bytes(spec); bytes > sync_shared_limit(spec.arch))
      problems.push_back("D = " + std::to_string(spec.D) + ", Dv = " + std::to_string(spec.Dv) + " with " + std::to_string(spec.sync_rows) +
                         " query rows a step needs " + std::to_string(bytes) + " bytes of shared memory, more than a block's " +
                         std::to_string(sync_shared_limit(spec.arch)) + " on " + (spec.arch.empty() ? std::string("this target") : spec.arch));
    if (spec.dq_tma || spec.copy_d_output) problems.push_back("the sync form takes neither dq_tma nor copy_d_output");
  } else {
  if (!sixteen_bit(q) || spec.input_types[1] != q || spec.input_types[2] != q)
    problems.push_back(std::string("q, k, v are ") + dtype_name(spec.input_types[0]) + ", " + dtype_name(spec.input_types[1]) +
                       ", " + dtype_name(spec.input_types[2]) + ": the GPU backward takes q, k, v of one 16-bit type (f16 or bf16)");
  for (const auto& [name, dim] : {std::pair{"D", spec.D}, std::pair{"Dv", spec.Dv}})
    if (dim < 8 || dim > 256 || dim % 8 != 0)
      problems.push_back(std::string(name) + " = " + std::to_string(dim) + ": the GPU backward takes head dims of 8 to 256, multiples of 8");
  if (attention_backward_column_split(spec) && spec.dq_tma) problems.push_back("dq_tma: head dims past 128 add dQ by red.global");
  if (!has_wgmma(spec.arch))
    problems.push_back("the GPU backward runs on wgmma and TMA: it needs the target sm_90a, the target is " +
                       (spec.arch.empty() ? std::string("unknown") : spec.arch));
  if (spec.stages < 2 || spec.stages > 4) problems.push_back("stages = " + std::to_string(spec.stages) + ", expected 2 to 4");
  else if (const int bytes = attention_backward_shared_bytes(spec); bytes > attention_backward_max_shared_bytes)
    problems.push_back("stages = " + std::to_string(spec.stages) + " at D = " + std::to_string(spec.D) + ", Dv = " + std::to_string(spec.Dv) +
                       " needs " + std::to_string(bytes) + " bytes of shared memory, more than a block's " +
                       std::to_string(attention_backward_max_shared_bytes));
  }
  if (!spec.input_gradients.empty() && spec.input_gradients.size() != variant.inputs.size())
    problems.push_back("input_gradients has " + std::to_string(spec.input_gradients.size()) + " entries, expected one per variant input");
  return problems;
}

namespace {

// The main kernel's block: a step's tile of queries, the block's keys (two warpgroups of 64).
constexpr int query_tile = 64;

std::string storage(DType t) { return t == DType::u8 ? "unsigned char" : storage_type(t); }

// prep's parameters, into kernel.prep_params; returns their declarations.
std::vector<std::string> declare_prep_params(const AttentionBackwardParts& parts, AttentionBackwardKernel& kernel) {
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  const AttentionBackwardSpec& spec = parts.spec;
  std::vector<std::string> prep_decl;
  const auto prep_param = [&](const std::string& c_type, const std::string& name, Type type, Role role, int input = -1) {
    prep_decl.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
    kernel.prep_params.push_back({name, c_type, type, role, input});
  };
  prep_param("const " + std::string(storage_type(spec.output_type)) + "*", "o", Type::pointer, Role::output);
  prep_param("long long", "o_stride_b", Type::i64, Role::output_stride_b);
  prep_param("long long", "o_stride_t", Type::i64, Role::output_stride_t);
  prep_param("long long", "o_stride_h", Type::i64, Role::output_stride_h);
  prep_param("long long", "o_stride_d", Type::i64, Role::output_stride_d);
  prep_param("const float*", "lse", Type::pointer, Role::lse);
  prep_param("const " + std::string(storage_type(spec.d_output_type)) + "*", "d_output", Type::pointer, Role::d_output);
  prep_param("long long", "d_output_stride_b", Type::i64, Role::d_output_stride_b);
  prep_param("long long", "d_output_stride_t", Type::i64, Role::d_output_stride_t);
  prep_param("long long", "d_output_stride_h", Type::i64, Role::d_output_stride_h);
  prep_param("long long", "d_output_stride_d", Type::i64, Role::d_output_stride_d);
  if (spec.copy_d_output) prep_param(std::string(storage_type(spec.input_types[0])) + "*", "d_output_copy", Type::pointer, Role::d_output_copy);
  prep_param("float2*", "row_stats", Type::pointer, Role::row_stats);
  if (spec.sinks_gradient) {
    prep_param("const " + storage(spec.sinks_type) + "*", "softmax_aux", Type::pointer, Role::softmax_aux);
    prep_param("long long", "softmax_aux_stride_h", Type::i64, Role::softmax_aux_stride_h);
    prep_param("long long", "softmax_aux_stride_s", Type::i64, Role::softmax_aux_stride_s);
    prep_param("int", "sinks", Type::i32, Role::sinks);
    prep_param("float*", "d_softmax_aux", Type::pointer, Role::d_softmax_aux);
    prep_param("long long", "d_softmax_aux_stride_h", Type::i64, Role::d_softmax_aux_stride_h);
    prep_param("long long", "d_softmax_aux_stride_s", Type::i64, Role::d_softmax_aux_stride_s);
  }
  if (spec.varlen) prep_param("const long long*", "cu_seqlens_q", Type::pointer, Role::cu_seqlens_q);
  prep_param("int", "Tq", Type::i32, Role::q_tokens);
  prep_param("int", "H", Type::i32, Role::heads);
  return prep_decl;
}

// main's parameters, into kernel.main_params; returns their declarations.
std::vector<std::string> declare_main_params(const AttentionBackwardParts& parts, AttentionBackwardKernel& kernel) {
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  const AttentionBackwardSpec& spec = parts.spec;
  const ir::AttentionVariant& variant = parts.variant;
  const auto& inputs = variant.inputs;
  const std::vector<std::string>& id = parts.id;
  const int BM = query_tile, BN = parts.key_block;
  std::vector<std::string> decl;
  const auto param = [&](const std::string& c_type, const std::string& name, Type type, Role role, int input = -1) {
    decl.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
    kernel.main_params.push_back({name, c_type, type, role, input});
  };
  for (std::size_t k = 3; k < inputs.size(); ++k) {
    const ir::Input& in = inputs[k];
    const int index = static_cast<int>(k);
    if (in.kind == ir::InputKind::scalar) {
      param("float", id[k], Type::f32, Role::input, index);
      continue;
    }
    param("const " + storage(spec.input_types[k]) + "*", id[k], Type::pointer, Role::input, index);
    param("long long", id[k] + "_stride_b", Type::i64, Role::input_stride_b, index);
    if (in.kind == ir::InputKind::pair) param("long long", id[k] + "_stride_t", Type::i64, Role::input_stride_t, index);
    param("long long", id[k] + "_stride_h", Type::i64, Role::input_stride_h, index);
    if (in.kind == ir::InputKind::pair) param("long long", id[k] + "_stride_d", Type::i64, Role::input_stride_d, index);
    if (parts.gradient[k]) {
      param("float*", "d_" + id[k], Type::pointer, Role::d_input, index);
      param("long long", "d_" + id[k] + "_stride_b", Type::i64, Role::d_input_stride_b, index);
      if (in.kind == ir::InputKind::pair) param("long long", "d_" + id[k] + "_stride_t", Type::i64, Role::d_input_stride_t, index);
      param("long long", "d_" + id[k] + "_stride_h", Type::i64, Role::d_input_stride_h, index);
      if (in.kind == ir::InputKind::pair) param("long long", "d_" + id[k] + "_stride_d", Type::i64, Role::d_input_stride_d, index);
    }
  }
  param("int", "H_kv", Type::i32, Role::input_heads, 1);
  if (spec.form == AttentionBackwardForm::sync) {  // q, k, v and d_output read in place, any strides
    for (int k = 0; k < 3; ++k) {
      param("const " + storage(spec.input_types[k]) + "*", id[k], Type::pointer, Role::input, k);
      param("long long", id[k] + "_stride_b", Type::i64, Role::input_stride_b, k);
      param("long long", id[k] + "_stride_t", Type::i64, Role::input_stride_t, k);
      param("long long", id[k] + "_stride_h", Type::i64, Role::input_stride_h, k);
      param("long long", id[k] + "_stride_d", Type::i64, Role::input_stride_d, k);
    }
    param("const " + storage(spec.d_output_type) + "*", "d_output", Type::pointer, Role::d_output);
    param("long long", "d_output_stride_b", Type::i64, Role::d_output_stride_b);
    param("long long", "d_output_stride_t", Type::i64, Role::d_output_stride_t);
    param("long long", "d_output_stride_h", Type::i64, Role::d_output_stride_h);
    param("long long", "d_output_stride_d", Type::i64, Role::d_output_stride_d);
  }
  for (const auto& [name, role, index, rows] : {std::tuple{"q_map", Role::tensor_map, 0, BM}, std::tuple{"k_map", Role::tensor_map, 1, BN},
                                                std::tuple{"v_map", Role::tensor_map, 2, BN}, std::tuple{"do_map", Role::d_output_map, -1, BM}}) {
    if (spec.form == AttentionBackwardForm::sync) break;
    decl.push_back(std::string("const __grid_constant__ ladle_tensor_map ") + name);
    kernel.main_params.push_back({name, "ladle_tensor_map", Type::tensor_map, role, index, rows});
  }
  if (spec.dq_tma) {
    decl.push_back("const __grid_constant__ ladle_tensor_map dq_map");
    kernel.main_params.push_back({"dq_map", "ladle_tensor_map", Type::tensor_map, Role::dq_map, -1, BM});
  }
  param("const float2*", "row_stats", Type::pointer, Role::row_stats);
  param("float*", "dq", Type::pointer, Role::dq);
  param("long long", "dq_stride_b", Type::i64, Role::dq_stride_b);
  param("long long", "dq_stride_t", Type::i64, Role::dq_stride_t);
  param("long long", "dq_stride_h", Type::i64, Role::dq_stride_h);
  param("float*", "dk", Type::pointer, Role::dk);
  param("long long", "dk_stride_b", Type::i64, Role::dk_stride_b);
  param("long long", "dk_stride_t", Type::i64, Role::dk_stride_t);
  param("long long", "dk_stride_h", Type::i64, Role::dk_stride_h);
  param("long long", "dk_stride_d", Type::i64, Role::dk_stride_d);
  param("float*", "dv", Type::pointer, Role::dv);
  param("long long", "dv_stride_b", Type::i64, Role::dv_stride_b);
  param("long long", "dv_stride_t", Type::i64, Role::dv_stride_t);
  param("long long", "dv_stride_h", Type::i64, Role::dv_stride_h);
  param("long long", "dv_stride_d", Type::i64, Role::dv_stride_d);
  declare_mask_params(param, variant, spec.q_segment_ids_type, spec.kv_segment_ids_type, spec.varlen);
  param("int", "Tq", Type::i32, Role::q_tokens);
  param("int", "Tk", Type::i32, Role::k_tokens);
  param("int", "H", Type::i32, Role::heads);
  return decl;
}

// The comment block at the top of the source: the variant, its derivatives, both launches.
std::string header_text(const AttentionBackwardParts& parts, const AttentionBackwardKernel& kernel) {
  const AttentionBackwardSpec& spec = parts.spec;
  const ir::AttentionVariant& variant = parts.variant;
  const auto& inputs = variant.inputs;
  const std::string t16 = parts.f16 ? "f16" : "bf16";
  std::string header = "ladle: attention backward kernels " + kernel.prep_name + ", " + kernel.name +
                       "\nGenerated by codegen/cuda/attention_backward.cpp; do not edit.\n\n";
  header += ir::to_string(variant);
  header += "\nlogit          = " + ir::to_string(inputs, variant.score) + "\n";
  if (!variant.keep.empty()) header += "keep           = " + ir::to_string(inputs, variant.keep) + "\n";
  header += "d logit/dscore = " + ir::to_string(inputs, ir::derivative(variant.score, ir::Op::score)) + "\n";
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (!parts.dinput_expression[k].empty())
      header += "d logit/d" + inputs[k].name + " = " + ir::to_string(inputs, ir::derivative(variant.score, static_cast<std::int32_t>(k))) + "\n";
  if (parts.sync) {
    const std::string operands = parts.split ? "bf16 hi + lo (q, k, v " + std::string(dtype_name(spec.input_types[0])) + ", " +
                                                   dtype_name(spec.input_types[1]) + ", " + dtype_name(spec.input_types[2]) + " split)"
                                             : t16;
    header += "D=" + std::to_string(spec.D) + " Dv=" + std::to_string(spec.Dv) + ", q, k, v " + operands + ", form sync (" + spec.arch + ")\n";
    header += "prep: grid (ceil(Tq / 8), N * H), block 256: delta = do . o, lse in log2 units" +
              std::string(spec.sinks_gradient ? ", the sinks' gradient" : "") + "\n";
    header += "main: grid attention_grid(N * H_kv, ceil(Tk / 64) * " + std::to_string(kernel.column_parts) + "), block 128 (4 warps of 16 keys; " +
              std::to_string(kernel.column_parts) + " column part" + (kernel.column_parts > 1 ? "s" : "") + " of " +
              std::to_string(spec.sync_columns) + "),\ndynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes; " +
              std::to_string(spec.sync_rows) + " queries a step, every query head of the key/value head's group\n"
              "S^T = K q^T, dP^T = V do^T, dV += P^T do, dK += dS^T q, dQ += dS K: mma.sync m16n8k16, fp32 accumulation\n";
    return header;
  }
  header += "D=" + std::to_string(spec.D) + " Dv=" + std::to_string(spec.Dv) + ", q, k, v " + t16 + ", stages " + std::to_string(spec.stages) + "\n";
  header += "prep: grid (ceil(Tq / 8), N * H), block 256: delta = do . o, lse in log2 units" +
            std::string(spec.sinks_gradient ? ", the sinks' gradient" : "") + (spec.copy_d_output ? ", d_output copied to " + t16 : "") + "\n";
  header += "main: grid attention_grid(N * H_kv, ceil(Tk / " + std::to_string(kernel.block_n) + ")), block 256 (" +
            (parts.column_split ? "two warpgroups of the block's 64 keys, each its own columns of dK and dV"
                                : "two warpgroups of 64 keys") + "; thread 0 issues the TMA copies),\n"
            "dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes; every query head of the key/value head's group\n"
            "S^T = K q^T, dP^T = V do^T, dV += P^T do, dK += dS^T q, dQ += dS K: wgmma.mma_async, fp32 accumulation\n";
  return header;
}

// The device helpers both kernels call (each guarded, so that a host emulation may define its own).
void emit_helpers(Code& c, const AttentionBackwardParts& parts, const std::string& header) {
  const bool f16 = parts.f16;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers + attention_helpers +
    wgmma_helpers(query_tile, parts.DVP, f16, f16) + wgmma_product(true, parts.DP, f16) + ws_helpers());
  if (parts.column_split)  // each warpgroup's dK and dV columns: up to 128 for warpgroup 0, the rest for warpgroup 1
    for (const int n : {parts.CDP, parts.CDVP, parts.DP - 128, parts.DVP - 128})
      if (n > 0) c(wgmma_product(true, n, f16));
  if (f16)
    c("#ifndef LADLE_WGMMA_TRANSPOSED_F16\n#define LADLE_WGMMA_TRANSPOSED_F16\n"
      "template <int N> __device__ void ladle_wgmma_ss_f16_tab(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1);\n"
      "#endif");
  else
    c(wgmma_transposed_helpers(64));
  if (f16) c(wgmma_product(false, 64, true, true, true));
  c(R"(#ifndef LADLE_ATTENTION_BACKWARD_HELPERS
#define LADLE_ATTENTION_BACKWARD_HELPERS
// dq's partial sums into global memory: a reduction of two adjacent floats (sm_90), no return value.
__device__ __forceinline__ void ladle_red_add_f32x2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}
// dQ's tile added to dq by the TMA unit: box (c0.., c1.., c2, c3) of the fp32 map read from shared memory in the
// 128-byte swizzle; the issuing thread commits its reductions as a bulk group and, before the source is written
// again, waits until its groups have read it.
__device__ __forceinline__ void ladle_tma_reduce_add_4d(const ladle_tensor_map* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(map),
               "r"(static_cast<unsigned>(__cvta_generic_to_shared(src))), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void ladle_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void ladle_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void ladle_bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void ladle_red_add_f32(float* p, float a) { atomicAdd(p, a); }
#endif)");
  c("");
}

// The sync form's device helpers: the tensor-core and attention helpers, atomics for dq and the
// score inputs' gradients, the lo half of a split pair.
void emit_sync_helpers(Code& c, const std::string& header) {
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers + attention_helpers);
  c(R"(#ifndef LADLE_ATTENTION_BACKWARD_SYNC_HELPERS
#define LADLE_ATTENTION_BACKWARD_SYNC_HELPERS
#ifndef LADLE_ATTENTION_BACKWARD_HELPERS
__device__ __forceinline__ void ladle_red_add_f32(float* p, float a) { atomicAdd(p, a); }
#endif
// Two adjacent floats added into global memory: one red.global.add.v2.f32 on sm_90, else two atomics.
__device__ __forceinline__ void ladle_red_add_pair(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  ladle_red_add_f32(p, a);
  ladle_red_add_f32(p + 1, b);
#endif
}
// The lo halves of a split pair: x - bf16(x) for each, rounded to bf16 (hi is ladle_pack_bf16's).
__device__ __forceinline__ unsigned ladle_pack_lo_bf16(float lo, float hi) {
  return ladle_pack_bf16(lo - ladle_bf16_float(ladle_bf16_bits(lo)), hi - ladle_bf16_float(ladle_bf16_bits(hi)));
}
#endif)");
  c("");
}

// prep: one warp per query row of one head.
void emit_prep(Code& c, const AttentionBackwardParts& parts, const std::string& prep_name, const std::vector<std::string>& prep_decl) {
  const AttentionBackwardSpec& spec = parts.spec;
  c("// ---- prep: one warp per query row of one head: delta = do . o (fp32), lse in log2 units" +
    std::string(spec.sinks_gradient ? ", the sinks' gradient" : ""));
  c("extern \"C\" __global__ void __launch_bounds__(256) " + prep_name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < prep_decl.size(); ++p) c(prep_decl[p] + (p + 1 < prep_decl.size() ? "," : ") {"));
  c.out();
  c("constexpr int DV = " + std::to_string(spec.Dv) + ";");
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;");
  c("const int n = blockIdx.y / H, h = blockIdx.y % H, i = blockIdx.x * 8 + warp;");
  emit_query_sequence(c, spec.varlen);
  c("const bool live = i < q_len;");
  c("float delta = 0.0f;");
  c("if (live) {");
  c.in();
  c("const " + std::string(storage_type(spec.output_type)) + "* const o_row = o + b * o_stride_b + (q_bos + i) * o_stride_t + h * o_stride_h;");
  c("const " + std::string(storage_type(spec.d_output_type)) +
    "* const do_row = d_output + b * d_output_stride_b + (q_bos + i) * d_output_stride_t + h * d_output_stride_h;");
  if (spec.copy_d_output)
    c(std::string(storage_type(spec.input_types[0])) + "* const copy_row = d_output_copy + ((static_cast<long long>(b) * Tq + q_bos + i) * H + h) * DV;");
  c("for (int d = lane; d < DV; d += 32) {");
  c("  const float x = ladle_load(do_row + d * d_output_stride_d);");
  c("  delta += x * ladle_load(o_row + d * o_stride_d);");
  if (spec.copy_d_output) c("  ladle_store(copy_row + d, x);");
  c("}");
  c.out();
  c("}");
  c("for (int m = 16; m > 0; m /= 2) delta += __shfl_xor_sync(0xffffffffu, delta, m);");
  c("const long long row = (static_cast<long long>(b) * H + h) * Tq + q_bos + i;");
  c("const float lse_row = live ? lse[row] : ladle_neg_inf();");
  c("// Nothing attended (lse -inf): lse2 = +inf, so that every p = 2^(logit - lse2) is 0.");
  c("if (live && lane == 0) row_stats[row] = make_float2(lse_row == ladle_neg_inf() ? -ladle_neg_inf() : lse_row * LOG2E, delta);");
  if (spec.sinks_gradient) {
    c("// d sink_s = -sum_i exp(sink_s - lse_i) delta_i: the block's rows summed in shared memory, one atomic per sink.");
    c("__shared__ float part[8];");
    c("for (int s = 0; s < sinks; ++s) {");
    c.in();
    c("const float sink = ladle_load(softmax_aux + h * softmax_aux_stride_h + s * softmax_aux_stride_s);");
    c("if (lane == 0) part[warp] = live && lse_row != ladle_neg_inf() ? -ladle_exp2((sink - lse_row) * LOG2E) * delta : 0.0f;");
    c("__syncthreads();");
    c("if (threadIdx.x == 0) {");
    c("  float sum = 0.0f;");
    c("  for (int w = 0; w < 8; ++w) sum += part[w];");
    c("  if (sum != 0.0f) ladle_red_add_f32(d_softmax_aux + h * d_softmax_aux_stride_h + s * d_softmax_aux_stride_s, sum);");
    c("}");
    c("__syncthreads();");
    c.out();
    c("}");
  }
  c.out();
  c("}");
  c("");
}

// main's signature, constants, block and sequence, and the query tiles its keys may be attended by.
void emit_main_opening(Code& c, const AttentionBackwardParts& parts, const std::string& name, const std::vector<std::string>& decl) {
  const AttentionBackwardSpec& spec = parts.spec;
  const ir::AttentionVariant& variant = parts.variant;
  const int BM = query_tile, BN = parts.key_block;
  c("// ---- main: the gradients of q, k, v" + std::string(spec.sinks_gradient || !decl.empty() ? " and the score's inputs" : ""));
  c("extern \"C\" __global__ void __launch_bounds__(256, 1) " + name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < decl.size(); ++p) c(decl[p] + (p + 1 < decl.size() ? "," : ") {"));
  c.out();
  c("constexpr int BM = " + std::to_string(BM) + ", BN = " + std::to_string(BN) + ", STAGES = " + std::to_string(spec.stages) + ";");
  c("constexpr int D = " + std::to_string(spec.D) + ", DV = " + std::to_string(spec.Dv) + ", DP = " + std::to_string(parts.DP) +
    ", DVP = " + std::to_string(parts.DVP) + ", DPB = " + std::to_string(parts.DPB) + ", DVPB = " + std::to_string(parts.DVPB) + ";");
  c("constexpr unsigned Q_BYTES = BM * DPB * 2, DO_BYTES = BM * DVPB * 2, K_BYTES = BN * DPB * 2, V_BYTES = BN * DVPB * 2,");
  c("                   DS_BYTES = BN * 128;");
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("(void)LOG2E;");
  if (parts.column_split)
    c("// Warp w = 0..7 owns keys 16 (w % 4).. of the block's 64; warpgroup w / 4 owns dK's and dV's columns 128 (w / 4)..;\n"
      "// thread 0 also issues the copies.");
  else
    c("// Warp w = 0..7 (warpgroup w / 4) owns keys 16 w.. of the block; thread 0 also issues the copies.");
  c("const int lane = threadIdx.x % 32, warp = static_cast<int>(threadIdx.x / 32), gid = lane / 4, tig = lane % 4;");
  c("// The grid (attention_grid): x a group's kv heads, y the key blocks (under a causal mask the first is the");
  c("// heaviest: it starts first), z the groups.");
  c("const int head = static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x), n = head / H_kv, hk = head % H_kv, group = H / H_kv;");
  emit_attention_bounds(c, spec.varlen);
  c("(void)Tk;");
  c("const int j_block = blockIdx.y * BN;");
  emit_block_query_tiles(c, variant);
}

}  // namespace

namespace detail {

void emit_block_query_tiles(Code& c, const ir::AttentionVariant& variant) {
  c("if (j_block >= k_len) return;");
  c("const int diagonal = k_len - q_len, j_last = (j_block + BN < k_len ? j_block + BN : k_len) - 1;");
  c("(void)j_last;");
  c("// The queries any key of the block is attended by (causal, window); tiles outside are never loaded.");
  c("long long q_begin = 0, q_end = q_len;");
  if (variant.causal) c("if (j_block - diagonal > q_begin) q_begin = j_block - diagonal;");
  if (variant.window) {
    c("if (window_right >= 0 && j_block - diagonal - window_right > q_begin) q_begin = j_block - diagonal - window_right;");
    c("if (window_left >= 0 && j_last - diagonal + window_left + 1 < q_end) q_end = j_last - diagonal + window_left + 1;");
  }
  c("const int tile_begin = static_cast<int>(q_begin / BM);");
  c("const int tile_end = q_end > q_begin ? static_cast<int>((q_end + BM - 1) / BM) : tile_begin;");
  c("const int tiles = tile_end - tile_begin, steps = group * tiles;  // a step: one query head's tile");
  c("");
}

void emit_key_row_values(Code& c, const AttentionBackwardParts& parts) {
  const ir::AttentionVariant& variant = parts.variant;
  const std::string w = parts.key_warp;
  c("const int key_row[2] = {j_block + " + w + " * 16 + gid, j_block + " + w + " * 16 + gid + 8};");
  if (variant.segment_ids)
    c("const long long kv_segment[2] = {key_row[0] < k_len ? static_cast<long long>(kv_segment_ids[b * kv_segment_stride_b + (k_bos + key_row[0]) * kv_segment_stride_t]) : 0,\n"
      "                                 key_row[1] < k_len ? static_cast<long long>(kv_segment_ids[b * kv_segment_stride_b + (k_bos + key_row[1]) * kv_segment_stride_t]) : 0};");
  if (variant.dropout) c("const float keep_scale = 1.0f / (1.0f - dropout_p);");
  const auto& inputs = variant.inputs;
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (parts.gradient[k] && inputs[k].kind == ir::InputKind::head)
      c("float acc_" + parts.id[k] + " = 0.0f;  // this thread's part of d " + inputs[k].name);
  c("// The row statistics (lse in log2 units, delta) of a step's BM queries, one per thread of the first BM;");
  c("// past the sequence lse is +inf (p = 0).");
  c("const auto load_stats = [&](int step) {");
  c("  const int h = hk * group + step / tiles, i = (tile_begin + step % tiles) * BM + static_cast<int>(threadIdx.x);");
  c("  return i < q_len ? row_stats[(static_cast<long long>(b) * H + h) * Tq + q_bos + i] : make_float2(-ladle_neg_inf(), 0.0f);");
  c("};");
}


void emit_key_gradients(Code& c, const AttentionBackwardParts& parts) {
  const AttentionBackwardSpec& spec = parts.spec;
  if (spec.dq_tma) c("if (threadIdx.x % 128 == 0) ladle_bulk_wait();  // dQ's last reductions done before the block ends");
  c("// 7. dK and dV of this thread's keys" + std::string(parts.sync ? ", the part's columns," : "") +
    " stored once (fp32; zero where no query attended them).");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("const int j = key_row[half];");
  c("if (j >= k_len) continue;");
  c("float* const dk_row = dk + b * dk_stride_b + (k_bos + j) * dk_stride_t + hk * dk_stride_h;");
  c("float* const dv_row = dv + b * dv_stride_b + (k_bos + j) * dv_stride_t + hk * dv_stride_h;");
  // The accumulators' columns and where they start: every column (ws), a warpgroup's (split ws), a part's (sync).
  const std::string& dk_n = parts.dk_columns, & dv_n = parts.dv_columns;
  const std::string col0 = parts.sync ? "c0 + " : parts.column_split ? "warpgroup * 128 + " : "";
  c("LADLE_UNROLL for (int nt = 0; nt < " + dk_n + " / 8; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("    const int col = " + col0 + "nt * 8 + tig * 2 + e;");
  c("    if (col < D) dk_row[col * dk_stride_d] = dk_acc[nt][2 * half + e];");
  c("  }");
  c("LADLE_UNROLL for (int nt = 0; nt < " + dv_n + " / 8; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("    const int col = " + col0 + "nt * 8 + tig * 2 + e;");
  c("    if (col < DV) dv_row[col * dv_stride_d] = dv_acc[nt][2 * half + e];");
  c("  }");
  c.out();
  c("}");
}

}  // namespace detail

namespace {

// main's shared memory: K, V, the q / d_output ring, dS^T, dQ's stages, the row statistics.
void emit_main_shared(Code& c, const AttentionBackwardSpec& spec) {
  c("// Shared memory from a 1024-byte aligned base (TMA's 128-byte swizzle): K [DPB / 64][BN][64], V [DVPB / 64][BN][64],");
  c("// per stage q [DPB / 64][BM][64] and do [DVPB / 64][BM][64], dS^T [2][BN][64] (ours, swizzled alike), the steps'");
  c("// row statistics [2][BM], mbarriers.");
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("unsigned char* const aligned_smem = smem + (1024 - ladle_shared_address(smem) % 1024) % 1024;");
  c("unsigned short* const k_tile = reinterpret_cast<unsigned short*>(aligned_smem);");
  c("unsigned short* const v_tile = reinterpret_cast<unsigned short*>(aligned_smem + K_BYTES);");
  c("unsigned short* const q_ring = reinterpret_cast<unsigned short*>(aligned_smem + K_BYTES + V_BYTES);");
  c("unsigned short* const do_ring = reinterpret_cast<unsigned short*>(aligned_smem + K_BYTES + V_BYTES + STAGES * Q_BYTES);");
  c("unsigned char* const ds_tile = aligned_smem + K_BYTES + V_BYTES + STAGES * (Q_BYTES + DO_BYTES);");
  if (spec.dq_tma) {
    c("// dQ's stage: per warpgroup two boxes of BM rows x 32 floats (128 bytes, swizzled as TMA reads them), 1024-byte");
    c("// aligned; the TMA unit adds them into dq.");
    c("constexpr unsigned DQ_STAGE_BYTES = 2 * 2 * BM * 128;");
    c("unsigned char* const dq_stage = ds_tile + 2 * DS_BYTES;");
    c("float2* const stats_s = reinterpret_cast<float2*>(dq_stage + DQ_STAGE_BYTES);  // [2][BM] {lse log2 e, delta}");
  } else {
    c("float2* const stats_s = reinterpret_cast<float2*>(ds_tile + 2 * DS_BYTES);  // [2][BM] {lse log2 e, delta}, by step");
  }
}

// Step 2: this thread's keys, their accumulators, the wgmma descriptors, the first step's statistics.
void emit_key_rows(Code& c, const AttentionBackwardParts& parts) {
  c("// 2. This thread's keys: rows gid and gid + 8 of its warp's 16 (S^T's accumulator rows).");
  c("const int warpgroup = ladle_warp_uniform(warp / 4);");
  emit_key_row_values(c, parts);
  const std::string& dk_n = parts.dk_columns, & dv_n = parts.dv_columns;
  if (parts.column_split)
    c("constexpr int CDP = " + std::to_string(parts.CDP) + ", CDVP = " + std::to_string(parts.CDVP) +
      ";  // the accumulators' columns: a warpgroup's part of dK and dV");
  c("float dk_acc[" + dk_n + " / 8][4], dv_acc[" + dv_n + " / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < " + dk_n + " / 8; ++nt) dk_acc[nt][0] = dk_acc[nt][1] = dk_acc[nt][2] = dk_acc[nt][3] = 0.0f;");
  c("LADLE_UNROLL for (int nt = 0; nt < " + dv_n + " / 8; ++nt) dv_acc[nt][0] = dv_acc[nt][1] = dv_acc[nt][2] = dv_acc[nt][3] = 0.0f;");
  c("// Descriptors formed once (a product adds its byte offset / 16): K and V of this warpgroup's keys as the");
  c("// K-major A of S^T and dP^T; q and do K-major (B of S^T, dP^T: SBO 1024, the next 16 of D 32 bytes on) and");
  c("// N-major (B of dK, dV: LBO one box, the next 16 queries 2048 bytes on); dS^T MN-major (A of dQ) and K");
  c("// N-major (B of dQ), the next 16 keys 2048 bytes on.");
  const std::string key_offset = parts.column_split ? "" : " + warpgroup * 64 * 64";  // split: both warpgroups read every key
  c("const unsigned long long k_desc = ladle_wgmma_desc_sw128(k_tile" + key_offset + ", 16, 1024);");
  c("const unsigned long long v_desc = ladle_wgmma_desc_sw128(v_tile" + key_offset + ", 16, 1024);");
  c("const unsigned long long q_desc = ladle_wgmma_desc_sw128(q_ring, 16, 1024);");
  c("const unsigned long long do_desc = ladle_wgmma_desc_sw128(do_ring, 16, 1024);");
  c("const unsigned long long qn_desc = ladle_wgmma_desc_sw128(q_ring, BM * 128, 1024);");
  c("const unsigned long long don_desc = ladle_wgmma_desc_sw128(do_ring, BM * 128, 1024);");
  c("const unsigned long long ds_desc = ladle_wgmma_desc_sw128(ds_tile, BN * 128, 1024);");
  // K's columns of this warpgroup's dQ: box w (64 columns); split: boxes 2 w and 2 w + 1.
  c("const unsigned long long kn_desc = ladle_wgmma_desc_sw128(k_tile + warpgroup * " + std::string(parts.column_split ? "2 * " : "") +
    "BN * 64, BN * 128, 1024);");
  c("if (threadIdx.x < BM && steps > 0) stats_s[threadIdx.x] = load_stats(0);");
  c("__syncthreads();");
  c("kv_latch.wait();");
}


}  // namespace

namespace detail {

ir::LoadFn attention_backward_load(const std::vector<std::string>& id) {
  return [&id](const ir::Input& in, std::int32_t k) -> std::string {
    switch (in.kind) {
      case ir::InputKind::pair:
        return "ladle_load(" + id[k] + "_bh + (q_bos + i) * " + id[k] + "_stride_t + (k_bos + j) * " + id[k] + "_stride_d)";
      case ir::InputKind::head: return id[k] + "_value";
      case ir::InputKind::scalar: return id[k];
      default: break;
    }
    return "0.0f";
  };
}

std::string attention_backward_leaf(ir::Op op) { return attention_leaf(op, "s_acc[nt][r]"); }

AttentionBackwardParts::AttentionBackwardParts(const ir::AttentionVariant& variant_, const AttentionBackwardSpec& spec_,
                                               const std::vector<std::string>& id_)
    : variant(variant_), spec(spec_), id(id_) {
  const auto& inputs = variant.inputs;
  sync = spec.form == AttentionBackwardForm::sync;
  split = sync && attention_backward_split(spec);
  f16 = !split && spec.input_types[0] == DType::f16;
  column_split = attention_backward_column_split(spec);
  key_block = sync ? 64 : column_split ? 64 : 128;
  key_warp = column_split ? "(warp % 4)" : "warp";
  key_base = column_split ? "j_block" : "j_block + warpgroup * 64";
  input_guard = sync ? "input_part" : column_split ? "warpgroup == 0" : "";
  dk_columns = sync ? "CW" : column_split ? "CDP" : "DP";
  dv_columns = sync ? "CW" : column_split ? "CDVP" : "DVP";
  DP = pad16(spec.D), DVP = pad16(spec.Dv), DPB = (spec.D + 63) / 64 * 64, DVPB = (spec.Dv + 63) / 64 * 64;
  CDP = std::min(DP, 128), CDVP = std::min(DVP, 128);
  used.assign(inputs.size(), false);
  for (const ir::Expr* e : {&variant.score, &variant.keep})
    for (const ir::Node& node : e->nodes)
      if (node.op == ir::Op::input) used[node.input] = true;
  gradient.assign(inputs.size(), false);
  for (std::size_t k = 0; k < inputs.size(); ++k)
    gradient[k] = k < spec.input_gradients.size() && spec.input_gradients[k] &&
                  (inputs[k].kind == ir::InputKind::pair || inputs[k].kind == ir::InputKind::head);

  const ir::LoadFn load = attention_backward_load(id);
  const auto leaf = attention_backward_leaf;
  constexpr double log2e = 1.4426950408889634;
  hoisted = hoist_invariants(inputs, variant.score, log2e, 1.0);
  const auto hoisted_load = [&](const ir::Input& in, std::int32_t k) -> std::string {
    return static_cast<std::size_t>(k) >= hoisted.first_hoisted ? in.name : load(in, k);
  };
  // Split f32 inputs: the exact tanh, as the forward's split path forms the logit.
  logit_expression = ir::render_c(hoisted.inputs, hoisted.expr, hoisted_load, leaf, ir::RenderFunctions{split ? "ladle_tanh" : "ladle_tanh_approx"});
  keep_expression = variant.keep.empty() ? "" : ir::render_c(inputs, variant.keep, load, leaf, ir::RenderFunctions{"ladle_tanh"});
  dscore_expression = ir::render_c(inputs, ir::derivative(variant.score, ir::Op::score), load, leaf, ir::RenderFunctions{"ladle_tanh"});
  dinput_expression.assign(inputs.size(), "");
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (gradient[k] && used[k])
      dinput_expression[k] =
          ir::render_c(inputs, ir::derivative(variant.score, static_cast<std::int32_t>(k)), load, leaf, ir::RenderFunctions{"ladle_tanh"});
}

}  // namespace detail

namespace {

// The kernel for these inputs' C names (with_input_names runs it twice).
AttentionBackwardKernel generate_named(const AttentionBackwardParts& parts) {
  const ir::AttentionVariant& variant = parts.variant;
  const AttentionBackwardSpec& spec = parts.spec;

  AttentionBackwardKernel kernel;
  std::string key = std::to_string(spec.D) + "," + std::to_string(spec.Dv) + (spec.varlen ? " L" : "") +
                    (spec.copy_d_output ? " C" : "") + (spec.sinks_gradient ? " S" : "") + (spec.dq_tma ? " QB" : "") + " s" +
                    std::to_string(spec.stages) +
                    (parts.sync ? " sync" + std::to_string(spec.sync_rows) + "x" + std::to_string(spec.sync_columns) + " " + spec.arch : "") +
                    dtype_name(spec.output_type) + dtype_name(spec.d_output_type) +
                    dtype_name(spec.q_segment_ids_type) + dtype_name(spec.kv_segment_ids_type) +
                    dtype_name(spec.sinks_type);
  for (DType t : spec.input_types) key += dtype_name(t);
  for (std::size_t k = 0; k < variant.inputs.size(); ++k) key += parts.gradient[k] ? "g" : "-";
  const std::string tag = hex(fnv1a(key, ir::hash(variant)));
  kernel.prep_name = "ladle_attention_bwd_prep_" + tag;
  kernel.name = "ladle_attention_bwd_" + tag;
  kernel.shared_bytes = attention_backward_shared_bytes(spec);
  const std::vector<std::string> prep_decl = declare_prep_params(parts, kernel);
  const std::vector<std::string> decl = declare_main_params(parts, kernel);

  Code c;
  if (parts.sync) {
    kernel.main_threads = 128;
    kernel.block_n = 64;
    kernel.column_parts = (std::max(parts.DP, parts.DVP) + spec.sync_columns - 1) / spec.sync_columns;
    emit_sync_helpers(c, header_text(parts, kernel));
    emit_prep(c, parts, kernel.prep_name, prep_decl);
    emit_sync_main(c, parts, kernel.name, decl);
    kernel.source = c.text();
    return kernel;
  }
  kernel.block_n = parts.key_block;
  emit_helpers(c, parts, header_text(parts, kernel));
  emit_prep(c, parts, kernel.prep_name, prep_decl);
  emit_main_opening(c, parts, kernel.name, decl);
  emit_main_shared(c, spec);
  emit_stage_ring(c);
  emit_key_rows(c, parts);
  emit_attention_backward_steps(c, parts);
  emit_key_gradients(c, parts);
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace

AttentionBackwardKernel generate_attention_backward(const ir::AttentionVariant& variant, const AttentionBackwardSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_attention_backward: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (const auto problems = attention_backward_unsupported(variant, spec); !problems.empty()) fail(problems.front());
  for (DType t : {spec.output_type, spec.d_output_type, spec.sinks_type})
    if (!floating(t)) fail(std::string("a floating dtype was expected, got ") + dtype_name(t));
  return with_input_names<AttentionBackwardKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return generate_named(AttentionBackwardParts(variant, spec, id)); });
}

}  // namespace ladle::cuda
