// The decode form of the softmax-attention family (codegen/cuda/attention.h, AttentionMma::decode):
// the parts that differ from the mma.sync forward. A block owns one (sequence, key/value head),
// packed rows m0.. of its GQA group (row rho = token * G + g reads query head hk * G + g) and the
// keys of split blockIdx.x; it writes its rows' partial o and lse, and the merge kernel of the same
// source combines the splits. The key loop, the logits, the online softmax and P V are the forward's
// (attention_parts.cpp), with the row's token and head per row.
#include <ladle/runtime/error.h>

#include "attention_parts.h"

namespace ladle::cuda {

AttentionGrid attention_decode_grid(std::int64_t splits, std::int64_t row_blocks, std::int64_t groups) {
  if (splits < 1 || row_blocks < 1 || groups < 1)
    throw InvalidArgument("attention_decode_grid: splits = " + std::to_string(splits) + ", row blocks = " + std::to_string(row_blocks) +
                          ", groups = " + std::to_string(groups) + ", expected positive");
  if (splits > 65535 || row_blocks > 65535 || groups > 65535)
    throw InvalidArgument("attention_decode_grid: " + std::to_string(splits) + " key splits, " + std::to_string(row_blocks) +
                          " row blocks and " + std::to_string(groups) + " (sequence, key/value head) pairs; the grid takes at most 65535 of each");
  return {static_cast<unsigned>(splits), static_cast<unsigned>(row_blocks), static_cast<unsigned>(groups)};
}

unsigned attention_merge_blocks(std::int64_t rows) {
  if (rows < 1 || rows > 0x7fffffff)
    throw InvalidArgument("attention_merge_blocks: " + std::to_string(rows) + " rows, expected 1 to " + std::to_string(0x7fffffffLL));
  return static_cast<unsigned>(rows);
}

namespace detail {

void declare_decode_params(const AttentionParamFn& param) {
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  param("float*", "o_part", Type::pointer, Role::partial_o);
  param("float*", "lse_part", Type::pointer, Role::partial_lse);
  param("int", "partial_rows", Type::i32, Role::partial_rows);
  param("int", "split_len", Type::i32, Role::split_len);
}

void emit_decode_range(Code& c, const ir::AttentionVariant& variant, bool varlen, const std::string& k_heads) {
  c("// The block: (sequence, key/value head) blockIdx.z, its group's packed rows m0.. (row rho = token *");
  c("// G + g reads query head hk * G + g), the keys of split blockIdx.x.");
  c("const int m0 = blockIdx.y * BM;");
  c("const int HK = " + k_heads + ", G = H / HK;");
  c("const int n = blockIdx.z / HK, hk = blockIdx.z % HK;");
  c("");
  emit_attention_sequence(c, varlen);
  c("const int rows = q_len * G;");
  c("if (m0 >= rows) return;");
  c("");
  c("// The keys any row of this block may attend (the causal / window range of its tokens row_first..");
  c("// row_last around the diagonal j = i + (k_len - q_len)), within this split's keys.");
  c("const int diagonal = k_len - q_len, row_first = m0 / G, row_last = ((m0 + BM < rows ? m0 + BM : rows) - 1) / G;");
  c("long long key_begin = 0, key_end = k_len;");
  emit_key_range(c, variant, "row_first", "row_last", "key_begin", "key_end");
  c("const long long split_begin = static_cast<long long>(blockIdx.x) * split_len;");
  c("if (key_begin < split_begin) key_begin = split_begin;");
  c("if (key_end > split_begin + split_len) key_end = split_begin + split_len;");
  c("const int tile_begin = static_cast<int>(key_begin / BN_TILE);");
  c("const int tile_end = key_end > key_begin ? static_cast<int>((key_end + BN_TILE - 1) / BN_TILE) : tile_begin;");
  c("");
}

void emit_decode_key_merge(Code& c) {
  c("// 6b. The key warps of a row group each hold their keys' running maximum, sum and o: key warps > 0");
  c("//     leave theirs in shared memory (the ring is free), key warp 0 takes them in and stores the block's.");
  c("if (KEY_WARPS > 1) {");
  c.in();
  c("__syncthreads();");
  c("float* const merge_o = reinterpret_cast<float*>(smem);  // [WARPS][16][DVP]");
  c("float* const merge_stats = merge_o + WARPS * 16 * DVP;     // [WARPS][16]: maximum, sum");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("const int r = warp * 16 + gid + 8 * half;");
  c("const float total = ladle_quad_sum(row_sum[half]);");
  c("if (key_warp > 0) {");
  c("  LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt)");
  c("    merge_o[r * DVP + nt * 8 + tig * 2] = o_acc[nt][2 * half], merge_o[r * DVP + nt * 8 + tig * 2 + 1] = o_acc[nt][2 * half + 1];");
  c("  if (tig == 0) merge_stats[2 * r] = row_max[half], merge_stats[2 * r + 1] = total;");
  c("}");
  c.out();
  c("}");
  c("__syncthreads();");
  c("if (key_warp > 0) return;");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("float top = row_max[half];");
  c("for (int k = 1; k < KEY_WARPS; ++k) top = fmaxf(top, merge_stats[2 * ((k * ROW_WARPS + row_warp) * 16 + gid + 8 * half)]);");
  c("const float own = row_max[half] == ladle_neg_inf() ? 0.0f : ladle_exp2(row_max[half] - top);  // top -inf: every part is");
  c("row_sum[half] *= own;");
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) o_acc[nt][2 * half] *= own, o_acc[nt][2 * half + 1] *= own;");
  c("for (int k = 1; k < KEY_WARPS; ++k) {");
  c("  const int r = (k * ROW_WARPS + row_warp) * 16 + gid + 8 * half;");
  c("  const float m = merge_stats[2 * r], w = m == ladle_neg_inf() ? 0.0f : ladle_exp2(m - top);");
  c("  if (tig == 0) row_sum[half] += w * merge_stats[2 * r + 1];  // a quad's sum, added once (the epilogue sums the quad)");
  c("  LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt)");
  c("    o_acc[nt][2 * half] += w * merge_o[r * DVP + nt * 8 + tig * 2], o_acc[nt][2 * half + 1] += w * merge_o[r * DVP + nt * 8 + tig * 2 + 1];");
  c("}");
  c("row_max[half] = top;");
  c.out();
  c("}");
  c.out();
  c("}");
}

void emit_decode_partials(Code& c) {
  c("// 7. This split's partial result per row: o_acc / its own sum, and its lse in log2 units (-inf where");
  c("//    it attended nothing); the merge kernel weighs the splits by them.");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("const float sum = ladle_quad_sum(row_sum[half]), top = row_max[half];");
  c("if (!row_live[half]) continue;");
  c("const long long part_row = ((static_cast<long long>(blockIdx.x) * (gridDim.z / HK) + n) * H + row_head[half]) * partial_rows + row_token[half];");
  c("const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;");
  c("float* const o_row = o_part + part_row * DV;");
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) {");
  c("  const int col = nt * 8 + tig * 2;");
  c("  if (col < DV) o_row[col] = o_acc[nt][2 * half] * inv;");
  c("  if (col + 1 < DV) o_row[col + 1] = o_acc[nt][2 * half + 1] * inv;");
  c("}");
  c("if (tig == 0) lse_part[part_row] = sum > 0.0f ? top + log2f(sum) : ladle_neg_inf();");
  c.out();
  c("}");
  c.out();
  c("}");
}

std::string decode_merge_kernel(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec, const std::string& name,
                                std::vector<AttentionParam>& params) {
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  std::vector<std::string> declarations;
  const auto param = [&](const std::string& c_type, const std::string& pname, Type type, Role role) {
    declarations.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + pname);
    params.push_back({pname, c_type, type, role});
  };
  param("const float*", "o_part", Type::pointer, Role::partial_o);
  param("const float*", "lse_part", Type::pointer, Role::partial_lse);
  param("int", "partial_rows", Type::i32, Role::partial_rows);
  param("int", "kv_splits", Type::i32, Role::kv_splits);
  param("int", "sequences", Type::i32, Role::sequences);
  declare_output_params(param, variant, spec);
  if (spec.varlen) param("const long long*", "cu_seqlens_q", Type::pointer, Role::cu_seqlens_q);
  param("int", "Tq", Type::i32, Role::q_tokens);
  param("int", "H", Type::i32, Role::heads);

  Code c;
  c("");
  c("// The splits' merge: a block per (sequence, head, token) row. Its threads spread over the splits for");
  c("// the top lse and the weights w_s = 2^(lse_s - top), then over the columns, each summing w_s o_s over");
  c("// every split (independent loads, several in flight). o = that / (sum_s w_s" +
    std::string(variant.sinks ? " + the sinks' 2^(log2 e aux - top)" : "") + "); lse as the forward");
  c("// writes it; a row with nothing attended gets o = 0.");
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(attention_merge_threads) + ") " + name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("constexpr int DV = " + std::to_string(spec.Dv) + ", THREADS = " + std::to_string(attention_merge_threads) +
    ", MOST = " + std::to_string(attention_merge_splits) + ";");
  c("constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;");
  c("(void)LOG2E; (void)LN2;");
  c("__shared__ float weights[MOST];");
  c("__shared__ float reduce[THREADS / 32];");
  c("const long long row = blockIdx.x;");
  c("const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;");
  c("const long long between = static_cast<long long>(sequences) * H * partial_rows;  // one split's rows");
  c("const int token = static_cast<int>(row % partial_rows), h = static_cast<int>(row / partial_rows % H);");
  c("const int n = static_cast<int>(row / partial_rows / H);");
  emit_query_sequence(c, spec.varlen);
  c("if (token >= q_len) return;  // the whole block: no barrier is skipped by part of it");
  c("// The top: over the splits (and the sinks), a block's maximum.");
  c("float top = ladle_neg_inf();");
  c("for (int s = threadIdx.x; s < kv_splits; s += THREADS) top = fmaxf(top, lse_part[s * between + row]);");
  if (variant.sinks)
    c("for (int s = threadIdx.x; s < sinks; s += THREADS) top = fmaxf(top, LOG2E * ladle_load(softmax_aux + h * softmax_aux_stride_h + s * softmax_aux_stride_s));");
  c("for (int off = 16; off > 0; off >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));");
  c("if (lane == 0) reduce[warp] = top;");
  c("__syncthreads();");
  c("top = reduce[0];");
  c("for (int w = 1; w < THREADS / 32; ++w) top = fmaxf(top, reduce[w]);");
  c("__syncthreads();  // reduce is the sum's next");
  c("// The weights (0 for a split that attended nothing) and their sum.");
  c("float sum = 0.0f;");
  c("for (int s = threadIdx.x; s < kv_splits; s += THREADS) {");
  c("  const float l = lse_part[s * between + row];");
  c("  const float w = l == ladle_neg_inf() ? 0.0f : ladle_exp2(l - top);");
  c("  weights[s] = w;");
  c("  sum += w;");
  c("}");
  if (variant.sinks)
    c("for (int s = threadIdx.x; s < sinks && top != ladle_neg_inf(); s += THREADS) sum += ladle_exp2(LOG2E * ladle_load(softmax_aux + h * softmax_aux_stride_h + s * softmax_aux_stride_s) - top);");
  c("for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);");
  c("if (lane == 0) reduce[warp] = sum;");
  c("__syncthreads();");
  c("sum = 0.0f;");
  c("for (int w = 0; w < THREADS / 32; ++w) sum += reduce[w];");
  c("const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;");
  c(std::string(storage_type(spec.output_type)) + "* const o_row = o + b * o_stride_b + (q_bos + token) * o_stride_t + h * o_stride_h;");
  c("for (int col = threadIdx.x; col < DV; col += THREADS) {");
  c.in();
  c("float acc = 0.0f;");
  c("LADLE_UNROLL_8 for (int s = 0; s < kv_splits; ++s) acc += weights[s] * o_part[(s * between + row) * DV + col];");
  c("ladle_store(o_row + col * o_stride_d, acc * inv);");
  c.out();
  c("}");
  if (spec.lse)
    c("if (threadIdx.x == 0) lse[(static_cast<long long>(b) * H + h) * Tq + q_bos + token] = sum > 0.0f ? (top + log2f(sum)) * LN2 : ladle_neg_inf();");
  c.out();
  c("}");
  return c.text();
}

}  // namespace detail
}  // namespace ladle::cuda
