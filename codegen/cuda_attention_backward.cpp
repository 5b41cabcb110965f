#include "cuda_attention_backward.h"


#include <set>
#include <tuple>

#include <ladle/runtime/error.h>

#include "detail/attention_helpers.h"
#include "detail/attention_parts.h"
#include "detail/cuda_source.h"
#include "detail/hoist.h"
#include "render_c.h"

namespace ladle::cuda {

using namespace detail;

namespace {

// The template's own names (an input with one of these names, or a derived one, is renamed).
const std::set<std::string>& template_names() {
  static const std::set<std::string> names = {
      "BM", "BN", "D", "DV", "DP", "DVP", "DPB", "DVPB", "STAGES", "LOG2E", "LN2", "smem", "aligned_smem", "k_tile", "v_tile",
      "q_ring", "do_ring", "ds_tile", "kv_full", "full", "empty", "lane", "warp", "gid", "tig", "warpgroup", "n", "h", "hk", "b",
      "group", "q_bos", "k_bos", "q_len", "k_len", "diagonal", "j_block", "j_last", "q_begin", "q_end", "tile_begin",
      "tile_end", "tiles", "steps", "step", "tile", "stage", "m0", "i", "j", "nt", "r", "kt", "kk", "e", "cb", "s_acc",
      "dp_acc", "dk_acc", "dv_acc", "dq_acc", "p_frag", "ds_frag", "lse2", "delta", "key_row", "key_live", "attend", "lg",
      "p", "keep", "dl", "pd", "ds", "keep_scale", "kv_segment", "interior", "k_desc", "v_desc", "q_desc", "qn_desc",
      "do_desc", "don_desc", "ds_desc", "kn_desc", "Q_BYTES", "DO_BYTES", "K_BYTES", "V_BYTES", "DS_BYTES", "stats", "stats_s", "next_stats", "load_stats",
      "dq_stage", "DQ_STAGE_BYTES", "stage_boxes", "dq_head", "dq_part", "dq_map",
      "o", "o_stride_b", "o_stride_t", "o_stride_h", "o_stride_d", "lse", "d_output", "d_output_stride_b",
      "d_output_stride_t", "d_output_stride_h", "d_output_stride_d", "d_output_copy", "do_map", "q_map", "k_map",
      "v_map", "row_stats", "dq", "dq_stride_b", "dq_stride_t", "dq_stride_h", "dk", "dk_stride_b", "dk_stride_t",
      "dk_stride_h", "dk_stride_d", "dv", "dv_stride_b", "dv_stride_t", "dv_stride_h", "dv_stride_d", "q_segment_ids",
      "q_segment_stride_b", "q_segment_stride_t", "kv_segment_ids", "kv_segment_stride_b", "kv_segment_stride_t",
      "softmax_aux", "softmax_aux_stride_h", "softmax_aux_stride_s", "sinks", "d_softmax_aux", "d_softmax_aux_stride_h",
      "d_softmax_aux_stride_s", "cu_seqlens_q", "cu_seqlens_k", "window_left", "window_right", "dropout_p", "seed", "B",
      "Tq", "Tk", "H", "H_kv", "row", "x", "sum", "part", "s", "q_row", "k_row", "col", "dst", "src", "bits", "top",
      "value", "it"};
  return names;
}

int pad16(int x) { return (x + 15) / 16 * 16; }

bool sixteen_bit(DType t) { return t == DType::f16 || t == DType::bf16; }


}  // namespace

// A 1024-byte alignment pad, K and V of the block's 128 keys, the q / d_output ring, dS^T twice, dQ's
// stages (dq_tma), the row statistics of two steps, the mbarriers.
int attention_backward_shared_bytes(const AttentionBackwardSpec& spec) {
  constexpr int BM = 64, BN = 128;
  const int DPB = (spec.D + 63) / 64 * 64, DVPB = (spec.Dv + 63) / 64 * 64;
  const int q_bytes = BM * DPB * 2, do_bytes = BM * DVPB * 2, k_bytes = BN * DPB * 2, v_bytes = BN * DVPB * 2, ds_bytes = BN * 128;
  return 1024 + k_bytes + v_bytes + spec.stages * (q_bytes + do_bytes) + 2 * ds_bytes + (spec.dq_tma ? 2 * 2 * BM * 128 : 0) + 2 * BM * 8 +
         8 * (1 + 2 * spec.stages);
}

std::string to_string(const AttentionBackwardTile& tile) {
  return "stages=" + std::to_string(tile.stages) + (tile.dq_tma ? " dq=tma" : " dq=red");
}

AttentionBackwardSpec with_tile(AttentionBackwardSpec spec, const AttentionBackwardTile& tile) {
  spec.stages = tile.stages;
  spec.dq_tma = spec.dq_tma && tile.dq_tma && attention_backward_shared_bytes(spec) <= attention_backward_max_shared_bytes;
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
  if (!sixteen_bit(q) || spec.input_types[1] != q || spec.input_types[2] != q)
    problems.push_back(std::string("q, k, v are ") + dtype_name(spec.input_types[0]) + ", " + dtype_name(spec.input_types[1]) +
                       ", " + dtype_name(spec.input_types[2]) + ": the GPU backward takes q, k, v of one 16-bit type (f16 or bf16)");
  for (const auto& [name, dim] : {std::pair{"D", spec.D}, std::pair{"Dv", spec.Dv}})
    if (dim < 8 || dim > 128 || dim % 8 != 0)
      problems.push_back(std::string(name) + " = " + std::to_string(dim) + ": the GPU backward takes head dims of 8 to 128, multiples of 8");
  if (spec.arch != "sm_90a" && spec.arch != "compute_90a")
    problems.push_back("the GPU backward runs on wgmma and TMA: it needs the target sm_90a, the target is " +
                       (spec.arch.empty() ? std::string("unknown") : spec.arch));
  if (spec.stages < 2 || spec.stages > 4) problems.push_back("stages = " + std::to_string(spec.stages) + ", expected 2 to 4");
  else if (const int bytes = attention_backward_shared_bytes(spec); bytes > attention_backward_max_shared_bytes)
    problems.push_back("stages = " + std::to_string(spec.stages) + " at D = " + std::to_string(spec.D) + ", Dv = " + std::to_string(spec.Dv) +
                       " needs " + std::to_string(bytes) + " bytes of shared memory, more than a block's " +
                       std::to_string(attention_backward_max_shared_bytes));
  if (!spec.input_gradients.empty() && spec.input_gradients.size() != variant.inputs.size())
    problems.push_back("input_gradients has " + std::to_string(spec.input_gradients.size()) + " entries, expected one per variant input");
  return problems;
}

AttentionBackwardKernel generate_attention_backward(const ir::AttentionVariant& variant, const AttentionBackwardSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_attention_backward: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (const auto problems = attention_backward_unsupported(variant, spec); !problems.empty()) fail(problems.front());
  for (DType t : {spec.output_type, spec.d_output_type, spec.sinks_type})
    if (!floating(t)) fail(std::string("a floating dtype was expected, got ") + dtype_name(t));

  const auto& inputs = variant.inputs;
  ir::Variant named;
  named.inputs = inputs;
  const std::vector<std::string> id = identifiers(named, template_names());
  const bool f16 = spec.input_types[0] == DType::f16;
  const std::string t16 = f16 ? "f16" : "bf16";
  const int DP = pad16(spec.D), DVP = pad16(spec.Dv), DPB = (spec.D + 63) / 64 * 64, DVPB = (spec.Dv + 63) / 64 * 64;
  constexpr int BM = 64, BN = 128;
  const auto wants_gradient = [&](std::size_t k) {
    return k < spec.input_gradients.size() && spec.input_gradients[k] &&
           (inputs[k].kind == ir::InputKind::pair || inputs[k].kind == ir::InputKind::head);
  };

  AttentionBackwardKernel kernel;
  std::string key = std::to_string(spec.D) + "," + std::to_string(spec.Dv) + (spec.varlen ? " L" : "") +
                    (spec.copy_d_output ? " C" : "") + (spec.sinks_gradient ? " S" : "") + (spec.dq_tma ? " QB" : "") + " s" +
                    std::to_string(spec.stages) +
                    dtype_name(spec.output_type) + dtype_name(spec.d_output_type) +
                    dtype_name(spec.q_segment_ids_type) + dtype_name(spec.kv_segment_ids_type) +
                    dtype_name(spec.sinks_type);
  for (DType t : spec.input_types) key += dtype_name(t);
  for (std::size_t k = 0; k < inputs.size(); ++k) key += wants_gradient(k) ? "g" : "-";
  const std::string tag = hex(fnv1a(key, ir::hash(variant)));
  kernel.prep_name = "ladle_attention_bwd_prep_" + tag;
  kernel.name = "ladle_attention_bwd_" + tag;
  kernel.shared_bytes = attention_backward_shared_bytes(spec);

  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  const auto storage = [&](DType t) -> std::string { return t == DType::u8 ? "unsigned char" : storage_type(t); };

  // ---- prep's parameters
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

  // ---- main's parameters
  std::vector<bool> used(inputs.size(), false);
  for (const ir::Expr* e : {&variant.score, &variant.keep})
    for (const ir::Node& node : e->nodes)
      if (node.op == ir::Op::input) used[node.input] = true;
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
    if (wants_gradient(k)) {
      param("float*", "d_" + id[k], Type::pointer, Role::d_input, index);
      param("long long", "d_" + id[k] + "_stride_b", Type::i64, Role::d_input_stride_b, index);
      if (in.kind == ir::InputKind::pair) param("long long", "d_" + id[k] + "_stride_t", Type::i64, Role::d_input_stride_t, index);
      param("long long", "d_" + id[k] + "_stride_h", Type::i64, Role::d_input_stride_h, index);
      if (in.kind == ir::InputKind::pair) param("long long", "d_" + id[k] + "_stride_d", Type::i64, Role::d_input_stride_d, index);
    }
  }
  param("int", "H_kv", Type::i32, Role::input_heads, 1);
  for (const auto& [name, role, index, rows] : {std::tuple{"q_map", Role::tensor_map, 0, BM}, std::tuple{"k_map", Role::tensor_map, 1, BN},
                                                std::tuple{"v_map", Role::tensor_map, 2, BN}, std::tuple{"do_map", Role::d_output_map, -1, BM}}) {
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

  // ---- The expressions at one (i, j): i a query of the step's tile, j a key of this thread
  const auto load = [&](const ir::Input& in, std::int32_t k) -> std::string {
    switch (in.kind) {
      case ir::InputKind::pair:
        return "ladle_load(" + id[k] + "_bh + (q_bos + i) * " + id[k] + "_stride_t + (k_bos + j) * " + id[k] + "_stride_d)";
      case ir::InputKind::head: return id[k] + "_value";
      case ir::InputKind::scalar: return id[k];
      default: break;
    }
    return "0.0f";
  };
  const auto leaf = [&](ir::Op op) -> std::string {
    switch (op) {
      case ir::Op::score: return "s_acc[nt][r]";
      case ir::Op::query_index: return "static_cast<float>(i)";
      case ir::Op::key_index: return "static_cast<float>(j)";
      case ir::Op::head_index: return "static_cast<float>(h)";
      case ir::Op::batch_index: return "static_cast<float>(n)";
      default: break;
    }
    return "0.0f";
  };
  constexpr double log2e = 1.4426950408889634;
  // The logit as the forward's ws tiles form it (log2 units, invariant factors hoisted, tanh.approx),
  // so that P here is the forward's P to its rounding.
  const HoistedExpression hoisted = hoist_invariants(inputs, variant.score, log2e, 1.0);
  const auto hoisted_load = [&](const ir::Input& in, std::int32_t k) -> std::string {
    return static_cast<std::size_t>(k) >= hoisted.first_hoisted ? in.name : load(in, k);
  };
  const std::string logit_expression = ir::render_c(hoisted.inputs, hoisted.expr, hoisted_load, leaf, ir::RenderFunctions{"ladle_tanh_approx"});
  const std::string keep_expression = variant.keep.empty() ? "" : ir::render_c(inputs, variant.keep, load, leaf, ir::RenderFunctions{"ladle_tanh"});
  // d logit / d score and d logit / d input (natural units), through ir::derivative.
  const std::string dscore_expression =
      ir::render_c(inputs, ir::derivative(variant.score, ir::Op::score), load, leaf, ir::RenderFunctions{"ladle_tanh"});
  std::vector<std::string> dinput_expression(inputs.size());
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (wants_gradient(k) && used[k])
      dinput_expression[k] =
          ir::render_c(inputs, ir::derivative(variant.score, static_cast<std::int32_t>(k)), load, leaf, ir::RenderFunctions{"ladle_tanh"});

  // ---- Header
  std::string header = "ladle: attention backward kernels " + kernel.prep_name + ", " + kernel.name +
                       "\nGenerated by codegen/cuda_attention_backward.cpp; do not edit.\n\n";
  header += ir::to_string(variant);
  header += "\nlogit          = " + ir::to_string(inputs, variant.score) + "\n";
  if (!variant.keep.empty()) header += "keep           = " + ir::to_string(inputs, variant.keep) + "\n";
  header += "d logit/dscore = " + ir::to_string(inputs, ir::derivative(variant.score, ir::Op::score)) + "\n";
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (!dinput_expression[k].empty())
      header += "d logit/d" + inputs[k].name + " = " + ir::to_string(inputs, ir::derivative(variant.score, static_cast<std::int32_t>(k))) + "\n";
  header += "D=" + std::to_string(spec.D) + " Dv=" + std::to_string(spec.Dv) + ", q, k, v " + t16 + ", stages " + std::to_string(spec.stages) + "\n";
  header += "prep: grid (ceil(Tq / 8), N * H), block 256: delta = do . o, lse in log2 units" +
            std::string(spec.sinks_gradient ? ", the sinks' gradient" : "") + (spec.copy_d_output ? ", d_output copied to " + t16 : "") + "\n";
  header += "main: grid attention_grid(N * H_kv, ceil(Tk / 128)), block 256 (two warpgroups of 64 keys; thread 0 issues the TMA copies),\n"
            "dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes; every query head of the key/value head's group\n"
            "S^T = K q^T, dP^T = V do^T, dV += P^T do, dK += dS^T q, dQ += dS K: wgmma.mma_async, fp32 accumulation\n";

  Code c;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers + attention_helpers +
    wgmma_helpers(BM, DVP, f16, f16) + wgmma_product(true, DP, f16) + ws_helpers());
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

  // ================================ prep
  c("// ---- prep: one warp per query row of one head: delta = do . o (fp32), lse in log2 units" +
    std::string(spec.sinks_gradient ? ", the sinks' gradient" : ""));
  c("extern \"C\" __global__ void __launch_bounds__(256) " + kernel.prep_name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < prep_decl.size(); ++p) c(prep_decl[p] + (p + 1 < prep_decl.size() ? "," : ") {"));
  c.out();
  c("constexpr int DV = " + std::to_string(spec.Dv) + ";");
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;");
  c("const int n = blockIdx.y / H, h = blockIdx.y % H, i = blockIdx.x * 8 + warp;");
  if (spec.varlen) {
    c("const long long q_bos = cu_seqlens_q[n];");
    c("const int q_len = static_cast<int>(cu_seqlens_q[n + 1] - q_bos), b = 0;");
  } else {
    c("const long long q_bos = 0;");
    c("const int q_len = Tq, b = n;");
  }
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

  // ================================ main
  c("// ---- main: the gradients of q, k, v" + std::string(spec.sinks_gradient || !decl.empty() ? " and the score's inputs" : ""));
  c("extern \"C\" __global__ void __launch_bounds__(256, 1) " + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < decl.size(); ++p) c(decl[p] + (p + 1 < decl.size() ? "," : ") {"));
  c.out();
  c("constexpr int BM = " + std::to_string(BM) + ", BN = " + std::to_string(BN) + ", STAGES = " + std::to_string(spec.stages) + ";");
  c("constexpr int D = " + std::to_string(spec.D) + ", DV = " + std::to_string(spec.Dv) + ", DP = " + std::to_string(DP) +
    ", DVP = " + std::to_string(DVP) + ", DPB = " + std::to_string(DPB) + ", DVPB = " + std::to_string(DVPB) + ";");
  c("constexpr unsigned Q_BYTES = BM * DPB * 2, DO_BYTES = BM * DVPB * 2, K_BYTES = BN * DPB * 2, V_BYTES = BN * DVPB * 2,");
  c("                   DS_BYTES = BN * 128;");
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("(void)LOG2E;");
  c("// Warp w = 0..7 (warpgroup w / 4) owns keys 16 w.. of the block; thread 0 also issues the copies.");
  c("const int lane = threadIdx.x % 32, warp = static_cast<int>(threadIdx.x / 32), gid = lane / 4, tig = lane % 4;");
  c("// The grid (attention_grid): x a group's kv heads, y the key blocks (under a causal mask the first is the");
  c("// heaviest: it starts first), z the groups.");
  c("const int head = static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x), n = head / H_kv, hk = head % H_kv, group = H / H_kv;");
  if (spec.varlen) {
    c("const long long q_bos = cu_seqlens_q[n], k_bos = cu_seqlens_k[n];");
    c("const int q_len = static_cast<int>(cu_seqlens_q[n + 1] - q_bos), k_len = static_cast<int>(cu_seqlens_k[n + 1] - k_bos);");
    c("const int b = 0;");
  } else {
    c("const long long q_bos = 0, k_bos = 0;");
    c("const int q_len = Tq, k_len = Tk, b = n;");
  }
  c("(void)Tk;");
  c("const int j_block = blockIdx.y * BN;");
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
  c("unsigned long long* const kv_full = reinterpret_cast<unsigned long long*>(stats_s + 2 * BM);");
  c("unsigned long long* const full = kv_full + 1;");
  c("unsigned long long* const empty = kv_full + 1 + STAGES;");
  c("if (threadIdx.x == 0) {");
  c("  ladle_mbarrier_init(kv_full, 1);");
  c("  for (int s = 0; s < STAGES; ++s) {");
  c("    ladle_mbarrier_init(&full[s], 1);   // the producer's arrive_expect_tx, then the copies' bytes");
  c("    ladle_mbarrier_init(&empty[s], 8);  // lane 0 of every consumer warp");
  c("  }");
  c("  ladle_fence_barrier_init();");
  c("}");
  c("__syncthreads();");
  c("");
  c("// 1. Thread 0 issues every copy: K and V once, q and do of the first STAGES - 1 steps now, and at the");
  c("//    top of each step the step STAGES - 1 ahead, into the stage the step before released (empty).");
  c("const auto issue = [&](int step) {");
  c.in();
  c("const int h = hk * group + step / tiles, q_row = static_cast<int>(q_bos) + (tile_begin + step % tiles) * BM, stage = step % STAGES;");
  c("if (step >= STAGES) ladle_mbarrier_wait(&empty[stage], (step / STAGES - 1) & 1);");
  c("ladle_mbarrier_arrive_expect_tx(&full[stage], Q_BYTES + DO_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb)");
  c("  ladle_tma_load_4d(q_ring + stage * (Q_BYTES / 2) + cb * BM * 64, &q_map, cb * 64, q_row, h, b, &full[stage]);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb)");
  c("  ladle_tma_load_4d(do_ring + stage * (DO_BYTES / 2) + cb * BM * 64, &do_map, cb * 64, q_row, h, b, &full[stage]);");
  c.out();
  c("};");
  c("if (threadIdx.x == 0) {");
  c.in();
  c("const int k_row = static_cast<int>(k_bos) + j_block;");
  c("ladle_mbarrier_arrive_expect_tx(kv_full, K_BYTES + V_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb) ladle_tma_load_4d(k_tile + cb * BN * 64, &k_map, cb * 64, k_row, hk, b, kv_full);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb) ladle_tma_load_4d(v_tile + cb * BN * 64, &v_map, cb * 64, k_row, hk, b, kv_full);");
  c("for (int step = 0; step < STAGES - 1 && step < steps; ++step) issue(step);");
  c.out();
  c("}");
  c("");
  c("// 2. This thread's keys: rows gid and gid + 8 of its warp's 16 (S^T's accumulator rows).");
  c("const int warpgroup = ladle_warp_uniform(warp / 4);");
  c("const int key_row[2] = {j_block + warp * 16 + gid, j_block + warp * 16 + gid + 8};");
  if (variant.segment_ids)
    c("const long long kv_segment[2] = {key_row[0] < k_len ? static_cast<long long>(kv_segment_ids[b * kv_segment_stride_b + (k_bos + key_row[0]) * kv_segment_stride_t]) : 0,\n"
      "                                 key_row[1] < k_len ? static_cast<long long>(kv_segment_ids[b * kv_segment_stride_b + (k_bos + key_row[1]) * kv_segment_stride_t]) : 0};");
  if (variant.dropout) c("const float keep_scale = 1.0f / (1.0f - dropout_p);");
  c("float dk_acc[DP / 8][4], dv_acc[DVP / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < DP / 8; ++nt) dk_acc[nt][0] = dk_acc[nt][1] = dk_acc[nt][2] = dk_acc[nt][3] = 0.0f;");
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) dv_acc[nt][0] = dv_acc[nt][1] = dv_acc[nt][2] = dv_acc[nt][3] = 0.0f;");
  c("// Descriptors formed once (a product adds its byte offset / 16): K and V of this warpgroup's keys as the");
  c("// K-major A of S^T and dP^T; q and do K-major (B of S^T, dP^T: SBO 1024, the next 16 of D 32 bytes on) and");
  c("// N-major (B of dK, dV: LBO one box, the next 16 queries 2048 bytes on); dS^T MN-major (A of dQ) and K");
  c("// N-major (B of dQ), the next 16 keys 2048 bytes on.");
  c("const unsigned long long k_desc = ladle_wgmma_desc_sw128(k_tile + warpgroup * 64 * 64, 16, 1024);");
  c("const unsigned long long v_desc = ladle_wgmma_desc_sw128(v_tile + warpgroup * 64 * 64, 16, 1024);");
  c("const unsigned long long q_desc = ladle_wgmma_desc_sw128(q_ring, 16, 1024);");
  c("const unsigned long long do_desc = ladle_wgmma_desc_sw128(do_ring, 16, 1024);");
  c("const unsigned long long qn_desc = ladle_wgmma_desc_sw128(q_ring, BM * 128, 1024);");
  c("const unsigned long long don_desc = ladle_wgmma_desc_sw128(do_ring, BM * 128, 1024);");
  c("const unsigned long long ds_desc = ladle_wgmma_desc_sw128(ds_tile, BN * 128, 1024);");
  c("const unsigned long long kn_desc = ladle_wgmma_desc_sw128(k_tile + warpgroup * BN * 64, BN * 128, 1024);");
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (wants_gradient(k) && inputs[k].kind == ir::InputKind::head) c("float acc_" + id[k] + " = 0.0f;  // this thread's part of d " + inputs[k].name);
  c("// The row statistics (lse in log2 units, delta) of a step's 64 queries, one per thread of the first 64;");
  c("// past the sequence lse is +inf (p = 0). Loaded a step ahead, stored into stats_s at the step's barrier.");
  c("const auto load_stats = [&](int step) {");
  c("  const int h = hk * group + step / tiles, i = (tile_begin + step % tiles) * BM + static_cast<int>(threadIdx.x);");
  c("  return i < q_len ? row_stats[(static_cast<long long>(b) * H + h) * Tq + q_bos + i] : make_float2(-ladle_neg_inf(), 0.0f);");
  c("};");
  c("if (threadIdx.x < BM && steps > 0) stats_s[threadIdx.x] = load_stats(0);");
  c("__syncthreads();");
  c("ladle_mbarrier_wait(kv_full, 0);");
  c("for (int step = 0; step < steps; ++step) {");
  c.in();
  c("const int h = hk * group + step / tiles, m0 = (tile_begin + step % tiles) * BM, stage = step % STAGES;");
  c("(void)h;");
  c("const float2* const stats = stats_s + (step & 1) * BM;  // this step's, stored at the last step's barrier");
  c("float2 next_stats = make_float2(0.0f, 0.0f);");
  c("if (threadIdx.x < BM && step + 1 < steps) next_stats = load_stats(step + 1);  // in flight through the step");
  for (std::size_t k = 3; k < inputs.size(); ++k) {
    if (!used[k] && !wants_gradient(k)) continue;
    if (inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h);");
    if (inputs[k].kind == ir::InputKind::pair) {
      c("const " + storage(spec.input_types[k]) + "* const " + id[k] + "_bh = " + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h;");
      if (wants_gradient(k))
        c("float* const d_" + id[k] + "_bh = d_" + id[k] + " + b * d_" + id[k] + "_stride_b + h * d_" + id[k] + "_stride_h;");
    }
  }
  if (!hoisted.invariants.empty()) {
    c("// The logit's factors that no (query, key) pair changes (log2 units).");
    for (std::size_t k = 0; k < hoisted.invariants.size(); ++k)
      c("const float " + hoisted.inputs[hoisted.first_hoisted + k].name + " = " +
        ir::render_c(inputs, hoisted.invariants[k], load, leaf, ir::RenderFunctions{"ladle_tanh"}) + ";");
  }
  c("if (threadIdx.x == 0 && step + STAGES - 1 < steps) issue(step + STAGES - 1);");
  c("ladle_mbarrier_wait(&full[stage], (step / STAGES) & 1);");
  c("// 3. S^T = K q^T and dP^T = V do^T for this warpgroup's 64 keys and the tile's 64 queries.");
  c("float s_acc[BM / 8][4], dp_acc[BM / 8][4];");
  c("ladle_wgmma_fence_operand<BM>(s_acc);");
  c("ladle_wgmma_fence_operand<BM>(dp_acc);");
  c("ladle_wgmma_fence();");
  const std::string ss = f16 ? "ladle_wgmma_ss_f16<BM>" : "ladle_wgmma_ss_bf16<BM>";
  c("LADLE_UNROLL for (int kt = 0; kt < DP / 16; ++kt)");
  c("  " + ss + "(s_acc, k_desc + ((kt / 4) * BN * 64 + (kt % 4) * 16) * 2 / 16,");
  c("      q_desc + (stage * Q_BYTES + ((kt / 4) * BM * 64 + (kt % 4) * 16) * 2) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("LADLE_UNROLL for (int kt = 0; kt < DVP / 16; ++kt)");
  c("  " + ss + "(dp_acc, v_desc + ((kt / 4) * BN * 64 + (kt % 4) * 16) * 2 / 16,");
  c("      do_desc + (stage * DO_BYTES + ((kt / 4) * BM * 64 + (kt % 4) * 16) * 2) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<BM>(s_acc);");
  c("ladle_wgmma_fence_operand<BM>(dp_acc);");
  c("");
  // Interior steps: every (query, key) of the warpgroup's part inside both sequences and the
  // structured masks, and no per-element test besides (no segment ids, no predicate).
  const bool plain_interior = !variant.segment_ids && keep_expression.empty();
  std::string interior = "m0 + BM <= q_len && j_block + warpgroup * 64 + 64 <= k_len";
  if (variant.causal) interior += " && j_block + warpgroup * 64 + 63 <= m0 + diagonal";
  if (variant.window)
    interior += " && (window_left < 0 || j_block + warpgroup * 64 >= m0 + BM - 1 + diagonal - window_left) && "
                "(window_right < 0 || j_block + warpgroup * 64 + 63 <= m0 + diagonal + window_right)";
  c("// 4. P = 2^(logit - lse), dlogit = P (dP - delta), dS = dlogit * d logit / d score, per element; masked: 0.");
  c("//    P (times the dropout keep) and dS packed in 16-bit pairs are the A operands of dV and dK.");
  const std::string pack = f16 ? "ladle_pack_f16" : "ladle_pack_bf16";
  c("unsigned p_frag[BM / 16][4], ds_frag[BM / 16][4];");
  const auto element_body = [&](bool tested) {
    c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk) {");
    c.in();
    c("float pd[2][4], ds[2][4];  // columns 16 kk.. (two accumulator column blocks), packed as soon as formed");
    c("LADLE_UNROLL for (int x = 0; x < 2; ++x)");
    c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
    c.in();
    c("  const int nt = 2 * kk + x, i = m0 + nt * 8 + tig * 2 + e;");
    c("  const float2 st = stats[nt * 8 + tig * 2 + e];  // lse (log2 units) and delta of query i");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c.in();
    c("  const int r = 2 * half + e, j = key_row[half];");
    c("  (void)j;");
    if (tested) {
      std::string attend = "i < q_len && j < k_len";
      if (variant.causal) attend += " && j <= i + diagonal";
      if (variant.window)
        attend += " && (window_left < 0 || j >= static_cast<long long>(i) + diagonal - window_left) && "
                  "(window_right < 0 || j <= static_cast<long long>(i) + diagonal + window_right)";
      if (variant.segment_ids)
        attend += " && kv_segment[half] == static_cast<long long>(q_segment_ids[b * q_segment_stride_b + (q_bos + i) * q_segment_stride_t])";
      if (!keep_expression.empty()) attend += " && (" + keep_expression + ") != 0.0f";
      c("  const bool attend = " + attend + ";");
    } else {
      c("  constexpr bool attend = true;");
    }
    c("  float p = 0.0f, dl = 0.0f, keep = 1.0f;");
    c("  if (attend) {");
    c("    p = ladle_exp2(" + logit_expression + " - st.x);");
    if (variant.dropout)
      c("    keep = ladle_dropout_uniform(seed, n, h, i, j) >= dropout_p ? keep_scale : 0.0f;");
    c("    dl = p * (dp_acc[nt][r] * keep - st.y);");
    c("  }");
    c("  pd[x][r] = p * keep;");
    c("  ds[x][r] = attend ? dl * (" + dscore_expression + ") : 0.0f;");
    for (std::size_t k = 3; k < inputs.size(); ++k) {
      if (dinput_expression[k].empty()) continue;
      if (inputs[k].kind == ir::InputKind::pair)
        c("  if (dl != 0.0f) ladle_red_add_f32(d_" + id[k] + "_bh + (q_bos + i) * d_" + id[k] + "_stride_t + (k_bos + j) * d_" + id[k] +
          "_stride_d, dl * (" + dinput_expression[k] + "));");
      else
        c("  if (dl != 0.0f) acc_" + id[k] + " += dl * (" + dinput_expression[k] + ");");
    }
    c.out();
    c("  }");
    c.out();
    c("  }");
    c("p_frag[kk][0] = " + pack + "(pd[0][0], pd[0][1]);");
    c("p_frag[kk][1] = " + pack + "(pd[0][2], pd[0][3]);");
    c("p_frag[kk][2] = " + pack + "(pd[1][0], pd[1][1]);");
    c("p_frag[kk][3] = " + pack + "(pd[1][2], pd[1][3]);");
    c("ds_frag[kk][0] = " + pack + "(ds[0][0], ds[0][1]);");
    c("ds_frag[kk][1] = " + pack + "(ds[0][2], ds[0][3]);");
    c("ds_frag[kk][2] = " + pack + "(ds[1][0], ds[1][1]);");
    c("ds_frag[kk][3] = " + pack + "(ds[1][2], ds[1][3]);");
    c.out();
    c("}");
  };
  if (plain_interior) {
    c("if (" + interior + ") {");
    c.in();
    element_body(false);
    c.out();
    c("} else {");
    c.in();
    element_body(true);
    c.out();
    c("}");
  } else {
    element_body(true);
  }
  c("// dS^T into shared memory for dQ: row = key (128 bytes: the tile's 64 queries), 16-byte piece p of row r at");
  c("// p ^ r % 8 (TMA's 128-byte swizzle, which the descriptor names). Buffers alternate by step: the other");
  c("// warpgroup may still read the last step's.");
  c("{");
  c.in();
  c("unsigned char* const ds_base = ds_tile + (step & 1) * DS_BYTES;");
  c("LADLE_UNROLL for (int nt = 0; nt < BM / 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int kr = warp * 16 + gid + 8 * half;");
  c("    *reinterpret_cast<unsigned*>(ds_base + kr * 128 + ((nt ^ (kr % 8)) * 16) + tig * 4) = ds_frag[nt / 2][(nt % 2) * 2 + half];");
  c("  }");
  c.out();
  c("}");
  const std::string rs_dv = std::string(f16 ? "ladle_wgmma_rs_f16" : "ladle_wgmma_rs_bf16") + "<DVP>";
  const std::string rs_dk = std::string(f16 ? "ladle_wgmma_rs_f16" : "ladle_wgmma_rs_bf16") + "<DP>";
  const std::string tab = std::string(f16 ? "ladle_wgmma_ss_f16_tab" : "ladle_wgmma_ss_bf16_tab") + "<64>";
  c("// 5. dV += P^T do and dK += dS^T q (A from registers, 16 queries per product).");
  c("ladle_wgmma_fence_operand<DVP>(dv_acc);");
  c("ladle_wgmma_fence_operand<DP>(dk_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
  c("  " + rs_dv + "(dv_acc, p_frag[kk], don_desc + (stage * DO_BYTES + kk * 2048) / 16);");
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
  c("  " + rs_dk + "(dk_acc, ds_frag[kk], qn_desc + (stage * Q_BYTES + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("// 6. dQ = dS K over the block's 128 keys: warpgroup w takes D's columns 64 w.. (warpgroup 1 idles at DP <= 64).");
  c("ladle_fence_proxy_async();  // dS^T's stores, visible to wgmma");
  c("if (threadIdx.x < BM && step + 1 < steps) stats_s[((step + 1) & 1) * BM + threadIdx.x] = next_stats;");
  if (spec.dq_tma)
    c("if (threadIdx.x % 128 == 0) ladle_bulk_wait_read();  // the last step's reductions have read this warpgroup's dQ stage");
  c("ladle_named_barrier_sync(1, 256);  // both warpgroups' dS^T stored, the next step's statistics too" +
    std::string(spec.dq_tma ? ", the dQ stages free" : ""));
  c("float dq_acc[8][4];");
  c("const bool dq_part = warpgroup * 64 < DP;");
  c("if (dq_part) {");
  c.in();
  c("ladle_wgmma_fence_operand<64>(dq_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk)");
  c("  " + tab + "(dq_acc, ds_desc + ((step & 1) * DS_BYTES + kk * 2048) / 16, kn_desc + kk * 2048 / 16, kk > 0);");
  c("ladle_wgmma_commit();");
  c.out();
  c("}");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<DVP>(dv_acc);");
  c("ladle_wgmma_fence_operand<DP>(dk_acc);");
  c("ladle_wgmma_fence_operand<64>(dq_acc);");
  c("if (lane == 0) ladle_mbarrier_arrive(&empty[stage]);  // q and do of this stage are read");
  if (spec.dq_tma) {
    c("// dQ into this warpgroup's stage (row r, column 32 x + c of box x at byte r 128 + ((c / 4) ^ r % 8) 16 + c % 4 * 4),");
    c("// then one thread adds the boxes into dq by TMA (rows past the sequence are zero; past the tensor, dropped).");
    c("unsigned char* const stage_boxes = dq_stage + warpgroup * 2 * BM * 128;");
    c("if (dq_part) {");
    c("  LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("    LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("      const int r = (warp % 4) * 16 + gid + 8 * half, c = (nt % 4) * 8 + tig * 2;");
    c("      *reinterpret_cast<float2*>(stage_boxes + (nt / 4) * BM * 128 + r * 128 + (((c / 4) ^ (r % 8)) * 16) + (c % 4) * 4) =");
    c("          make_float2(dq_acc[nt][2 * half], dq_acc[nt][2 * half + 1]);");
    c("    }");
    c("  ladle_fence_proxy_async();  // the stage's stores, visible to the TMA unit");
    c("}");
    c("ladle_named_barrier_sync(2 + warpgroup, 128);  // this warpgroup's stage written");
    c("if (dq_part && threadIdx.x % 128 == 0) {");
    c("  LADLE_UNROLL for (int x = 0; x < 2; ++x)");
    c("    if (warpgroup * 64 + x * 32 < D)");
    c("      ladle_tma_reduce_add_4d(&dq_map, stage_boxes + x * BM * 128, warpgroup * 64 + x * 32, static_cast<int>(q_bos) + m0, h, b);");
    c("  ladle_bulk_commit();");
    c("}");
  } else {
    c("if (dq_part) {");
    c.in();
    c("float* const dq_head = dq + b * dq_stride_b + h * dq_stride_h;");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int i = m0 + (warp % 4) * 16 + gid + 8 * half, col = warpgroup * 64 + nt * 8 + tig * 2;");
    c("    if (i < q_len && col < D) ladle_red_add_f32x2(dq_head + (q_bos + i) * dq_stride_t + col, dq_acc[nt][2 * half], dq_acc[nt][2 * half + 1]);");
    c("  }");
    c.out();
    c("}");
  }
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (!dinput_expression[k].empty() && inputs[k].kind == ir::InputKind::head) {
      c("// d " + inputs[k].name + ": this warp's sum, one atomic per warp and head.");
      c("if (step + 1 == steps || (step + 1) % tiles == 0) {");
      c("  float x = acc_" + id[k] + ";");
      c("  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);");
      c("  if (lane == 0 && x != 0.0f) ladle_red_add_f32(d_" + id[k] + " + b * d_" + id[k] + "_stride_b + h * d_" + id[k] + "_stride_h, x);");
      c("  acc_" + id[k] + " = 0.0f;");
      c("}");
    }
  c.out();
  c("}");
  c("");
  if (spec.dq_tma) c("if (threadIdx.x % 128 == 0) ladle_bulk_wait();  // dQ's last reductions done before the block ends");
  c("// 7. dK and dV of this thread's keys, stored once (fp32; zero where no query attended them).");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("const int j = key_row[half];");
  c("if (j >= k_len) continue;");
  c("float* const dk_row = dk + b * dk_stride_b + (k_bos + j) * dk_stride_t + hk * dk_stride_h;");
  c("float* const dv_row = dv + b * dv_stride_b + (k_bos + j) * dv_stride_t + hk * dv_stride_h;");
  c("LADLE_UNROLL for (int nt = 0; nt < DP / 8; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("    const int col = nt * 8 + tig * 2 + e;");
  c("    if (col < D) dk_row[col * dk_stride_d] = dk_acc[nt][2 * half + e];");
  c("  }");
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("    const int col = nt * 8 + tig * 2 + e;");
  c("    if (col < DV) dv_row[col * dv_stride_d] = dv_acc[nt][2 * half + e];");
  c("  }");
  c.out();
  c("}");
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace ladle::cuda
